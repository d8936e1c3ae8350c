"""What the kernel SVM classifiers share (CASVMClassifier, AsyGCDSVC).

* targets and per-sample C: LIBSVM's ``C_i = C * class_weight[y_i] * sample_weight_i``
  (:func:`row_C`), rows with ``C_i <= 0`` left out as SVC leaves them out;
* callable kernels, turned into a precomputed kernel matrix as SVC does;
* ``decision_function`` and ``predict``: one-vs-one voting and SVC's "ovr"-shaped
  decision values over the pairwise values each estimator computes;
* SVC's packed ``dual_coef_`` layout and ``coef_`` for the linear kernel;
* fitted arrays kept on the host, with device copies cached for prediction but
  never pickled, so a model fitted on a GPU loads where there is none;
* the fit of one part of a partitioned SVM (:class:`SVMPartFit`).

SVC's ``probability=True`` is :mod:`gpuml.estimators._probability`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.validation import (
    _check_sample_weight,
    check_consistent_length,
    check_is_fitted,
)

from .._backend import is_dask_collection, namespace_of, to_numpy, to_output
from .._validation import check_class_labels, validate_X_y
from ..kernels.pairwise import make_kernel, squared_norms, widened_dot
from ..pipeline import dask_module, on_device


def value_dtype(X):
    """The dtype of decision values and probabilities for input ``X``: float32 in, float32 out.

    float32 for float32 NumPy, CuPy, SciPy sparse or Dask input and for a
    DataFrame whose columns are all float32; float64 for anything else (as
    scikit-learn's ``check_array`` keeps float32 and turns the rest into float64).
    Class labels (``predict``) keep the training labels' dtype, as SVC.
    """
    dtype = getattr(X, "dtype", None)
    if dtype is None and hasattr(X, "dtypes"):
        kinds = set(map(str, X.dtypes))
        dtype = kinds.pop() if len(kinds) == 1 else None
    return np.dtype(np.float32) if str(dtype) == "float32" else np.dtype(np.float64)


def row_C(C, class_weight, y_idx, sample_weight):
    """LIBSVM's per-row ``C_i = C * class_weight[y_i] * sample_weight_i``."""
    return C * class_weight[y_idx] * sample_weight


def class_pairs(n_classes: int) -> list[tuple[int, int]]:
    """The one-vs-one pairs ``(a, b)``, ``a < b``, in LIBSVM's order."""
    return [(a, b) for a in range(n_classes) for b in range(a + 1, n_classes)]


def pair_classes(n_classes: int, xp=np):
    """``(first, second)``: ``(n_pairs, n_classes)`` float64 matrices (on ``xp``) with a 1
    at each pair's first class and at its second (:func:`class_pairs`); see
    :func:`count_by_class`."""
    pairs = np.asarray(class_pairs(n_classes), dtype=np.int64).reshape(-1, 2)
    first = np.zeros((len(pairs), n_classes))
    second = np.zeros_like(first)
    first[np.arange(len(pairs)), pairs[:, 0]] = 1.0
    second[np.arange(len(pairs)), pairs[:, 1]] = 1.0
    return xp.asarray(first), xp.asarray(second)


def count_by_class(to_first, to_second, classes):
    """Per row and class, the pairs (bool ``(n, n_pairs)`` masks) that go to the pair's
    first class (``to_first``) or its second (``to_second``), counted by two products with
    :func:`pair_classes`' matrices (``classes``): sums of ones, exact."""
    first, second = classes
    return to_first.astype(np.float64) @ first + to_second.astype(np.float64) @ second


def pair_table(n_classes: int) -> np.ndarray:
    """``(n_classes, n_classes - 1)`` ints: row ``c`` the pairs (:func:`class_pairs`) of class
    ``c`` with each other class ``d`` in increasing ``d``, the order of LIBSVM's packed
    ``dual_coef_`` rows for a support vector of class ``c``.

    >>> pair_table(3).tolist()
    [[0, 1], [0, 2], [1, 2]]
    """
    pair_of = {pair: q for q, pair in enumerate(class_pairs(n_classes))}
    return np.array([[pair_of[(min(c, d), max(c, d))] for d in range(n_classes) if d != c]
                     for c in range(n_classes)], dtype=np.int64).reshape(n_classes, -1)


#: Fewest classes for which :class:`PairCoef` multiplies by class blocks: from four on
#: the blocks do at most half the dense product's work.
PAIR_BLOCKS_MIN_CLASSES = 4


class PairCoef:
    """One model's ``alpha y`` per one-vs-one pair (``(m, n_pairs)``, a column per pair),
    ready for products with kernel values, on one device.

    A support vector of class ``c`` takes part in the ``n_classes - 1`` pairs of ``c``
    only (the rows LIBSVM keeps in ``dual_coef_``), so the dense product ``K @ coef`` does
    ``n_classes / 2`` times the work needed. With :data:`PAIR_BLOCKS_MIN_CLASSES` classes
    or more, :meth:`times` multiplies each class's kernel columns by its coefficients in
    its own pairs and adds the result into those pairs' columns, as LIBSVM's prediction
    sums them. ``coef`` (host, float64), ``sv_class`` (host: each support vector's class,
    grouped: non-decreasing; None below :data:`PAIR_BLOCKS_MIN_CLASSES` classes) and
    ``asarray`` (host to the device) make it.

    >>> import numpy as np
    >>> coef = np.array([[1.0, 2.0, 0.0], [-1.0, 0.0, 3.0], [0.0, -2.0, -3.0]])
    >>> K = np.array([[1.0, 0.5, 0.25]])
    >>> PairCoef(coef, np.array([0, 1, 2]), 3).times(K).tolist() == (K @ coef).tolist()
    True
    """

    def __init__(self, coef, sv_class, n_classes: int, asarray=np.asarray):
        self.n_pairs = coef.shape[1]
        self.dense = None
        self.blocks = []
        if n_classes < PAIR_BLOCKS_MIN_CLASSES:
            self.dense = asarray(coef)
            return
        table = pair_table(n_classes)
        ends = np.searchsorted(sv_class, np.arange(n_classes + 1))
        for c in range(n_classes):
            start, stop = int(ends[c]), int(ends[c + 1])
            if start == stop:
                continue
            pairs = table[c]
            self.blocks.append((start, stop, asarray(pairs),
                                asarray(np.ascontiguousarray(coef[start:stop][:, pairs]))))

    def times(self, K):
        """``K @ coef`` (float64) for kernel values ``K`` (``(n, m)``, any float dtype, on the
        device): float64 accumulation (:func:`gpuml.kernels.pairwise.widened_dot`)."""
        if self.dense is not None:
            return widened_dot(K, self.dense)
        out = namespace_of(K).zeros((K.shape[0], self.n_pairs), dtype=np.float64)
        for start, stop, pairs, coef in self.blocks:
            out[:, pairs] += widened_dot(K[:, start:stop], coef)
        return out


def pair_values(kernel, X, vectors, coef: PairCoef):
    """``K(X, vectors) @ coef`` (float64, one column per pair) for a :class:`PairCoef`, by
    blocks of rows of the kernel values (:meth:`gpuml.kernels.pairwise.Kernel.blocks`); for a
    precomputed kernel ``vectors`` are the support vectors' columns of ``X``."""
    if kernel.name == "precomputed":
        return coef.times(X[:, vectors])
    out = namespace_of(X).empty((X.shape[0], coef.n_pairs), dtype=np.float64)
    for start, stop, K in kernel.blocks(X, vectors):
        out[start:stop] = coef.times(K)
    return out


def ovo_votes(values, n_classes: int, voting=None, zero_votes_first=False, confidence=True):
    """Votes and summed confidences from pairwise values.

    ``values[:, q] > 0`` is a vote for the first class of pair ``q``;
    ``voting[:, q]`` (default all True) says whether pair ``q`` votes at all.
    A value of exactly 0 votes for the second class, as LIBSVM's predict does;
    with ``zero_votes_first`` for the first, as scikit-learn's "ovr"
    ``decision_function`` counts it (``_ovr_decision_function(dec < 0, ...)``).

    The votes are counted for every pair at once (:func:`count_by_class`); the
    confidences, where asked for (``confidence``; else None), are added pair by pair in
    pair order, as scikit-learn's ``_ovr_decision_function`` adds them, so that they round
    alike.

    >>> import numpy as np
    >>> votes, conf = ovo_votes(np.array([[1.0, 2.0, -0.5]]), 3)
    >>> votes.tolist(), conf.tolist()
    ([[2.0, 0.0, 1.0]], [[3.0, -1.5, -1.5]])
    """
    first = values >= 0 if zero_votes_first else values > 0
    second = ~first
    if voting is not None:
        first &= voting
        second &= voting
    votes = count_by_class(first, second, pair_classes(n_classes))
    if not confidence:
        return votes, None
    # by rows of the transposes: each pair's values and each class's sums contiguous
    by_pair = np.ascontiguousarray(values.T)
    summed = np.zeros((n_classes, values.shape[0]))
    for q, (a, b) in enumerate(class_pairs(n_classes)):
        summed[a] += by_pair[q]
        summed[b] -= by_pair[q]
    return votes, summed.T


def unsettled_votes(values, voting, n_classes: int, margin: float) -> np.ndarray:
    """Rows whose one-vs-one winner could change if each pairwise value moved by less
    than ``margin`` (host bool array).

    ``values`` (on any device) and ``voting`` as :func:`ovo_votes` (LIBSVM's rule: a
    value above 0 votes for the pair's first class); ``voting`` False marks a pair whose
    value is no evidence. Each pair whose value lies within ``margin`` of 0 may vote
    either way, and a pair marked False may vote for either class; a row is settled when
    its winner keeps more votes with every such vote lost than any other class gains with
    every such vote won (so no tie can form). Two classes: ``|value| < margin``, or a pair
    marked False.

    >>> import numpy as np
    >>> unsettled_votes(np.array([[0.9], [-0.2], [-0.7]]), np.ones((3, 1), bool), 2,
    ...                 0.5).tolist()
    [False, True, False]
    """
    xp = namespace_of(values)
    classes = pair_classes(n_classes, xp)
    vote = xp.asarray(voting)
    wins_first = (values > 0) & vote
    wins_second = ~(values > 0) & vote
    close = xp.abs(values) < margin
    silent = ~vote

    votes = count_by_class(wins_first, wins_second, classes)
    may_lose = count_by_class(wins_first & close, wins_second & close, classes)
    may_gain = count_by_class((wins_second & close) | silent, (wins_first & close) | silent,
                              classes)
    rows = xp.arange(values.shape[0])
    winner = xp.argmax(votes, axis=1)
    fewest = votes[rows, winner] - may_lose[rows, winner]
    most = votes + may_gain
    most[rows, winner] = -1.0
    return to_numpy(~(fewest > most.max(axis=1)))


def ovr_decision(votes, confidence):
    """SVC's "ovr" shape: votes plus confidences squashed into (-1/3, 1/3)."""
    return votes + confidence / (3 * (np.abs(confidence) + 1))


def ovo_output(values, voting, classes, method: str, shape: str = "ovr",
               break_ties: bool = False, dtype=np.float64):
    """``predict``'s labels or ``decision_function``'s values (``method``) from the pairwise
    values and voting pairs (host), as SVC makes them: for two classes minus the value
    (positive for ``classes[1]``); for more, the pairwise values (``shape="ovo"``) or
    SVC's "ovr" shape; labels by one-vs-one voting (ties: the lowest class), or with
    ``break_ties`` ("ovr", more than two classes) the argmax of the decision values, in
    ``dtype`` (that of the decision values returned).

    >>> import numpy as np
    >>> ovo_output(np.array([[0.5], [-2.0]]), None, np.array(["a", "b"]), "predict").tolist()
    ['a', 'b']
    """
    n_classes = len(classes)
    if method == "predict" and not (break_ties and n_classes > 2):
        votes, _ = ovo_votes(values, n_classes, voting, confidence=False)
        return classes[np.argmax(votes, axis=1)]
    if n_classes == 2:
        decision = -values[:, 0]
    elif shape == "ovo":
        decision = values
    else:
        decision = ovr_decision(*ovo_votes(values, n_classes, voting, zero_votes_first=True))
    decision = decision.astype(dtype, copy=False)
    return decision if method == "decision_function" else classes[np.argmax(decision, axis=1)]


def pack_dual_coef(ovo_coef, sv_class, n_classes: int):
    """LIBSVM's (n_classes - 1, n_SV) layout from one row per pair.

    ``ovo_coef[q, k]`` is support vector k's ``alpha y`` in pair q (zero when
    it takes no part). In LIBSVM's layout a support vector of class ``c``
    keeps its coefficient for the pair with class ``d`` in row ``d - 1`` if
    ``d > c`` and row ``d`` otherwise; a vector belongs to one class, so the
    n_classes - 1 rows hold all its pairs.
    """
    packed = np.zeros((max(n_classes - 1, 1), ovo_coef.shape[1]), dtype=ovo_coef.dtype)
    for q, (a, b) in enumerate(class_pairs(n_classes)):
        in_a = sv_class == a
        in_b = sv_class == b
        packed[b - 1, in_a] = ovo_coef[q, in_a]
        packed[a, in_b] = ovo_coef[q, in_b]
    return packed


def primal_coef(ovo_coef, support_vectors, binary: bool):
    """``coef_`` of a linear-kernel SVM: ``sum_k coef[q, k] x_k`` per pair, read-only.

    Sparse support vectors give a sparse ``coef_`` (as SVC); the binary sign
    is SVC's (positive values favour ``classes_[1]``).
    """
    if sp.issparse(support_vectors):
        coef = sp.csr_matrix(ovo_coef) @ support_vectors
        coef = sp.csr_matrix(-coef if binary else coef)
        coef.data.flags.writeable = False
    else:
        coef = ovo_coef @ np.asarray(support_vectors)
        coef = -coef if binary else coef
        coef.flags.writeable = False
    return coef


@dataclass
class SVMPartFit:
    """The fitted local model of one part: small host arrays, picklable.

    Attributes
    ----------
    support : int ndarray of shape (n_SV,)
        Positions of the part's support vectors among the part's rows, ascending.
    support_vectors : ndarray or CSR of shape (n_SV, n_features), or None
        (0, 0) for ``kernel="precomputed"``. None: not gathered by the solve (a joint
        solve of many settings, whose models are assembled one at a time); the model's
        assembly gathers them from the training rows (:func:`support_vector_blocks`).
    dual_coef : ndarray of shape (n_pairs, n_SV)
    intercept, pair_status, n_iter, objective : ndarrays of shape (n_pairs,)
        As the rows of the estimator's attributes of those names.
    converged : bool
    n_problems : int
        One-vs-one problems trained in the part.
    """

    support: np.ndarray
    support_vectors: object
    dual_coef: np.ndarray
    intercept: np.ndarray
    pair_status: np.ndarray
    n_iter: np.ndarray
    objective: np.ndarray
    converged: bool
    n_problems: int


def support_vector_blocks(X, supports) -> list:
    """The rows ``supports[p]`` of ``X`` (index arrays, one per part) on the host, one block
    per part: one gather and one copy for all parts (a GPU's rows come over once)."""
    sv_rows = np.concatenate(list(supports) + [np.zeros(0, np.int64)])
    stacked = to_numpy(X[to_output(sv_rows, X)])
    ends = np.cumsum([len(s) for s in supports]).tolist()
    return [stacked[lo:hi] for lo, hi in zip([0] + ends[:-1], ends)]


class KernelSVMMixin:
    """What the kernel SVM classifiers share: the fit preamble, prediction and device caching.

    An estimator supplies ``_ovo_values(X)``: the pairwise decision values of
    the rows of ``X``, shape (n_samples, n_pairs), positive for the pair's
    first class, and a bool array of the same shape saying which pairs vote
    for each row (None: every pair votes). ``decision_function`` and
    ``predict`` are written on it.
    """

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # As SVC: a callable kernel takes samples, not a kernel matrix.
        tags.input_tags.pairwise = self.kernel == "precomputed"
        # As SVC: a precomputed kernel matrix must be dense.
        tags.input_tags.sparse = self.kernel != "precomputed"
        return tags

    def _validate_targets(self, X, y, sample_weight):
        """Validate ``X`` and ``y``; set ``classes_`` and the kernel; return per-sample C.

        Returns ``(X, y_idx, sample_C)`` with ``y_idx`` the class index of
        every sample.
        """
        X, y_idx, weights, classes, counts = self._check_targets(X, y, sample_weight)
        self._set_classes(classes, counts)
        self._set_kernel(X)
        return X, y_idx, self._row_C(y_idx, weights)

    def _check_targets(self, X, y, sample_weight):
        """``X`` and ``y`` checked as SVC checks them, before any work.

        Returns ``(X, y_idx, sample_weight, classes, class_counts)``: the class
        index of every row, the weights as float64 (ones when None), the sorted
        classes and the rows of each.
        """
        if sp.issparse(X) and self.kernel == "precomputed":
            raise TypeError("Sparse precomputed kernels are not supported.")
        if callable(self.kernel):
            # As SVC: the callable sees the samples as given (any objects, even
            # strings) and the fit runs on the kernel matrix it returns.
            check_consistent_length(X, y)
            self._X_fit = X
            X = self._callable_gram(X)
        X, y = validate_X_y(self, X, y)
        y_host = to_numpy(y)
        check_class_labels(y_host)
        if self._kernel_name == "precomputed" and X.shape[0] != X.shape[1]:
            raise ValueError(f"Precomputed matrix must be a square matrix. Input is a "
                             f"{X.shape[0]}x{X.shape[1]} matrix.")
        classes, y_idx = np.unique(y_host, return_inverse=True)
        # Negative weights are allowed and, as in SVC, drop their rows (C_i <= 0).
        sw = (np.ones(X.shape[0]) if sample_weight is None else  # as the check gives None
              _check_sample_weight(sample_weight, X, dtype=np.float64,
                                   allow_all_zero_weights=True))
        if self._kernel_name != "precomputed" and not bool(
                namespace_of(X).isfinite(squared_norms(X)).all()):
            # Before any work: kernel values of such samples overflow, and the solver's
            # coefficients with them (SVC finds out after its fit; the message is SVC's).
            raise ValueError("The dual coefficients or intercepts are not finite: the squared "
                             "norms of some samples overflow, and so do their kernel values. "
                             "The input data may contain large values and need to be "
                             "preprocessed.")
        return X, y_idx, sw, classes, np.bincount(y_idx, minlength=len(classes))

    def _set_classes(self, classes, counts):
        """``classes_`` and ``class_weight_`` from the sorted classes and their row counts."""
        if len(classes) < 2:
            raise ValueError(f"{type(self).__name__} needs samples of at least two classes in y "
                             f"(the number of classes has to be greater than one; got "
                             f"{len(classes)} class)")
        self.classes_ = classes
        # None: ones, as compute_class_weight gives them (without its checks' cost)
        self.class_weight_ = (np.ones(len(classes)) if self.class_weight is None else
                              compute_class_weight(self.class_weight, classes=classes,
                                                   y=np.repeat(classes, counts)))

    def _set_kernel(self, stats):
        """The kernel with ``gamma`` resolved from ``stats`` (the training rows, or anything
        with their ``shape`` and ``var()``)."""
        self._kernel = make_kernel(self._kernel_name, self.gamma, self.degree, self.coef0, stats)
        self._gamma = self._kernel.gamma

    def _row_C(self, y_idx, sample_weight):
        """LIBSVM's per-row ``C_i = C * class_weight[y_i] * sample_weight_i`` (:func:`row_C`);
        rows with ``C_i <= 0`` are left out, as SVC leaves them out (refused when no row, or
        one class, is left)."""
        sample_C = row_C(self.C, self.class_weight_, y_idx, sample_weight)
        kept = sample_C > 0
        if not kept.any():
            raise ValueError("Invalid input - all samples have zero or negative weights.")
        if np.unique(y_idx[kept]).size < 2:
            raise ValueError("Invalid input - all samples with positive weights belong to the "
                             "same class.")
        return sample_C

    @property
    def _kernel_name(self) -> str:
        """The kernel the solver sees: a callable kernel is a precomputed matrix to it."""
        return "precomputed" if callable(self.kernel) else self.kernel

    def score(self, X, y, sample_weight=None):
        """Mean accuracy on ``X`` and ``y`` (scikit-learn's ``ClassifierMixin.score``).

        On Dask input (``X``, ``y`` or ``sample_weight``: arrays, dataframes or
        series) the predictions are computed once, each block where it lies, and
        compared with its targets there: one pass over the rows.

        Parameters
        ----------
        X : array-like, sparse matrix or Dask collection of shape (n_samples, n_features)
        y : array-like or Dask collection of shape (n_samples,)
        sample_weight : array-like or Dask collection of shape (n_samples,), default=None

        Returns
        -------
        float
        """
        if any(is_dask_collection(v) for v in (X, y, sample_weight)):
            return dask_module().score(self, X, y, sample_weight)
        return super().score(X, y, sample_weight)

    def decision_function(self, X):
        """Decision values in SVC's shapes: (n,) for two classes, else (n, n_classes) or ovo.

        For two classes, positive values mean ``classes_[1]``. For more, with
        "ovr" column k is the number of one-vs-one votes for class k plus its
        summed pairwise values squashed into (-1/3, 1/3) (SVC's recipe); with
        "ovo" the pairwise values, positive for the pair's first class.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,), (n_samples, n_classes) or (n_samples, n_pairs)
            float32 for float32 ``X``, else float64 (computed with float64
            accumulation either way). A lazy Dask array for Dask input (each
            chunk computed on its worker).
        """
        check_is_fitted(self)
        if self._on_cluster(X):
            return self._lazy(X, "decision_function")
        return self._output(X, "decision_function")

    def predict(self, X):
        """Class labels by one-vs-one voting, as SVC (ties: the lowest class).

        A pairwise value of exactly 0 votes for the pair's second class; with
        ``break_ties=True`` ("ovr", more than two classes) the class is the
        argmax of :meth:`decision_function` instead. For
        :class:`~gpuml.estimators.casvm.CASVMClassifier` the votes are those of
        the parts that judge the sample (``combine``).

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
            A lazy Dask array for Dask input (each chunk predicted on its worker).
        """
        check_is_fitted(self)
        if self.break_ties and self.decision_function_shape == "ovo":
            raise ValueError("break_ties must be False when decision_function_shape is 'ovo'")
        if self._on_cluster(X):
            return self._lazy(X, "predict")
        return self._output(X, "predict")

    def _output(self, X, method):
        """``method``'s result for in-memory ``X`` (:func:`ovo_output`), on X's device."""
        values, voting = self._ovo_values(X)
        return to_output(ovo_output(to_numpy(values), voting, self.classes_, method,
                                    self.decision_function_shape, self.break_ties,
                                    value_dtype(X)), X)

    def _on_cluster(self, X) -> bool:
        """Whether ``X`` is predicted on a Dask cluster (:meth:`_lazy`): Dask input."""
        return is_dask_collection(X)

    def _output_layout(self, X, method):
        """``(columns, dtype)`` of ``method``'s result for ``X``: columns None for a 1-D
        result."""
        if method == "predict":
            return None, self.classes_.dtype
        k = len(self.classes_)
        columns = (None if k == 2 else k if self.decision_function_shape == "ovr"
                   else k * (k - 1) // 2)
        return columns, value_dtype(X)

    def _lazy(self, X, method):
        """``method`` (``"predict"`` or ``"decision_function"``) over Dask ``X``, lazily:
        each block predicted on the worker holding it."""
        columns, dtype = self._output_layout(X, method)
        return dask_module().predict_blocks(self, X, method, out_columns=columns, dtype=dtype)

    def _check_predict_input(self, X):
        """SVC's checks before prediction; returns the matrix the model is evaluated on."""
        check_is_fitted(self)
        if callable(self.kernel):
            X = self._callable_gram(X)
        elif (sp.issparse(X) or hasattr(X, "tocsr")) and not self._sparse:
            # As SVC, whose LIBSVM has separate dense and sparse models.
            raise ValueError(f"cannot use sparse input in {type(self).__name__!r} trained on "
                             "dense data")
        return X

    def _check_finite_model(self, *arrays):
        """SVC's error for a fit whose coefficients overflowed (features near the float max)."""
        if not all(np.isfinite(a).all() for a in arrays):
            raise ValueError("The dual coefficients or intercepts are not finite. The input "
                             "data may contain large values and need to be preprocessed.")

    def _callable_gram(self, X):
        """``kernel(X, X_fit)`` of a callable kernel as a dense float64 matrix (as SVC)."""
        K = self.kernel(X, self._X_fit)
        K = K.toarray() if sp.issparse(K) else K
        return np.asarray(to_numpy(K), dtype=np.float64, order="C")

    def __getstate__(self):
        # Device copies of fitted arrays are a cache, not part of the model: dropping
        # them lets a GPU-fitted model load where there is no GPU.
        state = self.__dict__.copy()
        state.pop("_device_cache", None)
        return state

    def _ovo_coef(self, backend, cols=None):
        """``ovo_dual_coef_`` of the support vectors ``cols`` (all when None) as a
        :class:`PairCoef` on ``backend``."""
        n_classes = len(self.classes_)
        coef = self.ovo_dual_coef_.T if cols is None else self.ovo_dual_coef_[:, cols].T
        sv_class = None
        if n_classes >= PAIR_BLOCKS_MIN_CLASSES:  # the blocks need each vector's class
            sv_class = np.repeat(np.arange(n_classes), self.n_support_)
            sv_class = sv_class if cols is None else sv_class[cols]
        return PairCoef(coef, sv_class, n_classes, backend.asarray)

    def _pair_coef(self, backend):
        """:meth:`_ovo_coef` of every support vector on the predicting device: made once
        per device and fit, and, like the device copies, never pickled."""
        cache = self.__dict__.setdefault("_device_cache", {})
        key = (backend.device, "pair_coef")
        if key not in cache:
            with backend.use():
                cache[key] = self._ovo_coef(backend)
        return cache[key]

    def _on_device(self, backend, name):
        """The fitted host array ``name`` on the predicting device (copied once, cached)."""
        return on_device(self, backend, (name,), backend.asarray, getattr(self, name))
