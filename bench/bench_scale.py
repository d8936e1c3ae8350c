"""How gpuml's defaults scale with n, beside what a user with big data picks instead.

All in this one process, on the same data (features float32), one run per point:

1. ``scale_synthetic``: an n-curve. Classification ``make_classification(n_features=28,
   n_informative=20, n_redundant=4, flip_y=0.05, class_sep=0.8, random_state=0)``,
   regression ``make_friedman1(n_features=28, noise=0.5, random_state=0)``, each drawn
   in one call of ``max(SIZES) + N_TEST`` rows, so that every n sees the same problem:
   the last ``N_TEST`` rows are the fixed test set, the first n train, n = 20k ... 1M.
2. ``scale_real``: adult (binary), california (regression), Fashion-MNIST (60,000 x 784
   pixels / 255, 10 classes, tested on the 10,000 t10k rows; in full mode also exact
   ``CASVMClassifier(n_partitions=1)`` and exact ``SVC()`` on all 60k rows).
3. ``scale_summary``: per gpuml row, the most accurate alternative and the fastest one
   at least as accurate.

Methods: gpuml ``CASVMClassifier()``, ``AsyGCDSVC()`` (n <= 50k) and ``BKRRRegressor()``
at their defaults (``random_state=0``); scikit-learn ``Nystroem(gamma, n_components=c)``
then ``RidgeClassifier()`` and ``LinearSVC()`` (classification; LinearSVC up to
``LINEARSVC_MAX_N`` rows) or ``Ridge()``, c in ``COMPONENTS``; exact ``SVC(gamma)`` /
``KernelRidge(kernel="rbf", gamma, alpha=1)`` (y centred) on random subsamples of m
rows, m in ``SUBSAMPLES``. gamma is "scale", ``1 / (n_features * X_train.var())``, for
every model. Per row: fit, predict (all test
rows) and total seconds (Nystroem's transform counted in each learner's), the peak
increase of the process's resident memory during fit and during predict, test accuracy
(R² for regression), and the fitted sizes that explain the cost (parts, largest part,
support vectors). ``dominated_by``, on gpuml rows: the alternatives on the same data
and n at least as accurate in no more total time.

Target (the scaling issue): none in seconds; the tables answer whether gpuml's defaults
are dominated by what a user would pick instead, and where (``dominated_by`` empty is
the hoped-for result). Guards keep a long run bounded: a method stops growing n after a
run (fit + predict) over ``TIME_CAP`` s, or when its fit extrapolated from its last n
(n² for the exact SVMs) passes ``EXTRAPOLATE`` x the cap; on one data set and n, a
Nystroem learner stops growing c, and the subsampled model m, after a run over the cap
(the exact 60k Fashion-MNIST runs are not capped); a Nystroem point is skipped when its
estimated memory passes half of what is available. Skipped points are rows with
``ran=False`` and the reason in ``note``.

``GPUML_SCALE_ONLY=synthetic`` runs the n-curve only and takes the real-data rows from
the ``scale_real`` table already written (for the summary and the plots);
``GPUML_SCALE_ONLY=real`` the other way round.
On the 2-core development VM run it with ``OPENBLAS_CORETYPE=Haswell``: there scipy's
OpenBLAS (0.3.31, SkylakeX kernels) segfaults in the upper Cholesky factorisation of a
matrix of 16,512 rows, which ``KernelRidge``'s solve on a 16k subsample uses (gpuml's
lower factorisation does not crash); the tables' notes name the setting.

Plots beside the tables: ``scale_time.png`` (seconds against n, log-log) and
``scale_frontier.png`` (accuracy against seconds per data set).
``python -m bench.run scale`` (hours on 2 cores); ``python -m bench.run scale:quick``
(n = 5k, 20k and small real subsets, about a minute; ``_quick`` names).
"""

from __future__ import annotations

import ctypes
import gc
import gzip
import json
import os
import threading
import time
import traceback
import warnings
from functools import partial
from pathlib import Path

import numpy as np
from sklearn.datasets import make_classification, make_friedman1
from sklearn.exceptions import ConvergenceWarning
from sklearn.kernel_approximation import Nystroem
from sklearn.kernel_ridge import KernelRidge
from sklearn.linear_model import Ridge, RidgeClassifier
from sklearn.metrics import accuracy_score, r2_score
from sklearn.svm import SVC, LinearSVC

