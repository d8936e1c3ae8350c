"""``n_partitions="auto"`` against the fixed P = 8 it replaced, where the defaults were chosen.

On the sets of ``casvm_defaults`` (adult 20,000 / 10,000, MAGIC 14,000 / 5,020, letter
15,000 / 5,000, standardised), over three seeds: ``CASVMClassifier()`` with
``n_partitions=8`` and with ``"auto"`` (parts of at most 2,048 rows), all else at the
defaults; accuracy (mean, min, max), the median fit and predict seconds, beside SVC's
accuracy and fit time (one fit). Target (the scaling issue): ``auto`` within the fixed
P's accuracy at these sizes.

Run: ``python -m bench.studies.casvm_auto`` (``--quick``: one seed, smaller sets).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

import numpy as np
from sklearn.svm import SVC

from bench import _harness
from bench._harness import record
from bench.datasets import CASVM_SETS, casvm_split
from gpuml import CASVMClassifier


def main(quick: bool = False, gpu: bool = False):
    seeds = (0,) if quick else (0, 1, 2)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in CASVM_SETS:
            Xtr, Xte, ytr, yte = casvm_split(name, (4000, 2000) if quick else None)
            n_train = len(ytr)
            t0 = time.perf_counter()
            svc = SVC().fit(Xtr, ytr)
            svc_fit = time.perf_counter() - t0
            svc_acc = float((svc.predict(Xte) == yte).mean())
            for P in (8, "auto"):
                acc, fit, pred, chosen = [], [], [], None
                for seed in seeds:
                    t0 = time.perf_counter()
                    clf = CASVMClassifier(n_partitions=P, random_state=seed).fit(Xtr, ytr)
                    fit.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    acc.append(float((clf.predict(Xte) == yte).mean()))
                    pred.append(time.perf_counter() - t0)
                    chosen = clf.n_partitions_
                rows.append({"data": name, "n_train": n_train, "n_partitions": str(P),
                             "P": chosen, "accuracy": 100 * np.mean(acc),
                             "accuracy_min": 100 * min(acc), "accuracy_max": 100 * max(acc),
                             "svc_accuracy": 100 * svc_acc,
                             "fit_s": statistics.median(fit),
                             "predict_s": statistics.median(pred), "svc_fit_s": svc_fit})
                print(rows[-1], flush=True)
    record("casvm_auto" + ("_quick" if quick else ""), rows,
           title="CA-SVM: n_partitions='auto' against the fixed P = 8",
           notes=f"Seeds {seeds}; accuracy in % (mean, min, max over the seeds); fit_s and "
                 "predict_s: medians over the seeds (ours n_jobs=None, the shared 2-core "
                 "machine); SVC: one fit.")


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    _harness.COMMAND = "python -m bench.studies.casvm_auto" + (" --quick" if quick else "")
    main(quick=quick)
