"""SMO along an increasing sequence of C: kernel values computed once, each C warm-started.

A search over C solves the same problems (a part's one-vs-one pairs) with bounds that
grow by a common factor. Two things are shared along the path (:func:`solve_path`):

* the kernel values: a group's whole matrix (several problems sharing it, or small
  ones) is computed once, a problem alone keeps its :class:`~.rows.RowCache` (its rows,
  and its whole matrix once made) for every C;
* the solution: each C starts from the previous C's solution moved to the new bounds
  (:func:`seed_alpha`; DeCoste and Wagstaff, "Alpha seeding for support vector
  machines", KDD 2000), its gradient recomputed from that start. The optimum reached is
  the cold start's to the solver's tolerance; the steps are fewer where the support
  vectors and their bound status change little from one C to the next.
"""

from __future__ import annotations

import numpy as np

from ..._backend import to_numpy
from .._threads import part_threads
from . import Checked
from .cpu import (
    _dense,
    _DenseRun,
    _in_threads,
    _make_matrix,
    _matrix_plan,
    check_batch,
    result_of,
    solved_alone,
)
from .rows import WHOLE_MATRIX_MAX_ROWS, RowCache
from .values import matrix_threads, values_of


def check_Cs(Cs) -> np.ndarray:
    """The C values of a path as a float64 array: finite, positive, strictly increasing."""
    Cs = np.asarray(Cs, dtype=np.float64)
    if Cs.ndim != 1 or Cs.size == 0:
        raise ValueError("Cs must be a non-empty 1-D sequence of C values")
    if not np.all(np.isfinite(Cs)) or np.any(Cs <= 0):
        raise ValueError(f"every C must be positive and finite, got {Cs.tolist()}")
    if np.any(np.diff(Cs) <= 0):
        raise ValueError(f"Cs must be strictly increasing (a path warm-starts each C from "
                         f"the smaller one before it), got {Cs.tolist()}")
    return Cs


def seed_alpha(alpha, y, C_old, C_new):
    """A feasible start for the bounds ``C_new`` from the solution ``alpha`` for ``C_old``.

    Alpha seeding (DeCoste and Wagstaff, 2000) along a C path: a variable at its old bound
    (a margin error) moves to its new bound, scaled by ``C_new_i / C_old_i``, as the
    solution path does while it stays a margin error; the others keep their value,
    clipped to ``[0, C_new_i]``. Whatever this moved ``y @ alpha`` away from 0 is taken
    from the larger class side, scaled down, so that the start is feasible
    (:func:`~gpuml.kernels.smo.check_flat`). Scaling every variable instead (the free ones
    too) moves the free support vectors off the margin by ``C_new / C_old - 1`` and took
    more SMO steps than a cold start on problems whose solution stops changing with C
    (``tests/test_smo_path.py``; the measured savings: ``bench/bench_exact_work.py``).
    """
    y = np.asarray(y, dtype=np.float64)
    C_old = np.broadcast_to(np.asarray(C_old, dtype=np.float64), y.shape)
    C_new = np.broadcast_to(np.asarray(C_new, dtype=np.float64), y.shape)
    seed = np.asarray(alpha, dtype=np.float64).copy()
    at_bound = seed >= C_old
    seed[at_bound] = C_new[at_bound]
    np.clip(seed, 0.0, C_new, out=seed)
    positive, negative = seed[y > 0].sum(), seed[y < 0].sum()
    if positive > negative:
        seed[y > 0] *= negative / positive
    elif negative > positive:
        seed[y < 0] *= positive / negative
    return seed


def solve_path(kernel, Xs, problems, Cs, *, tol=1e-3, max_iter=-1, cache_bytes=1 << 30,
               shrinking=True, n_jobs=None, sgemm_min_rows=None):
    """Every problem for every C of ``Cs`` (increasing): ``results[c][w]``.

    ``problems[w].C`` are its bounds for C = 1 (class and sample weights), multiplied by
    each C; ``problems[w].alpha0`` starts the first C (None: zeros). Groups run in
    :func:`~gpuml.kernels.part_threads` threads, each group's C values one after
    another on its kernel values (a matrix, or a :class:`~.rows.RowCache` per problem).
    """
    Cs = check_Cs(Cs)
    if not problems:
        return [[] for _ in Cs]
    checked, group, idxs = check_batch(Xs, problems)
    sizes = np.diff(checked.offsets)
    alone = solved_alone(kernel, group, sizes, len(Xs))
    weights = [checked.C[a:b] for a, b in zip(checked.offsets[:-1], checked.offsets[1:])]
    starts = [checked.alpha[a:b] for a, b in zip(checked.offsets[:-1], checked.offsets[1:])]
    ys = [checked.y[a:b] for a, b in zip(checked.offsets[:-1], checked.offsets[1:])]
    settings = (tol, max_iter, shrinking)

    def one_group(g):
        mine = np.flatnonzero(group == g).tolist()
        X = Xs[g]
        plan = None if alone[mine[0]] else _matrix_plan(kernel, X, cache_bytes, sgemm_min_rows)
        threads = matrix_threads(X.shape[0]) if jobs == 1 else 1
        if plan is not None:
            K = _make_matrix(kernel, X, plan, cache_bytes, threads)
            return mine, _dense_path(K, [idxs[w] for w in mine], [ys[w] for w in mine],
                                     [weights[w] for w in mine], [starts[w] for w in mine],
                                     Cs, X.shape[0], settings)
        out = []
        for w in mine:
            out.append(_alone_path(kernel, X, idxs[w], ys[w], weights[w], starts[w], Cs,
                                   cache_bytes, sgemm_min_rows, settings, threads))
        return mine, [list(col) for col in zip(*out)]

    results = [[None] * len(problems) for _ in Cs]
    groups = np.unique(group).tolist()
    jobs = part_threads(n_jobs, sizes)
    for mine, by_C in _in_threads(one_group, groups, jobs):
        for c, row in enumerate(by_C):
            for w, res in zip(mine, row):
                results[c][w] = res
    return results


