"""The parameter names of an estimator, read once per class."""

from __future__ import annotations

import functools

from sklearn.base import BaseEstimator


@functools.cache
def _names(cls) -> tuple:
    return tuple(BaseEstimator._get_param_names.__func__(cls))


class CachedParamNames:
    """scikit-learn's parameter names (the ``__init__`` signature), read once per class.

    ``get_params`` (so ``clone``, ``set_params`` and the check of the parameters
    at the start of every ``fit``) reads the signature of ``__init__`` on every
    call with :mod:`inspect`; on small data that costs as much as the fit's solve,
    and a grid search or cross-validation pays it several times per fit. The names
    are the same for every call; they are read once per class and copied out.
    """

    @classmethod
    def _get_param_names(cls):
        return list(_names(cls))
