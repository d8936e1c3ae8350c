"""Exact SVM fits whose cost follows their SMO work: ``CASVMClassifier(n_partitions=1)`` vs SVC.

The CPU SMO computes a problem's kernel rows as its working sets need them and makes the
whole matrix only when the solve is seen to touch most of it (``gpuml.kernels.smo.rows``).
Five tables, in this one process, alternating the estimators (warm: two fits each before
the timed ones; medians of the repeats; wall seconds, and CPU seconds where noted):

* ``exact_work``: ``CASVMClassifier(n_partitions=1)`` against ``SVC()`` (same C, gamma,
  tol) on easy problems (``make_classification(n, 10, n_informative=6, class_sep=2.0,
  flip_y=0, random_state=1)`` at 2,000 to 20,000 rows), on real ones whose solves take few
  steps (MNIST 5k 0-vs-rest, letter A-vs-rest) and on adult 10k (standardised) at its
  defaults and over C in {0.1, 1, 10} x gamma in {0.001, 0.01, 0.1};
* ``exact_work_defaults``: ``CASVMClassifier()`` (its default parts) on adult, MAGIC and
  letter (bench.datasets.casvm_split) and adult's whole training split;
* ``exact_work_path``: the C path (``gpuml.kernels.smo_solve_path``) on adult 6k for
  C in {0.1, 1, 10, 100, 1000} and 5 gammas, against a cold solve per C: SMO steps and
  seconds (kernel values once per gamma, each C warm-started);
* ``exact_work_first_fit``: the first fit in a fresh process (numba's disk cache empty:
  ``cold``; filled: ``warm``), the easy 10,000-row problem;
* ``exact_work_costs``: the cost model of ``gpuml.kernels.smo.rows`` (a row computed
  alone, an entry of the whole matrix, per value) against its measurement;
* ``exact_work_hard``: solves of many steps (MAGIC, 4,000 standardised rows, C in
  {10, 100, 1000} x gamma in {0.3, 3} / (d Var X)), where a step's sweeps are the cost:
  ours with its default ``shrinking="auto"`` and with ``shrinking=False`` against SVC
  (shrinking on).

With ``GPUML_EXACT_WORK_BASELINE=DIR`` (DIR holding another version's package under the
name ``gpuml_baseline``, and its commit in ``DIR/COMMIT``: ``git archive <commit> gpuml |
tar -x -C DIR && mv DIR/gpuml DIR/gpuml_baseline && git rev-parse --short <commit> >
DIR/COMMIT``) that version's ``CASVMClassifier`` is timed too, in the same turns (the
``baseline`` columns).

Run: ``python -m bench.run exact_work`` (``:quick``: fewer cases and repeats); one table:
``python -m bench.bench_exact_work hard`` (``exact``, ``defaults``, ``path``, ``first_fit``,
``costs``).
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.datasets import make_classification
from sklearn.svm import SVC

from bench._harness import record
from bench.datasets import (
    casvm_split,
    load_adult,
    load_letter,
    load_magic,
    load_mnist5k,
    train_test_split_std,
)
from gpuml import CASVMClassifier

ROOT = Path(__file__).resolve().parents[1]
REPEATS, QUICK_REPEATS = 5, 2
#: The default fits take a fraction of a second and vary most with the machine's load.
DEFAULTS_REPEATS = 9
ADULT_GRID = [(C, g) for C in (0.1, 1.0, 10.0) for g in (0.001, 0.01, 0.1)]
PATH_CS = [0.1, 1.0, 10.0, 100.0, 1000.0]
PATH_GAMMAS = [0.001, 0.01, 0.03, 0.1, 0.3]


def _baseline():
    """The baseline's estimator class, or None (``GPUML_EXACT_WORK_BASELINE``)."""
    folder = os.environ.get("GPUML_EXACT_WORK_BASELINE")
    if not folder:
        return None
    sys.path.insert(0, str(Path(folder).resolve()))
    return importlib.import_module("gpuml_baseline").CASVMClassifier


