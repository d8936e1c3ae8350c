"""Asynchronous greedy coordinate descent for the bias-free kernel SVM dual, on CPU threads.

You 2020 (Yang You, *Fast and Accurate Machine Learning on Distributed Systems and
Supercomputers*, PhD thesis, UC Berkeley, 2020), chapter 4: Alg 13 (serial GCD) and
Alg 14 (Asy-GCD), from You, Lian, Liu, Yu, Dhillon, Demmel and Hsieh, *Asynchronous
parallel greedy coordinate descent*, NIPS 2016. The problem is

    min_a  1/2 a'Qa - e'a   s.t.  0 <= a_i <= C_i,   Q_ij = y_i y_j K(x_i, x_j)   (eq. 4.9)

Each worker is one thread (from a pool reused across solves; worker 0 is the
calling thread) running :func:`_work`, a numba function compiled with
``nogil=True``, so the workers run truly at the same time. A worker owns one
contiguous block of variables (the wrapper reorders the data so that block
``w`` is ``[starts[w], starts[w+1])``) *and the same rows of the gradient*
``g``, and repeats, with no barrier and no lock:

1. read the update log (below) from where it left off and add each other
   worker's update ``delta_j q_j`` into its rows of ``g``;
2. pick the variable of its block with the largest projected gradient
   (eq. 4.11) (``selection="greedy"``), or a uniformly random one
   (``"random"``, the PSCD baseline of §4.5); a greedy worker whose largest
   violation is under half the largest any worker published waits instead
   (:data:`GREEDY_SHARE`, a CPU-only rule: see below);
3. the closed-form step ``delta`` (eq. 4.10, damped: below);
4. append ``(i, delta)`` to the log, set ``a_i += delta`` (only the owner
   writes ``a_i``) and add ``delta q_i`` into its own rows of ``g``.

Owner-computes updates (how this differs from Alg 14 as written). Alg 14 has
every worker add ``delta q_i`` into the whole shared ``g`` with atomic adds.
On x86 a float atomic add is a ``lock cmpxchg`` loop, tens of cycles against
one for a vectorised add, and with two workers writing all of ``g`` every
cache line of it moves between the cores on every update: the first CPU
version (shared ``g``, atomic adds) was slower with two workers than with one
(bench/results/cpu-2core/asygcd-runs.md). Here each row of ``g`` has one writer,
its owner, which adds every update into its rows with plain vectorised adds
and computes only its rows of the kernel column ``q_i`` (its LRU cache holds
block-long pieces of columns, §4.4 "Kernel Caching"). An update costs each of
W workers ``1/W`` of the serial column and gradient work, and nothing is
shared but one atomic counter per update and the log: a ring of
``(i, delta)`` entries numbered by that counter, each published by a release
store of its number. A worker's rows of ``g`` are exact for "its own updates
plus the first ``done`` updates of the log", where ``done`` is its position
in the log, so its step is stale by at most the updates claimed but not yet
read (on idle cores, a fraction of one update on average). Because an update
costs every worker its rows, a worker with a small block (cheap updates) or a
nearly converged one would flood the others with small steps; so greedy workers
publish their block's largest violation and step only when theirs is at least
half the largest (an approximate Gauss-Southwell rule). The GPU kernel, where
an update costs only its maker, has no such rule.

Stopping. A worker whose block has no projected gradient above ``tol`` at
log position ``s`` publishes ``s`` as its quiet state. When every worker
has published the same ``s`` and the counter still says ``s`` updates were
made, every block's rows of ``g`` are exact for the same state, which is
then optimal to ``tol`` over all variables, and the run stops. Busy workers
never wait for the check. A quiet worker spins on the log (its block gets
work again as soon as another worker's update lands in its rows) and only
goes back to its Python thread to sleep after a while, or at once when the
workers outnumber the cores, so that idle workers give their core to busy
ones. A variable whose exact step rounds to zero in floating point (a huge
``Q_ii``) cannot move, so the scans pass over it: it never keeps a block from
certifying. Every run ends: after :func:`default_max_updates` updates at the
latest (``converged=False``). After the run each block adds the updates
published after it last read the log, so ``g`` holds every update made.

Compile time (the first fit in a fresh install compiles :func:`_work` and what it
calls): the functions are compiled without reference counting (``_nrt=False``): no
compiled function allocates or returns an array (the workers' workspaces come from
Python), and the greedy selection passes ``rng=None``, so numba leaves the random
selection's code out of the default variant.

Damped steps (our addition to Alg 14). Workers that step at the same time
from the same gradient each take the *exact* step for their own coordinate,
as if no other coordinate moved. When the coordinates are strongly
correlated (greedy picks the largest violators, which for near-duplicate
points have the same large gradient) the steps add up and overshoot: a
Jacobi-style instability in which the iterates swing between the bounds and
the run never ends. GPU thread blocks run nearly in lockstep, which makes
this the normal case there (docs/asygcd.md, "Damped steps"; ``_lockstep`` in
``tests/test_gcd_solver.py`` models it). So each worker keeps a step factor ``eta`` in
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

import numpy as np
from numba import njit

from .. import _jit
from ..vexp import exp_nonpositive
from . import (
    CAPPED,
    CERTIFIED,
    KERNEL_CODES,
    RUNNING,
    TAU,
    GCDResult,
    default_max_updates,
    max_violation,
)
from .atomics import atomic_add_seq, atomic_load, atomic_store

#: int64 stride between words that different CPU workers write (one 64-byte cache line
#: each): the per-worker positions and quiet states, and the two shared counters, would
#: otherwise share lines and every write would steal the line from the other cores.
PAD = 8
#: The CPU solver's counters: the next update number (claimed with one atomic add per
#: update) and the stop flag, on separate cache lines.
C_STARTED, C_STOP = 0, PAD
#: Entries of the CPU update log (a ring; a power of two). A worker that would overwrite an
#: entry not yet read by every worker waits; the workers read the log before every pick, so
#: they are a few entries apart and a full ring is only reached by a worker that is
#: descheduled for thousands of updates.
LOG_SIZE = 1 << 14
#: The damped step (module docstring): overshoot when ``g_now / g_before`` is below this;
#: the factor is then halved (not below ``ETA_MIN``), else it grows by ``ETA_GROWTH`` up to 1.
#: W workers stepping together on perfectly correlated coordinates need ``eta`` about
#: ``1 / W``; the floor covers 4,096 workers, more than any GPU keeps resident.
OVERSHOOT = -0.5
ETA_MIN = 2.0 ** -12
ETA_GROWTH = 1.1
#: A greedy worker steps only when its block's largest violation is at least this share of
#: the largest one any worker published (an approximate Gauss-Southwell rule: Nutini,
#: Schmidt, Laradji, Friedlander and Koepke, "Coordinate descent converges faster with the
#: Gauss-Southwell rule than random selection", ICML 2015); else it waits, reading the log.
#: An update costs every worker its rows, so a worker with a small or nearly converged
#: block would otherwise make many cheap, small steps that the others must all add in
#: (on unequal blocks the rule cuts two workers' updates and fit time: "Other figures"
#: in bench/results/cpu-2core/asygcd-runs.md).
GREEDY_SHARE = 0.5
#: What :func:`_work` returns: the run is over, or the worker found nothing to do for a while.
DONE, IDLE = 0, 1
#: Looks at the log with nothing new (its block quiet) before an idle worker goes back to
#: Python to sleep. A look is a few loads: IDLE_POLLS is some tens of microseconds of
#: spinning, for workers that outnumber the cores (a sleeping worker gives its core to a
#: busy one); SPIN_POLLS about a tenth of a second, for workers with a core each (as
#: OpenMP runtimes spin before they block). Another worker's update can make a quiet block
#: busy again within microseconds; a worker that slept meanwhile left its block's largest
#: violators untouched, and the others spent their updates on their own smaller ones.
IDLE_POLLS = 4096
SPIN_POLLS = 1 << 22
IDLE_SLEEP = 50e-6


@njit(nogil=True, cache=True, _nrt=False)
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


@njit(nogil=True, cache=True, fastmath=True, inline="always", _nrt=False)
def _dot(a, b):
    # Row views, not X[i, k]: without index wrap-around checks the loop vectorises.
    s = 0.0
    for k in range(a.shape[0]):
        s += a[k] * b[k]
    return s


@njit(nogil=True, cache=True, fastmath=True, inline="always", _nrt=False)
def _from_dot(dot, sq_i, sq_j, kind, gamma, coef0, degree):
    """Kernel value from the inner product (and squared norms, for rbf)."""
    if kind == 0:
        return dot
    if kind == 1:
        return (gamma * dot + coef0) ** degree
    if kind == 2:
        return math.exp(-gamma * max(sq_i + sq_j - 2.0 * dot, 0.0))
    return math.tanh(gamma * dot + coef0)


@njit(nogil=True, cache=True, fastmath=True, _nrt=False)
def fill_rows(X, sq_norms, y, i, lo, hi, kind, gamma, coef0, degree, out, arg, scratch):
    """``out[j - lo] = Q_ji = y_j y_i K(x_j, x_i)`` for j in [lo, hi): part of column i, O(m d).

    ``kind == 4``: X is the precomputed kernel matrix (symmetric, so row i is column i).
    ``arg`` (float64) and ``scratch`` (int64): workspaces of at least ``hi - lo``
    entries (allocating in compiled code would compile NumPy's allocators into the
    first fit).
    """
    m = hi - lo
    if kind == 4:
        for j in range(m):
            out[j] = y[lo + j] * y[i] * X[i, lo + j]
        return
    xi = X[i]
    if kind == 2:  # rbf: the exponents first, then one vectorised exp over the column
        # (into separate arrays: with out as its own input the SIMD loop would not be taken)
        for j in range(m):
            arg[j] = -gamma * max(sq_norms[i] + sq_norms[lo + j] - 2.0 * _dot(X[lo + j], xi),
                                  0.0)
        exp_nonpositive(arg[:m], out, scratch)
        for j in range(m):
            out[j] *= y[lo + j] * y[i]
        return
    for j in range(m):
        k = _from_dot(_dot(X[lo + j], xi), sq_norms[lo + j], sq_norms[i], kind, gamma, coef0,
                      degree)
        out[j] = y[lo + j] * y[i] * k


@njit(nogil=True, cache=True)
def fill_column(X, sq_norms, y, i, kind, gamma, coef0, degree, out):
    """``out[j] = Q_ji = y_j y_i K(x_j, x_i)`` for every j: one column of Q in O(n d)."""
    n = y.shape[0]
    fill_rows(X, sq_norms, y, i, 0, n, kind, gamma, coef0, degree, out, np.empty(n),
              np.empty(n, dtype=np.int64))


@njit(nogil=True, cache=True, inline="always", _nrt=False)
def _projected_gradient(g_j, a_j, c_j):
    """|a - P_[0,C](a - g)| (eq. 4.11)."""
    return abs(a_j - min(max(a_j - g_j, 0.0), c_j))


@njit(nogil=True, cache=True, inline="always", _nrt=False)
def _moves(g_j, a_j, c_j, q_j):
    """Whether the exact step (eq. 4.10) changes ``a_j`` at all in floating point."""
    return min(max(a_j - g_j / q_j, 0.0), c_j) != a_j


@njit(nogil=True, cache=True, _nrt=False)
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


@njit(nogil=True, cache=True, _nrt=False)
def _column(X, sq_norms, y, i, lo, hi, kind, gamma, coef0, degree, cache, slot_of, slot_var,
            slot_time, clock, arg, scratch):
    """The slot of this worker's LRU cache that holds rows [lo, hi) of column q_i (filling
    the least recently used slot on a miss). The slot, not the row: returning an array
    view needs numba's reference counting, which these functions are compiled without."""
    s = slot_of[i]
    if s < 0:
        s = 0
        for t in range(1, slot_time.shape[0]):
            if slot_time[t] < slot_time[s]:
                s = t
        if slot_var[s] >= 0:
            slot_of[slot_var[s]] = -1
        fill_rows(X, sq_norms, y, i, lo, hi, kind, gamma, coef0, degree, cache[s], arg, scratch)
        slot_var[s] = i
        slot_of[i] = s
    slot_time[s] = clock
    return s


