"""A Dask worker lost at each phase of a fit or a prediction: the same model, or a clear error.

A real two-worker ``LocalCluster`` (worker processes under nannies). Each case
persists fresh data over both workers, then loses one worker at a chosen moment
in one of two ways:

* ``kill``: the worker process is killed (SIGKILL); its nanny starts a new one;
* ``close``: the worker closes for good, nanny and all.

Every case begins by making sure of two running workers (:func:`_two_workers`: a
new worker process, ``python -m distributed.cli.dask_worker``, replaces one closed
for good), so a case that fails leaves the next ones unharmed.

The moments: before the partitioner's first step (``start``), during k-means++
seeding (``seeding``), during the Lloyd steps (``lloyd``), at the greedy fill
(``fill``), while the fit tasks run (``fit``), while a lazy prediction is
computed (``predict``: the fitted parts are kept on the workers, so the lost
worker takes some of them with it), for every partitioner that has that phase
and for both estimators, and between the fit and the prediction (``between``: a
worker holding parts lost; two partitioners). Each run must end within
:data:`RUN_LIMIT` seconds (else the test reports a hang) with the model an
undisturbed fit of the same data gives, its lost parts fitted again from the
persisted rows. Parts lost with rows that cannot be computed again end in an
error naming the worker and the parts.
"""

import contextlib
import faulthandler
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_classification, make_regression

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

from gpuml import BKRRRegressor, CASVMClassifier  # noqa: E402
from gpuml.distributed import dask as gd  # noqa: E402
from gpuml.distributed.dask import steps as dask_steps  # noqa: E402
from gpuml.pipeline import dask as dask_fit  # noqa: E402

#: Seconds a disturbed fit and its prediction may take before the test calls it a hang.
RUN_LIMIT = 120
#: Seconds the whole module may take before every thread's stack is dumped and the run ends.
MODULE_LIMIT = 1800

PHASES = {
    "random": ("start", "fit", "predict"),
    "contiguous": ("start", "fit", "predict"),
    "fcfs": ("start", "fill", "fit", "predict"),
    "kmeans": ("start", "seeding", "lloyd", "fit", "predict"),
    "kbalance": ("start", "seeding", "lloyd", "fill", "fit", "predict"),
}
#: Lost between the fit and the prediction: a worker holding parts, with or without rows
#: moved to other workers' parts.
BETWEEN = ("fcfs", "contiguous")
CASES = [(est, method, phase, how)
         for est in ("casvm", "bkrr")
         for method, phases in PHASES.items()
         for phase in phases + (("between",) if method in BETWEEN else ())
         for how in ("kill", "close")]


@pytest.fixture(scope="module")
def cluster():
    import cloudpickle

    faulthandler.dump_traceback_later(MODULE_LIMIT, exit=True)
    # The workers import gpuml, not this test module: its functions and plugin go by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       memory_limit="1GiB", dashboard_address=":0",
                                       silence_logs=50)
    client = distributed.Client(cluster)
    joined = []
    yield cluster, client, joined
    client.close()
    cluster.close()
    for proc in joined:
        proc.kill()
        proc.wait()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    faulthandler.cancel_dump_traceback_later()


def _data(estimator):
    if estimator == "casvm":
        return make_classification(2400, 10, n_informative=6, n_classes=3, random_state=0)
    X, y = make_regression(2400, 8, noise=1.0, random_state=0)
    return X / X.std(axis=0), y / y.std()


def _estimator(estimator, method):
    if estimator == "casvm":
        return CASVMClassifier(n_partitions=8, partition=method, random_state=0)
    return BKRRRegressor(n_partitions=8, partition=method, random_state=0)


_reference = {}


def _undisturbed(client, estimator, method):
    """The model and predictions of an undisturbed fit on the same data (once per case kind)."""
    key = (estimator, method)
    if key not in _reference:
        X, y = _data(estimator)
        Xd, yd = client.persist([da.from_array(X, chunks=(300, X.shape[1])),
                                 da.from_array(y, chunks=300)])
        est = _estimator(estimator, method).fit(Xd, yd)
        _reference[key] = est, est.predict(Xd).compute()
    return _reference[key]


