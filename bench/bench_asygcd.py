"""Asy-GCD for kernel SVM (You 2020, §4.5): thread scaling, greedy vs random, vs sklearn SVC.

Tables, all measured in one process on the same data:

1. ``asygcd_scaling``: objective vs time for 1, 2, 4, 8, 16 workers (Fig. 4.1 style plot
   in docs/img/asygcd_<dataset>.png) and the speedup in time to a relative objective gap
   of 1e-3, partition time included as in the paper, for even random blocks and for
   k-means blocks (§4.4; k-means can make very unequal blocks, see ``largest_block``).
   Worker counts above the core count are marked ``oversubscribed``: their threads
   time-share cores, so their speedup is not thread scaling.
2. ``asygcd_selection``: greedy (Asy-GCD) vs random (PSCD) selection, same workers and
   (random) blocks, time to the same gap.
3. ``asygcd_trace_overhead``: time to converge (max projected gradient < 1e-3) with and
   without the trace's snapshots, best of k, to show the trace does not slow the run.
4. ``asygcd_vs_svc``: test accuracy and fit time of AsyGCDSVC (default workers) vs
   sklearn.svm.SVC (which has a bias term; the objectives differ, accuracies compare).
5. ``asygcd_gpu`` (``--gpu``, where a GPU answers): one GPU solve (a persistent block per
   SM) against the all-core CPU solve, both to max projected gradient < 1e-3.

The trace is honest: while the workers run, the monitor copies alpha alone (every alpha
in the box [0, C] is a feasible point) and after the run each copy's objective is
computed exactly from X (:func:`gpuml.kernels.gcd_objectives`), never from the gradient
the workers maintain. Time to gap = the first snapshot whose exact objective is within
the gap of f*, the best exact objective of a long serial run (tol 1e-5) and of all runs.
Every run also reports ``g_err``, the largest difference between the maintained gradient
and ``Q alpha - e`` recomputed from X (the stopping certificate relies on it).

Data: adult (binary) and letter (26 classes; the objective-vs-time runs use the binary
problem "A-M vs N-Z", the accuracy table the 26-class problem, one-vs-one for both
estimators). ``--quick`` subsamples for a smoke run.
"""

from __future__ import annotations

import os
import time

import numpy as np

from bench._harness import RESULTS, machine_name, record, timeit
from gpuml._backend import cuda_available
from gpuml.estimators.asygcd import AsyGCDSVC
from gpuml.kernels import (
    gcd_default_workers,
    gcd_gradient,
    gcd_objectives,
    gcd_solve,
    make_kernel,
)
from gpuml.partition import assign_nearest, kmeans

GAP = 1e-3
WORKERS = (1, 2, 4, 8, 16)
C = 1.0
KMEANS_SUBSAMPLE = 20_000
#: Snapshots evaluated per call of gcd_objectives (bounds the (n, s) stack in memory).
EVAL_CHUNK = 128


def _datasets(quick: bool):
    from bench.datasets import load_adult, load_letter, train_test_split_std

    sizes = {"adult": (4000, 2000) if quick else (20000, 10000),
             "letter": (4000, 2000) if quick else (15000, 5000)}
    out = {}
    for name, loader in (("adult", load_adult), ("letter", load_letter)):
        X, y = loader()
        train, test = sizes[name]
        out[name] = train_test_split_std(X, y, train_size=train, test_size=test, random_state=0)
    return out


def binary_labels(name, y):
    """Labels in {-1, +1}: adult's two classes; letter as the binary problem A-M vs N-Z."""
    if name == "letter":
        return np.where(y >= np.median(np.unique(y)), 1.0, -1.0)
    return np.where(y == y.max(), 1.0, -1.0)


