"""Where a partitioned fit runs: the executors of :class:`gpuml.pipeline.PartitionedFit`.

An executor holds the validated data (:class:`FitData`) and runs the split,
the placement and the parts' fits; the estimator's hooks do the work that is
the estimator's (:mod:`gpuml.pipeline.fit` lists them). Each returns what it
computed (:class:`~gpuml.partition.Partitioning`, :class:`FitResult`) and sets
nothing on the estimator.
"""

from __future__ import annotations

import numpy as np

from .._backend import CPU, Backend, available_bytes, resolve, resolve_devices, to_numpy
from .._validation import check_memory_bytes, check_n_partitions
from ..distributed import DeviceGroup, balance, partition_on_devices
from ..distributed.placement import shard_bounds
from ..partition import Partitioning, fewest_parts_fitting, split
from ..routing import route
from .data import FitData, FitResult


def _rows_of(A, rows):
    """Rows ``rows`` (host indices) of a host array, or None."""
    return None if A is None else A[rows]


class InProcess:
    """Every step in this process, on one device (the CPU, or one GPU)."""

    where = "process"
    #: the estimator's solver reports each part as it ends (it runs in the calling thread)
    reports_parts = True
    #: whether the parts go through the device in groups (:class:`Streamed`)
    streams = False

    def __init__(self, backend: Backend):
        self.backend = backend

    @property
    def gpu(self) -> bool:
        """Whether the parts are solved on a GPU (an estimator's ``n_partitions="auto"``)."""
        return self.backend.is_gpu

    def load(self, estimator, X, y, sample_weight) -> FitData:
        return estimator._validate(X, y, sample_weight, self.backend)

    def summarise(self, estimator, data, n_parts) -> FitData:
        return data

    def check_memory(self, estimator, data, sizes, n_parts=None):
        with self.backend.use():
            estimator._check_fit_memory(sizes, data, self.backend, n_samples=data.n,
                                    n_parts=n_parts)

    def split(self, data, n_parts, method, random_state) -> Partitioning:
        with self.backend.use():
            return split(data.X, n_parts, method, random_state)

    def fit_parts(self, estimator, data, partitioning) -> FitResult:
        with self.backend.use():
            estimator._check_fit_memory(partitioning.sizes, data, self.backend)
            fits = estimator._solve_parts(self.backend, data, data.X, data.targets,
                                          data.weights, partitioning.parts,
                                          np.arange(len(partitioning.parts)))
        return FitResult(fits, backend=self.backend)


class OnDevices:
    """Several devices of this process, one host thread each.

    The rows are sharded over the devices for the split
    (:func:`gpuml.distributed.partition_on_devices`), the parts are placed by
    the estimator's cost model (:func:`gpuml.distributed.balance`, Graham's
    LPT rule), and each device fits its parts, in its own thread, from the
    host rows. The fitted model is assembled on the host; each part's arrays
    may also stay on its device for prediction (the estimator's
    ``_keep_on_device``).
    """

    where = "devices"
    reports_parts = False
    streams = False

    def __init__(self, group: DeviceGroup):
        self.group = group

    @property
    def gpu(self) -> bool:
        return any(backend.is_gpu for backend in self.group.backends)

    def load(self, estimator, X, y, sample_weight) -> FitData:
        return estimator._validate(X, y, sample_weight, CPU)

    def summarise(self, estimator, data, n_parts) -> FitData:
        return data

    def check_memory(self, estimator, data, sizes, n_parts=None):
        for backend in self.group.backends:
            with backend.use():
                estimator._check_fit_memory(sizes, data, backend, n_samples=data.n,
                                        n_parts=n_parts)

    def split(self, data, n_parts, method, random_state) -> Partitioning:
        return split_on_devices(self.group, data.X, n_parts, method, random_state)

    def fit_parts(self, estimator, data, partitioning) -> FitResult:
        group = self.group
        placement = balance(estimator._part_costs(partitioning.sizes, data.n_features),
                            group.size)
        for backend, ids in zip(group.backends, placement):
            if ids.size:
                with backend.use():
                    estimator._check_fit_memory(partitioning.sizes[ids], data, backend)

        def fit_local(backend, ids, rows, local):
            return estimator._solve_parts(backend, data, backend.asarray(data.X[rows]),
                                          _rows_of(data.targets, rows),
                                          _rows_of(data.weights, rows), local, ids)

        fits, part_device = fit_on_devices(group, partitioning, placement, fit_local)
        host = []
        for j, (rows, fit, rank) in enumerate(zip(partitioning.parts, fits,
                                                  part_device.tolist())):
            estimator._keep_on_device(group.backends[rank], j, fit)
            host.append(estimator._part_to_host(fit, data.X[rows]))
        return FitResult(host, backend=CPU, part_device=part_device, devices=group.devices)