@njit(nogil=True, cache=True, _nrt=False)
def _xorshift(state):
    """One step of xorshift64* on ``state[0]``; a uniform 64-bit draw (per-worker RNG)."""
    x = state[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    state[0] = x
    return x * np.uint64(2685821657736338717)


@njit(nogil=True, cache=True, _nrt=False)
def _catch_up(lo, hi, done, end, X, sq_norms, y, kind, gamma, coef0, degree, g, log_var,
              log_delta, log_seq, cache, slot_of, slot_var, slot_time, clock, arg, scratch):
    """Add the published updates ``done, done + 1, ...`` (below ``end``) into ``g[lo:hi]``.

    Stops at the first entry not yet published (its maker is between claiming
    the number and writing it); ``end < 0``: no bound. The worker's own
    updates (variables in [lo, hi), which only it moves) are passed over: it
    added them when it made them. Returns ``(done, clock)``.
    """
    mask = log_seq.shape[0] - 1
    while end < 0 or done < end:
        slot = done & mask
        if atomic_load(log_seq, slot) != done:  # acquire: log_var/log_delta are written
            if end < 0:
                break
            done += 1  # after the run (end >= 0): a claim that was never made
            continue
        i = log_var[slot]
        if i < lo or i >= hi:
            clock += 1
            q = cache[_column(X, sq_norms, y, i, lo, hi, kind, gamma, coef0, degree, cache, slot_of,
                        slot_var, slot_time, clock, arg, scratch)]
            d = log_delta[slot]
            for j in range(hi - lo):
                g[lo + j] += d * q[j]
        done += 1
    return done, clock


@njit(nogil=True, cache=True, _nrt=False)
def _agree(counters, quiet, n_workers, state):
    """Whether every worker found its block quiet at ``state`` and no update came after."""
    for v in range(n_workers):
        if atomic_load(quiet, v * PAD) != state:
            return False
    return atomic_load(counters, C_STARTED) == state


@njit(nogil=True, cache=True, _nrt=False)
def _largest(vmax, n_workers):
    """The largest block violation the workers published."""
    v = 0.0
    for u in range(n_workers):
        v = max(v, atomic_load(vmax, u * PAD))
    return v


@njit(nogil=True, cache=True, _nrt=False)
def _work(w, X, sq_norms, y, C, qdiag, starts, kind, gamma, coef0, degree, tol,
          max_updates, idle_polls, share, vmax, alpha, g, counters, log_var, log_delta,
          log_seq, applied, quiet, cache, slot_of, slot_var, slot_time, rng, damp, state, arg,
          scratch):
    """Worker w's loop (Alg 14, owner-computes updates) until the run stops (DONE) or it
    idles (IDLE).

    ``damp = [eta, g_before]`` and ``state = [last i, quiet state, picks, updates made]``
    hold the worker's state across calls (``last i = -1``: no coordinate to look at
    again; ``quiet state``: the log position at which its block was last found quiet).
    ``rng`` is None for the greedy selection (numba then drops the random selection's
    code at compile time). ``arg``, ``scratch``: the worker's column workspaces.
    """
    lo = starts[w]
    hi = starts[w + 1]
    size = hi - lo
    n_workers = starts.shape[0] - 1
    ring = log_seq.shape[0]
    mask = ring - 1
    done = applied[w * PAD]
    # The LRU clock resumes after the latest use (a loop: np.max adds to the compile time).
    clock = np.int64(0)  # not the literal 0: one compiled _catch_up for both call sites
    for t in range(slot_time.shape[0]):
        clock = max(clock, slot_time[t])
    unbounded = np.int64(-1)  # not the literal -1: one compiled _catch_up serves the drain too
    waited_at = -1  # the log position of the last scan that found a far larger violator
    room = -1  # claims below this number have a free log slot (refreshed when passed)
    polls = 0
    while atomic_load(counters, C_STOP) == RUNNING:
        # 1. Everyone else's updates, in log order, into this block's part of g.
        done, clock = _catch_up(lo, hi, done, unbounded, X, sq_norms, y, kind, gamma, coef0, degree,
                                g, log_var, log_delta, log_seq, cache, slot_of, slot_var,
                                slot_time, clock, arg, scratch)
        atomic_store(applied, w * PAD, done)
        if state[1] == done:  # nothing new since the block was found quiet
            if _agree(counters, quiet, n_workers, done):
                atomic_store(counters, C_STOP, CERTIFIED)
                break
            polls += 1
            if polls >= idle_polls:
                return IDLE
            continue
        if waited_at != done:
            polls = 0
        # 2. Pick a variable of the block.
        if rng is None:  # greedy (selection="greedy"; the random branch is not compiled)
            i, best_v = _scan(g, alpha, C, qdiag, lo, hi)
            if best_v < tol or i < 0:
                atomic_store(vmax, w * PAD, 0.0)
                state[1] = done
                atomic_store(quiet, w * PAD, done)
                continue
            atomic_store(vmax, w * PAD, best_v)
            if n_workers > 1 and best_v < share * _largest(vmax, n_workers):
                # Another block holds a far larger violator: wait (reading the log) rather
                # than make everyone add in a step worth a fraction of its step.
                if waited_at == done:
                    polls += 1
                    if polls >= idle_polls:
                        return IDLE
                waited_at = done
                continue
        else:
            state[2] += 1
            if state[2] >= size:
                state[2] = 0
                _, best_v = _scan(g, alpha, C, qdiag, lo, hi)
                if best_v < tol:
                    state[1] = done
                    atomic_store(quiet, w * PAD, done)
                    state[2] = size  # quiet: scan again first when something changes
                    continue
            i = lo + np.int64(_xorshift(rng) % np.uint64(size))
            # A pick already within tol is not worth an O(n) gradient update; skipping it
            # also lets the workers go quiet together, so the run can certify and stop.
            if _projected_gradient(g[i], alpha[i], C[i]) < tol:
                continue
        if not _moves(g[i], alpha[i], C[i], qdiag[i]):
            continue
        # 3. The step (eq. 4.10, damped).
        if state[0] >= 0:  # the coordinate moved last, now that the others' steps landed
            damp[0] = damped_step_factor(damp[0], g[state[0]], damp[1])
            state[0] = -1
        a_i = alpha[i]
        g_i = g[i]
        new = min(max(a_i - damp[0] * g_i / qdiag[i], 0.0), C[i])
        if new == a_i:
            new = min(max(a_i - g_i / qdiag[i], 0.0), C[i])
        delta = new - a_i
        if delta == 0.0:
            continue
        # 4. Publish (i, delta) for the other workers, then update this block's part of g.
        s = atomic_add_seq(counters, C_STARTED, 1)
        if s >= max_updates:
            atomic_store(counters, C_STOP, CAPPED)
            break
        while s >= room:  # slot s & mask may hold an entry that someone has yet to read
            room = atomic_load(applied, 0)
            for v in range(1, n_workers):
                room = min(room, atomic_load(applied, v * PAD))
            room += ring  # entries below every worker's position are read: their slots are free
            if s < room:
                break
            done, clock = _catch_up(lo, hi, done, unbounded, X, sq_norms, y, kind, gamma, coef0,
                                    degree, g, log_var, log_delta, log_seq, cache, slot_of,
                                    slot_var, slot_time, clock, arg, scratch)
            atomic_store(applied, w * PAD, done)
            if atomic_load(counters, C_STOP) != RUNNING:
                return DONE  # the claim is dropped: nobody reads past it after the run
        log_var[s & mask] = i
        log_delta[s & mask] = delta
        atomic_store(log_seq, s & mask, s)  # release: the entry is complete
        alpha[i] = new
        clock += 1
        q = cache[_column(X, sq_norms, y, i, lo, hi, kind, gamma, coef0, degree, cache, slot_of,
                    slot_var, slot_time, clock, arg, scratch)]
        for j in range(size):
            g[lo + j] += delta * q[j]
        state[0] = i
        state[1] = -1
        state[3] += 1
        damp[1] = g_i
    return DONE


def _cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _pool() -> ThreadPoolExecutor:
    """Threads reused across solves (starting threads is slow on a busy machine)."""
    return _pool_of_process(os.getpid())


@functools.cache
def _pool_of_process(pid: int) -> ThreadPoolExecutor:
    # Keyed by process: a forked child inherits the pool object but not its threads.
    # The bound is far above any worker count: a worker that sat queued behind a full pool
    # would never certify its block, and the others would wait for it forever.
    return ThreadPoolExecutor(max_workers=4096, thread_name_prefix=f"gpuml-gcd-{pid}")


def solve_batch(X, kernel, problems, *, n_jobs=1, cache_bytes=1 << 30, progress=None,
                **options):
    """Solve every problem with :func:`solve`, ``n_jobs`` problems at a time in threads.

    Each problem runs on its own rows of X and gets ``cache_bytes / n_jobs`` of
    kernel-column cache; ``options`` are :func:`solve`'s. The numba workers
    release the GIL, so problems in threads run at the same time.
    ``progress(k, result)`` runs in the calling thread as the results come
    back, in problem order.
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
                     random_state=problem.random_state, threads_per_worker=n_jobs, **options)

    if n_jobs == 1:
        outputs = (one(problem) for problem in problems)
    else:
        from joblib import Parallel, delayed

        outputs = Parallel(n_jobs=n_jobs, prefer="threads", return_as="generator")(
            delayed(one)(p) for p in problems)
    results = []
    for k, res in enumerate(outputs):
        results.append(res)
        if progress is not None:
            progress(k, res)
    return results


def objective_from_gradient(alpha, g) -> float:
    """``1/2 a'Qa - e'a = 1/2 a'(g - 1)`` given ``g = Qa - 1``: O(n)."""
    return 0.5 * float(alpha @ (g - 1.0))


def solve(X, y, C, kernel, blocks, *, selection="greedy", tol=1e-3, max_updates=None,
          cache_bytes=256 << 20, random_state=0, trace_interval=None, time_limit=None,
          threads_per_worker=1, greedy_share=None):
    """Run Asy-GCD on NumPy data; see :func:`gpuml.kernels.gcd_solve` for the parameters.

    ``threads_per_worker``: how many solves run side by side (:func:`solve_batch`), so
    that the workers know whether they outnumber the cores and should sleep when idle.
    ``greedy_share``: :data:`GREEDY_SHARE` when None; 0 lets every greedy worker step on
    its own block's largest violator whatever the others hold (Alg 14 as written).
    """
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
    counters = np.zeros(2 * PAD, dtype=np.int64)
    quiet = np.full(max(n_workers, 1) * PAD, -1, dtype=np.int64)
    applied = np.zeros(max(n_workers, 1) * PAD, dtype=np.int64)
    log_var = np.zeros(LOG_SIZE, dtype=np.int64)
    log_delta = np.zeros(LOG_SIZE)
    log_seq = np.full(LOG_SIZE, -1, dtype=np.int64)
    limit = default_max_updates(n) if max_updates is None else int(max_updates)
    seeds = np.random.default_rng(random_state).integers(1, 2**63, size=max(n_workers, 1))
    kparams = (kind, float(kernel.gamma), float(kernel.coef0), int(kernel.degree))
    args = (Xw, sq_norms, yw, Cw, qdiag, starts, *kparams, float(tol),
            limit, IDLE_POLLS if n_workers * int(threads_per_worker) > _cores() else SPIN_POLLS,
            float(GREEDY_SHARE if greedy_share is None else greedy_share),
            np.zeros(max(n_workers, 1) * PAD),
            alpha, g, counters, log_var, log_delta, log_seq, applied, quiet)
    # Per worker: an LRU cache of its rows of kernel columns (cache_bytes / workers in all;
    # a part-column is block-long, so each worker holds about as many columns as one worker
    # with the whole cache would), which column sits in which slot, the RNG (None for the
    # greedy selection), the step factor, the loop state of _work and its column workspaces.
    workers = []
    for w in range(n_workers):
        size = int(counts[w])
        slots = max(min(int(cache_bytes) // n_workers // (8 * size), n), 1)
        workers.append((np.empty((slots, size)), np.full(n, -1, dtype=np.int64),
                        np.full(slots, -1, dtype=np.int64), np.zeros(slots, dtype=np.int64),
                        None if selection == "greedy" else np.array([seeds[w]], dtype=np.uint64),
                        np.array([1.0, 0.0]), np.array([-1, -1, 0, 0], dtype=np.int64),
                        np.empty(size), np.empty(size, dtype=np.int64)))

    if (selection == "greedy" and n_workers > 1 and not monitor_requested(trace_interval,
                                                                          time_limit)
            and 8 * n * n <= NUMPY_TWIN_MAX_BYTES
            and not _jit.ready(_work, 0, *args, *workers[0])):
        cpu0 = time.thread_time()
        n_updates, converged = _one_worker_numpy(Xw, kernel, yw, Cw, qdiag, float(tol), limit,
                                                 alpha, g)
        return GCDResult(_unpermute(alpha, order), objective_from_gradient(alpha, g),
                         max_violation(alpha, g, Cw), n_updates, converged, 1, [],
                         _unpermute(g, order), [time.thread_time() - cpu0])

    worker_cpu = [0.0] * n_workers

    def run(w):
        cpu0 = time.thread_time()
        while _work(w, *args, *workers[w]) == IDLE:
            time.sleep(IDLE_SLEEP)
        worker_cpu[w] = time.thread_time() - cpu0

    def made():
        return sum(int(state[3]) for *_, state, _arg, _scratch in workers)

    trace = []
    t0 = time.perf_counter()
    monitor = monitor_requested(trace_interval, time_limit)
    futures = [_pool().submit(run, w) for w in range(0 if monitor else 1, n_workers)]
    if not monitor and n_workers > 0:
        run(0)
    poll = trace_interval if trace_interval is not None else 0.01
    while monitor and wait(futures, timeout=poll).not_done:
        elapsed = time.perf_counter() - t0
        if trace_interval is not None:
            # alpha alone, never g: the objective from a g that the workers are still
            # adding into is optimistic; any alpha in the box is a point to evaluate exactly.
            trace.append((elapsed, made(), alpha.copy()))
        if time_limit is not None and elapsed > time_limit:
            counters[C_STOP] = CAPPED
    for f in futures:
        f.result()
    # A run that stopped leaves each block's part of g where its worker last read the log:
    # add the updates published after that, so g holds every update that was made.
    end = min(int(counters[C_STARTED]), limit)
    for w in range(n_workers):
        cache, slot_of, slot_var, slot_time = workers[w][:4]
        _catch_up(starts[w], starts[w + 1], applied[w * PAD], end, Xw, sq_norms, yw, *kparams,
                  g, log_var, log_delta, log_seq, cache, slot_of, slot_var, slot_time,
                  slot_time.max(), *workers[w][-2:])
    n_updates = made()
    if trace_interval is not None:
        trace.append((time.perf_counter() - t0, n_updates, alpha.copy()))
    objective = objective_from_gradient(alpha, g)
    violation = max_violation(alpha, g, Cw)
    return GCDResult(_unpermute(alpha, order), objective, violation, n_updates,
                     int(counters[C_STOP]) != CAPPED, n_workers,
                     [(s, u, _unpermute(a, order)) for s, u, a in trace], _unpermute(g, order),
                     worker_cpu)


#: Largest Q (bytes) the NumPy twin of the workers precomputes (see :func:`_one_worker_numpy`).
NUMPY_TWIN_MAX_BYTES = 64 << 20


def monitor_requested(trace_interval, time_limit) -> bool:
    """Whether a run is watched from Python (snapshots or a time limit): compiled workers only."""
    return trace_interval is not None or time_limit is not None


def _one_worker_numpy(Xw, kernel, y, C, qdiag, tol, limit, alpha, g):
    """Greedy coordinate descent with one worker (You 2020, Alg 13), in NumPy, on a precomputed Q.

    This is Asy-GCD's one-worker case, step for step as :func:`_work` takes it
    with one block: the variable with the largest projected gradient (eq. 4.11)
    among those whose exact step moves them (the first on ties), the damped step
    (``eta`` stays 1 with one worker, see the module notes), the update of the
    whole gradient, and the stop when no variable is above ``tol`` (certified) or
    after ``limit`` updates (capped). The kernel values come from one GEMM
    instead of the workers' column fills, so they differ in rounding: the
    solution agrees with the compiled one-worker run to the tolerance, not bit for
    bit. It serves small problems that would run on several workers while
    numba compiles :func:`_work` in the background (a first fit in a fresh
    install, see :mod:`._jit`); several workers make a run's order of updates
    depend on thread timing anyway, so such a fit was reproducible only to the
    tolerance. Updates ``alpha`` and ``g`` in place; returns the number of updates
    and whether the run certified.
    """
    K = Xw if kernel.name == "precomputed" else kernel.matrix(Xw)
    Q = np.asarray(K, dtype=np.float64) * y[:, None] * y[None, :]
    eta = 1.0
    g_before = 0.0
    last = -1
    updates = 0
    while True:
        violation = np.abs(alpha - np.clip(alpha - g, 0.0, C))
        i = int(np.argmax(violation))
        if not _moves_numpy(g[i], alpha[i], C[i], qdiag[i]):
            # The largest violator cannot move in this precision: the first largest of those
            # that can (as _scan's strict > keeps the first), if any.
            moves = np.clip(alpha - g / qdiag, 0.0, C) != alpha
            violation = np.where(moves, violation, 0.0)
            i = int(np.argmax(violation))
        best_v = float(violation[i])
        if best_v < tol or best_v <= 0.0:
            return updates, True
        if last >= 0:
            eta = _damped_step_factor_numpy(eta, float(g[last]), g_before)
            last = -1
        a_i = float(alpha[i])
        g_i = float(g[i])
        new = min(max(a_i - eta * g_i / qdiag[i], 0.0), C[i])
        if new == a_i:
            new = min(max(a_i - g_i / qdiag[i], 0.0), C[i])
        delta = new - a_i
        if updates >= limit:
            return updates, False
        alpha[i] = new
        g += delta * Q[i]
        last = i
        updates += 1
        g_before = g_i


def _moves_numpy(g_j, a_j, c_j, q_j):
    """:func:`_moves` for one variable."""
    return min(max(a_j - g_j / q_j, 0.0), c_j) != a_j


def _damped_step_factor_numpy(eta, g_now, g_before):
    """:func:`damped_step_factor` in Python floats (the same rule)."""
    if g_now * g_before < OVERSHOOT * g_before * g_before:
        return max(0.5 * eta, ETA_MIN)
    return min(1.0, ETA_GROWTH * eta)


def _unpermute(v, order):
    """A vector in the original variable order (the workers see it sorted by block)."""
    out = np.empty_like(v)
    out[order] = v
    return out