def make_blocks(X, workers, seed=0, partition="kmeans"):
    """k-means blocks (§4.4) or an even random split, timed: the paper times its k-means."""
    t0 = time.perf_counter()
    if workers == 1:
        return np.zeros(X.shape[0], dtype=np.int64), 0.0
    rng = np.random.default_rng(seed)
    if partition == "random":
        return rng.permutation(np.arange(X.shape[0]) % workers), time.perf_counter() - t0
    sub = X if X.shape[0] <= KMEANS_SUBSAMPLE else X[rng.choice(X.shape[0], KMEANS_SUBSAMPLE,
                                                                replace=False)]
    _, centers = kmeans(sub, workers, random_state=seed)
    labels = np.asarray(assign_nearest(X, centers), dtype=np.int64)
    return labels, time.perf_counter() - t0


def _time_to_gap(trace, f_star, offset):
    """First snapshot whose exact relative objective gap is <= GAP (plus the partition time)."""
    for seconds, updates, objective in trace:
        if (objective - f_star) <= GAP * abs(f_star):
            return seconds + offset, updates
    return float("nan"), -1


def timed_solve(X, y, kernel, workers, *, partition="kmeans", seed=0, tol=1e-3, **options):
    """One CPU solve with ``workers`` threads from a zero start: ``(result, seconds, t_part)``.

    ``seconds`` is the solve's wall time, ``t_part`` the time to make the blocks
    (add it for the paper's time-to-gap). The result also carries ``cpu_per_wall``
    (CPU seconds of all threads per wall second: above 1 only if the workers ran
    at the same time) and ``largest_block`` (its share of the variables).
    ``options`` go to :func:`gpuml.kernels.gcd_solve` (selection, trace, limits).
    """
    blocks, t_part = make_blocks(X, workers, seed, partition)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    res = gcd_solve(X, y, np.full(len(y), C), kernel, blocks, tol=tol, random_state=seed,
                    cache_bytes=1 << 30, **options)
    seconds = time.perf_counter() - wall0
    res.cpu_per_wall = (time.process_time() - cpu0) / seconds
    res.largest_block = float(np.bincount(blocks).max() / len(y))
    return res, seconds, t_part


def _run(X, y, kernel, workers, selection, time_limit, trace_interval, seed=0,
         partition="kmeans"):
    """One timed solve with snapshots; the snapshots are evaluated exactly afterwards."""
    res, _, t_part = timed_solve(X, y, kernel, workers, partition=partition, seed=seed,
                                 selection=selection, trace_interval=trace_interval,
                                 time_limit=time_limit)
    # Outside the timed region: exact objectives of the snapshots, and the gradient check.
    objectives = np.concatenate([
        gcd_objectives(X, y, kernel, np.stack([a for _, _, a in res.trace[k:k + EVAL_CHUNK]], 1))
        for k in range(0, len(res.trace), EVAL_CHUNK)])
    res.trace = [(s, u, float(f)) for (s, u, _), f in zip(res.trace, objectives)]
    res.exact_objective = res.trace[-1][2]
    res.g_err = float(np.abs(res.gradient - gcd_gradient(X, y, kernel, res.alpha)).max())
    return res, t_part


def _trace_overhead(name, X, y, kernel, trace_interval, repeat):
    """Time to converge with and without snapshots (same blocks), best of ``repeat``.

    Wall and CPU seconds (all threads), and what the copies alone cost: the snapshots
    taken times the measured time of one copy of alpha.
    """
    rows = []
    one_copy = timeit(lambda: np.empty(len(y)).copy(), repeat=200)
    for workers in (1, 2):
        blocks, _ = make_blocks(X, workers, partition="random")
        best = {mode: [float("inf"), float("inf"), 0] for mode in ("plain", "traced")}
        for _ in range(repeat):
            for mode, stats in best.items():  # alternate, so that load hits both
                cpu0, t0 = time.process_time(), time.perf_counter()
                res = gcd_solve(X, y, np.full(len(y), C), kernel, blocks, tol=1e-3,
                                cache_bytes=1 << 30,
                                trace_interval=trace_interval if mode == "traced" else None)
                stats[0] = min(stats[0], time.perf_counter() - t0)
                stats[1] = min(stats[1], time.process_time() - cpu0)
                stats[2] = len(res.trace)
        (plain_s, plain_cpu, _), (traced_s, traced_cpu, snapshots) = best.values()
        rows.append({"dataset": name, "n": len(y), "workers": workers,
                     "trace_interval_s": trace_interval, "snapshots": snapshots,
                     "copies_s": snapshots * one_copy, "plain_s": plain_s,
                     "traced_s": traced_s, "traced_over_plain": traced_s / plain_s,
                     "plain_cpu_s": plain_cpu, "traced_cpu_s": traced_cpu,
                     "cpu_traced_over_plain": traced_cpu / plain_cpu})
    return rows


