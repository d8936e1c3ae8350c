"""BKRRRegressorCV: same choice as brute force on the same splits, closed-form LOO, refit."""

import numpy as np
import pytest
from sklearn.kernel_ridge import KernelRidge
from sklearn.metrics import r2_score
from sklearn.model_selection import GridSearchCV, KFold

from gpuml.estimators.bkrr import BKRRRegressor, BKRRRegressorCV
from gpuml.estimators.bkrr_cv import _r2_scores

SIGMAS = [0.5, 1.5, 4.0]
LAMS = [1e-6, 1e-4, 1e-2]


@pytest.mark.parametrize("partition, combine", [("kbalance", "nearest"), ("random", "average"),
                                                ("kmeans", "nearest")])
def test_same_choice_and_scores_as_grid_search(diabetes, partition, combine):
    X, y = diabetes
    folds = KFold(4, shuffle=True, random_state=0)
    common = dict(n_partitions=3, partition=partition, combine=combine, device="cpu",
                  random_state=0)
    fast = BKRRRegressorCV(sigmas=SIGMAS, lams=LAMS, cv=folds, **common).fit(X, y)
    brute = GridSearchCV(BKRRRegressor(**common), {"sigma": SIGMAS, "lam": LAMS},
                         cv=folds).fit(X, y)
    assert fast.best_params_ == brute.best_params_
    assert fast.cv_results_["params"] == brute.cv_results_["params"]
    for key in ["mean_test_score", "std_test_score"] + [f"split{k}_test_score" for k in range(4)]:
        np.testing.assert_allclose(fast.cv_results_[key], brute.cv_results_[key],
                                   rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(fast.cv_results_["rank_test_score"],
                                  brute.cv_results_["rank_test_score"])
    assert fast.best_index_ == brute.best_index_
    assert fast.best_score_ == pytest.approx(brute.best_score_, rel=1e-8)
    np.testing.assert_allclose(fast.predict(X[:30]), brute.predict(X[:30]), rtol=1e-8)


@pytest.mark.parametrize("fit_intercept", [False, True])
def test_closed_form_loo_is_brute_force_loo(diabetes, fit_intercept):
    """Every sample left out of its own part, the part's shift lam*m_j kept (eq. 3.6).

    With centring, the part's mean is the whole part's (not refitted without the sample).
    """
    X, y = diabetes
    X, y = X[:120], y[:120]
    fast = BKRRRegressorCV(sigmas=SIGMAS, lams=LAMS, fit_intercept=fit_intercept,
                           n_partitions=3, device="cpu", random_state=0).fit(X, y)
    parts = BKRRRegressor(n_partitions=3, device="cpu", random_state=0).fit(X, y)
    order = [np.flatnonzero((X == r).all(axis=1))[0] for r in parts.X_fit_]
    brute = []
    for lam in LAMS:  # GridSearchCV's order: lam slowest, sigma fastest
        for sigma in SIGMAS:
            loo = []
            for lo, hi in zip(parts.part_offsets_[:-1], parts.part_offsets_[1:]):
                idx = np.array(order[lo:hi])
                mean = y[idx].mean() if fit_intercept else 0.0
                for i in range(len(idx)):
                    keep = np.delete(idx, i)
                    model = KernelRidge(alpha=lam * len(idx), kernel="rbf",
                                        gamma=1 / (2 * sigma**2)).fit(X[keep], y[keep] - mean)
                    loo.append(model.predict(X[idx[i]][None])[0] + mean)
            brute.append(r2_score(y[order], loo))
    np.testing.assert_allclose(fast.cv_results_["mean_test_score"], brute, rtol=1e-7)
    assert fast.best_index_ == int(np.argmax(brute))


def test_refit_is_the_plain_estimator(diabetes):
    X, y = diabetes
    fast = BKRRRegressorCV(sigmas=SIGMAS, lams=LAMS, n_partitions=2, device="cpu",
                           random_state=0).fit(X, y)
    plain = BKRRRegressor(sigma=fast.sigma_, lam=fast.lam_, n_partitions=2, device="cpu",
                          random_state=0).fit(X, y)
    np.testing.assert_array_equal(fast.predict(X), plain.predict(X))
    assert fast.best_params_ == {"lam": fast.lam_, "sigma": fast.sigma_}
    assert fast.n_splits_ == 1
    assert fast.best_score_ == fast.cv_results_["mean_test_score"].max()
    assert fast.cv_results_["rank_test_score"][fast.best_index_] == 1


def test_no_refit_keeps_results_only(diabetes):
    X, y = diabetes
    fast = BKRRRegressorCV(sigmas=SIGMAS[:2], lams=LAMS, refit=False, n_partitions=2,
                           device="cpu", random_state=0).fit(X, y)
    assert not hasattr(fast, "best_estimator_")
    with pytest.raises(Exception, match="not fitted"):
        fast.predict(X)


def test_multi_output_scores_average_the_targets(diabetes):
    X, y = diabetes
    single = BKRRRegressorCV(sigmas=SIGMAS, lams=LAMS, n_partitions=2, device="cpu",
                             random_state=0).fit(X, y)
    double = BKRRRegressorCV(sigmas=SIGMAS, lams=LAMS, n_partitions=2, device="cpu",
                             random_state=0).fit(X, np.column_stack([y, y]))
    np.testing.assert_allclose(double.cv_results_["mean_test_score"],
                               single.cv_results_["mean_test_score"], rtol=1e-10)
    assert double.predict(X[:5]).shape == (5, 2)


@pytest.mark.parametrize("params, match", [
    ({"sigmas": []}, "at least one"),
    ({"sigmas": [1.0, 0.0]}, "sigma"),
    ({"lams": [1e-3, 0.0]}, "lam"),
    ({"lams": [np.nan]}, "lam"),
    ({"combine": "average"}, "cv=None"),
    ({"partition": "nope"}, "partition"),
])
def test_bad_parameters(diabetes, params, match):
    X, y = diabetes
    with pytest.raises(ValueError, match=match):
        BKRRRegressorCV(device="cpu", **params).fit(X, y)


def test_one_sample_is_a_clear_error():
    with pytest.raises(ValueError, match="n_samples = 1"):
        BKRRRegressorCV(device="cpu").fit(np.ones((1, 3)), np.ones(1))


@pytest.mark.parametrize("y", [np.linspace(-1, 2, 9), np.ones(9), np.arange(27.0).reshape(9, 3),
                               np.column_stack([np.ones(9), np.arange(9.0)])])
def test_r2_of_many_predictions_is_sklearns(y):
    rng = np.random.default_rng(0)
    preds = rng.normal(size=(4,) + y.shape)
    preds[1] = y
    np.testing.assert_allclose(_r2_scores(y, preds), [r2_score(y, p) for p in preds],
                               rtol=1e-12)
    assert np.isnan(_r2_scores(y[:1], preds[:, :1])).all()


def test_float32_search_close_to_float64(diabetes):
    X, y = diabetes
    folds = KFold(3, shuffle=True, random_state=0)
    common = dict(sigmas=SIGMAS, lams=[1e-3, 1e-2], cv=folds, n_partitions=2, device="cpu",
                  random_state=0)
    double = BKRRRegressorCV(**common).fit(X, y)
    single = BKRRRegressorCV(dtype="float32", **common).fit(X.astype(np.float32), y)
    np.testing.assert_allclose(single.cv_results_["mean_test_score"],
                               double.cv_results_["mean_test_score"], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("cv", [None, 3])
@pytest.mark.parametrize("combine", ["nearest", "average"])
def test_cholesky_search_equals_the_reduction(diabetes, cv, combine):
    if cv is None and combine == "average":
        return  # leave-one-out is for combine="nearest" only
    X, y = diabetes
    common = dict(sigmas=SIGMAS, lams=LAMS, cv=cv, n_partitions=3, combine=combine,
                  device="cpu", random_state=0)
    red = BKRRRegressorCV(search="reduction", **common).fit(X, y)
    cho = BKRRRegressorCV(search="cholesky", **common).fit(X, y)
    assert red.search_ == "reduction" and cho.search_ == "cholesky"
    np.testing.assert_allclose(cho.cv_results_["mean_test_score"],
                               red.cv_results_["mean_test_score"], rtol=1e-7, atol=1e-9)
    assert cho.best_params_ == red.best_params_


def test_auto_search_picks_the_cheaper_for_the_grid(diabetes):
    """Reduction ~5 Cholesky (Householder) or ~12 (eigen: LOO, GPU); a λ ~1 (LOO: 3)."""
    from gpuml._backend import CPU, Backend
    from gpuml.kernels.krr import tridiagonal_form

    # The reduction's form: Householder on the CPU, eigen for leave-one-out and on a GPU
    # (a backend that only says it is a GPU: nothing runs on it).
    assert tridiagonal_form(CPU) == "householder"
    assert tridiagonal_form(CPU, eigen=True) == tridiagonal_form(Backend(np, 0)) == "eigen"
    est = BKRRRegressorCV()
    assert est._search_kind(3, loo=False, form="householder") == "cholesky"
    assert est._search_kind(5, loo=False, form="householder") == "cholesky"
    assert est._search_kind(6, loo=False, form="householder") == "reduction"
    assert est._search_kind(4, loo=True, form="eigen") == "cholesky"
    assert est._search_kind(5, loo=True, form="eigen") == "reduction"
    assert est._search_kind(10, loo=False, form="eigen") == "cholesky"
    assert est._search_kind(13, loo=False, form="eigen") == "reduction"
    assert BKRRRegressorCV(search="reduction")._search_kind(1, loo=True, form="eigen") == \
        "reduction"
    X, y = diabetes
    small = BKRRRegressorCV(sigmas=[1.0], lams=[1e-4, 1e-3, 1e-2], n_partitions=2,
                            device="cpu", random_state=0).fit(X, y)
    large = BKRRRegressorCV(sigmas=[1.0], lams=np.geomspace(1e-6, 1e-1, 10), n_partitions=2,
                            device="cpu", random_state=0).fit(X, y)
    assert small.search_ == "cholesky" and large.search_ == "reduction"
    with pytest.raises(ValueError, match="search"):
        BKRRRegressorCV(search="fast").fit(X, y)
