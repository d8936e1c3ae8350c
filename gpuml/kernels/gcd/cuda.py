"""Asy-GCD on one GPU: host side of ``gcd.cu`` (You, 2020, ch. 4, Alg 14).

A batch of independent problems (the one-vs-one pairs of a multiclass fit)
runs in as few launches as the GPU allows, each CUDA thread block a
persistent worker over its block of variables of one problem, sharing that
problem's gradient ``g`` through ``atomicAdd``. A launch holds at most the
blocks the GPU keeps resident at once (a certified-quiet block waits for the
other blocks of its problem; a block that never got scheduled would never
agree), so a batch with more blocks than that is split into launches that
fit, one after another.

Memory. Each problem's ``Q`` (``n_p^2`` entries) is precomputed when the
launch's matrices fit in ``cache_bytes`` and in free device memory (free
plus CuPy's pool), built in place in row chunks (no ``n^2`` temporary);
otherwise its kernel values are computed on the fly from a feature-major
copy of its rows. A precomputed kernel has no features to fall back on:
a problem whose matrix does not fit is refused before any work, with the
bytes it needs.
"""

from __future__ import annotations

import numpy as np

from .._cuda import get_kernel
from . import CAPPED, KERNEL_CODES, TAU, GCDProblem, GCDResult, default_max_updates, max_violation

THREADS = 256  # GCD_THREADS in gcd.cu
#: Counter words of gcd.cu (per problem): updates begun, updates finished, the stop flag.
STARTED, FINISHED, STOP = 0, 1, 2
COUNTERS = 4  # GCD_COUNTERS in gcd.cu: words per problem
#: Rows of Q (or of the precomputed kernel) are built this many bytes at a time.
BUILD_BYTES = 64 << 20
#: Device bytes per variable besides X and Q: y, C, diagonal, alpha, g and their copies in
#: the caller's order (double), the row and order indices, the squared norm.
BYTES_PER_VARIABLE = 96
#: Fraction of the free device memory the default cache takes.
DEFAULT_CACHE_FRACTION = 0.25


def resident_blocks(kernel, device_id: int) -> int:
    """How many ``THREADS``-wide blocks of ``kernel`` the GPU holds at once."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    per_sm = props["maxThreadsPerMultiProcessor"] // THREADS
    per_sm = min(per_sm, int(props.get("maxBlocksPerMultiProcessor", per_sm) or per_sm))
    regs = int(getattr(kernel, "num_regs", 0) or 0)
    if regs > 0:
        # registers are handed out per warp in units of 256
        per_warp = -(-regs * 32 // 256) * 256
        per_sm = min(per_sm, props["regsPerMultiprocessor"] // (per_warp * (THREADS // 32)))
    shared = int(getattr(kernel, "shared_size_bytes", 0) or 0)
    if shared > 0 and props.get("sharedMemPerMultiprocessor"):
        # 1 KiB per block is reserved by the system on sm_80 and later
        per_sm = min(per_sm, props["sharedMemPerMultiprocessor"] // (shared + 1024))
    return max(1, per_sm) * props["multiProcessorCount"]


def default_workers(device_id: int) -> int:
    """One worker per streaming multiprocessor."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def default_cache_bytes(device_id: int) -> int:
    """A quarter of the device memory free now (free plus CuPy's pool): scales with the GPU."""
    import cupy

    from ..._backend import available_bytes

    with cupy.cuda.Device(device_id):
        return int(DEFAULT_CACHE_FRACTION * available_bytes(cupy))


def solve(X, y, C, kernel, blocks, *, selection="greedy", tol=1e-3, max_updates=None,
          cache_bytes=256 << 20, random_state=0):
    """Run Asy-GCD on CuPy data; see :func:`gpuml.kernels.gcd_solve` for the parameters."""
    import cupy as cp

    problem = GCDProblem(np.arange(int(y.shape[0])), cp.asnumpy(cp.asarray(y)),
                         cp.asnumpy(cp.asarray(C)), cp.asnumpy(cp.asarray(blocks)), random_state)
    (result,) = solve_batch(X, kernel, [problem], selection=selection, tol=tol,
                            max_updates=max_updates, cache_bytes=cache_bytes,
                            seeds=[random_state])
    return result


