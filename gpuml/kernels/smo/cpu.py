"""SMO on the CPU: a batch of problems over threads, on kernel matrices or rows on demand.

:mod:`.loop` holds the iteration (numba, ``nogil``); this module feeds it. A
batch (:func:`solve_batch`: the parts times the one-vs-one pairs of a CA-SVM
fit, thousands of small problems) is validated once and laid end to end in
flat arrays. A group (a part) whose problems share kernel values (several
one-vs-one pairs) or are small gets its kernel matrix computed once
(:mod:`.values`) when it fits in the cache, and each compiled call solves a
chunk of that group's problems on it (:class:`_DenseRun`), in joblib threads.
Every other problem (one problem of more than
:data:`~.rows.WHOLE_MATRIX_MAX_ROWS` variables on its rows, as the binary parts and
the exact SVM have, or one too large for the cache) computes its kernel rows as its
steps need them (:class:`~.rows.RowCache`): its cost follows its work. Of a batch's
problems alone, the first :data:`FIRST_ALONE` are solved first; when all of them made
their whole matrix midway (hard problems), the others make it first.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from .. import _jit
from .._threads import blas_controller, part_threads
from . import Checked, SMOResult, check_flat, iteration_limit
from .loop import (
    _CONVERGED,
    STATE_SIZE,
    _rho,
    _solve_dense_problems,
    _solve_dense_problems_numpy,
)
from .rows import WHOLE_MATRIX_MAX_ROWS, RowCache, shrinks
from .values import (  # noqa: F401  (the float32 matrices' rule and builder, named here too)
    PART_SGEMM_MIN_ROWS,
    SGEMM_EXPONENT_ERROR,
    SGEMM_MIN_ROWS,
    Values,
    matrix_threads,
    sgemm_applies,
    sgemm_matrix,
    sgemm_rows,
    values_of,
)

#: Largest problem (variables) the NumPy twin of the dense solver takes while
#: :func:`_solve_dense_problems` compiles in the background (see
#: :mod:`gpuml.kernels._jit`): an SMO step costs the twin about 20 NumPy calls over
#: the problem, so past a few thousand variables waiting for the compile costs less.
#: Larger problems compute their rows on demand (:data:`~.rows.WHOLE_MATRIX_MAX_ROWS`).
NUMPY_TWIN_MAX_ROWS = WHOLE_MATRIX_MAX_ROWS
#: ... and the largest batch (all the problems of a call to :func:`solve_batch`), in sum of
#: squared problem sizes (the steps scale about so).
NUMPY_TWIN_MAX_WORK = 2048 ** 2
#: The problems alone of a batch solved first, whose outcome decides how the others start
#: (:func:`solve_batch`): a fixed number, so that it never depends on the threads.
FIRST_ALONE = 2


def check_problem(y, C, alpha0):
    """Validate one dual problem's labels, bounds and warm start; returns float64 copies."""
    checked = check_flat([y], [C], [alpha0])
    return checked.y, checked.C, checked.alpha


def solve(kernel, X, idx, y, C, *, tol=1e-3, max_iter=-1, cache_bytes=1 << 30,
          shrinking=True, alpha0=None, K=None, sgemm_min_rows=None) -> SMOResult:
    """Solve the dual on the rows ``idx`` of ``X`` (host arrays).

    ``K`` may be the problem's whole kernel matrix, already computed (shared
    by the one-vs-one problems of a part); otherwise a small problem's matrix is
    computed first and a larger one's rows as its steps need them
    (:class:`~.rows.RowCache`, at most ``cache_bytes``).
    """
    y, C, alpha = check_problem(y, C, alpha0)
    return _solve_checked(kernel, X, np.asarray(idx), y, C, alpha, tol, max_iter, cache_bytes,
                          shrinking, K, sgemm_min_rows)[0]


