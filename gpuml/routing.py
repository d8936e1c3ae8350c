"""Nearest-centre routing of new rows to the parts of a partitioned model (You 2020, Alg 5).

:func:`route` sends each row to the part of its nearest centre;
:func:`neighbor_weights` weighs the parts by how many of a row's nearest
support vectors each holds (CA-SVM's ``combine="neighbors"``), and :func:`neighbor_blocks` hands the
distances it computed on to the parts' kernel values.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ._backend import namespace_of, to_numpy
from .kernels.pairwise import gram, sq_distances, squared_norms
from .partition import assign_nearest


def route(X, centers):
    """Part index of every row of ``X`` (step 3), on the host."""
    if centers.shape[0] == 1:
        return np.zeros(X.shape[0], dtype=np.int64)
    return to_numpy(assign_nearest(X, centers))


def part_runs(owner, n_parts: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of each part by one stable sort of ``owner`` (host ints in ``[0, n_parts)``,
    a part per row): ``(order, offsets)``, part ``p``'s rows (ascending) being
    ``order[offsets[p]:offsets[p + 1]]``. A scan of ``owner`` per part would cost rows x
    parts (a model of thousands of parts).

    >>> order, offsets = part_runs(np.array([2, 0, 2]), 3)
    >>> order.tolist(), offsets.tolist()
    ([1, 0, 2], [0, 1, 1, 3])
    """
    owner = np.asarray(owner, dtype=np.int64)
    order = np.argsort(owner, kind="stable")
    return order, np.searchsorted(owner[order], np.arange(n_parts + 1))


def rows_by_part(owner) -> list[tuple[int, np.ndarray]]:
    """``(p, rows)`` for every part ``p`` in ``owner`` (:func:`part_runs`), in increasing
    ``p``, ``rows`` ascending.

    >>> [(p, r.tolist()) for p, r in rows_by_part(np.array([2, 0, 2, 5]))]
    [(0, [1]), (2, [0, 2]), (5, [3])]
    """
    owner = np.asarray(owner)
    if owner.size == 0:
        return []
    order, offsets = part_runs(owner, int(owner.max()) + 1)
    present = np.flatnonzero(np.diff(offsets)).tolist()
    return [(p, order[offsets[p]:offsets[p + 1]]) for p in present]


#: Bytes of the distances that one block of rows keeps in :func:`neighbor_blocks` (a
#: prediction's memory beside its output is about twice this).
NEIGHBOR_BLOCK_BYTES = 32 << 20
#: :func:`neighbor_blocks` searches a row's nearest support vectors among those of its
#: ``NEIGHBOR_PARTS`` nearest parts (by centre) when the model has more parts with
#: support vectors, so that a row's cost stays bounded as P grows with n: within 0.07 point
#: of searching every part on 100,000 to 400,000 rows
#: (bench/results/cpu-2core/casvm_neighbours_large.md). Eight cost 0.6-0.9 of the time
#: for up to 0.085 point less on bench/results/cpu-2core/casvm_predict.md, but up to 1.2
#: points at P = 16 with splits whose centres say little (bench/results/cpu-2core/casvm-runs.md).
NEIGHBOR_PARTS = 16


class PartVectors:
    """The fitted support vectors split by part, with their squared norms, on one device.

    ``vectors`` (dense or CSR, on the device the search runs on) and ``vector_part``
    (host: the part of each); the split is made once and serves every block of
    every prediction that keeps it. ``vectors[p]`` and ``norms[p]`` for each part
    ``p`` in ``held`` (the parts with vectors), in the order they have in ``vectors``.

    >>> import numpy as np
    >>> parts = PartVectors(np.eye(3), np.array([1, 0, 1]), n_parts=3)
    >>> parts.held.tolist(), parts.vectors[1].tolist()
    ([0, 1], [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    """

    def __init__(self, vectors, vector_part, n_parts: int):
        xp = namespace_of(vectors)
        owner = np.asarray(vector_part, dtype=np.int64)
        self.n_parts = int(n_parts)
        self.n_vectors = owner.size
        self.dtype = np.dtype(vectors.dtype)
        self.held = np.flatnonzero(np.bincount(owner, minlength=n_parts))
        #: the vectors sorted by part, and where each part's run starts (:func:`part_runs`)
        self.order, self.offsets = part_runs(owner, n_parts)
        ends = self.offsets
        if hasattr(vectors, "tocsr"):  # CSR, on the host or a GPU
            self.sorted = self.sorted_norms = None
            self.vectors = {int(p): vectors[xp.asarray(self.order[ends[p]:ends[p + 1]])]
                            for p in self.held}
            self.norms = {p: squared_norms(v) for p, v in self.vectors.items()}
        else:
            #: dense vectors: all of them sorted by part, and their squared norms
            #: (``vectors[p]`` and ``norms[p]`` are slices of these)
            self.sorted = vectors[xp.asarray(self.order)]
            self.sorted_norms = squared_norms(self.sorted)
            self.vectors = {int(p): self.sorted[ends[p]:ends[p + 1]] for p in self.held}
            self.norms = {int(p): self.sorted_norms[ends[p]:ends[p + 1]] for p in self.held}
        self.widest = max((v.shape[0] for v in self.vectors.values()), default=1)


