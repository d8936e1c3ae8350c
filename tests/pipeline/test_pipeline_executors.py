"""What each executor runs, and its refusal of the rest, before any work.

Every executor declares its capabilities; a fit that needs one it lacks is refused
with the executor's sentence, naming the setting that asks for it. The stand-in
estimator asks for each in turn; the real estimators' refusals are those of the
same executors.
"""

import numpy as np
import pytest
from _standin import PartRidge

import gpuml.pipeline.fit as pipeline_fit
from gpuml import BKRRRegressor, CASVMClassifier
from gpuml._backend import CPU, resolve_devices
from gpuml.distributed import DeviceGroup
from gpuml.pipeline import (
    Capability,
    InProcess,
    Need,
    OnDevices,
    PartitionedEstimator,
    PartSolver,
    Streamed,
)
from gpuml.pipeline.dask import OnDask

EXECUTORS = {
    "in_process": lambda: InProcess(CPU),
    "streamed": lambda: Streamed(CPU, 10**6),
    "devices": lambda: OnDevices(DeviceGroup(resolve_devices(["cpu", "cpu"]))),
    "dask": lambda: OnDask(),
}

#: What each executor runs beyond independent parts of rows with features.
RUNS = {
    "in_process": {"KERNEL_MATRIX", "LAYERS", "PROBABILITY", "HOST_KERNEL",
                   "WEIGHTED_SETTINGS"},
    "streamed": {"STREAM", "PROBABILITY", "HOST_KERNEL", "WEIGHTED_SETTINGS"},
    "devices": {"DEVICE_GROUP", "PROBABILITY", "WEIGHTED_SETTINGS"},
    "dask": {"HOST_KERNEL"},
}

#: Each executor's refusal of what it does not run (a setting ``s=1`` asking for it).
REFUSALS = {
    ("streamed", "KERNEL_MATRIX"): "max_device_memory streams parts of rows with features: "
                                   "s=1 cannot be streamed",
    ("streamed", "LAYERS"): "max_device_memory streams independent parts: s=1 cannot be "
                            "streamed (its layers depend on each other)",
    ("devices", "STREAM"): "max_device_memory is for one device: leave devices=None",
    ("devices", "KERNEL_MATRIX"): "s=1 fits on one device: use devices=None",
    ("devices", "LAYERS"): "s=1 fits on one device (its layers depend on each other): use "
                           "devices=None",
    ("devices", "HOST_KERNEL"): "s=1 is computed by scikit-learn's pairwise_kernels on the "
                                "CPU: use device='cpu' (or 'auto') and devices=None",
    ("dask", "STREAM"): "max_device_memory is for a fit in this process: on Dask each "
                        "worker's memory_limit bounds its parts",
    ("dask", "WEIGHTED_SETTINGS"): "sample_weight is not supported on Dask input for "
                                   "PartRidge yet: fit on in-memory data, or without weights",
    ("dask", "KERNEL_MATRIX"): "s=1 does not run on Dask input: partitioning and routing "
                               "need the samples' features",
    ("dask", "PROBABILITY"): "s=1 does not run on Dask input: fit "
                             "CalibratedClassifierCV(PartRidge(...)) on in-memory data, or "
                             "leave probability unset",
    ("dask", "DEVICE_GROUP"): "devices= is for several devices of one process; on Dask each "
                              "worker fits its parts on its own device: leave devices=None",
    ("dask", "LAYERS"): "s=1 does not run on Dask input (its layers depend on each other): "
                        "use s=0 or in-memory data",
}


@pytest.mark.parametrize("where", list(EXECUTORS))
@pytest.mark.parametrize("capability", [c.name for c in Capability])
def test_each_executor_runs_what_it_declares_and_refuses_the_rest(where, capability):
    executor = EXECUTORS[where]()
    assert {c.name for c in executor.capabilities} == RUNS[where]
    need = Need(Capability[capability], "s=1", instead="s=0")
    if capability in RUNS[where]:
        executor.refuse(PartRidge(), [need])
        return
    message = REFUSALS.get((where, capability),
                           f"s=1 needs {Capability[capability].value}, which "
                           f"{type(executor).__name__} does not run")
    with pytest.raises(ValueError) as info:
        executor.refuse(PartRidge(), [need])
    assert str(info.value) == message


