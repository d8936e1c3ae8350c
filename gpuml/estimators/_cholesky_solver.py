"""BKRR's part solver: each part's kernel ridge system, all parts in one batched Cholesky solve.

:class:`CholeskyPartSolver` is what :class:`~gpuml.estimators.bkrr_regressor.BKRRRegressor`
hands the partitioned fit (:mod:`gpuml.pipeline`): the kernel with its resolved
width, λ (or KernelRidge's ``alpha``) and the centring of the targets. Part
``j`` of ``m_j`` rows solves ``(K_j + lam * m_j * I) a_j = y_j`` (You 2020,
eq. 3.6, Alg 10 line 12) by :func:`gpuml.kernels.krr_solve_parts`, every part of
a batch at once; a part whose system the Cholesky factorisation refuses is
solved by least squares, with a warning, as ``KernelRidge`` does.
:class:`CholeskyCost` is what the parts cost: ``m^3/3 + m^2 d`` to place them,
their rows, targets and kernel block in memory.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .._backend import to_numpy
from ..distributed import cholesky_cost
from ..kernels import NotPositiveDefiniteError, krr_lstsq_part, krr_solve_parts, part_threads
from ..kernels.pairwise import Kernel
from ..pipeline import PartCost, PartSolver
from ._krr import KRRPartFit, _part_masses, _take, check_fit_memory, part_offsets, part_shifts


@dataclass
class CholeskyCost(PartCost):
    """What kernel ridge parts cost: ``m^3/3 + m^2 d`` each
    (:func:`gpuml.distributed.cholesky_cost`), their rows, targets and kernel block in
    memory (:func:`~gpuml.kernels.part_threads` blocks at a time on the CPU)."""

    name: str
    n_jobs: int | None = None

    def weights(self, sizes, n_features):
        return cholesky_cost(sizes, n_features)

    def part_bytes(self, sizes, n_features, itemsize):
        """Device bytes of each part solved alone: its rows, targets and kernel block."""
        sizes = np.asarray(sizes, dtype=np.int64)
        return sizes * (n_features + sizes + 2) * itemsize

    def worker_bytes(self, n_features, itemsize):
        """Bytes a worker holds to fit parts of given sizes: rows and targets, and the
        solve's kernel blocks (:func:`~gpuml.kernels.part_threads` at a time)."""

        def need(sizes):
            concurrent = part_threads(self.n_jobs, sizes)
            blocks = int((np.sort(sizes)[::-1][:concurrent].astype(np.float64) ** 2).sum())
            return int(itemsize * (sizes.sum() * (n_features + 2) + blocks))

        return need

    def check_device(self, sizes, itemsize, backend, *, n_samples=None, n_parts=None):
        check_fit_memory(self.name, self.n_jobs, sizes, itemsize, backend,
                         n_samples=n_samples, n_parts=n_parts)


@dataclass
class CholeskyPartSolver(PartSolver):
    """The kernel ridge system of each part (You 2020, eq. 3.6), solved in one batch.

    ``kernel`` has its γ resolved (``1 / (2 sigma^2)``, or the ``gamma``
    given); a part of ``m_j`` rows (with weights, of total weight ``m_j``) is
    shifted by ``lam * m_j``, or by ``alpha`` when given; ``fit_intercept``
    centres its targets on their mean. ``precomputed``: the rows are those of
    a kernel matrix (a part takes its block). ``kernel_param`` is the
    estimator's ``kernel``, named in warnings. The targets it takes are y, the
    weights the sample weights (None: none).
    """

    kernel: Kernel
    sigma: float
    lam: float
    alpha: float | None
    fit_intercept: bool
    precomputed: bool
    kernel_param: object
    n_jobs: int | None
    cost: CholeskyCost

    #: on Dask the parts (every training row) stay on the workers that fitted them
    keeps_parts_on_workers = True

    def solve(self, backend, X, targets, weights, part_rows, part_ids, progress=None):
        """``(K_j + lam*m_j*I) a_j = y_j`` for the given parts, one batch on ``backend``:
        one :class:`~gpuml.estimators._krr.KRRPartFit` per part, on that device.

        ``part_ids[k]`` names part k in warnings. A part whose system the Cholesky
        factorisation refuses (``lam=0`` with duplicate samples, the indefinite sigmoid
        kernel) is solved by least squares instead, with a warning, as ``KernelRidge``
        does.
        """
        xp = backend.xp
        X, y = backend.asarray(X), backend.asarray(targets)
        sample_weight = None if weights is None else backend.asarray(weights)
        parts = [_take(xp, X, idx) if not self.precomputed
                 else X[xp.asarray(idx)][:, xp.asarray(idx)] for idx in part_rows]
        targets = [_take(xp, y, idx) for idx in part_rows]
        weights = (None if sample_weight is None else
                   [_take(xp, sample_weight, idx) for idx in part_rows])
        offsets = part_offsets(xp, targets, weights, self.fit_intercept)
        targets = [t - b for t, b in zip(targets, offsets)]
        shifts = part_shifts(_part_masses(part_rows, weights), self.lam, self.alpha)
        kernel = self.kernel
        try:
            jobs = part_threads(self.n_jobs, [len(idx) for idx in part_rows])
            alphas = krr_solve_parts(kernel, parts, targets, shifts, n_jobs=jobs, weights=weights)
        except NotPositiveDefiniteError:
            alphas = []
            for k, (Xj, yj, shift) in enumerate(zip(parts, targets, shifts)):
                wj = None if weights is None else [weights[k]]
                try:
                    alphas += krr_solve_parts(kernel, [Xj], [yj], [shift], weights=wj)
                except NotPositiveDefiniteError:
                    warnings.warn(
                        f"Singular matrix in solving dual problem of part {int(part_ids[k])}: "
                        f"the system (K + shift*I) alpha = y is not positive definite (kernel="
                        f"{self.kernel_param!r}, shift={shift!r}; with lam=0 duplicate "
                        "samples do this, and the sigmoid kernel is not positive "
                        "semi-definite). Using least-squares solution instead, as "
                        "KernelRidge.", stacklevel=3)
                    alphas.append(krr_lstsq_part(kernel, Xj, yj, shift,
                                                 None if wj is None else wj[0]))
        return [KRRPartFit(Xj, a, b) for Xj, a, b in zip(parts, alphas, offsets)]

    def to_host(self, fit, X_part):
        # Only the coefficients come back: the training rows are on the host already.
        return KRRPartFit(X_part, to_numpy(fit.dual_coef), to_numpy(fit.intercept))

    def summary(self, fit):
        # What the client keeps of a part fitted on a Dask worker: its intercept, and its
        # arrays without rows (their dtypes and trailing shapes).
        return KRRPartFit(fit.X[:0], fit.dual_coef[:0], fit.intercept)