def _record(name, rows, title, notes, table=None):
    """:func:`bench._harness.record` with the baseline's commit and the command that sets it
    (``table``: the one table run, ``python -m bench.bench_exact_work <table>``)."""
    folder = os.environ.get("GPUML_EXACT_WORK_BASELINE")
    command = None
    if folder:
        commit = Path(folder, "COMMIT")
        version = commit.read_text().strip() if commit.exists() else "another version"
        notes += f" Baseline: {version}."
        command = "GPUML_EXACT_WORK_BASELINE=DIR python -m bench.run " + (
            "exact_work:quick" if name.endswith("_quick") else "exact_work")
        if table is not None:
            command = (f"GPUML_EXACT_WORK_BASELINE=DIR python -m bench.bench_exact_work "
                       f"{table}" + (" --quick" if name.endswith("_quick") else ""))
    record(name, rows, title=title, notes=notes, command=command)


def _fits(X, y, params, baseline, svc=None):
    """The fits to time: ours with ``params``, the baseline's with the same (when given),
    SVC with ``svc`` (when given)."""
    fits = {"ours": lambda: CASVMClassifier(**params).fit(X, y)}
    if svc is not None:
        fits["svc"] = lambda: SVC(**svc).fit(X, y)
    if baseline is not None:
        fits["baseline"] = lambda: baseline(**params).fit(X, y)
    return fits


def _turns(fits, repeat):
    """``{name: (wall seconds, CPU seconds, last fitted)}``: medians of ``repeat`` fits of
    each, run in turns, after two untimed fits each (compiled, warm)."""
    for fit in fits.values():
        fit(), fit()
    wall = {name: [] for name in fits}
    cpu = {name: [] for name in fits}
    last = {}
    for _ in range(repeat):
        for name, fit in fits.items():
            t0, c0 = time.perf_counter(), time.process_time()
            last[name] = fit()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name]), last[name])
            for name in fits}


def _easy(n):
    return make_classification(n_samples=n, n_features=10, n_informative=6, class_sep=2.0,
                               flip_y=0, random_state=1)


def _exact_cases(quick):
    """``(case, X, y, C, gamma, repeats)`` of the exact table."""
    repeat = QUICK_REPEATS if quick else REPEATS
    for n in (2000, 5000, 10000) if quick else (2000, 5000, 10000, 20000):
        X, y = _easy(n)
        yield f"easy {n}", X, y, 1.0, "scale", repeat
    X, y = load_mnist5k()
    yield "mnist5k 0-vs-rest", X / 255.0, (y == 0).astype(np.int64), 1.0, "scale", repeat
    X, y = load_letter()
    X, _, y, _ = train_test_split_std(X, (y == 0).astype(np.int64), train_size=15000,
                                      test_size=5000, random_state=0)
    yield "letter A-vs-rest 15k", X, y, 1.0, "scale", repeat
    X, y = load_adult()
    X, _, y, _ = train_test_split_std(X, y, train_size=10000, test_size=5000, random_state=0)
    slow = 1 if quick else 3
    yield "adult 10k", X, y, 1.0, "scale", slow
    for C, gamma in ADULT_GRID[::4] if quick else ADULT_GRID:
        yield "adult 10k", X, y, C, gamma, slow


