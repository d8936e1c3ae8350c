"""First fit in a fresh process: numba compile included (cold cache) and from the cache (warm).

Each row is one estimator fitted on ``make_classification(2000, 20)`` in a new Python
process: ``cold`` with an empty numba cache directory (``NUMBA_CACHE_DIR`` pointing to a
new folder, as right after installing), ``warm`` in a second new process with the cache
the first one wrote (every later process, or any process after ``python -m
gpuml.precompile``). ``first_fit_s`` includes compiling or loading the CPU kernels;
``second_fit_s`` is a second fit in the same process (no compile); ``import_s`` is
``import gpuml.estimators`` with scikit-learn and numba. ``*_cpu_s`` are the same fits
in CPU seconds of the process: on a machine shared with other jobs the wall time of a
compile (single-threaded Python) stretches with the load, its CPU time much less.

Small fits no longer wait for the compile: while numba compiles in a background
thread, the first fit runs NumPy twins of the solvers (the dense SMO, bit for bit the
same steps; Asy-GCD's one-worker case; ``gpuml.kernels._jit``), and the compile
starts when the fit returns. ``second_fit_s`` is then usually a twin fit too, sharing
the interpreter with that compile; and a child that exits before the compile is done
leaves the cache without it, so a ``warm`` row can take the twins as well.

Each (estimator, cache) pair runs ``REPEATS`` times, in turns, and the table gives the
medians. With ``GPUML_FIRST_FIT_BASELINE=<dir>`` (a directory holding another version's
``gpuml`` package, e.g. ``git archive <commit> gpuml | tar -x -C <dir>``), the same
children also run that version, interleaved with this one, for a before/after
comparison measured side by side.

``GPUML_FIRST_FIT=large`` runs large fits made of small pieces instead (the scale
benchmark's synthetic set: ``CASVMClassifier(n_partitions=200)`` on 100,000 rows, parts
of 500; ``CASVMClassifier()`` on 500,000 rows, its greedy fill in blocks), which no twin
may serve: a twin judges the whole fit, not each part or block
(``first_fit_large``).

Run: ``python -m bench.run first_fit`` (``GPUML_FIRST_FIT=large python -m bench.run
first_fit``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._harness import record

CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")  # a 2,000-row P=16 fit warns (PartitionWarning): not timed
t0 = time.perf_counter()
import numpy as np
from sklearn.datasets import make_classification
from gpuml.estimators.asygcd import AsyGCDSVC
from gpuml.estimators.casvm import CASVMClassifier
t_import = time.perf_counter() - t0
name, n = sys.argv[1], int(sys.argv[2])
if n == 2000:
    X, y = make_classification(2000, 20, random_state=0)
else:  # the scale benchmark's synthetic set
    X, y = make_classification(n, n_features=28, n_informative=20, n_redundant=4,
                               flip_y=0.05, class_sep=0.8, random_state=0)
    X = X.astype(np.float32)
make = {"CASVMClassifier(n_partitions=16)":
            lambda: CASVMClassifier(n_partitions=16, device="cpu", random_state=0),
        "CASVMClassifier(n_partitions=200)":
            lambda: CASVMClassifier(n_partitions=200, device="cpu", random_state=0),
        "CASVMClassifier()": lambda: CASVMClassifier(device="cpu", random_state=0),
        "AsyGCDSVC()": lambda: AsyGCDSVC(device="cpu", random_state=0)}[name]
times, cpu = [], []
for _ in range(2):
    t0, c0 = time.perf_counter(), time.process_time()
    make().fit(X, y)
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
print(json.dumps({"import_s": t_import, "first_fit_s": times[0], "first_fit_cpu_s": cpu[0],
                  "second_fit_s": times[1], "second_fit_cpu_s": cpu[1]}))
"""

#: (estimator, rows): small fits, which the NumPy twins serve while numba compiles ...
ESTIMATORS = (("CASVMClassifier(n_partitions=16)", 2000), ("AsyGCDSVC()", 2000))
#: ... and large fits of small pieces, which must not take them (``GPUML_FIRST_FIT=large``)
LARGE = (("CASVMClassifier(n_partitions=200)", 100_000), ("CASVMClassifier()", 500_000))
REPEATS = 3
LARGE_REPEATS = 2
ROOT = Path(__file__).resolve().parents[1]


