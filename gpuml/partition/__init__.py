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

The algorithms are written once (:mod:`.algorithms`) over the steps a
:class:`~.algorithms.Rows` answers: here the rows of one array
(:class:`~.local.LocalRows`); :mod:`gpuml.distributed` runs the same
algorithms over rows sharded across devices and over the chunks of a Dask
array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.utils import check_random_state

from .._backend import namespace_of, to_numpy
from .._validation import as_float_matrix, check_n_partitions
from ..kernels import nearest_centres
from .algorithms import (
    SPLITS,
    Rows,
    capacities,
    contiguous_labels,
    divide,
    fcfs_seeds,
    fewest_parts_fitting,
    random_labels,
    split_kmeans,
)
from .local import LocalRows, dense_rows

#: The partitioners by name (``partition=`` of the estimators).
PARTITIONERS = tuple(SPLITS)


def kmeans(X, n_parts, random_state=None, *, max_iter=100, tol=1e-4):
    """Lloyd's k-means with k-means++ seeding; returns ``(labels, centers)``.

    ``tol`` is relative to the mean per-feature variance of X (as
    scikit-learn's KMeans). The returned labels are the nearest of the
    returned centres.
    """
    X = as_float_matrix(X)
    n_parts = check_n_partitions(n_parts, X.shape[0])
    return split_kmeans(LocalRows(X), n_parts, check_random_state(random_state),
                        max_iter=max_iter, tol=tol)


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
    rows = LocalRows(X)
    labels, centers = SPLITS[method](rows, n_partitions, check_random_state(random_state),
                                     max_iter=max_iter, tol=tol)
    if centers is None:
        centers = rows.means(labels, n_partitions)
    return labels, centers


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


@dataclass
class Partitioning:
    """The result of step 1: labels, centres, and the sample indices of each part (host)."""

    labels: np.ndarray
    centers: object
    parts: list

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(p) for p in self.parts], dtype=np.int64)

    @classmethod
    def from_labels(cls, labels, centers, n_parts: int) -> Partitioning:
        """Parts from labels: each part's sample indices, ascending."""
        labels = to_numpy(labels)
        order = np.argsort(labels, kind="stable")
        bounds = np.cumsum(np.bincount(labels, minlength=n_parts))[:-1]
        return cls(labels, centers, np.split(order, bounds))


def split(X, n_partitions, method, random_state) -> Partitioning:
    """Partition ``X`` (step 1). With one part, no clustering is run at all."""
    n = X.shape[0]
    n_partitions = check_n_partitions(n_partitions, n)
    if n_partitions == 1:
        xp = namespace_of(X)
        center = xp.asarray(X.mean(axis=0)).reshape(1, -1)
        return Partitioning(np.zeros(n, dtype=np.int64), center, [np.arange(n)])
    labels, centers = partition(X, n_partitions, method, random_state=random_state)
    return Partitioning.from_labels(labels, centers, n_partitions)


__all__ = [
    "PARTITIONERS",
    "Partitioning",
    "SPLITS",
    "LocalRows",
    "Rows",
    "assign_nearest",
    "capacities",
    "contiguous_labels",
    "dense_rows",
    "divide",
    "fcfs_seeds",
    "fewest_parts_fitting",
    "kmeans",
    "partition",
    "random_labels",
    "split",
]
