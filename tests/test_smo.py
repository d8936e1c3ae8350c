"""The SMO solver (gpuml.kernels.smo_solve / smo_solve_batch) against LIBSVM and its own KKT."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from gpuml.kernels import Kernel, SMOProblem, make_kernel, smo_solve, smo_solve_batch
from gpuml.kernels.smo.cpu import sgemm_applies, sgemm_matrix


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), np.where(y == 1, 1.0, -1.0)


def dual_objective(K, y, alpha):
    v = alpha * y
    return 0.5 * v @ K @ v - alpha.sum()


def svc_alpha(svc, n):
    alpha = np.zeros(n)
    alpha[svc.support_] = np.abs(svc.dual_coef_[0])
    return alpha


def kkt_gap(K, y, C, alpha):
    """max_{I_up} -yG - min_{I_low} -yG for the minimisation dual."""
    G = y * (K @ (alpha * y)) - 1.0
    up = ((y > 0) & (alpha < C)) | ((y < 0) & (alpha > 0))
    low = ((y > 0) & (alpha > 0)) | ((y < 0) & (alpha < C))
    return np.max(-y[up] * G[up]) - np.min(-y[low] * G[low])


@pytest.mark.parametrize("shrinking", [True, False])
@pytest.mark.parametrize("cache_mb", [1024.0, 0.05])
def test_matches_libsvm(cancer, shrinking, cache_mb):
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    res = smo_solve(kernel, X, y, 1.0, cache_size=cache_mb, shrinking=shrinking)
    svc = SVC(C=1.0, gamma="scale", shrinking=shrinking).fit(X, y)
    K = kernel.matrix(X)
    ref = dual_objective(K, y, svc_alpha(svc, len(y)))
    assert res.converged
    assert abs(res.objective - ref) <= 1e-3 * abs(ref)
    # Rows computed on demand are cached in float32, as LIBSVM's.
    assert res.objective == pytest.approx(dual_objective(K, y, res.alpha), rel=1e-6)
    assert abs(np.count_nonzero(res.alpha) - len(svc.support_)) <= 0.01 * len(svc.support_)
    # LIBSVM's decision function is -(our) sign convention for its label order; compare values.
    ours = K @ (res.alpha * y) + res.intercept
    theirs = svc.decision_function(X)
    assert np.mean(np.sign(ours) == np.sign(theirs)) >= 0.995
    assert kkt_gap(K, y, 1.0, res.alpha) < 1e-3
    assert abs(res.alpha @ y) < 1e-9


def test_small_cache_equals_full_matrix(cancer):
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    full = smo_solve(kernel, X, y, 2.0, shrinking=False)
    tiny = smo_solve(kernel, X, y, 2.0, cache_size=3 * X.shape[0] * 8 / 2**20, shrinking=False)
    # Three cached rows in float32 against the whole matrix in float64: the same path
    # up to float32 rounding of the kernel values.
    assert abs(tiny.n_iter - full.n_iter) <= 0.02 * full.n_iter
    assert tiny.objective == pytest.approx(full.objective, rel=1e-6)
    np.testing.assert_allclose(tiny.alpha, full.alpha, atol=1e-4)


def test_per_sample_C_matches_svc_sample_weight(cancer):
    X, y = cancer
    w = np.random.default_rng(0).uniform(0.2, 3.0, size=len(y))
    kernel = make_kernel("rbf", "scale", X=X)
    res = smo_solve(kernel, X, y, 0.7 * w)
    svc = SVC(C=0.7).fit(X, y, sample_weight=w)
    K = kernel.matrix(X)
    ref = dual_objective(K, y, svc_alpha(svc, len(y)))
    assert abs(res.objective - ref) <= 1e-3 * abs(ref)
    assert np.all(res.alpha <= 0.7 * w + 1e-12)


def test_warm_start_from_solution_takes_few_steps(cancer):
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    cold = smo_solve(kernel, X, y, 1.0, tol=1e-5)
    warm = smo_solve(kernel, X, y, 1.0, tol=1e-3, alpha0=cold.alpha)
    assert warm.n_iter == 0
    assert warm.objective == pytest.approx(cold.objective, rel=1e-12)
    np.testing.assert_allclose(warm.gradient, cold.gradient, atol=1e-8)


def test_warm_start_from_a_partial_solution(cancer):
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    partial = smo_solve(kernel, X, y, 1.0, max_iter=50)
    assert not partial.converged and partial.n_iter == 50
    resumed = smo_solve(kernel, X, y, 1.0, alpha0=partial.alpha)
    cold = smo_solve(kernel, X, y, 1.0)
    assert resumed.converged
    assert resumed.objective == pytest.approx(cold.objective, rel=1e-4)


def test_rejects_bad_problems(cancer):
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    with pytest.raises(ValueError, match="both classes"):
        smo_solve(kernel, X, np.ones_like(y))
    with pytest.raises(ValueError, match="-1 and \\+1"):
        smo_solve(kernel, X, (y > 0).astype(float))
    with pytest.raises(ValueError, match="C must be positive"):
        smo_solve(kernel, X, y, 0.0)
    with pytest.raises(ValueError, match="infeasible"):
        smo_solve(kernel, X, y, 1.0, alpha0=np.full(len(y), 0.5) * (y > 0))
    with pytest.raises(ValueError, match="infeasible"):
        smo_solve(kernel, X, y, 1.0, alpha0=np.full(len(y), 2.0))


def test_precomputed_equals_rbf(cancer):
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    K = kernel.matrix(X)
    a = smo_solve(kernel, X, y, 1.0)
    b = smo_solve(Kernel("precomputed"), K, y, 1.0, cache_size=0.5)
    np.testing.assert_allclose(a.alpha, b.alpha, atol=1e-8)
    assert a.intercept == pytest.approx(b.intercept, abs=1e-8)


@pytest.mark.parametrize("name", ["linear", "poly", "sigmoid"])
def test_other_kernels_match_libsvm(cancer, name):
    X, y = cancer
    X = X[:200]
    y = y[:200]
    kernel = make_kernel(name, "scale", degree=3, coef0=0.5 if name != "linear" else 0.0, X=X)
    res = smo_solve(kernel, X, y, 0.5)
    svc = SVC(C=0.5, kernel=name, gamma="scale", coef0=kernel.coef0).fit(X, y)
    K = kernel.matrix(X)
    ref = dual_objective(K, y, svc_alpha(svc, len(y)))
    assert abs(res.objective - ref) <= 1e-3 * abs(ref)


def test_batch_shares_group_matrices_and_matches_single_solves():
    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:600]
    y = y[:600]
    kernel = make_kernel("rbf", "scale", X=X)
    problems = []
    for a, b in [(0, 1), (3, 8), (4, 9)]:
        idx = np.flatnonzero((y == a) | (y == b))
        problems.append(SMOProblem(0, idx, np.where(y[idx] == a, 1.0, -1.0), 1.0))
    batch = smo_solve_batch(kernel, [X], problems, n_jobs=2)
    for prob, res in zip(problems, batch):
        single = smo_solve(kernel, X[prob.idx], prob.y, 1.0, cache_size=0.1)
        # Same problem, kernel values equal up to rounding (one GEMM vs row batches).
        assert res.objective == pytest.approx(single.objective, rel=1e-4)
        K = kernel.matrix(X[prob.idx])
        assert np.all(np.sign(K @ (res.alpha * prob.y) + res.intercept)
                      == np.sign(K @ (single.alpha * prob.y) + single.intercept))


def test_float32_input(cancer):
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    a = smo_solve(kernel, X, y)
    b = smo_solve(kernel, X.astype(np.float32), y, cache_size=0.2)
    assert b.objective == pytest.approx(a.objective, rel=1e-4)


def test_kernel_matrices_held_at_most_one_per_thread(monkeypatch):
    """Each group's matrix is made just before its problems and dropped after them: on
    one thread the memory of one part's matrix, on n_jobs threads (a task per group) of
    n_jobs, not of all."""
    import weakref

    import gpuml.kernels.smo.cpu as cpu_smo

    X, y = load_digits(return_X_y=True)
    X, y = StandardScaler().fit_transform(X)[:600], y[:600]
    kernel = make_kernel("rbf", "scale", X=X)
    Xs = [X[g::4] for g in range(4)]
    problems = [SMOProblem(g, np.arange(len(Xg)), np.where(y[g::4] < 5, 1.0, -1.0), 1.0)
                for g, Xg in enumerate(Xs)]
    alive, most = [], []
    make = cpu_smo._make_matrix

    def tracked(*args):
        K = make(*args)
        alive.append(weakref.ref(K))
        most.append(sum(r() is not None for r in alive))
        return K

    monkeypatch.setattr(cpu_smo, "_make_matrix", tracked)
    one = smo_solve_batch(kernel, Xs, problems, n_jobs=1)
    assert most == [1, 1, 1, 1]
    # Two threads, 16 groups of one problem each (8 chunks per thread): each task makes
    # and drops its group's matrix.
    Xs = [X[g::16] for g in range(16)]
    problems = [SMOProblem(g, np.arange(len(Xg)), np.where(y[g::16] < 5, 1.0, -1.0), 1.0)
                for g, Xg in enumerate(Xs)]
    one = smo_solve_batch(kernel, Xs, problems, n_jobs=1)
    alive.clear(), most.clear()
    two = smo_solve_batch(kernel, Xs, problems, n_jobs=2)
    assert max(most) <= 2 and len(most) == 16
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a.alpha, b.alpha)


@pytest.mark.parametrize("n_jobs", [None, 2])
def test_batch_equals_each_problem_alone(n_jobs):
    """The compiled batch (chunks of problems per call, in threads; one group's matrix at a
    time on one thread) changes no result."""
    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:900]
    y = y[:900]
    kernel = make_kernel("rbf", "scale", X=X)
    w = np.random.default_rng(1).uniform(0.5, 2.0, size=len(y))
    groups = [np.flatnonzero(np.arange(len(y)) % 3 == g) for g in range(3)]
    Xs = [X[rows] for rows in groups]
    problems = []
    for g, rows in enumerate(groups):
        yg = y[rows]
        for a, b in [(0, 1), (3, 8), (4, 9), (1, 7)]:
            idx = np.flatnonzero((yg == a) | (yg == b))
            problems.append(SMOProblem(g, idx, np.where(yg[idx] == a, 1.0, -1.0), w[rows[idx]]))
        # A whole group as one problem, and a warm-started one.
        problems.append(SMOProblem(g, np.arange(len(rows)), np.where(yg < 5, 1.0, -1.0), 1.0))
    cold = smo_solve_batch(kernel, Xs, [problems[-1]])[0]
    problems.append(SMOProblem(2, problems[-1].idx, problems[-1].y, 1.0, alpha0=cold.alpha))
    for shrinking in (False, True):
        batch = smo_solve_batch(kernel, Xs, problems, n_jobs=n_jobs, shrinking=shrinking)
        assert len(batch) == len(problems)
        for prob, res in zip(problems, batch):
            alone = smo_solve_batch(kernel, Xs, [prob], shrinking=shrinking)[0]
            np.testing.assert_array_equal(res.alpha, alone.alpha)
            assert res.objective == alone.objective
            assert res.intercept == alone.intercept
            assert res.n_iter == alone.n_iter and res.converged
            # Against an independent solve on the problem's own rows and kernel matrix.
            single = smo_solve(kernel, Xs[prob.group][prob.idx], prob.y, prob.C,
                               shrinking=shrinking, alpha0=prob.alpha0)
            assert single.n_iter == res.n_iter
            np.testing.assert_allclose(single.alpha, res.alpha, atol=1e-9)
            assert single.objective == pytest.approx(res.objective, rel=1e-12)
    assert batch[-1].n_iter == 0


def test_default_threads_follow_the_work_and_the_blas_limit(monkeypatch):
    """``n_jobs=None``: one thread for a small batch, one per PART_THREAD_MIN_WORK of a large one,
    at most the threads BLAS may use (a limit from outside, as joblib's process workers and
    Dask's set, is honoured); an int is joblib's. The threads chosen are the ones that
    solve, and they change no result beyond rounding."""
    from threadpoolctl import threadpool_limits

    from gpuml.kernels import _threads as threads
    from gpuml.kernels import part_threads
    from gpuml.kernels.smo import cpu

    parts = np.full(20, 2048)  # ten times PART_THREAD_MIN_WORK
    assert part_threads(None, np.full(3, 2000)) == 1
    with threadpool_limits(limits=2, user_api="blas"):
        assert part_threads(None, parts) == 2
        assert part_threads(None, np.full(5, 2048)) == 2
        assert part_threads(None, np.full(3, 2048)) == 1  # under two threads' work
    with threadpool_limits(limits=1, user_api="blas"):
        assert part_threads(None, parts) == 1
    assert part_threads(1, parts) == 1 and part_threads(2, np.full(3, 10)) == 2

    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:600]
    kernel = make_kernel("rbf", "scale", X=X)
    groups = np.array_split(np.arange(600), 6)
    Xs = [X[rows] for rows in groups]
    problems = [SMOProblem(g, np.arange(len(rows)), np.where(y[rows] < 5, 1.0, -1.0), 1.0)
                for g, rows in enumerate(groups)]
    used = []
    real = cpu._in_threads
    monkeypatch.setattr(cpu, "_in_threads", lambda fn, items, n_jobs, on_result=None: (
        used.append(n_jobs), real(fn, items, n_jobs, on_result))[1])
    one = smo_solve_batch(kernel, Xs, problems, n_jobs=1)
    assert set(used) == {1}
    used.clear()
    monkeypatch.setattr(threads, "PART_THREAD_MIN_WORK", 100**2)
    with threadpool_limits(limits=2, user_api="blas"):
        default = smo_solve_batch(kernel, Xs, problems)
    assert set(used) == {2}
    for a, b in zip(one, default):  # equal but for BLAS's rounding on other threads
        np.testing.assert_allclose(a.alpha, b.alpha, atol=1e-8)
        assert a.intercept == pytest.approx(b.intercept, abs=1e-8)


def test_default_threads_are_one_inside_ranks_and_dask_tasks():
    """Inside work that already runs in parallel (the ranks of a multi-device fit, a Dask
    task, even of an in-process cluster whose BLAS is not limited) ``n_jobs=None`` takes
    one thread; an int is still the user's."""
    from dask.distributed import Client, LocalCluster
    from threadpoolctl import threadpool_limits

    from gpuml._backend import CPU
    from gpuml.distributed.placement import run_on_devices
    from gpuml.kernels import parallel_region, part_threads

    parts = np.full(20, 2048)
    with threadpool_limits(limits=2, user_api="blas"):
        assert part_threads(None, parts) == 2
        with parallel_region():
            assert part_threads(None, parts) == 1 and part_threads(2, parts) == 2
        assert part_threads(None, parts) == 2
        assert run_on_devices(lambda rank, backend: part_threads(None, parts), [CPU] * 2) \
            == [1, 1]
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            assert client.submit(part_threads, None, parts).result() == 1
            assert client.submit(part_threads, 2, parts).result() == 2


def test_batch_rejects_a_bad_problem_among_good_ones(cancer):
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    good = SMOProblem(0, np.arange(100), y[:100], 1.0)
    with pytest.raises(ValueError, match="both classes"):
        smo_solve_batch(kernel, [X], [good, SMOProblem(0, np.arange(5), np.ones(5)), good])
    with pytest.raises(ValueError, match="C must be positive"):
        smo_solve_batch(kernel, [X], [good, SMOProblem(0, np.arange(100), y[:100], -1.0)])
    with pytest.raises(ValueError, match="outside its group"):
        smo_solve_batch(kernel, [X], [good, SMOProblem(0, np.arange(100) + len(y) - 50,
                                                       y[:100])])
    with pytest.raises(ValueError, match="equal length"):
        smo_solve_batch(kernel, [X], [good, SMOProblem(0, np.arange(99), y[:100])])
    with pytest.raises(ValueError, match="group outside"):
        smo_solve_batch(kernel, [X], [good, SMOProblem(1, np.arange(100), y[:100])])


def test_iteration_limit_is_libsvms_cap():
    """max_iter=-1 stops at max(10^7, 100 n) steps, as LIBSVM (CPU and GPU solvers alike)."""
    from gpuml.kernels.smo import ITER_CAP_MIN, ITER_CAP_PER_VARIABLE, iteration_limit

    assert ITER_CAP_MIN == 10**7 and ITER_CAP_PER_VARIABLE == 100
    assert iteration_limit(-1, 10) == 10**7
    assert iteration_limit(-1, 200_000) == 2 * 10**7
    assert iteration_limit(5, 10**9) == 5
    assert iteration_limit(0, 3) == 0


@pytest.mark.parametrize("cache_mb", [1024.0, 0.05])
def test_max_iter_stops_dense_and_row_cached_paths(cancer, cache_mb):
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    res = smo_solve(kernel, X, y, 1.0, max_iter=7, cache_size=cache_mb, shrinking=False)
    assert not res.converged and res.n_iter == 7
    full = smo_solve(kernel, X, y, 1.0, max_iter=-1, cache_size=cache_mb)
    assert full.converged and full.n_iter < 10**7


# -- rbf kernel matrices of large parts in float32 (sgemm_matrix) ---------------------------

def _far_from_origin(n=2200, d=12, seed=0):
    """Rows far from the origin (mean 1e3, spread 1): float32 ||x||^2 cancels badly there."""
    rng = np.random.default_rng(seed)
    X = 1e3 + rng.normal(size=(n, d))
    y = np.where(X[:, 0] - 1e3 + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def test_sgemm_only_for_large_rbf_parts_with_a_small_rounding_bound(cancer):
    X, _ = cancer
    assert not sgemm_applies(make_kernel("rbf", "scale", X=X), X)  # 569 rows: float64
    Xf, _ = _far_from_origin()
    assert sgemm_applies(make_kernel("rbf", "scale", X=Xf), Xf)
    assert sgemm_applies(make_kernel("rbf", "scale", X=Xf), sp.csr_matrix(Xf))
    assert not sgemm_applies(Kernel("linear"), Xf)
    assert not sgemm_applies(make_kernel("rbf", 50.0, X=Xf), Xf)  # bound far above 1e-4


def test_sgemm_matrix_on_centred_rows():
    X, _ = _far_from_origin()
    kernel = make_kernel("rbf", "scale", X=X)
    K = sgemm_matrix(kernel, X, max_bytes=1 << 30)
    exact = kernel.matrix(X)
    assert K.dtype == np.float32 and K.shape == exact.shape
    np.testing.assert_array_equal(K, K.T)
    np.testing.assert_array_equal(np.diag(K), 1.0)
    # Centred: within a few float32 ulps of the float64 values. Uncentred rows
    # (norms ~1e7) would lose every digit of the distances.
    assert np.abs(K - exact).max() < 2e-6
    uncentred = kernel.matrix(X.astype(np.float32))
    assert np.abs(uncentred - exact).max() > 1e-2
    # The format never changes the values.
    np.testing.assert_array_equal(sgemm_matrix(kernel, sp.csr_matrix(X), max_bytes=1 << 30), K)


def test_float32_values_for_problems_on_rows_and_groups_of_2048_or_1024_rows(monkeypatch):
    """rbf values are float32 on centred rows for a problem computing its rows on demand
    (more than 1,024 rows, alone in its group: a binary part, the exact SVM) and for a
    group's matrix of 2,048+ rows, 1,024+ in a fit of several parts (the default parts
    hold just under 2,048); a smaller group's matrix keeps the data's dtype. The model
    stays that of float64 values to the solver's tolerance."""
    from gpuml import CASVMClassifier
    from gpuml.kernels.smo import cpu as smo
    from gpuml.kernels.smo import values

    X, y = _far_from_origin(n=2600, seed=4)
    made = []
    real_values, real_matrix = smo.values_of, smo._make_matrix

    def recorded(kernel, X, *args):
        out = real_values(kernel, X, *args)
        made.append((X.shape[0], out.dtype))
        return out

    def matrix(*args):
        K = real_matrix(*args)
        made.append((K.shape[0], K.dtype))
        return K

    monkeypatch.setattr(smo, "values_of", recorded)
    monkeypatch.setattr(smo, "_make_matrix", matrix)
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    two = CASVMClassifier(n_partitions=2, partition="random", random_state=0).fit(X, y)
    assert made == [(1300, f32), (1300, f32)]
    made.clear()
    one = CASVMClassifier(n_partitions=1).fit(X[:1500], y[:1500])
    assert made == [(1500, f32)]
    # a group of two problems (one-vs-one pairs): the solver's own switch,
    # smo_solve_batch(partitioned=)
    kernel = make_kernel("rbf", "scale", X=X)
    problems = [SMOProblem(0, np.arange(900), y[:900]),
                SMOProblem(0, np.arange(600, 1100), y[600:1100])]
    for partitioned, dtype in ((False, f64), (True, f32)):
        made.clear()
        smo_solve_batch(kernel, [X[:1100]], problems, partitioned=partitioned)
        assert made == [(1100, dtype)]
    # float64 values everywhere: the same model to the tolerance
    monkeypatch.setattr(values, "SGEMM_EXPONENT_ERROR", 0.0)
    float64 = CASVMClassifier(n_partitions=2, partition="random", random_state=0).fit(X, y)
    assert made[-2:] == [(1300, f64), (1300, f64)]
    np.testing.assert_allclose(two.decision_function(X), float64.decision_function(X),
                               atol=2e-2)
    assert (two.predict(X) != float64.predict(X)).mean() < 0.005
    assert one.score(X[:1500], y[:1500]) > 0.9


def test_solution_on_float32_kernel_matches_svc():
    """SMO on the SGEMM matrix ends where LIBSVM does, to its tolerance."""
    X, y = _far_from_origin(seed=3)
    svc = SVC(C=1.0, gamma="scale", tol=1e-3).fit(X, y)
    res = smo_solve(make_kernel("rbf", "scale", X=X), X, y, 1.0)
    ours = svc_alpha(svc, len(y))
    assert np.abs(res.alpha - ours).max() < 2e-2
    assert res.intercept == pytest.approx(svc.intercept_[0], abs=2e-4)
    K = make_kernel("rbf", "scale", X=X).matrix(X)
    ref = dual_objective(K, y, ours)
    assert abs(dual_objective(K, y, res.alpha) - ref) <= 1e-6 * abs(ref)


def _dense_batch(dtype, max_iter=-1, C=None, warm=False):
    """One-vs-one problems on digits (whole and gathered), laid out as solve_batch does."""
    from gpuml.kernels.smo import check_flat
    from gpuml.kernels.smo.cpu import _DenseRun

    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:400].astype(dtype)
    y = y[:400]
    K = np.ascontiguousarray(make_kernel("rbf", "scale", X=X).matrix(X))
    rng = np.random.default_rng(0)
    idxs, ys, Cs = [], [], []
    for a, b in [(0, 1), (3, 8), (4, 9), (1, 7), (2, 5)]:
        idx = np.flatnonzero((y == a) | (y == b))
        idxs.append(idx)
        ys.append(np.where(y[idx] == a, 1.0, -1.0))
        Cs.append(rng.uniform(0.2, 5.0, idx.size) if C is None else C)
    idxs.append(np.arange(len(y)))  # a whole-matrix problem
    ys.append(np.where(y < 5, 1.0, -1.0))
    Cs.append(1.0 if C is None else C)
    alpha0s = [None] * len(ys)
    if warm:  # a feasible, non-zero start: equal mass on one row of each class
        for w, yw in enumerate(ys):
            start = np.zeros(yw.size)
            start[np.flatnonzero(yw > 0)[0]] = start[np.flatnonzero(yw < 0)[0]] = 0.1
            alpha0s[w] = start
    checked = check_flat(ys, Cs, alpha0s)
    whole = np.array([i.size == len(y) for i in idxs])
    return K, _DenseRun(whole, np.concatenate(idxs), checked, 1e-3, max_iter, False)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", [{}, {"max_iter": 37}, {"C": np.inf}, {"warm": True}])
def test_numpy_twin_equals_compiled_dense_solver_bit_for_bit(dtype, case):
    """The NumPy twin that serves small fits while numba compiles is the same solver:
    identical dual variables, gradient, steps, intercepts and objectives."""
    from gpuml.kernels import _jit
    from gpuml.kernels.smo.cpu import _solve_dense_problems_numpy

    K, compiled = _dense_batch(dtype, **case)
    _, twin = _dense_batch(dtype, **case)
    which = np.arange(len(compiled.sizes), dtype=np.int64)
    with _jit.synchronous():  # the compiled function, whatever the cache holds
        compiled(K, which)
    _solve_dense_problems_numpy(K, *twin.args, twin.G, which, twin.settings[0], twin.limits,
                                twin.n_iter, twin.status, twin.rho, twin.objective)
    assert compiled.n_iter.min() > 0
    for name in ("n_iter", "status", "rho", "objective", "G"):
        np.testing.assert_array_equal(getattr(twin, name), getattr(compiled, name), name)
    np.testing.assert_array_equal(twin.checked.alpha, compiled.checked.alpha)


def test_small_batch_takes_the_twin_while_numba_compiles(monkeypatch):
    """Not compiled yet: the batch goes to the twin; large problems and shrinking never do."""
    from gpuml.kernels import _jit
    from gpuml.kernels.smo import cpu as smo

    K, run = _dense_batch(np.float64)
    K_ref, ref = _dense_batch(np.float64)
    which = np.arange(len(run.sizes), dtype=np.int64)
    with _jit.synchronous():
        ref(K_ref, which)
    twin = smo._solve_dense_problems_numpy
    calls = []
    monkeypatch.setattr(_jit, "ready", lambda dispatcher, *args, **kw: False)
    monkeypatch.setattr(smo, "_solve_dense_problems_numpy",
                        lambda *args: calls.append(len(args[8])) or twin(*args))
    run(K, which)
    assert calls == [len(which)]
    np.testing.assert_array_equal(run.checked.alpha, ref.checked.alpha)
    monkeypatch.setattr(smo, "NUMPY_TWIN_MAX_ROWS", int(run.sizes.max()) - 1)
    run(K, which)  # too large now: compiled (in this thread)
    monkeypatch.setattr(smo, "NUMPY_TWIN_MAX_ROWS", int(run.sizes.max()))
    run.shrinking = True
    run(K, which)  # shrinking: compiled
    run.shrinking = "auto"
    run(K, which)  # "auto" on problems this small: no shrinking, the twin
    assert calls == [len(which)] * 2


def test_many_small_groups_take_the_twin_only_when_the_batch_is_small(monkeypatch):
    """The parts of a CA-SVM are many groups of one small problem each, solved one group
    per call: the twin (while numba compiles, which waits for the fit to end) serves
    them only when the whole batch is small, else a large fit of small parts would run
    the twin in every call (a first CASVMClassifier(n_partitions=200) fit of 100,000 rows:
    20 s against 2 s)."""
    from gpuml.kernels import _jit
    from gpuml.kernels.smo import cpu as smo

    rng = np.random.default_rng(5)
    Xs = [rng.standard_normal((40, 3)) for _ in range(6)]
    problems = [SMOProblem(g, np.arange(40), np.where(X[:, 0] > 0, 1.0, -1.0), 1.0)
                for g, X in enumerate(Xs)]
    kernel = make_kernel("rbf", 0.5, X=Xs[0])
    with _jit.synchronous():
        expected = smo_solve_batch(kernel, Xs, problems, shrinking=False)
    twin = smo._solve_dense_problems_numpy
    calls = []
    monkeypatch.setattr(_jit, "ready", lambda dispatcher, *args, **kw: False)
    monkeypatch.setattr(smo, "_solve_dense_problems_numpy",
                        lambda *args: calls.append(len(args[8])) or twin(*args))
    for limit, twin_calls in ((6 * 40 ** 2, [1] * 6), (6 * 40 ** 2 - 1, [])):
        monkeypatch.setattr(smo, "NUMPY_TWIN_MAX_WORK", limit)
        calls.clear()
        results = smo_solve_batch(kernel, Xs, problems, shrinking=False)
        assert calls == twin_calls
        for got, want in zip(results, expected):
            np.testing.assert_array_equal(got.alpha, want.alpha)
            assert got.intercept == want.intercept


def test_shrinking_keeps_the_active_variables_in_order():
    """A shrink is a stable partition: the variables kept stay ascending (the sweeps read
    the kernel rows forwards), the shrunk ones are LIBSVM's be_shrunk set."""
    from gpuml.kernels.smo.loop import _ACTIVE, _UNSHRUNK, STATE_SIZE, _shrink, _shrinkable

    rng = np.random.default_rng(3)
    n = 500
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    C = np.full(n, 2.0)
    alpha = rng.choice([0.0, 2.0, 1.0], size=n, p=[0.5, 0.3, 0.2])
    G = rng.standard_normal(n)
    active = np.arange(n, dtype=np.int64)
    state = np.zeros(STATE_SIZE, dtype=np.int64)
    state[_ACTIVE] = n
    state[_UNSHRUNK] = 1
    assert not _shrink(y, C, alpha, G, active, state, 1e-3)
    kept = active[:state[_ACTIVE]]
    up = np.where(y > 0, alpha < C, alpha > 0)
    low = np.where(y > 0, alpha > 0, alpha < C)
    g1, g2 = np.max(-y[up] * G[up]), np.max(y[low] * G[low])
    expected = [k for k in range(n) if not _shrinkable(k, y, C, alpha, G, g1, g2)]
    assert 0 < len(expected) < n
    np.testing.assert_array_equal(kept, expected)
    np.testing.assert_array_equal(np.sort(active), np.arange(n))


def test_auto_shrinking_is_for_problems_past_the_whole_matrix_size():
    from gpuml.kernels.smo.rows import WHOLE_MATRIX_MAX_ROWS, shrinks

    assert not shrinks("auto", WHOLE_MATRIX_MAX_ROWS)
    assert shrinks("auto", WHOLE_MATRIX_MAX_ROWS + 1)
    assert shrinks(True, 10) and not shrinks(False, 10**6)
