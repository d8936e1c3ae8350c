"""SMO with kernel rows computed as its working sets need them, the whole matrix when that pays.

A problem of more than :data:`WHOLE_MATRIX_MAX_ROWS` variables starts with no kernel
value: the compiled iteration (:func:`~.loop._run`) returns to :class:`RowCache` when a
step needs a row it does not hold, which computes its products (one matrix-vector
product, :meth:`~.values.Values.products`) and re-enters through one compiled call that
puts the row in place and goes on (:meth:`~.values.Values.fill_and_run`). Its cost follows
the work: an easy problem touches a few hundred rows of a 10,000-row problem (LIBSVM keeps
the rows its working sets touch in an LRU cache the same way; Chang & Lin, "LIBSVM: a
library for support vector machines", 2011, section 4.3).

When the matrix fits in the cache (``n * n`` values of the problem's precision at most
``cache_bytes``), rows are kept in the matrix's own storage in the order computed, never
evicted, and the rest of the matrix is made at once when it pays
(:meth:`RowCache.matrix_pays`): the rows still to come are counted as the variables not
yet touched that violate the optimality conditions, few once an easy problem's support
vectors are found, nearly all of a hard problem's (most variables support vectors). The
variables are then reordered so that the rows already computed come first, the remaining
block ``K[T, T]`` comes from matrix products (:meth:`~.values.Values.fill_lower`), the
cross block ``K[T, S]`` is the mirror of the rows computed, and the solve goes on without
leaving compiled code (:func:`~.loop._continue_dense`). The gradient stays exact through
the reorder: every value the steps used is where the dense loop reads it. A hard problem
pays its first rows (:data:`FIRST_ASK_ROWS` or more) beyond the matrix, less the rows it
keeps; an easy one only its rows. The costs compared come from a model measured on the
2-core reference machine (:func:`row_cost`, :func:`matrix_cost`;
``bench/bench_exact_work.py``).

Past the cache the rows live in an LRU cache of ``cache_bytes`` over the active
(unshrunk) variables, as LIBSVM's, and the matrix is never made.
"""

from __future__ import annotations

import numpy as np

from .._threads import blas_controller
from . import iteration_limit
from .loop import (
    _ACTIVE,
    _CLOCK,
    _COUNTER,
    _FILL,
    _ITER,
    _MAX,
    _MAX_ITER,
    _NEED,
    _NEED_ROWS,
    _PAIR_I,
    _PAIR_J,
    _UNSHRINK,
    _VERSION,
    STATE_SIZE,
    _continue_dense,
    _gradient_from_rows,
    _run,
    _solve_dense,
)

#: Problems of at most this many variables get their whole matrix first: it costs
#: little (a million values), a row's round trip through Python would cost a fair share
#: of a row, and a small fit's solve then never depends on whether numba has compiled
#: (the NumPy twin of the dense solver serves it bit for bit, :mod:`gpuml.kernels._jit`).
WHOLE_MATRIX_MAX_ROWS = 1024


def shrinks(shrinking, n) -> bool:
    """Whether a problem of ``n`` variables shrinks: ``shrinking`` when it is a bool; with
    ``"auto"`` when ``n > WHOLE_MATRIX_MAX_ROWS``.

    The sweeps of a step read every active variable and two kernel rows; shrinking
    (LIBSVM's heuristic, Chang & Lin 2011, section 5.1) keeps them to the variables that
    may still move, which pays on the long solves of large problems
    (bench/results/cpu-2core/exact_work_hard.md). A small problem's sweeps are short and
    its solve runs in the NumPy twin while numba compiles (:mod:`gpuml.kernels._jit`),
    which has no shrinking.
    """
    if shrinking == "auto":
        return n > WHOLE_MATRIX_MAX_ROWS
    return bool(shrinking)


#: The rows still to come are counted (:meth:`RowCache.matrix_pays`) every quarter of the
#: rows whose cost is this fraction of the whole matrix's (:func:`rows_before_asking`),
#: and compared in cost with the rest of the matrix once that many rows are computed.
SWITCH_FRACTION = 0.1
#: The fewest rows before the first count, as a share of all and in number (and half
#: that number between counts, so that a count's fall shows): before that too few
#: variables have moved for the support vectors of even an easy problem to shape its
#: decision function, and nearly all still violate, in any problem.
FIRST_ASK_SHARE = 0.02
FIRST_ASK_ROWS = 100
#: A count finds the problem hard, and the matrix is made, when at least this share of
#: the variables not yet touched still violate: the solve will touch most rows.
HARD_SHARE = 0.95
#: A count is compared in cost with the rest of the matrix only while it falls slowly, to
#: no less than this share of the count before: a fast fall is an easy problem's support
#: vectors being found, whose rows to come will be far fewer than counted.
STEADY_SHARE = 0.8

