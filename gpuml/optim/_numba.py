r"""Fused LAMB and LARS steps on the CPU: numba kernels over each tensor's memory.

The CPU counterpart of :mod:`gpuml.optim._triton` (``fused=True`` on CPU tensors). The
same two-pass design: pass 1 steps the moments and returns the two sums of squares the
trust ratio needs, pass 2 recomputes the update from the stored moments and applies it,
so a LAMB step moves 40 B per fp32 parameter (44 with global clipping: the gradients'
norm is read first) where the for-loop path's elementwise operations move about 104.

Why numba. The other ways to fuse on the CPU were weighed: a C++ extension needs a
compiler at install or run time; ``torch.compile`` of the per-tensor update needs a C++
compiler at run time (Inductor generates C++), and compiles at run time again for
new shapes; numba is already a dependency of gpuml (its CPU solvers, ``gpuml.kernels``),
needs no compiler, and its machine code is cached on disk (``cache=True``; ``python -m
gpuml.precompile`` fills the cache at install time, as for the solvers).

Kernels take 1-D float32 NumPy views of a tensor's memory (the parameter or its fp32
copy, the float32 gradient, the state), which must share one dense layout (contiguous or
channels-last: elementwise updates do not care about the order, only that element ``i``
of each view is the same element of the tensor). Each chunk's loop runs over slices
indexed from 0 (``range(hi - lo)``): numba then knows no index is negative, drops its
wrap-around check and LLVM vectorises the loop (with ``range(lo, hi)`` it did not:
scalar ``sqrtss``/``divss``). Work is split into chunks of
:data:`CHUNK` elements over numba's threads (``prange``) for tensors of at least
:data:`PARALLEL_MIN` elements, one thread below that (a parallel region's start costs
more than a small tensor's update). The threads follow ``torch.get_num_threads()``.
Arithmetic is float32 as in the other paths, with per-chunk float32 sums of squares added
in float64; ``fastmath`` allows only reassociation and contraction (vectorised sums,
FMAs), so NaN and inf propagate as in the other paths.
"""

from __future__ import annotations

import types

import numba as nb
import numpy as np
import torch
from torch import Tensor

from gpuml.optim import _sharding as S
from gpuml.optim._layout import dense_layout

#: elements per parallel work item
CHUNK = 16384
#: tensors smaller than this run on one thread
PARALLEL_MIN = 1 << 16

_FASTMATH = {"reassoc", "contract"}
_f32 = np.float32


