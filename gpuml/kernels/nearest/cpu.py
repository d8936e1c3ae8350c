"""Sequential steps of the balanced partitioners (You 2020, Alg 3, 4 and 9) as numba loops."""

import numpy as np
from numba import njit
from scipy import sparse

from .. import _jit

#: Largest distance block (rows x parts) the NumPy twin of :func:`fill_nearest_open`
#: takes while numba compiles it (a Python step per row).
NUMPY_TWIN_MAX_ENTRIES = 1 << 20


def fill_nearest_open_any(D, counts, caps, labels, entries=None):
    """:func:`fill_nearest_open`, by its NumPy twin while numba compiles it (small fills).

    ``entries``: the distance entries (rows x parts) of the whole fill that ``D`` is a
    block of (None: ``D.size``). Only a fill of at most :data:`NUMPY_TWIN_MAX_ENTRIES`
    takes the twin, whatever its blocks: the twin's Python step per row would cost a
    large fill far more than the compile. The twin (see :mod:`._jit`) takes the same
    decisions row by row, so the labels and counts are identical.
    """
    entries = D.size if entries is None else int(entries)
    nearest = np.argmin(D, axis=1)  # vectorised; the loop then scans only rows it cannot take
    if entries <= NUMPY_TWIN_MAX_ENTRIES and not _jit.ready(fill_nearest_open, D, nearest,
                                                            counts, caps, labels):
        _fill_nearest_open_numpy(D, counts, caps, labels)
    else:
        fill_nearest_open(D, nearest, counts, caps, labels)


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
def fill_nearest_open(D, nearest, counts, caps, labels):
    """Give each row of ``D``, in order, to its nearest part that is not yet full.

    ``D[i, j]`` is the (squared) distance of sample i to centre j; part j is
    full once ``counts[j] == caps[j]``. ``counts`` is updated in place, so
    consecutive blocks of rows can be filled one after another. Ties go to
    the lowest part index, as the strict ``dist < mindis`` of the paper.

    ``nearest``: ``np.argmin(D, axis=1)``, each row's nearest part whether full or not
    (the lowest of equal minima, or the first NaN). Where that part has room and the
    distance is finite it is the one the paper's scan would find, and the row takes it
    at once; the other rows (their nearest part full, or NaN or infinite distances) scan
    every part. A fill of 10 million rows into 4,883 parts is 5e10 distances, so a fill
    costs what it does per distance: one vectorised argmin, without the scan's branch per
    part, for every row whose nearest part has room.
    """
    n, p = D.shape
    for i in range(n):
        best = nearest[i]
        if not (counts[best] < caps[best] and D[i, best] < np.inf):
            best = -1
            best_d = np.inf
            for j in range(p):
                if counts[j] < caps[j] and D[i, j] < best_d:
                    best_d = D[i, j]
                    best = j
        counts[best] += 1
        labels[i] = best


@njit(nogil=True, cache=True)
def fill_from_candidates(cand, cand_d, start, counts, caps, labels):
    """:func:`fill_nearest_open` from each row's first candidates instead of its distances.

    ``cand[i]`` (ints, ``r`` a row) are the first ``r`` parts of row ``i`` in the order
    (distance, part) among those not full when the block began, ``cand_d[i]`` their
    distances. Parts only fill, so a row's first candidate with room left is the part the
    scan would find, unless the row's distances run out first: from row ``start`` on,
    each row takes it, until a row none of whose candidates has room, or whose next
    candidate is not at a finite distance (an infinite or NaN distance, or a part full at
    the start, which the caller marks infinite): that row is returned for the caller to
    scan in full (``cand.shape[0]`` when every row took a part).
    """
    n, r = cand.shape
    for i in range(start, n):
        best = -1
        for t in range(r):
            if not cand_d[i, t] < np.inf:
                break
            if counts[cand[i, t]] < caps[cand[i, t]]:
                best = cand[i, t]
                break
        if best < 0:
            return i
        counts[best] += 1
        labels[i] = best
    return n


#: Entries (rows x P) of a distance block of :func:`nearest_centre_sums_numpy`: small
#: enough to stay in cache while each feature's column is subtracted, large enough
#: that NumPy's per-call cost is spread over many entries.
NUMPY_TWIN_BLOCK_ENTRIES = 1 << 16


