r"""SMO for the kernel SVM dual with bias, on the CPU (numba, ``nogil``).

The problem (seed 001, eqs. 2.1-2.2, written as a minimisation like LIBSVM)::

    min_a  f(a) = 1/2 a^T Q a - e^T a,   Q_ij = y_i y_j K(x_i, x_j)
    s.t.   y^T a = 0,   0 <= a_i <= C_i

Seed 001's Alg 1 picks the maximal-violating pair (first-order). This solver
is the LIBSVM refinement of it (Fan, Chen & Lin 2005): the first index is the
maximal violator, the second the one with the largest second-order decrease
of ``f`` (WSS2); the gradient ``G = Q a - e`` is updated with two kernel rows
per step; rows live in a bounded LRU cache; optional shrinking keeps only
the variables that may still move active; the stop is the KKT gap
``max_{I_up} -y G - min_{I_low} -y G < tol``.

Kernel rows come from :class:`gpuml.kernels.pairwise.Kernel` (BLAS). The
iteration itself is a numba state machine (:func:`_run`) that runs until it
needs a row that is not cached, then returns to Python, which computes that
row over the active variables and re-enters. When the whole kernel matrix
fits in the cache it is computed once up front (one GEMM) and the loop
never leaves numba.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit
from threadpoolctl import threadpool_limits

from ..pairwise import squared_norms

#: Smallest curvature used for a non-positive-definite pair (LIBSVM's TAU).
TAU = 1e-12

_CONVERGED, _NEED_ROWS, _MAX_ITER, _UNSHRINK = 0, 1, 2, 3
# Slots of the integer state vector shared by Python and the numba loop.
_ITER, _MAX, _ACTIVE, _CLOCK, _COUNTER, _UNSHRUNK, _NEED, _VERSION = range(8)


@dataclass
class SMOResult:
    """The solution of one SVM dual problem.

    Attributes
    ----------
    alpha : ndarray of shape (n,)
        Dual variables, ``0 <= alpha_i <= C_i`` and ``y @ alpha == 0``.
    intercept : float
        ``b`` of the decision function ``sum_i alpha_i y_i K(x_i, x) + b``
        (LIBSVM's ``-rho``).
    n_iter : int
        SMO steps taken.
    objective : float
        ``1/2 a^T Q a - sum(a)`` at the solution (LIBSVM's ``obj``; the dual
        of seed 001's eq. 2.1 is its negative).
    gradient : ndarray of shape (n,)
        ``Q a - e`` at the solution (warm starts and diagnostics).
    converged : bool
        False when ``max_iter`` stopped the solver first.
    """

    alpha: np.ndarray
    intercept: float
    n_iter: int
    objective: float
    gradient: np.ndarray
    converged: bool


@njit(nogil=True, cache=True, inline="always")
def _in_up(yk, ak, ck):
    return (yk > 0 and ak < ck) or (yk < 0 and ak > 0)


@njit(nogil=True, cache=True, inline="always")
def _in_low(yk, ak, ck):
    return (yk > 0 and ak > 0) or (yk < 0 and ak < ck)


@njit(nogil=True, cache=True)
def _lookup(r, slot_of, slot_time, state):
    """Cache slot of row ``r`` (refreshing its LRU time), or -1."""
    s = slot_of[r]
    if s >= 0:
        state[_CLOCK] += 1
        slot_time[s] = state[_CLOCK]
    return s


@njit(nogil=True, cache=True)
def _gaps(y, C, alpha, G, active, n_active):
    """``(Gmax1, Gmax2)``: max of ``-yG`` over I_up and of ``yG`` over I_low."""
    g1 = -np.inf
    g2 = -np.inf
    for t in range(n_active):
        k = active[t]
        v = -y[k] * G[k]
        if _in_up(y[k], alpha[k], C[k]) and v > g1:
            g1 = v
        if _in_low(y[k], alpha[k], C[k]) and -v > g2:
            g2 = -v
    return g1, g2


@njit(nogil=True, cache=True)
def _shrinkable(k, y, C, alpha, G, g1, g2):
    """LIBSVM's be_shrunk: a variable at a bound whose gradient pushes it further out."""
    if alpha[k] >= C[k]:
        return -G[k] > g1 if y[k] > 0 else -G[k] > g2
    if alpha[k] <= 0:
        return G[k] > g2 if y[k] > 0 else G[k] > g1
    return False


@njit(nogil=True, cache=True)
def _shrink(y, C, alpha, G, active, state, tol):
    """Move variables stuck at a bound to the inactive tail of ``active``."""
    n_active = state[_ACTIVE]
    g1, g2 = _gaps(y, C, alpha, G, active, n_active)
    if state[_UNSHRUNK] == 0 and g1 + g2 <= 10.0 * tol:
        state[_UNSHRUNK] = 1
        return True
    t = 0
    while t < n_active:
        k = active[t]
        if _shrinkable(k, y, C, alpha, G, g1, g2):
            n_active -= 1
            active[t] = active[n_active]
            active[n_active] = k
        else:
            t += 1
    if n_active < state[_ACTIVE]:
        state[_ACTIVE] = n_active
        state[_VERSION] += 1
    return False


@njit(nogil=True, cache=True)
def _run(y, C, QD, alpha, G, active, cache, slot_of, slot_time, state, tol, shrinking):
    """SMO iterations until convergence, ``max_iter``, a cache miss or an unshrink request.

    Returns a status code; on ``_NEED_ROWS`` the missing row is ``state[_NEED]``.
    Re-entering after the caller filled the cache repeats the selection (which
    depends only on the state), so a step is never half done.
    """
    n = y.shape[0]
    while True:
        if state[_MAX] >= 0 and state[_ITER] >= state[_MAX]:
            return _MAX_ITER
        n_active = state[_ACTIVE]
        g_max = -np.inf
        i = -1
        for t in range(n_active):
            k = active[t]
            if y[k] > 0:
                if alpha[k] < C[k] and -G[k] >= g_max:
                    g_max = -G[k]
                    i = k
            elif alpha[k] > 0 and G[k] >= g_max:
                g_max = G[k]
                i = k
        if i < 0:
            return _CONVERGED
        si = _lookup(i, slot_of, slot_time, state)
        if si < 0:
            state[_NEED] = i
            return _NEED_ROWS
        Ki = cache[si]
        g_max2 = -np.inf
        j = -1
        best = np.inf
        for t in range(n_active):
            k = active[t]
            if y[k] > 0:
                if alpha[k] > 0:
                    if G[k] > g_max2:
                        g_max2 = G[k]
                    diff = g_max + G[k]
                    if diff > 0:
                        quad = QD[i] + QD[k] - 2.0 * Ki[k]
                        dec = -diff * diff / (quad if quad > 0 else TAU)
                        if dec <= best:
                            best = dec
                            j = k
            elif alpha[k] < C[k]:
                if -G[k] > g_max2:
                    g_max2 = -G[k]
                diff = g_max - G[k]
                if diff > 0:
                    quad = QD[i] + QD[k] - 2.0 * Ki[k]
                    dec = -diff * diff / (quad if quad > 0 else TAU)
                    if dec <= best:
                        best = dec
                        j = k
        if g_max + g_max2 < tol or j < 0:
            return _CONVERGED
        sj = _lookup(j, slot_of, slot_time, state)
        if sj < 0:
            state[_NEED] = j
            return _NEED_ROWS
        Kj = cache[sj]
        Ci = C[i]
        Cj = C[j]
        old_i = alpha[i]
        old_j = alpha[j]
        ai = old_i
        aj = old_j
        if y[i] != y[j]:
            quad = QD[i] + QD[j] - 2.0 * Ki[j]
            delta = (-G[i] - G[j]) / (quad if quad > 0 else TAU)
            diff = ai - aj
            ai += delta
            aj += delta
            if diff > 0:
                if aj < 0:
                    aj = 0.0
                    ai = diff
            elif ai < 0:
                ai = 0.0
                aj = -diff
            if diff > Ci - Cj:
                if ai > Ci:
                    ai = Ci
                    aj = Ci - diff
            elif aj > Cj:
                aj = Cj
                ai = Cj + diff
        else:
            quad = QD[i] + QD[j] - 2.0 * Ki[j]
            delta = (G[i] - G[j]) / (quad if quad > 0 else TAU)
            total = ai + aj
            ai -= delta
            aj += delta
            if total > Ci:
                if ai > Ci:
                    ai = Ci
                    aj = total - Ci
            elif aj < 0:
                aj = 0.0
                ai = total
            if total > Cj:
                if aj > Cj:
                    aj = Cj
                    ai = total - Cj
            elif ai < 0:
                ai = 0.0
                aj = total
        alpha[i] = ai
        alpha[j] = aj
        # G_k += Q_ki d_i + Q_kj d_j with Q_kl = y_k y_l K_kl.
        di = (ai - old_i) * y[i]
        dj = (aj - old_j) * y[j]
        for t in range(n_active):
            k = active[t]
            G[k] += y[k] * (Ki[k] * di + Kj[k] * dj)
        state[_ITER] += 1
        if shrinking:
            state[_COUNTER] -= 1
            if state[_COUNTER] == 0:
                state[_COUNTER] = min(n, 1000)
                if _shrink(y, C, alpha, G, active, state, tol):
                    return _UNSHRINK


@njit(nogil=True, cache=True)
def _submatrix(K, idx):
    """``K[np.ix_(idx, idx)]`` for a one-vs-one problem (numpy's generic gather is slower)."""
    m = idx.shape[0]
    out = np.empty((m, m), dtype=K.dtype)
    for a in range(m):
        row = K[idx[a]]
        for b in range(m):
            out[a, b] = row[idx[b]]
    return out


@njit(nogil=True, cache=True)
def _rho(y, C, alpha, G):
    """LIBSVM's rho: the mean of ``yG`` over free variables, else the middle of its bounds."""
    ub = np.inf
    lb = -np.inf
    total = 0.0
    n_free = 0
    for k in range(y.shape[0]):
        yg = y[k] * G[k]
        if alpha[k] >= C[k]:
            if y[k] < 0:
                ub = min(ub, yg)
            else:
                lb = max(lb, yg)
        elif alpha[k] <= 0:
            if y[k] > 0:
                ub = min(ub, yg)
            else:
                lb = max(lb, yg)
        else:
            n_free += 1
            total += yg
    if n_free > 0:
        return total / n_free
    return 0.5 * (ub + lb)


class _RowSource:
    """Kernel rows of one problem: from a dense kernel matrix, or computed on demand.

    On-demand rows cover only the active (unshrunk) variables, as LIBSVM's:
    once shrinking has removed most variables a row costs a fraction of a
    full one. The active rows of ``X`` and their norms are gathered once per
    change of the active set, so each row is one GEMV plus the kernel map.
    """

    def __init__(self, kernel, X, idx, K=None):
        self.kernel = kernel
        self.K = K
        self.X = X[idx] if K is None else None
        if kernel.name == "precomputed" and K is None:
            self.K = np.ascontiguousarray(X[np.ix_(idx, idx)])
        self.version = -1

    def single_precision(self):
        """Compute cached rows in float32, as LIBSVM caches its ``Qfloat`` rows.

        Half the memory traffic per row and twice the rows per MB of cache;
        the gradient and the dual variables stay in float64.
        """
        self.X32 = self.X.astype(np.float32)

    def active_rows(self, r, active, version):
        """``K(x_r, x_active)`` for one row ``r``."""
        if version != self.version:
            self.Xa = self.X32[active]
            self.norms = squared_norms(self.Xa) if self.kernel.name == "rbf" else None
            self.version = version
        # The foundation's one-block kernel map, with the norms kept across calls.
        return self.kernel._block(self.X32[r:r + 1], self.Xa, self.norms)[0]

    def dot(self, r, cols, coef):
        """``K[r][:, cols] @ coef`` without materialising more than a block."""
        if self.K is not None:
            return self.K[np.ix_(r, cols)] @ coef
        return self.kernel.dot(self.X[r], self.X[cols], coef)


def check_problem(y, C, alpha0):
    """Validate one dual problem's labels, bounds and warm start; returns float64 copies."""
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1 or not np.all(np.abs(y) == 1.0):
        raise ValueError("y must be a 1-D array of -1 and +1")
    if not (np.any(y > 0) and np.any(y < 0)):
        raise ValueError("y must hold both classes (-1 and +1) for the SVM dual")
    C = np.broadcast_to(np.asarray(C, dtype=np.float64), y.shape).copy()
    if not np.all(np.isfinite(C)) or np.any(C <= 0):
        raise ValueError("C must be positive and finite for every sample")
    if alpha0 is None:
        return y, C, np.zeros_like(y)
    alpha = np.array(alpha0, dtype=np.float64, copy=True)
    if alpha.shape != y.shape:
        raise ValueError(f"alpha0 has shape {alpha.shape}, expected {y.shape}")
    scale = max(1.0, float(C.max()))
    if np.any(alpha < 0) or np.any(alpha > C) or abs(alpha @ y) > 1e-8 * scale * y.size:
        raise ValueError("alpha0 is infeasible: it needs 0 <= alpha0 <= C and y @ alpha0 == 0")
    return y, C, alpha


def solve(kernel, X, idx, y, C, *, tol=1e-3, max_iter=-1, cache_bytes=1 << 30,
          shrinking=True, alpha0=None, K=None) -> SMOResult:
    """Solve the dual on the rows ``idx`` of ``X`` (host arrays).

    ``K`` may be the problem's whole kernel matrix, already computed (shared
    by the one-vs-one problems of a part); otherwise rows are computed on
    demand and cached in at most ``cache_bytes``.
    """
    y, C, alpha = check_problem(y, C, alpha0)
    n = y.shape[0]
    src = _RowSource(kernel, X, idx, K)
    row_bytes = n * np.dtype(X.dtype).itemsize
    if src.K is None and n * row_bytes <= cache_bytes:
        src.K = kernel.matrix(src.X, max_bytes=max(cache_bytes, row_bytes * n))
    if src.K is not None:
        cache = src.K
        slot_of = np.arange(n, dtype=np.int64)
        QD = np.ascontiguousarray(np.diagonal(cache)).astype(np.float64)
    else:
        src.single_precision()
        n_slots = int(min(n, max(2, cache_bytes // (4 * n))))
        cache = np.empty((n_slots, n), dtype=np.float32)
        slot_of = np.full(n, -1, dtype=np.int64)
        QD = np.asarray(kernel.diag(src.X), dtype=np.float64)
    slot_row = np.full(cache.shape[0], -1, dtype=np.int64)
    slot_full = np.zeros(cache.shape[0], dtype=bool)
    slot_time = np.zeros(cache.shape[0], dtype=np.int64)

    G = -np.ones(n)
    nz = np.flatnonzero(alpha > 0)
    if nz.size:
        G += y * src.dot(np.arange(n), nz, alpha[nz] * y[nz])
    active = np.arange(n, dtype=np.int64)
    state = np.zeros(8, dtype=np.int64)
    state[_MAX] = max_iter
    state[_ACTIVE] = n
    state[_COUNTER] = min(n, 1000)

    status = _iterate(src, y, C, QD, alpha, G, active, cache, slot_of, slot_row, slot_full,
                      slot_time, state, tol, shrinking)
    return SMOResult(alpha=alpha, intercept=-float(_rho(y, C, alpha, G)),
                     n_iter=int(state[_ITER]), objective=float(alpha @ (G - 1.0)) / 2.0,
                     gradient=G, converged=status == _CONVERGED)


class _BlasThreads:
    """BLAS on one thread while rows are computed, all threads for a reconstruction.

    One row is one GEMV: BLAS threads only add synchronisation to it (and the
    parts of a CA-SVM already run in parallel threads). With a dense kernel
    matrix no BLAS call happens in the loop, so nothing is changed.
    """

    def __init__(self, active):
        self.active = active
        self.limits = None

    def single(self):
        if self.active:
            self.limits = threadpool_limits(1, user_api="blas")

    def restore(self):
        if self.limits is not None:
            self.limits.restore_original_limits()
            self.limits = None


def _iterate(src, y, C, QD, alpha, G, active, cache, slot_of, slot_row, slot_full, slot_time,
             state, tol, shrinking):
    """Alternate numba iterations with row computations and unshrinking until done."""
    n = y.shape[0]
    blas = _BlasThreads(src.K is None)
    blas.single()
    try:
        while True:
            status = _run(y, C, QD, alpha, G, active, cache, slot_of, slot_time, state,
                          float(tol), bool(shrinking))
            if status == _NEED_ROWS:
                r = int(state[_NEED])
                n_active = int(state[_ACTIVE])
                cols = active[:n_active] if n_active < n else np.arange(n)
                slot = _free_slot(slot_of, slot_row, slot_time, state)
                cache[slot, cols] = src.active_rows(r, cols, int(state[_VERSION]))
                slot_of[r] = slot
                slot_row[slot] = r
                slot_full[slot] = n_active == n
                continue
            if state[_ACTIVE] < n:
                blas.restore()
                _reconstruct(src, y, alpha, G, active, state)
                blas.single()
                _drop_partial_rows(slot_of, slot_row, slot_full, src.K is not None)
                if status != _MAX_ITER:
                    continue
            elif status == _UNSHRINK:
                continue
            return status
    finally:
        blas.restore()


def _free_slot(slot_of, slot_row, slot_time, state):
    """The least recently used slot (never the row just looked up), emptied."""
    slot = int(np.argmin(slot_time))
    old = slot_row[slot]
    if old >= 0:
        slot_of[old] = -1
    state[_CLOCK] += 1
    slot_time[slot] = state[_CLOCK]
    return slot


def _drop_partial_rows(slot_of, slot_row, slot_full, dense):
    """After unshrinking, rows computed for a smaller active set are incomplete."""
    if dense:
        return
    stale = (slot_row >= 0) & ~slot_full
    slot_of[slot_row[stale]] = -1
    slot_row[stale] = -1


def _reconstruct(src, y, alpha, G, active, state):
    """Exact gradient of the shrunk variables (one blocked GEMM), then all active again."""
    n = y.shape[0]
    inactive = np.sort(active[state[_ACTIVE]:])
    if inactive.size:
        nz = np.flatnonzero(alpha > 0)
        G[inactive] = -1.0
        if nz.size:
            G[inactive] += y[inactive] * src.dot(inactive, nz, alpha[nz] * y[nz])
    active[:] = np.arange(n)
    state[_ACTIVE] = n
    state[_VERSION] += 1
    state[_COUNTER] = 1


@dataclass
class SMOProblem:
    """One SVM dual problem of a batch: rows ``idx`` of the group matrix ``Xs[group]``.

    Attributes
    ----------
    group : int
        Which matrix of the batch the rows come from; problems of one group
        share its kernel matrix when it fits in the cache (one-vs-one pairs
        of a partition).
    idx : ndarray of int
        Row indices into ``Xs[group]``.
    y : ndarray of shape (len(idx),)
        Labels in {-1, +1}; both must occur.
    C : float or ndarray of shape (len(idx),)
        Per-sample upper bounds (LIBSVM's C times class and sample weights).
    alpha0 : ndarray or None
        Feasible warm start, zeros by default.
    """

    group: int
    idx: np.ndarray
    y: np.ndarray
    C: object = 1.0
    alpha0: np.ndarray | None = None


def solve_batch(kernel, Xs, problems, *, tol=1e-3, max_iter=-1, cache_bytes=1 << 30,
                shrinking=True, n_jobs=None) -> list[SMOResult]:
    """Solve every problem, sharing kernel values between the problems of a group.

    Groups, then problems, run in joblib threads (the numba loop releases the GIL).
    """
    from joblib import Parallel, delayed

    def run(fn, items):
        items = list(items)
        if n_jobs in (None, 1) or len(items) <= 1:
            return [fn(item) for item in items]
        return Parallel(n_jobs=n_jobs, prefer="threads")(delayed(fn)(it) for it in items)

    if not problems:
        return []
    used = sorted({p.group for p in problems})

    def group_matrix(g):
        # The whole matrix when it fits: one GEMM, and the one-vs-one problems of a
        # group need exactly its values between them (diagonal plus cross blocks).
        # When it does not fit, shared diagonal blocks are the next best (_run_blocks).
        X = Xs[g]
        if kernel.name == "precomputed":
            return None
        if X.shape[0] ** 2 * np.dtype(X.dtype).itemsize > cache_bytes:
            return None
        return kernel.matrix(X, max_bytes=max(cache_bytes, 1))

    mats = dict(zip(used, run(group_matrix, used)))
    if len(problems) == 1:
        return [_solve_problem(kernel, Xs, problems[0], mats, {}, tol, max_iter, cache_bytes,
                               shrinking)]
    # Many small problems (one-vs-one pairs, parts): the threads are the
    # parallelism; BLAS threads inside each would only oversubscribe the cores.
    with threadpool_limits(1, user_api="blas"):
        diagonal = _run_blocks(kernel, Xs, problems, mats, cache_bytes)
        return run(lambda p: _solve_problem(kernel, Xs, p, mats, diagonal, tol, max_iter,
                                            cache_bytes, shrinking), problems)


def _runs(idx):
    """Maximal runs of consecutive indices of ``idx`` as ``(start, stop)`` pairs."""
    if idx.size == 0:
        return []
    cut = np.flatnonzero(np.diff(idx) != 1) + 1
    first = np.concatenate([[0], cut])
    last = np.concatenate([cut, [idx.size]])
    return [(int(idx[a]), int(idx[b - 1]) + 1) for a, b in zip(first, last)]


def _run_blocks(kernel, Xs, problems, mats, cache_bytes):
    """Kernel blocks of the index runs shared by several problems of a group.

    One-vs-one problems over rows sorted by class are two runs each: the
    diagonal block of every class is computed once here (if they fit in
    ``cache_bytes`` together) and only the cross block per pair later, about
    a third of the kernel values of computing every pair's matrix whole.
    """
    if kernel.name == "precomputed":
        return {}
    wanted = {}
    for p in problems:
        if mats[p.group] is None:
            for run_ in _runs(np.asarray(p.idx)):
                wanted[(p.group,) + run_] = wanted.get((p.group,) + run_, 0) + 1
    shared = [key for key, uses in wanted.items() if uses > 1]
    itemsize = max((np.dtype(X.dtype).itemsize for X in Xs), default=8)
    if sum((b - a) ** 2 for _, a, b in shared) * itemsize > cache_bytes:
        return {}
    return {key: kernel.matrix(Xs[key[0]][key[1]:key[2]]) for key in shared}


def _assemble(kernel, X, idx, diagonal, group):
    """The kernel matrix of rows ``idx`` from cached diagonal blocks and fresh cross blocks."""
    runs = _runs(idx)
    bounds = np.concatenate([[0], np.cumsum([b - a for a, b in runs])])
    K = np.empty((idx.size, idx.size), dtype=X.dtype)
    for u, (a, b) in enumerate(runs):
        ou, eu = bounds[u], bounds[u + 1]
        block = diagonal.get((group, a, b))
        K[ou:eu, ou:eu] = kernel.matrix(X[a:b]) if block is None else block
        for v in range(u + 1, len(runs)):
            c, d = runs[v]
            cross = kernel.matrix(X[a:b], X[c:d])
            K[ou:eu, bounds[v]:bounds[v + 1]] = cross
            K[bounds[v]:bounds[v + 1], ou:eu] = cross.T
    return K


def _solve_problem(kernel, Xs, p, mats, diagonal, tol, max_iter, cache_bytes, shrinking):
    """One problem of a batch, on its group's kernel matrix or its cached blocks."""
    K = mats[p.group]
    idx = np.asarray(p.idx)
    if K is not None and not np.array_equal(idx, np.arange(K.shape[0])):
        K = _submatrix(K, idx.astype(np.int64))
    elif (K is None and diagonal and idx.size ** 2 * np.dtype(Xs[p.group].dtype).itemsize
          <= cache_bytes):
        K = _assemble(kernel, Xs[p.group], idx, diagonal, p.group)
    return solve(kernel, Xs[p.group], idx, p.y, p.C, tol=tol, max_iter=max_iter,
                 cache_bytes=cache_bytes, shrinking=shrinking, alpha0=p.alpha0, K=K)
