"""CA-SVM: communication-avoiding kernel SVM (You 2020, chapter 2, Alg 3, 4 and 5)."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from .._backend import namespace_of, stack_rows, to_numpy, to_output
from .._progress import Progress
from .._validation import check_n_partitions
from ..distributed import smo_cost
from ..kernels import SMOProblem, compile_after_fit, part_threads, smo_solve_batch
from ..partition import Partitioning, split
from ..pipeline import FitData, FitResult, PartitionedFit
from ._params import CachedParamNames
from ._part_prediction import PartPredictionMixin
from ._partitioned import (
    KERNEL_CONSTRAINTS,
    PARTITION_CONSTRAINTS,
    auto_n_partitions,
    warn_poor_parts,
    warn_stopped_parts,
)
from ._svm import KernelSVMMixin, SVMPartFit, class_pairs, pack_dual_coef, primal_coef
from ._tree import fit_tree

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
#: How C grows in a part of m of the n training rows (``part_C=``): the factor on C.
PART_C_SCALES = {"sqrt": lambda n, m: np.sqrt(n / m), "linear": lambda n, m: n / m,
                 "none": lambda n, m: 1.0}
#: Default number of nearest support vectors that weigh the parts (``combine="neighbors"``;
#: values compared in bench/results/cpu-2core/casvm_prediction_explore.md).
DEFAULT_N_NEIGHBORS = 20
#: Default ``blend_margin`` of ``combine="auto"``: the rows whose nearest part's pairwise
#: values all lie this far from 0 (in units of the SVM margin) keep them
#: (bench/results/cpu-2core/casvm_predict.md).
DEFAULT_BLEND_MARGIN = 0.6


def _part_line(rows, n_problems, n_iter, converged):
    """The ``verbose`` line of one fitted part."""
    return (f"{rows} rows, {n_problems} SMO problem{'s' if n_problems != 1 else ''}, "
            f"{n_iter} iterations" + ("" if converged else ", stopped at max_iter"))


class CASVMClassifier(CachedParamNames, PartitionedFit, PartPredictionMixin, KernelSVMMixin,
                      ClassifierMixin, BaseEstimator):
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
        nearest parts); 5-13x ``"nearest"``'s time. ``"auto"``: the nearest
        part's values where the pairs it trained settle the vote with every
        value ``blend_margin`` or more from 0, ``"neighbors"`` elsewhere (6-17 %
        of samples; more when parts lack classes): 1.8-2.9x ``"nearest"``'s
        time, within 0.11 point of ``"neighbors"``
        (bench/results/cpu-2core/casvm_predict.md).
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
    shrinking : bool, default=False
        LIBSVM's shrinking heuristic. Off by default, unlike SVC: here a row
        costs one GEMV, so shrinking saves less per step than its
        full-gradient reconstructions cost (docs/casvm.md, "The SMO solver").
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
        "shrinking": ["boolean"],
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
                 cache_size=DEFAULT_CACHE_SIZE, shrinking=False, class_weight=None,
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
        return self._fit_partitioned(X, y, sample_weight)

    # -- the steps of the partitioned fit (gpuml.pipeline.PartitionedFit) ---------------
    _refit_drops = ("layer_sizes_", "layer_n_iter_")

    def _fit_device(self):
        return self.device

    def _check_fit(self, executor, sample_weight=None):
        """Settings that some executors cannot run, refused before any work."""
        precomputed = self._kernel_name == "precomputed"
        if precomputed and self.n_partitions not in (1, "auto"):
            raise ValueError(f"kernel={self.kernel!r} needs n_partitions=1 (or 'auto'): "
                             "partitioning and nearest-centre routing need the samples' "
                             "features")
        if executor.streams and (precomputed or self.method != "casvm"):
            raise ValueError("max_device_memory streams the parts of method='casvm' with "
                             f"features (got method={self.method!r}, kernel={self.kernel!r})")
        if executor.where == "devices":
            if precomputed:
                raise ValueError(f"kernel={self.kernel!r} fits on one device: use "
                                 "devices=None")
            if self.method != "casvm":
                raise ValueError(f"method={self.method!r} fits on one device (its layers "
                                 "depend on each other): use devices=None")
        if executor.where == "dask":
            if self.kernel == "precomputed" or callable(self.kernel):
                raise ValueError(f"kernel={self.kernel!r} does not run on Dask input: "
                                 "partitioning and routing need the samples' features")
            if self.probability not in ("deprecated", False):
                raise ValueError("probability=True does not run on Dask input: fit "
                                 "CalibratedClassifierCV(CASVMClassifier(...)) on in-memory "
                                 "data, or leave probability unset")
            if self.devices is not None:
                raise ValueError("devices= is for several devices of one process; on Dask "
                                 "each worker fits its parts on its own device: leave "
                                 "devices=None")
            if self.method != "casvm":
                raise ValueError(f"method={self.method!r} does not run on Dask input (its "
                                 "layers depend on each other): use method='casvm' or "
                                 "in-memory data")

    def _validate(self, X, y, sample_weight, backend) -> FitData:
        """SVC's checks of in-memory input; the rows on ``backend``, the classes indexed."""
        X, y_idx, weights, classes, counts = self._check_targets(X, y, sample_weight)
        with backend.use():
            Xd = backend.asarray(X)
        return FitData(Xd, int(X.shape[0]), int(X.shape[1]), targets=y_idx, weights=weights,
                       stats=X, classes=classes, class_counts=counts,
                       extra={"sparse": sp.issparse(X) or hasattr(X, "tocsr")})

    def _setup(self, data):
        """Classes, class weights, the kernel and every row's C, from the validated data."""
        self._set_classes(data.classes, data.class_counts)
        self._set_kernel(data.stats)
        self._sparse = data.extra.get("sparse", False)
        self.shape_fit_ = (data.n, data.n_features)
        self.partition_ = self._split_method()
        if data.targets is not None:  # in memory (on Dask the chunks' tasks weigh their rows)
            data.weights = self._row_C(data.targets, data.weights)
        # The tree's layers report as a whole (its parts are not the model's).
        data.extra["_progress"] = Progress("CASVM", data.n_parts if self.method == "casvm"
                                          else 0, self.verbose)

    def _n_parts(self, n: int, gpu: bool = False) -> int:
        if self.n_partitions == "auto":
            return 1 if self._kernel_name == "precomputed" else auto_n_partitions(
                n, AUTO_PART_ROWS_GPU if gpu else AUTO_PART_ROWS)
        return check_n_partitions(self.n_partitions, n)

    #: what the part solver reads of the fitted attributes (``shape_fit_``: the parts' C scale)
    _part_solver_reads = ("classes_", "class_weight_", "n_features_in_", "shape_fit_")

    def _chunk_dtype(self, X):
        return np.float64

    def _chunk_targets(self, y, sample_weight):
        """A chunk's class indices and per-row C (LIBSVM: C * class_weight[y] * weight)."""
        y_idx = np.searchsorted(self.classes_, y)
        return y_idx, np.asarray(self._row_weights(y_idx, 1.0 if sample_weight is None
                                                   else sample_weight), dtype=np.float64)

    def _worker_memory_need(self, n_features, dtype):
        """Bytes a worker holds to fit parts of given sizes: rows, and each part's kernel.

        The CPU SMO keeps a part's whole kernel matrix when it fits in ``cache_size``,
        else a row cache of at most ``cache_size``, one part per solver thread at a time
        (:func:`~gpuml.kernels.part_threads`); a GPU worker's device memory is checked by
        the solver itself.
        """
        cache = float(self.cache_size) * 2**20

        def need(sizes):
            m = sizes.astype(np.float64)
            # one matrix per solver thread at a time (gpuml.kernels.smo_solve_batch)
            blocks = np.sort(np.minimum(8.0 * m**2, cache))[::-1][:part_threads(self.n_jobs, m)]
            return int((8.0 * m * (n_features + 2)).sum() + blocks.sum())

        return need

    def _part_costs(self, sizes, n_features):
        return smo_cost(sizes)

    def _part_bytes(self, sizes, data, backend):
        """Device bytes of each part solved alone: its rows and its kernel matrix (at most
        ``cache_size``)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        itemsize = getattr(data.X, "dtype", np.dtype(np.float64)).itemsize
        return (sizes * data.n_features * itemsize
                + np.minimum(sizes ** 2 * 8, int(self.cache_size * 2**20)))

    def _solve_parts(self, backend, data, X, targets, weights, part_rows, part_ids):
        """The one-vs-one SMO problems of the given parts, as one batch on ``backend``."""
        progress = data.extra.get("_progress") if data.extra.get("_reports", True) else None
        return self._fit_parts(backend.asarray(X), part_rows, targets, weights, progress)

    def _fit_split(self, executor, data, partitioning):
        if self.method == "casvm":
            data.extra["_reports"] = executor.reports_parts
            return executor.fit_parts(self, data, partitioning)

        def fit_nodes(node_rows, members, warm):
            return self._fit_parts(data.X, node_rows, data.targets, data.weights,
                                   members=members, warm=warm)

        with executor.backend.use():
            rows, fit, n_iter, self.layer_sizes_, self.layer_n_iter_ = fit_tree(
                fit_nodes, partitioning.parts, data.targets, data.weights,
                len(self.classes_), pass_every_row=self.method == "dcsvm")
            # The model is the root's SVM alone: one part, centred on the mean, no routing.
            one = split(data.X, 1, "random", None)
        data.extra["_tree"] = (partitioning, Partitioning(one.labels, one.centers, [rows]),
                               n_iter)
        return FitResult([fit], backend=executor.backend)

    def _assemble(self, partitioning, result, data):
        """The fitted attributes (:meth:`_assemble_parts`); for the tree methods, the last
        layer's model with the whole tree's work and split."""
        progress = data.extra["_progress"]
        if not data.extra.get("_reports", True):
            # The devices' threads (or the workers) fitted the parts: their lines from here,
            # in part order.
            for p, (rows, f) in enumerate(zip(partitioning.parts, result.fits)):
                progress.update(p, _part_line(len(rows), f.n_problems, int(f.n_iter.sum()),
                                              f.converged))
        tree = data.extra.get("_tree")
        if tree is None:
            self._assemble_parts(partitioning, result.fits, data, progress)
            return
        split_parts, final, n_iter = tree
        self._assemble_parts(final, result.fits, data, progress)
        # The model is the last layer's; the work and the split are the whole tree's
        # (the steps of each pair the model trained, summed over every layer).
        self.n_iter_ = n_iter[self.pair_status_[0] == 2].astype(np.int32)
        self.partition_sizes_ = split_parts.sizes
        self.n_partitions_ = len(split_parts.sizes)

    def _finish_fit(self, data, X, y, sample_weight):
        if data.targets is not None:
            self._fit_probability(data.X, y, data.targets, data.weights, sample_weight)

    def _fit_parts(self, X, part_rows, y_idx, sample_C, progress=None, members=None,
                   warm=None) -> list[SVMPartFit]:
        """Step 2 for the given parts: their one-vs-one SMO problems, solved as one batch.

        ``X`` is on the current device; ``part_rows[k]`` are the rows of X of the
        k-th part, ``y_idx`` and ``sample_C`` (host) are aligned with X's rows.
        The layers of the tree methods pass, per part, ``members[k]`` (bool,
        ``(n_pairs, len(part_rows[k]))``: the rows that take part in each pair's
        problem; None: every row of the pair's two classes) and ``warm[k]``
        (the same shape: each pair's starting alphas; None: zeros).
        Returns one :class:`SVMPartFit` per part, in order. ``progress`` (a
        :class:`gpuml._progress.Progress`, only when called from the fitting
        thread) gets one line per part as the part's last problem is solved.
        """
        n_classes = len(self.classes_)
        pairs = class_pairs(n_classes)
        n_pairs = len(pairs)
        # Per pair its first class's run, then its second's: labels +1, then -1.
        runs = np.array(pairs, dtype=np.int64).reshape(-1)
        sign = np.where(np.arange(2 * n_pairs) % 2 == 0, 1.0, -1.0)
        problems, layout, Xs = [], [], []
        for k, rows in enumerate(part_rows):
            rows = np.asarray(rows, dtype=np.int64)
            pos = np.flatnonzero(sample_C[rows] > 0)
            # Grouped by class, as LIBSVM does: every one-vs-one problem is then
            # two index runs whose kernel blocks the solver can share.
            pos = pos[np.argsort(y_idx[rows[pos]], kind="stable")]
            sel = to_output(rows[pos], X)
            Xs.append(self._solver_rows(X[sel]) if self._kernel.name != "precomputed"
                      else X[sel][:, sel])
            # Class c holds the part's rows bounds[c]:bounds[c + 1].
            bounds = np.searchsorted(y_idx[rows[pos]], np.arange(n_classes + 1))
            # Every pair's candidate rows are its two class runs, laid end to end
            # for all pairs of the part at once (entry e: pair pair_of[e]).
            lengths = np.diff(bounds)[runs]
            starts = np.repeat(bounds[runs] - np.concatenate([[0], np.cumsum(lengths)[:-1]]),
                               lengths)
            idx = starts + np.arange(starts.size)
            labels = np.repeat(sign, lengths)
            pair_of = np.repeat(np.arange(n_pairs), lengths[0::2] + lengths[1::2])
            if members is not None and members[k] is not None:
                keep = members[k][pair_of, pos[idx]]
                idx, labels, pair_of = idx[keep], labels[keep], pair_of[keep]
            has_first = np.bincount(pair_of[labels > 0], minlength=n_pairs) > 0
            has_second = np.bincount(pair_of[labels < 0], minlength=n_pairs) > 0
            # A pair with both classes present is one problem; the others are left out.
            q = np.flatnonzero(has_first & has_second)
            trained = (has_first & has_second)[pair_of]
            idx, labels, pair_of = idx[trained], labels[trained], pair_of[trained]
            C_part = sample_C[rows[pos][idx]] * self._part_C_factor(len(rows))
            start = (warm[k][pair_of, pos[idx]] if warm is not None and warm[k] is not None
                     else None)
            ends = np.cumsum(np.bincount(pair_of, minlength=n_pairs)[q]).tolist()
            problems += [SMOProblem(k, idx[lo:hi], labels[lo:hi], C_part[lo:hi],
                                    None if start is None else start[lo:hi])
                         for lo, hi in zip([0] + ends[:-1], ends)]
            layout.append((has_first, has_second, q, pos[idx], labels))
        report = None
        if progress:
            for k, (_, _, q, _, _) in enumerate(layout):
                if not len(q):  # one class (or none) in the part: nothing to solve
                    progress.update(k, _part_line(len(part_rows[k]), 0, 0, True))

            def report(k, res):
                progress.update(k, _part_line(len(part_rows[k]), len(res),
                                              sum(int(r.n_iter) for r in res),
                                              all(bool(r.converged) for r in res)))
        partitioned = max(map(len, part_rows), default=0) < self.shape_fit_[0]  # P > 1
        results = smo_solve_batch(self._kernel, Xs, problems, tol=self.tol,
                                  max_iter=self.max_iter, cache_size=self.cache_size,
                                  shrinking=self.shrinking, n_jobs=self.n_jobs, progress=report,
                                  partitioned=partitioned)
        # One copy to the host: the GPU solver's alphas are joined on the device first.
        alphas = [res.alpha for res in results]
        alpha = (to_numpy(namespace_of(alphas[0]).concatenate(alphas)) if alphas
                 else np.zeros(0))
        fits, supports = [], []
        first_problem = first_alpha = 0
        for rows, (has_first, has_second, q, owner, labels) in zip(part_rows, layout):
            mine = results[first_problem: first_problem + len(q)]
            first_problem += len(q)
            # 2: trained; 1: one class of the pair in the part (constant vote); 0: none.
            status = (has_first.astype(np.int8) + has_second).astype(np.int8)
            intercept = np.where(status == 1, has_first * 1.0 - has_second, 0.0)
            intercept[q] = [res.intercept for res in mine]
            n_iter = np.zeros(n_pairs, dtype=np.int64)
            n_iter[q] = [res.n_iter for res in mine]
            objective = np.full(n_pairs, np.nan)
            objective[q] = [res.objective for res in mine]
            part_alpha = alpha[first_alpha: first_alpha + len(owner)]
            first_alpha += len(owner)
            sv = part_alpha > 0
            # A row may be a support vector of several pairs: one column per row,
            # rows ascending.
            used = np.zeros(len(rows), dtype=bool)
            used[owner[sv]] = True
            support = np.flatnonzero(used)
            column = (np.cumsum(used) - 1)[owner[sv]]
            dual_coef = np.zeros((n_pairs, len(support)))
            sizes = [len(res.alpha) for res in mine]
            dual_coef[np.repeat(q, sizes)[sv], column] = (part_alpha * labels)[sv]
            supports.append(np.asarray(rows, dtype=np.int64)[support])
            fits.append(SVMPartFit(support, None, dual_coef, intercept, status, n_iter,
                                   objective, all(bool(res.converged) for res in mine), len(q)))
        # The support vectors of all parts in one gather and one copy to the host.
        sv_rows = np.concatenate(supports + [np.zeros(0, np.int64)])
        if self._kernel.name == "precomputed":
            vectors = [np.empty((0, 0))] * len(fits)
        else:
            stacked = to_numpy(X[to_output(sv_rows, X)])
            ends = np.cumsum([len(s) for s in supports]).tolist()
            vectors = [stacked[lo:hi] for lo, hi in zip([0] + ends[:-1], ends)]
        for fit, block in zip(fits, vectors):
            fit.support_vectors = block
        return fits

    def _part_C_factor(self, m) -> float:
        """The factor on C in a part of ``m`` rows (``part_C``; 1 for the tree methods)."""
        if self.method != "casvm" or m == 0:
            return 1.0
        return float(PART_C_SCALES[self.part_C](self.shape_fit_[0], m))

    def _split_method(self) -> str:
        """The partitioner: ``partition``, or the method's own for ``"auto"``."""
        return METHOD_PARTITION[self.method] if self.partition == "auto" else self.partition

    def _solver_rows(self, Xp):
        """A part's rows as the solver gets them: sparse ones dense when that costs little.

        A sparse part with no more features than rows is no larger dense than the kernel
        matrix its solver holds anyway. Densified, its kernel values come from the same GEMM
        as a dense fit's, bit for bit, so the sparse fit takes the same SMO steps and gives
        the same model (as SVC's dense and sparse LIBSVM agree); a product of sparse matrices
        sums in another order, and rounding differences then steer the working-set selection
        elsewhere (differences of the order of ``tol``). Wide sparse data (text) stays sparse.
        """
        if not hasattr(Xp, "tocsr"):
            return Xp
        m, d = Xp.shape
        if d <= m and m * d * Xp.dtype.itemsize <= self.cache_size * (1 << 20):
            return Xp.toarray()
        return Xp

    def _assemble_parts(self, parts, fits, data, progress=None):
        """The fitted attributes from the per-part models (in part order) and the centres.

        The support vectors of all parts are put in SVC's order (by class,
        then by row); gpuml's pairwise layout (``ovo_dual_coef_``) and SVC's
        packed one (``dual_coef_``) are both kept, in that order.
        """
        n_classes = len(self.classes_)
        y_idx = data.targets if data.targets is not None else data.extra["_y_idx"]
        rows = [np.asarray(r, dtype=np.int64)[f.support] for r, f in zip(parts.parts, fits)]
        support = np.concatenate(rows + [np.zeros(0, np.int64)])
        support_part = np.repeat(np.arange(len(fits)), [len(r) for r in rows])
        ovo_coef = np.concatenate([f.dual_coef for f in fits], axis=1)
        order = np.lexsort((support, y_idx[support]))
        self.support_ = support[order]
        self.support_part_ = support_part[order]
        self.ovo_dual_coef_ = np.ascontiguousarray(ovo_coef[:, order])
        self.n_support_ = np.bincount(y_idx[self.support_], minlength=n_classes).astype(np.int32)
        if self._kernel.name == "precomputed":
            self.support_vectors_ = np.empty((0, 0))
        else:
            vectors = stack_rows([f.support_vectors for f in fits])
            self.support_vectors_ = vectors[order]
        self.part_intercept_ = np.stack([f.intercept for f in fits])
        self.pair_status_ = np.stack([f.pair_status for f in fits])
        self.part_n_iter_ = np.stack([f.n_iter for f in fits])
        self.objective_ = np.stack([f.objective for f in fits])
        # SVC's public arrays: LIBSVM's packing, and for two classes SVC's sign
        # (its decision function is minus LIBSVM's, positive for classes_[1]).
        sign = -1.0 if n_classes == 2 else 1.0
        packed = sign * pack_dual_coef(self.ovo_dual_coef_, y_idx[self.support_], n_classes)
        self.dual_coef_ = sp.csr_matrix(packed) if self._sparse else packed
        intercept = sign * self.part_intercept_
        self.intercept_ = intercept[0] if len(fits) == 1 else intercept
        # The steps of every SMO problem solved, part by part: SVC's (n_pairs,) for one
        # part, and never a zero for a pair that a part did not train.
        self.n_iter_ = self.part_n_iter_[self.pair_status_ == 2].astype(np.int32)
        self._check_finite_model(self.part_intercept_, ovo_coef)
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
                       f"{int(self.part_n_iter_.sum())} iterations, {len(self.support_)} "
                       "support vectors")

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
