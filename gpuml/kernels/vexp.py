"""A vectorisable ``exp`` for non-positive arguments (the RBF kernel's range).

``math.exp`` in a numba loop is a libm call per element, which blocks SIMD:
for an RBF kernel column of data with few features it costs more than the
inner products. :func:`exp_nonpositive` is Cody–Waite range reduction plus a
degree-13 Taylor polynomial, with the ``2^k`` scale built from the exponent
bits in a second pass, so both loops vectorise (a column's cost with either:
bench/results/cpu-2core/asygcd-runs.md). Error: within two ulps of ``math.exp``
for ``x >= -708`` (``tests/test_gcd_solver.py`` checks it); below that (true
values under 3.3e-308) it returns 0. Three variants:

* :func:`exp_nonpositive`: multiply-adds fused, the fastest; Asy-GCD's kernel columns
  (:mod:`gpuml.kernels.gcd.cpu`), which nothing else has to agree with.
* :func:`exp_nonpositive_f64`: the same rounded step by step, and
  :func:`exp_nonpositive_f32` in float32 (a degree-7 polynomial, eight lanes to a
  256-bit register; within two float32 ulps for ``x >= -87.33``, 0 below). Their
  NumPy twin, :func:`exp_nonpositive_numpy`, computes the same values to the bit.
  :func:`rbf_in_place` turns inner products or squared distances into rbf kernel values
  with them in one pass (:func:`rbf_by_arrays` is the same by array operations, NumPy's
  twin on the host, the device's ``exp`` on a GPU): every rbf block on the host
  (:meth:`gpuml.kernels.pairwise.Kernel.matrix` and ``dot``: SMO's rows, prediction, KRR)
  and the SMO solver's float32 part matrices
  (:func:`gpuml.kernels.smo.cpu.sgemm_matrix`). Where numba has not compiled yet,
  NumPy gives the same values: a fit does not depend on whether the compile is done.
"""
import math
import types

import numpy as np
from numba import njit

from .._backend import namespace_of

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
#: Smallest argument with a normal result; below it the result is 0.
XMIN = -708.0


def _exp_nonpositive(x, out, scratch):
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


def _compiled(py_func, name, doc, **flags):
    """``py_func`` compiled under its own ``name`` (numba's disk cache files are named
    after a function's qualified name, so one source compiled twice with different flags
    needs two names, or the second would load the first's machine code)."""
    fn = types.FunctionType(py_func.__code__, py_func.__globals__, name)
    fn.__qualname__ = name
    fn.__doc__ = doc
    return njit(nogil=True, cache=True, _nrt=False, **flags)(fn)


exp_nonpositive = _compiled(_exp_nonpositive, "exp_nonpositive", _exp_nonpositive.__doc__,
                            fastmath={"contract"})
exp_nonpositive_f64 = _compiled(
    _exp_nonpositive, "exp_nonpositive_f64",
    ":func:`exp_nonpositive` rounded step by step (no fused multiply-add), as "
    ":func:`exp_nonpositive_numpy` computes it.")


#: float32: smallest argument with a normal result (``exp(-87.33) = 1.18e-38``).
XMIN_F32 = -87.33


@njit(nogil=True, cache=True, _nrt=False)
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


@njit(nogil=True, cache=True)
def rbf_exponent(row, scale, x_term, y_terms, gamma, arg):
    """``arg[j] = -gamma * max(scale * row[j] + y_terms[j] + x_term, 0)`` in ``row``'s dtype:
    from inner products (``scale=-2``, the squared norms) the rbf exponent of squared
    distances rounded as :func:`gpuml.kernels.pairwise.gram_to_sq_distances` rounds them, and
    from squared distances (``scale=1``, zero terms) their exponent. No fused
    multiply-add: the distances equal NumPy's to the bit."""
    zero = row.dtype.type(0.0)
    g = row.dtype.type(-gamma)
    a = row.dtype.type(scale)
    for j in range(row.shape[0]):
        arg[j] = g * max((row[j] * a + y_terms[j]) + x_term, zero)


@njit(nogil=True, cache=True)
def _rbf_rows_f32(G, scale, x_terms, y_terms, gamma):
    arg = np.empty(G.shape[1], np.float32)
    scratch = np.empty(G.shape[1], np.int32)
    for i in range(G.shape[0]):
        rbf_exponent(G[i], scale, x_terms[i], y_terms, gamma, arg)
        exp_nonpositive_f32(arg, G[i], scratch)


@njit(nogil=True, cache=True)
def _rbf_rows_f64(G, scale, x_terms, y_terms, gamma):
    arg = np.empty(G.shape[1], np.float64)
    scratch = np.empty(G.shape[1], np.int64)
    for i in range(G.shape[0]):
        rbf_exponent(G[i], scale, x_terms[i], y_terms, gamma, arg)
        exp_nonpositive_f64(arg, G[i], scratch)


