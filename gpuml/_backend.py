"""The one seam that knows NumPy from CuPy.

Estimators call :func:`resolve` once at the top of ``fit``/``predict`` and then
write their algorithm against ``backend.xp``. Nothing else in gpuml branches
on the device, except the hardware-specific code in :mod:`gpuml.kernels`.

Rules
-----
* ``device="auto"``: the device of a CuPy input if there is one; otherwise
  the GPU when CuPy imports and a CUDA device answers; otherwise the CPU.
* ``device="cpu"``, ``"cuda"`` (current GPU, normally 0) or ``"cuda:N"``.
  Asking for a GPU that is not there raises :class:`RuntimeError`.
* ``devices`` (several devices, :func:`resolve_devices`): ``"all"`` GPUs, or a
  list of GPU ids / names, or of ``"cpu"`` ranks.
* Outputs follow the input: a CuPy input gives CuPy outputs, anything else
  (NumPy, pandas, lists, SciPy sparse) gives NumPy outputs, wherever the
  computation ran.
* Floating dtypes: float32 and float64 are kept as given. Integers, booleans
  and float16 become float64 (float16 has too little precision for kernel
  sums). Mixed float32/float64 inputs are computed in float64.

Memory and readback
-------------------
* :func:`available_bytes`: memory that can be allocated now, on the host or
  the device (the solvers size their caches and chunks by it).
* :func:`read_lag`, :func:`read_later`: when a device scalar is read back, so
  that an iterative loop never drains the GPU's queue to decide whether to go on.

Importing this module never imports CuPy, never touches a GPU, never prints.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from types import ModuleType

import numpy as np

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda)(?::(\d+))?$")


@functools.lru_cache(maxsize=1)
def cupy_module() -> ModuleType | None:
    """CuPy if it imports, else None (cached; import errors are swallowed)."""
    try:
        import cupy
    except Exception:  # ImportError, or a broken CUDA install raising at import
        return None
    return cupy


@functools.lru_cache(maxsize=1)
def gpu_count() -> int:
    """Number of CUDA devices that answer (0 without CuPy or without a GPU)."""
    cp = cupy_module()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:  # CUDARuntimeError without a driver or device
        return 0


def cuda_available() -> bool:
    """True when CuPy imports and at least one CUDA device answers."""
    return gpu_count() > 0


def gpu_name(device_id: int = 0) -> str | None:
    """The GPU's marketing name, or None without one."""
    if not cuda_available():
        return None
    props = cupy_module().cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def is_cupy_array(a) -> bool:
    """True for CuPy dense arrays and cupyx sparse matrices (without importing CuPy)."""
    mod = type(a).__module__
    return mod.startswith("cupy") or mod.startswith("cupyx")


def is_dask_collection(a) -> bool:
    """True for Dask arrays, dataframes and series (without importing Dask).

    Every Dask collection implements the ``__dask_graph__`` protocol method.
    """
    return a is not None and callable(getattr(type(a), "__dask_graph__", None))


