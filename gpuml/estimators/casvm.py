"""CA-SVM: communication-avoiding kernel SVM (You 2020, chapter 2, Alg 3, 4 and 5)."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from .._backend import to_numpy
from .._progress import Progress
from .._validation import check_n_partitions
from ..kernels import compile_after_fit
from ..pipeline import Capability, FitData, Need, PartitionedEstimator
from ..pipeline.fit import fit_partitioned
from ._kept_svm import KEPT_STATE, KeptSVMMixin, support_arrays
from ._params import CachedParamNames
from ._part_prediction import PartPredictionMixin
from ._partitioned import (
    KERNEL_CONSTRAINTS,
    PARTITION_CONSTRAINTS,
    auto_n_partitions,
    warn_poor_parts,
    warn_stopped_parts,
)
from ._probability import PlattProbabilityMixin
from ._smo_path_solver import solve_together
from ._smo_solver import PART_C_SCALES, SMOCost, SMOPartSolver, part_line
from ._svm import KernelSVMMixin, primal_coef, support_vector_blocks

#: Default number of parts: ``ceil(n / AUTO_PART_ROWS)`` (docs/casvm.md, "How many parts").
DEFAULT_N_PARTITIONS = "auto"
#: ``n_partitions="auto"``: the most rows a part holds, solved on the CPU / on a GPU (an
#: SMO solve of m rows costs m^2 or more: bounded parts, a fit linear in n).
AUTO_PART_ROWS = 2048
AUTO_PART_ROWS_GPU = 8192
#: Default kernel cache per part in MB (see docs/casvm.md).
DEFAULT_CACHE_SIZE = 1024.0
#: The training schemes of You 2020, sections 2.2-2.4, as settings (``method=``):
#: how the models of the parts become the classifier.
METHODS = ("casvm", "cascade", "dcsvm", "dcfilter")
#: The split each method makes with ``partition="auto"``. CA-SVM: FCFS (Alg 3), balanced
#: and local (bench/results/cpu-2core/casvm_defaults.md); the baselines: the paper's
#: (Cascade splits evenly, DC-SVM and DC-Filter cluster with k-means).
METHOD_PARTITION = {"casvm": "fcfs", "cascade": "random", "dcsvm": "kmeans",
                    "dcfilter": "kmeans"}
#: Default number of nearest support vectors that weigh the parts (``combine="neighbors"``;
#: values compared in bench/results/cpu-2core/casvm_prediction_explore.md).
DEFAULT_N_NEIGHBORS = 20
#: Default ``blend_margin`` of ``combine="auto"``: the rows whose nearest part's pairwise
#: values all lie this far from 0 (in units of the SVM margin) keep them
#: (bench/results/cpu-2core/casvm_predict.md).
DEFAULT_BLEND_MARGIN = 0.6


class CASVMClassifier(CachedParamNames, PartitionedEstimator, PartPredictionMixin, KeptSVMMixin,
                      KernelSVMMixin, PlattProbabilityMixin, ClassifierMixin, BaseEstimator):
    """Communication-avoiding kernel SVM: P independent SMO solvers, samples judged by their parts.

    ``fit`` splits the training set into ``n_partitions`` parts with the
    chosen partitioner, keeps one centre per part, and trains one kernel SVM
    per part with SMO; the parts never communicate. The paper's CA-SVM
    (Alg 5; here ``combine="nearest", part_C="none"``) trains every part with
    the same C and sends every sample to the part whose centre is nearest,
    whose model judges it. By default each part's C is scaled to its size
    (``part_C="sqrt"``) and a sample's decision values are those of the parts
    holding its nearest support vectors, weighted by their share
    (``combine="neighbors"``), which keeps more of SVC's accuracy at the same
    split and fit time (bench/results/cpu-2core/casvm_defaults.md;
    docs/casvm.md, "Defaults"). The paper's baselines are settings too
    (``method=``): Cascade SVM, DC-SVM and DC-Filter train a tree of layers
    and end with one SVM. With ``n_partitions=1`` it is an exact kernel SVM
    solving the same dual as :class:`sklearn.svm.SVC` (LIBSVM's SMO with
    second-order working-set selection, shrinking and a kernel cache).

    Multiclass problems are solved one-vs-one inside each part, as SVC does.
    A part that holds one class always predicts it; a pair with one class
    absent from a part votes for the class that is present (no vote when
    both are absent).

    Parameters
    ----------
    C : float, default=1.0
        Regularisation; the upper bound of every dual variable before class
        and sample weights (``C_i = C * class_weight[y_i] * sample_weight_i``,
        as LIBSVM). ``C=inf`` gives the hard-margin SVM, as in SVC.
    kernel : {"rbf", "linear", "poly", "sigmoid", "precomputed"} or callable, default="rbf"
        With "precomputed", ``X`` is the square training kernel matrix in
        ``fit`` and ``K(X_test, X_train)`` in ``predict``; only
        ``n_partitions=1`` is allowed then, because partitioning and
        nearest-centre routing need the samples' features. A callable
        ``kernel(A, B)`` returns the kernel matrix between the samples of
        ``A`` and ``B`` (which it receives as given, as SVC passes them); it
        is turned into a precomputed matrix, with the same restriction.
    gamma : {"scale", "auto"} or float, default="scale"
        Kernel coefficient, resolved on the whole training set as SVC does.
    degree : int, default=3
    coef0 : float, default=0.0
    n_partitions : int or "auto", default="auto"
        Number of parts P; ``1`` gives the exact SVM. More parts fit faster
        and lose more accuracy against SVC. ``"auto"``: parts of at most
        2048 rows (8192 on a GPU), ``ceil(n / 2048)``: the exact SVM up to
        2048 rows, a fit time linear in n beyond (docs/casvm.md, "How many
        parts"); one part for a precomputed kernel. The paper's prediction
        (``part_C="none", combine="nearest"``) loses more than the defaults
        do, the more the fewer rows per class a part holds, so with it many
        classes need a small P (bench/results/cpu-2core/casvm_tradeoff.md,
        casvm_parts.md).
    partition : {"auto", "random", "contiguous", "fcfs", "kmeans", "kbalance", "bkm"}, \
default="auto"
        How the training set is split (docs/casvm.md, "Partitioners";
        bench/results/cpu-2core/casvm_partitioners.md). ``"auto"``: the
        method's own split, which ``partition_`` names: ``"fcfs"`` for CA-SVM,
        ``"random"`` for Cascade, ``"kmeans"`` for DC-SVM and DC-Filter.
        ``"fcfs"``: FCFS-SVM (Alg 3: random centres, each sample to the nearest
        part with room), balanced, local and as fast as the random split.
        ``"random"``: the paper's CA-SVM (Alg 5). ``"contiguous"``: Alg 5 as
        the paper ran it (casvm2: part j is the j-th run of consecutive rows),
        the random split for rows in random order (shuffle sorted data first);
        on Dask input no row moves between workers and no partitioning pass
        runs. ``"kmeans"``: CP-SVM, whose parts are unequal, so it is slower
        at the same P and its speed depends on the seed. ``"kbalance"``: the
        K-balance split of chapter 3; ``"bkm"``: BKM-SVM (Alg 4).
    method : {"casvm", "cascade", "dcsvm", "dcfilter"}, default="casvm"
        How the parts' models become the classifier (You 2020, sections
        2.2-2.4; docs/casvm.md, "Cascade, DC-SVM, DC-Filter"). ``"casvm"``:
        the parts' SVMs are the model, each sample judged by its parts'
        (``combine``). The others train a binary tree of layers up to one SVM,
        the model (:mod:`gpuml.estimators._tree`; ``part_C`` and ``combine`` do
        not apply): ``"cascade"`` (Graf et al.) and ``"dcfilter"`` pass only
        each one-vs-one problem's support vectors up the tree, ``"dcsvm"``
        (Hsieh et al.) every row, so its model is the exact SVM's. One device
        only (no ``devices``, no Dask input).
    part_C : {"sqrt", "linear", "none"}, default="sqrt"
        How ``C`` is scaled in a part of ``m`` of the ``n`` training rows
        (``method="casvm"``; the tree methods keep ``C``): ``"sqrt"`` multiplies
        it by ``sqrt(n / m)`` (4 for 16 equal parts), ``"linear"`` by ``n / m``,
        ``"none"`` keeps it; 1 with ``n_partitions=1`` (the exact SVM). A part
        with the whole problem's C is more regularised than the whole problem;
        this pays when the parts' values are blended (docs/casvm.md, "Prediction").
    combine : {"auto", "neighbors", "nearest"}, default="auto"
        How the parts' models judge a sample (``method="casvm"``;
        docs/casvm.md, "Prediction"). ``"nearest"``: the model of the part
        whose centre is nearest (Alg 5). ``"neighbors"``: the pairwise decision
        values of the parts that hold the sample's ``n_neighbors`` nearest
        support vectors, each weighted by its share of them, then voted on as
        one model's (searched among the support vectors of the sample's 16
        nearest parts), several times ``"nearest"``'s time. ``"auto"``: the
        nearest part's values where the pairs it trained settle the vote with
        every value ``blend_margin`` or more from 0, ``"neighbors"`` elsewhere
        (a minority of samples; more when parts lack classes): nearly
        ``"neighbors"``'s accuracy at a fraction of its time (docs/casvm.md,
        "Prediction"; bench/results/cpu-2core/casvm_predict.md).
    n_neighbors : int, default=20
        Support vectors that weigh the parts in the blend
        (bench/results/cpu-2core/casvm_prediction_explore.md compares values).
    blend_margin : float >= 0, default=0.6
        ``combine="auto"``: how far from 0 every pairwise value of the nearest
        part's model must lie for a sample to keep its values, in units of the
        SVM margin (support vectors on it have ``|value| = 1``). A pair the
        part did not train counts as open. ``inf`` blends every sample (as
        ``"neighbors"``).
    tol : float, default=1e-3
        Stopping tolerance on the KKT gap (LIBSVM's ``eps``).
    max_iter : int, default=-1
        SMO steps per binary problem at most; -1 for LIBSVM's cap of
        ``max(10**7, 100 * n)`` steps on a problem of ``n`` samples. A problem
        stopped by either warns with a ``ConvergenceWarning``, as SVC.
    cache_size : float, default=1024
        Kernel cache in MB **per part**. A part whose kernel matrix fits is
        computed whole with one GEMM just before its one-vs-one problems are
        solved, shared by them and dropped after them (so up to ``n_jobs``
        parts' matrices at once; every part's when there are fewer than
        8 x ``n_jobs`` parts); otherwise rows are computed on demand and kept
        in an LRU cache of this size.
    shrinking : bool or "auto", default="auto"
        LIBSVM's shrinking heuristic (SVC's ``shrinking=True``). ``"auto"``:
        on for the SMO problems of more than 1,024 samples, where a solve is
        long enough for it to pay, off for smaller ones (their solves are
        short, and a first fit's run in NumPy while numba compiles).
    class_weight : dict, "balanced" or None, default=None
        Multiplies C per class, as SVC.
    decision_function_shape : {"ovr", "ovo"}, default="ovr"
        As SVC: "ovr" turns the one-vs-one values into one column per class
        (votes plus bounded confidences); "ovo" returns the pairwise values.
    probability : bool or "deprecated", default="deprecated"
        SVC's Platt scaling, kept for code written for SVC, with SVC's
        ``FutureWarning`` whenever it is given (scikit-learn deprecated it in
        1.9 and removes it in 1.11). ``True`` fits
        ``CalibratedClassifierCV(<this classifier>, method="sigmoid",
        ensemble=False)`` on 5 stratified folds after the fit (about five more
        fits) and gives ``predict_proba``; use ``CalibratedClassifierCV``
        directly instead (docs/casvm.md, "Probabilities").
    break_ties : bool, default=False
        As SVC: with "ovr" and more than two classes, ``predict`` returns the
        argmax of ``decision_function`` (ties in the votes broken by the
        confidences) instead of the one-vs-one vote (ties: lowest class).
    device : str, default="auto"
        "auto", "cpu", "cuda" or "cuda:N" (see :mod:`gpuml._backend`).
    devices : None, "all" or list, default=None
        Several devices (docs/scale-out.md). None: one device, ``device``.
        ``"all"``: every GPU; or a list of GPU ids / ``"cuda:N"`` names. The
        rows are sharded over the devices for partitioning, the parts placed
        on the devices by their ``m^2`` cost, each device solves its parts in
        its own host thread, and prediction sends each row to its part's
        device; the model equals the one-device fit with the same partition.
        ``"cpu"`` entries run CPU ranks (threads of this process) through the
        same code, to try a multi-device setup without GPUs. Leave
        ``device="auto"`` when giving ``devices``.
    max_device_memory : int, str or None, default=None
        Bytes (or ``"2GB"``, ``"512MiB"``) the fit may use on its device. Given
        (or, when None, on a GPU whose free memory is less than twice the
        data), the data stay on the host and the parts go through the device in
        groups that fit, each group's rows copied while the previous one is
        solved; a part that alone does not fit is refused before any work
        (docs/scale.md). The model is the one of an unbounded fit.
    n_jobs : int or None, default=None
        CPU threads solving parts, and predicting blocks of rows. None: by the size
        (:func:`gpuml.kernels.part_threads`; a thread per 4,096 rows predicted), up to
        the threads BLAS may use: every core for large work, one for small; an int as joblib's.
    random_state : int, RandomState or None, default=None
        Seeds the partitioner.
    verbose : int, default=0
        When positive, print one line per part as it finishes (its rows, SMO
        problems and iterations) and a summary line, all from the thread that
        called ``fit`` (never interleaved); with ``tqdm`` installed a fit that
        lasts over 2 s also shows a progress bar on stderr.

    Attributes
    ----------
    SVC's attributes keep SVC's names, shapes, layouts and signs, so that
    ``CASVMClassifier(n_partitions=1)`` is a drop-in for ``SVC``. With
    ``n_partitions > 1`` each support vector belongs to one part
    (``support_part_``), the SVC arrays are the union of the parts' models,
    and ``intercept_`` and ``coef_`` gain a leading part axis.

    classes_ : ndarray of shape (n_classes,)
    class_weight_ : ndarray of shape (n_classes,)
        The multiplier of C per class (1 without ``class_weight``), as SVC.
    n_features_in_ : int
        For a callable kernel, the number of training samples (the width of
        the kernel matrix the fit ran on).
    shape_fit_ : tuple
        Shape of the training ``X`` (of the kernel matrix for a callable
        kernel), as SVC.
    centers_ : ndarray of shape (n_partitions, n_features)
        Routing centres (the part means for balanced splits); one row, the
        mean, for the tree methods (their model is one SVM).
    partition_ : str
        The partitioner used (``partition`` with ``"auto"`` resolved).
    partition_sizes_ : ndarray of shape (n_partitions,)
        Rows per part of the split (the first layer for the tree methods).
    n_partitions_ : int
        The number of parts P of the split (``n_partitions`` with ``"auto"``
        resolved).
    layer_sizes_ : list of int ndarrays
        Tree methods only: the rows of each node trained in each layer, first
        layer first (a node carried up unmerged is not repeated).
    layer_n_iter_ : ndarray of shape (n_layers,)
        Tree methods only: SMO steps per layer, over all its nodes and pairs.
    support_ : ndarray of shape (n_SV,)
        Training indices of the support vectors, grouped by class and
        ascending within a class (SVC's order).
    support_vectors_ : ndarray or CSR matrix of shape (n_SV, n_features)
        In the order of ``support_``; sparse after a sparse fit. Shape (0, 0)
        for a precomputed or callable kernel, as SVC.
    n_support_ : ndarray of shape (n_classes,), int32
        Support vectors per class.
    dual_coef_ : ndarray or CSR matrix of shape (n_classes - 1, n_SV)
        LIBSVM's layout, as SVC: a support vector of class ``c`` holds its
        ``alpha_i y_i`` for the pair with class ``d`` in row ``d - 1`` if
        ``d > c``, else row ``d``. For two classes the sign is SVC's:
        positive for ``classes_[1]``. Sparse (CSR) after a sparse fit.
    coef_ : ndarray or CSR matrix of shape (n_pairs, n_features)
        Only for ``kernel="linear"``: the primal weights, read-only, as SVC
        (sparse after a sparse fit); ``(n_partitions, n_pairs, n_features)``,
        one set per part, when ``n_partitions > 1``.
    intercept_ : ndarray of shape (n_pairs,)
        SVC's intercepts (binary sign as ``dual_coef_``);
        ``(n_partitions, n_pairs)`` when ``n_partitions > 1``. A pair not
        trained in a part has intercept -1, +1 or 0 there (a constant vote
        for the class that is present, or none; see ``pair_status_``).
    n_iter_ : ndarray of shape (n_problems,), int32
        SMO steps of every one-vs-one problem solved:
        ``part_n_iter_[pair_status_ == 2]``, part by part, and within a part
        the pairs it trained in SVC's order; a pair a part could not train has
        no entry, so every entry is at least 1 (unless ``max_iter=0``). With
        one part this is SVC's ``(n_pairs,)`` (as SVC, a class without a sample
        of positive weight drops its pairs). For the tree methods, one entry
        per pair the model trained, summed over every layer (``layer_n_iter_``
        splits them by layer).
    fit_status_ : int
        0 if every problem converged, 1 if ``max_iter`` stopped one (as SVC).
    support_part_ : ndarray of shape (n_SV,)
        The part each support vector belongs to (and predicts in).
    ovo_dual_coef_ : ndarray of shape (n_pairs, n_SV)
        ``alpha_i y_i`` of every support vector in every one-vs-one problem,
        ``y = +1`` for the first class of the pair (pairs in SVC's order:
        (0, 1), (0, 2), ..., (1, 2), ...); zero where a vector takes no part.
        Columns as ``support_``.
    part_intercept_ : ndarray of shape (n_partitions, n_pairs)
        Per part and pair, LIBSVM's sign (``+`` favours the pair's first
        class) for every number of classes.
    pair_status_ : ndarray of shape (n_partitions, n_pairs)
        2: the pair was trained in the part; 1: only one of its classes was
        there (constant vote); 0: neither (no vote).
    part_n_iter_ : ndarray of shape (n_partitions, n_pairs)
        SMO steps per part and pair, 0 where the pair was not trained; for
        the tree methods, the last layer's steps (one row).
    objective_ : ndarray of shape (n_partitions, n_pairs)
        LIBSVM's dual objective ``1/2 a'Qa - sum(a)`` per problem (NaN when
        not trained).
    devices_ : tuple of str
        Only after a fit with ``devices``: the devices, in rank order.
    part_device_ : ndarray of shape (n_partitions,)
        Only after a fit with ``devices``: the index in ``devices_`` of the
        device each part was fitted on and predicts on.

    References
    ----------
    Yang You, "Fast and Accurate Machine Learning on Distributed Systems and
    Supercomputers", PhD thesis, UC Berkeley, 2020: chapter 2, Alg 1 (SMO), Alg 3
    (FCFS), Alg 4 (BKM), Alg 5 (CA-SVM), sections 2.2-2.3 (Cascade, DC-SVM,
    DC-Filter); Tables 2.8-2.18.
    H. P. Graf, E. Cosatto, L. Bottou, I. Durdanovic, V. Vapnik, "Parallel
    support vector machines: the Cascade SVM", NIPS 2004.
    C.-J. Hsieh, S. Si, I. S. Dhillon, "A divide-and-conquer solver for kernel
    support vector machines", ICML 2014.
    R.-E. Fan, P.-H. Chen, C.-J. Lin, "Working set selection using second
    order information for training SVM", JMLR 6 (2005).

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.preprocessing import StandardScaler
    >>> from gpuml.estimators.casvm import CASVMClassifier
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> X = StandardScaler().fit_transform(X)
    >>> clf = CASVMClassifier(n_partitions=4, random_state=0, device="cpu").fit(X, y)
    >>> clf.partition_sizes_.tolist()
    [143, 142, 142, 142]
    >>> bool(clf.score(X, y) > 0.95)
    True
    """

    _parameter_constraints: dict = {
        # inf included (the hard margin), as SVC's constraint allows it.
        "C": [Interval(Real, 0.0, None, closed="right")],
        **KERNEL_CONSTRAINTS,
        "kernel": [*KERNEL_CONSTRAINTS["kernel"], callable],
        **PARTITION_CONSTRAINTS,
        "partition": [StrOptions(set(PARTITION_CONSTRAINTS["partition"][0].options) | {"auto"})],
        "method": [StrOptions(set(METHODS))],
        "part_C": [StrOptions(set(PART_C_SCALES))],
        "combine": [StrOptions({"auto", "neighbors", "nearest"})],
        "n_neighbors": [Interval(Integral, 1, None, closed="left")],
        "blend_margin": [Interval(Real, 0.0, None, closed="left")],
        "tol": [Interval(Real, 0.0, None, closed="neither")],
        "max_iter": [Interval(Integral, -1, None, closed="left")],
        "cache_size": [Interval(Real, 0.0, None, closed="neither")],
        "shrinking": ["boolean", StrOptions({"auto"})],
        "class_weight": [StrOptions({"balanced"}), dict, None],
        "decision_function_shape": [StrOptions({"ovr", "ovo"})],
        "break_ties": ["boolean"],
        "probability": ["boolean", StrOptions({"deprecated"})],
        "verbose": ["verbose"],
    }

    def __init__(self, C=1.0, kernel="rbf", gamma="scale", degree=3, coef0=0.0,
                 n_partitions=DEFAULT_N_PARTITIONS, partition="auto", method="casvm",
                 part_C="sqrt", combine="auto", n_neighbors=DEFAULT_N_NEIGHBORS,
                 blend_margin=DEFAULT_BLEND_MARGIN, tol=1e-3, max_iter=-1,
                 cache_size=DEFAULT_CACHE_SIZE, shrinking="auto", class_weight=None,
                 decision_function_shape="ovr", break_ties=False, probability="deprecated",
                 device="auto", devices=None, max_device_memory=None, n_jobs=None,
                 random_state=None, verbose=0):
        self.C = C
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.n_partitions = n_partitions
        self.partition = partition
        self.method = method
        self.part_C = part_C
        self.combine = combine
        self.n_neighbors = n_neighbors
        self.blend_margin = blend_margin
        self.tol = tol
        self.max_iter = max_iter
        self.cache_size = cache_size
        self.shrinking = shrinking
        self.class_weight = class_weight
        self.decision_function_shape = decision_function_shape
        self.break_ties = break_ties
        self.probability = probability
        self.device = device
        self.devices = devices
        self.max_device_memory = max_device_memory
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose

    @_fit_context(prefer_skip_nested_validation=True)
    @compile_after_fit
    def fit(self, X, y, sample_weight=None):
        """Partition the data and train one kernel SVM per part (Alg 5, training).

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            Or the (n_samples, n_samples) kernel matrix with kernel="precomputed".
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None
            Scales C per sample; samples with weight 0 or less are left out
            (as SVC; an error if that leaves no sample or one class).

        Returns
        -------
        self
        """
        self._warn_probability()
        return fit_partitioned(self, X, y, sample_weight)

    # -- what the partitioned fit asks (gpuml.pipeline.PartitionedEstimator) ---------------
    _solve_params = ("C", "gamma", "degree", "coef0", "class_weight", "tol", "max_iter",
                     "cache_size", "shrinking", "part_C", "combine", "n_neighbors",
                     "blend_margin", "decision_function_shape", "break_ties", "verbose")
    _refit_drops = ("layer_sizes_", "layer_n_iter_", *KEPT_STATE)

    def _fit_needs(self, sample_weight=None) -> tuple:
        """A kernel matrix, the tree's layers, calibration: what not every executor runs."""
        precomputed = self._kernel_name == "precomputed"
        if precomputed and self.n_partitions not in (1, "auto"):
            raise ValueError(f"kernel={self.kernel!r} needs n_partitions=1 (or 'auto'): "
                             "partitioning and nearest-centre routing need the samples' "
                             "features")
        needs = []
        if precomputed:
            needs.append(Need(Capability.KERNEL_MATRIX, f"kernel={self.kernel!r}"))
        if self.probability not in ("deprecated", False):
            needs.append(Need(Capability.PROBABILITY, "probability=True"))
        if self.method != "casvm":
            needs.append(Need(Capability.LAYERS, f"method={self.method!r}",
                              instead="method='casvm'"))
        return tuple(needs)

    def _solve_together(self, solvers) -> list:
        """Settings that differ in C and γ only: one solver, a C path per γ, each part's
        kernel values computed once for every C (:func:`~._smo_path_solver.solve_together`)."""
        return solve_together(solvers)

    def _validate(self, X, y, sample_weight, backend) -> FitData:
        """SVC's checks of in-memory input; the rows on ``backend``, the classes indexed."""
        X, y_idx, weights, classes, counts = self._check_targets(X, y, sample_weight)
        with backend.use():
            Xd = backend.asarray(X)
        return FitData(Xd, int(X.shape[0]), int(X.shape[1]), targets=y_idx, weights=weights,
                       stats=X, classes=classes, class_counts=counts, class_index=y_idx,
                       itemsize=Xd.dtype.itemsize,
                       sparse=sp.issparse(X) or hasattr(X, "tocsr"))

    def _n_parts(self, n: int, gpu: bool = False) -> int:
        if self.n_partitions == "auto":
            return 1 if self._kernel_name == "precomputed" else auto_n_partitions(
                n, AUTO_PART_ROWS_GPU if gpu else AUTO_PART_ROWS)
        return check_n_partitions(self.n_partitions, n)

    def _split_method(self) -> str:
        """The partitioner: ``partition``, or the method's own for ``"auto"``."""
        return METHOD_PARTITION[self.method] if self.partition == "auto" else self.partition

    def _part_cost(self) -> SMOCost:
        return SMOCost(type(self).__name__, self.cache_size, self.n_jobs)

    def _part_solver(self, data) -> SMOPartSolver:
        """Classes, class weights and the kernel from the validated data; the SMO solver."""
        self._set_classes(data.classes, data.class_counts)
        self._set_kernel(data.stats)
        self._sparse = data.sparse
        self.shape_fit_ = (data.n, data.n_features)
        self.partition_ = self._split_method()
        if data.targets is not None:
            # in memory: refuse weights that leave no row, or one class (on Dask the chunks'
            # tasks weigh their rows)
            self._row_C(data.targets, data.weights)
        return SMOPartSolver(
            self._kernel, len(self.classes_), self.C, self.class_weight_, data.n, self.part_C,
            self.method, self.tol, self.max_iter, self.cache_size, self.shrinking, self.n_jobs,
            self._part_cost(),
            # The tree's layers report as a whole (its parts are not the model's).
            progress=Progress("CASVM", data.n_parts if self.method == "casvm" else 0,
                              self.verbose),
            rows_here=data.targets is not None)

    def _assemble(self, partitioning, result, data):
        """The fitted attributes (:meth:`_assemble_parts`); for the tree methods, the last
        layer's model with the whole tree's work and split."""
        progress = result.solver.progress
        if not result.reported:
            # The devices' threads (or the workers) fitted the parts: their lines from here,
            # in part order.
            for p, (rows, f) in enumerate(zip(partitioning.parts, result.fits)):
                progress.update(p, part_line(len(rows), f.n_problems, int(f.n_iter.sum()),
                                             f.converged))
        tree = result.layers
        if tree is None:
            self._assemble_parts(partitioning, result.fits, data, progress, result.kept)
            return
        self.layer_sizes_, self.layer_n_iter_ = tree.layer_sizes, tree.layer_n_iter
        self._assemble_parts(tree.root, result.fits, data, progress)
        # The model is the last layer's; the work and the split are the whole tree's
        # (the steps of each pair the model trained, summed over every layer).
        self.n_iter_ = tree.n_iter[self.pair_status_[0] == 2].astype(np.int32)
        self.partition_sizes_ = partitioning.sizes
        self.n_partitions_ = len(partitioning.sizes)

    def _finish_fit(self, data, y, sample_weight):
        if data.targets is not None:
            self._fit_probability(data.X, y, data.targets,
                                  self._row_C(data.targets, data.weights), sample_weight)

    def _assemble_parts(self, parts, fits, data, progress=None, kept=None):
        """The fitted attributes from the per-part models (in part order) and the centres.

        The support vectors of all parts are put in SVC's order (by class,
        then by row); gpuml's pairwise layout (``ovo_dual_coef_``) and SVC's
        packed one (``dual_coef_``) are both kept, in that order. ``kept``: the parts
        stayed on the Dask workers that fitted them (``fits`` are their summaries), and
        so do the support vectors' arrays (:class:`~gpuml.estimators._kept_svm.KeptSVMMixin`).
        """
        n_classes = len(self.classes_)
        y_idx = data.class_index
        if kept is None:
            rows = [np.asarray(r, dtype=np.int64)[f.support] for r, f in zip(parts.parts, fits)]
            vectors = (None if self._kernel.name == "precomputed"
                       else [f.support_vectors for f in fits])
            if vectors is not None and any(v is None for v in vectors):
                vectors = support_vector_blocks(data.X, rows)  # left by a joint solve
            self.__dict__.update(support_arrays(
                rows, [y_idx[r] for r in rows], vectors, [f.dual_coef for f in fits],
                n_classes, self._sparse))
            self.n_support_ = np.bincount(y_idx[self.support_],
                                          minlength=n_classes).astype(np.int32)
            self._check_finite_model(*[f.dual_coef for f in fits])
        else:
            self._keep_parts(kept, fits)
        self.part_intercept_ = np.stack([f.intercept for f in fits])
        self.pair_status_ = np.stack([f.pair_status for f in fits])
        self.part_n_iter_ = np.stack([f.n_iter for f in fits])
        self.objective_ = np.stack([f.objective for f in fits])
        intercept = (-1.0 if n_classes == 2 else 1.0) * self.part_intercept_  # SVC's sign
        self.intercept_ = intercept[0] if len(fits) == 1 else intercept
        # The steps of every SMO problem solved, part by part: SVC's (n_pairs,) for one
        # part, and never a zero for a pair that a part did not train.
        self.n_iter_ = self.part_n_iter_[self.pair_status_ == 2].astype(np.int32)
        self._check_finite_model(self.part_intercept_)
        converged = all(f.converged for f in fits)
        self.fit_status_ = 0 if converged else 1
        self.centers_ = to_numpy(parts.centers)
        self.partition_sizes_ = parts.sizes
        self.n_partitions_ = len(parts.sizes)
        warn_poor_parts(parts.parts, y_idx, len(self.classes_), self.partition_,
                        blended=self.method == "casvm" and self.combine != "nearest")
        warn_stopped_parts([f.converged for f in fits], self.max_iter)
        progress = progress or Progress("CASVM", 0, self.verbose)
        progress.close(f"{len(fits)} parts, {sum(f.n_problems for f in fits)} SMO problems, "
                       f"{int(self.part_n_iter_.sum())} iterations, "
                       f"{int(self.n_support_.sum())} support vectors")

    @property
    def coef_(self):
        """Primal weights for ``kernel="linear"`` (read-only, as SVC's; see Attributes)."""
        check_is_fitted(self)
        if self.kernel != "linear":
            raise AttributeError("coef_ is only available when using a linear kernel")
        binary = len(self.classes_) == 2
        if self.part_intercept_.shape[0] == 1:
            return primal_coef(self.ovo_dual_coef_, self.support_vectors_, binary)
        return np.stack([
            to_numpy(sp.csr_matrix.toarray(c) if sp.issparse(c) else c)
            for c in (primal_coef(self.ovo_dual_coef_[:, cols], self.support_vectors_[cols],
                                  binary)
                      for cols in self._part_columns())])
