"""How many threads a default ``CASVMClassifier()`` / ``BKRRRegressor()`` fit solves its parts
in, and what it gains.

``n_jobs=None`` (the default) chooses the threads by the fit's work
(:func:`gpuml.kernels.part_threads`: one per
:data:`~gpuml.kernels._threads.PART_THREAD_MIN_WORK` of the problems' squared sizes, at
most the threads BLAS may use). Each case is fitted with ``n_jobs=1``, the default and
``n_jobs=-1`` (every core), the three taking turns, on the same split
(``random_state=0``), and the models compared on the first 5,000 fitted rows. The
threads change which part each solves and BLAS's own threads (one inside each solver
thread, all of them on one), and OpenBLAS rounds a product differently on different
numbers of threads, so the models agree to rounding, not bit for bit (``agree``: for
CA-SVM the share of equal labels, for BKRR the largest difference of a prediction over
the targets' standard deviation; the three fits against the default).

Cases: CA-SVM on digits (1,797 x 64, 10 classes, one part: 45 small problems), the
scale benchmark's synthetic set (``make_classification(n_features=28, n_informative=20,
n_redundant=4, flip_y=0.05, class_sep=0.8)``, float32) at 3,000 to 100,000 rows and
adult (36,631 x 108, standardised, float32, as the scale benchmark fits it); BKRR on
``make_regression(n_features=28, n_informative=20, noise=5)`` (float32) at 3,000 to
100,000 rows and california (16,512 x 8, standardised).

Run: ``python -m bench.run part_threads`` (``:quick``: fewer cases, one repeat fewer).
"""

from __future__ import annotations

import statistics
import time
import warnings

import numpy as np
from sklearn.datasets import load_digits, make_classification, make_regression

from bench._harness import record
from bench.datasets import DatasetMissing, load, train_test_split_std
from gpuml import BKRRRegressor, CASVMClassifier
from gpuml.kernels import part_threads

SIZES = (3_000, 6_000, 12_000, 20_000, 50_000, 100_000)
QUICK_SIZES = (3_000, 20_000)
SETTINGS = {"one": 1, "default": None, "all": -1}


def _real(name, test_size):
    try:
        Xtr, _, ytr, _ = train_test_split_std(*load(name), random_state=0, test_size=test_size)
    except DatasetMissing as e:
        print(f"{name}: skipped, {e}", flush=True)
        return None
    return Xtr.astype(np.float32), ytr


def _cases(quick):
    sizes = QUICK_SIZES if quick else SIZES
    X, y = load_digits(return_X_y=True)
    yield CASVMClassifier, "digits", X, y
    X, y = make_classification(max(sizes), n_features=28, n_informative=20, n_redundant=4,
                               flip_y=0.05, class_sep=0.8, random_state=0)
    X = X.astype(np.float32)
    for n in sizes:
        yield CASVMClassifier, f"synthetic {n:,}", X[:n], y[:n]
    if not quick and (adult := _real("adult", 0.25)) is not None:
        yield CASVMClassifier, "adult", *adult
    X, y = make_regression(max(sizes), n_features=28, n_informative=20, noise=5.0,
                           random_state=0)
    X = X.astype(np.float32)
    for n in sizes:
        yield BKRRRegressor, f"regression {n:,}", X[:n], y[:n]
    if not quick and (california := _real("california", 0.2)) is not None:
        yield BKRRRegressor, "california", *california


def _problem_sizes(model, y):
    """The sizes of the fit's problems: a part's is its size, except that one CA-SVM part
    of several classes has one per pair of classes."""
    if isinstance(model, CASVMClassifier) and len(model.classes_) > 2:
        counts = np.bincount(np.searchsorted(model.classes_, y))
        return np.array([counts[a] + counts[b] for a in range(len(counts))
                         for b in range(a + 1, len(counts))])
    return model.partition_sizes_ if isinstance(model, CASVMClassifier) else model.part_sizes_


def _measure(cls, name, X, y, repeats):
    cls(random_state=0).fit(X[:500], y[:500])  # compiled loops loaded
    seconds = {key: [] for key in SETTINGS}
    models = {}
    for _ in range(repeats):
        for key, n_jobs in SETTINGS.items():
            t0 = time.perf_counter()
            models[key] = cls(n_jobs=n_jobs, random_state=0).fit(X, y)
            seconds[key].append(time.perf_counter() - t0)
    model = models["default"]
    row = {"estimator": cls.__name__, "data": name, "n": len(y), "P": model.n_partitions_,
           "threads": part_threads(None, _problem_sizes(model, y))}
    for key in SETTINGS:
        row[f"{key}_s"] = statistics.median(seconds[key])
    row["default_speedup"] = row["one_s"] / row["default_s"]
    row["all_speedup"] = row["one_s"] / row["all_s"]
    rows = X[:5000]
    reference = model.predict(rows)
    if cls is CASVMClassifier:
        row["agree"] = min(float(np.mean(models[k].predict(rows) == reference))
                           for k in SETTINGS)
    else:
        row["agree"] = max(float(np.abs(models[k].predict(rows) - reference).max())
                           for k in SETTINGS) / float(np.std(y))
    print(row, flush=True)
    return row


def main(quick: bool = False, gpu: bool = False):
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cls, name, X, y in _cases(quick):
            rows.append(_measure(cls, name, X, y, 2 if quick else 3))
    record("part_threads" + ("_quick" if quick else ""), rows,
           title="The default fit's threads over parts (CA-SVM, BKRR)",
           notes="Each estimator with random_state=0 fitted with n_jobs=1 (one_s), n_jobs=None "
                 "(the default, default_s) and n_jobs=-1 (all_s), taking turns; seconds: "
                 "median of three fits (two in quick runs) on the shared machine; threads: "
                 "what n_jobs=None chose (gpuml.kernels.part_threads); *_speedup: one_s over "
                 "the setting's; agree (the three fits against the default's, on the first "
                 "5,000 fitted rows): CA-SVM the share of equal labels, BKRR the largest "
                 "prediction difference over std(y) (equal to rounding: OpenBLAS rounds a "
                 "product differently on different numbers of threads).")
