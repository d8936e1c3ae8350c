r"""BKRRRegressor: balanced kernel ridge regression and its family, as settings
(You 2020, chapter 3, Alg 6, 8, 9 and 10).

Split the training set into P parts, solve one kernel ridge system per part, and
predict with the part whose centre is nearest (BKRR2, KKRR2) or with the average of
all parts (DC-KRR). The fit is :func:`gpuml.pipeline.fit_partitioned`, with the
Cholesky part solver of :mod:`gpuml.estimators._cholesky_solver`; ``lam="auto"``
picks λ by closed-form leave-one-out on a subsample (:data:`AUTO_LAMS`,
:data:`AUTO_LAM_SAMPLES`).
"""

from __future__ import annotations

from numbers import Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from .._backend import CPU, from_device, is_dask_collection, to_numpy
from ..kernels import compile_after_fit, tridiagonal_batch
from ..kernels.pairwise import HOST_KERNELS
from ..pipeline import Capability, FitData, Need, PartitionedEstimator, dask_module, on_device
from ..pipeline.fit import fit_partitioned
from ._cholesky_solver import CholeskyCost, CholeskyPartSolver
from ._krr import _COMMON_CONSTRAINTS, _BKRRBase, _take
from ._partitioned import PARTITION_CONSTRAINTS

#: ``lam="auto"`` picks λ from this grid (1e-6 ... 1, half decades) by the closed-form
#: leave-one-out error of kernel ridge on a subsample of the training set. Below 1e-6 the
#: choice becomes unstable (leave-one-out can pick a smaller λ that predicts worse;
#: bench/bench_bkrr_defaults.py) and float32 solves fail.
AUTO_LAMS = tuple(float(v) for v in np.logspace(-6.0, 0.0, 13))
#: ... of at most this many rows (a fixed random subset): one eigendecomposition of
#: its kernel block, whatever the size of the training set.
AUTO_LAM_SAMPLES = 1000


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



