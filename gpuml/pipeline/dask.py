"""The Dask executor of :class:`gpuml.pipeline.PartitionedFit`: a fit on a Dask cluster.

The machinery (the chunks held on the workers, the split over them, the parts
shipped and fitted) is :mod:`gpuml.distributed.dask`'s; the rules and the part
solver are the estimator's.
"""

from __future__ import annotations

import copy

import numpy as np
from sklearn.base import is_classifier
from sklearn.utils.multiclass import check_classification_targets

from .._backend import CPU
from ..distributed.dask import (
    Driver,
    SplitStart,
    check_budget,
    check_dask_input,
    check_group_budget,
    current_client,
    feature_source,
    load_rows,
    partition_chunks,
    ship_and_fit,
    workers_and_budget,
)
from ..partition import Partitioning
from .data import FitData, FitResult


class _Spread:
    """What data-driven defaults read of the rows (``shape``, ``var()``), from the chunks'
    summaries: the variance of all entries, as ``gamma="scale"`` needs it."""

    def __init__(self, shape, variance):
        self.shape = shape
        self._variance = float(variance)

    def var(self):
        return self._variance


def _shipped(estimator):
    """The estimator as the fit tasks need it: parameters, the settings of this fit and its
    resolved kernel; of its fitted attributes, only those its part solver reads."""
    clone = copy.copy(estimator)
    for name in list(clone.__dict__):
        if name.endswith("_") and name not in estimator._part_solver_reads:
            del clone.__dict__[name]
    return clone


class OnDask:
    """A fit on a Dask cluster: the chunks validated and held on the workers, the split over
    them (:func:`partition_chunks`), each group of parts fitted where most of its rows are
    (:func:`ship_and_fit`). The estimator's rules and part solver, the cluster's work."""

    where = "dask"
    #: the workers fit the parts: their lines come from the client after
    reports_parts = False
    #: whether the parts are solved on GPUs (set by :meth:`load`)
    gpu = False
    streams = False

    def __init__(self, client=None):
        # None: the current client, looked up with the data (after the estimator's checks)
        self.client = client
        self.driver = None
        self.traffic = None

    def load(self, estimator, X, y, sample_weight) -> FitData:
        """The layout checked from the metadata alone (no chunk is computed yet)."""
        if y is None:
            raise ValueError("requires y to be passed, but the target y is None")
        self.client = self.client or current_client()
        # Each worker solves on its own device: a GPU where the estimator asks for one.
        self.gpu = str(estimator._fit_device()).startswith("cuda")
        features = feature_source(X)
        classifier = is_classifier(estimator)
        X, y, w = check_dask_input(X, y, sample_weight, multi_output=not classifier)
        self.addresses, self.budget = workers_and_budget(self.client)
        dtype = np.dtype(estimator._chunk_dtype(X))
        return FitData(X, int(X.shape[0]), int(X.shape[1]), targets=y, weights=w,
                       features=features, extra={"dtype": dtype, "itemsize": dtype.itemsize,
                                                 "classifier": classifier})

    def check_memory(self, estimator, data, sizes, n_parts=None):
        need = estimator._worker_memory_need(data.n_features, np.dtype(data.extra["dtype"]))
        check_budget(need, sizes, data.n, self.budget, type(estimator).__name__)

    def summarise(self, estimator, data, n_parts) -> FitData:
        """Every chunk computed, checked on its worker and held there; their summaries."""
        self.driver = driver = Driver(self.client)
        self.traffic = driver.traffic
        self.start = SplitStart(n_parts, estimator._split_method(), estimator.random_state)
        X, y = data.X, data.targets
        classifier = data.extra["classifier"]
        rows = load_rows(driver, X, y, data.weights, dtype=data.extra["dtype"],
                         classification=classifier, split=self.start)
        extra = dict(data.extra, _take=lambda ids: _gather_rows(X, y, ids, rows.dtype))
        out = FitData(rows, rows.n, rows.n_features, stats=_Spread(X.shape, rows.variance_all),
                      extra=extra)
        if classifier:
            check_classification_targets(rows.classes)
            out.classes, out.class_counts = rows.classes, rows.class_counts
            out.extra["_y_idx"] = np.searchsorted(rows.classes, rows.y).astype(np.int64)
        return out

    def split(self, data, n_parts, method, random_state) -> Partitioning:
        self.labels, centers = partition_chunks(data.X, n_parts, method, random_state,
                                                start=self.start)
        return Partitioning.from_labels(np.concatenate(self.labels).astype(np.int64),
                                        centers, n_parts)

    def fit_parts(self, estimator, data, partitioning) -> FitResult:
        sizes = partitioning.sizes
        # The largest part alone (its size is known now), then each worker's share once the
        # parts are placed: its chunks' rows and the parts it fits.
        self.check_memory(estimator, data, [int(np.max(sizes))])
        need = estimator._worker_memory_need(data.n_features, np.dtype(data.extra["dtype"]))
        row_bytes = data.n_features * int(data.extra["itemsize"])

        def check(address, part_sizes, held_rows):
            check_group_budget(need, part_sizes, held_rows, row_bytes, self.budget,
                               type(estimator).__name__, address)

        fits, part_worker, centers, kept = ship_and_fit(
            data.X, self.labels, sizes, estimator._part_costs(sizes, data.n_features),
            _shipped(estimator), data.for_workers(), self.addresses, partitioning.centers,
            check=check, keep=estimator._keeps_parts_on_workers)
        return FitResult(fits, backend=CPU, part_worker=np.asarray(part_worker, dtype=object),
                         centers=centers, kept=kept)


def _gather_rows(X, y, ids, dtype):
    """Host rows ``ids`` of Dask ``X`` and ``y`` (a small subsample), in ``dtype``."""
    return (np.asarray(X[ids].compute(), dtype=dtype), np.asarray(y[ids].compute(), dtype=dtype),
            None)
