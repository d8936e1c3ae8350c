"""First fit in a fresh process: numba compile included (cold cache) and from the cache (warm).

Each row is one estimator fitted on ``make_classification(2000, 20)`` in a new Python
process: ``cold`` with an empty numba cache directory (``NUMBA_CACHE_DIR`` pointing to a
new folder, as right after installing), ``warm`` in a second new process with the cache
the first one wrote (every later process, or any process after ``python -m
gpuml.precompile``). ``first_fit_s`` includes compiling or loading the CPU kernels;
``second_fit_s`` is a second fit in the same process (no compile); ``import_s`` is
``import gpuml.estimators`` with scikit-learn and numba.

Run: ``python -m bench.run first_fit``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from bench._harness import record

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from sklearn.datasets import make_classification
from gpuml.estimators.asygcd import AsyGCDSVC
from gpuml.estimators.casvm import CASVMClassifier
t_import = time.perf_counter() - t0
X, y = make_classification(2000, 20, random_state=0)
make = {"CASVMClassifier(n_partitions=16)":
            lambda: CASVMClassifier(n_partitions=16, device="cpu", random_state=0),
        "AsyGCDSVC()": lambda: AsyGCDSVC(device="cpu", random_state=0)}[sys.argv[1]]
times = []
for _ in range(2):
    t0 = time.perf_counter()
    make().fit(X, y)
    times.append(time.perf_counter() - t0)
print(json.dumps({"import_s": t_import, "first_fit_s": times[0], "second_fit_s": times[1]}))
"""

ESTIMATORS = ("CASVMClassifier(n_partitions=16)", "AsyGCDSVC()")


def _child(name, cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", CHILD, name], env=env, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(quick: bool = False, gpu: bool = False) -> None:
    rows = []
    for name in ESTIMATORS:
        with tempfile.TemporaryDirectory(prefix="gpuml-numba-cache-") as cache_dir:
            for state in ("cold", "warm"):
                row = {"estimator": name, "cache": state, **_child(name, cache_dir)}
                rows.append(row)
                print(f"{name:34s} {state}: first fit {row['first_fit_s']:.2f} s, second "
                      f"{row['second_fit_s']:.3f} s (import {row['import_s']:.2f} s)",
                      flush=True)
    record("first_fit", rows, title="First fit in a fresh process (2,000 x 20, CPU)",
           notes="cold: empty numba cache (NUMBA_CACHE_DIR a new folder), as right after "
                 "installing; warm: a new process with the cache the cold one wrote (every "
                 "later process; or run `python -m gpuml.precompile` once after installing). "
                 f"{os.cpu_count()} CPU cores.", command="python -m bench.run first_fit")


if __name__ == "__main__":
    main()