class _Problem:
    """One problem as the kernel sees it: variables sorted by block (host arrays)."""

    def __init__(self, problem, seed, max_updates):
        rows = np.asarray(problem.rows, dtype=np.int64)
        labels = np.asarray(problem.blocks, dtype=np.int64)
        self.n = int(rows.shape[0])
        if labels.shape != (self.n,) or np.shape(problem.y) != (self.n,) or \
                np.shape(problem.C) != (self.n,):
            raise ValueError("every problem needs one label, bound and block per row")
        self.order = np.argsort(labels, kind="stable")
        counts = np.bincount(labels, minlength=1) if self.n else np.zeros(0, dtype=np.int64)
        self.counts = counts[counts > 0]
        self.rows = rows[self.order]
        self.y = np.asarray(problem.y, dtype=np.float64)[self.order]
        self.C = np.asarray(problem.C, dtype=np.float64)[self.order]
        self.seed = int(seed)
        self.cap = default_max_updates(self.n) if max_updates is None else int(max_updates)

    @property
    def n_blocks(self) -> int:
        return int(self.counts.shape[0])


def _fixed_bytes(p: _Problem, d: int, itemsize: int, precomputed: bool) -> int:
    """Device bytes a problem needs whatever the cache: its vectors, and its rows of X twice
    (gathered, then feature-major) or, for a precomputed kernel, its kernel matrix."""
    data = p.n * p.n * itemsize if precomputed else 2 * p.n * d * itemsize
    return p.n * BYTES_PER_VARIABLE + data


def _memory_error(p: _Problem, need: int, available: int, device_id: int, precomputed: bool):
    what = (f"its {p.n} x {p.n} kernel matrix (a precomputed kernel is always held whole)"
            if precomputed else f"its {p.n} rows of X and vectors")
    return MemoryError(
        f"Asy-GCD needs {need / 2**20:.1f} MiB of GPU {device_id} for a problem of {p.n} "
        f"variables ({what}), but only {available / 2**20:.1f} MiB are free; free device "
        "memory, use fewer samples, or fit on the CPU (device='cpu')")


def _launches(prepared, capacity, budget, fixed):
    """Consecutive problems grouped into launches of at most ``capacity`` blocks and
    ``budget`` fixed bytes (indices into ``prepared``; empty problems need no launch)."""
    launches, current, blocks, used = [], [], 0, 0
    for k, p in enumerate(prepared):
        if p.n == 0:
            continue
        if current and (blocks + p.n_blocks > capacity or used + fixed[k] > budget):
            launches.append(current)
            current, blocks, used = [], 0, 0
        current.append(k)
        blocks += p.n_blocks
        used += fixed[k]
    if current:
        launches.append(current)
    return launches


