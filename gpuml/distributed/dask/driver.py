"""The client side of a Dask fit: tasks submitted and gathered, bytes counted, workers named.

Every wait here ends: a task is retried by Dask when its worker dies (and gives
up after ``distributed.scheduler.allowed-failures``), and input that Dask cannot
compute again ends the fit with :class:`LostData`, naming the worker lost.
"""

from __future__ import annotations

import contextlib
import pickle
import uuid
from dataclasses import dataclass

import dask
import numpy as np
from distributed import KilledWorker, as_completed, futures_of, get_client, wait
from distributed.utils import CancelledError

#: Task keys start with this, then the step; tests and dashboards find gpuml's tasks by it.
KEY_PREFIX = "gpuml"


class LostWorker(RuntimeError):
    """The Dask worker running a k-means actor was lost (k-means then runs as tasks)."""


class LostData(RuntimeError):
    """A Dask worker was lost holding input rows that Dask cannot compute again."""


#: the lists :func:`counting` fills, one per open ``with`` block
_counting: list = []


@contextlib.contextmanager
def counting():
    """What the Dask fits inside the block sent and gathered: ``with counting() as fits:``
    collects one :class:`Traffic` per fit, in order (for benchmarks and tests)."""
    fits = []
    _counting.append(fits)
    try:
        yield fits
    finally:
        _counting.remove(fits)


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


class Driver:
    """The client side of a fit: submits tasks, gathers small results, counts bytes."""

    def __init__(self, client):
        self.client = client
        self.token = uuid.uuid4().hex[:8]
        self.traffic = Traffic()
        for fits in _counting:
            fits.append(self.traffic)
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


def current_client():
    try:
        return get_client()
    except ValueError:
        raise ValueError(
            "fitting on Dask input needs a distributed client: create one first "
            "(from distributed import Client; client = Client() or Client(cluster)), or "
            "pass NumPy data (X.compute())") from None


def live_workers(client) -> dict:
    """The running workers, ``{address: info}``, as the scheduler answers now.

    Asked of the scheduler directly: ``client.scheduler_info()`` returns the
    client's cached copy, which distributed's periodic refresh (without
    per-worker entries) may replace between the call and its return.
    """
    info = client.sync(client.scheduler.identity, n_workers=-1)
    return {a: w for a, w in info.get("workers", {}).items()
            if w.get("status", "running") == "running"}


def workers_and_budget(client):
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


def _on(address):
    """Task placement on the worker at ``address`` (None: anywhere); if it is gone the
    scheduler may run the task elsewhere (its inputs then move)."""
    return dict(workers=None if address is None else [address], allow_other_workers=True)


def _in_order_sum(values):
    """float64 arrays added one after another, in the order given (the same bits every time,
    wherever the values were computed)."""
    total = np.array(values[0], dtype=np.float64, copy=True)
    for v in values[1:]:
        total += v
    return total

