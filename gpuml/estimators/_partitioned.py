"""What every partitioned estimator shares: its parameters, its number of parts, its warnings.

CA-SVM (You 2020, Alg 5) and BKRR2 (Alg 10) have the same shape:

1. partition the training set into P parts and keep one centre per part;
2. fit one independent local model per part (no communication);
3. send every new sample to the model of its nearest centre.

The fit is :func:`gpuml.pipeline.fit_partitioned` (the steps, on one device, a
device group or a Dask cluster) with each estimator's part solver
(:mod:`gpuml.estimators._smo_solver`, :mod:`gpuml.estimators._cholesky_solver`);
prediction on the devices of the fit is :mod:`gpuml.pipeline.predict`'s. This
module holds what the estimators share besides: the parameter constraints of
partitioning and devices, ``n_partitions="auto"``, and the warnings about parts
that make a partitioned classifier's accuracy unpredictable.
"""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions

from ..errors import PartitionWarning
from ..kernels.pairwise import KERNELS
from ..partition import PARTITIONERS

#: ``_parameter_constraints`` entries for the kernel parameters (names as sklearn.svm.SVC).
KERNEL_CONSTRAINTS = {
    "kernel": [StrOptions(set(KERNELS))],
    "gamma": [StrOptions({"scale", "auto"}), Interval(Real, 0.0, None, closed="neither")],
    "degree": [Interval(Integral, 0, None, closed="left")],
    "coef0": [Interval(Real, None, None, closed="neither")],
}

#: ``_parameter_constraints`` entries for partitioning, device and parallelism.
PARTITION_CONSTRAINTS = {
    "n_partitions": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
    "partition": [StrOptions(set(PARTITIONERS))],
    "device": [str],
    "devices": [None, StrOptions({"all"}), list, tuple],
    "max_device_memory": [None, Interval(Real, 0.0, None, closed="neither"), str],
    "n_jobs": [Integral, None],
    "random_state": ["random_state"],
}


def auto_n_partitions(n: int, part_rows: int) -> int:
    """``n_partitions="auto"``: the fewest parts of at most ``part_rows`` rows.

    >>> auto_n_partitions(2048, 2048), auto_n_partitions(2049, 2048), auto_n_partitions(10**6, 2048)
    (1, 2, 489)
    """
    return max(1, -(-int(n) // int(part_rows)))


#: Fewer rows than this in a part: the local model has too little data (P is large for n).
MIN_PART_ROWS = 20
#: Fewer rows per class per part than this on average (n / (P * n_classes)): the expected
#: accuracy loss of nearest-centre prediction against one part is high (many classes
#: being simply where n / (P * n_classes) is small for a given n and P), while CA-SVM's
#: default (C scaled per part, the parts of a sample's nearest support vectors blended)
#: keeps SVC's accuracy far below it (bench/results/cpu-2core/casvm_parts.md,
#: casvm_partitioners.md, casvm_defaults.md).
MIN_ROWS_PER_CLASS = 300


def warn_poor_parts(part_rows, y_idx, n_classes, partition, blended=False):
    """Warn about parts that make a partitioned classifier's accuracy unpredictable.

    ``part_rows`` are the rows of each part, ``y_idx`` every row's class index.
    One warning per fit naming each problem found: parts that hold a single class
    (every sample routed to them gets that class), parts smaller than
    :data:`MIN_PART_ROWS`, and, unless the parts' predictions are ``blended``
    (CA-SVM's ``combine="auto"`` and ``"neighbors"``), fewer than :data:`MIN_ROWS_PER_CLASS`
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
            f"nearest-centre prediction (several points on the benchmarks of "
            f"bench/results/cpu-2core/casvm_parts.md){hint}; CA-SVM's default "
            f"combine='auto' with part_C='sqrt' keeps far more of it")
    if problems:
        warnings.warn("; ".join(problems) + ". Use a smaller n_partitions, or n_partitions=1 "
                      "for the exact model.", PartitionWarning, stacklevel=8)


def warn_stopped_parts(converged, max_iter):
    """SVC's ``ConvergenceWarning`` for a partitioned fit, naming the parts ``max_iter`` stopped
    (``converged``: one bool per part; one warning per fit, SVC's sentence first)."""
    if all(converged):
        return
    cap = ("" if max_iter >= 0 else
           ": an SMO problem reached LIBSVM's cap of max(10**7, 100 * n_samples) steps")
    stopped = [p for p, ok in enumerate(converged) if not ok]
    where = ("" if len(converged) == 1 else
             f" Stopped in {len(stopped)} of {len(converged)} parts: parts {_some(stopped)}.")
    warnings.warn(f"Solver terminated early (max_iter={max_iter}){cap}.  Consider "
                  f"pre-processing your data with StandardScaler or MinMaxScaler.{where}",
                  ConvergenceWarning, stacklevel=8)


def _some(items, limit=8):
    head = ", ".join(str(i) for i in items[:limit])
    return head + (", ..." if len(items) > limit else "")
