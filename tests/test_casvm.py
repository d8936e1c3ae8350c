"""CASVMClassifier: exactness at P=1 against SVC, partitioned behaviour, sklearn citizenship."""

import pickle
import re

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.calibration import CalibratedClassifierCV
from sklearn.datasets import load_breast_cancer, load_digits, make_blobs
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC
from sklearn.utils.estimator_checks import parametrize_with_checks

from gpuml.estimators.casvm import CASVMClassifier
from gpuml.kernels import make_kernel


def cpu(**kw):
    return CASVMClassifier(device="cpu", **kw)


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0)
    sc = StandardScaler().fit(Xtr)
    return sc.transform(Xtr), sc.transform(Xte), ytr, yte


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0)
    sc = StandardScaler().fit(Xtr)
    return sc.transform(Xtr), sc.transform(Xte), ytr, yte


def svc_objectives(svc, X, y):
    """LIBSVM's dual objective of every one-vs-one problem of a fitted SVC."""
    kernel = make_kernel(svc.kernel, svc.gamma, svc.degree, svc.coef0, X)
    classes = svc.classes_
    starts = np.concatenate([[0], np.cumsum(svc.n_support_)])
    out = []
    for a in range(len(classes)):
        for b in range(a + 1, len(classes)):
            sa = slice(starts[a], starts[a + 1])
            sb = slice(starts[b], starts[b + 1])
            coef = np.concatenate([svc.dual_coef_[b - 1, sa], svc.dual_coef_[a, sb]])
            idx = np.concatenate([svc.support_[sa], svc.support_[sb]])
            v = coef @ kernel.dot(X[idx], X[idx], coef)
            out.append(0.5 * v - np.abs(coef).sum())
    return np.array(out)


@pytest.mark.parametrize("data", ["cancer", "digits"])
def test_one_partition_matches_svc(data, request):
    Xtr, Xte, ytr, yte = request.getfixturevalue(data)
    ours = cpu(n_partitions=1).fit(Xtr, ytr)
    svc = SVC(C=1.0, gamma="scale", tol=1e-3).fit(Xtr, ytr)
    ref = svc_objectives(svc, Xtr, ytr)
    np.testing.assert_allclose(ours.objective_[0], ref, rtol=1e-3)
    assert abs(len(ours.support_) - len(svc.support_)) <= 0.01 * len(svc.support_)
    np.testing.assert_array_equal(np.sort(ours.support_), np.sort(svc.support_))
    assert np.mean(ours.predict(Xte) == svc.predict(Xte)) >= 0.995
    np.testing.assert_allclose(ours.decision_function(Xte), svc.decision_function(Xte),
                               atol=1e-2)
    np.testing.assert_array_equal(ours.n_support_, svc.n_support_)


def test_weights_scale_C_like_libsvm(digits):
    Xtr, Xte, ytr, yte = digits
    sw = np.random.default_rng(0).uniform(0.5, 2.0, size=len(ytr))
    cw = {c: 1.0 + 0.2 * c for c in range(10)}
    ours = cpu(n_partitions=1, C=2.0, class_weight=cw).fit(Xtr, ytr, sample_weight=sw)
    svc = SVC(C=2.0, class_weight=cw).fit(Xtr, ytr, sample_weight=sw)
    np.testing.assert_allclose(ours.objective_[0], svc_objectives(svc, Xtr, ytr), rtol=1e-3)
    assert np.mean(ours.predict(Xte) == svc.predict(Xte)) >= 0.995
    balanced = cpu(n_partitions=1, class_weight="balanced").fit(Xtr, ytr)
    svc_bal = SVC(class_weight="balanced").fit(Xtr, ytr)
    np.testing.assert_allclose(balanced.objective_[0], svc_objectives(svc_bal, Xtr, ytr),
                               rtol=1e-3)


def test_zero_sample_weight_drops_samples(cancer):
    Xtr, Xte, ytr, _ = cancer
    sw = np.ones(len(ytr))
    sw[::3] = 0
    a = cpu(n_partitions=1, gamma=0.03).fit(Xtr, ytr, sample_weight=sw)
    keep = sw > 0
    b = cpu(n_partitions=1, gamma=0.03).fit(Xtr[keep], ytr[keep])
    np.testing.assert_allclose(a.objective_, b.objective_, rtol=1e-6)
    assert not np.any(np.isin(a.support_, np.flatnonzero(~keep)))


@pytest.mark.parametrize("method", ["random", "fcfs", "kmeans", "kbalance", "bkm"])
def test_every_partitioner_trains_and_routes(method, digits):
    Xtr, Xte, ytr, yte = digits
    clf = cpu(n_partitions=4, partition=method, random_state=0, n_jobs=2).fit(Xtr, ytr)
    assert clf.centers_.shape == (4, Xtr.shape[1])
    assert clf.partition_sizes_.sum() == len(ytr)
    # SVC's shapes, with a part axis on the per-model intercept_ (see the docstring).
    n_sv = len(clf.support_)
    assert clf.intercept_.shape == (4, 45)
    assert clf.part_n_iter_.shape == (4, 45) and clf.part_intercept_.shape == (4, 45)
    # one entry per SMO problem solved, part by part
    np.testing.assert_array_equal(clf.n_iter_, clf.part_n_iter_[clf.pair_status_ == 2])
    assert clf.n_iter_.dtype == np.int32 and clf.n_iter_.min() >= 1
    assert clf.dual_coef_.shape == (9, n_sv) and clf.ovo_dual_coef_.shape == (45, n_sv)
    assert clf.support_part_.shape == (n_sv,)
    assert set(np.unique(clf.support_part_)) <= set(range(4))
    # SVC's order: grouped by class, rows ascending within a class.
    classes = np.searchsorted(clf.classes_, ytr[clf.support_])
    np.testing.assert_array_equal(np.lexsort((clf.support_, classes)), np.arange(n_sv))
    assert clf.score(Xte, yte) > 0.85
    if method != "kmeans":
        assert clf.partition_sizes_.max() - clf.partition_sizes_.min() <= 1


