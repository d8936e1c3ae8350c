r"""SMO for the kernel SVM dual with bias, on the CPU (numba, ``nogil``).

The problem (You 2020, eqs. 2.1-2.2, written as a minimisation like LIBSVM)::

    min_a  f(a) = 1/2 a^T Q a - e^T a,   Q_ij = y_i y_j K(x_i, x_j)
    s.t.   y^T a = 0,   0 <= a_i <= C_i

You 2020's Alg 1 picks the maximal-violating pair (first-order). This solver
is the LIBSVM refinement of it (Fan, Chen & Lin 2005): the first index is the
maximal violator, the second the one with the largest second-order decrease
of ``f`` (WSS2); the gradient ``G = Q a - e`` is updated with two kernel rows
per step; rows live in a bounded LRU cache; optional shrinking keeps only
the variables that may still move active; the stop is the KKT gap
``max_{I_up} -y G - min_{I_low} -y G < tol``.

Kernel rows come from :class:`gpuml.pairwise.Kernel` (BLAS). The
iteration itself is a numba state machine (:func:`_run`) that runs until it
needs a row that is not cached, then returns to Python, which computes that
row over the active variables and re-enters. When the whole kernel matrix
fits in the cache it is computed once up front (one GEMM) and the loop
never leaves numba (:func:`_solve_dense`).

A batch (:func:`solve_batch`: the parts times the one-vs-one pairs of a
CA-SVM fit, thousands of small problems) is validated once and laid end to
end in flat arrays; each compiled call (:func:`_solve_dense_problems`)
solves a chunk of one group's problems on that group's kernel matrix, so
no Python runs per problem.

Compile time. The first fit in a fresh install compiles these functions
(numba's type inference and lowering, in Python: seconds, see
``bench/bench_first_fit.py``), so they are written to compile little: nothing
allocates inside compiled code (the workspaces come from Python: each NumPy
allocator would compile its own implementation), the functions are compiled
without reference counting (``_nrt=False``, which that allows), and the dense
path passes ``None`` for what it does not use (the LRU slots, and shrinking
when it is off, the default of CA-SVM), which numba prunes before typing, so
that code is compiled only by a fit that uses it.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
from joblib import effective_n_jobs
from numba import njit
from threadpoolctl import ThreadpoolController, threadpool_limits

from ...pairwise import squared_norms
from .. import _jit
from . import Checked, SMOResult, check_flat, iteration_limit

#: Smallest curvature used for a non-positive-definite pair (LIBSVM's TAU).
TAU = 1e-12

_CONVERGED, _NEED_ROWS, _MAX_ITER, _UNSHRINK = 0, 1, 2, 3
# Slots of the integer state vector shared by Python and the numba loop.
_ITER, _MAX, _ACTIVE, _CLOCK, _COUNTER, _UNSHRUNK, _NEED, _VERSION = range(8)


@njit(nogil=True, cache=True, inline="always", _nrt=False)
def _in_up(yk, ak, ck):
    return (yk > 0 and ak < ck) or (yk < 0 and ak > 0)


@njit(nogil=True, cache=True, inline="always", _nrt=False)
def _in_low(yk, ak, ck):
    return (yk > 0 and ak > 0) or (yk < 0 and ak < ck)


def _pair_step_py(ai, aj, opposite, quad, Gi, Gj, Ci, Cj):
    """LIBSVM's step on the working pair (i, j), clipped to the box: the new alpha_i, alpha_j.

    ``opposite``: y_i != y_j; ``quad``: K_ii + K_jj - 2 K_ij (TAU where not positive);
    ``Gi, Gj``: the gradient at i and j. One piece of code for the compiled loop
    (:func:`_pair_step`, inlined there) and its NumPy twin, so both step alike.
    """
    q = quad if quad > 0 else TAU
    if opposite:
        delta = (-Gi - Gj) / q
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
        delta = (Gi - Gj) / q
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
    return ai, aj


_pair_step = njit(nogil=True, cache=True, inline="always", _nrt=False)(_pair_step_py)


@njit(nogil=True, cache=True, _nrt=False)
def _lookup(r, slot_of, slot_time, state):
    """Cache slot of row ``r`` (refreshing its LRU time), or -1."""
    s = slot_of[r]
    if s >= 0:
        state[_CLOCK] += 1
        slot_time[s] = state[_CLOCK]
    return s


@njit(nogil=True, cache=True, _nrt=False)
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


@njit(nogil=True, cache=True, _nrt=False)
def _shrinkable(k, y, C, alpha, G, g1, g2):
    """LIBSVM's be_shrunk: a variable at a bound whose gradient pushes it further out."""
    if alpha[k] >= C[k]:
        return -G[k] > g1 if y[k] > 0 else -G[k] > g2
    if alpha[k] <= 0:
        return G[k] > g2 if y[k] > 0 else G[k] > g1
    return False


