"""CASVMClassifierCV: GridSearchCV's search over C and γ, its work shared.

The search's split scores are GridSearchCV(CASVMClassifier(...))'s on the same folds to
within what the C path's tolerance moves a prediction, and its choice is GridSearchCV's
(or one whose GridSearchCV mean score is within 0.002 of the best); the shared work is
counted with spies: one split and one routing of the validation rows per fold, each
part's kernel values once per γ, each C after the first started from the one before.
"""

import re
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer, load_digits, make_classification
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV, StratifiedKFold
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC
from sklearn.utils.estimator_checks import parametrize_with_checks

import gpuml.estimators._part_prediction as part_prediction
import gpuml.estimators.casvm_cv as casvm_cv
import gpuml.kernels.smo.cpu as smo_cpu
import gpuml.kernels.smo.path as smo_path
import gpuml.pipeline.executors as executors
import gpuml.pipeline.fit as pipeline_fit
from gpuml import CASVMClassifier, CASVMClassifierCV


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), y


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X[:700] / 16.0, y[:700]


@pytest.fixture(scope="module")
def three_classes():
    X, y = make_classification(600, 20, n_informative=8, n_classes=3, random_state=0)
    return X, y, np.random.default_rng(0).uniform(0.5, 2.0, len(y))


FOLDS = StratifiedKFold(3, shuffle=True, random_state=0)

#: (data fixture, settings, Cs, γs, sample weights): binary and multiclass, dense and
#: sparse, one part and several, every combine rule, class and sample weights.
CASES = {
    "binary_exact": ("cancer", dict(n_partitions=1), [0.1, 1, 10, 100],
                     [0.003, 0.01, 0.03, 0.1], False),
    "binary_parts_nearest": ("cancer", dict(n_partitions=3, combine="nearest"),
                             [0.1, 1, 10, 100], [0.003, 0.01, 0.03, 0.1], False),
    "ten_classes_sparse_exact": ("digits_sparse", dict(n_partitions=1), [0.3, 3, 30],
                                 [0.01, 0.03, 0.1], False),
    "ten_classes_neighbors_balanced": ("digits", dict(n_partitions=2, combine="neighbors",
                                                      class_weight="balanced"),
                                       [0.3, 3, 30], [0.01, 0.03, 0.1], False),
    "three_classes_kmeans_auto_weighted": ("three_classes", dict(n_partitions=3,
                                                                 partition="kmeans"),
                                           [0.1, 1, 10], [0.01, 0.05, 0.2], True),
}


def _data(request, name):
    if name == "digits_sparse":
        X, y = request.getfixturevalue("digits")
        return sp.csr_matrix(X), y, None
    data = request.getfixturevalue(name)
    return data if len(data) == 3 else (*data, None)