def _dense_path(K, idxs, ys, weights, starts, Cs, n_rows, settings):
    """The problems of one group on its whole matrix ``K``, one compiled batch per C."""
    tol, max_iter, shrinking = settings
    sizes = [i.size for i in idxs]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    idx = np.concatenate(idxs)
    whole = np.array([i.size == n_rows and np.array_equal(i, np.arange(n_rows)) for i in idxs])
    y = np.concatenate(ys)
    which = np.arange(len(idxs), dtype=np.int64)
    alphas, by_C, previous = list(starts), [], None
    for C in Cs:
        bounds = [C * wt for wt in weights]
        if previous is not None:
            alphas = [seed_alpha(a, yw, b_old, b) for a, yw, b_old, b
                      in zip(alphas, ys, previous, bounds)]
        run = _DenseRun(whole, idx, Checked(offsets, y, np.concatenate(bounds),
                                            np.concatenate(alphas)), tol, max_iter, shrinking)
        run(K, which)
        row = run.results()
        by_C.append(row)
        alphas, previous = [r.alpha for r in row], bounds
    return by_C


def _alone_path(kernel, X, idx, y, weights, start, Cs, cache_bytes, sgemm_min_rows, settings,
                threads):
    """One problem alone along the path: its whole matrix when it is given or small, else
    its rows on demand, one :class:`~.rows.RowCache` for every C."""
    tol, max_iter, shrinking = settings
    n = y.size
    K, rows = None, None
    if kernel.name == "precomputed":
        K = np.ascontiguousarray(_dense(X)[np.ix_(idx, idx)])
    else:
        values = values_of(kernel, X[idx], sgemm_min_rows, WHOLE_MATRIX_MAX_ROWS)
        if n <= WHOLE_MATRIX_MAX_ROWS and n * n * values.dtype.itemsize <= cache_bytes:
            K = values.matrix(threads)
        else:
            rows = RowCache(values, cache_bytes, threads=threads)
    if K is not None:
        by_C = _dense_path(K, [np.arange(n)], [y], [weights], [start], Cs, n, settings)
        return [row[0] for row in by_C]
    out, alpha, previous = [], start, None
    for C in Cs:
        bounds = C * weights
        alpha = (alpha.copy() if previous is None
                 else seed_alpha(alpha, y, previous, bounds))
        status, n_iter, G = rows.solve(y, bounds, alpha, tol, max_iter, shrinking)
        out.append(result_of(y, bounds, alpha, G, n_iter, status))
        previous = bounds
    return out


def path_batch(problems, Cs) -> list:
    """The problems of a C path as one batch (:func:`gpuml.kernels.smo_solve_path` with
    ``one_launch``): every problem for ``Cs[0]``, then every problem for ``Cs[1]``, ...,
    each with its bounds for C = 1 times that C and its own ``alpha0`` (feasible for
    every C of an increasing path); the group of each copy is its problem's, so a batch
    solver makes each group's kernel values once for all of them.

    >>> import numpy as np
    >>> from gpuml.kernels import SMOProblem
    >>> one = SMOProblem(0, np.arange(2), np.array([-1.0, 1.0]), np.array([1.0, 2.0]))
    >>> [p.C.tolist() for p in path_batch([one], [0.5, 4.0])]
    [[0.5, 1.0], [4.0, 8.0]]
    """
    import dataclasses

    Cs = check_Cs(Cs)
    weights = [np.broadcast_to(np.asarray(to_numpy(p.C), dtype=np.float64), np.shape(p.y))
               for p in problems]
    return [dataclasses.replace(p, C=C * w) for C in Cs.tolist()
            for p, w in zip(problems, weights)]