def _live(client):
    """The running workers' addresses, as the scheduler answers now."""
    info = client.sync(client.scheduler.identity, n_workers=-1)["workers"]
    return {a for a, w in info.items() if w["status"] == "running"}


def _close_for_good(dask_worker):
    """Close this worker and its nanny (run in the worker): it does not come back."""
    dask_worker.loop.add_callback(dask_worker.close, nanny=True, executor_wait=False,
                                  reason="closed by test_dask_faults")


class _LoseOnTask(distributed.WorkerPlugin):
    """Loses its worker when a task whose key starts with ``prefix`` starts executing there.

    Once in all: the first worker to create ``flag`` (a file, which it writes its address
    into) is lost; the others, and the workers that join later with the plugin, leave their
    tasks alone.
    """

    def __init__(self, prefix, how, flag):
        self.prefix, self.how, self.flag = prefix, how, str(flag)

    def setup(self, worker):
        self.worker = worker

    def transition(self, key, start, finish, **kwargs):
        name = key[0] if isinstance(key, tuple) else key
        if not (finish == "executing" and isinstance(name, str) and name.startswith(self.prefix)):
            return
        try:
            fd = os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, self.worker.address.encode())
        os.close(fd)
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        _close_for_good(self.worker)


class _Loser:
    """Loses one worker, once, from the test's side (the fit's driver thread)."""

    def __init__(self, client, how):
        self.client, self.how, self.lost = client, how, []

    def __call__(self, address=None):
        if self.lost:
            return
        workers = _live(self.client)
        address = address if address in workers else sorted(workers)[0]
        self.lost.append(address)
        if self.how == "kill":
            pid = self.client.run(os.getpid, workers=[address])[address]
            os.kill(pid, signal.SIGKILL)
        else:
            self.client.run(_close_for_good, workers=[address])
        deadline = time.monotonic() + 30
        while address in _live(self.client):
            assert time.monotonic() < deadline, f"the worker {address} was not lost"
            time.sleep(0.05)


def _on_driver(monkeypatch, phase, lose):
    """Patch the step where ``phase`` begins so that it first loses a worker holding rows."""
    def holder(rows):
        return rows.groups[0][0]

    if phase == "start":
        original = dask_fit.partition_chunks

        def start(rows, *args, **kwargs):
            lose(holder(rows))
            return original(rows, *args, **kwargs)

        monkeypatch.setattr(dask_fit, "partition_chunks", start)
    elif phase == "seeding":
        for steps in (dask_steps._ActorSteps, dask_steps._TaskSteps):
            monkeypatch.setattr(steps, "first", _before(steps.first, lose))
    elif phase == "lloyd":
        for steps in (dask_steps._ActorSteps, dask_steps._TaskSteps):
            monkeypatch.setattr(steps, "assign", _before(steps.assign, lose, skip=1))
    elif phase == "fill":
        monkeypatch.setattr(gd.ChunkRows, "fill", _before(gd.ChunkRows.fill, lose))