@pytest.mark.parametrize("case", list(CASES))
def test_split_scores_and_choice_are_grid_search_cvs(request, case):
    name, settings, Cs, gammas, weighted = CASES[case]
    X, y, w = _data(request, name)
    w = w if weighted else None
    common = dict(random_state=0, device="cpu", **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = CASVMClassifierCV(Cs=Cs, gammas=gammas, gamma_unit=1.0, cv=FOLDS,
                                 **common).fit(X, y, sample_weight=w)
        brute = GridSearchCV(CASVMClassifier(**common), {"C": Cs, "gamma": gammas},
                             cv=FOLDS).fit(X, y, sample_weight=w)
    results, expected = fast.cv_results_, brute.cv_results_
    assert results["params"] == expected["params"]
    assert list(results)[:len(expected)] == list(expected)
    np.testing.assert_array_equal(results["param_C"], expected["param_C"])
    np.testing.assert_array_equal(results["param_gamma"], expected["param_gamma"])
    # The C path's models are the cold fits' optimum to tol: a validation row near the
    # boundary may move (one row in 190 is 0.005); most scores are equal.
    split = np.array([results[f"split{k}_test_score"] - expected[f"split{k}_test_score"]
                      for k in range(3)])
    assert np.abs(split).max() <= 0.02 and np.abs(split).mean() <= 0.006
    assert (split == 0).mean() >= 0.6
    best = expected["mean_test_score"].max()
    assert (fast.best_params_ == brute.best_params_
            or best - expected["mean_test_score"][fast.best_index_] <= 0.002)
    assert fast.best_score_ == results["mean_test_score"][fast.best_index_]
    assert results["rank_test_score"][fast.best_index_] == 1
    assert fast.n_splits_ == 3
    # The refit is the plain estimator with the choice.
    plain = CASVMClassifier(**fast.best_params_, **common).fit(X, y, sample_weight=w)
    np.testing.assert_array_equal(fast.predict(X), plain.predict(X))
    np.testing.assert_array_equal(fast.decision_function(X), plain.decision_function(X))
    assert fast.score(X, y) == plain.score(X, y)
    np.testing.assert_array_equal(fast.classes_, brute.classes_)
    assert fast.n_features_in_ == X.shape[1]


def test_grid_search_cv_of_the_estimator_still_chooses_svcs(cancer):
    """GridSearchCV(CASVMClassifier(n_partitions=1)) is GridSearchCV(SVC()) (the same dual)."""
    X, y = cancer
    grid = {"C": [0.1, 1, 10], "gamma": [0.01, 0.1]}
    ours = GridSearchCV(CASVMClassifier(n_partitions=1, device="cpu"), grid, cv=FOLDS).fit(X, y)
    svc = GridSearchCV(SVC(), grid, cv=FOLDS).fit(X, y)
    assert ours.best_params_ == svc.best_params_
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"],
                               svc.cv_results_["mean_test_score"], atol=0.004)


