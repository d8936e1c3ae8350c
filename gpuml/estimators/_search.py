"""What gpuml's searches share (BKRRRegressorCV, CASVMClassifierCV): scikit-learn's results.

* :func:`search_results`: ``cv_results_`` in ``GridSearchCV``'s layout and key order
  (``mean_fit_time`` ... ``param_<name>``, ``params``, ``split<k>_test_score``,
  ``mean_test_score``, ``std_test_score``, ``rank_test_score``), ranked as it ranks
  (ties share the best rank; a NaN mean ties with the worst) and its ``best_index_``
  (the first candidate of rank 1);
* :class:`BestEstimatorMixin`: ``predict``, ``decision_function``, ``predict_proba`` and
  ``score`` forwarded to the refitted ``best_estimator_``, as ``GridSearchCV`` does.
"""

from __future__ import annotations

import numpy as np
from sklearn.exceptions import NotFittedError
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted


def rank_scores(means, tiers=None) -> np.ndarray:
    """``GridSearchCV``'s ranks of the mean scores ``means``: 1 for the best, ties sharing
    the best rank of the tie (``scipy.stats.rankdata(method="min")``), NaN tied with the
    worst (all NaN: all 1). ``tiers`` (optional ints): candidates of a higher tier rank
    before every candidate of a lower one (a successive-halving search: the rounds a
    candidate reached), by their means within a tier.

    >>> rank_scores(np.array([0.5, 0.9, 0.9, np.nan])).tolist()
    [3, 1, 1, 4]
    >>> rank_scores(np.array([0.5, 0.9, 0.7]), tiers=np.array([1, 0, 1])).tolist()
    [2, 3, 1]
    """
    means = np.asarray(means, dtype=np.float64)
    if np.isnan(means).all():
        return np.ones(means.size, dtype=np.int32)
    filled = np.where(np.isnan(means), np.nanmin(means) - 1.0, means)
    tiers = np.zeros(means.size) if tiers is None else np.asarray(tiers, dtype=np.float64)
    keys = np.stack([-tiers, -filled], axis=1)
    order = np.lexsort((keys[:, 1], keys[:, 0]))
    rank = np.empty(means.size, dtype=np.int32)
    rank[order] = np.arange(1, means.size + 1)
    for i in range(1, means.size):
        if (keys[order[i]] == keys[order[i - 1]]).all():
            rank[order[i]] = rank[order[i - 1]]
    return rank


def search_results(params, split_scores, fit_times=None, score_times=None, tiers=None,
                   extra=None):
    """``(cv_results_, best_index_)`` of a search, in ``GridSearchCV``'s layout.

    ``params``: one dict per candidate, in the search's order (``ParameterGrid``'s:
    the parameter names sorted, the first slowest); ``split_scores``: ``(n_candidates,
    n_splits)`` test scores; ``fit_times``, ``score_times``: the same shape, seconds
    (left out when None); ``tiers``: see :func:`rank_scores`; ``extra``: further
    columns (one value per candidate), appended in their order.
    """
    scores = np.asarray(split_scores, dtype=np.float64)
    results = {}
    for name, times in (("fit_time", fit_times), ("score_time", score_times)):
        if times is not None:
            times = np.asarray(times, dtype=np.float64)
            results[f"mean_{name}"] = times.mean(axis=1)
            results[f"std_{name}"] = times.std(axis=1)
    for name in sorted({name for candidate in params for name in candidate}):
        values = [candidate.get(name) for candidate in params]
        column = np.ma.MaskedArray(np.array(values), mask=[name not in c for c in params])
        results[f"param_{name}"] = column
    results["params"] = [dict(candidate) for candidate in params]
    for k in range(scores.shape[1]):
        results[f"split{k}_test_score"] = scores[:, k]
    mean = scores.mean(axis=1)
    results["mean_test_score"] = mean
    results["std_test_score"] = scores.std(axis=1)
    results["rank_test_score"] = rank_scores(mean, tiers)
    results.update({name: np.asarray(values) for name, values in (extra or {}).items()})
    return results, int(np.argmin(results["rank_test_score"]))


def _best_has(method):
    """Whether the search offers ``method``: its refitted model's, or before a fit the
    model it would refit (:meth:`BestEstimatorMixin._unfitted_model`)."""
    def check(search):
        model = getattr(search, "best_estimator_", None) or search._unfitted_model()
        return hasattr(model, method)
    return check


class BestEstimatorMixin:
    """The methods of a fitted search that its refitted ``best_estimator_`` answers, as
    ``GridSearchCV`` forwards them (``NotFittedError``, naming ``refit``, when there is
    none). ``score`` uses the search's scorer (``scorer_``) where it has one."""

    def _unfitted_model(self):
        """The model a fit would refit, unfitted (what the forwarded methods depend on)."""
        raise NotImplementedError

    def _best(self):
        check_is_fitted(self, "cv_results_")
        if not hasattr(self, "best_estimator_"):
            raise NotFittedError(f"This {type(self).__name__} instance is not fitted with "
                                 "refit=True: it holds the search's results only. Fit it with "
                                 "refit=True, or fit the estimator with best_params_")
        return self.best_estimator_

    def predict(self, X):
        """Predict with the refitted best model (``best_estimator_.predict``)."""
        return self._best().predict(X)

    @available_if(_best_has("decision_function"))
    def decision_function(self, X):
        """``best_estimator_.decision_function``."""
        return self._best().decision_function(X)

    @available_if(_best_has("predict_proba"))
    def predict_proba(self, X):
        """``best_estimator_.predict_proba`` (where the refitted model has it)."""
        return self._best().predict_proba(X)

    def score(self, X, y, sample_weight=None):
        """The search's score of the refitted best model on ``X``, ``y`` (its ``scoring``;
        the model's own ``score`` when none)."""
        best = self._best()
        scorer = getattr(self, "scorer_", None)
        if scorer is None:
            return best.score(X, y, sample_weight=sample_weight)
        kwargs = {} if sample_weight is None else {"sample_weight": sample_weight}
        return scorer(best, X, y, **kwargs)