def exact_table(quick, baseline):
    rows = []
    for case, X, y, C, gamma, repeat in _exact_cases(quick):
        ours = dict(n_partitions=1, C=C, gamma=gamma, device="cpu")
        out = _turns(_fits(X, y, ours, baseline, svc=dict(C=C, gamma=gamma)), repeat)
        ours, svc = out["ours"], out["svc"]
        row = {"case": case, "n": len(y), "d": X.shape[1], "C": C, "gamma": gamma,
               "svc_s": svc[0], "ours_s": ours[0], "ratio": ours[0] / svc[0],
               "ratio_cpu": ours[1] / svc[1]}
        if baseline is not None:
            row["baseline_s"] = out["baseline"][0]
            row["ours_vs_baseline"] = ours[0] / out["baseline"][0]
        row["ours_iter"] = int(ours[2].n_iter_.sum())
        row["svc_iter"] = int(svc[2].n_iter_.sum())
        row["same_predictions"] = float(np.mean(ours[2].predict(X) == svc[2].predict(X)))
        rows.append(row)
        print(row, flush=True)
    _record("exact_work" + ("_quick" if quick else ""), rows,
           title="Exact SVM (one part) against SVC: the fit's cost follows its SMO work",
           notes=f"Medians of alternating warm fits (after two untimed fits each; repeats: "
                 f"{REPEATS} for the easy and the MNIST/letter rows, 3 for adult; quick: "
                 f"{QUICK_REPEATS} and 1). ratio = ours / SVC's wall time, ratio_cpu the "
                 "same in CPU seconds of the process (SVC runs on one thread, ours may "
                 "use two while it makes a matrix); ours_vs_baseline: ours / the baseline "
                 "version's (GPUML_EXACT_WORK_BASELINE). same_predictions: the share of "
                 "training rows both predict alike. Default settings otherwise "
                 "(tol=1e-3, cache_size: ours 1024 MB, SVC 200 MB; shrinking: ours "
                 "'auto', on past 1,024 rows, SVC on).")


def defaults_table(quick, baseline):
    rows = []
    sets = [("adult", None), ("magic", None), ("letter", None)]
    if not quick:
        sets.append(("adult", (36631, 12211)))
    for name, sizes in sets:
        X, _, y, _ = casvm_split(name, sizes)
        out = _turns(_fits(X, y, dict(device="cpu", random_state=0), baseline),
                     QUICK_REPEATS if quick else DEFAULTS_REPEATS)
        row = {"data": name, "n": len(y), "parts": int(out["ours"][2].n_partitions_),
               "ours_s": out["ours"][0], "ours_cpu_s": out["ours"][1]}
        if baseline is not None:
            row.update(baseline_s=out["baseline"][0], baseline_cpu_s=out["baseline"][1],
                       ratio=out["ours"][0] / out["baseline"][0],
                       ratio_cpu=out["ours"][1] / out["baseline"][1],
                       same_predictions=float(np.mean(out["ours"][2].predict(X)
                                                      == out["baseline"][2].predict(X))))
        rows.append(row)
        print(row, flush=True)
    _record("exact_work_defaults" + ("_quick" if quick else ""), rows,
           title="CASVMClassifier() (its default parts) against the baseline version",
           notes=f"Medians of {DEFAULTS_REPEATS} alternating warm fits (quick: "
                 f"{QUICK_REPEATS}); ratio = ours / the baseline's time "
                 "(GPUML_EXACT_WORK_BASELINE), ratio_cpu in CPU seconds. casvm_split's "
                 "standardised training rows (adult 20,000 and its whole split, MAGIC "
                 "14,000, letter 15,000); binary parts of more than 1,024 rows compute "
                 "their kernel rows on demand (the first two of a fit decide for the "
                 "others), letter's 26-class parts their matrices as before.")


