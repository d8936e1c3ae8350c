"""The ``make gpu-check`` harness: guard, test runner, summary, unpacking.

``make gpu-check`` runs on a GPU machine with the image's ``python3`` (no
installs, no network) and writes everything that must come back into one flat
folder ``OUT`` (``make gpu-check OUT=DIR``, default ``gpu-out``):

==================  ===========================================================
file                written by
==================  ===========================================================
pytest.log          ``tests``: the whole pytest output (every pass, see below)
junit.xml           ``tests``: every test's outcome, all passes merged
bench_status.json   ``bench.run --out``: per benchmark: ok, seconds, error text
bench_results.json  ``bench.run --out``: every benchmark record (JSON and Markdown)
environment.json    ``summary``: GPU, driver, CUDA and package versions, CPUs
summary.md          ``summary``: all of the above as one Markdown page
==================  ===========================================================

Six files at most, whatever the number of benchmark tables. The commands::

    python -m bench.gpu_check guard                  # one line and status 1 without a GPU
    python -m bench.gpu_check tests OUT [--timeout S] [--budget S] -- PYTEST_ARGS...
    python -m bench.gpu_check summary OUT [--probe]
    python -m bench.gpu_check unpack OUT/bench_results.json FOLDER

``tests`` runs pytest once and, when pytest-timeout is importable, with a
per-test limit (thread method: a test stuck inside a GPU kernel cannot be
interrupted, so the whole process is stopped after its stacks are printed). A
test that never reports (killed by the limit, or a crash) is recorded as failed
and pytest is started again without the tests already done, so one hang costs
one test, not the run. ``--budget`` bounds the whole run: when it is spent, pytest
is stopped and the files are written all the same. Its exit status is nonzero if any
test failed or errored, or did not report.

``summary`` probes the machine once per ``OUT`` (``environment.json``; ``--probe``
probes again) and reads whatever of the other files are there, so two halves
run as separate calls (tests, then benchmarks) can be summarised together by
copying both folders into one and running ``summary`` there.

``unpack`` writes the records of ``bench_results.json`` back out as
``<record>.json`` and ``<record>.md``, byte for byte what
:func:`bench._harness.record` writes, e.g. into ``bench/results/<gpu-name>/``.

The module is also a pytest plugin (``-p bench.gpu_check``, used by ``tests``):
it logs each test's start, outcome and end to ``$GPUML_PROGRESS``, deselects the
node ids listed in ``$GPUML_DESELECT`` and runs the tests under the path prefixes in
``$GPUML_RUN_LAST`` after the others.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

LOG, JUNIT, SUMMARY, ENVIRONMENT = "pytest.log", "junit.xml", "summary.md", "environment.json"
STATUS, RESULTS = "bench_status.json", "bench_results.json"
#: The repository root: ``-p bench.gpu_check`` must import from any working directory.
REPO = Path(__file__).resolve().parents[1]


# -- the GPU -------------------------------------------------------------------------------

def gpu_problems() -> list[str]:
    """Why this process has no usable GPU, or ``[]`` (CuPy and, where it imports, torch).

    Asks CuPy directly, as :func:`gpuml._backend.gpu_count` does, without importing gpuml
    (seconds of scikit-learn and numba imports): the guard must answer at once.
    """
    problems = []
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install raising at import
        problems.append(f"CuPy does not import: {type(e).__name__}: {e}".splitlines()[0])
    else:
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception:  # CUDARuntimeError without a driver or a device
            count = 0
        if count == 0:
            problems.append("CuPy sees none")
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and not torch.cuda.is_available():
        problems.append("torch.cuda.is_available() is False")
    return problems


def guard() -> int:
    problems = gpu_problems()
    if not problems:
        return 0
    print(f"gpu-check: no CUDA device answers ({', '.join(problems)}); "
          "use DRY_RUN=1 to exercise the harness on the CPU", file=sys.stderr)
    return 1


# -- the pytest plugin -----------------------------------------------------------------------

def pytest_runtest_logstart(nodeid, location):
    _progress({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    entry = {"event": "report", "nodeid": report.nodeid, "when": report.when,
             "outcome": report.outcome, "duration": report.duration}
    if report.outcome != "passed":
        text = report.longreprtext or ""
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            text = str(report.longrepr[2])  # (file, line, reason)
        if hasattr(report, "wasxfail"):
            text = "xfail: " + (report.wasxfail or text)
        entry["text"] = text[-8000:]
    _progress(entry)


def pytest_runtest_logfinish(nodeid, location):
    _progress({"event": "end", "nodeid": nodeid})


def _progress(entry: dict) -> None:
    path = os.environ.get("GPUML_PROGRESS")
    if path:
        with open(path, "a") as f:  # one line per event, closed at once: it must survive a kill
            f.write(json.dumps(entry) + "\n")


def pytest_collection_modifyitems(config, items):
    # Tests under the prefixes in $GPUML_RUN_LAST run after the others (kept in order): a
    # module that may hang then costs only its own tests when the time budget runs out.
    last = os.environ.get("GPUML_RUN_LAST", "").split()
    if last:
        items.sort(key=lambda item: any(item.nodeid.startswith(p) for p in last))
    path = os.environ.get("GPUML_DESELECT")
    if not path or not os.path.exists(path):
        return
    done = set(Path(path).read_text().splitlines())
    keep = [item for item in items if item.nodeid not in done]
    dropped = [item for item in items if item.nodeid in done]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


# -- tests -----------------------------------------------------------------------------------

def _tee(cmd: list[str], log, env: dict,
         limit: float | None = None) -> tuple[int, list[str], bool]:
    """Run ``cmd``, copying its output to ``log`` and stdout, killed after ``limit`` seconds;
    its status, last lines, and whether the limit killed it."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True, errors="replace", bufsize=1)
    fired = threading.Event()

    def stop():
        fired.set()
        proc.kill()

    timer = threading.Timer(max(limit, 0), stop) if limit is not None else None
    if timer:
        timer.start()
    tail: list[str] = []
    try:
        for line in proc.stdout:
            log.write(line)
            log.flush()
            sys.stdout.write(line)
            sys.stdout.flush()
            tail = (tail + [line.rstrip("\n")])[-60:]
        code = proc.wait()
    finally:
        if timer:
            timer.cancel()
    return code, tail, fired.is_set()


