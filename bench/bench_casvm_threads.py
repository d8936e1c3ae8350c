"""How many threads a default ``CASVMClassifier()`` fit solves its parts in, and what it gains.

``n_jobs=None`` (the default) chooses the solver's threads by the fit's work
(:func:`gpuml.kernels.smo_threads`: one per :data:`~gpuml.kernels.smo.cpu.THREAD_MIN_WORK`
of the problems' squared sizes, at most the threads BLAS may use). Each case is fitted
with ``n_jobs=1``, the default and ``n_jobs=-1`` (every core), the three taking turns,
on the same split (``random_state=0``), and the models compared on the fitted rows.
The threads change which part each solves, and BLAS's own threads while the parts'
kernel matrices are made, and OpenBLAS rounds a product differently on different
numbers of threads, so the models agree to rounding, not bit for bit (``agree``: the
share of equal labels on the first 5,000 fitted rows; ``max_intercept_diff``: the largest
difference of a part's intercept, over the three fits against the default).

Cases: digits (1,797 x 64, 10 classes, one part: 45 small problems), the scale
benchmark's synthetic set (``make_classification(n_features=28, n_informative=20,
n_redundant=4, flip_y=0.05, class_sep=0.8)``, float32) at 3,000 to 100,000 rows, and
adult (36,631 x 108 rows, standardised, float32, as the scale benchmark fits it).

Run: ``python -m bench.run casvm_threads`` (``:quick``: fewer cases, one repeat fewer).
"""

from __future__ import annotations

import statistics
import time
import warnings

import numpy as np
from sklearn.datasets import load_digits, make_classification

from bench._harness import record
from bench.datasets import DatasetMissing, load, train_test_split_std
from gpuml import CASVMClassifier
from gpuml.kernels import smo_threads

SIZES = (3_000, 6_000, 12_000, 20_000, 50_000, 100_000)
QUICK_SIZES = (3_000, 20_000)
SETTINGS = {"one": 1, "default": None, "all": -1}


def _cases(quick):
    X, y = load_digits(return_X_y=True)
    yield "digits", X, y
    sizes = QUICK_SIZES if quick else SIZES
    X, y = make_classification(max(sizes), n_features=28, n_informative=20, n_redundant=4,
                               flip_y=0.05, class_sep=0.8, random_state=0)
    X = X.astype(np.float32)
    for n in sizes:
        yield f"synthetic {n:,}", X[:n], y[:n]
    if not quick:
        try:
            Xtr, _, ytr, _ = train_test_split_std(*load("adult"), random_state=0, test_size=0.25)
        except DatasetMissing as e:
            print(f"adult: skipped, {e}", flush=True)
            return
        yield "adult", Xtr.astype(np.float32), ytr


def _measure(name, X, y, repeats):
    CASVMClassifier(random_state=0).fit(X[:500], y[:500])  # compiled loops loaded
    seconds = {key: [] for key in SETTINGS}
    models = {}
    for _ in range(repeats):
        for key, n_jobs in SETTINGS.items():
            t0 = time.perf_counter()
            models[key] = CASVMClassifier(n_jobs=n_jobs, random_state=0).fit(X, y)
            seconds[key].append(time.perf_counter() - t0)
    clf = models["default"]
    row = {"data": name, "n": len(y), "P": clf.n_partitions_,
           "threads": smo_threads(None, _problem_sizes(clf, y))}
    for key in SETTINGS:
        row[f"{key}_s"] = statistics.median(seconds[key])
    row["default_speedup"] = row["one_s"] / row["default_s"]
    row["all_speedup"] = row["one_s"] / row["all_s"]
    rows = X[:5000]
    labels = clf.predict(rows)
    row["agree"] = min(float(np.mean(models[k].predict(rows) == labels)) for k in SETTINGS)
    row["max_intercept_diff"] = max(float(np.abs(models[k].part_intercept_
                                                 - clf.part_intercept_).max()) for k in SETTINGS)
    print(row, flush=True)
    return row


def _problem_sizes(clf, y):
    """The sizes of the fit's problems: a binary part's is its size; one part of several
    classes has one per pair of classes."""
    if len(clf.classes_) == 2:
        return clf.partition_sizes_
    counts = np.bincount(np.searchsorted(clf.classes_, y))
    return np.array([counts[a] + counts[b] for a in range(len(counts))
                     for b in range(a + 1, len(counts))])


def main(quick: bool = False, gpu: bool = False):
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, X, y in _cases(quick):
            rows.append(_measure(name, X, y, 2 if quick else 3))
    record("casvm_threads" + ("_quick" if quick else ""), rows,
           title="CA-SVM: the default fit's solver threads",
           notes="CASVMClassifier(random_state=0) fitted with n_jobs=1 (one_s), n_jobs=None "
                 "(the default, default_s) and n_jobs=-1 (all_s), taking turns; seconds: "
                 "median of three fits (two in quick runs) on the shared machine; threads: "
                 "what n_jobs=None chose (gpuml.kernels.smo_threads); *_speedup: one_s over "
                 "the setting's; agree: the share of equal labels on the first "
                 "5,000 fitted rows, max_intercept_diff: of the parts' intercepts, the three "
                 "fits against the default's (equal to rounding: "
                 "OpenBLAS rounds a product differently on different numbers of threads).")
