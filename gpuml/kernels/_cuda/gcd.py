"""Asy-GCD on one GPU: host side of ``gcd.cu`` (seed 001, Alg 14).

One launch runs the whole solve: each CUDA thread block is a persistent
worker over its block of variables, sharing the gradient ``g`` in global
memory through ``atomicAdd``. The grid is capped at the number of blocks the
GPU keeps resident at once (a certified-quiet block waits, spinning, for the
others to agree; a block that never got scheduled would never agree).
"""

from __future__ import annotations

import numpy as np

from .._cpu.gcd import KERNEL_CODES, TAU, GCDResult
from .loader import get_kernel

THREADS = 256  # GCD_THREADS in gcd.cu


def resident_blocks(kernel, device_id: int) -> int:
    """How many ``THREADS``-wide blocks of ``kernel`` the GPU holds at once."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    per_sm = props["maxThreadsPerMultiProcessor"] // THREADS
    regs = int(getattr(kernel, "num_regs", 0) or 0)
    if regs > 0:
        per_sm = min(per_sm, props["regsPerMultiprocessor"] // (regs * THREADS))
    return max(1, per_sm) * props["multiProcessorCount"]


def default_workers(device_id: int) -> int:
    """One worker per streaming multiprocessor."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def solve(X, y, C, kernel, blocks, *, selection="greedy", tol=1e-3, max_updates=None,
          cache_bytes=256 << 20, random_state=0):
    """Run Asy-GCD on CuPy data; see :func:`gpuml.kernels.gcd_solve` for the parameters."""
    import cupy as cp

    device_id = X.device.id
    with cp.cuda.Device(device_id):
        dtype = np.dtype(X.dtype) if X.dtype in (np.float32, np.float64) else np.dtype(np.float64)
        n = int(y.shape[0])
        labels = cp.asnumpy(cp.asarray(blocks)).astype(np.int64)
        order_host = np.argsort(labels, kind="stable")
        counts = np.bincount(labels, minlength=1)
        counts = counts[counts > 0]
        starts = cp.asarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        n_workers = int(counts.shape[0])
        fn = get_kernel("gcd", "gcd_solve", dtype, device_id)
        capacity = resident_blocks(fn, device_id)
        if n_workers > capacity:
            raise ValueError(f"{n_workers} GPU workers asked for but this GPU keeps only "
                             f"{capacity} blocks resident; use n_workers <= {capacity}")
        order = cp.asarray(order_host)
        yw = cp.ascontiguousarray(cp.asarray(y, dtype=dtype)[order])
        Cw = cp.ascontiguousarray(cp.asarray(C, dtype=dtype)[order])
        kind = KERNEL_CODES[kernel.name]
        if kind == 4:
            Kw = cp.asarray(X, dtype=dtype)[order][:, order]
            Q = cp.ascontiguousarray(Kw * yw[:, None] * yw[None, :])
            qdiag = cp.diagonal(Kw).copy()
            XT = cp.zeros(1, dtype=dtype)
            sq_norms = cp.zeros(1, dtype=dtype)
            d = 0
            use_q = 1
        else:
            Xw = cp.ascontiguousarray(cp.asarray(X, dtype=dtype)[order])
            qdiag = cp.asarray(kernel.diag(Xw), dtype=dtype)
            d = int(Xw.shape[1])
            use_q = int(n * n * dtype.itemsize <= cache_bytes)
            if use_q:
                Q = cp.ascontiguousarray(kernel.matrix(Xw) * yw[:, None] * yw[None, :])
                XT = cp.zeros(1, dtype=dtype)
            else:
                Q = cp.zeros(1, dtype=dtype)
                XT = cp.ascontiguousarray(Xw.T)
            sq_norms = cp.ascontiguousarray((Xw * Xw).sum(axis=1))
        qdiag = cp.maximum(qdiag, TAU)
        alpha = cp.zeros(n, dtype=dtype)
        g = -cp.ones(n, dtype=dtype)
        counters = cp.zeros(3, dtype=cp.uint64)
        quiet = cp.full(n_workers, np.iinfo(np.uint64).max, dtype=cp.uint64)
        limit = np.iinfo(np.uint64).max if max_updates is None else int(max_updates)
        scalar = dtype.type
        if n_workers > 0:
            fn((n_workers,), (THREADS,),
               (XT, sq_norms, Q, np.int32(use_q), yw, Cw, qdiag, starts, np.int64(n),
                np.int32(d), np.int32(kind), scalar(kernel.gamma), scalar(kernel.coef0),
                np.int32(kernel.degree), np.int32(selection == "greedy"), scalar(tol),
                np.uint64(limit), np.uint64(random_state), alpha, g, counters, quiet,
                np.int32(n_workers)))
        alpha64 = alpha.astype(cp.float64)
        g64 = g.astype(cp.float64)
        objective = 0.5 * float(alpha64 @ (g64 - 1.0))
        violation = float(cp.abs(alpha64 - cp.clip(alpha64 - g64, 0.0, Cw.astype(cp.float64)))
                          .max()) if n else 0.0
        alpha_out = cp.empty(n, dtype=dtype)
        alpha_out[order] = alpha
        return GCDResult(alpha_out, objective, violation, int(counters[1].get()),
                         violation < tol, n_workers, [])
