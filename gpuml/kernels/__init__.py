"""Everything hardware-specific in gpuml lives in this package.

Estimators and partitioners call the functions exported here; each takes
arrays of either namespace (NumPy or CuPy) and dispatches to the CPU or the
CUDA half of a solver. The package is cut by concept: ``smo/`` and ``gcd/``
each hold their neutral types (``__init__.py``), their numba half
(``cpu.py``; SMO's iteration itself is ``smo/loop.py``), their CuPy half
(``cuda.py``) and its CUDA C (``<name>.cu``); ``krr.py`` the batched Cholesky
and eigen solves of kernel ridge, host and device; ``nearest/`` the
nearest-centre sweep and the merge of each row's nearest support vectors
(``neighbors.py``). ``_jit.py`` compiles the
numba halves in the background and ``_cuda.py`` loads the CUDA sources. The
kernel functions themselves are :mod:`gpuml.kernels.pairwise` (re-exported here), memory
probing and readback :mod:`gpuml._backend`. Nothing outside this package
branches on the device.
"""

from __future__ import annotations

import numpy as np

from .._backend import available_bytes, is_cupy_array, namespace_of, read_lag, read_later, to_numpy
from ._jit import deferring as compile_after_fit
from ._jit import synchronous as compiling_in_caller
from ._threads import (
    map_threads,
    parallel_region,
    part_threads,
    path_threads,
    row_ranges,
    threads_for,
)
from .gcd import GCDProblem, GCDResult
from .krr import (
    NotPositiveDefiniteError,
    cholesky_solve_batch,
    eigh_batch,
    gpu_solve_bytes,
    gpu_solve_plan,
    gram_batch,
    krr_lstsq_part,
    krr_solve_parts,
    tridiagonal_batch,
)
from .nearest import OpenDistances, fill_blocks, nearest_centres, part_sums, row_blocks
from .pairwise import (
    HOST_KERNELS,
    KERNELS,
    Kernel,
    PairwiseKernel,
    kernel_matrix,
    make_kernel,
    resolve_gamma,
    shifted_sq_distances,
    sq_distances,
    squared_norms,
)
from .smo import SMOProblem, SMOResult
from .vexp import rbf_from_sq_distances

__all__ = [
    "GCDProblem",
    "GCDResult",
    "gcd_default_cache_bytes",
    "gcd_default_workers",
    "gcd_plan",
    "gcd_gradient",
    "gcd_objectives",
    "gcd_solve",
    "gcd_solve_batch",
    "SMOProblem",
    "SMOResult",
    "smo_solve",
    "smo_solve_batch",
    "smo_solve_path",
    "part_threads",
    "path_threads",
    "parallel_region",
    "threads_for",
    "map_threads",
    "rbf_from_sq_distances",
    "row_ranges",
    "HOST_KERNELS",
    "KERNELS",
    "PairwiseKernel",
    "NotPositiveDefiniteError",
    "available_bytes",
    "cholesky_solve_batch",
    "eigh_batch",
    "gpu_solve_bytes",
    "gpu_solve_plan",
    "gram_batch",
    "krr_lstsq_part",
    "krr_solve_parts",
    "tridiagonal_batch",
    "Kernel",
    "OpenDistances",
    "compile_after_fit",
    "compiling_in_caller",
    "fill_blocks",
    "fill_by_candidates",
    "fill_nearest_open",
    "nearest_centres",
    "part_sums",
    "read_lag",
    "read_later",
    "row_blocks",
    "kernel_matrix",
    "make_kernel",
    "resolve_gamma",
    "shifted_sq_distances",
    "sq_distances",
    "squared_norms",
]


