"""Compile numba functions in a background thread while a NumPy twin serves small problems.

The first fit in a fresh install would otherwise spend seconds in numba's compiler
(type inference and lowering, in Python) before solving a problem that takes
milliseconds: a CA-SVM fit of 2,000 rows compiles its SMO for about 5 s and solves
its sixteen parts in 0.02 s. So a caller with a small problem asks :func:`ready`
first: when the numba function already holds the specialisation for its arguments
(in memory), it runs it; otherwise the specialisation is queued for one background
thread (which loads it from numba's disk cache when it is there, else compiles it,
and writes the cache) and the caller solves this problem with a NumPy version of the
same algorithm. Later calls find the compiled function and use it.

The compile runs in Python and holds the GIL most of the time, so code running
beside it (the NumPy twin, the user's next statements) shares the interpreter with
it for those seconds; it is a daemon thread, so a process may exit before it is done
(the next process then compiles again). Large problems never take the twin: they
compile in the calling thread as before, the compile being small against the solve.
``python -m gpuml.precompile`` (and any caller of :func:`synchronous`) compiles in
the calling thread instead, so that the cache is complete when it returns; the
environment variable ``GPUML_JIT_BACKGROUND=0`` does the same for a whole process.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading

_lock = threading.Lock()
_queued: set = set()
_failed: set = set()
_jobs: queue.Queue = queue.Queue()
_worker: threading.Thread | None = None
_sync_depth = 0


def _background_enabled() -> bool:
    return _sync_depth == 0 and os.environ.get("GPUML_JIT_BACKGROUND", "1") != "0"


def signature(dispatcher, args) -> tuple:
    """numba's argument types for ``args``, as the dispatcher would type a call."""
    return tuple(dispatcher.typeof_pyval(a) for a in args)


def ready(dispatcher, *args) -> bool:
    """Whether ``dispatcher(*args)`` runs compiled code now (else its compile is queued).

    True when the specialisation for the arguments' types is in memory, or when
    background compiling is off (the call then compiles in the caller, as plain
    numba). False otherwise, after queueing that specialisation for the background
    thread: the caller should take its NumPy path this time.
    """
    sig = signature(dispatcher, args)
    if (sig in dispatcher.overloads or not _background_enabled()
            or (id(dispatcher), sig) in _failed):
        return True
    _submit(dispatcher, sig)
    return False


def _submit(dispatcher, sig):
    global _worker
    key = (id(dispatcher), sig)
    with _lock:
        if key in _queued:
            return
        _queued.add(key)
        _jobs.put((dispatcher, sig))
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_compile_forever, name="gpuml-numba-compile",
                                       daemon=True)
            _worker.start()


def _compile_forever():
    while True:
        dispatcher, sig = _jobs.get()
        try:
            dispatcher.compile(sig)
        except Exception:  # noqa: BLE001
            # The caller's next call compiles in its own thread and raises there.
            _failed.add((id(dispatcher), sig))
        finally:
            _jobs.task_done()


def wait() -> None:
    """Block until every queued compile has finished (tests, precompile)."""
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
