"""How many CPU threads a piece of work takes, and BLAS's threads around them.

One rule for every ``n_jobs=None`` of the CPU paths: a thread per ``min_work`` of the
work, at most the threads BLAS may use in this process (which honours
``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``, threadpoolctl's limits and the limits
that joblib's process workers and Dask's workers set), one thread for small work.
"""

from __future__ import annotations

import functools

from joblib import effective_n_jobs
from threadpoolctl import ThreadpoolController


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


def threads_for(n_jobs, work, min_work, most) -> int:
    """The threads for ``work`` (any unit) split in at most ``most`` pieces.

    An int ``n_jobs`` means what it means to joblib (-1: every core); ``None``: one
    thread per ``min_work`` (so one below ``2 * min_work``), at most
    :func:`blas_threads`. Never more than ``most``, nor fewer than 1.

    >>> threads_for(None, 10, min_work=100, most=4), threads_for(1, 10**9, 100, 4)
    (1, 1)
    """
    if n_jobs is None:
        if work < 2 * min_work:
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


def in_threads(fn, ranges, threads: int) -> None:
    """``fn(start, stop)`` for every range, in ``threads`` joblib threads with BLAS on one
    thread inside them (``fn`` releases the GIL in its NumPy and compiled calls), or in
    this thread when one."""
    if threads <= 1 or len(ranges) <= 1:
        for start, stop in ranges:
            fn(start, stop)
        return
    from joblib import Parallel, delayed

    with blas_controller().limit(limits=1, user_api="blas"):
        Parallel(n_jobs=threads, prefer="threads")(delayed(fn)(a, b) for a, b in ranges)