def fill_nearest_open(D, counts, caps, entries=None):
    """Assign each row of the distance block ``D`` to its nearest part with room left.

    A sequential greedy pass (You 2020, Alg 3 and 9): the order of rows
    matters, so it runs as one numba loop on the host. ``counts`` (host int64) is
    updated in place. ``entries``: the distance entries (rows x parts) of the whole
    fill ``D`` is a block of, when it has several blocks (only a small fill may take the
    loop's NumPy twin while numba compiles). Returns the labels in ``D``'s namespace.

    A block on a GPU is not copied over: the device finds each row's
    :data:`~gpuml.kernels.nearest.FILL_CANDIDATES` nearest parts among those with room
    when the block begins (:func:`~gpuml.kernels.nearest.fill_candidates`), and the host
    reads back those and, for the rare row all of whose candidates filled within the
    block, that row's distances (:func:`fill_by_candidates`): the same labels, with
    eight numbers a row crossing the bus instead of P distances (at 10 million rows and
    4,883 parts, 195 GB of them).
    """
    if is_cupy_array(D):
        return fill_by_candidates(D, counts, caps)
    from .nearest.cpu import fill_nearest_open_any as _fill

    host = np.ascontiguousarray(to_numpy(D))
    labels = np.empty(host.shape[0], dtype=np.int64)
    _fill(host, counts, caps, labels, entries)
    return labels


def fill_by_candidates(D, counts, caps, r=None):
    """:func:`fill_nearest_open` from each row's first ``r`` candidates (on ``D``'s device,
    NumPy or CuPy; default :data:`~gpuml.kernels.nearest.FILL_CANDIDATES`): the host takes
    a row's first candidate with room left
    (:func:`~gpuml.kernels.nearest.cpu.fill_from_candidates`) and scans the row's
    distances, read back with the next :data:`~gpuml.kernels.nearest.FILL_SCAN_ROWS` rows',
    where none has or they are not finite. The same labels and counts as the scan of every
    row. Returns the labels in ``D``'s namespace.

    >>> D = np.array([[0.0, 1.0], [0.0, 2.0], [3.0, 1.0]])
    >>> counts = np.zeros(2, dtype=np.int64)
    >>> fill_by_candidates(D, counts, np.array([1, 2]), r=1).tolist(), counts.tolist()
    ([0, 1, 1], [1, 2])
    """
    from .nearest import FILL_CANDIDATES, FILL_SCAN_ROWS, fill_candidates
    from .nearest.cpu import fill_from_candidates
    from .nearest.cpu import fill_nearest_open as scan

    xp = namespace_of(D)
    r = FILL_CANDIDATES if r is None else int(r)
    cand, cand_d = fill_candidates(D, counts >= caps, min(r, D.shape[1]))
    cand, cand_d = to_numpy(cand), to_numpy(cand_d)
    n = D.shape[0]
    labels = np.empty(n, dtype=np.int64)
    i = 0
    while True:
        i = fill_from_candidates(cand, cand_d, i, counts, caps, labels)
        if i == n:
            return xp.asarray(labels)
        # this row and the next few (rows near a part that fills tend to follow one
        # another): their distances read back at once and scanned
        stop = min(i + FILL_SCAN_ROWS, n)
        rows = np.ascontiguousarray(to_numpy(D[i:stop]))
        scan(rows, np.argmin(rows, axis=1), counts, caps, labels[i:stop])
        i = stop