@njit(nogil=True, cache=True, _nrt=False)
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


@njit(nogil=True, cache=True, _nrt=False)
def _run(y, C, QD, alpha, G, active, cache, slot_of, slot_time, state, tol, shrinking):
    """SMO iterations until convergence, ``max_iter``, a cache miss or an unshrink request.

    Returns a status code; on ``_NEED_ROWS`` the missing row is ``state[_NEED]``.
    Re-entering after the caller filled the cache repeats the selection (which
    depends only on the state), so a step is never half done.
    """
    n = y.shape[0]
    # slot_of (with slot_time) None: the whole matrix is ``cache``, row k in slot k (the
    # dense path). It and ``shrinking=None`` are pruned at compile time (numba drops the
    # branches on an argument typed None), so a dense fit without shrinking compiles
    # neither the LRU lookups nor the shrinking code: a third of the compile time.
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
        si = i
        if slot_of is not None:
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
        sj = j
        if slot_of is not None:
            sj = _lookup(j, slot_of, slot_time, state)
            if sj < 0:
                state[_NEED] = j
                return _NEED_ROWS
        Kj = cache[sj]
        Ci = C[i]
        Cj = C[j]
        old_i = alpha[i]
        old_j = alpha[j]
        ai, aj = _pair_step(old_i, old_j, y[i] != y[j], QD[i] + QD[j] - 2.0 * Ki[j],
                            G[i], G[j], Ci, Cj)
        alpha[i] = ai
        alpha[j] = aj
        # G_k += Q_ki d_i + Q_kj d_j with Q_kl = y_k y_l K_kl.
        di = (ai - old_i) * y[i]
        dj = (aj - old_j) * y[j]
        for t in range(n_active):
            k = active[t]
            G[k] += y[k] * (Ki[k] * di + Kj[k] * dj)
        state[_ITER] += 1
        if shrinking is not None and shrinking:
            state[_COUNTER] -= 1
            if state[_COUNTER] == 0:
                state[_COUNTER] = n if n < 1000 else 1000
                if _shrink(y, C, alpha, G, active, state, tol):
                    return _UNSHRINK


@njit(nogil=True, cache=True, _nrt=False)
def _submatrix(K, idx, out):
    """``out[:m, :m] = K[np.ix_(idx, idx)]`` for a one-vs-one problem (numpy's generic
    gather is slower); ``out`` is a workspace at least m x m, same type as ``K``."""
    m = idx.shape[0]
    for a in range(m):
        row = K[idx[a]]
        for b in range(m):
            out[a, b] = row[idx[b]]


@njit(nogil=True, cache=True, _nrt=False)
def _rho(y, C, alpha, G):
    """LIBSVM's rho: the mean of ``yG`` over free variables, else the middle of its bounds."""
    ub = np.inf
    lb = -np.inf
    total = 0.0
    n_free = 0
    # Comparisons, not min/max: each builtin overload costs compile time.
    for k in range(y.shape[0]):
        yg = y[k] * G[k]
        if alpha[k] >= C[k]:
            if y[k] < 0:
                if yg < ub:
                    ub = yg
            elif yg > lb:
                lb = yg
        elif alpha[k] <= 0:
            if y[k] > 0:
                if yg < ub:
                    ub = yg
            elif yg > lb:
                lb = yg
        else:
            n_free += 1
            total += yg
    if n_free > 0:
        return total / n_free
    return 0.5 * (ub + lb)


@njit(nogil=True, cache=True, _nrt=False)
def _dense_gradient(K, y, alpha, G, rows, nz, v):
    """``G_k = (Q a)_k - 1`` for the rows ``rows`` of a dense kernel matrix (``nz``, ``v``:
    workspaces of at least n entries)."""
    n = y.shape[0]
    n_nz = 0
    for k in range(n):
        if alpha[k] > 0:
            nz[n_nz] = k
            v[n_nz] = alpha[k] * y[k]
            n_nz += 1
    for k in rows:
        row = K[k]
        g = 0.0
        for t in range(n_nz):
            g += row[nz[t]] * v[t]
        G[k] = y[k] * g - 1.0


