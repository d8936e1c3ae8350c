"""A model whose parts stay on the Dask workers that fitted them.

A BKRR model holds every training row (You 2020, Alg 10: each part's kernel
expansion is over its own rows), so gathering it would bring the whole training
set to the client. After a Dask fit the parts stay where they were fitted
(:func:`gpuml.distributed.dask.ship_and_fit` with ``keep=True``): the client
keeps one future per worker's group of parts, and the fitted arrays are Dask
arrays over them, one chunk per part (:func:`kept_arrays`).

Prediction goes to the parts (:func:`predict_kept`): each chunk of rows is routed
where it lies, the rows of each group's parts travel to that group's worker and
its values come back, so rows move once and no worker holds another's parts.
With ``combine="average"`` every part judges every row: each chunk travels to
each group. A worker lost after the fit loses its parts with it; Dask computes
them again from the fit's tasks when a prediction needs them (as long as the
training input can be computed again).
"""

from __future__ import annotations

import uuid

import dask
import dask.array as da
import numpy as np

from .data import _as_array, check_features
from .driver import KEY_PREFIX
from .predict import _compute


def kept_arrays(kept, summaries, sizes):
    """``X_fit_`` and ``dual_coef_`` as Dask arrays, one chunk per part in part order.

    ``kept``: ``(part_ids, future)`` per group (a group's future holds its parts'
    fits); ``summaries``: each part's summary (its arrays with no rows, which carry
    their dtypes and trailing shapes); ``sizes``: each part's rows.
    """
    where = {}
    for ids, future in kept:
        for k, p in enumerate(ids):
            where[p] = (future, k)
    X_parts, coef_parts = [], []
    for p, (summary, m) in enumerate(zip(summaries, np.asarray(sizes).tolist())):
        future, k = where[p]
        X_parts.append(da.from_delayed(dask.delayed(_part_rows)(future, k),
                                       shape=(m,) + summary.X.shape[1:], dtype=summary.X.dtype))
        coef_parts.append(da.from_delayed(dask.delayed(_part_coef)(future, k),
                                          shape=(m,) + summary.dual_coef.shape[1:],
                                          dtype=summary.dual_coef.dtype))
    return da.concatenate(X_parts), da.concatenate(coef_parts)


def _part_rows(group, k):
    return group[0][k].X


def _part_coef(group, k):
    return group[0][k].dual_coef


def check_reachable(estimator):
    """Refuse, with what to do, a kept model whose cluster is gone (its client closed)."""
    futures = [future for _, future in estimator._kept_parts]
    client = futures[0].client
    if getattr(client, "status", "running") != "running" or any(
            f.status == "cancelled" for f in futures):
        raise RuntimeError(
            f"this {type(estimator).__name__} was fitted on Dask and its parts (its training "
            "rows and coefficients) are kept on the cluster's workers, but that cluster's "
            "client is closed or the parts were released (cancelled): predict while the "
            "cluster runs, or pickle the model while it runs (the pickle holds the parts) "
            "and load that")


