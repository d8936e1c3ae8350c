"""Partitioners of You 2020 and nearest-centre routing.

Each partitioner splits ``n`` samples into ``P`` parts and returns
``(labels, centers)``: ``labels[i]`` is the part of sample ``i`` and
``centers[j]`` the centre that routes new samples to part ``j``
(:func:`assign_nearest`). All are deterministic under ``random_state`` and
run on NumPy or CuPy inputs (the distance and assignment steps are GEMMs on
the input's device; the greedy fill, sequential by nature, is a numba loop).

=========  ===============================================  ==============
name       what                                              sizes
=========  ===============================================  ==============
random     even random split, centre = mean (CA-SVM, Alg 5)  balanced
contiguous the rows as they lie: part j the j-th run of rows    balanced
           (casvm2, Alg 5's no-communication split)
fcfs       random centres, first come first served (Alg 3)   balanced
kmeans     k-means, k-means++ init (CP-SVM, KKRR)            unbalanced
kbalance   k-means centres, then greedy FCFS fill (Alg 9)    balanced
bkm        k-means, then move the farthest samples of        balanced
           over-full parts to the nearest under-full (Alg 4)
=========  ===============================================  ==============

Balanced means part sizes differ by at most one. The paper assumes ``P``
divides ``n`` (capacity ``n/P`` each); here every part may hold
``lo = n // P`` samples and ``r = n % P`` parts may hold one more: for
``fcfs`` the first ``r`` random centres, for ``contiguous`` the first ``r``
parts, for ``kbalance`` and ``bkm`` the ``r`` parts k-means made largest (ties
to the lower index). For ``fcfs``, ``contiguous``, ``kbalance`` and ``bkm`` the
returned centres are the means of the final parts, as in the algorithms' last
lines; for ``kmeans`` they are the centres of the last assignment, so that
``assign_nearest(X, centers)`` reproduces ``labels``.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from sklearn.utils import check_random_state

from ._backend import namespace_of, read_lag, read_later, to_numpy
from ._validation import as_float_matrix, check_n_partitions
from .kernels import fill_nearest_open, nearest_centres, part_sums, row_blocks
from .pairwise import shifted_sq_distances, sq_distances, squared_norms


def _means(X, labels, n_parts, fallback=None):
    """Mean of each part; an empty part keeps ``fallback[j]``."""
    return _divide(*part_sums(X, labels, n_parts), fallback)


def _divide(sums, counts, fallback=None):
    """``sums / counts`` per part; a part with no members keeps ``fallback[j]``."""
    xp = namespace_of(sums)
    means = sums / xp.maximum(counts, 1)[:, None].astype(sums.dtype)
    if fallback is None:
        return means
    # A select, not a masked assignment: asking whether any part is empty would
    # read a device value back (a synchronisation in every Lloyd pass).
    return xp.where((counts == 0)[:, None], fallback, means)


def _capacities(n: int, n_parts: int, larger_first=None) -> np.ndarray:
    """Part capacities ``n // P`` plus one for ``n % P`` parts (``larger_first`` order)."""
    lo, r = divmod(n, n_parts)
    caps = np.full(n_parts, lo, dtype=np.int64)
    order = np.arange(n_parts) if larger_first is None else larger_first
    caps[order[:r]] += 1
    return caps


def _fill(X, centers, counts, caps, rows=None):
    """Greedy FCFS fill of ``X[rows]`` (in that order) into parts with room left."""
    xp = namespace_of(centers)
    rows = xp.arange(X.shape[0]) if rows is None else rows
    labels = xp.empty(rows.shape[0], dtype=np.int64)
    c_norms = squared_norms(centers)
    for start, stop in row_blocks(rows.shape[0], centers.shape[0]):
        D = shifted_sq_distances(X[rows[start:stop]], centers, c_norms)
        labels[start:stop] = fill_nearest_open(D, counts, caps)
    return labels


def _random_labels(n: int, n_parts: int, rng) -> np.ndarray:
    """The even random split's labels of ``n`` rows (host array; one permutation drawn)."""
    labels = np.empty(n, dtype=np.int64)
    labels[rng.permutation(n)] = np.arange(n) % n_parts
    return labels


