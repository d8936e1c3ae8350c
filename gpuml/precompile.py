"""Compile gpuml's CPU kernels once, into numba's on-disk cache: ``python -m gpuml.precompile``.

The CPU solvers (SMO for CA-SVM, Asy-GCD, the partitioners' greedy fills and the
fused nearest-centre sweep), CA-SVM's neighbour search in prediction and LAMB/LARS's
fused CPU kernels are numba functions compiled with ``cache=True``: the first process
that needs one compiles it (seconds per solver; this module prints the time each
takes, and the cost of a cold first fit is in bench/results/cpu-2core/first_fit.md)
and writes the machine code next to the sources (in ``__pycache__``, or under
``NUMBA_CACHE_DIR`` when that is set); every later process
loads it in a fraction of a second. Run this module once after installing (in a
Docker image build, a CI setup step, ``make install``) so that no user-facing fit
meets the compile. It fits each estimator on a small synthetic problem, which
compiles exactly the specialisations a fit uses, with both dtypes a user may pass.
Without it, a small first fit no longer waits for the compile: it runs NumPy twins of
the solvers while numba compiles in a background thread (``gpuml.kernels._jit``);
here everything compiles in the calling thread, so the cache is complete on return.
"""

from __future__ import annotations

import time
import warnings


def precompile(verbose: bool = True) -> dict:
    """Fit every CPU code path once on tiny data; returns the seconds each took.

    A path already in the cache takes well under a second; a cold one compiles.
    """
    from sklearn.datasets import make_classification, make_regression

    from gpuml.estimators.asygcd import AsyGCDSVC
    from gpuml.estimators.bkrr import BKRRRegressor
    from gpuml.estimators.casvm import CASVMClassifier
    from gpuml.kernels.pairwise import Kernel
    from gpuml.kernels.smo.cpu import sgemm_matrix

    # 1,200 rows, 3 classes: one-vs-one pairs of ~800, enough for two Asy-GCD workers
    X, y = make_classification(1200, 8, n_classes=3, n_informative=4, random_state=0)
    Xr, yr = make_regression(600, 8, random_state=0)
    # binary problems of more than 1,024 rows compute their kernel rows on demand, and
    # these (a third of the labels flipped: most rows support vectors) make the rest of
    # their matrix midway: every piece of that path
    Xb, yb = make_classification(2200, 8, flip_y=0.3, random_state=0)
    fits = {
        # predict: the neighbour search's merge (the blend of combine="neighbors", and of
        # the rows combine="auto" leaves open: every row here, so that it surely runs)
        "CASVMClassifier": lambda X: CASVMClassifier(n_partitions=2, combine="neighbors",
                                                     device="cpu",
                                                     random_state=0).fit(X, y).predict(X),
        # predict: the blend among more parts than a row searches, its neighbour search
        # and its values each in one compiled loop
        "CASVMClassifier(20 parts)": lambda X: CASVMClassifier(
            n_partitions=20, combine="neighbors", device="cpu",
            random_state=0).fit(X, y).predict(X),
        # predict: the nearest part's values of rows spread over many parts, every part
        # in one compiled loop (a few rows here for the two parts)
        "CASVMClassifier(partition='fcfs')": lambda X: CASVMClassifier(
            n_partitions=2, partition="fcfs", device="cpu",
            random_state=0).fit(X, y).predict(X[:50]),
        # Shrinking and the random selection are compiled apart from the defaults (numba
        # drops their code from the default variants), so they get their own warm-up.
        "CASVMClassifier(shrinking=True)": lambda X: CASVMClassifier(
            n_partitions=2, shrinking=True, device="cpu", random_state=0).fit(X, y),
        "AsyGCDSVC(1 worker)": lambda X: AsyGCDSVC(n_workers=1, device="cpu",
                                                   random_state=0).fit(X, y),
        "AsyGCDSVC(2 workers)": lambda X: AsyGCDSVC(n_workers=2, device="cpu",
                                                    random_state=0).fit(X, y),
        "AsyGCDSVC(selection='random')": lambda X: AsyGCDSVC(
            n_workers=2, selection="random", device="cpu", random_state=0).fit(X, y),
        "BKRRRegressor": lambda X: BKRRRegressor(n_partitions=2, device="cpu",
                                                 random_state=0).fit(X, yr),

        # the float32 kernel matrices of parts of 1,024+ rows (the default parts' size)
        "CA-SVM float32 part matrices": lambda X: sgemm_matrix(
            Kernel("rbf", gamma=0.1), X, max_bytes=1 << 30),
        # kernel rows on demand: one part of 1,500 rows, two parts of 1,100 (float32
        # values), float64 values (a gamma too large for float32), with and without
        # shrinking; a C path on them
        "CASVMClassifier(exact, rows on demand)": lambda X: CASVMClassifier(
            n_partitions=1, device="cpu").fit(Xb[:1500].astype(X.dtype), yb[:1500]),
        "CASVMClassifier(rows on demand, float64 values)": lambda X: CASVMClassifier(
            n_partitions=1, gamma=500.0, device="cpu").fit(Xb[:1500].astype(X.dtype),
                                                           yb[:1500]),
        "CASVMClassifier(float32 part rows)": lambda X: CASVMClassifier(
            n_partitions=2, partition="random", device="cpu", random_state=0).fit(
            Xb.astype(X.dtype), yb),
        "CASVMClassifier(rows on demand, shrinking=True)": lambda X: [CASVMClassifier(
            n_partitions=p, partition="random", shrinking=True, device="cpu",
            random_state=0).fit(Xb[:1100 * p].astype(X.dtype), yb[:1100 * p]) for p in (1, 2)],
        "C path": lambda X: _c_path(Xb[:1500].astype(X.dtype), yb[:1500]),
    }
    from gpuml.kernels import compiling_in_caller

    with compiling_in_caller():  # compile in this thread, into the cache, before returning
        return _precompile(fits, X, Xr, verbose)


