"""Asy-GCD on the CPU: 1 worker against 2 (or more), side by side, speedup and objective gap.

The acceptance figure of thread scaling: a CPU solve of the bias-free SVM dual
(You 2020, Alg 14; You, Lian, Liu, Yu, Dhillon, Demmel and Hsieh, "Asynchronous
parallel greedy coordinate descent", 2016) with one worker and with two on the
same data, the same even random blocks and the same stop rule (largest
projected gradient below ``tol``), run alternately ``repeat`` times so that
load from other jobs hits both.

Per data set it prints one row per worker count:

* ``wall_s``: median wall seconds of the solve; ``speedup``: the one-worker
  median over this one. This is the figure to read on idle cores.
* ``cpu_s``: median CPU seconds of all the solver's threads; ``busiest_cpu_s``:
  median CPU seconds of the busiest worker thread. On a machine shared with
  other jobs the wall time is inflated by waiting for a core;
  ``cpu_speedup`` = one worker's CPU seconds / the busiest worker's, which is
  what the wall speedup would be on idle cores if no worker ever waited
  (spinning counts as CPU time, so a worker that waits by spinning is not
  flattered; one that sleeps is).
* ``cpu_per_wall``: above 1 only if the workers ran at the same time.
* ``updates``: coordinate updates; ``objective``: the exact dual objective of
  the returned alpha, recomputed from X; ``objective_gap``: its relative
  difference to the one-worker objective (the same problem solved to the
  same ``tol``: both are within the tolerance of the optimum, not equal).

Also one fit of :class:`~gpuml.estimators.asygcd.AsyGCDSVC` per worker count on
the binary problem with its default settings but ``n_workers`` (the estimator
adds its block partition and validation to the solve).

Run: ``python -m bench.run asygcd_speedup`` (``asygcd_speedup:quick``: 4,000 rows). More
workers on a larger machine: ``python -c 'from bench.bench_asygcd_speedup import main;
main(workers=(1, 2, 4, 8, 16))'``.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from bench._harness import record
from gpuml.estimators.asygcd import AsyGCDSVC
from gpuml.kernels import gcd_objectives, gcd_solve, make_kernel

C = 1.0
TOL = 1e-3
WORKERS = (1, 2)


def _data(quick):
    from bench.bench_asygcd import _datasets, binary_labels

    out = {}
    for name, (X, _, y, _) in _datasets(quick).items():
        out[name] = (X, binary_labels(name, y))
    return out


def _blocks(n, workers, seed=0):
    """An even random split: blocks of equal size, so that the speedup is the solver's."""
    return np.random.default_rng(seed).permutation(np.arange(n) % workers)


def _solve(X, y, kernel, workers):
    cpu0, t0 = time.process_time(), time.perf_counter()
    res = gcd_solve(X, y, np.full(len(y), C), kernel, _blocks(len(y), workers), tol=TOL,
                    cache_bytes=1 << 30, random_state=0)
    wall = time.perf_counter() - t0
    return res, wall, time.process_time() - cpu0


def speedup_rows(name, X, y, workers=WORKERS, repeat=3):
    """Rows of the solver table for one data set (see the module docstring)."""
    kernel = make_kernel("rbf", "scale", 3, 0.0, X)
    gcd_solve(X[:300], y[:300], np.ones(300), kernel, _blocks(300, 2))  # compile outside
    runs = {w: [] for w in workers}
    for _ in range(repeat):
        for w in workers:  # alternate, so that load from other jobs hits every count
            runs[w].append(_solve(X, y, kernel, w))
    rows = []
    base = None
    for w in workers:
        res = runs[w][-1][0]
        wall = statistics.median(r[1] for r in runs[w])
        cpu = statistics.median(r[2] for r in runs[w])
        busiest = statistics.median(max(r[0].worker_cpu_s) for r in runs[w])
        objective = float(gcd_objectives(X, y, kernel, res.alpha))
        if base is None:
            base = (wall, busiest, objective)
        rows.append({"dataset": name, "n": len(y), "workers": w, "wall_s": wall,
                     "speedup": base[0] / wall, "cpu_s": cpu, "busiest_cpu_s": busiest,
                     "cpu_speedup": base[1] / busiest, "cpu_per_wall": cpu / wall,
                     "updates": int(statistics.median(r[0].n_updates for r in runs[w])),
                     "objective": objective,
                     "objective_gap": (objective - base[2]) / abs(base[2]),
                     "max_violation": res.max_violation,
                     "converged": all(r[0].converged for r in runs[w])})
    return rows


