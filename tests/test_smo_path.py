"""The C path (gpuml.kernels.smo_solve_path): each C the cold start's optimum, in fewer steps,
on kernel values computed once."""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_digits, make_classification
from sklearn.preprocessing import StandardScaler

from gpuml.kernels import SMOProblem, make_kernel, smo_solve_batch, smo_solve_path
from gpuml.kernels.smo import check_flat
from gpuml.kernels.smo.path import check_Cs, seed_alpha
from gpuml.kernels.smo.rows import WHOLE_MATRIX_MAX_ROWS
from gpuml.kernels.smo.values import values_of


def _cancer():
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    return [X], [SMOProblem(0, np.arange(len(y)), np.where(y == 1, 1.0, -1.0))]


def _digits_pairs():
    """One group, several one-vs-one problems sharing its matrix, with class weights."""
    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:700]
    y = y[:700]
    problems = []
    for a, b in [(0, 1), (3, 8), (4, 9), (1, 7)]:
        idx = np.flatnonzero((y == a) | (y == b))
        problems.append(SMOProblem(0, idx, np.where(y[idx] == a, 1.0, -1.0),
                                   np.where(y[idx] == a, 1.5, 0.7)))
    return [X], problems


def _rows_alone():
    """Two parts of one binary problem each, large enough to compute rows on demand."""
    X, y = make_classification(n_samples=2600, n_features=10, n_informative=6,
                               flip_y=0.1, random_state=4)
    y = np.where(y == 1, 1.0, -1.0)
    return [X[:1300], X[1300:]], [SMOProblem(0, np.arange(1300), y[:1300]),
                                  SMOProblem(1, np.arange(1300), y[1300:])]


#: data, kernel, C grid, and the bound on the path's SMO steps over the cold starts' where
#: the saving is robust (None: the optimum only; on cancer the path saves about 2 %).
CASES = {"cancer": (_cancer, "rbf", [0.1, 1.0, 10.0, 100.0], None),
         "digits pairs": (_digits_pairs, "rbf", [0.3, 1.0, 3.0, 10.0], 0.8),
         "digits pairs, linear": (_digits_pairs, "linear", [0.01, 0.1, 1.0], 0.9),
         "rows alone": (_rows_alone, "rbf", [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0], 0.95)}


def _kkt_gap(K, y, C, alpha):
    G = y * (K @ (alpha * y)) - 1.0
    up = ((y > 0) & (alpha < C)) | ((y < 0) & (alpha > 0))
    low = ((y > 0) & (alpha > 0)) | ((y < 0) & (alpha < C))
    return np.max(-y[up] * G[up]) - np.min(-y[low] * G[low])


