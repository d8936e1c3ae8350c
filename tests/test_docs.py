"""Every Python code block in README.md and docs/*.md runs, as a reader would paste it; the
README stays a front page, every relative link resolves, every benchmark a page names is
registered, and the API reference covers every public name.

The blocks of one file run in order in one namespace (a later block may use what an
earlier one defined), in a temporary working directory. A block that cannot run here
(it needs a GPU, or several processes under ``torchrun``) is preceded by a marker line
that says so and why::

    <!-- docs-test: skip (needs a GPU: device="cuda") -->

A marker without a reason in parentheses is an error, and so is a marker that is not
followed by a Python block. Skipped blocks are still compiled, so a syntax error in one
fails too. A block that imports an optional dependency that is not installed skips,
naming it.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Optional dependencies (the extras in pyproject.toml): a block that needs one that is not
#: installed skips, saying which; any other missing module fails.
OPTIONAL = {"torch", "triton", "dask", "distributed", "cupy", "tqdm", "matplotlib"}
MARKER = re.compile(r"^<!--\s*docs-test:\s*skip\s*(?:\((?P<reason>[^)]+)\))?\s*-->\s*$")


def blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """``(first line, code, skip reason or None)`` of each ```python block of a file."""
    out, lines = [], path.read_text().splitlines()
    k, pending = 0, None
    while k < len(lines):
        line = lines[k]
        marker = MARKER.match(line.strip())
        if marker:
            if not marker.group("reason"):
                raise AssertionError(f"{path.name}:{k + 1}: a skip marker needs its reason, "
                                     "as <!-- docs-test: skip (why) -->")
            pending = (k + 1, marker.group("reason").strip())
        elif line.strip().startswith("```python"):
            start, body = k + 1, []
            k += 1
            while not lines[k].strip().startswith("```"):
                body.append(lines[k])
                k += 1
            out.append((start + 1, "\n".join(body) + "\n", pending[1] if pending else None))
            pending = None
        elif line.strip() and pending is not None:
            raise AssertionError(f"{path.name}:{pending[0]}: a skip marker must come right "
                                 "before a ```python block")
        k += 1
    return out


def test_markers_need_a_reason_and_a_block(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("<!-- docs-test: skip -->\n```python\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="needs its reason"):
        blocks(doc)
    doc.write_text("<!-- docs-test: skip (needs a GPU) -->\ntext\n```python\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="right before"):
        blocks(doc)
    doc.write_text("<!-- docs-test: skip (needs a GPU) -->\n```python\nx = 1\n```\n"
                   "```python\ny = 2\n```\n")
    assert [(c, r) for _, c, r in blocks(doc)] == [("x = 1\n", "needs a GPU"), ("y = 2\n", None)]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_python_blocks_run(path, tmp_path, monkeypatch):
    found = blocks(path)
    if not found:
        pytest.skip(f"{path.name} has no Python blocks")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{path.stem}"}
    for line, code, reason in found:
        compiled = compile(code, f"{path.name}:{line}", "exec")
        if reason is None:
            try:
                exec(compiled, namespace)
            except ModuleNotFoundError as err:
                missing = (err.name or "").partition(".")[0]
                if missing not in OPTIONAL or importlib.util.find_spec(missing) is not None:
                    raise
                pytest.skip(f"{path.name}:{line} needs {missing} (an optional dependency), "
                            "which is not installed here")


def _modules() -> list[str]:
    import pkgutil

    import gpuml

    return sorted(m.name for m in pkgutil.walk_packages(gpuml.__path__, "gpuml."))


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name):
    """Every ``>>>`` example in the package's docstrings gives the output it shows."""
    import doctest
    import warnings

    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:
        missing = (err.name or "").partition(".")[0]
        if missing not in OPTIONAL or importlib.util.find_spec(missing) is not None:
            raise
        pytest.skip(f"{name} needs {missing} (an optional dependency), not installed here")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS
                                 | doctest.NORMALIZE_WHITESPACE, report=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"


# ---- the front page, the links and the benchmark names the docs give --------------------

#: The pages a reader follows links from: the README, the docs, and the benchmark notes.
RESULTS = ROOT / "bench" / "results"
LINKED = [*FILES, ROOT / "bench" / "README.md", RESULTS / "README.md",
          *sorted(RESULTS.glob("*/README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
BENCH_RUN = re.compile(r"bench\.run((?:\s+[a-z_]+(?::(?:quick|full))?)+)")
STUDY = re.compile(r"bench\.studies\.([a-z_]+)")


def test_readme_is_a_front_page():
    """Under 200 lines, with at most five headline claims (the bullets of "Measured")."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    measured = text.split("\n## Measured\n", 1)[1].split("\n## ", 1)[0]
    claims = [line for line in measured.splitlines() if line.startswith("- ")]
    assert 1 <= len(claims) <= 5, claims
    assert all("](bench/results/" in line for line in claims), "each claim links its table"


@pytest.mark.parametrize("path", LINKED, ids=[str(p.relative_to(ROOT)) for p in LINKED])
def test_relative_links_resolve(path):
    """Every relative link (a file, optionally with an anchor) names a file that exists."""
    missing = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.partition("#")[0]).exists():
            missing.append(target)
    assert not missing, f"{path.relative_to(ROOT)}: links to missing files {missing}"


def test_named_benchmarks_are_registered():
    """Every ``python -m bench.run NAME`` that a page or the Makefile names is in the registry,
    every registered name has its ``bench/bench_<name>.py`` and every such file is
    registered; every ``bench.studies.NAME`` is a module there."""
    from bench.run import BENCHMARKS

    files = {p.stem.removeprefix("bench_") for p in (ROOT / "bench").glob("bench_*.py")}
    assert files == set(BENCHMARKS), "bench/bench_*.py and bench.run.BENCHMARKS differ"
    makefile = (ROOT / "Makefile").read_text()
    gpu_bench = re.search(r"^GPU_BENCH \?= (.+)$", makefile, re.M).group(1)
    named = {spec.partition(":")[0] for spec in gpu_bench.split()}
    studies = set()
    for path in LINKED:
        text = path.read_text()
        for group in BENCH_RUN.findall(text):
            named.update(spec.partition(":")[0] for spec in group.split())
        studies.update(STUDY.findall(text))
    assert named - set(BENCHMARKS) == set(), "named but not registered"
    assert {s for s in studies if not (ROOT / "bench" / "studies" / f"{s}.py").exists()} == set()


#: The API reference's pages, by the module whose ``__all__`` each must cover.
API_PAGES = {"gpuml": "estimators", "gpuml.optim": "optim", "gpuml.optim.schedules": "optim",
             "gpuml.training": "training", "gpuml.partition": "partition",
             "gpuml.distributed": "distributed", "gpuml.kernels": "kernels"}


@pytest.mark.parametrize("module", API_PAGES)
def test_api_reference_covers_all(module):
    """Every public name (``__all__``) has an entry on its API reference page."""
    try:
        names = importlib.import_module(module).__all__
    except ModuleNotFoundError as err:
        pytest.skip(f"{module} needs {err.name} (an optional dependency), not installed here")
    page = (ROOT / "docs" / "api" / f"{API_PAGES[module]}.rst").read_text()
    entry = re.compile(r"^\.\. (?:auto)?(?:class|function|exception|data):: (\S+)", re.M)
    documented = {name.rpartition(".")[2] for name in entry.findall(page)}
    assert sorted(set(names) - documented) == []
