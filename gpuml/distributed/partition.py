"""The partitioners of :mod:`gpuml.partition` over rows sharded across ranks.

Every rank holds a contiguous block of rows (rank 0 the first) and runs the
same code (SPMD) with a :class:`~gpuml.distributed.comm.Communicator`. The
partition is the one a single process computes on all the rows, up to the
rounding of sums taken in another order:

* **Lloyd steps** (k-means, and the k-means inside K-balance and BKM): each rank
  finds the nearest centre of its rows and sums them per centre; one allreduce
  of the sums and counts (P x (d + 1) numbers) gives every rank the same new
  centres, hence the same convergence decision.
* **k-means++ seeding**: each rank sums the D^2 weights of its rows; an
  allgather of the R totals tells every rank, from the same random draw (every
  rank holds an identical generator), which rank holds the drawn sample, and
  that rank broadcasts it.
* **Greedy fill** (FCFS, K-balance, BKM's movers; You 2020 Alg 3 and 9): the
  pass is sequential over the rows in a fixed order, so each rank computes the
  distances of its own rows, block by block (the same blocks as one process);
  rank 0 gathers a block, fills it, and broadcasts its labels.
* **Part means** (the final centres): per-rank sums, one allreduce.

Traffic per Lloyd step is ``P (d + 1)`` numbers per rank, independent of n; the
fill moves the ``n x P`` distance matrix to rank 0 once (block by block), which
is less than the data itself whenever ``P < d``.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils import check_random_state

from .._backend import namespace_of, to_numpy
from ..kernels import fill_nearest_open, nearest_centres, part_sums, row_blocks
from ..pairwise import shifted_sq_distances, sq_distances, squared_norms
from ..partition import (
    _capacities,
    _contiguous_labels,
    _dense_rows,
    _divide,
    _random_labels,
)


class _Shard:
    """One rank's rows and where they sit among all ranks' rows."""

    def __init__(self, comm, X):
        self.comm = comm
        self.X = X
        sizes = [int(np.asarray(to_numpy(s)).ravel()[0])
                 for s in comm.allgather(np.array([X.shape[0]], dtype=np.int64))]
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.n = int(self.bounds[-1])
        self.offset = int(self.bounds[comm.rank])
        self.rows = int(X.shape[0])

    @property
    def xp(self):
        return namespace_of(self.X)

    def owner(self, i: int) -> int:
        """The rank holding global row ``i``."""
        return int(np.searchsorted(self.bounds, i, side="right") - 1)

    def broadcast_row(self, i: int):
        """Global row ``i`` (dense, shape (d,)) on every rank, sent by its owner."""
        owner = self.owner(i)
        return self.broadcast_local_row(owner, i - int(self.bounds[owner]))

    def broadcast_local_row(self, owner: int, local: int):
        """Row ``local`` of rank ``owner``'s block (dense, shape (d,)) on every rank."""
        if self.comm.rank == owner:
            row = self.xp.ascontiguousarray(_dense_rows(self.X, [local])[0])
        else:
            row = self.xp.empty(self.X.shape[1], dtype=self.X.dtype)
        return self.comm.broadcast(row, root=owner)

    def mine(self, full):
        """This rank's slice of a host array over all rows, in the shard's namespace."""
        return self.xp.asarray(full[self.offset: self.offset + self.rows])


def _allreduce_sums(shard, sums, counts):
    """Per-part sums and counts over all ranks: one allreduce of a packed float64 array.

    float64 holds counts exactly up to 2^53 rows per part, and float32 sums
    exactly, so packing changes nothing but the order of the additions.
    """
    xp = namespace_of(sums)
    d = sums.shape[1]
    pack = xp.empty((sums.shape[0], d + 1), dtype=np.float64)
    pack[:, :d] = sums
    pack[:, d] = counts
    shard.comm.allreduce(pack, out=pack)
    return pack[:, :d].astype(sums.dtype), pack[:, d].astype(np.int64)


def _means(shard, labels, n_parts, fallback=None):
    return _divide(*_allreduce_sums(shard, *part_sums(shard.X, labels, n_parts)), fallback)


