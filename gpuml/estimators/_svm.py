"""What the kernel SVM classifiers share (CASVMClassifier, AsyGCDSVC).

* targets and per-sample C: LIBSVM's ``C_i = C * class_weight[y_i] * sample_weight_i``;
* one-vs-one voting and SVC's "ovr"-shaped decision values;
* fitted arrays kept on the host, with device copies cached for prediction but
  never pickled, so a model fitted on a GPU loads where there is none.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight

from .._backend import to_numpy
from .._validation import validate_X_y
from ..kernels import make_kernel


def class_pairs(n_classes: int) -> list[tuple[int, int]]:
    """The one-vs-one pairs ``(a, b)``, ``a < b``, in LIBSVM's order."""
    return [(a, b) for a in range(n_classes) for b in range(a + 1, n_classes)]


def ovo_votes(values, n_classes: int, voting=None):
    """Votes and summed confidences from pairwise values.

    ``values[:, q] > 0`` is a vote for the first class of pair ``q``;
    ``voting[:, q]`` (default all True) says whether pair ``q`` votes at all.
    """
    votes = np.zeros((values.shape[0], n_classes))
    confidence = np.zeros_like(votes)
    for q, (a, b) in enumerate(class_pairs(n_classes)):
        first = values[:, q] > 0
        vote = np.ones_like(first) if voting is None else voting[:, q]
        votes[:, a] += first & vote
        votes[:, b] += ~first & vote
        confidence[:, a] += values[:, q]
        confidence[:, b] -= values[:, q]
    return votes, confidence


def ovr_decision(votes, confidence):
    """SVC's "ovr" shape: votes plus confidences squashed into (-1/3, 1/3)."""
    return votes + confidence / (3 * (np.abs(confidence) + 1))


class KernelSVMMixin:
    """Shared fit preamble and device caching for the kernel SVM classifiers."""

    def _validate_targets(self, X, y, sample_weight):
        """Validate ``X`` and ``y``; set ``classes_`` and the kernel; return per-sample C.

        Returns ``(X, y_idx, sample_C)`` with ``y_idx`` the class index of
        every sample.
        """
        X, y = validate_X_y(self, X, y)
        y_host = to_numpy(y)
        check_classification_targets(y_host)
        if self.kernel == "precomputed" and X.shape[0] != X.shape[1]:
            raise ValueError(f"Precomputed matrix must be a square matrix. Input is a "
                             f"{X.shape[0]}x{X.shape[1]} matrix.")
        self.classes_, y_idx = np.unique(y_host, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"{type(self).__name__} needs samples of at least two classes in y "
                             f"(the number of classes has to be greater than one; got "
                             f"{len(self.classes_)} class)")
        sw = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        cw = compute_class_weight(self.class_weight, classes=self.classes_, y=y_host)
        self._kernel = make_kernel(self.kernel, self.gamma, self.degree, self.coef0, X)
        return X, y_idx, self.C * cw[y_idx] * sw

    def __getstate__(self):
        # Device copies of fitted arrays are a cache, not part of the model: dropping
        # them lets a GPU-fitted model load where there is no GPU.
        state = self.__dict__.copy()
        state.pop("_device_cache", None)
        return state

    def _on_device(self, backend, name):
        """The fitted host array ``name`` on the predicting device (copied once, cached)."""
        value = getattr(self, name)
        if not backend.is_gpu:
            return value
        cache = self.__dict__.setdefault("_device_cache", {})
        key = (backend.device, name)
        if key not in cache:
            with backend.use():
                cache[key] = backend.asarray(value)
        return cache[key]
