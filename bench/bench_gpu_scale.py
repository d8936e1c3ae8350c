"""The GPU issue's points at scale and beside GPU peers, in order of value, within the time left.

Run on the GPU machine after the GPU targets (``make gpu-check`` does):
``PYTHONPATH=. python3 -m bench.run gpu_scale --gpu``. Four tables, each written as soon as
its point is done, so a run cut short keeps what it finished:

1. ``gpu_fashion_exact``: the exact kernel SVM, ``CASVMClassifier(n_partitions=1)``, on
   all of Fashion-MNIST (60,000 x 784 pixels / 255, float32, 10 classes: 45 one-vs-one
   SMO problems) on the GPU; fit seconds (first fit, compile included, and a second, warm
   fit), predict seconds for the 10,000 test rows, accuracy. Target: fit <= 10 s, against
   ThunderSVM's 19.55 s for MNIST's 60,000 rows on an older GPU (Meanti, Carratino,
   Rosasco and Rudi, *Kernel methods through the roof: handling billions of points
   efficiently*, 2020, Table 2).
2. ``gpu_scale``: ``CASVMClassifier()`` and ``BKRRRegressor()`` at their defaults at
   n = 1M, 4M and 10M rows of the scale benchmark's synthetic sets (``bench_scale``: the
   same generators, drawn once at the largest n plus :data:`N_TEST` test rows); fit and
   predict seconds, test accuracy or R², P and the largest part. Target: each fit <= 60 s
   at 10M rows. A larger n runs only while the time left allows it, by the time of the
   last n scaled linearly (with :data:`MARGIN`), keeping :data:`PEERS_RESERVE` seconds
   for the peers.
3. ``gpu_streamed``: the largest n of 2. fitted in memory, fitted again with
   ``max_device_memory`` half the bytes of its training rows (the data twice the memory
   the fit may use; the dry run: 64 MiB, two parts): the parts go through the device in
   groups, the next group's rows copied beside the current group's solve. Target: seconds
   per row <= 2x the fit in memory, the same model (predictions equal).
4. ``gpu_peers``: exact KRR, ``BKRRRegressor(n_partitions=1)``, beside GPyTorch's exact
   GP regression (posterior mean with fixed hyperparameters, its defaults: conjugate
   gradients beyond 800 rows; and with ``max_cholesky_size`` raised, a Cholesky
   factorisation) and beside a plain ``torch.linalg.cholesky`` solve, at 20,000 and
   50,000 rows of the friedman1 set, float64, the same kernel ``exp(-|x - z|^2 / (2
   sigma^2))`` and regularisation ``K + lam n I`` (targets centred); fit + predict
   seconds (first and second call), and each prediction's largest difference relative to
   the Cholesky solve's.
5. ``gpu_asygcd_threads``: ``AsyGCDSVC`` on the host's CPU cores, adult (20,000 training
   rows), with 1, 2, 4, 8 and 16 workers, its K-balance blocks and random ones: fit
   seconds, updates, speed-up over one worker. Target: >= 8x at 16 workers, or the
   best configuration and the measured reason (updates, CPU time per wall second).

Without ``--gpu`` this is a CPU dry run at tiny sizes (names ending ``_dryrun``; GPyTorch,
absent here, is reported as not run): it checks the harness only, and ``met`` says nothing.
"""

from __future__ import annotations

import functools
import gc
import time

import numpy as np
from sklearn.datasets import make_friedman1

from bench._harness import record, seconds_left
from bench.bench_gpu import Run, _adult, _cores, _host, _release_device_memory
from bench.bench_scale import draw_synthetic

