"""Where a partitioned fit runs: the executors of :func:`gpuml.pipeline.fit_partitioned`.

An executor (:class:`~gpuml.pipeline.Executor`) holds the validated data
(:class:`FitData`) and runs the split, the placement and the parts' fits, for
one solver or for several (the settings of :func:`gpuml.pipeline.fit_settings`:
one split and one placement, each solver fitting the same parts from rows
gathered once). It declares its ``capabilities``
(:class:`~gpuml.pipeline.Capability`) and refuses, before any work, a fit that
needs one it lacks, quoting the setting that asks for it. Each step returns
what it computed (a :class:`~gpuml.partition.Partitioning`, a placement, one
:class:`FitResult` per solver) and sets nothing on the estimator:

* :class:`InProcess`: every part on one device of this process; the solver
  reports each part as it ends; the only executor of layered fits;
* :class:`Streamed`: one device under a memory budget, the parts in groups;
* :class:`OnDevices`: a group of devices of this process, one thread each;
* :class:`gpuml.pipeline.dask.OnDask`: the workers of a Dask cluster.
"""

from __future__ import annotations

import numpy as np

from .._backend import CPU, Backend, available_bytes, resolve, resolve_devices
from .._validation import check_memory_bytes, check_n_partitions
from ..distributed import DeviceGroup, balance, partition_on_devices
from ..partition import Partitioning, fewest_parts_fitting, split
from .contract import Capability, Executor, Need
from .data import FitData, FitResult

KERNEL_MATRIX, LAYERS, PROBABILITY, HOST_KERNEL, WEIGHTED_SETTINGS, DEVICE_GROUP, STREAM = (
    Capability.KERNEL_MATRIX, Capability.LAYERS, Capability.PROBABILITY,
    Capability.HOST_KERNEL, Capability.WEIGHTED_SETTINGS, Capability.DEVICE_GROUP,
    Capability.STREAM)

#: The refusal of a fit that needs a kernel computed on the CPU (its setting quoted), on a
#: device group and for a fit asked onto a GPU.
HOST_KERNEL_REFUSAL = ("{setting} is computed by scikit-learn's pairwise_kernels on the CPU: "
                       "use device='cpu' (or 'auto') and devices=None")


def _rows_of(A, rows):
    """Rows ``rows`` (host indices) of a host array, or None."""
    return None if A is None else A[rows]


class InProcess(Executor):
    """Every step in this process, on one device (the CPU, or one GPU)."""

    capabilities = frozenset({KERNEL_MATRIX, LAYERS, PROBABILITY, HOST_KERNEL,
                              WEIGHTED_SETTINGS})
    reports_parts = True

    def __init__(self, backend: Backend):
        self.backend = backend

    @property
    def gpu(self) -> bool:
        """Whether the parts are solved on a GPU (an estimator's ``n_partitions="auto"``)."""
        return self.backend.is_gpu

    def load(self, estimator, X, y, sample_weight) -> FitData:
        return estimator._validate(X, y, sample_weight, self.backend)

    def check_memory(self, costs, data, sizes, n_parts=None):
        with self.backend.use():
            for cost in costs:
                cost.check_device(sizes, data.itemsize, self.backend, n_samples=data.n,
                                  n_parts=n_parts)

    def split(self, data, n_parts, method, random_state) -> Partitioning:
        with self.backend.use():
            return split(data.X, n_parts, method, random_state)

    def place(self, solvers, data, partitioning) -> None:
        """Every part on this device: refused, before any work, where it would not fit."""
        with self.backend.use():
            for solver in solvers:
                solver.cost.check_device(partitioning.sizes, data.itemsize, self.backend)

    def fit_parts(self, solvers, data, partitioning, placement) -> list[FitResult]:
        with self.backend.use():
            return [self._fit(solver, data, partitioning) for solver in solvers]

    def _fit(self, solver, data, partitioning) -> FitResult:
        if solver.layered:
            return solver.solve_layers(self.backend, data.X, data.targets, data.weights,
                                       partitioning)
        fits = solver.solve(self.backend, data.X, data.targets, data.weights,
                            partitioning.parts, np.arange(len(partitioning.parts)),
                            progress=solver.progress)
        return FitResult(fits, solver=solver, backend=self.backend, reported=True)


