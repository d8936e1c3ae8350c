r"""Balanced kernel ridge regression and its family (You 2020, chapter 3, Alg 6-11).

One estimator, :class:`BKRRRegressor`, covers the methods of the chapter as
settings: split the training set into P parts, solve one kernel ridge system
per part, and predict with the part whose centre is nearest (BKRR2, KKRR2)
or with the average of all parts (DC-KRR). :class:`BKRRRegressorCV` searches
σ and λ with one tridiagonal reduction (or eigendecomposition) per part and σ.

This module is the family's import path. The estimators live in
:mod:`gpuml.estimators.bkrr_regressor` and :mod:`gpuml.estimators.bkrr_cv`, what
they share (helpers, the base class) in :mod:`gpuml.estimators._krr`.
"""

from ._krr import AUTO_PART_SIZE, KRRPartFit, scale_gamma
from .bkrr_cv import CHOLESKY_COST, REDUCTION_COST, BKRRRegressorCV
from .bkrr_regressor import AUTO_LAM_SAMPLES, AUTO_LAMS, BKRRRegressor, auto_lam_rows

__all__ = [
    "AUTO_LAMS",
    "AUTO_LAM_SAMPLES",
    "AUTO_PART_SIZE",
    "BKRRRegressor",
    "BKRRRegressorCV",
    "CHOLESKY_COST",
    "KRRPartFit",
    "REDUCTION_COST",
    "auto_lam_rows",
    "scale_gamma",
]
