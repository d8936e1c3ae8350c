"""Asynchronous greedy coordinate descent for the bias-free kernel SVM dual, on CPU threads.

Seed 001, chapter 4: Alg 13 (serial GCD) and Alg 14 (Asy-GCD). The problem is

    min_a  1/2 a'Qa - e'a   s.t.  0 <= a_i <= C_i,   Q_ij = y_i y_j K(x_i, x_j)   (eq. 4.9)

Each worker is one thread (from a pool reused across solves; worker 0 is the
calling thread) running :func:`_work`, a numba function compiled with
``nogil=True``, so the workers run truly at the same time. A
worker owns one contiguous block of variables (the wrapper reorders the data
so that block ``w`` is ``[starts[w], starts[w+1])``) and repeats, with no
barrier and no lock:

1. pick the variable of its block with the largest projected gradient
   (eq. 4.11), reading the shared gradient ``g`` without synchronisation
   (``selection="greedy"``), or a uniformly random one (``"random"``, the
   PSCD baseline of §4.5);
2. the closed-form step ``delta`` (eq. 4.10);
3. ``g += delta * q_i`` with lock-free atomic float adds
   (:mod:`._atomics`), ``q_i`` taken from the worker's own LRU column cache
   (one contiguous array per worker, §4.4 "Kernel Caching") or computed from X;
4. ``a_i += delta`` (only the owner writes ``a_i``).

Stopping. Two shared counters bracket every update: ``started`` is bumped
before step 3 and ``finished`` after step 4. A worker whose block has no
projected gradient above ``tol`` certifies it *at state s* when it read
``finished == started == s`` before its scan and ``started == s`` after it
(so ``g`` did not change while it looked). Workers that find nothing to do
publish that state; when every worker has certified the same state, that
state is optimal to ``tol`` over all variables and the run stops. Workers
with work never wait for the check. A worker that stays quiet for a while
returns to its Python thread, which sleeps briefly before re-entering, so
idle workers give their core to busy ones when threads outnumber cores.
A variable whose exact step rounds to zero in floating point (a huge
``Q_ii``) cannot move, so the scans pass over it: it never keeps a block from
certifying. Every run ends: after :func:`default_max_updates` updates at the
latest (``converged=False``).

Damped steps (our addition to Alg 14). Workers that step at the same time
from the same gradient each take the *exact* step for their own coordinate,
as if no other coordinate moved. When the coordinates are strongly
correlated (greedy picks the largest violators, which for near-duplicate
points have the same large gradient) the steps add up and overshoot: a
Jacobi-style instability in which the iterates swing between the bounds and
the run never ends. GPU thread blocks run nearly in lockstep, which makes
this the normal case there (digits, 8 blocks: no convergence in 20,000
synchronous rounds). So each worker keeps a step factor ``eta`` in
``[2**-12, 1]``, starting at 1, and steps ``P[0,C_i](a_i - eta g_i / Q_ii)``.
When it next computes a step it looks again at the coordinate ``i`` it
updated last: if ``g_i`` changed sign and kept over half its magnitude
(``g_i now / g_i before < -1/2``), the other workers' concurrent steps
overshot it, and ``eta`` is halved; otherwise ``eta`` grows by 10%, back to
1. One worker never sees that (its exact step leaves ``g_i`` about 0, or
with the same sign at a bound), so it keeps ``eta = 1`` and is exactly
Alg 13. Steps shorter than ``1 / L_max`` are what the analysis of
asynchronous coordinate descent asks for under bounded delay (Liu, Wright,
Re, Bittorf and Sridhar, "An asynchronous parallel stochastic coordinate
descent algorithm", 2015); the adaptive factor finds a safe length without
knowing the delay. A damped step that rounds to zero falls back to the exact
one.
"""

from __future__ import annotations

import functools
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from ._atomics import atomic_add, atomic_add_seq, atomic_load, atomic_store
from ._vexp import exp_nonpositive

#: Kernel codes understood by :func:`fill_column` (names as :mod:`gpuml.kernels.pairwise`).
KERNEL_CODES = {"linear": 0, "poly": 1, "rbf": 2, "sigmoid": 3, "precomputed": 4}

#: Floor on Q_ii, as LIBSVM's TAU: a non-positive diagonal (sigmoid kernel, zero rows of a
#: linear kernel) makes the one-variable problem unbounded, and the step then goes to a bound.
TAU = 1e-12

