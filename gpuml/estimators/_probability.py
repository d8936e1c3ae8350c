"""SVC's ``probability=True`` for the kernel SVM classifiers, kept for code written for SVC.

Platt scaling by ``CalibratedClassifierCV(<the classifier>, method="sigmoid",
ensemble=False)`` after the fit, which is what scikit-learn recommends since it
deprecated the parameter (1.9, removed in 1.11); the parameter warns whenever
it is given, as SVC's does.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils import _safe_indexing, check_random_state
from sklearn.utils._available_if import available_if
from sklearn.utils.deprecation import deprecated

from .._backend import to_numpy, to_output
from ._svm import value_dtype

#: Folds of the cross-validated decision values Platt scaling is fitted on (LIBSVM's 5).
PROBABILITY_FOLDS = 5

_PROBABILITY_DOC = ("as the `probability=True` option of SVC, which gpuml keeps for code "
                    "written for SVC, was deprecated in scikit-learn 1.9 and is removed in 1.11")


class PlattProbabilityMixin:
    """SVC's ``probability``, ``predict_proba``, ``predict_log_proba``, ``probA_`` and
    ``probB_`` for a classifier with ``probability``, ``kernel`` and ``random_state``
    parameters; its ``fit`` calls :meth:`_warn_probability` first and
    :meth:`_fit_probability` once the model is fitted."""

    def _warn_probability(self):
        """SVC's FutureWarning whenever ``probability`` is given, pointing to the replacement."""
        if self.probability != "deprecated":
            name = type(self).__name__
            warnings.warn(f"The `probability` parameter was deprecated in 1.9 and will be "
                          f"removed in version 1.11 (as SVC's). Use "
                          f"`CalibratedClassifierCV({name}(), ensemble=False)` instead of "
                          f"`{name}(probability=True)`", FutureWarning, stacklevel=3)

    def _fit_probability(self, X, y, y_idx, sample_C, sample_weight):
        """Platt scaling on cross-validated decision values, as SVC's ``probability=True``.

        ``CalibratedClassifierCV(clone, method="sigmoid", ensemble=False)`` on the
        rows the fit kept (positive C), with stratified folds seeded by
        ``random_state``; a class with a single sample leaves no folds, and the
        sigmoid is then fitted on the model's own decision values.
        """
        from sklearn.calibration import CalibratedClassifierCV
        from sklearn.model_selection import StratifiedKFold

        self._calibrated = None
        if self.probability in ("deprecated", False):
            return
        kept = np.flatnonzero(sample_C > 0)
        if callable(self.kernel):
            X = self._X_fit
        X, y = _safe_indexing(X, kept), _safe_indexing(np.asarray(to_numpy(y)), kept)
        weight = None if sample_weight is None else \
            _safe_indexing(np.asarray(to_numpy(sample_weight), dtype=np.float64), kept)
        folds = min(PROBABILITY_FOLDS, int(np.bincount(y_idx[kept]).min()))
        base = clone(self).set_params(probability="deprecated")
        if folds >= 2:
            seed = check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
            cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
            calibrated = CalibratedClassifierCV(base, method="sigmoid", cv=cv, ensemble=False)
        else:
            from sklearn.frozen import FrozenEstimator

            frozen = copy.copy(self)
            frozen.__dict__.pop("_calibrated", None)
            # One "fold" holding every row: the frozen model predicts its own training set.
            every_row = np.arange(len(y))
            calibrated = CalibratedClassifierCV(FrozenEstimator(frozen), method="sigmoid",
                                                cv=[(every_row, every_row)], ensemble=False)
        self._calibrated = calibrated.fit(X, y, sample_weight=weight)

    def _check_proba(self):
        if self.probability in ("deprecated", False):
            raise AttributeError("predict_proba is not available when probability=False")
        return True

    @available_if(_check_proba)
    def predict_proba(self, X):
        """Class probabilities by Platt scaling, with ``probability=True`` (deprecated, as SVC).

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        if getattr(self, "_calibrated", None) is None:
            raise NotFittedError("predict_proba is not available when fitted with "
                                 "probability=False")
        proba = self._calibrated.predict_proba(X)
        return to_output(proba.astype(value_dtype(X), copy=False), X)

    @available_if(_check_proba)
    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`."""
        return np.log(self.predict_proba(X))

    def _platt(self, name):
        calibrated = getattr(self, "_calibrated", None)
        if calibrated is None:
            return np.array([])
        sigmoids = calibrated.calibrated_classifiers_[0].calibrators
        return np.array([getattr(c, name) for c in sigmoids])

    @deprecated(f"Attribute `probA_` was deprecated in version 1.9 and will be removed in 1.11 "
                f"{_PROBABILITY_DOC}.")
    @property
    def probA_(self):
        """Slopes of the Platt sigmoids (one per class, or one for two classes; SVC: per pair)."""
        return self._platt("a_")

    @deprecated(f"Attribute `probB_` was deprecated in version 1.9 and will be removed in 1.11 "
                f"{_PROBABILITY_DOC}.")
    @property
    def probB_(self):
        """Offsets of the Platt sigmoids (as ``probA_``)."""
        return self._platt("b_")