def _assign(shard, centers):
    """Nearest centres of this rank's rows, and the summed per-centre sums and counts."""
    labels, sums, counts = nearest_centres(shard.X, centers, with_sums=True)
    return (labels, *_allreduce_sums(shard, sums, counts))


def _variance(shard) -> float:
    """Mean per-feature variance of all rows (k-means' tolerance scale), two passes."""
    X, comm, n = shard.X, shard.comm, shard.n
    if hasattr(X, "tocsr"):
        local = np.array([float(X.multiply(X).sum()), float(X.sum())])
        total = to_numpy(comm.allreduce(local))
        entries = n * X.shape[1]
        return float(total[0] / entries - (total[1] / entries) ** 2)
    mean = comm.allreduce(X.sum(axis=0)) / n
    deviation = comm.allreduce(((X - mean) ** 2).sum(axis=0)) / n
    return float(deviation.mean())


def _kmeans_pp(shard, n_parts, rng):
    """k-means++ seeding (Arthur & Vassilvitskii, 2007) over the shards: D^2 sampling."""
    X, comm, xp = shard.X, shard.comm, shard.xp
    centers = [shard.broadcast_row(int(rng.randint(shard.n)))]
    x_norms = squared_norms(X)

    def sq_distances_to(c):
        return xp.maximum(shifted_sq_distances(X, c[None, :])[:, 0] + x_norms, 0.0)

    closest = sq_distances_to(centers[0])
    for _ in range(1, n_parts):
        cumulative = xp.cumsum(closest)
        local_total = float(cumulative[-1]) if shard.rows else 0.0
        totals = np.array([float(np.asarray(to_numpy(t)).ravel()[0])
                           for t in comm.allgather(np.array([local_total]))])
        ends = np.cumsum(totals)
        total = float(ends[-1])
        if total <= 0:  # fewer distinct points than parts: any sample will do
            c = shard.broadcast_row(int(rng.randint(shard.n)))
        else:
            # Every rank draws the same u and finds the same owner: the first rank
            # whose running total reaches u; the owner finds the row within its block.
            u = rng.uniform(0, total)
            owner = min(int(np.searchsorted(ends, u)), comm.size - 1)
            local = 0
            if comm.rank == owner:
                start = float(ends[owner - 1]) if owner else 0.0
                local = min(int(xp.searchsorted(cumulative, u - start)), shard.rows - 1)
            c = shard.broadcast_local_row(owner, local)
        centers.append(c)
        xp.minimum(closest, sq_distances_to(c), out=closest)
    return xp.stack(centers)


def _kmeans(shard, n_parts, rng, max_iter=100, tol=1e-4):
    """Lloyd's k-means over the shards: ``(labels of this shard, centers, global sizes)``."""
    centers = _kmeans_pp(shard, n_parts, rng)
    threshold = tol * _variance(shard)
    labels, sums, counts = _assign(shard, centers)
    for _ in range(max_iter):
        new_centers = _divide(sums, counts, fallback=centers)
        shift = float(((new_centers - centers) ** 2).sum())
        centers = new_centers
        labels, sums, counts = _assign(shard, centers)
        if shift <= threshold:
            break
    return labels, namespace_of(centers).ascontiguousarray(centers), to_numpy(counts)