def path_table(quick):
    from gpuml.kernels import SMOProblem, make_kernel, smo_solve_batch, smo_solve_path

    X, y = load_adult()
    n = 2000 if quick else 6000
    X, _, y, _ = train_test_split_std(X, y, train_size=n, test_size=2000, random_state=0)
    labels = np.where(y == 1, 1.0, -1.0)
    problem = SMOProblem(0, np.arange(n), labels)
    # compile both ways first (the path's solves on a whole matrix made midway)
    warm = make_kernel("rbf", 0.1, X=X[:1500])
    smo_solve_path(warm, [X[:1500]], [SMOProblem(0, np.arange(1500), labels[:1500])],
                   [1.0, 10.0])
    rows = []
    for gamma in PATH_GAMMAS[::2] if quick else PATH_GAMMAS:
        kernel = make_kernel("rbf", gamma, X=X)
        times = {"path": [], "cold": []}
        for _ in range(1 if quick else 2):  # in turns
            t0 = time.perf_counter()
            path = smo_solve_path(kernel, [X], [problem], PATH_CS)
            times["path"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            cold = [smo_solve_batch(kernel, [X], [SMOProblem(0, problem.idx, labels, C)])[0]
                    for C in PATH_CS]
            times["cold"].append(time.perf_counter() - t0)
        path_s, cold_s = min(times["path"]), min(times["cold"])
        gap = max(abs(p[0].objective - c.objective) / abs(c.objective)
                  for p, c in zip(path, cold))
        rows.append({"gamma": gamma, "path_s": path_s, "cold_s": cold_s,
                     "time_ratio": path_s / cold_s,
                     "path_iter": sum(p[0].n_iter for p in path),
                     "cold_iter": sum(c.n_iter for c in cold),
                     "iter_ratio": sum(p[0].n_iter for p in path) / sum(c.n_iter for c in cold),
                     "path_iter_by_C": " ".join(str(p[0].n_iter) for p in path),
                     "cold_iter_by_C": " ".join(str(c.n_iter) for c in cold),
                     "max_objective_diff": gap})
        print(rows[-1], flush=True)
    total = {"gamma": "all", "path_s": sum(r["path_s"] for r in rows),
             "cold_s": sum(r["cold_s"] for r in rows)}
    total["time_ratio"] = total["path_s"] / total["cold_s"]
    total["path_iter"] = sum(r["path_iter"] for r in rows)
    total["cold_iter"] = sum(r["cold_iter"] for r in rows)
    total["iter_ratio"] = total["path_iter"] / total["cold_iter"]
    rows.append(total)
    _record("exact_work_path" + ("_quick" if quick else ""), rows,
           title=f"The C path on adult {n // 1000}k: one kernel per gamma, each C warm-started",
           notes="gpuml.kernels.smo_solve_path(C in " + str(PATH_CS) + ") against a cold "
                 "smo_solve_batch per C, one binary problem on the standardised rows (rows "
                 "on demand, the matrix made midway when it pays: the path keeps it for "
                 "every C). The faster of two runs each, in turns, after a compile on "
                 "other data; max_objective_diff is the largest relative difference of the "
                 "dual objectives, path against cold (both to tol=1e-3).")


CHILD = r"""
import json, sys, time, warnings, importlib
warnings.simplefilter("ignore")
from sklearn.datasets import make_classification
estimator = importlib.import_module(sys.argv[1]).CASVMClassifier
X, y = make_classification(n_samples=10000, n_features=10, n_informative=6, class_sep=2.0,
                           flip_y=0, random_state=1)
out = {}
for fit in ("first", "second"):
    t0, c0 = time.perf_counter(), time.process_time()
    estimator(n_partitions=1, device="cpu").fit(X, y)
    out[fit + "_fit_s"] = time.perf_counter() - t0
    out[fit + "_fit_cpu_s"] = time.process_time() - c0
print(json.dumps(out))
"""


def first_fit_table(quick):
    versions = {"this tree": ("gpuml", str(ROOT))}
    if os.environ.get("GPUML_EXACT_WORK_BASELINE"):
        folder = str(Path(os.environ["GPUML_EXACT_WORK_BASELINE"]).resolve())
        versions["baseline"] = ("gpuml_baseline", folder + os.pathsep + str(ROOT))
    runs = {}
    for _ in range(1 if quick else 2):
        for code, (package, path) in versions.items():
            with tempfile.TemporaryDirectory(prefix="gpuml-numba-cache-") as cache_dir:
                for cache in ("cold", "warm"):
                    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=path,
                               GPUML_JIT_BACKGROUND="1")
                    text = subprocess.run([sys.executable, "-c", CHILD, package], env=env,
                                          capture_output=True, text=True, check=True).stdout
                    runs.setdefault((code, cache), []).append(
                        json.loads(text.strip().splitlines()[-1]))
    rows = []
    for (code, cache), outs in runs.items():
        row = {"code": code, "cache": cache}
        for key in outs[0]:
            row[key] = statistics.median(o[key] for o in outs)
        rows.append(row)
        print(row, flush=True)
    _record("exact_work_first_fit" + ("_quick" if quick else ""), rows,
           title="First fit in a fresh process: CASVMClassifier(n_partitions=1), easy 10,000 rows",
           notes="cold: an empty numba cache (NUMBA_CACHE_DIR a new folder), the compile "
                 "in the fit; warm: a new process with the cache the cold one wrote (or "
                 "after `python -m gpuml.precompile`). Medians of the runs; the second "
                 "fit is in the same process. The fit runs compiled code (no NumPy twin: "
                 "a problem of more than 1,024 rows waits for the compile).")


