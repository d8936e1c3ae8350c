"""Each row's k nearest vectors, merged part by part: the inner step of CA-SVM's
``combine="neighbors"`` (:func:`gpuml.routing.neighbor_blocks`).

A row's candidates arrive one part at a time as inner products ``G = X_rows @ V_p.T``;
:meth:`NearestMerge.add` turns them into squared distances (in place: the caller reuses
them for the part's kernel values) and keeps, per row, the ``k`` smallest seen so far
with the part that holds each. Candidates are ordered by (distance, part, column), so
among vectors exactly as near as a row's k-th those of lower parts, then lower columns,
count: the kept set depends neither on the order the parts arrive in nor on the
implementation. Two implementations:

* **numba** (host): two passes over each row of ``G`` (the distances, then the
  comparisons); each row keeps its k nearest sorted farthest first, and a candidate
  replaces the farthest only when nearer. Once the row's k best are near, whole
  stretches of candidates are rejected by one vectorised count. Nothing of the
  candidates' size is written beside ``G``.
* **array twin** (CuPy, and the host while numba compiles the loop, see
  :mod:`.._jit`): a stable sort of each row's kept and new candidates.

:meth:`NearestMerge.search` runs a whole search on the host in one compiled function:
for every part, the GEMM of its rows (numba's ``np.dot``, the BLAS SciPy loads) and the
merge loop, without a step of the interpreter per part (a model of hundreds of parts).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..._backend import is_cupy_array, namespace_of, to_numpy
from ..pairwise import gram_to_sq_distances

#: A candidate's rank among equally near ones: ``part << COLUMN_BITS | column``.
COLUMN_BITS = 32
#: The rank of an empty slot: after every candidate.
EMPTY_RANK = np.iinfo(np.int64).max


#: Candidates the merge loop tests at once (one vectorised count) before it looks at
#: them one by one: most stretches of a row hold none nearer than its k-th kept.
MERGE_STRETCH = 64


@njit(nogil=True, cache=True)
def _merge_loop(G, minus_two, x_norms, v_norms, rows, part, best_d, best_r):
    """:meth:`NearestMerge.add`'s host loop: row ``i``'s kept candidates are sorted
    farthest first by (distance, rank) in ``best_d[i]``, ``best_r[i]``.

    Per row, one pass turns the inner products into distances (a loop the compiler
    vectorises); a second counts, :data:`MERGE_STRETCH` candidates at a time, those
    no farther than the farthest kept (a vectorised count: most stretches hold none)
    and compares those of the other stretches one by one. A nearer candidate replaces
    the farthest and moves to its place in the order.
    """
    m2 = minus_two[0]
    zero = m2 - m2
    k = best_d.shape[1]
    m = G.shape[1]
    base = np.int64(part) << COLUMN_BITS
    for r in range(G.shape[0]):
        g = G[r]
        xn = x_norms[r]
        for j in range(m):
            # gram_to_sq_distances' arithmetic and order, row by row
            d = (g[j] * m2 + v_norms[j]) + xn
            g[j] = zero if d < 0 else d
        i = rows[r]
        hd = best_d[i]
        hr = best_r[i]
        # the farthest kept, in G's dtype: exact, as every kept distance came from one
        top_d = G.dtype.type(hd[0])
        top_r = hr[0]
        for start in range(0, m, MERGE_STRETCH):
            stop = min(start + MERGE_STRETCH, m)
            near = 0
            for j in range(start, stop):
                near += g[j] <= top_d
            if near == 0:
                continue
            for j in range(start, stop):
                d = g[j]
                if d <= top_d:
                    rank = base + j
                    if d < top_d or rank < top_r:
                        pos = 0
                        while pos + 1 < k and (hd[pos + 1] > d or (hd[pos + 1] == d
                                                                   and hr[pos + 1] > rank)):
                            hd[pos] = hd[pos + 1]
                            hr[pos] = hr[pos + 1]
                            pos += 1
                        hd[pos] = d
                        hr[pos] = rank
                        top_d = G.dtype.type(hd[0])
                        top_r = hr[0]


@njit(nogil=True, cache=True)
def _search_loop(X, x_norms, rows, segments, vectors, offsets, v_norms, minus_two, best_d,
                 best_r):
    """:meth:`NearestMerge.search`'s loop: segment ``(p, a, b)`` merges part ``p``'s
    candidates for the rows ``rows[a:b]``."""
    for s in range(segments.shape[0]):
        p = segments[s, 0]
        mine = rows[segments[s, 1]:segments[s, 2]]
        a, b = offsets[p], offsets[p + 1]
        if mine.shape[0] == 0 or b == a:
            continue
        G = np.dot(X[mine], vectors[a:b].T)
        _merge_loop(G, minus_two, x_norms[mine], v_norms[a:b], mine, p, best_d, best_r)


def _merge_array(G, x_norms, v_norms, rows, part, best_d, best_r):
    """:meth:`NearestMerge.add` by array operations on G's device: each row's kept and
    new candidates sorted by (distance, rank) (two stable sorts), the k first kept,
    farthest first (as the loop keeps them, should it take the next merge)."""
    xp = namespace_of(G)
    gram_to_sq_distances(G, x_norms, v_norms)
    ranks = (int(part) << COLUMN_BITS) + xp.arange(G.shape[1], dtype=np.int64)
    _keep_nearest(xp, rows, G.astype(best_d.dtype, copy=False),
                  xp.broadcast_to(ranks, G.shape), best_d, best_r)


def _keep_nearest(xp, rows, new_d, new_r, best_d, best_r):
    """The rows ``rows``' kept candidates and the new ones (``new_d``, ``new_r``: a row of
    candidates per row) sorted by (distance, rank) (two stable sorts), the k first kept,
    farthest first."""
    k = best_d.shape[1]
    sel = xp.asarray(rows)
    cand_d = xp.concatenate([best_d[sel], new_d], axis=1)
    cand_r = xp.concatenate([best_r[sel], new_r], axis=1)
    by_rank = xp.argsort(cand_r, axis=1, kind="stable")
    cand_d = xp.take_along_axis(cand_d, by_rank, axis=1)
    cand_r = xp.take_along_axis(cand_r, by_rank, axis=1)
    keep = xp.argsort(cand_d, axis=1, kind="stable")[:, :k][:, ::-1]
    best_d[sel] = xp.take_along_axis(cand_d, keep, axis=1)
    best_r[sel] = xp.take_along_axis(cand_r, keep, axis=1)


class NearestMerge:
    """The ``k`` nearest candidates of ``n`` rows so far, and the part of each.

    ``best_d`` (float64) and ``best_r`` (int64: ``part << COLUMN_BITS | column``,
    :data:`EMPTY_RANK` for an empty slot) have shape ``(n, k)`` on the rows' device;
    :meth:`add` merges one part's candidates.
    """

    def __init__(self, xp, n: int, k: int):
        self.best_d = xp.full((n, k), np.inf, dtype=np.float64)
        self.best_r = xp.full((n, k), EMPTY_RANK, dtype=np.int64)

    def add(self, G, x_norms, v_norms, rows, part: int):
        """Merge the candidates of part ``part`` for the rows ``rows`` (host indices).

        ``G`` (dense, ``len(rows) x m``) holds the rows' inner products with the
        part's ``m`` vectors, ``x_norms`` and ``v_norms`` their squared norms; on
        return ``G`` holds the squared distances (as :func:`gpuml.kernels.pairwise.sq_distances`
        computes them).
        """
        from .. import _jit

        if G.shape[0] == 0 or G.shape[1] == 0:
            return
        if G.shape[1] >= 1 << COLUMN_BITS:
            raise ValueError(f"a part of {G.shape[1]} vectors: at most 2**{COLUMN_BITS}")
        if is_cupy_array(G):
            _merge_array(G, x_norms, v_norms, rows, part, self.best_d, self.best_r)
            return
        args = (G, np.full(1, -2.0, dtype=G.dtype), x_norms.astype(G.dtype, copy=False),
                v_norms.astype(G.dtype, copy=False), np.asarray(rows, dtype=np.int64),
                int(part), self.best_d, self.best_r)
        if _jit.ready(_merge_loop, *args):
            _merge_loop(*args)
        else:
            _merge_array(G, args[2], args[3], rows, part, self.best_d, self.best_r)

    def search(self, X, x_norms, rows, segments, vectors, offsets, v_norms) -> bool:
        """Merge the candidates of several parts in one compiled loop (host arrays): each
        segment ``(p, a, b)`` of ``segments`` (int rows, in the order given) merges part
        ``p``'s vectors ``vectors[offsets[p]:offsets[p + 1]]`` (sorted by part, squared
        norms ``v_norms``) for the rows ``rows[a:b]`` (indices into ``X`` and the kept
        candidates, ``x_norms`` their squared norms). The same kept candidates as
        :meth:`add` segment by segment with ``G = X[rows[a:b]] @ V_p.T`` (``X`` and
        ``vectors`` of one dtype, C-contiguous). Returns False, merging nothing, while the
        loop is not compiled yet.

        >>> X = np.array([[0.0], [3.0]])
        >>> merge = NearestMerge(np, 2, 1)
        >>> done = merge.search(X, X[:, 0] ** 2, np.array([0, 1]), np.array([[0, 0, 2],
        ...                     [1, 0, 2]]), np.array([[1.0], [2.0]]), np.array([0, 1, 2]),
        ...                     np.array([1.0, 4.0]))
        >>> not done or merge.counts(2)[0].tolist() == [[1.0, 0.0], [0.0, 1.0]]
        True
        """
        from .. import _jit
        from .._threads import blas_controller

        if vectors.shape[0] >= 1 << COLUMN_BITS:
            raise ValueError(f"{vectors.shape[0]} vectors: at most 2**{COLUMN_BITS}")
        args = (X, np.ascontiguousarray(x_norms, dtype=X.dtype), np.asarray(rows, dtype=np.int64),
                np.ascontiguousarray(segments, dtype=np.int64).reshape(-1, 3), vectors,
                np.asarray(offsets, dtype=np.int64),
                np.ascontiguousarray(v_norms, dtype=X.dtype), np.full(1, -2.0, dtype=X.dtype),
                self.best_d, self.best_r)
        if not _jit.ready(_search_loop, *args, from_cache=True):
            return False
        # numba's np.dot: SciPy's BLAS, on one thread (see .values.rbf_part_values)
        with blas_controller().limit(limits=1, user_api="blas"):
            _search_loop(*args)
        return True

    def absorb(self, rows, best_d, best_r):
        """Merge the candidates another merge kept for the rows ``rows`` (its ``best_d`` and
        ``best_r``, as :class:`NearestMerge` holds them): afterwards each row keeps the
        ``k`` nearest of both, by the same rule as :meth:`add` (parts searched apart, on
        several machines, then merged, keep what one search of them all keeps).

        >>> a, b = NearestMerge(np, 1, 2), NearestMerge(np, 1, 2)
        >>> a.add(np.zeros((1, 2)), np.zeros(1), np.array([1.0, 4.0]), [0], 0)
        >>> b.add(np.zeros((1, 1)), np.zeros(1), np.array([1.0]), [0], 3)
        >>> a.absorb([0], b.best_d, b.best_r)
        >>> a.counts(4)[0].tolist()
        [[1.0, 0.0, 0.0, 1.0]]
        """
        xp = namespace_of(self.best_d)
        if len(rows):
            _keep_nearest(xp, rows, xp.asarray(best_d), xp.asarray(best_r), self.best_d,
                          self.best_r)

    def parts_of(self) -> np.ndarray:
        """``(n, k)`` host array: the part of each kept candidate (-1 for an empty slot)."""
        ranks = to_numpy(self.best_r)
        return np.where(ranks != EMPTY_RANK, ranks >> COLUMN_BITS, -1)

    def shares(self):
        """Each row's share of its kept candidates held by each part where it is not zero:
        ``(rows, parts, shares)`` (host), ordered by part then row; the entries of
        :meth:`counts` divided by the row's candidates, without its ``(n, n_parts)`` array.

        >>> merge = NearestMerge(np, 2, 2)
        >>> merge.add(np.zeros((2, 2)), np.zeros(2), np.array([1.0, 2.0]), [0, 1], 5)
        >>> [a.tolist() for a in merge.shares()]
        [[0, 1], [5, 5], [1.0, 1.0]]
        """
        parts = self.parts_of()
        n, k = parts.shape
        found = parts >= 0
        line = np.repeat(np.arange(n, dtype=np.int64), k)[found.ravel()]
        keys, counts = np.unique(parts[found] * max(n, 1) + line, return_counts=True)
        rows, parts = keys % max(n, 1), keys // max(n, 1)
        return rows, parts, counts.astype(np.float64) / np.maximum(found.sum(axis=1), 1)[rows]

    def counts(self, n_parts: int):
        """``(n, n_parts)`` host array: how many of each row's kept candidates each part holds,
        and ``(n,)`` how many each row kept in all."""
        parts = self.parts_of()
        found = parts >= 0
        n, k = parts.shape
        line = np.repeat(np.arange(n), k)[found.ravel()]
        out = np.bincount(line * n_parts + parts[found], minlength=n * n_parts)
        return out.reshape(n, n_parts).astype(np.float64), found.sum(axis=1)
