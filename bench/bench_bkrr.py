"""BKRR2 and its family on california_housing (You 2020, Table 3.2 "cadata", Fig. 3.2, 3.9).

Four measurements, ours and the baselines in one process on the same data:

1. ``bkrr_accuracy``: best test MSE over one σ × λ grid for exact KRR, DC-KRR,
   KKRR2, BKRR2 and the BKRR3 oracle bound (Alg 11: per test sample, the
   part whose prediction is closest to the true target), at P = 4, 8, 16, 32,
   with the mean fit time per grid point. The paper's sizes: 18,432 train /
   2,208 test, standardised features. Exact KRR over the whole grid at
   n = 18,432 costs 9 dense 18,432² Cholesky solves (the time of one:
   bench/results/cpu-2core/bkrr_fit_time.md), so the grid table has exact KRR at n = 4,608 and the
   full-size exact KRR appears at one grid point in ``bkrr_fit_time``.
2. ``bkrr_fit_time``: fit time vs P at n = 18,432 (with exact KRR and
   scikit-learn's KernelRidge), and vs n at fixed n/P = 1,152, against the
   (n/P)³ law.
3. ``bkrr_cv``: BKRRRegressorCV vs GridSearchCV(BKRRRegressor) on a 10 × 10
   grid with the same 5 folds, at P = 8, 16, 32: same choice, time ratio.
   ``bkrr_accuracy_seeds``: BKRR2 vs DC-KRR of ``bkrr_accuracy`` at n = 18,432
   over three seeds of the split and the partition.
4. ``bkrr_gpu`` (``--gpu``): batched Cholesky throughput and exact KRR on the
   GPU vs the same machine's CPU.
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.kernel_ridge import KernelRidge
from sklearn.model_selection import GridSearchCV, KFold

from bench._harness import record, timeit
from bench.datasets import load_california, train_test_split_std
from gpuml.estimators.bkrr import BKRRRegressor, BKRRRegressorCV
from gpuml.kernels.pairwise import Kernel

METHODS = {
    "DC-KRR": ("random", "average"),
    "KKRR2": ("kmeans", "nearest"),
    "BKRR2": ("kbalance", "nearest"),
}
SIGMAS = (1.0, 2.0, 4.0)
LAMS = (1e-7, 1e-5, 1e-3)


def _name(base, quick):
    """Quick runs get their own result files, so they never overwrite the full ones."""
    return base + "_quick" if quick else base


def _command(part, quick):
    """How a table was made: one part of this benchmark, default threading (what users get)."""
    return (f"python -c 'from bench import bench_bkrr as b; "
            f"b.{part}(quick={quick})'  (all parts: python -m bench.run bkrr)")


def california(n_train, n_test, seed=0):
    """california_housing split ``(X_train, X_test, y_train, y_test)``, standardised."""
    X, y = load_california()
    return train_test_split_std(X, y, train_size=n_train, test_size=n_test, random_state=seed)


def _fit(est, X, y):
    t0 = time.perf_counter()
    est.fit(X, y)
    return est, time.perf_counter() - t0


def _oracle_mse(est, X_test, y_test):
    """BKRR3 (Alg 11): every part predicts every test sample; keep the closest to the truth."""
    kernel = Kernel("rbf", est.gamma_)
    preds = np.stack([
        kernel.dot(X_test, est.X_fit_[lo:hi], est.dual_coef_[lo:hi])
        for lo, hi in zip(est.part_offsets_[:-1], est.part_offsets_[1:])
    ])
    best = np.abs(preds - y_test[None]).argmin(axis=0)
    return float(np.mean((preds[best, np.arange(len(y_test))] - y_test) ** 2))


def _grid_best(make, Xtr, ytr, Xte, yte, oracle=False):
    best = {"mse": np.inf}
    seconds = []
    for sigma in SIGMAS:
        for lam in LAMS:
            est, s = _fit(make(sigma, lam), Xtr, ytr)
            seconds.append(s)
            mse = float(np.mean((est.predict(Xte) - yte) ** 2))
            if mse < best["mse"]:
                best = {"mse": mse, "sigma": sigma, "lam": lam}
            if oracle:
                o = _oracle_mse(est, Xte, yte)
                if o < best.get("oracle", np.inf):
                    best["oracle"] = o
    best["fit_s"] = float(np.mean(seconds))
    return best


def accuracy(quick):
    rows = []
    sizes = [(2304, 552)] if quick else [(4608, 552), (18432, 2208)]
    Ps = (4, 8) if quick else (4, 8, 16, 32)
    for n_train, n_test in sizes:
        Xtr, Xte, ytr, yte = california(n_train, n_test)
        if n_train <= 4608:
            b = _grid_best(lambda s, l: BKRRRegressor(sigma=s, lam=l, n_partitions=1,
                                                      device="cpu"), Xtr, ytr, Xte, yte)
            rows.append({"n_train": n_train, "P": 1, "method": "exact KRR", "best_mse": b["mse"],
                         "sigma": b["sigma"], "lam": b["lam"], "fit_s": b["fit_s"]})
        for P in Ps:
            for name, (part, combine) in METHODS.items():
                def make(s, l, part=part, combine=combine, P=P):
                    return BKRRRegressor(sigma=s, lam=l, n_partitions=P, partition=part,
                                         combine=combine, device="cpu", random_state=0)

                b = _grid_best(make, Xtr, ytr, Xte, yte, oracle=name == "BKRR2")
                rows.append({"n_train": n_train, "P": P, "method": name, "best_mse": b["mse"],
                             "sigma": b["sigma"], "lam": b["lam"], "fit_s": b["fit_s"]})
                if name == "BKRR2":
                    rows.append({"n_train": n_train, "P": P, "method": "BKRR3 (oracle bound)",
                                 "best_mse": b["oracle"], "sigma": "", "lam": "",
                                 "fit_s": b["fit_s"]})
            by = {r["method"]: r["best_mse"] for r in rows if r["P"] == P
                  and r["n_train"] == n_train}
            print(f"n={n_train} P={P}: BKRR2 {by['BKRR2']:.4f} vs DC-KRR {by['DC-KRR']:.4f}",
                  flush=True)
    notes = (f"california_housing, standardised with the training split's statistics; grid "
             f"sigma in {SIGMAS} x lam in {LAMS}; fit_s is the mean fit time per grid point "
             "(partitioning included). random_state=0 for every partitioner.")
    record(_name("bkrr_accuracy", quick), rows,
           title="BKRR family: best test MSE over the same grid",
           notes=notes, command=_command("accuracy", quick))
    return rows


def accuracy_seeds(quick):
    """Is BKRR2 vs DC-KRR at a given P within the noise of the split and the partition?

    The ``accuracy`` grid at n = 18,432, repeated for three seeds; a seed sets both the
    train/test split and every partitioner's random_state. One more setting rides along:
    nearest-centre routing over BKM parts (You 2020 Alg 4: each over-full k-means cluster
    gives up its members farthest from its centre, instead of K-balance's fill in sample
    order, which may push a cluster's core members out).
    """
    n_train, n_test = (2304, 552) if quick else (18432, 2208)
    Ps = (8,) if quick else (8, 16, 32)
    methods = {"DC-KRR": METHODS["DC-KRR"], "BKRR2": METHODS["BKRR2"],
               "BKM-nearest": ("bkm", "nearest")}
    rows = []
    for seed in (0, 1, 2):
        Xtr, Xte, ytr, yte = california(n_train, n_test, seed=seed)
        for P in Ps:
            row = {"seed": seed, "P": P}
            for name, (part, combine) in methods.items():
                def make(s, l, part=part, combine=combine, P=P, seed=seed):
                    return BKRRRegressor(sigma=s, lam=l, n_partitions=P, partition=part,
                                         combine=combine, device="cpu", random_state=seed)

                row[name] = _grid_best(make, Xtr, ytr, Xte, yte)["mse"]
            rows.append(row)
            print(row, flush=True)
    for P in Ps:
        rows.append({"seed": "mean", "P": P, **{
            name: float(np.mean([r[name] for r in rows if r["P"] == P])) for name in methods}})
    for r in rows:
        r["BKRR2 / DC-KRR"] = r["BKRR2"] / r["DC-KRR"]
        r["BKM-nearest / DC-KRR"] = r["BKM-nearest"] / r["DC-KRR"]
    notes = (f"california_housing, n_train={n_train}, n_test={n_test}, standardised; best test "
             f"MSE over sigma in {SIGMAS} x lam in {LAMS}; seed = split random_state = "
             "partitioner random_state (seed 0 is the split of bkrr_accuracy). Ratios below 1: "
             "more accurate than DC-KRR.")
    record(_name("bkrr_accuracy_seeds", quick), rows,
           title="BKRR2 vs DC-KRR over three seeds (split and partition)", notes=notes,
           command=_command("accuracy_seeds", quick))
    return rows


def fit_time(quick):
    rows = []
    n = 4608 if quick else 18432
    Xtr, Xte, ytr, yte = california(n, 2208)
    sigma, lam = 1.0, 1e-5
    warm = BKRRRegressor(n_partitions=4, device="cpu", random_state=0)
    warm.fit(Xtr[:1000], ytr[:1000])  # numba compile of the K-balance fill
    # The KernelRidge comparison is at n/2: at n = 18,432 it would add one more full-size
    # n x n solve to a run already long on a small CPU (the exact fit's time at each size:
    # bench/results/cpu-2core/bkrr_fit_time.md).
    n_ref = n // 2
    ref = KernelRidge(alpha=lam * n_ref, kernel="rbf", gamma=1 / (2 * sigma**2))
    t_ref = timeit(lambda: ref.fit(Xtr[:n_ref], ytr[:n_ref]), repeat=1)
    mse_ref = float(np.mean((ref.predict(Xte) - yte) ** 2))
    ours = BKRRRegressor(sigma=sigma, lam=lam, n_partitions=1, fit_intercept=False, device="cpu")
    t_ours = timeit(lambda: ours.fit(Xtr[:n_ref], ytr[:n_ref]), repeat=1)
    mse_ours = float(np.mean((ours.predict(Xte) - yte) ** 2))
    rows.append({"series": "exact vs sklearn", "n": n_ref, "P": 1, "method": "KernelRidge",
                 "fit_s": t_ref, "test_mse": mse_ref, "speedup_vs_exact": ""})
    rows.append({"series": "exact vs sklearn", "n": n_ref, "P": 1, "method": "exact KRR (gpuml)",
                 "fit_s": t_ours, "test_mse": mse_ours, "speedup_vs_exact": ""})
    exact = BKRRRegressor(sigma=sigma, lam=lam, n_partitions=1, device="cpu")
    t_exact = timeit(lambda: exact.fit(Xtr, ytr), repeat=1)
    mse_exact = float(np.mean((exact.predict(Xte) - yte) ** 2))
    rows.append({"series": "vs P", "n": n, "P": 1, "method": "exact KRR (gpuml)", "fit_s": t_exact,
                 "test_mse": mse_exact, "speedup_vs_exact": 1.0})
    for P in (4, 8, 16, 32, 64):
        est = BKRRRegressor(sigma=sigma, lam=lam, n_partitions=P, device="cpu", random_state=0)
        t = timeit(lambda est=est: est.fit(Xtr, ytr), repeat=3)
        mse = float(np.mean((est.predict(Xte) - yte) ** 2))
        rows.append({"series": "vs P", "n": n, "P": P, "method": "BKRR2", "fit_s": t,
                     "test_mse": mse, "speedup_vs_exact": t_exact / t})
    per_part = 1152
    for P in (1, 2, 4, 8, 16):
        m = per_part * P
        if m > n:
            break
        est = BKRRRegressor(sigma=sigma, lam=lam, n_partitions=P, device="cpu", random_state=0)
        t = timeit(lambda est=est, m=m: est.fit(Xtr[:m], ytr[:m]), repeat=3)
        rows.append({"series": "vs n, n/P=1152", "n": m, "P": P, "method": "BKRR2", "fit_s": t,
                     "test_mse": "", "speedup_vs_exact": ""})
    vs_p = [r for r in rows if r["series"] == "vs P" and r["method"] == "BKRR2"]
    sizes = np.log([n / r["P"] for r in vs_p])
    per_part_times = np.log([r["fit_s"] / r["P"] for r in vs_p])
    slope = float(np.polyfit(sizes[:3], per_part_times[:3], 1)[0])
    notes = (f"sigma={sigma}, lam={lam}; exact KRR and KernelRidge timed once each (the same "
             f"n x n Cholesky; compared at n={n_ref}), BKRR2 best of 3 (K-balance partitioning "
             "included). "
             f"Fit time per part vs part size m = n/P over P = 4, 8, 16: slope {slope:.2f} on "
             "log-log (3 = the (n/P)^3 law of the solve, so the total P (n/P)^3 = n^3/P^2; "
             "kernel building, m^2 d, and partitioning, n P d per k-means step, pull it below 3 "
             "once parts are small). At fixed n/P the total should grow like P.")
    record(_name("bkrr_fit_time", quick), rows,
           title="BKRR2 fit time vs P and vs n (fixed n/P)", notes=notes,
           command=_command("fit_time", quick))
    return rows


def exact_point(quick):
    """Exact KRR at the grid point that is best for every partitioned method (n = 18,432).

    The full grid of exact KRR at this size is out of reach on the shared CPU (see the module
    docstring); this row is its value where the others peak. BKRR2 with P = 16 is timed
    (best of 5) right before and right after the one exact fit, in the same process.
    """
    n = 4608 if quick else 18432
    Xtr, Xte, ytr, yte = california(n, 552 if quick else 2208)
    sigma, lam = 2.0, 1e-5
    bkrr2 = BKRRRegressor(sigma=sigma, lam=lam, n_partitions=16, device="cpu", random_state=0)
    before = timeit(lambda: bkrr2.fit(Xtr, ytr), repeat=5, warmup=1)
    exact = BKRRRegressor(sigma=sigma, lam=lam, n_partitions=1, device="cpu")
    t_exact = timeit(lambda: exact.fit(Xtr, ytr), repeat=1)
    after = timeit(lambda: bkrr2.fit(Xtr, ytr), repeat=5)
    rows = [
        {"method": "exact KRR", "n": n, "P": 1, "sigma": sigma, "lam": lam, "fit_s": t_exact,
         "test_mse": float(np.mean((exact.predict(Xte) - yte) ** 2)), "speedup": 1.0},
        {"method": "BKRR2 (before)", "n": n, "P": 16, "sigma": sigma, "lam": lam,
         "fit_s": before, "test_mse": float(np.mean((bkrr2.predict(Xte) - yte) ** 2)),
         "speedup": t_exact / before},
        {"method": "BKRR2 (after)", "n": n, "P": 16, "sigma": sigma, "lam": lam,
         "fit_s": after, "test_mse": "", "speedup": t_exact / after},
    ]
    record(_name("bkrr_exact_point", quick), rows,
           title="Exact KRR vs BKRR2 (P=16) at sigma=2, lam=1e-5",
           notes="BKRR2 best of 5 fits right before and right after the single exact fit.",
           command=_command("exact_point", quick))
    return rows


def cv_search(quick, Ps=None, grid=None):
    """BKRRRegressorCV vs GridSearchCV(BKRRRegressor) on the same folds, at P = 8, 16, 32.

    Both are timed best of ``repeat`` in the same process, alternating, so load from other
    jobs on the shared machine hits both alike. ``grid``: the number of σ and of λ (10 x 10
    by default; a 3 x 3 grid is the other end: BKRRRegressorCV then solves by Cholesky).
    """
    n = 1500 if quick else 4000
    Xtr, _, ytr, _ = california(n, 100)
    size = grid or (5 if quick else 10)
    sigmas = np.geomspace(0.25, 8.0, size).tolist()
    lams = np.geomspace(1e-7, 1e-2, size).tolist()
    folds = KFold(5, shuffle=True, random_state=0)
    repeat = 1 if quick else 2
    rows, notes = [], []
    for P in Ps or ((8,) if quick else (8, 16, 32)):
        common = dict(n_partitions=P, device="cpu", random_state=0)
        BKRRRegressorCV(sigmas=sigmas[:1], lams=lams[:1], cv=folds, **common).fit(Xtr, ytr)
        t_ours, t_loo, t_brute = np.inf, np.inf, np.inf
        for _ in range(repeat):
            ours, t = _fit(BKRRRegressorCV(sigmas=sigmas, lams=lams, cv=folds, **common),
                           Xtr, ytr)
            t_ours = min(t_ours, t)
            loo, t = _fit(BKRRRegressorCV(sigmas=sigmas, lams=lams, cv=None, **common),
                          Xtr, ytr)
            t_loo = min(t_loo, t)
            brute, t = _fit(GridSearchCV(BKRRRegressor(**common), {"sigma": sigmas, "lam": lams},
                                         cv=folds), Xtr, ytr)
            t_brute = min(t_brute, t)
        diff = float(np.max(np.abs(ours.cv_results_["mean_test_score"]
                                   - brute.cv_results_["mean_test_score"])))
        rows += [
            {"P": P, "search": "GridSearchCV(BKRRRegressor), 5-fold", "seconds": t_brute,
             "best_sigma": brute.best_params_["sigma"], "best_lam": brute.best_params_["lam"],
             "best_r2": brute.best_score_, "time_ratio": 1.0},
            {"P": P, "search": f"BKRRRegressorCV ({ours.search_}), same 5 folds",
             "seconds": t_ours,
             "best_sigma": ours.best_params_["sigma"], "best_lam": ours.best_params_["lam"],
             "best_r2": ours.best_score_, "time_ratio": t_brute / t_ours},
            {"P": P, "search": f"BKRRRegressorCV ({loo.search_}), cv=None (LOO in each part)",
             "seconds": t_loo,
             "best_sigma": loo.best_params_["sigma"], "best_lam": loo.best_params_["lam"],
             "best_r2": loo.best_score_, "time_ratio": t_brute / t_loo},
        ]
        same = ours.best_params_ == brute.best_params_
        notes.append(f"P={P}: same choice as GridSearchCV: {same}, max |difference| of "
                     f"mean_test_score over the grid: {diff:.2e}")
        print(rows[-2], notes[-1], flush=True)
    notes = (f"california_housing, n={n} standardised, BKRR2 (K-balance, nearest centre), "
             f"{len(sigmas)} x {len(lams)} grid, KFold(5, shuffle, random_state=0), default "
             f"threading, n_jobs=None on both sides. Seconds: best of {repeat} alternating runs, "
             "refit on all the data included; the 2-core machine was shared with other "
             "benchmarks. " + "; ".join(notes) + ".")
    name = _name("bkrr_cv" if grid is None else f"bkrr_cv_{size}x{size}", quick)
    record(name, rows, title=f"BKRRRegressorCV vs GridSearchCV ({size} x {size} grid)",
           notes=notes, command=_command("cv_search", quick) if grid is None else
           f"python -c 'from bench import bench_bkrr as b; b.cv_search(False, Ps={Ps}, "
           f"grid={grid})'")
    return rows


def gpu_bench(quick):
    import cupy as cp

    from gpuml.kernels import krr_solve_parts

    rows = []
    sync = cp.cuda.get_current_stream().synchronize
    rng = np.random.default_rng(0)
    kernel = Kernel("rbf", 0.5)
    for P, m in ((64, 256), (32, 1024), (16, 2048)) if not quick else ((16, 256),):
        Xs = [rng.normal(size=(m, 8)) for _ in range(P)]
        ys = [rng.normal(size=m) for _ in range(P)]
        Xd, yd = [cp.asarray(a) for a in Xs], [cp.asarray(a) for a in ys]
        shifts = [1e-3 * m] * P
        t_gpu = timeit(lambda Xd=Xd, yd=yd, sh=shifts: krr_solve_parts(kernel, Xd, yd, sh),
                       warmup=1, repeat=3, sync=sync)
        t_cpu = timeit(lambda Xs=Xs, ys=ys, sh=shifts: krr_solve_parts(kernel, Xs, ys, sh,
                                                                       n_jobs=-1), repeat=1)
        rows.append({"what": "P batched Cholesky KRR solves", "P": P, "m": m, "gpu_s": t_gpu,
                     "cpu_s": t_cpu, "speedup": t_cpu / t_gpu,
                     "gpu_GFLOPs": P * m**3 / 3 / t_gpu / 1e9})
    n = 4608 if quick else 18432
    Xtr, _, ytr, _ = california(n, 2208)
    est = BKRRRegressor(sigma=1.0, lam=1e-5, n_partitions=1, device="cuda")
    Xd, yd = cp.asarray(Xtr), cp.asarray(ytr)
    t_gpu = timeit(lambda: est.fit(Xd, yd), warmup=1, repeat=3, sync=sync)
    cpu = BKRRRegressor(sigma=1.0, lam=1e-5, n_partitions=1, device="cpu")
    t_cpu = timeit(lambda: cpu.fit(Xtr, ytr), repeat=1)
    rows.append({"what": "exact KRR fit", "P": 1, "m": n, "gpu_s": t_gpu, "cpu_s": t_cpu,
                 "speedup": t_cpu / t_gpu, "gpu_GFLOPs": n**3 / 3 / t_gpu / 1e9})
    for P in (16, 64):
        gpu = BKRRRegressor(sigma=1.0, lam=1e-5, n_partitions=P, device="cuda", random_state=0)
        t_gpu = timeit(lambda gpu=gpu: gpu.fit(Xd, yd), warmup=1, repeat=3, sync=sync)
        cpu = BKRRRegressor(sigma=1.0, lam=1e-5, n_partitions=P, device="cpu", random_state=0,
                            n_jobs=-1)
        t_cpu = timeit(lambda cpu=cpu: cpu.fit(Xtr, ytr), repeat=1)
        rows.append({"what": "BKRR2 fit", "P": P, "m": n // P, "gpu_s": t_gpu, "cpu_s": t_cpu,
                     "speedup": t_cpu / t_gpu, "gpu_GFLOPs": ""})
    record(_name("bkrr_gpu", quick), rows,
           gpu=True, title="BKRR on the GPU vs the device CPU",
           notes="Random parts for the batched solve; california_housing for the fits.")
    return rows


def main(quick: bool = False, gpu: bool = False):
    if gpu:
        gpu_bench(quick)
        return
    fit_time(quick)
    exact_point(quick)
    cv_search(quick)
    accuracy(quick)
    accuracy_seeds(quick)


if __name__ == "__main__":
    import sys

    main(quick="--quick" in sys.argv, gpu="--gpu" in sys.argv)