def _child(name, n, cache_dir, source=ROOT):
    # The library's default (bench._harness turns background compiling off for the
    # other benchmarks).
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=str(source),
               GPUML_JIT_BACKGROUND="1")
    out = subprocess.run([sys.executable, "-c", CHILD, name, str(n)], env=env,
                         capture_output=True, text=True, check=True, cwd=str(source)).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(quick: bool = False, gpu: bool = False) -> None:
    """Small fits (``first_fit``), or with ``GPUML_FIRST_FIT=large`` the large fits
    (``first_fit_large``)."""
    large = os.environ.get("GPUML_FIRST_FIT") == "large"
    sources = {"this tree": ROOT}
    if os.environ.get("GPUML_FIRST_FIT_BASELINE"):
        sources["baseline"] = Path(os.environ["GPUML_FIRST_FIT_BASELINE"]).resolve()
    repeats = 1 if quick else LARGE_REPEATS if large else REPEATS
    cases = LARGE if large else ESTIMATORS
    runs = {}
    for _ in range(repeats):
        for name, n in cases:
            for code, source in sources.items():
                with tempfile.TemporaryDirectory(prefix="gpuml-numba-cache-") as cache_dir:
                    for state in ("cold", "warm"):
                        out = _child(name, n, cache_dir, source)
                        runs.setdefault((name, n, code, state), []).append(out)
                        print(f"{name:34s} {n:>7,} {code:9s} {state}: first fit "
                              f"{out['first_fit_s']:.2f} s ({out['first_fit_cpu_s']:.2f} s "
                              f"CPU), second {out['second_fit_s']:.3f} s", flush=True)
    rows = []
    for (name, n, code, state), outs in runs.items():
        row = {"estimator": name, "n": n, "code": code, "cache": state}
        for key in ("import_s", "first_fit_s", "first_fit_cpu_s", "second_fit_s",
                    "second_fit_cpu_s"):
            row[key] = statistics.median(o[key] for o in outs)
        rows.append(row)
    common = ("cold: empty numba cache (NUMBA_CACHE_DIR a new folder), as right after "
              "installing; warm: a new process with the cache the cold one wrote (every "
              "later process; or run `python -m gpuml.precompile` once after installing). "
              f"Medians of {repeats} runs per row, the versions interleaved; "
              f"{os.cpu_count()} CPU cores, shared with other jobs, so wall times stretch "
              "with the load; *_cpu_s: CPU seconds of the process, much less sensitive to "
              "it. ")
    if large:
        record("first_fit_large", rows,
               title="First fit in a fresh process: large fits of small pieces (CPU)",
               notes=common + "Data: the scale benchmark's synthetic set (28 features, "
                     "float32). A NumPy twin serves only a fit small as a whole "
                     "(gpuml.kernels._jit): these fits' parts (500 rows at P=200) and "
                     "fill blocks are each small, and before the twins judged the whole "
                     "fit they ran the twins throughout, the compile waiting for the fit "
                     "to end. baseline: main before that (commit a2e1676, `git archive "
                     "a2e1676 gpuml | tar -x -C DIR`; `GPUML_FIRST_FIT=large "
                     "GPUML_FIRST_FIT_BASELINE=DIR python -m bench.run first_fit`).",
               command="GPUML_FIRST_FIT=large python -m bench.run first_fit")
        return
    record("first_fit", rows, title="First fit in a fresh process (2,000 x 20, CPU)",
           notes=common + "Since the NumPy twins (gpuml.kernels._jit), a small first fit runs "
                 "them while numba compiles in a background thread started after the fit: "
                 "the second fit shares the interpreter with that compile, and a child that "
                 "exits before it ends writes no cache for the solvers, so its warm child "
                 "runs the twins again.",
           command="python -m bench.run first_fit")


if __name__ == "__main__":
    main()
