r"""Balanced kernel ridge regression and its family (You 2020, chapter 3, Alg 6-11).

One estimator, :class:`BKRRRegressor`, covers the methods of the chapter as
settings: split the training set into P parts, solve one kernel ridge system
per part, and predict with the part whose centre is nearest (BKRR2, KKRR2)
or with the average of all parts (DC-KRR). :class:`BKRRRegressorCV` searches
σ and λ with one tridiagonal reduction (or eigendecomposition) per part and σ.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from joblib import effective_n_jobs
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.model_selection import check_cv
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from .._backend import (
    CPU,
    Backend,
    available_bytes,
    float_dtype,
    is_cupy_array,
    is_dask_collection,
    resolve,
    stack_rows,
    to_numpy,
    to_output,
)
from .._progress import Progress
from .._validation import check_n_partitions, refuse_dask, validate_X, validate_X_y
from ..distributed import cholesky_cost
from ..kernels import (
    NotPositiveDefiniteError,
    cholesky_solve_batch,
    compile_after_fit,
    gpu_solve_bytes,
    krr_lstsq_part,
    krr_solve_parts,
    tridiagonal_batch,
)
from ..kernels.krr import GPU_HEADROOM_BYTES
from ..pairwise import HOST_KERNELS, Kernel, PairwiseKernel, resolve_gamma, sq_distances
from ..partition import split
from ..pipeline import (
    FitData,
    PartitionedFit,
    dask_module,
    predict_on_devices,
    prediction_group,
    route_on_devices,
)
from ..routing import route
from ._partitioned import PARTITION_CONSTRAINTS, on_device

#: ``n_partitions="auto"`` makes parts of at most this many samples. Fit time
#: is ``P (n/P)^3`` and the error grows with P (bench/bench_bkrr.py, california_housing,
#: n = 18,432, one sigma/lam: parts of 2,304 gave test MSE 0.369 against exact KRR's
#: 0.312 at 39x less fit time; parts of 1,152 gave 0.472 at 124x). 2048 keeps one
#: part's float64 kernel block at 32 MiB and its solve well under a second per core.
AUTO_PART_SIZE = 2048

#: ``lam="auto"`` picks λ from this grid (1e-6 ... 1, half decades) by the closed-form
#: leave-one-out error of kernel ridge on a subsample of the training set. Below 1e-6 the
#: choice becomes unstable (rf1: LOO picked 1e-7, test R² 0.948 against 0.982 at 1e-6;
#: bench/bench_bkrr_defaults.py) and float32 solves fail.
AUTO_LAMS = tuple(float(v) for v in np.logspace(-6.0, 0.0, 13))
#: ... of at most this many rows (a fixed random subset): one eigendecomposition of
#: its kernel block, about 0.2 s on one CPU core for 1,000 rows.
AUTO_LAM_SAMPLES = 1000

#: Cost of reducing one part's kernel block, in Cholesky factorisations of that block:
#: LAPACK ``sytrd`` + one ``ormqr`` (Householder form, ``cv`` given on the CPU) and
#: ``syevd`` (eigen form: leave-one-out, and every GPU search). Measured on the shared
#: 2-core machine: sytrd + ormqr 3.3-4.2 units at m = 400 and 5.9 at m = 4,000; syevd 9-21
#: at m = 100-400 and 12.8 at m = 4,000 (docs/bkrr.md).
REDUCTION_COST = {"householder": 5.0, "eigen": 12.0}
#: Cost of one λ without a reduction, in the same units: one Cholesky factorisation, plus
#: for the leave-one-out diagonal the solve with m right-hand sides (two more).
CHOLESKY_COST = {"householder": 1.0, "eigen": 3.0}

_COMMON_CONSTRAINTS = {
    "degree": [Interval(Integral, 0, None, closed="left")],
    "coef0": [Interval(Real, None, None, closed="neither")],
    "n_partitions": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
    "partition": PARTITION_CONSTRAINTS["partition"],
    "combine": [StrOptions({"nearest", "average"})],
    "dtype": [StrOptions({"float32", "float64"}), None],
    "fit_intercept": ["boolean"],
    "device": [str],
    "n_jobs": [Integral, None],
    "random_state": ["random_state"],
}


def _n_partitions(n_partitions, n_samples: int) -> int:
    if n_partitions == "auto":
        return max(1, math.ceil(n_samples / AUTO_PART_SIZE))
    return check_n_partitions(n_partitions, n_samples)


def _r2_scores(y, preds):
    """``r2_score(y, preds[k])`` for every k at once (outputs averaged uniformly).

    The same numbers as scikit-learn's ``r2_score`` (a constant target gives
    1 for a perfect prediction, 0 otherwise; fewer than two samples give NaN)
    without its per-call validation, which costs more than one λ's solve here.
    """
    if y.shape[0] < 2:
        return np.full(preds.shape[0], np.nan)
    y = y.reshape(y.shape[0], -1)
    preds = preds.reshape(preds.shape[0], y.shape[0], -1)
    total = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
    residual = ((preds - y) ** 2).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = 1.0 - residual / total
    r2 = np.where(total == 0, np.where(residual == 0, 1.0, 0.0), r2)
    return r2.mean(axis=1)


def scale_gamma(X, sample_weight=None) -> float:
    """``1 / (n_features * X.var())``: scikit-learn's ``gamma="scale"`` (SVC), for any input.

    ``X.var()`` is the variance of all entries of ``X`` (dense or sparse,
    NumPy or CuPy); a constant ``X`` gives 1.0, as in SVC. With
    ``sample_weight`` each row counts its weight times (so weight 2 is the
    same as a repeated row, as everywhere else in the fit).
    """
    if sample_weight is None:
        return resolve_gamma("scale", X)
    p = sample_weight / sample_weight.sum()
    squares = X.multiply(X).mean(axis=1) if hasattr(X, "multiply") else (X * X).mean(axis=1)
    means = X.mean(axis=1)
    flat = (lambda a: a.ravel()) if not hasattr(X, "multiply") else (
        lambda a: a.A.ravel() if hasattr(a, "A") else a.ravel())
    var = float(p @ flat(squares)) - float(p @ flat(means)) ** 2
    return 1.0 / (X.shape[1] * var) if var > 0 else 1.0


def _weighted_mean(xp, y, w):
    """Mean of ``y`` over its rows, weighted by ``w`` (None: plain); 0 when all weights are 0."""
    if w is None:
        return y.mean(axis=0)
    total = w.sum()
    if float(total) == 0.0:
        return xp.zeros(y.shape[1:], dtype=y.dtype)
    return (w @ y if y.ndim == 2 else (w * y).sum()) / total


def _format_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _balanced_sizes(n: int, n_parts: int) -> np.ndarray:
    """Part sizes of a balanced split of n samples into P parts (as K-balance makes)."""
    return np.full(n_parts, n // n_parts, dtype=np.int64) + (np.arange(n_parts) < n % n_parts)


def _fitting_partitions(n: int, n_parts: int, fits) -> int | None:
    """The smallest P in (n_parts, n] with ``fits(P)``, by bisection; None if P = n does not fit.

    The need of balanced parts falls as P grows, except around the size where
    parts become small enough to be factored in batches on a GPU
    (:func:`gpuml.kernels.gpu_solve_plan`); there the bisection may return a
    larger P than the smallest, but never one that does not fit.
    """
    lo, hi = n_parts + 1, n
    if lo > n or not fits(n):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _gpu_search_bytes(sizes, itemsize: int) -> int:
    """Peak device bytes of :class:`BKRRRegressorCV` for parts of these sizes.

    All parts at once: their squared distances, their kernel blocks at one σ,
    the eigenvectors of each (``Tridiagonal.Q``) and ``Q * Q`` for the
    leave-one-out diagonal, four ``m_j^2`` arrays per part; plus ``syevd``'s
    copy and workspace for the largest block (about two more ``m^2``).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    blocks = 4 * int((sizes**2).sum()) + 2 * int(sizes.max()) ** 2
    return blocks * itemsize + GPU_HEADROOM_BYTES


@dataclass
class KRRPartFit:
    """The fitted local model of one part: training rows, dual coefficients, intercept.

    Arrays on the device that fitted the part (NumPy on the CPU); picklable.
    ``intercept`` is the (weighted) mean of the part's targets with
    ``fit_intercept=True``, zeros otherwise.
    """

    X: object
    dual_coef: object
    intercept: object


def _take(xp, A, idx):
    """Rows ``idx`` (host indices) of ``A`` on A's device."""
    return A[xp.asarray(idx)]


def auto_lam_rows(n: int, sample_weight=None) -> np.ndarray:
    """The rows ``lam="auto"`` searches λ on: every row (of positive weight), or
    :data:`AUTO_LAM_SAMPLES` of them drawn at random (a fixed draw: the same rows for every
    fit of the same data), ascending."""
    rows = (np.arange(n) if sample_weight is None
            else np.flatnonzero(to_numpy(sample_weight) > 0))
    if rows.size > AUTO_LAM_SAMPLES:
        rows = rows[np.sort(np.random.default_rng(0).choice(rows.size, AUTO_LAM_SAMPLES,
                                                             replace=False))]
    return rows