#: The cost model of :func:`row_cost` and :func:`matrix_cost`, in nanoseconds on the
#: 2-core reference machine (``python -m bench.run exact_work``, table
#: ``exact_work_costs``), by bytes per value (float32, float64): per value of a row
#: computed alone (a matrix-vector product and the map), ``fixed + per_feature * d``; per
#: entry of the whole matrix (matrix products over its lower triangle, the map, the
#: mirror), the same; and Python's share of one row.
ROW_VALUE_NS = {4: (3.4, 0.1), 8: (9.0, 0.3)}
MATRIX_ENTRY_NS = {4: (2.0, 0.015), 8: (4.8, 0.043)}
ROW_CALL_NS = 5_000.0


def row_cost(n, d, itemsize) -> float:
    """Nanoseconds of one row of ``n`` values with ``d`` features per row (the model)."""
    fixed, per_feature = ROW_VALUE_NS[itemsize]
    return ROW_CALL_NS + n * (fixed + per_feature * d)


def matrix_cost(n, d, itemsize, threads=1) -> float:
    """Nanoseconds of the whole ``n`` x ``n`` matrix made in ``threads`` threads (the
    model; a row is always computed on one)."""
    fixed, per_feature = MATRIX_ENTRY_NS[itemsize]
    return float(n) * n * (fixed + per_feature * d) / max(1, threads)


def rows_before_asking(n, d, itemsize, threads=1) -> int:
    """Rows whose cost is :data:`SWITCH_FRACTION` of the whole matrix's: from there
    :meth:`RowCache.matrix_pays` compares costs (and counts every quarter of it)."""
    return int(SWITCH_FRACTION * matrix_cost(n, d, itemsize, threads)
               / row_cost(n, d, itemsize))


