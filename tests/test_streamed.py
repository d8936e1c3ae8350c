"""Fits under a device memory budget (``max_device_memory``): the parts streamed through the
device in groups, on the CPU here (the same code path as on a GPU)."""

import threading
import time

import numpy as np
import pytest
from sklearn.datasets import make_classification, make_regression

import gpuml.pipeline.executors as executors
from gpuml import BKRRRegressor, CASVMClassifier
from gpuml._backend import cuda_available
from gpuml._validation import check_memory_bytes
from gpuml.estimators._cholesky_solver import CholeskyPartSolver
from gpuml.estimators._smo_solver import SMOPartSolver


@pytest.fixture(scope="module")
def classification():
    return make_classification(6000, 10, n_informative=6, n_classes=3, random_state=0)


@pytest.fixture(scope="module")
def regression():
    X, y = make_regression(7000, 8, noise=1.0, random_state=0)
    return X, np.column_stack([y, -y])


def _count_solves(monkeypatch, cls):
    calls = []
    solve = cls.solve

    def counted(self, backend, X, targets, weights, part_rows, part_ids, progress=None):
        calls.append((X.shape[0], list(part_ids)))
        return solve(self, backend, X, targets, weights, part_rows, part_ids, progress)

    monkeypatch.setattr(cls, "solve", counted)
    return calls


def test_casvm_streamed_in_groups_is_the_unbounded_fit(classification, monkeypatch):
    X, y = classification
    w = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    full = CASVMClassifier(random_state=0, device="cpu").fit(X, y, sample_weight=w)
    calls = _count_solves(monkeypatch, SMOPartSolver)
    # Each 2,000-row part needs 2000 * 10 * 8 + 2000^2 * 8 bytes (about 31 MiB): two fit.
    streamed = CASVMClassifier(random_state=0, device="cpu", max_device_memory="70MB")
    streamed.fit(X, y, sample_weight=w)
    assert calls == [(4000, [0, 1]), (2000, [2])]
    for name in ("support_", "dual_coef_", "intercept_", "part_intercept_", "centers_",
                 "n_iter_", "pair_status_"):
        np.testing.assert_array_equal(getattr(streamed, name), getattr(full, name), name)
    np.testing.assert_array_equal(streamed.decision_function(X), full.decision_function(X))


def test_bkrr_streamed_in_groups_is_the_unbounded_fit(regression, monkeypatch):
    X, Y = regression
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(X))
    for dtype in ("float64", "float32"):
        full = BKRRRegressor(random_state=0, dtype=dtype).fit(X, Y, sample_weight=w)
        calls = _count_solves(monkeypatch, CholeskyPartSolver)
        streamed = BKRRRegressor(random_state=0, dtype=dtype, max_device_memory=30 * 2**20)
        streamed.fit(X, Y, sample_weight=w)
        monkeypatch.undo()
        assert len(calls) > 1 and sorted(sum((ids for _, ids in calls), [])) == [0, 1, 2, 3]
        np.testing.assert_array_equal(streamed.part_sizes_, full.part_sizes_)
        np.testing.assert_array_equal(streamed.X_fit_, full.X_fit_)
        np.testing.assert_array_equal(streamed.dual_coef_, full.dual_coef_)
        np.testing.assert_array_equal(streamed.predict(X), full.predict(X))


def test_the_next_group_is_copied_while_this_one_is_solved(classification, monkeypatch):
    X, y = classification
    events, lock = [], threading.Lock()
    upload = executors.Backend.upload_rows
    solve = SMOPartSolver.solve

    def logged_upload(self, X, rows):
        with lock:
            events.append(("copy", len(rows)))
        return upload(self, X, rows)

    def slow_solve(self, backend, Xg, *args, **kwargs):
        with lock:
            events.append(("solve", Xg.shape[0]))
        time.sleep(0.3)
        with lock:
            events.append(("solved", Xg.shape[0]))
        return solve(self, backend, Xg, *args, **kwargs)

    monkeypatch.setattr(executors.Backend, "upload_rows", logged_upload)
    monkeypatch.setattr(SMOPartSolver, "solve", slow_solve)
    CASVMClassifier(random_state=0, device="cpu", max_device_memory="40MB").fit(X, y)
    # Three groups of one part: the second's copy is made before the first is solved.
    assert events.index(("copy", 2000), 1) < events.index(("solved", 2000))
    assert [e for e in events if e[0] == "solve"] == [("solve", 2000)] * 3


