"""A CA-SVM model larger than a Dask worker: its parts stay on the workers that fitted them
and prediction goes to them.

A ``LocalCluster`` of six worker processes of one thread each (two for ``quick``;
``memory_limit`` each;
Dask's spilling off: a worker pauses at 80 % of it). The training rows are drawn on the
workers, ``da.random.RandomState(seed).standard_normal((n, d))`` in chunks of
``block`` rows, labelled by a linear score plus a sine term (``x_0 + sin(2 x_1) / 2 >
0``; with ``flip``, that share of the labels drawn at random, so that nearly every row
is a support vector) and persisted; ``CASVMClassifier(random_state=0)`` is fitted on
them and scores 50,000 held-out rows drawn alike (Dask arrays in chunks of 10,000 rows,
one pass; 3,000 for ``quick``), which are then
predicted again (``predict(X).compute()``). After that, outside what is measured, the
model is gathered (``to_local()``) with the held-out rows, the cluster is closed, and
the in-memory model predicts the same rows on the same cores.

Configurations: ``issue`` (1,000,000 x 300 float64 rows, 2.4 GB, workers of 2.2 GB:
about 860,000 support vectors, a model of 2 GB) and ``two_budgets`` (more rows, a
share of the labels flipped, ``partition="contiguous"``, eight workers: a model larger than two
workers' budgets together; contiguous parts move no row between workers, so that a
worker holds its rows and its parts, not the rows it takes from the others as well).
``quick`` runs both on 12,000 rows (a check of the machinery, for the tests).

Reported: the model (support vectors, MB, against the smallest worker's budget); fit,
score and prediction seconds on the cluster and the in-memory prediction's seconds
(load average before and after); the client's peak resident memory above its level
before the fit, through fit, score and prediction, and the largest worker's peak
(bench.bench_dask_memory's sampling); what the fit gathered to the client; whether a
worker restarted; how many of the prediction's tasks that read a group of parts ran away
from it; whether the cluster's predictions equal the in-memory model's.

Run: ``python -m bench.run dask_model`` (the machine otherwise idle: check ``uptime``),
``dask_model:quick``.
"""

from __future__ import annotations

import os
import time

import numpy as np

from bench._harness import record
from bench.bench_dask_memory import Peaks, memory_cluster, smallest_limit, worker_memory

#: worker processes (one thread each), of the full run and the quick one; a configuration
#: may name its own (the model over two budgets: eight workers, so that each holds its
#: rows and its parts within its budget)
WORKERS = {False: 6, True: 2}
#: name: (rows, features, rows per chunk, memory_limit, labels flipped, partition)
CONFIGS = {
    "issue": (1_000_000, 300, 50_000, "2.2GB", 0.0, "auto"),
    "two_budgets": (1_300_000, 300, 50_000, "2.2GB", 0.3, "contiguous", 8),
}
QUICK = {
    "issue": (12_000, 20, 2_000, "1.5GB", 0.0, "auto"),
    "two_budgets": (12_000, 20, 2_000, "1.5GB", 0.3, "contiguous"),
}
#: held-out rows scored, in chunks of this many (a worker holds a chunk of rows, and as
#: many again for the rows its parts judge), and their seed (the training rows' is 11)
TEST_ROWS = {False: 50_000, True: 3_000}
TEST_BLOCK = {False: 10_000, True: 1_000}
TRAIN_SEED, TEST_SEED = 11, 12


def labelled(seed, n, d, block, flip):
    """Rows drawn on the workers and their labels (Dask arrays, not computed)."""
    import dask.array as da

    X = da.random.RandomState(seed).standard_normal((n, d), chunks=(block, d))
    y = (X[:, 0] + 0.5 * da.sin(2.0 * X[:, 1]) > 0).astype(np.int64)
    if flip:
        noise = da.random.RandomState(seed + 100).random_sample(n, chunks=block)
        coin = da.random.RandomState(seed + 200).randint(0, 2, n, chunks=block)
        y = da.where(noise < flip, coin, y)
    return X, y


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _away(stream, holders) -> int:
    """Tasks of ``stream`` that read a group of parts (its values, the blend's candidates)
    and ran on another worker than the group's (``holders``: each group's workers)."""
    from gpuml.distributed.dask.kept import GROUP_STEPS, KEY_PREFIX

    steps = tuple(f"{KEY_PREFIX}-predict-{step}-" for step in GROUP_STEPS)
    return sum(1 for task in stream if str(task["key"]).startswith(steps)
               and task["worker"] not in holders[int(str(task["key"]).rsplit("-", 1)[1])])


