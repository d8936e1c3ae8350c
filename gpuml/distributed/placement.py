"""Parts over devices, balanced by cost, and one host thread per device.

The parts of a partitioned fit are independent (You 2020, ch. 2-3: no
communication between the local models), so spreading them is a scheduling
problem: give each device a set of parts whose summed cost is as even as
possible, then let each device solve its set as one batch.

Cost model. A part of ``m`` samples costs

* SMO (CA-SVM): ``m^2`` — the part's kernel matrix is ``m^2 d`` to compute and
  ``m^2`` to hold, and SMO takes a number of steps roughly proportional to ``m``,
  each reading an ``O(m)`` kernel row; ``d`` is the same for every part, so it
  does not change the ranking;
* Cholesky (BKRR): ``m^3 / 3 + m^2 d`` — the factorisation plus the Gram matrix
  (here ``d`` decides which term dominates, so it stays).

Balanced partitioners (random, fcfs, kbalance, bkm) make parts that differ by
at most one sample, and any placement of ``ceil(P / R)`` parts per device is
then optimal; the model matters for k-means, whose parts can differ in size by orders of
magnitude (``max_over_min`` in bench/results/cpu-2core/partition.md).
The heuristic is Graham's LPT (largest cost first, each to the least-loaded
device), within 4/3 of the best makespan (R. L. Graham, "Bounds on
multiprocessing timing anomalies", SIAM J. Appl. Math. 17, 1969).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..kernels import parallel_region
from .comm import CommunicatorAborted, communicators


def smo_cost(sizes) -> np.ndarray:
    """Estimated cost of SMO on parts of these sizes: ``m^2`` (see the module notes)."""
    m = np.asarray(sizes, dtype=np.float64)
    return m**2


def cholesky_cost(sizes, n_features: int) -> np.ndarray:
    """Estimated cost of a kernel ridge solve on parts of these sizes: ``m^3/3 + m^2 d``."""
    m = np.asarray(sizes, dtype=np.float64)
    return m**3 / 3.0 + m**2 * float(n_features)


def balance(costs, n_devices: int) -> list[np.ndarray]:
    """Part indices per device by LPT: costliest part first, to the least-loaded device.

    Ties go to the lower part index and the lower device, so the placement is
    deterministic. Each device's parts are returned in ascending order.

    Examples
    --------
    >>> from gpuml.distributed.placement import balance
    >>> [p.tolist() for p in balance([9.0, 1.0, 4.0, 4.0, 1.0], 2)]
    [[0, 4], [1, 2, 3]]
    """
    costs = np.asarray(costs, dtype=np.float64)
    if n_devices < 1:
        raise ValueError(f"need at least one device, got {n_devices}")
    loads = np.zeros(n_devices)
    bins = [[] for _ in range(n_devices)]
    for p in np.argsort(-costs, kind="stable").tolist():
        d = int(np.argmin(loads))
        bins[d].append(p)
        loads[d] += costs[p]
    return [np.array(sorted(b), dtype=np.int64) for b in bins]


#: LPT's placement replaces :func:`balance_local`'s only when its makespan is lower by
#: more than this fraction. The costs are estimates (an SMO part's time scatters around
#: ``m^2``), a row that moves is certain work, and without a margin a negligible gain can
#: move half of all rows (measured: bench/results/cpu-2core/dask-runs.md, "LPT moved half
#: the rows").
LPT_MARGIN = 0.02


def balance_local(costs, held) -> list[np.ndarray]:
    """Part indices per device, balanced by cost, moving as few parts as it can.

    ``held[p, r]``: the rows of part ``p`` device (worker) ``r`` holds already.
    Each part starts on the device holding most of its rows (ties: the lower
    device); then, while the most loaded device has a part whose move to the
    least loaded lowers the larger of their two loads, the part whose cost is
    nearest half their gap moves (ties: the one with fewer rows there, then the
    lower index). When :func:`balance` (LPT, which ignores where rows are) gives a
    makespan lower by more than :data:`LPT_MARGIN`, its placement is returned
    instead. Each device's parts are in ascending order.

    With data spread evenly and parts that lie on one device each (the
    ``"contiguous"`` split), nothing moves; with parts spread over all devices
    (FCFS, K-balance), the rows that move are as with LPT, and each part's
    largest piece stays.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.distributed.placement import balance_local
    >>> held = np.array([[5, 0], [5, 0], [5, 0], [0, 5]])
    >>> [p.tolist() for p in balance_local([1.0, 1.0, 1.0, 1.0], held)]
    [[1, 2], [0, 3]]
    """
    costs = np.asarray(costs, dtype=np.float64)
    held = np.asarray(held)
    n_devices = held.shape[1]
    home = np.argmax(held, axis=1)
    bins = [set(np.flatnonzero(home == r).tolist()) for r in range(n_devices)]
    loads = np.array([costs[sorted(b)].sum() for b in bins])
    while True:
        h, low = int(np.argmax(loads)), int(np.argmin(loads))
        gap = loads[h] - loads[low]
        movable = [p for p in bins[h] if 0 < costs[p] < gap]
        if not movable:
            break
        p = min(movable, key=lambda q: (abs(gap / 2 - costs[q]), held[q, h], q))
        bins[h].remove(p)
        bins[low].add(p)
        loads[h] -= costs[p]
        loads[low] += costs[p]
    local = [np.array(sorted(b), dtype=np.int64) for b in bins]
    lpt = balance(costs, n_devices)
    makespan = [max(costs[b].sum() for b in placement) for placement in (local, lpt)]
    return lpt if makespan[1] < makespan[0] * (1 - LPT_MARGIN) else local


def shard_bounds(n: int, n_shards: int) -> np.ndarray:
    """Row bounds of ``n_shards`` contiguous shards of ``n`` rows (sizes differ by at most one)."""
    return np.array([n * r // n_shards for r in range(n_shards + 1)], dtype=np.int64)


def run_on_devices(fn, backends, *, on_error=None) -> list:
    """``fn(rank, backend)`` for every backend, one host thread each, results in rank order.

    Each call runs with its device current (``backend.use()``, i.e. ``with
    cupy.cuda.Device(g)`` on a GPU). When a call raises, ``on_error(reason)`` is
    called at once (to abort the collectives the other ranks may be blocked in),
    every other call is waited for, and the first error is raised again with a
    note naming its device; errors that only say a collective was aborted
    because of it are not reported over it.
    """
    backends = list(backends)
    failures = []
    lock = threading.Lock()

    def call(rank, backend):
        try:
            # the ranks are the parallelism: n_jobs=None inside each takes one thread
            with backend.use(), parallel_region():
                return fn(rank, backend)
        except BaseException as err:
            with lock:
                failures.append((rank, err))
            if on_error is not None and not isinstance(err, CommunicatorAborted):
                on_error(f"rank {rank} on {backend.device} failed: {type(err).__name__}: {err}")
            raise

    with ThreadPoolExecutor(max_workers=len(backends),
                            thread_name_prefix="gpuml-device") as pool:
        futures = [pool.submit(call, r, b) for r, b in enumerate(backends)]
        for f in futures:
            f.exception()  # wait for all, whatever happened
    if failures:
        primary = [f for f in failures if not isinstance(f[1], CommunicatorAborted)] or failures
        rank, err = primary[0]
        if hasattr(err, "add_note"):
            err.add_note(f"raised on {backends[rank].device} (rank {rank} of {len(backends)})")
        raise err
    return [f.result() for f in futures]


class DeviceGroup:
    """The devices of a multi-device fit, as backends: shards, threads and collectives.

    Parameters
    ----------
    backends : sequence of :class:`gpuml._backend.Backend`
        One rank each: distinct GPUs, or CPU ranks (threads sharing the host).
    timeout : float or None
        Bound in seconds on each wait of the in-process (thread) communicator.
    """

    def __init__(self, backends, timeout: float | None = None):
        self.backends = tuple(backends)
        if not self.backends:
            raise ValueError("a device group needs at least one device")
        self.timeout = timeout

    @property
    def size(self) -> int:
        return len(self.backends)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(b.device for b in self.backends)

    def run(self, fn) -> list:
        """``fn(rank, backend)`` on every device in its own thread (no collectives)."""
        return run_on_devices(fn, self.backends)

    def spmd(self, fn) -> list:
        """``fn(comm, backend)`` on every device in its own thread, with a communicator.

        On a GPU the rank works on a stream of its own (non-blocking), so its
        kernels and collectives are ordered with each other and never wait on
        the legacy default stream. A rank that fails aborts the communicator, so
        the others leave their collectives with :class:`CommunicatorAborted`
        instead of waiting forever.
        """
        with communicators(self.backends, timeout=self.timeout) as comms:

            def abort(reason):
                for c in comms:
                    c.abort(reason)

            def rank(r, backend):
                if not backend.is_gpu:
                    return fn(comms[r], backend)
                stream = backend.xp.cuda.Stream(non_blocking=True)
                with stream:
                    out = fn(comms[r], backend)
                stream.synchronize()
                return out

            return run_on_devices(rank, self.backends, on_error=abort)
