"""Dask input on a real two-process cluster: the same model as the in-process fit.

One ``distributed.LocalCluster`` (two worker processes, one thread each, 1 GiB
each) serves the whole module. Every test is bounded in time: a hang dumps the
stacks and ends the run instead of eating CI's limit.
"""

import contextlib
import faulthandler
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import make_classification, make_regression

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")

from gpuml import BKRRRegressor, CASVMClassifier  # noqa: E402
from gpuml.distributed.dask import counting  # noqa: E402
from gpuml.partition import partition  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: Seconds any one test may take before the run is stopped with every thread's stack.
TEST_LIMIT = 240


@pytest.fixture(autouse=True)
def _bounded():
    faulthandler.dump_traceback_later(TEST_LIMIT, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def client():
    faulthandler.dump_traceback_later(TEST_LIMIT, exit=True)
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       memory_limit="1GiB", dashboard_address=":0",
                                       silence_logs=40)
    c = distributed.Client(cluster)
    faulthandler.cancel_dump_traceback_later()
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="module")
def classification():
    X, y = make_classification(2400, 10, n_informative=6, n_classes=3, random_state=0)
    return X, y


@pytest.fixture(scope="module")
def regression():
    X, y = make_regression(2400, 8, noise=1.0, random_state=0)
    return X / X.std(axis=0), y / y.std()


def _dask(X, y, rows=400):
    return da.from_array(X, chunks=(rows, X.shape[1])), da.from_array(y, chunks=rows)


