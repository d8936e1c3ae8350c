"""The GPU targets of the GPU issue, each measured against its baseline in one process.

Run on the GPU machine (one GPU, 16 CPU cores): ``PYTHONPATH=. python3 -m bench.run gpu --gpu``.
Every target gets a detail table and one row of the summary ``gpu_targets``
(target, goal, what was measured, ``met``):

1. ``gpu_svc``: exact SVC, :class:`~gpuml.estimators.casvm.CASVMClassifier` with
   ``n_partitions=1`` on the GPU against ``sklearn.svm.SVC`` on adult (20,000
   training rows, stratified; 10,000 test rows): same predicted class on >= 99.5 %
   of the test rows, fit >= 50x faster; dual objectives and support vectors of both.
2. ``gpu_casvm_p16``: CA-SVM with P = 16 on the same data: fit < 0.5 s, accuracy
   against SVC, and whether the 16 parts are solved at once: the SMO launches one
   fit makes, and the solver's time for the 16 problems in one batch against the
   sum of its times for each problem alone (same problems, same iterations).
3. ``gpu_krr``: exact KRR (:class:`~gpuml.estimators.bkrr.BKRRRegressor`,
   ``n_partitions=1``) against ``sklearn.kernel_ridge.KernelRidge`` on california
   housing (18,432 rows, float64): predictions equal to 1e-6 relative, fit >= 20x
   faster; BKRR2 (P = 16, K-balance, nearest centre) >= 100x faster.
4. ``gpu_asygcd``: :class:`~gpuml.estimators.asygcd.AsyGCDSVC` on the GPU agrees
   with the CPU solver's decision function to 1e-4 relative (adult 20k, tol 1e-5);
   the CPU solver with 16 threads reaches tol 1e-3 >= 10x sooner than with one.
5. ``gpu_optim``: fused (Triton) LAMB and LARS on ResNet-50's 161 tensors
   (25.6 M parameters): equal to the for-loop path (fp32 to 1e-6 of the parameter
   norm; bf16 parameters with fp32 master weights to one bf16 rounding), step time
   within 1.7x of ``torch.optim.AdamW(fused=True)``, >= 80 % of the measured copy
   bandwidth for the bytes the step must move, >= 5x the loop path.
6. ``gpu_memory``: fits whose n x n kernel matrix is twice the device memory, each
   in a child process: refused before any large allocation with a message that
   says how much is needed and what to change? (time to the answer, the largest
   allocation asked of CuPy, the peak device memory).

Timing: our warm figure is the median of repeated calls after a first call that is
reported apart as ``cold`` (it includes CUDA/Triton/numba compilation); baselines
that take seconds (SVC, KernelRidge, the one-thread Asy-GCD) run once. The GPU
Asy-GCD fit and the memory probes run in child processes with a time limit, so a
hang or a crash there costs that row only; every table is written as soon as its
target is done, so a run cut short keeps what it finished.

Without ``--gpu`` this is a CPU dry run at tiny sizes, a few seconds in all (CI runs
it so the harness cannot rot): CUDA-only figures say 'skipped: no GPU' and ``met``
says nothing about the targets there. Tables get the suffix ``_dryrun``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench._harness import record, timings
from bench.bench_asygcd import binary_labels, timed_solve
from bench.bench_bkrr import california
from bench.bench_casvm import svc_objective
from bench.datasets import load_adult, train_test_split_std

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = "skipped: no GPU"
#: SVM settings of targets 1, 2 and 4 (SVC's defaults; the issue's C and gamma).
SVM = dict(C=1.0, gamma="scale", tol=1e-3)
#: KRR setting of target 3: the best grid point of bench_bkrr's partitioned methods.
KRR_SIGMA, KRR_LAM = 2.0, 1e-5
#: Asy-GCD stopping tolerances: the thread-scaling runs, and the GPU-vs-CPU agreement
#: (decision values of two solvers stopped at tol differ by about tol relative; 1e-5
#: leaves a margin of 10 under the 1e-4 target; measured on adult 5k:
#: bench/results/h100-80gb-hbm3/gpu_asygcd.md).
GCD_SCALING_TOL, GCD_AGREEMENT_TOL = 1e-3, 1e-5
#: Optimizer steps compared between the fused and the loop path.
OPTIM_STEPS = 3
#: Seconds a child process may take: the GPU Asy-GCD fit (data, compile, two fits), one
#: memory probe (imports and one fit that should stop at once).
ASYGCD_TIMEOUT, PROBE_TIMEOUT = 90, 45

GOALS = {
    "svc": "CASVM P=1 vs SVC on adult 20k: same class on >= 99.5 % of test rows; "
           "fit >= 50x faster",
    "casvm_p16": "CA-SVM P=16 on adult 20k: fit < 0.5 s; the 16 parts solved at once",
    "krr": "exact KRR vs KernelRidge on california 18,432: equal to 1e-6, >= 20x faster; "
           "BKRR2 P=16 >= 100x faster",
    "asygcd": "Asy-GCD GPU vs CPU decision function to 1e-4 relative; CPU 16 threads "
              ">= 10x faster than 1 thread",
    "optim": "fused LAMB/LARS on ResNet-50 shapes: = loop to 1e-6 (fp32) and bf16 rounding; "
             "<= 1.7x AdamW(fused); >= 80 % of copy bandwidth; >= 5x loop",
    "memory": "a fit that does not fit in GPU memory is refused before it starts, saying "
              "how much it needs and what to change",
}


@dataclass
class Run:
    """Sizes, device and timing rules of one run (GPU, or the CPU dry run)."""

    gpu: bool
    quick: bool = False
    start: float = field(default_factory=time.perf_counter)

    @property
    def device(self) -> str:
        return "cuda" if self.gpu else "cpu"

    @property
    def repeat(self) -> int:
        return 5 if self.gpu and not self.quick else 3

    @property
    def adult_sizes(self) -> tuple[int, int]:
        return (20_000, 10_000) if self.gpu else (1_000, 500)

    @property
    def california_sizes(self) -> tuple[int, int]:
        return (18_432, 2_208) if self.gpu else (512, 128)

    @property
    def threads(self) -> int:
        """CPU threads of the scaling run: 16, or the cores there are."""
        return min(16, _cores())

    def say(self, message: str) -> None:
        print(f"[bench_gpu {time.perf_counter() - self.start:6.1f}s] {message}", flush=True)

    def sync(self) -> None:
        if self.gpu:
            import cupy

            cupy.cuda.Device().synchronize()

    def cold_warm(self, fn, repeat: int | None = None) -> tuple[float, float]:
        """``(first call, median of the next calls)`` in seconds, synchronised."""
        cold = timings(fn, repeat=1, warmup=0, sync=self.sync)[0]
        warm = timings(fn, repeat=repeat or self.repeat, warmup=0, sync=self.sync)
        return cold, statistics.median(warm)

    def name(self, base: str) -> str:
        return base if self.gpu else base + "_dryrun"


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _adult(run: Run):
    n_train, n_test = run.adult_sizes
    X, y = load_adult()
    return train_test_split_std(X, y, train_size=n_train, test_size=n_test, random_state=0,
                                stratify=True)


def _host(a):
    from gpuml._backend import to_numpy

    return np.asarray(to_numpy(a))


def _release_device_memory() -> None:
    """Hand cached device memory back, so that child processes see all of it free."""
    from gpuml._backend import cuda_available

    if not cuda_available():
        return
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- 1. exact SVC -------------------------------------------------------------------------

def exact_svc(run: Run, adult) -> tuple[dict, list[dict]]:
    from sklearn.svm import SVC

    from gpuml.estimators.casvm import CASVMClassifier

    Xtr, Xte, ytr, yte = adult
    run.say(f"1. SVC fit on {len(ytr)} rows, once (LIBSVM: one core; ~30 s on the GPU machine)")
    svc = SVC(cache_size=1024, **SVM)
    t_svc = timings(lambda: svc.fit(Xtr, ytr), repeat=1, warmup=0)[0]
    pred_svc = svc.predict(Xte)
    run.say(f"   SVC {t_svc:.1f} s; CASVMClassifier(n_partitions=1, device={run.device!r})")
    ours = CASVMClassifier(n_partitions=1, device=run.device, **SVM)
    cold, warm = run.cold_warm(lambda: ours.fit(Xtr, ytr))
    pred = ours.predict(Xte)
    agreement = float(np.mean(pred == pred_svc))
    obj_svc, obj_ours = svc_objective(svc, Xtr), float(np.nansum(ours.objective_))
    speedup = t_svc / warm
    met = bool(agreement >= 0.995 and speedup >= 50)
    row = {"n_train": len(ytr), "n_test": len(yte), "svc_fit_s": t_svc, "ours_cold_s": cold,
           "ours_warm_s": warm, "speedup": speedup, "agreement": agreement,
           "svc_acc": float(np.mean(pred_svc == yte)), "ours_acc": float(np.mean(pred == yte)),
           "svc_objective": obj_svc, "ours_objective": obj_ours,
           "objective_rel_diff": abs(obj_ours - obj_svc) / abs(obj_svc),
           "svc_n_sv": int(len(svc.support_)), "ours_n_sv": int(len(ours.support_)),
           "svc_iter": int(np.sum(svc.n_iter_)), "ours_iter": int(ours.n_iter_.sum()),
           "target": ">= 99.5 % agreement and >= 50x", "met": met}
    measured = (f"agreement {100 * agreement:.2f} %, {speedup:.1f}x faster ({warm:.3g} s vs SVC "
                f"{t_svc:.3g} s), objectives {obj_ours:.2f} vs {obj_svc:.2f}, n_SV "
                f"{row['ours_n_sv']} vs {row['svc_n_sv']}")
    return _summary("svc", measured, met, run), [row]


# -- 2. CA-SVM P=16 -----------------------------------------------------------------------

class _CountedKernel:
    """A compiled CUDA kernel that counts its launches."""

    def __init__(self, fn, counts: Counter, name: str):
        self._fn, self._counts, self._name = fn, counts, name

    def __call__(self, *args, **kwargs):
        self._counts[self._name] += 1
        return self._fn(*args, **kwargs)

    def __getattr__(self, attr):
        return getattr(self._fn, attr)


@contextlib.contextmanager
def count_launches(gpu: bool):
    """Count the launches of gpuml's CUDA kernels (by kernel name) inside the block.

    Every kernel is fetched through ``gpuml.kernels._cuda.get_kernel``; the
    functions it returns are wrapped while the block runs (also where a module
    imported the function by name). Yields None without a GPU.
    """
    if not gpu:
        yield None
        return
    from gpuml.kernels import _cuda as loader

    counts: Counter = Counter()
    original = loader.get_kernel

    def counting(name, kernel, *args, **kwargs):
        return _CountedKernel(original(name, kernel, *args, **kwargs), counts, kernel)

    holders = [m for m in list(sys.modules.values())
               if getattr(m, "__name__", "").startswith("gpuml.kernels")
               and getattr(m, "get_kernel", None) is original]
    for m in holders:
        m.get_kernel = counting
    try:
        yield counts
    finally:
        for m in holders:
            m.get_kernel = original


def _launches(counts) -> str:
    if counts is None:
        return SKIPPED
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none counted"


def casvm_p16(run: Run, adult, svc_acc: float | None) -> tuple[dict, list[dict]]:
    from gpuml._backend import resolve
    from gpuml.estimators.casvm import CASVMClassifier
    from gpuml.kernels import SMOProblem, make_kernel, smo_solve_batch
    from gpuml.partition import split

    Xtr, Xte, ytr, yte = adult
    P = 16
    run.say(f"2. CASVMClassifier(n_partitions={P}) fit")
    clf = CASVMClassifier(n_partitions=P, device=run.device, random_state=0, **SVM)
    with count_launches(run.gpu) as fit_launches:
        cold = timings(lambda: clf.fit(Xtr, ytr), repeat=1, warmup=0, sync=run.sync)[0]
    warm = statistics.median(timings(lambda: clf.fit(Xtr, ytr), repeat=run.repeat, warmup=0,
                                     sync=run.sync))
    acc = clf.score(Xte, yte)

    # The solver alone: the 16 binary problems of the fit's parts in one batch, against
    # each problem alone. Gamma is the whole training set's, as in the fit.
    run.say(f"   SMO: the {P} problems in one batch vs each alone")
    backend = resolve(run.device)
    with backend.use():
        Xd = backend.asarray(Xtr)
        parts = split(Xd, P, "random", 0).parts
        Xs = [Xd[backend.asarray(rows)] for rows in parts]
    kernel = make_kernel("rbf", SVM["gamma"], 3, 0.0, Xtr)
    signs = np.where(ytr == ytr.max(), 1.0, -1.0)
    problems = [SMOProblem(g, np.arange(len(rows)), signs[rows], np.full(len(rows), SVM["C"]))
                for g, rows in enumerate(parts)]
    options = dict(tol=SVM["tol"], cache_size=1024.0, shrinking=False)

    def batch():
        return smo_solve_batch(kernel, Xs, problems, **options)

    with count_launches(run.gpu) as batch_launches:
        results = batch()
    run.sync()
    t_batch = statistics.median(timings(batch, repeat=run.repeat, warmup=0, sync=run.sync))
    alone, alone_iter = [], 0
    for g, prob in enumerate(problems):
        single = [SMOProblem(0, prob.idx, prob.y, prob.C)]

        def one(g=g, single=single):
            return smo_solve_batch(kernel, [Xs[g]], single, **options)

        alone_iter += one()[0].n_iter
        alone.append(statistics.median(timings(one, repeat=run.repeat, warmup=0,
                                               sync=run.sync)))
    batch_iter = sum(r.n_iter for r in results)
    smo_launches = sum(batch_launches.values()) if batch_launches is not None else None
    concurrent = t_batch <= 0.5 * sum(alone)
    one_launch = smo_launches is not None and 0 < smo_launches < len(problems)
    met = bool(warm < 0.5 and concurrent and one_launch)
    row = {"P": P, "n_train": len(ytr), "fit_cold_s": cold, "fit_warm_s": warm,
           "acc": acc, "svc_acc": svc_acc if svc_acc is not None else "",
           "fit_launches": _launches(fit_launches),
           "smo_problems": len(problems), "smo_batch_launches": _launches(batch_launches),
           "smo_batch_s": t_batch, "smo_alone_sum_s": float(sum(alone)),
           "smo_alone_max_s": float(max(alone)),
           "batch_over_alone_sum": t_batch / sum(alone),
           "batch_iter": int(batch_iter), "alone_iter": int(alone_iter),
           "target": "fit < 0.5 s; the problems in fewer launches than problems and the batch "
                     "<= half the sum of the problems alone", "met": met}
    measured = (f"fit {warm:.3f} s (cold {cold:.2f} s), accuracy {acc:.4f}"
                + (f" vs SVC {svc_acc:.4f}" if svc_acc is not None else "")
                + f"; SMO: {len(problems)} problems, launches: {_launches(batch_launches)}; batch "
                f"{t_batch:.3f} s vs {sum(alone):.3f} s for the problems one by one "
                f"(largest alone {max(alone):.3f} s; iterations {batch_iter} vs {alone_iter})")
    return _summary("casvm_p16", measured, met, run), [row]


# -- 3. exact KRR and BKRR2 ---------------------------------------------------------------

def krr(run: Run) -> tuple[dict, list[dict]]:
    from sklearn.kernel_ridge import KernelRidge
    from threadpoolctl import threadpool_info, threadpool_limits

    from gpuml.estimators.bkrr import BKRRRegressor

    n_train, n_test = run.california_sizes
    Xtr, Xte, ytr, yte = california(n_train, n_test)
    m = len(ytr)
    ref = KernelRidge(alpha=KRR_LAM * m, kernel="rbf", gamma=1.0 / (2.0 * KRR_SIGMA**2))
    cores = _cores()
    run.say(f"3. KernelRidge fit on {m} rows, once, BLAS on {cores} threads")
    with threadpool_limits(limits=cores, user_api="blas"):
        blas = ", ".join(sorted({f"{i['internal_api']} {i['num_threads']} threads"
                                 for i in threadpool_info() if i["user_api"] == "blas"}))
        t_ref = timings(lambda: ref.fit(Xtr, ytr), repeat=1, warmup=0)[0]
        pred_ref = ref.predict(Xte)

    def mse(pred):
        return float(np.mean((pred - yte) ** 2))

    rows = [{"method": "KernelRidge (sklearn)", "P": 1, "device": "cpu", "cold_s": "",
             "warm_s": t_ref, "speedup": 1.0, "rel_diff_vs_ref": 0.0, "test_mse": mse(pred_ref),
             "target": "", "met": ""}]
    met = True
    for method, P, goal, kw in (
            ("exact KRR (gpuml)", 1, 20.0, {}),
            ("BKRR2 (gpuml)", 16, 100.0, dict(partition="kbalance", combine="nearest",
                                              random_state=0))):
        run.say(f"   BKRRRegressor(n_partitions={P}, device={run.device!r})")
        # KernelRidge's model (no intercept), the model the target compares with
        # (bench/results/h100-80gb-hbm3/gpu_krr.md).
        est = BKRRRegressor(sigma=KRR_SIGMA, lam=KRR_LAM, n_partitions=P, device=run.device,
                            fit_intercept=False, **kw)
        cold, warm = run.cold_warm(lambda est=est: est.fit(Xtr, ytr))
        pred = _host(est.predict(Xte))
        rel = float(np.abs(pred - pred_ref).max() / np.abs(pred_ref).max())
        ok = t_ref / warm >= goal and (P > 1 or rel <= 1e-6)
        met &= ok
        rows.append({"method": method, "P": P, "device": run.device, "cold_s": cold,
                     "warm_s": warm, "speedup": t_ref / warm, "rel_diff_vs_ref": rel,
                     "test_mse": mse(pred),
                     "target": f">= {goal:g}x" + (", rel diff <= 1e-6" if P == 1 else ""),
                     "met": bool(ok)})
    exact, bkrr2 = rows[1], rows[2]
    measured = (f"exact: rel diff {exact['rel_diff_vs_ref']:.1e}, {exact['speedup']:.1f}x "
                f"({exact['warm_s']:.3f} s vs KernelRidge {t_ref:.2f} s on {blas}); BKRR2: "
                f"{bkrr2['speedup']:.0f}x, test MSE {bkrr2['test_mse']:.4f} vs exact "
                f"{exact['test_mse']:.4f}")
    return _summary("krr", measured, bool(met), run), rows


# -- 4. Asy-GCD ----------------------------------------------------------------------------

def _child_asygcd(device: str, tol: float, dry_run: bool) -> tuple[dict, dict]:
    """In a child process: fit AsyGCDSVC on ``device``; its decision values on the test rows."""
    from gpuml.estimators.asygcd import AsyGCDSVC

    run = Run(gpu=not dry_run)
    Xtr, Xte, ytr, _ = _adult(run)
    sync = Run(gpu=device != "cpu").sync
    est = AsyGCDSVC(device=device, tol=tol, block_partition="random", random_state=0)
    cold = timings(lambda: est.fit(Xtr, ytr), repeat=1, warmup=0, sync=sync)[0]
    warm = timings(lambda: est.fit(Xtr, ytr), repeat=1, warmup=0, sync=sync)[0]
    info = {"cold_s": cold, "warm_s": warm, "workers": int(est.n_workers_),
            "updates": int(est.n_updates_.sum()), "max_violation": float(est.max_violation_.max()),
            "objective": float(est.objective_.sum())}
    return info, {"decision": _host(est.decision_function(Xte))}


def asygcd(run: Run, adult) -> tuple[dict, list[dict]]:
    from gpuml.estimators.asygcd import AsyGCDSVC
    from gpuml.kernels import make_kernel

    Xtr, Xte, ytr, _ = adult
    yb = binary_labels("adult", ytr)
    kernel = make_kernel("rbf", SVM["gamma"], 3, 0.0, Xtr)
    threads = run.threads
    run.say("4. Asy-GCD: numba compile on a small problem")
    timed_solve(Xtr[:400], yb[:400], kernel, 2, partition="random", tol=GCD_SCALING_TOL)
    run.say(f"   CPU solver, 1 thread, to tol {GCD_SCALING_TOL:g} (once; ~10 s on the GPU "
            "machine)")
    res1, t1, part1 = timed_solve(Xtr, yb, kernel, 1, partition="random", tol=GCD_SCALING_TOL)
    run.say(f"   1 thread {t1:.1f} s; {threads} threads")
    many = [timed_solve(Xtr, yb, kernel, threads, partition="random", tol=GCD_SCALING_TOL)
            for _ in range(run.repeat)]
    t_many = statistics.median(t + p for _, t, p in many)
    res_many = many[-1][0]
    speedup = (t1 + part1) / t_many
    rows = [{"what": "CPU solver, 1 thread", "threads": 1, "cores": _cores(),
             "seconds": t1 + part1, "updates": int(res1.n_updates),
             "max_violation": float(res1.max_violation), "cpu_per_wall": res1.cpu_per_wall,
             "speedup": 1.0, "rel_diff": "", "target": "", "met": ""},
            {"what": f"CPU solver, {threads} threads", "threads": threads, "cores": _cores(),
             "seconds": t_many, "updates": int(res_many.n_updates),
             "max_violation": float(res_many.max_violation),
             "cpu_per_wall": res_many.cpu_per_wall, "speedup": speedup, "rel_diff": "",
             "target": ">= 10x over 1 thread", "met": bool(speedup >= 10)}]

    run.say(f"   AsyGCDSVC(device='cpu', tol={GCD_AGREEMENT_TOL:g})")
    cpu = AsyGCDSVC(device="cpu", tol=GCD_AGREEMENT_TOL, block_partition="random",
                    random_state=0)
    t_cpu = timings(lambda: cpu.fit(Xtr, ytr), repeat=1, warmup=0)[0]
    d_cpu = _host(cpu.decision_function(Xte))
    rows.append({"what": f"AsyGCDSVC cpu, tol {GCD_AGREEMENT_TOL:g}", "threads": cpu.n_workers_,
                 "cores": _cores(), "seconds": t_cpu, "updates": int(cpu.n_updates_.sum()),
                 "max_violation": float(cpu.max_violation_.max()), "cpu_per_wall": "",
                 "speedup": "", "rel_diff": "", "target": "", "met": ""})
    # Without a GPU the child fits on the CPU as well: a dry run of the same path.
    child_device = "cuda" if run.gpu else "cpu"
    run.say(f"   AsyGCDSVC(device={child_device!r}) in a child process "
            f"(limit {ASYGCD_TIMEOUT} s)")
    _release_device_memory()
    other = run_child("asygcd", dict(device=child_device, tol=GCD_AGREEMENT_TOL,
                                     dry_run=not run.gpu), timeout=ASYGCD_TIMEOUT)
    if "decision" in other:
        rel = float(np.abs(other["decision"] - d_cpu).max() / np.abs(d_cpu).max())
        agree = bool(rel <= 1e-4) if run.gpu else None
        rows.append({"what": f"AsyGCDSVC {child_device}, tol {GCD_AGREEMENT_TOL:g}"
                             + ("" if run.gpu else f" ({SKIPPED}: CPU dry run)"),
                     "threads": other["workers"], "cores": _cores(), "seconds": other["warm_s"],
                     "updates": other["updates"], "max_violation": other["max_violation"],
                     "cpu_per_wall": "", "speedup": t_cpu / other["warm_s"], "rel_diff": rel,
                     "target": "decision rel diff <= 1e-4", "met": agree})
        agreement = (f"GPU vs CPU decision rel diff {rel:.1e} (GPU fit {other['warm_s']:.2f} s, "
                     f"cold {other['cold_s']:.1f} s; CPU {t_cpu:.2f} s)")
    else:
        agree = False if run.gpu else None
        rows.append({"what": f"AsyGCDSVC {child_device}: {other['child_status']}",
                     "threads": "", "cores": _cores(), "seconds": "", "updates": "",
                     "max_violation": "", "cpu_per_wall": "", "speedup": "", "rel_diff": "",
                     "target": "decision rel diff <= 1e-4", "met": agree})
        agreement = f"GPU fit failed: {other['child_status']}"
    met = bool(agree and speedup >= 10)
    measured = (f"{agreement}; CPU {threads} threads {speedup:.1f}x faster than 1 thread "
                f"to tol {GCD_SCALING_TOL:g} ({t_many:.2f} s vs {t1 + part1:.1f} s)")
    return _summary("asygcd", measured, met, run), rows


# -- 5. fused LAMB and LARS -----------------------------------------------------------------

def _rel_diff(params, reference) -> float:
    """Largest over tensors of ``||p - p_ref|| / ||p_ref||`` (fp32)."""
    return max(float((p.detach().float() - r.detach().float()).norm()
                     / r.detach().float().norm().clamp_min(1e-30))
               for p, r in zip(params, reference))


def _bf16_ulps(params, reference) -> float:
    """Largest difference in units of the last place of bfloat16 (8 significant bits)."""
    import torch

    worst = 0.0
    tiny = torch.finfo(torch.bfloat16).tiny
    for p, r in zip(params, reference):
        a, b = p.detach().float(), r.detach().float()
        scale = torch.maximum(a.abs(), b.abs()).clamp_min(tiny)
        ulp = torch.exp2(torch.floor(torch.log2(scale)) - 7)
        worst = max(worst, float(((a - b).abs() / ulp).max()))
    return worst


def _compare_paths(run: Run, shapes, opt_name: str, path: str) -> dict:
    """``path`` against the loop path after a few steps: fp32, and bf16 with master weights.

    Also times the first fp32 step of ``path`` (``cold_ms``): the first call of the fused
    kernels in the process, so it includes their Triton compilation.
    """
    import torch

    from bench.bench_optim import make_params, variants

    sync = torch.cuda.synchronize if run.gpu else None
    out = {}
    for options, dtype in (({}, torch.float32), ({"master_weights": True}, torch.bfloat16)):
        makers = {(o, p): make for o, p, make in variants(run.gpu, **options)}
        states = []
        for impl in ("loop", path):
            params = make_params(shapes, run.device)
            if dtype != torch.float32:
                grads = [p.grad.to(dtype) for p in params]
                params = [torch.nn.Parameter(p.detach().to(dtype)) for p in params]
                for p, g in zip(params, grads):
                    p.grad = g
            opt = makers[(opt_name, impl)](params)
            first = timings(opt.step, repeat=1, warmup=0, sync=sync)[0]
            if impl == path and dtype == torch.float32:
                out["cold_ms"] = 1e3 * first
            for _ in range(OPTIM_STEPS - 1):
                opt.step()
            masters = [opt.state[p].get("master_param") for p in params]
            states.append((params, masters))
        (ref, ref_master), (ours, our_master) = states
        if dtype == torch.float32:
            out["fp32_rel_diff"] = _rel_diff(ours, ref)
        else:
            out["bf16_max_ulps"] = _bf16_ulps(ours, ref)
            out["bf16_is_rounded_master"] = all(
                m is not None and torch.equal(p.detach(), m.to(p.dtype))
                for params_, masters in states for p, m in zip(params_, masters))
            out["bf16_master_rel_diff"] = (_rel_diff(our_master, ref_master)
                                           if all(m is not None for m in our_master + ref_master)
                                           else "no master weights kept")
    return out


def _copy_seconds(size: int, device: str, sync) -> float:
    """Median time of a copy of ``size`` bytes on ``device`` (it reads and writes ``size``)."""
    import torch

    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return statistics.median(timings(lambda: dst.copy_(src), repeat=20, warmup=2, sync=sync))


def _graph_step_times(shapes) -> dict:
    """GPU time of one step of fused LAMB, LARS and AdamW: median replay of a captured step.

    ``capturable=True`` keeps the step count and learning rate on the device, so the
    whole step is one CUDA graph; its replay time is the kernels' time without Python
    or launch gaps (what the bandwidth of the kernels is judged on).
    """
    import torch

    from bench.bench_optim import make_params
    from gpuml.optim import LAMB, LARS

    def lr(x):
        return torch.tensor(x, device="cuda")

    # LAMB with global clipping, the 44 B/param step the bandwidth figure counts
    makers = {"LAMB": lambda ps: LAMB(ps, lr=lr(1e-3), max_grad_norm=1.0, fused=True,
                                      capturable=True),
              "LARS": lambda ps: LARS(ps, lr=lr(1.0), weight_decay=1e-4, fused=True,
                                      capturable=True),
              "AdamW (torch)": lambda ps: torch.optim.AdamW(ps, lr=lr(1e-3), fused=True,
                                                            capturable=True)}
    out = {}
    for name, make in makers.items():
        opt = make(make_params(shapes, "cuda"))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            opt.step()
        out[name] = statistics.median(timings(graph.replay, repeat=50, warmup=5,
                                              sync=torch.cuda.synchronize))
        del graph, opt
    return out


def optim(run: Run) -> tuple[dict, list[dict]]:
    import torch

    from bench.bench_optim import (
        LAMB_BYTES_PER_PARAM,
        LARS_BYTES_PER_PARAM,
        make_params,
        numel,
        resnet50_shapes,
        variants,
    )

    shapes = resnet50_shapes() if run.gpu else resnet50_shapes()[:12]
    n = numel(shapes)
    # The path under test: fused (Triton) on the GPU; on the CPU the dry run compares the
    # foreach path instead, the fused one needs a GPU.
    path = "fused" if run.gpu else "foreach"
    sync = torch.cuda.synchronize if run.gpu else None
    run.say(f"5. optimizers on {len(shapes)} tensors, {n / 1e6:.1f} M parameters: "
            f"{path} vs loop after {OPTIM_STEPS} steps")
    equal = {name: _compare_paths(run, shapes, name, path) for name in ("LAMB", "LARS")}

    run.say("   step times")
    params = make_params(shapes, run.device)
    times = {}
    for opt_name, impl, make in variants(run.gpu):
        opt = make(params)
        reps = 5 if impl == "loop" else 20
        times[opt_name, impl] = statistics.median(timings(opt.step, repeat=reps, warmup=2,
                                                          sync=sync))
        del opt
    del params
    adamw = times["AdamW (torch)", "fused" if run.gpu else "foreach"]
    graph = _graph_step_times(shapes) if run.gpu else {}

    size = (1 << 30) if run.gpu else (64 << 20)
    t_copy = _copy_seconds(size, run.device, sync)
    copy_bw = 2 * size / t_copy
    _release_device_memory()

    rows, met = [], True
    for opt_name, per_param in (("LAMB", LAMB_BYTES_PER_PARAM), ("LARS", LARS_BYTES_PER_PARAM)):
        t = times[opt_name, path]
        bw = n * per_param / t
        # The kernels' bandwidth is judged on the GPU time of the step (a replayed CUDA graph:
        # no Python, no launch gaps); the eager figure beside it includes the host's work.
        t_gpu = graph.get(opt_name)
        bw_gpu = n * per_param / t_gpu if t_gpu else None
        eq = equal[opt_name]
        bf16_ok = (eq["bf16_is_rounded_master"]
                   and isinstance(eq["bf16_master_rel_diff"], float)
                   and eq["bf16_master_rel_diff"] <= 1e-6)
        checks = {"fp32": eq["fp32_rel_diff"] <= 1e-6, "bf16": bf16_ok,
                  "vs_adamw": t / adamw <= 1.7,
                  "bandwidth": (bw_gpu or bw) / copy_bw >= 0.8,
                  "vs_loop": times[opt_name, "loop"] / t >= 5}
        ok = all(checks.values()) if run.gpu else None
        met = met and bool(ok)
        rows.append({"optimizer": opt_name, "path": path if run.gpu else f"{path} ({SKIPPED}: "
                     "fused needs a GPU)", "tensors": len(shapes), "params_M": n / 1e6,
                     "step_ms": 1e3 * t,
                     "loop_ms": 1e3 * times[opt_name, "loop"],
                     "foreach_ms": 1e3 * times[opt_name, "foreach"],
                     "adamw_ms": 1e3 * adamw, "vs_adamw": t / adamw,
                     "speedup_vs_loop": times[opt_name, "loop"] / t,
                     "bytes_per_param": per_param, "GB_per_s": bw / 1e9,
                     "frac_copy_bw": bw / copy_bw,
                     "graph_step_ms": 1e3 * t_gpu if t_gpu else "",
                     "graph_adamw_ms": 1e3 * graph["AdamW (torch)"] if graph else "",
                     "graph_frac_copy_bw": bw_gpu / copy_bw if bw_gpu else "", **eq,
                     "failed": ", ".join(k for k, v in checks.items() if not v) if run.gpu else "",
                     "target": "= loop (1e-6 fp32; bf16 = its rounded masters), <= 1.7x AdamW, "
                               ">= 80 % copy bw (GPU time), "
                               ">= 5x loop", "met": ok})
    rows.append({"optimizer": f"device copy of {size >> 20} MiB", "path": "torch copy_",
                 "step_ms": 1e3 * t_copy, "GB_per_s": copy_bw / 1e9, "bytes_per_param": "",
                 "target": "reference: bytes read + written / time", "met": ""})
    lamb, lars = rows[0], rows[1]
    measured = "; ".join(
        f"{r['optimizer']} {r['step_ms']:.2f} ms = {r['vs_adamw']:.2f}x AdamW, "
        f"{100 * r['frac_copy_bw']:.0f} % of copy bw eager"
        + (f", {100 * r['graph_frac_copy_bw']:.0f} % as a replayed graph "
           f"({r['graph_step_ms']:.3f} ms vs AdamW {r['graph_adamw_ms']:.3f} ms)"
           if r["graph_frac_copy_bw"] != "" else "")
        + f", {r['speedup_vs_loop']:.1f}x loop, fp32 diff {r['fp32_rel_diff']:.1e}, "
        f"bf16 params = rounded masters: {r['bf16_is_rounded_master']}, masters diff "
        f"{r['bf16_master_rel_diff']:.1e} (max {r['bf16_max_ulps']:.0f} bf16 ulp elementwise)"
        for r in (lamb, lars)) + f" (copy {copy_bw / 1e9:.0f} GB/s)"
    if not run.gpu:
        measured = f"{SKIPPED} (dry run: foreach vs loop) " + measured
    return _summary("optim", measured, met if run.gpu else None, run), rows


# -- 6. GPU memory: refusals ------------------------------------------------------------------

#: What each probe fits, with the caps that keep a fit that does start short.
PROBES = {
    "BKRRRegressor exact (P=1)": "bkrr",
    "CASVMClassifier P=1 (max_iter=200)": "casvm",
    "AsyGCDSVC (max_updates=2000)": "asygcd",
    "AsyGCDSVC, cache_size asking for the whole Q": "asygcd_whole_q",
}
_SIZE_RE = re.compile(r"\d[\d.,]*\s*(?:[KMGT]i?B|bytes)\b")
_FIX_RE = re.compile(r"\b(?:use|set|reduce|increase|lower|raise|larger|smaller)\b", re.I)


class _DeviceMemory:
    """Peak device memory (polled every 2 ms) and the largest request to CuPy's allocator."""

    def __init__(self):
        import cupy

        self._cp = cupy
        free, self.total = cupy.cuda.runtime.memGetInfo()
        self.base = self.peak = self.total - free
        self.largest = 0
        pool = cupy.get_default_memory_pool()

        def malloc(size):
            self.largest = max(self.largest, size)
            return pool.malloc(size)

        cupy.cuda.set_allocator(malloc)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _sample(self):
        free, total = self._cp.cuda.runtime.memGetInfo()
        self.peak = max(self.peak, total - free)

    def _poll(self):
        while not self._stop.is_set():
            self._sample()
            time.sleep(0.002)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self._sample()
        return {"peak_extra_GiB": (self.peak - self.base) / 2**30,
                "largest_alloc_GiB": self.largest / 2**30, "device_GiB": self.total / 2**30}