import gpuml
from bench._harness import OUT_ENV, RESULTS, machine_name, record
from bench.datasets import DatasetMissing, data_dir, load, train_test_split_std

SIZES, QUICK_SIZES = (20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000), (5_000, 20_000)
N_TEST, QUICK_N_TEST = 20_000, 5_000
COMPONENTS, QUICK_COMPONENTS = (500, 1000, 2000, 4000), (200, 500)
SUBSAMPLES, QUICK_SUBSAMPLES = (5_000, 10_000, 20_000), (2_000, 5_000)
#: AsyGCDSVC solves one global dual problem: only up to this many training rows.
ASYGCD_MAX_N = 50_000
#: liblinear on n x c dense Nystroem features: beyond this many rows one fit takes longer
#: than the rest of the benchmark (Nystroem(4000)+LinearSVC: 133 s at 50,000 rows, twice
#: that per doubling), and RidgeClassifier on the same features is the faster choice.
LINEARSVC_MAX_N = 100_000
#: Seconds (fit + predict) after which a method is not run at larger n.
TIME_CAP, QUICK_TIME_CAP = 600.0, 60.0
#: Skip an n whose fit, extrapolated from the method's last n, passes this x the cap.
EXTRAPOLATE = 4.0
#: Bytes per element of the n x c Nystroem features at a learner's peak: the float32
#: features and the transform's kernel block, Ridge's centred copy; liblinear's float64
#: copy and 16-byte (index, value) nodes.
BYTES_PER_FEATURE = {Ridge: 12, RidgeClassifier: 12, LinearSVC: 28}
FASHION = Path("/usr/share/datasets/fashion-mnist")
QUICK_FASHION = (5_000, 2_000)  # train rows, test rows
COLUMNS = ("data", "n_train", "method", "ran", "score", "fit_s", "predict_s", "total_s",
           "fit_mib", "predict_mib", "parts", "largest_part", "n_sv", "dominated_by", "note")
FIGURES = ("fit_s", "predict_s", "total_s", "fit_mib", "predict_mib")

try:  # give freed heap back to the OS before each step, so that RSS growth is its memory
    _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):
    _malloc_trim = None


class PeakRSS:
    """Context manager: ``mib``, the peak increase of this process's RSS over the block.

    A background thread reads ``/proc/self/statm`` every ``interval`` s (``mib`` stays
    None without /proc).
    """

    PAGE = os.sysconf("SC_PAGE_SIZE")

    def __init__(self, interval: float = 0.005):
        self.interval, self.mib, self._stop = interval, None, threading.Event()

    def _rss(self) -> int:
        return int(os.pread(self._fd, 128, 0).split()[1]) * self.PAGE

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, self._rss())

    def __enter__(self):
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None
            return self
        self._start = self._peak = self._rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._fd is not None:
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, self._rss())
            os.close(self._fd)
            self.mib = (self._peak - self._start) / 2**20
        return False


def measure(fit, predict):
    """``fit()`` then ``predict()``, each timed and watched: both results and the figures."""
    gc.collect()
    if _malloc_trim:
        _malloc_trim(0)
    out = []
    for step in (fit, predict):
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            out.append(step())
            out.append(time.perf_counter() - t0)
        out.append(mem.mib)
    fitted, fit_s, fit_mib, pred, predict_s, predict_mib = out
    return fitted, pred, {"fit_s": fit_s, "predict_s": predict_s, "total_s": fit_s + predict_s,
                          "fit_mib": fit_mib, "predict_mib": predict_mib}


def available_gib() -> float:
    """MemAvailable of /proc/meminfo in GiB (inf where unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def fitted_sizes(est) -> dict:
    """What explains a fit's cost: parts, the largest part, support vectors."""
    out = {}
    if hasattr(est, "partition_sizes_"):  # CA-SVM
        out["parts"] = int(getattr(est, "n_partitions_", None) or len(est.centers_))
        out["largest_part"] = int(np.max(est.partition_sizes_))
    elif hasattr(est, "part_sizes_"):  # BKRR
        out["parts"] = int(est.n_partitions_)
        out["largest_part"] = int(np.max(est.part_sizes_))
    if hasattr(est, "support_"):
        out["n_sv"] = int(len(est.support_))
    return out