def _contiguous_labels(n: int, n_parts: int) -> np.ndarray:
    """Part j for the j-th run of rows, the first ``n % P`` runs one row longer (host array)."""
    return np.repeat(np.arange(n_parts, dtype=np.int64), _capacities(n, n_parts))


def _random(X, n_parts, rng, **_):
    labels = namespace_of(X).asarray(_random_labels(X.shape[0], n_parts, rng))
    return labels, _means(X, labels, n_parts)


def _contiguous(X, n_parts, rng=None, **_):
    """You 2020, Alg 5 as its experiments run it (casvm2): each node's rows are its part.

    The data is assumed spread evenly over the nodes already, so the split
    moves nothing: part j is the j-th run of consecutive rows (the first
    ``n % P`` runs one row longer). On rows in random order it is an even
    random split like ``"random"``; on rows sorted by class or by a feature
    its parts are not samples of the whole (shuffle first). On Dask input
    the parts go to the workers holding their rows, so no row moves.
    ``rng`` is not used.
    """
    labels = namespace_of(X).asarray(_contiguous_labels(X.shape[0], n_parts))
    return labels, _means(X, labels, n_parts)


def _dense_rows(X, idx):
    rows = X[idx]
    return rows.toarray() if hasattr(rows, "toarray") else rows


def _fcfs(X, n_parts, rng, **_):
    n = X.shape[0]
    seeds = np.sort(rng.choice(n, n_parts, replace=False))
    centers = _dense_rows(X, seeds)
    counts = np.zeros(n_parts, dtype=np.int64)
    labels = _fill(X, centers, counts, _capacities(n, n_parts))
    return labels, _means(X, labels, n_parts)


def _kmeans_pp(X, n_parts, rng):
    """k-means++ seeding (Arthur & Vassilvitskii, 2007): D^2-weighted sampling.

    Each pick draws ``uniform(0, total)`` with ``total`` the sum of the
    current squared distances, so read naively every pick waits for the
    device. Where reads are costly (dense GPU input, :func:`read_lag`) the
    picks are made on the device from uniforms drawn up front instead,
    which is the same draw (see :func:`_kmeans_pp_ahead`).
    """
    n = X.shape[0]
    first = int(rng.randint(n))
    x_norms = squared_norms(X)
    if read_lag(X) and not hasattr(X, "tocsr"):
        state = rng.get_state()
        centers = _kmeans_pp_ahead(X, n_parts, rng, first, x_norms)
        if centers is not None:
            return centers
        rng.set_state(state)
    return _kmeans_pp_in_turn(X, n_parts, rng, first, x_norms)


def _closest_sq_distances(X, x_norms, c):
    """Squared distances of the rows of ``X`` to the centre ``c`` (a row), clamped at 0."""
    xp = namespace_of(X)
    return xp.maximum(shifted_sq_distances(X, c[None, :])[:, 0] + x_norms, 0.0)


def _kmeans_pp_in_turn(X, n_parts, rng, first, x_norms):
    """k-means++ picks one after another, each read back to the host."""
    xp = namespace_of(X)
    n = X.shape[0]
    centers = [_dense_rows(X, [first])[0]]
    closest = _closest_sq_distances(X, x_norms, centers[0])
    for _ in range(1, n_parts):
        cumulative = xp.cumsum(closest)
        total = float(cumulative[-1])
        if total <= 0:  # fewer distinct points than parts: any sample will do
            pick = int(rng.randint(n))
        else:
            pick = int(xp.searchsorted(cumulative, rng.uniform(0, total)))
            pick = min(pick, n - 1)
        c = _dense_rows(X, [pick])[0]
        centers.append(c)
        xp.minimum(closest, _closest_sq_distances(X, x_norms, c), out=closest)
    return namespace_of(centers[0]).stack(centers)


