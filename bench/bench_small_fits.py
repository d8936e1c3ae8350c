"""Many small fits: ``CASVMClassifier()`` against ``SVC`` where scikit-learn's users meet it.

Nested cross-validation, permutation tests and parameter grids are made of many fits
on small data, so there the fixed cost of a fit (validation, the split, thread pools,
setting up prediction) is what a user pays. On iris, wine, breast cancer and digits
(features standardised), in this one process, alternating the two estimators:

* ``fit_predict``: one ``fit`` + ``predict`` on the whole set (median of ``REPEATS``);
* ``cross_val_score``: 5-fold ``cross_val_score`` (median of ``REPEATS // 4``);
* ``grid``: ``GridSearchCV`` over C and gamma (3 x 3, 5 folds), as scikit-learn's
  ``plot_rbf_parameters`` example (median of three).

``CASVMClassifier()`` (its defaults) is one part, the exact SVM, below 2,049 rows, so it
fits SVC's problem; the predictions are compared (``same_predictions``). Target (the
scaling issue): ``ratio`` (ours over SVC's time) at most 1.2.

Run: ``python -m bench.run small_fits`` (``:quick``: fewer repeats).
"""

from __future__ import annotations

import statistics
import time
import warnings

import numpy as np
from sklearn.datasets import load_breast_cancer, load_digits, load_iris, load_wine
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from bench._harness import record
from gpuml import CASVMClassifier

SETS = {"iris": load_iris, "wine": load_wine, "breast_cancer": load_breast_cancer,
        "digits": load_digits}
REPEATS, QUICK_REPEATS = 40, 8
GRID = {"C": [0.1, 1.0, 10.0], "gamma": [0.01, 0.1, 1.0]}


def _median_time(fn, repeat):
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _side_by_side(ours, theirs, repeat):
    """Median seconds of ``ours`` and ``theirs``, run in turns (one call each per turn)."""
    a, b = [], []
    ours(), theirs()  # warm: compiled kernels, imported modules
    for _ in range(repeat):
        a.append(_median_time(ours, 1))
        b.append(_median_time(theirs, 1))
    return statistics.median(a), statistics.median(b)


def _ours():
    return CASVMClassifier(device="cpu")


def _cases(X, y, repeat):
    """What is timed on one data set: ``{what: (ours, SVC's, repeats)}``."""
    return {
        "fit_predict": (lambda: _ours().fit(X, y).predict(X),
                        lambda: SVC().fit(X, y).predict(X), repeat),
        "cross_val_score": (lambda: cross_val_score(_ours(), X, y, cv=5),
                            lambda: cross_val_score(SVC(), X, y, cv=5), max(2, repeat // 4)),
        "grid": (lambda: GridSearchCV(_ours(), GRID, cv=5).fit(X, y),
                 lambda: GridSearchCV(SVC(), GRID, cv=5).fit(X, y), 3),
    }


def main(quick: bool = False, gpu: bool = False):
    repeat = QUICK_REPEATS if quick else REPEATS
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, load in SETS.items():
            X, y = load(return_X_y=True)
            X = StandardScaler().fit_transform(X)

            same = bool(np.array_equal(_ours().fit(X, y).predict(X),
                                       SVC().fit(X, y).predict(X)))
            for what, (ours, theirs, n) in _cases(X, y, repeat).items():
                ours_s, svc_s = _side_by_side(ours, theirs, n)
                rows.append({"data": name, "n": len(X), "what": what, "ours_s": ours_s,
                             "svc_s": svc_s, "ratio": ours_s / svc_s,
                             "same_predictions": same})
                print(rows[-1], flush=True)
    record("small_fits" + ("_quick" if quick else ""), rows,
           title="Small fits: CASVMClassifier() against SVC",
           notes="Medians of alternating runs in one process (fit_predict: "
                 f"{repeat} each; cross_val_score: {max(2, repeat // 4)}; grid: 3); "
                 "ratio = ours / SVC's time; same_predictions: CASVMClassifier()'s "
                 "predictions on the training set equal SVC's. Target: ratio <= 1.2.")
