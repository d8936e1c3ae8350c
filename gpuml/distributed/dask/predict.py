"""Prediction and scores on Dask input, lazily, each block where it lies."""

from __future__ import annotations

import math
import warnings
from functools import partial

import dask
import numpy as np
from dask.base import is_dask_collection
from distributed import get_client
from sklearn.base import is_classifier
from sklearn.exceptions import UndefinedMetricWarning
from sklearn.metrics import accuracy_score, r2_score

from .data import _as_array, _unknown, check_features, is_dask
from .driver import BUDGET_RULE, KEY_PREFIX, compute, fmt_bytes, workers_and_budget
from .kept import compute_kept


def _apply(block, model, method, names):
    if names is not None:
        import pandas as pd

        block = pd.DataFrame(block, columns=names)
    return np.asarray(getattr(model, method)(block))


def predict_blocks(estimator, X, method, *, out_columns, dtype):
    """``getattr(estimator, method)`` over the row chunks of Dask ``X``, lazily.

    The fitted model travels once to each worker as one ``dask.delayed``
    object; each chunk's rows are predicted where they are (routed to their
    part's model inside the chunk). ``out_columns`` is None for a 1-D result.
    Feature names, their number and the dtypes are checked first
    (:func:`check_features`), as for in-memory input.
    """
    check_features(estimator, X)
    _check_model_fits_workers(estimator)
    names = getattr(estimator, "feature_names_in_", None)
    X, _ = _as_array(X, "X", lengths=False)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (rows, features), got a {X.ndim}-D Dask array")
    if X.numblocks[1] > 1:
        X = X.rechunk({1: -1})
    model = dask.delayed(estimator, pure=True, traverse=False)
    token = f"{KEY_PREFIX}-{method.replace('_', '-')}"
    if out_columns is None:
        return X.map_blocks(_apply, model, method, names, drop_axis=1, dtype=dtype,
                            meta=np.empty((0,), dtype=dtype), token=token)
    return X.map_blocks(_apply, model, method, names, dtype=dtype,
                        chunks=(X.chunks[0], (out_columns,)),
                        meta=np.empty((0, 0), dtype=dtype), token=token)


def model_bytes(estimator) -> int:
    """Bytes of the fitted model's arrays (what travels to each worker that predicts)."""
    total = 0
    for value in vars(estimator).values():
        if isinstance(value, np.ndarray):
            total += value.nbytes
        elif hasattr(value, "tocsr"):  # SciPy sparse
            total += value.data.nbytes + value.indices.nbytes + value.indptr.nbytes
    return int(total)


def _check_model_fits_workers(estimator):
    """Refuse, before any work, a prediction whose model cannot fit a worker's budget.

    The model travels whole to every worker that predicts (a CA-SVM model holds its
    support vectors, a BKRR model every training row). Without a current client
    (the prediction computed later, elsewhere) there is nothing to check against.
    """
    try:
        client = get_client()
    except ValueError:
        return
    _, budget = workers_and_budget(client)
    size = model_bytes(estimator)
    if budget is not None and size > budget:
        held = "support vectors" if hasattr(estimator, "support_vectors_") else "training rows"
        raise MemoryError(
            f"the fitted {type(estimator).__name__} takes {fmt_bytes(size)} (its {held} and "
            f"coefficients) and travels whole to every Dask worker that predicts, but the "
            f"smallest worker's budget is {fmt_bytes(budget)} ({BUDGET_RULE}): predict on "
            "in-memory rows (in blocks), or use workers with a larger memory_limit")


def score(estimator, X, y, sample_weight=None) -> float:
    """``estimator.score`` on Dask input, in one pass over the rows.

    Accuracy for a classifier, R² for a regressor, with ``sample_weight``, as
    scikit-learn's ``accuracy_score`` and ``r2_score`` (uniform average over
    targets) compute them. ``X``, ``y`` and ``sample_weight`` may each be a Dask
    array, dataframe or series, or in memory. When ``y`` is in memory the
    predictions (one value per row) come back and scikit-learn scores them;
    otherwise each block's predictions are compared with its targets where
    they lie and a few sums per block come back (for R², each block's weighted
    mean and sum of squares about it, merged as Chan, Golub and LeVeque,
    "Algorithms for computing the sample variance", 1983).
    """
    if y is None:
        raise ValueError("score requires y to be passed, but the target y is None")
    predicted = estimator.predict(X)
    # a model whose parts are kept on the workers: its tasks where its parts are
    run = (partial(compute_kept, estimator) if estimator.__dict__.get("_kept_parts") is not None
           else compute)
    classifier = is_classifier(estimator)
    if not is_dask(y, sample_weight):
        y_pred, = run(predicted)
        metric = accuracy_score if classifier else r2_score
        return float(metric(y, y_pred, sample_weight=sample_weight))
    blocks = predicted.to_delayed().ravel().tolist()
    targets = _blocks_like(y, predicted, "y")
    weights = (_blocks_like(sample_weight, predicted, "sample_weight")
               if sample_weight is not None else [None] * len(blocks))
    stats = run(*[dask.delayed(_score_sums)(p, t, w, classifier)
                       for p, t, w in zip(blocks, targets, weights)])
    if classifier:
        hits = math.fsum(h for h, _ in stats)
        total = math.fsum(t for _, t in stats)
        return hits / total if total else float("nan")
    return _r2_of(stats)