def _solve_checked(kernel, X, idx, y, C, alpha, tol, max_iter, cache_bytes, shrinking, K,
                   sgemm_min_rows=None, threads=1, whole_first=False):
    """One validated problem: the dense solver on its whole matrix when given, precomputed,
    small enough to compute first, or ``whole_first`` (and it fits); else its rows on
    demand (a matrix made midway in ``threads`` threads). Returns the result and whether
    the problem's whole matrix was made."""
    n = y.shape[0]
    if K is None and kernel.name == "precomputed":
        K = _dense(X)[np.ix_(idx, idx)]
    values = None
    if K is None:
        values = values_of(kernel, X[idx], sgemm_min_rows, WHOLE_MATRIX_MAX_ROWS)
        fits = n * n * values.dtype.itemsize <= cache_bytes
        if fits and (whole_first or n <= WHOLE_MATRIX_MAX_ROWS):
            K = values.matrix(threads)
    if K is not None:
        one = _DenseRun(np.ones(1, bool), np.arange(n, dtype=np.int64),
                        Checked(np.array([0, n], dtype=np.int64), y, C, alpha),
                        tol, max_iter, shrinking)
        one(np.ascontiguousarray(K), np.zeros(1, np.int64))
        return one.results()[0], True
    rows = RowCache(values, cache_bytes, threads=threads)
    status, n_iter, G = rows.solve(y, C, alpha, tol, max_iter, shrinking)
    return result_of(y, C, alpha, G, n_iter, status), rows.order is not None