def test_a_part_too_large_is_refused_before_any_work(regression, monkeypatch):
    X, Y = regression

    def no_split(*args, **kwargs):
        raise AssertionError("the split ran")

    monkeypatch.setattr(executors, "split", no_split)
    with pytest.raises(MemoryError, match=r"a part of 1750 rows needs about 23.5 MiB .* "
                                          r"use n_partitions>=7 \(parts of at most 1000 rows\)"):
        BKRRRegressor(max_device_memory="10MB").fit(X, Y)
    with pytest.raises(MemoryError, match="a part of 2000 rows"):
        CASVMClassifier(device="cpu", max_device_memory="20MB").fit(*make_classification(6000))


def test_settings_that_cannot_be_streamed_are_refused(classification):
    import dask.array as da

    X, y = classification
    with pytest.raises(ValueError, match="max_device_memory is for one device"):
        CASVMClassifier(devices=["cpu", "cpu"], max_device_memory="1GB").fit(X, y)
    with pytest.raises(ValueError, match="on Dask each worker's memory_limit"):
        BKRRRegressor(max_device_memory="1GB").fit(da.from_array(X), da.from_array(y * 1.0))
    with pytest.raises(ValueError, match="method='cascade'"):
        CASVMClassifier(method="cascade", n_partitions=2, max_device_memory="1GB").fit(X, y)
    K = X[:300] @ X[:300].T
    with pytest.raises(ValueError, match="cannot be streamed"):
        BKRRRegressor(kernel="precomputed", max_device_memory="1GB").fit(K, y[:300] * 1.0)
    with pytest.raises(ValueError, match="not a memory size"):
        CASVMClassifier(max_device_memory="lots").fit(X, y)


def test_memory_sizes():
    assert check_memory_bytes("2GB") == 2 * 10**9
    assert check_memory_bytes("512 MiB") == 512 * 2**20
    assert check_memory_bytes(1e6) == 10**6
    with pytest.raises(ValueError, match="at least one byte"):
        check_memory_bytes(0.5)
    with pytest.raises(TypeError):
        check_memory_bytes([1])


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_streamed_through_a_gpu_equals_the_resident_gpu_fit(classification, regression):
    """On a GPU: the rows copied group by group on a side stream, the same model as a fit
    with every row on the device; the BKRR fit equals the CPU's to rounding."""
    X, y = classification
    resident = CASVMClassifier(random_state=0, device="cuda").fit(X, y)
    streamed = CASVMClassifier(random_state=0, device="cuda", max_device_memory="70MB")
    streamed.fit(X, y)
    np.testing.assert_array_equal(streamed.support_, resident.support_)
    np.testing.assert_allclose(streamed.dual_coef_, resident.dual_coef_, atol=1e-8)
    np.testing.assert_array_equal(streamed.predict(X), resident.predict(X))
    Xr, Y = regression
    cpu = BKRRRegressor(random_state=0, device="cpu").fit(Xr, Y)
    gpu = BKRRRegressor(random_state=0, device="cuda", max_device_memory=30 * 2**20).fit(Xr, Y)
    np.testing.assert_array_equal(gpu.part_sizes_, cpu.part_sizes_)
    np.testing.assert_allclose(gpu.predict(Xr), cpu.predict(Xr), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_upload_through_pinned_memory(dtype):
    """A group's rows gathered into page-locked memory and copied on their own stream: the
    rows X[rows], on the device, complete on return; CSR rows take the plain copy."""
    import cupy as cp
    import scipy.sparse as sp

    from gpuml._backend import resolve

    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, 17)).astype(dtype)
    rows = rng.permutation(5000)[:3000]
    backend = resolve("cuda")
    out = backend.upload_rows(X, rows)
    assert isinstance(out, cp.ndarray) and out.dtype == dtype
    np.testing.assert_array_equal(cp.asnumpy(out), X[rows])
    csr = sp.csr_matrix(np.where(X > 1, X, 0))
    np.testing.assert_array_equal(backend.upload_rows(csr, rows).toarray().get(),
                                  csr[rows].toarray())


def test_rows_upload_on_the_cpu_is_the_rows():
    from gpuml._backend import CPU

    X = np.arange(12.0).reshape(6, 2)
    np.testing.assert_array_equal(CPU.upload_rows(X, np.array([4, 1])), X[[4, 1]])
