"""The partitioners over rows sharded across ranks: :mod:`gpuml.partition`'s algorithms, SPMD.

Every rank holds a contiguous block of rows (rank 0 the first) and runs the
same algorithm (:mod:`gpuml.partition.algorithms`) with an identical generator
over a :class:`ShardRows`, whose steps end in a collective of the
:class:`~gpuml.distributed.comm.Communicator`, so that every rank takes the same
decisions. The partition is the one a single process computes on all the rows,
up to the rounding of sums taken in another order:

* **Lloyd steps** (k-means, and the k-means inside K-balance and BKM): each rank
  finds the nearest centre of its rows and sums them per centre; one allreduce
  of the sums and counts (P x (d + 1) numbers) gives every rank the same new
  centres, hence the same convergence decision.
* **k-means++ seeding**: each rank sums the D^2 weights of its rows; an
  allgather of the R totals tells every rank, from the same random draw, which
  rank holds the drawn sample, and that rank broadcasts it.
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
from ..kernels import OpenDistances, fill_blocks, fill_nearest_open, nearest_centres, part_sums
from ..kernels.pairwise import shifted_sq_distances, sq_distances, squared_norms
from ..partition import SPLITS, LocalRows, dense_rows, divide
from .placement import shard_bounds


class ShardRows:
    """One rank's rows, and the steps of :mod:`gpuml.partition.algorithms` over all ranks."""

    #: every Lloyd shift is read at once (it decides a collective's participation)
    read_lag = 0

    def __init__(self, comm, X):
        self.comm = comm
        self.X = X
        self.xp = namespace_of(X)
        sizes = [int(np.asarray(to_numpy(s)).ravel()[0])
                 for s in comm.allgather(np.array([X.shape[0]], dtype=np.int64))]
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.n = int(self.bounds[-1])
        self.n_features = int(X.shape[1])
        self.offset = int(self.bounds[comm.rank])
        self.size = int(X.shape[0])
        self._x_norms = self._closest = self._cumulative = None
        self._last = (None, None)

    # -- rows ------------------------------------------------------------------------
    def owner(self, i: int) -> int:
        """The rank holding global row ``i``."""
        return int(np.searchsorted(self.bounds, i, side="right") - 1)

    def _broadcast_local_row(self, owner: int, local: int):
        """Row ``local`` of rank ``owner``'s block (dense, shape (d,)) on every rank."""
        if self.comm.rank == owner:
            row = self.xp.ascontiguousarray(dense_rows(self.X, [local])[0])
        else:
            row = self.xp.empty(self.n_features, dtype=self.X.dtype)
        return self.comm.broadcast(row, root=owner)

    def row(self, i):
        """Global row ``i`` on every rank, broadcast by its owner."""
        owner = self.owner(i)
        return self._broadcast_local_row(owner, i - int(self.bounds[owner]))

    def rows(self, ids):
        """The global rows ``ids`` on every rank: each from its owner and zeros elsewhere,
        assembled exactly by one allreduce."""
        out = self.xp.zeros((len(ids), self.n_features), dtype=self.X.dtype)
        for k, i in enumerate(np.asarray(ids).tolist()):
            if self.owner(i) == self.comm.rank:
                out[k] = dense_rows(self.X, [i - self.offset])[0]
        return self.comm.allreduce(out)

    def stack(self, rows):
        return self.xp.stack(rows)

    def sample(self, ids):
        """The global rows ``ids`` on every rank (one allreduce), as rows of this rank: every
        rank then runs the same k-means on the same rows, with the same draws."""
        return LocalRows(self.rows(ids))

    def stack_centers(self, centers):
        return centers

    def local(self, labels):
        """This rank's slice of a host array over all rows, in the shard's namespace."""
        return self.xp.asarray(labels[self.offset: self.offset + self.size])

    # -- statistics --------------------------------------------------------------------
    def variance(self) -> float:
        """Mean per-feature variance of all rows (k-means' tolerance scale), two passes."""
        X, comm, n = self.X, self.comm, self.n
        if hasattr(X, "tocsr"):
            local = np.array([float(X.multiply(X).sum()), float(X.sum())])
            total = to_numpy(comm.allreduce(local))
            entries = n * X.shape[1]
            return float(total[0] / entries - (total[1] / entries) ** 2)
        mean = comm.allreduce(X.sum(axis=0)) / n
        deviation = comm.allreduce(((X - mean) ** 2).sum(axis=0)) / n
        return float(deviation.mean())

    def _allreduce_sums(self, sums, counts):
        """Per-part sums and counts over all ranks: one allreduce of a packed float64 array.

        float64 holds counts exactly up to 2^53 rows per part, and float32 sums
        exactly, so packing changes nothing but the order of the additions.
        """
        xp = namespace_of(sums)
        d = sums.shape[1]
        pack = xp.empty((sums.shape[0], d + 1), dtype=np.float64)
        pack[:, :d] = sums
        pack[:, d] = counts
        self.comm.allreduce(pack, out=pack)
        return pack[:, :d].astype(sums.dtype), pack[:, d].astype(np.int64)

    def means(self, labels, n_parts, fallback=None):
        return divide(*self._allreduce_sums(*part_sums(self.X, labels, n_parts)), fallback)

    # -- k-means++ -------------------------------------------------------------------
    def _distances_to(self, c):
        if self._x_norms is None:
            self._x_norms = squared_norms(self.X)
        return self.xp.maximum(shifted_sq_distances(self.X, c[None, :])[:, 0] + self._x_norms,
                               0.0)

    def _totals(self):
        self._cumulative = self.xp.cumsum(self._closest)
        local_total = float(self._cumulative[-1]) if self.size else 0.0
        return np.array([float(np.asarray(to_numpy(t)).ravel()[0])
                         for t in self.comm.allgather(np.array([local_total]))])

    def first(self, c):
        self._closest = self._distances_to(c)
        return self._totals()

    def closer(self, c):
        self.xp.minimum(self._closest, self._distances_to(c), out=self._closest)
        return self._totals()

    def pick(self, block, u):
        """Rank ``block`` finds the drawn row within its rows and broadcasts it."""
        local = 0
        if self.comm.rank == block:
            local = min(int(self.xp.searchsorted(self._cumulative, u)), self.size - 1)
        return self._broadcast_local_row(block, local)

    # -- Lloyd -------------------------------------------------------------------------
    def assign(self, centers):
        labels, sums, counts = nearest_centres(self.X, centers, with_sums=True)
        self._last = (centers, labels)
        return self._allreduce_sums(sums, counts)

    def nearest(self, centers):
        seen, labels = self._last
        return labels if seen is centers else nearest_centres(self.X, centers)

    # -- the greedy fill and BKM's movers ----------------------------------------------
    def fill(self, centers, counts, caps, rows=None):
        """The fill of the global ``rows`` (default: all, in order): rank 0 runs the
        sequential pass over gathered distance blocks, the blocks one process would use,
        gathered on its device (a GPU's block is not read back whole, see
        :func:`gpuml.kernels.fill_nearest_open`), and broadcasts each block's labels.
        Returns this rank's labels (``rows=None``), or the host labels of ``rows`` on every
        rank; ``counts`` is updated on every rank."""
        comm, X = self.comm, self.X
        xp = namespace_of(centers)
        every = rows is None
        rows = np.arange(self.n, dtype=np.int64) if every else np.asarray(rows, np.int64)
        rank_of = np.searchsorted(self.bounds, rows, side="right") - 1
        distances = OpenDistances(centers)
        labels = np.empty(rows.shape[0], dtype=np.int64)
        for start, stop in fill_blocks(rows.shape[0], centers):
            block_rank = rank_of[start:stop]
            local = rows[start:stop][np.flatnonzero(block_rank == comm.rank)] - self.offset
            if local.size:
                D = distances(X[xp.asarray(local)], counts, caps)
            else:  # no rows of this block here (indexing a device CSR by nothing is not portable)
                D = xp.empty((0, centers.shape[0]), dtype=centers.dtype)
            blocks = comm.allgather(D)
            filled = np.empty(stop - start, dtype=np.int64)
            if comm.rank == 0:  # the block on rank 0's device: a GPU reads back candidates
                D = xp.empty((stop - start, centers.shape[0]), dtype=np.dtype(D.dtype))
                for r, block in enumerate(blocks):
                    D[xp.asarray(np.flatnonzero(block_rank == r))] = xp.asarray(block)
                filled = fill_nearest_open(D, counts, caps,
                                           entries=rows.shape[0] * centers.shape[0])
            filled = to_numpy(comm.broadcast(filled, root=0))
            if comm.rank != 0:
                np.add.at(counts, filled, 1)
            labels[start:stop] = filled
        return self.local(labels) if every else labels

    def members(self, labels, parts, centers):
        """``(j, members, squared distances to centre j)`` of each part ``j`` of ``parts``:
        every rank's members gathered, in global row order."""
        labels_host = to_numpy(labels)
        local = np.flatnonzero(np.isin(labels_host, parts))
        d2 = np.empty(local.size)
        for j in parts.tolist():
            sel = np.flatnonzero(labels_host[local] == j)
            if sel.size:
                d2[sel] = to_numpy(sq_distances(dense_rows(self.X, local[sel]),
                                                centers[j][None, :])[:, 0])
        table = np.column_stack([local + self.offset, labels_host[local], d2])
        table = np.concatenate([to_numpy(t) for t in self.comm.allgather(table)])
        for j in parts.tolist():
            sel = table[:, 1] == j
            yield j, table[sel, 0].astype(np.int64), table[sel, 2]

    def relabel(self, labels, rows, new):
        mine = (rows >= self.offset) & (rows < self.offset + self.size)
        labels = labels.copy()
        labels[self.xp.asarray(rows[mine] - self.offset)] = self.xp.asarray(new[mine])
        return labels


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
    if method not in SPLITS:
        raise ValueError(f"partition method must be one of {sorted(SPLITS)}, got {method!r}")
    rows = ShardRows(comm, X)
    n_partitions = int(n_partitions)
    labels, centers = SPLITS[method](rows, n_partitions, rng, max_iter=max_iter, tol=tol)
    if centers is None:
        centers = rows.means(labels, n_partitions)
    return labels, centers


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