def _fill(shard, centers, counts, caps, rows=None) -> np.ndarray:
    """Greedy fill of the global ``rows`` (default: all, in order) into parts with room.

    Returns the labels of the filled rows (host, on every rank); ``counts`` is
    updated on every rank. Rank 0 runs the sequential pass over gathered
    distance blocks; the blocks are those one process would use.
    """
    comm, X = shard.comm, shard.X
    xp = namespace_of(centers)
    rows = np.arange(shard.n, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
    rank_of = np.searchsorted(shard.bounds, rows, side="right") - 1
    c_norms = squared_norms(centers)
    labels = np.empty(rows.shape[0], dtype=np.int64)
    for start, stop in row_blocks(rows.shape[0], centers.shape[0]):
        block_rank = rank_of[start:stop]
        mine = np.flatnonzero(block_rank == comm.rank)
        local = rows[start:stop][mine] - shard.offset
        if local.size:
            D = shifted_sq_distances(X[xp.asarray(local)], centers, c_norms)
        else:  # no rows of this block here (indexing a device CSR by nothing is not portable)
            D = xp.empty((0, centers.shape[0]), dtype=centers.dtype)
        blocks = comm.allgather(D)
        filled = np.empty(stop - start, dtype=np.int64)
        if comm.rank == 0:
            D = np.empty((stop - start, centers.shape[0]), dtype=np.dtype(D.dtype))
            for r, block in enumerate(blocks):
                D[np.flatnonzero(block_rank == r)] = to_numpy(block)
            filled = fill_nearest_open(D, counts, caps)
        filled = to_numpy(comm.broadcast(filled, root=0))
        if comm.rank != 0:
            np.add.at(counts, filled, 1)
        labels[start:stop] = filled
    return labels


def _random(shard, n_parts, rng, **_):
    labels = shard.mine(_random_labels(shard.n, n_parts, rng))
    return labels, _means(shard, labels, n_parts)


def _contiguous(shard, n_parts, rng, **_):
    labels = shard.mine(_contiguous_labels(shard.n, n_parts))
    return labels, _means(shard, labels, n_parts)


def _fcfs(shard, n_parts, rng, **_):
    X, xp = shard.X, shard.xp
    seeds = np.sort(rng.choice(shard.n, n_parts, replace=False))
    # Each seed row from its owner, zeros elsewhere: one allreduce assembles them exactly.
    centers = xp.zeros((n_parts, X.shape[1]), dtype=X.dtype)
    for k, s in enumerate(seeds.tolist()):
        if shard.owner(s) == shard.comm.rank:
            centers[k] = _dense_rows(X, [s - shard.offset])[0]
    centers = shard.comm.allreduce(centers)
    counts = np.zeros(n_parts, dtype=np.int64)
    labels = shard.mine(_fill(shard, centers, counts, _capacities(shard.n, n_parts)))
    return labels, _means(shard, labels, n_parts)


def _kbalance(shard, n_parts, rng, max_iter=100, tol=1e-4, **_):
    _, km_centers, sizes = _kmeans(shard, n_parts, rng, max_iter=max_iter, tol=tol)
    caps = _capacities(shard.n, n_parts, np.argsort(-sizes, kind="stable"))
    counts = np.zeros(n_parts, dtype=np.int64)
    labels = shard.mine(_fill(shard, km_centers, counts, caps))
    return labels, _means(shard, labels, n_parts)


def _bkm(shard, n_parts, rng, max_iter=100, tol=1e-4, **_):
    labels, km_centers, sizes = _kmeans(shard, n_parts, rng, max_iter=max_iter, tol=tol)
    X, xp = shard.X, shard.xp
    caps = _capacities(shard.n, n_parts, np.argsort(-sizes, kind="stable"))
    over = np.flatnonzero(sizes > caps)
    if over.size:
        # Every member of an over-full part, with its distance to the part's centre:
        # gathered (global index, part, distance) rows, in global row order.
        labels_host = to_numpy(labels)
        local = np.flatnonzero(np.isin(labels_host, over))
        d2 = np.empty(local.size)
        for j in over.tolist():
            sel = np.flatnonzero(labels_host[local] == j)
            if sel.size:
                d2[sel] = to_numpy(sq_distances(_dense_rows(X, local[sel]),
                                                km_centers[j][None, :])[:, 0])
        table = np.column_stack([local + shard.offset, labels_host[local], d2])
        table = np.concatenate([to_numpy(t) for t in shard.comm.allgather(table)])
        # Over-full part j gives up its (size - cap) members farthest from its
        # centre, farthest first; parts in index order (Alg 4, lines 9-26).
        movers = []
        for j in over.tolist():
            sel = table[:, 1] == j
            members = table[sel, 0].astype(np.int64)
            farthest_first = members[np.argsort(-table[sel, 2], kind="stable")]
            movers.append(farthest_first[: sizes[j] - caps[j]])
        movers = np.concatenate(movers)
        counts = np.minimum(sizes, caps).astype(np.int64)
        moved = _fill(shard, km_centers, counts, caps, rows=movers)
        mine = (movers >= shard.offset) & (movers < shard.offset + shard.rows)
        labels = labels.copy()
        labels[xp.asarray(movers[mine] - shard.offset)] = xp.asarray(moved[mine])
    return labels, _means(shard, labels, n_parts)


#: Sharded partitioners by name, as :data:`gpuml.partition.PARTITIONERS`.
SHARDED_PARTITIONERS = {
    "random": _random,
    "contiguous": _contiguous,
    "fcfs": _fcfs,
    "kmeans": lambda shard, n_parts, rng, **kw: _kmeans(shard, n_parts, rng, **kw)[:2],
    "kbalance": _kbalance,
    "bkm": _bkm,
}


def partition_shard(comm, X, n_partitions, method="random", *, rng, max_iter=100, tol=1e-4):
    """One rank's share of :func:`gpuml.partition.partition` over rows sharded across ranks.

    Called by every rank of ``comm`` at once, each with its block of rows
    (contiguous, rank order) and an identical generator ``rng``.

    Parameters
    ----------
    comm : Communicator
    X : (n_r, d) array, NumPy or CuPy, dense or CSR: this rank's rows (may be empty)
    n_partitions : int in [1, n], n the total number of rows
    method : {"random", "contiguous", "fcfs", "kmeans", "kbalance", "bkm"}
    rng : numpy.random.RandomState, in the same state on every rank
    max_iter, tol : as :func:`gpuml.partition.partition`

    Returns
    -------
    labels : int64 array of shape (n_r,), in X's namespace
    centers : dense array of shape (n_partitions, d), the same on every rank
    """
    if method not in SHARDED_PARTITIONERS:
        raise ValueError(f"partition method must be one of {sorted(SHARDED_PARTITIONERS)}, "
                         f"got {method!r}")
    shard = _Shard(comm, X)
    return SHARDED_PARTITIONERS[method](shard, int(n_partitions), rng, max_iter=max_iter,
                                        tol=tol)


def partition_on_devices(group, X, n_partitions, method="random", *, random_state=None,
                         max_iter=100, tol=1e-4):
    """Partition the rows of host ``X`` sharded over the devices of ``group``.

    ``X`` (NumPy or SciPy CSR) is cut into ``group.size`` contiguous shards,
    each copied to its device; every device runs :func:`partition_shard` in its
    own thread. The generator of ``random_state`` advances as in a one-process
    run.

    Returns
    -------
    labels : int64 ndarray of shape (n,), on the host
    centers : ndarray of shape (n_partitions, d), on the host

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml._backend import CPU
    >>> from gpuml.distributed.placement import DeviceGroup
    >>> from gpuml.distributed.partition import partition_on_devices
    >>> from gpuml.partition import partition
    >>> X = np.random.default_rng(0).normal(size=(200, 3))
    >>> labels, _ = partition_on_devices(DeviceGroup([CPU] * 3), X, 4, "kbalance",
    ...                                  random_state=0)
    >>> bool((labels == partition(X, 4, "kbalance", random_state=0)[0]).all())
    True
    """
    from .placement import shard_bounds

    base = check_random_state(random_state)
    rngs = [_copy_rng(base) for _ in range(group.size)]
    bounds = shard_bounds(X.shape[0], group.size)

    def work(comm, backend):
        rows = X[int(bounds[comm.rank]): int(bounds[comm.rank + 1])]
        labels, centers = partition_shard(comm, backend.asarray(rows), n_partitions, method,
                                          rng=rngs[comm.rank], max_iter=max_iter, tol=tol)
        return to_numpy(labels), (to_numpy(centers) if comm.rank == 0 else None)

    results = group.spmd(work)
    base.set_state(rngs[0].get_state())
    return np.concatenate([r[0] for r in results]).astype(np.int64), results[0][1]


def _copy_rng(rng):
    copy = np.random.RandomState()
    copy.set_state(rng.get_state())
    return copy
