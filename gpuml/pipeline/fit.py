"""The partitioned fit, written once: validate, split, place, fit the parts, assemble.

:func:`fit_partitioned` is ``fit`` for the partitioned estimators (You 2020,
Alg 5 and Alg 10); :func:`fit_settings` is the same fit for several settings
of one estimator on one split ("one split, many solves": a search over C and
γ, or σ and λ, splits and places the data once and solves the parts once per
setting). Both run the steps of :class:`Split` on the executor
:func:`~gpuml.pipeline.fit_executor` picks; a search keeps one :class:`Split` per
training fold and fits its candidates on it, a group at a time.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import clone
from sklearn.utils.validation import validate_data

from .._backend import CPU, is_cupy_array, namespace_of, to_numpy
from ..partition import Partitioning
from ..routing import route
from .data import FitData, FitResult
from .executors import fit_executor, placement_needs

#: Fitted attributes that say where the parts were fitted; a refit sets the ones that apply.
PLACEMENT_ATTRIBUTES = ("devices_", "part_device_", "part_worker_")


def fit_partitioned(estimator, X, y, sample_weight=None):
    """Fit a :class:`~gpuml.pipeline.PartitionedEstimator` on ``X``, ``y``: ``estimator``,
    fitted."""
    fit_split([estimator], X, y, sample_weight)
    return estimator


def fit_settings(estimator, settings, X, y, sample_weight=None, *, jointly=False) -> list:
    """One split, many solves: ``estimator`` fitted once per setting, on one split of ``X``.

    Each setting (a dict of parameters among the estimator's ``_solve_params``:
    C and γ for CA-SVM, σ and λ for BKRR, ...) gives
    ``clone(estimator).set_params(**setting)`` fitted; each equals the ordinary
    fit of that clone, bit for bit, but the data are validated, split and
    placed once, and the parts' rows gathered once for every setting (a
    ``random_state`` left to chance draws the one split of them all).

    ``jointly=True``: the settings one solver fits together (the estimator's
    ``_solve_together``: a CA-SVM's values of C for one γ, a C path whose kernel
    values are computed once and whose solves start from the previous C's
    solution) are fitted by it; each model is then that solver's (for a C path,
    the optimum of the ordinary fit to the solver's tolerance, not bit for bit).

    >>> import numpy as np
    >>> from gpuml.estimators.bkrr import BKRRRegressor
    >>> X = np.random.default_rng(0).normal(size=(200, 3))
    >>> y = X.sum(axis=1)
    >>> base = BKRRRegressor(n_partitions=2, sigma=2.0, random_state=0, device="cpu")
    >>> fits = fit_settings(base, [{"lam": 1e-3}, {"lam": 1e-1}], X, y)
    >>> [f.lam_ for f in fits]
    [0.001, 0.1]
    >>> one = base.set_params(lam=1e-1).fit(X, y)
    >>> bool((fits[1].dual_coef_ == one.dual_coef_).all())
    True
    """
    estimators = setting_estimators(estimator, settings)
    return Split(estimators, X, y, sample_weight).fit(estimators, jointly=jointly)


def setting_estimators(estimator, settings) -> list:
    """``clone(estimator).set_params(**setting)`` for each setting, its parameters checked;
    refused where a setting varies more than the estimator's ``_solve_params``."""
    settings = [dict(setting) for setting in settings]
    if not settings:
        raise ValueError("fit_settings needs at least one setting")
    allowed = set(estimator._solve_params)
    for setting in settings:
        other = sorted(set(setting) - allowed)
        if other:
            raise ValueError(
                f"fit_settings varies the parameters of {type(estimator).__name__}'s solve "
                f"({', '.join(sorted(allowed))}), which leave its validation and its split "
                f"as they are: not {', '.join(other)}")
    estimators = [clone(estimator).set_params(**setting) for setting in settings]
    for fitted in estimators:
        fitted._validate_params()
    return estimators


def fit_split(estimators, X, y, sample_weight=None) -> list:
    """The steps, for estimators that differ in their solve only: ``estimators``, fitted
    (:class:`Split`, then :meth:`Split.fit`)."""
    return Split(estimators, X, y, sample_weight).fit(estimators)


