"""SMO for the kernel SVM dual with bias: what its CPU and CUDA halves share.

The problem (You 2020, eqs. 2.1-2.2, written as a minimisation like LIBSVM)::

    min_a  f(a) = 1/2 a^T Q a - e^T a,   Q_ij = y_i y_j K(x_i, x_j)
    s.t.   y^T a = 0,   0 <= a_i <= C_i

:mod:`.cpu` solves it with numba loops on the host, :mod:`.cuda` with ``smo.cu``
on a GPU (CuPy); :func:`gpuml.kernels.smo_solve_batch` picks one by the arrays'
namespace. This module holds what both take and return (:class:`SMOProblem`,
:class:`SMOResult`), the validation of a batch (:func:`check_flat`) and the
iteration cap (:func:`iteration_limit`); it imports neither numba nor CuPy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: With ``max_iter=-1`` a problem of n variables stops after ``max(ITER_CAP_MIN,
#: ITER_CAP_PER_VARIABLE * n)`` steps, LIBSVM's cap (Chang & Lin, "LIBSVM: a library for
#: support vector machines", 2011, Solver::Solve): rounding can keep a problem from ever
#: reaching the tolerance, and a solver that never returns is worse than one that says so.
ITER_CAP_MIN = 10_000_000
ITER_CAP_PER_VARIABLE = 100


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
        of You 2020's eq. 2.1 is its negative).
    gradient : ndarray of shape (n,)
        ``Q a - e`` at the solution (warm starts and diagnostics).
    converged : bool
        False when ``max_iter`` (or, with ``max_iter=-1``, LIBSVM's cap of
        ``max(10**7, 100 n)`` steps, see :func:`iteration_limit`) stopped the
        solver first.
    """

    alpha: np.ndarray
    intercept: float
    n_iter: int
    objective: float
    gradient: np.ndarray
    converged: bool


def iteration_limit(max_iter, n):
    """SMO steps allowed on a problem of ``n`` variables: ``max_iter``, or LIBSVM's cap for -1.

    The CPU and GPU solvers both stop there and report ``converged=False``.
    """
    if max_iter >= 0:
        return max_iter
    return max(ITER_CAP_MIN, ITER_CAP_PER_VARIABLE * n)


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


@dataclass
class Checked:
    """Validated problems laid end to end: problem ``w`` owns ``offsets[w]:offsets[w + 1]``."""

    offsets: np.ndarray
    y: np.ndarray
    C: np.ndarray
    alpha: np.ndarray


def check_flat(ys, Cs, alpha0s) -> Checked:
    """Validate many problems' labels, bounds and warm starts at once (float64 copies)."""
    ys = [np.asarray(v, dtype=np.float64) for v in ys]
    if any(v.ndim != 1 for v in ys):
        raise ValueError("y must be a 1-D array of -1 and +1")
    sizes = np.array([v.size for v in ys], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    y = np.concatenate(ys) if ys else np.zeros(0)
    if not np.all(np.abs(y) == 1.0):
        raise ValueError("y must be a 1-D array of -1 and +1")
    n_pos = np.add.reduceat((y > 0).astype(np.int64), offsets[:-1]) if y.size else sizes
    if np.any(sizes == 0) or np.any(n_pos == 0) or np.any(n_pos == sizes):
        raise ValueError("y must hold both classes (-1 and +1) for the SVM dual")
    Cs = [np.asarray(c, dtype=np.float64) for c in Cs]
    C = np.concatenate([c if c.shape == (n,) else np.broadcast_to(c, (n,))
                        for c, n in zip(Cs, sizes.tolist())])
    # C = +inf is the hard-margin SVM (no upper bound), which SVC accepts too.
    if np.any(np.isnan(C)) or np.any(C <= 0):
        raise ValueError("C must be positive (or +inf) for every sample")
    alpha = np.zeros_like(y)
    for w, alpha0 in enumerate(alpha0s):
        if alpha0 is None:
            continue
        a, b = offsets[w], offsets[w + 1]
        start = np.asarray(alpha0, dtype=np.float64)
        if start.shape != (b - a,):
            raise ValueError(f"alpha0 has shape {start.shape}, expected {(b - a,)}")
        yw, Cw = y[a:b], C[a:b]
        scale = max(1.0, float(Cw.max()))
        if (np.any(start < 0) or np.any(start > Cw)
                or abs(start @ yw) > 1e-8 * scale * yw.size):
            raise ValueError("alpha0 is infeasible: it needs 0 <= alpha0 <= C and "
                             "y @ alpha0 == 0")
        alpha[a:b] = start
    return Checked(offsets, y, C, alpha)
