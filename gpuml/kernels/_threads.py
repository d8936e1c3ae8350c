"""How many CPU threads a piece of work takes, and BLAS's threads around them.

One rule for every ``n_jobs=None`` of the CPU paths: a thread per ``min_work`` of the
work, at most the threads BLAS may use in this process (which honours
``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``, threadpoolctl's limits and the limits
that joblib's process workers and Dask's workers set), one thread for small work, and
one thread inside work that already runs in parallel (a Dask task, a rank of a
multi-device fit: :func:`parallel_region`).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading

import numpy as np
from joblib import effective_n_jobs
from threadpoolctl import ThreadpoolController

from .._backend import is_cupy_array

#: ``n_jobs=None``: the least work (the parts' or problems' squared sizes summed) that a
#: thread solving parts is given; less runs on one thread. Two parts of 2,048 rows: with
#: less, starting threads and an idle thread at the end cost about what they save
#: (bench/results/cpu-2core/part_threads.md).
PART_THREAD_MIN_WORK = 2 * 2048**2


@functools.cache
def blas_controller() -> ThreadpoolController:
    """The loaded BLAS libraries, scanned once per process: a scan reads the process's
    memory map, which costs more than the solve of a small problem."""
    return ThreadpoolController()


def blas_threads() -> int:
    """The threads BLAS may use in this process now (every core unless limited)."""
    allowed = [lib.num_threads for lib in blas_controller().lib_controllers
               if lib.user_api == "blas"]
    return max(allowed) if allowed else int(effective_n_jobs(-1))


_region = threading.local()


@contextlib.contextmanager
def parallel_region():
    """Marks this thread as one of several that already share the cores (the ranks of a
    multi-device fit): ``n_jobs=None`` inside it takes one thread."""
    before = getattr(_region, "inside", False)
    _region.inside = True
    try:
        yield
    finally:
        _region.inside = before


def _nested() -> bool:
    """Whether this thread runs inside :func:`parallel_region` or a Dask task."""
    if getattr(_region, "inside", False):
        return True
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return False
    try:
        distributed.get_worker()
    except (ValueError, AttributeError):
        return False
    return True


def threads_for(n_jobs, work, min_work, most) -> int:
    """The threads for ``work`` (any unit) split in at most ``most`` pieces.

    An int ``n_jobs`` means what it means to joblib (-1: every core); ``None``: one
    thread per ``min_work`` (so one below ``2 * min_work``), at most
    :func:`blas_threads`, and one inside a Dask task or a :func:`parallel_region` (their
    threads are the parallelism). Never more than ``most``, nor fewer than 1.

    >>> threads_for(None, 10, min_work=100, most=4), threads_for(1, 10**9, 100, 4)
    (1, 1)
    """
    if n_jobs is None:
        if work < 2 * min_work or _nested():
            return 1
        wanted = min(blas_threads(), int(work // min_work))
    else:
        wanted = 1 if n_jobs == 1 else int(effective_n_jobs(n_jobs))
    return int(max(1, min(wanted, most)))


def row_ranges(n: int, block: int, threads: int = 1) -> list[tuple[int, int]]:
    """``(start, stop)`` blocks of at most ``block`` of ``n`` rows: consecutive blocks of
    ``block`` rows on one thread; on several, blocks of equal size, as many as a multiple
    of ``threads`` (so that the threads end together).

    >>> row_ranges(10, 4), row_ranges(10, 8, threads=2)
    ([(0, 4), (4, 8), (8, 10)], [(0, 5), (5, 10)])
    """
    size = max(1, int(block))
    if threads > 1 and n > 0:
        blocks = -(-n // size)
        count = threads * -(-blocks // threads)
        size = -(-n // count)
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def map_threads(fn, items, n_jobs) -> list:
    """``[fn(item) for item in items]``, in ``n_jobs`` joblib threads (joblib's meaning;
    None or 1: in this thread) with BLAS on one thread inside them: the items already
    run side by side, so BLAS threads inside each would oversubscribe the cores (``fn``
    releases the GIL in its NumPy, LAPACK and compiled calls)."""
    items = list(items)
    if n_jobs in (None, 1) or len(items) <= 1:
        return [fn(item) for item in items]
    from joblib import Parallel, delayed

    with blas_controller().limit(limits=1, user_api="blas"):
        return Parallel(n_jobs=n_jobs, prefer="threads")(delayed(fn)(item) for item in items)


def part_threads(n_jobs, sizes) -> int:
    """The threads that solve independent problems (a fit's parts) of ``sizes`` rows.

    An int ``n_jobs`` means what it means to joblib (-1: every core). ``None``: one
    thread per :data:`PART_THREAD_MIN_WORK` of the problems' squared sizes summed, at most
    one per problem and at most the threads BLAS may use in this process
    (:func:`threads_for`), so that a fit inside an outer ``GridSearchCV(n_jobs=...)`` or a
    Dask worker takes no more than its share of the cores. Small fits (a few thousand rows,
    the many fits of a search on small data) stay on one thread.

    >>> import numpy as np
    >>> part_threads(None, np.full(3, 2000)), part_threads(1, np.full(50, 2000))
    (1, 1)
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    return threads_for(n_jobs, int((sizes * sizes).sum()), PART_THREAD_MIN_WORK,
                       max(1, sizes.size))


def path_threads(X, n_jobs, sizes, n_paths, n_groups) -> tuple[int, int]:
    """``(outer, inner)`` for ``n_paths`` independent batches of the same problems (a
    search's γ values, each a C path over the problems of ``sizes`` rows in ``n_groups``
    groups): the batches side by side in ``outer`` threads, each giving its problems
    ``inner``. The threads are :func:`part_threads`' for every batch's problems; the
    batches share them only where the groups alone leave some idle (fewer groups than
    threads). On a GPU (``X`` a CuPy array) the batches run one after another: its
    device is current in the calling thread.

    >>> import numpy as np
    >>> path_threads(np.zeros((2, 2)), 1, np.full(1, 4000), 5, 1)   # n_jobs=1: one thread
    (1, 1)
    """
    total = part_threads(n_jobs, np.tile(np.asarray(sizes, dtype=np.int64), n_paths))
    if is_cupy_array(X) or total <= n_groups or n_paths == 1:
        return 1, total
    outer = min(n_paths, max(1, total // max(n_groups, 1)))
    return outer, max(1, total // outer)
