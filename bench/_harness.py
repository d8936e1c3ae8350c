"""Shared helpers for benchmarks: timing, machine naming, and result files.

Every benchmark runs gpuml and its baseline in the same process on the same
data and reports ratios; absolute seconds on these shared machines are noisy.
Results go to ``bench/results/<machine>/<name>.json`` plus a Markdown table,
or, when the environment variable ``GPUML_BENCH_OUT`` names a folder (``bench.run
--out DIR`` sets it; ``make gpu-check`` uses it to bring results back from a
remote GPU machine), to ``$GPUML_BENCH_OUT/<name>.json`` and ``.md``, flat.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# Benchmarks time warm, compiled code: numba compiles in the calling thread, as before
# the background compiler (gpuml.kernels._jit), so that no NumPy twin serves a
# timed fit and no compile thread runs beside one. bench_first_fit turns it back on in
# its child processes, where the first fit a user gets is what it measures.
os.environ.setdefault("GPUML_JIT_BACKGROUND", "0")

RESULTS = Path(__file__).resolve().parent / "results"

#: Environment variable naming the folder :func:`record` writes to instead of ``RESULTS``.
OUT_ENV = "GPUML_BENCH_OUT"
#: Environment variable holding the wall-clock time (``time.time()``) by which the running
#: benchmark is killed: ``bench.run`` sets it for a benchmark it runs with a time limit.
DEADLINE_ENV = "GPUML_BENCH_DEADLINE"


def seconds_left() -> float:
    """Seconds until the running benchmark is killed (:data:`DEADLINE_ENV`), or infinity when
    it runs without a limit: a benchmark that measures points in order of value skips those
    that would not finish."""
    deadline = os.environ.get(DEADLINE_ENV)
    return float(deadline) - time.time() if deadline else float("inf")

#: The command line that is running, set by ``bench.run``; the default for :func:`record`.
COMMAND: str | None = None


def machine_name(gpu: bool = False) -> str:
    """A short, stable name for the machine the numbers come from."""
    if gpu:
        from gpuml._backend import gpu_name

        name = gpu_name()
        if name:
            return name.lower().replace("nvidia ", "").replace(" ", "-")
    return f"cpu-{os.cpu_count()}core"


def cpu_model() -> str:
    """The host CPU's model name (``/proc/cpuinfo``; the platform's processor elsewhere):
    machines of one name (``cpu-2core``) may differ in their CPU, which moves timings."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def timeit(fn: Callable[[], object], *, repeat: int = 3, warmup: int = 0,
           sync: Callable[[], None] | None = None) -> float:
    """Best wall time of ``repeat`` calls of ``fn`` in seconds (after ``warmup`` calls).

    ``sync`` is called after each call (for example a device synchronise) so
    that asynchronous GPU work is inside the measured interval.
    """
    for _ in range(warmup):
        fn()
        if sync:
            sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        best = min(best, time.perf_counter() - t0)
    return best


def timings(fn: Callable[[], object], *, repeat: int = 5, warmup: int = 1,
            sync: Callable[[], None] | None = None) -> list[float]:
    """Wall seconds of each of ``repeat`` calls of ``fn``, after ``warmup`` untimed calls.

    ``sync`` is called after each call (a device synchronise) so that work a
    call queues on a GPU is inside its interval. Report the median of the list
    for a warm figure; time the first call of a fresh process apart (with
    ``warmup=0, repeat=1``) when compile time is wanted.
    """
    for _ in range(warmup):
        fn()
        if sync:
            sync()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        out.append(time.perf_counter() - t0)
    return out


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.4g}"
    return str(v)


def markdown_table(rows: Sequence[dict]) -> str:
    """Rows of dicts (same keys) as a Markdown table."""
    if not rows:
        return "(no rows)\n"
    keys = list(rows[0])
    for r in rows[1:]:
        keys += [k for k in r if k not in keys]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_fmt(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def record(name: str, rows: Sequence[dict], *, gpu: bool = False, title: str = "",
           notes: str = "", command: str | None = None) -> Path:
    """Print ``rows`` as a table and write them to bench/results/<machine>/<name>.{json,md}.

    With ``$GPUML_BENCH_OUT`` set, the two files go to that folder instead.
    """
    machine = machine_name(gpu)
    out = Path(os.environ[OUT_ENV]) if os.environ.get(OUT_ENV) else RESULTS / machine
    out.mkdir(parents=True, exist_ok=True)
    command = command or COMMAND or "python -m bench.run " + name
    meta = {
        "name": name,
        "machine": machine,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": command,
        "notes": notes,
    }
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": list(rows)}, indent=1,
                                                 default=float))
    table = markdown_table(rows)
    md = (f"# {title or name}\n\nMachine: `{machine}` ({meta['cpu']}). "
          f"Command: `{command}`.\n\n{table}")
    if notes:
        md += f"\n{notes}\n"
    (out / f"{name}.md").write_text(md)
    print(f"\n## {title or name} ({machine})\n{table}", flush=True)
    return out / f"{name}.md"