def smo_solve_batch(kernel, Xs, problems, *, tol=1e-3, max_iter=-1, cache_size=1024.0,
                    shrinking=True, n_jobs=None, progress=None, partitioned=False):
    """Solve a batch of SVM dual problems (SMO with WSS2, You 2020 Alg 1), CPU or GPU.

    ``Xs`` is a list of matrices (all NumPy or all CuPy); each
    :class:`SMOProblem` names its matrix (``group``) and rows. Problems of one
    group share its kernel matrix when it fits in ``cache_size`` MB. On the
    CPU groups and problems run in :func:`part_threads` threads; on a GPU the problems
    are solved concurrently, one kernel launch per chunk of groups whose
    kernel matrices fit in device memory together (usually one). Returns one
    :class:`SMOResult` per problem, arrays in the namespace of ``Xs``.

    ``progress(group, results)``, when given, is called in the calling thread
    once per group with problems, with that group's results in problem order:
    on the CPU as soon as the group's last problem is solved, on a GPU (one
    launch for all) after the batch.

    ``partitioned``: the groups are parts of a larger fit (a CA-SVM of several parts),
    whose rbf kernel matrices the CPU makes in float32 from
    :data:`~gpuml.kernels.smo.cpu.PART_SGEMM_MIN_ROWS` rows instead of
    :data:`~gpuml.kernels.smo.cpu.SGEMM_MIN_ROWS` (:func:`~gpuml.kernels.smo.cpu.sgemm_matrix`,
    as LIBSVM keeps its kernel values); a GPU computes them in the rows' dtype either way.
    """
    cache_bytes = int(float(cache_size) * (1 << 20))
    if any(is_cupy_array(X) for X in Xs):
        from .smo.cuda import solve_batch as _gpu

        results = _gpu(kernel, Xs, problems, tol=tol, max_iter=max_iter,
                       cache_bytes=cache_bytes, shrinking=shrinking)
        if progress is not None:
            groups = [p.group for p in problems]
            for g in dict.fromkeys(groups):
                progress(g, [r for r, h in zip(results, groups) if h == g])
        return results
    from .smo.cpu import PART_SGEMM_MIN_ROWS
    from .smo.cpu import solve_batch as _cpu

    return _cpu(kernel, Xs, problems, tol=tol, max_iter=max_iter, cache_bytes=cache_bytes,
                shrinking=shrinking, n_jobs=n_jobs, progress=progress,
                sgemm_min_rows=PART_SGEMM_MIN_ROWS if partitioned else None)


