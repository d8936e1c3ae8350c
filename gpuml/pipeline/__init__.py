"""The fit of a partitioned estimator, written once, and where it runs.

CA-SVM (You 2020, Alg 5) and BKRR2 (Alg 10) have the same shape:

1. **validate** the training data and derive the data-driven settings
   (classes, ``gamma="scale"``, σ, λ);
2. **split** it into P parts, one centre per part (:mod:`gpuml.partition`);
3. **place** the parts where they are fitted;
4. **fit** one independent local model per part (no communication);
5. **assemble** the fitted model from the local ones.

:class:`PartitionedFit` is that fit. An estimator supplies only what is its
own: its validation and settings, its part solver, its cost model and its
assembly (the hooks listed there). An **executor**, chosen once per fit from
the input and the estimator's ``devices`` (:func:`fit_executor`), holds the
data and runs steps 2-4: in this process on one device (:class:`InProcess`),
over a group of devices in threads of this process (:class:`OnDevices`), or on
a Dask cluster (:class:`gpuml.pipeline.dask.OnDask`). Estimators never ask
where they run; executors never set an estimator's attributes.

Prediction sends every new row to its part's model: on one device, on the
devices the parts were fitted on (:func:`route_on_devices`,
:func:`predict_on_devices`), or lazily over the blocks of Dask input.
"""

from .data import FitData, FitResult
from .executors import (
    InProcess,
    OnDevices,
    dask_module,
    device_group,
    fit_executor,
    predict_on_devices,
    prediction_group,
    route_on_devices,
)
from .fit import PartitionedFit

__all__ = [
    "FitData",
    "FitResult",
    "InProcess",
    "OnDevices",
    "PartitionedFit",
    "dask_module",
    "device_group",
    "fit_executor",
    "predict_on_devices",
    "prediction_group",
    "route_on_devices",
]
