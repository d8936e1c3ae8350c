"""Fit time on 1 and 2 Dask workers, and the bytes each fit moves against the cost model.

CA-SVM P=16 on adult (36,631 training rows x 108, and its first 20,000), with the
default FCFS split and with ``partition="contiguous"`` (You 2020's casvm2: each part
the rows as they lie, here in the random order of the train/test split, so nothing is
partitioned and no row moves), and BKRR2 P=16 (K-balance) on
california housing (15,480 x 8), each fitted on a ``LocalCluster`` of one and
of two worker processes, one thread each, BLAS/OpenMP/numba pinned to one
thread in the workers (checked with threadpoolctl and reported). Both clusters
are up at once in this process, on the same data, persisted on their workers
before the timed fits (in a real cluster the data is loaded there: here each
chunk's rows and targets on one worker, half of the chunks on each), and their
fits alternate, so that the drift of this shared machine's speed over a minute
falls on both alike. While one cluster fits, the other's worker processes are
stopped (SIGSTOP, then SIGCONT): idle, they still wake every few milliseconds
(heartbeats, the profiler), which slows the 2-worker fit on two cores (measured:
bench/results/cpu-2core/dask-runs.md, "Method") — a cost of measuring two
clusters, not of one.

Both clusters run with Dask's own periodic work made rarer (:data:`QUIET`: the
event-loop probe every scheduler, nanny and worker runs every 20 ms, the
nannies' memory monitor every 100 ms, the system monitor every 500 ms, the
workers' profiler every 10 ms). With the defaults that work takes a share of the
two cores while both workers of a 2-worker cluster compute (:func:`quiet_ab`
measures it); a machine with a core to spare runs it there. What the fits gain
from it: docs/scale-out.md and bench/results/cpu-2core/dask-runs.md.

Bytes moved per fit, counted three ways and added:

* what the client sent in task arguments and gathered back (the driver's
  count in :class:`gpuml.distributed.dask.Traffic`: ``nbytes`` of arrays,
  the pickle of anything else);
* what the workers fetched from each other during the fit (each worker's
  ``transfer_incoming_log``, sizes as distributed estimates them).

The model (docs/scale-out.md, "What moves over the network"), with n rows, d
features, K chunks, W workers of which H hold chunks (one task each for the
small steps), P parts, I Lloyd steps (counted by the driver):

* partitioning: per Lloyd step the P x d centres to each worker's task and
  P x (d + 1) sums and counts back per chunk, ``8 (H P d + K P (d + 1))``;
  k-means++ (P picks, on one actor per worker: each chunk's total back, the
  picked row to the client and on to the H actors) ``8 P ((H + 1) d + K)``;
  the fill: when it runs on the client (P <= d) the centres to each worker's
  task, ``8 H P d``, and the n x P distances back, ``8 n P`` (FCFS: and its P
  seed rows, ``8 P d``); the chain (P > d): the centres to each link, at most
  ``8 K P d`` (one per chunk as tasks, one per run of chunks on a worker on
  actors: modelled as K);
* labels: made on the workers (k-means; the fill's chain when P > d), to the
  client, ``8 n``; from the client (all splits) to the tasks that cut out each of
  the G groups of parts, ``8 n G`` (``8 n`` when no row moves); CA-SVM: and y in the
  summary pass, ``8 n``;
* the part means: each group's fit task sums its parts' rows and returns the
  sums and counts with its fits, ``8 P (d + 1)`` (k-means too, though its centres
  are the last Lloyd step's);
* rows shipped once to their part's worker: ``8 r (d + 2)`` for CA-SVM (a row, its
  class and its C), ``8 r (d + 1)`` for BKRR, r the rows of parts placed on another
  worker than theirs (the placement's count; about ``n (W - 1) / W`` for parts spread
  over all chunks as FCFS and K-balance make them, none for ``"contiguous"`` parts
  that lie on one worker each);
* the parts' training indices, from the client to the fit tasks (CA-SVM), ``8 n``;
* the parts stay on the workers: each part's summary back, CA-SVM
  ``8 (4 n_pairs + n_classes)`` and about 640 bytes of pickle, BKRR its intercept.

Targets (issue 12): the 2-worker CA-SVM fit at least 1.6x faster than the
1-worker fit, counted traffic within 2x of the model.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from contextlib import contextmanager

from bench._harness import record
from bench.datasets import load_adult, load_california, train_test_split_std
from gpuml.distributed.dask import counting, fills_on_client

#: Pinned in every worker before it starts (distributed's pre-spawn environment).
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "NUMBA_NUM_THREADS": "1"}
N_CHUNKS = 8
#: Dask's own periodic work, made rarer in both clusters (see the module notes): the
#: event-loop probe every server (scheduler, nannies, workers) runs, the nannies' memory
#: monitor, the system monitor and the workers' profiler.
QUIET = {"distributed.admin.tick.interval": "1s",
         "distributed.admin.system-monitor.interval": "5s",
         "distributed.worker.memory.monitor-interval": "1s",
         "distributed.worker.profile.enabled": False}


def _cluster(n_workers, quiet=True):
    import dask
    from distributed import Client, LocalCluster

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}), **THREAD_ENV)
    config = {"distributed.nanny.pre-spawn-environ": environ, **(QUIET if quiet else {})}
    # dashboard_address=":0": a free port; None would still listen on 8787 (no dashboard pages).
    with dask.config.set(config):
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               memory_limit="6GiB", dashboard_address=":0", silence_logs=40)
    return cluster, Client(cluster)


def _worker_threads(client) -> str:
    """The BLAS/OpenMP thread counts each worker reports (threadpoolctl), and numba's."""

    def probe():
        import numba
        from threadpoolctl import threadpool_info

        pools = sorted({f"{p['internal_api']}={p['num_threads']}" for p in threadpool_info()})
        return ",".join(pools + [f"numba={numba.config.NUMBA_NUM_THREADS}"])

    return ";".join(sorted(set(client.run(probe).values())))