def smo_solve_path(kernel, Xs, problems, Cs, *, tol=1e-3, max_iter=-1, cache_size=1024.0,
                   shrinking=True, n_jobs=None, partitioned=False, one_launch=False):
    """Solve a batch of SVM dual problems for every C of an increasing sequence ``Cs``.

    The C path of a search (one part's one-vs-one problems, or a batch of parts, over a
    grid of C): ``problems[w].C`` are problem ``w``'s bounds for C = 1 (LIBSVM's class and
    sample weights), and the problems are solved for each C of ``Cs`` with those bounds
    times C. Arguments otherwise as :func:`smo_solve_batch` (``problems[w].alpha0``
    starts the first C). On the CPU the work of the path is shared
    (:mod:`gpuml.kernels.smo.path`):

    * each group's kernel values are computed once for every C: its whole matrix (a
      group of several problems, or small ones), or a problem's rows on demand and its
      matrix once made (:class:`~gpuml.kernels.smo.rows.RowCache`);
    * each C after the first starts from the previous C's solution, its variables at
      their bound moved to the new bound (:func:`~gpuml.kernels.smo.path.seed_alpha`;
      DeCoste and Wagstaff, "Alpha seeding for support vector machines", KDD 2000), the
      gradient recomputed from that start.

    Each result is the cold start's optimum to ``tol`` (a KKT gap below it); the path
    takes fewer SMO steps where the support vectors change little from one C to the next
    (measured: ``bench/bench_exact_work.py``, table ``exact_work_path``). On a GPU each C
    is one :func:`smo_solve_batch` warm-started the same way (its kernel matrices computed
    again for each C). ``one_launch`` (GPU only): every (problem, C) pair in one
    :func:`smo_solve_batch` instead (:func:`~gpuml.kernels.smo.path.path_batch`), each
    group's kernel matrix made once and shared by its problems for every C, all of them
    solved side by side, each from ``alpha0`` (no seed from the previous C); ``"auto"``:
    so when every problem is small enough to be solved by one thread block
    (:data:`~gpuml.kernels.smo.cuda.GRID_MIN_SIZE`; a larger problem takes the whole
    device, one launch each, and gains from the seeds).

    Returns
    -------
    list of lists of SMOResult
        ``results[c][w]``: problem ``w`` for ``Cs[c]``.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.kernels import Kernel, SMOProblem, smo_solve_path
    >>> X = np.array([[0.0], [1.0], [3.0], [4.0]])
    >>> problem = SMOProblem(0, np.arange(4), np.array([-1.0, -1.0, 1.0, 1.0]))
    >>> path = smo_solve_path(Kernel("linear"), [X], [problem], [0.1, 10.0])
    >>> [(np.round(by_C[0].alpha, 3) + 0.0).tolist() for by_C in path]
    [[0.075, 0.1, 0.1, 0.075], [0.0, 0.5, 0.5, 0.0]]
    """
    from .smo.path import check_Cs, seed_alpha

    Cs = check_Cs(Cs)
    cache_bytes = int(float(cache_size) * (1 << 20))
    if any(is_cupy_array(X) for X in Xs):
        import dataclasses

        from .smo.path import path_batch

        if one_launch == "auto":
            from .smo.cuda import GRID_MIN_SIZE

            one_launch = all(np.size(p.idx) < GRID_MIN_SIZE for p in problems)
        if one_launch:
            flat = smo_solve_batch(kernel, Xs, path_batch(problems, Cs), tol=tol,
                                   max_iter=max_iter, cache_size=cache_size, shrinking=shrinking)
            return [flat[c * len(problems):(c + 1) * len(problems)] for c in range(len(Cs))]
        weights = [np.asarray(to_numpy(p.C), dtype=np.float64) for p in problems]
        batch, results = list(problems), []
        for c, C in enumerate(Cs.tolist()):
            if c:
                batch = [dataclasses.replace(p, C=C * w, alpha0=seed_alpha(
                    to_numpy(r.alpha), to_numpy(p.y), Cs[c - 1] * w, C * w))
                    for p, w, r in zip(problems, weights, results[-1])]
            else:
                batch = [dataclasses.replace(p, C=C * w) for p, w in zip(problems, weights)]
            results.append(smo_solve_batch(kernel, Xs, batch, tol=tol, max_iter=max_iter,
                                           cache_size=cache_size, shrinking=shrinking))
        return results
    from .smo.cpu import PART_SGEMM_MIN_ROWS
    from .smo.path import solve_path

    return solve_path(kernel, Xs, problems, Cs, tol=tol, max_iter=max_iter,
                      cache_bytes=cache_bytes, shrinking=shrinking, n_jobs=n_jobs,
                      sgemm_min_rows=PART_SGEMM_MIN_ROWS if partitioned else None)


def smo_solve(kernel, X, y, C=1.0, *, tol=1e-3, max_iter=-1, cache_size=1024.0,
              shrinking=True, alpha0=None):
    """Solve one SVM dual ``min 1/2 a'Qa - e'a, y'a = 0, 0 <= a <= C`` on all rows of ``X``.

    Parameters
    ----------
    kernel : Kernel
        The kernel function (``make_kernel``); "precomputed" means X is K.
    X : array of shape (n, d), NumPy or CuPy (dense or CSR on the CPU)
    y : array of shape (n,) in {-1, +1}
    C : float or array of shape (n,)
        Per-sample upper bounds.
    tol : float
        Stop when the KKT gap ``max_{I_up} -yG - min_{I_low} -yG`` is below it.
    max_iter : int
        SMO steps at most; -1: LIBSVM's cap of ``max(10**7, 100 n)`` steps. A
        problem stopped by either has ``converged=False``.
    cache_size : float
        Kernel-row cache in MB; the whole kernel matrix is computed at once when it fits.
    shrinking : bool or "auto"
        LIBSVM's shrinking heuristic; ``"auto"``: on a problem of more than 1,024
        variables only (:func:`gpuml.kernels.smo.rows.shrinks`). No effect on a GPU.
    alpha0 : array of shape (n,) or None
        Feasible warm start.

    Returns
    -------
    SMOResult

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.kernels import Kernel, smo_solve
    >>> X = np.array([[0.0], [1.0], [3.0], [4.0]])
    >>> res = smo_solve(Kernel("linear"), X, np.array([-1, -1, 1, 1]), C=10.0)
    >>> np.round(res.alpha, 3).tolist(), round(res.intercept, 2)
    ([0.0, 0.5, 0.5, 0.0], -2.0)
    """
    idx = np.arange(X.shape[0])
    problem = SMOProblem(0, idx, to_numpy(y), to_numpy(C), None if alpha0 is None
                         else to_numpy(alpha0))
    (result,) = smo_solve_batch(kernel, [X], [problem], tol=tol, max_iter=max_iter,
                                cache_size=cache_size, shrinking=shrinking)
    return result


