"""GPU SMO: the problems of a batch solved by a few launches of ``smo.cu`` (CuPy).

The kernel matrix of every group (partition) is computed on the device with
:class:`gpuml.kernels.pairwise.Kernel` and kept whole; the problems then
index into it. Two launch shapes, no Python loop per SMO step:

* many problems (the P parts of a CA-SVM, times their one-vs-one pairs):
  ``smo_block``, one persistent thread block per problem, all at once;
* few large problems (P = 1 binary, P small): ``smo_grid`` per problem, a
  cooperative grid of one block per SM whose blocks share every reduction
  through ``grid.sync()``, so the whole GPU works on one SMO.

Memory: the matrices of all groups usually fit at once (one chunk, one
launch). When they do not, the groups are packed into chunks that fit
(:func:`plan_chunks`) and each chunk is one launch over its problems, its
matrices freed before the next chunk's are built. Only a group whose matrix
alone does not fit is solved by ``smo_grid_rows``, which computes the two
kernel rows of every step from the (transposed) features, no cache.
``shrinking`` and ``cache_size`` do not apply on the GPU.

Precision: the kernel matrix is in the data's float type; the dual
variables, the gradient and all SMO arithmetic are double, as LIBSVM keeps
float kernel rows and double gradients. Results equal the CPU solver's up to
rounding.
"""

from __future__ import annotations

import numpy as np

from ..._backend import available_bytes
from .. import _cuda as loader
from ..pairwise import BLOCK_BYTES
from . import SMOResult, check_flat, iteration_limit

_KERNELS = ("smo_block", "smo_grid", "smo_grid_rows")
_THREADS = 256
#: A problem needs at least this many variables before the whole grid works on it alone;
#: smaller ones are solved by one block each, all at once.
GRID_MIN_SIZE = 4096
#: Fraction of the device's free memory (CuPy's pool included) one solve may take.
_MEMORY_FRACTION = 0.8
#: Device bytes per variable of the SMO state: its row index (int32) and y, C, alpha, G
#: and the kernel diagonal (double).
_STATE_BYTES = 4 + 5 * 8
#: Device bytes per problem: offsets, sizes, iteration limits, results, matrix offsets.
_PROBLEM_BYTES = 64


def plan_chunks(sizes, itemsize: int, budget: int) -> tuple[list[list[int]], list[int]]:
    """Pack groups into chunks whose kernel matrices fit in ``budget`` bytes together.

    The matrix of a group of ``n`` rows takes ``n * n * itemsize`` bytes. Groups
    go into chunks first-fit decreasing (D. S. Johnson, "Near-optimal bin
    packing algorithms", PhD thesis, MIT, 1973): few chunks means few
    launches, and each launch solves many problems at once.

    Parameters
    ----------
    sizes : mapping of group -> number of rows n
    itemsize : bytes per kernel value
    budget : bytes the matrices of one chunk may take

    Returns
    -------
    chunks : list of lists of groups
        Every group that fits alone is in exactly one chunk (ascending inside
        it); the chunks' matrices each take at most ``budget`` bytes.
    too_large : list of groups
        The groups whose matrix alone exceeds ``budget``, ascending.
    """
    need = {g: int(n) * int(n) * int(itemsize) for g, n in sizes.items()}
    too_large = sorted(g for g, b in need.items() if b > budget)
    chunks: list[list[int]] = []
    loads: list[int] = []
    for g in sorted((g for g, b in need.items() if b <= budget), key=lambda g: (-need[g], g)):
        for c, load in enumerate(loads):
            if load + need[g] <= budget:
                loads[c] += need[g]
                chunks[c].append(g)
                break
        else:
            loads.append(need[g])
            chunks.append([g])
    return [sorted(c) for c in chunks], too_large