STARTED, FINISHED, STOP = 0, 1, 2
#: Values of ``counters[STOP]``: still running, stopped on the certificate, stopped by the
#: update cap (or the time limit).
RUNNING, CERTIFIED, CAPPED = 0, 1, 2
#: The damped step (module docstring): overshoot when ``g_now / g_before`` is below this;
#: the factor is then halved (not below ``ETA_MIN``), else it grows by ``ETA_GROWTH`` up to 1.
#: W workers stepping together on perfectly correlated coordinates need ``eta`` about
#: ``1 / W``; the floor covers 4,096 workers, more than any GPU keeps resident.
OVERSHOOT = -0.5
ETA_MIN = 2.0 ** -12
ETA_GROWTH = 1.1
#: What :func:`_work` returns: the run is over, or the worker found nothing to do for a while.
DONE, IDLE = 0, 1
#: Quiet scans in a row before an idle worker goes back to Python to sleep.
IDLE_SCANS = 64
IDLE_SLEEP = 50e-6


def default_max_updates(n: int) -> int:
    """The update cap when none is given: ``max(10**7, 100 n)``, LIBSVM's cap on SMO steps.

    A bound that no healthy run reaches (the benchmarks converge in under
    ``20 n`` updates) but that ends any run, so no solve can loop forever.
    """
    return max(10**7, 100 * int(n))


@njit(nogil=True, cache=True)
def damped_step_factor(eta, g_now, g_before):
    """The next step factor of a worker that moved a coordinate whose gradient was ``g_before``.

    ``g_now`` is that coordinate's gradient when the worker looks again. A sign
    change keeping over half the magnitude (``g_now / g_before < -1/2``) means
    concurrent steps overshot: halve the factor (not below ``ETA_MIN``); else
    grow it by ``ETA_GROWTH`` (up to 1). Written without a division.
    """
    if g_now * g_before < OVERSHOOT * g_before * g_before:
        return max(0.5 * eta, ETA_MIN)
    return min(1.0, ETA_GROWTH * eta)


@njit(nogil=True, cache=True, fastmath=True, inline="always")
def _dot(a, b):
    # Row views, not X[i, k]: without index wrap-around checks the loop vectorises (2x).
    s = 0.0
    for k in range(a.shape[0]):
        s += a[k] * b[k]
    return s


@njit(nogil=True, cache=True, fastmath=True, inline="always")
def _from_dot(dot, sq_i, sq_j, kind, gamma, coef0, degree):
    """Kernel value from the inner product (and squared norms, for rbf)."""
    if kind == 0:
        return dot
    if kind == 1:
        return (gamma * dot + coef0) ** degree
    if kind == 2:
        return math.exp(-gamma * max(sq_i + sq_j - 2.0 * dot, 0.0))
    return math.tanh(gamma * dot + coef0)


@njit(nogil=True, cache=True, fastmath=True)
def fill_column(X, sq_norms, y, i, kind, gamma, coef0, degree, out):
    """``out[j] = Q_ji = y_j y_i K(x_j, x_i)`` for every j: one column of Q in O(n d).

    ``kind == 4``: X is the precomputed kernel matrix (symmetric, so row i is column i).
    """
    n = y.shape[0]
    if kind == 4:
        for j in range(n):
            out[j] = y[j] * y[i] * X[i, j]
        return
    xi = X[i]
    if kind == 2:  # rbf: the exponents first, then one vectorised exp over the column
        # (into separate arrays: with out as its own input the SIMD loop would not be taken)
        arg = np.empty(n)
        for j in range(n):
            arg[j] = -gamma * max(sq_norms[i] + sq_norms[j] - 2.0 * _dot(X[j], xi), 0.0)
        exp_nonpositive(arg, out, np.empty(n, dtype=np.int64))
        for j in range(n):
            out[j] *= y[j] * y[i]
        return
    for j in range(n):
        k = _from_dot(_dot(X[j], xi), sq_norms[j], sq_norms[i], kind, gamma, coef0, degree)
        out[j] = y[j] * y[i] * k


@njit(nogil=True, cache=True, inline="always")
def _projected_gradient(g_j, a_j, c_j):
    """|a - P_[0,C](a - g)| (eq. 4.11)."""
    return abs(a_j - min(max(a_j - g_j, 0.0), c_j))


@njit(nogil=True, cache=True, inline="always")
def _moves(g_j, a_j, c_j, q_j):
    """Whether the exact step (eq. 4.10) changes ``a_j`` at all in floating point."""
    return min(max(a_j - g_j / q_j, 0.0), c_j) != a_j


