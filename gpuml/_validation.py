"""Input checks shared by every estimator and public function.

Every check runs before any heavy work, raises an error that names the
problem, and never modifies what the caller passed in. NumPy, pandas and
SciPy-sparse inputs go through scikit-learn's own validation (so messages
match scikit-learn's); CuPy inputs get the same checks on the device.
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, validate_data

from ._backend import is_cupy_array, is_dask_collection

FLOAT_DTYPES = (np.float64, np.float32)


def refuse_dask(estimator, *values):
    """Refuse Dask input to a ``fit`` that runs in one process, before any work.

    Such a fit would gather every row into the client, which is what Dask
    input says the user cannot or does not want to do.
    """
    if any(is_dask_collection(v) for v in values):
        raise TypeError(
            f"{type(estimator).__name__}.fit does not take Dask input: it fits in one process "
            "and would gather every row into it. Compute the data first (X.compute()) if it "
            "fits in memory, or use CASVMClassifier / BKRRRegressor, which fit on the Dask "
            "workers")


def _check_cupy_2d(X, name="X"):
    """The checks scikit-learn applies, for a CuPy array (dense or cupyx sparse)."""
    import cupy as cp

    if X.ndim != 2:
        raise ValueError(
            f"Expected 2D array, got {X.ndim}D array instead for {name}; reshape your data "
            "with X.reshape(-1, 1) for a single feature or X.reshape(1, -1) for a single sample."
        )
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"Found array with shape {X.shape} while a minimum of 1 sample and "
                         f"1 feature is required ({name}).")
    if hasattr(X, "tocsr"):
        X = X.tocsr()
        data = X.data
    else:
        data = X
    if data.dtype not in FLOAT_DTYPES:
        if data.dtype.kind not in "biuf":
            raise ValueError(f"{name} has dtype {data.dtype}; a numeric dtype is required")
        X = X.astype(cp.float64)
        data = X.data if hasattr(X, "tocsr") else X
    if not bool(cp.isfinite(data).all()):
        raise ValueError(f"Input {name} contains NaN or infinity.")
    return X


def validate_X(estimator, X, *, reset: bool):
    """Validate a feature matrix for ``fit`` (``reset=True``) or ``predict``.

    Returns a float32/float64 2-D array (CSR for sparse input) on the input's
    own device, and sets/checks ``n_features_in_``.
    """
    if is_cupy_array(X):
        X = _check_cupy_2d(X)
        if reset:
            estimator.n_features_in_ = int(X.shape[1])
        elif X.shape[1] != estimator.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but {type(estimator).__name__} is expecting "
                f"{estimator.n_features_in_} features as input."
            )
        return X
    return validate_data(estimator, X, accept_sparse="csr", dtype=FLOAT_DTYPES, reset=reset)


def validate_X_y(estimator, X, y, *, y_numeric: bool = False, multi_output: bool = False):
    """Validate ``X`` and ``y`` for ``fit``: same length, finite, ``y`` 1-D (or 2-D if allowed)."""
    if is_cupy_array(X) or is_cupy_array(y):
        import cupy as cp

        X = validate_X(estimator, cp.asarray(X) if not is_cupy_array(X) else X, reset=True)
        y = cp.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1 and not multi_output:
            y = y.ravel()
        if y.ndim != 1 and not (multi_output and y.ndim == 2):
            raise ValueError(f"y should be a 1d array, got an array of shape {y.shape} instead.")
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                             f"[{X.shape[0]}, {y.shape[0]}]")
        if y_numeric:
            y = y.astype(X.dtype, copy=False)
            if not bool(cp.isfinite(y).all()):
                raise ValueError("Input y contains NaN or infinity.")
        return X, y
    return validate_data(estimator, X, y, accept_sparse="csr", dtype=FLOAT_DTYPES,
                         y_numeric=y_numeric, multi_output=multi_output)


def check_class_labels(y):
    """scikit-learn's ``check_classification_targets`` for validated 1-D labels.

    Integer and boolean labels, and floats that are whole numbers, are class
    labels without further work (scikit-learn's ``type_of_target`` calls them
    binary or multiclass); anything else goes through scikit-learn's check,
    which raises its own message for continuous or other unfit targets. The
    shortcut matters on small data, where ``type_of_target`` costs as much as
    an SVM fit of a hundred rows.
    """
    if isinstance(y, np.ndarray) and y.ndim == 1 and y.size:
        kind = y.dtype.kind
        if kind in "iub":
            return
        if kind == "f" and bool(np.all(np.isfinite(y))) and np.array_equal(
                y, y.astype(np.int64)):
            return
    check_classification_targets(y)


def as_float_matrix(X, name: str = "X"):
    """Validate a matrix for the plain functions (kernels, partitioners): 2-D, finite, float."""
    if is_cupy_array(X):
        return _check_cupy_2d(X, name)
    return check_array(X, accept_sparse="csr", dtype=FLOAT_DTYPES, input_name=name)


def check_n_partitions(n_partitions, n_samples: int) -> int:
    """``n_partitions`` must be an integer in [1, n_samples]."""
    if isinstance(n_partitions, bool) or not isinstance(n_partitions, numbers.Integral):
        raise TypeError(f"n_partitions must be an integer, got {n_partitions!r}")
    if n_partitions < 1:
        raise ValueError(f"n_partitions must be at least 1, got {n_partitions}")
    if n_partitions > n_samples:
        raise ValueError(
            f"n_partitions={n_partitions} is larger than the number of samples ({n_samples}); "
            "every partition needs at least one sample"
        )
    return int(n_partitions)


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def check_memory_bytes(value, name: str = "max_device_memory") -> int | None:
    """A memory size as bytes: None, a positive integer (bytes) or a string such as
    ``"512MB"`` or ``"2 GiB"`` (kB/MB/GB/TB: powers of 10; KiB/MiB/GiB/TiB: of 2).

    >>> check_memory_bytes("1.5 GiB"), check_memory_bytes(4096), check_memory_bytes(None)
    (1610612736, 4096, None)
    """
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(number):]
        try:
            size = float(number) * _BYTE_UNITS[unit]
        except (ValueError, KeyError):
            raise ValueError(f"{name}={value!r} is not a memory size: give bytes, or a number "
                             "with kB, MB, GB, KiB, MiB or GiB") from None
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        size = float(value)
    else:
        raise TypeError(f"{name} must be None, a number of bytes or a string such as '2GB', "
                        f"got {value!r}")
    if not size >= 1:
        raise ValueError(f"{name}={value!r} must be at least one byte")
    return int(size)