@pytest.mark.parametrize("shrinking", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_each_C_reaches_the_cold_optimum_in_fewer_steps(case, shrinking):
    make, name, Cs, max_ratio = CASES[case]
    Xs, problems = make()
    kernel = make_kernel(name, "scale", X=Xs[0])
    path = smo_solve_path(kernel, Xs, problems, Cs, shrinking=shrinking)
    assert len(path) == len(Cs) and all(len(row) == len(problems) for row in path)
    warm_steps = cold_steps = 0
    for C, row in zip(Cs, path):
        scaled = [SMOProblem(p.group, p.idx, p.y, C * np.broadcast_to(p.C, p.y.shape))
                  for p in problems]
        cold = smo_solve_batch(kernel, Xs, scaled, shrinking=shrinking)
        for p, warm, ref in zip(scaled, row, cold):
            assert warm.converged and ref.converged
            X = Xs[p.group][p.idx]
            # the values the solver read: float32 for a problem alone on rows on demand
            K = values_of(kernel, X, None, WHOLE_MATRIX_MAX_ROWS).matrix().astype(np.float64)
            bounds = np.broadcast_to(p.C, p.y.shape)
            # the optimum of the same problem, to the solver's tolerance
            assert _kkt_gap(K, p.y, bounds, warm.alpha) < 1.01e-3
            assert np.all(warm.alpha >= 0) and np.all(warm.alpha <= bounds)
            assert abs(warm.alpha @ p.y) < 1e-8 * max(1.0, C) * p.y.size
            assert warm.objective == pytest.approx(ref.objective, rel=2e-3, abs=1e-3)
            ours = K @ (warm.alpha * p.y) + warm.intercept
            theirs = K @ (ref.alpha * p.y) + ref.intercept
            assert np.max(np.abs(ours - theirs)) < 0.05 * max(1.0, np.abs(theirs).max())
            assert np.mean(np.sign(ours) == np.sign(theirs)) > 0.99
            warm_steps += warm.n_iter
            cold_steps += ref.n_iter
    if max_ratio is not None:
        assert warm_steps < max_ratio * cold_steps


def test_the_path_computes_each_groups_values_once(monkeypatch):
    from gpuml.kernels.smo import path as smo_path

    made, caches = [], []
    real_matrix, real_cache = smo_path._make_matrix, smo_path.RowCache
    monkeypatch.setattr(smo_path, "_make_matrix",
                        lambda *args: made.append(args[1].shape[0]) or real_matrix(*args))
    monkeypatch.setattr(smo_path, "RowCache",
                        lambda *args, **kw: caches.append(args[0].rows.shape[0])
                        or real_cache(*args, **kw))
    Xs, problems = _digits_pairs()
    smo_solve_path(make_kernel("rbf", "scale", X=Xs[0]), Xs, problems, [0.5, 1.0, 2.0])
    assert made == [Xs[0].shape[0]] and caches == []
    made.clear()
    Xs, problems = _rows_alone()
    smo_solve_path(make_kernel("rbf", "scale", X=Xs[0]), Xs, problems, [0.5, 1.0, 2.0],
                   n_jobs=1)
    assert made == [] and caches == [1300, 1300]


def test_a_start_for_the_first_C_and_a_path_of_one():
    Xs, problems = _cancer()
    kernel = make_kernel("rbf", "scale", X=Xs[0])
    (only,), = smo_solve_path(kernel, Xs, problems, [1.0], tol=1e-5)
    started = [SMOProblem(0, problems[0].idx, problems[0].y, alpha0=only.alpha)]
    (again,), = smo_solve_path(kernel, Xs, started, [1.0])
    assert again.n_iter == 0
    np.testing.assert_array_equal(again.alpha, only.alpha)


def test_seed_alpha_is_feasible_for_the_new_bounds():
    rng = np.random.default_rng(0)
    y = np.where(rng.random(300) < 0.4, 1.0, -1.0)
    old = rng.uniform(0.5, 2.0, 300)
    new = old * rng.uniform(0.5, 4.0, 300)  # not one factor: clipping moves y @ alpha
    alpha = rng.uniform(0, 1, 300) * old
    alpha[y > 0] *= alpha[y < 0].sum() / alpha[y > 0].sum()
    seed = seed_alpha(alpha, y, old, new)
    assert np.all(seed >= 0) and np.all(seed <= new)
    check_flat([y], [new], [seed])  # feasible: no error
    # one factor: the variables at their bound move to the new one, the free ones keep
    # their value (the classes' masses at the bound balance here, so nothing is repaired)
    pos, neg = np.flatnonzero(y > 0), np.flatnonzero(y < 0)
    alpha = np.zeros(300)
    alpha[pos[:3]] = alpha[neg[:3]] = 1.0
    alpha[pos[3:5]] = alpha[neg[3:5]] = 0.2
    seed = seed_alpha(alpha, y, 1.0, 3.0)
    expected = np.where(alpha == 1.0, 3.0, alpha)
    np.testing.assert_array_equal(seed, expected)
    # unbalanced: the larger side gives back the difference
    alpha[neg[2]], alpha[neg[5]] = 0.0, 1.0 - 0.6
    seed = seed_alpha(alpha, y, 1.0, 3.0)
    assert abs(seed @ y) < 1e-12 and np.all(seed[neg[:2]] == 3.0)


def test_bad_paths_are_refused_before_any_work():
    for Cs in ([], [[1.0, 2.0]], [1.0, 1.0], [2.0, 1.0], [0.0, 1.0], [1.0, np.inf],
               [np.nan]):
        with pytest.raises(ValueError, match="Cs|C must"):
            check_Cs(Cs)
    Xs, problems = _cancer()
    kernel = make_kernel("rbf", "scale", X=Xs[0])
    with pytest.raises(ValueError, match="increasing"):
        smo_solve_path(kernel, Xs, problems, [1.0, 0.5])
    bad = [SMOProblem(0, np.arange(10), np.ones(10))]
    with pytest.raises(ValueError, match="both classes"):
        smo_solve_path(kernel, Xs, bad, [1.0, 2.0])


def test_the_gpu_branch_warm_starts_each_batch(monkeypatch, smo_gpu_on_host):
    """On a GPU each C is one smo_solve_batch from the previous C's seed (its logic run here
    on the host: the batch solver replaced by the CPU one)."""
    import gpuml.kernels as kernels

    Xs, problems = _digits_pairs()
    kernel = make_kernel("rbf", "scale", X=Xs[0])
    batches = smo_gpu_on_host
    Cs = [0.3, 1.0, 3.0]
    gpu = kernels.smo_solve_path(kernel, Xs, problems, Cs)
    monkeypatch.undo()
    host = smo_solve_path(kernel, Xs, problems, Cs)
    assert len(batches) == 3 and all(p.alpha0 is None for p in batches[0])
    for c in (1, 2):
        for p, before, prob in zip(batches[c], gpu[c - 1], problems):
            weights = np.broadcast_to(prob.C, prob.y.shape)
            np.testing.assert_allclose(p.C, Cs[c] * weights)
            np.testing.assert_array_equal(
                p.alpha0, seed_alpha(before.alpha, prob.y, Cs[c - 1] * weights, Cs[c] * weights))
    for row_gpu, row_host in zip(gpu, host):
        for a, b in zip(row_gpu, row_host):
            assert a.n_iter == b.n_iter
            np.testing.assert_allclose(a.alpha, b.alpha, atol=1e-12)