def test_parts_train_independently(digits):
    """Part p's model is exactly an SVM fitted on part p's rows alone (Alg 5)."""
    Xtr, Xte, ytr, _ = digits
    clf = cpu(n_partitions=3, partition="random", random_state=1, part_C="none",
              combine="nearest").fit(Xtr, ytr)
    from gpuml.partition import split
    from gpuml.routing import route

    parts = split(Xtr, 3, "random", 1)
    owner = route(Xte, clf.centers_)
    p = int(owner[0])
    alone = cpu(n_partitions=1, gamma=clf._gamma).fit(Xtr[parts.parts[p]], ytr[parts.parts[p]])
    mine = owner == p
    np.testing.assert_array_equal(clf.predict(Xte[mine]), alone.predict(Xte[mine]))
    # gamma="scale" comes from the whole training set, as SVC's, not from each part.
    assert clf._gamma == pytest.approx(SVC(gamma="scale").fit(Xtr, ytr)._gamma, rel=1e-12)
    assert abs(alone._gamma - cpu(n_partitions=1).fit(Xtr[parts.parts[p]],
                                                       ytr[parts.parts[p]])._gamma) > 0


def _part_C_fits(clf, X, y, P, partition, seed, scale):
    """Each part's SVM fitted alone on its rows with C times ``scale(n, m)``."""
    from gpuml.partition import split

    parts = split(X, P, partition, seed).parts
    return [cpu(n_partitions=1, gamma=clf._gamma, C=clf.C * scale(len(X), len(rows)))
            .fit(X[rows], y[rows]) for rows in parts]


@pytest.mark.parametrize("part_C, scale", [("sqrt", lambda n, m: np.sqrt(n / m)),
                                           ("linear", lambda n, m: n / m),
                                           ("none", lambda n, m: 1.0)])
def test_part_C_scales_each_parts_C(part_C, scale, cancer):
    """A part of m of the n rows is the SVM of its rows alone with C * scale(n, m)."""
    Xtr, Xte, ytr, _ = cancer
    clf = cpu(n_partitions=3, partition="fcfs", random_state=0, part_C=part_C, C=0.5,
              combine="nearest").fit(Xtr, ytr)
    alone = _part_C_fits(clf, Xtr, ytr, 3, "fcfs", 0, scale)
    for p, model in enumerate(alone):
        np.testing.assert_allclose(clf.part_intercept_[p], model.part_intercept_[0],
                                   rtol=1e-10, atol=1e-12)
        mine = clf.support_part_ == p
        np.testing.assert_allclose(np.sort(np.abs(clf.ovo_dual_coef_[0, mine])),
                                   np.sort(np.abs(model.ovo_dual_coef_[0])), rtol=1e-10,
                                   atol=1e-12)
    # The tree methods keep C: their last SVM is the whole problem's.
    solver = _part_solver(cpu(method="cascade", n_partitions=2, part_C=part_C), Xtr, ytr)
    assert solver._part_C_factor(10) == 1.0


def _part_solver(est, X, y):
    """The part solver of ``est`` for ``X``, ``y``, as its fit makes it."""
    from gpuml._backend import CPU

    data = est._validate(X, y, None, CPU)
    data.n_parts = est._n_parts(data.n)
    return est._part_solver(data)


def test_neighbor_weights_match_a_written_out_count():
    """Part p weighs (how many of the k nearest support vectors are p's) / k."""
    from gpuml.routing import neighbor_weights

    rng = np.random.default_rng(0)
    X, V = rng.normal(size=(37, 5)), rng.normal(size=(50, 5))
    part = rng.integers(0, 4, size=50)
    for k in (1, 3, 20, 60):
        D = ((X[:, None, :] - V[None, :, :]) ** 2).sum(-1)
        nearest = np.argsort(D, axis=1)[:, :min(k, 50)]
        expected = np.stack([np.bincount(part[row], minlength=4) for row in nearest])
        np.testing.assert_allclose(neighbor_weights(X, V, part, 4, k),
                                   expected / min(k, 50), rtol=0, atol=1e-15)
        # Row blocks give the same weights as one block.
        import gpuml.routing as partitioned

        small = partitioned.NEIGHBOR_BLOCK_BYTES
        partitioned.NEIGHBOR_BLOCK_BYTES = 8 * 50 * 4
        try:
            np.testing.assert_array_equal(neighbor_weights(X, V, part, 4, k),
                                          expected / min(k, 50))
        finally:
            partitioned.NEIGHBOR_BLOCK_BYTES = small


def test_neighbor_weights_among_the_nearest_parts_match_a_written_out_count(monkeypatch):
    """With more parts holding support vectors than ``n_searched``, a row's neighbours are
    searched among the vectors of its ``n_searched`` nearest parts (by centre) only."""
    import gpuml.routing as routing

    rng = np.random.default_rng(1)
    X, V = rng.normal(size=(41, 5)), rng.normal(size=(90, 5))
    part = rng.integers(0, 9, size=90)
    part[part == 4] = 5  # part 4 holds no vector: never searched
    centers = rng.normal(size=(9, 5))
    held = np.unique(part)
    for q, k in ((2, 3), (3, 20), (5, 1), (5, 60)):
        expected = np.zeros((41, 9))
        for i, x in enumerate(X):
            dc = ((centers[held] - x) ** 2).sum(1)
            searched = held[np.argsort(dc)[:q]]
            cand = np.flatnonzero(np.isin(part, searched))
            d = ((V[cand] - x) ** 2).sum(1)
            nearest = cand[np.argsort(d)[:min(k, cand.size)]]
            expected[i] = np.bincount(part[nearest], minlength=9) / nearest.size
        got = routing.neighbor_weights(X, V, part, 9, k, centers=centers, n_searched=q)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-15)
        monkeypatch.setattr(routing, "NEIGHBOR_BLOCK_BYTES", 8 * 7 * (30 + 2 * k))
        np.testing.assert_allclose(routing.neighbor_weights(X, V, part, 9, k, centers=centers,
                                                            n_searched=q), expected,
                                   rtol=0, atol=1e-15)
        monkeypatch.undo()
    # As many parts searched as hold vectors: every vector, the full rule.
    np.testing.assert_array_equal(
        routing.neighbor_weights(X, V, part, 9, 7, centers=centers, n_searched=8),
        routing.neighbor_weights(X, V, part, 9, 7))