def predict_kept(estimator, X, kernel, intercepts, dtype, checked=False):
    """The predictions of a kept model for Dask ``X``, lazily: a Dask array chunked as X's
    rows (their lengths computed first for a dataframe).

    ``kernel`` and ``intercepts`` (one row per part) are the model's; the values are
    computed in ``dtype`` (the model's) and returned in it, or in float32 for float32
    ``X`` (as in memory). ``checked``: X's features were checked already.
    """
    check_reachable(estimator)
    if not checked:
        check_features(estimator, X)
    X, _ = _as_array(X, "X", lengths=True)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (rows, features), got a {X.ndim}-D Dask array")
    if X.numblocks[1] > 1:
        X = X.rechunk({1: -1})
    tail = tuple(estimator.dual_coef_.shape[1:])
    out_dtype = np.dtype(np.float32) if X.dtype == np.float32 else np.dtype(dtype)
    token = uuid.uuid4().hex[:8]
    kernel, intercepts = dask.delayed(kernel), dask.delayed(np.asarray(intercepts))
    centers = dask.delayed(np.asarray(estimator.centers_))
    n_parts = int(estimator.n_partitions_)
    average = estimator.combine == "average"
    blocks = []
    for i, (chunk, rows) in enumerate(zip(X.to_delayed().ravel(), X.chunks[0])):
        def key(step, g=None, i=i):
            return f"{KEY_PREFIX}-predict-{step}-{token}-{i}" + ("" if g is None else f"-{g}")

        if average:
            pieces = [dask.delayed(_kept_sum)(chunk, future, kernel, dtype,
                                              dask_key_name=key("parts", g))
                      for g, (_, future) in enumerate(estimator._kept_parts)]
            block = dask.delayed(_averaged)(pieces, intercepts, n_parts, out_dtype,
                                            dask_key_name=key("sum"))
        else:
            labels = dask.delayed(_route)(chunk, centers, dtype, dask_key_name=key("route"))
            pieces = []
            for g, (ids, future) in enumerate(estimator._kept_parts):
                mine = dask.delayed(_select)(chunk, labels, ids, dtype,
                                            dask_key_name=key("select", g))
                pieces.append(dask.delayed(_kept_values)(mine, future, ids, kernel, intercepts,
                                                         dask_key_name=key("parts", g)))
            block = dask.delayed(_placed)(rows, tail, out_dtype, pieces,
                                          dask_key_name=key("rows"))
        blocks.append(da.from_delayed(block, shape=(rows,) + tail, dtype=out_dtype))
    return da.concatenate(blocks)


def predict_kept_in_memory(estimator, X, kernel, intercepts, dtype, block_rows):
    """:func:`predict_kept` for in-memory ``X`` (NumPy): its rows sent to the cluster in
    blocks of ``block_rows``, the predictions gathered (host array)."""
    Xd = da.from_array(np.asarray(X), chunks=(block_rows, X.shape[1]))
    out, = _compute(predict_kept(estimator, Xd, kernel, intercepts, dtype, checked=True))
    return out


def gathered(estimator):
    """``X_fit_`` and ``dual_coef_`` of a kept model computed to the client (NumPy)."""
    check_reachable(estimator)
    return _compute(estimator.X_fit_, estimator.dual_coef_)


def _route(chunk, centers, dtype):
    from ...routing import route

    return route(np.asarray(chunk, dtype=dtype), centers)


def _select(chunk, labels, ids, dtype):
    """The rows of the chunk routed to the parts ``ids``: ``(positions, rows, parts)``."""
    idx = np.flatnonzero(np.isin(labels, ids))
    return idx, np.asarray(chunk[idx], dtype=dtype), labels[idx]


def _kept_values(selection, group, ids, kernel, intercepts):
    """The values of the selected rows under their parts of this group: ``(positions,
    values)``."""
    idx, rows, parts = selection
    fits = group[0]
    out = np.empty((idx.size,) + fits[0].dual_coef.shape[1:], dtype=rows.dtype)
    for k, p in enumerate(ids):
        mine = np.flatnonzero(parts == p)
        if mine.size:
            out[mine] = kernel.dot(rows[mine], fits[k].X, fits[k].dual_coef) + intercepts[p]
    return idx, out


def _placed(rows, tail, dtype, pieces):
    out = np.empty((rows,) + tail, dtype=dtype)
    for idx, values in pieces:
        out[idx] = values
    return out


def _kept_sum(chunk, group, kernel, dtype):
    """The sum of the values of every part of this group for the chunk's rows."""
    rows = np.asarray(chunk, dtype=dtype)
    total = None
    for fit in group[0]:
        value = kernel.dot(rows, fit.X, fit.dual_coef)
        total = value if total is None else total + value
    return total


def _averaged(pieces, intercepts, n_parts, out_dtype):
    total = pieces[0].copy()
    for piece in pieces[1:]:
        total += piece
    total /= n_parts
    total += intercepts.mean(axis=0)
    return total.astype(out_dtype, copy=False)