def _gcd_seed(random_state) -> int:
    from sklearn.utils import check_random_state

    return int(check_random_state(random_state).randint(2**31 - 1))


def _check_gcd_options(selection, tol):
    if selection not in ("greedy", "random"):
        raise ValueError(f"selection must be 'greedy' or 'random', got {selection!r}")
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol!r}")


def gcd_solve(X, y, C, kernel, blocks, *, selection="greedy", tol=1e-3, max_updates=None,
              cache_bytes=None, random_state=None, trace_interval=None, time_limit=None):
    """Asy-GCD for the bias-free kernel SVM dual (You, 2020, ch. 4, Alg 13 and 14), CPU or GPU.

    Solves ``min 1/2 a'Qa - e'a`` s.t. ``0 <= a <= C``, ``Q_ij = y_i y_j K(x_i, x_j)``
    (eq. 4.9) with one worker per block of variables, never waiting for each
    other: on the CPU each owns its block's rows of the gradient and reads the
    others' updates from a log; on a GPU they share it through atomic adds. NumPy input
    runs on CPU threads (numba, outside the GIL); CuPy input runs one persistent
    CUDA thread block per worker on X's device. Each worker damps its steps
    when the others' concurrent steps overshoot its coordinate (our addition to
    Alg 14, see :mod:`gpuml.kernels.gcd.cpu`); one worker is exactly Alg 13.

    Parameters
    ----------
    X : array of shape (n, d), NumPy or CuPy (CSR is densified), or (n, n) for
        ``kernel.name == "precomputed"``
    y : array of shape (n,) with values in {-1, +1}
    C : array of shape (n,), per-variable upper bounds (>= 0)
    kernel : Kernel
    blocks : int array of shape (n,), the block (worker) of every variable; each
        non-empty block gets one worker, so one block is serial GCD (Alg 13)
    selection : {"greedy", "random"}
        Largest projected gradient in the block (eq. 4.11), or a uniformly
        random variable (asynchronous stochastic coordinate descent, PSCD);
        a random pick already within ``tol`` is skipped.
    tol : float > 0
        Stop once the largest projected gradient over all variables is below it.
    max_updates : int or None
        Stop after this many coordinate updates (over all workers); None:
        ``max(10**7, 100 n)`` (LIBSVM's cap on SMO steps), so every run ends.
    cache_bytes : int or None
        CPU: kernel-column cache over all workers (each gets an equal share,
        at least one column). GPU: the whole Q is precomputed on the device
        when it fits in this many bytes and in free device memory, else
        columns are computed on the fly. None: 1 GiB on the CPU, a quarter of
        the free device memory on a GPU (:func:`gcd_default_cache_bytes`).
    random_state : int, RandomState or None
        Seeds the per-worker generators of ``selection="random"``.
    trace_interval : float or None
        CPU only: snapshot ``(seconds, n_updates, alpha)`` this often (a copy of
        the dual variables, n floats each; evaluate them with
        :func:`gcd_objectives` after the run).
    time_limit : float or None
        CPU only: stop the workers after about this many seconds.

    Returns
    -------
    GCDResult
        ``alpha`` in X's namespace, objective, max violation, update count,
        the maintained gradient (check it with :func:`gcd_gradient`), whether
        the run stopped on its certificate (``converged``) rather than the
        update cap; on CPU also the trace.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.kernels import Kernel, gcd_solve
    >>> X = np.array([[0.0], [1.0], [3.0], [4.0]])
    >>> res = gcd_solve(X, np.array([-1.0, -1.0, 1.0, 1.0]), np.ones(4), Kernel("rbf", 1.0),
    ...                 np.zeros(4, dtype=int), tol=1e-8)
    >>> res.converged, round(res.objective, 4)
    (True, -1.4723)
    """
    _check_gcd_options(selection, tol)
    seed = _gcd_seed(random_state)
    if hasattr(X, "toarray"):
        X = X.toarray()
    if cache_bytes is None:
        cache_bytes = gcd_default_cache_bytes(X)
    if is_cupy_array(X):
        from .gcd.cuda import solve as solve_cuda

        return solve_cuda(X, y, C, kernel, blocks, selection=selection, tol=tol,
                          max_updates=max_updates, cache_bytes=cache_bytes, random_state=seed)
    from .gcd.cpu import solve as solve_cpu

    return solve_cpu(to_numpy(X), to_numpy(y), to_numpy(C), kernel, to_numpy(blocks),
                     selection=selection, tol=tol, max_updates=max_updates,
                     cache_bytes=cache_bytes, random_state=seed, trace_interval=trace_interval,
                     time_limit=time_limit)