def trace_overhead(quick: bool = False, repeat: int = 3) -> None:
    """Only the trace-overhead table (the snapshot interval of :func:`main`: t_ref / 200)."""
    rows = []
    for name, (X_tr, _, y_tr, _) in _datasets(quick).items():
        yb = binary_labels(name, y_tr)
        kernel = make_kernel("rbf", "scale", 3, 0.0, X_tr)
        t0 = time.perf_counter()
        gcd_solve(X_tr, yb, np.full(len(yb), C), kernel, np.zeros(len(yb), np.int64),
                  tol=1e-5, cache_bytes=1 << 30)
        rows += _trace_overhead(name, X_tr, yb, kernel,
                                max(0.01, (time.perf_counter() - t0) / 200), repeat)
    _record_overhead(rows, "python -c 'from bench.bench_asygcd import trace_overhead; "
                           f"trace_overhead(quick={quick}, repeat={repeat})'")


def _record_overhead(rows, command):
    record("asygcd_trace_overhead", rows, title="Asy-GCD: cost of the trace",
           notes="Time to max projected gradient < 1e-3 without and with alpha snapshots "
                 "every trace_interval_s (the monitor thread copies alpha), same blocks, best "
                 "of k alternating runs on a shared machine: wall seconds and CPU seconds of "
                 "all threads. copies_s: snapshots x the measured time of one copy.",
           command=command)


