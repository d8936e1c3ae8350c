"""One split, many solves with the real estimators: :func:`gpuml.pipeline.fit_settings`.

For CA-SVM (C, γ, class weights, ``part_C``) and BKRR (σ, λ) on every executor that
runs here, each setting's model equals the ordinary fit of that setting, bit for
bit, and its predictions too.
"""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.datasets import load_digits, make_regression

from gpuml import BKRRRegressor, CASVMClassifier
from gpuml.pipeline import fit_settings

WHERE = {
    "in_process": dict(device="cpu"),
    "streamed": dict(device="cpu", max_device_memory="1MB"),
    "devices": dict(devices=["cpu", "cpu"]),
}

CASVM_ARRAYS = ("support_", "support_part_", "dual_coef_", "ovo_dual_coef_", "intercept_",
                "part_intercept_", "support_vectors_", "n_iter_", "pair_status_", "centers_",
                "class_weight_", "partition_sizes_")


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X[:900] / 16.0, y[:900]


def _same_casvm(a, b, X):
    for name in CASVM_ARRAYS:
        va, vb = getattr(a, name), getattr(b, name)
        if sp.issparse(va):
            va, vb = va.toarray(), vb.toarray()
        np.testing.assert_array_equal(va, vb, err_msg=name)
    np.testing.assert_array_equal(a.decision_function(X), b.decision_function(X))
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


@pytest.mark.parametrize("where", list(WHERE))
def test_casvm_settings_are_the_separate_fits(digits, where):
    X, y = digits
    w = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    base = CASVMClassifier(n_partitions=4, random_state=0, **WHERE[where])
    settings = [{"C": 0.3, "gamma": 0.05}, {"C": 10.0}, {"class_weight": "balanced",
                                                         "part_C": "none"}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = fit_settings(base, settings, X, y, sample_weight=w)
        for fitted, setting in zip(fits, settings):
            assert fitted.get_params() == clone(base).set_params(**setting).get_params()
            _same_casvm(fitted, clone(base).set_params(**setting).fit(X, y, sample_weight=w),
                        X)
    assert not np.array_equal(fits[0].n_iter_, fits[1].n_iter_)


@pytest.mark.parametrize("where", ["streamed", "devices"])
def test_casvm_c_paths_are_the_same_on_every_executor(digits, where):
    """The settings of C and γ solved together (one C path per γ: jointly=True) give the
    same models wherever the parts are solved; the tree method beside them alone."""
    X, y = digits
    base = CASVMClassifier(n_partitions=4, random_state=0, **WHERE[where])
    settings = [{"C": C, "gamma": g} for C in (0.3, 3.0) for g in (0.02, 0.05)]
    settings.append({"C": 1.0, "class_weight": "balanced"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        there = fit_settings(base, settings, X, y, jointly=True)
        here = fit_settings(clone(base).set_params(**WHERE["in_process"], devices=None,
                                                   max_device_memory=None),
                            settings, X, y, jointly=True)
    for a, b in zip(there, here):
        _same_casvm(a, b, X)
    # the class-weighted setting differs in more than C and γ: solved alone, the plain fit
    _same_casvm(here[-1], clone(base).set_params(**WHERE["in_process"], devices=None,
                                                 max_device_memory=None,
                                                 **settings[-1]).fit(X, y), X)


def test_casvm_settings_of_the_tree_methods_and_sparse_rows(digits):
    X, y = digits
    Xs = sp.csr_matrix(np.where(X > 0.4, X, 0.0))
    for est, rows in [(CASVMClassifier(method="dcsvm", n_partitions=4, device="cpu",
                                       random_state=0), X),
                      (CASVMClassifier(n_partitions=3, device="cpu", random_state=0), Xs)]:
        settings = [{"C": 0.5}, {"C": 5.0, "gamma": 0.02}]
        for fitted, setting in zip(fit_settings(est, settings, rows, y), settings):
            _same_casvm(fitted, clone(est).set_params(**setting).fit(rows, y), rows)
            if est.method == "dcsvm":
                np.testing.assert_array_equal(fitted.layer_n_iter_, clone(est).set_params(
                    **setting).fit(rows, y).layer_n_iter_)


@pytest.mark.parametrize("where", list(WHERE))
def test_bkrr_settings_are_the_separate_fits(where):
    X, y = make_regression(1500, 6, noise=1.0, random_state=0)
    X /= X.std(axis=0)
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(y))
    params = dict(WHERE[where], max_device_memory="5MB") if where == "streamed" else \
        WHERE[where]
    base = BKRRRegressor(n_partitions=3, random_state=0, **params)
    settings = [{"sigma": 1.0, "lam": 1e-4}, {"sigma": 4.0}, {"lam": 0.1,
                                                             "fit_intercept": False}]
    for fitted, setting in zip(fit_settings(base, settings, X, y, sample_weight=w), settings):
        alone = clone(base).set_params(**setting).fit(X, y, sample_weight=w)
        for name in ("X_fit_", "dual_coef_", "intercept_", "centers_", "shifts_"):
            np.testing.assert_array_equal(getattr(fitted, name), getattr(alone, name), name)
        assert (fitted.sigma_, fitted.lam_) == (alone.sigma_, alone.lam_)
        np.testing.assert_array_equal(fitted.predict(X), alone.predict(X))


def test_settings_that_change_the_split_are_refused(digits):
    X, y = digits
    with pytest.raises(ValueError, match="not n_partitions"):
        fit_settings(CASVMClassifier(), [{"n_partitions": 2}], X, y)
    with pytest.raises(ValueError, match="not dtype, partition"):
        fit_settings(BKRRRegressor(), [{"partition": "random", "dtype": "float32"}], X,
                     y * 1.0)


@pytest.mark.parametrize("sparse", [False, True])
def test_split_fits_one_model_at_a_time(digits, sparse):
    """Split.fits yields the models Split.fit makes (a joint C path, its support vectors
    gathered as each model is assembled), and keeps none it has yielded: a search that
    scores each model and drops it holds one model, not every setting's."""
    import gc
    import weakref

    from gpuml.pipeline.fit import Split

    X, y = digits
    rows = sp.csr_matrix(np.where(X > 0.4, X, 0.0)) if sparse else X
    base = CASVMClassifier(n_partitions=3, random_state=0, device="cpu")
    settings = [{"C": C, "gamma": g} for C in (0.3, 3.0, 30.0) for g in (0.02, 0.05)]

    def models():
        return [clone(base).set_params(**s) for s in settings]

    whole = fit_settings(base, settings, rows, y, jointly=True)
    split = Split(models(), rows, y)
    seen, gone = [], []
    for k, model in split.fits(models(), jointly=True):
        _same_casvm(model, whole[k], rows)
        gone.extend(ref() is None for ref in seen)
        seen.append(weakref.ref(model))
        del model
        gc.collect()
    assert len(seen) == len(settings) and gone and all(gone)


def test_a_joint_result_hands_each_setting_over():
    """FitResult.take: the fits of one setting, forgotten by the joint result."""
    from gpuml.pipeline import FitResult

    joint = FitResult([("a0", "b0"), ("a1", "b1")], solver="joint")
    one = joint.take(1, "second")
    assert one.fits == ["b0", "b1"] and one.solver == "second"
    assert joint.fits == [("a0", None), ("a1", None)]