@pytest.mark.parametrize("k", [1, 7])
@pytest.mark.parametrize("data", ["cancer", "digits"])
def test_neighbors_blend_the_parts_decision_values(data, k, request):
    """combine="neighbors": the pairwise values are sum_p w_p f_p(x), written out with
    the parts' models fitted alone and the weights counted with NumPy (k=1: the values
    of the part holding the nearest support vector)."""
    Xtr, Xte, ytr, _ = request.getfixturevalue(data)
    P = 4
    clf = cpu(n_partitions=P, partition="fcfs", random_state=0, n_neighbors=k,
              combine="neighbors", decision_function_shape="ovo").fit(Xtr, ytr)
    alone = _part_C_fits(clf, Xtr, ytr, P, "fcfs", 0, lambda n, m: np.sqrt(n / m))
    D = ((Xte[:, None, :] - clf.support_vectors_[None, :, :]) ** 2).sum(-1)
    nearest = clf.support_part_[np.argsort(D, axis=1)[:, :k]]
    weights = np.stack([np.bincount(row, minlength=P) for row in nearest]) / k
    # Each alone model's ovo values in LIBSVM's sign (+ for the pair's first class).
    values = np.stack([m._ovo_values(Xte)[0] for m in alone])
    expected = np.einsum("np,pnq->nq", weights, values)
    got = clf.decision_function(Xte)
    if len(clf.classes_) == 2:
        np.testing.assert_allclose(got, -expected[:, 0], rtol=1e-9, atol=1e-9)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    from gpuml.estimators._svm import ovo_votes

    voting = weights @ (clf.pair_status_ > 0) > 0
    votes, _ = ovo_votes(expected, len(clf.classes_), voting)
    np.testing.assert_array_equal(clf.predict(Xte), clf.classes_[np.argmax(votes, axis=1)])


def test_neighbors_with_one_part_or_nearest_is_the_nearest_centre_model(digits):
    """One part: the blend is that part's model (the exact SVM). The same fitted parts
    with combine="nearest" (Alg 5) and "neighbors" agree on every row whose neighbours
    all belong to its nearest centre's part."""
    from gpuml._backend import resolve
    from gpuml.routing import route

    Xtr, Xte, ytr, _ = digits
    np.testing.assert_array_equal(
        cpu(n_partitions=1).fit(Xtr, ytr).decision_function(Xte),
        cpu(n_partitions=1, combine="nearest").fit(Xtr, ytr).decision_function(Xte))
    near = cpu(n_partitions=3, random_state=0, combine="nearest",
               decision_function_shape="ovo").fit(Xtr, ytr)
    blend = clone(near).set_params(combine="neighbors").fit(Xtr, ytr)
    np.testing.assert_array_equal(blend.ovo_dual_coef_, near.ovo_dual_coef_)
    weights = blend._part_weights(resolve("cpu"), Xte)
    same = (weights.max(axis=1) == 1.0) & (np.argmax(weights, axis=1) == route(Xte,
                                                                              near.centers_))
    assert 0 < same.sum() < len(Xte)
    np.testing.assert_array_equal(blend.decision_function(Xte[same]),
                                  near.decision_function(Xte[same]))
    assert not np.array_equal(blend.decision_function(Xte[~same]),
                              near.decision_function(Xte[~same]))


