"""gpuml: GPU-first communication-avoiding kernel methods with a scikit-learn API.

Estimators (You 2020, chapters 2-4):

- :class:`CASVMClassifier` — communication-avoiding kernel SVM (Alg 3, 4, 5), and
  :class:`CASVMClassifierCV`, its search over C and γ;
- :class:`BKRRRegressor`, :class:`BKRRRegressorCV` — balanced kernel ridge
  regression and its family (Alg 6-11);
- :class:`AsyGCDSVC` — asynchronous greedy coordinate descent SVM (Alg 12-14).

The optimizers live in :mod:`gpuml.optim` (needs PyTorch). Importing gpuml
never touches a GPU, imports neither CuPy nor torch, and prints nothing: the
device is resolved when an estimator is fitted (see :mod:`gpuml._backend`).

References (the short forms used throughout gpuml's docstrings, docs and tests):

- **You 2020**: Yang You, "Fast and Accurate Machine Learning on Distributed
  Systems and Supercomputers", PhD thesis, UC Berkeley (Technical Report
  UCB/EECS-2020-136), 2020.
- **You et al. 2019**: Yang You, Jonathan Hseu, Chris Ying, James Demmel, Kurt
  Keutzer, Cho-Jui Hsieh, "Large-Batch Training for LSTM and Beyond", SC 2019.
- **Goyal et al. 2017**: Priya Goyal et al., "Accurate, Large Minibatch SGD:
  Training ImageNet in 1 Hour", 2017.
"""

from .errors import PartitionWarning
from .estimators.asygcd import AsyGCDSVC
from .estimators.bkrr import BKRRRegressor, BKRRRegressorCV
from .estimators.casvm import CASVMClassifier
from .estimators.casvm_cv import CASVMClassifierCV

__version__ = "0.1.0"

__all__ = ["AsyGCDSVC", "BKRRRegressor", "BKRRRegressorCV", "CASVMClassifier",
           "CASVMClassifierCV", "PartitionWarning", "__version__"]
