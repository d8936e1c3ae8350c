"""The client side of a Dask fit: tasks submitted and gathered, bytes counted, workers named.

Every wait here ends: a task is retried by Dask when its worker dies (and gives
up after ``distributed.scheduler.allowed-failures``), input that Dask cannot
compute again ends the fit with :class:`LostData`, naming the worker lost, and a
fit that makes no progress while a worker stays paused for memory ends with a
:class:`MemoryError` naming it (:data:`PAUSED_GIVE_UP_S`).
"""

from __future__ import annotations

import contextlib
import pickle
import time
import uuid
from dataclasses import dataclass

import dask
import numpy as np
from distributed import KilledWorker, futures_of, get_client, wait
from distributed.utils import CancelledError

#: Task keys start with this, then the step; tests and dashboards find gpuml's tasks by it.
KEY_PREFIX = "gpuml"

#: Seconds a wait goes on with no task of the fit finishing while a worker is paused for
#: memory (``distributed.worker.memory.pause``) before the fit ends with a MemoryError:
#: a paused worker starts no task until its memory falls, and the memory held by a
#: solver's arrays or by compiled code does not fall by itself.
PAUSED_GIVE_UP_S = 60.0

#: Seconds between the checks of a wait (tasks finished, workers paused).
WAIT_POLL_S = 1.0


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
        """``distributed.wait``, with a lost input named (:meth:`lost_data`) and paused
        workers refused (:meth:`progress`)."""
        try:
            self.progress(futures, first=False)
            wait(futures)
        except CancelledError as err:
            raise self.lost_data(err) from err

    def progress(self, futures, *, first: bool):
        """Wait until every future is done (``first``: until one is), checking every
        :data:`WAIT_POLL_S` seconds; a MemoryError naming the paused workers when none of
        them finishes for :data:`PAUSED_GIVE_UP_S` seconds while a worker is paused.
        Futures that end in an error or are cancelled count as done (the gather that
        follows raises their error)."""
        pending = [f for f in futures if not f.done()]
        stalled = None
        while pending and not (first and len(pending) < len(futures)):
            try:
                wait(pending, timeout=WAIT_POLL_S, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
            left = [f for f in pending if not f.done()]
            if len(left) < len(pending):
                pending, stalled = left, None
                continue
            paused = paused_workers(self.client)
            if not paused:
                stalled = None
                continue
            stalled = stalled or time.monotonic()
            if time.monotonic() - stalled >= PAUSED_GIVE_UP_S:
                self.client.cancel(pending)
                raise MemoryError(_paused_message(paused, len(pending)))

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
                left = list(futures)
                while left:
                    self.progress(left, first=True)
                    done = [f for f in left if f.done()]
                    for future, value in zip(done, self.client.gather(done)):
                        values[where[future.key]] = value
                    gathered = {f.key for f in done}
                    left = [f for f in left if f.key not in gathered]
            else:
                self.progress(futures, first=False)
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


def compute(*collections):
    """``dask.compute``, on the current client through a :class:`Driver`'s wait (a worker
    paused for memory ends it with a MemoryError, not a wait without end)."""
    try:
        client = get_client()
    except ValueError:
        return dask.compute(*collections)
    return Driver(client).gather(client.compute(list(collections)))


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


def _workers(client, status) -> dict:
    """The workers of a status (``"running"``, ``"paused"``), ``{address: info}``, as the
    scheduler answers now.

    Asked of the scheduler directly: ``client.scheduler_info()`` returns the
    client's cached copy, which distributed's periodic refresh (without
    per-worker entries) may replace between the call and its return.
    """
    info = client.sync(client.scheduler.identity, n_workers=-1)
    return {a: w for a, w in info.get("workers", {}).items()
            if w.get("status", "running") == status}


def live_workers(client) -> dict:
    """The running workers, ``{address: info}``, as the scheduler answers now."""
    return _workers(client, "running")


def paused_workers(client) -> dict:
    """The workers paused for memory now, ``{address: info}``."""
    return _workers(client, "paused")


def fmt_bytes(n) -> str:
    """A size for a message: GiB from 1 GiB up, MiB below."""
    n = float(n or 0)
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


#: How a worker's memory budget is made, for the messages that name one.
BUDGET_RULE = "memory_limit x distributed.worker.memory.pause, less the worker's own memory"


def _paused_message(paused, n_waiting) -> str:
    fraction = dask.config.get("distributed.worker.memory.pause", 0.8)
    where = "; ".join(f"{a} at {fmt_bytes(w.get('metrics', {}).get('memory'))} of its "
                      f"memory_limit {fmt_bytes(w.get('memory_limit'))}"
                      for a, w in sorted(paused.items()))
    waited = ("no worker is running" if n_waiting is None else
              f"none of the {n_waiting} waiting tasks finished for {PAUSED_GIVE_UP_S:.0f} s "
              "(they are cancelled)")
    return (
        f"Dask workers paused for memory ({where}) and {waited}: a worker pauses at "
        f"distributed.worker.memory.pause ({fraction}) of its memory_limit and starts no task "
        "until its memory falls, which a solver's arrays and compiled code do not. Give the "
        "workers a larger memory_limit (a worker holds about 0.5 GB once gpuml has fitted "
        "there, before any data), or more workers for the same data, or a larger "
        "n_partitions for smaller parts")


#: Memory a worker holds besides the data once gpuml has fitted there (its libraries and
#: compiled code), at the least, in its budget; docs/scale.md, "Past one machine", says how
#: to size workers for it.
WORKER_BASE_BYTES = 512 * 2**20


def workers_and_budget(client):
    """Worker addresses (sorted) and the smallest memory budget among them (None: no limit).

    The budget is ``memory_limit`` times the fraction at which a worker pauses
    (``distributed.worker.memory.pause``, 0.8 by default; at 0.95 the nanny
    kills it; unmanaged memory such as a solver's kernel blocks counts there),
    less what the worker holds besides Dask's data: its memory now less its
    managed bytes, at least :data:`WORKER_BASE_BYTES`.
    """
    info = live_workers(client)
    if not info:
        paused = paused_workers(client)
        if paused:
            raise MemoryError(_paused_message(paused, None))
        raise RuntimeError("the Dask cluster has no running workers: start some "
                           "(cluster.scale(n)) or wait for them (client.wait_for_workers(n))")
    addresses = sorted(info)
    limits = [int(info[a].get("memory_limit") or 0) for a in addresses]
    fraction = dask.config.get("distributed.worker.memory.pause", 0.8) or \
        dask.config.get("distributed.worker.memory.terminate", 0.95) or 1.0
    if not all(limits):
        return addresses, None

    def own(a):
        metrics = info[a].get("metrics", {})
        held = int(metrics.get("memory") or 0) - int(metrics.get("managed_bytes") or 0)
        return max(WORKER_BASE_BYTES, held)

    budget = min(int(limit * float(fraction)) - own(a) for a, limit in zip(addresses, limits))
    return addresses, max(budget, 0)


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

