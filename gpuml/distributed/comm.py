"""A small communicator: the collectives that cross a device boundary, and nothing more.

The partitioned estimators need three collectives while partitioning data
sharded over several devices (the fit of the parts needs none):

* ``allreduce``: the per-centre sums and counts of every Lloyd step;
* ``broadcast``: the sample a k-means++ step picks, from the rank that holds it,
  and the labels of the greedy fill, from the rank that runs it;
* ``allgather``: small per-rank values (shard sizes, the weights of k-means++'s
  draw) and the distance blocks the sequential fill reads.

Every rank calls the same collectives in the same order (SPMD), each rank in
its own host thread. Two implementations:

* :class:`ThreadCommunicator`: ranks that are threads of one process, exchanging
  through host memory. NumPy or CuPy arrays (a CuPy array is copied to the host
  and the result back to the rank's device). Runs anywhere; what CI tests; the
  fallback for GPUs where CuPy has no NCCL.
* :class:`NcclCommunicator`: one rank per GPU of this process, through
  ``cupy.cuda.nccl`` (``ncclCommInitAll``). Each rank's host thread issues its
  own calls on its device's current stream: the NCCL guide allows a clique made
  by ``ncclCommInitAll`` to be driven "using a single thread and group calls,
  or multiple threads, each provided with a comm object"; with one thread per
  rank no ``groupStart``/``groupEnd`` is needed, and the same SPMD code runs on
  both implementations.

A rank that fails calls :meth:`Communicator.abort` (the thread runner in
:mod:`gpuml.distributed.placement` does it), which releases the other ranks
waiting in a collective with :class:`CommunicatorAborted` instead of leaving
them blocked.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from abc import ABC, abstractmethod

import numpy as np

from .._backend import cupy_module, is_cupy_array, namespace_of, to_numpy


class CommunicatorAborted(RuntimeError):
    """A collective could not complete: another rank failed, or a wait timed out."""


class Communicator(ABC):
    """One rank's handle on a group of ``size`` ranks.

    Arrays are dense; the result of a collective is in the namespace (and on the
    device) of the array the rank passed. Sums are exact copies on every rank:
    all ranks see the same bits, so every rank takes the same decisions
    (convergence, the sample a k-means++ step draws) without a further exchange.
    """

    rank: int
    size: int

    @abstractmethod
    def allreduce(self, x, out=None):
        """The elementwise sum of every rank's ``x`` (same shape and dtype on all ranks).

        Written into ``out`` when given (``out=x`` sums in place), else returned as
        a new array.
        """

    @abstractmethod
    def broadcast(self, x, root: int = 0):
        """Root's ``x`` copied into ``x`` of every other rank (a buffer of the same
        shape and dtype there); returns ``x``."""

    @abstractmethod
    def allgather(self, x) -> list:
        """Every rank's ``x`` in rank order, on every rank. Shapes may differ in the
        first dimension only (per-rank blocks of rows)."""

    @abstractmethod
    def abort(self) -> None:
        """Release every rank blocked in a collective of this group (after a failure)."""


class _Rendezvous:
    """What the ranks of a :class:`ThreadCommunicator` share: a barrier, one slot per rank."""

    def __init__(self, size: int, timeout: float | None):
        self.barrier = threading.Barrier(size)
        self.slots = [None] * size
        self.timeout = timeout
        self.reason = None

    def wait(self):
        try:
            self.barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            if self.reason is None:
                self.reason = (f"a rank waited more than {self.timeout} s in a collective "
                               "(a deadlock, or a rank far behind)")
            raise CommunicatorAborted(self.reason) from None

    def exchange(self, rank: int, value) -> list:
        """Post ``value`` and return every rank's value (rank order)."""
        self.slots[rank] = value
        self.wait()
        values = list(self.slots)
        # Nobody posts the next collective's value before everyone has read this one.
        self.wait()
        return values

    def abort(self, reason: str):
        if self.reason is None:
            self.reason = reason
        self.barrier.abort()


def _like(host, x):
    """The host array ``host`` in the namespace of ``x`` (on the current device)."""
    return namespace_of(x).asarray(host) if is_cupy_array(x) else host