class Split:
    """One split of the data, for estimators that differ in their solve only.

    Made, it has run the first steps once:

    1. **validate** (:func:`validate`) the input, by the first estimator, and
       refuse what the executor cannot run before any work; derive each
       estimator's data-driven settings (its solver), so that a setting the data
       refuse is refused before any work too;
    2. **split** the rows into P parts, one centre per part (``partitioning``).

    :meth:`fit` runs the rest, as often as asked, for those estimators or others
    that differ from them in their solve only (one split, many solves):

    3. **place** the parts on the executor's devices or workers, by the
       solvers' cost model;
    4. **fit** each part's local model, once per solver;
    5. **assemble** each estimator's fitted attributes from its solver's fits
       (:func:`assemble`).
    """

    def __init__(self, estimators, X, y, sample_weight=None):
        first = estimators[0]
        needs = placement_needs(first) + tuple(first._fit_needs(sample_weight))
        executor = fit_executor(first, needs, X, y, sample_weight)
        executor.refuse(first, needs)
        data, self._checked = validate(executor, estimators, X, y, sample_weight)
        n_parts = first._n_parts(data.n, executor.gpu)
        # No partition of n rows into P parts has a smaller largest part: refuse before work.
        executor.check_memory([fitted._part_cost() for fitted in estimators], data,
                              [-(-data.n // n_parts)], n_parts)
        data = executor.summarise(first, data, n_parts)
        data.n_parts = n_parts
        self._solvers = {id(fitted): (fitted, fitted._part_solver(data)) for fitted in estimators}
        self.partitioning = executor.split(data, n_parts, first._split_method(),
                                           first.random_state)
        self.executor, self.data, self.first = executor, data, first
        self._y, self._sample_weight = y, sample_weight

    def route(self, X) -> np.ndarray:
        """The part of every row of ``X``, its nearest centre (You 2020, Alg 5's routing),
        on the host: computed where the split's executor computes (on the host for CuPy
        rows of a split on the host)."""
        centers = self.partitioning.centers
        if centers.shape[0] == 1:
            return np.zeros(X.shape[0], dtype=np.int64)
        backend = getattr(self.executor, "backend", CPU)
        if is_cupy_array(X) and not backend.is_gpu:
            backend, X = CPU, to_numpy(X)
        with backend.use():
            return route(backend.asarray(X), backend.asarray(centers))

    def fit(self, estimators, *, jointly=False, parts=None) -> list:
        """Steps 3-5 for ``estimators`` on this split: ``estimators``, fitted.

        ``jointly``: the settings one solver fits at once are fitted by it (the
        first estimator's ``_solve_together``). ``parts`` (part indices, ascending):
        only those parts are fitted, and each model is theirs alone (its centres
        theirs, in that order: a search that spends parts as its resource); in
        this process only.
        """
        for _ in self.fits(estimators, jointly=jointly, parts=parts):
            pass
        return estimators

    def fits(self, estimators, *, jointly=False, parts=None):
        """:meth:`fit`, one model at a time: yields ``(k, estimators[k])`` as each is
        assembled (the parts solved first, every setting of a joint solve at once).

        It keeps no model it has yielded, and a joint solve's part fits of a setting go
        as its model is assembled: a caller that scores each model and drops it holds
        the part fits of the settings still to come and one model, not every model.
        """
        data, executor = self.data, self.executor
        estimators = list(estimators)
        solvers = [self._solver(fitted) for fitted in estimators]
        partitioning = self.partitioning if parts is None else self._parts(parts)
        groups = (self.first._solve_together(solvers) if jointly else
                  [(solver, [k]) for k, solver in enumerate(solvers)])
        placement = executor.place([solver for solver, _ in groups], data, partitioning)
        results = executor.fit_parts([solver for solver, _ in groups], data, partitioning,
                                     placement)
        for g, (solver, members) in enumerate(groups):
            for k, m in enumerate(members):
                one = (results[g] if solver.n_settings == 1 else
                       results[g].take(k, solvers[m]))
                fitted, estimators[m] = estimators[m], None
                assemble(fitted, partitioning, one, data)
                fitted._finish_fit(data, self._y, self._sample_weight)
                del one
                yield m, fitted
            results[g] = None

    def _solver(self, fitted):
        """The solver of ``fitted``: the one derived with the split, or derived now for an
        estimator new to it (what the validation set on the first is set on it)."""
        known = self._solvers.pop(id(fitted), None)
        if known is not None and known[0] is fitted:
            return known[1]
        forget_fit(fitted)
        changed, dropped = self._checked
        for name in dropped:
            fitted.__dict__.pop(name, None)
        fitted.__dict__.update(changed)
        return fitted._part_solver(self.data)

    def _parts(self, ids):
        """The partitioning of the parts ``ids`` alone (their rows and centres)."""
        from .dask import OnDask

        if isinstance(self.executor, OnDask):
            raise ValueError("a fit of some of the parts runs in this process, not on Dask "
                             "input: fit every part")
        ids = np.asarray(ids, dtype=np.int64)
        whole = self.partitioning
        labels = np.full(whole.labels.shape, -1, dtype=np.int64)
        for k, p in enumerate(ids.tolist()):
            labels[whole.parts[p]] = k
        centers = whole.centers[namespace_of(whole.centers).asarray(ids)]
        return Partitioning(labels, centers, [whole.parts[p] for p in ids.tolist()])


def validate(executor, estimators, X, y, sample_weight):
    """The input checked once, by the first estimator (chunked input: its metadata by
    scikit-learn's rules); what that check set on it (``n_features_in_``,
    ``feature_names_in_``, ...) is set on the others. A refit first drops the previous
    model's placement and device copies (:func:`forget_fit`).

    Returns the :class:`~gpuml.pipeline.FitData` and what the check set and dropped
    (``(changed, dropped)``: an estimator fitted later on the same split gets them)."""
    for fitted in estimators:
        forget_fit(fitted)
    first = estimators[0]
    before = dict(vars(first))
    data = executor.load(first, X, y, sample_weight)
    if data.features is not None:
        validate_data(first, data.features, skip_check_array=True, reset=True)
    after = vars(first)
    changed = {k: v for k, v in after.items() if k not in before or before[k] is not v}
    dropped = [k for k in before if k not in after]
    for other in estimators[1:]:
        for name in dropped:
            other.__dict__.pop(name, None)
        other.__dict__.update(changed)
    return data, (changed, dropped)


def assemble(estimator, partitioning, result: FitResult, data: FitData) -> None:
    """The estimator's fitted attributes from its solver's fits, and where they were fitted."""
    if result.centers is not None:
        partitioning.centers = result.centers
    estimator._assemble(partitioning, result, data)
    for name, value in (("devices_", result.devices), ("part_device_", result.part_device),
                        ("part_worker_", result.part_worker)):
        if value is not None:
            setattr(estimator, name, value)


def forget_fit(estimator) -> None:
    """A refit drops the previous model's placement and its device copies; the new model's
    go to a fresh, empty cache (:func:`gpuml.pipeline.on_device`)."""
    for name in (*PLACEMENT_ATTRIBUTES, *estimator._refit_drops):
        estimator.__dict__.pop(name, None)
    estimator._device_cache = {}