def _c_path(X, y):
    """:func:`gpuml.kernels.smo_solve_path` on rows computed on demand, then on the whole
    matrix made midway (a later C solves on it from a start)."""
    import numpy as np

    from gpuml.kernels import SMOProblem, make_kernel, smo_solve_path

    problem = SMOProblem(0, np.arange(len(y)), np.where(y == 1, 1.0, -1.0))
    kernel = make_kernel("rbf", "scale", X=X)
    for shrinking in (False, True):
        smo_solve_path(kernel, [X], [problem], [0.5, 2.0, 8.0], shrinking=shrinking)


def _precompile(fits, X, Xr, verbose):
    seconds = {}
    try:
        import torch  # noqa: F401  (gpuml.optim needs it; without it there is nothing to do)
    except ImportError:
        pass
    else:
        from gpuml.optim import compile_cpu_kernels

        key = "LAMB/LARS fused CPU kernels"
        t0 = time.perf_counter()
        compile_cpu_kernels()
        seconds[key] = time.perf_counter() - t0
        if verbose:
            print(f"{key:44s} {seconds[key]:6.2f} s", flush=True)
    # Warm-up fits on tiny data: their PartitionWarnings and ConvergenceWarnings say nothing.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, fit in fits.items():
            _time_fit(name, fit, X, Xr, seconds, verbose)
    return seconds


def _time_fit(name, fit, X, Xr, seconds, verbose):
    """Fit ``name`` on float64 and float32 data (both compile), recording the seconds."""
    import numpy as np

    for dtype in (np.float64, np.float32):
        data = (Xr if name.startswith("BKRR") else X).astype(dtype)
        t0 = time.perf_counter()
        fit(data)
        key = f"{name} {np.dtype(dtype).name}"
        seconds[key] = time.perf_counter() - t0
        if verbose:
            print(f"{key:44s} {seconds[key]:6.2f} s", flush=True)


if __name__ == "__main__":
    precompile()
