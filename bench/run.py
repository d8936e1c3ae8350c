"""Run benchmarks: ``python -m bench.run [NAME[:quick] ...] [--quick] [--gpu] [--out DIR]``.

A benchmark is a name in :data:`BENCHMARKS` and its file ``bench/bench_<name>.py``, which
defines ``main(quick: bool, gpu: bool)``. With no names, every registered benchmark runs
(the GPU ones as CPU dry runs unless ``--gpu``). ``NAME:quick``
runs that one benchmark with ``quick=True`` (``--quick`` sets it for all;
``NAME:full`` overrides it). A NAME ending in ``.py`` is a file's path instead
(``tests/_bench_probe.py``: the harness's own test).

Each benchmark is guarded: an exception in one (a missing data set, a failed
GPU launch, anything) prints its traceback and the run goes on with the next;
the exit status is 1 if any failed.

``--out DIR`` is for runs whose results must come back from another machine
(``make gpu-check``): every benchmark's records (what :func:`bench._harness.record`
writes, ``<record>.json`` and ``<record>.md``) are staged in a temporary folder
through ``$GPUML_BENCH_OUT`` and gathered, after each benchmark, into two files:

* ``DIR/bench_status.json``: per benchmark its name, quick, seconds, ok, error
  text and the records it wrote;
* ``DIR/bench_results.json``: every record (its JSON and its Markdown text).

So ``DIR`` stays flat and small however many tables the benchmarks write, and
a run killed half-way leaves what was finished. ``python -m bench.gpu_check
unpack DIR/bench_results.json FOLDER`` writes the records back out as the
usual ``<record>.json`` / ``<record>.md`` files.

``--timeout S`` runs each benchmark in a child process and kills it after S
seconds (a GPU kernel that never returns cannot be interrupted from Python);
Python's stacks are dumped shortly before, so the log shows where it hung.
``--budget S`` bounds the whole run the same way: the running benchmark is
killed when it runs out, and the ones after it are reported as not run, so
that the status and results are written before a machine's command limit.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

STATUS = "bench_status.json"
RESULTS = "bench_results.json"


#: Every benchmark, by name, with the claim its tables back (bench/results/README.md indexes
#: the claims with their tables and figures). The code is ``bench/bench_<name>.py``; one line
#: each, in order of name. One-off studies are not here: they live in ``bench/studies/``.
BENCHMARKS = {
    "asygcd": "Asy-GCD: greedy selection needs fewer updates than random; AsyGCDSVC vs SVC",
    "asygcd_speedup": "Asy-GCD on the CPU: two workers against one, same objective",
    "bkrr": "exact KRR vs KernelRidge; BKRR2 vs exact KRR and DC-KRR; BKRRRegressorCV",
    "bkrr_defaults": "BKRRRegressor() within 0.05 R² of a tuned KernelRidge; BKRR2 vs DC-KRR",
    "casvm": "CA-SVM exact mode vs SVC; P parts with the paper's prediction vs SVC",
    "casvm_predict": "CA-SVM's default prediction: its cost and accuracy beside the others",
    "casvm_sgemm": "CA-SVM's float32 part matrices: faster than float64, same accuracy",
    "casvm_tradeoff": "CA-SVM's defaults keep SVC's accuracy at P = 16; the trade-off plot",
    "dask": "Dask: CA-SVM on 2 workers vs 1; bytes moved against the cost model",
    "dask_memory": "Dask: a fit on data larger than any one worker's memory",
    "dask_model": "Dask: a CA-SVM model larger than a worker stays on the workers, predicted there",
    "exact_work": "the exact SVM's cost follows its SMO work (rows on demand) vs SVC; the C path",
    "fashion_exact": "the exact SVM on all of Fashion-MNIST vs SVC",
    "first_fit": "the first fit in a fresh process, empty and warm numba cache",
    "gpu": "the GPU targets: exact SVC, CA-SVM, KRR, BKRR2, Asy-GCD, fused LAMB/LARS",
    "gpu_scale": "the GPU at scale: 1M-10M rows, Fashion-MNIST exact, streamed fits, peers",
    "kernels": "kernel matrices vs sklearn.metrics.pairwise, dense and CSR",
    "large_batch": "LAMB + LEGW keeps the accuracy at 8-32x the batch, beside AdamW and SGD",
    "optim": "LAMB / LARS step time on BERT-large and ResNet-50 shapes (GPU: fused)",
    "optim_convergence": "LAMB with LEGW and sqrt scaling from batch 64 to 8192",
    "optim_cpu": "LAMB / LARS CPU step vs timm's Lamb / Lars and AdamW",
    "optim_defaults": "the LAMB / LARS defaults the papers leave open, trained and compared",
    "optim_schedules": "figure: the learning-rate schedules (docs/img/optim_schedules.png)",
    "part_threads": "default fits solve their parts on all cores without slowing small fits",
    "partition": "partitioners up to 1M rows, P up to 256: balance; k-means vs scikit-learn",
    "scale": "the defaults from 20,000 to 1M rows beside Nystroem and subsampled exact models",
    "search": "CASVMClassifierCV beside GridSearchCV(SVC()) and GridSearchCV(CASVMClassifier())",
    "sharded": "FSDP2 + LAMB vs FSDP2 + AdamW: step time, one all-reduce per step",
    "small_fits": "CASVMClassifier() vs SVC in many small fits (CV, grids)",
    "ten_million": "the defaults on 10 million rows on the CPU",
    "training_schemes": "figure: the data assignment schemes (docs/img/training_schemes.png)",
}


def available() -> list[str]:
    return list(BENCHMARKS)


def parse_spec(spec: str, quick: bool) -> tuple[str, bool]:
    """``"kernels:quick"`` -> ``("kernels", True)``; ``"kernels"`` -> ``("kernels", quick)``."""
    name, _, option = spec.partition(":")
    if option not in ("", "quick", "full"):
        raise ValueError(f"benchmark {spec!r}: the option after ':' must be 'quick' or 'full'")
    return name, (option == "quick") if option else quick


def _load(name: str):
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"no benchmark file {name!r}")
        spec = importlib.util.spec_from_file_location(f"bench_file_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if name not in BENCHMARKS:
        raise ModuleNotFoundError(f"no benchmark {name!r} (not in bench.run.BENCHMARKS); "
                                  f"available: {available()}", name=f"bench.bench_{name}")
    return importlib.import_module(f"bench.bench_{name}")


def run_one(name: str, quick: bool, gpu: bool) -> None:
    """Import and run one benchmark in this process (exceptions propagate)."""
    _load(name).main(quick=quick, gpu=gpu)


def _error_text(e: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(e), e)).strip()


def _run_child(spec: str, gpu: bool, timeout: float, env: dict) -> str | None:
    """Run one benchmark in a child process; an error text, or None when it succeeded."""
    cmd = [sys.executable, "-m", "bench.run", spec, "--child"] + (["--gpu"] if gpu else [])
    error_file = Path(tempfile.mkdtemp(prefix="gpuml-bench-")) / "error.txt"
    env = dict(env, GPUML_BENCH_DUMP_AFTER=str(max(timeout - 10, timeout * 0.9, 0.01)),
               GPUML_BENCH_ERROR=str(error_file))
    from bench._harness import DEADLINE_ENV

    env[DEADLINE_ENV] = repr(time.time() + timeout)  # the benchmark may plan by it
    # Same process group as this one: whoever stops the whole run stops the child too.
    proc = subprocess.Popen(cmd, env=env)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return f"TimeoutError: killed after {timeout:.1f} s (Python's stacks are in the log above)"
    finally:
        text = error_file.read_text() if error_file.exists() else ""
        shutil.rmtree(error_file.parent, ignore_errors=True)
    if code == 0:
        return None
    if code < 0:
        return f"the child process died of signal {-code} ({signal.Signals(-code).name})"
    return text or f"the child process failed (exit status {code}); see the log"


def gather(stage: Path, out: Path, benchmark: str) -> list[str]:
    """Move the records staged in ``stage`` into ``out/bench_results.json``; their names."""
    path = out / RESULTS
    results = json.loads(path.read_text()) if path.exists() else {"records": []}
    names = []
    for js in sorted(stage.glob("*.json"), key=lambda p: (p.stat().st_mtime_ns, p.name)):
        md = js.with_suffix(".md")
        entry = {"benchmark": benchmark, "name": js.stem, "json": json.loads(js.read_text()),
                 "md": md.read_text() if md.exists() else ""}
        results["records"] = [r for r in results["records"] if r["name"] != js.stem] + [entry]
        names.append(js.stem)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(path)
    return names


def _write_status(out: Path, meta: dict, statuses: list[dict]) -> None:
    tmp = out / (STATUS + ".tmp")
    tmp.write_text(json.dumps(dict(meta, benchmarks=statuses), indent=1))
    tmp.replace(out / STATUS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*",
                        help=f"benchmarks to run (default all): {available()}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for smoke runs")
    parser.add_argument("--gpu", action="store_true", help="run the GPU variants too")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="gather the results into DIR (bench_status.json, bench_results.json)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="run each benchmark in a child process, killed after S seconds")
    parser.add_argument("--budget", type=float, metavar="S",
                        help="the whole run's limit: benchmarks in child processes, the one "
                             "running when it is spent is killed, the rest do not start")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        specs = [parse_spec(s, args.quick) for s in (args.names or available())]
    except ValueError as e:
        parser.error(str(e))
    from bench import _harness

    if args.child:
        # one benchmark, inside a --timeout parent: exceptions give a traceback and status 1
        (name, quick), = specs
        dump_after = float(os.environ.get("GPUML_BENCH_DUMP_AFTER", 0))
        if dump_after > 0:
            import faulthandler

            faulthandler.dump_traceback_later(dump_after, exit=False)
        _harness.COMMAND = os.environ.get("GPUML_BENCH_COMMAND")
        try:
            run_one(name, quick, args.gpu)
        except (Exception, SystemExit) as e:
            traceback.print_exc()
            error_file = os.environ.get("GPUML_BENCH_ERROR")
            if error_file:  # the parent's status line
                Path(error_file).write_text(_error_text(e))
            return 1
        return 0

    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        for stale in (STATUS, RESULTS):
            (args.out / stale).unlink(missing_ok=True)
    meta = {"command": "python -m bench.run " + " ".join(argv if argv is not None
                                                          else sys.argv[1:]),
            "gpu": args.gpu, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    statuses = []
    deadline = time.monotonic() + args.budget if args.budget else None
    for name, quick in specs:
        flags = (" --quick" if quick else "") + (" --gpu" if args.gpu else "")
        command = f"python -m bench.run {name}{flags}"
        stage = Path(tempfile.mkdtemp(prefix="gpuml-bench-")) if args.out else None
        saved = os.environ.get(_harness.OUT_ENV)
        if stage:
            os.environ[_harness.OUT_ENV] = str(stage)
        print(f"=== bench_{name}{' (quick)' if quick else ''} ===", flush=True)
        t0 = time.perf_counter()
        error = None
        limit = args.timeout
        if deadline is not None:
            left = deadline - time.monotonic()
            limit = min(limit, left) if limit else left
        try:
            if limit is not None and limit <= 0:
                error = f"not run: the time budget of {args.budget:g} s was spent"
                print(error, flush=True)
            elif limit:
                env = dict(os.environ, GPUML_BENCH_COMMAND=command)
                error = _run_child(f"{name}:{'quick' if quick else 'full'}", args.gpu,
                                   limit, env)
            else:
                _harness.COMMAND = command
                run_one(name, quick, args.gpu)
        except (Exception, SystemExit) as e:  # the guard: report, go on with the next one
            traceback.print_exc()
            error = _error_text(e)
        finally:
            if stage:
                if saved is None:
                    os.environ.pop(_harness.OUT_ENV, None)
                else:
                    os.environ[_harness.OUT_ENV] = saved
        seconds = time.perf_counter() - t0
        state = "done" if error is None else "FAILED"
        print(f"=== bench_{name} {state} in {seconds:.1f}s ===", flush=True)
        status = {"name": name, "quick": quick, "seconds": round(seconds, 3),
                  "ok": error is None, "error": error}
        if args.out:
            status["records"] = gather(stage, args.out, name)
            shutil.rmtree(stage, ignore_errors=True)
            statuses.append(status)
            _write_status(args.out, meta, statuses)
        else:
            statuses.append(status)
    failed = [s["name"] for s in statuses if not s["ok"]]
    print(f"=== {len(statuses) - len(failed)} of {len(statuses)} benchmarks ran"
          + (f"; FAILED: {' '.join(failed)}" if failed else "") + " ===", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
