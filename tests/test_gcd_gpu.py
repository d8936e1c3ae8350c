"""Asy-GCD on a GPU (gcd.cu) against the CPU solver: same QP, same objective."""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_digits

from gpuml.estimators.asygcd import AsyGCDSVC
from gpuml.kernels import gcd_default_workers, gcd_solve, make_kernel

pytestmark = pytest.mark.gpu


def _data():
    X, y = load_digits(return_X_y=True)
    X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    return X, np.where(y < 5, 1.0, -1.0)


def _blocks(n, workers):
    return np.random.default_rng(0).permutation(np.arange(n) % workers)


@pytest.mark.parametrize("selection", ["greedy", "random"])
@pytest.mark.parametrize("precompute", [False, True])
@pytest.mark.parametrize("workers", [1, 8, 64])
def test_gpu_objective_matches_cpu(selection, precompute, workers):
    import cupy as cp

    X, y = _data()
    kernel = make_kernel("rbf", "scale", 3, 0.0, X)
    C = np.ones(len(y))
    ref = gcd_solve(X, y, C, kernel, np.zeros(len(y), dtype=np.int64), tol=1e-6)
    tol = 1e-4 if selection == "greedy" else 1e-3
    res = gcd_solve(cp.asarray(X), cp.asarray(y), cp.asarray(C), kernel, _blocks(len(y), workers),
                    selection=selection, tol=tol,
                    cache_bytes=(1 << 30) if precompute else 0, random_state=0)
    assert isinstance(res.alpha, cp.ndarray)
    assert res.converged and res.n_workers == workers
    assert abs(res.objective - ref.objective) <= 1e-4 * abs(ref.objective)
    Q = np.outer(y, y) * kernel.matrix(X)
    alpha = cp.asnumpy(res.alpha)
    assert abs(0.5 * alpha @ Q @ alpha - alpha.sum() - ref.objective) <= 1e-4 * abs(ref.objective)


@pytest.mark.parametrize("name", ["linear", "poly"])
def test_gpu_other_kernels_float32(name):
    import cupy as cp

    X, y = _data()
    X = X[:600] / 8
    y = y[:600]
    kernel = make_kernel(name, 0.01, 2, 0.5, X)
    C = np.full(len(y), 0.5)
    ref = gcd_solve(X, y, C, kernel, np.zeros(len(y), dtype=np.int64), tol=1e-6)
    res = gcd_solve(cp.asarray(X, dtype=cp.float32), cp.asarray(y), cp.asarray(C), kernel,
                    _blocks(len(y), 16), tol=1e-3, cache_bytes=0)
    assert res.alpha.dtype == cp.float32
    assert abs(res.objective - ref.objective) <= 1e-3 * abs(ref.objective)


def test_gpu_max_updates_and_default_workers():
    import cupy as cp

    X, y = _data()
    kernel = make_kernel("rbf", "scale", 3, 0.0, X)
    res = gcd_solve(cp.asarray(X), cp.asarray(y), cp.ones(len(y)), kernel, _blocks(len(y), 4),
                    tol=1e-8, max_updates=100)
    assert res.n_updates == 100 and not res.converged
    assert gcd_default_workers(cp.zeros(1)) >= 1


def test_estimator_on_gpu_follows_cupy_input():
    import cupy as cp

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    cpu = AsyGCDSVC(n_workers=1, tol=1e-6, device="cpu").fit(X, y)
    gpu = AsyGCDSVC(n_workers=16, tol=1e-4, device="cuda", random_state=0).fit(cp.asarray(X),
                                                                              cp.asarray(y))
    assert abs(gpu.objective_[0] - cpu.objective_[0]) <= 1e-4 * abs(cpu.objective_[0])
    pred = gpu.predict(cp.asarray(X))
    assert isinstance(pred, cp.ndarray)
    assert float((pred == cp.asarray(y)).mean()) >= cpu.score(X, y) - 0.01
    assert isinstance(gpu.predict(X), np.ndarray)