@njit(nogil=True, cache=True, _nrt=False)
def _solve_dense(K, y, C, alpha, G, state, tol, shrinking, QD, active, nz, v):
    """SMO on one problem whose kernel matrix ``K`` is in memory: no row ever leaves numba.

    The same iteration (:func:`_run`) as the cached path, with every row
    "cached" (row k of ``K`` is slot k); shrinking's gradient reconstruction is a
    loop over ``K``. ``shrinking=None`` compiles the variant without shrinking.
    ``QD``, ``active``, ``nz``, ``v``: workspaces of at least n entries (no
    allocation in compiled code: every NumPy allocator costs compile time).
    """
    n = y.shape[0]
    for k in range(n):
        QD[k] = K[k, k]
        active[k] = k
    state[_ACTIVE] = n
    state[_COUNTER] = n if n < 1000 else 1000
    _dense_gradient(K, y, alpha, G, active[:n], nz, v)
    while True:
        status = _run(y, C, QD, alpha, G, active, K, None, None, state, tol, shrinking)
        if shrinking is not None:
            if state[_ACTIVE] < n:
                _dense_gradient(K, y, alpha, G, active[state[_ACTIVE]:n], nz, v)
                for t in range(n):
                    active[t] = t
                state[_ACTIVE] = n
                state[_VERSION] += 1
                state[_COUNTER] = 1
                if status != _MAX_ITER:
                    continue
            elif status == _UNSHRINK:
                continue
        return status


@njit(nogil=True, cache=True, _nrt=False)
def _solve_dense_problems(K, whole, offsets, idx, y, C, alpha, G, which, tol, limits,
                          shrinking, n_iter, status, rho, objective, sub, QD, active, nz, v,
                          state):
    """Solve the problems ``which`` of a flat batch, all on rows of ``K``, in one call.

    Problem ``w`` owns ``offsets[w]:offsets[w + 1]`` of the flat ``idx`` (rows of
    ``K``), ``y``, ``C``, ``alpha`` (warm start in, solution out) and ``G``, and
    stops after ``limits[w]`` steps. ``whole[w]``: the problem is all rows of ``K``
    in order, so ``K`` is used as it is; otherwise its submatrix is gathered into
    the workspace ``sub`` (as large as the largest such problem, same type as
    ``K``). ``QD``, ``active``, ``nz``, ``v`` (the largest problem's size) and
    ``state`` (8) are workspaces too. ``shrinking=None``: no shrinking (compiled
    without it).
    """
    for w in which:
        a = offsets[w]
        b = offsets[w + 1]
        Kw = K
        if not whole[w]:
            _submatrix(K, idx[a:b], sub)
            Kw = sub
        for s in range(state.shape[0]):
            state[s] = 0
        state[_MAX] = limits[w]
        ya = y[a:b]
        Ca = C[a:b]
        al = alpha[a:b]
        Ga = G[a:b]
        status[w] = _solve_dense(Kw, ya, Ca, al, Ga, state, tol, shrinking, QD, active, nz, v)
        n_iter[w] = state[_ITER]
        rho[w] = _rho(ya, Ca, al, Ga)
        f = 0.0
        for k in range(b - a):
            f += al[k] * (Ga[k] - 1.0)
        objective[w] = f / 2.0


#: Largest problem (variables) the NumPy twin of the dense solver takes while
#: :func:`_solve_dense_problems` compiles in the background (see :mod:`._jit`): an SMO
#: step costs it about 20 NumPy calls over the problem, so past a few thousand
#: variables the compile (seconds) is the smaller cost.
NUMPY_TWIN_MAX_ROWS = 1024
#: ... and the largest batch, in sum of squared problem sizes (the steps scale about so).
NUMPY_TWIN_MAX_WORK = 2048 ** 2


def _last_argmax(v):
    """Index of the last largest entry (the compiled loops' ``>=`` sweep keeps the last)."""
    return v.shape[0] - 1 - int(np.argmax(v[::-1]))


def _sequential_sum(v):
    """``v[0] + v[1] + ...`` left to right, as the compiled loops add (np.sum pairs)."""
    return float(np.cumsum(v)[-1]) if v.shape[0] else 0.0