def costs_table(quick):
    """The cost model of gpuml.kernels.smo.rows against its measurement."""
    from threadpoolctl import threadpool_limits

    from gpuml.kernels import make_kernel
    from gpuml.kernels.smo import rows as model
    from gpuml.kernels.smo.loop import _FILL, _MAX, _NEED, STATE_SIZE
    from gpuml.kernels.smo.values import Values, values_of

    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(limits=1, user_api="blas"):
        for itemsize in (4, 8):
            for n in (2000,) if quick else (2000, 6000):
                for d in (10, 100, 800):
                    X = rng.standard_normal((n, d))
                    kernel = make_kernel("rbf", 1.0 / d, X=X)
                    values = values_of(kernel, X, 0) if itemsize == 4 else Values(kernel, X)
                    row_s = statistics.median(_row_seconds(values, 100, (_FILL, _MAX, _NEED),
                                                           STATE_SIZE) for _ in range(3))
                    matrix_s = statistics.median(_matrix_seconds(values) for _ in range(3))
                    rows.append({"bytes": itemsize, "n": n, "d": d,
                                 "row_us": row_s * 1e6,
                                 "model_row_us": model.row_cost(n, d, itemsize) / 1e3,
                                 "matrix_ms": matrix_s * 1e3,
                                 "model_matrix_ms": model.matrix_cost(n, d, itemsize) / 1e6,
                                 "rows_worth_the_matrix": matrix_s / row_s,
                                 "model_rows_worth": model.matrix_cost(n, d, itemsize)
                                 / model.row_cost(n, d, itemsize)})
                    print(rows[-1], flush=True)
    _record("exact_work_costs" + ("_quick" if quick else ""), rows,
           title="The cost model of rows on demand (gpuml.kernels.smo.rows) against measurement",
           notes="One row: its products (one matrix-vector product) and the compiled call "
                 "that puts it in place, BLAS on one thread, CPU seconds, median of three "
                 "runs of 100 rows; the matrix: Values.fill_lower on one thread. "
                 "rows_worth_the_matrix: how many rows cost what the whole matrix costs "
                 "(the model's beside it). The model is per value (ROW_VALUE_NS, "
                 "MATRIX_ENTRY_NS: fixed + per feature) plus ROW_CALL_NS a row.")


def _row_seconds(values, count, slots, state_size):
    fill, most, need = slots
    n = values.rows.shape[0]
    cache = np.empty((n, n), values.dtype)
    slot_of = np.full(n, -1, np.int64)
    slot_row = np.full(n, -1, np.int64)
    state = np.zeros(state_size, np.int64)
    ones, zeros = np.ones(n), np.zeros(n)
    order = np.random.default_rng(1).permutation(n)[:count].tolist()
    c0 = time.process_time()
    for slot, r in enumerate(order):
        values.products(r)
        state[need], state[fill], state[most] = r, slot + 1, 0
        values.fill_and_run(cache, slot_of, np.zeros(n, np.int64), slot_row, ones, ones,
                            zeros, -ones, np.arange(n), state, 1e-3, None)
    return (time.process_time() - c0) / count