def solve_batch(X, kernel, problems, *, selection="greedy", tol=1e-3, max_updates=None,
                cache_bytes=256 << 20, seeds=None) -> list[GCDResult]:
    """Solve every :class:`GCDProblem` (rows of the CuPy matrix ``X``) in as few launches as fit.

    ``seeds`` (one int per problem) seed the random selection. Returns one
    :class:`GCDResult` per problem, in order, with ``alpha`` (X's float dtype)
    and ``gradient`` (float64) as CuPy arrays in the problem's row order.
    """
    import cupy as cp

    from ..._backend import available_bytes

    device_id = X.device.id
    seeds = [0] * len(problems) if seeds is None else list(seeds)
    with cp.cuda.Device(device_id):
        dtype = np.dtype(X.dtype) if X.dtype in (np.float32, np.float64) else np.dtype(np.float64)
        precomputed = kernel.name == "precomputed"
        d = 0 if precomputed else int(X.shape[1])
        fn = get_kernel("gcd", "gcd_solve", dtype, device_id)
        capacity = resident_blocks(fn, device_id)
        prepared = [_Problem(p, s, max_updates) for p, s in zip(problems, seeds)]
        widest = max((p.n_blocks for p in prepared), default=0)
        if widest > capacity:
            raise ValueError(f"{widest} GPU workers asked for but this GPU keeps only "
                             f"{capacity} blocks resident; use n_workers <= {capacity}")
        fixed = [_fixed_bytes(p, d, dtype.itemsize, precomputed) for p in prepared]
        available = available_bytes(cp)
        budget = available - BUILD_BYTES
        for p, need in zip(prepared, fixed):
            if need > budget:
                raise _memory_error(p, need + BUILD_BYTES, available, device_id, precomputed)
        results = [None] * len(prepared)
        for k, p in enumerate(prepared):
            if p.n == 0:
                results[k] = GCDResult(cp.zeros(0, dtype=dtype), 0.0, 0.0, 0, True, 0, [],
                                       cp.zeros(0))
        for launch in _launches(prepared, capacity, budget, fixed):
            out = _run_launch(X, kernel, [prepared[k] for k in launch], dtype, d, precomputed,
                              selection == "greedy", tol, cache_bytes,
                              sum(fixed[k] for k in launch), fn, cp)
            for k, result in zip(launch, out):
                results[k] = result
        return results