def _read_progress(path: Path) -> list[dict]:
    events = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by the kill
                pass
    return events


def run_tests(out: Path, pytest_args: list[str], timeout: float = 0, budget: float = 0,
              max_passes: int = 20) -> int:
    """Run pytest into ``out/pytest.log`` and ``out/junit.xml``, going on after a killed test.

    ``timeout``: per test (pytest-timeout, when importable). ``budget``: for the whole run;
    when it runs out, pytest is stopped and what finished is written, so that the files
    come back from a machine whose command limit would otherwise cut everything off.
    """
    deadline = time.monotonic() + budget if budget else None
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpuml-tests-"))
    deselect = work / "deselect.txt"
    deselect.touch()
    base = [sys.executable, "-m", "pytest", "-p", "bench.gpu_check", "-p", "no:cacheprovider",
            "-v", "-ra", "--durations=25"]
    notes = []
    if timeout and importlib.util.find_spec("pytest_timeout") is not None:
        base += [f"--timeout={timeout:g}", "--timeout-method=thread"]
        notes.append(f"per-test timeout {timeout:g} s (pytest-timeout, thread method)")
    elif timeout:
        notes.append("pytest-timeout is not installed: no per-test timeout")
    if budget:
        notes.append(f"time budget {budget:g} s for the whole run")
    suites, reported, killed, status = [], [], [], 0
    with open(out / LOG, "w") as log:
        for n in range(1, max_passes + 1):
            progress, junit = work / f"progress-{n}.txt", work / f"junit-{n}.xml"
            env = dict(os.environ, GPUML_PROGRESS=str(progress), GPUML_DESELECT=str(deselect),
                       PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                os.environ.get("PYTHONPATH")])))
            cmd = base + [f"--junitxml={junit}"] + pytest_args
            header = f"=== gpu-check tests, pass {n}: {shlex.join(cmd[1:])}"
            header += (f" ({'; '.join(notes)})" if notes else "") + "\n"
            log.write(header)
            sys.stdout.write(header)
            left = deadline - time.monotonic() if deadline else None
            code, tail, out_of_time = _tee(cmd, log, env, left)
            events = _read_progress(progress)
            started = [e["nodeid"] for e in events if e["event"] == "start"]
            finished = {e["nodeid"] for e in events if e["event"] == "end"}
            lost = [nodeid for nodeid in started if nodeid not in finished]
            if not lost:
                if junit.exists():
                    suites.append(junit)
                # the pass ended by itself; "no tests collected" after a restart is the end
                if not (n > 1 and code == 5):
                    status = code
                break
            # pytest never wrote its junit.xml: the outcomes come from the progress log
            reported += [e for e in events if e["event"] == "report"]
            killed += [(nodeid, code, tail, out_of_time) for nodeid in lost]
            with open(deselect, "a") as f:
                f.write("".join(nodeid + "\n" for nodeid in started))
            if out_of_time:
                msg = (f"=== gpu-check tests: the time budget of {budget:g} s ran out inside "
                       f"{lost}; the tests after it did not run\n")
            else:
                msg = (f"=== gpu-check tests: pass {n} ended (status {code}) inside {lost}; "
                       "recorded as failed, going on with the tests not yet run\n")
            log.write(msg)
            sys.stdout.write(msg)
            if out_of_time or (deadline and time.monotonic() >= deadline):
                status = status or 1
                break
        else:
            status = status or 1
    _merge_junit(suites, reported, killed, out / JUNIT, timeout, budget)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if killed and status == 0 else status


