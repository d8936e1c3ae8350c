"""torch.optim's conventions, LAMB and LARS side by side with torch.optim.AdamW.

Each test does the same thing to AdamW and to gpuml's optimizers and expects the same kind of
outcome: what a user swapping ``AdamW`` for ``LAMB`` relies on.
"""

import ast
from pathlib import Path

import pytest
import torch

from gpuml.optim import LAMB, LARS

OPTIM = Path(__file__).resolve().parents[2] / "gpuml" / "optim"
OPTIMIZERS = {"AdamW": lambda ps, **kw: torch.optim.AdamW(ps, **kw),
              "LAMB": lambda ps, **kw: LAMB(ps, **kw),
              "LARS": lambda ps, **kw: LARS(ps, **kw)}


def _imports(path: Path) -> set[str]:
    """The gpuml modules ``path`` imports at module level (not inside functions)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("gpuml")}


def test_common_and_triton_do_not_import_each_other():
    """``_triton`` (the fused kernels) takes its helpers from ``_layout``; only ``_common``
    reaches ``_triton``, and only inside the functions of the fused path."""
    triton_imports = _imports(OPTIM / "_triton.py")
    assert not any("_common" in m for m in triton_imports), triton_imports
    assert not any("_triton" in m for m in _imports(OPTIM / "_common.py"))
    assert not any("_common" in m or "_triton" in m for m in _imports(OPTIM / "_layout.py"))