def _solve_dense_numpy(K, y, C, alpha, G, limit, tol):
    """:func:`_solve_dense` without shrinking, in NumPy: the same steps, bit for bit.

    Every selection, step and gradient update is the compiled loop's arithmetic in
    the same order (elementwise NumPy, the sums left to right, ties to the last
    index as the loops' ``>=``/``<=`` sweeps), so the solution, the iteration count
    and the intercept are identical (``tests/test_smo.py`` checks it). Returns the
    status and the number of steps.
    """
    K = np.asarray(K, dtype=np.float64)  # float32 parts: the loops promote each value too
    QD = np.diagonal(K).copy()
    nz = np.flatnonzero(alpha > 0)
    if nz.size:
        g = np.cumsum(K[:, nz] * (alpha[nz] * y[nz]), axis=1)[:, -1]
        G[:] = y * g - 1.0
    else:
        G[:] = -1.0
    pos = y > 0
    it = 0
    while True:
        if it >= limit:
            return _MAX_ITER, it
        up = np.flatnonzero(np.where(pos, alpha < C, alpha > 0))
        if up.size == 0:
            return _CONVERGED, it
        minus_yG = -y * G
        i = int(up[_last_argmax(minus_yG[up])])
        g_max = float(minus_yG[i])
        Ki = K[i]
        low = np.flatnonzero(np.where(pos, alpha > 0, alpha < C))
        yG = y[low] * G[low]
        g_max2 = float(yG.max()) if low.size else -np.inf
        diff = g_max + yG
        ok = diff > 0
        j = -1
        if ok.any():
            cand = low[ok]
            d = diff[ok]
            quad = QD[i] + QD[cand] - 2.0 * Ki[cand]
            dec = -d * d / np.where(quad > 0, quad, TAU)
            j = int(cand[_last_argmax(-dec)])
        if g_max + g_max2 < tol or j < 0:
            return _CONVERGED, it
        Kj = K[j]
        Ci = float(C[i])
        Cj = float(C[j])
        old_i = float(alpha[i])
        old_j = float(alpha[j])
        quad = float(QD[i]) + float(QD[j]) - 2.0 * float(Ki[j])
        ai, aj = _pair_step_py(old_i, old_j, bool(y[i] != y[j]), quad, float(G[i]),
                               float(G[j]), Ci, Cj)
        alpha[i] = ai
        alpha[j] = aj
        di = (ai - old_i) * float(y[i])
        dj = (aj - old_j) * float(y[j])
        G += y * (Ki * di + Kj * dj)
        it += 1


def _rho_numpy(y, C, alpha, G):
    """:func:`_rho` in NumPy (the free variables' sum left to right, as the loop)."""
    yg = y * G
    upper = alpha >= C
    lower = ~upper & (alpha <= 0)
    free = ~upper & ~lower
    if free.any():
        return _sequential_sum(yg[free]) / int(free.sum())
    pos = y > 0
    to_ub = (upper & ~pos) | (lower & pos)
    to_lb = (upper & pos) | (lower & ~pos)
    ub = float(yg[to_ub].min()) if to_ub.any() else np.inf
    lb = float(yg[to_lb].max()) if to_lb.any() else -np.inf
    return 0.5 * (ub + lb)


def _solve_dense_problems_numpy(K, whole, offsets, idx, y, C, alpha, G, which, tol, limits,
                                n_iter, status, rho, objective):
    """:func:`_solve_dense_problems` without shrinking, in NumPy, with identical results.

    The twin that small batches use while the compiled function is being compiled
    in the background (:mod:`._jit`): the same algorithm, not a second one, written
    out in NumPy so that a first fit does not wait seconds for numba's compiler.
    """
    for w in which:
        a = offsets[w]
        b = offsets[w + 1]
        Kw = K if whole[w] else K[np.ix_(idx[a:b], idx[a:b])]
        ya, Ca, al, Ga = y[a:b], C[a:b], alpha[a:b], G[a:b]
        status[w], n_iter[w] = _solve_dense_numpy(Kw, ya, Ca, al, Ga, int(limits[w]), tol)
        rho[w] = _rho_numpy(ya, Ca, al, Ga)
        objective[w] = _sequential_sum(al * (Ga - 1.0)) / 2.0


class _RowSource:
    """Kernel rows of one problem too large to hold whole, computed on demand.

    Rows cover only the active (unshrunk) variables, as LIBSVM's: once
    shrinking has removed most variables a row costs a fraction of a full
    one. The active rows of ``X`` and their norms are gathered once per
    change of the active set, so each row is one GEMV plus the kernel map.
    Rows are computed in float32, as LIBSVM caches its ``Qfloat`` rows: half
    the memory traffic per row and twice the rows per MB of cache; the
    gradient and the dual variables stay in float64.
    """

    def __init__(self, kernel, X, idx):
        self.kernel = kernel
        self.X = X[idx]
        self.X32 = self.X.astype(np.float32)
        self.version = -1

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
        return self.kernel.dot(self.X[r], self.X[cols], coef)


def check_problem(y, C, alpha0):
    """Validate one dual problem's labels, bounds and warm start; returns float64 copies."""
    checked = check_flat([y], [C], [alpha0])
    return checked.y, checked.C, checked.alpha


def solve(kernel, X, idx, y, C, *, tol=1e-3, max_iter=-1, cache_bytes=1 << 30,
          shrinking=True, alpha0=None, K=None) -> SMOResult:
    """Solve the dual on the rows ``idx`` of ``X`` (host arrays).

    ``K`` may be the problem's whole kernel matrix, already computed (shared
    by the one-vs-one problems of a part); otherwise rows are computed on
    demand and cached in at most ``cache_bytes``.
    """
    y, C, alpha = check_problem(y, C, alpha0)
    return _solve_checked(kernel, X, np.asarray(idx), y, C, alpha, tol, max_iter, cache_bytes,
                          shrinking, K)