def _clear_transfer_logs(client) -> None:
    """Empty each worker's log of incoming transfers (before a timed fit)."""
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())


def _between_workers(client) -> int:
    """Bytes the workers fetched from each other since :func:`_clear_transfer_logs`.

    From each worker's log of incoming transfers (peer to peer only: a client's
    gather is not in it), sizes as distributed estimates them (``nbytes`` of arrays).
    The log is emptied before each fit rather than filtered by time: its times are
    shifted by the worker's estimate of the scheduler's clock offset, which a worker
    stopped and resumed (see :func:`_stopped`) can get wrong by more than a fit's
    length, and then a fit's transfers fall outside its window
    (bench/results/cpu-2core/dask-runs.md, "Method").
    """

    def incoming(dask_worker):
        return sum(e["total"] for e in dask_worker.transfer_incoming_log)

    return int(sum(client.run(incoming).values()))


#: The pickle of a part's summary beside its arrays (the driver counts the pickle).
SUMMARY_PICKLE_BYTES = 640


def _model_bytes(est, traffic, n, d, K, W, kind):
    """Bytes the cost model of docs/scale-out.md predicts for this fit."""
    P = len(est.partition_sizes_) if kind == "svm" else est.n_partitions_
    partition = getattr(est, "partition_", est.partition)
    total = 0.0
    groups = len(set(est.part_worker_))
    H = traffic.groups
    if partition in ("kmeans", "kbalance"):
        I = traffic.steps + 1  # the Lloyd steps, and the first assignment
        total += 8 * (H * P * d + K * P * (d + 1)) * I
        total += 8 * P * ((H + 1) * d + K)
    on_client = partition in ("random", "contiguous") or (partition in ("fcfs", "kbalance")
                                                          and fills_on_client(P, d))
    if partition in ("fcfs", "kbalance"):
        # the fill: the centres out, and the distances back when it runs on the client
        total += 8 * H * P * d + 8 * n * P if on_client else 8 * K * P * d
    if partition == "fcfs":
        total += 8 * P * d  # the seed rows
    total += 8 * P * (d + 1)  # the part sums, back with the fits (k-means too)
    # the labels: each fit task's and each take task's worker's (every row's, per group),
    # only the fit tasks' when no row moves (contiguous parts on their workers)
    total += 8 * n * ((1 if traffic.rows_moved == 0 else groups) + (0 if on_client else 1))
    total += 8 * n if kind == "svm" else 0  # y in the summary pass
    # the rows of parts placed away from them (about n (W - 1) / W when parts are spread
    # over every worker's chunks, FCFS and K-balance; none for contiguous parts)
    total += 8 * traffic.rows_moved * (d + (2 if kind == "svm" else 1))
    if kind == "svm":
        n_pairs = est.pair_status_.shape[1]
        total += 8 * n  # the parts' training indices, to the fit tasks
        total += P * (8 * (4 * n_pairs + len(est.classes_)) + SUMMARY_PICKLE_BYTES)
    else:
        total += 8 * P * est.intercept_[0].size
    return total