def _blocks_like(value, predicted, what) -> list:
    """``value``'s row blocks, one per block of ``predicted`` (delayed or in memory)."""
    n_blocks = predicted.numblocks[0]
    if is_dask_collection(value):
        arr, _ = _as_array(value, what, lengths=False)
        if arr.ndim == 2 and arr.numblocks[1] > 1:
            arr = arr.rechunk({1: -1})
        known = not _unknown(arr.chunks[0]) and not _unknown(predicted.chunks[0])
        if known and arr.shape[0] != predicted.shape[0]:
            raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                             f"[{predicted.shape[0]}, {arr.shape[0]}] (X and {what})")
        if known and arr.chunks[0] != predicted.chunks[0]:
            arr = arr.rechunk({0: predicted.chunks[0]})
        elif arr.numblocks[0] != n_blocks:
            raise ValueError(
                f"X and {what} are partitioned differently ({n_blocks} and "
                f"{arr.numblocks[0]} row blocks, lengths unknown): repartition one like the "
                "other")
        return arr.to_delayed().reshape(n_blocks, -1)[:, 0].tolist()
    value = np.asarray(value)
    if _unknown(predicted.chunks[0]):
        raise ValueError(
            f"{what} is in memory but X's row blocks have unknown lengths (a Dask dataframe): "
            f"pass {what} as a Dask series partitioned like X, or X with known lengths "
            "(X.to_dask_array(lengths=True))")
    if value.shape[0] != predicted.shape[0]:
        raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                         f"[{predicted.shape[0]}, {value.shape[0]}] (X and {what})")
    ends = np.cumsum((0,) + predicted.chunks[0]).tolist()
    return [value[a:b] for a, b in zip(ends[:-1], ends[1:])]


def _score_sums(y_pred, y, w, classifier: bool):
    """One block's sums for :func:`score`: ``(hits, weight)`` for a classifier; for a
    regressor per target ``(weight, mean, squares about the mean, squared errors)``."""
    y = np.asarray(y)
    if y.shape[0] != y_pred.shape[0]:
        raise ValueError(f"Found input variables with inconsistent numbers of samples in a "
                         f"block: [{y_pred.shape[0]}, {y.shape[0]}] (predictions and y)")
    w = np.ones(y.shape[0]) if w is None else np.asarray(w, dtype=np.float64)
    if classifier:
        return float(np.dot(w, (y_pred == y).astype(np.float64))), float(w.sum())
    y = y.reshape(y.shape[0], -1).astype(np.float64)
    y_pred = y_pred.reshape(y.shape).astype(np.float64)
    total = float(w.sum())
    mean = (w @ y) / total if total else np.zeros(y.shape[1])
    squares = w @ (y - mean) ** 2
    errors = w @ (y - y_pred) ** 2
    return total, mean, squares, errors, y.shape[0]


def _r2_of(stats) -> float:
    """R² from the blocks' sums (:func:`_score_sums`), as ``r2_score`` forces it finite."""
    if sum(s[4] for s in stats) < 2:
        warnings.warn("R^2 score is not well-defined with less than two samples.",
                      UndefinedMetricWarning, stacklevel=3)
        return float("nan")
    weight, mean, squares, errors = 0.0, 0.0, 0.0, 0.0
    for w, m, sq, err, _ in stats:
        errors = errors + err
        if w == 0:
            continue
        total = weight + w
        delta = m - mean
        mean = mean + delta * (w / total)
        squares = squares + sq + delta**2 * (weight * w / total)
        weight = total
    numerator = np.atleast_1d(errors)
    denominator = np.atleast_1d(squares)
    scores = np.ones(numerator.shape)
    valid = (denominator != 0) & (numerator != 0)
    scores[valid] = 1.0 - numerator[valid] / denominator[valid]
    scores[(numerator != 0) & (denominator == 0)] = 0.0
    return float(scores.mean())

