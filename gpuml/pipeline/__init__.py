"""The fit of a partitioned estimator, written once, and where it runs.

CA-SVM (You 2020, Alg 5) and BKRR2 (Alg 10) have the same shape:

1. **validate** the training data;
2. **split** it into P parts, one centre per part (:mod:`gpuml.partition`);
3. **place** the parts where they are fitted;
4. **fit** one independent local model per part (no communication);
5. **assemble** the fitted model from the local ones.

:func:`fit_partitioned` is that fit; :func:`fit_settings` solves the parts of
one split for several settings (C and γ, σ and λ), each giving its own fitted
estimator, the ordinary fit being the case of one setting.

**The contract** (:mod:`gpuml.pipeline.contract`). An estimator is a
:class:`PartitionedEstimator`: it supplies its validation, its number of parts
and partitioner, its data-driven settings with the :class:`PartSolver` that
fits its parts (its :class:`PartCost`: placement weights and memory), and its
assembly; it declares what its fit needs (:class:`Need`, a
:class:`Capability` and the setting that asks for it). The per-fit state the
steps hand each other is typed: :class:`FitData` (the validated data) and
:class:`FitResult` (one solver's fits of the parts).

**The executors** (:mod:`gpuml.pipeline.executors`), chosen once per fit from
the input and the estimator's ``device``, ``devices`` and ``max_device_memory``
(:func:`fit_executor`), hold the data and run steps 2-4: in this process on one
device (:class:`InProcess`), streamed through one device under a memory budget
(:class:`Streamed`), over a group of devices in threads of this process
(:class:`OnDevices`), or on a Dask cluster
(:class:`gpuml.pipeline.dask.OnDask`). Each declares its capabilities and
refuses, before any work, a fit that needs one it lacks. Estimators never ask
where they run; executors never set an estimator's attributes.

**Prediction** (:mod:`gpuml.pipeline.predict`) sends every new row to its
part's model: on one device, on the devices the parts were fitted on
(:func:`route_on_devices`, :func:`predict_on_devices`), or lazily over the
blocks of Dask input; the device copies of a model's arrays are a cache
(:func:`on_device`) that pickling leaves out.
"""

from .contract import Capability, Need, PartCost, PartitionedEstimator, PartSolver
from .data import FitData, FitResult
from .executors import (
    Executor,
    InProcess,
    OnDevices,
    Streamed,
    dask_module,
    device_group,
    fit_executor,
)
from .fit import fit_partitioned, fit_settings, fit_split
from .predict import (
    block_threads,
    gpu_compute_dtype,
    host_state,
    on_device,
    on_host,
    predict_on_devices,
    prediction_group,
    route_on_devices,
    state_on_device,
)

__all__ = [
    "Capability",
    "Executor",
    "FitData",
    "FitResult",
    "InProcess",
    "Need",
    "OnDevices",
    "PartCost",
    "PartSolver",
    "PartitionedEstimator",
    "Streamed",
    "block_threads",
    "dask_module",
    "device_group",
    "fit_executor",
    "fit_partitioned",
    "fit_settings",
    "fit_split",
    "gpu_compute_dtype",
    "host_state",
    "on_device",
    "on_host",
    "predict_on_devices",
    "prediction_group",
    "route_on_devices",
    "state_on_device",
]
