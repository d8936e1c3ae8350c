"""Sequential steps of the balanced partitioners (You 2020, Alg 3, 4 and 9) as numba loops."""

import numpy as np
from numba import njit

from . import _jit

#: Largest distance block (rows x parts) the NumPy twin of :func:`fill_nearest_open`
#: takes while numba compiles it (a Python step per row: ~5 us each).
NUMPY_TWIN_MAX_ENTRIES = 1 << 20


def fill_nearest_open_any(D, counts, caps, labels):
    """:func:`fill_nearest_open`, by its NumPy twin while numba compiles it (small blocks).

    The twin (see :mod:`._jit`) takes the same decisions row by row, so the labels
    and counts are identical.
    """
    if D.size <= NUMPY_TWIN_MAX_ENTRIES and not _jit.ready(fill_nearest_open, D, counts, caps,
                                                           labels):
        _fill_nearest_open_numpy(D, counts, caps, labels)
    else:
        fill_nearest_open(D, counts, caps, labels)


def _fill_nearest_open_numpy(D, counts, caps, labels):
    """:func:`fill_nearest_open` in NumPy: each row's nearest open part, the lowest on ties."""
    open_ = counts < caps
    for i in range(D.shape[0]):
        row = D[i]
        d = np.where(open_ & (row == row), row, np.inf)  # the loop's < passes over NaN
        best = int(np.argmin(d))  # the first of equal minima, as the loop's strict <
        if not d[best] < np.inf:  # the loop finds no part (every open one at inf or NaN)
            best = -1
        counts[best] += 1
        labels[i] = best
        open_[best] = counts[best] < caps[best]


@njit(nogil=True, cache=True)
def fill_nearest_open(D, counts, caps, labels):
    """Give each row of ``D``, in order, to its nearest part that is not yet full.

    ``D[i, j]`` is the (squared) distance of sample i to centre j; part j is
    full once ``counts[j] == caps[j]``. ``counts`` is updated in place, so
    consecutive blocks of rows can be filled one after another. Ties go to
    the lowest part index, as the strict ``dist < mindis`` of the paper.
    """
    n, p = D.shape
    for i in range(n):
        best = -1
        best_d = np.inf
        for j in range(p):
            if counts[j] < caps[j] and D[i, j] < best_d:
                best_d = D[i, j]
                best = j
        counts[best] += 1
        labels[i] = best


@njit(nogil=True, cache=True, fastmath=True)
def nearest_centre_sums(X, centers, half_norms, labels, sums, counts):
    """One Lloyd pass fused: nearest centre of every row, and per-centre sums and counts.

    The nearest centre minimises ``||c||^2 / 2 - x.c`` (the squared distance
    halved, less the row's own norm); ties go to the lowest index, as
    ``argmin``. ``sums`` and ``counts`` are accumulated into (zero them
    first). One sweep over X, nothing of size n x P is written: for small
    ``P * d`` this beats a GEMM followed by an argmin and a separate sum.
    """
    n, d = X.shape
    p = centers.shape[0]
    for i in range(n):
        best = 0
        best_s = np.inf
        for j in range(p):
            s = half_norms[j]
            for k in range(d):
                s -= X[i, k] * centers[j, k]
            if s < best_s:
                best_s = s
                best = j
        labels[i] = best
        counts[best] += 1
        for k in range(d):
            sums[best, k] += X[i, k]
