"""What CA-SVM's default prediction rule costs beside the nearest-centre rule, from 20,000 to
1,000,000 training rows, and what it keeps of the accuracy.

``CASVMClassifier()`` is fitted once per data set and seed; its test rows are then
predicted three ways on the same fitted parts:

* ``nearest``: ``combine="nearest"``, the model of the nearest centre (You 2020, Alg 5);
* ``neighbors``: the default, ``combine="neighbors"``: the parts holding each row's 20
  nearest support vectors, searched among the vectors of its
  :data:`gpuml.routing.NEIGHBOR_PARTS` nearest parts;
* ``neighbors_8``: the same rule searching 8 parts.

Data: the sets of ``casvm_defaults`` (adult 20,000 / 10,000, MAGIC 14,000 / 5,020,
letter 15,000 / 5,000, standardised; seeds 0, 1, 2) and the scale benchmark's
synthetic set (``make_classification(n_features=28, n_informative=20, n_redundant=4,
flip_y=0.05, class_sep=0.8)``, float32; n = 20,000 ... 1,000,000, 20,000 test rows,
seed 0). Times: the median of three warm predictions. Targets (the scale issue):
the default at most 2x ``nearest`` at every n, its accuracy within 0.1 point of the
neighbours rule's.

Run: ``python -m bench.run casvm_predict`` (``:quick``: 20,000 and 50,000 synthetic rows,
the real sets at 4,000 rows, one seed).
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
import warnings

import numpy as np
from sklearn.datasets import make_classification

from bench._harness import record
from bench.datasets import CASVM_SETS, casvm_split
from gpuml import CASVMClassifier, routing
from gpuml._backend import resolve

SIZES = (20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000)
QUICK_SIZES = (20_000, 50_000)
N_TEST = 20_000
RULES = {"nearest": ("nearest", None), "neighbors": ("neighbors", None),
         "neighbors_8": ("neighbors", 8)}


def _predict(clf, X, combine, searched):
    """The median of three warm predictions' seconds, and the last prediction."""
    clf.set_params(combine=combine)
    default = routing.NEIGHBOR_PARTS
    if searched is not None:
        routing.NEIGHBOR_PARTS = searched
    try:
        clf.predict(X[:100])  # warm: the parts' arrays and compiled loops in place
        seconds = []
        for _ in range(3):
            t0 = time.perf_counter()
            pred = clf.predict(X)
            seconds.append(time.perf_counter() - t0)
    finally:
        routing.NEIGHBOR_PARTS = default
    return statistics.median(seconds), pred


def _measure(name, n_train, Xtr, ytr, Xte, yte, seeds):
    acc = {r: [] for r in RULES}
    secs = {r: [] for r in RULES}
    fits, P, blended, traced = [], None, [], []
    for seed in seeds:
        t0 = time.perf_counter()
        clf = CASVMClassifier(random_state=seed).fit(Xtr, ytr)
        fits.append(time.perf_counter() - t0)
        P = clf.n_partitions_
        clf.set_params(combine="neighbors")
        blended.append(float((clf._part_weights(resolve("cpu"), Xte) > 0).sum(axis=1).mean()))
        tracemalloc.start()
        clf.predict(Xte)
        traced.append(tracemalloc.get_traced_memory()[1] / 2**20)
        tracemalloc.stop()
        for rule, (combine, searched) in RULES.items():
            s, pred = _predict(clf, Xte, combine, searched)
            secs[rule].append(s)
            acc[rule].append(100 * float((pred == yte).mean()))
    row = {"data": name, "n_train": n_train, "n_test": len(yte), "P": P,
           "fit_s": statistics.median(fits)}
    for rule in RULES:
        row[f"{rule}_acc"] = float(np.mean(acc[rule]))
        row[f"{rule}_s"] = statistics.median(secs[rule])
    row["ratio"] = row["neighbors_s"] / row["nearest_s"]
    row["parts_per_row"] = float(np.mean(blended))
    row["predict_mib"] = max(traced)
    row["acc_8"] = row["neighbors_8_acc"] - row["neighbors_acc"]
    row["acc_8_min"] = float(min(np.subtract(acc["neighbors_8"], acc["neighbors"])))
    row["acc_8_max"] = float(max(np.subtract(acc["neighbors_8"], acc["neighbors"])))
    print(row, flush=True)
    return row


def main(quick: bool = False, gpu: bool = False):
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in CASVM_SETS:
            Xtr, Xte, ytr, yte = casvm_split(name, (4000, 2000) if quick else None)
            rows.append(_measure(name, len(ytr), Xtr, ytr, Xte, yte,
                                 (0,) if quick else (0, 1, 2)))
        sizes = QUICK_SIZES if quick else SIZES
        X, y = make_classification(max(sizes) + N_TEST, n_features=28, n_informative=20,
                                   n_redundant=4, flip_y=0.05, class_sep=0.8, random_state=0)
        X = X.astype(np.float32)
        for n in sizes:
            rows.append(_measure("synthetic", n, X[:n], y[:n], X[-N_TEST:], y[-N_TEST:], (0,)))
    record("casvm_predict" + ("_quick" if quick else ""), rows,
           title="CA-SVM prediction: the neighbours rule beside the nearest centre",
           notes=f"CASVMClassifier() (auto P); accuracy in % (mean over the seeds: 0, 1, 2 on "
                 "adult, magic, letter; 0 on synthetic); times: median of three warm "
                 "predictions of the n_test rows (seconds; medians over the seeds), the "
                 "shared 2-core machine; ratio = neighbors_s / nearest_s; neighbors: the "
                 f"default (the {routing.NEIGHBOR_PARTS} nearest parts searched), "
                 "neighbors_8: 8 parts searched; acc_8: neighbors_8_acc - neighbors_acc "
                 "(mean, min, max over the seeds); parts_per_row: the parts a test "
                 "row's default prediction blends, on average; predict_mib: the most memory "
                 "a default prediction of the n_test rows allocated (tracemalloc, MiB).")