def _classname(nodeid: str) -> tuple[str, str]:
    """pytest's junit ``classname`` and ``name`` of a node id."""
    path, _, name = nodeid.partition("::")
    classname = path.removesuffix(".py").replace("/", ".")
    if "::" in name:
        cls, _, name = name.rpartition("::")
        classname += "." + cls.replace("::", ".")
    return classname, name


def _merge_junit(paths, reported, killed, target: Path, timeout: float,
                 budget: float = 0) -> None:
    """One junit.xml: pytest's own files, the outcomes of passes that were cut short (from
    the progress log), and a failure for each test that never reported."""
    root = ET.Element("testsuites")
    for path in paths:
        try:
            tree = ET.parse(path).getroot()
        except ET.ParseError:
            continue
        root.extend(tree.iter("testsuite") if tree.tag == "testsuites" else [tree])
    lost = {nodeid for nodeid, _, _, _ in killed}
    cases: dict[str, dict] = {}
    for e in reported:
        if e["nodeid"] in lost:
            continue
        case = cases.setdefault(e["nodeid"], {"time": 0.0, "outcome": "passed", "text": ""})
        case["time"] += e["duration"]
        if e["outcome"] == "failed":
            case["outcome"] = "failure" if e["when"] == "call" else "error"
            case["text"] = e.get("text", "")
        elif e["outcome"] == "skipped" and case["outcome"] == "passed":
            case["outcome"], case["text"] = "skipped", e.get("text", "")
    if cases or killed:
        suite = ET.SubElement(root, "testsuite", name="gpu-check: passes cut short")
        for nodeid, case in cases.items():
            classname, name = _classname(nodeid)
            el = ET.SubElement(suite, "testcase", classname=classname, name=name,
                               time=f"{case['time']:.3f}")
            if case["outcome"] != "passed":
                lines = case["text"].strip().splitlines()
                # pytest's "E   assert ..." line says most; else the last line
                first_e = [line[1:].strip() for line in lines if line.startswith("E ")][:1]
                message = (first_e or lines[-1:] or [case["outcome"]])[0][:500]
                child = ET.SubElement(el, case["outcome"], message=message)
                child.text = case["text"]
        why = (f"killed by the per-test timeout of {timeout:g} s, or crashed" if timeout
               else "crashed")
        for nodeid, code, tail, out_of_time in killed:
            classname, name = _classname(nodeid)
            el = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0")
            if out_of_time:
                message = (f"no result: the run's time budget of {budget:g} s ran out during "
                           "this test, and the tests after it did not run")
            else:
                message = (f"no result: the test process died during this test ({why}; pytest "
                           f"exit status {code}); the output's tail follows, all of it is in "
                           "pytest.log")
            failure = ET.SubElement(el, "failure", message=message)
            failure.text = "\n".join(tail)
    ET.ElementTree(root).write(target, encoding="utf-8", xml_declaration=True)


def read_junit(path: Path) -> dict:
    """Tally, failures, skip reasons and durations of a junit.xml."""
    root = ET.parse(path).getroot()
    cases = []
    for case in root.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        module = classname
        outcome, message, text = "passed", "", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = child.get("message", "") or ""
                text = child.text or ""
                break
        cases.append({"id": f"{module}::{name}", "outcome": outcome, "message": message,
                      "text": text, "time": float(case.get("time", 0) or 0)})
    tally = {k: sum(c["outcome"] == k for c in cases)
             for k in ("passed", "failed", "error", "skipped")}
    return {"cases": cases, "tally": tally, "total": len(cases),
            "seconds": sum(c["time"] for c in cases)}


# -- the environment -------------------------------------------------------------------------

