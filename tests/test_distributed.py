"""gpuml.distributed on the CPU: the thread communicator, placement, and sharded partitioning.

The oracle of a sharded partition is :func:`gpuml.partition.partition` on all the
rows in one process: the same labels, centres equal to rounding.
"""

import time

import numpy as np
import pytest
import scipy.sparse as sp
from _threads import bounded as _bounded

from gpuml._backend import CPU
from gpuml.distributed import (
    CommunicatorAborted,
    DeviceGroup,
    ThreadCommunicator,
    balance,
    balance_local,
    cholesky_cost,
    partition_on_devices,
    run_on_devices,
    smo_cost,
)
from gpuml.distributed.placement import LPT_MARGIN, shard_bounds
from gpuml.partition import partition

METHODS = ["random", "contiguous", "fcfs", "kmeans", "kbalance", "bkm"]


def bounded(fn, seconds=30.0):
    """:func:`_threads.bounded` with this file's default and hint."""
    return _bounded(fn, seconds, " (a collective deadlocked?)")


def spmd(size, fn, timeout=20.0):
    """``fn(comm)`` on ``size`` thread ranks; results in rank order."""
    group = DeviceGroup([CPU] * size, timeout=timeout)
    return bounded(lambda: group.spmd(lambda comm, backend: fn(comm)))