def _child_memory(probe: str, n: int, device: str) -> tuple[dict, dict]:
    """In a child process: one fit of ``n`` synthetic rows that cannot fit; what happened."""
    from gpuml.estimators.asygcd import AsyGCDSVC
    from gpuml.estimators.bkrr import BKRRRegressor
    from gpuml.estimators.casvm import CASVMClassifier

    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 8))
    y = (X[:, 0] > 0).astype(np.int64)
    whole_q_mb = 2 * n * n * 8 / 2**20
    est, target = {
        "bkrr": (BKRRRegressor(n_partitions=1, device=device), X[:, 0]),
        "casvm": (CASVMClassifier(n_partitions=1, max_iter=200, device=device), y),
        "asygcd": (AsyGCDSVC(max_updates=2000, block_partition="random", device=device), y),
        "asygcd_whole_q": (AsyGCDSVC(max_updates=2000, block_partition="random",
                                     cache_size=whole_q_mb, device=device), y),
    }[probe]
    memory = _DeviceMemory() if device != "cpu" else None
    outcome, message = "completed", ""
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X, target)
            if memory is not None:
                import cupy

                cupy.cuda.Device().synchronize()
    except Exception as err:  # what it raises is the measurement
        outcome, message = type(err).__name__, str(err)
    seconds = time.perf_counter() - t0
    info = {"outcome": outcome, "message": message, "seconds": seconds}
    info.update(memory.stop() if memory is not None else {})
    return info, {}


