"""Everything hardware-specific in gpuml lives in this package.

Estimators and partitioners call the functions exported here; each takes
arrays of either namespace (NumPy or CuPy) and dispatches to the numba loop
in ``_cpu`` or the CUDA code in ``_cuda``. Nothing outside this package
branches on the device.
"""

from __future__ import annotations

import numpy as np

from .._backend import is_cupy_array, to_numpy
from ._cpu.smo import SMOProblem, SMOResult
from .krr import (
    NotPositiveDefiniteError,
    available_bytes,
    cholesky_solve_batch,
    eigh_batch,
    gram_batch,
    krr_solve_parts,
)
from .pairwise import (
    KERNELS,
    Kernel,
    kernel_matrix,
    make_kernel,
    resolve_gamma,
    shifted_sq_distances,
    sq_distances,
    squared_norms,
)

__all__ = [
    "SMOProblem",
    "SMOResult",
    "smo_solve",
    "smo_solve_batch",
    "KERNELS",
    "NotPositiveDefiniteError",
    "available_bytes",
    "cholesky_solve_batch",
    "eigh_batch",
    "gram_batch",
    "krr_solve_parts",
    "Kernel",
    "fill_nearest_open",
    "kernel_matrix",
    "make_kernel",
    "resolve_gamma",
    "shifted_sq_distances",
    "sq_distances",
    "squared_norms",
]


def fill_nearest_open(D, counts, caps):
    """Assign each row of the distance block ``D`` to its nearest part with room left.

    A sequential greedy pass (seed 001, Alg 3 and 9): the order of rows
    matters, so it runs as one numba loop on the host; a device block is
    copied over once. ``counts`` (host int64) is updated in place. Returns the
    labels in ``D``'s namespace.
    """
    from ._cpu.partition import fill_nearest_open as _fill

    host = np.ascontiguousarray(to_numpy(D))
    labels = np.empty(host.shape[0], dtype=np.int64)
    _fill(host, counts, caps, labels)
    if is_cupy_array(D):
        import cupy

        return cupy.asarray(labels)
    return labels


def smo_solve_batch(kernel, Xs, problems, *, tol=1e-3, max_iter=-1, cache_size=1024.0,
                    shrinking=True, n_jobs=None):
    """Solve a batch of SVM dual problems (SMO with WSS2, seed 001 Alg 1), CPU or GPU.

    ``Xs`` is a list of matrices (all NumPy or all CuPy); each
    :class:`SMOProblem` names its matrix (``group``) and rows. Problems of one
    group share its kernel matrix when it fits in ``cache_size`` MB. On the
    CPU groups and problems run in ``n_jobs`` threads; on a GPU every problem
    is solved concurrently by one kernel launch. Returns one
    :class:`SMOResult` per problem, arrays in the namespace of ``Xs``.
    """
    cache_bytes = int(float(cache_size) * (1 << 20))
    if any(is_cupy_array(X) for X in Xs):
        from ._cuda.smo import solve_batch as _gpu

        return _gpu(kernel, Xs, problems, tol=tol, max_iter=max_iter, cache_bytes=cache_bytes,
                    shrinking=shrinking)
    from ._cpu.smo import solve_batch as _cpu

    return _cpu(kernel, Xs, problems, tol=tol, max_iter=max_iter, cache_bytes=cache_bytes,
                shrinking=shrinking, n_jobs=n_jobs)


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
        SMO steps at most (-1: no limit).
    cache_size : float
        Kernel-row cache in MB; the whole kernel matrix is computed at once when it fits.
    shrinking : bool
        LIBSVM's shrinking heuristic.
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
