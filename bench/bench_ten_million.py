"""Ten million rows on the CPU: ``CASVMClassifier()`` and ``BKRRRegressor()`` at their defaults.

The far end of the scale benchmark's n-curve, gpuml alone (no alternative runs at this
size in useful time on a few cores): the synthetic sets of ``bench_scale`` (same
generators, ``random_state=0``) drawn at 10,000,000 training rows plus 20,000 test rows,
float32. Per estimator: fit and predict seconds (the 20,000 test rows), test accuracy or
R², P and the largest part, and the peak increase of the process's resident memory during
the fit (``bench_scale.measure``; the data are drawn before). One fit each.

Run: ``python -m bench.run ten_million`` (about 20 minutes on 2 cores; ``:quick``:
1,000,000 rows).
"""

from __future__ import annotations

import time

from bench._harness import record
from bench.bench_gpu_scale import score
from bench.bench_scale import draw_synthetic, fitted_sizes, measure

N, QUICK_N, N_TEST = 10_000_000, 1_000_000, 20_000


def main(quick: bool = False, gpu: bool = False):
    import gpuml

    n = QUICK_N if quick else N
    rows = []
    for task, make in (("classification", gpuml.CASVMClassifier),
                       ("regression", gpuml.BKRRRegressor)):
        t0 = time.perf_counter()
        X, y = draw_synthetic(task == "classification", n + N_TEST)
        draw_s = time.perf_counter() - t0
        est = make(random_state=0)
        _, pred, figures = measure(lambda est=est, X=X, y=y: est.fit(X[:n], y[:n]),
                                   lambda est=est, X=X: est.predict(X[-N_TEST:]))
        row = {"task": task, "method": type(est).__name__, "n_train": n, "draw_s": draw_s,
               **figures, "score": score(task, pred, y[-N_TEST:]), **fitted_sizes(est)}
        print(row, flush=True)
        rows.append(row)
        del X, y, est
    record("ten_million" + ("_quick" if quick else ""), rows,
           title="Ten million rows on the CPU: the defaults",
           notes=f"bench_scale's synthetic sets drawn at n + {N_TEST:,} rows (float32), the "
                 f"last {N_TEST:,} the test rows; score: accuracy or R²; *_mib: peak increase "
                 "of the resident memory during fit / predict; one fit each, default threads.")
    return rows
