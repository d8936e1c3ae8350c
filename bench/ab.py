"""A/B of two source trees of gpuml on the same fits: is a change faster, slower, the same?

Two versions of one package cannot share a process, so each round runs the
workload once in a fresh interpreter per tree, the trees alternating (A B, then
B A, ...), and every fit is timed inside its process after a warm-up fit (no
import or compile time counted). The medians and their ratio are printed, with
the models' predictions compared (a behaviour-preserving change gives equal
predictions).

    python -m bench.ab OLD_TREE NEW_TREE [--rounds 5] [--quick]

``OLD_TREE``/``NEW_TREE``: folders holding a ``gpuml`` package (e.g. a
``git worktree`` of the commit before a change, and this checkout). The Dask
workload starts a two-worker ``LocalCluster`` in each process; ``predict`` times
``CASVMClassifier()``'s prediction of 20,000 rows after a fit on ``--n`` rows (fitted
in each process, not timed) and a first prediction, ``predict100`` the median of 21
predictions of 100 rows each, ``predict26`` the prediction of 20,000 rows of 26 classes (as
letter's) by ``CASVMClassifier(n_partitions=1)`` fitted on ``--n`` rows (325 one-vs-one
pairs a row).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

WORKLOADS = ("casvm", "bkrr", "dask", "predict", "predict100", "predict26")

_CHILD = r"""
import json, sys, time, warnings
import numpy as np
warnings.simplefilter("ignore")
from sklearn.datasets import make_classification, make_regression
kind, n = sys.argv[1], int(sys.argv[2])
import gpuml
from gpuml import BKRRRegressor, CASVMClassifier
if kind == "bkrr":
    X, y = make_regression(n, 16, noise=1.0, random_state=0)
    X = X / X.std(axis=0); y = y / y.std()
    make = lambda: BKRRRegressor(n_partitions=16, random_state=0, device="cpu")
else:
    X, y = make_classification(n, 28, n_informative=20, n_redundant=4, flip_y=0.05,
                               class_sep=0.8, random_state=0)
    make = lambda: CASVMClassifier(n_partitions=16, random_state=0, device="cpu")
if kind in ("predict", "predict100", "predict26"):  # a predict after a fit on n
    if kind == "predict26":  # the exact SVM of 26 classes
        X, y = make_classification(n + 20000, 16, n_informative=12, n_classes=26,
                                   n_clusters_per_class=1, class_sep=2.0, random_state=0)
        model = CASVMClassifier(n_partitions=1, device="cpu").fit(X[:n], y[:n])
    else:  # CASVMClassifier()
        X, y = make_classification(n + 20000, 28, n_informative=20, n_redundant=4,
                                   flip_y=0.05, class_sep=0.8, random_state=0)
        X = X.astype(np.float32)
        model = CASVMClassifier(random_state=0, device="cpu").fit(X[:n], y[:n])
    model.predict(X[n:n + 100])
    if kind != "predict100":  # 20,000 rows
        t0 = time.perf_counter(); pred = model.predict(X[n:]); seconds = time.perf_counter() - t0
    else:  # 100 rows at a time: the median of 21 calls
        calls = []
        for i in range(21):
            t0 = time.perf_counter(); model.predict(X[n + 100 * i:n + 100 * (i + 1)])
            calls.append(time.perf_counter() - t0)
        seconds, pred = float(np.median(calls)), model.predict(X[n:])
    print(json.dumps({"seconds": seconds, "pred": np.asarray(pred[:2000]).tolist(),
                      "gpuml": gpuml.__file__}))
    sys.exit(0)
data = (X, y)
if kind == "dask":
    import dask.array as da
    from distributed import Client, LocalCluster
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                           silence_logs=50)
    client = Client(cluster)
    data = client.persist([da.from_array(X, chunks=(n // 8, X.shape[1])),
                           da.from_array(y, chunks=n // 8)])
make().fit(*data)  # warm-up: compiles, imports, the cluster's first tasks
t0 = time.perf_counter(); model = make().fit(*data); seconds = time.perf_counter() - t0
pred = np.asarray(model.predict(X[:2000]))
print(json.dumps({"seconds": seconds, "pred": pred.tolist(), "gpuml": gpuml.__file__}))
"""


def _run(tree, kind, n):
    env = dict(os.environ, PYTHONPATH=tree)
    # in the tree: ``python -c`` puts the working folder first on the path, before PYTHONPATH
    out = subprocess.run([sys.executable, "-c", _CHILD, kind, str(n)], env=env, cwd=tree,
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not os.path.realpath(result["gpuml"]).startswith(os.path.realpath(tree) + os.sep):
        raise RuntimeError(f"the child imported {result['gpuml']}, not the tree {tree}")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small data, two rounds")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--n", type=int, default=20000, help="training rows (default 20,000)")
    args = ap.parse_args(argv)
    n = 4000 if args.quick else args.n
    rounds = 2 if args.quick else args.rounds
    print(f"n={n}, {rounds} rounds, trees alternating; A = {args.old}, B = {args.new}")
    for kind in args.workloads.split(","):
        times = {"A": [], "B": []}
        same = True
        for r in range(rounds):
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            preds = {}
            for label in order:
                tree = args.old if label == "A" else args.new
                out = _run(tree, kind, n)
                times[label].append(out["seconds"])
                preds[label] = np.asarray(out["pred"])
            same &= bool(np.allclose(preds["A"], preds["B"], rtol=1e-9, atol=1e-12))
        a, b = np.median(times["A"]), np.median(times["B"])
        print(f"{kind:6s} A {a:7.3f} s  B {b:7.3f} s  B/A {b / a:5.2f}  "
              f"(A {np.round(times['A'], 3).tolist()}, B {np.round(times['B'], 3).tolist()})"
              f"  predictions {'equal' if same else 'DIFFER'}", flush=True)
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"{time.perf_counter() - t0:.0f} s in all")
    sys.exit(code)
