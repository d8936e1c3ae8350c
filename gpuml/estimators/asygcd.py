"""AsyGCDSVC: kernel SVM trained by asynchronous greedy coordinate descent (You 2020, ch. 4)."""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from .._backend import resolve, to_numpy
from .._progress import Progress
from .._validation import refuse_dask, validate_X
from ..kernels import GCDProblem, compile_after_fit, gcd_plan, gcd_solve_batch
from ..partition import assign_nearest, kmeans, partition
from ..pipeline import gpu_compute_dtype
from ._params import CachedParamNames
from ._partitioned import KERNEL_CONSTRAINTS
from ._probability import PlattProbabilityMixin
from ._svm import KernelSVMMixin, class_pairs, pack_dual_coef, pair_values, primal_coef

#: k-means for the variable blocks runs on at most this many samples (§4.4).
KMEANS_SUBSAMPLE = 20_000
#: Fewest variables per worker: smaller blocks buy more contention on g than parallelism.
MIN_BLOCK_SIZE = 256


class AsyGCDSVC(CachedParamNames, KernelSVMMixin, PlattProbabilityMixin, ClassifierMixin,
                BaseEstimator):
    r"""Bias-free kernel SVM solved by asynchronous parallel greedy coordinate descent.

    Solves the dual of the SVM without intercept (You 2020, eq. 4.9)

    .. math:: \min_\alpha \tfrac12 \alpha^\top Q \alpha - e^\top \alpha
              \quad\text{s.t.}\quad 0 \le \alpha_i \le C_i,\qquad
              Q_{ij} = y_i y_j K(x_i, x_j)

    with Asy-GCD (Alg 14): the variables are split into one block per worker
    (k-means on a subsample of at most 20,000 points and nearest-centre
    assignment, §4.4, or an even random split); each worker repeatedly takes
    the variable of its block with the largest projected gradient (eq. 4.11),
    makes the exact one-variable step (eq. 4.10) and adds ``delta * q_i`` into
    the gradient, never waiting for the other workers. On the CPU the workers
    are threads running compiled code outside the GIL, each owning its block's
    rows of the gradient and adding the others' updates from a log (no atomic
    adds; see :mod:`gpuml.kernels.gcd.cpu`), each with its own LRU cache of
    kernel-column pieces; on a GPU each worker is a persistent CUDA thread
    block adding into one shared gradient with atomic adds. One worker is the serial greedy
    coordinate descent of Alg 13.

    The model has no bias term (unlike :class:`sklearn.svm.SVC`): the
    decision value is :math:`f(x) = \sum_i \alpha_i y_i K(x_i, x)`.

    Multiclass problems are split one-vs-one, as SVC does: one binary problem
    per pair of classes, predictions by voting. On a GPU all pairs run in one
    kernel launch (each pair its own thread blocks, counters and stop flag).

    Workers that step at the same time damp their steps when the others'
    concurrent steps overshoot their coordinate (an addition to Alg 14, which
    keeps GPU thread blocks running in near lockstep from oscillating; see
    :mod:`gpuml.kernels.gcd.cpu`); one worker is exactly Alg 13.

    Reproducibility: with ``n_workers=1`` a fit is deterministic (given
    ``random_state``). With several workers the order of updates depends on
    thread timing, so the solution is reproducible only to the tolerance of
    the objective; every run stops at a point whose largest projected
    gradient is below ``tol``. A small problem asked for several workers
    while numba is still compiling the workers (the first fit in a fresh
    install) is solved by Alg 13, the one-worker case, in NumPy (see
    ``docs/backend.md``), to the same tolerance.

    The model has no bias term (the dual of You 2020, eq. 4.9, has no
    equality constraint), so ``intercept_`` is zero; apart from that the
    fitted attributes and methods are :class:`sklearn.svm.SVC`'s (names,
    shapes, LIBSVM's ``dual_coef_`` layout and signs, ``coef_`` for the linear
    kernel, ``decision_function_shape``, ``break_ties``), so the two swap in
    code that reads them.

    Parameters
    ----------
    C : float, default=1.0
        Upper bound of the dual variables (inverse regularisation), > 0;
        ``inf`` for the hard margin, as SVC.
    kernel : {"linear", "poly", "rbf", "sigmoid", "precomputed"} or callable, default="rbf"
        A callable ``kernel(A, B)`` returns the kernel matrix, as for SVC (it
        is then a precomputed kernel to the solver).
    gamma : {"scale", "auto"} or float, default="scale"
        As in :class:`sklearn.svm.SVC`.
    degree : int, default=3
    coef0 : float, default=0.0
    n_workers : int or None, default=None
        Asynchronous workers (variable blocks) per binary problem. On the CPU
        an explicit value runs the problems one after another; on a GPU all
        problems run at once. None: for two classes, the usable CPU cores (or
        the GPU's streaming multiprocessors); for more classes on the CPU, one
        worker per one-vs-one problem with the problems spread over the cores
        (independent problems need no atomic adds, so this beats several
        workers per problem: bench/results/cpu-2core/asygcd-runs.md, "Against
        sklearn SVC"), on a GPU ``ceil(SMs / n_pairs)`` workers per problem
        (see :func:`gpuml.kernels.gcd_plan`).
        A binary problem of m samples uses ``max(1, min(n_workers, m // 256))``
        workers: blocks of fewer than 256 variables cost more in contention on
        the shared gradient than they gain in parallelism.
    selection : {"greedy", "random"}, default="greedy"
        ``"greedy"``: the largest projected gradient of the block (Asy-GCD).
        ``"random"``: a uniformly random variable of the block, the
        asynchronous stochastic coordinate descent baseline (PSCD, §4.5).
    tol : float, default=1e-3
        Stop when the largest projected gradient over all variables is below it.
    max_updates : int or None, default=None
        Stop each binary problem after this many coordinate updates; None:
        ``max(10**7, 100 m)`` for a problem of m samples (LIBSVM's cap on SMO
        steps), so no fit runs forever. A problem stopped by the cap before
        reaching ``tol`` raises a :class:`~sklearn.exceptions.ConvergenceWarning`.
    cache_size : float or None, default=None
        Kernel cache in MB. CPU: kernel columns over all workers, each worker
        owning an equal contiguous part (at least one column). GPU: the
        matrices Q of the problems of a launch are precomputed when they fit
        in this size and in free device memory, else kernel values are
        computed on the fly. None: 1024 MB on the CPU, a quarter of the free
        device memory on a GPU.
    block_partition : {"kbalance", "kmeans", "random"}, default="kbalance"
        How variables are split among workers. ``"kbalance"`` (the default)
        keeps the k-means locality of the paper's blocks with equal blocks
        (K-balance, Alg 9: k-means centres, then each variable to the nearest
        block with room). ``"kmeans"`` is the paper's rule (§4.4): related
        variables in one block, but blocks can be very unequal (on one-hot data
        one block can take nearly every variable), so one worker does nearly
        all the work, and fit warns (largest block over twice the mean share,
        or over 90% with two workers); bench/results/cpu-2core/asygcd_speedup_fit.md
        compares the two with two workers. The blocks only share out the work:
        every choice solves the same dual. ``"random"`` splits evenly. With
        ``kernel="precomputed"`` there are no features to cluster and the
        split is always random.
    class_weight : dict, "balanced" or None, default=None
        Multiplies C per class; with ``sample_weight`` the bound of sample i is
        ``C * class_weight[y_i] * sample_weight[i]``.
    decision_function_shape : {"ovr", "ovo"}, default="ovr"
        As SVC: "ovo" returns the pairwise values (positive for the pair's
        first class), "ovr" one column per class (votes plus bounded
        confidences).
    probability : bool or "deprecated", default="deprecated"
        SVC's Platt scaling, kept for code written for SVC, with SVC's
        ``FutureWarning`` whenever it is given (scikit-learn deprecated it in
        1.9 and removes it in 1.11). ``True`` fits
        ``CalibratedClassifierCV(<this classifier>, method="sigmoid",
        ensemble=False)`` on 5 stratified folds after the fit (about five more
        fits) and gives ``predict_proba``; use ``CalibratedClassifierCV``
        directly instead (docs/casvm.md, "Probabilities").
    break_ties : bool, default=False
        As SVC: with "ovr" and more than two classes, predict the argmax of
        ``decision_function`` instead of the one-vs-one vote.
    device : {"auto", "cpu", "cuda"} or "cuda:N", default="auto"
    random_state : int, RandomState or None, default=None
        Seeds the k-means/random split and the random selection.
    verbose : int, default=0
        When positive, print one line per one-vs-one pair as it finishes (its
        variables, workers, updates, objective and largest violation), from
        the thread that called ``fit`` (never interleaved); with ``tqdm``
        installed a fit that lasts over 2 s also shows a progress bar on stderr.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    class_weight_ : ndarray of shape (n_classes,)
    support_ : ndarray of shape (n_SV,)
        Indices of the training samples with a non-zero dual variable in any
        pair, grouped by class and ascending within a class (SVC's order).
    support_vectors_ : ndarray or sparse matrix of shape (n_SV, n_features)
        Shape (0, 0) for a precomputed or callable kernel, as SVC.
    n_support_ : ndarray of shape (n_classes,), int32
        Support vectors per class.
    dual_coef_ : ndarray or CSR matrix of shape (n_classes - 1, n_SV)
        SVC's (LIBSVM's) layout and signs: a support vector of class ``c``
        keeps its ``alpha_i y_i`` for the pair with class ``d`` in row
        ``d - 1`` if ``d > c``, else row ``d``; for two classes positive
        values favour ``classes_[1]``. CSR after a sparse fit.
    ovo_dual_coef_ : ndarray of shape (n_pairs, n_SV)
        The same numbers one row per pair (pairs ``(a, b)``, ``a < b``, in
        lexicographic order; positive for class ``a``, LIBSVM's sign), zero
        where a vector takes no part: what prediction uses.
    coef_ : ndarray or CSR matrix of shape (n_pairs, n_features)
        Only for ``kernel="linear"``: the primal weights, read-only, as SVC.
    intercept_ : ndarray of shape (n_pairs,)
        Zero: the bias-free model has no intercept (kept for SVC's contract).
    n_iter_ : ndarray of shape (n_pairs,), int32
        Coordinate updates per binary problem (``n_updates_``), where SVC
        counts SMO steps.
    fit_status_ : int
        0 if every problem reached ``tol``, 1 if ``max_updates`` stopped one.
    shape_fit_ : tuple
        Shape of the training ``X`` (of the kernel matrix for a callable kernel).
    objective_ : ndarray of shape (n_pairs,)
        Final dual objective (eq. 4.9) of each binary problem.
    max_violation_ : ndarray of shape (n_pairs,)
        Largest projected gradient (eq. 4.11) at the end of each problem.
    n_updates_ : ndarray of shape (n_pairs,)
        Coordinate updates made in each problem, over all workers.
    n_workers_ : int
        Workers per problem (each problem runs ``min(n_workers_, m // 256)``).
    n_features_in_ : int

    References
    ----------
    Yang You, "Fast and Accurate Machine Learning on Distributed Systems and
    Supercomputers", PhD thesis, UC Berkeley, 2020, chapter 4: Alg 12 (Asy-GCD),
    Alg 13 (GCD for the kernel SVM dual), Alg 14 (Asy-GCD for kernel SVM), eq. 4.9-4.11, §4.4
    (kernel caching, variable partitioning). Also You, Lian, Liu, Yu, Dhillon,
    Demmel, Hsieh, "Asynchronous parallel greedy coordinate descent", NIPS 2016.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.preprocessing import StandardScaler
    >>> from gpuml.estimators.asygcd import AsyGCDSVC
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> X = StandardScaler().fit_transform(X)
    >>> clf = AsyGCDSVC(n_workers=2, device="cpu", random_state=0).fit(X, y)
    >>> bool(clf.score(X, y) > 0.95)
    True
    """

    _parameter_constraints: dict = {
        # inf included (the hard margin), as SVC's constraint allows it.
        "C": [Interval(Real, 0.0, None, closed="right")],
        **KERNEL_CONSTRAINTS,
        "kernel": [*KERNEL_CONSTRAINTS["kernel"], callable],
        "decision_function_shape": [StrOptions({"ovr", "ovo"})],
        "break_ties": ["boolean"],
        "probability": ["boolean", StrOptions({"deprecated"})],
        "n_workers": [Interval(Integral, 1, None, closed="left"), None],
        "selection": [StrOptions({"greedy", "random"})],
        "tol": [Interval(Real, 0.0, None, closed="neither")],
        "max_updates": [Interval(Integral, 1, None, closed="left"), None],
        "cache_size": [Interval(Real, 0.0, None, closed="neither"), None],
        "block_partition": [StrOptions({"kmeans", "kbalance", "random"})],
        "class_weight": [StrOptions({"balanced"}), dict, None],
        "device": [str],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
    }

    def __init__(self, C=1.0, kernel="rbf", gamma="scale", degree=3, coef0=0.0,
                 n_workers=None, selection="greedy", tol=1e-3, max_updates=None,
                 cache_size=None, block_partition="kbalance", class_weight=None,
                 decision_function_shape="ovr", break_ties=False, probability="deprecated",
                 device="auto", random_state=None, verbose=0):
        self.C = C
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.n_workers = n_workers
        self.selection = selection
        self.tol = tol
        self.max_updates = max_updates
        self.cache_size = cache_size
        self.block_partition = block_partition
        self.class_weight = class_weight
        self.decision_function_shape = decision_function_shape
        self.break_ties = break_ties
        self.probability = probability
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # No intercept: only kernels with a constant component (rbf) can fit classes that sit
        # off the origin, so the others may score poorly on uncentred data by design.
        tags.classifier_tags.poor_score = self.kernel != "rbf"
        return tags

    @_fit_context(prefer_skip_nested_validation=True)
    @compile_after_fit
    def fit(self, X, y, sample_weight=None):
        """Solve one bias-free SVM dual per pair of classes with Asy-GCD (Alg 14).

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            Or the (n_samples, n_samples) kernel matrix with kernel="precomputed".
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None
            Scales C per sample. A weight of 0 or less pins that sample's dual
            variable at 0, which leaves it out as SVC does.

        Returns
        -------
        self
        """
        refuse_dask(self, X, y, sample_weight)
        self._warn_probability()
        backend = resolve(self.device, X, y)
        X, y_idx, sample_C = self._validate_targets(X, y, sample_weight)
        self._sparse = sp.issparse(X) or hasattr(X, "tocsr")
        self.shape_fit_ = tuple(X.shape)
        sample_C = np.maximum(sample_C, 0.0)
        rng = check_random_state(self.random_state)
        precomputed = self._kernel_name == "precomputed"

        with backend.use():
            Xd = backend.asarray(X)
            if hasattr(Xd, "toarray") and not precomputed:
                Xd = Xd.toarray()
            n_pairs = len(self.classes_) * (len(self.classes_) - 1) // 2
            self.n_workers_, concurrent = gcd_plan(Xd, n_pairs, self.n_workers)
            self._fit_pairs(Xd, backend, y_idx, sample_C, rng, concurrent)
        self.support_vectors_ = X[self.support_] if not precomputed else np.empty((0, 0))
        if hasattr(self.support_vectors_, "get"):
            self.support_vectors_ = to_numpy(self.support_vectors_)
        self._device_cache = {}
        self._fit_probability(X, y, y_idx, sample_C, sample_weight)
        return self

    def _blocks(self, X, n_workers, rng):
        """The worker of every variable: k-means blocks (§4.4), K-balance or an even split."""
        n = X.shape[0]
        if n_workers == 1:
            return np.zeros(n, dtype=np.int64)
        precomputed = self._kernel_name == "precomputed"
        if self.block_partition != "kmeans" or precomputed:
            method = "random" if precomputed else self.block_partition
            return to_numpy(partition(X, n_workers, method, random_state=rng)[0])
        sub = np.sort(rng.choice(n, KMEANS_SUBSAMPLE, replace=False)) if n > KMEANS_SUBSAMPLE \
            else None
        Xs = X if sub is None else X[sub]
        _, centers = kmeans(Xs, n_workers, random_state=rng)
        return to_numpy(assign_nearest(X, centers)).astype(np.int64)

    def _fit_pairs(self, X, backend, y_idx, sample_C, rng, concurrent=1):
        n_classes = len(self.classes_)
        pairs = class_pairs(n_classes)
        # One seed per pair, drawn up front: the same fit whether pairs run in turn or at once.
        seeds = rng.randint(2**31 - 1, size=len(pairs))
        problems, largest = [], []
        for (a, b), seed in zip(pairs, seeds):
            pair_rng = np.random.RandomState(seed)
            rows = np.flatnonzero((y_idx == a) | (y_idx == b))
            signs = np.where(y_idx[rows] == b, 1.0, -1.0)
            workers = max(1, min(self.n_workers_, len(rows) // MIN_BLOCK_SIZE))
            if workers > 1:
                rows_d = backend.asarray(rows)
                Xp = X[rows_d][:, rows_d] if self._kernel_name == "precomputed" else X[rows_d]
                blocks = self._blocks(Xp, workers, pair_rng)
            else:
                blocks = np.zeros(len(rows), dtype=np.int64)
            problems.append(GCDProblem(rows, signs, sample_C[rows], blocks,
                                       pair_rng.randint(2**31 - 1)))
            largest.append((np.bincount(blocks).max() / len(rows), workers))
        cache = None if self.cache_size is None else int(self.cache_size * 2**20)
        progress = Progress("AsyGCDSVC", len(pairs), self.verbose, unit="pair")

        def report(k, res):
            a, b = pairs[k]
            progress.update(k, f"classes ({self.classes_[a]}, {self.classes_[b]}), "
                               f"{len(problems[k].rows)} variables, {res.n_workers} workers, "
                               f"{res.n_updates} updates, objective {res.objective:.6g}, "
                               f"max violation {res.max_violation:.2e}"
                               + ("" if res.converged else ", stopped at max_updates"))

        results = gcd_solve_batch(X, self._kernel, problems, selection=self.selection,
                                  tol=self.tol, max_updates=self.max_updates,
                                  cache_bytes=cache, n_jobs=concurrent,
                                  progress=report if progress else None)
        progress.close()
        capped = [res for res in results if not res.converged]
        if capped:
            names = [f"({self.classes_[a]}, {self.classes_[b]})"
                     for (a, b), res in zip(pairs, results) if not res.converged]
            warnings.warn(f"Asy-GCD stopped {len(capped)} of {len(results)} binary problems at "
                          f"the update cap before every projected gradient was below "
                          f"tol={self.tol:g} (classes {', '.join(names[:8])}"
                          f"{', ...' if len(names) > 8 else ''}; largest left: "
                          f"{max(r.max_violation for r in capped):.3g}); raise max_updates or "
                          "tol", ConvergenceWarning, stacklevel=4)
        # Unequal blocks: the largest holds over twice the mean share (over 90% with two
        # workers); then one worker does most of the work while the others idle.
        most_unbalanced, worst = 0.0, (0.0, 0)
        for share, workers in largest:
            if workers > 1 and share / min(0.9, 2.0 / workers) > most_unbalanced:
                most_unbalanced = share / min(0.9, 2.0 / workers)
                worst = (share, workers)
        if most_unbalanced > 1.0:
            warnings.warn(f"k-means gave very unequal variable blocks (the largest held "
                          f"{worst[0]:.1%} of a problem's variables, {worst[1]} workers), so "
                          "the workers cannot share the work; block_partition='kbalance' "
                          "keeps the k-means locality with equal blocks (recommended), "
                          "'random' splits evenly", UserWarning, stacklevel=4)
        # alpha_i y_i with LIBSVM's sign: positive for the first class of the pair
        # (the problems above label the second class +1).
        coef_full = np.zeros((len(pairs), len(y_idx)))
        for p, (problem, res) in enumerate(zip(problems, results)):
            coef_full[p, problem.rows] = -problem.y * to_numpy(res.alpha).astype(np.float64)
        support = np.flatnonzero(np.any(coef_full != 0, axis=0))
        self.support_ = support[np.argsort(y_idx[support], kind="stable")]
        self.ovo_dual_coef_ = coef_full[:, self.support_]
        self._check_finite_model(self.ovo_dual_coef_)
        sign = -1.0 if n_classes == 2 else 1.0
        packed = sign * pack_dual_coef(self.ovo_dual_coef_, y_idx[self.support_], n_classes)
        self.dual_coef_ = sp.csr_matrix(packed) if self._sparse else packed
        self.intercept_ = np.zeros(len(pairs))
        self.n_support_ = np.bincount(y_idx[self.support_], minlength=n_classes).astype(np.int32)
        self.objective_ = np.array([r.objective for r in results])
        self.max_violation_ = np.array([r.max_violation for r in results])
        self.n_updates_ = np.array([r.n_updates for r in results], dtype=np.int64)
        self.n_iter_ = self.n_updates_.astype(np.int32)
        self.fit_status_ = 0 if all(bool(r.converged) for r in results) else 1

    @property
    def coef_(self):
        """Primal weights for ``kernel="linear"`` (read-only, as SVC's; see Attributes)."""
        check_is_fitted(self)
        if self.kernel != "linear":
            raise AttributeError("coef_ is only available when using a linear kernel")
        return primal_coef(self.ovo_dual_coef_, self.support_vectors_,
                           len(self.classes_) == 2)

    def _ovo_values(self, X):
        """Pairwise decision values ``K(X, SV) @ ovo_dual_coef_.T`` (positive: first class).

        Returns the values, float64 on the host, and None: every pair votes.
        """
        X = self._check_predict_input(X)
        backend = resolve(self.device, X)
        X = validate_X(self, X, reset=False)
        with backend.use():
            Xd = backend.asarray(X)
            if len(self.support_) == 0:
                values = backend.xp.zeros((X.shape[0], self.ovo_dual_coef_.shape[0]))
            else:
                coef = self._pair_coef(backend)
                if self._kernel_name == "precomputed":
                    vectors = backend.asarray(self.support_)
                else:
                    # Kernel values in float32 on a GPU for float32 rows, summed in float64.
                    vectors = self._on_device(backend, "support_vectors_")
                    vectors = vectors.astype(gpu_compute_dtype(backend, Xd, vectors.dtype),
                                             copy=False)
                values = pair_values(self._kernel, Xd, vectors, coef)
            return to_numpy(values).astype(np.float64, copy=False), None