class ThreadCommunicator(Communicator):
    """Ranks that are threads of one process, exchanging arrays through host memory.

    Make the ranks' handles with :meth:`create`, give one to each thread. Sums
    run in rank order on the host, so they are deterministic and identical on
    every rank.

    Examples
    --------
    >>> import numpy as np
    >>> from concurrent.futures import ThreadPoolExecutor
    >>> from gpuml.distributed.comm import ThreadCommunicator
    >>> comms = ThreadCommunicator.create(3)
    >>> with ThreadPoolExecutor(3) as pool:
    ...     sums = list(pool.map(lambda c: c.allreduce(np.full(2, c.rank + 1.0)), comms))
    >>> [s.tolist() for s in sums]
    [[6.0, 6.0], [6.0, 6.0], [6.0, 6.0]]
    """

    def __init__(self, rendezvous: _Rendezvous, rank: int, size: int):
        self._shared = rendezvous
        self.rank = rank
        self.size = size

    @classmethod
    def create(cls, size: int, timeout: float | None = None) -> list[ThreadCommunicator]:
        """Handles for ``size`` ranks; ``timeout`` bounds each wait in seconds (None: no bound)."""
        if int(size) < 1:
            raise ValueError(f"a communicator needs at least one rank, got size={size!r}")
        shared = _Rendezvous(int(size), timeout)
        return [cls(shared, r, int(size)) for r in range(int(size))]

    def _post(self, x):
        # A copy: the poster may overwrite x (out=x) before the others have read it.
        return np.array(to_numpy(x), copy=True)

    def allreduce(self, x, out=None):
        values = self._shared.exchange(self.rank, self._post(x))
        total = values[0].copy()
        for v in values[1:]:
            total += v
        result = _like(total, x)
        if out is None:
            return result
        out[...] = result
        return out

    def broadcast(self, x, root: int = 0):
        values = self._shared.exchange(self.rank, self._post(x) if self.rank == root else None)
        if self.rank != root:
            x[...] = _like(values[root], x)
        return x

    def allgather(self, x) -> list:
        values = self._shared.exchange(self.rank, self._post(x))
        return [_like(v, x) for v in values]

    def abort(self, reason: str = "another rank failed") -> None:
        self._shared.abort(reason)


def nccl_module():
    """``cupy.cuda.nccl`` when CuPy imports and its NCCL library loads, else None."""
    if cupy_module() is None:
        return None
    with warnings.catch_warnings():
        # CuPy warns at import when libnccl is missing; here that is an answer, not news.
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl
    return nccl if getattr(nccl, "available", False) else None


def _nccl_dtype(nccl, dtype):
    codes = {
        np.dtype(np.int8): nccl.NCCL_INT8, np.dtype(np.uint8): nccl.NCCL_UINT8,
        np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.uint32): nccl.NCCL_UINT32,
        np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.uint64): nccl.NCCL_UINT64,
        np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.float32): nccl.NCCL_FLOAT32,
        np.dtype(np.float64): nccl.NCCL_FLOAT64,
    }
    try:
        return codes[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"NCCL has no type for dtype {np.dtype(dtype)}") from None


