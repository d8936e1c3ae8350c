"""Several devices on real GPUs: the NCCL communicator and the estimators' ``devices``.

Few and small on purpose (seconds in all); each runs under a time bound so that a
hung collective fails the test instead of the run. One rank per GPU present: with
one GPU that is a one-rank clique, which must work too; the test that needs two
GPUs says so when it skips.
"""


import numpy as np
import pytest
from _threads import bounded as _bounded
from sklearn.datasets import load_digits

from gpuml._backend import Backend, gpu_count
from gpuml.distributed import (
    DeviceGroup,
    NcclCommunicator,
    ThreadCommunicator,
    partition_on_devices,
    run_on_devices,
)
from gpuml.distributed.comm import communicators, nccl_module
from gpuml.estimators.bkrr import BKRRRegressor
from gpuml.estimators.casvm import CASVMClassifier
from gpuml.partition import partition

pytestmark = pytest.mark.gpu


def bounded(fn, seconds=60.0):
    return _bounded(fn, seconds, " (a hung NCCL collective?)")




@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X[:900] / 16.0, y[:900]


def gpus(cp, n=None):
    return [Backend(cp, g) for g in range(gpu_count() if n is None else n)]


def needs_nccl():
    if nccl_module() is None:
        pytest.skip("CuPy's NCCL library does not load here (pip install nvidia-nccl-cu13): "
                    "the NCCL communicator could not run")


@pytest.mark.parametrize("ranks", sorted({1, gpu_count() or 1}))
def test_nccl_collectives_one_rank_per_gpu(cp, ranks):
    needs_nccl()
    backends = gpus(cp, ranks)
    with communicators(backends) as comms:
        assert all(isinstance(c, NcclCommunicator) for c in comms)

    def body(comm, backend):
        r, n = comm.rank, comm.size
        x = cp.arange(6, dtype=cp.float64).reshape(2, 3) * (r + 1)
        total = comm.allreduce(x)
        ints = cp.full(4, r, dtype=cp.int64)
        comm.allreduce(ints, out=ints)
        buf = cp.full(3, 7.0) if r == n - 1 else cp.zeros(3)
        comm.broadcast(buf, root=n - 1)
        gathered = comm.allgather(cp.full((r + 1, 2), r, dtype=cp.float32))
        host = comm.allreduce(np.ones(2))
        return (total.get(), total.device.id, ints.get(), buf.get(),
                [g.get() for g in gathered], host)

    results = bounded(lambda: DeviceGroup(backends).spmd(body))
    factor = ranks * (ranks + 1) / 2
    for r, (total, device, ints, buf, gathered, host) in enumerate(results):
        assert device == r
        np.testing.assert_array_equal(total, np.arange(6).reshape(2, 3) * factor)
        np.testing.assert_array_equal(ints, np.full(4, ranks * (ranks - 1) // 2))
        np.testing.assert_array_equal(buf, np.full(3, 7.0))
        assert [g.shape for g in gathered] == [(k + 1, 2) for k in range(ranks)]
        assert all((g == k).all() for k, g in enumerate(gathered))
        assert isinstance(host, np.ndarray) and (host == ranks).all()


def test_thread_communicator_with_cupy_arrays(cp):
    comms = ThreadCommunicator.create(2, timeout=30)

    def rank(r, backend):
        out = comms[r].allreduce(cp.ones(3) * (r + 1))
        return type(out).__module__.split(".")[0], out.get()

    for module, value in bounded(lambda: run_on_devices(rank, gpus(cp, 1) * 2)):
        assert module == "cupy"
        np.testing.assert_array_equal(value, np.full(3, 3.0))


def test_sharded_partition_on_gpus_equals_one_gpu(cp, digits):
    X, _ = digits
    labels, centers = bounded(lambda: partition_on_devices(DeviceGroup(gpus(cp)), X, 6,
                                                           "kbalance", random_state=0))
    expected_labels, expected_centers = partition(cp.asarray(X), 6, "kbalance", random_state=0)
    np.testing.assert_array_equal(labels, expected_labels.get())
    np.testing.assert_allclose(centers, expected_centers.get(), rtol=1e-10, atol=1e-12)


def test_estimators_devices_all_equal_one_gpu(cp, digits, diabetes):
    X, y = digits
    kw = dict(n_partitions=4, partition="kbalance", random_state=0)
    one = CASVMClassifier(device="cuda", **kw).fit(X, y)
    many = bounded(lambda: CASVMClassifier(devices="all", **kw).fit(X, y))
    assert many.devices_ == tuple(f"cuda:{g}" for g in range(gpu_count()))
    np.testing.assert_array_equal(many.partition_sizes_, one.partition_sizes_)
    np.testing.assert_array_equal(many.support_, one.support_)
    np.testing.assert_allclose(many.dual_coef_, one.dual_coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(many.predict(X), one.predict(X))
    assert isinstance(many.predict(cp.asarray(X)), cp.ndarray)

    Xr, yr = diabetes
    kw = dict(n_partitions=4, sigma=3.0, random_state=0)
    one = BKRRRegressor(device="cuda", **kw).fit(Xr, yr)
    many = bounded(lambda: BKRRRegressor(devices="all", **kw).fit(Xr, yr))
    np.testing.assert_array_equal(many.X_fit_, one.X_fit_.get())
    np.testing.assert_allclose(many.dual_coef_, one.dual_coef_.get(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(many.predict(Xr), one.predict(Xr), rtol=1e-9, atol=1e-9)


def test_two_gpus(cp, digits, diabetes):
    if gpu_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {gpu_count()}: the two-rank NCCL path "
                    "(sharded Lloyd steps, parts on two devices) was not run")
    X, y = digits
    kw = dict(n_partitions=5, partition="kmeans", random_state=0)
    one = CASVMClassifier(device="cuda", **kw).fit(X, y)
    many = bounded(lambda: CASVMClassifier(devices=[0, 1], **kw).fit(X, y))
    assert set(many.part_device_.tolist()) == {0, 1}
    np.testing.assert_array_equal(many.partition_sizes_, one.partition_sizes_)
    assert np.mean(many.predict(X) == one.predict(X)) >= 0.999
    Xr, yr = diabetes
    kw = dict(n_partitions=4, sigma=3.0, random_state=0, combine="average")
    one = BKRRRegressor(device="cuda", **kw).fit(Xr, yr)
    many = bounded(lambda: BKRRRegressor(devices=["cuda:0", "cuda:1"], **kw).fit(Xr, yr))
    np.testing.assert_allclose(many.predict(Xr), one.predict(Xr), rtol=1e-7, atol=1e-7)