class OnDevices(Executor):
    """Several devices of this process, one host thread each.

    The rows are sharded over the devices for the split
    (:func:`gpuml.distributed.partition_on_devices`), the parts are placed by
    the solver's cost model (:func:`gpuml.distributed.balance`, Graham's LPT
    rule), and each device fits its parts, in its own thread, from the host
    rows. The fitted model is assembled on the host; each result also holds the
    parts' fits as their devices hold them (``FitResult.device_fits``).
    """

    capabilities = frozenset({DEVICE_GROUP, PROBABILITY, WEIGHTED_SETTINGS})
    refusals = {
        STREAM: "max_device_memory is for one device: leave devices=None",
        KERNEL_MATRIX: "{setting} fits on one device: use devices=None",
        LAYERS: "{setting} fits on one device (its layers depend on each other): use "
                "devices=None",
        HOST_KERNEL: HOST_KERNEL_REFUSAL,
    }

    def __init__(self, group: DeviceGroup):
        self.group = group

    @property
    def gpu(self) -> bool:
        return any(backend.is_gpu for backend in self.group.backends)

    def load(self, estimator, X, y, sample_weight) -> FitData:
        return estimator._validate(X, y, sample_weight, CPU)

    def check_memory(self, costs, data, sizes, n_parts=None):
        for backend in self.group.backends:
            with backend.use():
                for cost in costs:
                    cost.check_device(sizes, data.itemsize, backend, n_samples=data.n,
                                      n_parts=n_parts)

    def split(self, data, n_parts, method, random_state) -> Partitioning:
        return split_on_devices(self.group, data.X, n_parts, method, random_state)

    def place(self, solvers, data, partitioning) -> list[np.ndarray]:
        """The parts of each device, by the first solver's cost model (the settings of one
        split share it); each device refuses, before any work, parts that would not fit."""
        group, sizes = self.group, partitioning.sizes
        placement = balance(solvers[0].cost.weights(sizes, data.n_features), group.size)
        for backend, ids in zip(group.backends, placement):
            if ids.size:
                with backend.use():
                    for solver in solvers:
                        solver.cost.check_device(sizes[ids], data.itemsize, backend)
        return placement

    def fit_parts(self, solvers, data, partitioning, placement) -> list[FitResult]:
        group = self.group

        def fit_local(backend, ids, rows, local):
            X = backend.asarray(data.X[rows])
            targets, weights = _rows_of(data.targets, rows), _rows_of(data.weights, rows)
            return list(zip(*[solver.solve(backend, X, targets, weights, local, ids)
                              for solver in solvers]))

        fits, part_device = fit_on_devices(group, partitioning, placement, fit_local)
        host = [[] for _ in solvers]
        on_devices = [[] for _ in solvers]
        for rows, per_solver, rank in zip(partitioning.parts, fits, part_device.tolist()):
            X_part = data.X[rows]
            for k, (solver, fit) in enumerate(zip(solvers, per_solver)):
                on_devices[k].append((group.backends[rank], fit))
                host[k].append(solver.to_host(fit, X_part))
        return [FitResult(fits_k, solver=solver, backend=CPU, part_device=part_device,
                          devices=group.devices, device_fits=device_fits)
                for solver, fits_k, device_fits in zip(solvers, host, on_devices)]


