"""CASVMClassifierCV: CA-SVM with a search over C and γ for the price of a few fits.

Each training fold is validated and split once (:class:`gpuml.pipeline.fit.Split`); the
candidates of a γ are fitted together on that split by one solver (a C path:
:mod:`gpuml.estimators._smo_path_solver`), each part's kernel values computed once for
every C and each C started from the previous C's solution; the validation rows are routed
to their parts once per fold and every candidate is scored on them. The best (C, γ) is
refitted as a :class:`~gpuml.estimators.casvm.CASVMClassifier`.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from numbers import Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.metrics import check_scoring, get_scorer_names
from sklearn.model_selection import check_cv
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _check_sample_weight

from .._backend import is_dask_collection, to_numpy, to_output
from .._progress import Progress
from .._validation import check_class_labels, validate_X_y
from ..kernels import compile_after_fit, part_threads
from ..kernels.pairwise import resolve_gamma
from ..pipeline.fit import Split
from ._part_prediction import given_routes
from ._search import BestEstimatorMixin, search_results
from .casvm import CASVMClassifier

#: The grid by default: C by factors of 10, γ by factors of about 3 around ``gamma_unit``.
DEFAULT_CS = (0.1, 1.0, 10.0, 100.0)
DEFAULT_GAMMAS = (0.1, 0.3, 1.0, 3.0)
#: Successive halving with one part spends rows: its first round takes at least this many
#: rows per class.
HALVING_MIN_ROWS_PER_CLASS = 50


def _grid(values, name, allow_inf=False) -> np.ndarray:
    """A grid's values as float64, refused unless a non-empty 1-D sequence of positive
    numbers (finite, or +inf where ``allow_inf``: C's hard margin)."""
    try:
        grid = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a sequence of numbers, got {values!r}") from err
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of values, got {values!r}")
    bad = np.isnan(grid) | (grid <= 0) | (np.isinf(grid) & (not allow_inf))
    if bad.any():
        kind = "positive" if allow_inf else "positive and finite"
        raise ValueError(f"every value of {name} must be {kind}, got {grid.tolist()}")
    return grid


def _takes_weights(scorer, search) -> bool:
    """Whether ``scorer`` takes ``sample_weight`` (``GridSearchCV``'s rule, with its
    warning where it does not: the scores are then unweighted)."""
    accepts = getattr(scorer, "_accept_sample_weight", None)
    accept = (accepts() if accepts is not None
              else "sample_weight" in inspect.signature(scorer).parameters)
    if not accept:
        warnings.warn(f"The scoring {scorer} does not support sample_weight, which may lead "
                      f"to statistically incorrect results when fitting {search} with "
                      "sample_weight. ", UserWarning, stacklevel=3)
    return accept


def _rows(A, idx):
    """Rows ``idx`` (host ints) of an array, sparse matrix or CuPy array; None stays None."""
    return None if A is None else A[to_output(idx, A)]


class CASVMClassifierCV(BestEstimatorMixin, ClassifierMixin, BaseEstimator):
    """CA-SVM with a search over C and γ: the work of the grid shared, not repeated.

    The same search as ``GridSearchCV(CASVMClassifier(...), {"C": Cs, "gamma": γs},
    cv=cv)``, with its results (``cv_results_`` in its layout and order, ``best_params_``,
    ``best_index_``, ``best_score_``, ``best_estimator_``), for the price of a few fits
    (docs/tuning.md). These rules hold (``tests/test_casvm_cv.py`` checks each):

    * each training fold is validated and split into parts **once** (the split depends
      on the rows, not on C or γ), and its validation rows are routed to their parts
      once, for every candidate;
    * per part and γ the kernel values are computed **once** and serve every C (a whole
      matrix, or rows on demand kept for every C);
    * the Cs of a γ are solved in increasing order, each **starting from the previous
      C's solution** (alpha seeding: DeCoste and Wagstaff, 2000): each model is the
      optimum of the ordinary fit to ``tol``, so the scores are GridSearchCV's to within
      what ``tol`` moves a prediction (with an int ``random_state``, whose split both
      make);
    * on a GPU the (part, C) problems of a γ whose parts are small enough for one thread
      block each are solved in one launch (:func:`gpuml.kernels.smo_solve_path`).

    The γ values of a fold are solved side by side in threads when the parts alone
    leave threads idle (fewer parts than threads: the exact SVM), one after another
    otherwise, each γ's models scored and dropped before the next (the search then holds
    about one fit's memory beside the fold's rows).

    Parameters
    ----------
    Cs : sequence of float > 0, default=(0.1, 1, 10, 100)
        The values of C (``inf``: the hard margin, solved on its own).
    gammas : sequence of float > 0, default=(0.1, 0.3, 1, 3)
        The values of γ, in units of ``gamma_unit``.
    gamma_unit : {"scale", "auto"} or float > 0, default="scale"
        What a value of ``gammas`` multiplies: ``"scale"``, SVC's
        ``gamma="scale"``, ``1 / (n_features * X.var())``; ``"auto"``,
        ``1 / n_features``; a number, itself (``1.0``: ``gammas`` are γ values,
        as in a ``GridSearchCV`` grid). Resolved once on the ``X`` given to
        ``fit`` (not per fold), so every candidate has one γ throughout: that
        γ (``gammas[k] * gamma_unit_``) is what ``cv_results_["param_gamma"]``,
        ``best_params_["gamma"]`` and the refitted model hold.
    cv : int, cross-validation generator or iterable, default=5
        As ``GridSearchCV``'s (an int: ``StratifiedKFold``).
    scoring : str, callable or None, default=None
        As ``GridSearchCV``'s, one metric (None: accuracy, the model's ``score``).
    refit : bool, default=True
        Refit :class:`CASVMClassifier` with the best (C, γ) on all the data
        (``best_estimator_``), which ``predict``, ``decision_function``,
        ``predict_proba`` (with ``probability=True``) and ``score`` use.
    halving_factor : float >= 2 or None, default=None
        Early elimination: successive halving with the parts as the resource
        (as ``HalvingGridSearchCV`` spends samples; Jamieson and Talwalkar,
        "Non-stochastic best arm identification and hyperparameter
        optimization", AISTATS 2016). Each round solves the candidates left
        on about ``1 / halving_factor`` as many parts as the next, scores them
        on the validation rows routed to those parts, and keeps the best
        ``1 / halving_factor`` of them; the last round solves the survivors on
        every part (their scores are then the full search's). None: every
        candidate on every part. Needs ``n_partitions`` > 1 to save anything.
    kernel, degree, coef0, n_partitions, partition, method, part_C, combine, \
n_neighbors, blend_margin, tol, max_iter, cache_size, shrinking, class_weight, \
decision_function_shape, break_ties, probability, device, devices, max_device_memory, \
random_state
        As in :class:`CASVMClassifier`, for every candidate and the refit (a
        precomputed or callable kernel is refused: the folds are rows of ``X``).
        An int ``random_state`` gives each fold the split ``GridSearchCV``'s fits
        of that fold make; None draws one split per fold, shared by its candidates.
    n_jobs : int or None, default=None
        CPU threads for the parts, the γ values side by side and the predictions
        (:class:`CASVMClassifier`'s meaning; None: by the size of the work).
    verbose : int, default=0
        When positive, a line per fold and group of γ solved (the Cs solved, the
        time, the best so far) and the choice; the refit reports as
        :class:`CASVMClassifier` does.

    Attributes
    ----------
    cv_results_ : dict of arrays
        ``GridSearchCV``'s keys and order: ``mean_fit_time``, ``std_fit_time``,
        ``mean_score_time``, ``std_score_time``, ``param_C``, ``param_gamma``,
        ``params``, ``split<k>_test_score``, ``mean_test_score``,
        ``std_test_score``, ``rank_test_score``, candidates in
        ``ParameterGrid({"C": Cs, "gamma": gammas})``'s order (C slowest). A
        candidate's fit time is its share of the work it shares (the fold's
        split, its γ's kernel values and C path, divided evenly). To explain the
        choice: ``mean_n_iter`` (SMO steps of a candidate's fit) and
        ``mean_n_support`` (its support vectors), means over the folds; with
        ``halving_factor``, ``iter`` (the last round a candidate ran) and
        ``n_resources`` (the parts it was solved on then): the survivors of the
        last round rank first.
    best_params_ : dict
        ``{"C": ..., "gamma": ...}`` (γ in absolute terms, see ``gamma_unit``).
    best_score_ : float
    best_index_ : int
    best_estimator_ : CASVMClassifier
        With ``refit=True``.
    refit_time_ : float
        Seconds of the refit (with ``refit=True``).
    n_iter_ : ndarray
        The refitted model's SMO steps (``best_estimator_.n_iter_``).
    gamma_unit_ : float
        The value of ``gamma_unit`` on the training data.
    scorer_ : callable
    n_splits_ : int
    classes_ : ndarray of shape (n_classes,)
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features,)
        Only when ``X`` has string column names.

    References
    ----------
    Yang You, PhD thesis, UC Berkeley, 2020, chapter 2 (CA-SVM, Alg 5). D. DeCoste,
    K. Wagstaff, "Alpha seeding for support vector machines", KDD 2000. K. Jamieson,
    A. Talwalkar, "Non-stochastic best arm identification and hyperparameter
    optimization", AISTATS 2016.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.preprocessing import StandardScaler
    >>> from gpuml.estimators.casvm_cv import CASVMClassifierCV
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> X = StandardScaler().fit_transform(X)
    >>> search = CASVMClassifierCV(Cs=[0.1, 1, 10], gammas=[0.3, 1, 3], cv=3,
    ...                            device="cpu").fit(X, y)
    >>> sorted(search.best_params_), len(search.cv_results_["params"])
    (['C', 'gamma'], 9)
    >>> bool(search.score(X, y) > 0.95)
    True
    """

    _parameter_constraints: dict = {
        "Cs": ["array-like"],
        "gammas": ["array-like"],
        "gamma_unit": [StrOptions({"scale", "auto"}), Interval(Real, 0.0, None,
                                                                  closed="neither")],
        "cv": ["cv_object"],
        "scoring": [StrOptions(set(get_scorer_names())), callable, None],
        "refit": ["boolean"],
        "halving_factor": [Interval(Real, 2.0, None, closed="left"), None],
        **{name: rule for name, rule in CASVMClassifier._parameter_constraints.items()
           if name not in ("C", "gamma")},
    }

    def __init__(self, Cs=DEFAULT_CS, gammas=DEFAULT_GAMMAS, gamma_unit="scale", cv=5,
                 scoring=None, refit=True, halving_factor=None, kernel="rbf", degree=3,
                 coef0=0.0, n_partitions="auto", partition="auto", method="casvm",
                 part_C="sqrt", combine="auto", n_neighbors=20, blend_margin=0.6, tol=1e-3,
                 max_iter=-1, cache_size=1024.0, shrinking="auto", class_weight=None,
                 decision_function_shape="ovr", break_ties=False, probability="deprecated",
                 device="auto", devices=None, max_device_memory=None, n_jobs=None,
                 random_state=None, verbose=0):
        self.Cs = Cs
        self.gammas = gammas
        self.gamma_unit = gamma_unit
        self.cv = cv
        self.scoring = scoring
        self.refit = refit
        self.halving_factor = halving_factor
        self.kernel = kernel
        self.degree = degree
        self.coef0 = coef0
        self.n_partitions = n_partitions
        self.partition = partition
        self.method = method
        self.part_C = part_C
        self.combine = combine
        self.n_neighbors = n_neighbors
        self.blend_margin = blend_margin
        self.tol = tol
        self.max_iter = max_iter
        self.cache_size = cache_size
        self.shrinking = shrinking
        self.class_weight = class_weight
        self.decision_function_shape = decision_function_shape
        self.break_ties = break_ties
        self.probability = probability
        self.device = device
        self.devices = devices
        self.max_device_memory = max_device_memory
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _unfitted_model(self, **params) -> CASVMClassifier:
        """The :class:`CASVMClassifier` of this search's settings (and ``params``)."""
        names = CASVMClassifier._get_param_names()
        return CASVMClassifier(**{**{name: getattr(self, name) for name in names
                                     if name not in ("C", "gamma")}, **params})

    @_fit_context(prefer_skip_nested_validation=True)
    @compile_after_fit
    def fit(self, X, y, sample_weight=None):
        """Search the C × γ grid on the folds of ``cv``, then refit the best (C, γ).

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None
            Passed to every fit (the fold's rows of it) and, where the scorer takes
            it, to the scorer (the validation rows'), as ``GridSearchCV`` does.

        Returns
        -------
        self
        """
        if any(is_dask_collection(v) for v in (X, y, sample_weight)):
            raise TypeError(
                "CASVMClassifierCV.fit does not take Dask input: its folds are cut and "
                "scored in this process. Search on an in-memory sample of the data, then "
                "fit CASVMClassifier(**search.best_params_) on the Dask data (it fits on "
                "the workers)")
        if self.kernel == "precomputed" or callable(self.kernel):
            raise ValueError(
                f"CASVMClassifierCV cuts its folds as rows of X, not as blocks of a kernel "
                f"matrix: kernel={self.kernel!r} is not searched here; use GridSearchCV("
                f"CASVMClassifier(kernel=...), {{'C': [...]}}), whose folds slice both axes")
        Cs = _grid(self.Cs, "Cs", allow_inf=True)
        multiples = _grid(self.gammas, "gammas")
        X_in = X
        X, y = validate_X_y(self, X, y)
        y_host = to_numpy(y)
        check_class_labels(y_host)
        self.classes_ = np.unique(y_host)
        weights = (None if sample_weight is None else _check_sample_weight(
            sample_weight, X, dtype=np.float64, allow_all_zero_weights=True))
        self.gamma_unit_ = (resolve_gamma(self.gamma_unit, X)
                            if isinstance(self.gamma_unit, str) else float(self.gamma_unit))
        gammas = (multiples if self.gamma_unit_ == 1.0 else multiples * self.gamma_unit_)
        user_Cs, user_gammas = list(self.Cs), (list(self.gammas) if self.gamma_unit_ == 1.0
                                                else gammas.tolist())
        # ParameterGrid's order: the names sorted ("C" < "gamma"), the first slowest.
        params = [{"C": C, "gamma": g} for C in user_Cs for g in user_gammas]
        self.scorer_ = check_scoring(self._unfitted_model(), scoring=self.scoring)
        weigh_scores = weights is not None and _takes_weights(self.scorer_, self)
        splits = list(check_cv(self.cv, y_host, classifier=True).split(
            np.zeros((len(y_host), 1)), y_host))
        self.n_splits_ = len(splits)
        grid = _Grid(self, X, y, weights, splits, Cs, gammas, weigh_scores)
        scores, fit_times, score_times, extra, tiers = grid.run()
        self.cv_results_, self.best_index_ = search_results(
            params, scores, fit_times, score_times, tiers=tiers, extra=extra)
        self.best_score_ = float(self.cv_results_["mean_test_score"][self.best_index_])
        self.best_params_ = dict(params[self.best_index_])
        grid.report_choice(self.cv_results_, self.best_index_, self.best_params_)
        del grid  # the folds' rows and splits go before the refit
        if self.refit:
            start = time.perf_counter()
            self.best_estimator_ = self._unfitted_model(**self.best_params_).fit(
                X_in, y, sample_weight=sample_weight)
            self.refit_time_ = time.perf_counter() - start
            self.n_iter_ = self.best_estimator_.n_iter_
        return self


class _Grid:
    """One search's folds and candidates: each fold split once, each round's candidates
    solved a group of γ at a time on it and scored on its routed validation rows."""

    def __init__(self, search, X, y, weights, splits, Cs, gammas, weigh_scores):
        self.search, self.X, self.y, self.weights = search, X, y, weights
        self.weigh_scores = weigh_scores
        self.splits, self.Cs, self.gammas = splits, Cs, gammas
        self.n_candidates = Cs.size * gammas.size
        self.progress = Progress(type(search).__name__, 0, search.verbose, unit="solve")
        self.scores = np.full((self.n_candidates, len(splits)), np.nan)
        self.fit_times = np.zeros_like(self.scores)
        self.score_times = np.zeros_like(self.scores)
        self.n_iter = np.zeros_like(self.scores)
        self.n_support = np.zeros_like(self.scores)
        self.iter = np.zeros(self.n_candidates, dtype=np.int64)
        self.n_resources = np.zeros(self.n_candidates, dtype=np.int64)
        self._solves = 0

    def candidate(self, index) -> CASVMClassifier:
        """The model of candidate ``index`` (C slowest), silent: the search reports."""
        C = self.Cs[index // self.gammas.size]
        gamma = self.gammas[index % self.gammas.size]
        return self.search._unfitted_model(C=float(C), gamma=float(gamma), verbose=0)

    def run(self):
        """Every round's candidates on every fold: the scores, times and explanations."""
        first = self._fold(*self.splits[0])
        alive = np.arange(self.n_candidates)
        fractions = self._rounds(first)
        # One round: each fold made, solved and dropped in turn (one fold's rows held at a
        # time); several: every fold kept for the rounds.
        folds = [first] + [self._fold(*split) if len(fractions) > 1 else split
                           for split in self.splits[1:]]
        del first
        for r, fraction in enumerate(fractions):
            self.progress.total += len(folds) * len(self._batches(folds[0]["split"], alive))
            for f in range(len(folds)):
                fold = folds[f] if isinstance(folds[f], dict) else self._fold(*folds[f])
                folds[f] = fold if len(fractions) > 1 else None
                self.n_resources[alive] = self._solve_fold(f, fold, alive, fraction)
                del fold
            self.iter[alive] = r
            if r + 1 < len(fractions):
                keep = math.ceil(alive.size / self.search.halving_factor)
                mean = np.nan_to_num(self.scores[alive].mean(axis=1), nan=-np.inf)
                alive = np.sort(alive[np.argsort(-mean, kind="stable")[:keep]])
        extra = {"mean_n_iter": self.n_iter.mean(axis=1),
                 "mean_n_support": self.n_support.mean(axis=1)}
        tiers = None
        if len(fractions) > 1:
            extra.update(iter=self.iter, n_resources=self.n_resources)
            tiers = self.iter
        return self.scores, self.fit_times, self.score_times, extra, tiers

    def _rounds(self, fold) -> list[float]:
        """The share of the resource each round spends (successive halving), the last
        all of it: the fold's parts, or with one part its rows (at least
        :data:`HALVING_MIN_ROWS_PER_CLASS` a class in the first round). One round
        without ``halving_factor`` or with one candidate.

        The rounds are ``HalvingGridSearchCV``'s: as many as the candidates need, ``1 +
        floor(log_factor(n_candidates))`` (so the last round solves up to ``factor`` of
        them, the choice made among them on all the resource), and no more than the
        resource allows. One more round than that, down to a single survivor, spends a
        ``factor`` times smaller first round and left the choice to fewer rows than
        tell the candidates apart (bench/results/cpu-2core/search-runs.md)."""
        factor = self.search.halving_factor
        if factor is None or self.n_candidates == 1:
            return [1.0]
        n_parts = len(fold["split"].partitioning.parts)
        most = (n_parts if n_parts > 1 else
                fold["train"].size / (HALVING_MIN_ROWS_PER_CLASS * len(self.search.classes_)))
        count = 1 + max(0, min(int(math.floor(math.log(max(most, 1.0), factor) + 1e-9)),
                               int(math.floor(math.log(self.n_candidates, factor) + 1e-9))))
        return [float(factor) ** -(count - 1 - r) for r in range(count)]

    def _fold(self, train, test) -> dict:
        """A fold's training rows validated and split once, its validation rows routed once."""
        start = time.perf_counter()
        split = Split([self.candidate(0)], _rows(self.X, train), _rows(self.y, train),
                      None if self.weights is None else self.weights[train])
        X_val, y_val = _rows(self.X, test), _rows(self.y, test)
        w_val = self.weights[test] if self.weigh_scores else None
        return {"split": split, "X_val": X_val, "y_val": y_val, "w_val": w_val,
                "owner": split.route(X_val), "train": train, "subsets": {},
                "seconds": time.perf_counter() - start}

    def _subset(self, fold, m) -> Split:
        """With one part, a round's resource: the exact SVM of the first ``m`` of the fold's
        training rows in an order drawn once per fold (seeded by ``random_state``), split
        (one part) once per fold and round."""
        if m not in fold["subsets"]:
            if "order" not in fold:
                seed = check_random_state(self.search.random_state).randint(2**31 - 1)
                fold["order"] = np.random.default_rng(seed).permutation(fold["train"].size)
            rows = fold["train"][np.sort(fold["order"][:m])]
            fold["subsets"][m] = Split(
                [self.candidate(0)], _rows(self.X, rows), _rows(self.y, rows),
                None if self.weights is None else self.weights[rows])
        return fold["subsets"][m]

    def _batches(self, split, alive) -> list:
        """The candidates ``alive`` by the calls that fit them: every γ in one call when
        the parts are fewer than the threads (the γ paths then run side by side), a γ
        per call otherwise (its models scored and dropped before the next)."""
        sizes = split.partitioning.sizes
        threads = part_threads(self.search.n_jobs, np.tile(sizes, self.gammas.size))
        by_gamma = [alive[alive % self.gammas.size == g] for g in range(self.gammas.size)]
        by_gamma = [ids for ids in by_gamma if ids.size]
        if len(sizes) < threads:
            return [np.sort(np.concatenate(by_gamma))]
        return by_gamma

    def _solve_fold(self, f, fold, alive, fraction) -> int:
        """Fit the candidates ``alive`` on fold ``f``'s split (``fraction`` of its parts, or
        with one part of its rows) and score each on the fold's validation rows routed to
        those parts. Returns the parts (with one part, the rows) they were solved on."""
        split, owner = fold["split"], fold["owner"]
        n_parts = len(split.partitioning.parts)
        parts = None
        X_val, y_val, w_val = fold["X_val"], fold["y_val"], fold["w_val"]
        used, whole = n_parts, n_parts
        if fraction < 1.0 and n_parts > 1:
            used = max(1, math.ceil(n_parts * fraction))
            parts = np.unique(np.linspace(0, n_parts - 1, used).round().astype(np.int64))
            position = np.full(n_parts, -1, dtype=np.int64)
            position[parts] = np.arange(parts.size)
            rows = np.flatnonzero(position[owner] >= 0)
            X_val, y_val, owner = _rows(X_val, rows), _rows(y_val, rows), position[owner[rows]]
            w_val = None if w_val is None else w_val[rows]
        elif n_parts == 1:
            used = whole = fold["train"].size
            if fraction < 1.0:
                used = math.ceil(whole * fraction)
                split = self._subset(fold, used)
        weighted = {} if w_val is None else {"sample_weight": w_val}
        shared = fold["seconds"] / self.n_candidates
        for ids in self._batches(split, alive):
            # Each model scored as it is assembled and dropped before the next: one model
            # held at a time (Split.fits). The fitting time is the generator's.
            fitting, start = 0.0, time.perf_counter()
            for k, model in split.fits([self.candidate(i) for i in ids.tolist()],
                                       jointly=True, parts=parts):
                scored = time.perf_counter()
                fitting += scored - start
                i = int(ids[k])
                with given_routes(model, X_val, owner):
                    self.scores[i, f] = self.search.scorer_(model, X_val, y_val, **weighted)
                self.n_iter[i, f] = int(model.n_iter_.sum())
                self.n_support[i, f] = len(model.support_)
                del model
                start = time.perf_counter()
                self.score_times[i, f] = start - scored
            fitting += time.perf_counter() - start
            self.fit_times[ids, f] = fitting / ids.size + shared
            self._report(f, ids, fitting, used, whole, "parts" if n_parts > 1 else "rows")
        return used

    def _report(self, f, ids, seconds, n_used, whole, unit):
        """The line of one call: the fold, its γ values and Cs, the time, its best."""
        if not self.progress:
            return
        gammas = sorted({float(self.gammas[i % self.gammas.size]) for i in ids.tolist()})
        best = ids[np.nanargmax(self.scores[ids, f])]
        on = "" if n_used == whole else f" on {n_used} of {whole} {unit}"
        self.progress.update(
            self._solves, f"fold {f + 1}/{len(self.splits)}, gamma "
            f"{', '.join(f'{g:.4g}' for g in gammas)}: {ids.size} candidates{on} in "
            f"{seconds:.2f} s; best C={self.Cs[best // self.gammas.size]:.4g}, gamma="
            f"{self.gammas[best % self.gammas.size]:.4g}, score {self.scores[best, f]:.4f}")
        self._solves += 1

    def report_choice(self, results, best, params):
        """The closing line: the choice and its margin over the next best."""
        mean = results["mean_test_score"]
        others = np.delete(mean, best)
        margin = ("" if others.size == 0 or np.isnan(others).all() else
                  f", {mean[best] - np.nanmax(others):+.4f} over the next best")
        self.progress.close(f"chose C={params['C']:.4g}, gamma={params['gamma']:.4g}: mean "
                            f"score {mean[best]:.4f} (std {results['std_test_score'][best]:.4f}) "
                            f"over {self.scores.shape[1]} folds{margin}")
