"""GPU SMO: every problem of a batch solved by one launch of ``smo.cu`` (CuPy).

The kernel matrix of every group (partition) is computed on the device with
:class:`gpuml.kernels.pairwise.Kernel` (one GEMM per group) and kept whole;
the problems then index into it. Two launch shapes, no Python loop per SMO
step:

* many problems (the P parts of a CA-SVM, times their one-vs-one pairs):
  ``smo_block``, one persistent thread block per problem, all at once;
* few large problems (P = 1 binary, P small): ``smo_grid`` per problem, a
  cooperative grid of one block per SM whose blocks share every reduction
  through ``grid.sync()``, so the whole GPU works on one SMO.

When the kernel matrices do not fit in device memory, each problem is
solved by ``smo_grid_rows`` instead: the grid computes the two kernel rows
of every step from the (transposed) features, no cache. ``shrinking`` and
``cache_size`` do not apply on the GPU.
"""

from __future__ import annotations

import numpy as np

from .._cpu.smo import SMOResult, check_problem
from . import loader

_KERNELS = ("smo_block", "smo_grid", "smo_grid_rows")
_THREADS = 256
#: A problem needs at least this many variables before the whole grid works on it alone;
#: smaller ones are solved by one block each, all at once.
GRID_MIN_SIZE = 4096
#: Fraction of free device memory the kernel matrices may take.
_MEMORY_FRACTION = 0.8


def _device_of(X):
    dev = X.device
    return int(getattr(dev, "id", dev))


def _matrices_fit(Xs, groups, cp) -> bool:
    """Whether the kernel matrices of the used groups fit in the free device memory."""
    itemsize = np.dtype(Xs[groups[0]].dtype).itemsize
    need = sum(Xs[g].shape[0] ** 2 for g in groups) * itemsize
    free, _ = cp.cuda.runtime.memGetInfo()
    return need <= _MEMORY_FRACTION * free