class Streamed:
    """One device whose memory the whole fit would exceed: the parts streamed through it.

    The data stay on the host (validated there, split there); the parts are
    fitted in groups, in part order, each group as large as fits the budget by
    the estimator's ``_part_bytes`` (a part's rows and its solve), its rows
    copied to the device while the previous group is solved (a host thread;
    on a GPU gathered into page-locked memory and copied on a stream of their own,
    :meth:`~gpuml._backend.Backend.upload_rows`). A part that alone needs more
    than the budget is refused before any work. The fits are those of one
    resident fit (the same rows, in the same order, per part).
    """

    where = "process"
    #: the parts' lines come from the host, in part order, after the groups
    reports_parts = False
    streams = True

    def __init__(self, backend: Backend, budget: int):
        self.backend, self.budget = backend, int(budget)
        self.groups = []

    @property
    def gpu(self) -> bool:
        return self.backend.is_gpu

    def load(self, estimator, X, y, sample_weight) -> FitData:
        return estimator._validate(X, y, sample_weight, CPU)

    def summarise(self, estimator, data, n_parts) -> FitData:
        return data

    def check_memory(self, estimator, data, sizes, n_parts=None):
        """Refuse a part that alone needs more than the budget, naming a P that fits."""
        largest = int(np.max(sizes))
        need = int(estimator._part_bytes(np.array([largest]), data, self.backend).sum())
        if need <= self.budget:
            return
        n = data.n

        def fit_in(P):
            return estimator._part_bytes(np.array([-(-n // P)]), data,
                                         self.backend).sum() <= self.budget

        fits = fewest_parts_fitting(n, max(len(sizes), n_parts or 1), fit_in)
        change = (f"use n_partitions>={fits} (parts of at most {-(-n // fits)} rows)"
                  if fits else "even one row per part does not fit")
        raise MemoryError(
            f"{type(estimator).__name__}: a part of {largest} rows needs about "
            f"{need / 2**20:.1f} MiB on {self.backend.device} (its rows and its solve), more "
            f"than max_device_memory ({self.budget / 2**20:.1f} MiB); {change}, or allow more "
            "device memory")

    def split(self, data, n_parts, method, random_state) -> Partitioning:
        return split(data.X, n_parts, method, random_state)

    def _groups(self, estimator, data, sizes):
        """Consecutive parts, each run as large as the budget takes."""
        need = estimator._part_bytes(np.asarray(sizes), data, self.backend)
        groups, start, used = [], 0, 0
        for j, b in enumerate(need.tolist()):
            if j > start and used + b > self.budget:
                groups.append(np.arange(start, j))
                start, used = j, 0
            used += b
        return groups + [np.arange(start, len(sizes))]

    def fit_parts(self, estimator, data, partitioning) -> FitResult:
        from concurrent.futures import ThreadPoolExecutor

        parts = partitioning.parts
        self.check_memory(estimator, data, partitioning.sizes)
        self.groups = self._groups(estimator, data, partitioning.sizes)
        backend = self.backend

        def upload(ids):
            rows = np.concatenate([parts[j] for j in ids.tolist()])
            with backend.use():
                return rows, backend.upload_rows(data.X, rows)

        fits = []
        with ThreadPoolExecutor(1) as pool:
            ahead = pool.submit(upload, self.groups[0])
            for g, ids in enumerate(self.groups):
                rows, X_group = ahead.result()
                if g + 1 < len(self.groups):
                    ahead = pool.submit(upload, self.groups[g + 1])
                bounds = np.cumsum([0] + [len(parts[j]) for j in ids.tolist()])
                local = [np.arange(bounds[k], bounds[k + 1]) for k in range(len(ids))]
                with backend.use():
                    group_fits = estimator._solve_parts(
                        backend, data, X_group, _rows_of(data.targets, rows),
                        _rows_of(data.weights, rows), local, ids)
                del X_group
                fits += [estimator._part_to_host(fit, data.X[parts[j]])
                         for j, fit in zip(ids.tolist(), group_fits)]
        return FitResult(fits, backend=CPU)


def device_budget(estimator, X, backend):
    """The bytes a fit may use on its device (``max_device_memory``), or None: unbounded.

    Set: that many bytes. Not set: on a GPU, its free memory when the training data
    alone would take more than half of it (the fit is then streamed); otherwise None.
    """
    budget = check_memory_bytes(getattr(estimator, "max_device_memory", None))
    if budget is not None:
        return budget
    if backend.is_gpu and hasattr(X, "shape") and len(X.shape) == 2:
        with backend.use():
            free = available_bytes(backend.xp)
        if 8 * X.shape[0] * X.shape[1] > free // 2:
            return free
    return None


def fit_executor(estimator, X, y=None, sample_weight=None):
    """The executor of one fit, chosen once from the input and the estimator's ``devices``:
    Dask input runs on its cluster, ``devices=`` on a device group, the rest in process,
    streamed through the device under a memory budget (:func:`device_budget`).

    Validated before any work (see :func:`gpuml._backend.resolve_devices`).
    """
    from .._backend import is_dask_collection

    streamed = getattr(estimator, "max_device_memory", None) is not None
    if any(is_dask_collection(v) for v in (X, y, sample_weight)):
        if streamed:
            raise ValueError("max_device_memory is for a fit in this process: on Dask each "
                             "worker's memory_limit bounds its parts")
        dask_module()  # a clear error when Dask is not installed
        from .dask import OnDask

        return OnDask()
    group = device_group(estimator)
    if group is not None:
        if streamed:
            raise ValueError("max_device_memory is for one device: leave devices=None")
        return OnDevices(group)
    backend = resolve(estimator._fit_device(), X, y)
    budget = device_budget(estimator, X, backend)
    if budget is not None:
        return Streamed(backend, budget)
    return InProcess(backend)


def dask_module():
    """:mod:`gpuml.distributed.dask`, or a clear ImportError naming the optional dependency."""
    try:
        from ..distributed import dask as dask_support
    except ImportError as err:
        raise ImportError("Dask input needs dask and distributed: pip install 'gpuml[dask]' "
                          f"({err})") from err
    return dask_support


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


def split_on_devices(group, X, n_partitions, method, random_state) -> Partitioning:
    """The split with the rows of host ``X`` sharded over ``group``: the parts :func:`split`
    gives. The centres come back to the host."""
    n = X.shape[0]
    n_partitions = check_n_partitions(n_partitions, n)
    if n_partitions == 1:
        center = np.asarray(X.mean(axis=0)).reshape(1, -1)
        return Partitioning(np.zeros(n, dtype=np.int64), center, [np.arange(n)])
    labels, centers = partition_on_devices(group, X, n_partitions, method,
                                           random_state=random_state)
    return Partitioning.from_labels(labels, centers, n_partitions)


def fit_on_devices(group, partitioning, placement, fit_local):
    """The parts' fits over several devices: each device fits its placed parts, in its own
    thread.

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
    """Prediction over several devices: rows grouped by their part's device, results in row
    order.

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
