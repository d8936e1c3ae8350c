"""Spawn a few real processes for the multi-process tests, bounded in time.

The process entry points live in ``training/_training_workers`` and
``optim/_sharded_workers`` (importable without pytest). They are started by a *forkserver*
that has imported them (and with them torch and gpuml) once: each child is then a fork of
that clean, single-threaded server, not a fork of pytest (whose torch thread pools may be
running) and not a fresh interpreter that spends seconds importing torch, numba and
scikit-learn again — on the 2 shared cores of CI that import is most of a test's time. A
process has one forkserver, started by the first test that needs it, so it preloads the
workers of every test directory. The queue gathers what the children report; whatever still
runs at the deadline is killed.
"""

import multiprocessing
import multiprocessing.forkserver
import os
import queue
import socket
import time
import traceback
from functools import wraps

import torch.distributed as dist


def gloo_missing() -> str | None:
    """Why gloo process groups cannot run here, or ``None``."""
    if not dist.is_available():
        return "torch.distributed is not available in this build of torch"
    if not dist.is_gloo_available():
        return "torch.distributed has no gloo backend in this build of torch"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_TESTS = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_TESTS)
# _sharded_workers first: it switches Triton's interpreter on (CPU only), which must happen
# before anything imports triton
_WORKERS = {"_sharded_workers": os.path.join(_TESTS, "optim"),
            "_training_workers": os.path.join(_TESTS, "training"),
            "_example_workers": os.path.join(_TESTS, "training")}
_context = None


def report_errors(fn):
    """A worker function that reports its exception to the test as ``("error", rank, text)``.

    The workers' last argument is the result queue; it is flushed and closed however the
    worker ends, so the test reads every message a dead worker sent.
    """
    @wraps(fn)  # the qualified name is what pickle sends to a child
    def wrapped(rank, world, *args):
        q = args[-1]
        try:
            fn(rank, world, *args)
        except BaseException:
            q.put(("error", rank, traceback.format_exc()))
            raise
        finally:
            q.close()
            q.join_thread()

    return wrapped


def _forkserver():
    """The forkserver context, its server started with the worker modules imported."""
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(_WORKERS))
        # Python 3.11's forkserver ignores the sys.path handed to it and skips a preload it
        # cannot import without a word; it does inherit the environment, so the path goes
        # there, this repository first (the gpuml under test, not an installed one).
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([*_WORKERS.values(), _TESTS, _ROOT]
                                                   + ([old] if old else []))
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            if old is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = old
        _context = ctx
    return _context


def run_processes(target, nprocs: int, args: tuple, deadline_s: float, until=None,
                  grace_s: float = 10.0):
    """Run ``target(rank, nprocs, *args, queue)`` in ``nprocs`` processes.

    Waits until all have ended, ``until(messages)`` is true (then ``grace_s`` more for the
    processes to exit), or ``deadline_s`` has passed, then kills what still runs. Returns
    ``(messages, exitcodes, seconds)``: every item the processes put on the queue, each
    process's exit code (``None`` where it was still running and had to be killed) and the
    wall time of the wait.
    """
    ctx = _forkserver()
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, nprocs, *args, q), daemon=True)
             for rank in range(nprocs)]
    start = time.monotonic()
    for p in procs:
        p.start()
    messages = []
    end = start + deadline_s
    while (time.monotonic() < end and any(p.is_alive() for p in procs)
           and not (until and until(messages))):
        try:
            messages.append(q.get(timeout=0.1))
        except queue.Empty:
            pass
    elapsed = time.monotonic() - start
    end = min(end, time.monotonic() + grace_s)
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    exitcodes = []
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
            exitcodes.append(None)
        else:
            exitcodes.append(p.exitcode)
    while True:
        try:
            messages.append(q.get(timeout=0.2))
        except queue.Empty:
            break
    return messages, exitcodes, elapsed