def memory(run: Run) -> tuple[dict, list[dict]]:
    if run.gpu:
        import cupy

        total = cupy.cuda.runtime.memGetInfo()[1]
        where = "device memory"
    else:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        where = "RAM (CPU dry run)"
    # n x n float64 kernel matrix = twice the memory there is.
    n = math.isqrt(2 * total // 8)
    run.say(f"6. memory probes: n = {n} rows, n^2 float64 = {n * n * 8 / 2**30:.0f} GiB "
            f"against {total / 2**30:.0f} GiB of {where}")
    _release_device_memory()
    rows, met = [], True
    for label, probe in PROBES.items():
        if not run.gpu and probe != "bkrr":
            rows.append({"fit": label, "n": n, "outcome": SKIPPED, "met": None})
            continue
        run.say(f"   {label} (child process, limit {PROBE_TIMEOUT} s)")
        info = run_child("memory", dict(probe=probe, n=n, device=run.device),
                         timeout=PROBE_TIMEOUT)
        if "outcome" not in info:
            outcome, ok = f"missed: {info['child_status']}", False
        elif info["outcome"] == "completed":
            low = info.get("peak_extra_GiB", 0.0) < 0.1 * total / 2**30
            outcome = ("completed within memory: needs no n x n matrix (rows computed on "
                       "the fly; work capped)" if low else "completed, using most of the memory")
            ok = low
        else:
            text = info["message"]
            says_size, says_fix = bool(_SIZE_RE.search(text)), bool(_FIX_RE.search(text))
            small = info.get("largest_alloc_GiB", 0.0) < 0.1 * total / 2**30
            ok = says_size and says_fix and small and "OutOfMemory" not in info["outcome"]
            outcome = ("refused" if ok else "missed") + f": {info['outcome']}" + (
                "" if says_size else ", no size in the message") + (
                "" if says_fix else ", no advice in the message") + (
                "" if small else ", after trying to allocate it")
        met = met and ok
        rows.append({"fit": label, "n": n, "outcome": outcome,
                     "seconds": info.get("seconds", ""),
                     "peak_extra_GiB": info.get("peak_extra_GiB", ""),
                     "largest_alloc_GiB": info.get("largest_alloc_GiB", ""),
                     "message": info.get("message", "")[:400],
                     "target": "refused before allocating, with size and advice (or fits "
                               "without the n x n matrix)", "met": bool(ok)})
        run.say(f"   -> {outcome}")
    measured = "; ".join(f"{r['fit']}: {r['outcome']}" for r in rows)
    return _summary("memory", measured, met if run.gpu else None, run), rows


# -- child processes ---------------------------------------------------------------------------

CHILDREN = {"asygcd": _child_asygcd, "memory": _child_memory}


def run_child(name: str, kwargs: dict, timeout: float) -> dict:
    """``CHILDREN[name](**kwargs)`` in a fresh Python process, killed after ``timeout`` s.

    Returns the child's dict with its arrays loaded, plus ``child_status`` ("ok",
    or why no result came: the time limit, or the exit status and the end of stderr).
    """
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "bench.bench_gpu", "--child", name, json.dumps(kwargs),
               tmp]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                          env.get("PYTHONPATH")]))
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, capture_output=True,
                                  text=True)
        except subprocess.TimeoutExpired:
            return {"child_status": f"no answer within {timeout:g} s (killed)"}
        result = Path(tmp) / "result.json"
        if proc.returncode != 0 or not result.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"child_status": f"exit {proc.returncode}: " + " | ".join(tail)}
        out = json.loads(result.read_text())
        for path in Path(tmp).glob("*.npy"):
            out[path.stem] = np.load(path)
        out["child_status"] = "ok"
        return out


