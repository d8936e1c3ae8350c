"""A vectorisable ``exp`` for non-positive arguments (the RBF kernel's range).

``math.exp`` in a numba loop is a libm call per element, which blocks SIMD:
for an RBF kernel column of data with few features it costs more than the
inner products. :func:`exp_nonpositive` is Cody–Waite range reduction plus a
degree-13 Taylor polynomial, with the ``2^k`` scale built from the exponent
bits in a second pass, so both loops vectorise (a column's cost with either:
bench/results/cpu-2core/asygcd-runs.md). Error: within two ulps of ``math.exp``
for ``x >= -708`` (``tests/test_gcd_solver.py`` checks it); below that (true
values under 3.3e-308) it returns 0. :func:`exp_nonpositive_f32` is the same in
float32 (eight lanes to a 256-bit register), for the float32 kernel matrices of
CA-SVM's parts: a degree-7 polynomial, within two float32 ulps for
``x >= -87.33``, 0 below.

Both are used by Asy-GCD's kernel columns (:mod:`gpuml.kernels.gcd.cpu`) and by
the SMO solver's float32 part matrices (:func:`gpuml.kernels.smo.cpu.sgemm_matrix`).
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


#: float32: smallest argument with a normal result (``exp(-87.33) = 1.18e-38``).
XMIN_F32 = -87.33


@njit(nogil=True, cache=True, fastmath={"contract"}, _nrt=False)
def exp_nonpositive_f32(x, out, scratch):
    """:func:`exp_nonpositive` for float32 ``x`` and ``out``; ``scratch`` an int32
    array at least as long as ``x``, overwritten. Every step is in float32."""
    n = x.shape[0]
    lowest = np.float32(XMIN_F32)
    log2e, half = np.float32(_LOG2E), np.float32(0.5)
    ln2_hi, ln2_lo = np.float32(0.693359375), np.float32(-2.12194440e-4)  # k * ln2_hi exact
    c7, c6, c5 = np.float32(1.0 / 5040.0), np.float32(1.0 / 720.0), np.float32(1.0 / 120.0)
    c4, c3 = np.float32(1.0 / 24.0), np.float32(1.0 / 6.0)
    one, zero = np.float32(1.0), np.float32(0.0)
    for j in range(n):
        xj = x[j]
        v = max(xj, lowest)
        k = np.floor(v * log2e + half)
        r = (v - k * ln2_hi) - k * ln2_lo  # |r| <= ln(2) / 2
        # Taylor to r^7 / 7!: remainder < 6e-9 (float32's ulp at 1: 1.2e-7)
        p = one + r * (one + r * (half + r * (c3 + r * (c4 + r * (c5 + r * (c6 + r * c7))))))
        out[j] = p if xj >= lowest else zero
        scratch[j] = (np.int32(k) + 127) << 23  # the bits of 2^k, k in [-126, 0]
    scale = scratch[:n].view(np.float32)
    for j in range(n):
        out[j] *= scale[j]
