"""Every Python code block in README.md and docs/*.md runs, as a reader would paste it.

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
