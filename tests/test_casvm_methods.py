"""CASVMClassifier's method= settings: Cascade SVM, DC-SVM, DC-Filter (You 2020, sections 2.2-2.3).

Each method is checked against its algorithm written out plainly below, one
binary one-vs-one problem at a time, with the bare SMO solver
(:func:`gpuml.kernels.smo_solve`): Graf et al.'s cascade of layers that merge
two nodes and keep their support vectors, warm-started with their alphas
(Cascade on an even split, DC-Filter on a k-means split), and Hsieh et al.'s
DC-SVM, which passes every row up and ends with the whole problem.
"""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC
from sklearn.utils.estimator_checks import parametrize_with_checks

from gpuml.estimators.casvm import METHOD_PARTITION, CASVMClassifier
from gpuml.kernels import make_kernel, smo_solve
from gpuml.partition import split

TREE_METHODS = ["cascade", "dcsvm", "dcfilter"]


def cpu(**kw):
    return CASVMClassifier(device="cpu", **kw)


def scaled(loader, n=None):
    X, y = loader(return_X_y=True)
    if n is not None:
        X, y = X[:n], y[:n]
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    sc = StandardScaler().fit(Xtr)
    return sc.transform(Xtr), sc.transform(Xte), ytr, yte


@pytest.fixture(scope="module")
def cancer():
    return scaled(load_breast_cancer)


@pytest.fixture(scope="module")
def wine():
    return scaled(load_wine)


@pytest.fixture(scope="module")
def wine_exact(wine):
    """``wine`` with every feature rounded to a multiple of 2**-6 (all below 4 in size).

    Every inner product of two rows, and every squared norm, is then exact in
    float64 whatever order BLAS adds in, so a kernel value is the same bits in a
    node's matrix (the estimator's: the node's rows of every class) as in one
    pair's (by hand). On real-valued rows some BLAS builds round an entry
    differently in matrices of different shapes (OpenBLAS's AVX-512 kernels do),
    and one ulp can turn an SMO working-set choice: the cascade's solution then
    moves by up to ``tol``.
    """
    Xtr, Xte, ytr, yte = wine
    return np.round(Xtr * 64) / 64, np.round(Xte * 64) / 64, ytr, yte


def cascade_by_hand(X, y, parts, kernel, C, keep_all):
    """One binary problem (labels ``y`` in {-1, +1}) through the tree of layers, written out.

    ``parts``: the rows of every first-layer node. Each node is solved on its
    rows, positives first then negatives (ascending within each: the order
    the estimator gives the solver), warm-started with the alphas its
    children passed up; two consecutive nodes merge into one of the next
    layer (an odd last node waits), until one is left. A node passes up its
    support vectors (``keep_all=False``: Cascade, DC-Filter) or all its rows
    (DC-SVM); a node holding one class only is not solved and passes all its
    rows. Returns the root's rows, alphas and intercept.
    """
    def solve(rows, start):
        order = np.argsort(-y[rows], kind="stable")  # +1 first, rows ascending within
        rows, start = rows[order], start[order]
        if np.unique(y[rows]).size < 2:
            return rows, start, None
        res = smo_solve(kernel, X[rows], y[rows], C, tol=1e-3, shrinking=False,
                        alpha0=start if start.any() else None)
        return rows, res.alpha, res.intercept

    nodes = [solve(np.sort(p), np.zeros(len(p))) for p in parts]
    while len(nodes) > 1:
        passed = []
        for rows, alpha, intercept in nodes:
            keep = (np.ones(len(rows), bool) if keep_all or intercept is None
                    else alpha > 0)
            passed.append((rows[keep], alpha[keep]))
        merged = []
        for (ra, aa), (rb, ab) in zip(passed[0::2], passed[1::2]):
            rows = np.concatenate([ra, rb])
            order = np.argsort(rows)
            merged.append(solve(rows[order], np.concatenate([aa, ab])[order]))
        if len(nodes) % 2:
            merged.append(nodes[-1])
        nodes = merged
    return nodes[0]


