"""gpuml: GPU-first communication-avoiding kernel methods with a scikit-learn API.

Importing gpuml never touches a GPU: the device is resolved when an estimator
is fitted (see :mod:`gpuml._backend`).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
