"""AsyGCDSVC: scikit-learn citizenship, bad input, and agreement with independent solvers."""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC
from sklearn.utils.estimator_checks import parametrize_with_checks

from gpuml.estimators.asygcd import AsyGCDSVC
from gpuml.kernels import make_kernel

X_BC, Y_BC = load_breast_cancer(return_X_y=True)
X_BC = StandardScaler().fit_transform(X_BC)
X_DIG, Y_DIG = load_digits(n_class=4, return_X_y=True)
X_DIG = StandardScaler().fit_transform(X_DIG)


def _expected_failures(estimator):
    if estimator.kernel == "precomputed":
        return {}
    # gamma="scale" is 1 / (n_features * X.var()): repeating samples changes X.var() and so the
    # kernel, so "weight 2" and "sample twice" are two different problems. With a numeric gamma
    # they are the same problem (test_sample_weight_is_repetition_for_a_fixed_kernel).
    reason = "gamma='scale' depends on the rows, so repeating rows changes the kernel"
    return {"check_sample_weight_equivalence_on_dense_data": reason,
            "check_sample_weight_equivalence_on_sparse_data": reason}


@parametrize_with_checks([
    # One worker is serial GCD (Alg 13): deterministic, as the checks need. The precomputed
    # checks feed rank-deficient linear Gram matrices, on which GCD crawls: bound the updates.
    AsyGCDSVC(n_workers=1, tol=1e-10, device="cpu", random_state=0),
    AsyGCDSVC(kernel="precomputed", n_workers=1, tol=1e-6, max_updates=5000, device="cpu",
              random_state=0),
], expected_failed_checks=_expected_failures)
def test_sklearn_compatible(estimator, check):
    check(estimator)


def _dual_objective(clf, X, y_signed, rows):
    kernel = make_kernel(clf.kernel, clf.gamma, clf.degree, clf.coef0, X)
    alpha = np.zeros(X.shape[0])
    alpha[clf.support_] = np.abs(clf.dual_coef_[0])
    a = alpha[rows]
    Q = np.outer(y_signed, y_signed) * kernel.matrix(X[rows])
    return 0.5 * a @ Q @ a - a.sum()


@pytest.fixture(scope="module")
def digits_binary():
    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    y = np.where(y < 5, "low", "high")
    serial = AsyGCDSVC(n_workers=1, tol=1e-7, device="cpu").fit(X, y)
    return X, y, serial


@pytest.mark.parametrize("n_workers", [1, 2, 4])
@pytest.mark.parametrize("block_partition", ["kmeans", "kbalance", "random"])
def test_binary_objective_and_accuracy(digits_binary, n_workers, block_partition):
    X, y, serial = digits_binary
    clf = AsyGCDSVC(n_workers=n_workers, block_partition=block_partition, tol=1e-4,
                    device="cpu", random_state=0).fit(X, y)
    assert abs(clf.objective_[0] - serial.objective_[0]) <= 1e-4 * abs(serial.objective_[0])
    y_signed = np.where(y == clf.classes_[1], 1.0, -1.0)
    f = _dual_objective(clf, X, y_signed, np.arange(len(y)))
    assert abs(f - clf.objective_[0]) <= 1e-6 * abs(f)
    assert clf.max_violation_[0] < 1e-4 and clf.n_updates_[0] > 0
    assert abs(clf.score(X, y) - SVC().fit(X, y).score(X, y)) <= 0.01


def test_decision_function_is_the_kernel_expansion():
    clf = AsyGCDSVC(n_workers=2, device="cpu", random_state=0).fit(X_BC, Y_BC)
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_BC)
    expected = kernel.matrix(X_BC[:50], clf.support_vectors_) @ clf.dual_coef_[0]
    np.testing.assert_allclose(clf.decision_function(X_BC[:50]), expected, rtol=1e-10)
    np.testing.assert_array_equal(clf.support_vectors_, X_BC[clf.support_])
    assert clf.n_support_.sum() == len(clf.support_)
    pred = clf.predict(X_BC[:50])
    np.testing.assert_array_equal(pred, clf.classes_[(expected > 0).astype(int)])