def _fill_q(X, kernel, p, src, yT, Xw, block, cp):
    """``block[i, j] = y_i y_j K(x_i, x_j)`` for one problem, built in row chunks in place."""
    n = p.n
    itemsize = block.dtype.itemsize
    width = X.shape[0] if kernel.name == "precomputed" else n
    step = max(1, BUILD_BYTES // max(1, width * itemsize))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        if kernel.name == "precomputed":
            block[r0:r1] = X[src[r0:r1]][:, src]
        else:
            block[r0:r1] = kernel.matrix(Xw[r0:r1], Xw, max_bytes=(r1 - r0) * width * itemsize)
        block[r0:r1] *= yT[r0:r1, None]
        block[r0:r1] *= yT[None, :]


def _run_launch(X, kernel, batch, dtype, d, precomputed, greedy, tol, cache_bytes, fixed_bytes,
                fn, cp):
    """One launch over ``batch`` (prepared problems whose blocks are all resident at once)."""
    from ..._backend import available_bytes

    itemsize = dtype.itemsize
    sizes = np.array([p.n for p in batch], dtype=np.int64)
    problem_vars = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    m = int(problem_vars[-1])
    block_counts = np.array([p.n_blocks for p in batch], dtype=np.int64)
    problem_blocks = np.concatenate([[0], np.cumsum(block_counts)]).astype(np.int32)
    n_blocks = int(problem_blocks[-1])
    starts = np.concatenate([[0]] + [problem_vars[k] + np.cumsum(p.counts)
                                     for k, p in enumerate(batch)]).astype(np.int64)
    block_problem = np.repeat(np.arange(len(batch), dtype=np.int32), block_counts)

    # Which problems get a precomputed Q: all for a precomputed kernel (checked to fit), else
    # in order while the matrices fit in the cache and in what the fixed needs leave free.
    q_bytes = sizes * sizes * itemsize
    if precomputed:
        grant = np.ones(len(batch), dtype=bool)
    else:
        room = min(int(cache_bytes), available_bytes(cp) - fixed_bytes - BUILD_BYTES)
        grant = np.zeros(len(batch), dtype=bool)
        for k in range(len(batch)):
            if q_bytes[k] <= room:
                grant[k] = True
                room -= int(q_bytes[k])
    problem_q = np.full(len(batch), -1, dtype=np.int64)
    problem_q[grant] = np.concatenate([[0], np.cumsum(q_bytes[grant] // itemsize)])[:-1]
    otf = ~grant
    x_sizes = np.where(otf, sizes * d, 0)
    problem_x = np.concatenate([[0], np.cumsum(x_sizes)])[:-1].astype(np.int64)

    src = cp.asarray(np.concatenate([p.rows for p in batch]))
    y = cp.asarray(np.concatenate([p.y for p in batch]))
    C = cp.asarray(np.concatenate([p.C for p in batch]))
    yT = y.astype(dtype)
    Q = cp.empty(max(1, int(q_bytes[grant].sum() // itemsize)), dtype=dtype)
    XT = cp.zeros(max(1, int(x_sizes.sum())), dtype=dtype)
    if precomputed:
        K = cp.asarray(X, dtype=dtype)
        qdiag = K[src, src].astype(cp.float64)
        sq_norms = cp.zeros(m, dtype=dtype)
        Xw = None
    else:
        Xw = cp.asarray(X[src], dtype=dtype)
        qdiag = cp.asarray(kernel.diag(Xw), dtype=cp.float64)
        sq_norms = cp.ascontiguousarray((Xw * Xw).sum(axis=1))
        K = X
    for k, p in enumerate(batch):
        lo, hi = int(problem_vars[k]), int(problem_vars[k + 1])
        Xp = None if Xw is None else Xw[lo:hi]
        if grant[k]:
            off = int(problem_q[k])
            block = Q[off:off + p.n * p.n].reshape(p.n, p.n)
            _fill_q(K, kernel, p, src[lo:hi], yT[lo:hi], Xp, block, cp)
        else:
            off = int(problem_x[k])
            XT[off:off + d * p.n].reshape(d, p.n)[...] = Xp.T
    del Xw, K
    qdiag = cp.maximum(qdiag, TAU)
    alpha = cp.zeros(m, dtype=cp.float64)
    g = -cp.ones(m, dtype=cp.float64)
    counters = cp.zeros(COUNTERS * len(batch), dtype=cp.uint64)
    quiet = cp.full(n_blocks, np.iinfo(np.uint64).max, dtype=cp.uint64)
    caps = cp.asarray(np.array([p.cap for p in batch], dtype=np.uint64))
    seeds = cp.asarray(np.array([p.seed for p in batch], dtype=np.uint64))
    scalar = dtype.type
    kind = KERNEL_CODES[kernel.name]
    fn((n_blocks,), (THREADS,),
       (XT, sq_norms, Q, y, C, qdiag, cp.asarray(starts), cp.asarray(block_problem),
        cp.asarray(problem_vars), cp.asarray(problem_blocks), cp.asarray(problem_q),
        cp.asarray(problem_x), caps, seeds, np.int32(d), np.int32(kind), scalar(kernel.gamma),
        scalar(kernel.coef0), np.int32(kernel.degree), np.int32(greedy), np.float64(tol),
        alpha, g, counters, quiet))
    # Back to each problem's own row order, with one gather for the whole launch.
    perm = cp.asarray(np.concatenate([problem_vars[k] + p.order for k, p in enumerate(batch)]))
    alpha_out = cp.empty_like(alpha)
    alpha_out[perm] = alpha
    g_out = cp.empty_like(g)
    g_out[perm] = g
    host_alpha, host_g = alpha.get(), g.get()
    host_counters = counters.get().reshape(len(batch), COUNTERS)
    results = []
    for k, p in enumerate(batch):
        lo, hi = int(problem_vars[k]), int(problem_vars[k + 1])
        a_k, g_k = host_alpha[lo:hi], host_g[lo:hi]
        results.append(GCDResult(
            alpha_out[lo:hi].astype(dtype), 0.5 * float(a_k @ (g_k - 1.0)),
            max_violation(a_k, g_k, p.C), int(host_counters[k, FINISHED]),
            int(host_counters[k, STOP]) != CAPPED, p.n_blocks, [], g_out[lo:hi]))
    return results