def _kmeans_pp_ahead(X, n_parts, rng, first, x_norms):
    """The picks of :func:`_kmeans_pp_in_turn` with one read-back instead of one per pick.

    ``rng.uniform(0, total)`` is ``0 + total * u`` with ``u`` the generator's
    next double, and ``rng.random_sample`` draws the same doubles: so the
    ``n_parts - 1`` values of ``u`` are drawn first, and each pick is found on
    the device as ``searchsorted(cumulative, total * u)``, with ``total`` a
    device scalar (float64, as the Python float the host path passes). The
    totals are read back once at the end: if any is not positive and finite
    (the host path would then have drawn ``randint`` instead, or raised), this
    returns None and the caller repeats the seeding in turn from the saved
    generator state, so results and the generator's final state are always
    those of the host path. Dense input only.
    """
    xp = namespace_of(X)
    n = X.shape[0]
    u = rng.random_sample(n_parts - 1)
    centers = [_dense_rows(X, [first])[0]]
    closest = _closest_sq_distances(X, x_norms, centers[0])
    totals = []
    for k in range(n_parts - 1):
        cumulative = xp.cumsum(closest)
        total = cumulative[-1:].astype(np.float64)
        totals.append(total)
        pick = xp.minimum(xp.searchsorted(cumulative, total * float(u[k])), n - 1)
        c = X[pick][0]
        centers.append(c)
        xp.minimum(closest, _closest_sq_distances(X, x_norms, c), out=closest)
    totals = to_numpy(xp.concatenate(totals)) if totals else np.ones(1)
    if not (np.isfinite(totals).all() and (totals > 0).all()):
        return None
    return xp.stack(centers)


def kmeans(X, n_parts, random_state=None, *, max_iter=100, tol=1e-4):
    """Lloyd's k-means with k-means++ seeding; returns ``(labels, centers)``.

    ``tol`` is relative to the mean per-feature variance of X (as
    scikit-learn's KMeans). The returned labels are the nearest of the
    returned centres.
    """
    X = as_float_matrix(X)
    n_parts = check_n_partitions(n_parts, X.shape[0])
    return _kmeans(X, n_parts, check_random_state(random_state), max_iter=max_iter, tol=tol)


def _kmeans(X, n_parts, rng, max_iter=100, tol=1e-4, **_):
    centers = _kmeans_pp(X, n_parts, rng)
    xp = namespace_of(centers)
    if hasattr(X, "tocsr"):
        mean_sq = float(X.multiply(X).mean())
        variance = mean_sq - float(X.mean()) ** 2
    else:
        variance = float(X.var(axis=0).mean())
    threshold = tol * variance
    # Each pass assigns every sample to its nearest centre and sums the parts,
    # so the next centres cost no second sweep over X.
    labels, sums, counts = nearest_centres(X, centers, with_sums=True)
    # Pass i stops the loop if the centres moved by at most the threshold
    # before it. On a GPU that shift is read only after later passes are
    # queued (read_lag), so the device never idles while the host decides;
    # passes run past the stop are dropped and the stopping one returned, so
    # every device stops where the host does.
    lag = read_lag(X)
    unread = deque()
    for _ in range(max_iter):
        new_centers = _divide(sums, counts, fallback=centers)
        shift = read_later(((new_centers - centers) ** 2).sum())
        centers = new_centers
        labels, sums, counts = nearest_centres(X, centers, with_sums=True)
        unread.append((shift, labels, centers))
        if len(unread) > lag:
            stopped = _stopped(unread, threshold)
            if stopped:
                return stopped
    # max_iter passes ran; the last is returned whatever its shift, but an
    # earlier unread pass may be where the host stopped.
    while len(unread) > 1:
        stopped = _stopped(unread, threshold)
        if stopped:
            return stopped
    return labels, xp.ascontiguousarray(centers)


def _stopped(unread, threshold):
    """Read the oldest unread pass: ``(labels, centers)`` if the loop stops there, else None."""
    shift, labels, centers = unread.popleft()
    if shift() <= threshold:
        return labels, namespace_of(centers).ascontiguousarray(centers)
    return None


def _kbalance(X, n_parts, rng, max_iter=100, tol=1e-4, **_):
    km_labels, km_centers = _kmeans(X, n_parts, rng, max_iter=max_iter, tol=tol)
    sizes = to_numpy(namespace_of(km_labels).bincount(km_labels, minlength=n_parts))
    caps = _capacities(X.shape[0], n_parts, np.argsort(-sizes, kind="stable"))
    counts = np.zeros(n_parts, dtype=np.int64)
    labels = _fill(X, km_centers, counts, caps)
    return labels, _means(X, labels, n_parts)


