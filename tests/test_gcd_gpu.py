"""Asy-GCD on a GPU (gcd.cu) against the CPU solver: same QP, same objective."""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.exceptions import ConvergenceWarning

from gpuml.estimators.asygcd import AsyGCDSVC
from gpuml.kernels import (
    GCDProblem,
    Kernel,
    gcd_default_cache_bytes,
    gcd_default_workers,
    gcd_gradient,
    gcd_solve,
    gcd_solve_batch,
    make_kernel,
)

pytestmark = pytest.mark.gpu


def _data():
    X, y = load_digits(return_X_y=True)
    X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    return X, np.where(y < 5, 1.0, -1.0)


def _blocks(n, workers, seed=0):
    return np.random.default_rng(seed).permutation(np.arange(n) % workers)


@pytest.fixture(scope="module")
def digits_serial():
    X, y = _data()
    kernel = make_kernel("rbf", "scale", 3, 0.0, X)
    C = np.ones(len(y))
    ref = gcd_solve(X, y, C, kernel, np.zeros(len(y), dtype=np.int64), tol=1e-6)
    return X, y, kernel, C, ref


@pytest.mark.parametrize("selection", ["greedy", "random"])
@pytest.mark.parametrize("precompute", [False, True])
@pytest.mark.parametrize("workers", [1, 8, 64, "sms"])
def test_gpu_objective_matches_cpu(digits_serial, selection, precompute, workers):
    # 8 and 64 workers (greedy, random blocks) never ended before the damped step: blocks in
    # lockstep overshot together on correlated coordinates.
    import cupy as cp

    X, y, kernel, C, ref = digits_serial
    if workers == "sms":
        workers = gcd_default_workers(cp.zeros(1))
    tol = 1e-4 if selection == "greedy" else 1e-3
    res = gcd_solve(cp.asarray(X), cp.asarray(y), cp.asarray(C), kernel, _blocks(len(y), workers),
                    selection=selection, tol=tol,
                    cache_bytes=(1 << 30) if precompute else 0, random_state=0)
    assert isinstance(res.alpha, cp.ndarray)
    assert res.converged and res.n_workers == workers and res.max_violation < tol
    assert abs(res.objective - ref.objective) <= 1e-4 * abs(ref.objective)
    Q = np.outer(y, y) * kernel.matrix(X)
    alpha = cp.asnumpy(res.alpha)
    assert abs(0.5 * alpha @ Q @ alpha - alpha.sum() - ref.objective) <= 1e-4 * abs(ref.objective)
    # every atomic add landed: the maintained gradient is Q a - e to rounding
    assert float(cp.abs(res.gradient - cp.asarray(Q @ alpha - 1.0)).max()) <= 1e-9


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


@pytest.mark.parametrize("precompute", [False, True])
def test_gpu_float32_rbf_keeps_the_gradient_in_double(digits_serial, precompute):
    # float32 data, float64 alpha and g: thousands of atomic adds do not drift.
    import cupy as cp

    X, y, kernel, C, ref = digits_serial
    res = gcd_solve(cp.asarray(X, dtype=cp.float32), cp.asarray(y), cp.asarray(C), kernel,
                    _blocks(len(y), 8), tol=1e-4, cache_bytes=(1 << 30) if precompute else 0)
    assert res.alpha.dtype == cp.float32 and res.gradient.dtype == cp.float64
    assert res.converged
    assert abs(res.objective - ref.objective) <= 1e-5 * abs(ref.objective)
    alpha = cp.asnumpy(res.alpha).astype(np.float64)
    exact = gcd_gradient(X, y, kernel, alpha)
    assert float(np.abs(cp.asnumpy(res.gradient) - exact).max()) <= 1e-4


def test_gpu_max_updates_and_default_workers():
    import cupy as cp

    X, y = _data()
    kernel = make_kernel("rbf", "scale", 3, 0.0, X)
    res = gcd_solve(cp.asarray(X), cp.asarray(y), cp.ones(len(y)), kernel, _blocks(len(y), 4),
                    tol=1e-8, max_updates=100)
    assert res.n_updates == 100 and not res.converged
    assert gcd_default_workers(cp.zeros(1)) >= 1


def test_gpu_default_update_cap_ends_the_run_and_the_fit_warns(monkeypatch):
    import cupy as cp

    from gpuml.kernels.gcd import cuda as cuda_gcd

    monkeypatch.setattr(cuda_gcd, "default_max_updates", lambda n: 50)
    X, y = _data()
    kernel = make_kernel("rbf", "scale", 3, 0.0, X)
    res = gcd_solve(cp.asarray(X), cp.asarray(y), cp.ones(len(y)), kernel, _blocks(len(y), 8),
                    tol=1e-8)
    assert res.n_updates == 50 and not res.converged
    with pytest.warns(ConvergenceWarning, match="update cap"):
        AsyGCDSVC(n_workers=4, tol=1e-8, device="cuda").fit(cp.asarray(X), cp.asarray(y))