def neighbor_weights(X, vectors, vector_part, n_parts: int, n_neighbors: int,
                     centers=None, n_searched: int | None = None) -> np.ndarray:
    """Each row's share of its ``n_neighbors`` nearest ``vectors`` held by each part (host).

    ``vectors`` (on X's device, dense or CSR) are the fitted support vectors and
    ``vector_part`` (host) the part of each. Row ``i`` of the result (shape
    ``(n, n_parts)``) sums to 1: part ``p`` weighs ``k_p / k`` where ``k_p`` of the
    row's ``k`` nearest vectors (Euclidean) are part ``p``'s. Which vectors are
    searched: see :func:`neighbor_blocks`.
    """
    out = np.zeros((X.shape[0], n_parts), dtype=np.float64)
    parts = PartVectors(vectors, vector_part, n_parts)
    for start, stop, weights, _ in neighbor_blocks(X, parts, n_neighbors, centers, n_searched,
                                                   distances=False):
        out[start:stop] = weights
    return out


def neighbor_blocks(X, parts: PartVectors, n_neighbors: int, centers=None,
                    n_searched: int | None = None, distances: bool = True):
    """:func:`neighbor_weights` by blocks of rows, with the distances it computed.

    Yields ``(start, stop, weights, distances)`` for consecutive blocks of ``X``:
    ``weights`` the block's rows of :func:`neighbor_weights` (host), ``distances``
    a list of ``(p, rows, D)``, one per part searched: ``D`` the squared distances (on
    X's device, as :func:`gpuml.kernels.pairwise.sq_distances`) of the block's rows ``rows`` (host
    indices into the block) to part ``p``'s vectors (``parts.vectors[p]``,
    :class:`PartVectors`).
    A caller may overwrite ``D``; on the host it holds until the next block is asked for
    (the blocks share one workspace). Every part a row weighs has a piece holding that row.
    With ``distances=False`` (the caller does not read them) a block's search may run in one
    compiled loop that keeps none, and yield None for them
    (:meth:`~gpuml.kernels.nearest.neighbors.NearestMerge.search`: on the host, dense rows
    of the dtype of ``parts``, once numba has compiled it).

    The search: among every vector (``k = min(n_neighbors, number of vectors)``)
    when at most ``n_searched`` parts hold vectors or ``centers`` is None;
    otherwise among the vectors of the row's ``n_searched`` nearest parts that
    hold any (by the distance to ``centers``, the parts' routing centres; ``k``
    at most the vectors found there; ``n_searched`` None: :data:`NEIGHBOR_PARTS`).
    One GEMM per block and part, the rows' ``k`` nearest merged part by part
    (:class:`gpuml.kernels.nearest.neighbors.NearestMerge`); a block keeps at most
    :data:`NEIGHBOR_BLOCK_BYTES` of distances. Among vectors exactly as near as a
    row's k-th, those of lower parts, then of lower positions within their part, count
    (whatever the device, the blocks and the order the parts are searched in).
    """
    from .kernels.nearest.neighbors import NearestMerge

    xp = namespace_of(X)
    held = parts.held
    k, searched = search_width(held.size, parts.n_vectors, n_neighbors,
                               held.size if centers is None else n_searched)
    held_centers = None if centers is None else xp.asarray(centers)[xp.asarray(held)]
    itemsize = max(np.dtype(X.dtype).itemsize, parts.dtype.itemsize)
    rows = max(1, NEIGHBOR_BLOCK_BYTES // (itemsize * searched * parts.widest + 16 * k))
    dense = xp is np and not sp.issparse(X) and not any(map(sp.issparse, parts.vectors.values()))
    # the whole search of a block in one compiled loop (NearestMerge.search), where the
    # rows and the sorted vectors share a dtype and no distances are asked for
    compiled = (not distances and dense and parts.sorted is not None
                and X.dtype == parts.dtype)
    work = None
    for start in range(0, X.shape[0], rows):
        stop = min(start + rows, X.shape[0])
        Xb = X[start:stop]
        used = 0
        x_norms = squared_norms(Xb)
        if held_centers is None:
            near = np.broadcast_to(np.arange(held.size), (stop - start, held.size))
        else:
            near = nearest_parts(Xb, held_centers, searched)
        merge = NearestMerge(xp, stop - start, k)
        runs, bounds, sequence = _search_runs(near, held.size)
        if compiled and merge.search(
                np.ascontiguousarray(Xb), x_norms, runs,
                np.stack([held[sequence], bounds[sequence], bounds[sequence + 1]], axis=1),
                parts.sorted, parts.offsets, parts.sorted_norms):
            yield start, stop, _shares(merge, parts.n_parts), None
            continue
        if dense and work is None:
            # The distances of a block go to one workspace on the host, reused block after
            # block (fresh arrays of tens of MiB cost page faults, on some machines as much
            # as the GEMMs).
            work = np.empty(min(rows, X.shape[0]) * searched * parts.widest,
                            dtype=np.result_type(X.dtype, parts.dtype))
        groups = [(j, runs[bounds[j]:bounds[j + 1]]) for j in sequence.tolist()]
        pieces = []
        for j, sel in groups:
            p = int(held[j])
            if sel.size == Xb.shape[0]:  # every row of the block (ascending, unique)
                Xs, xs_norms = Xb, x_norms
            else:
                sel_d = xp.asarray(sel)
                Xs, xs_norms = Xb[sel_d], x_norms[sel_d]
            if work is None:
                G = gram(Xs, parts.vectors[p])
            else:
                V = parts.vectors[p]
                G = work[used:used + Xs.shape[0] * V.shape[0]].reshape(Xs.shape[0], V.shape[0])
                used += G.size
                np.matmul(Xs, V.T, out=G)
            merge.add(G, xs_norms, parts.norms[p], sel, p)
            pieces.append((p, sel, G))
        yield start, stop, _shares(merge, parts.n_parts), pieces


def search_width(n_held: int, n_vectors: int, n_neighbors: int,
                 n_searched: int | None = None) -> tuple[int, int]:
    """``(k, searched)`` of :func:`neighbor_blocks`' search: a row keeps its ``k`` nearest
    vectors found among those of its ``searched`` nearest parts, of the ``n_held`` parts
    that hold the ``n_vectors`` vectors. Every part is searched when there are at most
    ``n_searched`` (None: :data:`NEIGHBOR_PARTS`), and then ``k`` is at most the vectors
    there are.

    >>> search_width(40, 900, 20), search_width(3, 12, 20)
    ((20, 16), (12, 3))
    """
    n_searched = NEIGHBOR_PARTS if n_searched is None else int(n_searched)
    if n_held <= n_searched:
        return min(int(n_neighbors), int(n_vectors)), int(n_held)
    return int(n_neighbors), n_searched


def nearest_parts(X, centers, searched: int) -> np.ndarray:
    """Each row's ``searched`` nearest of ``centers`` (their indices, nearest first; host):
    the parts :func:`neighbor_blocks` searches for the row, by their routing centres."""
    return _nearest_first(sq_distances(X, centers), searched)


def _shares(merge, n_parts: int) -> np.ndarray:
    """Each row's share of its kept candidates held by each part (host, rows sum to 1)."""
    counts, found = merge.counts(n_parts)
    counts /= np.maximum(found, 1)[:, None]
    return counts


def _nearest_first(D, searched):
    """Each row's ``searched`` nearest columns of ``D``, nearest first (host)."""
    xp = namespace_of(D)
    if searched < D.shape[1]:
        near = xp.argpartition(D, searched - 1, axis=1)[:, :searched]
        D = xp.take_along_axis(D, near, axis=1)
    else:
        near = None
    order = xp.argsort(D, axis=1)
    return to_numpy(order if near is None else xp.take_along_axis(near, order, axis=1))


def _search_runs(near, n_values: int):
    """The rows that search each value ``j`` of ``near`` (each row's searched parts as
    values in ``[0, n_values)``, nearest first): ``(rows, bounds, sequence)``, ``j``'s
    rows (ascending) being ``rows[bounds[j]:bounds[j + 1]]`` (:func:`part_runs`), and the
    order to search the values in: first those some row searches first, so that each
    row's k best are near early and the later parts' candidates are mostly rejected at
    one comparison each."""
    order, bounds = part_runs(near.ravel(), n_values)
    present = np.flatnonzero(np.diff(bounds))
    first = np.unique(near[:, 0]) if near.shape[1] else present
    sequence = np.concatenate([first, np.setdiff1d(present, first)])
    return order // max(near.shape[1], 1), bounds, sequence