def _bkm(X, n_parts, rng, max_iter=100, tol=1e-4, **_):
    labels, km_centers = _kmeans(X, n_parts, rng, max_iter=max_iter, tol=tol)
    xp = namespace_of(labels)
    sizes = to_numpy(xp.bincount(labels, minlength=n_parts))
    caps = _capacities(X.shape[0], n_parts, np.argsort(-sizes, kind="stable"))
    # Over-full part j gives up its (size - cap) members farthest from its centre,
    # farthest first; parts are visited in index order (Alg 4, lines 9-26).
    labels_host = to_numpy(labels)
    movers = []
    for j in np.flatnonzero(sizes > caps):
        members = np.flatnonzero(labels_host == j)
        d2 = to_numpy(sq_distances(_dense_rows(X, members), km_centers[j][None, :])[:, 0])
        farthest_first = members[np.argsort(-d2, kind="stable")]
        movers.append(farthest_first[: sizes[j] - caps[j]])
    if movers:
        movers = np.concatenate(movers)
        counts = np.minimum(sizes, caps).astype(np.int64)
        rows = xp.asarray(movers)
        labels = labels.copy()
        labels[rows] = _fill(X, km_centers, counts, caps, rows=rows)
    return labels, _means(X, labels, n_parts)


#: Partitioners by name; each is ``f(X, n_parts, rng, max_iter=, tol=) -> (labels, centers)``.
PARTITIONERS = {
    "random": _random,
    "contiguous": _contiguous,
    "fcfs": _fcfs,
    "kmeans": _kmeans,
    "kbalance": _kbalance,
    "bkm": _bkm,
}


def partition(X, n_partitions, method="random", *, random_state=None, max_iter=100, tol=1e-4):
    """Split the rows of ``X`` into ``n_partitions`` parts.

    Parameters
    ----------
    X : array of shape (n_samples, n_features), NumPy or CuPy, dense or CSR
    n_partitions : int in [1, n_samples]
    method : {"random", "contiguous", "fcfs", "kmeans", "kbalance", "bkm"}
    random_state : int, RandomState or None
    max_iter, tol : k-means iterations and relative tolerance (k-means based methods)

    Returns
    -------
    labels : int64 array of shape (n_samples,), on X's device
    centers : dense array of shape (n_partitions, n_features), on X's device

    References
    ----------
    Yang You, "Fast and Accurate Machine Learning on Distributed Systems and
    Supercomputers", PhD thesis, UC Berkeley, 2020: Alg 3 (FCFS), Alg 4 (BKM),
    Alg 5 (CA-SVM random split; ``"contiguous"``: its casvm2 run), Alg 9
    (K-balance).

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.partition import partition
    >>> X = np.random.default_rng(0).normal(size=(10, 2))
    >>> labels, centers = partition(X, 3, "kbalance", random_state=0)
    >>> np.bincount(labels).tolist()
    [4, 3, 3]
    """
    if method not in PARTITIONERS:
        raise ValueError(f"partition method must be one of {sorted(PARTITIONERS)}, got {method!r}")
    X = as_float_matrix(X)
    n_partitions = check_n_partitions(n_partitions, X.shape[0])
    rng = check_random_state(random_state)
    return PARTITIONERS[method](X, n_partitions, rng, max_iter=max_iter, tol=tol)


def assign_nearest(X, centers):
    """Index of the nearest centre for every row of ``X`` (Alg 5's routing of new samples).

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.partition import assign_nearest
    >>> centers = np.array([[0.0, 0.0], [1.0, 1.0]])
    >>> assign_nearest(np.array([[0.1, 0.0], [0.9, 1.2]]), centers).tolist()
    [0, 1]
    """
    X = as_float_matrix(X)
    centers = as_float_matrix(centers, "centers")
    if X.shape[1] != centers.shape[1]:
        raise ValueError(f"X has {X.shape[1]} features but centers have {centers.shape[1]}")
    return nearest_centres(X, centers)
