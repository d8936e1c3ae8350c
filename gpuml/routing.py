"""Nearest-centre routing of new rows to the parts of a partitioned model (You 2020, Alg 5).

:func:`route` sends each row to the part of its nearest centre;
:func:`neighbor_weights` weighs the parts by how many of a row's nearest
support vectors each holds (CA-SVM's ``combine="neighbors"``).
"""

from __future__ import annotations

import numpy as np

from ._backend import namespace_of, to_numpy
from .pairwise import sq_distances, squared_norms
from .partition import assign_nearest


def route(X, centers):
    """Part index of every row of ``X`` (step 3), on the host."""
    if centers.shape[0] == 1:
        return np.zeros(X.shape[0], dtype=np.int64)
    return to_numpy(assign_nearest(X, centers))


#: Bytes of one block of test-to-support-vector distances in :func:`neighbor_weights`.
NEIGHBOR_BLOCK_BYTES = 64 << 20
#: :func:`neighbor_weights` searches a row's nearest support vectors among those of its
#: ``NEIGHBOR_PARTS`` nearest parts (by centre) when the model has more parts with
#: support vectors, so that a row's cost stays bounded as P grows with n.
NEIGHBOR_PARTS = 16


def neighbor_weights(X, vectors, vector_part, n_parts: int, n_neighbors: int,
                     centers=None, n_searched: int | None = None) -> np.ndarray:
    """Each row's share of its ``n_neighbors`` nearest ``vectors`` held by each part (host).

    ``vectors`` (on X's device, dense or CSR) are the fitted support vectors and
    ``vector_part`` (host) the part of each. Row ``i`` of the result (shape
    ``(n, n_parts)``) sums to 1: part ``p`` weighs ``k_p / k`` where ``k_p`` of the
    row's ``k`` nearest vectors (Euclidean) are part ``p``'s.

    The search: among every vector (``k = min(n_neighbors, len(vectors))``)
    when at most ``n_searched`` parts hold vectors or ``centers`` is None;
    otherwise among the vectors of the row's ``n_searched`` nearest parts that
    hold any (by the distance to ``centers``, the parts' routing centres; ``k``
    at most the vectors found there; ``n_searched`` None: :data:`NEIGHBOR_PARTS`).
    The distances are computed in row blocks of at most
    :data:`NEIGHBOR_BLOCK_BYTES` (one GEMM per block, or per block and part, and
    a partial sort each, on X's device). Which of several equally
    distant vectors counts at the k-th place is the partial sort's choice
    (deterministic for a given backend).
    """
    n_searched = NEIGHBOR_PARTS if n_searched is None else int(n_searched)
    owner_host = np.asarray(vector_part, dtype=np.int64)
    held = np.flatnonzero(np.bincount(owner_host, minlength=n_parts))
    if centers is None or held.size <= n_searched:
        return _all_neighbor_weights(X, vectors, owner_host, n_parts, n_neighbors)
    return _near_parts_neighbor_weights(X, vectors, owner_host, n_parts, n_neighbors,
                                        centers, held, n_searched)


def _all_neighbor_weights(X, vectors, owner_host, n_parts, n_neighbors):
    """:func:`neighbor_weights` searching every vector."""
    xp = namespace_of(X)
    n, m = X.shape[0], vectors.shape[0]
    k = min(int(n_neighbors), m)
    owner = xp.asarray(owner_host)
    weights = xp.zeros((n, n_parts), dtype=np.float64)
    y_norms = squared_norms(vectors)
    rows = max(1, NEIGHBOR_BLOCK_BYTES // max(1, 8 * m))
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        D = sq_distances(X[start:stop], vectors, y_norms)
        # A partial sort: O(m) per row, where a full sort of the row would cost more
        # than the GEMM that made it.
        nearest = owner[xp.argpartition(D, k - 1, axis=1)[:, :k]]
        block = weights[start:stop]
        line = xp.arange(stop - start)
        for j in range(k):  # one neighbour per row at a time: no repeated index within a step
            block[line, nearest[:, j]] += 1.0
    weights /= k
    return to_numpy(weights)


def _near_parts_neighbor_weights(X, vectors, owner_host, n_parts, n_neighbors, centers, held,
                                 n_searched):
    """:func:`neighbor_weights` searching the vectors of each row's ``n_searched`` nearest
    parts among ``held`` (the parts with vectors): part by part, each part's ``k``
    nearest merged into the row's ``k`` best so far."""
    xp = namespace_of(X)
    n = X.shape[0]
    k = int(n_neighbors)
    order = np.argsort(owner_host, kind="stable")
    ends = np.searchsorted(owner_host[order], np.arange(n_parts + 1))
    members = {int(p): xp.asarray(order[ends[p]:ends[p + 1]]) for p in held}
    part_vectors = {p: vectors[idx] for p, idx in members.items()}
    part_norms = {p: squared_norms(v) for p, v in part_vectors.items()}
    held_centers = xp.asarray(centers)[xp.asarray(held)]
    widest = max(v.shape[0] for v in part_vectors.values())
    out = np.zeros((n, n_parts), dtype=np.float64)
    rows = max(1, NEIGHBOR_BLOCK_BYTES // (8 * (widest + 2 * k)))
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        Xb = X[start:stop]
        near = to_numpy(xp.argpartition(sq_distances(Xb, held_centers), n_searched - 1,
                                        axis=1)[:, :n_searched])
        best_d = xp.full((stop - start, k), np.inf)
        best_p = xp.full((stop - start, k), -1, dtype=np.int64)
        for j in np.unique(near).tolist():
            p = int(held[j])
            sel_host = np.flatnonzero((near == j).any(axis=1))
            sel = xp.asarray(sel_host)
            D = sq_distances(Xb[sel], part_vectors[p], part_norms[p])
            if D.shape[1] > k:
                D = xp.take_along_axis(D, xp.argpartition(D, k - 1, axis=1)[:, :k], axis=1)
            cand_d = xp.concatenate([best_d[sel], D.astype(np.float64, copy=False)], axis=1)
            cand_p = xp.concatenate([best_p[sel], xp.full(D.shape, p, dtype=np.int64)], axis=1)
            keep = xp.argpartition(cand_d, k - 1, axis=1)[:, :k]
            best_d[sel] = xp.take_along_axis(cand_d, keep, axis=1)
            best_p[sel] = xp.take_along_axis(cand_p, keep, axis=1)
        best_p = to_numpy(best_p)
        found = best_p >= 0
        line = np.repeat(np.arange(stop - start), k)[found.ravel()]
        block = out[start:stop]
        np.add.at(block, (line, best_p[found]), 1.0)
        block /= found.sum(axis=1, keepdims=True)
    return out
