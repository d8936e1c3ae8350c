"""The exact kernel SVM on all of Fashion-MNIST: ``CASVMClassifier(n_partitions=1)`` beside SVC.

60,000 training rows x 784 pixels (/ 255, float32), 10 classes, 10,000 test rows;
scikit-learn's ``SVC()`` and ``CASVMClassifier(n_partitions=1)`` (the same problem: C = 1,
rbf, ``gamma="scale"``, tol 1e-3, 45 one-vs-one SMO problems) and ``CASVMClassifier()``
(its defaults), one after the other in this process. Reported: fit and predict seconds,
test accuracy, support vectors, and the share of test rows on which each model's
prediction equals SVC's. One fit each (they take many minutes on two cores).

Run: ``python -m bench.run fashion_exact`` (``:quick``: 6,000 training rows). Needs the
Debian package ``fashion-mnist`` (``make bench`` installs it).
"""

from __future__ import annotations

import time

import numpy as np

from bench._harness import record


def main(quick: bool = False, gpu: bool = False):
    from sklearn.svm import SVC

    from bench.bench_scale import load_fashion
    from gpuml import CASVMClassifier

    Xtr, Xte, ytr, yte = load_fashion(quick)
    models = [("SVC()", SVC()),
              ("CASVMClassifier(n_partitions=1)", CASVMClassifier(n_partitions=1)),
              ("CASVMClassifier()", CASVMClassifier(random_state=0))]
    rows, reference = [], None
    for name, model in models:
        t0 = time.perf_counter()
        model.fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        pred = model.predict(Xte)
        predict_s = time.perf_counter() - t0
        reference = pred if reference is None else reference
        rows.append({"model": name, "n_train": len(ytr), "fit_s": fit_s,
                     "predict_s": predict_s, "accuracy": float(np.mean(pred == yte)),
                     "n_SV": int(len(model.support_)),
                     "same_as_SVC": float(np.mean(pred == reference))})
        print(rows[-1], flush=True)
    svc = rows[0]
    for r in rows:
        r["fit_vs_SVC"] = r["fit_s"] / svc["fit_s"]
    record("fashion_exact" + ("_quick" if quick else ""), rows,
           title="The exact kernel SVM on Fashion-MNIST: CASVMClassifier against SVC",
           notes=("One fit each, one after the other in one process; SVC runs LIBSVM on one "
                  "thread, gpuml its SMO over both cores. same_as_SVC: share of the 10,000 "
                  "test rows predicted as SVC predicts them."))
    return rows
