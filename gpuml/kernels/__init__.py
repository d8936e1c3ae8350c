"""Everything hardware-specific in gpuml lives in this package.

Estimators and partitioners call the functions exported here; each takes
arrays of either namespace (NumPy or CuPy) and dispatches to the numba loop
in ``_cpu`` or the CUDA code in ``_cuda``. Nothing outside this package
branches on the device.
"""

from __future__ import annotations

import numpy as np

from .._backend import is_cupy_array, to_numpy
from .krr import (
    NotPositiveDefiniteError,
    available_bytes,
    cholesky_solve_batch,
    eigh_batch,
    gram_batch,
    krr_solve_parts,
)
from .pairwise import (
    KERNELS,
    Kernel,
    kernel_matrix,
    make_kernel,
    resolve_gamma,
    sq_distances,
    squared_norms,
)

__all__ = [
    "KERNELS",
    "NotPositiveDefiniteError",
    "available_bytes",
    "cholesky_solve_batch",
    "eigh_batch",
    "gram_batch",
    "krr_solve_parts",
    "Kernel",
    "fill_nearest_open",
    "kernel_matrix",
    "make_kernel",
    "resolve_gamma",
    "sq_distances",
    "squared_norms",
]


def fill_nearest_open(D, counts, caps):
    """Assign each row of the distance block ``D`` to its nearest part with room left.

    A sequential greedy pass (seed 001, Alg 3 and 9): the order of rows
    matters, so it runs as one numba loop on the host; a device block is
    copied over once. ``counts`` (host int64) is updated in place. Returns the
    labels in ``D``'s namespace.
    """
    from ._cpu.partition import fill_nearest_open as _fill

    host = np.ascontiguousarray(to_numpy(D))
    labels = np.empty(host.shape[0], dtype=np.int64)
    _fill(host, counts, caps, labels)
    if is_cupy_array(D):
        import cupy

        return cupy.asarray(labels)
    return labels
