"""Asy-GCD for the bias-free kernel SVM dual: what its CPU and CUDA halves share.

You 2020, chapter 4: Alg 13 (serial GCD) and Alg 14 (Asy-GCD) for

    min_a  1/2 a'Qa - e'a   s.t.  0 <= a_i <= C_i,   Q_ij = y_i y_j K(x_i, x_j)   (eq. 4.9)

:mod:`.cpu` runs it on CPU threads (numba, with :mod:`.atomics` and :mod:`gpuml.kernels.vexp`),
:mod:`.cuda` with ``gcd.cu`` on a GPU (CuPy); :func:`gpuml.kernels.gcd_solve_batch`
picks one by the arrays' namespace. This module holds what both take and return
(:class:`GCDProblem`, :class:`GCDResult`), the codes and constants both follow, the
default update cap and the stopping certificate; it imports neither numba nor CuPy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Kernel codes understood by :func:`.cpu.fill_column` and ``gcd.cu`` (names as
#: :mod:`gpuml.kernels.pairwise`).
KERNEL_CODES = {"linear": 0, "poly": 1, "rbf": 2, "sigmoid": 3, "precomputed": 4}

#: Floor on Q_ii, as LIBSVM's TAU: a non-positive diagonal (sigmoid kernel, zero rows of a
#: linear kernel) makes the one-variable problem unbounded, and the step then goes to a bound.
TAU = 1e-12

#: Values of the stop flag (``gcd.cu``'s ``STOP`` word, the CPU solver's ``C_STOP``): still
#: running, stopped on the certificate, stopped by the update cap (or the time limit).
#: The numba functions of :mod:`.cpu` compile them in as constants, and numba's disk cache
#: does not see a change made here: after changing one, touch ``cpu.py`` too.
RUNNING, CERTIFIED, CAPPED = 0, 1, 2


def default_max_updates(n: int) -> int:
    """The update cap when none is given: ``max(10**7, 100 n)``, LIBSVM's cap on SMO steps.

    A bound far above what any benchmark run needed (docs/asygcd.md) but that
    ends any run, so no solve can loop forever.
    """
    return max(10**7, 100 * int(n))


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
    worker_cpu_s : list of float, CPU seconds of each worker's thread (CPU; empty on a GPU).
        On a machine shared with other jobs the wall time says little; the busiest
        worker's CPU seconds bound what the solve takes on idle cores.
    """

    alpha: object
    objective: float
    max_violation: float
    n_updates: int
    converged: bool
    n_workers: int
    trace: list = field(default_factory=list)
    gradient: object = None
    worker_cpu_s: list = field(default_factory=list)


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


def max_violation(alpha, g, C) -> float:
    """The largest projected gradient over all variables (eq. 4.11)."""
    if alpha.shape[0] == 0:
        return 0.0
    return float(np.abs(alpha - np.clip(alpha - g, 0.0, C)).max())
