"""CA-SVM partition variants at P=16.

Two ideas for keeping k-means' accuracy at the balanced splitters' speed, measured
against ``sklearn.svm.SVC`` on the same rows (docs/casvm.md quotes the results):

* **capped k-means**: the K-balance fill (k-means centres, each row to the nearest
  part with room) with part capacities ``alpha * n / P`` instead of ``n / P``
  (``alpha = 1`` is K-balance, no cap is k-means);
* **blended routing**: a test row's decision values are the softmax-weighted mean
  of every part's values, weights ``exp(-(d2 - d2_min) / (T * median gap))``.

Run: ``python -m bench.studies.casvm_variants adult 16 20000 10000`` (or ``letter 16
15000 5000``). Slow: one SVC fit on the whole training set first.
"""

import sys
import time

import numpy as np
from sklearn.svm import SVC

import gpuml.partition.algorithms as partition_module
from bench.datasets import load, train_test_split_std
from gpuml import CASVMClassifier
from gpuml.estimators._svm import ovo_votes


def part_values(model, X):
    """Every part's one-vs-one values for every row: shape (P, n, pairs)."""
    P = len(model.partition_sizes_)
    V = np.empty((P, X.shape[0], model.ovo_dual_coef_.shape[0]))
    for p in range(P):
        mine = np.flatnonzero(model.support_part_ == p)
        V[p] = model.part_intercept_[p][None, :]
        if mine.size:
            V[p] += model._kernel.dot(X, model.support_vectors_[mine],
                                      model.ovo_dual_coef_[:, mine].T)
    return V


def blended_accuracy(model, X, y, T):
    V = part_values(model, X)
    d2 = ((X[:, None, :] - model.centers_[None, :, :]) ** 2).sum(-1)
    gap = np.median(np.diff(np.sort(d2, 1)[:, :2], axis=1))
    W = np.exp(-(d2 - d2.min(1, keepdims=True)) / (T * gap + 1e-12))
    W /= W.sum(1, keepdims=True)
    votes, conf = ovo_votes(np.einsum("np,pnq->nq", W, V), len(model.classes_))
    pred = model.classes_[np.argmax(votes + conf / (3 * (np.abs(conf) + 1)), axis=1)]
    return (pred == y).mean()


def main(name, P, n_train, n_test):
    X, y = load(name)
    Xtr, Xte, ytr, yte = train_test_split_std(X, y, train_size=n_train, test_size=n_test,
                                              random_state=0)
    t0 = time.perf_counter()
    acc_svc = (SVC(C=1, gamma="scale").fit(Xtr, ytr).predict(Xte) == yte).mean()
    t_svc = time.perf_counter() - t0
    capacities = partition_module.capacities
    try:
        for alpha in (1.0, 1.5, 2.0, 3.0, None):
            for seed in (0, 1):
                method = "kmeans" if alpha is None else "kbalance"
                if alpha is not None:
                    def capped(n, k, larger_first=None, _a=alpha):
                        return np.ceil(capacities(n, k, larger_first) * _a).astype(np.int64)
                    partition_module.capacities = capped
                model = CASVMClassifier(n_partitions=P, partition=method, random_state=seed)
                t0 = time.perf_counter()
                model.fit(Xtr, ytr)
                t_fit = time.perf_counter() - t0
                partition_module.capacities = capacities
                loss = 100 * (acc_svc - (model.predict(Xte) == yte).mean())
                blend = 100 * (acc_svc - blended_accuracy(model, Xte, yte, 0.5))
                print(f"{name} P={P} alpha={alpha} seed={seed}: {t_svc / t_fit:.1f}x SVC, "
                      f"loss {loss:+.2f} (blended {blend:+.2f}), largest part "
                      f"{model.partition_sizes_.max()}", flush=True)
    finally:
        partition_module.capacities = capacities


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