def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def probe_environment() -> dict:
    """The machine the numbers come from: GPU, driver, CUDA, packages, CPUs."""
    env: dict = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "python": sys.version.split()[0],
                 "platform": platform.platform(), "cpu_count": os.cpu_count()}
    try:
        env["cpu_affinity"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                env["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                env["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    cupy_dists = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                        if (d.metadata["Name"] or "").lower().startswith("cupy"))
    packages = {name: _version(name) for name in cupy_dists}
    for name in ("torch", "triton", "numba", "numpy", "scipy", "scikit-learn", "joblib",
                 "pandas", "pyarrow", "pytest", "pytest-timeout"):
        packages[name] = _version(name)
    env["packages"] = packages
    if shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
            env["nvidia_smi"] = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
            if smi.stdout.strip():
                env["driver"] = smi.stdout.splitlines()[0].split(",")[1].strip()
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    try:
        import cupy as cp

        env["cuda_runtime"] = _cuda_version(cp.cuda.runtime.runtimeGetVersion())
        env["cuda_driver_api"] = _cuda_version(cp.cuda.runtime.driverGetVersion())
        gpus = []
        for i in range(cp.cuda.runtime.getDeviceCount()):
            p = cp.cuda.runtime.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            gpus.append({"name": name, "compute_capability": f"{p['major']}.{p['minor']}",
                         "sms": p["multiProcessorCount"],
                         "memory_gib": round(p["totalGlobalMem"] / 2**30, 1)})
        env["gpus"] = gpus
    except Exception as e:  # no CuPy, no driver, no device
        env["cupy_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    try:
        import torch

        env["torch_cuda"] = torch.version.cuda
        env["torch_cuda_available"] = torch.cuda.is_available()
    except Exception as e:
        env["torch_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    return env


def environment(out: Path, probe: bool = False) -> dict:
    """``out/environment.json``, probed and written first when missing (or ``probe``)."""
    path = out / ENVIRONMENT
    if path.exists() and not probe:
        return json.loads(path.read_text())
    env = probe_environment()
    path.write_text(json.dumps(env, indent=1))
    return env


def gpu_folder_name(env: dict) -> str:
    """``bench/results/<this>/``: the GPU's name as :func:`bench._harness.machine_name` says it."""
    gpus = env.get("gpus") or []
    if not gpus:
        return f"cpu-{env.get('cpu_count')}core"
    return gpus[0]["name"].lower().replace("nvidia ", "").replace(" ", "-")


# -- the summary -----------------------------------------------------------------------------

def _cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _machine_section(env: dict) -> list[str]:
    gpus = env.get("gpus") or []
    gpu = "; ".join(f"{g['name']} (sm_{g['compute_capability'].replace('.', '')}, "
                    f"{g['sms']} SMs, {g['memory_gib']} GiB)" for g in gpus)
    if not gpu:
        gpu = "none (" + (env.get("cupy_error") or "CuPy sees no device") + ")"
    rows = [
        ("GPU", gpu),
        ("Driver", f"{env.get('driver', '?')} (CUDA driver API {env.get('cuda_driver_api', '?')})"),
        ("CUDA runtime (CuPy)", env.get("cuda_runtime", "?")),
        ("torch CUDA", f"{env.get('torch_cuda')} (available: {env.get('torch_cuda_available')})"),
        ("CPU", f"{env.get('cpu_model', '?')}: {env.get('cpu_count')} CPUs "
                f"({env.get('cpu_affinity', '?')} usable), {env.get('memory_gib', '?')} GiB"),
        ("Python", f"{env.get('python')} on {env.get('platform')}"),
        ("Packages", ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items()
                               if v is not None)),
        ("Probed", env.get("time", "?")),
    ]
    lines = ["## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in rows]
    return lines + [""]


def _tests_section(out: Path) -> list[str]:
    lines = ["## Tests", ""]
    if not (out / JUNIT).exists():
        what = "pytest.log is there but no junit.xml" if (out / LOG).exists() else "not run"
        return lines + [f"No test results in this folder ({what}).", ""]
    report = read_junit(out / JUNIT)
    t = report["tally"]
    lines.append(f"**{report['total']} test(s): {t['passed']} passed, {t['failed']} failed, "
                 f"{t['error']} errors, {t['skipped']} skipped** "
                 f"({report['seconds']:.0f} s in tests; log: `{LOG}`, results: `{JUNIT}`).")
    lines.append("")
    bad = [c for c in report["cases"] if c["outcome"] in ("failed", "error")]
    if bad:
        lines += ["### Failures", ""]
        for c in bad:
            msg = (c["message"] or c["text"]).strip().splitlines()
            lines.append(f"- `{c['id']}` ({c['outcome']}): {_cell(msg[0][:300]) if msg else ''}")
        lines.append("")
        for c in bad:
            if c["text"].strip():
                body = "\n".join(c["text"].strip().splitlines()[-40:])
                lines += [f"<details><summary><code>{c['id']}</code></summary>", "", "```",
                          body, "```", "", "</details>", ""]
    skipped: dict[str, int] = {}
    for c in report["cases"]:
        if c["outcome"] == "skipped":
            reason = (c["message"] or "?").strip().splitlines()[0][:200]
            skipped[reason] = skipped.get(reason, 0) + 1
    if skipped:
        lines += ["### Skipped, by reason", ""]
        lines += [f"- {n} x {_cell(r)}" for r, n in sorted(skipped.items(), key=lambda x: -x[1])]
        lines.append("")
    slow = sorted(report["cases"], key=lambda c: -c["time"])[:10]
    if slow and slow[0]["time"] >= 0.01:
        lines += ["### Slowest", "", "| test | seconds |", "|---|---|"]
        lines += [f"| `{c['id']}` | {c['time']:.2f} |" for c in slow]
        lines.append("")
    return lines


def _demote(md: str) -> str:
    """Markdown headings two levels down, to sit under the summary's own."""
    return "\n".join("##" + line if line.startswith("#") else line for line in md.splitlines())


def _bench_section(out: Path) -> list[str]:
    lines = ["## Benchmarks", ""]
    if not (out / STATUS).exists():
        return lines + ["No benchmark results in this folder (not run).", ""]
    status = json.loads((out / STATUS).read_text())
    results = json.loads((out / RESULTS).read_text()) if (out / RESULTS).exists() else {}
    records = results.get("records", [])
    lines += [f"Command: `{status.get('command')}` ({status.get('time')}).", "",
              "| benchmark | quick | ok | seconds | tables | error |", "|---|---|---|---|---|---|"]
    for b in status["benchmarks"]:
        lines.append(f"| {b['name']} | {b['quick']} | {'yes' if b['ok'] else '**FAILED**'} | "
                     f"{b['seconds']:.1f} | {', '.join(b.get('records', []))} | "
                     f"{_cell((b.get('error') or '')[:300])} |")
    lines.append("")
    for b in status["benchmarks"]:
        for r in records:
            if r["benchmark"] == b["name"] and r["name"] in b.get("records", []):
                lines += [_demote(r["md"]).rstrip(), ""]
    return lines


def write_summary(out: Path, probe: bool = False) -> Path:
    env = environment(out, probe)
    lines = ["# gpu-check", "",
             f"Folder `{out}`; results belong in `bench/results/{gpu_folder_name(env)}/` "
             "(`python -m bench.gpu_check unpack`).", ""]
    lines += _machine_section(env) + _tests_section(out) + _bench_section(out)
    path = out / SUMMARY
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


# -- unpack ----------------------------------------------------------------------------------

def unpack(results: Path, folder: Path) -> list[Path]:
    """Write each record of ``bench_results.json`` as ``<name>.json`` and ``<name>.md``."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for r in json.loads(results.read_text())["records"]:
        # the same serialisation as bench._harness.record
        (folder / f"{r['name']}.json").write_text(json.dumps(r["json"], indent=1, default=float))
        (folder / f"{r['name']}.md").write_text(r["md"])
        written += [folder / f"{r['name']}.json", folder / f"{r['name']}.md"]
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("guard", help="one line and status 1 unless CuPy and torch see a GPU")
    t = sub.add_parser("tests", help="pytest into OUT/pytest.log and OUT/junit.xml")
    t.add_argument("out", type=Path)
    t.add_argument("--timeout", type=float, default=0,
                   help="per-test limit in seconds (needs pytest-timeout; 0: none)")
    t.add_argument("--budget", type=float, default=0,
                   help="limit for the whole run in seconds (0: none)")
    t.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    s = sub.add_parser("summary", help="OUT/summary.md from the files in OUT")
    s.add_argument("out", type=Path)
    s.add_argument("--probe", action="store_true", help="probe the machine even if "
                   "OUT/environment.json exists")
    u = sub.add_parser("unpack", help="bench_results.json -> <record>.json/.md files")
    u.add_argument("results", type=Path)
    u.add_argument("folder", type=Path)
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after "--" is pytest's, options included
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.command == "guard":
        return guard()
    if args.command == "tests":
        return run_tests(args.out, args.pytest_args + extra, args.timeout, args.budget)
    if args.command == "summary":
        args.out.mkdir(parents=True, exist_ok=True)
        path = write_summary(args.out, args.probe)
        print(f"gpu-check: summary in {path}; files in {args.out}: "
              + ", ".join(sorted(p.name for p in args.out.iterdir())))
        return 0
    for path in unpack(args.results, args.folder):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