def _solve_checked(kernel, X, idx, y, C, alpha, tol, max_iter, cache_bytes, shrinking, K):
    """One validated problem: the dense solver when its matrix is (or fits) in memory."""
    n = y.shape[0]
    if K is None and kernel.name == "precomputed":
        K = _dense(X)[np.ix_(idx, idx)]
    if K is None and n * n * np.dtype(X.dtype).itemsize <= cache_bytes:
        K = kernel.matrix(X[idx], max_bytes=max(cache_bytes, 1))
    if K is not None:
        one = _DenseRun(np.ones(1, bool), np.arange(n, dtype=np.int64),
                        Checked(np.array([0, n], dtype=np.int64), y, C, alpha),
                        tol, max_iter, shrinking)
        one(np.ascontiguousarray(K), np.zeros(1, np.int64))
        return one.results()[0]
    src = _RowSource(kernel, X, idx)
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
    state[_MAX] = iteration_limit(max_iter, n)
    state[_ACTIVE] = n
    state[_COUNTER] = min(n, 1000)

    status = _iterate(src, y, C, QD, alpha, G, active, cache, slot_of, slot_row, slot_full,
                      slot_time, state, tol, shrinking)
    return SMOResult(alpha=alpha, intercept=-float(_rho(y, C, alpha, G)),
                     n_iter=int(state[_ITER]), objective=float(alpha @ (G - 1.0)) / 2.0,
                     gradient=G, converged=status == _CONVERGED)


def _dense(X):
    """A precomputed kernel matrix as a dense host array."""
    return X.toarray() if hasattr(X, "toarray") else np.asarray(X)


class _DenseRun:
    """A flat batch for :func:`_solve_dense_problems` and its outputs, filled call by call."""

    def __init__(self, whole, idx, checked, tol, max_iter, shrinking):
        self.checked = checked
        self.whole = whole
        self.args = (whole, checked.offsets, idx, checked.y, checked.C, checked.alpha)
        n_problems = len(checked.offsets) - 1
        self.sizes = np.diff(checked.offsets)
        self.G = np.empty_like(checked.y)
        self.n_iter = np.zeros(n_problems, dtype=np.int64)
        self.status = np.zeros(n_problems, dtype=np.int64)
        self.rho = np.zeros(n_problems)
        self.objective = np.zeros(n_problems)
        limits = [iteration_limit(int(max_iter), int(n)) for n in self.sizes.tolist()]
        self.limits = np.array(limits, dtype=np.int64)
        # None, not False: the compiled code without shrinking is a smaller, faster compile.
        self.settings = (float(tol), self.limits, True if shrinking else None)

    def __call__(self, K, which):
        """Solve the problems ``which`` on rows of ``K`` (one compiled call, GIL released)."""
        m = int(self.sizes[which].max()) if len(which) else 0
        gathered = self.sizes[which][~self.whole[which]]
        side = int(gathered.max()) if gathered.size else 1
        # Workspaces for the call (one per thread): allocating them in compiled code
        # would compile NumPy's allocators into the first fit.
        sub = np.empty((side, side), dtype=K.dtype)
        which = np.asarray(which, dtype=np.int64)
        args = (K, *self.args, self.G, which, *self.settings, self.n_iter, self.status,
                self.rho, self.objective, sub, np.empty(m), np.empty(m, dtype=np.int64),
                np.empty(m, dtype=np.int64), np.empty(m), np.zeros(8, dtype=np.int64))
        if self._small(which) and not _jit.ready(_solve_dense_problems, *args):
            _solve_dense_problems_numpy(K, *self.args, self.G, which, self.settings[0],
                                        self.limits, self.n_iter, self.status, self.rho,
                                        self.objective)
            return
        _solve_dense_problems(*args)

    def _small(self, which):
        """Whether the NumPy twin may take these problems while numba compiles."""
        sizes = self.sizes[which]
        return (self.settings[2] is None and sizes.size > 0
                and int(sizes.max()) <= NUMPY_TWIN_MAX_ROWS
                and int((sizes * sizes).sum()) <= NUMPY_TWIN_MAX_WORK)

    def results(self) -> list[SMOResult]:
        return [self.result(w) for w in range(len(self.checked.offsets) - 1)]

    def result(self, w) -> SMOResult:
        """Problem ``w``'s solution (views of the flat arrays), once its call returned."""
        a, b = int(self.checked.offsets[w]), int(self.checked.offsets[w + 1])
        return SMOResult(alpha=self.checked.alpha[a:b], intercept=-float(self.rho[w]),
                         n_iter=int(self.n_iter[w]), objective=float(self.objective[w]),
                         gradient=self.G[a:b], converged=bool(self.status[w] == _CONVERGED))


