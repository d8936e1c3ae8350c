"""What every partitioned estimator shares: split, fit P local models, route predictions.

CA-SVM (You 2020, Alg 5) and BKRR2 (Alg 10) have the same shape:

1. partition the training set into P parts and keep one centre per part;
2. fit one independent local model per part (no communication);
3. send every new sample to the model of its nearest centre.

Steps 1 and 3 live here; step 2 is each estimator's own, in two halves that
this module connects:

* ``_fit_parts`` fits the local models of a given list of parts on the current
  device, as one batch (joblib threads on the CPU, one launch on a GPU), into
  small per-part results;
* ``_assemble`` (``_store_fit`` for BKRR) turns the per-part results, in part
  order, and the centres into the fitted attributes.

On one device ``_fit_parts`` gets every part. With several devices (the
estimators' ``devices`` parameter) the data is sharded for partitioning
(:mod:`gpuml.distributed.partition`), the parts are placed on the devices by
cost (:func:`gpuml.distributed.balance`), each device fits its parts in its
own host thread (:func:`fit_on_devices`), and prediction sends each row to its
part's device (:func:`route_on_devices`, :func:`predict_on_devices`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from .._backend import namespace_of, resolve_devices, sparse_module, to_numpy
from .._validation import check_n_partitions
from ..distributed import DeviceGroup, partition_on_devices
from ..distributed.placement import shard_bounds
from ..errors import PartitionWarning
from ..pairwise import KERNELS, sq_distances, squared_norms
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
    "devices": [None, StrOptions({"all"}), list, tuple],
    "n_jobs": [Integral, None],
    "random_state": ["random_state"],
}


#: Fewer rows than this in a part: the local model has too little data (P is large for n).
MIN_PART_ROWS = 20
#: Fewer rows per class per part than this on average (n / (P * n_classes)): the expected
#: accuracy loss against one part is high. Measured (bench/results/cpu-2core/casvm_parts.md,
#: casvm_partitioners.md; loss in points against SVC, three seeds): letter (26 classes,
#: 15,000 rows) at P=4 holds 144 rows per class and part and lost 6.0 points (random split)
#: / 3.8 (fcfs), at P=16 (36 rows) 17.4 / 6.5 (k-means 2.5); adult (2 classes, 36,631 rows)
#: at P=64 (286 rows) lost 2.5 / 1.8, at P=16 (1,145 rows) 1.2 / 1.2. Every measured
#: setting under 300 lost 1.8 points or more; the many-class case is simply the one where
#: n / (P * n_classes) is small for a given n and P. Only for nearest-centre prediction:
#: CA-SVM's default (C scaled per part, the parts of a sample's nearest support vectors
#: blended) lost -0.8 to 0.1 point on letter at P=16-128 (36 to 4.6 rows per class and
#: part), where the nearest centre lost 6.5-12.
MIN_ROWS_PER_CLASS = 300


def warn_poor_parts(part_rows, y_idx, n_classes, partition, blended=False):
    """Warn about parts that make a partitioned classifier's accuracy unpredictable.

    ``part_rows`` are the rows of each part, ``y_idx`` every row's class index.
    One warning per fit naming each problem found: parts that hold a single class
    (every sample routed to them gets that class), parts smaller than
    :data:`MIN_PART_ROWS`, and, unless the parts' predictions are ``blended``
    (CA-SVM's ``combine="neighbors"``), fewer than :data:`MIN_ROWS_PER_CLASS`
    rows per class per part on average. A single part never warns (it is the
    exact model).
    """
    P = len(part_rows)
    if P < 2:
        return
    sizes = np.array([len(r) for r in part_rows], dtype=np.int64)
    problems = []
    if n_classes >= 2:
        single = [p for p, rows in enumerate(part_rows)
                  if len(rows) and np.unique(y_idx[np.asarray(rows)]).size == 1]
        if single:
            problems.append(
                f"{len(single)} of {P} parts hold samples of one class only (parts "
                f"{_some(single)}): every sample routed to them is predicted as that class")
    small = np.flatnonzero(sizes < MIN_PART_ROWS).tolist()
    if small:
        problems.append(f"{len(small)} of {P} parts have fewer than {MIN_PART_ROWS} rows "
                        f"(parts {_some(small)}; the smallest has {int(sizes.min())}): "
                        f"n_partitions={P} is large for {int(sizes.sum())} samples")
    per_class = sizes.sum() / (P * max(n_classes, 1))
    if n_classes >= 2 and per_class < MIN_ROWS_PER_CLASS and not blended:
        hint = ("" if partition == "kmeans" else
                "; partition='kmeans' loses far less on many-class data")
        problems.append(
            f"the parts hold {per_class:.0f} rows per class on average, fewer than "
            f"{MIN_ROWS_PER_CLASS}: expect a large accuracy loss against one part with "
            f"nearest-centre prediction (measured: 26-class letter at 144 rows per class and "
            f"part lost 6.0 points with the random split, at 36 rows 17.4, 2.5 with k-means; "
            f"binary adult at 286 rows 2.5){hint}; CA-SVM's default combine='neighbors' "
            f"with part_C='sqrt' lost 0.1 point or less on letter at 36 rows")
    if problems:
        warnings.warn("; ".join(problems) + ". Use a smaller n_partitions, or n_partitions=1 "
                      "for the exact model.", PartitionWarning, stacklevel=5)


def _some(items, limit=8):
    head = ", ".join(str(i) for i in items[:limit])
    return head + (", ..." if len(items) > limit else "")


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


def split_on_devices(group, X, n_partitions, method, random_state) -> Partitioning:
    """Step 1 with the rows of host ``X`` sharded over ``group``: the same parts as :func:`split`.

    The centres come back to the host.
    """
    n = X.shape[0]
    n_partitions = check_n_partitions(n_partitions, n)
    if n_partitions == 1:
        center = np.asarray(X.mean(axis=0)).reshape(1, -1)
        return Partitioning(np.zeros(n, dtype=np.int64), center, [np.arange(n)])
    labels, centers = partition_on_devices(group, X, n_partitions, method,
                                           random_state=random_state)
    return Partitioning.from_labels(labels, centers, n_partitions)


def device_group(estimator) -> DeviceGroup | None:
    """The estimator's ``devices`` as a :class:`DeviceGroup`, or None for one device.

    Validated before any work (see :func:`gpuml._backend.resolve_devices`).
    """
    backends = resolve_devices(estimator.devices)
    if backends is None:
        return None
    if estimator.device != "auto":
        raise ValueError(f"give device= for one device or devices= for several, not both "
                         f"(device={estimator.device!r}, devices={estimator.devices!r})")
    return DeviceGroup(backends)


def prediction_group(devices) -> DeviceGroup | None:
    """The devices a model fitted on several devices predicts on.

    None for a one-device model, and where those devices are not there (a model
    unpickled on another machine): it then predicts on one device from its host
    arrays.
    """
    if devices is None:
        return None
    try:
        return DeviceGroup(resolve_devices(list(devices)))
    except RuntimeError:
        return None


def fit_on_devices(group, partitioning, placement, fit_local):
    """Step 2 over several devices: each device fits its placed parts, in its own thread.

    ``placement[r]`` lists the parts of device ``r`` (:func:`gpuml.distributed.balance`).
    ``fit_local(backend, part_ids, rows, local_rows)`` runs with the device
    current: ``rows`` are the parts' sample indices laid end to end (gather the
    data with them) and ``local_rows[k]`` the positions of part ``part_ids[k]``
    within ``rows``; it returns one result per part, in that order.

    Returns the results in part order and the device index of every part.
    """
    def work(rank, backend):
        ids = placement[rank]
        if ids.size == 0:
            return []
        blocks = [partitioning.parts[p] for p in ids.tolist()]
        rows = np.concatenate(blocks)
        ends = np.cumsum([len(b) for b in blocks])
        local = [np.arange(hi - len(b), hi) for b, hi in zip(blocks, ends.tolist())]
        return fit_local(backend, ids, rows, local)

    per_device = group.run(work)
    fits = [None] * len(partitioning.parts)
    part_device = np.empty(len(partitioning.parts), dtype=np.int64)
    for rank, (ids, results) in enumerate(zip(placement, per_device)):
        for p, result in zip(ids.tolist(), results):
            fits[p] = result
            part_device[p] = rank
    return fits, part_device


def stack_rows(blocks):
    """Row blocks (dense or CSR, one namespace) stacked into one matrix."""
    if len(blocks) == 1:
        return blocks[0]
    if hasattr(blocks[0], "tocsr"):
        return sparse_module(namespace_of(blocks[0])).vstack(blocks, format="csr")
    return namespace_of(blocks[0]).concatenate(blocks)


def on_device(estimator, backend, key, make, *args):
    """``make(*args)`` run with ``backend`` current and cached on the estimator per device.

    For fitted arrays copied to a GPU for prediction: a cache, not part of the
    model (the estimators drop ``_device_cache`` when pickled). On the CPU
    the result of ``make(*args)`` is returned as is.
    """
    if not backend.is_gpu:
        return make(*args)
    cache = estimator.__dict__.setdefault("_device_cache", {})
    key = (backend.device,) + tuple(key)
    if key not in cache:
        with backend.use():
            cache[key] = make(*args)
    return cache[key]


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


def route_on_devices(group, X, centers) -> np.ndarray:
    """Part index of every row of host ``X``, routed in row shards, one per device (host)."""
    if centers.shape[0] == 1:
        return np.zeros(X.shape[0], dtype=np.int64)
    bounds = shard_bounds(X.shape[0], group.size)

    def work(rank, backend):
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        if hi == lo:
            return np.zeros(0, dtype=np.int64)
        return route(backend.asarray(X[lo:hi]), backend.asarray(centers))

    return np.concatenate(group.run(work))


def predict_on_devices(group, X, owner, part_device, predict_local) -> np.ndarray:
    """Step 3 over several devices: rows grouped by their part's device, results in row order.

    ``predict_local(backend, X_rows, owner_rows)`` gets one device's rows (on
    that device) and their parts, and returns their values; every device runs
    once, in its own thread. The result is a host array.
    """
    device_of_row = np.asarray(part_device)[owner]

    def work(rank, backend):
        rows = np.flatnonzero(device_of_row == rank)
        if rows.size == 0:
            return rows, None
        values = predict_local(backend, backend.asarray(X[rows]), owner[rows])
        return rows, to_numpy(values)

    out = None
    for rows, values in group.run(work):
        if values is None:
            continue
        if out is None:
            out = np.empty((X.shape[0],) + values.shape[1:], dtype=values.dtype)
        out[rows] = values
    return out