def gcd_solve_batch(X, kernel, problems, *, selection="greedy", tol=1e-3, max_updates=None,
                    cache_bytes=None, n_jobs=1, progress=None):
    """Asy-GCD for a batch of independent problems on rows of one X (one-vs-one pairs).

    Parameters
    ----------
    X : array of shape (n, d), NumPy or CuPy, or the (n, n) kernel matrix for
        ``kernel.name == "precomputed"``
    kernel : Kernel
    problems : list of :class:`GCDProblem`
        Each names its rows of X, labels, bounds, variable blocks (one worker
        per non-empty block) and random state.
    selection, tol, max_updates : as :func:`gcd_solve`, for every problem.
    cache_bytes : int or None
        CPU: split evenly over the ``n_jobs`` problems that run at once. GPU:
        for the Q matrices of all problems of one launch. None: as
        :func:`gcd_solve`.
    n_jobs : int
        CPU: problems solved at once, in threads. On a GPU every problem runs
        in one launch (a thread block per worker, each problem with its own
        counters and stop flag); problems needing more blocks than the GPU
        keeps resident are split into launches that fit, one after another.
    progress : callable or None
        ``progress(k, result)`` is called in the calling thread for every
        problem ``k``, in order: on the CPU as soon as it (and the problems
        before it) are solved, on a GPU after the batch.

    Returns
    -------
    list of GCDResult, one per problem, in order; a problem of one block is
    solved exactly as :func:`gcd_solve` solves it on the same device.
    """
    import dataclasses

    _check_gcd_options(selection, tol)
    seeds = [_gcd_seed(p.random_state) for p in problems]
    on_gpu = is_cupy_array(X)
    if hasattr(X, "toarray") and (on_gpu or kernel.name != "precomputed"):
        X = X.toarray()
    if cache_bytes is None:
        cache_bytes = gcd_default_cache_bytes(X)
    if on_gpu:
        from .gcd.cuda import solve_batch as solve_cuda

        results = solve_cuda(X, kernel, problems, selection=selection, tol=tol,
                             max_updates=max_updates, cache_bytes=cache_bytes, seeds=seeds)
        for k, res in enumerate(results if progress is not None else ()):
            progress(k, res)
        return results
    from .gcd.cpu import solve_batch as solve_cpu

    seeded = [dataclasses.replace(p, random_state=s) for p, s in zip(problems, seeds)]
    return solve_cpu(X, kernel, seeded, n_jobs=n_jobs, cache_bytes=cache_bytes,
                     selection=selection, tol=tol, max_updates=max_updates, progress=progress)