def launch_order(problem_groups, chunks, too_large) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The problems laid out chunk after chunk, and each chunk's span in that layout.

    Returns ``order`` (problem ids: those of chunk 0, then chunk 1, ..., then
    those of the ``too_large`` groups, each in input order) and one
    ``(start, stop)`` per chunk into ``order``; the problems of the too-large
    groups fill ``order[spans[-1][1]:]`` (all of it without chunks).
    """
    problem_groups = np.asarray(problem_groups, dtype=np.int64)
    parts = [np.flatnonzero(np.isin(problem_groups, np.asarray(c, dtype=np.int64)))
             for c in list(chunks) + [too_large]]
    order = np.concatenate(parts + [np.zeros(0, np.int64)]).astype(np.int64)
    if order.size != problem_groups.size:
        raise ValueError("every problem's group must be in exactly one chunk or in too_large")
    ends = np.cumsum([p.size for p in parts[:-1]], dtype=np.int64).tolist()
    return order, list(zip([0] + ends[:-1], ends))


def _device_of(X):
    dev = X.device
    return int(getattr(dev, "id", dev))


def _matrix_budget(cp, reserved: int) -> int:
    """Bytes the kernel matrices of one chunk may take on the current device.

    A fraction of the free memory, counting what CuPy's pool holds free (it
    is ours to reuse), less ``reserved`` for the rest of the solve.
    """
    return int(_MEMORY_FRACTION * available_bytes(cp)) - int(reserved)


def _chunk_matrices(kernel, Xs, chunk, dtype, cp):
    """The kernel matrices of the groups ``chunk``: one flat device buffer and offsets.

    Each matrix is computed in row blocks written straight into its slot, so
    nothing beyond the buffer and one block (at most ``BLOCK_BYTES``) is
    allocated.
    """
    sizes = [Xs[g].shape[0] for g in chunk]
    flat = cp.empty(sum(n * n for n in sizes), dtype=dtype)
    offsets = {}
    pos = 0
    for g, n in zip(chunk, sizes):
        slot = flat[pos:pos + n * n].reshape(n, n)
        for start, stop, rows in kernel.blocks(Xs[g], Xs[g], BLOCK_BYTES):
            slot[start:stop] = rows.toarray() if hasattr(rows, "toarray") else rows
        offsets[g] = pos
        pos += n * n
    return flat, offsets


def _check_rows(Xs, problems, sizes):
    """Row indices as one int32 array per problem, each checked against its group's matrix."""
    idxs = []
    for p, n in zip(problems, sizes.tolist()):
        idx = np.asarray(p.idx, dtype=np.int64)
        if idx.shape != (n,):
            raise ValueError("every problem needs one row index per label (idx and y of equal "
                             "length)")
        if not 0 <= p.group < len(Xs):
            raise ValueError(f"a problem names a group outside 0..{len(Xs) - 1}")
        if n and (idx.min() < 0 or idx.max() >= Xs[p.group].shape[0]):
            raise ValueError("a problem's row index is outside its group's matrix")
        idxs.append(idx.astype(np.int32))
    return idxs