def _vote_winner(values, voting, n_classes):
    from gpuml.estimators._svm import ovo_votes

    return np.argmax(ovo_votes(values, n_classes, voting)[0], axis=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_classes", [2, 3, 4, 7])
def test_pair_coef_times_kernel_values_is_the_dense_product(n_classes, dtype):
    """PairCoef.times(K) is K @ coef, the coefficients one column per one-vs-one pair, each
    support vector's nonzero only in its own class's pairs (by class blocks from four
    classes on, one class without support vectors), accumulated in float64."""
    from gpuml.estimators._svm import PairCoef, class_pairs

    rng = np.random.default_rng(n_classes)
    sv_class = np.sort(rng.integers(0, n_classes, size=40))
    sv_class = sv_class[sv_class != 1] if n_classes > 2 else sv_class  # class 1: none
    pairs = class_pairs(n_classes)
    coef = rng.normal(size=(sv_class.size, len(pairs)))
    for q, (a, b) in enumerate(pairs):
        coef[(sv_class != a) & (sv_class != b), q] = 0.0
    K = rng.uniform(size=(9, sv_class.size)).astype(dtype)
    got = PairCoef(coef, sv_class, n_classes).times(K)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, K.astype(np.float64) @ coef, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_classes", [2, 3, 5])
def test_unsettled_votes_are_the_rows_a_move_below_the_margin_can_turn(n_classes):
    """unsettled_votes against its definition: on a settled row no move of the pairwise
    values by less than the margin (and no vote of a silent pair) changes the winner; on
    an unsettled row the worst such move for the winner makes another class reach it."""
    from gpuml.estimators._svm import class_pairs, unsettled_votes

    rng = np.random.default_rng(n_classes)
    pairs = class_pairs(n_classes)
    margin = 0.5
    values = rng.normal(scale=0.8, size=(600, len(pairs)))
    values[:5] = 0.0  # a value of 0 votes for the pair's second class
    voting = rng.random(values.shape) > 0.1
    open_ = unsettled_votes(values, voting, n_classes, margin)
    assert 0 < open_.sum() < len(values)
    winner = _vote_winner(values, voting, n_classes)
    for _ in range(30):
        moved = values + rng.uniform(-margin, margin, size=values.shape) * 0.999
        speaks = voting | (rng.random(values.shape) > 0.5)
        np.testing.assert_array_equal(_vote_winner(moved, speaks, n_classes)[~open_],
                                      winner[~open_])
    for i in np.flatnonzero(open_):
        c = winner[i]
        reached = False
        for j in set(range(n_classes)) - {c}:
            moved, speaks = values[i].copy(), np.ones(len(pairs), dtype=bool)
            for q, (a, b) in enumerate(pairs):
                first = values[i, q] > 0
                for cls, favour in ((c, False), (j, True)):
                    if cls not in (a, b):
                        continue
                    wants_first = (cls == a) == favour  # a vote for `a` helps or hurts cls
                    near = abs(values[i, q]) < margin and voting[i, q]
                    if (near or not voting[i, q]) and first != wants_first:
                        # across 0, less than the margin away (or a silent pair's vote)
                        step = margin - abs(values[i, q]) if voting[i, q] else margin
                        moved[q] = (1 if wants_first else -1) * step / 2
            votes = np.zeros(n_classes)
            for q, (a, b) in enumerate(pairs):
                votes[a if moved[q] > 0 else b] += speaks[q]
            reached |= votes[j] >= votes[c]
        assert reached, i


@pytest.mark.parametrize("data", ["cancer", "digits"])
def test_auto_blends_only_the_rows_the_nearest_part_leaves_open(data, request, monkeypatch):
    """combine="auto": the nearest part's values where the pairs it trained settle the
    vote within blend_margin, the blended values ("neighbors") elsewhere, and the search
    runs on those rows only; blend_margin=inf blends every row, as "neighbors"."""
    import copy

    import gpuml.estimators._part_prediction as prediction
    from gpuml.estimators._svm import unsettled_votes
    from gpuml.routing import route

    Xtr, Xte, ytr, _ = request.getfixturevalue(data)
    auto = cpu(n_partitions=4, random_state=0, decision_function_shape="ovo").fit(Xtr, ytr)
    assert auto.combine == "auto"
    near = copy.deepcopy(auto).set_params(combine="nearest")
    blend = copy.deepcopy(auto).set_params(combine="neighbors")
    K = len(auto.classes_)
    values, _ = near._ovo_values(Xte)
    # A pair the nearest part did not train (a constant vote) leaves the row open.
    trained = auto.pair_status_[route(Xte, auto.centers_)] == 2
    open_ = unsettled_votes(values, trained, K, auto.blend_margin)
    assert 0 < open_.sum() < 0.5 * len(Xte)
    searched = []
    blocks = prediction.neighbor_blocks

    def counting(X, *args, **kw):
        searched.append(X.shape[0])
        yield from blocks(X, *args, **kw)

    monkeypatch.setattr(prediction, "neighbor_blocks", counting)
    got = auto.decision_function(Xte)
    assert sum(searched) == open_.sum()
    flat = (lambda v: -v[:, 0]) if K == 2 else (lambda v: v)
    np.testing.assert_array_equal(got[~open_], near.decision_function(Xte)[~open_])
    np.testing.assert_allclose(got[open_], blend.decision_function(Xte)[open_],
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[~open_], flat(values)[~open_])
    labels = auto.predict(Xte)
    np.testing.assert_array_equal(labels[~open_], near.predict(Xte)[~open_])
    np.testing.assert_array_equal(labels[open_], blend.predict(Xte)[open_])
    everywhere = copy.deepcopy(auto).set_params(blend_margin=np.inf)
    np.testing.assert_allclose(everywhere.decision_function(Xte), blend.decision_function(Xte),
                               rtol=1e-12, atol=1e-12)


def test_single_class_part_predicts_that_class():
    X, y = make_blobs(n_samples=[60, 60, 60], centers=[[-10, 0], [10, 0], [10, 1.5]],
                      cluster_std=0.4, random_state=0)
    clf = cpu(n_partitions=2, partition="kmeans", random_state=0).fit(X, y)
    lone = [p for p in range(2) if np.sum(clf.pair_status_[p] == 2) == 0]
    assert lone, "expected a part holding a single class"
    left = X[:, 0] < 0
    assert np.all(clf.predict(X[left]) == 0)
    assert clf.score(X, y) > 0.9
    dec = clf.decision_function(X[left])
    assert np.all(np.argmax(dec, axis=1) == 0)


def test_class_absent_from_a_part_binary_and_multiclass():
    X, y = make_blobs(n_samples=[80, 80, 80, 80], centers=[[-6, 0], [-6, 1], [6, 0], [6, 1]],
                      cluster_std=0.5, random_state=0)
    clf = cpu(n_partitions=2, partition="kmeans", random_state=0).fit(X, y)
    assert np.any(clf.pair_status_ == 0)
    assert clf.score(X, y) >= SVC().fit(X, y).score(X, y) - 0.02
    yb = np.where(y < 3, "a", "b")
    clf_b = cpu(n_partitions=2, partition="kmeans", random_state=0).fit(X, yb)
    assert set(clf_b.predict(X)) <= {"a", "b"}
    assert clf_b.decision_function(X).shape == (len(yb),)


def test_string_labels(cancer):
    Xtr, Xte, ytr, yte = cancer
    names = np.array(["malignant", "benign"])
    clf = cpu(n_partitions=2, random_state=0).fit(Xtr, names[ytr])
    num = cpu(n_partitions=2, random_state=0).fit(Xtr, ytr)
    np.testing.assert_array_equal(clf.classes_, ["benign", "malignant"])
    np.testing.assert_array_equal(clf.predict(Xte) == "malignant", num.predict(Xte) == 0)


def test_precomputed_kernel_single_partition(cancer):
    Xtr, Xte, ytr, yte = cancer
    rbf = cpu(n_partitions=1, gamma=0.02).fit(Xtr, ytr)
    k = make_kernel("rbf", 0.02, X=Xtr)
    pre = cpu(n_partitions=1, kernel="precomputed").fit(k.matrix(Xtr), ytr)
    np.testing.assert_allclose(pre.decision_function(k.matrix(Xte, Xtr)),
                               rbf.decision_function(Xte), atol=1e-8)
    with pytest.raises(ValueError, match="n_partitions=1"):
        cpu(kernel="precomputed", n_partitions=2).fit(k.matrix(Xtr), ytr)
    with pytest.raises(ValueError, match="square"):
        cpu(kernel="precomputed", n_partitions=1).fit(Xtr, ytr)
    with pytest.raises(ValueError, match="expecting 426 features"):
        pre.predict(k.matrix(Xte, Xtr[:-1]))


def test_sparse_equals_dense(cancer):
    Xtr, Xte, ytr, _ = cancer
    dense = cpu(n_partitions=2, random_state=0).fit(Xtr, ytr)
    sparse = cpu(n_partitions=2, random_state=0).fit(sp.csr_matrix(Xtr), ytr)
    np.testing.assert_allclose(sparse.decision_function(sp.csr_matrix(Xte)),
                               dense.decision_function(Xte), atol=1e-6)
    # Parts with fewer features than rows are solved on the same dense kernel
    # values: the same SMO steps, the same model (SVC's agree to 1e-7 too; only
    # gamma="scale", a variance computed on sparse data, differs in the last bits).
    assert sp.issparse(sparse.dual_coef_) and sp.issparse(sparse.support_vectors_)
    np.testing.assert_array_equal(sparse.support_, dense.support_)
    np.testing.assert_allclose(sparse.dual_coef_.toarray(), dense.dual_coef_, rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(sparse.intercept_, dense.intercept_, rtol=1e-10, atol=1e-12)


def test_wide_sparse_data_stays_sparse_for_the_solver():
    # More features than rows (text): the solver gets the sparse rows, and the
    # model still matches the dense fit to about the tolerance.
    rng = np.random.default_rng(0)
    X = sp.random(60, 400, density=0.05, random_state=0, format="csr")
    y = rng.integers(0, 2, 60)
    est = cpu(n_partitions=1, kernel="linear")
    assert sp.issparse(_part_solver(est, X, y)._solver_rows(X))
    sparse = est.fit(X, y)
    dense = cpu(n_partitions=1, kernel="linear").fit(X.toarray(), y)
    np.testing.assert_allclose(sparse.decision_function(X), dense.decision_function(X.toarray()),
                               atol=1e-2)


@pytest.mark.parametrize(
    "params, X_y, error, match",
    [
        ({"C": 0.0}, None, ValueError, "'C' parameter"),
        ({"C": -1.0}, None, ValueError, "'C' parameter"),
        ({"gamma": 0.0}, None, ValueError, "'gamma' parameter"),
        ({"gamma": -0.5}, None, ValueError, "'gamma' parameter"),
        ({"kernel": "cosine"}, None, ValueError, "'kernel' parameter"),
        ({"partition": "spectral"}, None, ValueError, "'partition' parameter"),
        ({"n_partitions": 100}, "small", ValueError, "larger than the number of samples"),
        ({}, "one_class", ValueError, "greater than one"),
        ({}, "nan", ValueError, "NaN"),
        ({}, "inf", ValueError, "infinity"),
    ],
)
def test_bad_input(params, X_y, error, match):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = np.arange(40) % 2
    if X_y == "small":
        X, y = X[:20], y[:20]
    elif X_y == "one_class":
        y = np.zeros(40)
    elif X_y == "nan":
        X[3, 1] = np.nan
    elif X_y == "inf":
        X[3, 1] = np.inf
    kw = {"n_partitions": 2, **params}
    with pytest.raises(error, match=match):
        cpu(**kw).fit(X, y)


def test_not_fitted_and_inputs_untouched(cancer):
    Xtr, Xte, ytr, _ = cancer
    with pytest.raises(NotFittedError):
        cpu().predict(Xte)
    X0, y0 = Xtr.copy(), ytr.copy()
    cpu(n_partitions=2).fit(Xtr, ytr)
    np.testing.assert_array_equal(Xtr, X0)
    np.testing.assert_array_equal(ytr, y0)


def test_max_iter_warns():
    from sklearn.exceptions import ConvergenceWarning

    X, y = load_breast_cancer(return_X_y=True)
    # SVC's message, word for word.
    with pytest.warns(ConvergenceWarning, match=r"^Solver terminated early \(max_iter=5\)\.  "
                      r"Consider pre-processing your data with StandardScaler or MinMaxScaler\.$"):
        clf = cpu(n_partitions=1, max_iter=5).fit(StandardScaler().fit_transform(X), y)
    assert clf.fit_status_ == 1 and clf.n_iter_.max() == 5


def test_pipeline_gridsearch_calibration_clone_pickle(cancer):
    Xtr, Xte, ytr, yte = cancer
    pipe = make_pipeline(StandardScaler(), cpu(n_partitions=2, random_state=0))
    grid = GridSearchCV(pipe, {"casvmclassifier__C": [0.5, 2.0],
                               "casvmclassifier__gamma": ["scale", 0.01]}, cv=3, n_jobs=2)
    grid.fit(Xtr, ytr)
    assert grid.score(Xte, yte) > 0.9
    cal = CalibratedClassifierCV(cpu(n_partitions=2, random_state=0), cv=3).fit(Xtr, ytr)
    proba = cal.predict_proba(Xte)
    assert proba.shape == (len(yte), 2) and np.allclose(proba.sum(1), 1)
    clf = cpu(n_partitions=3, random_state=0).fit(Xtr, ytr)
    assert clone(clf).get_params() == clf.get_params()
    back = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(back.decision_function(Xte), clf.decision_function(Xte))


def test_device_cuda_without_gpu_is_a_clear_error(cancer):
    from gpuml._backend import cuda_available

    if cuda_available():
        pytest.skip("a GPU answers here")
    Xtr, _, ytr, _ = cancer
    with pytest.raises(RuntimeError, match="device='cuda'"):
        CASVMClassifier(device="cuda").fit(Xtr, ytr)


def test_default_partitions_value():
    from gpuml.estimators.casvm import DEFAULT_N_PARTITIONS

    assert CASVMClassifier().n_partitions == DEFAULT_N_PARTITIONS
    assert CASVMClassifier().partition == "auto" and CASVMClassifier().method == "casvm"
    X, y = make_blobs(400, centers=3, random_state=0)
    assert CASVMClassifier(n_partitions=2, device="cpu").fit(X, y).partition_ == "fcfs"


def _expected_failures(estimator):
    # As for sklearn.svm.SVC: the dual is solved to tol, and a weight w is
    # equivalent to w copies only at the exact optimum; with P > 1 the copies
    # also change the random split.
    why = "sample_weight is not equivalent to removing/repeating samples (as SVC)."
    return {"check_sample_weight_equivalence_on_dense_data": why,
            "check_sample_weight_equivalence_on_sparse_data": why}


@parametrize_with_checks([CASVMClassifier(n_partitions=1, device="cpu"),
                          CASVMClassifier(n_partitions=2, device="cpu", random_state=0),
                          CASVMClassifier(n_partitions=2, partition="fcfs", device="cpu",
                                          random_state=0)],
                         expected_failed_checks=_expected_failures)
def test_sklearn_compatible(estimator, check):
    check(estimator)


def run_unless_too_few_rows(check, estimator):
    """Run a check; skip it when its data has fewer rows than ``n_partitions``.

    The estimator must then refuse the fit with its clear error (a ValueError
    naming ``n_partitions`` and the number of samples), whether the check
    lets that error through, wraps it or chains it; any other failure fails.
    """
    try:
        check(estimator)
    except Exception as exc:
        cause = exc
        while cause is not None:
            found = re.search(rf"n_partitions={estimator.n_partitions} is larger than the "
                              r"number of samples \((\d+)\)", str(cause))
            if isinstance(cause, ValueError) and found:
                pytest.skip(f"the check fits {found.group(1)} samples, fewer than "
                            f"n_partitions={estimator.n_partitions}")
            cause = cause.__cause__ or cause.__context__
        raise


# break_ties=True: check_classifiers_train compares predict with the argmax of
# decision_function, and with SVC's default rule a three-way vote tie (lowest
# tied class in predict, the most confident in decision_function) separates
# them on one of its blobs' samples at 16 parts.
@parametrize_with_checks([CASVMClassifier(n_partitions=16, break_ties=True, device="cpu",
                                          random_state=0)],
                         expected_failed_checks=_expected_failures)
def test_sklearn_compatible_sixteen_parts(estimator, check):
    run_unless_too_few_rows(check, estimator)


def test_n_iter_counts_every_problem_solved():
    """n_iter_: the steps of each SMO problem that ran, all >= 1; SVC's layout for one part."""
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    clf = cpu(n_partitions=2, partition="fcfs", random_state=0).fit(X, y)
    # FCFS parts of iris (sorted by class) each miss a class: some pairs ran nowhere.
    assert (clf.pair_status_ < 2).any()
    assert clf.n_iter_.dtype == np.int32 and clf.n_iter_.min() >= 1
    np.testing.assert_array_equal(clf.n_iter_, clf.part_n_iter_[clf.pair_status_ == 2])
    assert clf.n_iter_.sum() == clf.part_n_iter_.sum()
    one = cpu(n_partitions=1).fit(X, y)
    assert one.n_iter_.shape == SVC().fit(X, y).n_iter_.shape == (3,)
    np.testing.assert_array_equal(one.n_iter_, one.part_n_iter_[0])
    # As SVC: a class left without a sample of positive weight runs none of its pairs.
    sw = np.where(y == 2, 0.0, 1.0)
    one = cpu(n_partitions=1).fit(X, y, sample_weight=sw)
    assert one.n_iter_.shape == SVC().fit(X, y, sample_weight=sw).n_iter_.shape == (1,)
    assert one.n_iter_.min() >= 1


def test_pickle_drops_device_copies(cancer):
    """A GPU-fitted model keeps device copies only as a cache, so it unpickles anywhere."""
    Xtr, Xte, ytr, _ = cancer
    clf = cpu(n_partitions=2, random_state=0).fit(Xtr, ytr)
    clf._device_cache = {"cuda:0": object()}
    back = pickle.loads(pickle.dumps(clf))
    assert "_device_cache" not in back.__dict__
    assert isinstance(back.support_vectors_, np.ndarray)
    np.testing.assert_array_equal(back.predict(Xte), clf.predict(Xte))


def test_poor_parts_warn_and_good_parts_do_not():
    """A PartitionWarning names each problem of a partitioned fit; a sound fit is silent."""
    import warnings

    from sklearn.datasets import make_classification

    from gpuml import PartitionWarning

    # Many classes, few rows per class and part (the letter failure mode).
    X, y = make_classification(3000, 10, n_informative=8, n_classes=10, random_state=0)
    with pytest.warns(PartitionWarning, match=r"hold 19 rows per class on average"):
        CASVMClassifier(n_partitions=16, random_state=0, combine="nearest").fit(X, y)
    # Parts smaller than MIN_PART_ROWS: P is large for n.
    X, y = make_classification(2000, 10, random_state=0)
    with pytest.warns(PartitionWarning, match=r"150 of 150 parts have fewer than 20 rows"):
        CASVMClassifier(n_partitions=150, random_state=0).fit(X, y)
    # Two far-apart blobs of one class each: k-means gives two single-class parts.
    rng = np.random.default_rng(0)
    Xb = np.vstack([rng.normal(size=(200, 2)), rng.normal(size=(200, 2)) + 50])
    yb = np.repeat([0, 1], 200)
    with pytest.warns(PartitionWarning, match=r"2 of 2 parts hold samples of one class only"):
        clf = CASVMClassifier(n_partitions=2, partition="kmeans", random_state=0).fit(Xb, yb)
    np.testing.assert_array_equal(clf.predict(Xb), yb)  # still fitted and usable
    # Enough rows per class and part, every part with both classes: no warning; P=1 never.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CASVMClassifier(n_partitions=2, random_state=0).fit(X, y)
        CASVMClassifier(n_partitions=1).fit(Xb, yb)


def test_probability_true_is_calibrated_classifier_cv_with_svc_warnings(cancer):
    from sklearn.model_selection import StratifiedKFold

    Xtr, Xte, ytr, _ = cancer
    with pytest.warns(FutureWarning, match="probability.+parameter.+deprecated"):
        clf = cpu(n_partitions=1, probability=True, random_state=0).fit(Xtr, ytr)
    seed = np.random.RandomState(0).randint(np.iinfo(np.int32).max)
    ref = CalibratedClassifierCV(cpu(n_partitions=1, random_state=0), method="sigmoid",
                                 cv=StratifiedKFold(5, shuffle=True, random_state=seed),
                                 ensemble=False).fit(Xtr, ytr)
    np.testing.assert_allclose(clf.predict_proba(Xte), ref.predict_proba(Xte), rtol=1e-12)
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(Xte)), clf.predict_proba(Xte))
    with pytest.warns(FutureWarning, match="Attribute `probA_` was deprecated"):
        assert clf.probA_.shape == (1,)
    plain = cpu(n_partitions=1).fit(Xtr, ytr)
    assert not hasattr(plain, "predict_proba")


