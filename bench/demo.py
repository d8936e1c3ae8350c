"""``make demo``: gpuml next to scikit-learn on real data, as one small table.

Each row fits ours and the scikit-learn baseline on the same split of a real data
set in this process and prints the test score, the fit seconds and the fit-time
ratio. Then the partitioners and the kernel functions at work on adult, and a
short optimizer run. Sizes are kept small enough for a laptop-class CPU; the
full-size comparisons live in ``bench/``.
"""

from __future__ import annotations

import time

import numpy as np

from bench._harness import markdown_table
from bench.datasets import load_adult, load_california, load_letter, train_test_split_std


def _fit_score(estimator, X_train, y_train, X_test, y_test):
    t0 = time.perf_counter()
    estimator.fit(X_train, y_train)
    seconds = time.perf_counter() - t0
    return estimator.score(X_test, y_test), seconds


def _compare(task, data, ours_name, ours, base_name, base, split):
    s_ours, t_ours = _fit_score(ours, *split)
    s_base, t_base = _fit_score(base, *split)
    return {"task": task, "data": data, "gpuml": ours_name, "score": round(s_ours, 4),
            "fit_s": round(t_ours, 2), "scikit-learn": base_name, "sk_score": round(s_base, 4),
            "sk_fit_s": round(t_base, 2), "speedup": round(t_base / t_ours, 1)}


def estimator_rows():
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.svm import SVC

    from gpuml import AsyGCDSVC, BKRRRegressor, CASVMClassifier

    rows = []
    X, y = load_adult()
    Xtr, Xte, ytr, yte = train_test_split_std(X, y, train_size=12000, test_size=4000,
                                              random_state=0)
    adult = (Xtr, ytr, Xte, yte)
    rows.append(_compare("classify", "adult 12k", "CASVMClassifier() (P=8, random)",
                         CASVMClassifier(random_state=0),
                         "SVC", SVC(), adult))
    rows.append(_compare("classify", "adult 12k", "CASVMClassifier(P=1, exact)",
                         CASVMClassifier(n_partitions=1), "SVC", SVC(), adult))
    # even blocks: k-means (the default, You 2020 §4.4) puts most of one-hot adult in one block
    rows.append(_compare("classify", "adult 12k", "AsyGCDSVC(2 workers, random blocks)",
                         AsyGCDSVC(n_workers=2, block_partition="random", random_state=0),
                         "SVC", SVC(), adult))

    X, y = load_letter()
    letter = train_test_split_std(X, y, train_size=10000, test_size=4000, random_state=0)
    letter = (letter[0], letter[2], letter[1], letter[3])
    rows.append(_compare("classify", "letter 10k (26 cl.)", "CASVMClassifier(P=4, kbalance)",
                         CASVMClassifier(C=10, n_partitions=4, partition="kbalance",
                                         random_state=0),
                         "SVC", SVC(C=10), letter))

    X, y = load_california()
    Xtr, Xte, ytr, yte = train_test_split_std(X, y, train_size=8000, test_size=2208,
                                              random_state=0)
    cal = (Xtr, ytr, Xte, yte)
    sigma, lam = 2.0, 1e-5
    rows.append(_compare("regress", "california 8k", "BKRRRegressor(P=16, kbalance)",
                         BKRRRegressor(sigma=sigma, lam=lam, n_partitions=16, random_state=0),
                         "KernelRidge", KernelRidge(alpha=lam * 8000, kernel="rbf",
                                                    gamma=1 / (2 * sigma**2)), cal))
    rows.append(_compare("regress", "california 8k", "BKRRRegressor(P=1, exact)",
                         BKRRRegressor(sigma=sigma, lam=lam, n_partitions=1),
                         "KernelRidge", KernelRidge(alpha=lam * 8000, kernel="rbf",
                                                    gamma=1 / (2 * sigma**2)), cal))
    return rows


def partition_rows():
    from gpuml.partition import PARTITIONERS, partition

    X, y = load_adult()
    X, _, _, _ = train_test_split_std(X, y, test_size=0.25, random_state=0)
    partition(X[:1000], 16, "fcfs", random_state=0)  # compile the numba loop once
    rows = []
    for method in PARTITIONERS:
        t0 = time.perf_counter()
        labels, centers = partition(X, 16, method, random_state=0)
        seconds = time.perf_counter() - t0
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
        t0 = time.perf_counter()
        K = kernel_matrix(X, kernel=name, gamma=0.01, coef0=1.0)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        K_ref = baseline()
        t_base = time.perf_counter() - t0
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


def main() -> None:
    sections = [
        ("gpuml vs scikit-learn on real data (test score; fit seconds; speedup = sklearn/gpuml)",
         estimator_rows),
        ("Partitioners on adult (36,631 x 108, P = 16)", partition_rows),
        ("Kernel matrices on adult (gpuml.kernels vs sklearn.metrics.pairwise)", kernel_rows),
        ("Large-batch optimizer (gpuml.optim)", optimizer_rows),
    ]
    for title, rows in sections:
        print(f"\n## {title}\n", flush=True)
        print(markdown_table(rows()), flush=True)


if __name__ == "__main__":
    main()