@pytest.mark.parametrize("method", TREE_METHODS)
@pytest.mark.parametrize("P", [4, 5])
def test_binary_method_equals_its_algorithm_by_hand(method, P, cancer):
    Xtr, Xte, ytr, _ = cancer
    clf = cpu(n_partitions=P, method=method, random_state=0).fit(Xtr, ytr)
    parts = split(Xtr, P, METHOD_PARTITION[method], 0).parts
    labels = np.where(ytr == clf.classes_[0], 1.0, -1.0)
    kernel = make_kernel("rbf", "scale", X=Xtr)
    rows, alpha, intercept = cascade_by_hand(Xtr, labels, parts, kernel, 1.0,
                                             keep_all=method == "dcsvm")
    sv = alpha > 0
    np.testing.assert_array_equal(np.sort(clf.support_), np.sort(rows[sv]))
    # SVC's sign: positive for classes_[1], i.e. minus the pair's (+1 = classes_[0]) value.
    by_hand = -(kernel.dot(Xte, Xtr[rows[sv]], alpha[sv] * labels[rows[sv]]) + intercept)
    np.testing.assert_allclose(clf.decision_function(Xte), by_hand, atol=1e-8)
    assert clf.partition_ == METHOD_PARTITION[method]
    np.testing.assert_array_equal(clf.partition_sizes_, [len(p) for p in parts])
    assert clf.layer_sizes_[0].tolist() == [len(p) for p in parts]
    assert len(clf.layer_sizes_) == 1 + int(np.ceil(np.log2(P)))
    assert clf.n_iter_.sum() == clf.layer_n_iter_.sum()


@pytest.mark.parametrize("method", ["cascade", "dcsvm"])
def test_multiclass_method_is_each_pair_by_hand(method, wine_exact):
    """One-vs-one: every pair runs its own cascade on the rows of its two classes."""
    Xtr, Xte, ytr, _ = wine_exact
    P = 4
    clf = cpu(n_partitions=P, method=method, partition="kmeans", random_state=0).fit(Xtr, ytr)
    parts = split(Xtr, P, "kmeans", 0).parts
    kernel = make_kernel("rbf", "scale", X=Xtr)
    pairs = [(a, b) for a in range(3) for b in range(a + 1, 3)]
    for q, (a, b) in enumerate(pairs):
        mine = np.flatnonzero((ytr == a) | (ytr == b))
        labels = np.where(ytr == a, 1.0, -1.0)
        rows, alpha, intercept = cascade_by_hand(
            Xtr, labels, [np.intersect1d(p, mine) for p in parts], kernel, 1.0,
            keep_all=method == "dcsvm")
        sv = alpha > 0
        theirs = dict(zip(rows[sv].tolist(), (alpha * labels[rows])[sv]))
        ours = {int(r): c for r, c in zip(clf.support_, clf.ovo_dual_coef_[q]) if c != 0}
        assert ours.keys() == theirs.keys()
        np.testing.assert_allclose([ours[r] for r in sorted(ours)],
                                   [theirs[r] for r in sorted(theirs)], atol=1e-10)
        assert clf.part_intercept_[0, q] == pytest.approx(intercept, abs=1e-10)


@pytest.mark.parametrize("method", ["casvm", *TREE_METHODS])
def test_one_part_is_svc(method, wine):
    Xtr, Xte, ytr, _ = wine
    ours = cpu(n_partitions=1, method=method).fit(Xtr, ytr)
    svc = SVC(C=1.0, gamma="scale").fit(Xtr, ytr)
    np.testing.assert_array_equal(np.sort(ours.support_), np.sort(svc.support_))
    np.testing.assert_allclose(ours.decision_function(Xte), svc.decision_function(Xte),
                               atol=1e-2)
    assert np.all(ours.predict(Xte) == svc.predict(Xte))


@pytest.mark.parametrize("method", TREE_METHODS)
def test_tree_n_iter_is_each_trained_pair_over_all_layers(method):
    """The model is one SVM: n_iter_ has one entry (>= 1) per pair it trained, as SVC."""
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    # FCFS parts of iris (sorted by class) miss classes: pairs start in later layers.
    clf = cpu(n_partitions=4, method=method, partition="fcfs", random_state=0).fit(X, y)
    assert clf.n_iter_.shape == (3,) and clf.n_iter_.dtype == np.int32
    assert clf.n_iter_.min() >= 1 and clf.n_iter_.sum() == clf.layer_n_iter_.sum()
    # A class without a sample of positive weight: its pairs ran nowhere and have no entry.
    sw = np.where(y == 2, 0.0, 1.0)
    clf = cpu(n_partitions=4, method=method, partition="fcfs", random_state=0).fit(
        X, y, sample_weight=sw)
    assert clf.n_iter_.shape == SVC().fit(X, y, sample_weight=sw).n_iter_.shape == (1,)
    assert clf.n_iter_.min() >= 1 and clf.n_iter_.sum() == clf.layer_n_iter_.sum()