def _matrix_seconds(values):
    n = values.rows.shape[0]
    c0 = time.process_time()
    values.fill_lower(np.empty((n, n), values.dtype))
    return time.process_time() - c0


HARD_CS, HARD_GAMMAS = (10.0, 100.0, 1000.0), (0.3, 3.0)


def hard_table(quick, baseline):
    X, y = load_magic()
    X, _, y, _ = train_test_split_std(X, y, train_size=4000, test_size=1000, random_state=0,
                                      stratify=True)
    unit = 1.0 / (X.shape[1] * X.var())
    repeat = 1 if quick else 3
    rows = []
    for C in HARD_CS[:2] if quick else HARD_CS:
        for g in HARD_GAMMAS:
            ours = dict(n_partitions=1, C=C, gamma=g * unit, device="cpu")
            fits = _fits(X, y, ours, baseline, svc=dict(C=C, gamma=g * unit))
            fits["ours_no_shrinking"] = lambda p=ours: CASVMClassifier(
                **p, shrinking=False).fit(X, y)
            out = _turns(fits, repeat)
            row = {"case": "magic 4k", "C": C, "gamma_x_scale": g, "svc_s": out["svc"][0],
                   "ours_s": out["ours"][0], "no_shrinking_s": out["ours_no_shrinking"][0],
                   "ratio": out["ours"][0] / out["svc"][0],
                   "ratio_no_shrinking": out["ours_no_shrinking"][0] / out["svc"][0]}
            if baseline is not None:
                row["baseline_s"] = out["baseline"][0]
                row["ours_vs_baseline"] = out["ours"][0] / out["baseline"][0]
            row["ours_iter"] = int(out["ours"][2].n_iter_.sum())
            row["svc_iter"] = int(out["svc"][2].n_iter_.sum())
            row["same_predictions"] = float(np.mean(out["ours"][2].predict(X)
                                                    == out["svc"][2].predict(X)))
            rows.append(row)
            print(row, flush=True)
    _record("exact_work_hard" + ("_quick" if quick else ""), rows,
            title="Exact SVM solves of many steps: shrinking against SVC",
            notes=f"MAGIC, 4,000 standardised training rows; medians of {repeat} alternating "
                  "warm fits (after two untimed each). ours: CASVMClassifier(n_partitions=1) "
                  "at its defaults (shrinking='auto': on for this problem); no_shrinking: "
                  "the same with shrinking=False; ratio = ours / SVC's wall time; "
                  "ours_vs_baseline: ours / the baseline version's "
                  "(GPUML_EXACT_WORK_BASELINE, its defaults). same_predictions: the share "
                  "of training rows ours and SVC predict alike.", table="hard")


TABLES = {"costs": costs_table, "exact": exact_table, "defaults": defaults_table,
          "path": path_table, "first_fit": first_fit_table, "hard": hard_table}


def main(quick: bool = False, gpu: bool = False, tables=tuple(TABLES)):
    baseline = _baseline()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in tables:
            table = TABLES[name]
            if name in ("exact", "defaults", "hard"):
                table(quick, baseline)
            else:
                table(quick)


if __name__ == "__main__":
    unknown = [a for a in sys.argv[1:] if a not in TABLES and a != "--quick"]
    if unknown:
        sys.exit(f"unknown table {unknown}; tables: {', '.join(TABLES)} (and --quick)")
    main(quick="--quick" in sys.argv,
         tables=[a for a in sys.argv[1:] if a in TABLES] or tuple(TABLES))