def test_auto_n_partitions_bounds_the_part_size(monkeypatch):
    import gpuml.estimators.casvm as casvm

    assert [cpu()._n_parts(n) for n in (1, 2048, 2049, 10_000)] == [1, 1, 2, 5]
    assert cpu()._n_parts(10_000, gpu=True) == 2
    X, y = load_digits(return_X_y=True)
    # Up to AUTO_PART_ROWS rows: one part, the exact SVM (SVC's model).
    clf = cpu().fit(X, y)
    assert clf.n_partitions_ == 1 and clf.partition_sizes_.tolist() == [len(X)]
    np.testing.assert_array_equal(clf.predict(X), SVC().fit(X, y).predict(X))
    # More rows: ceil(n / AUTO_PART_ROWS) balanced parts, as the integer setting.
    monkeypatch.setattr(casvm, "AUTO_PART_ROWS", 400)
    auto = cpu(random_state=0).fit(X, y)
    assert auto.n_partitions_ == 5 and auto.partition_sizes_.max() <= 400
    fixed = cpu(n_partitions=5, random_state=0).fit(X, y)
    np.testing.assert_array_equal(auto.decision_function(X), fixed.decision_function(X))
    assert fixed.n_partitions_ == 5
    # A precomputed kernel: one part.
    K = X @ X.T
    assert cpu(kernel="precomputed").fit(K, y).n_partitions_ == 1
    with pytest.raises(ValueError, match="n_partitions='bad'|n_partitions"):
        cpu(n_partitions="bad").fit(X, y)


