"""The rows of one array in this process, as the partitioners of :mod:`.algorithms` ask.

NumPy or CuPy, dense or CSR. Every collective of the algorithms is trivial
here (one block of rows); the distance and assignment steps are GEMMs or the
fused numba sweep on the array's device (:func:`gpuml.kernels.nearest_centres`),
the greedy fill a numba loop over blocks of distances
(:func:`gpuml.kernels.fill_nearest_open`).
"""

from __future__ import annotations

import numpy as np

from .._backend import namespace_of, read_lag, to_numpy
from ..kernels import OpenDistances, fill_blocks, fill_nearest_open, nearest_centres, part_sums
from ..kernels.pairwise import shifted_sq_distances, sq_distances, squared_norms
from .algorithms import divide


def dense_rows(X, idx):
    """``X[idx]`` as a dense array (CSR rows densified)."""
    rows = X[idx]
    return rows.toarray() if hasattr(rows, "toarray") else rows


def _distances_to(X, x_norms, c):
    """Squared distances of the rows of ``X`` to the centre ``c`` (a row), clamped at 0."""
    xp = namespace_of(X)
    return xp.maximum(shifted_sq_distances(X, c[None, :])[:, 0] + x_norms, 0.0)


def fill(X, centers, counts, caps, rows=None):
    """Greedy FCFS fill of ``X[rows]`` (in that order) into parts with room left (on a
    device in the blocks of :func:`~gpuml.kernels.fill_blocks`)."""
    xp = namespace_of(centers)
    rows = xp.arange(X.shape[0]) if rows is None else rows
    labels = xp.empty(rows.shape[0], dtype=np.int64)
    distances = OpenDistances(centers)
    for start, stop in fill_blocks(rows.shape[0], centers):
        D = distances(X[rows[start:stop]], counts, caps)
        labels[start:stop] = fill_nearest_open(D, counts, caps,
                                               entries=rows.shape[0] * centers.shape[0])
    return labels


class LocalRows:
    """The rows of ``X`` (one process, one device) for :mod:`.algorithms`: one block."""

    def __init__(self, X):
        self.X = X
        self.xp = namespace_of(X)
        self.n, self.n_features = int(X.shape[0]), int(X.shape[1])
        self.read_lag = read_lag(X)
        self._x_norms = self._closest = self._cumulative = None
        # (centres, labels) of the recent Lloyd passes: the labels a split returns are
        # those of the pass it stopped at, which may be a few passes back (read_lag).
        self._passes = []

    def variance(self) -> float:
        X = self.X
        if hasattr(X, "tocsr"):
            mean_sq = float(X.multiply(X).mean())
            return mean_sq - float(X.mean()) ** 2
        return float(X.var(axis=0).mean())

    def row(self, i):
        return dense_rows(self.X, [i])[0]

    def rows(self, ids):
        return dense_rows(self.X, ids)

    def stack(self, rows):
        return namespace_of(rows[0]).stack(rows)

    def _norms(self):
        if self._x_norms is None:
            self._x_norms = squared_norms(self.X)
        return self._x_norms

    def _totals(self):
        self._cumulative = self.xp.cumsum(self._closest)
        return np.array([float(self._cumulative[-1])])

    def first(self, c):
        self._closest = _distances_to(self.X, self._norms(), c)
        return self._totals()

    def closer(self, c):
        self.xp.minimum(self._closest, _distances_to(self.X, self._norms(), c),
                        out=self._closest)
        return self._totals()

    def pick(self, block, u):
        pick = min(int(self.xp.searchsorted(self._cumulative, u)), self.n - 1)
        return dense_rows(self.X, [pick])[0]

    def seed_ahead(self, first, n_parts, rng):
        """The picks of in-turn k-means++ with one read-back instead of one per pick.

        ``rng.uniform(0, total)`` is ``0 + total * u`` with ``u`` the generator's
        next double, and ``rng.random_sample`` draws the same doubles: so the
        ``n_parts - 1`` values of ``u`` are drawn first, and each pick is found on
        the device as ``searchsorted(cumulative, total * u)``, with ``total`` a
        device scalar (float64, as the Python float the in-turn path passes). The
        totals are read back once at the end: if any is not positive and finite
        (the in-turn path would then have drawn ``randint`` instead, or raised),
        this returns None and the caller seeds in turn from the saved generator
        state, so results and the generator's final state are always those of
        the in-turn path. Dense input only (None for CSR).
        """
        X, xp = self.X, self.xp
        if hasattr(X, "tocsr"):
            return None
        u = rng.random_sample(n_parts - 1)
        centers = [dense_rows(X, [first])[0]]
        closest = _distances_to(X, self._norms(), centers[0])
        totals = []
        for k in range(n_parts - 1):
            cumulative = xp.cumsum(closest)
            total = cumulative[-1:].astype(np.float64)
            totals.append(total)
            pick = xp.minimum(xp.searchsorted(cumulative, total * float(u[k])), self.n - 1)
            c = X[pick][0]
            centers.append(c)
            xp.minimum(closest, _distances_to(X, self._norms(), c), out=closest)
        totals = to_numpy(xp.concatenate(totals)) if totals else np.ones(1)
        if not (np.isfinite(totals).all() and (totals > 0).all()):
            return None
        return xp.stack(centers)

    def assign(self, centers):
        labels, sums, counts = nearest_centres(self.X, centers, with_sums=True)
        self._passes = self._passes[-(self.read_lag + 1):] + [(centers, labels)]
        return sums, counts

    def nearest(self, centers):
        for seen, labels in reversed(self._passes):
            if seen is centers:
                return labels
        return nearest_centres(self.X, centers)

    def fill(self, centers, counts, caps, rows=None):
        if rows is None:
            return fill(self.X, centers, counts, caps)
        return to_numpy(fill(self.X, centers, counts, caps, rows=self.xp.asarray(rows)))

    def members(self, labels, parts, centers):
        """``(j, members, squared distances to centre j)`` of each part ``j`` of ``parts``."""
        labels_host = to_numpy(labels)
        for j in parts.tolist():
            members = np.flatnonzero(labels_host == j)
            d2 = to_numpy(sq_distances(dense_rows(self.X, members), centers[j][None, :])[:, 0])
            yield j, members, d2

    def relabel(self, labels, rows, new):
        labels = labels.copy()
        labels[self.xp.asarray(rows)] = self.xp.asarray(new)
        return labels

    def local(self, labels):
        return self.xp.asarray(labels)

    def sample(self, ids):
        return LocalRows(self.X[self.xp.asarray(ids)])

    def stack_centers(self, centers):
        return centers

    def means(self, labels, n_parts, fallback=None):
        return divide(*part_sums(self.X, labels, n_parts), fallback)
