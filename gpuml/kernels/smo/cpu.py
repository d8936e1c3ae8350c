"""SMO on the CPU: a batch of problems over threads, kernel matrices and row caches.

:mod:`.loop` holds the iteration (numba, ``nogil``); this module feeds it. A
batch (:func:`solve_batch`: the parts times the one-vs-one pairs of a CA-SVM
fit, thousands of small problems) is validated once and laid end to end in
flat arrays. Every group whose kernel matrix fits in the cache gets it computed
once (one GEMM, see :func:`sgemm_matrix` for large rbf parts), and each
compiled call solves a chunk of that group's problems on it
(:class:`_DenseRun`), in joblib threads. A problem whose matrix does not fit
gets its kernel rows from :class:`gpuml.pairwise.Kernel` (BLAS) on demand, into
a bounded LRU cache, re-entering the loop after each miss (:func:`_iterate`).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
from numba import njit

from ...pairwise import squared_norms
from .. import _jit
from .._threads import blas_controller, part_threads
from ..vexp import exp_nonpositive_f32, rbf_exponent
from . import Checked, SMOResult, check_flat, iteration_limit
from .loop import (
    _ACTIVE,
    _CLOCK,
    _CONVERGED,
    _COUNTER,
    _ITER,
    _MAX,
    _MAX_ITER,
    _NEED,
    _NEED_ROWS,
    _UNSHRINK,
    _VERSION,
    _rho,
    _run,
    _solve_dense_problems,
    _solve_dense_problems_numpy,
)

#: Largest problem (variables) the NumPy twin of the dense solver takes while
#: :func:`_solve_dense_problems` compiles in the background (see
#: :mod:`gpuml.kernels._jit`): an SMO step costs the twin about 20 NumPy calls over
#: the problem, so past a few thousand variables waiting for the compile costs less.
NUMPY_TWIN_MAX_ROWS = 1024
#: ... and the largest batch (all the problems of a call to :func:`solve_batch`), in sum of
#: squared problem sizes (the steps scale about so).
NUMPY_TWIN_MAX_WORK = 2048 ** 2


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
        """Whether the NumPy twin may take these problems while numba compiles: only when
        the whole batch is small, not only this call's share of it (a batch of many
        small problems, the parts of a CA-SVM, would otherwise run the twin in every
        call, the compile waiting for the fit to end)."""
        sizes = self.sizes
        return (self.settings[2] is None and len(which) > 0
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
        self.limits = blas_controller().limit(limits=1, user_api="blas")

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
                shrinking=True, n_jobs=None, progress=None,
                sgemm_min_rows=None) -> list[SMOResult]:
    """Solve every problem, sharing kernel values between the problems of a group.

    The problems are validated once, together, and laid end to end in flat
    arrays. Every group whose kernel matrix fits in ``cache_bytes`` (the usual
    case for the parts of a CA-SVM) gets it computed once; its problems are
    then solved by compiled calls over chunks of problems, with no Python
    per problem or per step. Problems of larger groups are solved one by one
    with rows computed on demand. Chunks and large problems run in joblib
    threads (the numba loops release the GIL). ``progress(group, results)``, when
    given, is called in the calling thread as soon as every problem of a group is
    solved, with that group's results in problem order. ``sgemm_min_rows``: the fewest
    rows of a group whose rbf matrix :func:`sgemm_matrix` makes (None:
    :data:`SGEMM_MIN_ROWS`).
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
    if int(group.min()) < 0 or int(group.max()) >= len(Xs):
        raise ValueError(f"a problem names a group outside 0..{len(Xs) - 1}")
    idx = np.concatenate(idxs)
    rows = np.array([X.shape[0] for X in Xs], dtype=np.int64)
    if np.any(idx < 0) or np.any(idx >= np.repeat(rows[group], sizes)):
        raise ValueError("a problem's row index is outside its group's matrix")
    used = np.unique(group).tolist()
    planned = {g: _matrix_plan(kernel, Xs[g], cache_bytes, sgemm_min_rows) for g in used}
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
    jobs = part_threads(n_jobs, sizes)
    dense_groups = np.array([g for g in used if planned[g] is not None], dtype=np.int64)
    per_group = 1 if jobs == 1 else -(-8 * jobs // max(len(dense_groups), 1))
    # A group's whole matrix is made just before its problems are solved and dropped
    # after them (so at most n_jobs are held at once, each at most cache_size, and the
    # solver reads a matrix partly still in the CPU's cache): on one thread group after
    # group (the GEMM with all of BLAS's threads); on several when each group is one
    # task (binary parts always are), inside it. Otherwise (few groups, their problems
    # split over the threads) every matrix is made first.
    row_cached = np.flatnonzero(~dense).tolist()
    tasks = [("row-cached", w) for w in row_cached]
    split_groups = False
    for g in dense_groups.tolist():
        mine = np.flatnonzero(group == g)
        mine = mine[np.argsort(-sizes[mine], kind="stable")]
        n_chunks = min(per_group, mine.size)
        split_groups |= n_chunks > 1
        tasks += [("dense", (g, mine[c::n_chunks])) for c in range(n_chunks)]
    own = jobs > 1 and not split_groups
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

    # BLAS on one thread for every solve of the batch that calls it (rows on demand: one
    # GEMV each; matrices made inside the threads); the compiled dense solves never do.
    # The controller is the process's one scan of the loaded BLAS libraries (a
    # threadpool_limits per solve would scan them again), and entering a limit costs
    # more than the solve of a small problem, so it is entered only where it counts.
    blas = blas_controller() if len(problems) > 1 and (row_cached or own) else None

    def solve(items):
        with blas.limit(limits=1, user_api="blas") if blas is not None else nullcontext():
            return _in_threads(task, items, jobs, on_result=finished)

    mats = {}
    if jobs == 1:
        done = solve([t for t in tasks if t[0] == "row-cached"]) if row_cached else []
        for g in dense_groups.tolist():
            mats[g] = _make_matrix(kernel, Xs[g], planned[g], cache_bytes)
            done += solve([t for t in tasks if t[0] == "dense" and t[1][0] == g])
            del mats[g]
    else:
        if not own:
            mats = dict(zip(dense_groups.tolist(), _in_threads(
                lambda g: _make_matrix(kernel, Xs[g], planned[g], cache_bytes),
                dense_groups.tolist(), jobs)))
        done = solve(tasks)
    results = run.results()
    for out in done:
        if out is not None:
            results[out[0]] = out[1]
    return results


def _matrix_plan(kernel, X, cache_bytes, sgemm_min_rows=None):
    """How a group's whole kernel matrix is made ("precomputed", "sgemm", "exact"), or
    None when it does not fit in ``cache_bytes`` (its problems then compute rows on demand).

    One GEMM per group: the one-vs-one problems of a group need exactly its values
    between them (diagonal plus cross blocks).
    """
    if kernel.name == "precomputed":
        return "precomputed"
    if X.shape[0] ** 2 * 4 <= cache_bytes and sgemm_applies(kernel, X, sgemm_min_rows):
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
#: worst pair (accuracy and speed against float64: ``bench/bench_casvm_sgemm.py``,
#: bench/results/cpu-2core/casvm_sgemm.md).
SGEMM_EXPONENT_ERROR = 1e-4

#: Smaller matrices are computed in the data's dtype: their GEMM is cheap,
#: and small problems then solve exactly as before, as the GPU
#: solver does and as with a precomputed kernel matrix.
SGEMM_MIN_ROWS = 2048
#: ... except the parts of a partitioned fit (``smo_solve_batch(partitioned=True)``): the
#: default CA-SVM parts hold just under 2,048 rows, and their matrices in float32 make a
#: float64 fit about 1.3x faster at the same accuracy (``bench/bench_casvm_sgemm.py``).
PART_SGEMM_MIN_ROWS = 1024


def _centred(X):
    dense = X.toarray() if hasattr(X, "toarray") else np.asarray(X)
    return dense - dense.mean(axis=0)


def sgemm_rows(kernel, X, min_rows=None):
    """The centred rows of ``X`` when its rbf matrix is built by :func:`sgemm_matrix`, else None.

    rbf, at least ``min_rows`` rows (None: :data:`SGEMM_MIN_ROWS`), no more features than rows
    (a sparse part is densified: the dense copy is then no larger than the
    matrix) and a rounding bound ``2 gamma max ||x - mean||^2 eps32`` at most
    :data:`SGEMM_EXPONENT_ERROR` (a large gamma falls back to float64). It
    depends on the shape and the values only, never on the format.
    """
    n, d = X.shape
    if kernel.name != "rbf" or n < (SGEMM_MIN_ROWS if min_rows is None else min_rows) or d > n:
        return None
    centred = _centred(X)
    radius = float(np.einsum("ij,ij->i", centred, centred).max())
    if 2.0 * kernel.gamma * radius * np.finfo(np.float32).eps > SGEMM_EXPONENT_ERROR:
        return None
    return centred


def sgemm_applies(kernel, X, min_rows=None) -> bool:
    """Whether the rbf matrix of ``X`` is built by :func:`sgemm_matrix` (see :func:`sgemm_rows`)."""
    return sgemm_rows(kernel, X, min_rows) is not None


def sgemm_matrix(kernel, X, *, max_bytes, centred=None):
    """``K(X, X)`` for rbf in float32, as LIBSVM caches its values (``Qfloat``).

    Half the memory of float64, and faster: one SSYRK (the lower triangle of the
    rows' products) and one compiled pass that turns that triangle into kernel
    values and mirrors it (:func:`_rbf_from_lower`; building the matrix is most of a
    CA-SVM part's fit: ``bench/bench_casvm_sgemm.py``,
    bench/results/cpu-2core/casvm_sgemm.md). The rows are
    centred first (``centred``: :func:`sgemm_rows`' result, when the caller has
    it), which leaves distances unchanged and removes the cancellation of
    ``||x||^2 + ||y||^2 - 2 x.y`` for data far from the origin. The diagonal is its
    exact value 1 and the matrix exactly symmetric: SMO's incremental gradient reads
    rows and a fresh one columns, which must agree to the last bit for a warm start
    from a solution to take no step. The gradient and the dual variables stay in
    float64. Use where :func:`sgemm_applies`.
    """
    from scipy.linalg.blas import ssyrk

    centred = _centred(X) if centred is None else centred
    rows = np.ascontiguousarray(centred, dtype=np.float32)
    n = rows.shape[0]
    if n * n * 4 > max_bytes:
        raise MemoryError(f"the {n} x {n} float32 kernel matrix would take "
                          f"{n * n * 4 / 2**30:.1f} GiB, more than max_bytes="
                          f"{max_bytes / 2**30:.1f} GiB")
    # ssyrk on the (d, n) Fortran view of the rows: the upper triangle of a Fortran
    # n x n array, which is the lower triangle of its C-ordered transpose.
    gram_lower = ssyrk(1.0, rows.T, trans=1, lower=0).T
    return _rbf_from_lower(gram_lower, np.einsum("ij,ij->i", rows, rows), float(kernel.gamma))


@njit(nogil=True, cache=True)
def _rbf_from_lower(K, norms, gamma):
    """``exp(-gamma ||x_i - x_j||^2)`` from the products ``K[i, j] = x_i . x_j`` of the
    lower triangle (``j < i``), in place, row by row in float32
    (:func:`~gpuml.kernels.vexp.rbf_exponent`,
    :func:`~gpuml.kernels.vexp.exp_nonpositive_f32`); the diagonal set to 1 and the upper
    triangle a copy of the lower one: an exactly symmetric ``K``.
    """
    n = K.shape[0]
    arg = np.empty(n, np.float32)
    scratch = np.empty(n, np.int32)
    for i in range(n):
        row = K[i, :i]
        rbf_exponent(row, -2.0, norms[i], norms[:i], gamma, arg[:i])
        exp_nonpositive_f32(arg[:i], row, scratch)
        K[i, i] = 1.0
    step = 64
    for a in range(0, n, step):
        for b in range(0, a + 1, step):
            for i in range(a, min(a + step, n)):
                for j in range(b, min(b + step, i)):
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