def estimator_rows(name, X, y, workers=WORKERS):
    """One AsyGCDSVC fit per worker count: default settings but n_workers, and with
    ``block_partition="kbalance"`` (equal blocks; one worker needs no partition)."""
    import warnings

    rows = []
    for w in workers:
        for partition in ("default",) if w == 1 else ("default", "kbalance"):
            extra = {} if partition == "default" else {"block_partition": partition}
            cpu0, t0 = time.process_time(), time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                clf = AsyGCDSVC(C=C, tol=TOL, n_workers=w, device="cpu", random_state=0,
                                **extra).fit(X, y)
            wall = time.perf_counter() - t0
            rows.append({"dataset": name, "n": len(y), "workers": w,
                         "block_partition": partition, "fit_s": wall,
                         "cpu_per_wall": (time.process_time() - cpu0) / wall,
                         "objective": float(clf.objective_[0]),
                         "updates": int(clf.n_updates_[0]),
                         "warned": "; ".join(sorted({c.category.__name__ for c in caught}))})
    base = rows[0]
    for row in rows:
        row["speedup"] = base["fit_s"] / row["fit_s"]
        row["objective_gap"] = (row["objective"] - base["objective"]) / abs(base["objective"])
    return rows


def main(quick: bool = False, gpu: bool = False, workers=WORKERS) -> None:
    """Both tables; ``workers``: the counts to compare (the first is the baseline)."""
    solver, fits = [], []
    for name, (X, y) in _data(quick).items():
        rows = speedup_rows(name, X, y, workers=tuple(workers), repeat=2 if quick else 3)
        solver += rows
        for row in rows:
            print(f"{name:7s} n={row['n']} workers={row['workers']}: wall {row['wall_s']:.2f} s "
                  f"speedup {row['speedup']:.2f}x (CPU-normalised {row['cpu_speedup']:.2f}x, "
                  f"cpu/wall {row['cpu_per_wall']:.2f}), {row['updates']} updates, objective "
                  f"{row['objective']:.6f} (gap {row['objective_gap']:+.1e})", flush=True)
        fits += estimator_rows(name, X, y, workers=tuple(workers))
    command = "python -m bench.run asygcd_speedup" + (":quick" if quick else "")
    note = (f"{os.cpu_count()} CPU cores. Even random blocks, rbf, C={C:g}, tol={TOL:g} (largest "
            "projected gradient), medians of alternating runs. speedup: wall; cpu_speedup: one "
            "worker's CPU seconds over the busiest worker thread's (the idle-core speedup when "
            "no worker waits; read it when the machine was shared). objective_gap: relative "
            "difference of the exact objective to the one-worker run's.")
    record("asygcd_speedup", solver, title="Asy-GCD: 1 worker vs 2, side by side",
           notes=note, command=command)
    record("asygcd_speedup_fit", fits, title="AsyGCDSVC fit: 1 worker vs 2",
           notes="Binary problem (adult; letter A-M vs N-Z), default settings but n_workers; "
                 "one fit each, block partition included; 'default' is the estimator's "
                 "default block_partition (warned: warnings the fit raised, e.g. unequal "
                 "k-means blocks).", command=command)


if __name__ == "__main__":
    main(quick=True)
