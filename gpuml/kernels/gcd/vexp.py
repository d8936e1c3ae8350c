"""A vectorisable ``exp`` for non-positive arguments (the RBF kernel's range).

``math.exp`` in a numba loop is a libm call per element, which blocks SIMD:
for an RBF kernel column of data with few features it costs more than the
inner products. :func:`exp_nonpositive` is Cody–Waite range reduction plus a
degree-13 Taylor polynomial, with the ``2^k`` scale built from the exponent
bits in a second pass, so both loops vectorise (a column's cost with either:
bench/results/cpu-2core/asygcd-runs.md). Error: within two ulps of ``math.exp``
for ``x >= -708`` (``tests/test_gcd_solver.py`` checks it); below that (true
values under 3.3e-308) it returns 0.
"""

import math

import numpy as np
from numba import njit

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
#: Smallest argument with a normal result; below it the result is 0.
XMIN = -708.0


@njit(nogil=True, cache=True, fastmath={"contract"}, _nrt=False)
def exp_nonpositive(x, out, scratch):
    """``out[j] = exp(x[j])`` for ``x[j] <= 0``.

    Give ``out`` distinct from ``x``: LLVM's runtime overlap check sends an
    in-place call down the scalar loop (still correct, not vectorised).

    ``scratch`` is an int64 array at least as long as ``x``, overwritten.
    """
    n = x.shape[0]
    for j in range(n):
        xj = x[j]
        v = max(xj, XMIN)
        k = math.floor(v * _LOG2E + 0.5)
        r = (v - k * _LN2_HI) - k * _LN2_LO  # |r| <= ln(2) / 2
        p = 1.0 / 6227020800.0  # Taylor to r^13 / 13!: remainder < 5e-18 for |r| <= 0.35
        p = p * r + 1.0 / 479001600.0
        p = p * r + 1.0 / 39916800.0
        p = p * r + 1.0 / 3628800.0
        p = p * r + 1.0 / 362880.0
        p = p * r + 1.0 / 40320.0
        p = p * r + 1.0 / 5040.0
        p = p * r + 1.0 / 720.0
        p = p * r + 1.0 / 120.0
        p = p * r + 1.0 / 24.0
        p = p * r + 1.0 / 6.0
        p = p * r + 0.5
        p = p * r + 1.0
        p = p * r + 1.0
        out[j] = p if xj >= XMIN else 0.0
        scratch[j] = (np.int64(k) + 1023) << 52  # the bits of 2^k, k in [-1022, 0]
    scale = scratch[:n].view(np.float64)
    for j in range(n):
        out[j] *= scale[j]
