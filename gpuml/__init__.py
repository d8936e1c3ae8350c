"""gpuml: GPU-first communication-avoiding kernel methods with a scikit-learn API.

Estimators (seed 001, chapters 2-4):

- :class:`CASVMClassifier` — communication-avoiding kernel SVM (Alg 3, 4, 5);
- :class:`BKRRRegressor`, :class:`BKRRRegressorCV` — balanced kernel ridge
  regression and its family (Alg 6-11);
- :class:`AsyGCDSVC` — asynchronous greedy coordinate descent SVM (Alg 12-14).

The optimizers live in :mod:`gpuml.optim` (needs PyTorch). Importing gpuml
never touches a GPU, imports neither CuPy nor torch, and prints nothing: the
device is resolved when an estimator is fitted (see :mod:`gpuml._backend`).
"""

from .estimators._partitioned import PartitionWarning
from .estimators.asygcd import AsyGCDSVC
from .estimators.bkrr import BKRRRegressor, BKRRRegressorCV
from .estimators.casvm import CASVMClassifier

__version__ = "0.1.0"

__all__ = ["AsyGCDSVC", "BKRRRegressor", "BKRRRegressorCV", "CASVMClassifier", "PartitionWarning",
           "__version__"]
