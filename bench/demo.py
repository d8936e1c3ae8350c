"""``make demo``: gpuml next to scikit-learn on real data, as one small table.

Each row fits ours and the scikit-learn baseline on the same split of a real data
set in this process and prints the test score, the fit seconds and the fit-time
ratio. Fit seconds are warm: the median of ``REPEATS`` fits, after the one-off cost
of the first fits in a process (numba compiling its CPU kernels, or loading them from
numba's disk cache, which ``make`` fills at install), which has a row of its own.
Then the partitioners and the kernel functions at work on adult, and the large-batch
optimizer comparison (:mod:`gpuml.optim.demo`). Sizes are kept small enough for a
laptop-class CPU with 2 cores; the full-size comparisons live in ``bench/``.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from bench._harness import markdown_table, timings
from bench.datasets import load_adult, load_california, load_letter, train_test_split_std

#: Fits per estimator; the table shows their median.
REPEATS = 3


def _median_fit(make, X_train, y_train):
    """The last fitted estimator and the median of ``REPEATS`` fit times."""
    seconds = []
    for _ in range(REPEATS):
        estimator = make()
        t0 = time.perf_counter()
        estimator.fit(X_train, y_train)
        seconds.append(time.perf_counter() - t0)
    return estimator, statistics.median(seconds)


class _Baselines:
    """Each baseline fitted (``REPEATS`` times) once per data set, shared by the rows that
    compare against it."""

    def __init__(self):
        self._done = {}

    def __call__(self, name, make, split):
        key = (name, id(split))
        if key not in self._done:
            estimator, seconds = _median_fit(make, split[0], split[1])
            self._done[key] = (estimator.score(split[2], split[3]), seconds)
        return self._done[key]


def _compare(task, data, ours_name, make_ours, base_name, make_base, split, baselines):
    ours, t_ours = _median_fit(make_ours, split[0], split[1])
    s_ours = ours.score(split[2], split[3])
    s_base, t_base = baselines(base_name, make_base, split)
    return {"task": task, "data": data, "gpuml": ours_name(ours) if callable(ours_name)
            else ours_name, "score": round(s_ours, 4), "fit_s": round(t_ours, 2),
            "scikit-learn": base_name, "sk_score": round(s_base, 4),
            "sk_fit_s": round(t_base, 2), "speedup": round(t_base / t_ours, 1)}


def _one_off_row():
    """The first fits in this process, on tiny data (:func:`gpuml.precompile.precompile`):
    numba compiles the CPU kernels (the first process after installing, some seconds) or
    loads them from its disk cache (every later process, well under a second a kernel)."""
    from gpuml.precompile import precompile

    seconds = sum(precompile(verbose=False).values())
    return {"task": "one-off", "data": "tiny (per process)",
            "gpuml": "first fits in a process: numba compiles its kernels or loads them "
                     "from its disk cache", "score": "", "fit_s": round(seconds, 2),
            "scikit-learn": "", "sk_score": "", "sk_fit_s": "", "speedup": ""}


def estimator_rows():
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.svm import SVC

    from gpuml import AsyGCDSVC, BKRRRegressor, CASVMClassifier

    rows = [_one_off_row()]
    baselines = _Baselines()
    X, y = load_adult()
    Xtr, Xte, ytr, yte = train_test_split_std(X, y, train_size=8000, test_size=4000,
                                              random_state=0)
    adult = (Xtr, ytr, Xte, yte)
    rows.append(_compare("classify", "adult 8k",
                         lambda e: f"CASVMClassifier() (P={e.n_partitions_}, {e.partition_})",
                         lambda: CASVMClassifier(random_state=0), "SVC", SVC, adult, baselines))
    rows.append(_compare("classify", "adult 8k", "CASVMClassifier(P=1, exact)",
                         lambda: CASVMClassifier(n_partitions=1), "SVC", SVC, adult,
                         baselines))
    # even blocks: k-means (You 2020 §4.4) puts most of one-hot adult in one block
    rows.append(_compare("classify", "adult 8k", "AsyGCDSVC(2 workers, random blocks)",
                         lambda: AsyGCDSVC(n_workers=2, block_partition="random",
                                           random_state=0),
                         "SVC", SVC, adult, baselines))

    X, y = load_letter()
    letter = train_test_split_std(X, y, train_size=10000, test_size=4000, random_state=0)
    letter = (letter[0], letter[2], letter[1], letter[3])
    rows.append(_compare("classify", "letter 10k (26 cl.)", "CASVMClassifier(P=4, kbalance)",
                         lambda: CASVMClassifier(C=10, n_partitions=4, partition="kbalance",
                                                 random_state=0),
                         "SVC(C=10)", lambda: SVC(C=10), letter, baselines))

    X, y = load_california()
    Xtr, Xte, ytr, yte = train_test_split_std(X, y, train_size=6000, test_size=2208,
                                              random_state=0)
    cal = (Xtr, ytr, Xte, yte)
    sigma, lam = 2.0, 1e-5

    def kernel_ridge():  # the same system: (K + lam * n I) alpha = y, gamma = 1 / (2 sigma^2)
        return KernelRidge(alpha=lam * len(Xtr), kernel="rbf", gamma=1 / (2 * sigma**2))

    rows.append(_compare("regress", "california 6k", "BKRRRegressor(P=16, kbalance)",
                         lambda: BKRRRegressor(sigma=sigma, lam=lam, n_partitions=16,
                                               random_state=0),
                         "KernelRidge", kernel_ridge, cal, baselines))
    rows.append(_compare("regress", "california 6k", "BKRRRegressor(P=1, exact)",
                         lambda: BKRRRegressor(sigma=sigma, lam=lam, n_partitions=1),
                         "KernelRidge", kernel_ridge, cal, baselines))
    return rows


def partition_rows():
    from gpuml.partition import PARTITIONERS, partition

    X, y = load_adult()
    X, _, _, _ = train_test_split_std(X, y, test_size=0.25, random_state=0)
    partition(X[:1000], 16, "fcfs", random_state=0)  # compile the numba loop once
    rows = []
    for method in PARTITIONERS:
        seconds = statistics.median(timings(lambda m=method: partition(X, 16, m, random_state=0),
                                            repeat=REPEATS, warmup=0))
        labels, centers = partition(X, 16, method, random_state=0)
        sizes = np.bincount(labels, minlength=16)
        rows.append({"method": method, "n": X.shape[0], "P": 16, "seconds": round(seconds, 3),
                     "smallest": int(sizes.min()), "largest": int(sizes.max()),
                     "inertia_per_sample": round(float(((X - centers[labels]) ** 2).sum())
                                                 / X.shape[0], 2)})
    return rows


def kernel_rows():
    from sklearn.metrics import pairwise as skp

    from gpuml.kernels import kernel_matrix

    X, y = load_adult()
    X, _, _, _ = train_test_split_std(X, y, test_size=0.25, random_state=0)
    X = X[:3000]
    baselines = {"linear": lambda: skp.linear_kernel(X),
                 "poly": lambda: skp.polynomial_kernel(X, gamma=0.01, coef0=1.0),
                 "rbf": lambda: skp.rbf_kernel(X, gamma=0.01),
                 "sigmoid": lambda: skp.sigmoid_kernel(X, gamma=0.01, coef0=1.0)}
    rows = []
    for name, baseline in baselines.items():
        K = kernel_matrix(X, kernel=name, gamma=0.01, coef0=1.0)
        K_ref = baseline()
        t_ours = statistics.median(timings(
            lambda k=name: kernel_matrix(X, kernel=k, gamma=0.01, coef0=1.0),
            repeat=REPEATS, warmup=0))
        t_base = statistics.median(timings(baseline, repeat=REPEATS, warmup=0))
        rows.append({"kernel": name, "shape": f"{K.shape[0]}x{K.shape[1]}",
                     "gpuml_s": round(t_ours, 3), "sklearn_s": round(t_base, 3),
                     "max_abs_diff": float(np.abs(K - K_ref).max())})
    return rows


def optimizer_rows():
    try:
        from gpuml.optim.demo import rows
    except ImportError:  # PyTorch is an optional extra
        return [{"optimizer": "skipped: PyTorch is not installed"}]
    return rows()


def _optimizer_verdict(rows) -> str:
    if "batch" not in rows[0]:
        return ""
    from gpuml.optim.demo import verdict

    return (verdict(rows) + " Why and when: `python -c 'import gpuml.optim.demo as d; "
            "help(d)'` or docs/optim.md.")


def main() -> None:
    t0 = time.perf_counter()
    sections = [
        ("gpuml vs scikit-learn on real data (test score; warm fit seconds, the median of "
         f"{REPEATS} fits; speedup = sklearn/gpuml)", estimator_rows, None),
        ("Partitioners on adult (36,631 x 108, P = 16; median of "
         f"{REPEATS} runs)", partition_rows, None),
        ("Kernel matrices on adult (gpuml.kernels vs sklearn.metrics.pairwise; median of "
         f"{REPEATS} runs)", kernel_rows, None),
        ("Large batches: LAMB vs AdamW (gpuml.optim), lr tuned at B0 = 32, LEGW + sqrt "
         "scaling", optimizer_rows, _optimizer_verdict),
    ]
    for title, rows, after in sections:
        print(f"\n## {title}\n", flush=True)
        table = rows()
        print(markdown_table(table), flush=True)
        if after is not None:
            print(after(table), flush=True)
    print(f"\n(demo: {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
