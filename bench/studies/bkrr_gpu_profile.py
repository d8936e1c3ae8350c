"""Where BKRRRegressor's GPU fit spends its time: phases, and the batched/single Cholesky crossover.

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 -m bench.studies.bkrr_gpu_profile [--out DIR] [--kernelridge]

1. **Phases** of ``BKRRRegressor(device="cuda").fit`` on 18,432 x 8 random
   data (sigma=1, lam=1e-4), P = 1 (exact KRR) and P = 16 (BKRR2), float64 and
   float32: the fit's own steps and the library calls under them (partition,
   kernel blocks, cuSOLVER calls), each timed between two device
   synchronisations, so a phase's time is its host and device work together.
   Times are inclusive (a nested phase is also counted in its parent); the
   synchronisations cost a little, so the plain warm fit time is given too.
2. **Crossover**: ``krr_solve_parts`` on g random parts of m rows with every
   chunk forced through ``potrfBatched`` and with every block forced through
   single-matrix ``potrf``; ``gpuml.kernels.krr.POTRF_BATCHED_MAX`` should sit
   where the two cross. Skipped on code without that switch.
3. ``--kernelridge``: exact KRR (P = 1) against scikit-learn's KernelRidge on
   the machine's CPU: largest prediction difference and the time ratio.

Works on the code before and after the single-matrix Cholesky path: phases
that a version does not have are simply absent. ``--out DIR`` writes the
numbers as ``bkrr_gpu_phases.json`` there too.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import numpy as np


def _sync():
    import cupy

    cupy.cuda.get_current_stream().synchronize()


class Phases:
    """Wrap named callables so that every call is timed between two synchronisations."""

    def __init__(self):
        self.totals, self.calls, self.depth_of, self.order = {}, {}, {}, []
        self._depth = 0
        self._undo = []

    def _wrap(self, label, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            _sync()
            if label not in self.depth_of:
                self.depth_of[label] = self._depth
                self.order.append(label)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _sync()
                self._depth -= 1
                self.totals[label] = self.totals.get(label, 0.0) + time.perf_counter() - t0
                self.calls[label] = self.calls.get(label, 0) + 1
        return timed

    def patch(self, owner, name, label, optional=False):
        """Time ``owner.name``; a name that is gone fails loudly (the profile would
        otherwise quietly lose a phase when the code moves), unless ``optional``."""
        fn = getattr(owner, name, None)
        if fn is None:
            if optional:
                return
            raise AttributeError(f"{owner!r} has no {name!r}: update instrument()")
        try:
            setattr(owner, name, self._wrap(label, fn))
        except (AttributeError, TypeError):  # a read-only extension attribute: leave it
            return
        self._undo.append((owner, name, fn))

    def restore(self):
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)
        self._undo.clear()

    def reset(self):
        self.totals.clear()
        self.calls.clear()
        self.depth_of.clear()
        self.order.clear()


def instrument(phases: Phases):
    from cupy_backends.cuda.libs import cusolver

    from gpuml.estimators import _cholesky_solver, bkrr_regressor
    from gpuml.kernels import krr
    from gpuml.partition import algorithms, local
    from gpuml.pipeline import executors

    est = bkrr_regressor.BKRRRegressor
    step = executors.InProcess
    phases.patch(step, "load", "fit: validate + copy to device (_validate)")
    phases.patch(step, "check_memory", "fit: memory checks")
    phases.patch(step, "split", "fit: partition")
    phases.patch(algorithms, "lloyd", "partition: k-means (seeding + Lloyd)")
    phases.patch(algorithms, "kmeans_pp", "partition: k-means++ seeding")
    phases.patch(local, "fill", "partition: K-balance fill (host loop)")
    phases.patch(local.LocalRows, "means", "partition: part means")
    phases.patch(est, "_part_solver", "fit: settings from the data (sigma, lambda)")
    phases.patch(step, "fit_parts", "fit: solve the parts")
    phases.patch(_cholesky_solver, "_take", "solve: gather parts/targets (_take)")
    phases.patch(_cholesky_solver, "krr_solve_parts", "solve: krr_solve_parts")
    phases.patch(krr, "_stacked_gram", "krr: kernel blocks (GEMM + map)")
    phases.patch(krr, "_posv_device", "krr: batched posv (potrfBatched)")
    phases.patch(krr, "_potrf_potrs_inplace", "krr: single potrf + potrs")
    phases.patch(krr._DeviceCholesky, "raise_if_failed", "krr: failure check (1 sync)")
    for prefix in ("s", "d"):
        for routine in ("potrf", "potrs", "potrfBatched", "potrsBatched"):
            phases.patch(cusolver, prefix + routine, f"cuSOLVER {routine}", optional=True)
    phases.patch(est, "_assemble", "fit: store fitted arrays (_assemble)")


def _data(n, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(X.sum(axis=1)) + 0.1 * rng.normal(size=n)
    return X.astype(dtype), y.astype(dtype)


def fit_phases(n=18432, d=8, repeat=3):
    import cupy

    from gpuml.estimators.bkrr import BKRRRegressor

    rows = []
    for dtype in ("float64", "float32"):
        X, y = _data(n, d, dtype)
        Xd, yd = cupy.asarray(X), cupy.asarray(y)
        for P in (1, 16):
            est = BKRRRegressor(sigma=1.0, lam=1e-4, n_partitions=P, dtype=dtype,
                                device="cuda", random_state=0)
            _sync()
            t0 = time.perf_counter()
            est.fit(Xd, yd)
            _sync()
            cold = time.perf_counter() - t0
            warm = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                est.fit(Xd, yd)
                _sync()
                warm.append(time.perf_counter() - t0)
            phases = Phases()
            instrument(phases)
            try:
                t0 = time.perf_counter()
                est.fit(Xd, yd)
                _sync()
                instrumented = time.perf_counter() - t0
            finally:
                phases.restore()
            row = {"dtype": dtype, "P": P, "n": n, "d": d, "first_fit_s": cold,
                   "warm_fit_s_median": statistics.median(warm), "warm_fit_s": warm,
                   "instrumented_fit_s": instrumented,
                   "phases": [{"phase": k, "depth": phases.depth_of[k],
                               "calls": phases.calls[k], "seconds": phases.totals[k]}
                              for k in phases.order]}
            rows.append(row)
            print(f"\n{dtype} P={P}: first fit {cold:.3f} s, warm median "
                  f"{row['warm_fit_s_median']:.3f} s, instrumented {instrumented:.3f} s")
            for p in row["phases"]:
                print(f"  {'  ' * p['depth']}{p['phase']:<48s} {p['calls']:4d} calls "
                      f"{1e3 * p['seconds']:9.2f} ms")
    return rows


def crossover(sizes=(64, 128, 256, 512, 768, 1152, 2048), repeat=3):
    import cupy

    from gpuml.kernels import krr
    from gpuml.kernels.pairwise import Kernel

    if not hasattr(krr, "POTRF_BATCHED_MAX"):
        print("\ncrossover: this version has no POTRF_BATCHED_MAX switch; skipped")
        return []
    rows = []
    kernel = Kernel("rbf", 0.5)
    rng = np.random.default_rng(1)
    saved = krr.POTRF_BATCHED_MAX
    print("\ncrossover (float64): m, g, batched potrfBatched ms, single potrf ms, "
          "max |difference|")
    try:
        for m in sizes:
            for g in ((16, 144) if m <= 256 else (16,)):
                parts = [cupy.asarray(rng.normal(size=(m, 8))) for _ in range(g)]
                targets = [cupy.asarray(rng.normal(size=m)) for _ in range(g)]
                shifts = [1e-3 * m] * g
                times, results = {}, {}
                for mode, limit in (("batched", 1 << 40), ("single", 0)):
                    krr.POTRF_BATCHED_MAX = limit
                    results[mode] = krr.krr_solve_parts(kernel, parts, targets, shifts)
                    best = float("inf")
                    for _ in range(repeat):
                        _sync()
                        t0 = time.perf_counter()
                        krr.krr_solve_parts(kernel, parts, targets, shifts)
                        _sync()
                        best = min(best, time.perf_counter() - t0)
                    times[mode] = best
                diff = max(float(cupy.abs(a - b).max())
                           for a, b in zip(results["batched"], results["single"]))
                rows.append({"m": m, "g": g, "batched_s": times["batched"],
                             "single_s": times["single"], "max_abs_diff": diff})
                print(f"  m={m:5d} g={g:4d}  batched {1e3 * times['batched']:8.2f}  "
                      f"single {1e3 * times['single']:8.2f}  diff {diff:.1e}")
    finally:
        krr.POTRF_BATCHED_MAX = saved
    return rows


def against_kernel_ridge(n=18432, d=8):
    import cupy
    from sklearn.kernel_ridge import KernelRidge

    from gpuml.estimators.bkrr import BKRRRegressor

    X, y = _data(n, d, "float64")
    Xt, _ = _data(2048, d, "float64", seed=1)
    sigma, lam = 1.0, 1e-4
    est = BKRRRegressor(sigma=sigma, lam=lam, n_partitions=1, device="cuda")
    Xd, yd = cupy.asarray(X), cupy.asarray(y)
    est.fit(Xd, yd)
    _sync()
    t0 = time.perf_counter()
    est.fit(Xd, yd)
    _sync()
    t_gpu = time.perf_counter() - t0
    ref = KernelRidge(alpha=lam * n, kernel="rbf", gamma=1 / (2 * sigma**2))
    t0 = time.perf_counter()
    ref.fit(X, y)
    t_cpu = time.perf_counter() - t0
    ours, theirs = est.predict(Xt), ref.predict(Xt)
    row = {"n": n, "gpu_fit_s": t_gpu, "kernelridge_fit_s": t_cpu, "speedup": t_cpu / t_gpu,
           "max_abs_pred_diff": float(np.abs(ours - theirs).max()),
           "max_rel_pred_diff": float(np.abs(ours - theirs).max() / np.abs(theirs).max())}
    print(f"\nexact KRR vs KernelRidge, n={n}: GPU fit {t_gpu:.3f} s, KernelRidge {t_cpu:.2f} s "
          f"({row['speedup']:.0f}x), max |prediction difference| {row['max_abs_pred_diff']:.1e}")
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--kernelridge", action="store_true")
    args = parser.parse_args(argv)
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    print(f"GPU: {name}, CuPy {cupy.__version__}")
    result = {"gpu": name, "cupy": cupy.__version__, "fit_phases": fit_phases(),
              "crossover": crossover()}
    if args.kernelridge:
        result["kernelridge"] = against_kernel_ridge()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bkrr_gpu_phases.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