@njit(nogil=True, cache=True)
def nearest_centre_sums(X, centers_t, half_norms, block_rows, labels, sums, counts):
    """One Lloyd pass fused: nearest centre of every row, and per-block sums and counts.

    The nearest centre minimises ``||c||^2 / 2 - x.c`` (the squared distance
    halved, less the row's own norm): ``s = half_norms[j]``, then
    ``s -= X[i, k] * centers_t[k, j]`` for k in order, each product rounded
    (no fastmath, so no reassociation and no fused multiply-add: the order is
    the one :func:`nearest_centre_sums_numpy` repeats with NumPy, and the
    loop over the centres still vectorises). Ties go to the lowest index, a
    NaN is never nearest (the strict ``<``). Rows ``[b * block_rows,
    (b + 1) * block_rows)`` are added, in row order, into ``sums[b]`` and
    counted in ``counts[b]`` (zero them first). One sweep over X, nothing of
    size n x P is written: for small ``P * d`` this beats a GEMM followed by
    an argmin and a separate sum.
    """
    n, d = X.shape
    p = centers_t.shape[1]
    s = np.empty((4, p), dtype=half_norms.dtype)
    for b in range((n + block_rows - 1) // block_rows):
        stop = min((b + 1) * block_rows, n)
        # Four rows at a time: each centre column loaded once serves four rows.
        for i0 in range(b * block_rows, stop, 4):
            m = min(4, stop - i0)
            for r in range(4):
                for j in range(p):
                    s[r, j] = half_norms[j]
            if m == 4:
                for k in range(d):
                    x0, x1, x2, x3 = X[i0, k], X[i0 + 1, k], X[i0 + 2, k], X[i0 + 3, k]
                    for j in range(p):
                        c = centers_t[k, j]
                        s[0, j] -= x0 * c
                        s[1, j] -= x1 * c
                        s[2, j] -= x2 * c
                        s[3, j] -= x3 * c
            else:
                for r in range(m):
                    for k in range(d):
                        xk = X[i0 + r, k]
                        for j in range(p):
                            s[r, j] -= xk * centers_t[k, j]
            for r in range(m):
                best = 0
                best_s = np.inf
                for j in range(p):
                    if s[r, j] < best_s:
                        best_s = s[r, j]
                        best = j
                labels[i0 + r] = best
                counts[b, best] += 1
                for k in range(d):
                    sums[b, best, k] += X[i0 + r, k]


def nearest_centre_sums_numpy(X, centers_t, half_norms, block_rows, labels, sums, counts):
    """:func:`nearest_centre_sums` in NumPy, bit for bit: labels, sums and counts.

    The same arithmetic, elementwise over a block of rows at a time: each
    product rounded, then subtracted, feature after feature (a GEMM would add
    the products in its own order and could break near-ties otherwise). Each
    row block's sums are a sparse one-hot product, which adds each part's rows
    one after another in row order, as the loop.
    """
    n, d = X.shape
    p = centers_t.shape[1]
    rows = max(1, min(NUMPY_TWIN_BLOCK_ENTRIES // p, n))
    # Centres by rows, so that each elementwise step runs along the block's rows
    # (contiguous, however few the centres and however many the features).
    s = np.empty((p, rows), dtype=half_norms.dtype)
    product = np.empty_like(s)
    nan = np.empty(s.shape, dtype=bool)
    column = half_norms[:, None]
    for a in range(0, n, rows):
        z = min(a + rows, n) - a
        sz, pz, nz = s[:, :z], product[:, :z], nan[:, :z]
        block_t = np.ascontiguousarray(X[a:a + z].T)
        sz[...] = column
        for k in range(d):
            np.multiply(centers_t[k, :, None], block_t[k], out=pz)
            np.subtract(sz, pz, out=sz)
        np.isnan(sz, out=nz)
        sz[nz] = np.inf  # argmin would pick a NaN; the loop's strict < passes over it
        np.argmin(sz, axis=0, out=labels[a:a + z])
    for b in range(sums.shape[0]):
        a, z = b * block_rows, min((b + 1) * block_rows, n)
        sizes = np.bincount(labels[a:z], minlength=p)
        counts[b] += sizes
        # Part j's row of the one-hot matrix lists its rows in order, and the
        # product adds 1.0 * x for each in that order, as the loop's sums[b, j] += x.
        onehot = sparse.csr_matrix(
            (np.ones(z - a, dtype=X.dtype), np.argsort(labels[a:z], kind="stable"),
             np.concatenate(([0], np.cumsum(sizes)))), shape=(p, z - a))
        sums[b] = onehot @ X[a:z]
