"""CA-SVM with float32 kernel matrices (one SSYRK) against the same fits in the data's dtype.

rbf parts of 2,048+ rows, and of 1,024+ rows when the fit has several parts, build their
kernel matrix in float32 on centred rows (``gpuml.kernels.smo.cpu.sgemm_matrix``, as
LIBSVM stores its values in float); this runs the same fits with that switched off
(every matrix in float64, as before), interleaved in one process, BLAS on one thread:
adult (36,631 x 108, standardised, float64) with P=16 (parts of ~2,290 rows), with the
default ``n_partitions="auto"`` (18 parts of ~2,035 rows) and one part of 6,000 rows.
Reports the median fit times, the speed-up, the test accuracy of both and the largest
difference of their decision values (SMO's tol is 1e-3).

Run: ``python -m bench.run casvm_sgemm``.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from bench._harness import record
from bench.datasets import load_adult, train_test_split_std


def main(quick: bool = False, gpu: bool = False) -> None:
    from threadpoolctl import threadpool_limits

    import gpuml.kernels.smo.cpu as smo
    from gpuml import CASVMClassifier

    X, y = load_adult()
    Xtr, Xte, ytr, yte = train_test_split_std(X, y)
    sgemm = smo.sgemm_rows
    settings = {"float64": lambda kernel, X, min_rows=None: None, "float32 SGEMM": sgemm}
    cases = (((16, None), ("auto", None), (1, 6000)) if not quick
             else ((4, 12000),))  # parts of 3,000 rows
    rows = []
    try:
        with threadpool_limits(1):
            for P, n in cases:
                Xa, ya = (Xtr, ytr) if n is None else (Xtr[:n], ytr[:n])
                times = {name: [] for name in settings}
                models = {}
                for _ in range(1 if quick else 3):
                    for name, rule in settings.items():
                        smo.sgemm_rows = rule
                        t0 = time.perf_counter()
                        models[name] = CASVMClassifier(n_partitions=P, random_state=0,
                                                       n_jobs=1).fit(Xa, ya)
                        times[name].append(time.perf_counter() - t0)
                ref, new = models["float64"], models["float32 SGEMM"]
                diff = np.abs(ref.decision_function(Xte) - new.decision_function(Xte)).max()
                t64 = statistics.median(times["float64"])
                t32 = statistics.median(times["float32 SGEMM"])
                rows.append({"case": f"adult P={P}", "n_train": len(ya), "float64_s": t64,
                             "sgemm_s": t32, "speedup": t64 / t32,
                             "accuracy_float64": ref.score(Xte, yte),
                             "accuracy_sgemm": new.score(Xte, yte),
                             "max_decision_diff": float(diff)})
    finally:
        smo.sgemm_rows = sgemm
    record("casvm_sgemm", rows, title="CA-SVM: float32 kernel matrices vs float64",
           notes="Median of 3 interleaved fits each, BLAS on one thread, n_jobs=1, the "
                 "shared 2-core machine. P=auto: the default n_partitions (parts just "
                 "under 2,048 rows), whose float32 matrices come from the 1,024-row "
                 "threshold of partitioned fits (gpuml.kernels.smo.cpu.PART_SGEMM_MIN_ROWS). "
                 "max_decision_diff: largest difference of the test decision values; under "
                 "combine='auto' a row whose nearest part's value lies near blend_margin "
                 "may be blended in one fit and not in the other.",
           command="python -m bench.run casvm_sgemm")


if __name__ == "__main__":
    main()
