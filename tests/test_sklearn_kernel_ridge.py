"""scikit-learn's own KernelRidge tests (sklearn/tests/test_kernel_ridge.py) against BKRRRegressor.

The file runs as shipped with the installed scikit-learn, with ``KernelRidge``
mapped to a one-part ``BKRRRegressor`` (tests/_sklearn_suite.py). Every test
of the file is selected.
"""

from _sklearn_suite import functions_of, load

globals().update(functions_of(load("tests/test_kernel_ridge.py")))
