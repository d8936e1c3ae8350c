"""The Dask executor of :func:`gpuml.pipeline.fit_partitioned`: a fit on a Dask cluster.

The machinery (the chunks held on the workers, the split over them, the parts
shipped and fitted) is :mod:`gpuml.distributed.dask`'s; the rules are the estimator's
and the part solver, shipped to the workers, its solver's.
"""

from __future__ import annotations

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
    place_parts,
    ship_and_fit,
    workers_and_budget,
)
from ..partition import Partitioning
from .contract import Capability, Executor
from .data import FitData, FitResult


class _Spread:
    """What data-driven defaults read of the rows (``shape``, ``var()``), from the chunks'
    summaries: the variance of all entries, as ``gamma="scale"`` needs it."""

    def __init__(self, shape, variance):
        self.shape = shape
        self._variance = float(variance)

    def var(self):
        return self._variance


class OnDask(Executor):
    """A fit on a Dask cluster: the chunks validated and held on the workers, the split over
    them (:func:`partition_chunks`), each part placed where most of its rows are
    (:func:`place_parts`), each worker's group fitted there by every solver
    (:func:`ship_and_fit`). The estimator's rules and solver, the cluster's
    work. Each worker solves on its own device: ``device`` resolved there (a GPU for
    ``"auto"`` where it has one)."""

    capabilities = frozenset({Capability.HOST_KERNEL})
    refusals = {
        Capability.STREAM: "max_device_memory is for a fit in this process: on Dask each "
                           "worker's memory_limit bounds its parts",
        Capability.WEIGHTED_SETTINGS: "sample_weight is not supported on Dask input for "
                                      "{name} yet: fit on in-memory data, or without weights",
        Capability.KERNEL_MATRIX: "{setting} does not run on Dask input: partitioning and "
                                  "routing need the samples' features",
        Capability.PROBABILITY: "{setting} does not run on Dask input: fit "
                                "CalibratedClassifierCV({name}(...)) on in-memory data, or "
                                "leave probability unset",
        Capability.DEVICE_GROUP: "devices= is for several devices of one process; on Dask "
                                 "each worker fits its parts on its own device: leave "
                                 "devices=None",
        Capability.LAYERS: "{setting} does not run on Dask input (its layers depend on each "
                           "other): use {instead} or in-memory data",
    }

    def __init__(self, device="auto", client=None):
        self.device = device
        # None: the current client, looked up with the data (after the estimator's checks)
        self.client = client
        self.driver = None
        self.traffic = None

    @property
    def gpu(self) -> bool:
        """Whether the parts are solved on GPUs: where the estimator asks for one."""
        return str(self.device).startswith("cuda")

    def load(self, estimator, X, y, sample_weight) -> FitData:
        """The layout checked from the metadata alone (no chunk is computed yet)."""
        if y is None:
            raise ValueError("requires y to be passed, but the target y is None")
        self.client = self.client or current_client()
        features = feature_source(X)
        self.classifier = is_classifier(estimator)
        X, y, w = check_dask_input(X, y, sample_weight, multi_output=not self.classifier)
        self.addresses, self.budget = workers_and_budget(self.client)
        self.dtype = np.dtype(estimator._fit_dtype(X))
        return FitData(X, int(X.shape[0]), int(X.shape[1]), targets=y, weights=w,
                       features=features, itemsize=self.dtype.itemsize)

    def check_memory(self, costs, data, sizes, n_parts=None):
        for cost in costs:
            check_budget(cost.worker_bytes(data.n_features, data.itemsize), sizes, data.n,
                         self.budget, cost.name)

    def summarise(self, estimator, data, n_parts) -> FitData:
        """Every chunk computed, checked on its worker and held there; their summaries."""
        self.driver = driver = Driver(self.client)
        self.traffic = driver.traffic
        self.start = SplitStart(n_parts, estimator._split_method(), estimator.random_state)
        X, y = data.X, data.targets
        rows = load_rows(driver, X, y, data.weights, dtype=self.dtype,
                         classification=self.classifier, split=self.start)
        out = FitData(rows, rows.n, rows.n_features, stats=_Spread(X.shape, rows.variance_all),
                      itemsize=data.itemsize,
                      sample=lambda ids: _gather_rows(X, y, ids, rows.dtype))
        if self.classifier:
            check_classification_targets(rows.classes)
            out.classes, out.class_counts = rows.classes, rows.class_counts
            out.class_index = np.searchsorted(rows.classes, rows.y).astype(np.int64)
        return out

    def split(self, data, n_parts, method, random_state) -> Partitioning:
        self.labels, centers = partition_chunks(data.X, n_parts, method, random_state,
                                                start=self.start)
        return Partitioning.from_labels(np.concatenate(self.labels).astype(np.int64),
                                        centers, n_parts)

    def place(self, solvers, data, partitioning) -> list[np.ndarray]:
        """The parts of each worker (:func:`place_parts`), by the first solver's cost model,
        after refusing the largest part alone (its size is known now), then each worker's
        share: its chunks' rows and the parts it fits, one solver at a time."""
        sizes = partitioning.sizes
        costs = [solver.cost for solver in solvers]
        self.check_memory(costs, data, [int(np.max(sizes))])
        needs = [cost.worker_bytes(data.n_features, data.itemsize) for cost in costs]
        row_bytes = data.n_features * data.itemsize

        def need(part_sizes):
            return max(one(part_sizes) for one in needs)

        def check(address, part_sizes, held_rows):
            check_group_budget(need, part_sizes, held_rows, row_bytes, self.budget,
                               costs[0].name, address)

        return place_parts(data.X, self.labels, sizes, costs[0].weights(sizes, data.n_features),
                           self.addresses, check=check)

    def fit_parts(self, solvers, data, partitioning, placement) -> list[FitResult]:
        fits, part_worker, centers, kept = ship_and_fit(
            data.X, self.labels, placement, solvers, data.classes, self.device, self.addresses,
            partitioning.centers, part_rows=partitioning.parts)
        part_worker = np.asarray(part_worker, dtype=object)
        return [FitResult(fits_k, solver=solver, backend=CPU, part_worker=part_worker,
                          centers=centers, kept=kept_k)
                for solver, fits_k, kept_k in zip(solvers, fits, kept)]


def _gather_rows(X, y, ids, dtype):
    """Host rows ``ids`` of Dask ``X`` and ``y`` (a small subsample), in ``dtype``."""
    return (np.asarray(X[ids].compute(), dtype=dtype), np.asarray(y[ids].compute(), dtype=dtype),
            None)