@njit(nogil=True, cache=True)
def _scan(g, alpha, C, qdiag, lo, hi):
    """The variable of [lo, hi) with the largest projected gradient, and its value.

    Variables whose exact step rounds to zero are passed over: nothing can be
    done for them in this precision, and picking one would stall the worker.
    (The step is computed only for a new running maximum, so the scan costs
    about the same.)
    """
    best = -1
    best_v = 0.0
    for j in range(lo, hi):
        v = _projected_gradient(g[j], alpha[j], C[j])
        if v > best_v and _moves(g[j], alpha[j], C[j], qdiag[j]):
            best_v = v
            best = j
    return best, best_v


@njit(nogil=True, cache=True)
def _column(X, sq_norms, y, i, kind, gamma, coef0, degree, cache, slot_of, slot_var, slot_time,
            clock):
    """Column q_i from this worker's LRU cache (filling the least recently used slot on a miss)."""
    s = slot_of[i]
    if s < 0:
        s = 0
        for t in range(1, slot_time.shape[0]):
            if slot_time[t] < slot_time[s]:
                s = t
        if slot_var[s] >= 0:
            slot_of[slot_var[s]] = -1
        fill_column(X, sq_norms, y, i, kind, gamma, coef0, degree, cache[s])
        slot_var[s] = i
        slot_of[i] = s
    slot_time[s] = clock
    return cache[s]


