"""The ``make gpu-check`` harness, exercised on the CPU so that it cannot rot between the
rare runs on a GPU machine: the no-GPU guard, the dry run's out folder, the test runner
that goes on after a killed test, the benchmark guard and the unpacking of results."""

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench import _harness, gpu_check
from bench import run as bench_run

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
needs_make = pytest.mark.skipif(MAKE is None, reason="make is not installed")

SAMPLE_TESTS = '''
import pytest

def test_passes():
    assert 1 + 1 == 2

def test_fails():
    assert 1 + 1 == 3

def test_skips():
    pytest.skip("nothing to do here")
'''


def _has_gpu() -> bool:
    return not gpu_check.gpu_problems()


def _make(*args):
    # Not the settings of a make this suite may run under (`make test`): MAKEFLAGS would
    # carry its command-line variables into ours.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run([MAKE, "--no-print-directory", *args, f"PYTHON={sys.executable}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_guard_is_one_line_without_gpu(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "gpu_problems",
                        lambda: ["CuPy sees none", "torch.cuda.is_available() is False"])
    assert gpu_check.guard() == 1
    err = capsys.readouterr().err
    assert err == ("gpu-check: no CUDA device answers (CuPy sees none, torch.cuda.is_available()"
                   " is False); use DRY_RUN=1 to exercise the harness on the CPU\n")
    monkeypatch.setattr(gpu_check, "gpu_problems", lambda: [])
    assert gpu_check.guard() == 0 and capsys.readouterr().err == ""


def test_gpu_problems_here():
    problems = gpu_check.gpu_problems()
    from gpuml._backend import cuda_available

    assert ("CuPy sees none" in problems or any("CuPy does not import" in p for p in problems)) \
        == (not cuda_available())


@needs_make
def test_make_wiring():
    """What gpu-check runs, without running it (make -n): the guard first, the GPU tests
    required, the benchmarks on the GPU; the dry run without the guard, the requirement
    and --gpu."""
    real = _make("-n", "gpu-check").stdout.splitlines()
    assert "bench.gpu_check guard" in real[0]
    assert any("GPUML_REQUIRE_GPU=1" in line and 'bench.gpu_check tests gpu-out' in line
               and 'GPUML_RUN_LAST="tests/test_gcd_gpu.py"' in line for line in real)
    assert any('-m "gpu or cuda_also" tests' in line for line in real)
    assert any("bench.run gpu gpu_scale kernels:quick partition:quick optim:quick --gpu "
               "--out gpu-out" in line for line in real)
    # one call within GPU_BUDGET: the tests get TEST_SHARE of it, the benchmarks the rest
    assert any("--budget 240" in line for line in real)
    assert any("left=$(( 470 - $(date +%s) + start ))" in line for line in real)
    assert any("gpu-check-bench GPU_GUARD= BENCH_BUDGET=$left" in line for line in real)
    assert sum("bench.gpu_check summary gpu-out" in line for line in real) == 2
    dry = "\n".join(_make("-n", "gpu-check", "DRY_RUN=1").stdout.splitlines())
    assert "guard" not in dry and "GPUML_REQUIRE_GPU" not in dry and "--gpu" not in dry
    assert "--quick --out gpu-out" in dry


def test_required_gpu_missing_stops_the_session(monkeypatch, pytestconfig):
    """tests/conftest.py with GPUML_REQUIRE_GPU=1: no device is a failed session."""
    # Several folders have a conftest.py: find the root one among pytest's plugins.
    root = str(ROOT / "tests" / "conftest.py")
    conftest, = [p for p in pytestconfig.pluginmanager.get_plugins()
                 if getattr(p, "__file__", None) == root]
    monkeypatch.setattr(gpu_check, "gpu_problems", lambda: ["CuPy sees none"])
    monkeypatch.setenv("GPUML_REQUIRE_GPU", "1")
    with pytest.raises(pytest.exit.Exception, match="no CUDA device answers: CuPy sees none") \
            as stop:
        conftest.pytest_sessionstart(session=None)
    assert stop.value.returncode != 0
    monkeypatch.setenv("GPUML_REQUIRE_GPU", "0")
    conftest.pytest_sessionstart(session=None)  # not required: nothing happens