@pytest.mark.parametrize("combine", ["auto", "nearest"])
def test_parts_split_once_per_fit_and_dropped_by_a_refit(combine, monkeypatch):
    """The support vectors split by part and the parts' coefficients are made by the first
    prediction after a fit and kept for the next ones, on the CPU too; a refit on other
    rows predicts as a fresh model does, and a pickled model carries none of them."""
    import gpuml.estimators._part_prediction as prediction

    X, y = load_digits(return_X_y=True)
    made = []
    real = prediction.PartVectors
    monkeypatch.setattr(prediction, "PartVectors",
                        lambda *a: (made.append(a[0].shape[0]), real(*a))[1])
    clf = cpu(n_partitions=6, combine=combine, random_state=0).fit(X[:1200], y[:1200])
    first = clf.decision_function(X)
    assert made == [clf.support_vectors_.shape[0]]
    np.testing.assert_array_equal(clf.decision_function(X), first)
    np.testing.assert_array_equal(clf.predict(X[5:9]), clf.predict(X)[5:9])
    assert len(made) == 1
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(clf)).decision_function(X), first)
    assert len(made) == 2  # the unpickled model made its own

    clf.fit(X[600:], y[600:])  # other rows: another split, other coefficients
    refitted = clf.decision_function(X)
    assert made[2:] == [clf.support_vectors_.shape[0]] != made[:1]
    fresh = cpu(n_partitions=6, combine=combine, random_state=0).fit(X[600:], y[600:])
    np.testing.assert_array_equal(refitted, fresh.decision_function(X))