@pytest.mark.parametrize("method", ["random", "contiguous", "kbalance"])
def test_casvm_p16_equals_in_process(client, classification, method):
    X, y = classification
    Xd, yd = _dask(X, y)
    params = dict(n_partitions=16, partition=method, random_state=0)
    on_dask = CASVMClassifier(**params).fit(Xd, yd)
    local = CASVMClassifier(**params).fit(X, y)
    labels, centers = partition(X, 16, method, random_state=0)
    np.testing.assert_array_equal(on_dask.partition_sizes_, np.bincount(labels, minlength=16))
    np.testing.assert_allclose(on_dask.centers_, centers, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(on_dask.support_, local.support_)
    np.testing.assert_allclose(on_dask.dual_coef_, local.dual_coef_, rtol=1e-9, atol=1e-12)
    assert on_dask._gamma == pytest.approx(local._gamma, rel=1e-12)
    # Every part was fitted on one of the two workers, and both got parts.
    assert len(set(on_dask.part_worker_)) == 2
    pred = on_dask.predict(Xd)
    assert isinstance(pred, da.Array) and pred.chunks == (Xd.chunks[0],)
    np.testing.assert_array_equal(pred.compute(), local.predict(X))
    values = on_dask.decision_function(Xd)
    assert isinstance(values, da.Array)
    np.testing.assert_allclose(values.compute(), local.decision_function(X), atol=1e-9)
    # The model is an ordinary fitted estimator: NumPy in, NumPy out.
    np.testing.assert_array_equal(on_dask.predict(X), local.predict(X))


@pytest.mark.parametrize("method", ["kbalance", "contiguous"])
def test_bkrr2_p16_equals_in_process(client, regression, method):
    X, y = regression
    Xd, yd = _dask(X, y)
    params = dict(sigma=2.0, lam=1e-3, n_partitions=16, partition=method, random_state=0)
    on_dask = BKRRRegressor(**params).fit(Xd, yd)
    local = BKRRRegressor(**params).fit(X, y)
    np.testing.assert_array_equal(on_dask.part_sizes_, local.part_sizes_)
    np.testing.assert_array_equal(on_dask.X_fit_, local.X_fit_)
    np.testing.assert_allclose(on_dask.dual_coef_, local.dual_coef_, rtol=1e-8, atol=1e-10)
    pred = on_dask.predict(Xd)
    assert isinstance(pred, da.Array)
    np.testing.assert_allclose(pred.compute(), local.predict(X), rtol=1e-8, atol=1e-10)


def test_bkrr_kbalance_on_a_sample_equals_in_process(client, regression, monkeypatch):
    # Many rows: k-means runs on a sample gathered to the client, every row is assigned.
    from gpuml.partition import algorithms

    monkeypatch.setattr(algorithms, "KMEANS_MIN_ROWS", 500)
    monkeypatch.setattr(algorithms, "KMEANS_ROWS_PER_CENTRE", 10)
    X, y = regression
    params = dict(sigma=2.0, lam=1e-3, n_partitions=16, random_state=0)
    on_dask = BKRRRegressor(**params).fit(*_dask(X, y))
    local = BKRRRegressor(**params).fit(X, y)
    np.testing.assert_array_equal(on_dask.part_sizes_, local.part_sizes_)
    np.testing.assert_array_equal(on_dask.X_fit_, local.X_fit_)
    np.testing.assert_allclose(on_dask.dual_coef_, local.dual_coef_, rtol=1e-8, atol=1e-10)


def test_dataframes_and_multi_output(client, regression):
    import pandas as pd

    X, y = regression
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    Y = np.column_stack([y, -2 * y])
    Xd = dd.from_pandas(frame, npartitions=3)
    Yd = da.from_array(Y, chunks=(tuple(Xd.map_partitions(len).compute()), 2))
    params = dict(sigma=2.0, n_partitions=4, partition="kmeans", random_state=1)
    on_dask = BKRRRegressor(**params).fit(Xd, Yd)
    local = BKRRRegressor(**params).fit(frame, Y)
    np.testing.assert_array_equal(on_dask.feature_names_in_, local.feature_names_in_)
    pred = on_dask.predict(Xd)
    assert isinstance(pred, da.Array)
    np.testing.assert_allclose(pred.compute(), local.predict(frame), rtol=1e-8, atol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the frame's names checked once, as in memory
        in_memory = on_dask.predict(frame)
    assert in_memory.shape == (len(frame), 2)
    np.testing.assert_allclose(in_memory, local.predict(frame), rtol=1e-8, atol=1e-10)


def test_sample_weight_and_fcfs(client, classification):
    X, y = classification
    Xd, yd = _dask(X, y)
    w = np.random.default_rng(0).uniform(0.0, 2.0, size=len(y))
    params = dict(n_partitions=4, partition="fcfs", class_weight="balanced", gamma=0.1,
                  random_state=2)
    on_dask = CASVMClassifier(**params).fit(Xd, yd, sample_weight=da.from_array(w, chunks=400))
    local = CASVMClassifier(**params).fit(X, y, sample_weight=w)
    np.testing.assert_array_equal(on_dask.support_, local.support_)
    np.testing.assert_allclose(on_dask.dual_coef_, local.dual_coef_, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("schedule", ["client", "client-batches", "chain"])
def test_fcfs_fill_schedules_equal_in_process(client, classification, monkeypatch, schedule):
    """The greedy fill on the client (all distance blocks in one gather, or one chunk a
    batch) and the chain of one task per chunk give the in-process FCFS labels."""
    import gpuml.distributed.dask.steps as gdask

    monkeypatch.setattr(gdask, "fills_on_client", lambda P, d: schedule != "chain")
    if schedule == "client-batches":
        monkeypatch.setattr(gdask, "FILL_BATCH_BYTES", 1)
    X, y = classification
    Xd, yd = _dask(X, y, rows=300)
    on_dask = CASVMClassifier(n_partitions=16, partition="fcfs", random_state=3).fit(Xd, yd)
    labels, centers = partition(X, 16, "fcfs", random_state=3)
    np.testing.assert_array_equal(on_dask.partition_sizes_, np.bincount(labels, minlength=16))
    np.testing.assert_allclose(on_dask.centers_, centers, rtol=1e-12, atol=1e-12)
    # Every support vector was fitted in the part the in-process fill gave its row.
    np.testing.assert_array_equal(labels[on_dask.support_], on_dask.support_part_)


@pytest.mark.parametrize("method", ["fcfs", "kbalance"])
def test_small_steps_run_one_task_per_worker(client, classification, method):
    """Every step runs one task per worker over the chunks it holds, not one per chunk:
    the checks and summaries, Lloyd steps, the fill's distances; each group's rows are
    taken by one task on each other worker, fitted by one, which keeps them there (with its
    setting's fits picked out by one task and their summaries made by another). The model
    is the in-process one."""
    X, y = classification
    # 12 chunks on 2 workers, persisted there: the fit starts from their futures
    Xd, yd = client.persist(list(_dask(X, y, rows=200)))
    distributed.wait([Xd, yd])
    params = dict(n_partitions=4, partition=method, random_state=0)
    with distributed.get_task_stream(client) as stream, counting() as fits:
        on_dask = CASVMClassifier(**params).fit(Xd, yd)
    steps = {}
    for task in stream.data:
        key = str(task["key"])
        assert key.startswith("gpuml-"), f"{key}: a task that is not one of the fit's steps"
        step = "-".join(key.split("-")[1:-2])  # gpuml-<step>-<token>-<count>
        steps[step] = steps.get(step, 0) + 1
    tr, = fits
    assert tr.groups == 2
    assert steps["load"] == steps["summary"] == 2
    assert steps["distances"] == 2
    assert steps["take"] == 2  # the other worker's chunks, for each worker's group of parts
    assert steps["fit-parts"] == steps["fit-setting"] == steps["fit-summary"] == 2
    if method == "kbalance":
        # k-means++ and the Lloyd steps run on one actor per worker, no tasks of their own
        assert steps["actor"] == 2 and tr.steps > 0
        assert sum(steps.values()) == 2 * 8
    else:
        assert sum(steps.values()) == 2 * 7
    local = CASVMClassifier(**params).fit(X, y)
    np.testing.assert_array_equal(on_dask.support_, local.support_)
    np.testing.assert_allclose(on_dask.dual_coef_, local.dual_coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(on_dask.centers_, local.centers_, rtol=1e-12, atol=1e-12)


def test_kmeans_on_actors_equals_kmeans_as_tasks(client, regression):
    """k-means++ and Lloyd on one actor per worker give the centres and sizes of the
    same steps run as tasks (the path Dask retries), and the in-process k-means centres."""
    from gpuml.distributed.dask import data, driver
    from gpuml.distributed.dask import steps as gd
    from gpuml.partition.algorithms import lloyd

    X, y = regression
    rows = data.load_rows(driver.Driver(client), *_dask(X, y), None, dtype=np.float64,
                        classification=False)
    runs = []
    for steps in (gd._ActorSteps, gd._TaskSteps):
        args = (5, np.random.RandomState(0), gd.LLOYD_MAX_ITER, gd.LLOYD_TOL)
        if steps is gd._ActorSteps:
            with steps(rows) as on:
                centers, sizes = lloyd(gd.ChunkRows(rows, on), *args)
        else:
            centers, sizes = lloyd(gd.ChunkRows(rows, steps(rows)), *args)
        runs.append((centers, sizes, rows.driver.traffic.steps))
        rows.driver.traffic.steps = 0
    (c1, s1, n1), (c2, s2, n2) = runs
    np.testing.assert_array_equal(c1, c2)
    np.testing.assert_array_equal(s1, s2)
    assert n1 == n2 > 0
    labels, centers = partition(X, 5, "kmeans", random_state=0)
    np.testing.assert_allclose(c1, centers, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(s1, np.bincount(labels, minlength=5))


def test_lost_actor_falls_back_to_tasks(client, regression, monkeypatch):
    """A worker holding a k-means actor dies mid-seeding: k-means runs again as tasks
    from the same draws (a warning says so), and the model is the in-process one."""
    from gpuml.distributed.dask import steps as gd

    X, y = regression
    closer = gd._ActorSteps.closer
    killed = []

    def closer_then_kill(self, c):
        if not killed:
            killed.append(self.rows.groups[0][0])
            with contextlib.suppress(Exception):  # the worker dies before it answers
                client.run(os._exit, 1, workers=killed)
            deadline = time.monotonic() + 30
            while killed[0] in client.scheduler_info(n_workers=-1)["workers"]:
                assert time.monotonic() < deadline, "the worker did not die"
                time.sleep(0.05)
        return closer(self, c)

    monkeypatch.setattr(gd._ActorSteps, "closer", closer_then_kill)
    params = dict(sigma=2.0, lam=1e-3, n_partitions=4, partition="kbalance", random_state=0)
    with pytest.warns(RuntimeWarning, match="running it again as tasks") as caught:
        on_dask = BKRRRegressor(**params).fit(*_dask(X, y))
    assert killed
    # distributed's words for it: "Worker holding Actor was lost", "Unable to contact ..."
    assert any(word in str(w.message) for w in caught for word in ("lost", "contact")), \
        [str(w.message) for w in caught]
    local = BKRRRegressor(**params).fit(X, y)
    np.testing.assert_array_equal(on_dask.part_sizes_, local.part_sizes_)
    np.testing.assert_array_equal(on_dask.X_fit_, local.X_fit_)
    np.testing.assert_allclose(on_dask.predict(X), local.predict(X), rtol=1e-8, atol=1e-10)
    client.wait_for_workers(2, timeout=60)


def test_contiguous_split_moves_no_rows(client, classification):
    """You 2020's casvm2 (Alg 5 as run): each part is rows as they lie, so a part that
    is one chunk is fitted where that chunk is. No partitioning pass, no take; only
    parts moved to even out the workers' loads move rows."""
    X, y = classification
    Xd, yd = client.persist(list(_dask(X, y, rows=200)))  # 12 chunks, P = 12: a chunk a part
    distributed.wait([Xd, yd])
    from gpuml.distributed.dask.data import _block_futures

    chunks = _block_futures(client, Xd)  # in row order
    where = client.who_has(chunks)
    held = [sorted(where[f.key])[0] for f in chunks]
    per_worker = [held.count(a) for a in sorted(set(held))] + [0]
    params = dict(n_partitions=12, partition="contiguous")
    with distributed.get_task_stream(client) as stream, counting() as fits:
        on_dask = CASVMClassifier(**params).fit(Xd, yd)
    steps = {str(t["key"]).split("-")[1] for t in stream.data}
    assert steps == ({"load", "summary", "fit"} |
                     ({"take"} if per_worker[0] != per_worker[1] else set()))
    # equal parts: the more loaded worker hands over parts until the two differ by <= 1
    moved_parts = abs(per_worker[0] - per_worker[1]) // 2
    assert fits[0].rows_moved == 200 * moved_parts
    assert sum(on_dask.part_worker_[p] != held[p] for p in range(12)) == moved_parts
    local = CASVMClassifier(**params).fit(X, y)
    np.testing.assert_array_equal(on_dask.support_, local.support_)
    np.testing.assert_allclose(on_dask.dual_coef_, local.dual_coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(on_dask.predict(X), local.predict(X))


def test_takes_run_before_fits_and_chunks_are_sized(client, classification):
    """Five chunks on one worker, one on the other: two of the first worker's contiguous
    parts move. Their rows are taken out on the first worker before it starts its own fit
    (which waits for nothing: run first, it kept the other worker idle for its length),
    and the scheduler sizes the held chunks by their arrays (not ~60 bytes: it then stole
    the take to the idle worker and copied every chunk there)."""
    from dask.sizeof import sizeof

    from gpuml.distributed.dask.data import _Chunk

    assert sizeof(_Chunk(np.zeros((50, 4)), np.zeros(50), None)) == 50 * 4 * 8 + 50 * 8
    X, y = classification
    a, b = sorted(client.scheduler_info(n_workers=-1)["workers"])
    parts = []
    for i, w in enumerate([a, a, a, a, a, b]):
        rows = slice(400 * i, 400 * (i + 1))
        parts.append(client.persist(list(_dask(X[rows], y[rows])), workers=[w]))
    Xd = da.concatenate([p[0] for p in parts])
    yd = da.concatenate([p[1] for p in parts])
    with distributed.get_task_stream(client) as stream, counting() as fits:
        on_dask = CASVMClassifier(n_partitions=6, partition="contiguous").fit(Xd, yd)
    assert fits[0].rows_moved == 800
    assert sorted(on_dask.part_worker_.tolist()) == [a, a, a, b, b, b]
    start = {}
    for t in stream.data:
        step = str(t["key"]).split("-")[1]
        if step in ("take", "fit"):
            compute = [s for s in t["startstops"] if s["action"] == "compute"][0]
            start[step, t["worker"]] = compute["start"]
    assert set(start) == {("take", a), ("fit", a), ("fit", b)}
    assert start["take", a] < start["fit", a]
    local = CASVMClassifier(n_partitions=6, partition="contiguous").fit(X, y)
    np.testing.assert_allclose(on_dask.dual_coef_, local.dual_coef_, rtol=1e-9, atol=1e-12)


def test_persisted_chunks_are_used_as_they_are(client, classification):
    from gpuml.distributed.dask.data import _block_futures

    X, _ = classification
    Xd = client.persist(da.from_array(X, chunks=(400, 10)))
    futures = _block_futures(client, Xd)
    assert [f.key for f in futures] == [k for (k,) in Xd.__dask_keys__()]
    assert {f.key for f in futures} == {f.key for f in distributed.futures_of(Xd)}
    # Not persisted: its blocks are computed, in order.
    lazy = da.from_array(X, chunks=(400, 10)) * 2.0
    np.testing.assert_array_equal(np.concatenate(client.gather(_block_futures(client, lazy))),
                                  2.0 * X)


def test_bad_input_is_refused_before_work(client, classification, regression):
    X, y = classification
    Xd, yd = _dask(X, y)
    unknown = Xd[Xd[:, 0] > -np.inf]
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        CASVMClassifier().fit(unknown, yd)
    with pytest.raises(ValueError, match="chunked differently"):
        CASVMClassifier().fit(Xd, da.from_array(y, chunks=300))
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        CASVMClassifier().fit(Xd, y[:-1])
    with pytest.raises(ValueError, match="does not run on Dask input"):
        CASVMClassifier(n_partitions=4, partition="bkm").fit(Xd, yd)
    with pytest.raises(ValueError, match="devices="):
        CASVMClassifier(devices=["cpu", "cpu"]).fit(Xd, yd)
    with pytest.raises(ValueError, match="2-D"):
        CASVMClassifier().fit(Xd[:, 0], yd)
    bad = X.copy()
    bad[1234, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        CASVMClassifier().fit(da.from_array(bad, chunks=(400, 10)), yd)
    # A part of 12,000 rows needs a 1.1 GiB kernel block: more than a 1 GiB worker's
    # budget, refused from the chunk sizes alone (the random chunks are never computed).
    Xbig = da.random.random((12_000, 8), chunks=(3000, 8))
    ybig = da.random.random(12_000, chunks=3000)
    with pytest.raises(MemoryError, match=r"n_partitions>=\d+"):
        BKRRRegressor(n_partitions=1).fit(Xbig, ybig)
    Xr, yr = _dask(*regression)
    with pytest.raises(ValueError, match="sample_weight is not supported on Dask input"):
        BKRRRegressor(n_partitions=2).fit(Xr, yr, sample_weight=np.ones(len(regression[1])))
    with pytest.raises(ValueError, match="precomputed.+does not run on Dask input"):
        BKRRRegressor(kernel="precomputed", n_partitions=1).fit(Xr, yr)
    with pytest.raises(ValueError, match="probability=True does not run on Dask input"):
        CASVMClassifier(probability=True).fit(Xd, yd)
    fitted = BKRRRegressor(sigma=2.0, n_partitions=2).fit(Xr, yr)
    with pytest.raises(ValueError, match="features"):
        fitted.predict(da.zeros((10, 3), chunks=5))


class KillOnce(distributed.WorkerPlugin):
    """Kills its worker process when a gpuml fit task starts, once (a file remembers)."""

    def __init__(self, flag):
        self.flag = str(flag)

    def transition(self, key, start, finish, **kwargs):
        if (finish == "executing" and isinstance(key, str) and key.startswith("gpuml-fit-parts")
                and not os.path.exists(self.flag)):
            Path(self.flag).write_text(key)
            os._exit(1)


def test_worker_killed_mid_fit_is_retried(client, classification, tmp_path):
    import cloudpickle

    # The workers import gpuml, not this test module: send the plugin by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    X, y = classification
    Xd, yd = _dask(X, y)
    flag = tmp_path / "killed"
    client.register_plugin(KillOnce(flag), name="kill-once")
    try:
        on_dask = CASVMClassifier(n_partitions=16, random_state=0).fit(Xd, yd)
    finally:
        client.unregister_worker_plugin("kill-once")
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert flag.exists(), "the plugin never killed a worker"
    local = CASVMClassifier(n_partitions=16, random_state=0).fit(X, y)
    np.testing.assert_array_equal(on_dask.support_, local.support_)
    np.testing.assert_allclose(on_dask.dual_coef_, local.dual_coef_, rtol=1e-9, atol=1e-12)
    client.wait_for_workers(2, timeout=60)


def test_grid_search_on_the_dask_joblib_backend(client, classification):
    from joblib import parallel_backend
    from sklearn.model_selection import GridSearchCV

    X, y = classification
    X, y = X[:600], y[:600]
    grid = {"C": [0.5, 2.0], "partition": ["random", "kbalance"]}
    est = CASVMClassifier(n_partitions=4, random_state=0)
    with parallel_backend("dask"):
        on_dask = GridSearchCV(est, grid, cv=2, n_jobs=-1).fit(X, y)
    local = GridSearchCV(est, grid, cv=2, n_jobs=1).fit(X, y)
    np.testing.assert_allclose(on_dask.cv_results_["mean_test_score"],
                               local.cv_results_["mean_test_score"])
    assert on_dask.best_params_ == local.best_params_


def _frame(X, columns="abcdefghij"):
    import pandas as pd

    return pd.DataFrame(X, columns=list(columns[:X.shape[1]]))


@pytest.mark.parametrize("kind", ["casvm", "bkrr"])
def test_feature_names_are_checked_on_dask_input(client, classification, regression, kind):
    """Columns in another order are refused as scikit-learn refuses them in memory, before
    any computation; a Dask array after a fit on names warns as a NumPy array does."""
    import pandas as pd

    X, y = classification if kind == "casvm" else regression
    frame = _frame(X)
    est = (CASVMClassifier(n_partitions=2, random_state=0) if kind == "casvm"
           else BKRRRegressor(sigma=2.0, n_partitions=2, random_state=0))
    est.fit(dd.from_pandas(frame, npartitions=3), da.from_array(y, chunks=800))
    assert list(est.feature_names_in_) == list(frame.columns)
    shuffled = frame[list(frame.columns[::-1])]
    with pytest.raises(ValueError, match="feature names should match") as in_memory:
        est.predict(shuffled)
    with pytest.raises(ValueError, match="feature names should match") as on_dask:
        est.predict(dd.from_pandas(shuffled, npartitions=3))
    assert str(on_dask.value) == str(in_memory.value)
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        est.predict(da.from_array(X, chunks=800))
    texts = frame.astype({"b": str})
    with pytest.raises(ValueError, match=r"non-numeric columns .*'b'"):
        est.predict(dd.from_pandas(texts, npartitions=3))
    with pytest.raises(ValueError, match=r"non-numeric columns .*'b'"):
        type(est)(**est.get_params()).fit(dd.from_pandas(texts, npartitions=3),
                                          dd.from_pandas(pd.Series(y), npartitions=3))


def _predict_tasks(stream):
    return sum(1 for t in stream.data if str(t["key"]).startswith("('gpuml-predict"))


@pytest.mark.parametrize("kind", ["casvm", "bkrr"])
def test_score_on_dask_is_one_pass_and_equals_in_memory(client, classification, regression,
                                                        kind):
    """score takes Dask arrays, dataframes and series for X, y and sample_weight, computes
    each block's predictions once, and gives scikit-learn's number."""
    import pandas as pd

    X, y = classification if kind == "casvm" else regression
    w = np.random.default_rng(1).uniform(0.0, 2.0, size=len(y))
    est = (CASVMClassifier(n_partitions=2, random_state=0) if kind == "casvm"
           else BKRRRegressor(sigma=2.0, n_partitions=2, random_state=0)).fit(X, y)
    expected, weighted = est.score(X, y), est.score(X, y, sample_weight=w)
    frame = dd.from_pandas(_frame(X), npartitions=3)
    est.fit(_frame(X), y)
    series = dd.from_pandas(pd.Series(y), npartitions=3)
    weights = dd.from_pandas(pd.Series(w), npartitions=3)
    assert est.score(frame, series) == pytest.approx(expected, rel=1e-12)
    assert est.score(frame, series, sample_weight=weights) == pytest.approx(weighted, rel=1e-12)
    assert est.score(frame, y) == pytest.approx(expected, rel=1e-12)
    est.fit(X, y)
    Xd, yd = _dask(X, y)
    with distributed.get_task_stream(client) as stream:
        got = est.score(Xd, yd, sample_weight=w)
    assert got == pytest.approx(weighted, rel=1e-12)
    assert _predict_tasks(stream) == Xd.numblocks[0]
    # y chunked unlike X is rechunked like it, not refused
    assert est.score(Xd, da.from_array(y, chunks=700)) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        est.score(Xd, da.from_array(y[:-1], chunks=400))


def test_score_on_a_multi_output_regression(client, regression):
    X, y = regression
    Y = np.column_stack([y, np.sin(y)])
    est = BKRRRegressor(sigma=2.0, n_partitions=2, random_state=0).fit(X, Y)
    Xd = da.from_array(X, chunks=(400, X.shape[1]))
    got = est.score(Xd, da.from_array(Y, chunks=(400, 1)))
    assert got == pytest.approx(est.score(X, Y), rel=1e-12)


def test_worker_list_is_asked_of_the_scheduler(client, classification, monkeypatch):
    """distributed's periodic refresh replaces the client's cached scheduler info with one
    that has no per-worker entries, at any moment; a fit must not read that cache."""
    async def refresh_without_workers(self, n_workers=0):
        self._scheduler_identity = {"type": "Scheduler", "workers": {}}

    monkeypatch.setattr(type(client), "_update_scheduler_info", refresh_without_workers)
    X, y = classification
    on_dask = CASVMClassifier(n_partitions=4, random_state=0).fit(*_dask(X, y))
    local = CASVMClassifier(n_partitions=4, random_state=0).fit(X, y)
    np.testing.assert_array_equal(on_dask.support_, local.support_)


def test_in_process_estimators_refuse_dask_input_and_predict_lazily(client, classification,
                                                                    regression):
    """AsyGCDSVC and BKRRRegressorCV fit in one process: Dask input to fit is refused, not
    gathered. Fitted, they predict Dask input lazily, each block where it lies."""
    from gpuml import AsyGCDSVC, BKRRRegressorCV

    X, y = classification
    Xd, yd = _dask(X, y)
    with pytest.raises(TypeError, match="AsyGCDSVC.fit does not take Dask input"):
        AsyGCDSVC(n_workers=1).fit(Xd, yd)
    with pytest.raises(TypeError, match="AsyGCDSVC.fit does not take Dask input"):
        AsyGCDSVC(n_workers=1).fit(X, yd)
    svc = AsyGCDSVC(n_workers=1, random_state=0).fit(X[:600], y[:600])
    lazy = svc.predict(Xd)
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(lazy.compute(), svc.predict(X))
    lazy = svc.decision_function(Xd)
    assert isinstance(lazy, da.Array)
    # blocks of 400 rows: BLAS may round the kernel rows of another shape differently
    np.testing.assert_allclose(lazy.compute(), svc.decision_function(X), rtol=1e-12,
                               atol=1e-13)
    assert svc.score(Xd, yd) == pytest.approx(svc.score(X, y), rel=1e-12)
    Xr, yr = _dask(*regression)
    with pytest.raises(TypeError, match="BKRRRegressorCV.fit does not take Dask input"):
        BKRRRegressorCV(sigmas=(1.0,), lams=(1e-3,)).fit(Xr, yr)
    cv = BKRRRegressorCV(sigmas=(1.0, 2.0), lams=(1e-3,), n_partitions=2,
                         random_state=0).fit(*regression)
    lazy = cv.predict(Xr)
    assert isinstance(lazy, da.Array)
    np.testing.assert_allclose(lazy.compute(), cv.predict(regression[0]), rtol=1e-12)


def test_import_gpuml_does_not_import_dask():
    code = "import sys, gpuml; sys.exit(1 if 'dask' in sys.modules else 0)"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env).returncode == 0


def test_each_worker_is_held_to_its_share_not_to_all_the_data(client, classification,
                                                              monkeypatch):
    """The budget check counts what one worker holds: its chunks' rows and the parts placed
    on it (with one kernel block per solver thread), not every part; a share over budget is
    refused after the placement, before any row moves, naming the worker."""
    from gpuml.pipeline import dask as dask_executor

    X, y = classification
    Xd, yd = _dask(X, y)
    est = CASVMClassifier(n_partitions=8, partition="random", random_state=0)
    d, rows_per_worker, part = X.shape[1], 1200, 300
    # CA-SVM's estimate: rows (with class and C) and one kernel block per solver thread
    one_part = 8 * part * (d + 2) + 8 * part**2
    # ... for four parts, the chunks' rows, and two copies of the one wave of four parts
    share = 4 * 8 * part * (d + 2) + 8 * part**2 + rows_per_worker * d * 8 + 2 * 4 * part * d * 8
    original = dask_executor.workers_and_budget

    def budget(limit):
        monkeypatch.setattr(dask_executor, "workers_and_budget",
                            lambda c: (original(c)[0], limit))

    # The shares: 2,400 rows in 8 parts of 300 over two workers; the larger share holds at
    # least half the chunks' rows and half the parts.
    budget(2 * share)
    fitted = est.fit(Xd, yd)
    np.testing.assert_array_equal(fitted.partition_sizes_, [part] * 8)
    budget((one_part + share) // 2)  # one part fits, the larger share does not
    with distributed.get_task_stream(client) as stream:
        with pytest.raises(MemoryError, match=r"on the Dask worker tcp://\S+: the input rows "
                                              r"it holds"):
            est.fit(Xd, yd)
    steps = {str(t["key"]).split("-")[1] for t in stream.data}
    assert "fit" not in steps and "take" not in steps


def test_prediction_refuses_a_model_larger_than_a_workers_budget(client, regression,
                                                                  monkeypatch):
    """A BKRR model holds every training row and travels whole to each worker that
    predicts: more than a worker's budget is refused before any work, naming both sizes."""
    from gpuml.distributed.dask import predict as dask_predict
    from gpuml.distributed.dask.driver import fmt_bytes

    X, y = regression
    model = BKRRRegressor(n_partitions=4, random_state=0).fit(X, y)
    size = dask_predict.model_bytes(model)
    assert size >= model.X_fit_.nbytes + model.dual_coef_.nbytes
    Xd, _ = _dask(X, y)
    original = dask_predict.workers_and_budget
    monkeypatch.setattr(dask_predict, "workers_and_budget", lambda c: (original(c)[0], size))
    np.testing.assert_allclose(model.predict(Xd).compute(), model.predict(X), rtol=1e-12,
                               atol=1e-12)
    monkeypatch.setattr(dask_predict, "workers_and_budget",
                        lambda c: (original(c)[0], size - 1))
    with pytest.raises(MemoryError, match=re.escape(f"takes {fmt_bytes(size)} (its training "
                                                    "rows and coefficients)")):
        model.predict(Xd)


def _latent_block(block, rows, n_features):
    """A block of a smooth binary task made where it runs (as bench.datasets.latent_rows)."""
    rng = np.random.default_rng([3, block])
    Z = rng.standard_normal((rows, 3))
    mix = np.random.default_rng(3).standard_normal((3, n_features))
    X = Z @ mix + 0.05 * rng.standard_normal((rows, n_features))
    return X, (Z[:, 0] + 0.5 * np.sin(2 * Z[:, 1]) > 0).astype(np.int64)


def test_rows_made_on_the_workers_never_pass_the_client(client):
    """Rows made by tasks on the workers are fitted and scored there: what the client sends
    and gathers in the fit (the driver's count) is a small fraction of the rows' bytes (the
    model's support vectors, the split's sums and labels), and the score's predictions stay
    on the workers (a few sums a block come back)."""
    import dask

    blocks, rows, d = 8, 2000, 40
    made = [dask.delayed(_latent_block, pure=True)(b, rows, d) for b in range(blocks)]
    X = da.concatenate([da.from_delayed(m[0], shape=(rows, d), dtype=np.float64)
                        for m in made])
    y = da.concatenate([da.from_delayed(m[1], shape=(rows,), dtype=np.int64) for m in made])
    with distributed.get_task_stream(client) as stream, counting() as fits:
        est = CASVMClassifier(n_partitions=8, partition="kbalance", random_state=0).fit(X, y)
    tr, = fits
    # no collection computed to the client (dask's "finalize" step of a .compute())
    assert not [t for t in stream.data if "finalize" in str(t["key"])]
    model = est.support_vectors_.nbytes + est.dual_coef_.nbytes
    n, P = blocks * rows, 8
    # sent: the labels to the tasks that cut the parts out (8 n per group) and the centres
    # to each worker for every k-means step; gathered: each chunk's sums per step, the
    # K-balance fill's n x P distances (P <= d: no larger than the rows), the labels, the
    # parts' models (their support vectors): no input row either way
    assert tr.sent < 8 * n * (tr.groups + 1) + tr.steps * tr.groups * 8 * P * (d + 1) + 2**16
    assert tr.gathered < (model + 8 * n + 8 * n * P + tr.steps * blocks * 8 * P * (d + 1)
                          + 8 * P * (d + 1) * tr.groups + 2**17)
    assert est.score(X, y) > 0.97


@pytest.mark.parametrize("estimator", ["casvm", "bkrr"])
def test_parts_fitted_in_waves_give_the_model_of_one_batch(client, classification, regression,
                                                           monkeypatch, estimator):
    """A worker fits its parts in waves of at most FIT_WAVE_BYTES of rows: every part its own
    wave gives the model of all of a worker's parts in one batch, bit for bit."""
    from gpuml.distributed.dask import fit as dask_fit_steps

    assert dask_fit_steps._waves([3, 4, 5], 8, 8 * 7) == [[0, 1], [2]]
    assert dask_fit_steps._waves([3, 40, 5], 8, 8 * 7) == [[0], [1], [2]]
    if estimator == "casvm":
        X, y = classification
        make = lambda: CASVMClassifier(n_partitions=8, random_state=0)  # noqa: E731
    else:
        X, y = regression
        make = lambda: BKRRRegressor(n_partitions=8, random_state=0)  # noqa: E731
    Xd, yd = _dask(X, y)
    one = make().fit(Xd, yd)
    monkeypatch.setattr(dask_fit_steps, "FIT_WAVE_BYTES", 1)
    waves = make().fit(Xd, yd)
    np.testing.assert_array_equal(waves.dual_coef_, one.dual_coef_)
    np.testing.assert_array_equal(waves.intercept_, one.intercept_)
    if estimator == "casvm":
        np.testing.assert_array_equal(waves.support_, one.support_)
    else:
        np.testing.assert_array_equal(waves.X_fit_, one.X_fit_)
    # The models are equal to the bit (above); their predictions are BLAS products over the
    # parts' arrays where each fit left them on the workers, and OpenBLAS's AVX-512 kernels
    # need not round two such products alike (seen: 3 of 2,400 BKRR predictions 3.6e-15
    # apart, never with OPENBLAS_CORETYPE=Haswell).
    np.testing.assert_allclose(waves.predict(X), one.predict(X), rtol=1e-12, atol=0)


def _regression_block(block, rows, n_features):
    """A block of a smooth regression task made where it runs."""
    rng = np.random.default_rng([5, block])
    Z = rng.standard_normal((rows, 3))
    mix = np.random.default_rng(5).standard_normal((3, n_features))
    X = Z @ mix + 0.05 * rng.standard_normal((rows, n_features))
    return X, Z[:, 0] + 0.5 * np.sin(2 * Z[:, 1])


@pytest.mark.parametrize("combine", ["nearest", "average"])
def test_bkrr_parts_stay_on_the_workers_that_fitted_them(client, combine):
    """A BKRR model holds every training row: after a Dask fit its parts stay on the workers
    that fitted them (X_fit_ and dual_coef_ are Dask arrays over them, both workers hold
    some), the fit gathers none of its rows, a prediction runs where the parts are, and
    the model is the in-process one (attributes, predictions of Dask and in-memory rows,
    score); pickled, it is the in-memory model."""
    import pickle

    import dask

    blocks, rows, d = 6, 2000, 40
    made = [dask.delayed(_regression_block, pure=True)(b, rows, d) for b in range(blocks)]
    X = da.concatenate([da.from_delayed(m[0], shape=(rows, d), dtype=np.float64)
                        for m in made])
    y = da.concatenate([da.from_delayed(m[1], shape=(rows,), dtype=np.float64) for m in made])
    params = dict(n_partitions=8, combine=combine, random_state=0)
    with counting() as fits:
        est = BKRRRegressor(**params).fit(X, y)
    tr, = fits
    local_X = np.concatenate([_regression_block(b, rows, d)[0] for b in range(blocks)])
    local_y = np.concatenate([_regression_block(b, rows, d)[1] for b in range(blocks)])
    local = BKRRRegressor(**params).fit(local_X, local_y)
    # The model's rows (n x d) and coefficients stay on the workers: the fit gathers each
    # chunk's sums per k-means step, the K-balance fill's n x P distances (P <= d), the
    # labels and the parts' intercepts, less than the model by itself would be.
    n, P = blocks * rows, 8
    bound = 8 * n + 8 * n * P + tr.steps * blocks * 8 * P * (d + 1) + 2**17
    assert tr.gathered < bound < 8 * n * (d + 1)
    assert isinstance(est.X_fit_, da.Array) and isinstance(est.dual_coef_, da.Array)
    holders = client.who_has([future for _, future in est._kept_parts])
    assert len({w for ws in holders.values() for w in ws}) == 2
    np.testing.assert_array_equal(est.part_sizes_, local.part_sizes_)
    np.testing.assert_array_equal(est.X_fit_, local.X_fit_)
    np.testing.assert_allclose(est.dual_coef_, local.dual_coef_, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(est.intercept_, local.intercept_, rtol=1e-12, atol=1e-15)
    expected = local.predict(local_X[:2500])
    Xd = da.from_array(local_X[:2500], chunks=(700, d))
    with distributed.get_task_stream(client) as stream:
        pred = est.predict(Xd)
    assert not stream.data  # lazy
    assert isinstance(pred, da.Array) and pred.chunks == (Xd.chunks[0],)
    np.testing.assert_allclose(pred.compute(), expected, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(est.predict(local_X[:2500]), expected, rtol=1e-8, atol=1e-9)
    single = est.predict(local_X[:100].astype(np.float32))
    assert single.dtype == np.float32
    assert est.predict(Xd[:100].astype(np.float32)).compute().dtype == np.float32
    assert est.score(X, y) == pytest.approx(local.score(local_X, local_y), rel=1e-8)
    back = pickle.loads(pickle.dumps(est))
    assert isinstance(back.X_fit_, np.ndarray) and not back._kept()
    np.testing.assert_allclose(back.predict(local_X[:2500]), expected, rtol=1e-8, atol=1e-9)
    here = est.to_local()  # as the pickle, without it; the model stays kept
    assert isinstance(here.X_fit_, np.ndarray) and not here._kept() and est._kept()
    np.testing.assert_array_equal(here.predict(local_X[:2500]), back.predict(local_X[:2500]))
    assert here.to_local() is here  # a model in memory already
    est.fit(local_X, local_y)  # refitted in memory: nothing of the kept parts is left
    assert not est._kept() and isinstance(est.X_fit_, np.ndarray)
    np.testing.assert_array_equal(est.predict(local_X[:2500]), local.predict(local_X[:2500]))


def test_bkrr_kept_parts_released_are_a_clear_error(client, regression):
    """A model whose kept parts are gone (released, or their client closed) says so and
    what to do, instead of waiting on them or failing inside Dask."""
    import pickle

    X, y = regression
    est = BKRRRegressor(n_partitions=4, random_state=0).fit(*_dask(X, y))
    kept = pickle.loads(pickle.dumps(est))  # the parts gathered while they are there
    client.cancel([future for _, future in est._kept_parts])
    for call in (lambda: est.predict(X), lambda: est.predict(_dask(X, y)[0]),
                 lambda: pickle.dumps(est)):
        with pytest.raises(RuntimeError, match="kept on the cluster's workers.*pickle the "
                                               "model while it runs"):
            call()
    np.testing.assert_allclose(kept.predict(X), BKRRRegressor(n_partitions=4, random_state=0)
                               .fit(X, y).predict(X), rtol=1e-8, atol=1e-9)


def _noisy_block(block, rows, n_features, flip=0.3):
    """A block of a binary task made where it runs, a share of its labels flipped (many
    support vectors)."""
    X, y = _latent_block(block, rows, n_features)
    rng = np.random.default_rng([7, block])
    return X, np.where(rng.random(rows) < flip, rng.integers(0, 2, rows), y)


def _made_on_workers(make, blocks, rows, d, first=0):
    """Blocks ``first ...`` of ``make`` as Dask arrays made on the workers, and in memory."""
    import dask

    made = [dask.delayed(make, pure=True)(first + b, rows, d) for b in range(blocks)]
    X = da.concatenate([da.from_delayed(m[0], shape=(rows, d), dtype=np.float64)
                        for m in made])
    y = da.concatenate([da.from_delayed(m[1], shape=(rows,), dtype=np.int64) for m in made])
    local = [make(first + b, rows, d) for b in range(blocks)]
    return X, y, np.concatenate([m[0] for m in local]), np.concatenate([m[1] for m in local])


def _task_workers(stream, step):
    """``{group: {workers}}`` that ran the prediction tasks of ``step`` (``gpuml-predict-
    <step>-<token>-<block>-<group>``)."""
    out = {}
    for task in stream:
        key = str(task["key"])
        if key.startswith(f"gpuml-predict-{step}-"):
            out.setdefault(int(key.rsplit("-", 1)[1]), set()).add(task["worker"])
    return out


@contextlib.contextmanager
def _no_work_stealing(client):
    """Dask's work stealing paused: it may move a task to an idle worker with its inputs
    (a group of parts included) whatever the task's worker restrictions allow loosely."""
    async def stealing(dask_scheduler, on):
        extension = dask_scheduler.extensions["stealing"]
        await (extension.start() if on else extension.stop())

    client.run_on_scheduler(stealing, on=False)
    try:
        yield
    finally:
        client.run_on_scheduler(stealing, on=True)


@pytest.mark.parametrize("combine", ["nearest", "auto", "neighbors"])
def test_casvm_parts_stay_on_the_workers_that_fitted_them(client, combine):
    """After a Dask fit CA-SVM's parts stay on the workers that fitted them: the fit gathers
    no support vector, the client keeps the centres and the parts' summaries, the values of
    each part are computed on the worker holding it (the blend's candidates too), and the
    model is the in-process one: attributes (gathered when read), predictions and decision
    values of Dask and in-memory rows, score, to_local(), pickle."""
    import pickle

    blocks, rows, d = 6, 1000, 40
    X, y, local_X, local_y = _made_on_workers(_noisy_block, blocks, rows, d)
    # gamma given: "scale" reads the variance, summed in another order over the chunks
    params = dict(n_partitions=20, partition="random", gamma=0.02, combine=combine,
                  random_state=0)
    with counting() as fits:
        est = CASVMClassifier(**params).fit(X, y)
    tr, = fits
    local = CASVMClassifier(**params).fit(local_X, local_y)
    n, P, n_sv = blocks * rows, 20, int(local.n_support_.sum())
    # Gathered: y (8n; the random split is drawn on the client), each group's sums and
    # each part's summary: less than the support vectors alone.
    assert tr.gathered < 8 * n + P * 2**13 + 2**16 < 8 * n_sv * d
    assert est._kept() and not set(vars(est)) & {"support_vectors_", "dual_coef_", "support_"}
    holders = client.who_has([future for _, future in est._kept_parts])
    group_worker = {g: set(holders[f.key]) for g, (_, f) in enumerate(est._kept_parts)}
    assert len(set.union(*group_worker.values())) == 2
    np.testing.assert_array_equal(est.n_support_, local.n_support_)
    np.testing.assert_allclose(est.intercept_, local.intercept_, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(est.pair_status_, local.pair_status_)
    # The support vectors' arrays, gathered when first read, are the in-process fit's.
    np.testing.assert_array_equal(est.support_, local.support_)
    np.testing.assert_array_equal(est.support_part_, local.support_part_)
    np.testing.assert_array_equal(est.support_vectors_, local.support_vectors_)
    np.testing.assert_allclose(est.dual_coef_, local.dual_coef_, rtol=1e-9, atol=1e-12)
    Xt, yt, local_Xt, local_yt = _made_on_workers(_noisy_block, 2, 1300, d, first=100)
    expected = local.predict(local_Xt)
    with distributed.get_task_stream(client) as stream:
        pred = est.predict(Xt)
    assert not stream.data  # lazy
    assert isinstance(pred, da.Array) and pred.chunks == (Xt.chunks[0],)
    # Each group's tasks (its values, the blend's candidates) run on the worker holding the
    # group, for Dask and in-memory rows and score (Dask's work stealing paused: it may move
    # a task whose restriction is loose, as these are, to an idle worker).
    with _no_work_stealing(client), distributed.get_task_stream(client) as stream:
        np.testing.assert_array_equal(pred.compute(), expected)
        np.testing.assert_allclose(est.decision_function(Xt).compute(),
                                   local.decision_function(local_Xt), rtol=1e-9, atol=1e-9)
        np.testing.assert_array_equal(est.predict(local_Xt), expected)  # via the cluster
        score = est.score(Xt, yt)
    assert score == pytest.approx(local.score(local_Xt, local_yt), rel=1e-12)
    for step in ("parts", "candidates"):
        for g, workers in _task_workers(stream.data, step).items():
            assert workers == group_worker[g], (step, g)
    assert bool(_task_workers(stream.data, "candidates")) == (combine != "nearest")
    assert bool(_task_workers(stream.data, "parts")) == (combine != "neighbors")
    single = est.decision_function(local_Xt[:300].astype(np.float32))
    assert single.dtype == np.float32
    np.testing.assert_allclose(single, local.decision_function(local_Xt[:300].astype(
        np.float32)), rtol=1e-5, atol=1e-5)
    back = est.to_local()
    assert not back._kept() and isinstance(back.support_vectors_, np.ndarray)
    np.testing.assert_array_equal(back.predict(local_Xt), expected)
    loaded = pickle.loads(pickle.dumps(est))
    assert not loaded._kept()
    np.testing.assert_array_equal(loaded.predict(local_Xt), expected)
    assert est._kept()  # to_local and the pickle gathered copies: the parts stay there
    est.fit(local_X, local_y)  # refitted in memory: nothing of the kept parts is left
    assert not est._kept()
    np.testing.assert_array_equal(est.predict(local_Xt), expected)


def test_casvm_kept_support_arrays_over_the_gather_limit_are_refused(client, classification,
                                                                     monkeypatch):
    """Reading a kept model's support-vector arrays gathers them up to GATHER_LIMIT_BYTES and
    refuses beyond, naming their size and to_local(); the per-part and per-class arrays are
    on the client; to_local() gathers on purpose."""
    from gpuml.distributed.dask import kept
    from gpuml.distributed.dask.driver import fmt_bytes

    X, y = classification
    est = CASVMClassifier(n_partitions=4, random_state=0).fit(*_dask(X, y))
    size = est._support_bytes()
    d, pairs = X.shape[1], 3
    assert size == int(est.n_support_.sum()) * (8 * d + 8 * (pairs + 2 + 2))
    monkeypatch.setattr(kept, "GATHER_LIMIT_BYTES", size - 1)
    for name in ("support_vectors_", "dual_coef_", "support_", "support_part_",
                 "ovo_dual_coef_"):
        with pytest.raises(MemoryError, match=re.escape(f"{name} of this CASVMClassifier "
                                                        f"takes {fmt_bytes(size)}") +
                           r".*to_local\(\)"):
            getattr(est, name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_'"):
        est.no_such_
    assert est.intercept_.shape == (4, pairs) and est.n_support_.sum() > 0
    local = est.to_local()
    monkeypatch.setattr(kept, "GATHER_LIMIT_BYTES", size)
    np.testing.assert_array_equal(est.support_vectors_, local.support_vectors_)
    np.testing.assert_array_equal(est.predict(X), local.predict(X))


def _blobs_with_one_class_parts():
    """Four classes: two alone in blobs of their own (their parts hold one class and no
    support vector), two mixed in a third blob."""
    rng = np.random.default_rng(4)
    centres = np.array([[8.0, 0.0, 0.0], [0.0, 8.0, 0.0], [0.0, 0.0, 0.0]])
    X = np.concatenate([rng.normal(c, 1.0, size=(600, 3)) for c in centres])
    y = np.concatenate([np.zeros(600), np.ones(600),
                        np.where(X[1200:, 0] + 0.3 * rng.normal(size=600) > 0, 2, 3)])
    return X, y.astype(np.int64)


@pytest.mark.parametrize("combine", ["auto", "neighbors"])
def test_casvm_kept_many_classes_and_parts_without_support_vectors(client, combine):
    """Four classes (the pair coefficients by class blocks), parts that hold one class and no
    support vector (rows nearest them are judged by them alone), SVC's decision shapes and
    break_ties: the kept model predicts as the in-process one."""
    X, y = _blobs_with_one_class_parts()
    Xd, yd = _dask(X, y, rows=450)
    rng = np.random.default_rng(5)
    Xt = np.concatenate([X + rng.normal(0, 0.5, X.shape), rng.normal(4, 4, (300, 3))])
    for shape, ties in (("ovr", False), ("ovo", False), ("ovr", True)):
        params = dict(n_partitions=9, partition="kmeans", gamma=0.5, combine=combine,
                      decision_function_shape=shape, break_ties=ties, random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # parts of one class
            est = CASVMClassifier(**params).fit(Xd, yd)
            local = CASVMClassifier(**params).fit(X, y)
        counts = est._kept_n_support.sum(axis=1)
        assert (counts == 0).any() and (counts > 0).any()
        Xtd = da.from_array(Xt, chunks=(500, 3))
        np.testing.assert_array_equal(est.predict(Xtd).compute(), local.predict(Xt))
        np.testing.assert_allclose(est.decision_function(Xtd).compute(),
                                   local.decision_function(Xt), rtol=1e-9, atol=1e-9)


def test_casvm_kept_parts_released_are_a_clear_error(client, classification):
    """A kept CA-SVM whose parts were released says so and what to do."""
    import pickle

    X, y = classification
    est = CASVMClassifier(n_partitions=4, random_state=0).fit(*_dask(X, y))
    kept = est.to_local()
    client.cancel([future for _, future in est._kept_parts])
    for call in (lambda: est.predict(X), lambda: est.predict(_dask(X, y)[0]),
                 lambda: est.support_vectors_, lambda: pickle.dumps(est), est.to_local):
        with pytest.raises(RuntimeError, match="kept on the cluster's workers.*released.*pickle "
                                               "the model while it runs"):
            call()
    assert kept.score(X, y) > 0.8


def test_kept_prediction_without_the_placement_plugin_warns_and_predicts(client, classification,
                                                                       monkeypatch):
    """A scheduler that cannot load gpuml's placement of kept parts: a warning says so, and
    the prediction runs where Dask's scheduler puts it, with the same result."""
    import weakref

    from gpuml.distributed.dask import kept

    X, y = classification
    est = CASVMClassifier(n_partitions=4, random_state=0).fit(*_dask(X, y))
    expected = est.predict(X)

    def refuse(plugin, *args, **kwargs):
        raise ModuleNotFoundError("No module named 'gpuml'")

    monkeypatch.setattr(kept, "_placed", weakref.WeakSet())
    monkeypatch.setattr(client, "register_plugin", refuse)
    with pytest.warns(RuntimeWarning, match="could not load gpuml's placement of kept parts "
                                            r"\(ModuleNotFoundError"):
        pred = est.predict(_dask(X, y)[0])
    np.testing.assert_array_equal(pred.compute(), expected)
