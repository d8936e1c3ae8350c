"""Partitioned estimators on a Dask cluster: the parts are fitted on the workers.

``CASVMClassifier.fit`` and ``BKRRRegressor.fit`` hand Dask input (a
``dask.array.Array`` or a ``dask.dataframe`` of rows) to this module; it needs a
``distributed.Client``. The estimator stays the same object, and the fitted
model is the one an in-process fit of the same rows with the same partition
gives (You 2020, "Fast and Accurate Machine Learning on Distributed Systems and
Supercomputers", ch. 2-3: the local models never communicate, so only the
partitioning needs a few small reductions).

The steps, each a set of Dask tasks run from the client (the "driver"):

1. **Check the chunks** before any work: known row chunk sizes, ``y`` (and
   ``sample_weight``) chunked like ``X`` along the rows, one chunk along the
   columns (re-chunked if not), and the size of a part against the smallest
   worker's memory budget. The chunks are grouped by the worker holding each
   (:class:`DaskRows`: from here on every step is one task per worker over its
   chunks); that task validates them (finite, numeric) and keeps them, and a
   first pass sums what ``gamma="scale"``, k-means' tolerance and the class list
   need (and returns FCFS's seed rows, drawn before it).
2. **Partition with a distributed Lloyd** over the chunks (k-means++ seeding,
   Lloyd steps, the greedy fill of FCFS and K-balance; You 2020, Alg. 3 and 9):
   the same algorithms and the same random draws as
   :mod:`gpuml.distributed.partition`. Every Lloyd step sends the P x d centres
   to each worker and brings back one small array of per-centre sums and counts
   per chunk, summed on the client in chunk order. k-means++ and the Lloyd steps
   are a chain of small exchanges, so they run on one Dask actor per worker
   (:class:`_RowsActor`: a method call on the worker holding the chunks, without
   the scheduler's round trip of a task), where the k-means++ distances stay;
   if an actor's worker is lost they run again as tasks. The greedy fill is
   sequential over the rows: when P <= d the workers compute their rows' n_k x P
   distances to the centres (in parallel), the client gathers them in chunk order
   and runs the fill, as the SPMD fill of :mod:`gpuml.distributed.partition` does
   on rank 0; when the distances would outweigh the rows (P > d) it runs as a
   chain along the chunks that passes the P fill counts on (one task per chunk,
   or after K-balance's k-means one actor call per run of chunks on a worker). The
   labels end on the client and go to the workers with the tasks that need them.
   The
   partition is the one :func:`gpuml.partition.partition` computes on the same
   rows with the same seed (the tests check the labels).
3. **Ship each part's rows** to the worker it is placed on: each part starts on
   the worker holding most of its rows and parts move only to balance the
   estimator's cost model (:func:`gpuml.distributed.placement.balance_local`;
   Graham's LPT rule when that balances better by over 2 %), one group of parts
   per worker; the group's fit task cuts the rows of its parts out of its worker's chunks,
   and a task on each other worker holding some of them out of that worker's (a
   classifier's ``y`` as class indices, its per-row C): the only time rows
   move, once. With ``partition="contiguous"`` (You 2020's casvm2: each part the
   rows as they lie) and parts that do not straddle workers, no row moves and
   there is no partitioning step at all.
4. **Fit** each group on its worker with the estimator's own ``_fit_parts``
   (one batch: one SMO launch or one batched Cholesky; on a GPU under
   dask-cuda, where each worker sees one GPU, ``device="auto"`` resolves to it).
5. **Gather** the small per-part fits (picklable ``SVMPartFit`` /
   ``KRRPartFit``), with each group's sums and counts of its parts' rows (the
   centres: the parts' means), and assemble the fitted attributes on the
   client exactly as an in-process fit does.

Prediction on Dask input is lazy (:func:`predict_blocks`): ``map_blocks`` with
the fitted model as one ``dask.delayed`` object, sent once to each worker that
predicts; the rows never move.

A worker lost mid-fit: every task here is a pure function of its inputs, so
the scheduler recomputes what was on the lost worker and runs the lost tasks
again elsewhere, with the same result. A task whose workers keep dying ends
the fit with a :class:`RuntimeError` that says so. The k-means actors are not
retried by Dask; when one is lost (a call waits only while the actor's worker
runs), k-means runs again from the same random draws as tasks (a
:class:`RuntimeWarning` says so), with the same result. Input that Dask cannot
compute again (scattered rows) lost with its worker ends the fit with
:class:`LostData`, naming that worker.
"""

from __future__ import annotations

import itertools
import math
import pickle
import uuid
import warnings
from dataclasses import dataclass

import dask
import dask.array as da
import numpy as np
from dask.base import is_dask_collection
from dask.core import flatten
from dask.sizeof import sizeof
from distributed import KilledWorker, as_completed, futures_of, get_client, get_worker, wait
from distributed.utils import CancelledError
from joblib import effective_n_jobs
from sklearn.base import is_classifier
from sklearn.exceptions import UndefinedMetricWarning
from sklearn.metrics import accuracy_score, r2_score
from sklearn.utils import check_random_state
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.validation import check_array, validate_data

from .._backend import CPU, resolve, to_numpy
from .._validation import check_n_partitions
from ..estimators._partitioned import Partitioning
from ..kernels import fill_nearest_open, nearest_centres, part_sums, row_blocks
from ..pairwise import Kernel, shifted_sq_distances, squared_norms
from ..partition import PARTITIONERS, SPLITS, divide, fcfs_seeds
from .placement import balance_local, cholesky_cost, smo_cost

#: Task keys start with this, then the step; tests and dashboards find gpuml's tasks by it.
KEY_PREFIX = "gpuml"

#: The partitioners that run over chunks (all but BKM, see :func:`partition_chunks`).
DASK_PARTITIONERS = ("random", "contiguous", "fcfs", "kmeans", "kbalance")

def fills_on_client(n_parts: int, n_features: int) -> bool:
    """Whether the greedy fill gathers the n x P distances to the client (else: a chain).

    When P <= d the distances weigh no more than the rows that move to their
    parts anyway; see ``ChunkRows.fill``.
    """
    return n_parts <= n_features


#: Lloyd's k-means over chunks: at most this many steps, stopping when the centres move
#: less than this fraction of the data's variance (as :func:`gpuml.partition.partition`).
LLOYD_MAX_ITER, LLOYD_TOL = 100, 1e-4

#: Seconds between the checks, while a k-means actor computes, that its worker still runs.
ACTOR_POLL_S = 1.0


class LostWorker(RuntimeError):
    """The Dask worker running a k-means actor was lost (k-means then runs as tasks)."""


class LostData(RuntimeError):
    """A Dask worker was lost holding input rows that Dask cannot compute again."""


#: The greedy fill gathers the distance blocks of consecutive chunks up to this many
#: bytes at a time (the client's memory for them).
FILL_BATCH_BYTES = 256 * 2**20