class NcclCommunicator(Communicator):
    """One rank per GPU of this process, on ``cupy.cuda.nccl``.

    Make the handles with :meth:`initAll` (``ncclCommInitAll``) and drive each
    from its own host thread with its GPU current (``with cupy.cuda.Device(g)``):
    calls go to that device's current stream, ordered with the rank's other work
    on it, and return without waiting (reading a result on the host waits). A
    NumPy argument is copied to the rank's GPU and the result back.

    A one-GPU group is a valid one-rank clique (every collective is a copy).
    """

    def __init__(self, comm, rank: int, size: int, device_id: int, clique=None):
        self._comm = comm
        self.rank = rank
        self.size = size
        self.device_id = device_id
        self._clique = clique

    @classmethod
    def initAll(cls, device_ids) -> list[NcclCommunicator]:  # noqa: N802 (NCCL's name)
        """Handles for the GPUs ``device_ids`` (rank ``r`` on ``device_ids[r]``)."""
        nccl = nccl_module()
        if nccl is None:
            raise RuntimeError("NCCL is not available to CuPy here (libnccl.so.2 did not load); "
                               "install it with pip install nvidia-nccl-cu13 (or -cu12), or "
                               "use ThreadCommunicator")
        ids = [int(g) for g in device_ids]
        if len(set(ids)) != len(ids):
            raise ValueError(f"one NCCL rank per GPU: {ids} names a GPU twice")
        comms = nccl.NcclCommunicator.initAll(ids)
        return [cls(c, r, len(ids), g, tuple(ids)) for r, (c, g) in enumerate(zip(comms, ids))]

    def _device_array(self, x):
        cp = cupy_module()
        return cp.ascontiguousarray(cp.asarray(x))

    def _stream(self):
        return cupy_module().cuda.get_current_stream().ptr

    def _check_device(self):
        current = cupy_module().cuda.Device().id
        if current != self.device_id:
            raise RuntimeError(f"NCCL rank {self.rank} belongs to GPU {self.device_id} but GPU "
                               f"{current} is current; call it inside "
                               f"cupy.cuda.Device({self.device_id})")

    def allreduce(self, x, out=None):
        nccl = nccl_module()
        self._check_device()
        send = self._device_array(x)
        recv = cupy_module().empty_like(send)
        self._comm.allReduce(send.data.ptr, recv.data.ptr, send.size,
                             _nccl_dtype(nccl, send.dtype), nccl.NCCL_SUM, self._stream())
        result = recv if is_cupy_array(x) else recv.get()
        if out is None:
            return result
        out[...] = result
        return out

    def broadcast(self, x, root: int = 0):
        nccl = nccl_module()
        self._check_device()
        buf = self._device_array(x)
        self._comm.broadcast(buf.data.ptr, buf.data.ptr, buf.size,
                             _nccl_dtype(nccl, buf.dtype), int(root), self._stream())
        if buf is not x:
            x[...] = buf if is_cupy_array(x) else buf.get()
        return x

    def allgather(self, x) -> list:
        nccl = nccl_module()
        cp = cupy_module()
        self._check_device()
        send = self._device_array(x)
        # NCCL gathers equal counts: agree on the row counts, pad every block to the largest.
        rows = self.allreduce(_one_hot_count(cp, self.rank, self.size, send.shape[0]))
        rows = rows.get().tolist()
        row_shape = send.shape[1:]
        padded = cp.zeros((max(rows),) + row_shape, dtype=send.dtype)
        padded[: send.shape[0]] = send
        recv = cp.empty((self.size,) + padded.shape, dtype=send.dtype)
        if padded.size:
            self._comm.allGather(padded.data.ptr, recv.data.ptr, padded.size,
                                 _nccl_dtype(nccl, send.dtype), self._stream())
        blocks = [recv[r, : rows[r]] for r in range(self.size)]
        return blocks if is_cupy_array(x) else [b.get() for b in blocks]

    def abort(self, reason: str = "another rank failed") -> None:
        # An aborted clique is dead: the next group on these GPUs initialises a new one.
        with _CLIQUES_LOCK:
            _CLIQUES.pop(self._clique, None)
        self._comm.abort()


def _one_hot_count(xp, rank: int, size: int, count: int):
    """A length-``size`` vector holding ``count`` at ``rank``: summed, every rank's count."""
    v = xp.zeros(size, dtype=np.int64)
    v[rank] = count
    return v


#: NCCL cliques by GPU ids, each with the lock its users hold: ``ncclCommInitAll`` costs far
#: more than a small fit, and one clique must not be driven by two groups at once.
_CLIQUES: dict = {}
_CLIQUES_LOCK = threading.Lock()


def _nccl_clique(ids: tuple):
    with _CLIQUES_LOCK:
        entry = _CLIQUES.get(ids)
        if entry is None:
            entry = _CLIQUES[ids] = (threading.Lock(), NcclCommunicator.initAll(ids))
    return entry


@contextlib.contextmanager
def communicators(backends, timeout: float | None = None):
    """One communicator handle per backend, for the duration of a ``with`` block.

    CPU ranks use :class:`ThreadCommunicator`. GPU ranks use
    :class:`NcclCommunicator` when CuPy's NCCL loads (one clique per set of
    GPUs, made once and reused; the block holds it exclusively), else
    :class:`ThreadCommunicator` through host memory: correct and, for the few
    small collectives of a partitioned fit, barely slower.
    """
    ids = tuple(b.device_id for b in backends)
    if all(g is not None for g in ids) and nccl_module() is not None:
        lock, comms = _nccl_clique(ids)
        with lock:
            yield comms
        return
    yield ThreadCommunicator.create(len(ids), timeout=timeout)