class RowCache:
    """The kernel rows of one problem (:class:`~.values.Values`), kept across solves.

    While the matrix fits in ``cache_bytes``, rows grow in its storage and, from the
    first count on (:data:`FIRST_ASK_ROWS`, :data:`FIRST_ASK_SHARE`), every quarter of
    :func:`rows_before_asking` rows (half :data:`FIRST_ASK_ROWS` at least),
    :meth:`matrix_pays` decides whether to make the rest of the matrix now.

    :meth:`solve` may be called several times (other bounds, warm starts: the C path of
    :mod:`.path`); the rows computed, and the whole matrix once made, serve every call.
    ``switch=False`` never makes the whole matrix (rows until the end); ``threads``: the
    threads that make it.
    """

    def __init__(self, values, cache_bytes, switch=True, threads=1):
        self.values = values
        self.threads = threads
        n = values.rows.shape[0]
        itemsize = values.dtype.itemsize
        self.grow = n * n * itemsize <= cache_bytes
        n_slots = n if self.grow else int(min(n, max(2, cache_bytes // (itemsize * n))))
        self.cache = np.empty((n_slots, n), dtype=values.dtype)
        self.slot_of = np.full(n, -1, dtype=np.int64)
        self.slot_row = np.full(n_slots, -1, dtype=np.int64)
        self.slot_full = np.zeros(n_slots, dtype=bool)
        self.slot_time = np.zeros(n_slots, dtype=np.int64)
        d = values.n_features
        self.row_cost = row_cost(n, d, itemsize)
        self.matrix_cost = matrix_cost(n, d, itemsize, threads)
        #: Rows computed when the cost comparison of :meth:`matrix_pays` starts, when it is
        #: asked next, and the rows between asks.
        self.trusted = rows_before_asking(n, d, itemsize, threads)
        self.ask_every = max(self.trusted // 4, FIRST_ASK_ROWS // 2)
        self.next_ask = (max(self.ask_every, int(FIRST_ASK_SHARE * n), FIRST_ASK_ROWS)
                         if self.grow and switch else n + 1)
        self.last_count = None
        self.n_rows = 0
        self.clock = 0
        #: The variables in the order of the whole matrix's rows, once it is made.
        self.order = None
        # workspaces of the compiled calls
        self._nz = np.empty(n, dtype=np.int64)
        self._v = np.empty(n)
        self._masks = np.empty((2, n))

    @property
    def n(self) -> int:
        return self.slot_of.shape[0]

    def solve(self, y, C, alpha, tol, max_iter, shrinking):
        """SMO from ``alpha`` (updated in place); returns ``(status, n_iter, G)``."""
        n = self.n
        G = np.empty(n)
        state = np.zeros(STATE_SIZE, dtype=np.int64)
        state[_MAX] = iteration_limit(max_iter, n)
        state[_CLOCK] = self.clock
        shrink = True if shrinks(shrinking, n) else None
        if self.order is None and self.grow:
            # a start's gradient reads the rows of its non-zero variables
            missing = np.flatnonzero((alpha > 0) & (self.slot_of < 0))
            if missing.size * self.row_cost >= self._rest_cost():
                self._complete()
            else:
                for r in missing.tolist():
                    self._fill(r)
        if self.order is not None:
            return self._whole(y, C, alpha, G, state, tol, shrink, fresh=True)
        active = np.arange(n, dtype=np.int64)
        state[_ACTIVE] = n
        state[_COUNTER] = min(n, 1000)
        self._gradient(y, alpha, G, active)
        tol = float(tol)
        blas = blas_controller().limit(limits=1, user_api="blas")
        try:
            while True:
                if self.grow:
                    status = self.values.fill_and_run(self.cache, self.slot_of, self.slot_time,
                                                      self.slot_row, y, C, alpha, G, active,
                                                      state, tol, shrink, self._masks)
                else:
                    status = _run(y, C, self.values.QD, alpha, G, active, self.cache,
                                  self.slot_of, self.slot_time, state, tol, shrink, self._masks)
                if status == _NEED_ROWS:
                    if not self.grow:
                        self._request(int(state[_NEED]), active, state)
                        continue
                    if self.n_rows >= self.next_ask:
                        self.next_ask = self.n_rows + self.ask_every
                        if self.matrix_pays(y, C, alpha, G, tol):
                            if state[_ACTIVE] < n:
                                self._unshrink(y, alpha, G, active, state)
                            blas.restore_original_limits()
                            self._complete()
                            return self._whole(y, C, alpha, G, state, tol, shrink, fresh=False)
                    self.values.products(int(state[_NEED]))
                    self.n_rows += 1
                    state[_FILL] = self.n_rows
                    continue
                if state[_ACTIVE] < n:
                    self._unshrink(y, alpha, G, active, state)
                    if status != _MAX_ITER:
                        continue
                elif status == _UNSHRINK:
                    continue
                self.clock = int(state[_CLOCK])
                return status, int(state[_ITER]), G
        finally:
            blas.restore_original_limits()

    def rows_to_come(self, y, C, alpha, G, tol) -> int:
        """The rows a solve is still expected to ask for: the variables not yet touched
        that violate the optimality conditions by more than ``tol`` (at ``alpha = 0``:
        ``y_k f(x_k) < 1`` for the current intercept)."""
        minus_yG = -y * G
        up = np.where(y > 0, alpha < C, alpha > 0)
        low = np.where(y > 0, alpha > 0, alpha < C)
        if not up.any() or not low.any():
            return 0
        rho = 0.5 * (minus_yG[up].max() + minus_yG[low].min())
        violating = np.where(y > 0, minus_yG > rho + tol, minus_yG < rho - tol)
        return int(np.count_nonzero((self.slot_of < 0) & violating))

    def matrix_pays(self, y, C, alpha, G, tol) -> bool:
        """Whether to make the rest of the matrix now: when nearly all the variables not
        yet touched are rows to come (:meth:`rows_to_come`, :data:`HARD_SHARE`: a hard
        problem, most variables support vectors), or, once :attr:`trusted` and while the
        count falls slowly (:data:`STEADY_SHARE`), when those rows would cost more than the
        rest of the matrix."""
        to_come = self.rows_to_come(y, C, alpha, G, tol)
        before, self.last_count = self.last_count, to_come
        if to_come >= HARD_SHARE * (self.n - self.n_rows):
            return True
        return (self.n_rows >= self.trusted and before is not None
                and to_come >= STEADY_SHARE * before
                and to_come * self.row_cost >= self._rest_cost())

    def _rest_cost(self) -> float:
        """The model's cost of the rest of the matrix (the rows computed are kept)."""
        return (1.0 - self.n_rows / self.n) ** 2 * self.matrix_cost

    def _gradient(self, y, alpha, G, ks):
        """``G_k`` for the variables ``ks`` from ``alpha``: along the cached rows of the
        non-zero variables (all cached while rows grow), else by kernel products."""
        nz = np.flatnonzero(alpha > 0)
        if self.grow:
            _gradient_from_rows(self.cache, self.slot_of, y, alpha, G, ks, self._nz, self._v)
            return
        G[ks] = -1.0
        if nz.size:
            G[ks] += y[ks] * self.values.dot(ks, nz, alpha[nz] * y[nz])

    def _fill(self, r):
        """Row ``r`` into the next slot (rows grow, never evicted)."""
        self.values.products(r)
        self.values.fill(self.cache, self.slot_of, self.slot_row, r, self.n_rows)
        self.n_rows += 1

    def _request(self, r, active, state):
        """The row the iteration asked for, past the cache: into the least recently used
        slot, over the active variables (as LIBSVM)."""
        slot = int(np.argmin(self.slot_time))  # never the row just looked up: it is newest
        old = self.slot_row[slot]
        if old >= 0:
            self.slot_of[old] = -1
        state[_CLOCK] += 1
        self.slot_time[slot] = state[_CLOCK]
        n_active = int(state[_ACTIVE])
        if n_active == self.n:
            self.values.row(r, self.cache, slot)
        else:
            cols = active[:n_active]
            self.cache[slot, cols] = self.values.active_row(r, cols, int(state[_VERSION]))
            self.cache[slot, r] = self.values.diag[r]
        self.slot_of[r] = slot
        self.slot_row[slot] = r
        self.slot_full[slot] = n_active == self.n

    def _unshrink(self, y, alpha, G, active, state):
        """The exact gradient of the shrunk variables, then all of them active again; rows
        computed over fewer variables than all are dropped (the LRU cache's)."""
        inactive = np.sort(active[state[_ACTIVE]:])
        if inactive.size:
            self._gradient(y, alpha, G, inactive)
        active[:] = np.arange(self.n)
        state[_ACTIVE] = self.n
        state[_VERSION] += 1
        state[_COUNTER] = 1
        if not self.grow:
            stale = (self.slot_row >= 0) & ~self.slot_full
            self.slot_of[self.slot_row[stale]] = -1
            self.slot_row[stale] = -1

    def _complete(self):
        """The whole matrix in the cache's storage: the computed rows first (their columns
        reordered), the rest by matrix products, the cross block their mirror."""
        done = self.n_rows
        rest = np.flatnonzero(self.slot_of < 0)
        order = np.concatenate([self.slot_row[:done], rest])
        K = self.cache
        if done:
            K[:done] = K[:done][:, order]
        self.values.fill_lower(K, start=done, order=rest, threads=self.threads)
        if done:
            K[done:, :done] = K[:done, done:].T
        self.order = order

    def _whole(self, y, C, alpha, G, state, tol, shrink, fresh):
        """SMO on the whole matrix, in its order: from ``alpha`` (``fresh``: the gradient
        computed from it) or going on from the state the rows left (every variable active,
        ``G`` exact)."""
        order = self.order
        n = self.n
        ya, Ca, aa, Ga = y[order], C[order], alpha[order], G[order]
        QD = self.values.QD[order]
        active = np.arange(n, dtype=np.int64)
        if fresh:
            status = _solve_dense(self.cache, ya, Ca, aa, Ga, state, float(tol), shrink, QD,
                                  active, self._nz, self._v, self._masks)
        else:
            state[_ACTIVE] = n
            state[_COUNTER] = min(n, 1000)
            state[_PAIR_I] = state[_PAIR_J] = 0  # a pair of the old order
            status = _continue_dense(self.cache, ya, Ca, aa, Ga, state, float(tol), shrink, QD,
                                     active, self._nz, self._v, self._masks)
        alpha[order] = aa
        G[order] = Ga
        self.clock = int(state[_CLOCK])
        return status, int(state[_ITER]), G