@pytest.mark.parametrize("n_classes", [2, 3, 5])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_nearest_values_of_many_parts_in_one_compiled_loop(n_classes, dtype, monkeypatch):
    """Rows spread over many parts (fewer than PREDICT_THREAD_ROWS_PER_PART each) take
    their nearest part's values from one compiled loop over the parts: the values of the
    loop over the parts in Python, to rounding, and the same labels (five classes: the
    products by class blocks, PAIR_BLOCKS_MIN_CLASSES)."""
    from sklearn.datasets import make_classification

    import gpuml.estimators._part_prediction as prediction
    from gpuml.kernels import compiling_in_caller

    X, y = make_classification(4000, 12, n_informative=8, n_classes=n_classes,
                               random_state=0)
    X = X.astype(dtype)
    clf = cpu(n_partitions=40, combine="nearest", random_state=0).fit(X[:3000], y[:3000])
    ran = []
    real = prediction.rbf_part_values
    monkeypatch.setattr(prediction, "rbf_part_values",
                        lambda *a, **k: (ran.append(a[0].shape[0]), real(*a, **k))[1])
    with compiling_in_caller():
        values, labels = clf.decision_function(X[3000:]), clf.predict(X[3000:])
        assert ran and ran[0] == 1000  # 1,000 rows over 40 parts: 25 a part
        monkeypatch.setattr(prediction.PartPredictionMixin, "_values_compiled",
                            lambda *a: False)
        np.testing.assert_allclose(values, clf.decision_function(X[3000:]), rtol=1e-12,
                                   atol=1e-12)
        np.testing.assert_array_equal(labels, clf.predict(X[3000:]))


@pytest.mark.parametrize("n_parts", [6, 40])
@pytest.mark.parametrize("n_classes", [2, 3, 5])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("combine", ["neighbors", "auto"])
def test_neighbour_search_and_blend_in_compiled_loops(combine, dtype, n_classes, n_parts,
                                                      monkeypatch):
    """On the host the neighbour search runs in one compiled loop over the parts
    (NearestMerge.search) where its distances are not read (the weights alone; the blend
    among more than NEIGHBOR_PARTS parts, whose weighted values then come from another,
    rbf_part_values with weights): the same neighbours (weights equal) and the values of
    the loops over the parts in Python (which reuse the search's distances), to rounding,
    with every part searched (6 parts) and among each row's nearest parts (40); with
    more features than BLEND_COMPILED_MAX_FEATURES the blend keeps the Python loops."""
    from sklearn.datasets import make_classification

    import gpuml.estimators._part_prediction as prediction
    from gpuml._backend import CPU
    from gpuml.kernels import compiling_in_caller
    from gpuml.kernels.nearest.neighbors import NearestMerge
    from gpuml.routing import NEIGHBOR_PARTS

    X, y = make_classification(4000, 12, n_informative=8, n_classes=n_classes,
                               random_state=0)
    X = X.astype(dtype)
    clf = cpu(n_partitions=n_parts, combine=combine, random_state=0).fit(X[:3000], y[:3000])
    searched, blended = [], []
    search, values = NearestMerge.search, prediction.rbf_part_values
    monkeypatch.setattr(NearestMerge, "search",
                        lambda self, *a: (searched.append(a[0].shape[0]), search(self, *a))[1])
    monkeypatch.setattr(prediction, "rbf_part_values", lambda *a, **k: (
        blended.append(k.get("weights") is not None), values(*a, **k))[1])
    Xte = X[3000:]
    with compiling_in_caller():
        weights = clf._part_weights(CPU, Xte)
        got, labels = clf.decision_function(Xte), clf.predict(Xte)
        assert searched and any(blended) == (n_parts > NEIGHBOR_PARTS)
        # float32: the compiled loops' GEMMs run in SciPy's OpenBLAS, the Python loops' in
        # NumPy's, two builds whose kernels may round float32 products otherwise (they do
        # on AVX-512 with OPENBLAS_CORETYPE=Haswell), and the rbf map amplifies it
        tol = 1e-10 if dtype == np.float64 else 1e-4
        # with more features than BLEND_COMPILED_MAX_FEATURES the search keeps its distances
        blended.clear()
        monkeypatch.setattr(prediction, "BLEND_COMPILED_MAX_FEATURES", X.shape[1] - 1)
        np.testing.assert_allclose(clf.decision_function(Xte), got, rtol=tol, atol=tol)
        assert not any(blended)
        monkeypatch.setattr(NearestMerge, "search", lambda *a: False)
        monkeypatch.setattr(prediction.PartPredictionMixin, "_blend_compiled", lambda *a: False)
        np.testing.assert_array_equal(clf._part_weights(CPU, Xte), weights)
        np.testing.assert_allclose(got, clf.decision_function(Xte), rtol=tol, atol=tol)
        np.testing.assert_array_equal(labels, clf.predict(Xte))