def _plot(name, curves, f_star, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    colours = dict(zip(WORKERS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for (partition, workers), (trace, offset) in curves.items():
        t = np.array([s for s, _, _ in trace]) + offset
        # Below ~1e-7 the gap is rounding in f and f_star, not progress.
        gap = np.maximum((np.array([f for _, _, f in trace]) - f_star) / abs(f_star), 1e-7)
        label = f"{workers} worker{'s' if workers > 1 else ''}" + \
            (f" ({partition} blocks)" if workers > 1 else "")
        ax.semilogy(t, gap, label=label, color=colours[workers],
                    ls="-" if partition == "random" else "--")
    ax.axhline(GAP, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("seconds (partition time included)")
    ax.set_ylabel("relative objective gap")
    ax.set_title(f"Asy-GCD on {name} ({machine_name()})")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(quick: bool = False, gpu: bool = False) -> None:

    cores = gcd_default_workers()
    data = _datasets(quick)
    scaling, selection_rows, overhead_rows, svc_rows, gpu_rows = [], [], [], [], []
    docs_img = RESULTS.parent.parent / "docs" / "img"
    for name, (X_tr, X_te, y_tr, y_te) in data.items():
        yb = binary_labels(name, y_tr)
        kernel = make_kernel("rbf", "scale", 3, 0.0, X_tr)
        t0 = time.perf_counter()
        ref = gcd_solve(X_tr, yb, np.full(len(yb), C), kernel, np.zeros(len(yb), np.int64),
                        tol=1e-5, cache_bytes=1 << 30)
        t_ref = time.perf_counter() - t0
        # About 200 snapshots over the serial solve: fine enough for the time to gap, few
        # enough to evaluate exactly afterwards.
        interval = max(0.01, t_ref / 200)
        limit = 3 * t_ref + 5

        def run(workers, selection="greedy", partition="random", X=X_tr, y=yb, kernel=kernel,
                interval=interval, limit=limit):
            return _run(X, y, kernel, workers, selection, limit, interval, partition=partition)

        runs = {("random", w): run(w) for w in WORKERS}
        runs.update({("kmeans", w): run(w, partition="kmeans") for w in WORKERS[1:]})
        randoms = {w: run(w, "random") for w in (1, min(cores, 16))}
        f_star = min([gcd_objectives(X_tr, yb, kernel, ref.alpha)]
                     + [r.exact_objective for r, _ in runs.values()]
                     + [r.exact_objective for r, _ in randoms.values()])
        base = _time_to_gap(runs["random", 1][0].trace, f_star, 0.0)[0]
        for (partition, workers), (res, t_part) in runs.items():
            t_gap, updates = _time_to_gap(res.trace, f_star, t_part)
            scaling.append({"dataset": name, "n": len(yb), "blocks": partition,
                            "workers": workers, "cores": cores,
                            "oversubscribed": "yes" if workers > cores else "no",
                            "largest_block": res.largest_block,
                            "partition_s": t_part, "time_to_gap_s": t_gap,
                            "updates_to_gap": updates, "speedup": base / t_gap,
                            "efficiency": base / t_gap / workers,
                            "cpu_per_wall": res.cpu_per_wall, "converged": res.converged,
                            "final_gap": (res.exact_objective - f_star) / abs(f_star),
                            "g_err": res.g_err, "f_star": f_star})
        _plot(name, {key: (r.trace, t) for key, (r, t) in runs.items()}, f_star,
              docs_img / f"asygcd_{name}.png")
        for workers, (rand, t_rand) in randoms.items():
            greedy, t_greedy = runs["random", workers]
            greedy_t, greedy_u = _time_to_gap(greedy.trace, f_star, t_greedy)
            random_t, random_u = _time_to_gap(rand.trace, f_star, t_rand)
            selection_rows.append({"dataset": name, "n": len(yb), "workers": workers,
                                   "greedy_s": greedy_t, "random_s": random_t,
                                   "greedy_updates": greedy_u, "random_updates": random_u,
                                   "random_over_greedy": random_t / greedy_t,
                                   "random_final_gap": (rand.exact_objective - f_star)
                                   / abs(f_star), "g_err": max(greedy.g_err, rand.g_err)})
        overhead_rows += _trace_overhead(name, X_tr, yb, kernel, interval,
                                         repeat=3)
        if gpu and cuda_available():
            gpu_rows.append(_gpu_vs_cpu(name, X_tr, yb, kernel, f_star, cores))
        svc_rows.append(_vs_svc(name, X_tr, X_te, y_tr, y_te))
    command = "python -m bench.run asygcd" + (" --quick" if quick else "")
    honest = ("Objectives are exact: alpha snapshots evaluated from X after the run, never "
              "from the maintained gradient; g_err = max |g - (Q alpha - e)| at the end.")
    note = (f"{os.cpu_count()} CPU cores on this machine, shared with other jobs. Speedup = "
            f"time to relative gap {GAP:g} with 1 worker / with T workers, k-means time "
            "included. Oversubscribed rows (workers > cores) time-share cores: their speedup "
            "is not thread scaling. final_gap: relative gap of the last point (runs stop at "
            f"max projected gradient < 1e-3 or after 3x the serial tol-1e-5 time + 5 s). "
            + honest)
    record("asygcd_scaling", scaling, title="Asy-GCD thread scaling (Fig. 4.1/4.2 style)",
           notes=note, command=command)
    record("asygcd_selection", selection_rows, title="Greedy (Asy-GCD) vs random (PSCD)",
           notes=f"Time to relative objective gap {GAP:g}, same workers and random blocks. "
                 + honest, command=command)
    _record_overhead(overhead_rows, command)
    _record_vs_svc(svc_rows, command)
    if gpu_rows:
        record("asygcd_gpu", gpu_rows, gpu=True, title="Asy-GCD: GPU vs all CPU cores",
               notes="Both stop at max projected gradient < 1e-3 (the GPU run has no "
                     "objective trace); gap = relative objective gap at the stop.",
               command=command)


def _vs_svc(name, X_tr, X_te, y_tr, y_te):
    """Accuracy and fit time on the original labels (26-class letter), both one-vs-one."""
    from sklearn.svm import SVC

    t0 = time.perf_counter()
    ours = AsyGCDSVC(C=C, device="cpu", random_state=0).fit(X_tr, y_tr)  # default n_workers
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    svc = SVC(C=C, cache_size=1024).fit(X_tr, y_tr)
    t_svc = time.perf_counter() - t0
    return {"dataset": name, "n_train": len(y_tr), "n_test": len(y_te),
            "classes": len(np.unique(y_tr)), "workers_per_problem": ours.n_workers_,
            "asygcd_acc": ours.score(X_te, y_te), "svc_acc": svc.score(X_te, y_te),
            "asygcd_fit_s": t_ours, "svc_fit_s": t_svc, "svc_over_asygcd_time": t_svc / t_ours}


def _record_vs_svc(rows, command):
    record("asygcd_vs_svc", rows, title="AsyGCDSVC vs sklearn SVC (rbf, C=1)",
           notes="AsyGCDSVC with its default n_workers (binary: one worker per core; "
                 "multiclass: one worker per one-vs-one problem, problems spread over the "
                 "cores). SVC solves the SVM with a bias term; accuracy compares, objectives "
                 "do not.", command=command)


def vs_svc(quick: bool = False) -> None:
    """Only the AsyGCDSVC-vs-SVC table (``python -c 'from bench.bench_asygcd import vs_svc;
    vs_svc()'``)."""
    rows = [_vs_svc(name, *split) for name, split in _datasets(quick).items()]
    _record_vs_svc(rows, "python -c 'from bench.bench_asygcd import vs_svc; "
                         f"vs_svc(quick={quick})'")


def _gpu_vs_cpu(name, X, y, kernel, f_star, cores):
    """One GPU solve (one worker per SM) against the all-core CPU solve, same stop rule."""
    import cupy as cp

    from gpuml.kernels import gcd_default_workers as workers_of

    Xg, yg, Cg = cp.asarray(X), cp.asarray(y), cp.full(len(y), C)
    n_sm = workers_of(Xg)
    rows = {}
    for device, workers in (("gpu", n_sm), ("cpu", cores)):
        blocks, t_part = make_blocks(X, workers, partition="random")
        args = (Xg, yg, Cg) if device == "gpu" else (X, y, np.full(len(y), C))
        if device == "gpu":  # compile and warm up outside the timing
            gcd_solve(*args, kernel, blocks, tol=1e-3, max_updates=10)
            cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        res = gcd_solve(*args, kernel, blocks, tol=1e-3, cache_bytes=1 << 30)
        if device == "gpu":
            cp.cuda.Device().synchronize()
        rows[device] = (time.perf_counter() - t0 + t_part, res, workers)
    (t_gpu, r_gpu, w_gpu), (t_cpu, r_cpu, w_cpu) = rows["gpu"], rows["cpu"]
    return {"dataset": name, "n": len(y), "gpu_workers": w_gpu, "cpu_workers": w_cpu,
            "gpu_s": t_gpu, "cpu_s": t_cpu, "cpu_over_gpu": t_cpu / t_gpu,
            "gpu_gap": (gcd_objectives(X, y, kernel, cp.asnumpy(r_gpu.alpha).astype(np.float64))
                        - f_star) / abs(f_star),
            "cpu_gap": (gcd_objectives(X, y, kernel, r_cpu.alpha) - f_star) / abs(f_star)}


if __name__ == "__main__":
    main(quick=True)
