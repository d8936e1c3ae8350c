"""AsyGCDSVC: kernel SVM trained by asynchronous greedy coordinate descent (You 2020, ch. 4)."""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from .._backend import resolve, to_numpy, to_output
from .._validation import validate_X
from ..kernels import GCDProblem, gcd_plan, gcd_solve_batch
from ..partition import assign_nearest, kmeans, partition
from ._partitioned import KERNEL_CONSTRAINTS
from ._svm import KernelSVMMixin, class_pairs, ovo_votes, ovr_decision

#: k-means for the variable blocks runs on at most this many samples (§4.4).
KMEANS_SUBSAMPLE = 20_000
#: Fewest variables per worker: smaller blocks buy more contention on g than parallelism.
MIN_BLOCK_SIZE = 256


class AsyGCDSVC(KernelSVMMixin, ClassifierMixin, BaseEstimator):
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
    adds; see :mod:`gpuml.kernels._cpu.gcd`), each with its own LRU cache of
    kernel-column pieces; on a GPU each worker is a persistent CUDA thread
    block adding into one shared gradient with atomic adds. One worker is the serial greedy
    coordinate descent of Alg 13.

    The model has no bias term (unlike :class:`sklearn.svm.SVC`): the
    decision value is :math:`f(x) = \sum_i \alpha_i y_i K(x_i, x)`.

    Multiclass problems are split one-vs-one, as SVC does: one binary problem
    per pair of classes, predictions by voting. On a GPU all pairs run in one
    kernel launch (each pair its own thread blocks, counters and stop flag).

    Workers that step at the same time damp their steps when the others'
    concurrent steps overshoot their coordinate (our addition to Alg 14, which
    keeps GPU thread blocks running in near lockstep from oscillating; see
    :mod:`gpuml.kernels._cpu.gcd`); one worker is exactly Alg 13.

    Reproducibility: with ``n_workers=1`` a fit is deterministic (given
    ``random_state``). With several workers the order of updates depends on
    thread timing, so the solution is reproducible only to the tolerance of
    the objective; every run stops at a point whose largest projected
    gradient is below ``tol``.

    Parameters
    ----------
    C : float, default=1.0
        Upper bound of the dual variables (inverse regularisation), > 0.
    kernel : {"linear", "poly", "rbf", "sigmoid", "precomputed"}, default="rbf"
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
        (independent problems need no atomic adds: letter, 26 classes, 15,000
        samples on 2 cores fitted in 1.0 s this way against 6.1 s with 2
        workers per problem), on a GPU ``ceil(SMs / n_pairs)`` workers per
        problem (see :func:`gpuml.kernels.gcd_plan`).
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
    block_partition : {"kmeans", "kbalance", "random"}, default="kmeans"
        How variables are split among workers. k-means (§4.4, the default as
        in the paper) keeps related variables in one block but can make very
        unequal blocks (on one-hot data such as adult, one block took 99.8% of
        the variables); then one worker does nearly all the work, and fit
        warns (largest block over twice the mean share, or over 90% with two
        workers). ``"kbalance"``, recommended, keeps the k-means locality with
        equal blocks (K-balance, Alg 9: k-means centres, then each variable
        to the nearest block with room). ``"random"`` splits evenly. With
        ``kernel="precomputed"`` there are no features to cluster and the
        split is always random.
    class_weight : dict, "balanced" or None, default=None
        Multiplies C per class; with ``sample_weight`` the bound of sample i is
        ``C * class_weight[y_i] * sample_weight[i]``.
    device : {"auto", "cpu", "cuda"} or "cuda:N", default="auto"
    random_state : int, RandomState or None, default=None
        Seeds the k-means/random split and the random selection.
    verbose : int, default=0
        Print one line per binary problem when > 0.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    support_ : ndarray of shape (n_SV,)
        Indices of the training samples with a non-zero dual variable in any pair.
    support_vectors_ : ndarray or sparse matrix of shape (n_SV, n_features)
    n_support_ : ndarray of shape (n_classes,)
        Support vectors per class.
    dual_coef_ : ndarray of shape (n_pairs, n_SV)
        ``y_i * alpha_i`` of every support vector in each binary problem (zero
        where it does not take part); pairs are ``(a, b)`` with ``a < b`` in
        lexicographic order, ``y = +1`` for class ``b``. One row for two classes.
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
        "C": [Interval(Real, 0.0, None, closed="neither")],
        **KERNEL_CONSTRAINTS,
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
                 cache_size=None, block_partition="kmeans", class_weight=None,
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
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.pairwise = self.kernel == "precomputed"
        tags.input_tags.sparse = True
        # No intercept: only kernels with a constant component (rbf) can fit classes that sit
        # off the origin, so the others may score poorly on uncentred data by design.
        tags.classifier_tags.poor_score = self.kernel != "rbf"
        return tags

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Solve one bias-free SVM dual per pair of classes with Asy-GCD (Alg 14).

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            Or the (n_samples, n_samples) kernel matrix with kernel="precomputed".
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None
            Scales C per sample (0 pins that sample's dual variable at 0).

        Returns
        -------
        self
        """
        backend = resolve(self.device, X, y)
        X, y_idx, sample_C = self._validate_targets(X, y, sample_weight)
        rng = check_random_state(self.random_state)

        with backend.use():
            Xd = backend.asarray(X)
            if hasattr(Xd, "toarray") and self.kernel != "precomputed":
                Xd = Xd.toarray()
            n_pairs = len(self.classes_) * (len(self.classes_) - 1) // 2
            self.n_workers_, concurrent = gcd_plan(Xd, n_pairs, self.n_workers)
            self._fit_pairs(Xd, backend, y_idx, sample_C, rng, concurrent)
        self.support_vectors_ = X[self.support_] if self.kernel != "precomputed" else \
            np.zeros((len(self.support_), 0))
        if hasattr(self.support_vectors_, "get"):
            self.support_vectors_ = to_numpy(self.support_vectors_)
        self._device_cache = {}
        return self

    def _blocks(self, X, n_workers, rng):
        """The worker of every variable: k-means blocks (§4.4), K-balance or an even split."""
        n = X.shape[0]
        if n_workers == 1:
            return np.zeros(n, dtype=np.int64)
        if self.block_partition != "kmeans" or self.kernel == "precomputed":
            method = "random" if self.kernel == "precomputed" else self.block_partition
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
                Xp = X[rows_d][:, rows_d] if self.kernel == "precomputed" else X[rows_d]
                blocks = self._blocks(Xp, workers, pair_rng)
            else:
                blocks = np.zeros(len(rows), dtype=np.int64)
            problems.append(GCDProblem(rows, signs, sample_C[rows], blocks,
                                       pair_rng.randint(2**31 - 1)))
            largest.append((np.bincount(blocks).max() / len(rows), workers))
        cache = None if self.cache_size is None else int(self.cache_size * 2**20)
        results = gcd_solve_batch(X, self._kernel, problems, selection=self.selection,
                                  tol=self.tol, max_updates=self.max_updates,
                                  cache_bytes=cache, n_jobs=concurrent)
        for (a, b), problem, res in zip(pairs, problems, results):
            if self.verbose:
                print(f"[AsyGCDSVC] classes ({self.classes_[a]}, {self.classes_[b]}): "
                      f"{len(problem.rows)} variables, {res.n_workers} workers, "
                      f"{res.n_updates} updates, objective {res.objective:.6g}, "
                      f"max violation {res.max_violation:.2e}")
        capped = [res for res in results if not res.converged]
        if capped:
            warnings.warn(f"Asy-GCD stopped {len(capped)} of {len(results)} binary problems at "
                          f"the update cap before every projected gradient was below "
                          f"tol={self.tol:g} (largest left: "
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
        coef_full = np.zeros((len(pairs), len(y_idx)))
        for p, (problem, res) in enumerate(zip(problems, results)):
            coef_full[p, problem.rows] = problem.y * to_numpy(res.alpha).astype(np.float64)
        self.support_ = np.flatnonzero(np.any(coef_full != 0, axis=0))
        self.dual_coef_ = coef_full[:, self.support_]
        self.n_support_ = np.bincount(y_idx[self.support_], minlength=n_classes).astype(np.int32)
        self.objective_ = np.array([r.objective for r in results])
        self.max_violation_ = np.array([r.max_violation for r in results])
        self.n_updates_ = np.array([r.n_updates for r in results], dtype=np.int64)

    def _pair_values(self, X):
        """Decision value of every pair for every row: ``K(X, SV) @ dual_coef_.T``."""
        check_is_fitted(self)
        backend = resolve(self.device, X)
        X = validate_X(self, X, reset=False)
        with backend.use():
            Xd = backend.asarray(X)
            coef = self._on_device(backend, "dual_coef_")
            if self.kernel == "precomputed":
                values = Xd[:, backend.asarray(self.support_)] @ coef.T
            elif len(self.support_) == 0:
                values = backend.xp.zeros((X.shape[0], coef.shape[0]))
            else:
                values = self._kernel.dot(Xd, self._on_device(backend, "support_vectors_"), coef.T)
            return to_numpy(values).astype(np.float64, copy=False)

    def decision_function(self, X):
        """Signed distance-like values: (n,) for two classes, (n, n_classes) otherwise.

        For two classes, positive values mean ``classes_[1]``. For more, column
        k is the number of one-vs-one votes for class k plus its summed pairwise
        values squashed into (-1/3, 1/3) (SVC's "ovr" shape), so its argmax is
        the prediction.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_classes)
        """
        values = self._pair_values(X)
        n_classes = len(self.classes_)
        if n_classes == 2:
            return to_output(values[:, 0], X)
        # a positive pairwise value is a vote for the pair's second class
        votes, confidence = ovo_votes(-values, n_classes)
        return to_output(ovr_decision(votes, confidence), X)

    def predict(self, X):
        """Class labels: the sign for two classes, one-vs-one voting otherwise.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        scores = to_numpy(self.decision_function(X))
        if scores.ndim == 1:
            labels = self.classes_[(scores > 0).astype(np.int64)]
        else:
            labels = self.classes_[np.argmax(scores, axis=1)]
        return to_output(labels, X)