@needs_make
def test_dry_run_writes_the_out_folder(tmp_path):
    (tmp_path / "sample").mkdir()
    (tmp_path / "sample" / "test_sample.py").write_text(SAMPLE_TESTS)
    out = tmp_path / "out"
    proc = _make("gpu-check", "DRY_RUN=1", f"OUT={out}", f"GPU_TESTS={tmp_path / 'sample'}",
                 "GPU_MARKERS=not nothing", "GPU_BENCH=tests/_bench_probe.py:quick nosuch")
    # a failing test and an unknown benchmark: both halves ran to the end and said so
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "bench_results.json", "bench_status.json", "environment.json", "junit.xml",
        "pytest.log", "summary.md"]
    report = gpu_check.read_junit(out / "junit.xml")
    assert report["tally"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}
    status = json.loads((out / "bench_status.json").read_text())["benchmarks"]
    assert [(b["name"], b["ok"]) for b in status] == [("tests/_bench_probe.py", True),
                                                       ("nosuch", False)]
    assert status[0]["records"] == ["probe_a", "probe_b"] and "nosuch" in status[1]["error"]
    summary = (out / "summary.md").read_text()
    for text in ("## Machine", "3 test(s): 1 passed, 1 failed", "test_sample::test_fails",
                 "| nosuch | True | **FAILED** |", "### Probe A", "| 1 |\n| 2 |"):
        assert text in summary, text
    assert summary.index("## Tests") < summary.index("## Benchmarks")


def test_runner_goes_on_after_a_killed_test(tmp_path):
    (tmp_path / "test_dies.py").write_text(SAMPLE_TESTS + '''
import os

def test_dies():
    os._exit(7)

def test_after_the_death():
    pass
''')
    out = tmp_path / "out"
    code = gpu_check.run_tests(out, [str(tmp_path / "test_dies.py")])
    assert code == 1
    report = gpu_check.read_junit(out / "junit.xml")
    outcomes = {c["id"].split("::")[-1]: c["outcome"] for c in report["cases"]}
    assert outcomes == {"test_passes": "passed", "test_fails": "failed",
                        "test_skips": "skipped", "test_dies": "failed",
                        "test_after_the_death": "passed"}
    died = next(c for c in report["cases"] if c["id"].endswith("test_dies"))
    assert "no result" in died["message"] and "status 7" in died["message"]
    assert "pass 2" in (out / "pytest.log").read_text()
    ET.parse(out / "junit.xml")  # well-formed


def test_bench_guard_gathers_and_unpacks(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUML_BENCH_OUT", raising=False)
    monkeypatch.setenv("GPUML_PROBE", "fail")
    out = tmp_path / "out"
    probe = str(ROOT / "tests" / "_bench_probe.py")
    code = bench_run.main([probe, f"{probe}:quick", "--out", str(out)])
    assert code == 1  # both failed after their first table, and the run went on
    status = json.loads((out / "bench_status.json").read_text())["benchmarks"]
    assert [(b["quick"], b["ok"], b["records"]) for b in status] == [
        (False, False, ["probe_a"]), (True, False, ["probe_a"])]
    assert "the probe failed on purpose" in status[0]["error"]
    assert "GPUML_BENCH_OUT" not in os.environ
    # unpack gives back what record() writes, byte for byte
    monkeypatch.delenv("GPUML_PROBE")
    direct = tmp_path / "direct"
    monkeypatch.setenv("GPUML_BENCH_OUT", str(direct))
    _harness.COMMAND = f"python -m bench.run {probe} --quick"
    try:
        _harness.record("probe_a", [{"quick": True, "gpu": False, "value": 1.5}],
                        title="Probe A")
    finally:
        _harness.COMMAND = None
    unpacked = tmp_path / "unpacked"
    gpu_check.unpack(out / "bench_results.json", unpacked)
    assert (unpacked / "probe_a.md").read_text() == (direct / "probe_a.md").read_text()
    got = json.loads((unpacked / "probe_a.json").read_text())
    want = json.loads((direct / "probe_a.json").read_text())
    assert got["rows"] == want["rows"] and got["meta"]["command"] == want["meta"]["command"]


def test_bench_timeout_and_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUML_PROBE", "hang")
    out = tmp_path / "out"
    probe = str(ROOT / "tests" / "_bench_probe.py")
    code = bench_run.main([f"{probe}:quick", probe, "--out", str(out), "--timeout", "60",
                           "--budget", "3"])
    assert code == 1
    hung, late = json.loads((out / "bench_status.json").read_text())["benchmarks"]
    assert hung["error"].startswith("TimeoutError") and hung["records"] == ["probe_a"]
    assert hung["seconds"] < 30
    assert late["error"].startswith("not run: the time budget") and late["records"] == []


def test_runner_budget_stops_and_writes(tmp_path):
    (tmp_path / "test_slow.py").write_text(
        "import time\n\ndef test_a():\n    pass\n\ndef test_slow():\n    time.sleep(120)\n"
        "\ndef test_b():\n    pass\n")
    out = tmp_path / "out"
    assert gpu_check.run_tests(out, [str(tmp_path / "test_slow.py")], budget=5) == 1
    report = gpu_check.read_junit(out / "junit.xml")
    assert [(c["id"].split("::")[-1], c["outcome"]) for c in report["cases"]] == [
        ("test_a", "passed"), ("test_slow", "failed")]
    assert "time budget of 5 s ran out" in report["cases"][1]["message"]