def gcd_default_cache_bytes(like=None) -> int:
    """Asy-GCD's default kernel cache where ``like`` lives: 1 GiB on the CPU; on a GPU a
    quarter of the free device memory (free plus CuPy's pool), so it scales with the card."""
    if like is not None and is_cupy_array(like):
        from .gcd.cuda import default_cache_bytes

        return default_cache_bytes(like.device.id)
    return 1 << 30


def _support(coef):
    """Indices of the rows of ``coef`` (a vector, or one point per column) that are non-zero."""
    xp = namespace_of(coef)
    return xp.flatnonzero(coef != 0 if coef.ndim == 1 else xp.any(coef != 0, axis=1))


def _support_dot(X, kernel, coef, rows=None):
    """``K(X[rows], X) @ coef`` summing only over the support of ``coef``, blocked."""
    support = _support(coef)
    rows = namespace_of(coef).arange(X.shape[0]) if rows is None else rows
    if kernel.name == "precomputed":
        return kernel.dot(X[rows][:, support], None, coef[support])
    return kernel.dot(X[rows], X[support], coef[support])


def gcd_gradient(X, y, kernel, alpha):
    """``Q a - e`` recomputed from X (blocked kernel products over the support of ``a``).

    What an Asy-GCD solver's maintained gradient (:attr:`GCDResult.gradient`)
    must equal; the stopping certificate (largest projected gradient, eq. 4.11)
    is only as good as that agreement. Arguments as :func:`gcd_solve`.
    """
    if hasattr(X, "toarray"):
        X = X.toarray()
    return y * _support_dot(X, kernel, y * alpha) - 1.0


def gcd_objectives(X, y, kernel, alphas):
    """The exact dual objective ``1/2 a'Qa - e'a`` (eq. 4.9) of one or many points.

    Parameters
    ----------
    X, y, kernel : as :func:`gcd_solve`
    alphas : array of shape (n,) or (n, s): one point, or one per column (for
        instance the snapshots of a :attr:`GCDResult.trace`, stacked)

    Returns
    -------
    float, or array of shape (s,)
        Computed from X, never from a maintained gradient: one blocked kernel
        product restricted to the variables that are non-zero in any point.
    """
    if hasattr(X, "toarray"):
        X = X.toarray()
    ya = (y * alphas.T).T
    support = _support(ya)
    quadratic = (ya[support] * _support_dot(X, kernel, ya, support)).sum(axis=0)
    values = 0.5 * quadratic - alphas.sum(axis=0)
    return float(values) if alphas.ndim == 1 else values


def gcd_plan(like, n_problems: int, n_workers=None) -> tuple[int, int]:
    """``(workers per problem, problems solved at once)`` for a batch of Asy-GCD problems.

    CPU: an explicit ``n_workers`` runs the problems one after another with
    that many workers each (the paper's setting). With ``None`` and several
    problems (one-vs-one pairs), each problem gets one worker and the problems
    spread over the cores: independent problems share nothing, which on small
    problems beats sharing a problem's work (letter's 325 one-vs-one pairs:
    "Against sklearn SVC" in bench/results/cpu-2core/asygcd-runs.md).

    GPU: every problem runs at once, in one launch (:func:`gcd_solve_batch`).
    With ``None``, one problem gets one worker per SM; several share the SMs,
    ``ceil(SMs / n_problems)`` workers each (letter's 325 pairs on a GPU with
    fewer SMs: one block each, all resident at once, instead of 325 launches of
    a few blocks each).
    """
    cores = gcd_default_workers(like)
    on_gpu = like is not None and is_cupy_array(like)
    at_once = n_problems if on_gpu else 1
    if n_workers is not None:
        return int(n_workers), at_once
    if on_gpu:
        return max(1, -(-cores // max(n_problems, 1))), at_once
    if n_problems > 1:
        return 1, min(cores, n_problems)
    return cores, 1


def gcd_default_workers(like=None) -> int:
    """Asy-GCD's default worker count where ``like`` lives: usable CPU cores, or the GPU's SMs."""
    if like is not None and is_cupy_array(like):
        from .gcd.cuda import default_workers

        return default_workers(like.device.id)
    import os

    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