def _part_masses(part_rows, weights=None) -> list:
    """The size ``m_j`` of every part in the shift ``lam * m_j``: its rows, or its weight.

    Without weights, the row counts (ints). With ``weights`` (one array per
    part, on any device) the sum of the part's weights in float64, so that a
    row of integer weight w counts as w repeated rows; a part whose weights
    are all zero keeps its row count (its coefficients are zero whatever the
    shift, and a zero shift would make its system singular).
    """
    if weights is None:
        return [len(idx) for idx in part_rows]
    masses = [float(np.sum(to_numpy(w), dtype=np.float64)) for w in weights]
    return [m if m > 0 else len(idx) for m, idx in zip(masses, part_rows)]


class _BKRRBase(RegressorMixin, BaseEstimator):
    """Validation, partitioning, memory check, prediction and pickling shared by both."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        precomputed = getattr(self, "kernel", "rbf") == "precomputed"
        tags.input_tags.pairwise = precomputed
        tags.input_tags.sparse = not precomputed
        tags.target_tags.multi_output = True
        return tags

    def score(self, X, y, sample_weight=None):
        """R² of the predictions (scikit-learn's ``RegressorMixin.score``).

        On Dask input (``X``, ``y`` or ``sample_weight``: arrays, dataframes or
        series) the predictions are computed once, each block where it lies, and
        compared with its targets there: one pass over the rows.

        Parameters
        ----------
        X : array-like, sparse matrix or Dask collection of shape (n_samples, n_features)
        y : array-like or Dask collection of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like or Dask collection of shape (n_samples,), default=None

        Returns
        -------
        float
        """
        if any(is_dask_collection(v) for v in (X, y, sample_weight)):
            return dask_module().score(self, X, y, sample_weight)
        return super().score(X, y, sample_weight)

    # -- fitting helpers -------------------------------------------------
    def _prepare(self, X, y, backend=None):
        """Validated X, y on the computing device (or ``backend``) in the computing dtype."""
        backend = resolve(self.device, X, y) if backend is None else backend
        X, y = validate_X_y(self, X, y, y_numeric=True, multi_output=True)
        dtype = self._dtype(X)
        with backend.use():
            X = backend.asarray(X, dtype)
            y = backend.asarray(y, dtype)
        return backend, X, y

    def _dtype(self, X) -> np.dtype:
        """The computation dtype: ``dtype`` when given, else X's (float32 stays float32)."""
        return np.dtype(self.dtype) if self.dtype is not None else float_dtype(X)

    def _split(self, X):
        """Step 1 (Alg 9 for K-balance): the parts, their sample indices (host) and sizes."""
        return split(X, self._n_parts(X.shape[0]), self.partition, self.random_state)

    def _n_parts(self, n: int) -> int:
        """P for ``n`` samples: one part for a precomputed kernel (no features to split on)."""
        if getattr(self, "kernel", "rbf") == "precomputed":
            return 1
        return _n_partitions(self.n_partitions, n)

    def _memory_need(self, sizes, itemsize, backend, search=False) -> int:
        """Peak bytes of the solve (or of the σ/λ search) for parts of these sizes.

        CPU: ``n_jobs`` blocks of ``m_j^2`` live at once (each factored in
        place), three times over for the search. GPU: the solve's largest chunk
        (:func:`gpuml.kernels.gpu_solve_bytes`), or for the search
        :func:`_gpu_search_bytes`.
        """
        sizes = np.asarray(sizes, dtype=np.int64)
        if backend.is_gpu:
            return (_gpu_search_bytes if search else gpu_solve_bytes)(sizes, itemsize)
        concurrent = max(1, min(effective_n_jobs(self.n_jobs), sizes.size))
        blocks = int((np.sort(sizes)[::-1][:concurrent] ** 2).sum())
        return blocks * itemsize * (3 if search else 1)

    def _check_memory(self, sizes, itemsize, backend, *, search=False, n_samples=None,
                      n_parts=None):
        """Refuse, before allocating, a fit whose kernel blocks would not fit.

        ``sizes`` are the part sizes, or before partitioning ``[ceil(n / P)]``
        with ``n_samples=n, n_parts=P`` (no partition of n samples into P parts
        has a smaller largest part, so its need is a lower bound). The message
        says how much is needed and the smallest ``n_partitions`` whose balanced
        parts fit by the same estimate.
        """
        sizes = np.asarray(sizes, dtype=np.int64)
        n = int(sizes.sum() if n_samples is None else n_samples)
        n_parts = int(sizes.size if n_parts is None else n_parts)
        need = self._memory_need(sizes, itemsize, backend, search)
        avail = available_bytes(backend.xp)
        if need <= avail:
            return
        suggest = _fitting_partitions(
            n, n_parts, lambda P: self._memory_need(_balanced_sizes(n, P), itemsize, backend,
                                                    search) <= avail)
        if suggest is None:
            change = ("even one sample per part does not fit: free memory on the device "
                      "(other arrays, other processes) or fit on another device")
        else:
            change = f"use a larger n_partitions (n_partitions>={suggest} should fit)"
        if itemsize == 8:
            change += "; dtype='float32' needs about half"
        what = "its σ/λ search" if search else "its kernel blocks"
        raise MemoryError(
            f"{type(self).__name__} needs about {_format_bytes(need)} for {what} "
            f"({n_parts} part(s), largest {int(sizes.max())} samples) on {backend.device}, "
            f"but only {_format_bytes(avail)} is available; {change}"
        )

    def _check_before_split(self, n, itemsize, backend, *, search=False):
        """The memory check on the lower bound ``[ceil(n / P)]``, before any partitioning."""
        P = self._n_parts(n)
        self._check_memory([-(-n // P)], itemsize, backend, search=search, n_samples=n,
                           n_parts=P)

    def _kernel(self, gamma: float) -> Kernel:
        kernel = getattr(self, "kernel", "rbf")
        if callable(kernel) or kernel in HOST_KERNELS:
            return PairwiseKernel(kernel, gamma, int(self.degree), float(self.coef0),
                                  getattr(self, "kernel_params", None))
        kernel = "poly" if kernel == "polynomial" else kernel
        return Kernel(kernel, 1.0 if gamma is None else gamma, int(self.degree),
                      float(self.coef0))

    def _fit_gamma(self, sigma, n_features):
        """The kernel's gamma: ``1 / (2 sigma^2)``, or the ``gamma`` parameter when given.

        ``sigma`` is the resolved width (:meth:`_resolve_sigma`), which also
        carries ``gamma="scale"``.
        """
        gamma = getattr(self, "gamma", None)
        if gamma is None or gamma == "scale":
            return 1.0 / (2.0 * sigma**2)
        return 1.0 / n_features if gamma == "auto" else float(gamma)

    def _resolve_sigma(self, X, sample_weight=None) -> float:
        """σ as a number: ``sigma="scale"`` (or ``gamma="scale"``) from the training X.

        The rule is SVC's ``gamma = 1 / (n_features * X.var())``, so
        ``sigma = sqrt(n_features * X.var() / 2)``.
        """
        gamma = getattr(self, "gamma", None)
        if gamma == "scale" or (gamma is None and self.sigma == "scale"):
            if getattr(self, "kernel", "rbf") == "precomputed":
                return 1.0  # no features: the width is not used
            return 1.0 / math.sqrt(2.0 * scale_gamma(X, sample_weight))
        return 1.0 if self.sigma == "scale" else float(self.sigma)

    def _part_offsets(self, xp, targets, weights):
        """Each part's intercept: the (weighted) mean of its targets, or zeros.

        Per part rather than one global mean: each local model of BKRR2 then
        fits the deviation from its own region's mean, and DC-KRR averages the
        parts' means (bench/bench_bkrr_defaults.py measured both; docs/bkrr.md).
        """
        if not getattr(self, "fit_intercept", False):
            return [xp.zeros(t.shape[1:], dtype=t.dtype) for t in targets]
        return [_weighted_mean(xp, t, None if weights is None else weights[k])
                for k, t in enumerate(targets)]

    def _shifts(self, sizes, lam):
        """Each part's diagonal shift: ``lam * m_j`` (eq. 3.6), or ``alpha`` when given.

        ``sizes`` are the parts' sizes ``m_j``: row counts, or with
        ``sample_weight`` the parts' weights (:func:`_part_masses`).
        """
        alpha = getattr(self, "alpha", None)
        return [float(alpha) if alpha is not None else lam * m for m in sizes]

    def _fit_parts(self, backend, X, y, part_rows, sigma, lam, part_ids=None,
                   sample_weight=None) -> list[KRRPartFit]:
        """Step 2 for the given parts: ``(K_j + lam*m_j*I) a_j = y_j`` (eq. 3.6, Alg 10 line 12).

        ``X`` and ``y`` are on the current device, ``part_rows[k]`` the rows of
        the k-th part (``part_ids[k]`` names it in warnings). One batched solve
        for all of them; one :class:`KRRPartFit` per part, in order. A part
        whose system the Cholesky factorisation refuses (``lam=0`` with
        duplicate samples, the indefinite sigmoid kernel) is solved by least
        squares instead, with a warning, as ``KernelRidge`` does.
        """
        xp = backend.xp
        precomputed = getattr(self, "kernel", "rbf") == "precomputed"
        parts = [_take(xp, X, idx) if not precomputed else X[xp.asarray(idx)][:, xp.asarray(idx)]
                 for idx in part_rows]
        targets = [_take(xp, y, idx) for idx in part_rows]
        weights = (None if sample_weight is None else
                   [_take(xp, sample_weight, idx) for idx in part_rows])
        offsets = self._part_offsets(xp, targets, weights)
        targets = [t - b for t, b in zip(targets, offsets)]
        shifts = self._shifts(_part_masses(part_rows, weights), lam)
        kernel = self._kernel(self._fit_gamma(sigma, X.shape[1]))
        try:
            alphas = krr_solve_parts(kernel, parts, targets, shifts, n_jobs=self.n_jobs,
                                     weights=weights)
        except NotPositiveDefiniteError:
            alphas = []
            for k, (Xj, yj, shift) in enumerate(zip(parts, targets, shifts)):
                wj = None if weights is None else [weights[k]]
                try:
                    alphas += krr_solve_parts(kernel, [Xj], [yj], [shift], weights=wj)
                except NotPositiveDefiniteError:
                    which = k if part_ids is None else int(part_ids[k])
                    warnings.warn(
                        f"Singular matrix in solving dual problem of part {which}: the system "
                        f"(K + shift*I) alpha = y is not positive definite (kernel="
                        f"{self.kernel!r}, shift={shift!r}; with lam=0 duplicate samples do "
                        "this, and the sigmoid kernel is not positive semi-definite). Using "
                        "least-squares solution instead, as KernelRidge.",
                        stacklevel=3)
                    alphas.append(krr_lstsq_part(kernel, Xj, yj, shift,
                                                 None if wj is None else wj[0]))
        return [KRRPartFit(Xj, a, b) for Xj, a, b in zip(parts, alphas, offsets)]

    def _store_fit(self, backend, partitioning, fits, sigma, lam, sample_weight=None):
        """The fitted attributes from the per-part fits (in part order) and the centres.

        Called by the thread that called ``fit``, after every part is solved (one
        batched direct solve: no iteration, so no convergence to report): with
        ``verbose``, one line per part is printed here, in part order.
        ``sample_weight`` (the fit's, aligned with the rows the parts index)
        gives the parts' weighted sizes in the shifts.
        """
        progress = Progress("BKRR", len(fits), getattr(self, "verbose", 0))
        masses = (partitioning.sizes.tolist() if sample_weight is None else _part_masses(
            partitioning.parts, [to_numpy(sample_weight)[np.asarray(idx, dtype=np.int64)]
                                 for idx in partitioning.parts]))
        shifts = self._shifts(masses, lam)
        for j, (size, shift) in enumerate(zip(partitioning.sizes.tolist(), shifts)):
            progress.update(j, f"{size} rows, (K + {shift:.4g} I) a = y solved")
        progress.close()
        self.X_fit_ = stack_rows([f.X for f in fits])
        self.dual_coef_ = backend.xp.concatenate([f.dual_coef for f in fits])
        self.intercept_ = backend.xp.stack([backend.xp.asarray(f.intercept) for f in fits])
        self.centers_ = partitioning.centers
        self.part_sizes_ = partitioning.sizes
        self.part_offsets_ = np.concatenate([[0], np.cumsum(self.part_sizes_)])
        self.n_partitions_ = int(len(partitioning.parts))
        self.gamma_ = self._fit_gamma(sigma, self.n_features_in_)
        self.sigma_ = (float(sigma) if getattr(self, "gamma", None) in (None, "scale")
                       else 1.0 / math.sqrt(2.0 * self.gamma_))
        alpha = getattr(self, "alpha", None)
        total = (sum(masses) if sample_weight is None
                 else float(np.sum(to_numpy(sample_weight), dtype=np.float64)))
        self.lam_ = float(lam) if alpha is None else float(alpha) / total
        self.shifts_ = np.array(shifts)
        self.device_ = backend.device

    # -- prediction --------------------------------------------------------
    def _fitted_backend(self) -> Backend:
        if self.device_ == "cpu":
            return CPU
        return resolve(self.device_)

    def _predict_parts(self, X, backend):
        """Step 3: route each row to its part's model, or average all models (DC-KRR)."""
        xp = backend.xp
        kernel = self._kernel(self.gamma_)
        out_shape = (X.shape[0],) + tuple(self.dual_coef_.shape[1:])
        out = xp.zeros(out_shape, dtype=self.dual_coef_.dtype)
        bounds = self.part_offsets_
        if self.combine == "average":
            for j in range(self.n_partitions_):
                lo, hi = bounds[j], bounds[j + 1]
                out += kernel.dot(X, self.X_fit_[lo:hi], self.dual_coef_[lo:hi])
            out /= self.n_partitions_
            out += self.intercept_.mean(axis=0)
            return out
        labels = route(X, self.centers_)
        for j in range(self.n_partitions_):
            rows = np.flatnonzero(labels == j)
            if rows.size == 0:
                continue
            lo, hi = bounds[j], bounds[j + 1]
            Xj = _take(xp, X, rows)
            out[xp.asarray(rows)] = kernel.dot(
                Xj, self.X_fit_[lo:hi], self.dual_coef_[lo:hi]) + self.intercept_[j]
        return out

    def _part_on_device(self, backend, j):
        """Part ``j``'s training rows and coefficients on ``backend`` (cached for GPUs)."""
        lo, hi = self.part_offsets_[j], self.part_offsets_[j + 1]

        def upload():
            return backend.asarray(self.X_fit_[lo:hi]), backend.asarray(self.dual_coef_[lo:hi])

        return on_device(self, backend, ("part", j), upload)

    def _host_intercepts(self):
        """``intercept_`` on the host (one row per part)."""
        return to_numpy(self.intercept_)

    def _predict_on_devices(self, group, X):
        """Step 3 on the devices of the fit: rows to their part's device, or all parts summed."""
        kernel = self._kernel(self.gamma_)
        if self.combine == "average":
            def partial_sum(rank, backend):
                ids = np.flatnonzero(self.part_device_ == rank).tolist()
                if not ids:
                    return None
                Xd = backend.asarray(X)
                total = None
                for j in ids:
                    value = kernel.dot(Xd, *self._part_on_device(backend, j))
                    total = value if total is None else total + value
                return to_numpy(total)

            out = None
            for value in group.run(partial_sum):
                if value is not None:
                    out = value if out is None else out + value
            return out / self.n_partitions_ + self._host_intercepts().mean(axis=0)

        def predict_local(backend, Xd, parts):
            out = backend.xp.empty((Xd.shape[0],) + tuple(self.dual_coef_.shape[1:]),
                                   dtype=self.dual_coef_.dtype)
            intercepts = self._host_intercepts()
            for j in np.unique(parts).tolist():
                sel = backend.asarray(np.flatnonzero(parts == j))
                out[sel] = kernel.dot(_take(backend.xp, Xd, sel),
                                      *self._part_on_device(backend, j)) + intercepts[j]
            return out

        owner = route_on_devices(group, X, self.centers_)
        return predict_on_devices(group, X, owner, self.part_device_, predict_local)

    def _predict(self, X):
        """Predictions in the model's dtype; float32 for float32 input (float32 in, float32 out)."""
        check_is_fitted(self, "dual_coef_")
        group = prediction_group(getattr(self, "devices_", None))
        like = X
        X = validate_X(self, X, reset=False)
        single = X.dtype == np.float32
        if group is not None:
            X = CPU.asarray(X, self.X_fit_.dtype)
            out = self._predict_on_devices(group, X)
        else:
            backend = self._fitted_backend()
            with backend.use():
                X = backend.asarray(X, self.X_fit_.dtype)
                out = self._predict_parts(X, backend)
        if single and out.dtype != np.float32:
            out = out.astype(np.float32)
        return to_output(out, like)

    # -- pickling: fitted device arrays travel as NumPy ---------------------
    def __getstate__(self):
        # Device copies for multi-device prediction are a cache, not part of the model.
        state = {k: v for k, v in super().__getstate__().items() if k != "_device_cache"}
        return {k: (to_numpy(v) if is_cupy_array(v) else v) for k, v in state.items()}

    def __setstate__(self, state):
        # Back onto the fitting GPU when it is there; on the CPU otherwise.
        device = state.get("device_")
        if device not in (None, "cpu"):
            try:
                backend = resolve(device)
            except RuntimeError:
                backend = CPU
            state = dict(state, device_=backend.device)
            if backend.is_gpu:
                with backend.use():
                    state.update({k: backend.asarray(state[k])
                                  for k in ("X_fit_", "dual_coef_", "centers_", "intercept_")
                                  if k in state})
        super().__setstate__(state)


class BKRRRegressor(PartitionedFit, _BKRRBase):
    r"""Balanced kernel ridge regression (BKRR2) and its family, as settings.

    The training set is split into P parts; part ``j`` (``m_j`` samples)
    gets its own kernel ridge model by solving (You 2020, eq. 3.6)

    .. math:: (K_j + \lambda\, m_j\, I)\, \alpha_j = y_j,
              \qquad K_j[a, b] = \exp(-\lVert x_a - x_b\rVert^2 / (2\sigma^2)),

    by Cholesky (the system is SPD), ``y_j`` centred on the part's mean
    (``fit_intercept=True``, added back at prediction). A new sample is
    predicted by the model of its nearest part centre, or by the average of
    all P models.

    **Defaults.** ``BKRRRegressor()`` adapts to the data: the kernel width
    follows scikit-learn's ``gamma="scale"`` (``sigma="scale"``), λ is picked
    by closed-form leave-one-out on a subsample (``lam="auto"``), and y is
    centred. As with ``SVC`` and ``KernelRidge``, X is not standardised
    inside: put a ``StandardScaler`` first when the features have different
    units (``sigma="scale"`` follows the variance of all of X, so one feature
    in the thousands swamps the others). On diabetes, california housing and
    rf1 the defaults are within 0.05 R² of a ``GridSearchCV``-tuned
    ``KernelRidge`` on standardised features
    (``bench/results/cpu-2core/bkrr_defaults.md``).

    ====================================================  ============================
    setting                                               method of You 2020
    ====================================================  ============================
    ``partition="kbalance", combine="nearest"``           BKRR2 (Alg 9 + Alg 10)
    ``partition="kmeans", combine="nearest"``             KKRR2
    ``partition="random", combine="average"``             DC-KRR (Alg 8)
    ``n_partitions=1``                                    exact KRR / DKRR (Alg 6)
    ====================================================  ============================

    ``partition="random", combine="nearest"`` is allowed: it routes to the
    nearest centre of random parts, whose centres all lie near the data mean,
    so the routing is close to arbitrary — a baseline, not a method to use.

    **Mapping to scikit-learn.** With ``n_partitions=1`` (one part of
    ``m = n`` samples) and the Gaussian kernel, this is exactly
    ``sklearn.kernel_ridge.KernelRidge(alpha=lam * n, kernel="rbf",
    gamma=1 / (2 * sigma**2))`` (``alpha=lam * sum(sample_weight)`` for a
    weighted fit); with P parts each part is that model with
    ``alpha = lam * m_j``, fitted on ``y - y.mean()`` (``fit_intercept=False``:
    on y itself, as KernelRidge). ``KernelRidge(alpha=a, kernel=k, gamma=g,
    degree=d, coef0=c, kernel_params=p)`` itself maps, argument for argument and
    without knowing n, to ``BKRRRegressor(alpha=a, kernel=k, gamma=g or
    "auto", degree=d, coef0=c, kernel_params=p, fit_intercept=False,
    n_partitions=1)``: the paper's
    ``lam`` is normalised by the part size (eq. 3.6), KernelRidge's ``alpha``
    is not, and a constructor does not know n yet, hence the ``alpha`` and
    ``gamma`` alternatives to ``lam`` and ``sigma``.

    Parameters
    ----------
    kernel : str or callable, default="rbf"
        Kernel function (You 2020, Table 3.1): "rbf", "linear", "poly" (or
        "polynomial") and "sigmoid" run on any device. For "poly" and
        "sigmoid" the inner-product scale is also ``gamma = 1 / (2 sigma^2)``
        (the one scale parameter); "linear" ignores ``sigma``. The sigmoid
        kernel is not positive semi-definite: a part whose system the
        Cholesky factorisation refuses is solved by least squares, with a
        warning (as KernelRidge). "precomputed": ``X`` is the training kernel
        matrix in ``fit`` and ``K(X_test, X_train)`` in ``predict`` (one part
        only, since partitioning needs features). KernelRidge's other kernels
        ("laplacian", "chi2", "additive_chi2", "cosine") and callables are
        computed by scikit-learn's ``pairwise_kernels`` on the CPU.
    sigma : float > 0 or "scale", default="scale"
        Gaussian kernel width σ. ``"scale"``: scikit-learn's ``gamma="scale"``
        of ``SVC``, ``gamma = 1 / (n_features * X.var())`` with ``X.var()``
        the variance of all entries of the training X (rows weighted by
        ``sample_weight``), i.e.
        ``sigma = sqrt(n_features * X.var() / 2)`` (``sigma_`` and ``gamma_``
        hold the value; a constant X gives gamma 1). Measured against
        0.1-4× that gamma at each one's best λ, 1× is within 0.01 R² of the
        best on california and rf1 and 0.04 on diabetes (which prefers a
        wider, nearly linear kernel), so SVC's rule is kept as it is.
    lam : float >= 0 or "auto", default="auto"
        Regularisation λ; each part's system is shifted by ``lam * m_j``.
        With ``sample_weight``, ``m_j`` is the part's total weight (a part
        whose weights are all zero keeps its row count), so that a row of
        integer weight w is w repeated rows and, at a given λ, scaling all
        weights by one factor leaves the model unchanged.
        ``"auto"``: the λ of :data:`AUTO_LAMS` (1e-6 ... 1) with the smallest
        closed-form leave-one-out error of kernel ridge on
        :data:`AUTO_LAM_SAMPLES` (1,000) rows of the training set (a fixed
        random subset; all rows below that), at the fitted σ and centring —
        one eigendecomposition of a 1,000 x 1,000 kernel block. With
        ``sample_weight`` the criterion is that of the rows repeated (each
        row leaves out one unit of its weight, the whole row when that is
        below one; :meth:`_auto_lam_losses`) on rows of positive weight, so
        integer weights choose the λ of the repeated rows whenever those
        number at most 1,000 (no subsample on either side). No fixed λ
        serves all three benchmark sets: noisy diabetes needs 1e-2 (R² 0.34;
        -0.04 at 1e-4), california and rf1 1e-4 or less (0.65 and 0.88 at
        1e-2). ``lam_`` holds the chosen value. With ``lam=0`` a part whose
        kernel block is singular (duplicate samples) is solved by least
        squares, with a warning, as KernelRidge does with ``alpha=0``.
    fit_intercept : bool, default=True
        Centre each part's targets on their (``sample_weight``-weighted) mean
        before its solve and add that mean back to the part's predictions
        (``intercept_``); with ``combine="average"`` the parts' means are
        averaged too. Per part rather than one global mean: at P = 16 on
        california and rf1 the two are equal for DC-KRR and per part is as
        good or better for BKRR2 (bench/results/cpu-2core/bkrr_defaults.md).
        ``False``: no centring, exactly ``KernelRidge``; a target far from 0
        (rf1's flows average 160) then costs accuracy wherever the kernel
        decays away from the training data.
    degree : int, default=3
        Degree of the polynomial kernel.
    coef0 : float, default=1.0
        Offset ``r`` of the polynomial and sigmoid kernels.
    n_partitions : int or "auto", default="auto"
        Number of parts P. ``"auto"`` makes parts of at most
        :data:`AUTO_PART_SIZE` (2048) samples, ``ceil(n / 2048)`` parts (one
        part, exact KRR, below 2049 samples). Must not exceed ``n_samples``.
    partition : {"kbalance", "kmeans", "random", "contiguous", "fcfs", "bkm"}, \
default="kbalance"
        Partitioner (:mod:`gpuml.partition`). ``"contiguous"``: part j is the
        j-th run of consecutive rows, a random split (DC-KRR's) for rows in
        random order that moves no rows between Dask workers.
    combine : {"nearest", "average"}, default="nearest"
        ``"nearest"``: each sample is predicted by the model of its nearest
        part centre (BKRR2, KKRR2). ``"average"``: the mean of all P models'
        predictions (DC-KRR).
    dtype : {"float64", "float32"} or None, default=None
        Computation dtype. None follows X: float32 X is fitted in float32,
        anything else in float64 (float32 in, float32 out: ``predict``
        returns float32 for float32 input whatever the model's dtype, the
        model's dtype otherwise).
        float32 halves memory and is faster on GPUs, but the Cholesky solve
        loses about ``cond(K + lam*m*I) * 6e-8`` relative accuracy: expect
        around 1e-3 relative differences from float64 with ``lam*m`` near
        1e-2, and failures (a clear error) when ``lam*m`` is below ~1e-6.
    device : {"auto", "cpu", "cuda"} or "cuda:N", default="auto"
        Where to fit. On a GPU equal-size parts form one batched kernel GEMM;
        small blocks are then factored together by one batched Cholesky, large
        ones (exact KRR's one block) by one in-place cuSOLVER ``potrf`` each
        (:func:`gpuml.kernels.gpu_solve_plan`). A fit whose blocks would not
        fit in the device's free memory is refused before it starts, with the
        ``n_partitions`` that would fit.
    devices : None, "all" or list, default=None
        Several devices (docs/scale-out.md). None: one device, ``device``.
        ``"all"``: every GPU; or a list of GPU ids / ``"cuda:N"`` names. The
        rows are sharded over the devices for partitioning (the Lloyd steps'
        sums through NCCL), the parts placed on the devices balanced by their
        ``m^3/3 + m^2 d`` cost, each device solves its parts in one batch in its
        own host thread (each checked against that device's free memory first),
        and prediction sends each row to its part's device (with
        ``combine="average"`` every device sums its parts' predictions). The
        fitted arrays are gathered on the host (``device_ == "cpu"``); each
        device keeps a copy of its parts for prediction. A list of ``"cpu"``
        entries runs that many CPU ranks (threads of this process) through
        the same code: for trying a multi-device setup without GPUs, not for
        speed. Leave ``device="auto"`` when giving ``devices``.
    n_jobs : int or None, default=None
        Threads over parts on the CPU (joblib); each part's LAPACK call is
        itself multi-threaded by BLAS.
    random_state : int, RandomState or None, default=None
        Seeds the partitioner.
    alpha : float >= 0 or None, default=None
        KernelRidge's regularisation: when given, every part's system is
        ``(K_j + alpha I) a_j = y_j`` and ``lam`` is ignored. It lets
        ``KernelRidge(alpha=...)`` map onto this class without knowing n
        (``alpha = lam * n`` for one part).
    gamma : float > 0, "scale", "auto" or None, default=None
        KernelRidge's kernel coefficient: when given, it replaces
        ``1 / (2 sigma^2)`` (and ``sigma`` is ignored); "auto" is
        ``1 / n_features``, KernelRidge's ``gamma=None``; "scale" is SVC's
        rule, the same as ``sigma="scale"``.
    kernel_params : dict or None, default=None
        Keyword arguments of a callable kernel, as KernelRidge's.
    verbose : int, default=0
        When positive, print one line per part (its rows and diagonal shift)
        once the parts are solved, from the thread that called ``fit``.

    Attributes
    ----------
    X_fit_ : array of shape (n_samples, n_features)
        Training samples, grouped part by part, on the fitting device (on the
        host after a fit with ``devices``).
    dual_coef_ : array of shape (n_samples,) or (n_samples, n_targets)
        The α of every part, aligned with ``X_fit_``.
    centers_ : array of shape (n_partitions_, n_features)
        Part centres (nearest-centre routing).
    part_sizes_ : ndarray of shape (n_partitions_,)
    part_offsets_ : ndarray of shape (n_partitions_ + 1,)
        Part ``j`` is ``X_fit_[part_offsets_[j]:part_offsets_[j + 1]]``.
    n_partitions_ : int
    intercept_ : array of shape (n_partitions_,) or (n_partitions_, n_targets)
        Each part's intercept: the mean of its targets (zeros with
        ``fit_intercept=False``).
    sigma_, lam_, gamma_ : float
        The fitted σ, λ, and ``gamma_ = 1 / (2 sigma_^2)`` (``"scale"`` and
        ``"auto"`` resolved). With ``alpha`` given, ``lam_ = alpha /
        n_samples`` (one part's λ; the total of ``sample_weight`` in place of
        ``n_samples`` when weighted); with ``gamma`` given, ``sigma_ = 1 /
        sqrt(2 gamma_)``.
    shifts_ : ndarray of shape (n_partitions_,)
        The diagonal shift of every part's system (``lam * m_j`` or ``alpha``).
    device_ : str
        Device holding the fitted arrays. A model fitted on a GPU pickles its
        arrays as NumPy; unpickled where that GPU exists they go back to it,
        elsewhere the model loads on the CPU and predicts there.
    devices_ : tuple of str
        Only after a fit with ``devices``: the devices, in rank order.
    part_device_ : ndarray of shape (n_partitions_,)
        Only after a fit with ``devices``: the index in ``devices_`` of the
        device each part was fitted on and predicts on.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when ``X`` had string feature names.

    References
    ----------
    Yang You, "Fast and Accurate Machine Learning on Distributed Systems and
    Supercomputers", PhD thesis, UC Berkeley, 2020, chapter 3: Alg 6 (KRR), Alg 8
    (DC-KRR), Alg 9 (K-balance), Alg 10 (BKRR2), eq. 3.6.
    Y. Zhang, J. Duchi, M. Wainwright, "Divide and conquer kernel ridge
    regression", COLT 2013.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.datasets import load_diabetes
    >>> from gpuml.estimators.bkrr import BKRRRegressor
    >>> X, y = load_diabetes(return_X_y=True)
    >>> model = BKRRRegressor(device="cpu").fit(X, y)  # all defaults
    >>> bool(np.isclose(model.gamma_, 1 / (X.shape[1] * X.var())))  # sigma="scale"
    True
    >>> model.lam_, round(float(model.intercept_[0]), 1)  # lam="auto", centred y
    (0.01, 152.1)
    >>> model = BKRRRegressor(sigma=0.2, lam=1e-4, n_partitions=4, device="cpu",
    ...                       random_state=0).fit(X, y)
    >>> model.part_sizes_.tolist()
    [111, 111, 110, 110]
    >>> round(model.score(X, y), 2) > 0.5
    True
    >>> model.predict(X[:2].astype(np.float32)).dtype  # float32 in, float32 out
    dtype('float32')
    """

    _parameter_constraints = {
        "kernel": [StrOptions({"rbf", "linear", "poly", "polynomial", "sigmoid", "precomputed",
                               *HOST_KERNELS}), callable],
        "sigma": [Interval(Real, 0.0, None, closed="neither"), StrOptions({"scale"})],
        "lam": [Interval(Real, 0.0, None, closed="left"), StrOptions({"auto"})],
        **_COMMON_CONSTRAINTS,
        "devices": PARTITION_CONSTRAINTS["devices"],
        "alpha": [Interval(Real, 0.0, None, closed="left"), None],
        "gamma": [Interval(Real, 0.0, None, closed="neither"), StrOptions({"auto", "scale"}),
                  None],
        "kernel_params": [dict, None],
        "verbose": ["verbose"],
    }

    def __init__(self, kernel="rbf", sigma="scale", lam="auto", fit_intercept=True, degree=3,
                 coef0=1.0, n_partitions="auto", partition="kbalance", combine="nearest",
                 dtype=None, device="auto", devices=None, n_jobs=None, random_state=None,
                 alpha=None, gamma=None, kernel_params=None, verbose=0):
        self.kernel = kernel
        self.sigma = sigma
        self.lam = lam
        self.fit_intercept = fit_intercept
        self.degree = degree
        self.coef0 = coef0
        self.n_partitions = n_partitions
        self.partition = partition
        self.combine = combine
        self.dtype = dtype
        self.device = device
        self.devices = devices
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.alpha = alpha
        self.gamma = gamma
        self.kernel_params = kernel_params
        self.verbose = verbose

    def _host_only(self) -> bool:
        return callable(self.kernel) or self.kernel in HOST_KERNELS

    @compile_after_fit
    def fit(self, X, y, sample_weight=None):
        """Partition, then solve one kernel ridge system per part.

        Parameters
        ----------
        X : array-like or sparse CSR of shape (n_samples, n_features)
            NumPy, pandas, SciPy CSR or CuPy. With ``kernel="precomputed"``
            the (n_samples, n_samples) kernel matrix (left untouched).
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : float or array-like of shape (n_samples,), default=None
            Weights of the samples' squared errors, as KernelRidge's: each
            part solves ``(S K_j S + shift I) b = S y`` with
            ``S = diag(sqrt(w))`` and keeps ``a = S b``. A weight counts as
            that many copies of the row everywhere: in the shift
            ``lam * m_j`` (``m_j`` the part's total weight), ``sigma="scale"``
            and ``lam="auto"``. With one part, integer weights therefore give
            the fit on the rows repeated; with several, the repeated rows
            could fall in different parts.

        Returns
        -------
        self
        """
        self._validate_params()
        return self._fit_partitioned(X, y, sample_weight)

    # -- the steps of the partitioned fit (gpuml.pipeline.PartitionedFit) ---------------
    def _fit_device(self):
        return "cpu" if self._host_only() else self.device

    def _check_fit(self, executor, sample_weight=None):
        """Settings that some executors cannot run, refused before any work."""
        if self.kernel == "precomputed" and self.n_partitions not in (1, "auto"):
            raise ValueError("kernel='precomputed' needs n_partitions=1 (or 'auto'): "
                             "partitioning and nearest-centre routing need the samples' "
                             "features")
        if executor.where == "devices" and self.kernel == "precomputed":
            raise ValueError("kernel='precomputed' fits on one device: use devices=None")
        if self._host_only() and (executor.where == "devices"
                                  or self.device not in ("auto", "cpu")):
            raise ValueError(f"kernel={self.kernel!r} is computed by scikit-learn's "
                             "pairwise_kernels on the CPU: use device='cpu' (or 'auto') and "
                             "devices=None")
        if executor.where == "dask":
            if sample_weight is not None:
                raise ValueError("sample_weight is not supported on Dask input for "
                                 "BKRRRegressor yet: fit on in-memory data, or without "
                                 "weights")
            if self.kernel == "precomputed":
                raise ValueError("kernel='precomputed' does not run on Dask input: "
                                 "partitioning and routing need the samples' features")
            if self.devices is not None:
                raise ValueError("devices= is for several devices of one process; on Dask "
                                 "each worker fits its parts on its own device: leave "
                                 "devices=None")

    def _validate(self, X, y, sample_weight, backend) -> FitData:
        """KernelRidge's checks of in-memory input; X, y and the weights on ``backend``."""
        backend, X, y = self._prepare(X, y, backend)
        sample_weight = self._sample_weight(backend, sample_weight, X)
        precomputed = self.kernel == "precomputed"

        def take(rows):
            idx = backend.xp.asarray(rows)
            return (X[idx][:, idx] if precomputed else _take(backend.xp, X, rows),
                    _take(backend.xp, y, rows),
                    None if sample_weight is None else _take(backend.xp, sample_weight, rows))

        return FitData(X, int(X.shape[0]), int(X.shape[1]), targets=y, weights=sample_weight,
                       stats=X, backend=backend, extra={"_take": take,
                                                        "itemsize": X.dtype.itemsize})

    def _check_fit_memory(self, sizes, data, backend, n_samples=None, n_parts=None):
        self._check_memory(sizes, data.extra["itemsize"], backend, n_samples=n_samples,
                           n_parts=n_parts)

    def _setup(self, data):
        """σ (``"scale"``: from the data) and λ (``"auto"``: searched on a subsample)."""
        sigma = self._resolve_sigma(data.stats, data.weights)
        rows = auto_lam_rows(data.n, data.weights)
        X, y, w = data.extra["_take"](rows) if self.lam == "auto" else (None, None, None)
        backend = data.backend or CPU
        with backend.use():
            lam = self._resolve_lam(backend, X, y, w, sigma)
        data.extra["sigma"], data.extra["lam"] = sigma, lam

    def _split_method(self) -> str:
        return self.partition

    #: what the part solver reads of the fitted attributes (none: σ and λ travel with the data)
    _part_solver_reads = ()

    def _chunk_dtype(self, X):
        return self._dtype(X)

    def _chunk_targets(self, y, sample_weight):
        return y, sample_weight

    def _worker_memory_need(self, n_features, dtype):
        """Bytes a worker holds to fit parts of given sizes: rows and targets, and the
        solve's kernel blocks (``n_jobs`` at a time)."""
        jobs = effective_n_jobs(self.n_jobs)
        itemsize = np.dtype(dtype).itemsize

        def need(sizes):
            concurrent = max(1, min(jobs, sizes.size))
            blocks = int((np.sort(sizes)[::-1][:concurrent].astype(np.float64) ** 2).sum())
            return int(itemsize * (sizes.sum() * (n_features + 2) + blocks))

        return need

    def _part_costs(self, sizes, n_features):
        return cholesky_cost(sizes, n_features)

    def _solve_parts(self, backend, data, X, targets, weights, part_rows, part_ids):
        return self._fit_parts(backend, backend.asarray(X), backend.asarray(targets), part_rows,
                               data.extra["sigma"], data.extra["lam"], part_ids=part_ids,
                               sample_weight=None if weights is None
                               else backend.asarray(weights))

    def _part_to_host(self, fit, X_part):
        # Only the coefficients come back: the training rows are on the host already.
        return KRRPartFit(X_part, to_numpy(fit.dual_coef), to_numpy(fit.intercept))

    def _keep_on_device(self, backend, j, fit):
        # The part's arrays are on its device already: keep them for prediction there.
        on_device(self, backend, ("part", j), lambda: (fit.X, fit.dual_coef))

    def _assemble(self, partitioning, result, data):
        self._store_fit(result.backend, partitioning, result.fits, data.extra["sigma"],
                        data.extra["lam"], data.weights)

    def _resolve_lam(self, backend, X, y, sample_weight, sigma) -> float:
        """λ as a number: ``lam="auto"`` by leave-one-out on a subsample (else ``lam``).

        The λ of :data:`AUTO_LAMS` with the smallest leave-one-out loss
        (:meth:`_auto_lam_losses`). With ``alpha`` given, λ is not used and not
        searched.
        """
        if self.lam != "auto":
            return float(self.lam)
        if getattr(self, "alpha", None) is not None:
            return 0.0
        lams = np.asarray(AUTO_LAMS)
        loss = self._auto_lam_losses(backend, X, y, sample_weight, sigma, lams)
        return float(lams[int(np.argmin(loss))])

    def _auto_lam_losses(self, backend, X, y, sample_weight, sigma, lams):
        r"""The leave-one-out loss of kernel ridge at every λ of ``lams`` (host, inf if not finite).

        Kernel ridge on at most :data:`AUTO_LAM_SAMPLES` rows (a fixed random
        subset, the same for every fit of the same data; with
        ``sample_weight``, of the rows of positive weight), at the fitted σ and
        centring, with every λ scaled as in eq. 3.6: shift ``c = lam * m``, m
        the subsample's size. One eigendecomposition of its kernel block gives
        every λ at O(m^2) each (G. Wahba, "Spline Models for Observational
        Data", 1990; R. Rifkin, R. Lippert, "Notes on regularized least
        squares", 2007).

        Without weights, ``a = (K + c I)^{-1} y``, ``e_i = a_i / [(K + c
        I)^{-1}]_ii`` and the loss is ``sum_i e_i^2``, each target's divided
        by its variance.

        With weights ``w`` the rule is that of the rows repeated: a row of
        integer weight w counts as w rows, so m is the subsample's total
        weight ``sum_i w_i``, the loss ``sum_i w_i e_i^2`` divided by the
        weighted variance, and ``e_i`` is the residual at row i of the model
        fitted without one unit of its weight. With ``S = diag(sqrt w)``,
        ``b = (S K S + c I)^{-1} S y`` and ``g_i = [(S K S + c I)^{-1}]_ii``,
        the weighted fit's residual is ``y_i - f_i = c b_i / s_i`` and its hat
        matrix's diagonal ``h_ii = 1 - c g_i``; removing weight 1 from row i
        (Sherman-Morrison) divides the residual by ``1 - h_ii / w_i``:

        .. math:: e_i = \frac{c\, b_i}{s_i}\,\frac{u_i}{u_i - 1 + c\, g_i},
                  \qquad u_i = \max(w_i, 1),

        a row of weight below one being left out whole (``u_i = 1``: the
        residual divided by ``1 - h_ii``). For integer weights summing to at
        most :data:`AUTO_LAM_SAMPLES` (the rows repeated are not subsampled)
        these are the losses of the rows repeated, up to round-off; above
        that one side or both are subsampled, and the subsamples differ.
        """
        xp = backend.xp
        rows = auto_lam_rows(X.shape[0], sample_weight)
        idx = xp.asarray(rows)
        kernel = self._kernel(self._fit_gamma(sigma, X.shape[1]))
        if self.kernel == "precomputed":
            K = xp.array(X[idx][:, idx], dtype=X.dtype)
        else:
            K = kernel.matrix(_take(xp, X, rows))
        t = _take(xp, y, rows)
        w = None if sample_weight is None else _take(xp, sample_weight, rows)
        t = t - self._part_offsets(xp, [t], None if w is None else [w])[0]
        m = len(rows)
        T = t.reshape(m, -1)
        if w is None:
            form, = tridiagonal_batch([K], eigen=True, overwrite_a=True)
            Z = form.solve(lams * m, form.project(T))  # (L, m, k)
            alpha = form.expand(Z.transpose(1, 0, 2).reshape(m, -1))
            alpha = alpha.reshape(m, lams.size, -1).transpose(1, 0, 2)
            resid = alpha / form.inverse_diagonal(lams * m)[:, :, None]
            scale = xp.where(T.var(axis=0) > 0, T.var(axis=0), 1.0)
            loss = to_numpy(((resid**2).sum(axis=1) / scale).sum(axis=1))
            return np.where(np.isfinite(loss), loss, np.inf)
        s = xp.sqrt(w)
        K *= s[:, None]
        K *= s[None, :]
        form, = tridiagonal_batch([K], eigen=True, overwrite_a=True)
        mass = float(np.sum(to_numpy(w), dtype=np.float64))
        shifts = lams * mass
        Z = form.solve(shifts, form.project(s[:, None] * T))  # (L, m, k)
        b = form.expand(Z.transpose(1, 0, 2).reshape(m, -1))
        b = b.reshape(m, lams.size, -1).transpose(1, 0, 2)
        c = xp.asarray(shifts, dtype=K.dtype)[:, None]  # (L, 1)
        u = xp.maximum(w, 1.0)
        g = form.inverse_diagonal(shifts)  # (L, m)
        resid = (c[:, :, None] * b / s[None, :, None]) * (u / (u - 1.0 + c * g))[:, :, None]
        mean = (w @ T) / mass
        scale = (w @ (T - mean) ** 2) / mass
        scale = xp.where(scale > 0, scale, 1.0)
        loss = to_numpy(((w[None, :, None] * resid**2).sum(axis=1) / scale).sum(axis=1))
        return np.where(np.isfinite(loss), loss, np.inf)

    def _sample_weight(self, backend, sample_weight, X):
        """KernelRidge's ``sample_weight`` (None, a float, or one per sample) on the device."""
        if sample_weight is None:
            return None
        from sklearn.utils.validation import _check_sample_weight

        host = _check_sample_weight(to_numpy(sample_weight) if is_cupy_array(sample_weight)
                                    else sample_weight, np.empty((X.shape[0], 0)),
                                    dtype=np.float64, ensure_non_negative=True)
        with backend.use():
            return backend.asarray(host, X.dtype)

    def predict(self, X):
        """Predict with the nearest part's model (or the average of all parts).

        Memory stays bounded for any number of rows: kernel rows are built in
        blocks of at most 64 MiB and multiplied by α at once.

        Parameters
        ----------
        X : array-like or sparse CSR of shape (n_samples, n_features)

        Returns
        -------
        y_pred : array of shape (n_samples,) or (n_samples, n_targets)
            CuPy for CuPy input, a lazy Dask array for Dask input (each chunk
            predicted on its worker), NumPy otherwise.
        """
        if is_dask_collection(X):
            check_is_fitted(self, "dual_coef_")
            columns = self.dual_coef_.shape[1] if self.dual_coef_.ndim == 2 else None
            return dask_module().predict_blocks(self, X, "predict", out_columns=columns,
                                                dtype=self.dual_coef_.dtype)
        return self._predict(X)


class BKRRRegressorCV(_BKRRBase):
    r"""BKRR2 (and family) with a fast search over σ and λ (Gaussian kernel).

    The data (or each training fold) is partitioned once, and the squared
    distances within each part computed once. Per σ, every part's kernel
    block is reduced once to ``K_j = Q_j T_j Q_j^T`` with T_j tridiagonal
    (:class:`gpuml.kernels.krr.Tridiagonal`: LAPACK ``sytrd`` on the CPU, about
    three Cholesky factorisations; the eigendecomposition, T_j diagonal, on a
    GPU and for the leave-one-out diagonal). Then every λ costs an O(m_j)
    tridiagonal solve per part, with ``Q_j^T y_j`` kept:

    .. math:: \alpha_j = Q_j\, (T_j + \lambda m_j I)^{-1}\, Q_j^\top y_j .

    With ``cv=None`` each (σ, λ) is scored by the closed-form leave-one-out
    error of every part's model on its own samples,
    ``e_i = \alpha_i / [(K_j + \lambda m_j I)^{-1}]_{ii}`` (pooled over all
    parts, as R²). With ``cv`` given, each fold's validation samples are
    predicted exactly as :class:`BKRRRegressor` would (nearest centre or
    average) and scored by R² — the same numbers ``GridSearchCV`` computes on
    the same splits when ``random_state`` is an int (so each fold is
    partitioned the same way), up to round-off between the tridiagonal form
    and Cholesky. Then the best (σ, λ) is refitted on all the data.

    Parameters
    ----------
    sigmas : sequence of float > 0, default=(0.25, 0.5, 1.0, 2.0, 4.0)
    lams : sequence of float > 0, default=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
        λ must be positive here: the leave-one-out formula needs an
        invertible shifted kernel.
    cv : None, int, cross-validation generator or iterable, default=None
        None: leave-one-out within each part (``combine="nearest"`` only,
        since an averaged model's held-out error involves every part).
        Otherwise as in ``GridSearchCV`` (an int is ``KFold(cv)``).
    n_partitions, partition, combine, dtype, device, n_jobs, random_state
        As in :class:`BKRRRegressor` (``dtype=None``: float32 X is searched
        in float32).
    fit_intercept : bool, default=True
        Centre each part's targets on their mean, as :class:`BKRRRegressor`
        does (the refitted model gets the same setting). The leave-one-out
        score keeps the part's mean (not refitted without the left-out sample).
    search : {"auto", "reduction", "cholesky"}, default="auto"
        How each σ's λ values are scored. ``"reduction"``: one tridiagonal
        (or eigen) reduction per part and σ, then O(m) per λ. ``"cholesky"``:
        one Cholesky factorisation per part, σ and λ (for leave-one-out, with
        the m-column solve that gives the inverse's diagonal). ``"auto"``
        picks the cheaper for the grid: the reduction costs about
        ``REDUCTION_COST`` Cholesky factorisations (5 for the Householder form,
        12 for the eigen form of leave-one-out and GPUs), a λ without it
        ``CHOLESKY_COST`` (1, or 3 for leave-one-out); so short λ lists (fewer
        than 5 with ``cv`` on the CPU, 4 or fewer for leave-one-out) go
        through Cholesky. Both give the same scores to round-off.
    refit : bool, default=True
        Refit :class:`BKRRRegressor` with the best (σ, λ) on all the data.

    Attributes
    ----------
    cv_results_ : dict of arrays
        ``params``, ``param_sigma``, ``param_lam``, ``mean_test_score``,
        ``std_test_score``, ``rank_test_score`` and ``split{k}_test_score``
        (R²), in ``GridSearchCV``'s order (λ slowest, σ fastest).
    best_params_ : dict
        ``{"lam": ..., "sigma": ...}``.
    best_score_ : float
    best_index_ : int
    sigma_, lam_ : float
        The chosen σ and λ.
    best_estimator_ : BKRRRegressor
        The refitted model (when ``refit=True``); ``predict`` uses it.
    n_splits_ : int
    search_ : str
        The search that ran, ``"reduction"`` or ``"cholesky"``.
    n_features_in_ : int

    References
    ----------
    Yang You, PhD thesis, UC Berkeley, 2020, chapter 3: Alg 6 (the σ × λ grid of
    KRR), Alg 9 (K-balance), Alg 10 (BKRR2). The leave-one-out identity for
    regularised least squares: G. Wahba, "Spline Models for Observational
    Data", SIAM 1990; R. Rifkin, R. Lippert, "Notes on regularized least
    squares", MIT-CSAIL-TR-2007-025.

    Examples
    --------
    >>> from sklearn.datasets import load_diabetes
    >>> from gpuml.estimators.bkrr import BKRRRegressorCV
    >>> X, y = load_diabetes(return_X_y=True)
    >>> search = BKRRRegressorCV(sigmas=[0.1, 0.2, 0.4], lams=[1e-5, 1e-4, 1e-3],
    ...                          n_partitions=2, device="cpu", random_state=0).fit(X, y)
    >>> sorted(search.best_params_)
    ['lam', 'sigma']
    >>> len(search.cv_results_["mean_test_score"])
    9
    """

    _parameter_constraints = {
        "sigmas": ["array-like"],
        "lams": ["array-like"],
        "cv": ["cv_object", None],
        "fit_intercept": ["boolean"],
        "search": [StrOptions({"auto", "reduction", "cholesky"})],
        "refit": ["boolean"],
        **{k: v for k, v in _COMMON_CONSTRAINTS.items() if k not in ("degree", "coef0")},
    }

    def __init__(self, sigmas=(0.25, 0.5, 1.0, 2.0, 4.0), lams=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2),
                 cv=None, fit_intercept=True, n_partitions="auto", partition="kbalance",
                 combine="nearest", dtype=None, device="auto", n_jobs=None, random_state=None,
                 search="auto", refit=True):
        self.sigmas = sigmas
        self.lams = lams
        self.cv = cv
        self.fit_intercept = fit_intercept
        self.n_partitions = n_partitions
        self.partition = partition
        self.combine = combine
        self.dtype = dtype
        self.device = device
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.search = search
        self.refit = refit

    def _kernel(self, gamma: float) -> Kernel:
        return Kernel("rbf", gamma)

    def _search_kind(self, n_lams: int, loo: bool, gpu: bool) -> str:
        """``"reduction"`` or ``"cholesky"``: the cheaper for this many λ (cost model above)."""
        if self.search != "auto":
            return self.search
        form = "eigen" if loo or gpu else "householder"
        per_lam = CHOLESKY_COST["eigen" if loo else "householder"]
        return "reduction" if n_lams * per_lam > REDUCTION_COST[form] else "cholesky"

    def _shifted(self, xp, blocks, lam):
        """Copies of the kernel blocks with ``lam * m_j`` added to the diagonal (eq. 3.6)."""
        out = []
        for K in blocks:
            m = K.shape[0]
            A = K.copy()
            A[xp.arange(m), xp.arange(m)] += lam * m
            out.append(A)
        return out

    def _loo_scores_cholesky(self, xp, dists, targets, offsets, sigma, lams):
        """:meth:`_loo_scores` by one Cholesky per part and λ: ``(K + lam m I)^{-1} [y | I]``."""
        blocks = self._blocks(xp, dists, sigma)
        preds = []
        for lam in lams.tolist():
            rhs = [xp.concatenate([t.reshape(t.shape[0], -1), xp.eye(t.shape[0], dtype=t.dtype)],
                                  axis=1) for t in targets]
            sols = cholesky_solve_batch(self._shifted(xp, blocks, lam), rhs, overwrite_a=True,
                                        n_jobs=self.n_jobs)
            per_part = []
            for sol, t, b in zip(sols, targets, offsets):
                k = sol.shape[1] - t.shape[0]
                residual = sol[:, :k] / xp.diagonal(sol[:, k:])[:, None]
                per_part.append((t.reshape(t.shape[0], -1) - residual).reshape(t.shape) + b)
            preds.append(xp.concatenate(per_part))
        truth = xp.concatenate([t + b for t, b in zip(targets, offsets)])
        return _r2_scores(to_numpy(truth), to_numpy(xp.stack(preds)))

    def _split_scores_cholesky(self, xp, dists, targets, offsets, val_dists, rows, yval, sigma,
                               lams):
        """:meth:`_split_scores` by one Cholesky per part and λ."""
        used = [j for j, r in enumerate(rows) if r.size]
        blocks = self._blocks(xp, [dists[j] for j in used], sigma)
        val_blocks = self._blocks(xp, [val_dists[j] for j in used], sigma)
        P = len(rows)
        preds = xp.zeros((lams.size,) + yval.shape, dtype=yval.dtype)
        if self.combine != "nearest":
            preds += sum(offsets) / P
        for L, lam in enumerate(lams.tolist()):
            alphas = cholesky_solve_batch(self._shifted(xp, blocks, lam),
                                          [targets[j] for j in used], overwrite_a=True,
                                          n_jobs=self.n_jobs)
            for j, Kv, a in zip(used, val_blocks, alphas):
                if self.combine == "nearest":
                    preds[L, xp.asarray(rows[j])] = Kv @ a + offsets[j]
                else:
                    preds[L] += (Kv @ a) / P
        return _r2_scores(to_numpy(yval), to_numpy(preds))

    def _grid(self):
        sigmas = np.asarray(self.sigmas, dtype=np.float64).ravel()
        lams = np.asarray(self.lams, dtype=np.float64).ravel()
        if sigmas.size == 0 or lams.size == 0:
            raise ValueError("sigmas and lams must each hold at least one value")
        if not (np.all(np.isfinite(sigmas)) and np.all(sigmas > 0)):
            raise ValueError(f"every sigma must be a finite number > 0, got {sigmas.tolist()}")
        if not (np.all(np.isfinite(lams)) and np.all(lams > 0)):
            raise ValueError(f"every lam must be a finite number > 0, got {lams.tolist()}")
        return sigmas, lams

    def _blocks(self, xp, dists, sigma):
        """Kernel blocks ``exp(-D / (2 sigma^2))`` from σ-free squared distances.

        The same arithmetic as :meth:`Kernel.matrix`, so the blocks equal those
        :class:`BKRRRegressor` factors.
        """
        gamma = 1.0 / (2.0 * sigma**2)
        blocks = [D * -gamma for D in dists]
        return [xp.exp(K, out=K) for K in blocks]

    def _loo_scores(self, xp, dists, targets, offsets, sigma, lams):
        """R² of the pooled leave-one-out predictions within each part, for every λ.

        Needs ``diag((K_j + lam*m_j*I)^{-1})`` at every λ: O(m_j) per λ with
        explicit eigenvectors, O(m_j^2) from the tridiagonal form, which makes
        ``syevd`` cheaper here than ``sytrd`` plus forming Q (measured, m = 100..400).
        ``targets`` are centred by the parts' intercepts ``offsets``, which are kept
        (not refitted without the left-out sample).
        """
        forms = tridiagonal_batch(self._blocks(xp, dists, sigma), eigen=True, overwrite_a=True,
                                  n_jobs=self.n_jobs)
        preds = []
        for form, t in zip(forms, targets):
            m, L = form.size, lams.size
            Z = form.solve(lams * m, form.project(t)).reshape(L, m, -1)
            # alpha for every λ: one product with Q for all λ (and targets) at once
            alpha = form.expand(Z.transpose(1, 0, 2).reshape(m, -1))
            alpha = alpha.reshape(m, L, -1).transpose(1, 0, 2).reshape((L,) + t.shape)
            g = form.inverse_diagonal(lams * m)
            preds.append(t[None] - (alpha / g[:, :, None] if t.ndim == 2 else alpha / g))
        truth = [t + b for t, b in zip(targets, offsets)]
        preds = [p + b for p, b in zip(preds, offsets)]
        return _r2_scores(to_numpy(xp.concatenate(truth)),
                          to_numpy(xp.concatenate(preds, axis=1)))

    def _split_scores(self, xp, dists, targets, offsets, val_dists, rows, yval, sigma, lams):
        """R² on the validation fold of the routed (or averaged) models, for every λ.

        Per part, ``K_j = Q_j T_j Q_j^T`` once, and ``Q_j^T [y_j | K(X_val_j, X_j)^T]``
        once; then a λ costs one tridiagonal solve and one product with the
        projected validation block, O(m_j) + O(m_j m_val) — no more O(m_j^3).
        ``targets`` are centred; ``offsets`` are the parts' intercepts.
        """
        used = [j for j, r in enumerate(rows) if r.size]
        forms = tridiagonal_batch(self._blocks(xp, [dists[j] for j in used], sigma),
                                  overwrite_a=True, n_jobs=self.n_jobs)
        val_blocks = self._blocks(xp, [val_dists[j] for j in used], sigma)
        models = []
        for j, form, Kv in zip(used, forms, val_blocks):
            t = targets[j].reshape(form.size, -1)
            R = form.project(xp.concatenate([t, Kv.T], axis=1))
            models.append((rows[j], form, R[:, :t.shape[1]], R[:, t.shape[1]:], offsets[j]))
        P = len(rows)
        preds = xp.zeros((lams.size,) + yval.shape, dtype=yval.dtype)
        if self.combine != "nearest":
            preds += sum(offsets) / P
        for r, form, Qty, Wt, offset in models:
            # every λ at once: (L, m, k) solutions, then (L, m_val, k) predictions
            contribution = Wt.T @ form.solve(lams * form.size, Qty)
            contribution = contribution.reshape((lams.size, r.size) + yval.shape[1:])
            if self.combine == "nearest":
                contribution += offset
            if self.combine == "nearest":
                preds[:, xp.asarray(r)] = contribution
            else:
                preds += contribution / P
        return _r2_scores(to_numpy(yval), to_numpy(preds))

    def fit(self, X, y):
        """Search the σ × λ grid, then refit the best model on all the data.

        Parameters
        ----------
        X : array-like or sparse CSR of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_targets)

        Returns
        -------
        self
        """
        self._validate_params()
        refuse_dask(self, X, y)
        sigmas, lams = self._grid()
        if self.cv is None and self.combine != "nearest":
            raise ValueError("cv=None scores by leave-one-out within each part, which only "
                             "applies to combine='nearest'; give cv (e.g. cv=5) for "
                             f"combine={self.combine!r}")
        backend, X, y = self._prepare(X, y)
        n = X.shape[0]
        if n < 2:
            raise ValueError(f"BKRRRegressorCV needs at least 2 samples to score, got {n} "
                             "sample (n_samples = 1)")
        if self.cv is None:
            splits = [(np.arange(n), None)]
        else:
            cv = check_cv(self.cv)
            splits = list(cv.split(np.zeros((n, 1)), to_numpy(y)))
        scores = np.empty((sigmas.size, lams.size, len(splits)))
        xp = backend.xp
        self.search_ = self._search_kind(lams.size, self.cv is None, backend.is_gpu)
        with backend.use():
            for f, (train, test) in enumerate(splits):
                Xtr, ytr = _take(xp, X, train), _take(xp, y, train)
                self._check_before_split(Xtr.shape[0], X.dtype.itemsize, backend, search=True)
                partitioning = self._split(Xtr)
                self._check_memory(partitioning.sizes, X.dtype.itemsize, backend, search=True)
                parts = [_take(xp, Xtr, idx) for idx in partitioning.parts]
                targets = [_take(xp, ytr, idx) for idx in partitioning.parts]
                # the intercepts BKRRRegressor(fit_intercept=...) would fit on this fold
                offsets = self._part_offsets(xp, targets, None)
                targets = [t - b for t, b in zip(targets, offsets)]
                # Squared distances do not depend on σ: once per fold, one exp per σ.
                dists = [sq_distances(Xj, Xj) for Xj in parts]
                if test is None:
                    score = (self._loo_scores if self.search_ == "reduction"
                             else self._loo_scores_cholesky)
                    for s, sigma in enumerate(sigmas):
                        scores[s, :, f] = self._scores(score, self._loo_scores, xp, dists,
                                                       targets, offsets, sigma, lams)
                    continue
                Xval, yval = _take(xp, X, test), _take(xp, y, test)
                if self.combine == "nearest":
                    labels = route(Xval, partitioning.centers)
                    rows = [np.flatnonzero(labels == j) for j in range(len(parts))]
                else:
                    rows = [np.arange(Xval.shape[0])] * len(parts)
                val_dists = [sq_distances(_take(xp, Xval, r), Xj) if r.size else None
                             for r, Xj in zip(rows, parts)]
                score = (self._split_scores if self.search_ == "reduction"
                         else self._split_scores_cholesky)
                for s, sigma in enumerate(sigmas):
                    scores[s, :, f] = self._scores(score, self._split_scores, xp, dists,
                                                   targets, offsets, val_dists, rows, yval,
                                                   sigma, lams)
        self._record(scores, sigmas, lams)
        if self.refit:
            self.best_estimator_ = BKRRRegressor(
                sigma=self.sigma_, lam=self.lam_, fit_intercept=self.fit_intercept,
                n_partitions=self.n_partitions,
                partition=self.partition, combine=self.combine, dtype=self.dtype,
                device=backend.device, n_jobs=self.n_jobs, random_state=self.random_state,
            ).fit(X, y)
        return self

    @staticmethod
    def _scores(score, reduction, *args):
        """``score(*args)``; where a Cholesky factorisation fails (a tiny λ), the reduction."""
        try:
            return score(*args)
        except NotPositiveDefiniteError:
            return reduction(*args)

    def _record(self, scores, sigmas, lams):
        """cv_results_ in GridSearchCV's order: λ (alphabetically first) slowest."""
        per_split = scores.transpose(1, 0, 2).reshape(-1, scores.shape[2])
        mean = per_split.mean(axis=1)
        lam_col = np.repeat(lams, sigmas.size)
        sigma_col = np.tile(sigmas, lams.size)
        ranked = np.where(np.isnan(mean), -np.inf, mean)
        order = np.argsort(-ranked, kind="stable")
        rank = np.empty(mean.size, dtype=np.int32)
        rank[order] = np.arange(1, mean.size + 1)
        # ties share the best rank, as scipy's rankdata(method="min") in GridSearchCV
        for i in range(1, mean.size):
            if ranked[order[i]] == ranked[order[i - 1]]:
                rank[order[i]] = rank[order[i - 1]]
        results = {
            "params": [{"lam": float(a), "sigma": float(s)} for a, s in zip(lam_col, sigma_col)],
            "param_lam": lam_col,
            "param_sigma": sigma_col,
            "mean_test_score": mean,
            "std_test_score": per_split.std(axis=1),
            "rank_test_score": rank,
        }
        for k in range(per_split.shape[1]):
            results[f"split{k}_test_score"] = per_split[:, k]
        self.cv_results_ = results
        self.n_splits_ = int(per_split.shape[1])
        self.best_index_ = int(order[0])
        self.best_score_ = float(mean[self.best_index_])
        self.best_params_ = dict(results["params"][self.best_index_])
        self.sigma_ = self.best_params_["sigma"]
        self.lam_ = self.best_params_["lam"]

    def predict(self, X):
        """Predict with the refitted best model (see :meth:`BKRRRegressor.predict`)."""
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X)
