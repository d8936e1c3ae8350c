"""Partitioner throughput and balance (You 2020 Alg 3, 4, 5, 9), n up to 1M and P up to 256.

Synthetic Gaussian blobs (d=16) for the scaling grid; adult for the real-data
row. k-means runs beside scikit-learn's KMeans (n_init=1, same k) in the same
process: time ratio and inertia ratio. Balance is max/min part size.
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.cluster import KMeans

from bench._harness import record
from bench.datasets import load_adult, train_test_split_std
from gpuml.partition import PARTITIONERS, partition


def _blobs(n, d=16, centers=64, seed=0):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=5.0, size=(centers, d))
    return means[rng.integers(centers, size=n)] + rng.normal(size=(n, d))


def _one(X, P, method, dataset, to_device=None, sync=None):
    Xin = to_device(X) if to_device else X
    partition(Xin[: max(P, 1000)], P, method, random_state=0)  # numba compile / GPU warm-up
    t0 = time.perf_counter()
    labels, centers = partition(Xin, P, method, random_state=0)
    if sync:
        sync()
    seconds = time.perf_counter() - t0
    labels = labels.get() if hasattr(labels, "get") else labels
    centers = centers.get() if hasattr(centers, "get") else centers
    sizes = np.bincount(labels, minlength=P)
    return {"data": dataset, "n": X.shape[0], "P": P, "method": method, "seconds": seconds,
            "Msamples_per_s": X.shape[0] / seconds / 1e6,
            "max_over_min": float(sizes.max() / max(sizes.min(), 1)),
            "inertia": float(((X - centers[labels]) ** 2).sum())}


def main(quick: bool = False, gpu: bool = False) -> None:
    grid = [(100_000, 16), (100_000, 256)] if quick else \
        [(100_000, 16), (100_000, 256), (1_000_000, 16), (1_000_000, 256)]
    Xa, ya = load_adult()
    Xa, _, _, _ = train_test_split_std(Xa, ya, test_size=0.25, random_state=0)
    datasets = [("adult", Xa, [16, 64])] + [(f"blobs-{n}", _blobs(n), [P]) for n, P in grid]
    rows, km_rows = [], []
    to_device = sync = None
    if gpu:
        import cupy as cp

        to_device, sync = cp.asarray, cp.cuda.get_current_stream().synchronize
    for name, X, Ps in datasets:
        for P in Ps:
            for method in PARTITIONERS:
                rows.append(_one(X, P, method, name))
                if gpu:
                    g = _one(X, P, method, name, to_device, sync)
                    rows[-1].update(gpu_s=g["seconds"],
                                    gpu_speedup=rows[-1]["seconds"] / g["seconds"])
                print(rows[-1], flush=True)
            ours = next(r for r in rows if r["data"] == name and r["P"] == P
                        and r["method"] == "kmeans")
            t0 = time.perf_counter()
            sk = KMeans(P, n_init=1, random_state=0).fit(X)
            t_sk = time.perf_counter() - t0
            km_rows.append({"data": name, "n": X.shape[0], "P": P, "gpuml_s": ours["seconds"],
                            "sklearn_s": t_sk, "speedup": t_sk / ours["seconds"],
                            "inertia_ratio": ours["inertia"] / sk.inertia_})
    suffix = (" --quick" if quick else "") + (" --gpu" if gpu else "")
    record("partition", rows, gpu=gpu, title="Partitioners: throughput and balance",
           command="python -m bench.run partition" + suffix,
           notes="max_over_min = largest part / smallest part (balanced methods: <= 1 + 1/lo).")
    record("partition_kmeans_vs_sklearn", km_rows, gpu=gpu,
           title="gpuml k-means vs sklearn KMeans(n_init=1)",
           command="python -m bench.run partition" + suffix,
           notes="speedup = sklearn seconds / gpuml seconds; inertia_ratio = gpuml / sklearn.")