def _child_main(name: str, kwargs: str, folder: str) -> None:
    info, arrays = CHILDREN[name](**json.loads(kwargs))
    for key, value in arrays.items():
        np.save(Path(folder) / f"{key}.npy", value)
    (Path(folder) / "result.json").write_text(json.dumps(info, default=float))


# -- driver ------------------------------------------------------------------------------------

def _summary(key: str, measured: str, met, run: Run) -> dict:
    return {"target": key, "goal": GOALS[key], "measured": measured,
            "met": met if run.gpu else None}


TITLES = {
    "svc": "1. Exact SVC: CASVMClassifier(n_partitions=1) vs sklearn.svm.SVC (adult)",
    "casvm_p16": "2. CA-SVM P=16 on adult: fit time and concurrency of the parts",
    "krr": "3. Exact KRR and BKRR2 vs sklearn KernelRidge (california housing)",
    "asygcd": "4. Asy-GCD: GPU vs CPU solver, CPU thread scaling (adult)",
    "optim": "5. Fused LAMB / LARS on ResNet-50 shapes",
    "memory": "6. GPU memory: fits that cannot fit",
}


def main(quick: bool = False, gpu: bool = False) -> list[dict]:
    run = Run(gpu=gpu, quick=quick)
    if gpu:
        from gpuml._backend import cuda_available, gpu_name

        if not cuda_available():
            raise RuntimeError("bench_gpu --gpu: no CUDA device answers (CuPy sees none)")
        run.say(f"GPU: {gpu_name()}; {_cores()} CPU cores")
    else:
        run.say(f"CPU dry run ({SKIPPED} for CUDA-only figures; met means nothing here)")
    adult = _adult(run)
    state: dict = {}

    def svc():
        summary, rows = exact_svc(run, adult)
        state["svc_acc"] = rows[0]["svc_acc"]
        return summary, rows

    # The targets whose GPU code may still hang or crash (the Asy-GCD kernel, fits that do
    # not fit) run last, in child processes with a time limit.
    steps = {"svc": svc,
             "casvm_p16": lambda: casvm_p16(run, adult, state.get("svc_acc")),
             "krr": lambda: krr(run),
             "optim": lambda: optim(run),
             "asygcd": lambda: asygcd(run, adult),
             "memory": lambda: memory(run)}
    summary = []
    for key, step in steps.items():
        t0 = time.perf_counter()
        try:
            row, rows = step()
        except Exception as err:  # one broken target must not hide the others' figures
            traceback.print_exc()
            row, rows = _summary(key, f"error: {type(err).__name__}: {err}", False, run), []
            row["met"] = False
        if rows:
            record(run.name(f"gpu_{key}"), rows, gpu=gpu, title=TITLES[key],
                   notes=f"Goal: {GOALS[key]}. " + NOTES.get(key, ""))
        summary.append(row)
        run.say(f"{key} done in {time.perf_counter() - t0:.1f} s: met={row['met']}")
    # Run in the order above (the riskiest last), listed in the order of the targets.
    summary.sort(key=lambda row: list(GOALS).index(row["target"]))
    notes = ("Warm figures: median of repeated calls after a first, compile-including call "
             "(reported as cold); SVC, KernelRidge and the one-thread Asy-GCD run once. "
             "Details in the gpu_* tables beside this one. "
             f"Total {time.perf_counter() - run.start:.0f} s.")
    if not gpu:
        notes += (" CPU dry run at tiny sizes: met is left empty, the figures test the "
                  "harness only.")
    record(run.name("gpu_targets"), summary, gpu=gpu, title="GPU targets (issue: GPU truth)",
           notes=notes)
    return summary