class Guard:
    """Per method: stop growing n after a run over the cap; skip extrapolated runaways."""

    def __init__(self, cap: float):
        self.cap, self.last, self.stopped = cap, {}, {}

    def reason(self, method: str, n: int, exponent: float):
        if method in self.stopped:
            return self.stopped[method]
        if method in self.last:
            n0, fit_s = self.last[method]
            guess = fit_s * (n / n0) ** exponent
            if guess > EXTRAPOLATE * self.cap:
                return (f"not run: its fit at n={n0:,} extrapolates to {guess:.3g} s > "
                        f"{EXTRAPOLATE:g} x cap {self.cap:g} s")
        return None

    def done(self, method: str, n: int, row: dict) -> None:
        self.last[method] = (n, row["fit_s"])
        if row["total_s"] > self.cap:
            self.stopped[method] = (f"not run: at n={n:,} it took {row['total_s']:.3g} s "
                                    f"> cap {self.cap:g} s")


class Case:
    """One data set at one n: the split, the RBF gamma every model uses, rows, guards.

    ``guard`` follows a method across n; ``slow`` stops a family (a Nystroem learner, the
    subsampled model) from growing c or m here once one of its runs took over ``cap``.
    """

    def __init__(self, data, task, Xtr, ytr, Xte, yte, cap, guard=None):
        self.data, self.task, self.cap, self.guard, self.rows = data, task, cap, guard, []
        self.slow = {}
        self.Xtr, self.ytr, self.Xte, self.yte = Xtr, ytr, Xte, yte
        self.n = len(ytr)
        self.gamma = 1.0 / (Xtr.shape[1] * float(Xtr.var(dtype=np.float64)))

    def skip(self, method, reason):
        print(f"  {self.data} n={self.n:,} {method}: {reason}", flush=True)
        self.rows.append({"data": self.data, "n_train": self.n, "method": method,
                          "ran": False, "note": reason})

    def blocked(self, method, exponent=1.0, need_gib=0.0, family=None):
        """Why ``method`` must not run here (a guard or memory), or None."""
        why = self.slow.get(family) or (
            self.guard.reason(method, self.n, exponent) if self.guard else None)
        if why is None and need_gib > available_gib() / 2:
            why = f"not run: needs ~{need_gib:.3g} GiB > half of {available_gib():.3g} GiB free"
        return why

    def run(self, method, model, X, y, Xte, add=None, family=None):
        """Fit ``model`` on (X, y), predict ``Xte``, append the row; ``add``: figures of a
        shared step (Nystroem's transform) added to this row's."""
        try:
            est, pred, row = measure(partial(model.fit, X, y), partial(model.predict, Xte))
        except Exception as e:  # a long run goes on; the row says what failed
            traceback.print_exc()
            return self.skip(method, f"failed: {type(e).__name__}: {e}")
        for key in FIGURES if add else ():
            if row[key] is not None and add[key] is not None:
                row[key] += add[key]
        score = (accuracy_score(self.yte, pred) if self.task == "classification"
                 else r2_score(self.yte, pred))
        row = {"data": self.data, "n_train": self.n, "method": method, "ran": True,
               "score": float(score), **row, **fitted_sizes(est)}
        self.rows.append(row)
        if self.guard:
            self.guard.done(method, self.n, row)
        if family and row["total_s"] > self.cap:
            self.slow[family] = (f"not run: {method} took {row['total_s']:.3g} s > cap "
                                 f"{self.cap:g} s")
        print(f"  {self.data} n={self.n:,} {method}: {score:.4f} in {row['total_s']:.1f} s",
              flush=True)


class CentredKRR:
    """``KernelRidge(kernel="rbf", gamma, alpha=1)`` fitted to y minus its mean."""

    def __init__(self, gamma):
        self.krr = KernelRidge(kernel="rbf", gamma=gamma, alpha=1.0)

    def fit(self, X, y):
        self.mean = float(np.mean(y))
        self.krr.fit(X, y - self.mean)
        return self

    def predict(self, X):
        return self.krr.predict(X) + self.mean


def run_gpuml(case, device, extra=()):
    """gpuml's estimators at their defaults, then ``extra`` ((label, estimator) pairs)."""
    if case.task == "regression":
        models = [("gpuml BKRRRegressor", gpuml.BKRRRegressor(device=device, random_state=0))]
    else:
        models = [("gpuml CASVMClassifier", gpuml.CASVMClassifier(device=device, random_state=0))]
        if case.n <= ASYGCD_MAX_N:
            models.append(("gpuml AsyGCDSVC", gpuml.AsyGCDSVC(device=device, random_state=0)))
    for label, est in [*models, *extra]:
        why = case.blocked(label, 1.0 if "BKRR" in label else 2.0)
        if why:
            case.skip(label, why)
        else:
            case.run(label, est, case.Xtr, case.ytr, case.Xte)


