"""Layout and environment checks shared by the optimizers and the fused kernels.

Kept apart from :mod:`gpuml.optim._common` (what the implementations share) so that
:mod:`gpuml.optim._triton` can use them without importing ``_common``, which itself imports
``_triton`` (lazily) for the fused path: the dependency runs one way only.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def dense_layout(*tensors: Tensor | None) -> bool:
    """True when the tensors share one dense memory layout (the fused kernels walk memory)."""
    ts = [t for t in tensors if t is not None]
    first = ts[0]
    dense = first.is_contiguous() or (first.ndim == 4 and first.is_contiguous(
        memory_format=torch.channels_last)) or (first.ndim == 5 and first.is_contiguous(
            memory_format=torch.channels_last_3d))
    return dense and all(t.shape == first.shape and t.stride() == first.stride() for t in ts)