def _lamb_moments(g, m, v, w, c, beta1, beta3, beta2, omb2, a_m, a_g, a_v, a_g2, eps_in,
                  eps_out, wd):  # pragma: no cover - compiled by numba
    """Pass 1 of LAMB: the moments stepped in place; (sum w^2, sum u^2) with
    u = (a_m m + a_g g) / (sqrt(a_v v + a_g2 g^2 + eps_in) + eps_out) + wd w."""
    c, beta1, beta3, beta2, omb2 = _f32(c), _f32(beta1), _f32(beta3), _f32(beta2), _f32(omb2)
    a_m, a_g, a_v, a_g2 = _f32(a_m), _f32(a_g), _f32(a_v), _f32(a_g2)
    eps_in, eps_out, wd = _f32(eps_in), _f32(eps_out), _f32(wd)
    n = w.size
    w_sq = 0.0
    u_sq = 0.0
    for k in nb.prange((n + CHUNK - 1) // CHUNK):
        lo = k * CHUNK
        hi = min(lo + CHUNK, n)
        gk, mk, vk, wk = g[lo:hi], m[lo:hi], v[lo:hi], w[lo:hi]
        cw = _f32(0.0)
        cu = _f32(0.0)
        for i in range(hi - lo):
            gi = gk[i] * c
            mi = beta1 * mk[i] + beta3 * gi
            vi = beta2 * vk[i] + omb2 * gi * gi
            mk[i] = mi
            vk[i] = vi
            wi = wk[i]
            u = (a_m * mi + a_g * gi) / (np.sqrt(a_v * vi + a_g2 * gi * gi + eps_in)
                                         + eps_out) + wd * wi
            cw += wi * wi
            cu += u * u
        w_sq += np.float64(cw)
        u_sq += np.float64(cu)
    return w_sq, u_sq


def _lamb_apply(g, m, v, w, c, a_m, a_g, a_v, a_g2, eps_in, eps_out, wd,
                scale):  # pragma: no cover - compiled by numba
    """Pass 2 of LAMB: w += scale * u, u recomputed from the stepped moments (reads g only
    for N-LAMB/NN-LAMB, whose update has gradient terms)."""
    c, a_m, a_g, a_v, a_g2 = _f32(c), _f32(a_m), _f32(a_g), _f32(a_v), _f32(a_g2)
    eps_in, eps_out, wd, scale = _f32(eps_in), _f32(eps_out), _f32(wd), _f32(scale)
    n = w.size
    with_g = a_g != 0 or a_g2 != 0
    for k in nb.prange((n + CHUNK - 1) // CHUNK):
        lo = k * CHUNK
        hi = min(lo + CHUNK, n)
        gk, mk, vk, wk = g[lo:hi], m[lo:hi], v[lo:hi], w[lo:hi]
        if with_g:
            for i in range(hi - lo):
                gi = gk[i] * c
                wi = wk[i]
                u = (a_m * mk[i] + a_g * gi) / (np.sqrt(a_v * vk[i] + a_g2 * gi * gi + eps_in)
                                                + eps_out) + wd * wi
                wk[i] = wi + scale * u
        else:
            for i in range(hi - lo):
                wi = wk[i]
                u = a_m * mk[i] / (np.sqrt(a_v * vk[i] + eps_in) + eps_out) + wd * wi
                wk[i] = wi + scale * u


def _sumsq2(a, b, cb):  # pragma: no cover - compiled by numba
    """(sum a^2, sum (cb b)^2)."""
    cb = _f32(cb)
    n = a.size
    a_sq = 0.0
    b_sq = 0.0
    for k in nb.prange((n + CHUNK - 1) // CHUNK):
        lo = k * CHUNK
        hi = min(lo + CHUNK, n)
        ak, bk = a[lo:hi], b[lo:hi]
        ca = _f32(0.0)
        cc = _f32(0.0)
        for i in range(hi - lo):
            bi = cb * bk[i]
            ca += ak[i] * ak[i]
            cc += bi * bi
        a_sq += np.float64(ca)
        b_sq += np.float64(cc)
    return a_sq, b_sq


def _lars_momentum(g, w, buf, c, wd, ratio, keep, take, nest_d, nest_b,
                   neg_lr):  # pragma: no cover - compiled by numba
    """Classic LARS with momentum: d = ratio (c g + wd w), buf = keep buf + take d,
    w += neg_lr (nest_d d + nest_b buf). (keep, take) = (0, 1) at the first step, else
    (mu, 1 - dampening); (nest_d, nest_b) = (1, mu) with Nesterov, else (0, 1)."""
    c, wd, ratio, keep, take = _f32(c), _f32(wd), _f32(ratio), _f32(keep), _f32(take)
    nest_d, nest_b, neg_lr = _f32(nest_d), _f32(nest_b), _f32(neg_lr)
    n = w.size
    first = keep == 0
    for k in nb.prange((n + CHUNK - 1) // CHUNK):
        lo = k * CHUNK
        hi = min(lo + CHUNK, n)
        gk, wk, bk = g[lo:hi], w[lo:hi], buf[lo:hi]
        for i in range(hi - lo):
            wi = wk[i]
            d = ratio * (c * gk[i] + wd * wi)
            b = d if first else keep * bk[i] + take * d  # not 0 * buf: buf may hold inf
            bk[i] = b
            wk[i] = wi + neg_lr * (nest_d * d + nest_b * b)


def _lars_plain(g, w, c, wd, ratio, neg_lr):  # pragma: no cover - compiled by numba
    """Classic LARS without momentum: w += neg_lr ratio (c g + wd w)."""
    c, wd, ratio, neg_lr = _f32(c), _f32(wd), _f32(ratio), _f32(neg_lr)
    n = w.size
    for k in nb.prange((n + CHUNK - 1) // CHUNK):
        lo = k * CHUNK
        hi = min(lo + CHUNK, n)
        gk, wk = g[lo:hi], w[lo:hi]
        for i in range(hi - lo):
            wi = wk[i]
            wk[i] = wi + neg_lr * ratio * (c * gk[i] + wd * wi)


def _lars_normalized(g, w, buf, c, wd, mu):  # pragma: no cover - compiled by numba
    """Pass 1 of LARS Alg 15: buf = mu buf + (1 - mu)(c g + wd w); (sum w^2, sum buf^2)."""
    c, wd, mu = _f32(c), _f32(wd), _f32(mu)
    omm = _f32(1.0) - mu
    n = w.size
    w_sq = 0.0
    b_sq = 0.0
    for k in nb.prange((n + CHUNK - 1) // CHUNK):
        lo = k * CHUNK
        hi = min(lo + CHUNK, n)
        gk, wk, bk = g[lo:hi], w[lo:hi], buf[lo:hi]
        cw = _f32(0.0)
        cb = _f32(0.0)
        for i in range(hi - lo):
            wi = wk[i]
            b = mu * bk[i] + omm * (c * gk[i] + wd * wi)
            bk[i] = b
            cw += wi * wi
            cb += b * b
        w_sq += np.float64(cw)
        b_sq += np.float64(cb)
    return w_sq, b_sq


def _axpy(x, y, a):  # pragma: no cover - compiled by numba
    """x += a y."""
    a = _f32(a)
    n = x.size
    for k in nb.prange((n + CHUNK - 1) // CHUNK):
        lo = k * CHUNK
        hi = min(lo + CHUNK, n)
        xk, yk = x[lo:hi], y[lo:hi]
        for i in range(hi - lo):
            xk[i] += a * yk[i]


def _compile(fn):
    """A serial and a parallel compilation of ``fn`` (``prange`` is ``range`` in the first).

    The serial one compiles a copy under another qualified name: numba's disk cache names
    its files by the function, not by the compile options, so the two would overwrite each
    other's cache entries.
    """
    # error_model="numpy": x / 0 gives inf or NaN, as torch does, instead of raising
    opts = dict(cache=True, nogil=True, fastmath=_FASTMATH, error_model="numpy")
    serial = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial")
    serial.__qualname__ = fn.__qualname__ + "_serial"
    return nb.njit(**opts)(serial), nb.njit(parallel=True, **opts)(fn)


_KERNELS = {fn.__name__.lstrip("_"): _compile(fn) for fn in (
    _lamb_moments, _lamb_apply, _sumsq2, _lars_momentum, _lars_plain, _lars_normalized, _axpy)}


def run(name: str, n: int, *args):
    """Run kernel ``name`` on a tensor of ``n`` elements (parallel from :data:`PARALLEL_MIN`)."""
    serial, parallel = _KERNELS[name]
    return (parallel if n >= PARALLEL_MIN else serial)(*args)


def use_torch_threads() -> None:
    """Run the parallel kernels on as many threads as torch's intra-op pool."""
    nb.set_num_threads(max(1, min(torch.get_num_threads(), nb.config.NUMBA_NUM_THREADS)))


def flat(t: Tensor | None) -> np.ndarray | None:
    """The memory of a dense CPU tensor as a 1-D NumPy array (no copy)."""
    if t is None:
        return None
    return torch.as_strided(t.detach(), (t.numel(),), (1,)).numpy()


def check_layouts(*columns) -> None:
    """Each tensor's row across ``columns`` (lists, or None) shares one dense layout."""
    for tensors in zip(*(c for c in columns if c is not None)):
        if not dense_layout(*tensors):
            raise ValueError("the fused path needs each parameter, its gradient and its state "
                             "to share one dense layout (contiguous or channels_last); use "
                             "foreach=False for other layouts")


def two_passes(params: list[Tensor], ws: list[Tensor], adapt: list[bool], sharding, pass1,
               ratios, pass2):
    """The fused step on CPU tensors, a generator as the other paths.

    ``pass1(i)`` runs tensor ``i``'s first pass and returns its two sums of squares (weight,
    direction); once every trust ratio is known (``ratios(w_norms, d_norms)``, over the full
    tensors for sharded ones: one yield, as :func:`gpuml.optim._sharding.full_norms`),
    ``pass2(i, ratio)`` updates the compute view ``ws[i]`` (ratio 1 for tensors left out of
    adaptation), which is then rounded into ``params[i]`` where they differ.
    """
    use_torch_threads()
    sums = [pass1(i) for i in range(len(ws))]
    norms = torch.tensor(sums, dtype=torch.float64).sqrt().T.float()
    w_norms, d_norms = yield from S.full_norms(norms, sharding)
    ratio = torch.where(torch.tensor(adapt), ratios(w_norms, d_norms), 1.0).tolist()
    for i, (p, w) in enumerate(zip(params, ws)):
        pass2(i, ratio[i])
        if w is not p:
            p.copy_(w)


def compile_all() -> None:
    """Compile (or load from the disk cache) every kernel, serial and parallel, on tiny
    arrays: what ``python -m gpuml.precompile`` runs so that no first step compiles."""
    a, b, c, d = (np.ones(4, dtype=np.float32) for _ in range(4))
    args = {"lamb_moments": (a, b, c, d, *([0.5] * 12)),
            "lamb_apply": (a, b, c, d, *([0.5] * 9)),
            "sumsq2": (a, b, 1.0), "lars_momentum": (a, b, c, *([0.5] * 8)),
            "lars_plain": (a, b, *([0.5] * 4)), "lars_normalized": (a, b, c, 0.5, 0.5, 0.5),
            "axpy": (a, b, 0.5)}
    for name, kernels in _KERNELS.items():
        for kernel in kernels:
            kernel(*args[name])