# ---------------------------------------------------------------------------------------
# traffic: what the driver sends in task arguments and gathers back
# ---------------------------------------------------------------------------------------
@dataclass
class Traffic:
    """Bytes the client sent in task arguments and gathered from the workers.

    Sizes are ``nbytes`` for arrays and the pickle of anything else: what goes
    over the wire up to the framing. Rows moved between workers are
    counted by distributed itself (each worker's ``transfer_incoming_log``).
    """

    sent: int = 0
    gathered: int = 0
    steps: int = 0
    #: workers holding chunks: the steps run as one task per worker send their
    #: arguments (the centres) this many times, not once per chunk
    groups: int = 0
    #: rows cut out on one worker for a part placed on another (each moves once)
    rows_moved: int = 0


class _Driver:
    """The client side of a fit: submits tasks, gathers small results, counts bytes."""

    def __init__(self, client):
        self.client = client
        self.token = uuid.uuid4().hex[:8]
        self.traffic = Traffic()
        self._count = 0
        #: the input's own futures (scattered or persisted data): key -> (future, holders)
        self.inputs = {}

    def watch(self, *collections):
        """Note where the input's futures are held, to name a lost worker if one goes."""
        futures = [f for c in collections if c is not None for f in futures_of(c)]
        if futures:
            # The scheduler's record as it is now (Client.who_has would wait for them).
            where = self.client.sync(self.client.scheduler.who_has, keys=[f.key for f in futures])
            self.inputs = {f.key: (f, sorted(where.get(f.key, ()))) for f in futures}

    def lost_data(self, err) -> Exception:
        """The error to raise for a cancelled future: :class:`LostData` naming the lost
        workers when input data Dask cannot compute again is gone, else ``err``."""
        lost = {}
        for future, holders in self.inputs.values():
            if future.status in ("cancelled", "lost"):
                for holder in holders or ["a worker lost before the fit began"]:
                    lost[holder] = lost.get(holder, 0) + 1
        if not lost:
            return err
        where = "; ".join(f"{a}, holding {k} of the input's pieces"
                          for a, k in sorted(lost.items()))
        return LostData(
            f"a Dask worker was lost ({where}) with input data that Dask cannot compute again "
            "(scattered, or loaded by a task whose inputs are gone), so the fit cannot go on. "
            "Build the input from a source Dask can read again (dask.array.from_array, "
            "dask.dataframe.read_parquet, ...) or replicate it (client.replicate) to survive a "
            "lost worker")

    def wait(self, futures):
        """``distributed.wait``, with a lost input named (:meth:`lost_data`)."""
        try:
            wait(futures)
        except CancelledError as err:
            raise self.lost_data(err) from err

    def key(self, step: str) -> str:
        self._count += 1
        return f"{KEY_PREFIX}-{step}-{self.token}-{self._count}"

    def submit(self, step, fn, *args, **kwargs):
        self.traffic.sent += sum(_nbytes(a) for a in args)
        return self.client.submit(fn, *args, key=self.key(step), pure=False, **kwargs)

    def gather(self, futures, *, as_they_finish=False):
        """The futures' values, in order. ``as_they_finish``: each fetched as soon as it is
        done, so that the first results travel while later tasks still run."""
        try:
            if as_they_finish:
                values = [None] * len(futures)
                where = {f.key: i for i, f in enumerate(futures)}
                for future, value in as_completed(futures, with_results=True):
                    values[where[future.key]] = value
            else:
                values = self.client.gather(futures)
        except CancelledError as err:
            raise self.lost_data(err) from err
        except KilledWorker as err:
            raise RuntimeError(
                f"a Dask worker died each time it ran one of gpuml's tasks ({err}); the "
                "scheduler retries a task whose worker dies (distributed.scheduler."
                "allowed-failures times) and gave up: look for the cause in the worker "
                "logs (memory: a part too large for the worker, see n_partitions)"
            ) from err
        self.traffic.gathered += _nbytes(values)
        return values


def _is_future(a) -> bool:
    return type(a).__name__ == "Future"


def _nbytes(value) -> int:
    """Bytes ``value`` takes on the wire: ``nbytes`` for arrays, its pickle otherwise; 0 for
    futures (their data moves between workers, counted by distributed)."""
    if value is None or _is_future(value):
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _client():
    try:
        return get_client()
    except ValueError:
        raise ValueError(
            "fitting on Dask input needs a distributed client: create one first "
            "(from distributed import Client; client = Client() or Client(cluster)), or "
            "pass NumPy data (X.compute())") from None


# ---------------------------------------------------------------------------------------
# step 1: input checks, on the client (metadata only) and per chunk on the workers
# ---------------------------------------------------------------------------------------
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


def check_features(estimator, X, *, reset: bool):
    """scikit-learn's feature-name and feature-count rules for Dask ``X``, from its metadata.

    A Dask dataframe is checked through its ``_meta`` (an empty pandas frame
    with its columns and dtypes), a Dask array through its shape: the same
    errors and warnings as in-memory input (``validate_data``), computing
    nothing. ``reset=True`` (fit) sets ``n_features_in_`` and
    ``feature_names_in_``; ``reset=False`` (predict) checks them. A dataframe's
    columns must all be numeric or boolean.
    """
    if _is_frame(X):
        meta = X._meta
        bad = {str(c): str(t) for c, t in meta.dtypes.items() if t.kind not in "biuf"}
        if bad:
            raise ValueError(f"X has non-numeric columns (name: dtype) {bad}; a numeric dtype "
                             "is required")
        validate_data(estimator, meta, skip_check_array=True, reset=reset)
        return
    if getattr(X, "ndim", 2) == 2 and X.dtype.kind not in "biuf":
        raise ValueError(f"X has dtype {X.dtype}; a numeric dtype is required")
    validate_data(estimator, X, skip_check_array=True, reset=reset)


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
    """Its arrays' bytes. Without this Dask sizes a chunk at ~60 bytes (``sys.getsizeof``),
    and its scheduler, thinking a worker's held chunks free to move, stole a take task
    to the other worker and copied all of them there (11 MB, seen on 26 November)."""
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
    allocation (a 2 MB temporary costs page faults each time: four of them made
    this pass 4x slower in a worker than in the client).
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


def _with_classes(chunk, classes, class_weight, C):
    """y as class indices and the per-row C (LIBSVM: C * class_weight[y] * sample_weight)."""
    y_idx = np.searchsorted(classes, chunk.y)
    w = C * class_weight[y_idx] * (1.0 if chunk.w is None else chunk.w)
    return _Chunk(chunk.X, y_idx, np.asarray(w, dtype=np.float64))