@dataclass(frozen=True)
class Backend:
    """The array namespace and device a computation runs on.

    Attributes
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    device_id : int or None
        CUDA device ordinal, None on the CPU.
    """

    xp: ModuleType
    device_id: int | None = None

    @property
    def is_gpu(self) -> bool:
        return self.device_id is not None

    @property
    def device(self) -> str:
        return "cpu" if self.device_id is None else f"cuda:{self.device_id}"

    def use(self):
        """Context manager making this backend's GPU current (a no-op on the CPU)."""
        if self.device_id is None:
            import contextlib

            return contextlib.nullcontext()
        return self.xp.cuda.Device(self.device_id)

    def asarray(self, a, dtype=None):
        """``a`` on this backend's device (a copy only when it must move or change dtype)."""
        if self.is_gpu:
            with self.use():
                if hasattr(a, "tocsr") and not is_cupy_array(a):
                    import cupyx.scipy.sparse as cpsp

                    return cpsp.csr_matrix(a.astype(dtype) if dtype else a)
                return self.xp.asarray(a, dtype=dtype)
        return to_numpy(a) if dtype is None else to_numpy(a).astype(dtype, copy=False)

    def upload(self, a):
        """``a`` (host rows) on this backend's device, copied on a stream of its own and
        complete on return, so that a thread may copy while another computes (as
        :meth:`asarray` on the CPU)."""
        if not self.is_gpu:
            return self.asarray(a)
        with self.use():
            stream = self.xp.cuda.Stream(non_blocking=True)
            with stream:
                out = self.asarray(a)
            stream.synchronize()
        return out

    def upload_rows(self, X, rows):
        """Rows ``rows`` of the host matrix ``X`` on this backend's device, complete on return.

        On a GPU the rows of a dense ``X`` are gathered straight into page-locked host
        memory (CuPy's pinned pool: no pageable copy in between) and copied from there
        by DMA on a stream of their own, at the bus's full rate and without holding up
        work queued on the device's other streams. Otherwise :meth:`upload` of
        ``X[rows]``.
        """
        if not self.is_gpu or not isinstance(X, np.ndarray):
            return self.upload(X[rows])
        import cupyx

        with self.use():
            host = cupyx.empty_pinned((len(rows),) + X.shape[1:], dtype=X.dtype)
            np.take(X, rows, axis=0, out=host)
            out = self.xp.empty(host.shape, dtype=host.dtype)
            stream = self.xp.cuda.Stream(non_blocking=True)
            out.set(host, stream=stream)
            stream.synchronize()  # the pinned block goes back to its pool only after the copy
        return out

    def __reduce__(self):
        # Modules do not pickle; a backend is rebuilt from its device (CPU stays CPU).
        return resolve, (self.device,)

    def sync(self) -> None:
        """Wait for queued GPU work (a no-op on the CPU); for timing only."""
        if self.is_gpu:
            with self.use():
                self.xp.cuda.get_current_stream().synchronize()


CPU = Backend(np, None)


def parse_device(device) -> tuple[str, int | None]:
    """Split ``"cuda:1"`` into ``("cuda", 1)``; raise ValueError on anything else."""
    if not isinstance(device, str) or not _DEVICE_RE.match(device):
        raise ValueError(
            f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}"
        )
    kind, _, ordinal = device.partition(":")
    return kind, (int(ordinal) if ordinal else None)


def _gpu_backend(ordinal: int | None) -> Backend:
    n = gpu_count()
    asked = "cuda" if ordinal is None else f"cuda:{ordinal}"
    if n == 0:
        why = "CuPy is not installed" if cupy_module() is None else "no CUDA device answers"
        raise RuntimeError(
            f"device={asked!r} was asked for but {why}; install gpuml[cuda12] or "
            "gpuml[cuda13] on a machine with an NVIDIA GPU, or use device='cpu'"
        )
    ordinal = 0 if ordinal is None else ordinal
    if ordinal >= n:
        raise RuntimeError(f"device='cuda:{ordinal}' does not exist: this machine has {n} GPU(s)")
    return Backend(cupy_module(), ordinal)


def resolve(device="auto", *arrays) -> Backend:
    """The backend for a call, from the ``device`` parameter and the inputs.

    Parameters
    ----------
    device : {"auto", "cpu", "cuda"} or "cuda:N"
    *arrays : the call's inputs; a CuPy input pins ``"auto"`` to its device.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml._backend import resolve
    >>> resolve("cpu", np.zeros(3)).device
    'cpu'
    """
    kind, ordinal = parse_device(device)
    cupy_inputs = [a for a in arrays if a is not None and is_cupy_array(a)]
    if kind == "cpu":
        return CPU
    if kind == "cuda":
        return _gpu_backend(ordinal)
    if cupy_inputs:
        dev = cupy_inputs[0].device
        return _gpu_backend(int(getattr(dev, "id", dev)))
    return _gpu_backend(None) if cuda_available() else CPU


