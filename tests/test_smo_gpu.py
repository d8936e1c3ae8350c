"""GPU SMO (gpuml/kernels/smo/smo.cu) against the CPU solver; skipped without a CUDA device."""

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

    from gpuml.kernels.smo import cuda as gpu_smo

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


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_neighbor_weights_on_gpu_match_cpu(dtype):
    """combine="neighbors"' weights: the GEMM and partial sort on the GPU, NumPy's as oracle."""
    import cupy as cp

    from gpuml.routing import neighbor_weights

    rng = np.random.default_rng(0)
    X, V = rng.normal(size=(300, 12)).astype(dtype), rng.normal(size=(500, 12)).astype(dtype)
    part = rng.integers(0, 6, size=500)
    for k in (1, 20):
        np.testing.assert_array_equal(neighbor_weights(cp.asarray(X), cp.asarray(V), part, 6, k),
                                      neighbor_weights(X, V, part, 6, k))
        # Among each row's 3 nearest parts (by centre) only.
        C = rng.normal(size=(6, 12)).astype(dtype)
        np.testing.assert_array_equal(
            neighbor_weights(cp.asarray(X), cp.asarray(V), part, 6, k, centers=cp.asarray(C),
                             n_searched=3),
            neighbor_weights(X, V, part, 6, k, centers=C, n_searched=3))


@pytest.mark.parametrize("combine", ["neighbors", "auto"])
@pytest.mark.parametrize("n_partitions", [4, 12])
def test_neighbors_prediction_on_gpu_matches_cpu(n_partitions, combine, monkeypatch):
    """The blended decision values of a model fitted on the CPU, predicted on the GPU (12
    parts: each row's 8 nearest searched; the RBF values from the search's distances);
    "auto": the rows left open found from the nearest values on the GPU, then blended."""
    import cupy as cp

    import gpuml.routing as routing

    monkeypatch.setattr(routing, "NEIGHBOR_PARTS", 8)

    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    cpu = CASVMClassifier(n_partitions=n_partitions, random_state=0, device="cpu",
                          combine=combine).fit(X, y)
    gpu = pickle.loads(pickle.dumps(cpu)).set_params(device="cuda")
    on_gpu = cp.asnumpy(gpu.decision_function(cp.asarray(X)))
    # Rows whose k-th and (k+1)-th nearest support vectors are as near within rounding may
    # count another part on each device; every other row's values agree.
    same = np.all(np.isclose(on_gpu, cpu.decision_function(X), rtol=1e-9, atol=1e-9), axis=1)
    assert same.mean() >= 0.99


@pytest.mark.parametrize("name", ["rbf", "linear", "poly", "sigmoid"])
def test_rows_on_the_fly_match_cpu(cancer, name, monkeypatch):
    """The path for kernel matrices that do not fit: rows computed in the kernel each step."""
    import cupy as cp

    from gpuml.kernels.smo import cuda as gpu_smo

    monkeypatch.setattr(gpu_smo, "_matrix_budget", lambda cp, reserved: 0)
    X, y = cancer
    kernel = make_kernel(name, "scale", degree=2, coef0=0.5, X=X)
    cpu = smo_solve(kernel, X, y, 0.5)
    gpu = smo_solve(kernel, cp.asarray(X), y, 0.5)
    assert gpu.converged
    assert gpu.objective == pytest.approx(cpu.objective, rel=1e-4)


def digits_parts(sizes):
    """Digits split into parts of the given sizes, with every one-vs-one problem of each."""
    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    perm = np.random.default_rng(0).permutation(len(y))
    parts = np.split(perm, np.cumsum(sizes)[:-1])
    problems, Xs = [], []
    for g, rows in enumerate(parts):
        Xs.append(X[rows])
        labels = y[rows]
        for a in range(10):
            for b in range(a + 1, 10):
                local = np.flatnonzero((labels == a) | (labels == b))
                problems.append(SMOProblem(g, local, np.where(labels[local] == a, 1.0, -1.0),
                                           1.0))
    return X, Xs, problems


