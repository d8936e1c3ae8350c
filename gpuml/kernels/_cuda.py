"""The one place CUDA sources are compiled: CuPy RawModule, memoized per device.

Every solver's CUDA C lives beside its host code, in its concept's package:
``<name>.cu`` in ``gpuml/kernels/<name>/`` (``smo/smo.cu``, ``gcd/gcd.cu``),
shipped as package data. Conventions for every ``*.cu`` file:

* kernels are templates over the float type, instantiated at load time by
  ``name_expressions`` (e.g. ``"smo_solve<double>"``);
* the source is prefixed with a ``#line`` directive so NVRTC errors name the
  real file and line;
* under ``#ifdef GPUML_NVCC_CHECK`` each file instantiates its templates for
  ``float`` and ``double``, so ``nvcc -DGPUML_NVCC_CHECK`` (run by the test
  suite for sm_80 and sm_90 wherever nvcc exists) checks every kernel body,
  even on machines without a GPU.
"""

from __future__ import annotations

import functools
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent


def sources() -> list[Path]:
    """Every CUDA source shipped with gpuml."""
    return sorted(SOURCE_DIR.glob("*/*.cu"))


def source_path(name: str) -> Path:
    """The CUDA source ``<name>.cu``, in its concept's package ``gpuml/kernels/<name>/``."""
    return SOURCE_DIR / name / f"{name}.cu"


def template_name(kernel: str, dtype) -> str:
    """``"kernel<float>"`` or ``"kernel<double>"`` for a NumPy/CuPy dtype."""
    import numpy as np

    ctype = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}[np.dtype(dtype)]
    return f"{kernel}<{ctype}>"


@functools.cache
def load_module(name: str, device_id: int, name_expressions: tuple[str, ...] = (),
                cooperative: bool = False):
    """Compile ``<name>.cu`` for GPU ``device_id`` (once per process and device).

    ``cooperative=True`` launches the module's kernels with
    ``cuLaunchCooperativeKernel`` (needed for ``grid.sync()``; the grid must
    then fit on the device at once).
    """
    import cupy

    path = source_path(name)
    code = f'#line 1 "{path}"\n' + path.read_text()
    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=code, options=("-std=c++17",),
                                name_expressions=name_expressions,
                                enable_cooperative_groups=cooperative)
        module.compile()
    return module


def get_kernel(name: str, kernel: str, dtype, device_id: int, all_kernels: tuple[str, ...] = (),
               cooperative: bool = False):
    """The compiled template instance ``kernel<dtype>`` from ``<name>.cu``.

    ``all_kernels`` lists every kernel of the file, so the module is compiled
    once with all of its instances for that dtype.
    """
    wanted = tuple(template_name(k, dtype) for k in (all_kernels or (kernel,)))
    module = load_module(name, device_id, wanted, cooperative)
    return module.get_function(template_name(kernel, dtype))
