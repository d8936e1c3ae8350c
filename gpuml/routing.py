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


def neighbor_weights(X, vectors, vector_part, n_parts: int, n_neighbors: int) -> np.ndarray:
    """Each row's share of its ``n_neighbors`` nearest ``vectors`` held by each part (host).

    ``vectors`` (on X's device, dense or CSR) are the fitted support vectors and
    ``vector_part`` (host) the part of each. Row ``i`` of the result (shape
    ``(n, n_parts)``) sums to 1: part ``p`` weighs ``k_p / k`` where ``k_p`` of the
    row's ``k = min(n_neighbors, len(vectors))`` nearest vectors (Euclidean) are
    part ``p``'s. The distances are computed in row blocks of at most
    :data:`NEIGHBOR_BLOCK_BYTES` (one GEMM and one partial sort each, on X's
    device). Which of several equally distant vectors counts at the k-th place
    is the partial sort's choice (deterministic for a given backend).
    """
    xp = namespace_of(X)
    n, m = X.shape[0], vectors.shape[0]
    k = min(int(n_neighbors), m)
    owner = xp.asarray(np.asarray(vector_part, dtype=np.int64))
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