@pytest.mark.parametrize("combine", ["auto", "neighbors", "nearest"])
def test_prediction_in_row_blocks_equals_one_block(combine, monkeypatch):
    import gpuml.estimators._part_prediction as prediction

    X, y = load_digits(return_X_y=True)
    clf = cpu(n_partitions=6, combine=combine, random_state=0).fit(X, y)
    values, labels = clf.decision_function(X), clf.predict(X)
    monkeypatch.setattr(prediction, "PREDICT_BLOCK_ROWS", 97)
    # Other blocks hand BLAS products of other shapes, which it may add in another order
    # (OpenBLAS's kernels for few rows do): the last bits of a value may differ.
    np.testing.assert_allclose(clf.decision_function(X), values, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(clf.predict(X), labels)


@pytest.mark.parametrize("combine", ["auto", "neighbors", "nearest"])
def test_prediction_in_threads_equals_one_thread(combine, monkeypatch):
    """``n_jobs=None`` predicts blocks of rows in threads (one per PREDICT_THREAD_MIN_ROWS
    rows, at most the threads BLAS may use, each block PREDICT_THREAD_ROWS_PER_PART rows
    per part or more): the same labels, the values to rounding."""
    from threadpoolctl import threadpool_limits

    import gpuml.estimators._part_prediction as prediction

    X, y = load_digits(return_X_y=True)
    clf = cpu(n_partitions=6, combine=combine, random_state=0, n_jobs=1).fit(X, y)
    values, labels = clf.decision_function(X), clf.predict(X)
    used = []
    real = prediction.map_threads
    monkeypatch.setattr(prediction, "map_threads", lambda fn, ranges, threads: (
        used.append((len(ranges), threads)), real(fn, ranges, threads))[1])
    monkeypatch.setattr(prediction, "PREDICT_THREAD_MIN_ROWS", 400)
    with threadpool_limits(limits=2, user_api="blas"):
        clf.set_params(n_jobs=None)
        np.testing.assert_allclose(clf.decision_function(X), values, rtol=1e-13, atol=1e-13)
        np.testing.assert_array_equal(clf.predict(X), labels)
        assert used == [(2, 2)] * 2  # two blocks of 899 and 898 rows, one per thread
        used.clear()
        clf.decision_function(X[:700])  # fewer than two threads' rows
        assert used == [(1, 1)]
        used.clear()
        monkeypatch.setattr(prediction, "PREDICT_THREAD_ROWS_PER_PART", 200)
        clf.decision_function(X)  # the parts' values in compiled loops: threads at any P
        assert used == [(2, 2)]
        used.clear()
        monkeypatch.setattr(prediction.PartPredictionMixin, "_compiled_split",
                            lambda *a: None)
        clf.decision_function(X)  # too few rows per part (6 parts) for two threads
        assert used == [(1, 1)]


@pytest.mark.parametrize("y", [
    np.array([0, 1, 2, 1]), np.array([True, False, True, True]), np.array([3.0, -1.0, 3.0, 0.0]),
    np.array([0.5, 1.0, 2.0, 1.0]), np.array(["a", "b", "a", "c"], dtype=object),
    np.array(["a", "b", "a", "c"]), np.array([1e20, 0.0, 1e20, 0.0]), np.array([7, 7, 7, 7]),
    np.array([0, 1, 2, 1], dtype=np.uint8), np.array([1.0, 2.0, 1.0, np.inf]),
])
def test_class_label_check_accepts_and_refuses_as_scikit_learns(y):
    """The shortcut for plain labels raises exactly where scikit-learn's check raises."""
    from sklearn.utils.multiclass import check_classification_targets

    from gpuml._validation import check_class_labels

    try:
        check_classification_targets(y)
    except ValueError as err:
        with pytest.raises(ValueError, match=re.escape(str(err))):
            check_class_labels(y)
    else:
        check_class_labels(y)


def test_parameter_names_read_once_are_scikit_learns_and_per_class():
    from sklearn.base import BaseEstimator

    from gpuml import AsyGCDSVC, BKRRRegressor, BKRRRegressorCV

    class Wider(CASVMClassifier):
        def __init__(self, extra=1, C=1.0):
            super().__init__(C=C)
            self.extra = extra

    class Varargs(CASVMClassifier):
        def __init__(self, *args):
            super().__init__()

    for cls in (CASVMClassifier, BKRRRegressor, BKRRRegressorCV, AsyGCDSVC):
        assert cls._get_param_names() == BaseEstimator._get_param_names.__func__(cls)
    names = CASVMClassifier._get_param_names()
    names.append("not a parameter")  # the caller's copy: the next call is unchanged
    assert "not a parameter" not in CASVMClassifier._get_param_names()
    assert Wider._get_param_names() == ["C", "extra"]  # its own, not its parent's
    with pytest.raises(RuntimeError, match="varargs"):
        Varargs._get_param_names()  # scikit-learn's own refusal, not a cached answer