#: Training sizes of the n-curve on a GPU, and of the CPU dry run.
SIZES, DRY_SIZES = (1_000_000, 4_000_000, 10_000_000), (4_000, 8_000)
#: Test rows of the n-curve (as ``bench_scale``) and of the dry run.
N_TEST, DRY_N_TEST = 20_000, 1_000
#: Training sizes of the peer comparison (friedman1, float64), test rows.
PEER_SIZES, DRY_PEER_SIZES, PEER_TEST = (20_000, 50_000), (500, 1_000), 5_000
#: The peers' kernel and regularisation: sigma of the RBF kernel, lam (``K + lam n I``).
PEER_SIGMA, PEER_LAM = 1.0, 1e-5
#: A point starts only when its estimated time, times this, fits in the time left.
MARGIN = 1.5
#: Seconds kept for the peers while the n-curve grows.
PEERS_RESERVE = 90.0
#: Targets: exact Fashion-MNIST fit; each fit at the largest n; streamed over in memory.
FASHION_TARGET_S, SCALE_TARGET_S, STREAMED_TARGET = 10.0, 60.0, 2.0
#: Seconds the Fashion-MNIST point needs at least (two fits, one compiling, and a prediction).
FASHION_MIN_S = 60.0
#: Workers of the Asy-GCD sweep (those up to the host's cores).
THREAD_COUNTS = (1, 2, 4, 8, 16)


def _device(gpu: bool) -> str:
    return "cuda" if gpu else "cpu"


def _sync(gpu: bool) -> None:
    if gpu:
        import cupy

        cupy.cuda.Device().synchronize()


def _release(gpu: bool) -> None:
    """Hand cached device memory back between points (bench_gpu's release, after a
    collection frees the last point's arrays)."""
    gc.collect()
    _release_device_memory()


def _timed(fn, gpu: bool):
    t0 = time.perf_counter()
    out = fn()
    _sync(gpu)
    return out, time.perf_counter() - t0


def _name(base: str, gpu: bool) -> str:
    return base if gpu else base + "_dryrun"


def _say(message: str) -> None:
    print(f"[gpu_scale] {message}", flush=True)


# -- 1. the exact SVM on Fashion-MNIST -------------------------------------------------------

def fashion_exact(gpu: bool) -> list[dict]:
    from bench.bench_scale import load_fashion
    from gpuml import CASVMClassifier

    if seconds_left() < FASHION_MIN_S:
        _say(f"1. skipped: {seconds_left():.0f} s left")
        return [{"note": f"skipped: {seconds_left():.0f} s left"}]
    Xtr, Xte, ytr, yte = load_fashion(quick=not gpu)
    if not gpu:  # the dry run: a few hundred rows
        Xtr, ytr, Xte, yte = Xtr[:600], ytr[:600], Xte[:200], yte[:200]
    _say(f"1. CASVMClassifier(n_partitions=1) on Fashion-MNIST, {len(ytr):,} rows")
    model = CASVMClassifier(n_partitions=1, device=_device(gpu))
    _, cold = _timed(lambda: model.fit(Xtr, ytr), gpu)
    _, warm = _timed(lambda: model.fit(Xtr, ytr), gpu)
    pred, predict_s = _timed(lambda: _host(model.predict(Xte)), gpu)
    return [{"n_train": len(ytr), "n_test": len(yte), "fit_cold_s": cold, "fit_s": warm,
             "predict_s": predict_s, "accuracy": float(np.mean(pred == yte)),
             "n_sv": int(len(model.support_)), "target": f"fit <= {FASHION_TARGET_S:g} s",
             "met": bool(warm <= FASHION_TARGET_S) if gpu else ""}]


# -- 2. and 3. the n-curve, and the fit streamed through half the data's memory ----------------

def _estimator(task: str, gpu: bool, **kw):
    from gpuml import BKRRRegressor, CASVMClassifier

    cls = CASVMClassifier if task == "classification" else BKRRRegressor
    return cls(device=_device(gpu), random_state=0, **kw)


def score(task: str, pred, y) -> float:
    """Test accuracy (classification) or R² (regression)."""
    if task == "classification":
        return float(np.mean(pred == y))
    return float(1.0 - np.mean((pred - y) ** 2) / np.var(y))


def _fit_point(task, gpu, Xtr, ytr, Xte, yte, **kw):
    est = _estimator(task, gpu, **kw)
    _, fit_s = _timed(lambda: est.fit(Xtr, ytr), gpu)
    pred, predict_s = _timed(lambda: _host(est.predict(Xte)), gpu)
    sizes = getattr(est, "partition_sizes_", None)
    if sizes is None:
        sizes = est.part_sizes_
    row = {"task": task, "method": type(est).__name__, "n_train": len(ytr), "fit_s": fit_s,
           "predict_s": predict_s, "score": score(task, pred, yte),
           "P": int(est.n_partitions_), "largest_part": int(np.max(sizes))}
    return row, pred