def _in_threads(fn, items, n_jobs, on_result=None):
    """``fn`` over ``items`` in joblib threads (the numba loops release the GIL).

    ``on_result(item, result)`` runs in the calling thread as each result comes
    back, in the order of ``items`` (progress reports are printed from there).
    """
    from joblib import Parallel, delayed

    items = list(items)
    if n_jobs in (None, 1) or len(items) <= 1:
        outputs = (fn(item) for item in items)
    else:
        outputs = Parallel(n_jobs=n_jobs, prefer="threads", return_as="generator")(
            delayed(fn)(it) for it in items)
    done = []
    for item, out in zip(items, outputs):
        done.append(out)
        if on_result is not None:
            on_result(item, out)
    return done


class _BlasThreads:
    """BLAS on one thread while rows are computed, all threads for a reconstruction.

    One row is one GEMV: BLAS threads only add synchronisation to it (and the
    parts of a CA-SVM already run in parallel threads).
    """

    def __init__(self):
        self.limits = None

    def single(self):
        self.limits = threadpool_limits(1, user_api="blas")

    def restore(self):
        if self.limits is not None:
            self.limits.restore_original_limits()
            self.limits = None


def _iterate(src, y, C, QD, alpha, G, active, cache, slot_of, slot_row, slot_full, slot_time,
             state, tol, shrinking):
    """Alternate numba iterations with row computations and unshrinking until done."""
    n = y.shape[0]
    blas = _BlasThreads()
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
                _drop_partial_rows(slot_of, slot_row, slot_full)
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


def _drop_partial_rows(slot_of, slot_row, slot_full):
    """After unshrinking, rows computed for a smaller active set are incomplete."""
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