def solve_batch(kernel, Xs, problems, *, tol=1e-3, max_iter=-1, cache_bytes=0,
                shrinking=True) -> list[SMOResult]:
    """Solve every problem on the GPU of ``Xs`` (CuPy arrays); see ``gpuml.kernels``."""
    import cupy as cp

    if not problems:
        return []
    checked = check_flat([p.y for p in problems], [p.C for p in problems],
                          [p.alpha0 for p in problems])
    sizes = np.diff(checked.offsets)
    idxs = _check_rows(Xs, problems, sizes)
    group = np.array([p.group for p in problems], dtype=np.int64)
    used = np.unique(group).tolist()
    dtype = np.dtype(Xs[used[0]].dtype)
    device_id = _device_of(Xs[used[0]])
    with cp.cuda.Device(device_id):
        reserved = (int(sizes.sum()) * _STATE_BYTES + len(problems) * _PROBLEM_BYTES
                    + BLOCK_BYTES)
        budget = _matrix_budget(cp, reserved)
        chunks, too_large = plan_chunks({g: Xs[g].shape[0] for g in used}, dtype.itemsize,
                                        budget)
        if kernel.name == "precomputed" and too_large:
            n = Xs[too_large[0]].shape[0]
            raise MemoryError(
                f"the GPU solver copies the {n} x {n} precomputed kernel matrix "
                f"({n * n * dtype.itemsize / 2**30:.2f} GiB) and only "
                f"{max(budget, 0) / 2**30:.2f} GiB of device memory are free for it; free "
                "device memory or use device='cpu'")
        order, spans = launch_order(group, chunks, too_large)
        state = _State(cp, checked, sizes, idxs, order, max_iter)
        n_sm = int(cp.cuda.Device(device_id).attributes["MultiProcessorCount"])
        for chunk, (start, stop) in zip(chunks, spans):
            K, k_offsets = _chunk_matrices(kernel, Xs, chunk, dtype, cp)
            members = order[start:stop]
            k_off = np.array([k_offsets[g] for g in group[members]], dtype=np.int64)
            ld = np.array([Xs[g].shape[0] for g in group[members]], dtype=np.int64)
            for q in range(start, stop):
                if problems[order[q]].alpha0 is not None:
                    _warm_gradient(K, int(k_off[q - start]), int(ld[q - start]), state, q, cp)
            counts = state.counts[start:stop]
            if stop - start >= n_sm // 2 or counts.max() < GRID_MIN_SIZE:
                _launch_block(K, k_off, ld, state, start, stop, tol, device_id, cp)
            else:
                _launch_grid(K, k_off, ld, state, start, stop, tol, n_sm, device_id, cp)
            del K  # back to the pool before the next chunk's matrices
        first = spans[-1][1] if spans else 0
        for q in range(first, len(problems)):
            w = int(order[q])
            _solve_on_the_fly(kernel, Xs[problems[w].group], state, q,
                              problems[w].alpha0 is not None, tol, n_sm, device_id, cp)
        return state.results(problems)


class _State:
    """The SMO state of every problem on the device, laid out in launch order.

    Problem ``q`` of the layout (``order[q]`` of the batch) owns the variables
    ``offs[q]:offs[q] + counts[q]`` of the flat arrays ``idx`` (rows of its
    group's matrix), ``y``, ``C``, ``alpha``, ``G`` and ``qd`` (its kernel
    diagonal), and entry ``q`` of the per-problem outputs.
    """

    def __init__(self, cp, checked, sizes, idxs, order, max_iter):
        self.order = order
        self.counts = sizes[order]
        self.offs = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        var = np.concatenate([np.arange(checked.offsets[w], checked.offsets[w + 1])
                              for w in order.tolist()])
        self.idx = cp.asarray(np.concatenate([idxs[w] for w in order.tolist()]))
        self.y = cp.asarray(checked.y[var])
        self.C = cp.asarray(checked.C[var])
        self.alpha = cp.asarray(checked.alpha[var])
        self.G = cp.full(var.size, -1.0, dtype=cp.float64)
        self.qd = cp.empty(var.size, dtype=cp.float64)
        self.limits = np.array([iteration_limit(max_iter, int(n)) for n in self.counts.tolist()],
                               dtype=np.int64)
        self.offs_dev = cp.asarray(self.offs[:-1])
        self.counts_dev = cp.asarray(self.counts.astype(np.int32))
        self.limits_dev = cp.asarray(self.limits)
        n = order.size
        self.n_iter = cp.zeros(n, dtype=cp.int64)
        self.rho = cp.zeros(n, dtype=cp.float64)
        self.obj = cp.zeros(n, dtype=cp.float64)
        self.status = cp.zeros(n, dtype=cp.int32)

    def span(self, q):
        """Slice of problem ``q``'s variables in the flat arrays."""
        return slice(int(self.offs[q]), int(self.offs[q + 1]))

    def outputs(self, q):
        """Problem ``q``'s output cells (n_iter, rho, obj, status), as one-element views."""
        return (self.n_iter[q:q + 1], self.rho[q:q + 1], self.obj[q:q + 1],
                self.status[q:q + 1])

    def results(self, problems) -> list[SMOResult]:
        """One result per problem, in the batch's order; one copy to the host per output."""
        n_iter, rho, obj, status = (a.get().tolist()
                                    for a in (self.n_iter, self.rho, self.obj, self.status))
        out = [None] * len(problems)
        for q, w in enumerate(self.order.tolist()):
            s = self.span(q)
            out[w] = SMOResult(alpha=self.alpha[s], intercept=-rho[q], n_iter=n_iter[q],
                               objective=obj[q], gradient=self.G[s], converged=status[q] == 0)
        return out