def run_nystroem(case, components):
    """Nystroem(c) features, computed once per c, and each linear learner on them."""
    learners = (RidgeClassifier, LinearSVC) if case.task == "classification" else (Ridge,)
    for c in components:
        todo = []
        for cls in learners:
            label = f"Nystroem({c})+{cls.__name__}"
            if cls is LinearSVC and case.n > LINEARSVC_MAX_N:
                case.skip(label, f"LinearSVC only up to {LINEARSVC_MAX_N:,} rows")
                continue
            why = case.blocked(label, need_gib=case.n * c * BYTES_PER_FEATURE[cls] / 2**30,
                               family=cls)
            if why:
                case.skip(label, why)
            else:
                todo.append((label, cls))
        if not todo:
            continue
        ny = Nystroem(gamma=case.gamma, n_components=min(c, case.n), random_state=0)
        try:
            Ftr, Fte, shared = measure(partial(ny.fit_transform, case.Xtr),
                                       partial(ny.transform, case.Xte))
        except Exception as e:
            traceback.print_exc()
            for label, _ in todo:
                case.skip(label, f"failed: Nystroem: {type(e).__name__}: {e}")
            continue
        for label, cls in todo:
            case.run(label, cls(), Ftr, case.ytr, Fte, add=shared, family=cls)
        del Ftr, Fte


def run_subsamples(case, sizes):
    """Exact SVC / centred KernelRidge on random subsamples of m rows (m <= n)."""
    for m in sorted({min(m, case.n) for m in sizes}):
        label = f"{'SVC' if case.task == 'classification' else 'KernelRidge'} on {m:,}"
        why = case.blocked(label, exponent=0.0, family="subsample")
        if why:
            case.skip(label, why)
            continue
        keep = np.sort(np.random.default_rng(0).choice(case.n, m, replace=False))
        model = SVC(gamma=case.gamma) if case.task == "classification" else CentredKRR(case.gamma)
        case.run(label, model, case.Xtr[keep], case.ytr[keep], case.Xte, family="subsample")


def warm_up(device):
    """Compile (or load from the cache) gpuml's numba code, untimed: float32; 2 and 3
    classes; CA-SVM exact and in 3 parts of 1,000+ rows (the split's fill, float32 part
    matrices, the blend's neighbour search); BKRR in 2 parts."""
    X = np.random.default_rng(0).standard_normal((3300, 8)).astype(np.float32)
    for y in ((X[:, 0] > 0).astype(np.int64), np.digitize(X[:, 0], [-0.5, 0.5])):
        gpuml.CASVMClassifier(device=device, random_state=0).fit(X[:800], y[:800]).predict(X)
        gpuml.CASVMClassifier(n_partitions=3, device=device, n_jobs=2, random_state=0).fit(
            X, y).predict(X)
        gpuml.AsyGCDSVC(device=device, random_state=0).fit(X[:800], y[:800]).predict(X)
    gpuml.BKRRRegressor(device=device, random_state=0).fit(X, X[:, 0] * X[:, 1]).predict(X)


def draw_synthetic(classification: bool, total: int):
    """The n-curve's data, ``total`` rows, features float32: the classification set
    (``make_classification``) or the regression set (``make_friedman1``)."""
    if classification:
        X, y = make_classification(total, n_features=28, n_informative=20, n_redundant=4,
                                   flip_y=0.05, class_sep=0.8, random_state=0)
    else:
        X, y = make_friedman1(total, n_features=28, noise=0.5, random_state=0)
        y = y.astype(np.float32)
    return X.astype(np.float32), y