def test_default_spreads_pairs_over_cores_with_the_serial_solution(monkeypatch):
    from gpuml import kernels

    # On the CPU, None gives one worker per one-vs-one problem and the problems run at
    # once; a binary problem keeps every core; an explicit n_workers runs pairs in turn.
    monkeypatch.setattr(kernels, "gcd_default_workers", lambda like=None: 4)
    assert kernels.gcd_plan(X_DIG, 45) == (1, 4)
    assert kernels.gcd_plan(X_DIG, 3) == (1, 3)
    assert kernels.gcd_plan(X_DIG, 1) == (4, 1)
    assert kernels.gcd_plan(X_DIG, 45, n_workers=2) == (2, 1)
    labels = Y_DIG % 4
    spread = AsyGCDSVC(tol=1e-4, device="cpu", random_state=0).fit(X_DIG, labels)
    serial = AsyGCDSVC(n_workers=1, tol=1e-4, device="cpu", random_state=0).fit(X_DIG, labels)
    assert spread.n_workers_ == 1
    # Each pair is the same serial greedy solve, wherever it ran.
    np.testing.assert_array_equal(spread.support_, serial.support_)
    np.testing.assert_array_equal(spread.dual_coef_, serial.dual_coef_)
    np.testing.assert_array_equal(spread.n_updates_, serial.n_updates_)


def test_multiclass_one_vs_one_with_string_labels():
    labels = np.array(["zero", "one", "two", "three"])[Y_DIG]
    clf = AsyGCDSVC(n_workers=2, device="cpu", random_state=0).fit(X_DIG, labels)
    assert clf.dual_coef_.shape == (3, len(clf.support_))  # SVC's packing
    assert clf.ovo_dual_coef_.shape == (6, len(clf.support_))
    assert set(clf.classes_) == set(labels)
    scores = clf.decision_function(X_DIG)
    assert scores.shape == (len(labels), 4)
    np.testing.assert_array_equal(clf.predict(X_DIG), clf.classes_[scores.argmax(1)])
    assert clf.score(X_DIG, labels) >= SVC().fit(X_DIG, labels).score(X_DIG, labels) - 0.01
    # Pair (a, b) only involves samples of classes a and b.
    codes = np.searchsorted(clf.classes_, labels[clf.support_])
    first_pair = clf.ovo_dual_coef_[0]
    assert np.all(first_pair[(codes != 0) & (codes != 1)] == 0)
    # LIBSVM's sign: positive for the pair's first class.
    assert np.all(first_pair[codes == 0] >= 0) and np.all(first_pair[codes == 1] <= 0)
    # Support vectors grouped by class, rows ascending within a class (SVC's order).
    np.testing.assert_array_equal(np.lexsort((clf.support_, codes)),
                                  np.arange(len(clf.support_)))


def test_sample_and_class_weight_scale_c():
    base = dict(n_workers=1, tol=1e-6, device="cpu", random_state=0)
    doubled = AsyGCDSVC(C=2.0, **base).fit(X_BC, Y_BC)
    weighted = AsyGCDSVC(**base).fit(X_BC, Y_BC, sample_weight=np.full(len(Y_BC), 2.0))
    np.testing.assert_allclose(weighted.dual_coef_, doubled.dual_coef_)
    by_class = AsyGCDSVC(class_weight={0: 3.0, 1: 0.5}, **base).fit(X_BC, Y_BC)
    by_sample = AsyGCDSVC(**base).fit(X_BC, Y_BC, sample_weight=np.where(Y_BC == 0, 3.0, 0.5))
    np.testing.assert_allclose(by_class.dual_coef_, by_sample.dual_coef_)
    bound = np.where(Y_BC[by_class.support_] == 0, 3.0, 0.5)
    assert np.all(np.abs(by_class.dual_coef_[0]) <= bound + 1e-12)


