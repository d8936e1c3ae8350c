"""Compile numba functions in a background thread while a NumPy twin serves small problems.

The first fit in a fresh install would otherwise wait for numba's compiler (type
inference and lowering, in Python) far longer than a small problem takes to solve
(a CA-SVM fit of 2,000 rows, cold and warm: ``bench/bench_first_fit.py``,
bench/results/cpu-2core/first_fit.md). So a caller with a small problem asks :func:`ready`
first: when the numba function already holds the specialisation for its arguments
(in memory), it runs it; otherwise the specialisation is queued for one background
thread (which loads it from numba's disk cache when it is there, else compiles it,
and writes the cache) and the caller solves this problem with a NumPy version of the
same algorithm. Later calls find the compiled function and use it.

The compile runs in Python and holds the GIL most of the time (and numba's compiler
lock throughout), so the estimators' ``fit`` methods are wrapped in :func:`deferring`:
what a fit queues starts compiling when it returns, beside whatever the caller does
next, which shares the interpreter with it meanwhile. The thread is a daemon,
so a process may exit before it is done (the next process then compiles again).
Large problems never take the twin: they compile in the calling thread as before, the
compile being small against the solve. A caller whose other path costs more than loading
from the disk cache (CA-SVM's prediction loops over thousands of parts) asks
``ready(..., from_cache=True)``: a cached specialisation is then loaded in the calling
thread.
``python -m gpuml.precompile`` (and any caller of :func:`synchronous`) compiles in
the calling thread instead, so that the cache is complete when it returns; the
environment variable ``GPUML_JIT_BACKGROUND=0`` does the same for a whole process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import queue
import threading
from pathlib import Path

import numpy as np

#: The folder of the compiled sources whose machine code numba caches (``cache=True``).
KERNELS_DIR = Path(__file__).resolve().parent


@functools.cache
def sources_stamp(root: Path = KERNELS_DIR) -> bytes:
    """One digest of every Python source under ``root``, path and contents: the stamp of
    the disk cache of gpuml's compiled functions (:func:`_stamp_gpuml_caches`)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.digest()


def _stamped(locator):
    """``locator`` (one of numba's cache locators) for gpuml's compiled functions, with
    :func:`sources_stamp` as their source stamp."""

    class Stamped(locator):
        @classmethod
        def from_function(cls, py_func, py_file):
            if KERNELS_DIR not in Path(py_file).resolve().parents:
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return sources_stamp()

    Stamped.__name__ = Stamped.__qualname__ = f"GpumlStamped{locator.__name__}"
    return Stamped


def _stamp_gpuml_caches():
    """Make numba's disk cache of gpuml's compiled functions depend on all their sources.

    numba keys a function's cached machine code by its own file's contents, but a
    compiled function inlines the compiled functions it calls from other files (the SMO
    matrix pass inlines :mod:`.vexp`'s ``exp``): after a change to those, it would load
    the old code. Here every gpuml kernel's cache is stamped with :func:`sources_stamp`,
    so a change to any of them recompiles them all. Functions outside gpuml keep numba's
    locators, which come after these; a numba without this machinery keeps its own rule.
    """
    try:
        from numba.core import caching

        locators = caching.CacheImpl._locator_classes
        mixin = caching._SourceFileBackedLocatorMixin
    except (ImportError, AttributeError):  # pragma: no cover - another numba
        return
    if not any(c.__name__.startswith("GpumlStamped") for c in locators):
        locators[:0] = [_stamped(c) for c in locators if issubclass(c, mixin)]


_stamp_gpuml_caches()

_lock = threading.Lock()
_queued: set = set()
_failed: set = set()
_jobs: queue.Queue = queue.Queue()
_worker: threading.Thread | None = None
_sync_depth = 0
_defer_depth = 0


def _reset_in_child():
    """A forked child has no compiling thread, and a lock held at the fork stays held."""
    global _lock, _jobs, _worker, _queued
    _lock = threading.Lock()
    _jobs = queue.Queue()
    _worker = None
    _queued = set()  # the parent's queued compiles did not come along: queue them again


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)


def _background_enabled() -> bool:
    return _sync_depth == 0 and os.environ.get("GPUML_JIT_BACKGROUND", "1") != "0"


def signature(dispatcher, args) -> tuple:
    """numba's argument types for ``args``, as the dispatcher would type a call."""
    return tuple(dispatcher.typeof_pyval(a) for a in args)