def scale_curve(gpu: bool) -> tuple[list[dict], list[dict]]:
    """The n-curve (``gpu_scale``) and the streamed fits (``gpu_streamed``)."""
    sizes, n_test = (SIZES, N_TEST) if gpu else (DRY_SIZES, DRY_N_TEST)
    rows, streamed = [], []
    for task in ("classification", "regression"):
        if seconds_left() < PEERS_RESERVE + 30:
            _say(f"2. {task}: skipped, {seconds_left():.0f} s left")
            continue
        t0 = time.perf_counter()
        X, y = draw_synthetic(task == "classification", max(sizes) + n_test)
        draw_s = time.perf_counter() - t0
        _say(f"2. {task}: {len(y):,} rows drawn in {draw_s:.1f} s")
        Xte, yte = X[-n_test:], y[-n_test:]
        last = None  # (n, seconds) of the last point run
        for n in sizes:
            if last is not None:
                estimate = MARGIN * last[1] * n / last[0]
                if estimate > seconds_left() - PEERS_RESERVE:
                    _say(f"   n = {n:,}: skipped (estimated {estimate:.0f} s, "
                         f"{seconds_left():.0f} s left)")
                    rows.append({"task": task, "n_train": n, "note": "skipped: time left"})
                    break
            _release(gpu)
            row, _ = _fit_point(task, gpu, X[:n], y[:n], Xte, yte)
            row["met"] = (bool(row["fit_s"] <= SCALE_TARGET_S) if gpu and n == max(sizes)
                          else "")
            rows.append(row)
            last = (n, row["fit_s"] + row["predict_s"])
            _say(f"   n = {n:,}: fit {row['fit_s']:.1f} s, predict {row['predict_s']:.2f} s, "
                 f"score {row['score']:.4f}, P = {row['P']}")
        done = [r for r in rows if r.get("task") == task and "fit_s" in r]
        if done and 3 * MARGIN * done[-1]["fit_s"] < seconds_left() - PEERS_RESERVE:
            streamed.append(_streamed(task, gpu, X, y, Xte, yte, done[-1]))
        del X, y
    return rows, streamed


def _streamed(task, gpu, X, y, Xte, yte, in_memory) -> dict:
    n = in_memory["n_train"]
    Xtr, ytr = X[:n], y[:n]
    # (the dry run's rows are smaller than one part's kernel matrix: a budget of two parts)
    budget = Xtr.nbytes // 2 if gpu else 64 << 20
    _say(f"3. {task}: n = {n:,} again with max_device_memory={budget:,} bytes")
    _release(gpu)
    ref = _estimator(task, gpu).fit(Xtr, ytr)
    ref_pred = _host(ref.predict(Xte))
    del ref
    _release(gpu)
    row, pred = _fit_point(task, gpu, Xtr, ytr, Xte, yte, max_device_memory=budget)
    ratio = row["fit_s"] / in_memory["fit_s"]
    return {"task": task, "method": row["method"], "n_train": n, "data_bytes": int(Xtr.nbytes),
            "max_device_memory": int(budget), "in_memory_fit_s": in_memory["fit_s"],
            "streamed_fit_s": row["fit_s"], "per_row_ratio": ratio,
            "same_predictions": bool(np.array_equal(pred, ref_pred)),
            "target": f"ratio <= {STREAMED_TARGET:g}, same predictions",
            "met": bool(ratio <= STREAMED_TARGET and np.array_equal(pred, ref_pred))
            if gpu else ""}


# -- 4. exact KRR beside GPyTorch and a plain torch Cholesky solve ----------------------------

def _rbf_torch(torch, A, B, sigma):
    sq = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * (A @ B.T)
    return torch.exp(-sq.clamp_min_(0.0) / (2.0 * sigma**2))


def _torch_cholesky(torch, Xtr, ytr, Xte, sigma, lam):
    K = _rbf_torch(torch, Xtr, Xtr, sigma)
    K.diagonal().add_(lam * Xtr.shape[0])
    L = torch.linalg.cholesky(K)
    del K
    alpha = torch.cholesky_solve(ytr[:, None], L)[:, 0]
    del L
    return _rbf_torch(torch, Xte, Xtr, sigma) @ alpha