def test_the_first_refusal_in_the_executors_order():
    needs = [Need(Capability.LAYERS, "b=1", instead="b=0"),
             Need(Capability.KERNEL_MATRIX, "a=1")]
    with pytest.raises(ValueError, match="^a=1 does not run on Dask input"):
        OnDask().refuse(PartRidge(), needs)
    with pytest.raises(ValueError, match="^a=1 fits on one device: use"):
        EXECUTORS["devices"]().refuse(PartRidge(), needs)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 3))
    return X, (X[:, 0] > 0).astype(np.int64)


def test_refusals_come_before_any_work(data, monkeypatch):
    X, y = data

    def no_validation(*args, **kwargs):
        raise AssertionError("the data were validated")

    monkeypatch.setattr(pipeline_fit, "validate", no_validation)
    with pytest.raises(ValueError, match="^layered=True fits on one device"):
        PartRidge(layered=True, device="auto", devices=["cpu", "cpu"]).fit(X, y * 1.0)
    with pytest.raises(ValueError, match="^max_device_memory streams independent parts: "
                                         "layered=True cannot be streamed"):
        PartRidge(layered=True, max_device_memory="1GB").fit(X, y * 1.0)
    with pytest.raises(ValueError, match="^kernel_matrix=True fits on one device"):
        PartRidge(kernel_matrix=True, device="auto", devices=["cpu"]).fit(X, y * 1.0)
    with pytest.raises(ValueError, match="^max_device_memory is for one device"):
        PartRidge(max_device_memory="1GB", device="auto", devices=["cpu"]).fit(X, y * 1.0)
    # The estimators' settings are refused by the same executors, in the same words.
    with pytest.raises(ValueError, match="^method='cascade' fits on one device \\(its layers"):
        CASVMClassifier(method="cascade", devices=["cpu", "cpu"]).fit(X, y)
    with pytest.raises(ValueError, match="^max_device_memory streams independent parts: "
                                         "method='dcsvm' cannot be streamed"):
        CASVMClassifier(method="dcsvm", max_device_memory="1GB").fit(X, y)
    K = X @ X.T
    with pytest.raises(ValueError, match="^max_device_memory streams parts of rows with "
                                         "features: kernel='precomputed' cannot be streamed"):
        CASVMClassifier(kernel="precomputed", max_device_memory="1GB").fit(K, y)
    with pytest.raises(ValueError, match="^kernel='laplacian' is computed by scikit-learn's "
                                         "pairwise_kernels on the CPU"):
        BKRRRegressor(kernel="laplacian", devices=["cpu", "cpu"]).fit(X, y * 1.0)
    # A kernel computed on the CPU cannot be asked onto a GPU, whatever the executor.
    with pytest.raises(ValueError, match="^kernel='laplacian' is computed by"):
        BKRRRegressor(kernel="laplacian", device="cuda").fit(X, y * 1.0)


def test_a_kernel_computed_on_the_cpu_runs_there(data):
    X, y = data
    est = BKRRRegressor(kernel="laplacian", n_partitions=2, random_state=0).fit(X, y * 1.0)
    assert est.device_ == "cpu"


def test_the_contract_is_declared():
    """What an estimator and a solver must supply is abstract: a class that leaves out a
    required member cannot be made."""

    class NoAssembly(PartitionedEstimator):
        def _validate(self, X, y, sample_weight, backend): ...
        def _n_parts(self, n, gpu=False): ...
        def _split_method(self): ...
        def _part_cost(self): ...
        def _part_solver(self, data): ...

    with pytest.raises(TypeError, match="_assemble"):
        NoAssembly()

    class NoSolve(PartSolver):
        pass

    with pytest.raises(TypeError, match="solve"):
        NoSolve()
    for estimator in (CASVMClassifier(), BKRRRegressor(), PartRidge()):
        assert isinstance(estimator, PartitionedEstimator)
