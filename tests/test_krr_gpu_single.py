"""The GPU's single-matrix Cholesky path and memory check of BKRRRegressor, against the CPU.

Blocks larger than ``POTRF_BATCHED_MAX`` (and every lone block: exact KRR) are
factored by one in-place cuSOLVER ``potrf`` each instead of ``potrfBatched``;
these tests hold that path to LAPACK and to scikit-learn's KernelRidge.
"""

import numpy as np
import pytest
from sklearn.kernel_ridge import KernelRidge

from gpuml._backend import available_bytes, cuda_available
from gpuml.estimators import _krr
from gpuml.estimators.bkrr import BKRRRegressor
from gpuml.kernels import (
    Kernel,
    NotPositiveDefiniteError,
    cholesky_solve_batch,
    gram_batch,
    krr,
    krr_solve_parts,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")]


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 1e-4)])
@pytest.mark.parametrize("n_targets", [None, 3])
def test_single_matrix_path_matches_cpu(cp, dtype, tol, n_targets):
    """One block larger than POTRF_BATCHED_MAX: potrf/potrs in place, against LAPACK in float64."""
    m = krr.POTRF_BATCHED_MAX + 188
    assert [b for _, b in krr.gpu_solve_plan([m], np.dtype(dtype).itemsize)] == [False]
    rng = np.random.default_rng(5)
    X = rng.normal(size=(m, 5))
    y = rng.normal(size=m if n_targets is None else (m, n_targets))
    kernel = Kernel("rbf", gamma=0.2)
    (host,) = krr_solve_parts(kernel, [X], [y], [1e-2 * m])
    (device,) = krr_solve_parts(kernel, [cp.asarray(X, dtype=dtype)],
                                [cp.asarray(y, dtype=dtype)], [1e-2 * m])
    assert isinstance(device, cp.ndarray) and device.dtype == dtype and device.shape == y.shape
    assert _rel(device.get(), host) < tol
    (K,) = gram_batch(kernel, [X])
    (K_dev,) = gram_batch(kernel, [cp.asarray(X, dtype=dtype)])
    np.testing.assert_allclose(K_dev.get(), K, rtol=0, atol=1e-12 if dtype == np.float64 else 5e-6)


@pytest.mark.parametrize("batched_max", [0, 1 << 30])
def test_batched_and_single_plans_agree_with_cpu(cp, monkeypatch, batched_max):
    """Equal-size parts forced through potrfBatched, or through one potrf each."""
    monkeypatch.setattr(krr, "POTRF_BATCHED_MAX", batched_max)
    rng = np.random.default_rng(6)
    kernel = Kernel("rbf", gamma=0.3)
    sizes = (300, 300, 300, 299)
    parts = [rng.normal(size=(m, 4)) for m in sizes]
    targets = [rng.normal(size=m) for m in sizes]
    shifts = [1e-3 * m for m in sizes]
    host = krr_solve_parts(kernel, parts, targets, shifts)
    device = krr_solve_parts(kernel, [cp.asarray(p) for p in parts],
                             [cp.asarray(t) for t in targets], shifts)
    for h, d in zip(host, device):
        assert _rel(d.get(), h) < 1e-10


def test_single_matrix_failure_names_the_part(cp):
    m = krr.POTRF_BATCHED_MAX + 1
    good, bad = cp.eye(m) * 2.0, -cp.eye(m)
    with pytest.raises(NotPositiveDefiniteError) as info:
        cholesky_solve_batch([good, bad, good], [cp.ones(m)] * 3)
    assert info.value.part == 1


def test_single_matrix_overwrite_a(cp):
    m = krr.POTRF_BATCHED_MAX + 3
    rng = np.random.default_rng(7)
    G = rng.normal(size=(m, m))
    A = G @ G.T / m + np.eye(m)
    b = rng.normal(size=m)
    kept = cp.asarray(A)
    (x,) = cholesky_solve_batch([kept], [cp.asarray(b)])
    np.testing.assert_array_equal(kept.get(), A)  # not overwritten without overwrite_a
    assert _rel(x.get(), np.linalg.solve(A, b)) < 1e-10
    scratch = cp.asarray(A)
    (x2,) = cholesky_solve_batch([scratch], [cp.asarray(b)], overwrite_a=True)
    assert _rel(x2.get(), x.get()) < 1e-12
    assert not bool(cp.allclose(scratch, cp.asarray(A)))  # factored in place


@pytest.mark.parametrize("n", [442, 3000])
def test_exact_krr_on_gpu_equals_kernel_ridge(cp, diabetes, n):
    """n_partitions=1 on the GPU is scikit-learn's KernelRidge (to 1e-6)."""
    if n == len(diabetes[0]):
        X, y = diabetes
    else:
        rng = np.random.default_rng(8)
        X = rng.normal(size=(n, 8))
        y = np.sin(X.sum(axis=1)) + 0.1 * rng.normal(size=n)
    sigma, lam = 2.0, 1e-4
    gpu = BKRRRegressor(sigma=sigma, lam=lam, fit_intercept=False, n_partitions=1,
                        device="cuda").fit(X, y)
    ref = KernelRidge(alpha=lam * n, kernel="rbf", gamma=1 / (2 * sigma**2)).fit(X, y)
    assert _rel(gpu.predict(X), ref.predict(X)) < 1e-6
    assert _rel(cp.asnumpy(gpu.dual_coef_), ref.dual_coef_) < 1e-6


def test_gpu_memory_refusal_before_work(cp, diabetes, monkeypatch):
    X, y = diabetes
    free = available_bytes(cp)
    total = cp.cuda.runtime.memGetInfo()[1]
    assert 0 < free <= total + cp.get_default_memory_pool().total_bytes()
    # room for the headroom and a few small blocks: refused at P=1, some larger P fits
    monkeypatch.setattr(_krr, "available_bytes",
                        lambda xp: krr.GPU_HEADROOM_BYTES + 8 * 200**2)
    with pytest.raises(MemoryError, match=r"cuda:0.*n_partitions>=\d+"):
        BKRRRegressor(n_partitions=1, device="cuda").fit(X, y)
