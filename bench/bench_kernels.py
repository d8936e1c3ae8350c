"""Kernel-matrix throughput: gpuml.kernels vs sklearn.metrics.pairwise, same data, same process.

Real data (adult, one-hot, standardised): an n x n block for each kernel, dense
and CSR. On ``--gpu`` the same matrices are built on the GPU (CuPy) and timed
against the CPU baseline in the same run.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.metrics import pairwise as skp

from bench._harness import record, timeit
from bench.datasets import load_adult, train_test_split_std
from gpuml.kernels.pairwise import kernel_matrix

SKLEARN = {
    "linear": lambda X, g: skp.linear_kernel(X),
    "poly": lambda X, g: skp.polynomial_kernel(X, degree=3, gamma=g, coef0=1.0),
    "rbf": lambda X, g: skp.rbf_kernel(X, gamma=g),
    "sigmoid": lambda X, g: skp.sigmoid_kernel(X, gamma=g, coef0=1.0),
}


def main(quick: bool = False, gpu: bool = False) -> None:
    X_raw, y = load_adult()
    X, _, _, _ = train_test_split_std(X_raw, y, test_size=0.25, random_state=0)
    n = 2000 if quick else 8000
    X = X[:n]
    # CSR rows: the raw one-hot matrix (about 13 % non-zeros), scaled to unit column maximum.
    X_sparse = sp.csr_matrix(X_raw[:n] / np.maximum(np.abs(X_raw[:n]).max(0), 1e-12))
    gamma = 1.0 / X.shape[1]
    rows = []
    for fmt in ("dense", "csr"):
        Xin = X if fmt == "dense" else X_sparse
        for name, baseline in SKLEARN.items():
            t_ours = timeit(lambda Xin=Xin, name=name: kernel_matrix(Xin, kernel=name, gamma=gamma,
                                                                    coef0=1.0), repeat=3)
            t_base = timeit(lambda Xin=Xin, baseline=baseline: baseline(Xin, gamma), repeat=3)
            err = float(np.abs(kernel_matrix(Xin, kernel=name, gamma=gamma, coef0=1.0)
                               - baseline(Xin, gamma)).max())
            row = {"format": fmt, "kernel": name, "n": n, "d": X.shape[1],
                   "gpuml_s": t_ours, "sklearn_s": t_base, "speedup": t_base / t_ours,
                   "GB_per_s": n * n * 8 / t_ours / 1e9, "max_abs_err": err}
            if gpu:
                import cupy as cp
                import cupyx.scipy.sparse as cpsp

                Xg = cp.asarray(X) if fmt == "dense" else cpsp.csr_matrix(Xin)
                sync = cp.cuda.get_current_stream().synchronize
                t_gpu = timeit(lambda Xg=Xg, name=name: kernel_matrix(Xg, kernel=name, gamma=gamma,
                                                                      coef0=1.0),
                               repeat=5, warmup=1, sync=sync)
                row.update(gpu_s=t_gpu, gpu_vs_sklearn=t_base / t_gpu)
            rows.append(row)
    record("kernels", rows, gpu=gpu, title="Kernel matrix: gpuml vs sklearn.metrics.pairwise",
           command="python -m bench.run kernels" + (" --quick" if quick else "")
           + (" --gpu" if gpu else ""),
           notes="adult, first n rows: dense = one-hot standardised; csr = raw one-hot scaled "
                 "to unit column maximum (sparse). n x n float64 output.")