@pytest.mark.parametrize("grid", [True, False])
def test_float32_state_in_double_matches_float64_oracle(cancer, grid, monkeypatch):
    """float32 data: the kernel matrix in float32, alpha and G in double, as LIBSVM."""
    import cupy as cp

    from gpuml.kernels.smo import cuda as gpu_smo

    monkeypatch.setattr(gpu_smo, "GRID_MIN_SIZE", 0 if grid else 1 << 30)
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    cpu = smo_solve(kernel, X, y, 1.0)
    gpu = smo_solve(kernel, cp.asarray(X.astype(np.float32)), y, 1.0)
    assert gpu.converged
    assert gpu.alpha.dtype == cp.float64 and gpu.gradient.dtype == cp.float64
    assert gpu.objective == pytest.approx(cpu.objective, rel=1e-5)
    assert gpu.intercept == pytest.approx(cpu.intercept, abs=1e-3)
    assert abs(float(cp.asnumpy(gpu.alpha) @ y)) < 1e-10


def test_float32_batch_matches_float64_oracle():
    import cupy as cp

    X, Xs, problems = digits_parts([450, 450, 450, 447])
    kernel = make_kernel("rbf", "scale", X=X)
    cpu = smo_solve_batch(kernel, Xs, problems)
    gpu = smo_solve_batch(kernel, [cp.asarray(x, dtype=cp.float32) for x in Xs], problems)
    for c, g in zip(cpu, gpu):
        assert g.converged
        assert g.objective == pytest.approx(c.objective, rel=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_chunks_and_on_the_fly_match_cpu(dtype, monkeypatch):
    """Matrices that do not fit together: chunks of groups, and one group on the fly."""
    import cupy as cp

    from gpuml.kernels.smo import cuda as gpu_smo

    itemsize = np.dtype(dtype).itemsize
    # Group 0 (600 rows) does not fit alone; groups 1 and 2 fit together, 3 goes alone.
    budget = 2 * 400 * 400 * itemsize
    monkeypatch.setattr(gpu_smo, "_matrix_budget", lambda cp, reserved: budget)
    plans = []
    plan = gpu_smo.plan_chunks

    def spy(*args):
        plans.append(plan(*args))
        return plans[-1]

    monkeypatch.setattr(gpu_smo, "plan_chunks", spy)
    X, Xs, problems = digits_parts([600, 400, 400, 397])
    kernel = make_kernel("rbf", "scale", X=X)
    cpu = smo_solve_batch(kernel, Xs, problems)
    gpu = smo_solve_batch(kernel, [cp.asarray(x, dtype=dtype) for x in Xs], problems)
    assert plans == [([[1, 2], [3]], [0])]
    for c, g in zip(cpu, gpu):
        assert g.converged
        assert g.objective == pytest.approx(c.objective, rel=1e-5)
        assert g.intercept == pytest.approx(c.intercept, abs=1e-2)


def test_chunked_estimator_matches_cpu(monkeypatch):
    from gpuml.kernels.smo import cuda as gpu_smo

    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    # About one part's matrix per chunk: four launches instead of one.
    monkeypatch.setattr(gpu_smo, "_matrix_budget", lambda cp, reserved: 460 * 460 * 8)
    cpu = CASVMClassifier(n_partitions=4, random_state=0, device="cpu").fit(X, y)
    gpu = CASVMClassifier(n_partitions=4, random_state=0, device="cuda").fit(X, y)
    np.testing.assert_allclose(gpu.objective_, cpu.objective_, rtol=1e-4)
    assert np.mean(gpu.predict(X) == cpu.predict(X)) >= 0.995


def test_warm_start_in_a_later_chunk(monkeypatch):
    import cupy as cp

    from gpuml.kernels.smo import cuda as gpu_smo

    X, Xs, problems = digits_parts([450, 450, 450, 447])
    kernel = make_kernel("rbf", "scale", X=X)
    cold = smo_solve_batch(kernel, Xs, problems, tol=1e-5)
    warm = [SMOProblem(p.group, p.idx, p.y, p.C, c.alpha) for p, c in zip(problems, cold)]
    monkeypatch.setattr(gpu_smo, "_matrix_budget", lambda cp, reserved: 460 * 460 * 8)
    out = smo_solve_batch(kernel, [cp.asarray(x) for x in Xs], warm)
    for c, g in zip(cold, out):
        assert g.n_iter == 0
        assert g.objective == pytest.approx(c.objective, rel=1e-9)


def test_precomputed_matrix_too_large_is_refused(cancer, monkeypatch):
    import cupy as cp

    from gpuml.kernels.smo import cuda as gpu_smo

    X, y = cancer
    monkeypatch.setattr(gpu_smo, "_matrix_budget", lambda cp, reserved: 0)
    K = cp.asarray(X @ X.T)
    with pytest.raises(MemoryError, match="precomputed kernel matrix .* device='cpu'"):
        smo_solve(make_kernel("precomputed"), K, y, 1.0)


@pytest.mark.parametrize("grid", [True, False])
def test_iteration_cap_stops_like_cpu(cancer, grid, monkeypatch):
    import cupy as cp

    from gpuml.kernels.smo import cuda as gpu_smo

    monkeypatch.setattr(gpu_smo, "GRID_MIN_SIZE", 0 if grid else 1 << 30)
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    cpu = smo_solve(kernel, X, y, 1.0, max_iter=7, shrinking=False)
    gpu = smo_solve(kernel, cp.asarray(X), y, 1.0, max_iter=7)
    assert not gpu.converged and gpu.n_iter == 7
    assert not cpu.converged and cpu.n_iter == 7
    # Seven identical steps from zero: the same point.
    np.testing.assert_allclose(cp.asnumpy(gpu.alpha), cpu.alpha, atol=1e-10)
    assert gpu.objective == pytest.approx(cpu.objective, rel=1e-10)


def test_iteration_cap_on_the_fly_and_estimator_warning(cancer, monkeypatch):
    import cupy as cp
    from sklearn.exceptions import ConvergenceWarning

    from gpuml.kernels.smo import cuda as gpu_smo

    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    monkeypatch.setattr(gpu_smo, "_matrix_budget", lambda cp, reserved: 0)
    rows = smo_solve(kernel, cp.asarray(X), y, 1.0, max_iter=7)
    assert not rows.converged and rows.n_iter == 7
    monkeypatch.undo()
    with pytest.warns(ConvergenceWarning, match=r"Solver terminated early \(max_iter=5\)\.  "
                      "Consider pre-processing"):
        clf = CASVMClassifier(n_partitions=1, max_iter=5, device="cuda").fit(X, y)
    assert clf.fit_status_ == 1 and clf.n_iter_.max() == 5


@pytest.mark.parametrize("one_launch", [False, True])
def test_c_path_matches_cpu(cancer, one_launch):
    """smo_solve_path on CuPy rows (a launch per C, seeded, or one launch for every C)
    reaches the CPU path's optimum for every C."""
    import cupy as cp

    from gpuml.kernels import smo_solve_path

    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    problems = [SMOProblem(0, np.arange(len(y)), y)]
    Cs = [0.1, 1.0, 10.0]
    cpu = smo_solve_path(kernel, [X], problems, Cs)
    gpu = smo_solve_path(kernel, [cp.asarray(X)], problems, Cs, one_launch=one_launch)
    assert len(gpu) == len(Cs)
    for c in range(len(Cs)):
        assert gpu[c][0].converged
        assert gpu[c][0].objective == pytest.approx(cpu[c][0].objective, rel=1e-4)
        np.testing.assert_allclose(cp.asnumpy(gpu[c][0].alpha), cpu[c][0].alpha, atol=1e-2)


def test_search_on_gpu_matches_cpu():
    """CASVMClassifierCV on the GPU: the CPU search's choice and scores (digits, parts)."""
    from gpuml import CASVMClassifierCV

    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    kw = dict(Cs=[1, 10], gammas=[0.3, 1], cv=3, n_partitions=2, random_state=0)
    cpu = CASVMClassifierCV(device="cpu", **kw).fit(X, y)
    gpu = CASVMClassifierCV(device="gpu", **kw).fit(X, y)
    assert gpu.best_params_ == pytest.approx(cpu.best_params_)
    np.testing.assert_allclose(gpu.cv_results_["mean_test_score"],
                               cpu.cv_results_["mean_test_score"], atol=0.01)
    assert np.mean(gpu.predict(X) == cpu.predict(X)) > 0.99