def synthetic(quick, device, cap, save=lambda rows: None):
    """The n-curve rows: each task's data drawn once, the first n rows to train on
    (``save`` gets the rows so far after each n, so a run cut short keeps them)."""
    sizes = QUICK_SIZES if quick else SIZES
    n_test = QUICK_N_TEST if quick else N_TEST
    total, rows = max(sizes) + n_test, []
    for data in ("synthetic-reg", "synthetic-cls"):
        t0 = time.perf_counter()
        X, y = draw_synthetic(data == "synthetic-cls", total)
        print(f"{data}: {total:,} rows drawn in {time.perf_counter() - t0:.1f} s", flush=True)
        guard = Guard(cap)
        for n in sizes:
            case = Case(data, "classification" if data == "synthetic-cls" else "regression",
                        X[:n], y[:n], X[-n_test:], y[-n_test:], cap, guard)
            run_gpuml(case, device)
            run_nystroem(case, QUICK_COMPONENTS if quick else COMPONENTS)
            run_subsamples(case, QUICK_SUBSAMPLES if quick else SUBSAMPLES)
            rows += case.rows
            save(rows)
        del X, y, case
        gc.collect()
    return rows


def _idx(path: Path) -> np.ndarray:
    """An idx file (gzip): bytes 0 0 <type> <ndim>, ndim big-endian int32 sizes, uint8 data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    shape = np.frombuffer(raw, dtype=">i4", count=raw[3], offset=4)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * raw[3]).reshape(shape)


def fashion_folder() -> Path:
    """The folder of Fashion-MNIST's idx files: ``<data_dir>/fashion-mnist`` where they were
    carried (``make gpu-data`` copies them there for the GPU machine), else the Debian
    package's."""
    carried = data_dir() / "fashion-mnist"
    return carried if (carried / "train-images-idx3-ubyte.gz").exists() else FASHION


def load_fashion(quick):
    """Fashion-MNIST ``X_train, X_test, y_train, y_test``, pixels / 255 as float32."""
    parts = ("train-images-idx3", "t10k-images-idx3", "train-labels-idx1", "t10k-labels-idx1")
    folder = fashion_folder()
    files = [folder / f"{p}-ubyte.gz" for p in parts]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise DatasetMissing(f"data set 'fashion-mnist': no {', '.join(missing)}")
    Xtr, Xte, ytr, yte = (_idx(f) for f in files)
    Xtr, Xte = (X.reshape(len(X), -1).astype(np.float32) / 255 for X in (Xtr, Xte))
    ytr, yte = ytr.astype(np.int64), yte.astype(np.int64)
    if quick:
        keep = np.sort(np.random.default_rng(0).choice(len(ytr), QUICK_FASHION[0], False))
        Xtr, ytr, Xte, yte = Xtr[keep], ytr[keep], Xte[:QUICK_FASHION[1]], yte[:QUICK_FASHION[1]]
    return Xtr, Xte, ytr, yte


def real(quick, device, cap, save=lambda rows: None):
    """The real-data rows; a missing data set is reported and skipped (``save``: as for
    :func:`synthetic`, after each set). The exact 60k Fashion-MNIST fits run unless
    ``$GPUML_SCALE_EXACT`` is 0 (``bench_fashion_exact`` runs them alone: about 7 minutes
    on 2 cores)."""
    rows = []
    for name, task in (("adult", "classification"), ("california", "regression"),
                       ("fashion-mnist", "classification")):
        try:
            if name == "fashion-mnist":
                split = load_fashion(quick)
            else:
                test = 0.25 if name == "adult" else 0.2
                sizes = dict(train_size=5000, test_size=4000) if quick else dict(test_size=test)
                Xtr, Xte, ytr, yte = train_test_split_std(*load(name), random_state=0, **sizes)
                split = Xtr.astype(np.float32), Xte.astype(np.float32), ytr, yte
        except DatasetMissing as e:
            print(f"{name}: skipped, {e}", flush=True)
            continue
        Xtr, Xte, ytr, yte = split
        case = Case(name, task, Xtr, ytr, Xte, yte, cap)
        print(f"{name}: {case.n:,} train / {len(yte):,} test x {Xtr.shape[1]}", flush=True)
        exact = (name == "fashion-mnist" and not quick
                 and os.environ.get("GPUML_SCALE_EXACT", "1") != "0")
        exact_svm = gpuml.CASVMClassifier(n_partitions=1, device=device, random_state=0)
        run_gpuml(case, device,
                  extra=[("gpuml CASVMClassifier(n_partitions=1)", exact_svm)] if exact else [])
        run_nystroem(case, QUICK_COMPONENTS if quick else COMPONENTS)
        subsamples = QUICK_SUBSAMPLES if quick else SUBSAMPLES
        run_subsamples(case, subsamples + (case.n,) if exact else subsamples)
        rows += case.rows
        save(rows)
    return rows