def _pairs(workers):
    X, digit = load_digits(return_X_y=True)
    X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    problems = []
    for a in range(10):
        for b in range(a + 1, 10):
            rows = np.flatnonzero((digit == a) | (digit == b))
            y = np.where(digit[rows] == b, 1.0, -1.0)
            C = np.where(np.arange(len(rows)) % 3 == 0, 0.5, 2.0)
            problems.append(GCDProblem(rows, y, C, _blocks(len(rows), workers, a * 10 + b),
                                       random_state=a * 10 + b))
    return X, problems


@pytest.fixture(scope="module")
def pairs_serial():
    X, problems = _pairs(1)
    kernel = make_kernel("rbf", "scale", 3, 0.0, X)
    refs = [gcd_solve(X[p.rows], p.y, p.C, kernel, p.blocks, tol=1e-7) for p in problems]
    return X, kernel, refs


@pytest.mark.parametrize("capacity", [None, 16])
def test_gpu_batch_of_pairs_equals_cpu_pairs(pairs_serial, monkeypatch, capacity):
    # 45 one-vs-one problems of 4 blocks each: one launch of 180 blocks, whose first 10
    # problems get Q (the cache holds just those) while the others compute kernel values on
    # the fly; or (capacity 16) twelve launches of at most 4 problems, one after another.
    import cupy as cp

    from gpuml.kernels.gcd import cuda as cuda_gcd

    X, kernel, refs = pairs_serial
    _, problems = _pairs(4)
    if capacity is not None:
        monkeypatch.setattr(cuda_gcd, "resident_blocks", lambda fn, device: capacity)
    launches = []
    real_run = cuda_gcd._run_launch
    monkeypatch.setattr(cuda_gcd, "_run_launch",
                        lambda X_, k, batch, *a: launches.append(len(batch)) or
                        real_run(X_, k, batch, *a))
    q_bytes = sum(len(p.rows) ** 2 for p in problems[:10]) * 8
    out = gcd_solve_batch(cp.asarray(X), kernel, problems, tol=1e-5, cache_bytes=q_bytes)
    assert launches == ([45] if capacity is None else [4] * 11 + [1])
    for p, res, ref in zip(problems, out, refs):
        assert res.converged and res.n_workers == 4 and isinstance(res.alpha, cp.ndarray)
        assert abs(res.objective - ref.objective) <= 1e-4 * abs(ref.objective)
        alpha = cp.asnumpy(res.alpha)
        assert np.all(alpha >= 0) and np.all(alpha <= p.C)
        exact = gcd_gradient(X[p.rows], p.y, kernel, alpha)
        assert float(np.abs(cp.asnumpy(res.gradient) - exact).max()) <= 1e-9


def test_gpu_multiclass_fit_in_one_launch_equals_cpu(monkeypatch):
    import cupy as cp

    from gpuml.kernels.gcd import cuda as cuda_gcd

    X, digit = load_digits(return_X_y=True)
    X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    launches = []
    real_run = cuda_gcd._run_launch
    monkeypatch.setattr(cuda_gcd, "_run_launch",
                        lambda X_, k, batch, *a: launches.append(len(batch)) or
                        real_run(X_, k, batch, *a))
    gpu = AsyGCDSVC(tol=1e-5, device="cuda", random_state=0).fit(cp.asarray(X),
                                                                 cp.asarray(digit))
    cpu = AsyGCDSVC(n_workers=1, tol=1e-7, device="cpu", random_state=0).fit(X, digit)
    assert launches == [45]
    np.testing.assert_allclose(gpu.objective_, cpu.objective_, rtol=1e-4)
    assert np.all(gpu.max_violation_ < 1e-5)
    assert float((gpu.predict(X) == cpu.predict(X)).mean()) >= 0.99


def test_gpu_memory_is_checked_before_the_work(monkeypatch):
    import cupy as cp

    from gpuml import _backend
    from gpuml.kernels.gcd import cuda as cuda_gcd

    X, y = _data()
    n = len(y)
    kernel = make_kernel("rbf", "scale", 3, 0.0, X)
    K = cp.asarray(kernel.matrix(X))
    free = cuda_gcd.BUILD_BYTES + (16 << 20)  # the 25.8 MB kernel matrix does not fit
    monkeypatch.setattr(_backend, "available_bytes", lambda xp: free)
    with pytest.raises(MemoryError, match=rf"MiB of GPU .* {n} x {n} kernel matrix"):
        gcd_solve(K, cp.asarray(y), cp.ones(n), Kernel("precomputed"), _blocks(n, 4))
    # Features to fall back on: Q would fit the cache but not the memory, so the kernel
    # values are computed on the fly instead, with the same result.
    built = []
    real_fill = cuda_gcd._fill_q
    monkeypatch.setattr(cuda_gcd, "_fill_q", lambda *a: built.append(1) or real_fill(*a))
    res = gcd_solve(cp.asarray(X), cp.asarray(y), cp.ones(n), kernel, _blocks(n, 4), tol=1e-4,
                    cache_bytes=1 << 30)
    assert res.converged and built == []
    monkeypatch.undo()
    assert gcd_default_cache_bytes(cp.zeros(1)) >= 0.2 * _backend.available_bytes(cp)


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