NOTES = {
    "svc": "C=1, gamma='scale', tol=1e-3 for both; SVC with cache_size=1024 MB, fitted once "
           "(LIBSVM is single-threaded); ours from NumPy input (copies to the device included). "
           "Agreement: same predicted class on the test rows. Objectives: LIBSVM's dual "
           "1/2 a'Qa - sum(a) of both solutions.",
    "casvm_p16": "Random split, random_state=0. Launches counted by wrapping the kernels "
                 "gpuml.kernels._cuda.get_kernel returns. smo_batch_s: the solver on the "
                 "16 parts' binary problems in one call; smo_alone_sum_s: the sum of its "
                 "times on each problem alone (same gamma, same iterations). A batch time "
                 "near the largest single problem, far below the sum, means the problems ran "
                 "side by side; near the sum, one after another.",
    "krr": f"sigma={KRR_SIGMA}, lam={KRR_LAM}: KernelRidge(alpha=lam*n, gamma=1/(2 sigma^2)). "
           "rel_diff_vs_ref: max |prediction difference| / max |KernelRidge prediction| on the "
           "test rows. KernelRidge fitted once, BLAS threads as threadpoolctl reports them.",
    "asygcd": "Random (even) variable blocks. Scaling: gcd_solve from zero to max projected "
              "gradient < 1e-3, partition time included; 1 thread once, many threads median. "
              "Agreement: AsyGCDSVC with tol 1e-5 on both devices, decision values on the "
              "test rows, max |difference| / max |CPU value|; the GPU fit runs in a child "
              "process with a time limit (seconds: its second, warm fit).",
    "optim": f"fp32 rel diff: max over tensors of ||fused - loop|| / ||loop|| after "
             f"{OPTIM_STEPS} steps; bf16: parameters in bf16 with fp32 master weights; the "
             "check is that each path's bf16 parameters are exactly its fp32 masters rounded "
             "and the masters agree to 1e-6 (bf16_max_ulps, the largest elementwise difference "
             "in bf16 units of the last place, is shown for information: an element near zero "
             "whose masters differ by fp32 rounding can be many of its own ulps apart). "
             "Step times: median of 20 (loop: 5) after 2 warm-ups; graph_*: median replay of "
             "a captured step (capturable=True), the GPU time the bandwidth is judged on; "
             "cold_ms = the first "
             "step of the path in the process (Triton compile included). Bytes per parameter "
             "as gpuml/optim/_triton.py counts them (LAMB with global clipping 44, LARS 28); "
             "copy bandwidth: one 1 GiB device copy, read + written bytes.",
    "memory": "Each fit in its own child process on synthetic X (8 features). seconds: fit call "
              "to its answer; peak_extra_GiB: device memory in use above the start (polled "
              "every 2 ms); largest_alloc_GiB: the largest request to CuPy's allocator. A fit "
              "that completes without the n x n matrix is met only if it stayed small.",
}


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child_main(*sys.argv[2:])
    else:
        main(quick="--quick" in sys.argv, gpu="--gpu" in sys.argv)
