"""GPU paths of the batched KRR solvers and BKRRRegressor(CV), each checked against the CPU."""

import pickle

import numpy as np
import pytest

from gpuml._backend import cuda_available
from gpuml.estimators.bkrr import BKRRRegressor, BKRRRegressorCV
from gpuml.kernels import (
    Kernel,
    NotPositiveDefiniteError,
    cholesky_solve_batch,
    eigh_batch,
    gram_batch,
    krr_solve_parts,
)
from gpuml.kernels.krr import tridiagonal_batch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("sizes", [(40, 40, 39, 39), (7, 50, 23), (16, 16, 16)])
@pytest.mark.parametrize("name", ["rbf", "poly"])
def test_batched_solve_matches_cpu(cp, sizes, name):
    rng = np.random.default_rng(0)
    kernel = Kernel(name, gamma=0.2, degree=2, coef0=1.0)
    parts = [rng.normal(size=(m, 5)) for m in sizes]
    targets = [rng.normal(size=(m, 2)) for m in sizes]
    shifts = [1e-2 * m for m in sizes]
    host = krr_solve_parts(kernel, parts, targets, shifts)
    device = krr_solve_parts(kernel, [cp.asarray(p) for p in parts],
                             [cp.asarray(t) for t in targets], shifts)
    for h, d in zip(host, device):
        assert isinstance(d, cp.ndarray)
        np.testing.assert_allclose(d.get(), h, rtol=1e-8, atol=1e-10)
    for Kh, Kd in zip(gram_batch(kernel, parts), gram_batch(kernel, [cp.asarray(p)
                                                                    for p in parts])):
        np.testing.assert_allclose(Kd.get(), Kh, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("m", [8, 32, 100])
def test_batched_eigh_matches_cpu(cp, m):
    rng = np.random.default_rng(1)
    blocks = [np.cov(rng.normal(size=(m, 3 * m))) for _ in range(3)] + [np.eye(m - 1)]
    for A, (w, Q) in zip(blocks, eigh_batch([cp.asarray(A) for A in blocks])):
        np.testing.assert_allclose(w.get(), np.linalg.eigvalsh(A), rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(((Q * w) @ Q.T).get(), A, atol=1e-9)


def test_tridiagonal_forms_on_gpu_match_cpu(cp):
    """The GPU's eigen form and the CPU's Householder form give the same shifted solves."""
    rng = np.random.default_rng(2)
    blocks = [Kernel("rbf", gamma=0.2).matrix(rng.normal(size=(m, 4))) for m in (5, 40, 40)]
    host = tridiagonal_batch(blocks)
    device = tridiagonal_batch([cp.asarray(A) for A in blocks])
    for A, h, d in zip(blocks, host, device):
        assert d.e is None and isinstance(d.Q, cp.ndarray)
        B = rng.normal(size=(len(A), 2))
        shifts = [1e-3, 0.5]
        x_host = [h.expand(x) for x in h.solve(shifts, h.project(B))]
        x_dev = [d.expand(x).get() for x in d.solve(shifts, d.project(cp.asarray(B)))]
        np.testing.assert_allclose(x_dev, x_host, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(d.inverse_diagonal(shifts).get(), h.inverse_diagonal(shifts),
                                   rtol=1e-7, atol=1e-9)


def test_batched_cholesky_failure_is_reported(cp):
    As = [cp.eye(4), -cp.eye(4)]
    with pytest.raises(NotPositiveDefiniteError):
        cholesky_solve_batch(As, [cp.ones(4), cp.ones(4)])


@pytest.mark.parametrize("partition, combine", [("kbalance", "nearest"), ("kmeans", "nearest"),
                                                ("random", "average")])
def test_estimator_gpu_matches_cpu(cp, diabetes, partition, combine):
    X, y = diabetes
    kw = dict(sigma=2.0, lam=1e-4, n_partitions=4, partition=partition, combine=combine,
              random_state=0)
    cpu = BKRRRegressor(device="cpu", **kw).fit(X, y)
    gpu = BKRRRegressor(device="cuda", **kw).fit(cp.asarray(X), cp.asarray(y))
    assert gpu.device_ == "cuda:0" and isinstance(gpu.dual_coef_, cp.ndarray)
    pred = gpu.predict(cp.asarray(X))
    assert isinstance(pred, cp.ndarray)
    np.testing.assert_allclose(pred.get(), cpu.predict(X), rtol=1e-7, atol=1e-7)
    host_pred = gpu.predict(X)
    assert isinstance(host_pred, np.ndarray)


def test_exact_gpu_and_float32(cp, diabetes):
    X, y = diabetes
    cpu = BKRRRegressor(sigma=2.0, lam=1e-3, n_partitions=1, device="cpu").fit(X, y)
    gpu32 = BKRRRegressor(sigma=2.0, lam=1e-3, n_partitions=1, dtype="float32",
                          device="cuda").fit(X, y)
    pred = gpu32.predict(X)
    assert pred.dtype == np.float32
    ref = cpu.predict(X)
    assert np.max(np.abs(pred - ref)) / np.max(np.abs(ref)) < 1e-3


def test_singular_system_on_gpu_falls_back_to_least_squares(cp):
    X = cp.repeat(cp.arange(6.0).reshape(-1, 1), 2, axis=0)
    with pytest.warns(UserWarning, match="least-squares"):
        gpu = BKRRRegressor(lam=0.0, n_partitions=1, device="cuda").fit(X, cp.arange(12.0))
    with pytest.warns(UserWarning, match="least-squares"):
        cpu = BKRRRegressor(lam=0.0, n_partitions=1, device="cpu").fit(X.get(),
                                                                       np.arange(12.0))
    np.testing.assert_allclose(gpu.predict(X).get(), cpu.predict(X.get()), rtol=1e-6,
                               atol=1e-6)


def test_sample_weight_and_precomputed_on_gpu_match_cpu(cp, diabetes):
    X, y = diabetes
    sw = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    kw = dict(alpha=0.5, gamma=0.05, n_partitions=3, random_state=0)
    gpu = BKRRRegressor(device="cuda", **kw).fit(cp.asarray(X), cp.asarray(y),
                                                 sample_weight=cp.asarray(sw))
    cpu = BKRRRegressor(device="cpu", **kw).fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(gpu.predict(X), cpu.predict(X), rtol=1e-6, atol=1e-6)
    K = X @ X.T
    gpu = BKRRRegressor(kernel="precomputed", alpha=1.0, device="cuda").fit(cp.asarray(K), y)
    cpu = BKRRRegressor(kernel="precomputed", alpha=1.0, device="cpu").fit(K, y)
    np.testing.assert_allclose(gpu.predict(cp.asarray(K)).get(), cpu.predict(K), rtol=1e-6,
                               atol=1e-6)


def test_pickle_gpu_model(cp, diabetes, monkeypatch):
    X, y = diabetes
    gpu = BKRRRegressor(sigma=2.0, n_partitions=3, device="cuda", random_state=0).fit(X, y)
    blob = pickle.dumps(gpu)
    again = pickle.loads(blob)
    assert isinstance(again.dual_coef_, cp.ndarray)
    expected = gpu.predict(X)
    np.testing.assert_allclose(again.predict(X), expected, rtol=1e-12)
    # Unpickled where no GPU answers: __setstate__ resolves the fitting device through
    # gpuml._backend, whose device count is the one seam that decides whether a GPU is there.
    from gpuml import _backend

    monkeypatch.setattr(_backend, "gpu_count", lambda: 0)
    on_cpu = pickle.loads(blob)
    assert on_cpu.device_ == "cpu" and isinstance(on_cpu.dual_coef_, np.ndarray)
    # (the GPU model cannot predict while the patch hides the GPU: compare with before)
    np.testing.assert_allclose(on_cpu.predict(X), expected, rtol=1e-10)


@pytest.mark.parametrize("cv", [None, 3])
def test_cv_gpu_matches_cpu(cp, diabetes, cv):
    X, y = diabetes
    kw = dict(sigmas=[0.5, 2.0, 4.0], lams=[1e-5, 1e-3], n_partitions=3, cv=cv, random_state=0)
    cpu = BKRRRegressorCV(device="cpu", **kw).fit(X, y)
    gpu = BKRRRegressorCV(device="cuda", **kw).fit(cp.asarray(X), cp.asarray(y))
    np.testing.assert_allclose(gpu.cv_results_["mean_test_score"],
                               cpu.cv_results_["mean_test_score"], rtol=1e-7, atol=1e-9)
    assert gpu.best_params_ == cpu.best_params_
