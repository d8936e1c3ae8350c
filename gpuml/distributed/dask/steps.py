"""The partitioners of :mod:`gpuml.partition` over the chunks of a Dask fit.

The algorithms are :mod:`gpuml.partition.algorithms`'; :class:`ChunkRows`
answers their steps over the chunks held on the workers, each step one task
per worker (:class:`_TaskSteps`: what Dask retries) or one call of a Dask actor
per worker (:class:`_ActorSteps`: no scheduler round trip), the per-chunk
results added on the client in chunk order. :func:`partition_chunks` runs them.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
from sklearn.utils import check_random_state

from ...kernels import OpenDistances, fill_nearest_open, nearest_centres, row_blocks
from ...kernels.pairwise import shifted_sq_distances, squared_norms
from ...partition import PARTITIONERS, SPLITS, LocalRows, fcfs_seeds
from .data import DaskRows, _rows
from .driver import LostData, LostWorker, _in_order_sum, _nbytes, _on, live_workers

#: Lloyd's k-means over chunks: at most this many steps, stopping when the centres move
#: less than this fraction of the data's variance (as :func:`gpuml.partition.partition`).
LLOYD_MAX_ITER, LLOYD_TOL = 100, 1e-4

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


#: The greedy fill gathers the distance blocks of consecutive chunks up to this many
#: bytes at a time (the client's memory for them).
FILL_BATCH_BYTES = 256 * 2**20


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


def _fill_chunk(chunk, centers, counts, caps):
    """The greedy fill of the chunk's rows, in order, after the chunks before it.

    ``counts`` are the parts' fill counts after the previous chunks; returns
    this chunk's labels and the counts after it.
    """
    counts = np.array(counts, dtype=np.int64, copy=True)
    X = chunk.X
    labels = np.empty(X.shape[0], dtype=np.int64)
    distances = OpenDistances(centers)
    for start, stop in row_blocks(X.shape[0], centers.shape[0]):
        D = distances(X[start:stop], counts, caps)
        labels[start:stop] = fill_nearest_open(D, counts, caps,
                                               entries=X.shape[0] * centers.shape[0])
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

    def fill_chain(self, centers, counts, caps):
        """The fill, chunk after chunk: one task per chunk, handed the P fill counts after
        the chunks before it (the labels stay until the end)."""
        rows, states = self.rows, []
        for k in range(rows.n_chunks):
            state = rows.one("fill", _fill_chunk, k, centers, counts, caps)
            # Only the P counts go on to the next chunk's worker; the labels stay.
            counts = rows.driver.submit("fill-counts", _counts_of, state)
            states.append(state)
        # The labels come back with the last counts of each chunk (P numbers more).
        return [labels for labels, _ in rows.driver.gather(states)]


class _RowsActor:
    """A worker's chunks for k-means' small steps, as a Dask actor.

    Made on the worker holding them (the chunks are not copied); the client calls
    its methods directly, each call one message to the worker and one back, a
    fraction of the cost of a round of tasks: submit, schedule, run, report, gather
    (measured: bench/results/cpu-2core/dask-runs.md). The distances to the nearest
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

    def fill(self, items, centers, counts, caps):
        """The fill of chunks ``items`` (consecutive), after the fill counts ``counts``."""
        labels = []
        for i in items:
            mine, counts = _fill_chunk(self.chunks[i], centers, counts, caps)
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

    def fill_chain(self, centers, counts, caps):
        """The fill, chunk after chunk: one call per run of consecutive chunks on one
        worker, each handed the fill counts after the chunks before it."""
        rows, out = self.rows, []
        for g, run in itertools.groupby(range(rows.n_chunks), key=lambda k: rows.where[k][0]):
            labels, counts = self._call("fill", [rows.where[k][1] for k in run], centers,
                                        counts, caps, groups=[g])[0]
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

    def sample(self, ids):
        """The global rows ``ids`` gathered to the client (one task per worker), as rows of
        this process."""
        return LocalRows(self.rows(ids))

    def stack_centers(self, centers):
        return np.ascontiguousarray(centers, dtype=self.data.dtype)

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
        data = self.data
        if not fills_on_client(len(caps), data.n_features):
            return self.steps.fill_chain(centers, counts, caps)
        c_norms = squared_norms(centers)
        itemsize = np.dtype(data.dtype).itemsize
        P = len(caps)
        if data.n * P * itemsize <= FILL_BATCH_BYTES:
            # All the distances at once: one task per worker.
            blocks = data.gathered(data.each("distances", _distances, centers, c_norms))
            return [fill_nearest_open(D, counts, caps, entries=data.n * P) for D in blocks]
        futures = [data.one("distances", _distances, k, centers, c_norms)
                   for k in range(data.n_chunks)]
        sizes = np.diff(data.bounds).tolist()
        labels, batch, size = [], [], 0
        for k, future in enumerate(futures):
            batch.append(future)
            size += sizes[k] * P * itemsize
            if size >= FILL_BATCH_BYTES or k == len(futures) - 1:
                for D in data.driver.gather(batch):
                    labels.append(fill_nearest_open(D, counts, caps, entries=data.n * P))
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