# ---------------------------------------------------------------------------------------
# the data on the cluster
# ---------------------------------------------------------------------------------------
class DaskRows:
    """Training rows on the cluster: each worker's row chunks, held as one object there.

    Made by :func:`load_rows`. ``groups[g] = (address, ks, held)``: worker
    ``address`` holds chunks ``ks`` (ascending) as the future ``held`` (a list of
    :class:`_Chunk`, in that order). ``bounds[k]:bounds[k + 1]`` are chunk k's
    global rows; ``variance`` is the mean per-feature variance (k-means'
    tolerance scale) and ``variance_all`` the variance of all entries
    (``gamma="scale"``).

    Every step is one task per worker over the chunks it holds (:meth:`each`),
    however many chunks there are: a task costs a few milliseconds of the
    scheduler's and the worker's time (about 2 ms each on this project's 2-core
    machine, against 9 ms for a round trip), and a Dask array is often cut into
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



def _in_order_sum(values):
    """float64 arrays added one after another, in the order given (the same bits every time,
    wherever the values were computed)."""
    total = np.array(values[0], dtype=np.float64, copy=True)
    for v in values[1:]:
        total += v
    return total


def _on(address):
    """Task placement on the worker at ``address`` (None: anywhere); if it is gone the
    scheduler may run the task elsewhere (its inputs then move)."""
    return dict(workers=None if address is None else [address], allow_other_workers=True)


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


# ---------------------------------------------------------------------------------------
# step 2: the partitioners over chunks
# ---------------------------------------------------------------------------------------
def _assign_sums(chunk, centers):
    """The per-centre sums and counts of the chunk's rows, packed as one float64 array.

    float64 holds counts exactly up to 2^53 rows, and float32 sums exactly, as
    in :mod:`gpuml.distributed.partition`.
    """
    _, sums, counts = nearest_centres(chunk.X, centers, with_sums=True)
    return _pack(sums, counts)


def _assign_labels(chunk, centers):
    """The nearest centre of every row: the same call as a Lloyd step, so the same labels."""
    return nearest_centres(chunk.X, centers, with_sums=True)[0]


def _pack(sums, counts):
    pack = np.empty((sums.shape[0], sums.shape[1] + 1), dtype=np.float64)
    pack[:, :-1] = sums
    pack[:, -1] = counts
    return pack


def _norms(chunk):
    return squared_norms(chunk.X)


def _closest(chunk, norms, previous, c):
    """Squared distances of the rows to centre ``c`` (clamped at 0), or to the nearest so far."""
    d2 = np.maximum(shifted_sq_distances(chunk.X, c[None, :])[:, 0] + norms, 0.0)
    return d2 if previous is None else np.minimum(previous, d2)


def _total(chunk, closest):
    return float(np.cumsum(closest)[-1]) if closest.size else 0.0


def _pick(chunk, closest, u):
    """The row where the running sum of ``closest`` reaches ``u`` (k-means++'s draw)."""
    local = min(int(np.searchsorted(np.cumsum(closest), u)), closest.shape[0] - 1)
    return np.ascontiguousarray(chunk.X[local])


def _row(chunk, local):
    return np.ascontiguousarray(chunk.X[local])


def _rows(chunk, local):
    return np.ascontiguousarray(chunk.X[np.asarray(local, dtype=np.int64)])


def _distances(chunk, centers, c_norms):
    """Squared distances (shifted by the rows' norms) of the chunk's rows to the centres.

    The blocks the in-process fill computes (:func:`gpuml.partition.partition`),
    so the fill on the client sees the same numbers.
    """
    X = chunk.X
    D = np.empty((X.shape[0], centers.shape[0]), dtype=np.result_type(X.dtype, centers.dtype))
    for start, stop in row_blocks(X.shape[0], centers.shape[0]):
        D[start:stop] = shifted_sq_distances(X[start:stop], centers, c_norms)
    return D


def _fill_chunk(chunk, centers, c_norms, counts, caps):
    """The greedy fill of the chunk's rows, in order, after the chunks before it.

    ``counts`` are the parts' fill counts after the previous chunks; returns
    this chunk's labels and the counts after it.
    """
    counts = np.array(counts, dtype=np.int64, copy=True)
    X = chunk.X
    labels = np.empty(X.shape[0], dtype=np.int64)
    for start, stop in row_blocks(X.shape[0], centers.shape[0]):
        D = shifted_sq_distances(X[start:stop], centers, c_norms)
        labels[start:stop] = fill_nearest_open(D, counts, caps)
    return labels, counts


def _counts_of(result):
    return result[1]


def _unpack(pack, dtype):
    return pack[:, :-1].astype(dtype), pack[:, -1].astype(np.int64)


class _TaskSteps:
    """k-means' small steps as tasks, one per worker (:meth:`DaskRows.each`): what
    Dask retries when a worker is lost. A drawn row stays a future that the next
    distance tasks read; each step's totals or sums come back to the client."""

    def __init__(self, rows: DaskRows):
        self.rows = rows
        self.norms = self.closest = None

    def row(self, i: int):
        return self.rows.one("row", _row, *self.rows.owner(i))

    def _totals(self):
        return np.array(self.rows.gathered(self.rows.each("total", _total,
                                                          states=[self.closest])))

    def first(self, c):
        self.norms = self.rows.each("norms", _norms)
        self.closest = self.rows.each("closest", _closest, c, states=[self.norms, None])
        return self._totals()

    def closer(self, c):
        self.closest = self.rows.each("closest", _closest, c,
                                      states=[self.norms, self.closest])
        return self._totals()

    def pick(self, k: int, u: float):
        return self.rows.one("pick", _pick, k, u, states=[self.closest])

    def values(self, rows) -> np.ndarray:
        return np.stack(self.rows.driver.gather(rows))

    def assign(self, centers):
        """The per-centre sums and counts of all rows, added in chunk order."""
        rows = self.rows
        return _unpack(_in_order_sum(rows.gathered(rows.each("assign", _assign_sums, centers))),
                       rows.dtype)

    def labels(self, centers):
        return self.rows.gathered(self.rows.each("labels", _assign_labels, centers))

    def fill_chain(self, centers, c_norms, counts, caps):
        """The fill, chunk after chunk: one task per chunk, handed the P fill counts after
        the chunks before it (the labels stay until the end)."""
        rows, states = self.rows, []
        for k in range(rows.n_chunks):
            state = rows.one("fill", _fill_chunk, k, centers, c_norms, counts, caps)
            # Only the P counts go on to the next chunk's worker; the labels stay.
            counts = rows.driver.submit("fill-counts", _counts_of, state)
            states.append(state)
        # The labels come back with the last counts of each chunk (P numbers more).
        return [labels for labels, _ in rows.driver.gather(states)]


class _RowsActor:
    """A worker's chunks for k-means' small steps, as a Dask actor.

    Made on the worker holding them (the chunks are not copied); the client calls
    its methods directly, each call one message to the worker and one back (about
    5 ms on this project's 2-core machine, against about 20 ms for a round of
    tasks: submit, schedule, run, report, gather). The distances to the nearest
    centre so far stay here between calls. The per-chunk functions are the tasks'.
    """

    def __init__(self, chunks):
        self.chunks = chunks
        self.norms = self.closest = None

    def row(self, i, local):
        return _row(self.chunks[i], local)

    def _totals(self):
        return [_total(c, d) for c, d in zip(self.chunks, self.closest)]

    def first(self, c):
        self.norms = [_norms(chunk) for chunk in self.chunks]
        self.closest = [_closest(chunk, n, None, c) for chunk, n in zip(self.chunks, self.norms)]
        return self._totals()

    def closer(self, c):
        self.closest = [_closest(chunk, n, d, c)
                        for chunk, n, d in zip(self.chunks, self.norms, self.closest)]
        return self._totals()

    def pick(self, i, u):
        return _pick(self.chunks[i], self.closest[i], u)

    def assign(self, centers):
        return [_assign_sums(chunk, centers) for chunk in self.chunks]

    def labels(self, centers):
        return [_assign_labels(chunk, centers) for chunk in self.chunks]

    def fill(self, items, centers, c_norms, counts, caps):
        """The fill of chunks ``items`` (consecutive), after the fill counts ``counts``."""
        labels = []
        for i in items:
            mine, counts = _fill_chunk(self.chunks[i], centers, c_norms, counts, caps)
            labels.append(mine)
        return labels, counts


class _ActorSteps:
    """k-means' small steps on one :class:`_RowsActor` per worker (a context manager:
    the actors and the distances they hold are released at its end). The same
    per-chunk functions and the same order of sums as :class:`_TaskSteps`.

    Each actor starts on the worker holding its chunks, or on another if that one
    is gone (Dask then moves the chunks there). A call waits for its answer only
    while the actor's worker runs: a lost worker ends the wait with an error
    (:class:`LostWorker`), upon which :func:`partition_chunks` runs
    k-means again as tasks.
    """

    def __init__(self, rows: DaskRows):
        self.rows, self.driver = rows, rows.driver
        client = self.driver.client
        self.futures = [self.driver.submit("actor", _RowsActor, held, actor=True, **_on(address))
                        for address, _, held in rows.groups]
        try:
            self.actors = self.driver.gather(self.futures)
            where = client.who_has(self.futures)
            self.addresses = [sorted(where.get(f.key, ()))[:1] for f in self.futures]
        except BaseException:
            client.cancel(self.futures)
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.actors = None
        self.driver.client.cancel(self.futures)
        self.futures = None
        return False

    def _result(self, g, pending):
        """The value of a call to actor ``g``, waited for while its worker runs."""
        while True:
            try:
                return pending.result(timeout=ACTOR_POLL_S)
            except TimeoutError:
                address = self.addresses[g]
                if not address or address[0] not in live_workers(self.driver.client):
                    raise LostWorker(
                        f"the Dask worker {address[0] if address else '?'} holding a k-means "
                        "actor was lost") from None

    def _call(self, method, *args, groups=None):
        """``method(*args)`` on the actors of ``groups`` (all: their chunks' results in
        chunk order), all at once, waiting for each."""
        traffic = self.driver.traffic
        traffic.sent += sum(_nbytes(a) for a in args) * len(groups or self.actors)
        if groups is not None:
            values = [self._result(g, getattr(self.actors[g], method)(*args)) for g in groups]
            traffic.gathered += _nbytes(values)
            return values
        pending = [getattr(actor, method)(*args) for actor in self.actors]
        out = [None] * self.rows.n_chunks
        for g, ((_, ks, _), future) in enumerate(zip(self.rows.groups, pending)):
            for k, value in zip(ks, self._result(g, future)):
                out[k] = value
        traffic.gathered += _nbytes(out)
        return out

    def _one(self, method, k, *args):
        g, i = self.rows.where[k]
        return self._call(method, i, *args, groups=[g])[0]

    def row(self, i: int):
        return self._one("row", *self.rows.owner(i))

    def first(self, c):
        return np.array(self._call("first", c))

    def closer(self, c):
        return np.array(self._call("closer", c))

    def pick(self, k: int, u: float):
        return self._one("pick", k, u)

    def values(self, rows) -> np.ndarray:
        return np.stack(rows)

    def assign(self, centers):
        return _unpack(_in_order_sum(self._call("assign", centers)), self.rows.dtype)

    def labels(self, centers):
        return self._call("labels", centers)

    def fill_chain(self, centers, c_norms, counts, caps):
        """The fill, chunk after chunk: one call per run of consecutive chunks on one
        worker, each handed the fill counts after the chunks before it."""
        rows, out = self.rows, []
        for g, run in itertools.groupby(range(rows.n_chunks), key=lambda k: rows.where[k][0]):
            labels, counts = self._call("fill", [rows.where[k][1] for k in run], centers,
                                        c_norms, counts, caps, groups=[g])[0]
            out.extend(labels)
        return out


class ChunkRows:
    """The chunks of a Dask fit as :mod:`gpuml.partition.algorithms` asks for rows.

    A block is a chunk: each step is run by ``steps`` (:class:`_ActorSteps` or
    :class:`_TaskSteps`), one call or task per worker over its chunks, and the
    per-chunk totals and sums come back to the client, added there in chunk
    order. Labels are one host array per chunk. ``seeds`` (optional): rows
    gathered before the split began, by global index (FCFS's centres, see
    :class:`SplitStart`).
    """

    #: every Lloyd shift is read on the client as it comes
    read_lag = 0

    def __init__(self, data: DaskRows, steps, seeds=None):
        self.data, self.steps, self.seeds = data, steps, seeds
        self.n, self.n_features = data.n, data.n_features
        self._assigned = False

    def variance(self) -> float:
        return self.data.variance

    def row(self, i):
        return self.steps.row(i)

    def rows(self, ids):
        ids = np.asarray(ids).tolist()
        if self.seeds is not None and all(i in self.seeds for i in ids):
            return np.stack([self.seeds[i] for i in ids]).astype(self.data.dtype, copy=False)
        return np.concatenate(self.data.gathered(self.data.each(
            "rows", _rows, extra=[(loc,) for loc in self.data.locals_of(ids)])))

    def first(self, c):
        return np.asarray(self.steps.first(c))

    def closer(self, c):
        return np.asarray(self.steps.closer(c))

    def pick(self, block, u):
        return self.steps.pick(block, u)

    def stack(self, rows):
        return self.steps.values(rows)

    def assign(self, centers):
        if self._assigned:  # Lloyd steps after the first assignment
            self.data.driver.traffic.steps += 1
        self._assigned = True
        return self.steps.assign(centers)

    def nearest(self, centers):
        return self.steps.labels(centers)

    def local(self, labels):
        b = self.data.bounds
        return [labels[b[k]: b[k + 1]] for k in range(self.data.n_chunks)]

    def fill(self, centers, counts, caps, rows=None):
        """The greedy fill of every row in order (You 2020, Alg. 3): the labels per chunk.

        The fill is sequential over the rows, so it runs in one place at a time.
        When the n x P distances are no larger than the rows (P <= d), every
        chunk's task computes its block at once and the client gathers them in
        chunk order (batches of at most ``FILL_BATCH_BYTES``) and fills. Otherwise
        the fill runs as a chain along the chunks that hands the next only the P
        fill counts (``steps.fill_chain``: one task per chunk, or on actors one
        call per run of consecutive chunks on one worker); it moves P numbers a
        hop instead of the distances, but pays a round trip a hop, one after
        another. The labels end on the client either way (the placement needs the
        parts' sizes). BKM's fill of chosen rows is not offered over chunks.
        """
        if rows is not None:
            raise ValueError("partition='bkm' does not run on Dask input (its movers are "
                             "the farthest members of over-full parts, a global sort that "
                             "is not written for chunks)")
        c_norms = squared_norms(centers)
        data = self.data
        if not fills_on_client(len(caps), data.n_features):
            return self.steps.fill_chain(centers, c_norms, counts, caps)
        itemsize = np.dtype(data.dtype).itemsize
        P = len(caps)
        if data.n * P * itemsize <= FILL_BATCH_BYTES:
            # All the distances at once: one task per worker.
            blocks = data.gathered(data.each("distances", _distances, centers, c_norms))
            return [fill_nearest_open(D, counts, caps) for D in blocks]
        futures = [data.one("distances", _distances, k, centers, c_norms)
                   for k in range(data.n_chunks)]
        sizes = np.diff(data.bounds).tolist()
        labels, batch, size = [], [], 0
        for k, future in enumerate(futures):
            batch.append(future)
            size += sizes[k] * P * itemsize
            if size >= FILL_BATCH_BYTES or k == len(futures) - 1:
                for D in data.driver.gather(batch):
                    labels.append(fill_nearest_open(D, counts, caps))
                batch, size = [], 0
        return labels


class SplitStart:
    """A split begun before the chunk summaries are gathered (see :func:`load_rows`).

    FCFS draws its seed rows first and needs nothing from the summaries, so each
    chunk's summary task returns the seeds it holds; the other splits start nothing
    early. :func:`partition_chunks` then runs the split with the same generator,
    which draws the same seeds again and finds their rows here.
    """

    def __init__(self, n_partitions, method, random_state):
        self.P, self.method = int(n_partitions), method
        self.rng = check_random_state(random_state)
        self.ids = self.rows = None

    def seeds(self, data) -> list | None:
        """Each chunk's local indices of the rows wanted early, or None (nothing wanted)."""
        if self.method != "fcfs" or self.P == 1:
            return None
        state = self.rng.get_state()
        self.ids = fcfs_seeds(data.n, self.P, self.rng)
        self.rng.set_state(state)
        return data.locals_of(self.ids)

    def receive(self, blocks):
        self.rows = dict(zip(self.ids.tolist(), np.concatenate(blocks)))


def partition_chunks(data: DaskRows, n_partitions, method, random_state, *,
                     max_iter=LLOYD_MAX_ITER, tol=LLOYD_TOL, start: SplitStart | None = None):
    """Step 2: ``(labels per chunk, centers)``, as :func:`gpuml.partition.partition`.

    The algorithms of :mod:`gpuml.partition.algorithms` over :class:`ChunkRows`,
    with the same random draws. The labels are arrays on the client (the
    placement needs the parts' sizes, and the model every row's part). Apart
    from k-means, ``centers`` is None: the centres are the parts' means, which
    the fit tasks sum from the rows they hold (:func:`ship_and_fit`).

    k-means++ and the Lloyd steps are a chain of small exchanges (41 for BKRR2
    P=16 on California housing), so k-means and K-balance run on one Dask actor
    per worker (:class:`_RowsActor`, called from the client without the
    scheduler's round trip of a task), and so does K-balance's fill chain. If an
    actor's worker is lost, the split runs again from the same draws as tasks,
    which Dask retries like every other step.

    With one part no clustering runs (the centre is the mean), as in-process.
    """
    if method not in PARTITIONERS:
        raise ValueError(f"partition method must be one of {sorted(PARTITIONERS)}, got {method!r}")
    if method not in DASK_PARTITIONERS:
        raise ValueError(f"partition={method!r} does not run on Dask input; use one of "
                         f"{list(DASK_PARTITIONERS)} (BKM moves the farthest members of "
                         "over-full parts, a global sort that is not written for chunks)")
    if n_partitions == 1:
        labels = [np.zeros(int(b - a), dtype=np.int64)
                  for a, b in zip(data.bounds[:-1], data.bounds[1:])]
        return labels, data.col_mean.astype(data.dtype).reshape(1, -1)
    rng = start.rng if start is not None else check_random_state(random_state)
    split = SPLITS[method]
    kwargs = dict(max_iter=max_iter, tol=tol)
    if method in ("kmeans", "kbalance"):
        state = rng.get_state()
        try:
            with _ActorSteps(data) as steps:
                return split(ChunkRows(data, steps), n_partitions, rng, **kwargs)
        except LostData:
            raise
        except Exception as err:  # an actor's worker lost, or no actor could start
            warnings.warn(f"k-means on Dask actors failed ({type(err).__name__}: {err}); "
                          "running it again as tasks", RuntimeWarning, stacklevel=3)
            rng.set_state(state)
            data.driver.traffic.steps = 0
    seeds = start.rows if start is not None else None
    return split(ChunkRows(data, _TaskSteps(data), seeds=seeds), n_partitions, rng, **kwargs)


# ---------------------------------------------------------------------------------------
# steps 3-5: ship, fit, gather
# ---------------------------------------------------------------------------------------
def _take_parts(chunk, labels, part_ids, classes):
    """The rows of each of ``part_ids`` in this chunk, ascending: ``[(X, y, w), ...]``.

    ``classes``: None, or ``(classes, class_weight, C)`` for a classifier: ``y``
    becomes class indices and ``w`` the per-row C (:func:`_with_classes`).
    """
    if classes is not None:
        chunk = _with_classes(chunk, *classes)
    out = []
    for p in part_ids:
        sel = np.flatnonzero(labels == p)
        out.append((chunk.X[sel], chunk.y[sel], None if chunk.w is None else chunk.w[sel]))
    return out


def _group_rows(pieces, n_parts):
    """The pieces of each part, chunk after chunk, laid end to end part after part."""
    per_part = [[piece[j] for piece in pieces] for j in range(n_parts)]
    X = np.concatenate([b[0] for blocks in per_part for b in blocks])
    y = np.concatenate([b[1] for blocks in per_part for b in blocks])
    w = (None if pieces[0][0][2] is None else
         np.concatenate([b[2] for blocks in per_part for b in blocks]))
    sizes = [sum(b[0].shape[0] for b in blocks) for blocks in per_part]
    ends = np.cumsum(sizes)
    local = [np.arange(hi - m, hi) for m, hi in zip(sizes, ends.tolist())]
    return X, y, w, local


def _group_sums(pieces, n_parts):
    """The group's per-part row sums and counts (packed as :func:`_pack`), over the chunks.

    Each chunk's sums are the ones :func:`part_sums` gives on the whole chunk (its
    rows of a part, in order) and they are added in chunk order, so the parts' means
    have the bits of summing every chunk's sums on the client, without that pass.
    """
    packs = []
    for piece in pieces:
        X = np.concatenate([b[0] for b in piece])
        labels = np.repeat(np.arange(n_parts), [b[0].shape[0] for b in piece])
        packs.append(_pack(*part_sums(X, labels, n_parts)))
    return _in_order_sum(packs)


def _cut(chunks, labels, part_ids, classes):
    """:func:`_take_parts` for each of a worker's chunks; ``labels``: theirs, end to end."""
    ends = np.cumsum([c.X.shape[0] for c in chunks])
    return [_take_parts(c, labels[e - c.X.shape[0]: e], part_ids, classes)
            for c, e in zip(chunks, ends.tolist())]


def _take(chunks, labels, part_ids, classes):
    """The rows a group of parts takes from this worker's chunks, packed to travel.

    :func:`_cut`'s pieces laid end to end, chunk after chunk and part after part,
    as ``(X, y, w, counts)`` with ``counts[i, j]`` the rows of part j in chunk i:
    three arrays on the wire however many chunks and parts (:func:`_unpack_take`).
    """
    pieces = _cut(chunks, labels, part_ids, classes)
    flat = [b for piece in pieces for b in piece]
    counts = np.array([[b[0].shape[0] for b in piece] for piece in pieces], dtype=np.int64)
    w = None if flat[0][2] is None else np.concatenate([b[2] for b in flat])
    return (np.concatenate([b[0] for b in flat]), np.concatenate([b[1] for b in flat]), w,
            counts)


def _unpack_take(packed):
    """:func:`_take`'s pieces again, as views of its arrays."""
    X, y, w, counts = packed
    ends = np.cumsum(counts.ravel()).tolist()
    flat = [(X[a:b], y[a:b], None if w is None else w[a:b])
            for a, b in zip([0] + ends[:-1], ends)]
    P = counts.shape[1]
    return [flat[i * P: (i + 1) * P] for i in range(counts.shape[0])]


def _pieces(part_ids, classes, sources):
    """A group's rows, per chunk in chunk order (:func:`_take_parts`' pieces).

    ``sources``: one ``(ks, chunks, labels, taken)`` per worker holding chunks:
    ``taken``, what a task on that worker took (:func:`_take`: the rows that move),
    or None for this worker's own chunks, cut here from ``chunks`` by ``labels``.
    """
    pieces = {}
    for ks, chunks, labels, taken in sources:
        pieces.update(zip(ks, _cut(chunks, labels, part_ids, classes) if taken is None
                          else _unpack_take(taken)))
    return [pieces[k] for k in sorted(pieces)]


def _fit_svm_group(estimator, part_ids, classes, sources):
    """CA-SVM parts of one group on this worker (its GPU when it has one), their sums and
    this worker's address."""
    pieces = _pieces(part_ids, classes, sources)
    X, y_idx, sample_C, local = _group_rows(pieces, len(part_ids))
    backend = resolve(estimator.device)
    with backend.use():
        fits = estimator._fit_parts(backend.asarray(X), local, y_idx, sample_C)
    return fits, _group_sums(pieces, len(part_ids)), get_worker().address


def _fit_krr_group(estimator, part_ids, classes, sources):
    """Kernel ridge parts of one group on this worker, checked against its memory first
    (the fits, their sums and this worker's address)."""
    from ..estimators.bkrr import KRRPartFit

    pieces = _pieces(part_ids, classes, sources)
    X, y, _, local = _group_rows(pieces, len(part_ids))
    backend = resolve(estimator.device)
    sizes = np.array([len(r) for r in local], dtype=np.int64)
    with backend.use():
        estimator._check_memory(sizes, X.dtype.itemsize, backend)
        fits = estimator._fit_parts(backend, backend.asarray(X), backend.asarray(y), local,
                                    estimator.sigma, estimator.lam, part_ids=part_ids)
    return ([KRRPartFit(to_numpy(f.X), to_numpy(f.dual_coef), to_numpy(f.intercept))
             for f in fits], _group_sums(pieces, len(part_ids)), get_worker().address)


def live_workers(client) -> dict:
    """The running workers, ``{address: info}``, as the scheduler answers now.

    Asked of the scheduler directly: ``client.scheduler_info()`` returns the
    client's cached copy, which distributed's periodic refresh (without
    per-worker entries) may replace between the call and its return.
    """
    info = client.sync(client.scheduler.identity, n_workers=-1)
    return {a: w for a, w in info.get("workers", {}).items()
            if w.get("status", "running") == "running"}


def _workers(client):
    """Worker addresses (sorted) and the smallest memory budget among them (None: no limit).

    The budget is ``memory_limit`` times the fraction at which a worker pauses
    (``distributed.worker.memory.pause``, 0.8 by default; at 0.95 the nanny
    kills it): unmanaged memory such as a solver's kernel blocks counts there.
    """
    info = live_workers(client)
    if not info:
        raise RuntimeError("the Dask cluster has no running workers: start some "
                           "(cluster.scale(n)) or wait for them (client.wait_for_workers(n))")
    addresses = sorted(info)
    limits = [int(info[a].get("memory_limit") or 0) for a in addresses]
    fraction = dask.config.get("distributed.worker.memory.pause", 0.8) or \
        dask.config.get("distributed.worker.memory.terminate", 0.95) or 1.0
    budget = None if not all(limits) else int(min(limits) * float(fraction))
    return addresses, budget


def _fmt_bytes(n) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_budget(need, sizes, n, budget, what):
    """Refuse a fit whose largest group of parts needs more than a worker's budget.

    ``need(sizes)`` estimates the bytes one worker holds for parts of these
    sizes; the message names the smallest ``n_partitions`` whose balanced
    parts fit by the same estimate.
    """
    if budget is None:
        return
    sizes = np.asarray(sizes, dtype=np.int64)
    needed = need(sizes)
    if needed <= budget:
        return
    suggest = next((P for P in _candidates(len(sizes), n)
                    if need(np.array([-(-n // P)], dtype=np.int64)) <= budget), None)
    change = (f"use a larger n_partitions (n_partitions>={suggest} should fit)" if suggest
              else "use workers with more memory")
    raise MemoryError(
        f"{what} needs about {_fmt_bytes(needed)} on one Dask worker (a part of "
        f"{int(sizes.max())} rows: its rows and kernel block), but the smallest worker's "
        f"budget is {_fmt_bytes(budget)} (memory_limit x distributed.worker.memory.pause); "
        f"{change}, or workers with a larger memory_limit")


def _candidates(P, n):
    """n_partitions values above P to suggest, doubling then n itself."""
    Q = max(P, 1) + 1
    while Q < n:
        yield Q
        Q = max(Q + 1, int(Q * 1.25))
    yield n


def _svm_need(estimator, d):
    """Bytes a worker holds to fit CA-SVM parts of these sizes: rows, and each part's kernel.

    The CPU SMO keeps a part's whole kernel matrix when it fits in
    ``cache_size``, else a row cache of at most ``cache_size``, one part per
    solver thread at a time (``n_jobs``); a GPU worker's
    device memory is checked by the solver itself.
    """
    cache = float(estimator.cache_size) * 2**20
    jobs = effective_n_jobs(estimator.n_jobs)

    def need(sizes):
        m = sizes.astype(np.float64)
        # one matrix per solver thread at a time (gpuml.kernels.smo_solve_batch)
        blocks = np.sort(np.minimum(8.0 * m**2, cache))[::-1][:max(1, jobs)]
        return int((8.0 * m * (d + 2)).sum() + blocks.sum())

    return need


def _krr_need(estimator, d, itemsize):
    """Bytes a worker holds to fit kernel ridge parts: rows and targets, plus the solve's blocks."""
    jobs = effective_n_jobs(estimator.n_jobs)

    def need(sizes):
        concurrent = max(1, min(jobs, sizes.size))
        blocks = int((np.sort(sizes)[::-1][:concurrent].astype(np.float64) ** 2).sum())
        return int(itemsize * (sizes.sum() * (d + 2) + blocks))

    return need


def ship_and_fit(rows, labels, sizes, costs, group_fn, estimator, addresses, centers, *,
                 classes=None):
    """Steps 3-4: parts placed on workers by cost; each group's rows shipped and fitted there.

    Returns the per-part fits in part order (gathered), the worker each part was
    fitted on (where its task ran, which is not the planned one when that worker
    was lost) and the centres: ``centers`` as given, or when None the parts' means from the sums the
    fit tasks return with the fits (no pass of their own). ``classes``: see
    :func:`_take_parts`.
    """
    driver = rows.driver
    P = len(sizes)
    # held[p, a]: the rows of part p that worker a holds already
    held_rows = np.zeros((P, len(addresses)), dtype=np.int64)
    group_labels = []
    for holder, ks, _ in rows.groups:
        mine = np.concatenate([labels[k] for k in ks])
        group_labels.append(mine)
        if holder in addresses:
            held_rows[:, addresses.index(holder)] += np.bincount(mine, minlength=P)
    placement = balance_local(costs, held_rows)
    driver.traffic.rows_moved = int(sum(held_rows[ids].sum() - held_rows[ids, a].sum()
                                        for a, ids in enumerate(placement)))
    # The fit task cuts the group's rows out of its own worker's chunks; a take task on
    # each other worker holding some of them cuts them out of its chunks. Every take is
    # submitted before any fit, and ahead of them in each worker's queue: a worker that
    # starts its own fit first keeps the other waiting for its rows until that fit ends.
    groups = []
    for address, ids in zip(addresses, placement):
        if ids.size == 0:
            continue
        ids_list = ids.tolist()
        sources = []
        for (holder, ks, held), mine in zip(rows.groups, group_labels):
            if holder == address:
                sources.append((ks, held, mine, None))
            elif np.isin(mine, ids).any():
                take = driver.submit("take", _take, held, mine, ids_list, classes,
                                     priority=1, **_on(holder))
                sources.append((ks, None, None, take))
        groups.append((ids_list, address, sources))
    futures = [driver.submit("fit-parts", group_fn, estimator, ids, classes, sources,
                             **_on(address))
               for ids, address, sources in groups]
    results = driver.gather(futures, as_they_finish=True)
    fits = [None] * len(sizes)
    part_worker = [None] * len(sizes)
    sums = None
    for (ids, _, _), (group, pack, address) in zip(groups, results):
        if sums is None:
            sums = np.zeros((len(sizes), pack.shape[1]), dtype=np.float64)
        sums[ids] = pack
        for p, fit in zip(ids, group):
            fits[p] = fit
            part_worker[p] = address
    if centers is None:
        centers = divide(*_unpack(sums, rows.dtype))
    return fits, part_worker, centers


def fit_casvm(estimator, X, y, sample_weight=None):
    """``CASVMClassifier.fit`` on Dask input (see the module notes); returns the estimator."""
    if estimator.kernel == "precomputed" or callable(estimator.kernel):
        raise ValueError(f"kernel={estimator.kernel!r} does not run on Dask input: "
                         "partitioning and routing need the samples' features")
    if estimator.probability not in ("deprecated", False):
        raise ValueError("probability=True does not run on Dask input: fit "
                         "CalibratedClassifierCV(CASVMClassifier(...)) on in-memory data, or "
                         "leave probability unset")
    if estimator.devices is not None:
        raise ValueError("devices= is for several devices of one process; on Dask each worker "
                         "fits its parts on its own device: leave devices=None")
    if estimator.method != "casvm":
        raise ValueError(f"method={estimator.method!r} does not run on Dask input (its layers "
                         "depend on each other): use method='casvm' or in-memory data")
    if y is None:
        raise ValueError("requires y to be passed, but the target y is None")
    client = _client()
    check_features(estimator, X, reset=True)
    X, y, w = check_dask_input(X, y, sample_weight)
    n, d = X.shape
    P = check_n_partitions(estimator.n_partitions, n)
    addresses, budget = _workers(client)
    need = _svm_need(estimator, d)
    check_budget(need, [-(-n // P)], n, budget, "CASVMClassifier")
    driver = _Driver(client)
    estimator._dask_traffic = driver.traffic
    split = SplitStart(P, estimator._split_method(), estimator.random_state)
    rows = load_rows(driver, X, y, w, dtype=np.float64, classification=True, split=split)
    classes = rows.classes
    if len(classes) < 2:
        raise ValueError(f"CASVMClassifier needs samples of at least two classes in y (the "
                         f"number of classes has to be greater than one; got {len(classes)} "
                         "class)")
    if classes.dtype.kind == "f" and np.any(classes != np.round(classes)):
        raise ValueError("Unknown label type: continuous. Maybe you are trying to fit a "
                         "classifier, which expects discrete classes on a regression target "
                         "with continuous values.")
    estimator.classes_ = classes
    y_for_weights = np.repeat(classes, rows.class_counts)
    cw = compute_class_weight(estimator.class_weight, classes=classes, y=y_for_weights)
    estimator.class_weight_ = cw
    estimator._sparse = False  # chunks are dense: dual_coef_ is dense, as SVC's after a dense fit
    estimator.shape_fit_ = (int(n), int(d))
    estimator._calibrated = None
    if estimator.kernel == "linear":
        gamma = 1.0
    elif estimator.gamma == "scale":
        gamma = 1.0 / (d * rows.variance_all) if rows.variance_all > 0 else 1.0
    elif estimator.gamma == "auto":
        gamma = 1.0 / d
    else:
        gamma = float(estimator.gamma)
    estimator._kernel = Kernel(estimator.kernel, gamma, int(estimator.degree),
                               float(estimator.coef0))
    estimator._gamma = gamma
    for name in ("devices_", "part_device_", "_device_cache"):
        estimator.__dict__.pop(name, None)
    estimator.partition_ = split.method
    labels, centers = partition_chunks(rows, P, split.method, estimator.random_state,
                                       start=split)
    all_labels = np.concatenate(labels).astype(np.int64)
    y_idx = np.searchsorted(classes, rows.y).astype(np.int64)
    sizes = np.bincount(all_labels, minlength=P).astype(np.int64)
    check_budget(need, sizes, n, budget, "CASVMClassifier")
    fits, part_worker, centers = ship_and_fit(rows, labels, sizes, smo_cost(sizes),
                                              _fit_svm_group, _shipped(estimator), addresses,
                                              centers, classes=(classes, cw, float(estimator.C)))
    parts = Partitioning.from_labels(all_labels, centers, P)
    estimator._assemble(parts, fits, y_idx)
    estimator.part_worker_ = np.asarray(part_worker, dtype=object)
    return estimator


def fit_bkrr(estimator, X, y, sample_weight=None):
    """``BKRRRegressor.fit`` on Dask input (see the module notes); returns the estimator."""
    from ..estimators.bkrr import _n_partitions

    if sample_weight is not None:
        raise ValueError("sample_weight is not supported on Dask input for BKRRRegressor yet: "
                         "fit on in-memory data, or without weights")
    if estimator.kernel == "precomputed":
        raise ValueError("kernel='precomputed' does not run on Dask input: partitioning and "
                         "routing need the samples' features")
    if estimator.devices is not None:
        raise ValueError("devices= is for several devices of one process; on Dask each worker "
                         "fits its parts on its own device: leave devices=None")
    if y is None:
        raise ValueError("requires y to be passed, but the target y is None")
    client = _client()
    check_features(estimator, X, reset=True)
    X, y, _ = check_dask_input(X, y, multi_output=True)
    n, d = X.shape
    dtype = np.dtype(estimator.dtype) if estimator.dtype is not None else (
        np.dtype(np.float32) if X.dtype == np.float32 and y.dtype == np.float32
        else np.dtype(np.float64))
    P = _n_partitions(estimator.n_partitions, n)
    addresses, budget = _workers(client)
    need = _krr_need(estimator, d, dtype.itemsize)
    check_budget(need, [-(-n // P)], n, budget, "BKRRRegressor")
    driver = _Driver(client)
    estimator._dask_traffic = driver.traffic
    rows = load_rows(driver, X, y, None, dtype=dtype, classification=False)
    for name in ("devices_", "part_device_", "_device_cache"):
        estimator.__dict__.pop(name, None)
    sigma, lam = _krr_width_and_lam(estimator, X, y, dtype)
    labels, centers = partition_chunks(rows, P, estimator.partition, estimator.random_state)
    all_labels = np.concatenate(labels).astype(np.int64)
    sizes = np.bincount(all_labels, minlength=P).astype(np.int64)
    check_budget(need, sizes, n, budget, "BKRRRegressor")
    shipped = _shipped(estimator)
    # the workers solve with the resolved numbers, not "scale" / "auto"
    shipped.sigma, shipped.lam, shipped.gamma = sigma, lam, _resolved_gamma(estimator)
    fits, part_worker, centers = ship_and_fit(rows, labels, sizes, cholesky_cost(sizes, d),
                                              _fit_krr_group, shipped, addresses, centers)
    parts = Partitioning.from_labels(all_labels, centers, P)
    estimator._store_fit(CPU, parts, fits, sigma, lam)
    estimator.part_worker_ = np.asarray(part_worker, dtype=object)
    return estimator


def _krr_width_and_lam(estimator, X, y, dtype):
    """BKRR's σ and λ as numbers on Dask input: ``"scale"`` and ``"auto"`` resolved.

    ``sigma="scale"`` needs the variance of all of X (one pass over the
    chunks); ``lam="auto"`` the rows of the fixed subsample
    (``AUTO_LAM_SAMPLES``), gathered here and searched as in memory.
    """
    from ..estimators.bkrr import AUTO_LAM_SAMPLES, scale_gamma

    needs_scale = estimator.gamma == "scale" or (estimator.gamma is None
                                                 and estimator.sigma == "scale")
    sigma = estimator.sigma
    if needs_scale:
        gamma = float(scale_gamma(_VarianceOf(X)))
        sigma = 1.0 / np.sqrt(2.0 * gamma)
    elif sigma == "scale":
        sigma = 1.0
    if estimator.lam != "auto":
        return float(sigma), float(estimator.lam)
    n = X.shape[0]
    rows = np.arange(n)
    if n > AUTO_LAM_SAMPLES:
        rows = np.sort(np.random.default_rng(0).choice(n, AUTO_LAM_SAMPLES, replace=False))
    Xs = np.asarray(X[rows].compute(), dtype=dtype)
    ys = np.asarray(y[rows].compute(), dtype=dtype)
    lam = estimator._resolve_lam(CPU, Xs, ys, None, float(sigma))
    return float(sigma), lam


class _VarianceOf:
    """A stand-in for a Dask array in :func:`scale_gamma`: its variance and width, computed."""

    def __init__(self, X):
        self.shape = X.shape
        self._var = X.var()

    def var(self):
        return float(self._var.compute())


def _resolved_gamma(estimator):
    """The ``gamma`` the workers see: "scale" is carried by the resolved σ."""
    return None if estimator.gamma == "scale" else estimator.gamma


def _shipped(estimator):
    """The estimator as the fit tasks need it: parameters and resolved kernel, no fitted arrays."""
    import copy

    clone = copy.copy(estimator)
    clone.__dict__.pop("_dask_traffic", None)
    for name in list(clone.__dict__):
        # shape_fit_: the parts' C scale (CA-SVM's part_C) needs the whole set's size.
        if name.endswith("_") and name not in ("classes_", "n_features_in_", "shape_fit_"):
            del clone.__dict__[name]
    return clone


# ---------------------------------------------------------------------------------------
# lazy prediction
# ---------------------------------------------------------------------------------------
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
    check_features(estimator, X, reset=False)
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
    classifier = is_classifier(estimator)
    if not is_dask(y, sample_weight):
        y_pred = predicted.compute()
        metric = accuracy_score if classifier else r2_score
        return float(metric(y, y_pred, sample_weight=sample_weight))
    blocks = predicted.to_delayed().ravel().tolist()
    targets = _blocks_like(y, predicted, "y")
    weights = (_blocks_like(sample_weight, predicted, "sample_weight")
               if sample_weight is not None else [None] * len(blocks))
    stats = dask.compute(*[dask.delayed(_score_sums)(p, t, w, classifier)
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


__all__ = [
    "DASK_PARTITIONERS",
    "KEY_PREFIX",
    "LostData",
    "LostWorker",
    "DaskRows",
    "Traffic",
    "check_dask_input",
    "check_features",
    "fit_bkrr",
    "fit_casvm",
    "live_workers",
    "is_dask",
    "partition_chunks",
    "predict_blocks",
    "score",
]
