r"""What BKRRRegressor and BKRRRegressorCV share (You 2020, chapter 3).

* the parameter constraints both estimators take, and ``n_partitions="auto"``
  (:data:`AUTO_PART_SIZE`);
* ``sigma="scale"`` (:func:`scale_gamma`, SVC's ``gamma="scale"``), the kernel and
  each part's intercept and diagonal shift ``lam * m_j`` (eq. 3.6);
* the memory check that refuses, before allocating, a fit or a search whose kernel
  blocks would not fit, naming the ``n_partitions`` that would;
* the fit of a part (:class:`KRRPartFit`; the solver, one batched Cholesky solve with
  least squares for a part it refuses, is :mod:`gpuml.estimators._cholesky_solver`) and
  the fitted attributes assembled from the parts' fits;
* prediction by the nearest part (BKRR2, KKRR2) or the average of all parts
  (DC-KRR), on one device or on the devices of the fit, and pickling, which
  carries the fitted device arrays as NumPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from .._backend import (
    CPU,
    Backend,
    available_bytes,
    float_dtype,
    is_dask_collection,
    resolve,
    stack_rows,
    to_numpy,
    to_output,
)
from .._progress import Progress
from .._validation import check_n_partitions, validate_X, validate_X_y
from ..kernels.krr import krr_fit_bytes
from ..kernels.pairwise import HOST_KERNELS, Kernel, PairwiseKernel, resolve_gamma
from ..partition import fewest_parts_fitting, split
from ..pipeline import (
    dask_module,
    host_state,
    on_device,
    predict_on_devices,
    prediction_group,
    route_on_devices,
    state_on_device,
)
from ..routing import route, rows_by_part
from ._kept import KEPT_PREDICT_ROWS, KeptPartsMixin
from ._params import CachedParamNames
from ._partitioned import PARTITION_CONSTRAINTS, auto_n_partitions

#: ``n_partitions="auto"`` makes parts of at most this many samples. Fit time
#: is ``P (n/P)^3`` and the error grows with P (accuracy and fit time against P:
#: bench/results/cpu-2core/bkrr-runs.md, made by bench/bench_bkrr.py). 2048 keeps one
#: part's float64 kernel block at 32 MiB.
AUTO_PART_SIZE = 2048

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
        return auto_n_partitions(n_samples, AUTO_PART_SIZE)
    return check_n_partitions(n_partitions, n_samples)



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


def check_fit_memory(name, n_jobs, sizes, itemsize, backend, *, search=False,
                     n_samples=None, n_parts=None):
    """Refuse, before allocating, a fit whose kernel blocks would not fit on ``backend``.

    ``sizes`` are the part sizes, or before partitioning ``[ceil(n / P)]``
    with ``n_samples=n, n_parts=P`` (no partition of n samples into P parts
    has a smaller largest part, so its need is a lower bound); the need is
    :func:`gpuml.kernels.krr.krr_fit_bytes` (``search``: of the σ/λ search). The
    message, naming the estimator ``name``, says how much is needed and the
    smallest ``n_partitions`` whose balanced parts fit by the same estimate.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    n = int(sizes.sum() if n_samples is None else n_samples)
    n_parts = int(sizes.size if n_parts is None else n_parts)
    need = krr_fit_bytes(backend, sizes, itemsize, n_jobs, search)
    avail = available_bytes(backend.xp)
    if need <= avail:
        return
    suggest = fewest_parts_fitting(
        n, n_parts, lambda P: krr_fit_bytes(backend, _balanced_sizes(n, P), itemsize, n_jobs,
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
        f"{name} needs about {_format_bytes(need)} for {what} "
        f"({n_parts} part(s), largest {int(sizes.max())} samples) on {backend.device}, "
        f"but only {_format_bytes(avail)} is available; {change}"
    )


def part_offsets(xp, targets, weights, fit_intercept: bool) -> list:
    """Each part's intercept: the (weighted) mean of its targets, or zeros.

    Per part rather than one global mean: each local model of BKRR2 then
    fits the deviation from its own region's mean, and DC-KRR averages the
    parts' means (the two compared in bench/results/cpu-2core/bkrr_defaults.md;
    docs/bkrr.md).
    """
    if not fit_intercept:
        return [xp.zeros(t.shape[1:], dtype=t.dtype) for t in targets]
    return [_weighted_mean(xp, t, None if weights is None else weights[k])
            for k, t in enumerate(targets)]


def part_shifts(sizes, lam, alpha=None) -> list:
    """Each part's diagonal shift: ``lam * m_j`` (eq. 3.6), or ``alpha`` when given.

    ``sizes`` are the parts' sizes ``m_j``: row counts, or with
    ``sample_weight`` the parts' weights (:func:`_part_masses`).
    """
    return [float(alpha) if alpha is not None else lam * m for m in sizes]


class _BKRRBase(CachedParamNames, KeptPartsMixin, RegressorMixin, BaseEstimator):
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

    def _n_parts(self, n: int, gpu: bool = False) -> int:
        """P for ``n`` samples (on a GPU or not: the same P): one part for a precomputed
        kernel (no features to split on)."""
        if getattr(self, "kernel", "rbf") == "precomputed":
            return 1
        return _n_partitions(self.n_partitions, n)

    def _check_memory(self, sizes, itemsize, backend, *, search=False, n_samples=None,
                      n_parts=None):
        """:func:`check_fit_memory` for this estimator's fit (or, ``search``, σ/λ search)."""
        check_fit_memory(type(self).__name__, self.n_jobs, sizes, itemsize, backend,
                         search=search, n_samples=n_samples, n_parts=n_parts)

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
        """:func:`part_offsets` with this estimator's ``fit_intercept``."""
        return part_offsets(xp, targets, weights, getattr(self, "fit_intercept", False))

    def _shifts(self, sizes, lam):
        """:func:`part_shifts` with this estimator's ``alpha``."""
        return part_shifts(sizes, lam, getattr(self, "alpha", None))

    def _store_fit(self, backend, partitioning, fits, sigma, lam, sample_weight=None, kept=None):
        """The fitted attributes from the per-part fits (in part order) and the centres.

        Called by the thread that called ``fit``, after every part is solved (one
        batched direct solve: no iteration, so no convergence to report): with
        ``verbose``, one line per part is printed here, in part order.
        ``sample_weight`` (the fit's, aligned with the rows the parts index)
        gives the parts' weighted sizes in the shifts. ``kept``: the parts stayed on
        the Dask workers that fitted them (``FitResult.kept``; ``fits`` are their
        summaries): ``X_fit_`` and ``dual_coef_`` are Dask arrays over them.
        """
        progress = Progress("BKRR", len(fits), getattr(self, "verbose", 0))
        masses = (partitioning.sizes.tolist() if sample_weight is None else _part_masses(
            partitioning.parts, [to_numpy(sample_weight)[np.asarray(idx, dtype=np.int64)]
                                 for idx in partitioning.parts]))
        shifts = self._shifts(masses, lam)
        for j, (size, shift) in enumerate(zip(partitioning.sizes.tolist(), shifts)):
            progress.update(j, f"{size} rows, (K + {shift:.4g} I) a = y solved")
        progress.close()
        if kept is None:
            self.X_fit_ = stack_rows([f.X for f in fits])
            self.dual_coef_ = backend.xp.concatenate([f.dual_coef for f in fits])
        else:
            self.X_fit_, self.dual_coef_ = dask_module().kept_arrays(kept, fits,
                                                                    partitioning.sizes)
        self._kept_parts = kept
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
        for j, rows in rows_by_part(route(X, self.centers_)):
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
            for j, rows in rows_by_part(parts):
                sel = backend.asarray(rows)
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
        if self._kept():
            out = dask_module().predict_kept_in_memory(
                self, to_numpy(X), self._kernel(self.gamma_), self._host_intercepts(),
                self.dual_coef_.dtype, KEPT_PREDICT_ROWS)
        elif group is not None:
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
        if state.get("_kept_parts") is not None:
            # Parts kept on Dask workers: the model pickles as the in-memory one.
            state["X_fit_"], state["dual_coef_"] = dask_module().gathered(self)
            del state["_kept_parts"]
        return host_state(state)

    def __setstate__(self, state):
        # Back onto the fitting GPU when it is there; on the CPU otherwise.
        super().__setstate__(state_on_device(state, ("X_fit_", "dual_coef_", "centers_",
                                                     "intercept_")))