def _gpytorch_mean(Xtr, ytr, Xte, sigma, lam, cholesky: bool):
    import gpytorch
    import torch

    class ExactGP(gpytorch.models.ExactGP):
        def __init__(self, x, y, likelihood):
            super().__init__(x, y, likelihood)
            self.mean = gpytorch.means.ZeroMean()
            self.covar = gpytorch.kernels.RBFKernel()

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean(x), self.covar(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood(
        noise_constraint=gpytorch.constraints.GreaterThan(0.0)).to(Xtr)
    model = ExactGP(Xtr, ytr, likelihood).to(Xtr)
    likelihood.noise = lam * Xtr.shape[0]
    model.covar.lengthscale = sigma
    model.eval()
    likelihood.eval()
    size = 10**9 if cholesky else gpytorch.settings.max_cholesky_size.value()
    with (torch.no_grad(), gpytorch.settings.skip_posterior_variances(True),
          gpytorch.settings.max_cholesky_size(size)):
        return model(Xte).mean


GPYTORCH_METHODS = (("GPyTorch ExactGP (defaults: CG)", False),
                    ("GPyTorch ExactGP (Cholesky)", True))


def _peer_methods(n: int, device: str, have_gpytorch: bool) -> list:
    """``(label, predict)`` of each method at ``n`` training rows: ``predict()`` fits and
    returns the host predictions of the test rows."""
    import torch

    from gpuml import BKRRRegressor

    X, y = make_friedman1(n + PEER_TEST, n_features=28, noise=0.5, random_state=0)
    Xtr, Xte, ytr = X[:n], X[n:], y[:n]
    yc = ytr - ytr.mean()
    tX, tY, tT = (torch.as_tensor(a, device=device) for a in (Xtr, yc, Xte))

    def ours():
        est = BKRRRegressor(sigma=PEER_SIGMA, lam=PEER_LAM, n_partitions=1,
                            fit_intercept=False, device=device).fit(Xtr, yc)
        return _host(est.predict(Xte))

    def plain():
        return _torch_cholesky(torch, tX, tY, tT, PEER_SIGMA, PEER_LAM).cpu().numpy()

    def gpytorch(cholesky):
        return _gpytorch_mean(tX, tY, tT, PEER_SIGMA, PEER_LAM, cholesky).cpu().numpy()

    methods = [("gpuml BKRRRegressor(n_partitions=1)", ours), ("torch.linalg.cholesky", plain)]
    if have_gpytorch:
        methods += [(label, functools.partial(gpytorch, c)) for label, c in GPYTORCH_METHODS]
    return methods


def peers(gpu: bool) -> list[dict]:
    try:
        import gpytorch  # noqa: F401
        have_gpytorch = True
    except ImportError:
        have_gpytorch = False
    rows = []
    for n in PEER_SIZES if gpu else DRY_PEER_SIZES:
        if not have_gpytorch:
            rows += [{"n_train": n, "method": label, "note": "not run: no gpytorch"}
                     for label, _ in GPYTORCH_METHODS]
        done, reference = [], None
        for label, fn in _peer_methods(n, _device(gpu), have_gpytorch):
            if seconds_left() < 20:
                rows.append({"n_train": n, "method": label, "note": "skipped: time left"})
                continue
            _release(gpu)
            _say(f"4. n = {n:,}: {label}")
            try:
                pred, first = _timed(fn, gpu)
                second = _timed(fn, gpu)[1] if first * 2 < seconds_left() - 10 else ""
            except Exception as err:  # a peer that fails (memory, say) is reported, not fatal
                rows.append({"n_train": n, "method": label,
                             "note": f"failed: {type(err).__name__}: {err}"[:200]})
                continue
            if label == "torch.linalg.cholesky":
                reference = pred
            done.append(({"n_train": n, "method": label, "first_s": first, "second_s": second},
                          pred))
        for row, pred in done:
            if reference is not None:
                row["rel_diff_vs_cholesky"] = float(np.abs(pred - reference).max()
                                                    / np.abs(reference).max())
            rows.append(row)
    return rows


# -- 5. Asy-GCD on the host's cores --------------------------------------------------------------

def asygcd_threads(gpu: bool) -> list[dict]:
    from gpuml import AsyGCDSVC

    Xtr, Xte, ytr, yte = _adult(Run(gpu=gpu))
    cores = _cores()
    counts = [w for w in THREAD_COUNTS if w <= max(cores, 2)]
    AsyGCDSVC(device="cpu", n_workers=2, random_state=0).fit(Xtr[:400], ytr[:400])  # compile
    rows, one = [], {}
    for blocks in ("kbalance", "random"):
        for workers in counts:
            if rows and seconds_left() < 3 * max(r["fit_s"] for r in rows) + 10:
                rows.append({"blocks": blocks, "workers": workers, "note": "skipped: time left"})
                continue
            _say(f"5. AsyGCDSVC(n_workers={workers}, block_partition={blocks!r})")
            est = AsyGCDSVC(device="cpu", n_workers=workers, block_partition=blocks,
                            random_state=0)
            cpu0 = time.process_time()
            _, fit_s = _timed(lambda est=est: est.fit(Xtr, ytr), False)
            one.setdefault(blocks, fit_s if workers == 1 else None)
            rows.append({"blocks": blocks, "workers": workers, "cores": cores, "fit_s": fit_s,
                         "speedup": one[blocks] / fit_s if one[blocks] else "",
                         "updates": int(np.sum(est.n_updates_)),
                         "cpu_per_wall": (time.process_time() - cpu0) / fit_s,
                         "accuracy": float(est.score(Xte, yte))})
    return rows


def main(quick: bool = False, gpu: bool = False):
    if gpu:
        from gpuml._backend import cuda_available

        if not cuda_available():
            raise RuntimeError("bench_gpu_scale --gpu: no CUDA device answers")
    notes = ("" if gpu else "CPU dry run at tiny sizes: the figures test the harness only. ")
    out = {}
    try:
        out["fashion"] = fashion_exact(gpu)
        record(_name("gpu_fashion_exact", gpu), out["fashion"], gpu=gpu,
               title="The exact SVM on Fashion-MNIST on the GPU",
               notes=notes + "CASVMClassifier(n_partitions=1): C=1, gamma='scale', tol=1e-3; "
                             "fit_cold_s includes compiling; predict: the 10,000 test rows.")
    except Exception as err:  # a missing data set must not cost the points after it
        _say(f"1. failed: {type(err).__name__}: {err}")
    rows, streamed = scale_curve(gpu)
    record(_name("gpu_scale", gpu), rows, gpu=gpu,
           title="CASVMClassifier() and BKRRRegressor() at scale on one GPU",
           notes=notes + f"bench_scale's synthetic sets; {N_TEST:,} test rows; score: accuracy "
                         "or R²; one fit per point; a larger n runs while the time left allows.")
    if streamed:
        record(_name("gpu_streamed", gpu), streamed, gpu=gpu,
               title="Fits streamed through half the memory their data take",
               notes=notes + "max_device_memory = half the training rows' bytes; per_row_ratio:"
                             " streamed fit seconds over the fit in memory (same n).")
    peer_rows = peers(gpu)
    record(_name("gpu_peers", gpu), peer_rows, gpu=gpu,
           title="Exact KRR beside GPyTorch and a plain Cholesky solve",
           notes=notes + f"friedman1 (28 features), float64, sigma={PEER_SIGMA}, "
                         f"lam={PEER_LAM} (K + lam n I), targets centred, {PEER_TEST:,} test "
                         "rows; seconds: fit + predict, first and second call (the first "
                         "includes compiling); rel_diff_vs_cholesky: the largest difference "
                         "of the predictions over the largest |prediction| of the plain "
                         "Cholesky solve.")
    try:
        threads = asygcd_threads(gpu)
    except Exception as err:  # a missing data set: the tables before it stand
        _say(f"5. failed: {type(err).__name__}: {err}")
        return [*out.get("fashion", []), *rows, *streamed, *peer_rows]
    record(_name("gpu_asygcd_threads", gpu), threads, gpu=gpu,
           title="AsyGCDSVC on the host's cores: workers and blocks",
           notes=notes + "adult, 20,000 training rows, C=1, gamma='scale', tol=1e-3; one fit "
                         "per point (after a compile on 400 rows); speedup over one worker "
                         "with the same blocks; cpu_per_wall: CPU seconds of the process per "
                         "wall second (how many workers ran at once).")
    return [*out.get("fashion", []), *rows, *streamed, *peer_rows, *threads]
