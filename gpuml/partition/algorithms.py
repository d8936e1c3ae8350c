"""The partitioners of You 2020, written once over the rows wherever they are.

Each algorithm here is the driver's side of a partitioner: the random draws,
the small decisions (which row seeds the next centre, when Lloyd stops, how
many rows each part may hold) and the order of the steps. The work on the
rows themselves (distances, sums, the greedy fill) is asked of a
:class:`Rows` object, whose answers are global: the sums over all rows, the
distance totals of every block of rows. Three kinds of :class:`Rows` run them:

* :class:`gpuml.partition.local.LocalRows`: the rows of one array, in this
  process (NumPy or CuPy, dense or CSR); every collective is trivial;
* :class:`gpuml.distributed.partition.ShardRows`: the rows sharded over the
  ranks of a :class:`~gpuml.distributed.comm.Communicator` (several GPUs, or
  threads); every rank runs the same algorithm with an identical generator and
  each step ends in an allreduce, allgather or broadcast, so every rank takes
  the same decisions;
* the Dask rows of :mod:`gpuml.distributed.dask`: chunks held by the workers,
  each step a task (or an actor call) per worker whose results the client adds
  in chunk order.

Labels stay in the form the :class:`Rows` keeps them in (one array, this
rank's slice, one array per chunk); an algorithm only hands them back.

References
----------
Yang You, "Fast and Accurate Machine Learning on Distributed Systems and
Supercomputers", PhD thesis, UC Berkeley, 2020: Alg 3 (FCFS), Alg 4 (BKM),
Alg 5 (CA-SVM's random split, and the contiguous split of its casvm2 run),
Alg 9 (K-balance). David Arthur and Sergei Vassilvitskii, "k-means++: The
Advantages of Careful Seeding", 2007.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

from .._backend import namespace_of, read_later, to_numpy


class Rows(Protocol):
    """The rows a partitioner splits, and the steps it asks of them (answers are global)."""

    #: number of rows, of features
    n: int
    n_features: int
    #: Lloyd passes that may be queued before a pass's shift is read (0: read each)
    read_lag: int

    def variance(self) -> float:
        """Mean per-feature variance of all rows (k-means' tolerance scale)."""

    def row(self, i: int):
        """Global row ``i``, dense: an array, or a handle the other steps take (a future)."""

    def rows(self, ids) -> object:
        """The rows of the global indices ``ids`` (ascending), dense, as a centres array."""

    def seed_ahead(self, first: int, n_parts: int, rng):
        """k-means++ with every pick drawn up front (only where ``read_lag``); None: redo
        the seeding in turn from the generator's state before this call."""

    def first(self, c) -> np.ndarray:
        """k-means++: each row's squared distance to ``c`` kept; the totals of each block."""

    def closer(self, c) -> np.ndarray:
        """k-means++: the kept distances lowered to those to ``c``; the totals of each block."""

    def pick(self, block: int, u: float):
        """k-means++: the row of ``block`` where its running total of distances reaches ``u``
        (as :meth:`row` gives rows)."""

    def stack(self, rows):
        """The rows that :meth:`row` and :meth:`pick` gave, as one centres array."""

    def assign(self, centers):
        """A Lloyd pass: the per-centre sums and counts of the rows nearest each centre."""

    def nearest(self, centers):
        """Labels: each row's nearest centre."""

    def fill(self, centers, counts, caps, rows=None):
        """The greedy fill (Alg 3) of every row in order, or of the global ``rows`` in
        that order: each to its nearest centre with room left. ``counts`` (host) is
        updated. Returns labels; with ``rows``, the host labels of those rows."""

    def local(self, labels: np.ndarray):
        """Labels over all rows (a host array) in this :class:`Rows`' own form."""

    def sample(self, ids):
        """The global rows ``ids`` (ascending) as rows of this process (a ``LocalRows``)."""

    def stack_centers(self, centers):
        """Centres found on a :meth:`sample`, as this :class:`Rows`' steps take them."""


def fewest_parts_fitting(n: int, n_parts: int, fits) -> int | None:
    """The smallest P in (n_parts, n] with ``fits(P)``, by bisection; None if P = n does not fit.

    ``fits(P)``: whether balanced parts of ``n`` rows into P fit a memory budget. The
    need of such parts falls as P grows, except around the size where parts become
    small enough to be factored in batches on a GPU (:func:`gpuml.kernels.gpu_solve_plan`);
    there the bisection may return a larger P than the smallest, but never one that
    does not fit.
    """
    lo, hi = n_parts + 1, n
    if lo > n or not fits(n):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def capacities(n: int, n_parts: int, larger_first=None) -> np.ndarray:
    """Part capacities ``n // P``, plus one for ``n % P`` parts (``larger_first`` order)."""
    lo, r = divmod(n, n_parts)
    caps = np.full(n_parts, lo, dtype=np.int64)
    order = np.arange(n_parts) if larger_first is None else larger_first
    caps[order[:r]] += 1
    return caps


def divide(sums, counts, fallback=None):
    """``sums / counts`` per part; a part with no members keeps ``fallback[j]``."""
    xp = namespace_of(sums)
    means = sums / xp.maximum(counts, 1)[:, None].astype(sums.dtype)
    if fallback is None:
        return means
    # A select, not a masked assignment: asking whether any part is empty would
    # read a device value back (a synchronisation in every Lloyd pass).
    return xp.where((counts == 0)[:, None], fallback, means)


def random_labels(n: int, n_parts: int, rng) -> np.ndarray:
    """The even random split's labels of ``n`` rows (host array; one permutation drawn)."""
    labels = np.empty(n, dtype=np.int64)
    labels[rng.permutation(n)] = np.arange(n) % n_parts
    return labels


def contiguous_labels(n: int, n_parts: int) -> np.ndarray:
    """Part j for the j-th run of rows, the first ``n % P`` runs one row longer (host array)."""
    return np.repeat(np.arange(n_parts, dtype=np.int64), capacities(n, n_parts))


def fcfs_seeds(n: int, n_parts: int, rng) -> np.ndarray:
    """FCFS's centres (Alg 3): ``n_parts`` distinct rows drawn at random, ascending."""
    return np.sort(rng.choice(n, n_parts, replace=False))


def split_random(rows: Rows, n_parts, rng, **_):
    """You 2020, Alg 5: an even random split (centres: the parts' means)."""
    return rows.local(random_labels(rows.n, n_parts, rng)), None


def split_contiguous(rows: Rows, n_parts, rng=None, **_):
    """You 2020, Alg 5 as its experiments ran it (casvm2): each node's rows are its part.

    The data is assumed spread evenly over the nodes already, so the split
    moves nothing: part j is the j-th run of consecutive rows (the first
    ``n % P`` runs one row longer). On rows in random order it is an even
    random split; on rows sorted by class or by a feature its parts are not
    samples of the whole (shuffle first). ``rng`` is not used.
    """
    return rows.local(contiguous_labels(rows.n, n_parts)), None


def split_fcfs(rows: Rows, n_parts, rng, **_):
    """You 2020, Alg 3: random rows as centres, then the greedy first-come-first-served fill."""
    centers = rows.rows(fcfs_seeds(rows.n, n_parts, rng))
    counts = np.zeros(n_parts, dtype=np.int64)
    return rows.fill(centers, counts, capacities(rows.n, n_parts)), None


def kmeans_pp(rows: Rows, n_parts, rng):
    """k-means++ seeding (Arthur & Vassilvitskii, 2007): D^2-weighted sampling.

    Per centre, the totals of each block's distances to the nearest centre so
    far say which block holds the next draw; that block finds the row. The
    draw is ``uniform(0, total)`` of the generator, in the same order however
    the rows are split. Rows on a device whose reads stall it (``read_lag``)
    may draw all picks at once (``seed_ahead``: the same draws, one read).
    """
    n = rows.n
    first = int(rng.randint(n))
    if rows.read_lag:
        state = rng.get_state()
        centers = rows.seed_ahead(first, n_parts, rng)
        if centers is not None:
            return centers
        rng.set_state(state)
    centers = [rows.row(first)]
    totals = rows.first(centers[0])
    for j in range(1, n_parts):
        ends = np.cumsum(totals)
        total = float(ends[-1])
        if total <= 0:  # fewer distinct points than parts: any sample will do
            c = rows.row(int(rng.randint(n)))
        else:
            u = rng.uniform(0, total)
            block = min(int(np.searchsorted(ends, u)), len(totals) - 1)
            start = float(ends[block - 1]) if block else 0.0
            c = rows.pick(block, u - start)
        centers.append(c)
        if j < n_parts - 1:  # after the last pick no one reads the distances
            totals = rows.closer(c)
    return rows.stack(centers)


#: k-means finds its centres on at most ``KMEANS_ROWS_PER_CENTRE * P`` rows (and at least
#: ``KMEANS_MIN_ROWS``), drawn at random once when there are more: each Lloyd pass costs a
#: pass over the rows it runs on, and beyond a hundred rows a centre more rows hardly move
#: the centres a balanced split starts from. The sizes and labels are then those of all rows.
KMEANS_ROWS_PER_CENTRE = 100
KMEANS_MIN_ROWS = 50_000


def kmeans_rows(n: int, n_parts: int) -> int:
    """How many rows k-means finds its centres on (see :data:`KMEANS_ROWS_PER_CENTRE`)."""
    return min(n, max(KMEANS_ROWS_PER_CENTRE * n_parts, KMEANS_MIN_ROWS))


#: From this many centres on, k-means on the drawn rows is two-level
#: (:func:`two_level_centers`): a pass of flat k-means costs (rows x centres), and with
#: ``KMEANS_ROWS_PER_CENTRE`` rows per centre that grows as P^2 (at 10 million rows in
#: parts of 2,048, P = 4,883: minutes of Lloyd passes on two cores, against seconds).
KMEANS_TWO_LEVEL_PARTS = 1024


def apportion(sizes, total: int) -> np.ndarray:
    """``total`` parts over groups of ``sizes`` rows: in proportion to the rows (largest
    remainders first, ties to the lower group), at least one for a group with rows and at
    most its rows. ``total`` must lie between the groups with rows and all rows.

    >>> apportion(np.array([10, 0, 5, 1]), 6).tolist()
    [3, 0, 2, 1]
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    quota = sizes * (total / sizes.sum())
    share = np.clip(np.floor(quota).astype(np.int64), np.minimum(sizes, 1), sizes)
    while share.sum() > total:  # the one given to small groups: from the others' most over
        share[np.argmax(np.where(share > 1, share - quota, -np.inf))] -= 1
    order = np.argsort(-(quota - share), kind="stable")
    while share.sum() < total:
        for g in order:
            if share.sum() < total and share[g] < sizes[g]:
                share[g] += 1
    return share


def two_level_centers(rows: Rows, n_parts, rng, max_iter=100, tol=1e-4):
    """``n_parts`` centres by k-means in two levels: ``ceil(sqrt(P))`` centres of all the
    rows, then in each of their groups as many centres as its share of the rows
    (:func:`apportion`), by :func:`lloyd` on the group. Each pass costs about
    ``2 sqrt(P)`` distances per row instead of ``P``. ``rows`` is local (the rows k-means
    runs on, drawn in this process)."""
    groups = int(np.ceil(np.sqrt(n_parts)))
    top, _ = lloyd(rows, groups, rng, max_iter=max_iter, tol=tol)
    labels = to_numpy(rows.nearest(top))
    share = apportion(np.bincount(labels, minlength=groups), n_parts)
    centers = []
    for g in np.flatnonzero(share).tolist():
        group = rows.sample(np.flatnonzero(labels == g))
        centers.append(lloyd(group, int(share[g]), rng, max_iter=max_iter, tol=tol)[0])
    return namespace_of(top).concatenate(centers)


def lloyd(rows: Rows, n_parts, rng, max_iter=100, tol=1e-4):
    """Lloyd's k-means from k-means++ seeds: ``(centers, sizes)`` of the last pass.

    Stops when the centres moved by at most ``tol`` times the mean per-feature
    variance (as scikit-learn's KMeans), or after ``max_iter`` passes. Each pass
    assigns every row to its nearest centre and sums the parts, so the next
    centres cost no second sweep. Where reading a pass's shift would stall a
    device (``rows.read_lag`` passes may be queued before it is read), later
    passes are queued first; passes run past the stop are dropped, so every
    :class:`Rows` stops where reading each shift at once would.

    With more rows than :func:`kmeans_rows`, the centres are those of k-means on
    that many rows drawn at random (``rows.sample``, in this process; from
    :data:`KMEANS_TWO_LEVEL_PARTS` centres on in two levels, :func:`two_level_centers`),
    and the sizes those of one assignment of every row to them.
    """
    m = kmeans_rows(rows.n, n_parts)
    if m < rows.n:
        ids = np.sort(rng.choice(rows.n, m, replace=False))
        if n_parts >= KMEANS_TWO_LEVEL_PARTS:
            centers = two_level_centers(rows.sample(ids), n_parts, rng, max_iter, tol)
        else:
            centers, _ = lloyd(rows.sample(ids), n_parts, rng, max_iter=max_iter, tol=tol)
        centers = rows.stack_centers(centers)
        return centers, rows.assign(centers)[1]
    centers = kmeans_pp(rows, n_parts, rng)
    threshold = tol * rows.variance()
    sums, counts = rows.assign(centers)
    unread = deque()
    for _ in range(max_iter):
        new_centers = divide(sums, counts, fallback=centers)
        shift = read_later(((new_centers - centers) ** 2).sum())
        centers = new_centers
        sums, counts = rows.assign(centers)
        unread.append((shift, centers, counts))
        if len(unread) > rows.read_lag:
            stopped = _stopped(unread, threshold)
            if stopped:
                return stopped
    # max_iter passes ran; the last is returned whatever its shift, but an earlier
    # unread pass may be where reading each shift at once would have stopped.
    while len(unread) > 1:
        stopped = _stopped(unread, threshold)
        if stopped:
            return stopped
    return namespace_of(centers).ascontiguousarray(centers), counts


def _stopped(unread, threshold):
    """Read the oldest unread pass: ``(centers, counts)`` if the loop stops there, else None."""
    shift, centers, counts = unread.popleft()
    if shift() <= threshold:
        return namespace_of(centers).ascontiguousarray(centers), counts
    return None


def split_kmeans(rows: Rows, n_parts, rng, max_iter=100, tol=1e-4, **_):
    """k-means (CP-SVM, KKRR): the labels of the last Lloyd pass and its centres."""
    centers, _ = lloyd(rows, n_parts, rng, max_iter=max_iter, tol=tol)
    return rows.nearest(centers), centers


def _kmeans_capacities(rows, n_parts, counts):
    sizes = np.asarray(to_numpy(counts), dtype=np.int64)
    return sizes, capacities(rows.n, n_parts, np.argsort(-sizes, kind="stable"))


def split_kbalance(rows: Rows, n_parts, rng, max_iter=100, tol=1e-4, **_):
    """You 2020, Alg 9 (K-balance): k-means centres, then the greedy fill in row order.

    The ``n % P`` parts k-means made largest (ties to the lower index) may hold
    one row more than the others.
    """
    centers, counts = lloyd(rows, n_parts, rng, max_iter=max_iter, tol=tol)
    _, caps = _kmeans_capacities(rows, n_parts, counts)
    return rows.fill(centers, np.zeros(n_parts, dtype=np.int64), caps), None


def split_bkm(rows: Rows, n_parts, rng, max_iter=100, tol=1e-4, **_):
    """You 2020, Alg 4 (balanced k-means): over-full parts give up their farthest members.

    After k-means, each over-full part j gives up its ``size - cap`` members
    farthest from its centre, farthest first, parts in index order; the movers
    are then filled, in that order, into the nearest parts with room left.
    """
    centers, counts = lloyd(rows, n_parts, rng, max_iter=max_iter, tol=tol)
    labels = rows.nearest(centers)
    sizes, caps = _kmeans_capacities(rows, n_parts, counts)
    over = np.flatnonzero(sizes > caps)
    if not over.size:
        return labels, None
    movers = []
    for j, members, d2 in rows.members(labels, over, centers):
        farthest_first = members[np.argsort(-d2, kind="stable")]
        movers.append(farthest_first[: sizes[j] - caps[j]])
    movers = np.concatenate(movers)
    filled = np.minimum(sizes, caps).astype(np.int64)
    moved = rows.fill(centers, filled, caps, rows=movers)
    return rows.relabel(labels, movers, moved), None


#: The partitioners by name; each is ``f(rows, n_parts, rng, max_iter=, tol=)`` and returns
#: ``(labels, centers)``, ``centers`` None where they are the parts' means (computed by the
#: caller, which may have the sums at hand anyway).
SPLITS = {
    "random": split_random,
    "contiguous": split_contiguous,
    "fcfs": split_fcfs,
    "kmeans": split_kmeans,
    "kbalance": split_kbalance,
    "bkm": split_bkm,
}