def _group_matrices(kernel, Xs, groups, cp):
    """The kernel matrices of the used groups, one flat device buffer with offsets."""
    dtype = Xs[groups[0]].dtype
    itemsize = np.dtype(dtype).itemsize
    sizes = {g: Xs[g].shape[0] for g in groups}
    need = sum(n * n for n in sizes.values()) * itemsize
    flat = cp.empty(need // itemsize, dtype=dtype)
    offsets = {}
    pos = 0
    for g in groups:
        n = sizes[g]
        block = flat[pos:pos + n * n].reshape(n, n)
        if kernel.name == "precomputed":
            block[...] = Xs[g]
        else:
            block[...] = kernel.matrix(Xs[g], max_bytes=max(need, 1))
        offsets[g] = pos
        pos += n * n
    return flat, offsets, sizes


def solve_batch(kernel, Xs, problems, *, tol=1e-3, max_iter=-1, cache_bytes=0,
                shrinking=True) -> list[SMOResult]:
    """Solve every problem on the GPU of ``Xs`` (CuPy arrays); see ``gpuml.kernels``."""
    import cupy as cp

    if not problems:
        return []
    device_id = _device_of(Xs[problems[0].group])
    checked = [check_problem(p.y, p.C, p.alpha0) for p in problems]
    with cp.cuda.Device(device_id):
        groups = sorted({p.group for p in problems})
        if not _matrices_fit(Xs, groups, cp):
            if kernel.name == "precomputed":
                raise MemoryError("the precomputed kernel matrices do not fit in device memory "
                                  "twice; use device='cpu'")
            return [_solve_on_the_fly(kernel, Xs[p.group], p, c, tol, max_iter, device_id, cp)
                    for p, c in zip(problems, checked)]
        K, k_offsets, sizes = _group_matrices(kernel, Xs, groups, cp)
        dtype = K.dtype
        counts = np.array([len(p.idx) for p in problems], dtype=np.int64)
        offs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        idx = cp.asarray(np.concatenate([np.asarray(p.idx, dtype=np.int32) for p in problems]))
        y = cp.asarray(np.concatenate([c[0] for c in checked]), dtype=dtype)
        C = cp.asarray(np.concatenate([c[1] for c in checked]), dtype=dtype)
        alpha = cp.asarray(np.concatenate([c[2] for c in checked]), dtype=dtype)
        G = _initial_gradient(K, k_offsets, sizes, problems, idx, offs, counts, y, alpha, cp)
        n_iter = cp.zeros(len(problems), dtype=cp.int64)
        rho = cp.zeros(len(problems), dtype=dtype)
        obj = cp.zeros(len(problems), dtype=dtype)
        status = cp.zeros(len(problems), dtype=cp.int32)
        scalar = np.float32 if dtype == np.float32 else np.float64
        n_sm = cp.cuda.Device(device_id).attributes["MultiProcessorCount"]
        if len(problems) >= n_sm // 2 or counts.max() < GRID_MIN_SIZE:
            fn = loader.get_kernel("smo", "smo_block", dtype, device_id, _KERNELS)
            k_off = cp.asarray([k_offsets[p.group] for p in problems], dtype=cp.int64)
            ld = cp.asarray([sizes[p.group] for p in problems], dtype=cp.int64)
            fn((len(problems),), (_THREADS,),
               (K, k_off, ld, idx, cp.asarray(offs), cp.asarray(counts.astype(np.int32)), y, C,
                alpha, G, scalar(tol), np.int64(max_iter), n_iter, rho, obj, status))
        else:
            fn = loader.get_kernel("smo", "smo_grid", dtype, device_id, _KERNELS,
                                   cooperative=True)
            blocks = int(n_sm)
            scratch_v = cp.empty(2 * blocks, dtype=dtype)
            scratch_i = cp.empty(2 * blocks, dtype=cp.int32)
            for q, p in enumerate(problems):
                lo, hi = int(offs[q]), int(offs[q] + counts[q])
                fn((blocks,), (_THREADS,),
                   (K[k_offsets[p.group]:], np.int64(sizes[p.group]), idx[lo:hi],
                    np.int32(hi - lo), y[lo:hi], C[lo:hi], alpha[lo:hi], G[lo:hi],
                    scalar(tol), np.int64(max_iter), scratch_v, scratch_i, n_iter[q:q + 1],
                    rho[q:q + 1], obj[q:q + 1], status[q:q + 1]))
        host_iter, host_rho, host_obj, host_status = (a.get() for a in (n_iter, rho, obj, status))
    return [SMOResult(alpha=alpha[o:o + c], intercept=-float(host_rho[q]),
                      n_iter=int(host_iter[q]), objective=float(host_obj[q]),
                      gradient=G[o:o + c], converged=bool(host_status[q] == 0))
            for q, (o, c) in enumerate(zip(offs, counts))]


def _initial_gradient(K, k_offsets, sizes, problems, idx, offs, counts, y, alpha, cp):
    """``G = Q alpha0 - 1`` per problem (only warm-started problems need the product)."""
    G = -cp.ones_like(alpha)
    for q, p in enumerate(problems):
        if p.alpha0 is None:
            continue
        lo, hi = int(offs[q]), int(offs[q] + counts[q])
        n = sizes[p.group]
        Kg = K[k_offsets[p.group]:k_offsets[p.group] + n * n].reshape(n, n)
        rows = idx[lo:hi]
        Ksub = Kg[rows][:, rows]
        G[lo:hi] += y[lo:hi] * (Ksub @ (alpha[lo:hi] * y[lo:hi]))
    return G


_KIND = {"linear": 0, "poly": 1, "rbf": 2, "sigmoid": 3}


def _solve_on_the_fly(kernel, X, problem, checked, tol, max_iter, device_id, cp):
    """One problem whose kernel matrix does not fit: the grid computes rows i, j each step."""
    from ..pairwise import squared_norms

    Xp = X[cp.asarray(np.asarray(problem.idx))]
    if hasattr(Xp, "toarray"):
        Xp = Xp.toarray()
    dtype = Xp.dtype
    n, d = Xp.shape
    y, C, alpha = (cp.asarray(a, dtype=dtype) for a in checked)
    G = -cp.ones(n, dtype=dtype)
    nz = cp.flatnonzero(alpha > 0)
    if nz.size:
        G += y * kernel.dot(Xp, Xp[nz], alpha[nz] * y[nz])
    scalar = np.float32 if dtype == np.float32 else np.float64
    blocks = int(cp.cuda.Device(device_id).attributes["MultiProcessorCount"])
    fn = loader.get_kernel("smo", "smo_grid_rows", dtype, device_id, _KERNELS, cooperative=True)
    out_iter = cp.zeros(1, dtype=cp.int64)
    rho, obj = cp.zeros(1, dtype=dtype), cp.zeros(1, dtype=dtype)
    status = cp.zeros(1, dtype=cp.int32)
    fn((blocks,), (_THREADS,),
       (cp.ascontiguousarray(Xp.T), squared_norms(Xp), cp.asarray(kernel.diag(Xp), dtype=dtype),
        np.int32(n), np.int32(d), np.int32(_KIND[kernel.name]), scalar(kernel.gamma),
        scalar(kernel.coef0), np.int32(kernel.degree), y, C, alpha, G, scalar(tol),
        np.int64(max_iter), cp.empty(2 * blocks, dtype=dtype),
        cp.empty(2 * blocks, dtype=cp.int32), cp.empty(2 * n, dtype=dtype), out_iter, rho, obj,
        status))
    return SMOResult(alpha=alpha, intercept=-float(rho.get()[0]), n_iter=int(out_iter.get()[0]),
                     objective=float(obj.get()[0]), gradient=G,
                     converged=bool(status.get()[0] == 0))
