r"""The SMO iteration on the CPU: numba loops (``nogil``) and their NumPy twin.

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

The iteration is a numba state machine (:func:`_run`) that runs until it
needs a row that is not cached, then returns to its caller (:mod:`.rows`),
which computes that row and re-enters where the step stopped. When a
problem's whole kernel matrix is in memory every row is "cached" and the loop
never leaves numba (:func:`_solve_dense`, and :func:`_continue_dense` once the
rows on demand have become a whole matrix); :func:`_solve_dense_problems` solves
a chunk of a flat batch's problems on one group's matrix in one call, so no
Python runs per problem. :func:`_solve_dense_problems_numpy` is that dense
solver written out in NumPy, step for step, for small batches while numba
compiles (:mod:`gpuml.kernels._jit`).

Compile time. The first fit in a fresh install compiles these functions
(numba's type inference and lowering, in Python; ``bench/bench_first_fit.py``
measures it, bench/results/cpu-2core/first_fit.md), so they are written to compile
little: nothing allocates inside compiled code (the workspaces come from Python: each
NumPy allocator would compile its own implementation), the functions are compiled
without reference counting (``_nrt=False``, which that allows), and the dense
path passes ``None`` for what it does not use (the LRU slots, and shrinking
when it is off, the default of CA-SVM), which numba prunes before typing, so
that code is compiled only by a fit that uses it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Smallest curvature used for a non-positive-definite pair (LIBSVM's TAU).
TAU = 1e-12

_CONVERGED, _NEED_ROWS, _MAX_ITER, _UNSHRINK = 0, 1, 2, 3
# Slots of the integer state vector shared by Python and the numba loop; _PAIR_I and
# _PAIR_J hold 1 + the indices of a working pair chosen before a missing row stopped its
# step (0: none), _FILL 1 + the slot the products of the missing row go to on re-entry
# (:mod:`.values`' ``fill_and_run``; 0: none).
(_ITER, _MAX, _ACTIVE, _CLOCK, _COUNTER, _UNSHRUNK, _NEED, _VERSION, _PAIR_I, _PAIR_J,
 _FILL) = range(11)
#: Length of the state vector.
STATE_SIZE = 11


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


@njit(nogil=True, cache=True, inline="always", _nrt=False)
def _set_sides(k, yk, ak, ck, masks):
    """Variable ``k``'s entries of the selection masks: ``masks[0, k]`` 0 where it is in
    I_up, -inf where not; ``masks[1, k]`` the same for I_low."""
    masks[0, k] = 0.0 if _in_up(yk, ak, ck) else -np.inf
    masks[1, k] = 0.0 if _in_low(yk, ak, ck) else -np.inf


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
    # The variables kept stay in their order (a stable partition): ``active`` then stays
    # ascending, so the sweeps read the kernel rows forwards, as the hardware prefetches
    # them; swapping each shrunk variable with the last active one scattered the order,
    # and every read of a row of a matrix too large for the cache missed.
    kept = 0
    for t in range(n_active):
        k = active[t]
        if not _shrinkable(k, y, C, alpha, G, g1, g2):
            active[t] = active[kept]
            active[kept] = k
            kept += 1
    n_active = kept
    if n_active < state[_ACTIVE]:
        state[_ACTIVE] = n_active
        state[_VERSION] += 1
    return False


@njit(nogil=True, cache=True, _nrt=False)
def _run(y, C, QD, alpha, G, active, cache, slot_of, slot_time, state, tol, shrinking,
         masks):
    """SMO iterations until convergence, ``max_iter``, a cache miss or an unshrink request.

    Returns a status code; on ``_NEED_ROWS`` the missing row is ``state[_NEED]``. The
    working pair chosen so far is kept in the state (``_PAIR_I``, ``_PAIR_J``), and
    re-entering after the caller filled the cache resumes the step there: the choice
    sweeping again would make (it depends only on the state), a sweep or two fewer.

    ``masks`` (a ``(2, n)`` workspace) holds which of I_up and I_low each active variable
    is in, as 0 or -inf added to ``-y G`` and ``y G`` (:func:`_set_sides`): set on entry,
    then for the two variables of each step, so the selection sweeps read one value per
    variable and branch only where a better one is found (branching on each variable's
    ``y`` and bounds mispredicts about as often as the statuses mix, and the sweeps are
    most of a step: bench/results/cpu-2core/search-runs.md). The choices are those of
    LIBSVM's sweeps, ties included: a variable outside a set sweeps as -inf.
    """
    n = y.shape[0]
    for t in range(state[_ACTIVE]):
        k = t if shrinking is None else active[t]
        _set_sides(k, y[k], alpha[k], C[k], masks)
    up = masks[0]
    low = masks[1]
    # slot_of (with slot_time) None: the whole matrix is ``cache``, row k in slot k (the
    # dense path). It and ``shrinking=None`` are pruned at compile time (numba drops the
    # branches on an argument typed None), so a dense fit without shrinking compiles
    # neither the LRU lookups nor the shrinking code, and compiles that much less. Without
    # shrinking every variable stays active in order (active[t] == t): the sweeps then
    # index directly, with no gather through ``active`` (a dense solve a third faster).
    while True:
        if state[_MAX] >= 0 and state[_ITER] >= state[_MAX]:
            return _MAX_ITER
        n_active = state[_ACTIVE]
        i = state[_PAIR_I] - 1
        if i >= 0:
            g_max = -y[i] * G[i]
        else:
            g_max = -np.inf
            for t in range(n_active):
                k = t if shrinking is None else active[t]
                v = up[k] - y[k] * G[k]
                if v >= g_max:
                    g_max = v
                    i = k
            if g_max == -np.inf:  # I_up is empty (i: a variable outside it, or none)
                return _CONVERGED
        si = i
        if slot_of is not None:
            si = _lookup(i, slot_of, slot_time, state)
            if si < 0:
                state[_NEED] = i
                state[_PAIR_I] = i + 1
                return _NEED_ROWS
        Ki = cache[si]
        j = state[_PAIR_J] - 1
        if j < 0:
            g_max2 = -np.inf
            best = np.inf
            QDi = QD[i]
            for t in range(n_active):
                k = t if shrinking is None else active[t]
                yg = low[k] + y[k] * G[k]
                if yg > g_max2:
                    g_max2 = yg
                diff = g_max + yg
                if diff > 0:
                    quad = QDi + QD[k] - 2.0 * Ki[k]
                    dec = -diff * diff / (quad if quad > 0 else TAU)
                    if dec <= best:
                        best = dec
                        j = k
            if g_max + g_max2 < tol or j < 0:
                state[_PAIR_I] = 0
                return _CONVERGED
        sj = j
        if slot_of is not None:
            sj = _lookup(j, slot_of, slot_time, state)
            if sj < 0:
                state[_NEED] = j
                state[_PAIR_I] = i + 1
                state[_PAIR_J] = j + 1
                return _NEED_ROWS
        state[_PAIR_I] = 0
        state[_PAIR_J] = 0
        Kj = cache[sj]
        Ci = C[i]
        Cj = C[j]
        old_i = alpha[i]
        old_j = alpha[j]
        ai, aj = _pair_step(old_i, old_j, y[i] != y[j], QD[i] + QD[j] - 2.0 * Ki[j],
                            G[i], G[j], Ci, Cj)
        alpha[i] = ai
        alpha[j] = aj
        _set_sides(i, y[i], ai, Ci, masks)
        _set_sides(j, y[j], aj, Cj, masks)
        # G_k += Q_ki d_i + Q_kj d_j with Q_kl = y_k y_l K_kl.
        di = (ai - old_i) * y[i]
        dj = (aj - old_j) * y[j]
        for t in range(n_active):
            k = t if shrinking is None else active[t]
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
def _gradient_from_rows(K, slot_of, y, alpha, G, ks, nz, v):
    """``G_k = (Q a)_k - 1`` for the variables ``ks`` from the cached rows of the non-zero
    variables (row ``s`` in slot ``slot_of[s]``): the values every step used, read along
    those rows, summed in :func:`_dense_gradient`'s order. ``nz``, ``v``: workspaces."""
    n_nz = 0
    for k in range(y.shape[0]):
        if alpha[k] > 0:
            nz[n_nz] = slot_of[k]
            v[n_nz] = alpha[k] * y[k]
            n_nz += 1
    for k in ks:
        G[k] = 0.0
    for t in range(n_nz):
        row = K[nz[t]]
        vt = v[t]
        for k in ks:
            G[k] += row[k] * vt
    for k in ks:
        G[k] = y[k] * G[k] - 1.0


