"""Large-batch optimizers for PyTorch: LAMB, LARS (loop / foreach / fused Triton) and schedules.

``from gpuml.optim import FusedLAMB`` drops into an existing training loop.
Importing :mod:`gpuml` does not import torch; importing :mod:`gpuml.optim` does
(Triton is imported only when the fused path runs).
"""

try:
    import torch  # noqa: F401
except ModuleNotFoundError as e:  # say what to do, not just which module is missing
    if e.name != "torch":
        raise
    raise ImportError("gpuml.optim needs PyTorch, which is not installed: install it with "
                      "`pip install torch` (https://pytorch.org lists the build for your "
                      "CUDA version); the rest of gpuml works without it") from e

from gpuml.optim._numba import compile_all as compile_cpu_kernels
from gpuml.optim._optimizer import param_groups_by_name
from gpuml.optim.lamb import LAMB, FusedLAMB, lamb
from gpuml.optim.lars import LARS, FusedLARS, lars
from gpuml.optim.schedules import (
    GoyalWarmupStepDecay,
    LEGWPolynomialDecay,
    RollerCoasterDecay,
    WarmupPolynomialDecay,
    legw_warmup_steps,
    scale_lr,
)

__all__ = [
    "LAMB",
    "LARS",
    "FusedLAMB",
    "FusedLARS",
    "lamb",
    "lars",
    "param_groups_by_name",
    "compile_cpu_kernels",
    "WarmupPolynomialDecay",
    "LEGWPolynomialDecay",
    "RollerCoasterDecay",
    "GoyalWarmupStepDecay",
    "legw_warmup_steps",
    "scale_lr",
]
