"""What every partitioned estimator shares: split, fit P local models, route predictions.

CA-SVM (seed 001, Alg 5) and BKRR2 (Alg 10) have the same shape:

1. partition the training set into P parts and keep one centre per part;
2. fit one independent local model per part (no communication);
3. send every new sample to the model of its nearest centre.

Steps 1 and 3 live here; step 2 is each estimator's own, through a batched
solver in :mod:`gpuml.kernels` that runs the P local problems at once (joblib
threads on the CPU, one launch on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from .._backend import namespace_of, to_numpy
from .._validation import check_n_partitions
from ..kernels import KERNELS
from ..partition import PARTITIONERS, assign_nearest, partition

#: ``_parameter_constraints`` entries for the kernel parameters (names as sklearn.svm.SVC).
KERNEL_CONSTRAINTS = {
    "kernel": [StrOptions(set(KERNELS))],
    "gamma": [StrOptions({"scale", "auto"}), Interval(Real, 0.0, None, closed="neither")],
    "degree": [Interval(Integral, 0, None, closed="left")],
    "coef0": [Interval(Real, None, None, closed="neither")],
}

#: ``_parameter_constraints`` entries for partitioning, device and parallelism.
PARTITION_CONSTRAINTS = {
    "n_partitions": [Interval(Integral, 1, None, closed="left")],
    "partition": [StrOptions(set(PARTITIONERS))],
    "device": [str],
    "n_jobs": [Integral, None],
    "random_state": ["random_state"],
}


@dataclass
class Partitioning:
    """The result of step 1: labels, centres, and the sample indices of each part (host)."""

    labels: np.ndarray
    centers: object
    parts: list

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(p) for p in self.parts], dtype=np.int64)


def split(X, n_partitions, method, random_state) -> Partitioning:
    """Partition ``X`` (step 1). With one part, no clustering is run at all."""
    n = X.shape[0]
    n_partitions = check_n_partitions(n_partitions, n)
    if n_partitions == 1:
        xp = namespace_of(X)
        center = xp.asarray(X.mean(axis=0)).reshape(1, -1)
        return Partitioning(np.zeros(n, dtype=np.int64), center, [np.arange(n)])
    labels, centers = partition(X, n_partitions, method, random_state=random_state)
    labels = to_numpy(labels)
    order = np.argsort(labels, kind="stable")
    bounds = np.cumsum(np.bincount(labels, minlength=n_partitions))[:-1]
    return Partitioning(labels, centers, np.split(order, bounds))


def route(X, centers):
    """Part index of every row of ``X`` (step 3), on the host."""
    if centers.shape[0] == 1:
        return np.zeros(X.shape[0], dtype=np.int64)
    return to_numpy(assign_nearest(X, centers))