def solve_batch(kernel, Xs, problems, *, tol=1e-3, max_iter=-1, cache_bytes=1 << 30,
                shrinking=True, n_jobs=None, progress=None) -> list[SMOResult]:
    """Solve every problem, sharing kernel values between the problems of a group.

    The problems are validated once, together, and laid end to end in flat
    arrays. Every group whose kernel matrix fits in ``cache_bytes`` (the usual
    case for the parts of a CA-SVM) gets it computed once; its problems are
    then solved by compiled calls over chunks of problems, with no Python
    per problem or per step. Problems of larger groups are solved one by one
    with rows computed on demand. Chunks and large problems run in joblib
    threads (the numba loops release the GIL). ``progress(group, results)``, when
    given, is called in the calling thread as soon as every problem of a group is
    solved, with that group's results in problem order.
    """
    if not problems:
        return []
    checked = check_flat([p.y for p in problems], [p.C for p in problems],
                          [p.alpha0 for p in problems])
    group = np.array([p.group for p in problems], dtype=np.int64)
    idxs = [np.asarray(p.idx, dtype=np.int64) for p in problems]
    sizes = np.diff(checked.offsets)
    if any(i.shape != (n,) for i, n in zip(idxs, sizes.tolist())):
        raise ValueError("every problem needs one row index per label (idx and y of equal "
                         "length)")
    if np.any((group < 0) | (group >= len(Xs))):
        raise ValueError(f"a problem names a group outside 0..{len(Xs) - 1}")
    idx = np.concatenate(idxs)
    rows = np.array([X.shape[0] for X in Xs], dtype=np.int64)
    if np.any(idx < 0) or np.any(idx >= np.repeat(rows[group], sizes)):
        raise ValueError("a problem's row index is outside its group's matrix")
    used = np.unique(group).tolist()
    planned = {g: _matrix_plan(kernel, Xs[g], cache_bytes) for g in used}
    mat_rows = np.array([-1 if planned.get(g) is None else Xs[g].shape[0]
                         for g in range(len(Xs))], dtype=np.int64)
    dense = mat_rows[group] >= 0
    # Problem w is its group's whole matrix when idx[a:b] == arange(b - a) and b - a == m.
    shifted = idx - (np.arange(idx.size) - np.repeat(checked.offsets[:-1], sizes))
    in_order = np.add.reduceat((shifted != 0).astype(np.int64), checked.offsets[:-1]) == 0
    run = _DenseRun(dense & in_order & (sizes == mat_rows[group]), idx, checked, tol, max_iter,
                    shrinking)
    # One compiled call per chunk of a group's problems: largest first, dealt
    # round-robin, about 8 chunks per thread over all groups.
    jobs = 1 if n_jobs in (None, 1) else effective_n_jobs(n_jobs)
    dense_groups = np.unique(group[dense])
    per_group = 1 if jobs == 1 else -(-8 * jobs // max(len(dense_groups), 1))
    # A group's whole matrix is made just before its problems are solved and dropped
    # after them (so at most n_jobs are held at once, each at most cache_size, and the
    # solver reads a matrix partly still in the CPU's cache): on one thread group after
    # group (the GEMM with all of BLAS's threads); on several when each group is one
    # task, inside it. Otherwise (few groups, their problems split over the threads)
    # every matrix is made first.
    own = jobs > 1 and per_group == 1
    row_cached = np.flatnonzero(~dense).tolist()
    tasks = [("row-cached", w) for w in row_cached]
    for g in dense_groups.tolist():
        mine = np.flatnonzero(group == g)
        mine = mine[np.argsort(-sizes[mine], kind="stable")]
        n_chunks = min(per_group, mine.size)
        tasks += [("dense", (g, mine[c::n_chunks])) for c in range(n_chunks)]
    diagonal = _run_blocks(kernel, Xs, [(group[w], idxs[w]) for w in row_cached], cache_bytes)
    bounds = checked.offsets

    def task(item):
        kind, what = item
        if kind == "dense":
            g, which = what
            if own:
                return run(_make_matrix(kernel, Xs[g], planned[g], cache_bytes), which)
            return run(mats[g], which)
        w = what
        a, b = bounds[w], bounds[w + 1]
        g = int(group[w])
        K = None
        if diagonal and (b - a) ** 2 * np.dtype(Xs[g].dtype).itemsize <= cache_bytes:
            K = _assemble(kernel, Xs[g], idxs[w], diagonal, g)
        return w, _solve_checked(kernel, Xs[g], idxs[w], checked.y[a:b], checked.C[a:b],
                                 checked.alpha[a:b], tol, max_iter, cache_bytes, shrinking, K)

    # Many problems: the threads are the parallelism; BLAS threads inside each
    # would only oversubscribe the cores.
    pending = np.bincount([group[what] if kind == "row-cached" else what[0]
                           for kind, what in tasks], minlength=len(Xs))
    row_results = {}

    def finished(item, out):
        """A task is back (calling thread): report its group once all of the group's are."""
        kind, what = item
        g = int(group[what]) if kind == "row-cached" else int(what[0])
        if kind == "row-cached":
            row_results[out[0]] = out[1]
        pending[g] -= 1
        if pending[g] == 0 and progress is not None:
            mine = np.flatnonzero(group == g).tolist()
            progress(g, [row_results[w] if w in row_results else run.result(w)
                         for w in mine])

    # One scan of the loaded BLAS libraries for the whole batch (a threadpool_limits
    # each does its own, milliseconds each), then BLAS on one thread for every solve.
    blas = ThreadpoolController() if len(problems) > 1 else None

    def solve(items):
        with blas.limit(limits=1, user_api="blas") if blas is not None else nullcontext():
            return _in_threads(task, items, n_jobs, on_result=finished)

    mats = {}
    if jobs == 1:
        done = solve([t for t in tasks if t[0] == "row-cached"])
        for g in dense_groups.tolist():
            mats[g] = _make_matrix(kernel, Xs[g], planned[g], cache_bytes)
            done += solve([t for t in tasks if t[0] == "dense" and t[1][0] == g])
            del mats[g]
    else:
        if not own:
            mats = dict(zip(dense_groups.tolist(), _in_threads(
                lambda g: _make_matrix(kernel, Xs[g], planned[g], cache_bytes),
                dense_groups.tolist(), n_jobs)))
        done = solve(tasks)
    results = run.results()
    for out in done:
        if out is not None:
            results[out[0]] = out[1]
    return results


def _matrix_plan(kernel, X, cache_bytes):
    """How a group's whole kernel matrix is made ("precomputed", "sgemm", "exact"), or
    None when it does not fit in ``cache_bytes`` (its problems then compute rows on demand).

    One GEMM per group: the one-vs-one problems of a group need exactly its values
    between them (diagonal plus cross blocks).
    """
    if kernel.name == "precomputed":
        return "precomputed"
    if X.shape[0] ** 2 * 4 <= cache_bytes and sgemm_applies(kernel, X):
        return "sgemm"
    if X.shape[0] ** 2 * np.dtype(X.dtype).itemsize > cache_bytes:
        return None
    return "exact"


def _make_matrix(kernel, X, plan, cache_bytes):
    """The group's kernel matrix as :func:`_matrix_plan` planned it."""
    if plan == "precomputed":
        return np.ascontiguousarray(_dense(X))
    if plan == "sgemm":
        return sgemm_matrix(kernel, X, max_bytes=max(cache_bytes, 1))
    return np.ascontiguousarray(kernel.matrix(X, max_bytes=max(cache_bytes, 1)))


#: Largest bound on the float32 rounding error of an rbf exponent that
#: :func:`sgemm_matrix` accepts: 10x below SMO's default tolerance for the
#: worst pair; on standardised adult the bound is 1e-5 to 8e-5 per part and the
#: largest error measured off the diagonal 2e-6.
SGEMM_EXPONENT_ERROR = 1e-4

#: Smaller matrices are computed in the data's dtype: their GEMM takes
#: milliseconds, and small problems then solve exactly as before, as the GPU
#: solver does and as with a precomputed kernel matrix.
SGEMM_MIN_ROWS = 2048


def _centred(X):
    dense = X.toarray() if hasattr(X, "toarray") else np.asarray(X)
    return dense - dense.mean(axis=0)


def sgemm_rows(kernel, X):
    """The centred rows of ``X`` when its rbf matrix is built by :func:`sgemm_matrix`, else None.

    rbf, at least :data:`SGEMM_MIN_ROWS` rows, no more features than rows
    (a sparse part is densified: the dense copy is then no larger than the
    matrix) and a rounding bound ``2 gamma max ||x - mean||^2 eps32`` at most
    :data:`SGEMM_EXPONENT_ERROR` (a large gamma falls back to float64). It
    depends on the shape and the values only, never on the format.
    """
    n, d = X.shape
    if kernel.name != "rbf" or n < SGEMM_MIN_ROWS or d > n:
        return None
    centred = _centred(X)
    radius = float(np.einsum("ij,ij->i", centred, centred).max())
    if 2.0 * kernel.gamma * radius * np.finfo(np.float32).eps > SGEMM_EXPONENT_ERROR:
        return None
    return centred


def sgemm_applies(kernel, X) -> bool:
    """Whether the rbf matrix of ``X`` is built by :func:`sgemm_matrix` (see :func:`sgemm_rows`)."""
    return sgemm_rows(kernel, X) is not None


def sgemm_matrix(kernel, X, *, max_bytes, centred=None):
    """``K(X, X)`` for rbf in float32 by one SGEMM, as LIBSVM caches its values (``Qfloat``).

    Half the memory of float64, about twice as fast (SGEMM and a float32
    ``exp``; building the matrix is most of a CA-SVM part's fit). The rows are
    centred first (``centred``: :func:`sgemm_rows`' result, when the caller has
    it), which leaves distances unchanged and removes the cancellation of
    ``||x||^2 + ||y||^2 - 2 x.y`` for data far from the origin; the diagonal is
    set to its exact value 1 and the matrix mirrored to exact symmetry. The
    gradient and the dual variables stay in float64. Use where
    :func:`sgemm_applies`.
    """
    centred = _centred(X) if centred is None else centred
    K = np.ascontiguousarray(kernel.matrix(centred.astype(np.float32), max_bytes=max_bytes))
    np.fill_diagonal(K, 1.0)
    return _mirror_upper(K)


@njit(nogil=True, cache=True)
def _mirror_upper(K):
    """Copy the upper triangle onto the lower one, in place: an exactly symmetric ``K``.

    ``||x||^2 + ||y||^2 - 2 x.y`` rounds differently in ``(i, j)`` and ``(j, i)``;
    SMO's incremental gradient reads rows and a fresh one columns, which must
    agree to the last bit for a warm start from a solution to take no step.
    """
    n = K.shape[0]
    step = 64
    for a in range(0, n, step):
        for b in range(a, n, step):
            for i in range(a, min(a + step, n)):
                for j in range(max(b, i + 1), min(b + step, n)):
                    K[j, i] = K[i, j]
    return K


def _runs(idx):
    """Maximal runs of consecutive indices of ``idx`` as ``(start, stop)`` pairs."""
    if idx.size == 0:
        return []
    cut = np.flatnonzero(np.diff(idx) != 1) + 1
    first = np.concatenate([[0], cut])
    last = np.concatenate([cut, [idx.size]])
    return [(int(idx[a]), int(idx[b - 1]) + 1) for a, b in zip(first, last)]


def _run_blocks(kernel, Xs, problems, cache_bytes):
    """Kernel blocks of the index runs shared by several ``(group, idx)`` problems.

    One-vs-one problems over rows sorted by class are two runs each: the
    diagonal block of every class is computed once here (if they fit in
    ``cache_bytes`` together) and only the cross block per pair later, about
    a third of the kernel values of computing every pair's matrix whole.
    """
    if kernel.name == "precomputed":
        return {}
    wanted = {}
    for g, idx in problems:
        for run_ in _runs(idx):
            wanted[(int(g),) + run_] = wanted.get((int(g),) + run_, 0) + 1
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