@njit(nogil=True, cache=True, _nrt=False)
def _solve_dense(K, y, C, alpha, G, state, tol, shrinking, QD, active, nz, v, masks):
    """SMO on one problem whose kernel matrix ``K`` is in memory: no row ever leaves numba.

    The same iteration (:func:`_run`) as the cached path, with every row
    "cached" (row k of ``K`` is slot k); shrinking's gradient reconstruction is a
    loop over ``K``. ``shrinking=None`` compiles the variant without shrinking.
    ``QD``, ``active``, ``nz``, ``v``: workspaces of at least n entries, ``masks`` of
    ``(2, n)`` (no allocation in compiled code: every NumPy allocator costs compile time).
    """
    n = y.shape[0]
    for k in range(n):
        QD[k] = K[k, k]
        active[k] = k
    state[_ACTIVE] = n
    state[_COUNTER] = n if n < 1000 else 1000
    _dense_gradient(K, y, alpha, G, active[:n], nz, v)
    return _continue_dense(K, y, C, alpha, G, state, tol, shrinking, QD, active, nz, v,
                           masks)


@njit(nogil=True, cache=True, _nrt=False)
def _continue_dense(K, y, C, alpha, G, state, tol, shrinking, QD, active, nz, v, masks):
    """:func:`_solve_dense` from a state it (or the row cache, :mod:`.rows`) left: every
    variable active (``active[t] == t``, ``state[_ACTIVE] == n``), ``G`` exact."""
    n = y.shape[0]
    while True:
        status = _run(y, C, QD, alpha, G, active, K, None, None, state, tol, shrinking,
                      masks)
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
                          state, masks):
    """Solve the problems ``which`` of a flat batch, all on rows of ``K``, in one call.

    Problem ``w`` owns ``offsets[w]:offsets[w + 1]`` of the flat ``idx`` (rows of
    ``K``), ``y``, ``C``, ``alpha`` (warm start in, solution out) and ``G``, and
    stops after ``limits[w]`` steps. ``whole[w]``: the problem is all rows of ``K``
    in order, so ``K`` is used as it is; otherwise its submatrix is gathered into
    the workspace ``sub`` (as large as the largest such problem, same type as
    ``K``). ``QD``, ``active``, ``nz``, ``v`` (the largest problem's size), ``masks``
    (2 by that size) and ``state`` (:data:`STATE_SIZE`) are workspaces too.
    ``shrinking=None``: no shrinking (compiled without it).
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
        status[w] = _solve_dense(Kw, ya, Ca, al, Ga, state, tol, shrinking, QD, active, nz, v,
                                 masks)
        n_iter[w] = state[_ITER]
        rho[w] = _rho(ya, Ca, al, Ga)
        f = 0.0
        for k in range(b - a):
            f += al[k] * (Ga[k] - 1.0)
        objective[w] = f / 2.0


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
    in the background (:mod:`gpuml.kernels._jit`): the same algorithm, not a second one,
    written out in NumPy so that a first fit does not wait for numba's compiler.
    """
    for w in which:
        a = offsets[w]
        b = offsets[w + 1]
        Kw = K if whole[w] else K[np.ix_(idx[a:b], idx[a:b])]
        ya, Ca, al, Ga = y[a:b], C[a:b], alpha[a:b], G[a:b]
        status[w], n_iter[w] = _solve_dense_numpy(Kw, ya, Ca, al, Ga, int(limits[w]), tol)
        rho[w] = _rho_numpy(ya, Ca, al, Ga)
        objective[w] = _sequential_sum(al * (Ga - 1.0)) / 2.0