class BKRRRegressor(_BKRRBase, PartitionedEstimator):
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
    in the thousands swamps the others). The defaults are compared with a
    ``GridSearchCV``-tuned ``KernelRidge`` on standardised features, on
    diabetes, california housing and rf1, in
    ``bench/results/cpu-2core/bkrr_defaults.md``.

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
        hold the value; a constant X gives gamma 1). SVC's rule is kept as
        it is: a constant factor on that gamma, each at its best λ, gained
        little on the benchmark sets (most on diabetes, which prefers a
        wider, nearly linear kernel).
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
        serves all three benchmark sets: noisy diabetes needs a larger λ than
        california and rf1 (the ``lam_`` of each in
        bench/results/cpu-2core/bkrr_defaults.md). ``lam_`` holds the chosen
        value. With ``lam=0`` a part whose kernel block is singular
        (duplicate samples) is solved by least squares, with a warning, as
        KernelRidge does with ``alpha=0``.
    fit_intercept : bool, default=True
        Centre each part's targets on their (``sample_weight``-weighted) mean
        before its solve and add that mean back to the part's predictions
        (``intercept_``); with ``combine="average"`` the parts' means are
        averaged too. Per part rather than one global mean: the two are equal
        for DC-KRR and per part is as good or better for BKRR2
        (bench/results/cpu-2core/bkrr_defaults.md). ``False``: no centring,
        exactly ``KernelRidge``; a target far from 0 then costs accuracy
        wherever the kernel decays away from the training data (the "no
        centring" column of the same file).
    degree : int, default=3
        Degree of the polynomial kernel.
    coef0 : float, default=1.0
        Offset ``r`` of the polynomial and sigmoid kernels.
    n_partitions : int or "auto", default="auto"
        Number of parts P. ``"auto"`` makes parts of at most
        :data:`AUTO_PART_SIZE` (2048) samples, ``ceil(n / 2048)`` parts (one
        part, exact KRR, below 2049 samples). Must not exceed ``n_samples``.
    partition : {"kbalance", "kmeans", "random", "contiguous", "fcfs", "bkm"}, default="kbalance"
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
        loses about ``cond(K + lam*m*I) * 6e-8`` relative accuracy (float32's
        unit round-off times the condition number): the smaller ``lam*m``,
        the further from float64, and a shift too small for float32 makes
        the factorisation fail with a clear error (docs/bkrr.md, "dtype").
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
    max_device_memory : int, str or None, default=None
        Bytes (or ``"2GB"``, ``"512MiB"``) the fit may use on its device. Given
        (or, when None, on a GPU whose free memory is less than twice the
        data), the data stay on the host and the parts go through the device in
        groups that fit (each part's rows and kernel block), each group's rows
        copied while the previous one is solved; a part that alone does not fit
        is refused before any work (docs/scale.md). The model is the one of an
        unbounded fit.
    n_jobs : int or None, default=None
        Threads over parts on the CPU. None: by the fit's size
        (:func:`gpuml.kernels.part_threads`), up to the threads BLAS may use:
        every core for a large fit, one for a small one, where each part's LAPACK
        call is itself multi-threaded by BLAS; an int as joblib reads it.
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
        host after a fit with ``devices``). After a fit on Dask input, a Dask
        array whose chunks (one per part) stay on the workers that fitted the
        parts: prediction goes to them (docs/scale-out.md), pickling gathers them.
    dual_coef_ : array of shape (n_samples,) or (n_samples, n_targets)
        The α of every part, aligned with ``X_fit_`` (a Dask array likewise).
    centers_ : array of shape (n_partitions\_, n_features)
        Part centres (nearest-centre routing).
    part_sizes_ : ndarray of shape (n_partitions\_,)
    part_offsets_ : ndarray of shape (n_partitions\_ + 1,)
        Part ``j`` is ``X_fit_[part_offsets_[j]:part_offsets_[j + 1]]``.
    n_partitions_ : int
    intercept_ : array of shape (n_partitions\_,) or (n_partitions\_, n_targets)
        Each part's intercept: the mean of its targets (zeros with
        ``fit_intercept=False``).
    sigma_, lam_, gamma_ : float
        The fitted σ, λ, and ``gamma_ = 1 / (2 sigma_^2)`` (``"scale"`` and
        ``"auto"`` resolved). With ``alpha`` given, ``lam_ = alpha /
        n_samples`` (one part's λ; the total of ``sample_weight`` in place of
        ``n_samples`` when weighted); with ``gamma`` given, ``sigma_ = 1 /
        sqrt(2 gamma_)``.
    shifts_ : ndarray of shape (n_partitions\_,)
        The diagonal shift of every part's system (``lam * m_j`` or ``alpha``).
    device_ : str
        Device holding the fitted arrays. A model fitted on a GPU pickles its
        arrays as NumPy; unpickled where that GPU exists they go back to it,
        elsewhere the model loads on the CPU and predicts there.
    devices_ : tuple of str
        Only after a fit with ``devices``: the devices, in rank order.
    part_device_ : ndarray of shape (n_partitions\_,)
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
        "max_device_memory": PARTITION_CONSTRAINTS["max_device_memory"],
        "alpha": [Interval(Real, 0.0, None, closed="left"), None],
        "gamma": [Interval(Real, 0.0, None, closed="neither"), StrOptions({"auto", "scale"}),
                  None],
        "kernel_params": [dict, None],
        "verbose": ["verbose"],
    }

    def __init__(self, kernel="rbf", sigma="scale", lam="auto", fit_intercept=True, degree=3,
                 coef0=1.0, n_partitions="auto", partition="kbalance", combine="nearest",
                 dtype=None, device="auto", devices=None, max_device_memory=None, n_jobs=None,
                 random_state=None, alpha=None, gamma=None, kernel_params=None, verbose=0):
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
        self.max_device_memory = max_device_memory
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
        return fit_partitioned(self, X, y, sample_weight)

    # -- what the partitioned fit asks (gpuml.pipeline.PartitionedEstimator) ---------------
    _solve_params = ("sigma", "lam", "alpha", "gamma", "degree", "coef0", "kernel_params",
                     "fit_intercept", "combine", "verbose")

    def _fit_needs(self, sample_weight=None) -> tuple:
        """A kernel matrix, a kernel computed on the CPU, weighted settings: what not every
        executor runs."""
        if self.kernel == "precomputed" and self.n_partitions not in (1, "auto"):
            raise ValueError("kernel='precomputed' needs n_partitions=1 (or 'auto'): "
                             "partitioning and nearest-centre routing need the samples' "
                             "features")
        needs = []
        if sample_weight is not None:
            needs.append(Need(Capability.WEIGHTED_SETTINGS, "sample_weight"))
        if self.kernel == "precomputed":
            needs.append(Need(Capability.KERNEL_MATRIX, "kernel='precomputed'"))
        if self._host_only():
            needs.append(Need(Capability.HOST_KERNEL, f"kernel={self.kernel!r}"))
        return tuple(needs)

    def _validate(self, X, y, sample_weight, backend) -> FitData:
        """KernelRidge's checks of in-memory input; X, y and the weights on ``backend``."""
        backend, X, y = self._prepare(X, y, backend)
        sample_weight = self._sample_weight(backend, sample_weight, X)
        precomputed = self.kernel == "precomputed"

        def sample(rows):
            idx = backend.xp.asarray(rows)
            return (X[idx][:, idx] if precomputed else _take(backend.xp, X, rows),
                    _take(backend.xp, y, rows),
                    None if sample_weight is None else _take(backend.xp, sample_weight, rows))

        return FitData(X, int(X.shape[0]), int(X.shape[1]), targets=y, weights=sample_weight,
                       stats=X, backend=backend, itemsize=X.dtype.itemsize, sample=sample)

    def _fit_dtype(self, X):
        return self._dtype(X)

    def _split_method(self) -> str:
        return self.partition

    def _part_cost(self) -> CholeskyCost:
        return CholeskyCost(type(self).__name__, self.n_jobs)

    def _part_solver(self, data) -> CholeskyPartSolver:
        """σ (``"scale"``: from the data) and λ (``"auto"``: searched on a subsample); the
        Cholesky solver with them."""
        sigma = self._resolve_sigma(data.stats, data.weights)
        rows = auto_lam_rows(data.n, data.weights)
        X, y, w = data.sample(rows) if self.lam == "auto" else (None, None, None)
        backend = data.backend or CPU
        with backend.use():
            lam = self._resolve_lam(backend, X, y, w, sigma)
        return CholeskyPartSolver(
            self._kernel(self._fit_gamma(sigma, data.n_features)), sigma, lam,
            None if self.alpha is None else float(self.alpha), self.fit_intercept,
            self.kernel == "precomputed", self.kernel, self.n_jobs, self._part_cost())

    def _assemble(self, partitioning, result, data):
        solver = result.solver
        if result.device_fits is not None:
            # A device group's parts are on their devices already: kept for prediction there.
            for j, (backend, fit) in enumerate(result.device_fits):
                on_device(self, backend, ("part", j), lambda fit=fit: (fit.X, fit.dual_coef))
        self._store_fit(result.backend, partitioning, result.fits, solver.sigma, solver.lam,
                        data.weights, kept=result.kept)

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

        host = _check_sample_weight(from_device(sample_weight), np.empty((X.shape[0], 0)),
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
            predicted on its worker; after a Dask fit, each chunk's rows on the
            workers holding their parts), NumPy otherwise.
        """
        if is_dask_collection(X):
            check_is_fitted(self, "dual_coef_")
            if self._kept():
                return dask_module().predict_kept(self, X, self._kernel(self.gamma_),
                                                  self._host_intercepts(),
                                                  self.dual_coef_.dtype)
            columns = self.dual_coef_.shape[1] if self.dual_coef_.ndim == 2 else None
            return dask_module().predict_blocks(self, X, "predict", out_columns=columns,
                                                dtype=self.dual_coef_.dtype)
        return self._predict(X)
