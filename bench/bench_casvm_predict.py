"""What CA-SVM's default prediction rule costs beside the nearest-centre rule, from 20,000 to
1,000,000 training rows, and what it keeps of the neighbours rule's accuracy.

``CASVMClassifier()`` is fitted once per data set and seed; its test rows are then
predicted three ways on the same fitted parts:

* ``nearest``: ``combine="nearest"``, the model of the nearest centre (You 2020, Alg 5);
* ``neighbors``: ``combine="neighbors"``, the parts holding each row's 20 nearest
  support vectors, searched among the vectors of its :data:`gpuml.routing.NEIGHBOR_PARTS`
  nearest parts, weighted by their share;
* ``auto``: the default, ``combine="auto"``: the nearest centre's values where the pairs
  its part trained settle the vote with every value at least ``blend_margin`` from 0,
  the neighbours rule on the other rows (``blended``: their share of the test rows).

Data: the sets of ``casvm_defaults`` (adult 20,000 / 10,000, MAGIC 14,000 / 5,020,
letter 15,000 / 5,000, standardised; seeds 0, 1, 2), each with ``n_partitions="auto"``
and with the 16 parts of ``casvm_defaults``, and the scale benchmark's synthetic set
(``make_classification(n_features=28, n_informative=20, n_redundant=4, flip_y=0.05,
class_sep=0.8)``, float32; n = 20,000 ... 1,000,000, 20,000 test rows, seed 0), and the
same with 10 classes (``n_classes=10, n_clusters_per_class=1, class_sep=1.0``) at 200,000
training rows, where a row's vote has 45 pairs to settle. Times:
the median of five warm predictions, the three rules taking turns. Targets (the scale
issue): the default at most 2x ``nearest`` at every n, its accuracy within 0.1 point of
the neighbours rule's.

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
from gpuml import CASVMClassifier
from gpuml.routing import route

SIZES = (20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000)
QUICK_SIZES = (20_000, 50_000)
N_TEST = 20_000
#: The many-class point: (training rows, classes) of the synthetic set with 10 classes.
MULTICLASS, MULTICLASS_QUICK = (200_000, 10), (20_000, 10)
RULES = ("nearest", "auto", "neighbors")
REPEATS = 5


def _blended_share(clf, X):
    """The share of the rows ``X`` that ``combine="auto"`` blends."""
    values, _ = clf.set_params(combine="nearest")._ovo_values(X)
    return float(clf._unsettled(values, route(X, clf.centers_)).mean())


def _predictions(clf, X):
    """Each rule's median seconds over :data:`REPEATS` warm predictions (the rules taking
    turns, so that a slow spell of the shared machine falls on all of them) and its
    predictions."""
    seconds = {rule: [] for rule in RULES}
    labels = {}
    for rule in RULES:
        labels[rule] = clf.set_params(combine=rule).predict(X)  # warm: arrays, compiled loops
    for _ in range(REPEATS):
        for rule in RULES:
            clf.set_params(combine=rule)
            t0 = time.perf_counter()
            clf.predict(X)
            seconds[rule].append(time.perf_counter() - t0)
    clf.set_params(combine="auto")
    return {rule: statistics.median(s) for rule, s in seconds.items()}, labels


def _measure(name, n_train, Xtr, ytr, Xte, yte, seeds, n_partitions="auto"):
    acc = {r: [] for r in RULES}
    secs = {r: [] for r in RULES}
    fits, P, blended, traced = [], None, [], []
    for seed in seeds:
        t0 = time.perf_counter()
        clf = CASVMClassifier(n_partitions=n_partitions, random_state=seed).fit(Xtr, ytr)
        fits.append(time.perf_counter() - t0)
        P = clf.n_partitions_
        blended.append(_blended_share(clf, Xte))
        seconds, labels = _predictions(clf, Xte)
        for rule in RULES:
            secs[rule].append(seconds[rule])
            acc[rule].append(100 * float((labels[rule] == yte).mean()))
        tracemalloc.start()
        clf.set_params(combine="auto").predict(Xte)
        traced.append(tracemalloc.get_traced_memory()[1] / 2**20)
        tracemalloc.stop()
    row = {"data": name, "n_train": n_train, "n_test": len(yte), "P": P,
           "fit_s": statistics.median(fits)}
    for rule in RULES:
        row[f"{rule}_acc"] = float(np.mean(acc[rule]))
        row[f"{rule}_s"] = statistics.median(secs[rule])
    row["auto_ratio"] = row["auto_s"] / row["nearest_s"]
    row["neighbors_ratio"] = row["neighbors_s"] / row["nearest_s"]
    gap = np.subtract(acc["auto"], acc["neighbors"])
    row["auto_vs_neighbors"] = float(gap.mean())
    row["gap_min"], row["gap_max"] = float(gap.min()), float(gap.max())
    row["blended"] = float(np.mean(blended))
    row["predict_mib"] = max(traced)
    print(row, flush=True)
    return row


def main(quick: bool = False, gpu: bool = False):
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in CASVM_SETS:
            Xtr, Xte, ytr, yte = casvm_split(name, (4000, 2000) if quick else None)
            seeds = (0,) if quick else (0, 1, 2)
            rows.append(_measure(name, len(ytr), Xtr, ytr, Xte, yte, seeds))
            rows.append(_measure(f"{name} (P=16)", len(ytr), Xtr, ytr, Xte, yte, seeds,
                                 n_partitions=16))
        sizes = QUICK_SIZES if quick else SIZES
        X, y = make_classification(max(sizes) + N_TEST, n_features=28, n_informative=20,
                                   n_redundant=4, flip_y=0.05, class_sep=0.8, random_state=0)
        X = X.astype(np.float32)
        for n in sizes:
            rows.append(_measure("synthetic", n, X[:n], y[:n], X[-N_TEST:], y[-N_TEST:], (0,)))
        n, k = MULTICLASS_QUICK if quick else MULTICLASS
        X, y = make_classification(n + N_TEST, n_features=28, n_informative=20, n_redundant=4,
                                   n_classes=k, n_clusters_per_class=1, flip_y=0.05,
                                   class_sep=1.0, random_state=0)
        X = X.astype(np.float32)
        rows.append(_measure(f"synthetic, {k} classes", n, X[:n], y[:n], X[-N_TEST:],
                             y[-N_TEST:], (0,)))
    record("casvm_predict" + ("_quick" if quick else ""), rows,
           title="CA-SVM prediction: the default rule beside the nearest centre and the "
                 "neighbours rule",
           notes="CASVMClassifier() (auto P, or P=16 as casvm_defaults), the same fitted parts "
                 "predicted by each rule; accuracy in % (mean over the seeds: 0, 1, 2 on "
                 "adult, magic, letter; 0 on synthetic); times: median of five warm "
                 "predictions of the n_test rows, the rules taking turns (seconds; medians "
                 "over the seeds), the shared 2-core machine; auto_ratio = auto_s / "
                 "nearest_s, neighbors_ratio = neighbors_s / nearest_s; auto_vs_neighbors: "
                 "auto_acc - neighbors_acc in points (mean; gap_min, gap_max over the "
                 "seeds); blended: the share of test rows the default blends (their "
                 "nearest part's values leave the vote open within blend_margin=0.6); "
                 "predict_mib: the most memory a default prediction of the n_test rows "
                 "allocated (tracemalloc, MiB; a warm prediction: the parts' split of "
                 "the support vectors is kept from the first prediction after the fit).")