def result_of(y, C, alpha, G, n_iter, status) -> SMOResult:
    """The :class:`SMOResult` of a solved problem (LIBSVM's rho and objective from ``G``)."""
    return SMOResult(alpha=alpha, intercept=-float(_rho(y, C, alpha, G)), n_iter=int(n_iter),
                     objective=float(alpha @ (G - 1.0)) / 2.0, gradient=G,
                     converged=status == _CONVERGED)


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
        self.shrinking = shrinking
        self.settings = (float(tol), self.limits)

    def __call__(self, K, which):
        """Solve the problems ``which`` on rows of ``K`` (one compiled call, GIL released)."""
        m = int(self.sizes[which].max()) if len(which) else 0
        gathered = self.sizes[which][~self.whole[which]]
        side = int(gathered.max()) if gathered.size else 1
        # Workspaces for the call (one per thread): allocating them in compiled code
        # would compile NumPy's allocators into the first fit.
        sub = np.empty((side, side), dtype=K.dtype)
        which = np.asarray(which, dtype=np.int64)
        # None, not False: the compiled code without shrinking is a smaller, faster compile.
        shrink = True if shrinks(self.shrinking, m) else None
        args = (K, *self.args, self.G, which, *self.settings, shrink, self.n_iter, self.status,
                self.rho, self.objective, sub, np.empty(m), np.empty(m, dtype=np.int64),
                np.empty(m, dtype=np.int64), np.empty(m), np.zeros(STATE_SIZE, dtype=np.int64),
                np.empty((2, m)))
        if shrink is None and self._small(which) and not _jit.ready(_solve_dense_problems,
                                                                    *args):
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
        return (len(which) > 0
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


def check_batch(Xs, problems):
    """Validate a batch (labels, bounds, starts, groups, row indices) before any work:
    ``(checked, group, idxs)``, the problems laid end to end, their groups and rows."""
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
    rows = np.array([X.shape[0] for X in Xs], dtype=np.int64)
    idx = np.concatenate(idxs)
    if np.any(idx < 0) or np.any(idx >= np.repeat(rows[group], sizes)):
        raise ValueError("a problem's row index is outside its group's matrix")
    return checked, group, idxs


def solved_alone(kernel, group, sizes, n_groups):
    """Which problems compute their rows on demand: the one problem of its group, larger
    than a first matrix is worth (:data:`~.rows.WHOLE_MATRIX_MAX_ROWS`)."""
    return ((np.bincount(group, minlength=n_groups)[group] == 1)
            & (sizes > WHOLE_MATRIX_MAX_ROWS) & (kernel.name != "precomputed"))


def solve_batch(kernel, Xs, problems, *, tol=1e-3, max_iter=-1, cache_bytes=1 << 30,
                shrinking=True, n_jobs=None, progress=None,
                sgemm_min_rows=None) -> list[SMOResult]:
    """Solve every problem, sharing kernel values between the problems of a group.

    The problems are validated once, together, and laid end to end in flat
    arrays. A group whose kernel matrix fits in ``cache_bytes`` and whose problems
    share its values (several one-vs-one pairs) or are small (at most
    :data:`~.rows.WHOLE_MATRIX_MAX_ROWS` variables) gets it computed once; its
    problems are then solved by compiled calls over chunks of problems, with no
    Python per problem or per step. Every other problem (the one problem of a binary
    part, the exact SVM's, or one of a group too large for the cache) is solved alone
    with its rows computed as its steps need them (:class:`~.rows.RowCache`). Chunks
    and problems alone run in joblib threads (the numba loops release the GIL).
    ``progress(group, results)``, when given, is called in the calling thread as soon
    as every problem of a group is solved, with that group's results in problem order.
    ``sgemm_min_rows``: the fewest rows of a problem (or group) whose rbf values are
    float32 from centred rows (:func:`~.values.sgemm_rows`; None: :data:`SGEMM_MIN_ROWS`).
    """
    if not problems:
        return []
    checked, group, idxs = check_batch(Xs, problems)
    sizes = np.diff(checked.offsets)
    idx = np.concatenate(idxs)
    alone = solved_alone(kernel, group, sizes, len(Xs))
    used = np.unique(group[~alone]).tolist()
    planned = {g: _matrix_plan(kernel, Xs[g], cache_bytes, sgemm_min_rows) for g in used}
    mat_rows = np.array([-1 if planned.get(g) is None else Xs[g].shape[0]
                         for g in range(len(Xs))], dtype=np.int64)
    dense = (mat_rows[group] >= 0) & ~alone
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
    tasks = [("alone", w) for w in row_cached]
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
        res, made = _solve_checked(kernel, Xs[g], idxs[w], checked.y[a:b], checked.C[a:b],
                                   checked.alpha[a:b], tol, max_iter, cache_bytes, shrinking,
                                   K, sgemm_min_rows, matrix_threads(b - a) if jobs == 1 else 1,
                                   whole_first=alone[w] and w not in first and all(made_first))
        if w in first:
            made_first.append(made)
        return w, res

    # Many problems: the threads are the parallelism; BLAS threads inside each
    # would only oversubscribe the cores.
    pending = np.bincount([group[what] if kind == "alone" else what[0]
                           for kind, what in tasks], minlength=len(Xs))
    row_results = {}

    def finished(item, out):
        """A task is back (calling thread): report its group once all of the group's are."""
        kind, what = item
        g = int(group[what]) if kind == "alone" else int(what[0])
        if kind == "alone":
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

    # The problems alone of one batch are alike (the binary parts of one fit): the first
    # FIRST_ALONE of them tell the others whether to make their whole matrix first
    # (their rows on demand made it midway: hard problems) or to start on rows.
    first = set(np.flatnonzero(alone)[:FIRST_ALONE].tolist())
    made_first = []
    wave = [t for t in tasks if t[0] == "alone" and t[1] in first]
    tasks = [t for t in tasks if not (t[0] == "alone" and t[1] in first)]
    done = solve(wave) if wave else []
    mats = {}
    if jobs == 1:
        done += solve([t for t in tasks if t[0] == "alone"])
        for g in dense_groups.tolist():
            mats[g] = _make_matrix(kernel, Xs[g], planned[g], cache_bytes,
                                   matrix_threads(Xs[g].shape[0]))
            done += solve([t for t in tasks if t[0] == "dense" and t[1][0] == g])
            del mats[g]
    else:
        if not own:
            mats = dict(zip(dense_groups.tolist(), _in_threads(
                lambda g: _make_matrix(kernel, Xs[g], planned[g], cache_bytes),
                dense_groups.tolist(), jobs)))
        done += solve(tasks)
    results = run.results()
    for out in done:
        if out is not None:
            results[out[0]] = out[1]
    return results


def _matrix_plan(kernel, X, cache_bytes, sgemm_min_rows=None):
    """How a group's whole kernel matrix is made ("precomputed", "sgemm": float32 from
    centred rows, "exact": in the rows' dtype), or None when it does not fit in
    ``cache_bytes`` (its problems then compute rows on demand).

    One matrix per group: the one-vs-one problems of a group need exactly its values
    between them (diagonal plus cross blocks).
    """
    if kernel.name == "precomputed":
        return "precomputed"
    if X.shape[0] ** 2 * 4 <= cache_bytes and sgemm_applies(kernel, X, sgemm_min_rows):
        return "sgemm"
    if X.shape[0] ** 2 * np.dtype(X.dtype).itemsize > cache_bytes:
        return None
    return "exact"


def _make_matrix(kernel, X, plan, cache_bytes, threads=1):
    """The group's kernel matrix as :func:`_matrix_plan` planned it (float32 values in
    ``threads`` threads)."""
    if plan == "precomputed":
        return np.ascontiguousarray(_dense(X))
    if plan == "sgemm":
        return sgemm_matrix(kernel, X, max_bytes=max(cache_bytes, 1), threads=threads)
    return np.ascontiguousarray(kernel.matrix(X, max_bytes=max(cache_bytes, 1)))


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