def _gpuml(row) -> bool:
    return row["method"].startswith("gpuml")


def mark_dominance(rows):
    """Rows in ``COLUMNS`` order; on gpuml rows ``dominated_by``: the alternatives on the
    same data and n with score >= ours and total_s <= ours."""
    for r in rows:
        if r["ran"] and _gpuml(r):
            r["dominated_by"] = "; ".join(
                a["method"] for a in rows
                if a["ran"] and not _gpuml(a) and (a["data"], a["n_train"]) == (
                    r["data"], r["n_train"]) and a["score"] >= r["score"]
                and a["total_s"] <= r["total_s"])
    return [{k: r.get(k) for k in COLUMNS} for r in rows]


def summary_rows(rows):
    """Per gpuml row: the most accurate alternative and the fastest at least as accurate."""
    out = []
    for r in (r for r in rows if r["ran"] and _gpuml(r)):
        alts = [a for a in rows if a["ran"] and not _gpuml(a)
                and (a["data"], a["n_train"]) == (r["data"], r["n_train"])]
        best = max(alts, key=lambda a: a["score"], default={})
        fast = min((a for a in alts if a["score"] >= r["score"]), key=lambda a: a["total_s"],
                   default={})
        out.append({"data": r["data"], "n_train": r["n_train"], "method": r["method"],
                    "score": r["score"], "total_s": r["total_s"],
                    "best_alternative": best.get("method"), "best_score": best.get("score"),
                    "best_total_s": best.get("total_s"),
                    "fastest_as_accurate": fast.get("method"),
                    "its_total_s": fast.get("total_s"), "dominated": bool(r["dominated_by"])})
    return out


def out_dir(gpu):
    """The folder :func:`record` writes to: ``$GPUML_BENCH_OUT`` or results/<machine>."""
    return Path(os.environ[OUT_ENV]) if os.environ.get(OUT_ENV) else RESULTS / machine_name(gpu)