@contextmanager
def _stopped(pids):
    """The processes ``pids`` stopped for the block (the idle cluster's workers), and given
    a moment after it to catch up on their timers before anything is timed on them."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.2)


def _two_core_ceiling(client, make, X, y, repeat):
    """What two workers can gain at most on this machine, with Dask's partitioning and
    shipping out of the way.

    The whole in-process fit (BLAS one thread) runs as one task in a worker of the
    2-worker cluster (its executor thread, as the parts' fit tasks), alone and then in
    both workers at once, alternately, each timed by its own clock: ``2 x alone /
    side by side`` is the throughput of two cores for this work, the workers' own
    threads, memory bandwidth and the shared L3 cache included.
    """
    def fit(X, y):
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):
            t0 = time.perf_counter()
            make().fit(X, y)
            return time.perf_counter() - t0

    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    data = {w: client.scatter([X, y], workers=[w], broadcast=False) for w in workers}

    def run(on):
        return client.gather([client.submit(fit, *data[w], workers=[w],
                                            allow_other_workers=False, pure=False)
                              for w in on])

    run(workers)  # warm-up
    alone, both = [], []
    for _ in range(repeat):
        alone.append(run(workers[:1])[0])
        both.append(statistics.mean(run(workers)))
    return 2 * statistics.median(alone) / statistics.median(both)


def _phases(client, stream, t0, t1):
    """Where one fit's time went, from its task stream (``t0``, ``t1``: its start and end,
    ``time.time()``): before the first fit task starts (checks, summaries, partitioning,
    the rows' take and transfer), the fit tasks' window (first start to last stop), and
    after it (the last group's fitted parts gathered and the model assembled), and the
    tail: from the first fit task's end to the last's (the time one worker waits for the
    other: the groups' costs as estimated are balanced, their times are not)."""
    # A worker shifts its times by its estimate of the scheduler's clock offset
    # (milliseconds of noise here); one machine, one clock: take it back out.
    shift = client.run(lambda dask_worker: dask_worker.scheduler_delay)
    spans = [(s["start"] - shift[task["worker"]], s["stop"] - shift[task["worker"]])
             for task in stream.data if str(task["key"]).startswith("gpuml-fit-")
             for s in task["startstops"] if s["action"] == "compute"]
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    return first - t0, last - first, t1 - last, last - min(b for _, b in spans)


def _spread(client, X, y):
    """X and y persisted in :data:`N_CHUNKS` row chunks, chunk k's rows and its targets on
    one worker, the first half of the chunks on the first worker and the rest on the
    second: the layout of a data set each worker loaded its share of (the columns of a
    dataframe's partition stay together). Left to itself the scheduler placed the two
    arrays apart (``persist`` of ``from_array`` chunks: 5 and 3 chunks of X on the two
    workers in some runs, 4 and 4 in others, and 5 of the 8 targets away from their
    rows), a coin flip that changed each fit's work by a take and transfers."""
    import dask.array as da
    from distributed import wait

    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    n = X.shape[0]
    chunk = -(-n // N_CHUNKS)
    xs, ys = [], []
    for k, a in enumerate(range(0, n, chunk)):
        on = [workers[k * len(workers) // N_CHUNKS]]
        xs.append(client.persist(da.from_array(X[a:a + chunk], chunks=-1), workers=on))
        ys.append(client.persist(da.from_array(y[a:a + chunk], chunks=-1), workers=on))
    Xd, yd = client.persist([da.concatenate(xs), da.concatenate(ys)])
    wait([Xd, yd])
    return Xd, yd


def _hop_ms(client, repeat=20, length=6):
    """Milliseconds a step costs beyond its work on this cluster (medians over chains of
    ``length`` tiny dependent tasks): handed from worker to worker (alternating when
    there are two) by the scheduler, and through the client (submit, wait, fetch)."""
    import numpy as np

    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])

    def step(previous):
        return np.zeros(16)

    def chain(via_client):
        t0 = time.perf_counter()
        previous = None
        for i in range(length):
            future = client.submit(step, previous, workers=[workers[i % len(workers)]],
                                   pure=False)
            previous = future.result() if via_client else future
        if not via_client:
            previous.result()
        return (time.perf_counter() - t0) / length * 1e3

    for _ in range(3):
        chain(False), chain(True)
    return (statistics.median(chain(False) for _ in range(repeat)),
            statistics.median(chain(True) for _ in range(repeat)))


def _case_rows(name, make, X, y, Xtest, ytest, kind, repeat):
    """Both clusters up at once, their fits alternating (1, 2, 2, 1, 1, 2, ...): on a shared
    machine whose speed drifts over a minute, each pair of fits sees the same drift. The
    cluster not being timed has its worker processes stopped (see the module notes)."""
    from distributed import get_task_stream
    from threadpoolctl import threadpool_limits

    n, d = X.shape
    clusters = {}
    try:
        for W in (1, 2):
            cluster, client = clusters[W] = _cluster(W)
            Xd, yd = _spread(client, X, y)
            clusters[W] = (cluster, client, Xd, yd)
        runs = {W: {"seconds": [], "counted": [], "modelled": [], "driver": [], "phases": []}
                for W in (1, 2)}
        threads, est = {}, {}
        # each cluster's worker processes, stopped while the other cluster is timed
        pids = {W: sorted(c[1].run(os.getpid).values()) for W, c in clusters.items()}
        for W, (_, client, Xd, yd) in clusters.items():
            threads[W] = _worker_threads(client)
            with client.as_current():
                make().fit(Xd, yd)  # warm-up: imports and numba's cached kernels in every worker
        for i in range(repeat):
            for W in ((1, 2) if i % 2 == 0 else (2, 1)):
                _, client, Xd, yd = clusters[W]
                r = runs[W]
                _clear_transfer_logs(client)
                # get_task_stream only reads the scheduler's log when it exits, after the clock
                with _stopped(pids[3 - W]), get_task_stream(client) as stream, \
                        client.as_current(), counting() as fits:
                    start, t0 = time.time(), time.perf_counter()
                    est[W] = make().fit(Xd, yd)
                    r["seconds"].append(time.perf_counter() - t0)
                    end = start + r["seconds"][-1]
                r["phases"].append(_phases(client, stream, start, end))
                between = _between_workers(client)
                tr, = fits
                r["counted"].append(tr.sent + tr.gathered + between)
                r["driver"].append((tr.sent, tr.gathered, between, tr.steps))
                r["modelled"].append(_model_bytes(est[W], tr, n, d, N_CHUNKS, W, kind))
        hops = {}
        for W, c in clusters.items():
            with _stopped(pids[3 - W]):
                hops[W] = _hop_ms(c[1])
        with _stopped(pids[1]):
            ceiling = _two_core_ceiling(clusters[2][1], make, X, y, max(3, repeat // 3))
    finally:
        for cluster, client, *_ in clusters.values():
            client.close()
            cluster.close()
    rows = {}
    for W, r in runs.items():
        rows[W] = {"fit_s": statistics.median(r["seconds"]), "fit_min_s": min(r["seconds"]),
                   "phases": [statistics.median(p) for p in zip(*r["phases"])],
                   "counted_MB": statistics.median(r["counted"]) / 1e6,
                   "model_MB": statistics.median(r["modelled"]) / 1e6,
                   "driver": r["driver"][-1], "threads": threads[W],
                   "score": est[W].score(Xtest, ytest)}
    # the speed-up of each pair of fits run one after the other
    paired = statistics.median(a / b for a, b in zip(runs[1]["seconds"], runs[2]["seconds"]))
    with threadpool_limits(1):
        make().fit(X[:2000], y[:2000])
        t0 = time.perf_counter()
        local = make().fit(X, y)
        in_process = time.perf_counter() - t0
    out = []
    for W in (1, 2):
        r = rows[W]
        sent, gathered, between, steps = r["driver"]
        out.append({
            "case": name, "n": n, "d": d, "workers": W, "fit_s": r["fit_s"],
            "fit_min_s": r["fit_min_s"], "speedup_vs_1": rows[1]["fit_s"] / r["fit_s"],
            "pre_fit_s": r["phases"][0], "fit_tasks_s": r["phases"][1],
            "post_fit_s": r["phases"][2], "tail_s": r["phases"][3], "hop_ms": hops[W][0],
            "client_trip_ms": hops[W][1],
            "paired_speedup": paired if W == 2 else 1.0,
            "two_core_ceiling": ceiling if W == 2 else 1.0,
            "in_process_1thread_s": in_process, "lloyd_steps": steps,
            "client_sent_MB": sent / 1e6, "client_gathered_MB": gathered / 1e6,
            "between_workers_MB": between / 1e6, "counted_MB": r["counted_MB"],
            "model_MB": r["model_MB"], "counted_over_model": r["counted_MB"] / r["model_MB"],
            "score": r["score"], "score_in_process": local.score(Xtest, ytest),
            "worker_threads": r["threads"]})
    return out


def _busy(seconds):
    """Matrix products for ``seconds`` in the worker's thread: its CPU time, and the CPU
    time its process spent meanwhile in its other threads (event loop, profiler)."""
    import numpy as np
    import psutil

    proc, w0, t0 = psutil.Process(), time.perf_counter(), time.thread_time()
    c0 = sum(proc.cpu_times()[:2])
    a = np.random.default_rng(0).random((200, 200))
    while time.perf_counter() - w0 < seconds:
        a = a @ a
        a /= a.max()
    mine = time.thread_time() - t0
    return mine, sum(proc.cpu_times()[:2]) - c0 - mine


def _both_busy(client, seconds):
    return client.gather([client.submit(_busy, seconds, workers=[w], pure=False)
                          for w in sorted(client.scheduler_info(n_workers=-1)["workers"])])


def quiet_ab(rounds: int = 12, n: int = 20000) -> None:
    """What Dask's own periodic work costs on these two cores, default against
    :data:`QUIET` (printed; docs/scale-out.md quotes it).

    1. The CPU time each process spends beside the work while both workers of a
       2-worker cluster compute for 4 s: the main process (the scheduler, the client
       and the nannies: LocalCluster runs them all there) and each worker's threads
       other than the one computing (measured in the worker; clock ticks of 10 ms).
    2. CA-SVM P=16 ``partition="contiguous"`` on adult's first ``n`` rows on four
       clusters (1 and 2 workers, default and quiet) up at once, fits alternating
       (the three others stopped), ``rounds`` rounds: medians and speed-ups.

    Run: ``python -c "from bench.bench_dask import quiet_ab; quiet_ab()"``.
    """
    import psutil

    from gpuml import CASVMClassifier

    for quiet in (False, True):
        cluster, client = _cluster(2, quiet=quiet)
        try:
            main = psutil.Process()
            _both_busy(client, 0.5)  # warm-up
            before = sum(main.cpu_times()[:2])
            done = _both_busy(client, 4.0)
            used = {"main": sum(main.cpu_times()[:2]) - before}
            used.update({f"worker{i}": other for i, (_, other) in enumerate(done)})
            print(("quiet  " if quiet else "default"), "CPU ms beside two workers' 4 s of work:",
                  {k: round(v * 1e3) for k, v in used.items()},
                  f"total {sum(used.values()) * 1e3:.0f} ms")
        finally:
            client.close()
            cluster.close()
    Xa, ya = load_adult()
    Xa, _, ya, _ = train_test_split_std(Xa, ya, test_size=0.25, random_state=0)
    X, y = Xa[:n], ya[:n]

    def make():
        return CASVMClassifier(n_partitions=16, partition="contiguous", random_state=0)

    keys = [(1, False), (2, False), (1, True), (2, True)]
    clusters, pids, times = {}, {}, {k: [] for k in keys}
    try:
        for key in keys:
            cluster, client = _cluster(key[0], quiet=key[1])
            clusters[key] = (cluster, client, *_spread(client, X, y))
            pids[key] = sorted(client.run(os.getpid).values())
        for i in range(rounds + 1):
            for key in (keys if i % 2 == 0 else keys[::-1]):
                _, client, Xd, yd = clusters[key]
                others = [p for k, v in pids.items() if k != key for p in v]
                with _stopped(others), client.as_current():
                    t0 = time.perf_counter()
                    make().fit(Xd, yd)
                    if i:  # the first round warms up
                        times[key].append(time.perf_counter() - t0)
    finally:
        for cluster, client, *_ in clusters.values():
            client.close()
            cluster.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    for quiet in (False, True):
        paired = statistics.median(a / b for a, b in zip(times[1, quiet], times[2, quiet]))
        print(f"{'quiet  ' if quiet else 'default'} contiguous n={n}: 1 worker "
              f"{med[1, quiet]:.3f} s, 2 workers {med[2, quiet]:.3f} s, speed-up "
              f"{med[1, quiet] / med[2, quiet]:.2f}x (paired {paired:.2f}x), {rounds} rounds")


def main(quick: bool = False, gpu: bool = False) -> None:
    from gpuml import BKRRRegressor, CASVMClassifier

    repeat = 1 if quick else 21
    load = os.getloadavg()
    Xa, ya = load_adult()
    Xa, Xa_test, ya, ya_test = train_test_split_std(Xa, ya, test_size=0.25, random_state=0)
    Xc, yc = load_california()
    Xc, Xc_test, yc, yc_test = train_test_split_std(Xc, yc, test_size=0.25, random_state=0)
    if quick:
        Xa, ya, Xc, yc = Xa[:6000], ya[:6000], Xc[:6000], yc[:6000]
    rows = _case_rows("CA-SVM P=16 adult",
                      lambda: CASVMClassifier(n_partitions=16, random_state=0),
                      Xa, ya, Xa_test, ya_test, "svm", repeat)
    if not quick:  # the 20,000 rows of the CA-SVM benchmarks (parts of 1,250 rows)
        rows += _case_rows("CA-SVM P=16 adult 20k",
                           lambda: CASVMClassifier(n_partitions=16, random_state=0),
                           Xa[:20000], ya[:20000], Xa_test, ya_test, "svm", repeat)
    # You 2020's casvm2 (Alg 5 as the paper ran it): each part the rows as they lie (the
    # split's rows are in random order), so no partitioning pass and no row moves.
    for m in ((len(Xa), 20000) if not quick else (len(Xa),)):
        rows += _case_rows("CA-SVM P=16 adult contiguous" + (" 20k" if m == 20000 else ""),
                           lambda: CASVMClassifier(n_partitions=16, partition="contiguous",
                                                   random_state=0),
                           Xa[:m], ya[:m], Xa_test, ya_test, "svm", repeat)
    rows += _case_rows("BKRR2 P=16 california",
                       lambda: BKRRRegressor(sigma=1.0, lam=1e-4, n_partitions=16,
                                             partition="kbalance", random_state=0),
                       Xc, yc, Xc_test, yc_test, "krr", repeat)
    after = os.getloadavg()
    svm2 = [r for r in rows if r["case"].startswith("CA-SVM") and r["workers"] == 2]
    notes = (
        f"Load average (1, 5, 15 min) before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"after: {after[0]:.2f} {after[1]:.2f} {after[2]:.2f} on {os.cpu_count()} cores. "
        f"fit_s: median of {repeat} fits after a warm-up fit, the two clusters up at once "
        "and their fits alternating (1, 2, 2, 1, ...), the other cluster's worker processes "
        "stopped (SIGSTOP) during each; paired_speedup: the median over "
        "those pairs of the 1-worker fit's time over the 2-worker fit's. two_core_ceiling: "
        "2 x the in-process fit's time as one task alone in one worker / its time in both "
        "workers at once (no Dask partitioning or shipping in the fit): the most two "
        "workers can gain on this machine. Each cluster: W "
        "worker processes, one thread each, OMP/OPENBLAS/MKL/NUMBA threads 1 (worker_threads "
        "as the workers report them); data persisted on the workers in "
        f"{N_CHUNKS} chunks before timing, each chunk's rows and targets on one worker, the "
        "first half of the chunks on the first worker. pre_fit_s, fit_tasks_s, post_fit_s: "
        "from the task stream of the same fits (medians), the time before the first fit task "
        "starts, the fit tasks' window and the time after it; tail_s: from the first fit "
        "task's end to the last's. hop_ms: a tiny task that "
        "depends on the one before, handed from worker to worker (the two workers "
        "alternating); client_trip_ms: the same through the client (submit, wait, "
        "fetch): what each step costs beyond its work. in_process_1thread_s: the same "
        "fit in this "
        "process with BLAS limited to one thread. counted = client_sent + client_gathered + "
        "between_workers (distributed's transfer counters); model: docs/scale-out.md. "
        "Targets: CA-SVM 2-worker speedup >= 1.6 (here "
        + ", ".join(f"{r['speedup_vs_1']:.2f} (paired {r['paired_speedup']:.2f}, ceiling "
                    f"{r['two_core_ceiling']:.2f}) for {r['case']} at n={r['n']}"
                    for r in svm2) + "); "
        "counted_over_model within [0.5, 2].")
    suffix = " --quick" if quick else ""
    record("dask" + ("_quick" if quick else ""), rows,
           title="Dask: fit time on 1 and 2 workers, bytes moved vs the cost model",
           command="python -m bench.run dask" + suffix, notes=notes)
