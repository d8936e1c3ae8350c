r"""BKRRRegressorCV: BKRR2 and its family with a fast search over σ and λ
(You 2020, chapter 3, Alg 6, 9 and 10).

The data (or each training fold) is partitioned once; per σ every part's kernel
block is reduced once to tridiagonal (or diagonal) form, after which a λ costs
O(m_j) per part, or, for short λ lists, every (σ, λ) gets its own Cholesky
factorisation (:data:`REDUCTION_COST`, :data:`CHOLESKY_COST`). The best (σ, λ)
is refitted as a :class:`~gpuml.estimators.bkrr_regressor.BKRRRegressor`.
"""

from __future__ import annotations

import numpy as np
from sklearn.model_selection import check_cv
from sklearn.utils._param_validation import StrOptions

from .._backend import to_numpy
from .._validation import refuse_dask
from ..kernels import (
    NotPositiveDefiniteError,
    cholesky_solve_batch,
    part_threads,
    rbf_from_sq_distances,
    tridiagonal_batch,
)
from ..kernels.krr import tridiagonal_form
from ..kernels.pairwise import Kernel, sq_distances
from ..routing import route
from ._krr import _COMMON_CONSTRAINTS, _BKRRBase, _take
from ._search import BestEstimatorMixin, search_results
from .bkrr_regressor import BKRRRegressor

#: Cost of reducing one part's kernel block, in Cholesky factorisations of that block:
#: LAPACK ``sytrd`` + one ``ormqr`` (Householder form, ``cv`` given on the CPU) and
#: ``syevd`` (eigen form: leave-one-out, and every GPU search); the measured unit costs
#: are in docs/bkrr.md ("Which search runs") and bench/results/cpu-2core/bkrr-runs.md.
REDUCTION_COST = {"householder": 5.0, "eigen": 12.0}
#: Cost of one λ without a reduction, in the same units: one Cholesky factorisation, plus
#: for the leave-one-out diagonal the solve with m right-hand sides (two more).
CHOLESKY_COST = {"householder": 1.0, "eigen": 3.0}


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



class BKRRRegressorCV(BestEstimatorMixin, _BKRRBase):
    r"""BKRR2 (and family) with a fast search over σ and λ (Gaussian kernel).

    The data (or each training fold) is partitioned once, and the squared
    distances within each part computed once. Per σ, every part's kernel
    block is reduced once to ``K_j = Q_j T_j Q_j^T`` with T_j tridiagonal
    (:class:`gpuml.kernels.krr.Tridiagonal`: LAPACK ``sytrd`` on the CPU, a
    few Cholesky factorisations' worth (:data:`REDUCTION_COST`); the
    eigendecomposition, T_j diagonal, on a GPU and for the leave-one-out
    diagonal). Then every λ costs an O(m_j) tridiagonal solve per part, with
    ``Q_j^T y_j`` kept:

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

    def _search_kind(self, n_lams: int, loo: bool, form: str) -> str:
        """``"reduction"`` or ``"cholesky"``: the cheaper for this many λ (cost model above),
        ``form`` the reduction's on the device (:func:`gpuml.kernels.krr.tridiagonal_form`)."""
        if self.search != "auto":
            return self.search
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

    def _jobs(self, blocks):
        """Threads over the parts' square ``blocks`` (:func:`gpuml.kernels.part_threads`)."""
        return part_threads(self.n_jobs, [b.shape[0] for b in blocks])

    def _loo_scores_cholesky(self, xp, dists, targets, offsets, sigma, lams):
        """:meth:`_loo_scores` by one Cholesky per part and λ: ``(K + lam m I)^{-1} [y | I]``."""
        blocks = self._blocks(xp, dists, sigma)
        preds = []
        for lam in lams.tolist():
            rhs = [xp.concatenate([t.reshape(t.shape[0], -1), xp.eye(t.shape[0], dtype=t.dtype)],
                                  axis=1) for t in targets]
            sols = cholesky_solve_batch(self._shifted(xp, blocks, lam), rhs, overwrite_a=True,
                                        n_jobs=self._jobs(blocks))
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
                                          n_jobs=self._jobs(blocks))
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
        return [rbf_from_sq_distances(xp.array(D, copy=True), gamma) for D in dists]

    def _loo_scores(self, xp, dists, targets, offsets, sigma, lams):
        """R² of the pooled leave-one-out predictions within each part, for every λ.

        Needs ``diag((K_j + lam*m_j*I)^{-1})`` at every λ: O(m_j) per λ with
        explicit eigenvectors, O(m_j^2) from the tridiagonal form, which makes
        ``syevd`` cheaper here than ``sytrd`` plus forming Q (measured: docs/bkrr.md).
        ``targets`` are centred by the parts' intercepts ``offsets``, which are kept
        (not refitted without the left-out sample).
        """
        forms = tridiagonal_batch(self._blocks(xp, dists, sigma), eigen=True, overwrite_a=True,
                                  n_jobs=self._jobs(dists))
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
                                  overwrite_a=True, n_jobs=self._jobs([dists[j] for j in used]))
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
        loo = self.cv is None
        self.search_ = self._search_kind(lams.size, loo, tridiagonal_form(backend, eigen=loo))
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
        params = [{"lam": float(a), "sigma": float(s)} for a in lams for s in sigmas]
        self.cv_results_, self.best_index_ = search_results(params, per_split)
        self.n_splits_ = int(per_split.shape[1])
        self.best_score_ = float(self.cv_results_["mean_test_score"][self.best_index_])
        self.best_params_ = dict(params[self.best_index_])
        self.sigma_ = self.best_params_["sigma"]
        self.lam_ = self.best_params_["lam"]

    def _unfitted_model(self):
        return BKRRRegressor()

    def predict(self, X):
        """Predict with the refitted best model (see :meth:`BKRRRegressor.predict`)."""
        return self._best().predict(X)