def plot(rows, folder, suffix):
    """``scale_time.png`` (seconds against n) and ``scale_frontier.png`` (accuracy vs time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    ran = [r for r in rows if r["ran"]]
    methods = list(dict.fromkeys(r["method"] for r in ran))
    strong, pale = iter(("black", "crimson", "royalblue", "darkorange")), iter(range(99))
    style = {m: dict(color=next(strong), ls="-", marker="o", lw=2.4, ms=5) if m.startswith(
        "gpuml") else dict(color=plt.get_cmap("tab20")(next(pale) % 20), marker=".", lw=1.1,
                           ls="--" if m.startswith("Nystroem") else ":", ms=4) for m in methods}
    paths = [folder / f"scale_time{suffix}.png", folder / f"scale_frontier{suffix}.png"]

    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    for ax, data in zip(axes, ("synthetic-cls", "synthetic-reg")):
        for m in methods:
            pts = sorted((r["n_train"], r["total_s"]) for r in ran
                         if r["data"] == data and r["method"] == m)
            if pts:
                ax.plot(*zip(*pts), label=m, **style[m])
        ax.set(xscale="log", yscale="log", xlabel="training rows n",
               ylabel="fit + predict seconds", title=data)
        ax.grid(True, which="both", lw=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle("Fit + predict time against n (shared CPU cores; one run per point)")
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    panels = [(d, max(r["n_train"] for r in ran if r["data"] == d and _gpuml(r)))
              for d in ("synthetic-cls", "synthetic-reg")
              if any(r["data"] == d and _gpuml(r) for r in ran)]
    panels += [(d, None) for d in ("adult", "california", "fashion-mnist")
               if any(r["data"] == d for r in ran)]
    fig, axes = plt.subplots(2, 3, figsize=(15, 9))
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (data, n) in zip(axes.flat, panels):
        mine = [r for r in ran if r["data"] == data and n in (None, r["n_train"])]
        for r in mine:
            gp = _gpuml(r)
            ax.scatter(r["total_s"], r["score"], marker="*" if gp else "o", s=160 if gp else 25,
                       color=style[r["method"]]["color"], edgecolor="k" if gp else "none",
                       zorder=3 if gp else 2)
            ax.annotate(r["method"].replace("gpuml ", ""), (r["total_s"], r["score"]),
                        fontsize=6, xytext=(3, 2), textcoords="offset points")
        times = [r["total_s"] for r in mine]
        ax.set(xscale="log", xlim=(min(times) / 2, max(times) * 3), xlabel="fit + predict seconds",
               ylabel="R²" if data in ("synthetic-reg", "california") else "accuracy",
               title=f"{data} (n={mine[0]['n_train']:,})")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", lw=0.3)
    fig.suptitle("Test accuracy (R²) against fit + predict seconds (stars: gpuml defaults)")
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


NOTES = ("One run per point on shared CPU cores (seconds are noisy). score: test accuracy, or "
         "R² for regression; *_s: wall seconds, Nystroem's fit_transform / transform counted "
         "in fit_s / predict_s of each learner on it; *_mib: peak increase of the process's "
         "RSS during fit / predict (5 ms samples; freed heap trimmed before each). parts: "
         "gpuml's P, largest_part: its largest part; n_sv: support vectors. dominated_by: "
         "alternatives on the same data and n at least as accurate in no more total time. "
         "gamma = 1/(n_features * X.var()) for every RBF model; KernelRidge alpha=1 on "
         "centred y; features float32. ran=False: not run, note says why. "
         f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')} (on the 2-core "
         "VM scipy-openblas 0.3.31's SkylakeX kernels segfault in the upper Cholesky of a "
         "16,512-row matrix, which KernelRidge's solve uses; the Haswell kernels do not).")


def main(quick: bool = False, gpu: bool = False):
    device = "cuda" if gpu else "cpu"
    suffix = "_quick" if quick else ""
    cap = QUICK_TIME_CAP if quick else TIME_CAP
    t_start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # LinearSVC's max_iter
        warm_up(device)
        def save_synthetic(rows):
            record("scale_synthetic" + suffix, mark_dominance(rows), gpu=gpu,
                   title="Scaling in n: gpuml's defaults against Nystroem and subsampled "
                         "exact models",
                   notes=f"Synthetic; n in {QUICK_SIZES if quick else SIZES}, one fixed test "
                         f"set of {QUICK_N_TEST if quick else N_TEST:,} rows. Guards: a method "
                         f"stops after a run over {cap:g} s, or a fit extrapolated past "
                         f"{EXTRAPOLATE * cap:g} s; a Nystroem learner stops growing c, and "
                         "the subsampled model m, after a run over the cap; Nystroem points "
                         "over half the free memory are skipped. " + NOTES)

        def save_real(rows):
            record("scale_real" + suffix, mark_dominance(rows), gpu=gpu,
                   title="Real data: gpuml's defaults against Nystroem and subsampled exact "
                         "models",
                   notes="adult 75/25 and california 80/20 splits standardised with the "
                         "training part's statistics (quick: 5,000 train / 4,000 test); "
                         "Fashion-MNIST 60,000 / 10,000 pixels / 255 (quick: 5,000 train, the "
                         "first 2,000 test rows). A Nystroem learner stops growing c, and the "
                         f"subsampled model m, after a run over {cap:g} s. " + NOTES)

        only = os.environ.get("GPUML_SCALE_ONLY")

        def earlier(name):  # the rows of an earlier run's table, for the summary and plots
            return json.loads((out_dir(gpu) / f"{name}{suffix}.json").read_text())["rows"]

        real_rows = earlier("scale_real") if only == "synthetic" else real(quick, device, cap,
                                                                           save_real)
        syn = earlier("scale_synthetic") if only == "real" else synthetic(quick, device, cap,
                                                                          save_synthetic)
    rows = mark_dominance(syn + real_rows)
    summary = summary_rows(rows)
    record("scale_summary" + suffix, summary, gpu=gpu, title="Scaling: is gpuml dominated?",
           notes="best_alternative: the most accurate alternative on the same data and n; "
                 "fastest_as_accurate: the fastest alternative with score >= gpuml's; "
                 "dominated: it is no slower.")
    dominated = [s for s in summary if s["dominated"]]
    print(f"{len(dominated)} of {len(summary)} gpuml rows are dominated:")
    for s in dominated:
        print(f"  {s['data']} n={s['n_train']:,} {s['method']} ({s['score']:.4f} in "
              f"{s['total_s']:.1f} s): {s['fastest_as_accurate']} ({s['its_total_s']:.1f} s)")
    for path in plot(rows, out_dir(gpu), suffix):
        print("plot:", path)
    print(f"bench_scale: {time.perf_counter() - t_start:.0f} s in all", flush=True)
