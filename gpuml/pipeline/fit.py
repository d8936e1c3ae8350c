"""The partitioned fit, written once: validate, split, place, fit the parts, assemble.

:func:`fit_partitioned` is ``fit`` for the partitioned estimators (You 2020,
Alg 5 and Alg 10); :func:`fit_settings` is the same fit for several settings
of one estimator on one split ("one split, many solves": a search over C and
γ, or σ and λ, splits and places the data once and solves the parts once per
setting). Both run the steps of :func:`fit_split` on the executor
:func:`~gpuml.pipeline.fit_executor` picks.
"""

from __future__ import annotations

from sklearn.base import clone
from sklearn.utils.validation import validate_data

from .data import FitData, FitResult
from .executors import fit_executor, placement_needs

#: Fitted attributes that say where the parts were fitted; a refit sets the ones that apply.
PLACEMENT_ATTRIBUTES = ("devices_", "part_device_", "part_worker_")


def fit_partitioned(estimator, X, y, sample_weight=None):
    """Fit a :class:`~gpuml.pipeline.PartitionedEstimator` on ``X``, ``y``: ``estimator``,
    fitted."""
    fit_split([estimator], X, y, sample_weight)
    return estimator


def fit_settings(estimator, settings, X, y, sample_weight=None) -> list:
    """One split, many solves: ``estimator`` fitted once per setting, on one split of ``X``.

    Each setting (a dict of parameters among the estimator's ``_solve_params``:
    C and γ for CA-SVM, σ and λ for BKRR, ...) gives
    ``clone(estimator).set_params(**setting)`` fitted; each equals the ordinary
    fit of that clone, bit for bit, but the data are validated, split and
    placed once, and the parts' rows gathered once for every setting (a
    ``random_state`` left to chance draws the one split of them all).

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
    return fit_split(estimators, X, y, sample_weight)


def fit_split(estimators, X, y, sample_weight=None) -> list:
    """The steps, for estimators that differ in their solve only: ``estimators``, fitted.

    1. **validate** (:func:`validate`) the input once, and refuse what the
       executor cannot run before any work;
    2. **split** the rows into P parts, one centre per part;
    3. **place** the parts on the executor's devices or workers, by the
       solvers' cost model;
    4. **fit** each part's local model, once per estimator's solver;
    5. **assemble** each estimator's fitted attributes from its solver's fits
       (:func:`assemble`).
    """
    first = estimators[0]
    needs = placement_needs(first) + tuple(first._fit_needs(sample_weight))
    executor = fit_executor(first, needs, X, y, sample_weight)
    executor.refuse(first, needs)
    data = validate(executor, estimators, X, y, sample_weight)
    n_parts = first._n_parts(data.n, executor.gpu)
    # No partition of n rows into P parts has a smaller largest part: refuse before work.
    executor.check_memory([fitted._part_cost() for fitted in estimators], data,
                          [-(-data.n // n_parts)], n_parts)
    data = executor.summarise(first, data, n_parts)
    data.n_parts = n_parts
    solvers = [fitted._part_solver(data) for fitted in estimators]
    partitioning = executor.split(data, n_parts, first._split_method(), first.random_state)
    placement = executor.place(solvers, data, partitioning)
    results = executor.fit_parts(solvers, data, partitioning, placement)
    for fitted, result in zip(estimators, results):
        assemble(fitted, partitioning, result, data)
        fitted._finish_fit(data, y, sample_weight)
    return estimators


def validate(executor, estimators, X, y, sample_weight) -> FitData:
    """The input checked once, by the first estimator (chunked input: its metadata by
    scikit-learn's rules); what that check set on it (``n_features_in_``,
    ``feature_names_in_``, ...) is set on the others. A refit first drops the previous
    model's placement and device copies (:func:`forget_fit`)."""
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
    return data


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