def rbf_from_sq_distances(D, gamma):
    """``exp(-gamma D)`` in place for squared distances ``D`` (on any device): the compiled
    pass on the host (:func:`rbf_in_place`), else :func:`rbf_by_arrays`."""
    return D if rbf_in_place(D, gamma) else rbf_by_arrays(D, gamma)


def rbf_by_arrays(D, gamma):
    """``exp(-gamma D)`` by array operations: on the host :func:`exp_nonpositive_numpy`
    (the compiled pass's values to the bit), elsewhere the device's ``exp``."""
    D *= -gamma
    if isinstance(D, np.ndarray) and D.dtype in (np.float32, np.float64):
        return exp_nonpositive_numpy(D)
    return namespace_of(D).exp(D, out=D)


def rbf_in_place(G, gamma, scale=1.0, x_terms=None, y_terms=None) -> bool:
    """``G[i, j] = exp(-gamma * max(scale * G[i, j] + y_terms[j] + x_terms[i], 0))`` in
    place, one compiled pass (:func:`rbf_exponent`, then the vectorised ``exp``); the
    terms default to zeros. Returns False, and leaves ``G`` as it was, where it does not
    apply (not a C-contiguous float32 or float64 host matrix) or while the compiled pass
    is not loaded yet (see :mod:`gpuml.kernels._jit`) and the process's blocks taken that
    way stay within :data:`TWIN_BUDGET` values: the caller then computes the same values
    by :func:`rbf_by_arrays` (on the host the same to the bit).
    """
    from . import _jit

    global _twin_spent
    if not (isinstance(G, np.ndarray) and G.ndim == 2 and G.flags.c_contiguous
            and G.flags.writeable and G.dtype in (np.float32, np.float64)):
        return False
    fn = _rbf_rows_f32 if G.dtype == np.float32 else _rbf_rows_f64
    x_terms = (np.zeros(G.shape[0], G.dtype) if x_terms is None
               else np.ascontiguousarray(x_terms, dtype=G.dtype))
    y_terms = (np.zeros(G.shape[1], G.dtype) if y_terms is None
               else np.ascontiguousarray(y_terms, dtype=G.dtype))
    args = (G, float(scale), x_terms, y_terms, float(gamma))
    if G.size == 0:
        return True
    if not _jit.ready(fn, *args) and _twin_spent + G.size <= TWIN_BUDGET:
        _twin_spent += G.size
        return False
    fn(*args)  # (past the budget it compiles here if need be: the twin would cost more)
    return True


#: Values a process computes by the NumPy twin (:func:`rbf_by_arrays`) while
#: :func:`rbf_in_place`'s pass is not compiled; blocks past it wait for the compile. The
#: budget holds a first small fit's kernel matrix (2,000 rows: 4 million values), which the
#: twin computes in less time than a cold compile takes, and stops a large fit, during
#: which the background compile waits, from computing all its blocks by the slower twin
#: (docs/backend.md, "numba on the CPU: the first fit").
TWIN_BUDGET = 1 << 24
_twin_spent = 0


#: Values :func:`exp_nonpositive_numpy` takes at a time: its dozen passes then stay in
#: the core's cache instead of streaming the whole block from memory each time.
TWIN_CHUNK = 1 << 16


def exp_nonpositive_numpy(x):
    """:func:`exp_nonpositive_f64` (float64) or :func:`exp_nonpositive_f32` (float32) in NumPy,
    the same steps in the same order, so the same values to the bit, in place in ``x``
    (a writeable float array); returns ``x``. A contiguous ``x`` goes by chunks of
    :data:`TWIN_CHUNK` values."""
    if x.flags.c_contiguous and x.size > TWIN_CHUNK:
        flat = x.reshape(-1)
        for start in range(0, flat.size, TWIN_CHUNK):
            _exp_nonpositive_numpy(flat[start:start + TWIN_CHUNK])
        return x
    return _exp_nonpositive_numpy(x)


def _exp_nonpositive_numpy(x):
    f32 = x.dtype == np.float32
    t = x.dtype.type
    lowest = t(XMIN_F32 if f32 else XMIN)
    normal = x >= lowest
    np.maximum(x, lowest, out=x)
    k = np.floor(x * t(_LOG2E) + t(0.5))
    if f32:
        x -= k * np.float32(0.693359375)
        x -= k * np.float32(-2.12194440e-4)
        coefs = [1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0]
        p = np.full_like(x, t(coefs[0]))
    else:
        x -= k * _LN2_HI
        x -= k * _LN2_LO
        coefs = [1.0 / 6227020800.0] + [1.0 / math.factorial(i) for i in range(12, -1, -1)]
        p = np.full_like(x, coefs[0])
    for c in coefs[1:]:
        p *= x
        p += t(c)
    bits = (k.astype(np.int32 if f32 else np.int64) + (127 if f32 else 1023)) << (23 if f32 else 52)
    np.multiply(np.where(normal, p, t(0.0)), bits.view(x.dtype), out=x)
    return x
