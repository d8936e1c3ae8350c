"""The training rows of a Dask fit: input checks, the chunks held on the workers, summaries.

:func:`check_dask_input` checks the layout of Dask input before any computation;
:func:`load_rows` checks every chunk on its worker as scikit-learn checks a
whole array, keeps the chunks there (:class:`DaskRows`: one object per worker)
and brings back one small summary per chunk (column means and spreads,
classes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dask.array as da
import numpy as np
from dask.base import is_dask_collection
from dask.core import flatten
from dask.sizeof import sizeof
from distributed import futures_of
from sklearn.utils.validation import check_array, validate_data

from .driver import _on


def is_dask(*values) -> bool:
    """Whether any value is a Dask collection (array, dataframe, series)."""
    return any(v is not None and is_dask_collection(v) for v in values)


def _as_array(value, name, *, lengths: bool):
    """A Dask array from a Dask array, dataframe or series (dataframes: partition lengths)."""
    if isinstance(value, da.Array):
        return value, None
    if hasattr(value, "to_dask_array"):
        names = list(value.columns) if hasattr(value, "columns") else None
        return value.to_dask_array(lengths=True if lengths else None), names
    raise TypeError(f"{name} must be a Dask array or dataframe, got {type(value).__name__}")


def _unknown(chunks) -> bool:
    return any(isinstance(c, float) and math.isnan(c) for c in chunks)


def _is_frame(value) -> bool:
    return hasattr(value, "columns") and hasattr(value, "_meta")


def feature_source(X):
    """What scikit-learn reads the feature names and count of Dask ``X`` from: a dataframe's
    ``_meta`` (an empty pandas frame with its columns and dtypes) or the array itself,
    once its columns are checked numeric or boolean. Nothing is computed."""
    if _is_frame(X):
        meta = X._meta
        bad = {str(c): str(t) for c, t in meta.dtypes.items() if t.kind not in "biuf"}
        if bad:
            raise ValueError(f"X has non-numeric columns (name: dtype) {bad}; a numeric dtype "
                             "is required")
        return meta
    if getattr(X, "ndim", 2) == 2 and X.dtype.kind not in "biuf":
        raise ValueError(f"X has dtype {X.dtype}; a numeric dtype is required")
    return X


def check_features(estimator, X):
    """scikit-learn's feature-name and feature-count checks of Dask ``X`` for prediction,
    from its metadata (:func:`feature_source`): the errors and warnings of in-memory input
    (``validate_data``), computing nothing."""
    validate_data(estimator, feature_source(X), skip_check_array=True, reset=False)


def check_dask_input(X, y, sample_weight=None, *, multi_output=False):
    """Validate the layout of Dask training data before any computation.

    Returns ``(X, y, sample_weight)`` as Dask arrays with one chunk along the
    columns and the same row chunks (feature names: :func:`check_features`).
    Raises ValueError for unknown chunk sizes and for ``y``/``sample_weight``
    chunked unlike ``X``.
    NumPy ``y`` or ``sample_weight`` are chunked like ``X``.
    """
    X, _ = _as_array(X, "X", lengths=True)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (rows, features), got a {X.ndim}-D Dask array")
    if _unknown(X.chunks[0]) or _unknown(X.chunks[1]):
        raise ValueError(
            "X has unknown chunk sizes (a Dask array made from a dataframe or after boolean "
            "indexing): call X.compute_chunk_sizes() first, or pass the dataframe itself")
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"Found array with shape {X.shape} while a minimum of 1 sample and "
                         "1 feature is required.")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"X has dtype {X.dtype}; a numeric dtype is required")
    if X.numblocks[1] > 1:
        # A row's features in one chunk: every task works on whole rows.
        X = X.rechunk({1: -1})
    out = [X]
    for value, what in ((y, "y"), (sample_weight, "sample_weight")):
        if value is None:
            out.append(None)
            continue
        if is_dask_collection(value):
            value, _ = _as_array(value, what, lengths=True)
        else:
            value = np.asarray(value)
            if value.ndim == 0 or value.shape[0] != X.shape[0]:
                raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                                 f"[{X.shape[0]}, {value.shape[0] if value.ndim else 1}]")
            value = da.from_array(value, chunks=(X.chunks[0],) + value.shape[1:])
        if _unknown(value.chunks[0]):
            raise ValueError(f"{what} has unknown chunk sizes: call {what}.compute_chunk_sizes() "
                             "first, or pass the dataframe or series itself")
        if value.shape[0] != X.shape[0]:
            raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                             f"[{X.shape[0]}, {value.shape[0]}] (X and {what})")
        if value.chunks[0] != X.chunks[0]:
            raise ValueError(
                f"X and {what} are chunked differently along the rows (X: {X.chunks[0]}, "
                f"{what}: {value.chunks[0]}); rechunk one like the other, e.g. "
                f"{what}.rechunk({{0: X.chunks[0]}})")
        if value.ndim == 2 and value.shape[1] == 1 and not (multi_output and what == "y"):
            value = value[:, 0]
        if value.ndim > (2 if multi_output and what == "y" else 1):
            raise ValueError(f"{what} should be a 1d array, got a Dask array of shape "
                             f"{value.shape} instead.")
        if value.ndim == 2 and value.numblocks[1] > 1:
            value = value.rechunk({1: -1})
        out.append(value)
    return tuple(out)


@dataclass
class _Chunk:
    """One row chunk on a worker: features, targets, per-row weights (C for an SVM)."""

    X: np.ndarray
    y: np.ndarray
    w: np.ndarray | None


@sizeof.register(_Chunk)
def _sizeof_chunk(chunk) -> int:
    """Its arrays' bytes. Without this Dask sizes a chunk by ``sys.getsizeof`` (the
    object alone, not its arrays), and its scheduler, thinking a worker's held chunks
    free to move, may steal a take task to the other worker and copy all of them there
    (every chunk, megabytes of rows; bench/results/cpu-2core/dask-runs.md)."""
    return int(chunk.X.nbytes + chunk.y.nbytes + (0 if chunk.w is None else chunk.w.nbytes))


def _prepare_chunk(X, y, w, dtype, y_numeric):
    """A chunk checked as scikit-learn checks a whole array (runs on the chunk's worker)."""
    X = check_array(X, dtype=dtype, input_name="X")
    y = np.asarray(y)
    if y_numeric:
        y = check_array(y, dtype=dtype, ensure_2d=False, input_name="y")
    elif y.dtype.kind == "f" and not np.isfinite(y).all():
        raise ValueError("Input y contains NaN or infinity.")
    if w is not None:
        w = check_array(w, dtype=np.float64, ensure_2d=False, input_name="sample_weight")
        if (w < 0).any():
            raise ValueError("Negative values in data passed to `sample_weight`")
    return _Chunk(X, y, w)


def _rows(chunk, local):
    """Rows ``local`` of a chunk (dense, contiguous)."""
    return np.ascontiguousarray(chunk.X[np.asarray(local, dtype=np.int64)])


def _summary(chunk, seeds, classes: bool):
    """One pass over a chunk: its column means and spreads, and its classes (or targets).

    ``seeds`` (local row indices, or None): rows a split asked for before the
    summaries (FCFS's seeds, see :class:`SplitStart`), returned as ``"seeds"``.

    Each chunk's sums of squared deviations are taken from its *own* means and
    combined on the client with the parallel formula of Chan, Golub and LeVeque
    (Algorithms for computing the sample variance, 1983): as exact as a second pass
    over the global means, without the second round trip; the same formula
    gives the spread of all entries from the columns'. For a classifier the
    chunk's ``y`` comes back too (the client needs it as class indices).

    One temporary the size of the chunk: Dask's nannies start workers with
    ``MALLOC_TRIM_THRESHOLD_`` set, which makes glibc map and unmap every large
    allocation, so every large temporary costs page faults each time (measured:
    ``MALLOC_TRIM_THRESHOLD_`` in bench/results/cpu-2core/dask-runs.md).
    """
    X = chunk.X
    m = X.shape[0]
    col_mean = X.mean(axis=0, dtype=np.float64)
    mean = float(col_mean.mean())
    dev = X - col_mean
    np.square(dev, out=dev)
    col_m2 = dev.sum(axis=0)
    out = {"rows": m, "col_mean": col_mean, "mean": mean, "col_m2": col_m2,
           "m2": float(col_m2.sum() + m * ((col_mean - mean) ** 2).sum())}
    if classes:
        values, counts = np.unique(chunk.y, return_counts=True)
        out["classes"] = (values, counts)
        out["y"] = chunk.y
    if seeds:
        out["seeds"] = _rows(chunk, seeds)
    return out


def _combine(parts, d):
    """Global column means, mean per-feature variance and variance of all entries."""
    n = sum(p["rows"] for p in parts)
    col_mean = sum(p["rows"] * p["col_mean"] for p in parts) / n
    mean = float(col_mean.mean())
    col_m2 = sum(p["col_m2"] + p["rows"] * (p["col_mean"] - col_mean) ** 2 for p in parts)
    m2 = sum(p["m2"] + p["rows"] * d * (p["mean"] - mean) ** 2 for p in parts)
    return col_mean, float((col_m2 / n).mean()), float(m2) / (n * d)


class DaskRows:
    """Training rows on the cluster: each worker's row chunks, held as one object there.

    Made by :func:`load_rows`. ``groups[g] = (address, ks, held)``: worker
    ``address`` holds chunks ``ks`` (ascending) as the future ``held`` (a list of
    :class:`_Chunk`, in that order). ``bounds[k]:bounds[k + 1]`` are chunk k's
    global rows; ``variance`` is the mean per-feature variance (k-means'
    tolerance scale) and ``variance_all`` the variance of all entries
    (``gamma="scale"``).

    Every step is one task per worker over the chunks it holds (:meth:`each`),
    however many chunks there are: each task costs the scheduler and the worker
    time of their own, and a round trip more (measured:
    bench/results/cpu-2core/dask-runs.md), and a Dask array is often cut into
    many more chunks than there are workers. The per-chunk results of a step stay
    on the worker as one list (a "state" later steps read) unless gathered
    (:meth:`gathered`: in chunk order, so the client adds them in the same order
    whatever the placement).
    """

    def __init__(self, driver, groups, bounds, n_features, dtype):
        self.driver = driver
        self.groups = groups
        self.bounds = bounds
        self.n = int(bounds[-1])
        self.n_chunks = len(bounds) - 1
        self.n_features = int(n_features)
        self.dtype = np.dtype(dtype)
        self.variance = 0.0
        self.variance_all = 0.0
        self.col_mean = None
        self.classes = None
        self.class_counts = None
        self.y = None  # a classifier's targets, on the client
        #: chunk k is item ``where[k][1]`` of group ``where[k][0]``
        self.where = {k: (g, i) for g, (_, ks, _) in enumerate(groups) for i, k in enumerate(ks)}

    def each(self, step, fn, *args, states=(), extra=None):
        """``fn(chunk_k, *state_k, *extra[k], *args)`` for every chunk k, one task per worker.

        ``states``: results of earlier :meth:`each` calls (None: ``None`` for every
        chunk), read where they are. Returns one future per group, each the list of
        its chunks' results (in the group's order), left on the workers.
        """
        out = []
        for g, (address, ks, held) in enumerate(self.groups):
            extras = [tuple(extra[k]) for k in ks] if extra is not None else None
            out.append(self.driver.submit(step, _each, fn, held,
                                          [None if s is None else s[g] for s in states], extras,
                                          *args, **_on(address)))
        return out

    def one(self, step, fn, k, *args, states=()):
        """``fn(chunk_k, *state_k, *args)`` for chunk k alone: one task on its worker."""
        g, i = self.where[k]
        address, _, held = self.groups[g]
        return self.driver.submit(step, _one, fn, held, i,
                                  [None if s is None else s[g] for s in states], *args,
                                  **_on(address))

    def owner(self, i: int):
        """``(chunk, local index)`` of global row ``i``."""
        k = int(np.searchsorted(self.bounds, i, side="right") - 1)
        return k, i - int(self.bounds[k])

    def locals_of(self, ids) -> list:
        """Each chunk's local indices of the global rows ``ids`` (ascending; an empty list for
        a chunk with none)."""
        owners = [self.owner(int(i)) for i in np.asarray(ids).tolist()]
        return [[loc for kk, loc in owners if kk == k] for k in range(self.n_chunks)]

    def gathered(self, pending):
        """The results of an :meth:`each` call on the client: one per chunk, in chunk order."""
        out = [None] * self.n_chunks
        for (_, ks, _), values in zip(self.groups, self.driver.gather(pending)):
            for k, value in zip(ks, values):
                out[k] = value
        return out


def _each(fn, chunks, states, extras, *args):
    """``fn(chunk, *state, *extra, *args)`` for each of a worker's chunks, in order (one task)."""
    return [fn(chunk, *(None if s is None else s[i] for s in states),
               *(extras[i] if extras is not None else ()), *args)
            for i, chunk in enumerate(chunks)]


def _one(fn, chunks, i, states, *args):
    """``fn(chunk, *state, *args)`` for item ``i`` of a worker's chunks."""
    return fn(chunks[i], *(None if s is None else s[i] for s in states), *args)


def _load(xs, ys, ws, dtype, y_numeric):
    """A worker's chunks, each checked as scikit-learn checks a whole array."""
    return [_prepare_chunk(X, y, w, dtype, y_numeric) for X, y, w in zip(xs, ys, ws)]


def _block_futures(client, arr):
    """Futures of ``arr``'s row blocks, in order: its own when it is persisted (nothing
    to send), else its blocks computed on the cluster."""
    keys = list(flatten(arr.__dask_keys__()))
    held = {f.key: f for f in futures_of(arr) if f.client is client}
    if all(k in held for k in keys):
        return [held[k] for k in keys]
    return client.compute(arr.to_delayed().ravel().tolist())


def _locate(client, futures):
    """``[(worker address, [indices])]``: the futures grouped by the worker holding each
    (one scheduler call; they must be in memory), ordered by their first index."""
    where = client.who_has(futures)
    groups: dict = {}
    for k, future in enumerate(futures):
        holders = sorted(where.get(future.key, ()))
        groups.setdefault(holders[0] if holders else None, []).append(k)
    return sorted(groups.items(), key=lambda item: item[1][0])


def load_rows(driver, X, y, w, *, dtype, classification: bool, split=None) -> DaskRows:
    """Each worker's chunks validated and held there, then one small pass of summaries
    (step 1).

    The chunks are computed (at once if persisted) and grouped by the worker
    holding each; one task per worker checks them and keeps them. ``split`` (a
    :class:`SplitStart`, optional): the rows the partitioner can ask for before
    the summaries (FCFS: its seed rows) come back in them, one round trip fewer.
    """
    client = driver.client
    xs, ys = _block_futures(client, X), _block_futures(client, y)
    ws = _block_futures(client, w) if w is not None else [None] * len(xs)
    n_chunks = len(xs)
    driver.watch(X, y, w)
    driver.wait(xs)  # no round trip when the chunks are persisted already
    groups = []
    for address, ks in _locate(client, xs):
        held = driver.submit("load", _load, [xs[k] for k in ks], [ys[k] for k in ks],
                             [ws[k] for k in ks], dtype, not classification, **_on(address))
        groups.append((address, ks, held))
    driver.traffic.groups = len(groups)
    bounds = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(np.int64)
    rows = DaskRows(driver, groups, bounds, X.shape[1], dtype)
    seeds = split.seeds(rows) if split is not None else None
    first = rows.gathered(rows.each("summary", _summary, classification,
                                    extra=[(s,) for s in seeds or [None] * n_chunks]))
    if seeds is not None:
        split.receive([f["seeds"] for f in first if "seeds" in f])
    rows.col_mean, rows.variance, rows.variance_all = _combine(first, rows.n_features)
    if classification:
        values = np.unique(np.concatenate([f["classes"][0] for f in first]))
        counts = np.zeros(values.size, dtype=np.int64)
        for f in first:
            counts[np.searchsorted(values, f["classes"][0])] += f["classes"][1]
        rows.y = np.concatenate([f["y"] for f in first])
        rows.classes, rows.class_counts = values, counts
    return rows