def resolve_devices(devices) -> tuple[Backend, ...] | None:
    """The backends of a multi-device fit, from an estimator's ``devices`` parameter.

    ``None``: one device (the estimator's ``device`` decides). ``"all"``: every GPU
    that answers. A list or tuple: GPU ids (``0``, ``1``) or names (``"cuda:0"``),
    each GPU at most once; or ``"cpu"`` entries, each one CPU rank (a thread of this
    process: the multi-device code path on the CPU). GPUs and CPU ranks do not mix.
    Every check runs before any work: a malformed entry raises ValueError; a GPU
    that is not there, or any GPU without CuPy, raises RuntimeError.

    Examples
    --------
    >>> from gpuml._backend import resolve_devices
    >>> [b.device for b in resolve_devices(["cpu", "cpu"])]
    ['cpu', 'cpu']
    """
    if devices is None:
        return None
    if isinstance(devices, str):
        if devices != "all":
            raise ValueError(f"devices must be None, 'all' or a list of devices, got {devices!r}; "
                             "for a single device use device=...")
        n = gpu_count()
        if n == 0:
            why = "CuPy is not installed" if cupy_module() is None else "no CUDA device answers"
            raise RuntimeError(f"devices='all' asks for every GPU but {why}; use devices=None "
                               "(one device), or devices=['cpu', 'cpu'] for CPU ranks")
        return tuple(Backend(cupy_module(), g) for g in range(n))
    if not isinstance(devices, (list, tuple)) or len(devices) == 0:
        raise ValueError("devices must be None, 'all' or a non-empty list of GPU ids (0, 1, ...), "
                         f"'cuda:N' names or 'cpu' ranks, got {devices!r}")
    ordinals = []
    for entry in devices:
        if isinstance(entry, (bool, np.bool_)) or not isinstance(entry, (int, np.integer, str)):
            raise ValueError(f"devices entries are GPU ids (int), 'cuda:N' or 'cpu'; got {entry!r}")
        if isinstance(entry, str):
            kind, ordinal = parse_device(entry)
            if kind == "auto" or (kind == "cuda" and ordinal is None):
                raise ValueError(f"devices entries name one device ('cuda:0', 0, 'cpu'), "
                                 f"got {entry!r}")
        else:
            kind, ordinal = "cuda", int(entry)
            if ordinal < 0:
                raise ValueError(f"a GPU id is >= 0, got {entry!r} in devices")
        ordinals.append(None if kind == "cpu" else ordinal)
    gpus = [g for g in ordinals if g is not None]
    if gpus and len(gpus) != len(ordinals):
        raise ValueError(f"devices mixes GPUs and CPU ranks ({list(devices)!r}); use GPUs only, "
                         "or 'cpu' entries only")
    repeated = sorted({g for g in gpus if gpus.count(g) > 1})
    if repeated:
        raise ValueError(f"devices names GPU {repeated[0]} more than once ({list(devices)!r}); "
                         "each GPU is one rank")
    if gpus:
        n = gpu_count()
        if n == 0:
            why = "CuPy is not installed" if cupy_module() is None else "no CUDA device answers"
            raise RuntimeError(f"devices={list(devices)!r} names GPUs but {why}; install "
                               "gpuml[cuda12] or gpuml[cuda13] on a machine with NVIDIA GPUs, "
                               "or use devices=None")
        absent = [g for g in gpus if g >= n]
        if absent:
            raise RuntimeError(f"devices={list(devices)!r} names GPU {absent[0]}, which does not "
                               f"exist: this machine has {n} GPU(s)")
    return tuple(CPU if g is None else Backend(cupy_module(), g) for g in ordinals)


def namespace_of(a) -> ModuleType:
    """``cupy`` for a CuPy input, else ``numpy``: the namespace outputs follow."""
    return cupy_module() if is_cupy_array(a) else np