def ready(dispatcher, *args, from_cache: bool = False) -> bool:
    """Whether ``dispatcher(*args)`` runs compiled code now (else its compile is queued).

    True when the specialisation for the arguments' types is in memory, or when
    background compiling is off (the call then compiles in the caller, as plain
    numba). With ``from_cache`` (for a caller whose other path costs more than a load:
    a Python step per part of a model of thousands), also when it is in numba's disk
    cache and the background thread is not compiling (it holds numba's compiler lock,
    for seconds): it is loaded here, in the calling thread (:func:`_load_cached`). False
    otherwise, after queueing that specialisation for the background thread: the caller
    should take its NumPy path this time.
    """
    if not _background_enabled():
        return True
    key = _cheap_key(args)
    if key is not None and (dispatcher, key) in _compiled:
        return True
    sig = signature(dispatcher, args)
    if (sig in dispatcher.overloads or (dispatcher, sig) in _failed
            or (from_cache and not _busy() and _load_cached(dispatcher, sig))):
        if key is not None:
            _compiled.add((dispatcher, key))
        return True
    _submit(dispatcher, sig)
    return False


def _busy() -> bool:
    """Whether the background thread is at work (compiling, or loading from the cache)."""
    worker = _worker
    return worker is not None and worker.is_alive()


def _load_cached(dispatcher, sig) -> bool:
    """Load the specialisation ``sig`` of ``dispatcher`` from numba's disk cache, in the
    calling thread, as numba's own ``compile`` does before it compiles; False (nothing
    loaded) where the cache does not hold it or cannot be read."""
    from numba.core.compiler_lock import global_compiler_lock

    cache = getattr(dispatcher, "_cache", None)
    if cache is None:
        return False
    try:
        with global_compiler_lock:
            if sig in dispatcher.overloads:
                return True
            cres = cache.load_overload(sig, dispatcher.targetctx)
            if cres is None:
                return False
            if not cres.objectmode:
                dispatcher.targetctx.insert_user_function(cres.entry_point, cres.fndesc,
                                                          [cres.library])
            dispatcher.add_overload(cres)
    except Exception:  # noqa: BLE001 - numba's cache API changed, or the file is unreadable
        return False
    return True


#: ``(dispatcher, _cheap_key(args))`` whose specialisation is known to be in memory: numba's
#: own typing of the arguments costs more than a small problem's solve
_compiled: set = set()


def _cheap_key(args):
    """What decides numba's typing of ``args`` (arrays: dtype, dimensions, layout, flags;
    scalars and None: their type), or None for an argument of another kind."""
    key = []
    for a in args:
        if isinstance(a, np.ndarray):
            f = a.flags
            key.append((a.dtype.str, a.ndim, f.c_contiguous, f.f_contiguous, f.writeable,
                        f.aligned))
        elif a is None or isinstance(a, (bool, int, float, np.generic)):
            key.append(type(a))
        else:
            return None
    return tuple(key)


def _submit(dispatcher, sig):
    key = (dispatcher, sig)
    with _lock:
        if key in _queued:
            return
        _queued.add(key)
        _jobs.put((dispatcher, sig))
        if _defer_depth == 0:
            _start_worker()


def _start_worker():
    """Start the compiling thread if there is work and none runs (caller holds _lock)."""
    global _worker
    if not _jobs.empty() and (_worker is None or not _worker.is_alive()):
        _worker = threading.Thread(target=_compile_queued, name="gpuml-numba-compile",
                                   daemon=True)
        _worker.start()


def deferring(fit):
    """Decorate a ``fit``: compiles queued during it start when it returns.

    The compile holds the GIL most of the time, so running it beside the fit's
    NumPy twins would slow them about twofold; it also holds numba's compiler lock,
    which a compiled function without a twin would then wait for. After the fit,
    it runs beside whatever the caller does next.
    """
    @functools.wraps(fit)
    def wrapper(*args, **kwargs):
        global _defer_depth
        with _lock:
            _defer_depth += 1
        try:
            return fit(*args, **kwargs)
        finally:
            with _lock:
                _defer_depth -= 1
                if _defer_depth == 0:
                    _start_worker()

    return wrapper


def _compile_queued(always=False):
    """Compile queued specialisations until none is left or a fit starts (then its
    end starts this again); ``always``: until none is left, in the calling thread."""
    global _worker
    while True:
        with _lock:
            if _jobs.empty() or (_defer_depth > 0 and not always):
                if not always:
                    _worker = None
                return
            dispatcher, sig = _jobs.get_nowait()
        try:
            dispatcher.compile(sig)
        except Exception:  # noqa: BLE001
            # The caller's next call compiles in its own thread and raises there.
            _failed.add((dispatcher, sig))
        finally:
            _jobs.task_done()


def wait() -> None:
    """Compile everything queued, here, and wait for the background thread's compile."""
    _compile_queued(always=True)
    _jobs.join()


@contextlib.contextmanager
def synchronous():
    """Compile in the calling thread inside this block (numba's plain behaviour)."""
    global _sync_depth
    wait()
    with _lock:
        _sync_depth += 1
    try:
        yield
    finally:
        with _lock:
            _sync_depth -= 1