@njit(nogil=True, cache=True)
def _xorshift(state):
    """One step of xorshift64* on ``state[0]``; a uniform 64-bit draw (per-worker RNG)."""
    x = state[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    state[0] = x
    return x * np.uint64(2685821657736338717)


@njit(nogil=True, cache=True)
def _certify(w, g, alpha, C, qdiag, lo, hi, tol, counters, quiet):
    """Whether block w is quiet (nothing above tol); if so, certify it, and stop if all agree.

    The certificate is only given at a state with no update in flight
    (``finished == started`` before the scan, ``started`` unchanged after it).
    """
    finished = atomic_load(counters, FINISHED)
    started = atomic_load(counters, STARTED)
    _, best_v = _scan(g, alpha, C, qdiag, lo, hi)
    if best_v >= tol:
        return False
    if finished != started or atomic_load(counters, STARTED) != started:
        return True
    atomic_store(quiet, w, started)
    for v in range(quiet.shape[0]):
        if atomic_load(quiet, v) != started:
            return True
    if atomic_load(counters, STARTED) == started:
        atomic_store(counters, STOP, CERTIFIED)
    return True


@njit(nogil=True, cache=True)
def _work(w, X, sq_norms, y, C, qdiag, starts, kind, gamma, coef0, degree, greedy, shared,
          tol, max_updates, alpha, g, counters, quiet, cache, slot_of, slot_var, slot_time, rng,
          damp, last):
    """Worker w's loop (Alg 14) until the run stops (DONE) or it idles (IDLE).

    ``damp = [eta, g_before]`` and ``last = [i]`` hold the worker's damped-step
    state across calls: its step factor, and the coordinate it moved last with
    that coordinate's gradient then (``i = -1``: nothing to look at).
    """
    lo = starts[w]
    hi = starts[w + 1]
    size = hi - lo
    n = g.shape[0]
    quiet_scans = 0
    picks = 0
    clock = slot_time.max()
    while atomic_load(counters, STOP) == RUNNING:
        if greedy:
            i, best_v = _scan(g, alpha, C, qdiag, lo, hi)
            if best_v < tol or i < 0:
                _certify(w, g, alpha, C, qdiag, lo, hi, tol, counters, quiet)
                quiet_scans += 1
                if quiet_scans >= IDLE_SCANS:
                    return IDLE
                continue
        else:
            picks += 1
            if picks >= size:
                picks = 0
                if _certify(w, g, alpha, C, qdiag, lo, hi, tol, counters, quiet):
                    quiet_scans += 1
                    if quiet_scans >= IDLE_SCANS:
                        return IDLE
                    picks = size  # quiet: scan again next time rather than pick in vain
                    continue
            i = lo + np.int64(_xorshift(rng) % np.uint64(size))
            # A pick already within tol is not worth an O(n) gradient update; skipping it
            # also lets the workers go quiet together, so the run can certify and stop.
            if _projected_gradient(g[i], alpha[i], C[i]) < tol:
                continue
        if not _moves(g[i], alpha[i], C[i], qdiag[i]):
            continue
        quiet_scans = 0
        clock += 1
        q = _column(X, sq_norms, y, i, kind, gamma, coef0, degree, cache, slot_of, slot_var,
                    slot_time, clock)
        if last[0] >= 0:  # a column's time after its update: the others' steps have landed
            damp[0] = damped_step_factor(damp[0], g[last[0]], damp[1])
            last[0] = -1
        # The step (eq. 4.10, damped) from g_i as it is now, not as it was before the O(nd)
        # column computation: other workers moved g meanwhile, and a stale step overshoots.
        a_i = alpha[i]
        g_i = g[i]
        new = min(max(a_i - damp[0] * g_i / qdiag[i], 0.0), C[i])
        if new == a_i:
            new = min(max(a_i - g_i / qdiag[i], 0.0), C[i])
        delta = new - a_i
        if delta == 0.0:
            continue
        if atomic_add_seq(counters, STARTED, 1) >= max_updates:
            atomic_store(counters, STOP, CAPPED)
            break
        if shared:
            for j in range(n):
                atomic_add(g, j, delta * q[j])
        else:  # one worker is serial GCD (Alg 13): nobody else writes g, plain adds suffice
            for j in range(n):
                g[j] += delta * q[j]
        alpha[i] = new
        atomic_add_seq(counters, FINISHED, 1)
        last[0] = i
        damp[1] = g_i
    return DONE


def _pool() -> ThreadPoolExecutor:
    """Threads reused across solves (starting threads costs milliseconds on a busy machine)."""
    return _pool_of_process(os.getpid())


@functools.cache
def _pool_of_process(pid: int) -> ThreadPoolExecutor:
    # Keyed by process: a forked child inherits the pool object but not its threads.
    # The bound is far above any worker count: a worker that sat queued behind a full pool
    # would never certify its block, and the others would wait for it forever.
    return ThreadPoolExecutor(max_workers=4096, thread_name_prefix=f"gpuml-gcd-{pid}")


@dataclass
class GCDResult:
    """What a GCD run returns (arrays in the input's namespace).

    Attributes
    ----------
    alpha : (n,) dual variables.
    objective : float, ``1/2 a'Qa - e'a`` from the maintained gradient.
    max_violation : float, largest projected gradient (eq. 4.11) at the end.
    n_updates : int, coordinate updates with a non-zero step.
    converged : bool, the run stopped on its certificate (every variable's projected
        gradient below ``tol``, but for variables whose exact step rounds to zero, which
        cannot move), not on the update cap or the time limit.
    n_workers : int, workers actually run (empty blocks get none).
    trace : list of ``(seconds, n_updates, alpha)`` snapshots when asked for (CPU): copies
        of the dual variables taken while the workers run. Every snapshot lies in the box
        ``[0, C]``, so it is a feasible point whatever the workers were doing; its exact
        objective comes from :func:`gpuml.kernels.gcd_objectives`, after the run.
    gradient : (n,) the maintained gradient ``g`` (which should equal ``Qa - e``) at the
        end, the basis of ``objective`` and ``max_violation`` (float64 on both devices).
    """

    alpha: object
    objective: float
    max_violation: float
    n_updates: int
    converged: bool
    n_workers: int
    trace: list = field(default_factory=list)
    gradient: object = None


@dataclass
class GCDProblem:
    """One bias-free SVM dual of a batch (a one-vs-one pair): rows ``rows`` of a shared X.

    Attributes
    ----------
    rows : int array of shape (m,), the rows of X (and, for a precomputed kernel, its
        columns) that are this problem's variables.
    y : array of shape (m,) in {-1, +1}.
    C : array of shape (m,), per-variable upper bounds.
    blocks : int array of shape (m,), the block (worker) of every variable.
    random_state : int, RandomState or None, seeds the random selection.
    """

    rows: np.ndarray
    y: np.ndarray
    C: np.ndarray
    blocks: np.ndarray
    random_state: object = None


def solve_batch(X, kernel, problems, *, n_jobs=1, cache_bytes=1 << 30, **options):
    """Solve every problem with :func:`solve`, ``n_jobs`` problems at a time in threads.

    Each problem runs on its own rows of X and gets ``cache_bytes / n_jobs`` of
    kernel-column cache; ``options`` are :func:`solve`'s. The numba workers
    release the GIL, so problems in threads run at the same time.
    """
    n_jobs = max(1, min(int(n_jobs or 1), len(problems)))

    def one(problem):
        rows = np.asarray(problem.rows, dtype=np.int64)
        if kernel.name == "precomputed":
            Xp = X[rows][:, rows]
            Xp = Xp.toarray() if hasattr(Xp, "toarray") else Xp
        else:
            Xp = X[rows]
        return solve(Xp, np.asarray(problem.y), np.asarray(problem.C), kernel,
                     np.asarray(problem.blocks), cache_bytes=int(cache_bytes) // n_jobs,
                     random_state=problem.random_state, **options)

    if n_jobs == 1:
        return [one(problem) for problem in problems]
    from joblib import Parallel, delayed

    return Parallel(n_jobs=n_jobs, prefer="threads")(delayed(one)(p) for p in problems)


def objective_from_gradient(alpha, g) -> float:
    """``1/2 a'Qa - e'a = 1/2 a'(g - 1)`` given ``g = Qa - 1``: O(n)."""
    return 0.5 * float(alpha @ (g - 1.0))


def max_violation(alpha, g, C) -> float:
    """The largest projected gradient over all variables (eq. 4.11)."""
    if alpha.shape[0] == 0:
        return 0.0
    return float(np.abs(alpha - np.clip(alpha - g, 0.0, C)).max())


def solve(X, y, C, kernel, blocks, *, selection="greedy", tol=1e-3, max_updates=None,
          cache_bytes=256 << 20, random_state=0, trace_interval=None, time_limit=None):
    """Run Asy-GCD on NumPy data; see :func:`gpuml.kernels.gcd_solve` for the parameters."""
    n = y.shape[0]
    labels = np.asarray(blocks, dtype=np.int64)
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=1)
    counts = counts[counts > 0]
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n_workers = counts.shape[0]
    kind = KERNEL_CODES[kernel.name]
    if kind == 4:
        Xw = np.ascontiguousarray(np.asarray(X, dtype=np.float64)[np.ix_(order, order)])
        qdiag = np.diagonal(Xw).copy()
        sq_norms = np.zeros(n)
    else:
        Xw = np.ascontiguousarray(np.asarray(X, dtype=np.float64)[order])
        qdiag = np.asarray(kernel.diag(Xw), dtype=np.float64)
        sq_norms = np.einsum("ij,ij->i", Xw, Xw)
    qdiag = np.maximum(qdiag, TAU)
    yw = np.ascontiguousarray(np.asarray(y, dtype=np.float64)[order])
    Cw = np.ascontiguousarray(np.asarray(C, dtype=np.float64)[order])
    alpha = np.zeros(n)
    g = -np.ones(n)
    counters = np.zeros(3, dtype=np.int64)
    quiet = np.full(n_workers, -1, dtype=np.int64)
    slot_of = np.full(n, -1, dtype=np.int64)
    limit = default_max_updates(n) if max_updates is None else int(max_updates)
    per_worker = max(int(cache_bytes) // max(n_workers, 1) // max(8 * n, 1), 1)
    seeds = np.random.default_rng(random_state).integers(1, 2**63, size=max(n_workers, 1))
    args = (Xw, sq_norms, yw, Cw, qdiag, starts, kind, float(kernel.gamma),
            float(kernel.coef0), int(kernel.degree), selection == "greedy", n_workers > 1,
            float(tol), limit,
            alpha, g, counters, quiet)

    def run(w):
        slots = min(per_worker, int(counts[w]))
        cache = np.empty((slots, n))
        slot_var = np.full(slots, -1, dtype=np.int64)
        slot_time = np.zeros(slots, dtype=np.int64)
        rng = np.array([seeds[w]], dtype=np.uint64)
        damp = np.array([1.0, 0.0])
        last = np.array([-1], dtype=np.int64)
        while _work(w, *args, cache, slot_of, slot_var, slot_time, rng, damp, last) == IDLE:
            time.sleep(IDLE_SLEEP)

    trace = []
    t0 = time.perf_counter()
    monitor = trace_interval is not None or time_limit is not None
    futures = [_pool().submit(run, w) for w in range(0 if monitor else 1, n_workers)]
    if not monitor and n_workers > 0:
        run(0)
    poll = trace_interval if trace_interval is not None else 0.01
    while monitor and wait(futures, timeout=poll).not_done:
        elapsed = time.perf_counter() - t0
        if trace_interval is not None:
            # alpha alone, never g: the objective from a g that the workers are still
            # adding into is optimistic; any alpha in the box is a point to evaluate exactly.
            trace.append((elapsed, int(counters[FINISHED]), alpha.copy()))
        if time_limit is not None and elapsed > time_limit:
            counters[STOP] = CAPPED
    for f in futures:
        f.result()
    n_updates = int(counters[FINISHED])
    if trace_interval is not None:
        trace.append((time.perf_counter() - t0, n_updates, alpha.copy()))
    objective = objective_from_gradient(alpha, g)
    violation = max_violation(alpha, g, Cw)
    return GCDResult(_unpermute(alpha, order), objective, violation, n_updates,
                     int(counters[STOP]) != CAPPED, n_workers,
                     [(s, u, _unpermute(a, order)) for s, u, a in trace], _unpermute(g, order))


def _unpermute(v, order):
    """A vector in the original variable order (the workers see it sorted by block)."""
    out = np.empty_like(v)
    out[order] = v
    return out