def _warm_gradient(K, k_off, n, state, q, cp):
    """``G = Q alpha0 - 1`` for warm-started problem ``q`` from its group's matrix."""
    s = state.span(q)
    y, alpha = state.y[s], state.alpha[s]
    nz = cp.flatnonzero(alpha > 0)
    if nz.size == 0:
        return
    rows = state.idx[s]
    Kg = K[k_off:k_off + n * n].reshape(n, n)
    block = Kg[rows[:, None], rows[nz][None, :]].astype(cp.float64)
    state.G[s] += y * (block @ (alpha[nz] * y[nz]))


def _launch_block(K, k_off, ld, state, start, stop, tol, device_id, cp):
    """One ``smo_block`` launch: one thread block per problem ``start..stop-1``."""
    fn = loader.get_kernel("smo", "smo_block", K.dtype, device_id, _KERNELS)
    span = slice(start, stop)
    fn((stop - start,), (_THREADS,),
       (K, cp.asarray(k_off), cp.asarray(ld), state.idx, state.offs_dev[span],
        state.counts_dev[span], state.y, state.C, state.alpha, state.G, state.qd,
        np.float64(tol), state.limits_dev[span], state.n_iter[span], state.rho[span],
        state.obj[span], state.status[span]))


def _launch_grid(K, k_off, ld, state, start, stop, tol, n_sm, device_id, cp):
    """``smo_grid`` per problem ``start..stop-1``: each one on the whole cooperative grid."""
    fn = loader.get_kernel("smo", "smo_grid", K.dtype, device_id, _KERNELS, cooperative=True)
    scratch_v = cp.empty(2 * n_sm, dtype=cp.float64)
    scratch_i = cp.empty(2 * n_sm, dtype=cp.int32)
    for q in range(start, stop):
        s = state.span(q)
        fn((n_sm,), (_THREADS,),
           (K[int(k_off[q - start]):], np.int64(ld[q - start]), state.idx[s],
            np.int32(state.counts[q]), state.y[s], state.C[s], state.alpha[s], state.G[s],
            state.qd[s], np.float64(tol), np.int64(state.limits[q]), scratch_v, scratch_i,
            *state.outputs(q)))


_KIND = {"linear": 0, "poly": 1, "rbf": 2, "sigmoid": 3}


def _solve_on_the_fly(kernel, X, state, q, warm, tol, n_sm, device_id, cp):
    """Problem ``q``, whose group's matrix does not fit: the grid computes rows i, j each step."""
    from ..pairwise import squared_norms

    s = state.span(q)
    Xp = X[state.idx[s]]
    if hasattr(Xp, "toarray"):
        Xp = Xp.toarray()
    dtype = Xp.dtype
    n, d = Xp.shape
    y, alpha, G = state.y[s], state.alpha[s], state.G[s]
    if warm:
        nz = cp.flatnonzero(alpha > 0)
        if nz.size:
            G += y * kernel.dot(Xp, Xp[nz], alpha[nz] * y[nz])
    scalar = np.float32 if dtype == np.float32 else np.float64
    fn = loader.get_kernel("smo", "smo_grid_rows", dtype, device_id, _KERNELS, cooperative=True)
    fn((n_sm,), (_THREADS,),
       (cp.ascontiguousarray(Xp.T), squared_norms(Xp),
        cp.asarray(kernel.diag(Xp), dtype=cp.float64), np.int32(n), np.int32(d),
        np.int32(_KIND[kernel.name]), scalar(kernel.gamma), scalar(kernel.coef0),
        np.int32(kernel.degree), y, state.C[s], alpha, G, np.float64(tol),
        np.int64(state.limits[q]), cp.empty(2 * n_sm, dtype=cp.float64),
        cp.empty(2 * n_sm, dtype=cp.int32), cp.empty(2 * n, dtype=dtype), *state.outputs(q)))