def test_sample_weight_is_repetition_for_a_fixed_kernel():
    X, y = X_BC[:80], Y_BC[:80]
    weights = np.where(np.arange(80) % 3 == 0, 2, 1)
    base = dict(gamma=0.05, n_workers=1, tol=1e-10, device="cpu")
    weighted = AsyGCDSVC(**base).fit(X, y, sample_weight=weights)
    repeated = AsyGCDSVC(**base).fit(np.repeat(X, weights, axis=0), np.repeat(y, weights))
    np.testing.assert_allclose(weighted.decision_function(X_BC), repeated.decision_function(X_BC),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(weighted.objective_, repeated.objective_, rtol=1e-9)


def test_precomputed_sparse_and_random_selection_agree():
    dense = AsyGCDSVC(n_workers=1, tol=1e-6, device="cpu").fit(X_BC, Y_BC)
    sparse = AsyGCDSVC(n_workers=1, tol=1e-6, device="cpu").fit(sp.csr_matrix(X_BC), Y_BC)
    np.testing.assert_allclose(sparse.objective_, dense.objective_, rtol=1e-10)
    K = make_kernel("rbf", dense.gamma, 3, 0.0, X_BC).matrix(X_BC)
    pre = AsyGCDSVC(kernel="precomputed", n_workers=2, tol=1e-5, device="cpu",
                    random_state=0).fit(K, Y_BC)
    assert abs(pre.objective_[0] - dense.objective_[0]) <= 1e-4 * abs(dense.objective_[0])
    np.testing.assert_array_equal(pre.predict(K), dense.predict(X_BC))
    rand = AsyGCDSVC(n_workers=2, selection="random", tol=1e-4, device="cpu",
                     random_state=0).fit(X_BC, Y_BC)
    assert abs(rand.objective_[0] - dense.objective_[0]) <= 1e-4 * abs(dense.objective_[0])


def test_more_workers_than_samples_and_max_updates():
    X, y = X_BC[:6], Y_BC[:6]
    y = np.array([0, 1, 0, 1, 0, 1])
    clf = AsyGCDSVC(n_workers=16, device="cpu", random_state=0).fit(X, y)
    assert clf.n_workers_ == 16 and clf.max_violation_[0] < 1e-3
    with pytest.warns(ConvergenceWarning, match=r"stopped 1 of 1 binary problems at the "
                      r"update cap.*raise max_updates"):
        capped = AsyGCDSVC(n_workers=1, max_updates=5, tol=1e-8, device="cpu").fit(X_BC, Y_BC)
    assert capped.n_updates_[0] == 5 and capped.max_violation_[0] > 1e-8


def test_inputs_untouched_and_pickle_roundtrip():
    X, y = X_BC.copy(), Y_BC.copy()
    clf = AsyGCDSVC(n_workers=2, device="cpu", random_state=0).fit(X, y)
    np.testing.assert_array_equal(X, X_BC)
    np.testing.assert_array_equal(y, Y_BC)
    again = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(again.decision_function(X[:20]), clf.decision_function(X[:20]))


@pytest.mark.parametrize(("params", "match"), [
    ({"C": 0.0}, "'C' parameter"),
    ({"C": -1.0}, "'C' parameter"),
    ({"n_workers": 0}, "'n_workers' parameter"),
    ({"selection": "cyclic"}, "'selection' parameter"),
    ({"block_partition": "bkm"}, "'block_partition' parameter"),
    ({"tol": 0.0}, "'tol' parameter"),
])
def test_bad_parameters(params, match):
    with pytest.raises(ValueError, match=match):
        AsyGCDSVC(device="cpu", **params).fit(X_BC, Y_BC)


def test_bad_data():
    clf = AsyGCDSVC(device="cpu")
    with pytest.raises(ValueError, match="at least two classes"):
        clf.fit(X_BC, np.zeros(len(Y_BC)))
    for bad in (np.nan, np.inf):
        X = X_BC.copy()
        X[3, 2] = bad
        with pytest.raises(ValueError, match="NaN|infinity"):
            clf.fit(X, Y_BC)
    with pytest.raises(NotFittedError):
        AsyGCDSVC().predict(X_BC)
    with pytest.raises(ValueError, match="square"):
        AsyGCDSVC(kernel="precomputed", device="cpu").fit(X_BC, Y_BC)


def test_default_cache_and_update_cap(monkeypatch):
    from gpuml.kernels import gcd_default_cache_bytes
    from gpuml.kernels.gcd import cpu as cpu_gcd

    assert AsyGCDSVC().cache_size is None and gcd_default_cache_bytes(X_BC) == 1 << 30
    # No cap given: the solver's default cap ends the fit, which warns.
    monkeypatch.setattr(cpu_gcd, "default_max_updates", lambda n: 7)
    with pytest.warns(ConvergenceWarning, match="stopped 6 of 6 binary problems"):
        clf = AsyGCDSVC(n_workers=1, tol=1e-6, device="cpu").fit(X_DIG, Y_DIG)
    assert np.all(clf.n_updates_ == 7)


def test_unbalanced_kmeans_blocks_warn():
    rng = np.random.default_rng(0)
    # 600 points in one tight cloud and 4 far outliers: k-means gives the outliers their own
    # centres and leaves one block with nearly every variable.
    X = np.vstack([rng.normal(size=(600, 3)), 50 + rng.normal(size=(4, 3)) * 20])
    y = np.arange(len(X)) % 2
    with pytest.warns(UserWarning, match=r"unequal variable blocks \(the largest held 99\.[0-9]%"
                      r".*'kbalance'"):
        AsyGCDSVC(n_workers=2, block_partition="kmeans", device="cpu", random_state=0).fit(X, y)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for balanced in ("random", "kbalance"):
            AsyGCDSVC(n_workers=2, block_partition=balanced, device="cpu",
                      random_state=0).fit(X, y)
        AsyGCDSVC(n_workers=2, device="cpu", random_state=0).fit(X, y)  # the default: kbalance
