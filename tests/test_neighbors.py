"""CA-SVM's neighbour search (``combine="neighbors"``): the part-by-part merge of each row's
k nearest support vectors, its two implementations, and the blend that reuses its
distances for the parts' kernel values."""

import numpy as np
import pytest

from gpuml import CASVMClassifier
from gpuml._backend import resolve
from gpuml.kernels.nearest import neighbors
from gpuml.kernels.pairwise import gram, sq_distances, squared_norms


def _merged(X, V, part, k, order, merge):
    """Merge the parts ``order`` of ``V`` for every row of X with ``merge``; the kept
    distances (sorted per row), the parts' counts, and the distances left in G."""
    state = neighbors.NearestMerge(np, X.shape[0], k)
    rows = np.arange(X.shape[0])
    left = {}
    for p in order:
        Vp = V[part == p]
        G = gram(X, Vp)
        if merge == "loop":
            neighbors._merge_loop(G, np.full(1, -2.0, dtype=G.dtype), squared_norms(X),
                                  squared_norms(Vp), rows, p, state.best_d, state.best_r)
        else:
            neighbors._merge_array(G, squared_norms(X), squared_norms(Vp), rows, p,
                                   state.best_d, state.best_r)
        left[p] = G
    counts, found = state.counts(part.max() + 1)
    return np.sort(state.best_d, axis=1), counts, found, left


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [1, 5, 40, 200])
def test_merge_loop_and_array_twin_keep_a_rows_k_nearest(dtype, k):
    """Both merges keep each row's k nearest over the parts merged so far (a written-out
    sort of all distances), count them per part, and leave sq_distances' bits in G."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(31, 6)).astype(dtype)
    V = rng.normal(size=(120, 6)).astype(dtype)
    part = rng.integers(0, 5, size=120)
    part[:3] = 5  # a part of three vectors: fewer than k for most k
    D = sq_distances(X, V)
    expected = np.sort(D, axis=1)[:, :k].astype(np.float64)
    nearest = np.argsort(D, axis=1, kind="stable")[:, :k]
    expected_counts = np.stack([np.bincount(part[r], minlength=6) for r in nearest])
    for merge in ("loop", "array"):
        kept, counts, found, left = _merged(X, V, part, k, [5, 2, 0, 4, 1, 3], merge)
        width = min(k, 120)
        np.testing.assert_array_equal(kept[:, :width], expected[:, :width])
        assert np.all(np.isinf(kept[:, width:]))
        np.testing.assert_array_equal(counts, expected_counts)
        np.testing.assert_array_equal(found, np.full(31, width))
        for p, G in left.items():
            np.testing.assert_array_equal(G, sq_distances(X, V[part == p]))


def test_merge_keeps_state_across_subsets_of_rows():
    """Parts merged for different subsets of the rows (as each row searches its own nearest
    parts): each row's result is the k nearest among the parts merged for it."""
    rng = np.random.default_rng(3)
    X, V = rng.normal(size=(40, 4)), rng.normal(size=(90, 4))
    part = rng.integers(0, 3, size=90)
    subsets = {0: np.arange(0, 40, 2), 1: np.arange(40), 2: np.arange(10, 30)}
    k = 7
    for merge in ("loop", "twin"):
        state = neighbors.NearestMerge(np, 40, k)
        for p, rows in subsets.items():
            Vp = V[part == p]
            G = gram(X[rows], Vp)
            if merge == "loop":
                state.add(G, squared_norms(X[rows]), squared_norms(Vp), rows, p)
            else:
                neighbors._merge_array(G, squared_norms(X[rows]), squared_norms(Vp), rows, p,
                                       state.best_d, state.best_r)
        counts, _ = state.counts(3)
        for i in range(40):
            mine = [p for p, rows in subsets.items() if i in rows]
            cand = np.flatnonzero(np.isin(part, mine))
            d = ((V[cand] - X[i]) ** 2).sum(1)
            best = cand[np.argsort(d)[:k]]
            np.testing.assert_array_equal(counts[i], np.bincount(part[best], minlength=3))


@pytest.mark.parametrize("kernel", ["rbf", "poly"])
def test_blend_over_the_nearest_parts_is_the_weighted_sum_of_part_values(kernel, monkeypatch):
    """With more parts than are searched, the blended values are sum_p w_p f_p(x) with the
    weights of :func:`neighbor_weights` and each part's values computed on their own
    (the RBF blend takes its kernel values from the search's distances)."""
    from sklearn.datasets import make_classification

    import gpuml.routing as routing
    from gpuml.estimators._part_prediction import PartModels

    monkeypatch.setattr(routing, "NEIGHBOR_PARTS", 3)
    X, y = make_classification(1600, 8, n_informative=6, n_classes=3, random_state=0)
    Xtr, Xte, ytr = X[:1200], X[1200:], y[:1200]
    clf = CASVMClassifier(n_partitions=8, kernel=kernel, device="cpu", random_state=0,
                          combine="neighbors", decision_function_shape="ovo").fit(Xtr, ytr)
    backend = resolve("cpu")
    weights = routing.neighbor_weights(Xte, clf.support_vectors_, clf.support_part_, 8,
                                       clf.n_neighbors, centers=clf.centers_)
    assert (weights > 0).sum(axis=1).max() > 1  # rows blend several parts
    assert np.all((weights > 0).sum(axis=1) <= 3)
    models = PartModels(clf, backend)
    values = np.stack([clf._part_values(backend, p, Xte, models) for p in range(8)])
    expected = np.einsum("np,pnq->nq", weights, values)
    np.testing.assert_allclose(clf.decision_function(Xte), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("merge", ["loop", "array"])
def test_equally_near_vectors_count_by_part_then_column(merge):
    """Integer data: many vectors exactly as near as a row's k-th. Those of the lower part,
    then the lower column within it, count, whatever order the parts are merged in."""
    rng = np.random.default_rng(5)
    X = rng.integers(0, 3, size=(50, 3)).astype(np.float64)
    V = rng.integers(0, 3, size=(80, 3)).astype(np.float64)
    part = rng.integers(0, 4, size=80)
    column = np.zeros(80, dtype=np.int64)
    for p in range(4):
        column[part == p] = np.arange(np.sum(part == p))
    D = sq_distances(X, V)
    for k in (3, 10):
        expected = np.zeros((50, 4))
        for i in range(50):
            best = np.lexsort((column, part, D[i]))[:k]
            expected[i] = np.bincount(part[best], minlength=4)
        for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
            _, counts, _, _ = _merged(X, V, part, k, order, merge)
            np.testing.assert_array_equal(counts, expected)


@pytest.mark.parametrize("n_parts", [1, 7, 300])
def test_rows_by_part_equals_a_scan_per_part(n_parts):
    """Every part present, in increasing order, with its rows ascending: what a scan of the
    rows per part gives (and nothing for an empty input)."""
    from gpuml.routing import rows_by_part

    owner = np.random.default_rng(n_parts).integers(0, n_parts, 2000)
    got = rows_by_part(owner)
    want = [(p, np.flatnonzero(owner == p)) for p in range(n_parts) if (owner == p).any()]
    assert [p for p, _ in got] == [p for p, _ in want]
    for (_, rows), (_, expected) in zip(got, want):
        np.testing.assert_array_equal(rows, expected)
    assert rows_by_part(np.array([], dtype=np.int64)) == []