def sparse_module(xp) -> ModuleType:
    """``scipy.sparse`` for NumPy, ``cupyx.scipy.sparse`` for CuPy."""
    if xp is np:
        import scipy.sparse

        return scipy.sparse
    import cupyx.scipy.sparse

    return cupyx.scipy.sparse


def to_numpy(a):
    """A NumPy view/copy of ``a`` (dense or sparse, host or device)."""
    if is_cupy_array(a):
        return a.get()
    if hasattr(a, "tocsr"):
        return a
    return np.asarray(a)


def from_device(a):
    """``a`` on the host: a CuPy array (dense or sparse) copied to NumPy or SciPy, anything
    else (host arrays, scalars, other objects) as it is."""
    return a.get() if is_cupy_array(a) else a


def to_output(a, like):
    """``a`` converted to follow the input ``like``: CuPy in, CuPy out; NumPy otherwise."""
    if like is not None and is_cupy_array(like):
        cp = cupy_module()
        return cp.asarray(a)
    return to_numpy(a)


def float_dtype(*arrays) -> np.dtype:
    """The computation dtype for the given inputs (see the module's rules)."""
    kinds = [np.dtype(a.dtype) for a in arrays if a is not None and hasattr(a, "dtype")]
    if kinds and all(k == np.float32 for k in kinds):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def available_bytes(xp) -> int:
    """Memory that can be allocated now: free device memory for CuPy, free RAM for NumPy."""
    if xp is not np:
        free, _ = xp.cuda.runtime.memGetInfo()
        return int(free + xp.get_default_memory_pool().free_bytes())
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not POSIX: no cheap answer
        return 1 << 62


# Reading device scalars back to the host without draining the GPU's queue.
#
# An iterative method that decides on the host whether to go on (k-means'
# centre shift) would, read naively, stop the host at every step until the GPU
# has finished everything queued so far: ``float(x)`` copies on the current
# stream, behind all the work queued after ``x`` was computed. Here a loop
# instead takes a *reader* of the value when it is computed and calls it one
# step later, after queueing the next step: the reader waits only for the work
# that computed the value (an event) and copies it on a side stream, so the GPU
# always has the next step queued while the host waits. On the host the value
# is read at once and the loop runs no step ahead (:func:`read_lag` is 0), so
# the NumPy path runs exactly as a plain loop would.


def read_lag(like) -> int:
    """Steps a loop should run ahead of its readings where ``like`` lives (host 0, GPU 1).

    A loop that runs ``k`` steps ahead may have computed up to ``k`` steps it
    then throws away (their result is not wanted once the reading says stop),
    so a GPU loop keeps the results of its unread steps and goes back to the
    one its stopping rule picks.
    """
    return 1 if is_cupy_array(like) else 0


def read_later(x):
    """A callable returning ``float(x)`` for a scalar (0-d or 1-element) array ``x``.

    On the host the value is read now. On a GPU the call waits for the work
    queued before this function was called (not for work queued since) and
    copies the value on a non-blocking side stream, which the legacy default
    stream does not synchronise with.
    """
    if not is_cupy_array(x):
        value = float(x)
        return lambda: value
    return _DeviceRead(x)


class _DeviceRead:
    __slots__ = ("_x", "_event")

    def __init__(self, x):
        import cupy

        self._x = x  # held until read: the pool must not hand its memory to later work
        self._event = cupy.cuda.Event(disable_timing=True)
        self._event.record()

    def __call__(self) -> float:
        self._event.synchronize()
        stream = _side_stream(self._x.device.id)
        return float(self._x.reshape(1).get(stream=stream)[0])


@functools.cache
def _side_stream(device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.cuda.Stream(non_blocking=True)


def stack_rows(blocks):
    """Row blocks (dense or CSR, one namespace) stacked into one matrix."""
    if len(blocks) == 1:
        return blocks[0]
    if hasattr(blocks[0], "tocsr"):
        return sparse_module(namespace_of(blocks[0])).vstack(blocks, format="csr")
    return namespace_of(blocks[0]).concatenate(blocks)
