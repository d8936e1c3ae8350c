"""Data larger than any one Dask worker's memory: ``CASVMClassifier()`` and ``BKRRRegressor()``
fitted and scored on it.

A ``LocalCluster`` of six worker processes (one thread each), each with a
``memory_limit`` below the size of the training data, so that the data fits on
no single worker; the data are made by tasks on the workers
(:func:`bench.datasets.latent_rows`: wide rows on a 6-dimensional manifold; a class
for CA-SVM, the latent value itself for BKRR) and never exist on the client. Each
estimator (its defaults) is fitted on them, then ``score`` runs on a held-out Dask set
(each block scored where it lies; a few sums per block come back). A BKRR model holds
every training row: after the Dask fit its parts stay on the workers, and its
prediction goes to them. After the cluster is closed, the same estimator fits the same
rows held in this process, its model is compared with the Dask fit's, and it scores
the same held-out rows (CA-SVM's predictions compared; BKRR's, gathered from the
cluster before it closed, too).

Reported: fit and score seconds of each; the client's peak resident memory
above its level before the fit (sampled every 0.2 s); each worker's peak
resident memory (the scheduler's heartbeat figures, sampled alike) against its
``memory_limit``; what the client sent and gathered (the driver's
:class:`gpuml.distributed.dask.Traffic`); whether any worker restarted; the two
models' support vectors (CA-SVM) and scores.

Run: ``python -m bench.run dask_memory`` (1,000,000 x 300 float64 training rows,
2.4 GB, workers of 2.2 GB; 50,000 held-out rows), ``dask_memory:quick`` (200,000 x 100,
160 MB, workers of 1.2 GB: a check of the machinery only). A worker holds about 0.5 GB
once gpuml has fitted there (its libraries and compiled code), before any data.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from bench._harness import record
from bench.datasets import latent_dask, latent_rows

WORKERS = 6
#: (training rows, features, rows per block, memory_limit of each worker)
FULL = (1_000_000, 300, 50_000, "2.2GB")
QUICK = (200_000, 100, 25_000, "1.2GB")
#: held-out rows scored
TEST_ROWS = {False: 50_000, True: 25_000}


class Peaks:
    """The peak of ``read()`` (a dict of name -> bytes) sampled every ``period`` s."""

    def __init__(self, read, period=0.2):
        self.read, self.period, self.peak = read, period, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                for k, v in self.read().items():
                    self.peak[k] = max(self.peak.get(k, 0), v)
            except Exception:  # noqa: BLE001 - a sample lost while the cluster is busy
                pass
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


def memory_cluster(n_workers, memory_limit):
    """A fresh ``LocalCluster`` of ``n_workers`` one-thread worker processes with
    ``memory_limit`` each and Dask's spilling off (a worker pauses at 80 % and is
    restarted at 95 % of its limit), and its client."""
    import dask
    import distributed

    with dask.config.set({"distributed.worker.memory.spill": False,
                          "distributed.worker.memory.target": False}):
        cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1,
                                           processes=True, memory_limit=memory_limit,
                                           dashboard_address=":0", silence_logs=40)
    return cluster, distributed.Client(cluster)


def worker_memory(client) -> dict:
    """Each worker's resident memory as the scheduler's last heartbeat reports it."""
    info = client.scheduler_info()["workers"]
    return {a: w["metrics"]["memory"] for a, w in info.items()}


def smallest_limit(client) -> int:
    """The smallest ``memory_limit`` among the workers, in bytes."""
    return min(w["memory_limit"] for w in client.scheduler_info()["workers"].values())


ESTIMATORS = ("casvm", "bkrr")


def _in_memory(n_blocks, rows, n_features, first_block=0, regression=False):
    """The blocks :func:`latent_dask` makes on the workers, made here."""
    X = np.empty((n_blocks * rows, n_features))
    y = np.empty(n_blocks * rows, dtype=np.float64 if regression else np.int64)
    for b in range(n_blocks):
        X[b * rows:(b + 1) * rows], y[b * rows:(b + 1) * rows] = latent_rows(
            first_block + b, rows, n_features, regression)
    return X, y


def _fit_and_score(kind, X, y, X_test, y_test):
    """The estimator's defaults fitted and scored: the model, fit seconds, score (accuracy
    or R²), score seconds."""
    from gpuml import BKRRRegressor, CASVMClassifier

    t0 = time.perf_counter()
    model = (CASVMClassifier() if kind == "casvm" else BKRRRegressor()).fit(X, y)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    score = model.score(X_test, y_test)
    return model, fit_s, score, time.perf_counter() - t0


def _on_dask(kind, n, d, block, limit, quick):
    """One estimator fitted and scored on a fresh cluster: its row of measures (Dask side)
    and what the in-process side compares (the model's arrays, gathered; held-out
    predictions)."""
    import psutil

    from gpuml.distributed.dask import counting

    me = psutil.Process()
    regression = kind == "bkrr"
    cluster, client = memory_cluster(WORKERS, limit)
    try:
        limit_bytes = smallest_limit(client)
        pids = client.run(os.getpid)
        X, y = latent_dask(n // block, block, d, regression=regression)
        X_test, y_test = latent_dask(TEST_ROWS[quick] // block, block, d, first_block=10_000,
                                     regression=regression)

        base = me.memory_info().rss
        with Peaks(lambda: {"client": me.memory_info().rss - base}) as client_peak, \
                Peaks(lambda: worker_memory(client)) as worker_peak, counting() as traffic:
            model, fit_s, score, score_s = _fit_and_score(kind, X, y, X_test, y_test)
        restarted = client.run(os.getpid) != pids
        tr = traffic[0]
        row = {"estimator": kind, "n": n, "d": d, "data_MB": n * d * 8 / 1e6,
               "workers": WORKERS, "memory_limit_MB": limit_bytes / 1e6,
               "n_partitions": int(model.n_partitions_), "dask_fit_s": fit_s,
               "dask_score_s": score_s, "dask_score": score,
               "client_peak_MB": client_peak.peak.get("client", 0) / 1e6,
               "worker_peak_MB": max(worker_peak.peak.values()) / 1e6,
               "gathered_MB": tr.gathered / 1e6, "sent_MB": tr.sent / 1e6,
               "rows_moved": int(tr.rows_moved), "workers_restarted": restarted}
        if kind == "casvm":
            row["model_MB"] = model.support_vectors_.nbytes / 1e6
            kept = {"support": model.support_, "dual_coef": model.dual_coef_,
                    "sizes": model.partition_sizes_}
        else:
            row["model_MB"] = (model.X_fit_.nbytes + model.dual_coef_.nbytes) / 1e6
            # the held-out predictions, computed where the parts are (50,000 values back)
            kept = {"sizes": model.part_sizes_, "intercept": model.intercept_,
                    "predicted": model.predict(X_test).compute()}
        return row, kept
    finally:
        client.close()
        cluster.close()


def main(quick: bool = False, gpu: bool = False):
    n, d, block, limit = QUICK if quick else FULL
    rows = []
    for kind in ESTIMATORS:
        row, kept = _on_dask(kind, n, d, block, limit, quick)
        # The same rows, made again in this process (the blocks are deterministic): the
        # baseline, once the cluster is gone. (Computing the Dask arrays would gather
        # them on a worker first.)
        regression = kind == "bkrr"
        Xm, ym = _in_memory(n // block, block, d, regression=regression)
        Xt, yt = _in_memory(TEST_ROWS[quick] // block, block, d, first_block=10_000,
                            regression=regression)
        local, local_fit_s, local_score, local_score_s = _fit_and_score(kind, Xm, ym, Xt, yt)
        sizes = local.partition_sizes_ if kind == "casvm" else local.part_sizes_
        row.update({"local_fit_s": local_fit_s, "fit_ratio": row["dask_fit_s"] / local_fit_s,
                    "local_score_s": local_score_s, "local_score": local_score,
                    "same_part_sizes": bool(np.array_equal(kept["sizes"], sizes))})
        if kind == "casvm":
            row["same_model"] = bool(np.array_equal(kept["support"], local.support_)
                                     and np.allclose(kept["dual_coef"], local.dual_coef_,
                                                     rtol=1e-9, atol=1e-12))
            row["n_SV"], row["local_n_SV"] = len(kept["support"]), len(local.support_)
        else:
            row["same_model"] = bool(np.allclose(kept["predicted"], local.predict(Xt),
                                                 rtol=1e-6, atol=1e-8))
        del Xm, ym, local
        rows.append(row)
        print(row, flush=True)
    notes = (
        f"Training data made on the workers ({n:,} rows x {d} float64 features, "
        f"{n * d * 8 / 1e6:.0f} MB; bench.datasets.latent_rows: a class for CA-SVM, the "
        f"latent value for BKRR), {WORKERS} worker processes of one thread, each with "
        f"memory_limit {limit} (Dask's spilling off: a worker pauses at 80 % and is "
        "restarted at 95 % of it), a fresh cluster per estimator. dask_score, local_score: "
        f"accuracy (CA-SVM) or R² (BKRR) on {TEST_ROWS[quick]:,} held-out rows made the "
        "same way. local_*: the same estimator on the same rows held in this process "
        "after the cluster closed; same_model: CA-SVM the same support vectors and "
        "coefficients, BKRR the same held-out predictions within 1e-6 (the Dask model's "
        "computed where its parts are kept); same_part_sizes: the same part sizes. "
        "model_MB: CA-SVM's support vectors; BKRR's training rows and coefficients, which "
        "stay on the workers. client_peak_MB: this process's peak resident memory above "
        "its level before the Dask fit; worker_peak_MB: the largest worker's peak "
        "(heartbeat figures, sampled every 0.2 s), both over fit and score; gathered/sent: "
        "what the fit's client gathered from and sent to the workers (the split's sums, "
        "the fill's distances, the labels, and CA-SVM's parts with their support vectors, "
        "BKRR's parts' intercepts; the score's few sums per block are not counted). "
        "workers_restarted: whether any worker process was replaced.")
    record("dask_memory" + ("_quick" if quick else ""), rows,
           title="Data larger than a Dask worker's memory: CASVMClassifier() and "
                 "BKRRRegressor() fit and scored",
           notes=notes)
    return rows
