"""CA-SVM vs sklearn.svm.SVC on adult and letter (seed 001, Tables 2.9-2.18).

Three tables, ours and SVC in one process on the same standardised 75/25 split:

1. ``casvm_exact``: n_partitions=1 against SVC with the same C, gamma, tol —
   fit-time ratio, accuracy, dual objective, support vectors, agreement.
2. ``casvm_parts``: CA-SVM (random split) with P in {4, 16, 64} — speed-up
   over SVC and accuracy loss, the trade-off that picks the default P.
3. ``casvm_partitioners``: the five partitioners at P=16 on adult, like
   Table 2.9 (accuracy, partition time, training time, SMO iterations).

``--gpu`` runs the same with ``device="cuda"`` (SVC stays on the CPU).
"""

from __future__ import annotations

import os
import time

import numpy as np
from sklearn.svm import SVC

from bench._harness import record
from bench.datasets import load_adult, load_letter, train_test_split_std
from gpuml.estimators._partitioned import split
from gpuml.estimators.casvm import CASVMClassifier
from gpuml.kernels import make_kernel


def svc_objective(svc, X):
    """Sum over SVC's one-vs-one problems of LIBSVM's dual objective 1/2 a'Qa - sum(a)."""
    kernel = make_kernel(svc.kernel, svc.gamma, svc.degree, svc.coef0, X)
    starts = np.concatenate([[0], np.cumsum(svc.n_support_)])
    total = 0.0
    k = len(svc.classes_)
    for a in range(k):
        for b in range(a + 1, k):
            sa, sb = slice(starts[a], starts[a + 1]), slice(starts[b], starts[b + 1])
            coef = np.concatenate([svc.dual_coef_[b - 1, sa], svc.dual_coef_[a, sb]])
            idx = np.concatenate([svc.support_[sa], svc.support_[sb]])
            total += 0.5 * coef @ kernel.dot(X[idx], X[idx], coef) - np.abs(coef).sum()
    return total


def timed_fit(est, X, y):
    t0 = time.perf_counter()
    est.fit(X, y)
    return time.perf_counter() - t0


def datasets(quick):
    X, y = load_adult()
    train = 8000 if quick else None
    yield ("adult",) + tuple(train_test_split_std(X, y, test_size=0.25, train_size=train,
                                                  random_state=0))
    X, y = load_letter()
    train = 4000 if quick else None
    yield ("letter",) + tuple(train_test_split_std(X, y, test_size=0.25, train_size=train,
                                                   random_state=0))


def main(quick: bool = False, gpu: bool = False):
    device = "cuda" if gpu else "cpu"
    n_jobs = -1
    exact, parts, table29 = [], [], []
    for name, Xtr, Xte, ytr, yte in datasets(quick):
        # Warm up (numba cache, CUDA compiles of both SMO kernels) so no compile is timed.
        for P, n in ((1, 4200), (2, 400)):
            CASVMClassifier(n_partitions=P, device=device).fit(Xtr[:n], ytr[:n])
        svc = SVC(C=1.0, gamma="scale", tol=1e-3)
        t_svc = timed_fit(svc, Xtr, ytr)
        acc_svc = svc.score(Xte, yte)
        pred_svc = svc.predict(Xte)
        ours = CASVMClassifier(n_partitions=1, device=device, n_jobs=n_jobs)
        t_ours = timed_fit(ours, Xtr, ytr)
        obj_svc = svc_objective(svc, Xtr)
        obj_ours = float(np.nansum(ours.objective_))
        exact.append({
            "data": name, "n_train": len(ytr), "svc_s": t_svc, "ours_s": t_ours,
            "time_ratio": t_ours / t_svc, "svc_acc": acc_svc, "ours_acc": ours.score(Xte, yte),
            "obj_rel_diff": abs(obj_ours - obj_svc) / abs(obj_svc),
            "svc_n_sv": len(svc.support_), "ours_n_sv": len(ours.support_),
            "agreement": float(np.mean(ours.predict(Xte) == pred_svc)),
            "svc_iter": int(np.sum(svc.n_iter_)), "ours_iter": int(ours.n_iter_.sum()),
        })
        print(exact[-1], flush=True)
        for P in ((4, 16) if quick else (4, 8, 16, 64)):
            clf = CASVMClassifier(n_partitions=P, device=device, n_jobs=n_jobs, random_state=0)
            t = timed_fit(clf, Xtr, ytr)
            acc = clf.score(Xte, yte)
            parts.append({"data": name, "P": P, "fit_s": t, "speedup_vs_svc": t_svc / t,
                          "acc": acc, "acc_loss_points": 100 * (acc_svc - acc),
                          "n_sv": len(clf.support_), "iters": int(clf.n_iter_.sum())})
            print(parts[-1], flush=True)
        if name != "adult":
            continue
        for method in ("random", "fcfs", "kmeans", "kbalance", "bkm"):
            t0 = time.perf_counter()
            split(Xtr, 16, method, 0)
            t_init = time.perf_counter() - t0
            clf = CASVMClassifier(n_partitions=16, partition=method, device=device,
                                  n_jobs=n_jobs, random_state=0)
            t = timed_fit(clf, Xtr, ytr)
            table29.append({"method": method, "acc": clf.score(Xte, yte), "init_s": t_init,
                            "train_s": t - t_init, "fit_s": t, "iters": int(clf.n_iter_.sum()),
                            "max_part_iters": int(clf.n_iter_.sum(axis=1).max()),
                            "sizes_min_max": f"{clf.partition_sizes_.min()}-"
                                             f"{clf.partition_sizes_.max()}"})
            print(table29[-1], flush=True)
    cores = os.cpu_count()
    notes = (f"C=1, gamma='scale', tol=1e-3; ours n_jobs=-1 on {cores} cores (SVC is "
             "single-threaded); cache_size: ours 1024 MB per part, SVC 200 MB (its default). "
             "Times are single fits on a shared machine.")
    suffix = "_quick" if quick else ""
    record("casvm_exact" + suffix, exact, gpu=gpu, title="CA-SVM exact mode (P=1) vs SVC",
           notes=notes)
    record("casvm_parts" + suffix, parts, gpu=gpu, title="CA-SVM P parts vs SVC", notes=notes)
    record("casvm_partitioners" + suffix, table29, gpu=gpu,
           title="Partitioners at P=16 on adult (Table 2.9 style)", notes=notes)


if __name__ == "__main__":
    main()