class Streamed(Executor):
    """One device whose memory the whole fit would exceed: the parts streamed through it.

    The data stay on the host (validated there, split there); the parts are
    fitted in groups, in part order, each group as large as fits the budget by
    the solvers' ``part_bytes`` (a part's rows and its solve), its rows copied
    to the device while the previous group is solved (a host thread; on a GPU
    gathered into page-locked memory and copied on a stream of their own,
    :meth:`~gpuml._backend.Backend.upload_rows`); each group's rows serve every
    solver. A part that alone needs more than the budget is refused before any
    work. The fits are those of one resident fit (the same rows, in the same
    order, per part).
    """

    capabilities = frozenset({STREAM, PROBABILITY, HOST_KERNEL, WEIGHTED_SETTINGS})
    refusals = {
        KERNEL_MATRIX: "max_device_memory streams parts of rows with features: {setting} "
                       "cannot be streamed",
        LAYERS: "max_device_memory streams independent parts: {setting} cannot be streamed "
                "(its layers depend on each other)",
    }

    def __init__(self, backend: Backend, budget: int):
        self.backend, self.budget = backend, int(budget)

    @property
    def gpu(self) -> bool:
        return self.backend.is_gpu

    def load(self, estimator, X, y, sample_weight) -> FitData:
        return estimator._validate(X, y, sample_weight, CPU)

    def check_memory(self, costs, data, sizes, n_parts=None):
        """Refuse a part that alone needs more than the budget, naming a P that fits."""
        for cost in costs:
            self._check_part(cost, data, sizes, n_parts)

    def _check_part(self, cost, data, sizes, n_parts):
        largest = int(np.max(sizes))
        d, itemsize = data.n_features, data.itemsize
        need = int(cost.part_bytes(np.array([largest]), d, itemsize).sum())
        if need <= self.budget:
            return
        n = data.n

        def fit_in(P):
            return cost.part_bytes(np.array([-(-n // P)]), d, itemsize).sum() <= self.budget

        fits = fewest_parts_fitting(n, max(len(sizes), n_parts or 1), fit_in)
        change = (f"use n_partitions>={fits} (parts of at most {-(-n // fits)} rows)"
                  if fits else "even one row per part does not fit")
        raise MemoryError(
            f"{cost.name}: a part of {largest} rows needs about {need / 2**20:.1f} MiB on "
            f"{self.backend.device} (its rows and its solve), more than max_device_memory "
            f"({self.budget / 2**20:.1f} MiB); {change}, or allow more device memory")

    def split(self, data, n_parts, method, random_state) -> Partitioning:
        return split(data.X, n_parts, method, random_state)

    def _groups(self, solvers, data, sizes):
        """Consecutive parts, each run as large as the budget takes (for the solver that
        needs the most of each part)."""
        need = np.max([solver.cost.part_bytes(np.asarray(sizes), data.n_features, data.itemsize)
                       for solver in solvers], axis=0)
        groups, start, used = [], 0, 0
        for j, b in enumerate(need.tolist()):
            if j > start and used + b > self.budget:
                groups.append(np.arange(start, j))
                start, used = j, 0
            used += b
        return groups + [np.arange(start, len(sizes))]

    def place(self, solvers, data, partitioning) -> list[np.ndarray]:
        """The groups of parts streamed in turn (:meth:`_groups`), after refusing a part
        that alone needs more than the budget."""
        self.check_memory([solver.cost for solver in solvers], data, partitioning.sizes)
        return self._groups(solvers, data, partitioning.sizes)

    def fit_parts(self, solvers, data, partitioning, placement) -> list[FitResult]:
        from concurrent.futures import ThreadPoolExecutor

        parts, groups, backend = partitioning.parts, placement, self.backend

        def upload(ids):
            rows = np.concatenate([parts[j] for j in ids.tolist()])
            with backend.use():
                return rows, backend.upload_rows(data.X, rows)

        fits = [[] for _ in solvers]
        with ThreadPoolExecutor(1) as pool:
            ahead = pool.submit(upload, groups[0])
            for g, ids in enumerate(groups):
                rows, X_group = ahead.result()
                if g + 1 < len(groups):
                    ahead = pool.submit(upload, groups[g + 1])
                bounds = np.cumsum([0] + [len(parts[j]) for j in ids.tolist()])
                local = [np.arange(bounds[k], bounds[k + 1]) for k in range(len(ids))]
                targets, weights = _rows_of(data.targets, rows), _rows_of(data.weights, rows)
                with backend.use():
                    group_fits = [solver.solve(backend, X_group, targets, weights, local, ids)
                                  for solver in solvers]
                del X_group
                X_parts = [data.X[parts[j]] for j in ids.tolist()]
                for k, solver in enumerate(solvers):
                    fits[k] += [solver.to_host(fit, X_part)
                                for fit, X_part in zip(group_fits[k], X_parts)]
        return [FitResult(fits_k, solver=solver, backend=CPU)
                for solver, fits_k in zip(solvers, fits)]


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


def placement_needs(estimator) -> tuple:
    """What the estimator's placement parameters ask of the executor: several devices of
    this process (``devices``), a stream of parts under a budget (``max_device_memory``)."""
    needs = ()
    if getattr(estimator, "devices", None) is not None:
        needs += (Need(DEVICE_GROUP, "devices="),)
    if getattr(estimator, "max_device_memory", None) is not None:
        needs += (Need(STREAM, "max_device_memory"),)
    return needs


def fit_executor(estimator, needs=(), X=None, y=None, sample_weight=None):
    """The executor of one fit, chosen once from the input and the estimator's ``device``,
    ``devices`` and ``max_device_memory``: Dask input runs on its cluster, ``devices=`` on a
    device group, the rest in process, streamed through the device under a memory budget
    (:func:`device_budget`). A fit that ``needs`` a kernel computed on the CPU runs there
    (refused when ``device`` asks for a GPU).

    Validated before any work (see :func:`gpuml._backend.resolve_devices`).
    """
    from .._backend import is_dask_collection

    host = next((need for need in needs if need.capability is HOST_KERNEL), None)
    if host is not None and estimator.device not in ("auto", "cpu"):
        raise ValueError(HOST_KERNEL_REFUSAL.format(setting=host.setting))
    device = "cpu" if host is not None else estimator.device
    if any(is_dask_collection(v) for v in (X, y, sample_weight)):
        dask_module()  # a clear error when Dask is not installed
        from .dask import OnDask

        return OnDask(device)
    group = device_group(estimator)
    if group is not None:
        return OnDevices(group)
    backend = resolve(device, X, y)
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