def _counting(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("n_partitions", [1, 3])
def test_one_split_one_routing_one_kernel_per_fold_and_gamma(cancer, monkeypatch,
                                                             n_partitions):
    X, y = cancer
    gammas, Cs = [0.01, 0.03, 0.1], [0.1, 1.0, 10.0, 100.0]
    splits = _counting(monkeypatch, executors, "split")
    fold_routes = _counting(monkeypatch, pipeline_fit, "route")
    model_routes = _counting(monkeypatch, part_prediction, "route")
    values = _counting(monkeypatch, smo_path, "values_of")
    matrices = _counting(monkeypatch, smo_path, "_make_matrix")
    cold = _counting(monkeypatch, smo_cpu, "solve_batch")
    seeds = _counting(monkeypatch, smo_path, "seed_alpha")
    search = CASVMClassifierCV(Cs=Cs, gammas=gammas, gamma_unit=1.0, cv=FOLDS,
                               n_partitions=n_partitions, combine="nearest", refit=False,
                               random_state=0, device="cpu").fit(X, y)
    assert len(search.cv_results_["params"]) == 12
    # the split once per training fold, the validation rows routed once per fold
    assert len(splits) == 3
    assert len(fold_routes) == (3 if n_partitions > 1 else 0)
    assert model_routes == []
    # per part and γ the kernel values once (a part's matrix, or its rows' values),
    # for every C; no cold solve of a candidate; every C after the first seeded
    assert len(values) + len(matrices) == 3 * len(gammas) * n_partitions
    assert cold == []
    assert len(seeds) == 3 * len(gammas) * n_partitions * (len(Cs) - 1)


def test_each_model_on_the_path_is_the_cold_fits_optimum(digits):
    """The path's models (warm-started) and the cold fits reach one optimum to tol."""
    from gpuml.pipeline import fit_settings

    X, y = digits
    base = CASVMClassifier(n_partitions=2, decision_function_shape="ovo", random_state=0,
                           device="cpu")
    settings = [{"C": C, "gamma": g} for C in (0.3, 3.0, 30.0) for g in (0.02, 0.08)]
    path = fit_settings(base, settings, X, y, jointly=True)
    for fitted, setting in zip(path, settings):
        cold = clone(base).set_params(**setting).fit(X, y)
        trained = cold.pair_status_ == 2
        np.testing.assert_allclose(fitted.objective_[trained], cold.objective_[trained],
                                   rtol=2e-3, atol=1e-3)
        assert (fitted.predict(X) == cold.predict(X)).mean() >= 0.995
        np.testing.assert_allclose(fitted.decision_function(X), cold.decision_function(X),
                                   atol=0.05)


def test_gamma_unit_scale(cancer):
    X, y = cancer
    scale = 1.0 / (X.shape[1] * X.var())
    search = CASVMClassifierCV(Cs=[1.0, 10.0], gammas=[0.5, 1.0, 2.0], cv=FOLDS,
                               n_partitions=1, device="cpu").fit(X, y)
    assert search.gamma_unit_ == pytest.approx(scale, rel=1e-12)
    np.testing.assert_allclose(search.cv_results_["param_gamma"][:3],
                               [0.5 * scale, scale, 2.0 * scale], rtol=1e-12)
    brute = GridSearchCV(CASVMClassifier(n_partitions=1, device="cpu"),
                         {"C": [1.0, 10.0], "gamma": [0.5 * scale, scale, 2.0 * scale]},
                         cv=FOLDS).fit(X, y)
    assert search.best_params_["gamma"] == pytest.approx(brute.best_params_["gamma"])
    assert search.best_estimator_.gamma == search.best_params_["gamma"]
    auto = CASVMClassifierCV(Cs=[1.0], gammas=[1.0], gamma_unit="auto", cv=FOLDS,
                             n_partitions=1, device="cpu").fit(X, y)
    assert auto.best_params_ == {"C": 1.0, "gamma": 1.0 / X.shape[1]}


def test_without_refit_the_results_only(cancer):
    X, y = cancer
    search = CASVMClassifierCV(Cs=[1.0], gammas=[1.0], cv=FOLDS, refit=False,
                               device="cpu").fit(X, y)
    assert not hasattr(search, "best_estimator_")
    with pytest.raises(NotFittedError, match="refit=True"):
        search.predict(X)


def test_predict_proba_is_forwarded_with_probability(cancer):
    X, y = cancer
    plain = CASVMClassifierCV(Cs=[1.0], gammas=[1.0], cv=FOLDS, device="cpu")
    assert not hasattr(plain, "predict_proba")
    with pytest.warns(FutureWarning):
        search = clone(plain).set_params(probability=True, random_state=0).fit(X, y)
    np.testing.assert_array_equal(search.predict_proba(X[:20]),
                                  search.best_estimator_.predict_proba(X[:20]))


def test_scoring_is_used_for_the_choice_and_the_score(cancer):
    X, y = cancer
    search = CASVMClassifierCV(Cs=[0.1, 10.0], gammas=[0.3, 3.0], cv=FOLDS,
                               scoring="balanced_accuracy", n_partitions=1,
                               device="cpu").fit(X, y)
    brute = GridSearchCV(CASVMClassifier(n_partitions=1, device="cpu"),
                         {"C": [0.1, 10.0], "gamma": list(search.cv_results_["param_gamma"][:2])},
                         cv=FOLDS, scoring="balanced_accuracy").fit(X, y)
    np.testing.assert_allclose(search.cv_results_["mean_test_score"],
                               brute.cv_results_["mean_test_score"], atol=0.006)
    assert search.score(X, y) == pytest.approx(brute.score(X, y))


@pytest.mark.parametrize("grid, match", [
    (dict(Cs=[]), "Cs must be a non-empty"),
    (dict(gammas=[]), "gammas must be a non-empty"),
    (dict(Cs=[1.0, -1.0]), "every value of Cs must be positive"),
    (dict(gammas=[0.1, np.inf]), "every value of gammas must be positive and finite"),
    (dict(gammas=[np.nan]), "every value of gammas"),
    (dict(Cs=["a", "b"]), "Cs must be a sequence of numbers"),
    (dict(Cs=[[1.0, 2.0]]), "Cs must be a non-empty 1-D"),
])
def test_empty_or_invalid_grids_are_refused(cancer, grid, match, monkeypatch):
    X, y = cancer
    splits = _counting(monkeypatch, executors, "split")
    with pytest.raises(ValueError, match=match):
        CASVMClassifierCV(cv=FOLDS, device="cpu", **grid).fit(X, y)
    assert splits == []


def test_settings_it_cannot_search_are_refused(cancer):
    X, y = cancer
    with pytest.raises(ValueError, match="kernel='precomputed' is not searched here"):
        CASVMClassifierCV(kernel="precomputed", device="cpu").fit(X @ X.T, y)
    with pytest.raises(ValueError, match="halving_factor"):
        CASVMClassifierCV(halving_factor=1.0, device="cpu").fit(X, y)
    with pytest.raises(ValueError, match="scoring"):
        CASVMClassifierCV(scoring=["accuracy", "f1"], device="cpu").fit(X, y)
    da = pytest.importorskip("dask.array")
    with pytest.raises(TypeError, match=re.escape("CASVMClassifier(**search.best_params_)")):
        CASVMClassifierCV(device="cpu").fit(da.from_array(X), y)


def test_verbose_reports_each_solve_and_the_choice(cancer, capsys):
    X, y = cancer
    CASVMClassifierCV(Cs=[1.0, 10.0], gammas=[0.5, 2.0], cv=FOLDS, n_partitions=1,
                      device="cpu", verbose=1).fit(X, y)
    lines = capsys.readouterr().out.splitlines()
    solves = [line for line in lines if line.startswith("[CASVMClassifierCV] solve")]
    assert len(solves) == 6 and "fold 3/3" in solves[-1] and "(6/6)" in solves[-1]
    assert any(re.match(r"\[CASVMClassifierCV\] chose C=\S+, gamma=\S+: mean score", line)
               for line in lines)
    assert any(line.startswith("[CASVM] 1 parts") for line in lines)  # the refit


def test_n_jobs_reaches_every_solve_and_the_gammas_share_the_threads(cancer, monkeypatch):
    X, y = cancer
    paths = []
    solve_path = casvm_cv.Split.fits

    def counted(self, estimators, **kwargs):
        paths.append(len({e.gamma for e in estimators}))
        return solve_path(self, estimators, **kwargs)

    monkeypatch.setattr(casvm_cv.Split, "fits", counted)
    jobs = _counting(monkeypatch, smo_path, "part_threads")
    CASVMClassifierCV(Cs=[1.0, 10.0], gammas=[0.5, 1.0, 2.0], cv=FOLDS, n_partitions=1,
                      n_jobs=2, refit=False, device="cpu").fit(X, y)
    # one part, two threads: the three γ of a fold in one call, their paths side by side,
    # each path on one of the two threads
    assert paths == [3, 3, 3]
    assert {args[0] for args in jobs} == {1}
    paths.clear()
    CASVMClassifierCV(Cs=[1.0, 10.0], gammas=[0.5, 1.0, 2.0], cv=FOLDS, n_partitions=1,
                      n_jobs=1, refit=False, device="cpu").fit(X, y)
    assert paths == [1] * 9


def test_halving_keeps_the_choice_and_explains_the_rounds(three_classes, monkeypatch):
    X, y, _ = three_classes
    common = dict(Cs=[0.1, 1.0, 10.0], gammas=[0.01, 0.05, 0.2, 1.0], gamma_unit=1.0,
                  cv=FOLDS, n_partitions=4, random_state=0, device="cpu")
    full = CASVMClassifierCV(**common).fit(X, y)
    solved = []
    fit = casvm_cv.Split.fits

    def counted(self, estimators, **kwargs):
        solved.append((len(estimators), None if kwargs.get("parts") is None
                       else len(kwargs["parts"])))
        return fit(self, estimators, **kwargs)

    monkeypatch.setattr(casvm_cv.Split, "fits", counted)
    halved = CASVMClassifierCV(halving_factor=2, **common).fit(X, y)
    results = halved.cv_results_
    # rounds of 1, 2 and 4 parts; 12 candidates, then 6, then 3
    assert sorted(set(results["n_resources"].tolist())) == [1, 2, 4]
    assert np.bincount(results["iter"]).tolist() == [6, 3, 3]
    assert sum(n for n, parts in solved if parts == 1) == 12 * 3
    survivors = results["iter"] == 2
    assert (results["rank_test_score"][survivors] <= 3).all()
    # the survivors' scores are the full search's: the last round solves every part
    np.testing.assert_array_equal(results["mean_test_score"][survivors],
                                  full.cv_results_["mean_test_score"][survivors])
    assert halved.best_params_ == full.best_params_


@pytest.mark.parametrize("n_Cs, n_gammas", [(5, 5), (2, 5), (3, 3)])
def test_halving_runs_halving_grid_search_cvs_rounds(n_Cs, n_gammas):
    """As many rounds as HalvingGridSearchCV's candidates need (1 + floor(log_factor n)),
    each keeping as many candidates as its: 25 -> 9 -> 3, 10 -> 4 -> 2, 9 -> 3 -> 1, on
    an exact SVM whose rows (the resource) allow a round more than that."""
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401
    from sklearn.model_selection import HalvingGridSearchCV

    X, y = make_classification(4500, 8, n_informative=5, random_state=3)
    X = StandardScaler().fit_transform(X)
    Cs, gammas = np.logspace(-1, 2, n_Cs), np.logspace(-2, 0, n_gammas)
    ours = CASVMClassifierCV(Cs=Cs, gammas=gammas, gamma_unit=1.0, cv=FOLDS, n_partitions=1,
                             halving_factor=3, refit=False, random_state=0,
                             device="cpu").fit(X, y)
    with warnings.catch_warnings():  # the schedule, not the fits: a few SMO steps each
        warnings.simplefilter("ignore")
        theirs = HalvingGridSearchCV(SVC(max_iter=20), {"C": Cs, "gamma": gammas}, factor=3,
                                     cv=FOLDS, refit=False, random_state=0).fit(X, y)
    reached = np.bincount(ours.cv_results_["iter"])
    assert np.cumsum(reached[::-1])[::-1].tolist() == list(theirs.n_candidates_)
    # the rows of each round grow by the factor up to the fold's
    rounds = sorted(set(ours.cv_results_["n_resources"].tolist()))
    assert rounds[-1] == 3000 and len(rounds) == theirs.n_iterations_
    np.testing.assert_allclose(np.diff(np.log(rounds)), np.log(3), atol=0.01)


def test_a_device_group_searches_where_its_parts_live(cancer):
    X, y = cancer
    common = dict(Cs=[0.1, 10.0], gammas=[0.01, 0.1], gamma_unit=1.0, cv=FOLDS,
                  n_partitions=2, random_state=0)
    here = CASVMClassifierCV(device="cpu", **common).fit(X, y)
    group = CASVMClassifierCV(devices=["cpu", "cpu"], **common).fit(X, y)
    for k in range(3):
        np.testing.assert_array_equal(group.cv_results_[f"split{k}_test_score"],
                                      here.cv_results_[f"split{k}_test_score"])
    assert group.best_estimator_.devices_ == ("cpu", "cpu")


@parametrize_with_checks([CASVMClassifierCV(Cs=[1.0, 10.0], gammas=[0.5, 2.0], cv=3,
                                            device="cpu"),
                          CASVMClassifierCV(Cs=[1.0], gammas=[1.0], cv=2, n_partitions=2,
                                            random_state=0, device="cpu")],
                         expected_failed_checks=lambda est: {
                             name: "sample_weight is not equivalent to removing/repeating "
                                   "samples (as SVC; and a weight moves a row's fold)"
                             for name in ("check_sample_weight_equivalence_on_dense_data",
                                          "check_sample_weight_equivalence_on_sparse_data")})
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # folds with fewer rows of a class
        check(estimator)
