"""SMO with kernel rows on demand (gpuml.kernels.smo.rows): the same solutions as on the whole
matrix, the matrix made midway when the rows cost enough, the cost following the work."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_classification
from sklearn.svm import SVC

from gpuml.kernels import make_kernel, smo_solve
from gpuml.kernels.smo import check_flat, rows
from gpuml.kernels.smo.cpu import result_of, solve
from gpuml.kernels.smo.values import values_of


def _problem(n=1500, d=10, class_sep=1.0, flip_y=0.05, seed=0):
    X, y = make_classification(n_samples=n, n_features=d, n_informative=min(d, 6),
                               class_sep=class_sep, flip_y=flip_y, random_state=seed)
    return X, np.where(y == 1, 1.0, -1.0)


def _kkt_gap(K, y, C, alpha):
    G = y * (K @ (alpha * y)) - 1.0
    up = ((y > 0) & (alpha < C)) | ((y < 0) & (alpha > 0))
    low = ((y > 0) & (alpha > 0)) | ((y < 0) & (alpha < C))
    return np.max(-y[up] * G[up]) - np.min(-y[low] * G[low])


def _on_rows(kernel, X, y, C=1.0, *, switch=True, shrinking=False, alpha0=None, tol=1e-3,
             max_iter=-1, cache_bytes=1 << 30):
    """Solve through a RowCache, returning the result and the cache (to look at its rows)."""
    checked = check_flat([y], [C], [alpha0])
    cache = rows.RowCache(values_of(kernel, X), cache_bytes, switch=switch)
    status, n_iter, G = cache.solve(checked.y, checked.C, checked.alpha, tol, max_iter,
                                    shrinking)
    return result_of(checked.y, checked.C, checked.alpha, G, n_iter, status), cache


@pytest.mark.parametrize("shrinking", [False, True])
@pytest.mark.parametrize("name", ["rbf", "linear", "poly", "sigmoid"])
def test_rows_on_demand_reach_the_optimum_of_the_whole_matrix(name, shrinking):
    X, y = _problem()
    X = X / np.abs(X).max()
    kernel = make_kernel(name, "scale", degree=3, coef0=0.5 if name != "linear" else 0.0, X=X)
    K = values_of(kernel, X).matrix()
    whole = solve(kernel, X, np.arange(len(y)), y, 0.5, K=K, shrinking=shrinking)
    res, cache = _on_rows(kernel, X, y, 0.5, shrinking=shrinking, switch=False)
    assert cache.order is None and cache.n_rows < len(y)  # rows only, never the matrix
    assert res.converged and whole.converged
    assert res.objective == pytest.approx(whole.objective, rel=1e-6)
    assert _kkt_gap(K, y, 0.5, res.alpha) < 1e-3
    assert abs(res.alpha @ y) < 1e-9
    # The gradient the rows kept is the matrix's.
    np.testing.assert_allclose(res.gradient, y * (K @ (res.alpha * y)) - 1.0, atol=1e-9)
    agree = np.sign(K @ (res.alpha * y) + res.intercept) == np.sign(
        K @ (whole.alpha * y) + whole.intercept)
    assert agree.mean() > 0.995


@pytest.mark.parametrize("shrinking", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_matrix_made_midway_keeps_the_rows_and_the_gradient(monkeypatch, shrinking, dtype):
    """A hard problem (many support vectors) makes the rest of its matrix once the rows
    have cost enough: the rows computed are reordered first, the rest filled in, and the
    solve goes on to the same optimum with a gradient exact for the whole matrix."""
    X, y = _problem(n=1800, flip_y=0.3, seed=2)
    X = X.astype(dtype)
    kernel = make_kernel("rbf", "scale", X=X)
    monkeypatch.setattr(rows, "SWITCH_FRACTION", 0.02)
    res, cache = _on_rows(kernel, X, y, 2.0, shrinking=shrinking)
    assert cache.order is not None and 0 < cache.n_rows < len(y) // 4
    assert np.array_equal(np.sort(cache.order), np.arange(len(y)))
    # the whole matrix in the cache's order is the kernel's matrix, exactly symmetric
    K = values_of(kernel, X).matrix()
    reordered = K[np.ix_(cache.order, cache.order)]
    np.testing.assert_array_equal(cache.cache, cache.cache.T)
    np.testing.assert_allclose(cache.cache, reordered, atol=2e-6 if dtype == np.float32
                               else 1e-12)
    never, _ = _on_rows(kernel, X, y, 2.0, shrinking=shrinking, switch=False)
    assert res.converged and never.converged
    assert res.objective == pytest.approx(never.objective, rel=1e-6)
    # the gradient is exact for the values the solve read (the cache, back in the
    # problem's order)
    back = np.argsort(cache.order)
    read = cache.cache[np.ix_(back, back)].astype(np.float64)
    np.testing.assert_allclose(res.gradient, y * (read @ (res.alpha * y)) - 1.0, atol=1e-9)
    assert _kkt_gap(read, y, 2.0, res.alpha) < 1e-3
    assert abs(res.alpha @ y) < 1e-9


def test_an_easy_problem_computes_few_rows():
    """The cost follows the work: an easy problem (few support vectors) of 6,000 rows
    touches a few hundred rows and never makes its matrix."""
    X, y = _problem(n=6000, class_sep=2.0, flip_y=0.0, seed=1)
    kernel = make_kernel("rbf", "scale", X=X)
    res, cache = _on_rows(kernel, X, y)
    assert res.converged and cache.order is None
    n_sv = np.count_nonzero(res.alpha)
    assert n_sv <= cache.n_rows < 0.1 * len(y)
    svc = SVC(gamma="scale").fit(X, y)
    assert abs(n_sv - len(svc.support_)) <= 0.02 * len(svc.support_)
    agree = np.sign(svc.decision_function(X[::7]))
    K = kernel.matrix(X[::7], X)
    assert np.mean(np.sign(K @ (res.alpha * y) + res.intercept) == agree) > 0.995


def test_warm_start_on_rows_from_a_solution_takes_no_step():
    X, y = _problem()
    kernel = make_kernel("rbf", "scale", X=X)
    cold, _ = _on_rows(kernel, X, y, 1.0, tol=1e-5, switch=False)
    n_sv = np.count_nonzero(cold.alpha)
    # The start's gradient along the rows of its support vectors when they cost less than
    # the matrix; else the matrix first.
    for rows_cost_more in (False, True):
        cache = rows.RowCache(values_of(kernel, X), 1 << 30)
        cache.matrix_cost = n_sv * cache.row_cost * (0.5 if rows_cost_more else 2.0)
        checked = check_flat([y], [1.0], [cold.alpha])
        status, n_iter, G = cache.solve(checked.y, checked.C, checked.alpha, 1e-3, -1, False)
        assert n_iter == 0
        if rows_cost_more:
            assert cache.order is not None and cache.n_rows == 0
        else:
            assert cache.order is None and cache.n_rows == n_sv
        np.testing.assert_allclose(G, cold.gradient, atol=1e-8)


def test_max_iter_counts_the_steps_before_and_after_the_matrix(monkeypatch):
    X, y = _problem(n=1800, flip_y=0.3, seed=2)
    kernel = make_kernel("rbf", "scale", X=X)
    monkeypatch.setattr(rows, "SWITCH_FRACTION", 0.02)
    res, cache = _on_rows(kernel, X, y, 2.0, max_iter=400)
    assert cache.order is not None  # the matrix was made before step 400
    assert not res.converged and res.n_iter == 400
    monkeypatch.undo()
    same, cache = _on_rows(kernel, X, y, 2.0, max_iter=400, switch=False)
    assert cache.order is None and same.n_iter == 400


def test_lru_rows_when_the_matrix_does_not_fit():
    """Past the cache: rows over the active variables in an LRU cache, no matrix."""
    X, y = _problem(n=1500, flip_y=0.2)
    kernel = make_kernel("rbf", "scale", X=X)
    K = values_of(kernel, X).matrix()
    whole = solve(kernel, X, np.arange(len(y)), y, 1.0, K=K)
    for shrinking in (False, True):
        res, cache = _on_rows(kernel, X, y, 1.0, shrinking=shrinking,
                              cache_bytes=40 * len(y) * 8)
        assert not cache.grow and cache.cache.shape[0] == 40
        assert res.objective == pytest.approx(whole.objective, rel=1e-6)
        assert _kkt_gap(K, y, 1.0, res.alpha) < 1.001e-3


def test_sparse_and_dense_rows_reach_the_same_optimum():
    rng = np.random.default_rng(3)
    X = rng.random((1200, 2000))
    X[X < 0.98] = 0.0
    y = np.where(X[:, :1000].sum(axis=1) > X[:, 1000:].sum(axis=1), 1.0, -1.0)
    kernel = make_kernel("rbf", "scale", X=X)
    dense = smo_solve(kernel, X, y, 1.0)
    sparse = smo_solve(kernel, sp.csr_matrix(X), y, 1.0)
    assert sparse.objective == pytest.approx(dense.objective, rel=1e-9)
    np.testing.assert_allclose(sparse.alpha, dense.alpha, atol=1e-6)


def test_rows_before_asking_follow_the_cost_model():
    """Few features: a row costs about a row of the matrix, so more rows come before the
    first question than with many features, where a row alone is far dearer than in a
    block."""
    few = rows.rows_before_asking(10_000, 10, 4)
    many = rows.rows_before_asking(10_000, 784, 4)
    assert 0.02 * 10_000 < few < 0.25 * 10_000
    assert many < few / 2
    assert rows.rows_before_asking(2_000, 10, 8) < rows.rows_before_asking(20_000, 10, 8)


def test_the_rows_to_come_are_the_violators_not_yet_touched():
    """An easy problem has few variables left that violate the optimality conditions once
    its support vectors are found: the matrix never pays. A hard one (a third of the labels
    flipped) has nearly all of them left at the first count: the matrix is made there."""
    X, y = _problem(n=4000, class_sep=2.0, flip_y=0.0, seed=1)
    kernel = make_kernel("rbf", "scale", X=X)
    res, cache = _on_rows(kernel, X, y)
    assert cache.order is None
    assert cache.rows_to_come(y, np.ones_like(y), res.alpha, res.gradient, 1e-3) < 0.01 * 4000
    assert not cache.matrix_pays(y, np.ones_like(y), res.alpha, res.gradient, 1e-3)
    X, y = _problem(n=4000, flip_y=0.3, seed=2)
    kernel = make_kernel("rbf", "scale", X=X)
    res, cache = _on_rows(kernel, X, y)
    assert cache.order is not None  # found hard at the first count
    assert cache.n_rows == max(cache.ask_every, int(rows.FIRST_ASK_SHARE * 4000),
                               rows.FIRST_ASK_ROWS)


@pytest.mark.parametrize("binary", [False, True])
def test_sparse_and_dense_fits_agree_to_rounding(binary):
    """A sparse fit and a dense fit of the same data take the same steps: one gamma for both
    formats (:func:`gpuml.kernels.pairwise.entry_variance`), and a part the solver densifies gives
    the kernel values of the dense rows. On digits (pixels, where working-set choices tie)
    the two used to part by 3e-4 of the decision values. Binary: one problem of 1,797
    variables, rows on demand; ten classes: 45 problems on one matrix."""
    from sklearn.datasets import load_digits

    from gpuml import CASVMClassifier

    X, y = load_digits(return_X_y=True)
    y = y % 2 if binary else y
    fits = [CASVMClassifier(n_partitions=1, decision_function_shape="ovo").fit(data, y)
            for data in (X, sp.csr_matrix(X))]
    assert fits[0]._kernel.gamma == fits[1]._kernel.gamma
    np.testing.assert_array_equal(fits[0].n_iter_, fits[1].n_iter_)
    dense, sparse = (f.decision_function(X) for f in fits)
    np.testing.assert_allclose(sparse, dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("hard", [False, True])
def test_the_first_problems_alone_tell_the_others_how_to_start(monkeypatch, hard):
    """The binary parts of one fit are alike: when the first FIRST_ALONE of them made their
    matrix midway (hard), the others make it first; else they start on rows. The same
    optimum either way."""
    from gpuml.kernels import SMOProblem, smo_solve_batch
    from gpuml.kernels.smo import cpu

    X, y = _problem(n=5 * 1100, class_sep=1.0 if hard else 2.0, flip_y=0.3 if hard else 0.0,
                    seed=3)
    Xs = [X[p * 1100:(p + 1) * 1100] for p in range(5)]
    problems = [SMOProblem(p, np.arange(1100), y[p * 1100:(p + 1) * 1100]) for p in range(5)]
    kernel = make_kernel("rbf", "scale", X=X)
    caches = []
    real = cpu.RowCache
    monkeypatch.setattr(cpu, "RowCache", lambda *a, **kw: caches.append(real(*a, **kw))
                        or caches[-1])
    for n_jobs in (1, 2):
        caches.clear()
        batch = smo_solve_batch(kernel, Xs, problems, n_jobs=n_jobs)
        assert len(caches) == (cpu.FIRST_ALONE if hard else 5)
        assert all((c.order is not None) == hard for c in caches)
        for prob, res in zip(problems, batch):
            alone = smo_solve(kernel, Xs[prob.group], prob.y, 1.0)
            assert res.converged
            assert res.objective == pytest.approx(alone.objective, rel=1e-5)