# -- the thread communicator ---------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_allreduce_broadcast_allgather(size):
    def body(comm):
        r = comm.rank
        x = np.arange(6, dtype=np.float64).reshape(2, 3) * (r + 1)
        total = comm.allreduce(x)
        inplace = np.full(4, r, dtype=np.int64)
        same = comm.allreduce(inplace, out=inplace)
        buf = np.full(3, 7.0) if r == size - 1 else np.zeros(3)
        comm.broadcast(buf, root=size - 1)
        gathered = comm.allgather(np.full((r + 1, 2), r, dtype=np.int32))
        return total, same is inplace, inplace, buf, gathered

    factor = size * (size + 1) / 2
    for total, same, inplace, buf, gathered in spmd(size, body):
        np.testing.assert_array_equal(total, np.arange(6).reshape(2, 3) * factor)
        assert same
        np.testing.assert_array_equal(inplace, np.full(4, size * (size - 1) // 2))
        np.testing.assert_array_equal(buf, np.full(3, 7.0))
        assert [g.shape for g in gathered] == [(r + 1, 2) for r in range(size)]
        for r, g in enumerate(gathered):
            assert g.dtype == np.int32 and (g == r).all()


def test_allreduce_is_identical_on_every_rank_and_in_rank_order():
    # Values whose sum depends on the order of the additions: every rank must see
    # the same bits, the sum taken in rank order.
    values = [1e16, 1.0, -1e16, 1.0]

    def body(comm):
        return comm.allreduce(np.array([values[comm.rank]]))

    results = spmd(4, body)
    expected = ((values[0] + values[1]) + values[2]) + values[3]
    assert all(r[0] == expected for r in results)


def test_posted_array_may_be_overwritten_at_once():
    # out=x overwrites x while slower ranks may still be summing: they must read a copy.
    def body(comm):
        x = np.full(1000, float(comm.rank + 1))
        for _ in range(20):
            comm.allreduce(x, out=x)
            x /= comm.size * 1.0
        return x

    results = spmd(3, body)
    for x in results:
        np.testing.assert_array_equal(x, results[0])


def test_error_in_one_rank_propagates_with_its_device_and_releases_the_others():
    def fn(comm, backend):
        if comm.rank == 2:
            raise ValueError("rank two cannot go on")
        comm.allreduce(np.ones(3))  # the others wait here for rank 2
        return comm.rank

    group = DeviceGroup([CPU] * 4)  # no timeout: the abort alone must release them
    start = time.monotonic()
    with pytest.raises(ValueError, match="rank two cannot go on") as info:
        bounded(lambda: group.spmd(fn), seconds=20)
    assert time.monotonic() - start < 10
    assert any("cpu (rank 2 of 4)" in note for note in getattr(info.value, "__notes__", []))


def test_a_rank_that_never_arrives_times_out():
    def fn(comm, backend):
        if comm.rank == 0:
            return "skipped the collective"
        return comm.allreduce(np.ones(1))

    group = DeviceGroup([CPU] * 2, timeout=0.2)
    with pytest.raises(CommunicatorAborted, match="waited more than 0.2 s"):
        bounded(lambda: group.spmd(fn), seconds=20)


def test_run_on_devices_keeps_rank_order():
    out = run_on_devices(lambda r, b: (r, b.device), [CPU] * 3)
    assert out == [(0, "cpu"), (1, "cpu"), (2, "cpu")]


def test_communicator_needs_a_rank():
    with pytest.raises(ValueError, match="at least one rank"):
        ThreadCommunicator.create(0)


# -- placement -----------------------------------------------------------------------

def test_balance_is_lpt_and_deterministic():
    costs = [9.0, 1.0, 4.0, 4.0, 1.0]
    # 9 -> d0; 4, 4 -> d1; 1 -> d1 (8 < 9); the last 1 ties at 9 and goes to d0
    assert [p.tolist() for p in balance(costs, 2)] == [[0, 4], [1, 2, 3]]
    assert [p.tolist() for p in balance(costs, 3)] == [[0], [1, 2], [3, 4]]
    # equal costs: consecutive ties spread round-robin, every part placed once
    bins = balance(np.ones(10), 4)
    assert sorted(np.concatenate(bins).tolist()) == list(range(10))
    assert [len(b) for b in bins] == [3, 3, 2, 2]
    # more devices than parts: some get none
    assert [p.tolist() for p in balance([1.0, 2.0], 3)] == [[1], [0], []]


def test_balance_makespan_within_graham_bound():
    rng = np.random.default_rng(0)
    sizes = rng.integers(50, 2000, size=37)
    costs = cholesky_cost(sizes, 8)
    bins = balance(costs, 8)
    makespan = max(costs[b].sum() for b in bins)
    lower = max(costs.sum() / 8, costs.max())
    assert makespan <= (4 / 3) * lower


def test_balance_local_keeps_parts_where_their_rows_are():
    # Parts 0-2 lie on device 0, part 3 on device 1 (equal costs): one of device 0's
    # moves, the one with the fewest rows there; the others stay home.
    held = np.array([[5, 0], [3, 2], [5, 0], [0, 5]])
    assert [p.tolist() for p in balance_local(np.ones(4), held)] == [[0, 2], [1, 3]]
    # Balanced homes: nothing moves.
    held = np.kron(np.eye(2, dtype=int), np.full((4, 1), 7))  # parts 0-3 on 0, 4-7 on 1
    assert [p.tolist() for p in balance_local(np.ones(8), held)] == [[0, 1, 2, 3],
                                                                     [4, 5, 6, 7]]
    # A part moves only when that lowers the larger load: a big part on device 0 and a
    # small one on device 1 stay; three on device 0, the one nearest half the gap moves.
    held = np.array([[9, 0], [0, 9]])
    assert [p.tolist() for p in balance_local([10.0, 1.0], held)] == [[0], [1]]
    held = np.array([[9, 0], [9, 0], [9, 0]])
    assert [p.tolist() for p in balance_local([10.0, 1.0, 1.0], held)] == [[1, 2], [0]]
    # Every part placed once, on three devices, within LPT's makespan (and its margin).
    rng = np.random.default_rng(1)
    costs = smo_cost(rng.integers(100, 1000, size=23))
    held = rng.integers(0, 50, size=(23, 3))
    bins = balance_local(costs, held)
    assert sorted(np.concatenate(bins).tolist()) == list(range(23))
    lpt = max(costs[b].sum() for b in balance(costs, 3))
    assert max(costs[b].sum() for b in bins) <= lpt / (1 - LPT_MARGIN)
    # Contiguous parts of 36,631 rows (7 of 2,290 rows, 9 of 2,289) with the first eight
    # on device 0: LPT's makespan is 0.03 % lower, not enough to move half the rows.
    sizes = np.array([2290] * 7 + [2289] * 9)
    held = np.zeros((16, 2), dtype=int)
    held[:8, 0], held[8:, 1] = sizes[:8], sizes[8:]
    held[7] = [2287, 2]  # the eighth part's last rows lie in device 1's first chunk
    assert [p.tolist() for p in balance_local(smo_cost(sizes), held)] == [list(range(8)),
                                                                           list(range(8, 16))]
    # A placement LPT balances much better is taken: two big parts on one device.
    # (Moving one part cannot help: each costs more than the gap.)
    held = np.array([[9, 0], [9, 0], [0, 9], [0, 9]])
    assert [p.tolist() for p in balance_local([4.0, 4.0, 3.0, 3.0], held)] == [[0, 2], [1, 3]]


def test_cost_models():
    np.testing.assert_array_equal(smo_cost([10, 20]), [100.0, 400.0])
    np.testing.assert_allclose(cholesky_cost([3], 5), [9.0 + 45.0])


def test_shard_bounds():
    assert shard_bounds(10, 3).tolist() == [0, 3, 6, 10]
    assert shard_bounds(2, 4).tolist() == [0, 0, 1, 1, 2]


# -- sharded partitioning equals one process -------------------------------------------

@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=4.0, size=(6, 5))
    return centres[rng.integers(0, 6, size=1500)] + rng.normal(size=(1500, 5))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_sharded_partition_equals_one_process(method, ranks, blobs):
    labels, centers = bounded(lambda: partition_on_devices(
        DeviceGroup([CPU] * ranks, timeout=20), blobs, 7, method, random_state=3))
    expected_labels, expected_centers = partition(blobs, 7, method, random_state=3)
    np.testing.assert_array_equal(labels, expected_labels)
    np.testing.assert_allclose(centers, expected_centers, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", ["kmeans", "kbalance", "bkm", "fcfs"])
def test_sharded_partition_float32_and_sparse(method, blobs):
    X32 = blobs.astype(np.float32)
    labels, centers = partition_on_devices(DeviceGroup([CPU] * 3, timeout=20), X32, 5, method,
                                           random_state=1)
    expected_labels, expected_centers = partition(X32, 5, method, random_state=1)
    np.testing.assert_array_equal(labels, expected_labels)
    assert centers.dtype == np.float32
    np.testing.assert_allclose(centers, expected_centers, rtol=1e-5, atol=1e-5)

    Xs = sp.csr_matrix(np.where(np.abs(blobs) > 1.0, blobs, 0.0))
    labels, centers = partition_on_devices(DeviceGroup([CPU] * 2, timeout=20), Xs, 5, method,
                                           random_state=1)
    expected_labels, expected_centers = partition(Xs, 5, method, random_state=1)
    np.testing.assert_array_equal(labels, expected_labels)
    np.testing.assert_allclose(centers, expected_centers, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_more_ranks_than_rows(method):
    # Some shards are empty; every part still gets its samples.
    X = np.array([[0.0, 0.0], [5.0, 5.0], [0.1, 0.0]])
    labels, centers = partition_on_devices(DeviceGroup([CPU] * 4, timeout=20), X, 2, method,
                                           random_state=0)
    expected_labels, expected_centers = partition(X, 2, method, random_state=0)
    np.testing.assert_array_equal(labels, expected_labels)
    np.testing.assert_allclose(centers, expected_centers)


def test_random_state_instance_advances_as_in_one_process(blobs):
    a, b = np.random.RandomState(5), np.random.RandomState(5)
    partition_on_devices(DeviceGroup([CPU] * 2, timeout=20), blobs, 4, "kmeans", random_state=a)
    partition(blobs, 4, "kmeans", random_state=b)
    assert a.randint(1 << 30) == b.randint(1 << 30)


@pytest.mark.parametrize("method", ["kmeans", "kbalance", "bkm"])
def test_sharded_kmeans_on_a_sample_equals_one_process(method, blobs, monkeypatch):
    # k-means on a sample of the rows (gathered to every rank), then every row assigned.
    from gpuml.partition import algorithms

    monkeypatch.setattr(algorithms, "KMEANS_MIN_ROWS", 300)
    monkeypatch.setattr(algorithms, "KMEANS_ROWS_PER_CENTRE", 10)
    for X in (blobs, sp.csr_matrix(np.where(np.abs(blobs) > 1.0, blobs, 0.0))):
        labels, centers = bounded(lambda X=X: partition_on_devices(
            DeviceGroup([CPU] * 3, timeout=20), X, 7, method, random_state=2))
        expected_labels, expected_centers = partition(X, 7, method, random_state=2)
        np.testing.assert_array_equal(labels, expected_labels)
        np.testing.assert_allclose(centers, expected_centers, rtol=1e-12, atol=1e-12)
