"""How CA-SVM's parts should judge a sample.

The ideas measured before ``part_C`` and ``combine`` became CA-SVM's defaults
(docs/casvm.md, "Defaults", quotes the results), at P=16 over three partition
seeds against ``sklearn.svm.SVC`` fitted once on the same rows (You 2020's
CA-SVM, chapter 2, Alg 5, is the ``nearest`` row with the whole problem's C):

* ``nearest``: the model of the part whose centre is nearest (Alg 5);
* ``centres-k``: the k nearest centres' decision values, softmax-weighted by
  ``exp(-(d2 - d2_min) / median gap)`` (the gap between the two nearest centres);
* ``rows-10``: the parts of the 10 nearest training rows, weighted by their share;
* ``kernel-mass``: every part weighted by its rows' summed kernel values;
* ``svs-k``: the parts of the k = 5, 10, 20 nearest support vectors
  (``combine="neighbors"``, ``n_neighbors=k``);

each for the parts' SVMs trained with C (``part_C="none"``) and with C scaled by
sqrt(n/m) = 4 (``part_C="sqrt"``).

Run: ``python -m bench.studies.casvm_prediction adult`` (or ``magic``), and
``python -m bench.studies.casvm_prediction letter-large-p`` for the defaults
against Alg 5 at P = 32, 64, 128 on letter (one seed). Slow: SVC first.
"""

import sys
import time
import warnings

import numpy as np
from sklearn.svm import SVC

from bench.datasets import casvm_split
from gpuml import PartitionWarning
from gpuml.estimators.casvm import CASVMClassifier
from gpuml.kernels.pairwise import sq_distances
from gpuml.partition import split
from gpuml.routing import neighbor_weights

P = 16
SEEDS = (0, 1, 2)


def data(name):
    return casvm_split(name)


def part_values(model, X):
    """Every part's decision value (binary, LIBSVM's sign) for every row: shape (P, n)."""
    values = np.empty((P, X.shape[0]))
    for p in range(P):
        mine = np.flatnonzero(model.support_part_ == p)
        values[p] = model.part_intercept_[p][0]
        if mine.size:
            values[p] += model._kernel.dot(X, model.support_vectors_[mine],
                                           model.ovo_dual_coef_[0, mine])
    return values


def rule_weights(model, labels, Xtr, Xte, nearest_rows):
    """``{rule: (n, P) weights}`` for the prediction rules of the module notes."""
    n = Xte.shape[0]
    line = np.arange(n)
    d2 = sq_distances(Xte, model.centers_)
    order = np.argsort(d2, axis=1)
    out = {"nearest": np.eye(P)[order[:, 0]]}
    gap = np.median(d2[line, order[:, 1]] - d2[line, order[:, 0]])
    for k in (2, 3):
        w = np.zeros((n, P))
        top = order[:, :k]
        w[line[:, None], top] = np.exp(-(np.take_along_axis(d2, top, 1)
                                         - d2[line, order[:, 0]][:, None]) / gap)
        out[f"centres-{k}"] = w / w.sum(axis=1, keepdims=True)
    counts = np.zeros((n, P))
    np.add.at(counts, (np.repeat(line, 10), labels[nearest_rows].ravel()), 1.0)
    out["rows-10"] = counts / 10
    mass = np.zeros((n, P))
    for start in range(0, n, 1000):
        K = np.exp(-model._gamma * sq_distances(Xte[start:start + 1000], Xtr))
        for p in range(P):
            mass[start:start + 1000, p] = K[:, labels == p].sum(axis=1)
    out["kernel-mass"] = mass / mass.sum(axis=1, keepdims=True)
    for k in (5, 10, 20):
        out[f"svs-{k}"] = neighbor_weights(Xte, model.support_vectors_, model.support_part_, P,
                                           k)
    return out


def ideas(name):
    Xtr, Xte, ytr, yte = data(name)
    t0 = time.perf_counter()
    svc = SVC(C=1.0, gamma="scale").fit(Xtr, ytr)
    t_svc = time.perf_counter() - t0
    acc_svc = svc.score(Xte, yte)
    nearest_rows = np.argsort(sq_distances(Xte, Xtr), axis=1)[:, :10]
    for partition in ("fcfs", "random", "kmeans"):
        for part_C in ("none", "sqrt"):
            losses, speed = {}, []
            for seed in SEEDS:
                model = CASVMClassifier(n_partitions=P, partition=partition, part_C=part_C,
                                        combine="nearest", n_jobs=-1, random_state=seed)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", PartitionWarning)
                    t0 = time.perf_counter()
                    model.fit(Xtr, ytr)
                    speed.append(t_svc / (time.perf_counter() - t0))
                labels = split(Xtr, P, partition, seed).labels
                values = part_values(model, Xte)
                for rule, w in rule_weights(model, labels, Xtr, Xte, nearest_rows).items():
                    blended = np.einsum("np,pn->n", w, values)
                    pred = np.where(blended > 0, model.classes_[0], model.classes_[1])
                    losses.setdefault(rule, []).append(100 * (acc_svc - np.mean(pred == yte)))
            print(f"{name} {partition} part_C={part_C} ({np.median(speed):.0f}x SVC): "
                  + ", ".join(f"{rule} {np.mean(v):.2f}" for rule, v in losses.items()),
                  flush=True)


def letter_large_p():
    Xtr, Xte, ytr, yte = data("letter")
    acc_svc = SVC(C=1.0, gamma="scale").fit(Xtr, ytr).score(Xte, yte)
    for n_parts in (32, 64, 128):
        for label, params in (("defaults", {}),
                              ("Alg 5", {"part_C": "none", "combine": "nearest"})):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PartitionWarning)
                model = CASVMClassifier(n_partitions=n_parts, random_state=0, n_jobs=-1,
                                        **params).fit(Xtr, ytr)
            print(f"letter P={n_parts} {label}: loss "
                  f"{100 * (acc_svc - model.score(Xte, yte)):.2f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "letter-large-p":
        letter_large_p()
    else:
        ideas(sys.argv[1])