def run(name, config, test_rows, workers=WORKERS[False], test_block=TEST_BLOCK[False]):
    """One configuration on a fresh cluster of ``workers``: its row of measures."""
    import distributed
    import psutil

    from gpuml import CASVMClassifier
    from gpuml.distributed.dask import counting, workers_and_budget

    n, d, block, limit, flip, partition = config[:6]
    workers = config[6] if len(config) > 6 else workers
    me = psutil.Process()
    load_before = _load()
    cluster, client = memory_cluster(workers, limit)
    try:
        limit_bytes = smallest_limit(client)
        _, budget = workers_and_budget(client)
        pids = client.run(os.getpid)
        X, y = client.persist(list(labelled(TRAIN_SEED, n, d, block, flip)))
        Xt, yt = client.persist(list(labelled(TEST_SEED, test_rows, d, test_block, flip)))
        distributed.wait([X, y, Xt, yt])
        base = me.memory_info().rss
        clf = CASVMClassifier(random_state=0, partition=partition)
        with Peaks(lambda: {"client": me.memory_info().rss - base}) as client_peak, \
                Peaks(lambda: worker_memory(client)) as worker_peak, counting() as traffic:
            t0 = time.perf_counter()
            clf.fit(X, y)
            fit_s = time.perf_counter() - t0
            holders = client.who_has([future for _, future in clf._kept_parts])
            holders = [set(holders[future.key]) for _, future in clf._kept_parts]
            with distributed.get_task_stream(client) as scoring:
                t0 = time.perf_counter()
                score = clf.score(Xt, yt)
                score_s = time.perf_counter() - t0
            with distributed.get_task_stream(client) as predicting:
                t0 = time.perf_counter()
                predicted = clf.predict(Xt).compute()
                predict_s = time.perf_counter() - t0
        restarted = client.run(os.getpid) != pids
        n_sv = int(clf.n_support_.sum())
        model_bytes = clf._support_bytes()
        # Outside what is measured: the whole model and the held-out rows to this process.
        local = clf.to_local()
        X_test, y_test = client.gather(client.compute([Xt, yt]))
    finally:
        client.close()
        cluster.close()
    t0 = time.perf_counter()
    local_predicted = local.predict(X_test)
    local_s = time.perf_counter() - t0
    return {
        "config": name, "workers": workers, "n": n, "d": d, "data_MB": n * d * 8 / 1e6,
        "partition": clf.partition_, "labels_flipped": flip, "n_partitions": clf.n_partitions_,
        "n_SV": n_sv, "model_MB": model_bytes / 1e6,
        "memory_limit_MB": limit_bytes / 1e6, "worker_budget_MB": (budget or 0) / 1e6,
        "model_over_two_budgets": bool(budget and model_bytes > 2 * budget),
        "fit_s": fit_s, "score_s": score_s, "dask_predict_s": predict_s,
        "local_predict_s": local_s, "score_over_local": score_s / local_s,
        "dask_score": score, "local_score": float(np.mean(local_predicted == y_test)),
        "same_predictions": bool(np.array_equal(predicted, local_predicted)),
        "n_differ": int(np.sum(predicted != local_predicted)),
        "client_peak_MB": client_peak.peak.get("client", 0) / 1e6,
        "worker_peak_MB": max(worker_peak.peak.values()) / 1e6,
        "fit_gathered_MB": traffic[0].gathered / 1e6, "workers_restarted": restarted,
        "group_tasks_away_score": _away(scoring.data, holders),
        "group_tasks_away_predict": _away(predicting.data, holders),
        "load_before": load_before, "load_after": _load(),
    }


def main(quick: bool = False, gpu: bool = False):
    configs = QUICK if quick else CONFIGS
    rows = []
    for name, config in configs.items():
        rows.append(run(name, config, TEST_ROWS[quick], WORKERS[quick], TEST_BLOCK[quick]))
        print(rows[-1], flush=True)
    notes = (
        f"{WORKERS[quick]} worker processes of one thread (a configuration's own where the "
        "workers column says so), each with the memory_limit given "
        "(Dask's spilling off: a worker pauses at 80 % of it), a fresh cluster per "
        "configuration. Rows drawn on the workers with da.random.RandomState(11)."
        "standard_normal((n, d)), labels x_0 + sin(2 x_1) / 2 > 0 (labels_flipped: that "
        "share drawn at random), persisted; CASVMClassifier(random_state=0, partition=...) "
        f"fitted, then score and predict on {TEST_ROWS[quick]:,} held-out rows drawn alike "
        f"(RandomState(12); chunks of {TEST_BLOCK[quick]:,} rows), Dask arrays. model_MB: "
        "the support vectors with their "
        "coefficients and indices, kept on the workers; worker_budget_MB: the smallest "
        "worker's budget (memory_limit x 0.8 less what it holds besides Dask's data). "
        "client_peak_MB: this process's peak resident memory above its level before the "
        "fit, through fit, score and predict; worker_peak_MB: the largest worker's peak "
        "(heartbeat figures), both sampled every 0.2 s. fit_gathered_MB: what the fit "
        "gathered to the client. local_predict_s: to_local()'s in-memory model predicting "
        "the same rows after the cluster closed, on the same cores; same_predictions: the "
        "cluster's predictions equal it (n_differ rows differ). group_tasks_away_*: the "
        "prediction's tasks that read a group of parts and ran on another worker than the "
        "group's (score: restricted to it by gpuml; predict: a Dask array computed as "
        "is, placed by Dask's scheduler). load_before/after: the "
        "machine's load average (1, 5, 15 min) before the cluster started and after the "
        "cluster's measures.")
    record("dask_model" + ("_quick" if quick else ""), rows,
           title="A CA-SVM model larger than a Dask worker: kept on the workers, predicted "
                 "there", notes=notes)
    return rows