def _before(method, lose, skip=0):
    calls = []

    def patched(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > skip:
            lose((self.data if hasattr(self, "data") else self.rows).groups[0][0])
        return method(self, *args, **kwargs)

    return patched


def _bounded(fn):
    """``fn()`` in a thread, failing the test if it has not ended after RUN_LIMIT seconds."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(RUN_LIMIT)
    assert not thread.is_alive(), (f"the fit or prediction hung (over {RUN_LIMIT} s); where it "
                                   f"waits:\n{_where(thread)}")
    if "error" in out:
        raise out["error"]
    return out["value"]


def _where(thread):
    """The stack of ``thread`` and the state of gpuml's unfinished tasks on the scheduler
    (what a hang report needs)."""
    import traceback

    stack = "".join(traceback.format_stack(sys._current_frames()[thread.ident]))
    try:
        client = distributed.get_client()

        def tasks(dask_scheduler):
            return {str(k): (ts.state, sorted(ws.address for ws in ts.who_has or ()),
                             ts.processing_on.address if ts.processing_on else None)
                    for k, ts in dask_scheduler.tasks.items()
                    if str(k).startswith("gpuml") and ts.state != "memory"}

        state = (f"workers {_workers(client)}; unfinished gpuml tasks "
                 f"{client.run_on_scheduler(tasks)}")
        answers = {}
        asking = threading.Thread(target=lambda: answers.update(client.run(_busy_threads)),
                                  daemon=True)
        asking.start()
        asking.join(20)  # a worker whose event loop is stuck does not answer
        state += f"\nthe workers' busy threads: {answers or 'no answer in 20 s'}"
    except Exception as err:  # noqa: BLE001 - a report, not the test
        state = f"(no scheduler state: {err!r})"
    return f"{stack}\n{state}"


def _busy_threads():
    """The innermost frames of this process's threads that are not waiting (run in a
    worker, for a hang report)."""
    import traceback

    out = {}
    for ident, frame in sys._current_frames().items():
        lines = traceback.format_stack(frame)[-4:]
        if not any(w in lines[-1] for w in ("wait(", "select(", "poll(", "_worker(")):
            out[ident] = "".join(lines)
    return out


def _workers(client):
    """Every worker the scheduler knows now, address to status (running, paused, closing...)."""
    info = client.sync(client.scheduler.identity, n_workers=-1)["workers"]
    return {a: w["status"] for a, w in info.items()}


def _new_worker(client, joined):
    """Start a worker process outside the cluster's nannies; it joins within seconds."""
    joined.append(subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", client.scheduler.address,
         "--nthreads", "1", "--memory-limit", "1GiB", "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def _two_workers(client, joined):
    """Two running workers, whatever an earlier case left: each case starts from them, so a
    case that fails (or a worker that vanished between cases) fails that case alone.

    A killed worker's nanny starts a new one within seconds; a worker closed for good is
    replaced by a new worker process (``python -m distributed.cli.dask_worker``); workers
    that are not running (paused, closing) after that wait are closed, and extra running
    workers (a nanny's restart that came after its replacement) retire.
    """
    deadline = time.monotonic() + 15
    while len(_live(client)) != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = _workers(client)
    running = sorted(a for a, status in workers.items() if status == "running")
    stuck = sorted(set(workers) - set(running))
    if stuck:
        with contextlib.suppress(Exception):
            client.run(_close_for_good, workers=stuck)
    if len(running) > 2:
        client.run(_close_for_good, workers=running[2:])
    for _ in range(2 - len(running)):
        _new_worker(client, joined)
    deadline = time.monotonic() + 90
    while len(_live(client)) != 2 or len(_workers(client)) != 2:
        assert time.monotonic() < deadline, f"no two running workers: {_workers(client)}"
        time.sleep(0.1)


def _same_model(ours, ref):
    np.testing.assert_allclose(ours.centers_, ref.centers_, rtol=1e-12, atol=1e-12)
    if isinstance(ref, CASVMClassifier):
        np.testing.assert_array_equal(ours.partition_sizes_, ref.partition_sizes_)
        np.testing.assert_array_equal(ours.support_, ref.support_)
    else:
        np.testing.assert_array_equal(ours.part_sizes_, ref.part_sizes_)
        np.testing.assert_array_equal(ours.X_fit_, ref.X_fit_)
    np.testing.assert_allclose(ours.dual_coef_, ref.dual_coef_, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("estimator", "method", "phase", "how"), CASES)
def test_lost_worker_gives_the_same_model(cluster, monkeypatch, tmp_path, estimator, method,
                                          phase, how):
    cluster, client, joined = cluster
    _two_workers(client, joined)
    ref, ref_pred = _undisturbed(client, estimator, method)
    X, y = _data(estimator)
    Xd, yd = client.persist([da.from_array(X, chunks=(300, X.shape[1])),
                             da.from_array(y, chunks=300)])
    distributed.wait([Xd, yd])
    assert len(_live(client)) == 2
    lose = _Loser(client, how)
    plugin = None
    if phase in ("fit", "predict"):
        prefix = "gpuml-fit-parts" if phase == "fit" else "gpuml-predict"
        flag = tmp_path / "lost"
        plugin = client.register_plugin(_LoseOnTask(prefix, how, flag), name="lose-on-task")
    elif phase != "between":
        _on_driver(monkeypatch, phase, lose)
    try:
        with warnings.catch_warnings():
            # k-means on actors whose worker was lost runs again as tasks, and says so
            warnings.filterwarnings("ignore", "k-means on Dask actors failed",
                                    RuntimeWarning)
            est = _bounded(lambda: _estimator(estimator, method).fit(Xd, yd))
            if phase == "between":
                lose(est.part_worker_[0])
            predicted = _bounded(lambda: est.predict(Xd).compute())
    finally:
        if plugin is not None:
            with contextlib.suppress(Exception):
                client.unregister_worker_plugin("lose-on-task")
        monkeypatch.undo()
        if how == "close" and (lose.lost or (plugin is not None and flag.exists())):
            _new_worker(client, joined)  # in the next case's wait for two workers
    if plugin is None:
        assert lose.lost, f"no worker was lost at phase {phase!r}"
        assert phase == "between" or not set(lose.lost) & set(est.part_worker_), \
            "part_worker_ names a worker lost before the parts were fitted"
    else:
        assert flag.exists(), f"no worker was lost at phase {phase!r}"
    _same_model(est, ref)
    if estimator == "casvm":
        np.testing.assert_array_equal(predicted, ref_pred)
    else:
        np.testing.assert_allclose(predicted, ref_pred, rtol=1e-9, atol=1e-12)
    if phase == "fit" and how == "kill":
        # killed as its fit task started: that task never returned a part
        assert flag.read_text() not in set(est.part_worker_), \
            "part_worker_ names the worker killed before it fitted a part"


def test_lost_scattered_rows_name_the_worker(cluster, monkeypatch):
    """Rows scattered onto a worker that is then lost cannot be computed again: the fit ends
    at once with an error naming that worker, not Dask's "already forgotten"."""
    cluster, client, joined = cluster
    _two_workers(client, joined)
    X, y = _data("casvm")
    xs = client.scatter([X[i:i + 300] for i in range(0, len(X), 300)])
    ys = client.scatter([y[i:i + 300] for i in range(0, len(y), 300)])
    Xd = da.concatenate([da.from_delayed(f, (300, X.shape[1]), X.dtype) for f in xs])
    yd = da.concatenate([da.from_delayed(f, (300,), y.dtype) for f in ys])
    lose = _Loser(client, "kill")
    _on_driver(monkeypatch, "start", lose)
    try:
        with pytest.raises(gd.LostData, match="cannot compute again") as err:
            _bounded(lambda: _estimator("casvm", "kbalance").fit(Xd, yd))
    finally:
        monkeypatch.undo()
    assert lose.lost and lose.lost[0] in str(err.value)


@pytest.mark.parametrize("estimator", ["casvm", "bkrr"])
def test_lost_kept_parts_with_their_rows_gone_name_the_worker_and_parts(cluster, estimator):
    """Parts kept on a worker that is lost, fitted from rows that Dask cannot compute again
    (scattered, some on that worker): the prediction ends at once with LostParts naming
    the worker and its parts, not Dask's "cancelled", and so does a prediction begun
    afterwards; the parts of the other worker are there still."""
    cluster, client, joined = cluster
    _two_workers(client, joined)
    X, y = _data(estimator)
    xs = client.scatter([X[i:i + 300] for i in range(0, len(X), 300)])
    ys = client.scatter([y[i:i + 300] for i in range(0, len(y), 300)])
    Xd = da.concatenate([da.from_delayed(f, (300, X.shape[1]), X.dtype) for f in xs])
    yd = da.concatenate([da.from_delayed(f, (300,), y.dtype) for f in ys])
    est = _bounded(lambda: _estimator(estimator, "random").fit(Xd, yd))
    victim = est.part_worker_[0]
    parts = [p for p, w in enumerate(est.part_worker_) if w == victim]
    assert 0 < len(parts) < len(est.part_worker_)
    _Loser(client, "kill")(victim)
    named = re.escape(f"{victim}: parts {', '.join(map(str, parts))}")
    with pytest.raises(gd.LostParts, match=named):
        _bounded(lambda: est.predict(X[:50]))
    with pytest.raises(gd.LostParts, match=named):
        _bounded(lambda: est.predict(Xd))
    alive = [f for ids, f in est._kept_parts if ids[0] not in parts]
    assert alive and all(f.status == "finished" for f in alive)


def _hold(n_bytes, dask_worker):
    """Hold ``n_bytes`` of touched memory in this worker process, outside Dask's store (on
    the worker object: this function travels by value, with globals of its own)."""
    dask_worker.test_ballast = np.ones(n_bytes // 8)


def _drop(dask_worker):
    del dask_worker.test_ballast


def _pause(client, address, limit):
    """Push the worker past its pause threshold (80 %) and below the nanny's restart (95 %)
    with memory outside Dask's store; return once the scheduler sees it paused."""
    used = client.run(lambda: __import__("psutil").Process().memory_info().rss)
    client.run(_hold, int(0.87 * limit) - used[address])
    deadline = time.monotonic() + 30
    while address in _live(client):
        assert time.monotonic() < deadline, "the worker did not pause"
        time.sleep(0.1)


def _resume(client, address, limit):
    """Free what :func:`_pause` held; return once the worker runs and its memory as the
    scheduler reports it (what a fit's budget reads) has fallen."""
    client.run(_drop)
    deadline = time.monotonic() + 30
    while address not in _live(client) or client.sync(
            client.scheduler.identity, n_workers=-1)["workers"][address]["metrics"][
                "memory"] > limit // 2:
        assert time.monotonic() < deadline, "the worker did not resume"
        time.sleep(0.1)


def test_worker_paused_for_memory_mid_fit_ends_with_a_clear_error(cluster, monkeypatch):
    """A worker that pauses for memory (``distributed.worker.memory.pause``) in the middle of
    a fit starts no further task: the fit ends with a MemoryError naming it after
    PAUSED_GIVE_UP_S seconds without progress, its tasks cancelled, instead of waiting for
    ever; the same cluster fits once the memory is back."""
    from gpuml.distributed.dask import driver

    # A cluster of its own, one worker; the module's (``cluster``) sends this module's
    # functions by value while it is up.
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                       memory_limit="1GiB", dashboard_address=":0",
                                       silence_logs=50)
    client = distributed.Client(cluster)
    try:
        X, y = _data("casvm")
        Xd, yd = client.persist([da.from_array(X, chunks=(300, X.shape[1])),
                                 da.from_array(y, chunks=300)])
        distributed.wait([Xd, yd])
        address, = _live(client)
        limit = client.scheduler_info()["workers"][address]["memory_limit"]
        est = CASVMClassifier(n_partitions=8, partition="random", random_state=0)
        ref = _bounded(lambda: clone(est).fit(Xd, yd))
        monkeypatch.setattr(driver, "PAUSED_GIVE_UP_S", 3.0)
        original = dask_fit.partition_chunks

        def start(rows, *args, **kwargs):
            _pause(client, address, limit)
            return original(rows, *args, **kwargs)

        monkeypatch.setattr(dask_fit, "partition_chunks", start)
        with pytest.raises(MemoryError, match=r"paused for memory \(tcp://.*memory_limit"):
            _bounded(lambda: est.fit(Xd, yd))
        monkeypatch.setattr(dask_fit, "partition_chunks", original)
        _resume(client, address, limit)
        refit = _bounded(lambda: clone(est).fit(Xd, yd))
        _same_model(refit, ref)
        # A score on Dask input waits for its blocks alike: a paused worker ends it too.
        assert _bounded(lambda: refit.score(Xd, yd)) == ref.score(X, y)
        _pause(client, address, limit)
        with pytest.raises(MemoryError, match=r"paused for memory"):
            _bounded(lambda: refit.score(Xd, yd))
    finally:
        client.close()
        cluster.close()
