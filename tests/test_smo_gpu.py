"""GPU SMO (gpuml/kernels/_cuda/smo.cu) against the CPU solver; skipped without a CUDA device."""

import pickle

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.preprocessing import StandardScaler

from gpuml.estimators.casvm import CASVMClassifier
from gpuml.kernels import SMOProblem, make_kernel, smo_solve, smo_solve_batch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), np.where(y == 1, 1.0, -1.0)


@pytest.mark.parametrize("grid", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_single_problem_matches_cpu(cancer, dtype, grid, monkeypatch):
    import cupy as cp

    from gpuml.kernels._cuda import smo as gpu_smo

    # The cooperative grid kernel or one block, on the same problem.
    monkeypatch.setattr(gpu_smo, "GRID_MIN_SIZE", 0 if grid else 1 << 30)
    X, y = cancer
    X = X.astype(dtype)
    kernel = make_kernel("rbf", "scale", X=X)
    cpu = smo_solve(kernel, X, y, 1.0)
    gpu = smo_solve(kernel, cp.asarray(X), y, 1.0)
    assert gpu.converged
    rel = 1e-4 if dtype == np.float64 else 1e-3
    assert gpu.objective == pytest.approx(cpu.objective, rel=rel)
    assert gpu.intercept == pytest.approx(cpu.intercept, abs=1e-2)
    np.testing.assert_allclose(cp.asnumpy(gpu.alpha), cpu.alpha, atol=1e-2)
    assert abs(float(cp.asnumpy(gpu.alpha) @ y)) < 1e-4


def test_block_kernel_many_problems_match_cpu():
    import cupy as cp

    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    kernel = make_kernel("rbf", "scale", X=X)
    parts = np.array_split(np.random.default_rng(0).permutation(len(y)), 4)
    problems, Xs = [], []
    for g, rows in enumerate(parts):
        Xs.append(X[rows])
        labels = y[rows]
        for a in range(10):
            for b in range(a + 1, 10):
                local = np.flatnonzero((labels == a) | (labels == b))
                problems.append(SMOProblem(g, local, np.where(labels[local] == a, 1.0, -1.0),
                                           1.0))
    cpu = smo_solve_batch(kernel, Xs, problems)
    gpu = smo_solve_batch(kernel, [cp.asarray(x) for x in Xs], problems)
    for c, g in zip(cpu, gpu):
        assert g.converged
        assert g.objective == pytest.approx(c.objective, rel=1e-4)


def test_warm_start_on_gpu(cancer):
    import cupy as cp

    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    cold = smo_solve(kernel, X, y, 1.0, tol=1e-5)
    warm = smo_solve(kernel, cp.asarray(X), y, 1.0, alpha0=cold.alpha)
    assert warm.n_iter == 0
    assert warm.objective == pytest.approx(cold.objective, rel=1e-9)


@pytest.mark.parametrize("P", [1, 4])
def test_estimator_gpu_matches_cpu_and_pickles_to_cpu(P):
    import cupy as cp

    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    cpu = CASVMClassifier(n_partitions=P, random_state=0, device="cpu").fit(X, y)
    gpu = CASVMClassifier(n_partitions=P, random_state=0, device="cuda").fit(X, y)
    np.testing.assert_allclose(gpu.objective_, cpu.objective_, rtol=1e-4)
    assert np.mean(gpu.predict(X) == cpu.predict(X)) >= 0.995
    out = gpu.predict(cp.asarray(X))
    assert isinstance(out, cp.ndarray)
    back = pickle.loads(pickle.dumps(gpu))
    assert "_device_cache" not in back.__dict__
    back.set_params(device="cpu")
    np.testing.assert_array_equal(back.predict(X), gpu.predict(X))


@pytest.mark.parametrize("name", ["rbf", "linear", "poly", "sigmoid"])
def test_rows_on_the_fly_match_cpu(cancer, name, monkeypatch):
    """The path for kernel matrices that do not fit: rows computed in the kernel each step."""
    import cupy as cp

    from gpuml.kernels._cuda import smo as gpu_smo

    monkeypatch.setattr(gpu_smo, "_matrices_fit", lambda *args: False)
    X, y = cancer
    kernel = make_kernel(name, "scale", degree=2, coef0=0.5, X=X)
    cpu = smo_solve(kernel, X, y, 0.5)
    gpu = smo_solve(kernel, cp.asarray(X), y, 0.5)
    assert gpu.converged
    assert gpu.objective == pytest.approx(cpu.objective, rel=1e-4)