def test_dcsvm_warm_start_reaches_the_exact_optimum_in_fewer_steps(cancer):
    """DC-SVM's last layer is the whole problem, warm-started: same optimum as a cold solve."""
    Xtr, Xte, ytr, _ = cancer
    cold = cpu(n_partitions=1, tol=1e-5).fit(Xtr, ytr)
    dc = cpu(n_partitions=8, method="dcsvm", tol=1e-5, random_state=0).fit(Xtr, ytr)
    assert dc.layer_sizes_[-1].tolist() == [len(ytr)]
    np.testing.assert_allclose(dc.objective_, cold.objective_, rtol=1e-6)
    np.testing.assert_allclose(dc.decision_function(Xte), cold.decision_function(Xte),
                               atol=1e-3)
    assert dc.layer_n_iter_[-1] < cold.n_iter_.sum()


def test_warm_start_of_the_solver_from_the_parts(cancer):
    """The solver from k-means parts' alphas (DC-SVM's start): the cold optimum, fewer steps.

    (From a random split's alphas it takes about as many steps as a cold start:
    docs/casvm.md, "Cascade, DC-SVM, DC-Filter".)
    """
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    y = np.where(y == 1, 1.0, -1.0)
    kernel = make_kernel("rbf", "scale", X=X)
    start = np.zeros(len(y))
    for rows in split(X, 4, "kmeans", 0).parts:
        if np.unique(y[rows]).size == 2:  # a one-class part has no dual: its alphas stay 0
            start[rows] = smo_solve(kernel, X[rows], y[rows], 1.0, tol=1e-6).alpha
    cold = smo_solve(kernel, X, y, 1.0, tol=1e-6)
    warm = smo_solve(kernel, X, y, 1.0, tol=1e-6, alpha0=start)
    assert warm.objective == pytest.approx(cold.objective, rel=1e-10)
    np.testing.assert_allclose(warm.alpha, cold.alpha, atol=1e-4)
    assert warm.n_iter < 0.9 * cold.n_iter


def test_cascade_filters_to_support_vectors(cancer):
    Xtr, Xte, ytr, yte = cancer
    clf = cpu(n_partitions=8, method="cascade", random_state=0).fit(Xtr, ytr)
    sizes = [int(s.sum()) for s in clf.layer_sizes_]
    assert sizes[0] == len(ytr) and all(a > b for a, b in zip(sizes, sizes[1:]))
    assert clf.intercept_.shape == (1,) and clf.centers_.shape == (1, Xtr.shape[1])
    assert clf.score(Xte, yte) >= SVC().fit(Xtr, ytr).score(Xte, yte) - 0.02


def test_tree_methods_refuse_several_devices(cancer):
    Xtr, _, ytr, _ = cancer
    with pytest.raises(ValueError, match="method='cascade' fits on one device"):
        CASVMClassifier(method="cascade", devices=["cpu", "cpu"]).fit(Xtr, ytr)


def test_tree_methods_refuse_dask_input(cancer):
    da = pytest.importorskip("dask.array")
    Xtr, _, ytr, _ = cancer
    with pytest.raises(ValueError, match="method='dcsvm' does not run on Dask input"):
        cpu(method="dcsvm").fit(da.from_array(Xtr, chunks=100), da.from_array(ytr, chunks=100))


def test_auto_partition_and_bad_method(cancer):
    Xtr, _, ytr, _ = cancer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cpu(n_partitions=2, random_state=0).fit(Xtr, ytr).partition_ == "fcfs"
        assert cpu(n_partitions=2, partition="fcfs", method="dcfilter",
                   random_state=0).fit(Xtr, ytr).partition_ == "fcfs"
    with pytest.raises(ValueError, match="method"):
        cpu(method="dc").fit(Xtr, ytr)


def _expected_failures(estimator):
    why = "sample_weight is not equivalent to removing/repeating samples (as SVC)."
    return {"check_sample_weight_equivalence_on_dense_data": why,
            "check_sample_weight_equivalence_on_sparse_data": why}


@parametrize_with_checks([CASVMClassifier(n_partitions=2, method="cascade", device="cpu",
                                          random_state=0)],
                         expected_failed_checks=_expected_failures)
def test_sklearn_compatible(estimator, check):
    check(estimator)
