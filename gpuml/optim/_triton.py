r"""Fused LAMB and LARS steps as Triton kernels: many tensors per launch.

Design
------
*Tensor table and chunk table.* The tensors of one param group that share a
dtype are described by an ``int64`` table, one row per tensor: the addresses of
the parameter, the gradient, the two state buffers, the fp32 master copy and the
``step`` counter, the element count, the tensor's first chunk and chunk count,
and two flag bits (adapt, decay). Every tensor is cut into chunks of ``CHUNK``
elements; a second table maps each chunk to ``(tensor, chunk index)`` and one
Triton program handles one chunk (looping over it in ``BLOCK``-wide vectors).
A whole group is therefore one launch per pass, however many tensors it has,
without copying parameters into a flat buffer. The tables are built on the host
and uploaded through pinned memory with ``non_blocking=True``; the last table
is cached, so a training loop whose tensors keep their addresses uploads nothing
(and a CUDA-graph capture, which needs a warm-up step anyway, replays cached
tables). Tensors may be contiguous or channels_last, as long as a parameter, its
gradient and its state share the layout; the default path picks foreach otherwise.

*Norms inside the passes.* Each program writes the partial sums of squares of
its chunk (weight and update for LAMB, weight and gradient/momentum for LARS)
to a ``[n_chunks, 2]`` buffer. The second pass sums the partials of its own
tensor in a fixed order (deterministic, no atomics) and turns them into the
trust ratio, so no separate norm kernel and no host synchronisation is needed.
``step``, ``lr`` (when a tensor), ``grad_scale``, ``found_inf`` and the global
clipping factor are read from device memory inside the kernels; a step with
``found_inf != 0`` makes every program's range empty, so nothing is written,
and ``step`` is corrected with one ``_foreach_sub_`` as in torch's fused Adam.

Bytes moved per fp32 parameter
------------------------------
LAMB (the update :math:`u` is recomputed in pass 2 instead of stored):

==========================  =====================================  ======
pass                        traffic                                bytes
==========================  =====================================  ======
0 global grad norm          read g                                 4
1 moments, partial norms    read g, m, v, w; write m, v            24
2 ratio, update             read m, v, w; write w                  16
==========================  =====================================  ======

44 B/param with ``max_grad_norm`` (40 without); apex's four-phase design stores
:math:`u` and moves 52. N-LAMB/NN-LAMB read g again in pass 2 (+4). With fp16/bf16
parameters and fp32 master weights, w is the 4-byte master and the 2-byte
parameter is written in pass 2 (+2); g is 2 bytes.

LARS, classic (momentum, eq. 5.1 sequence): pass 1 reads w, g (8); pass 2 reads
w, g, buffer and writes buffer, w (20): 28 B/param. Normalized (Alg 15): pass 1
reads w, g, m and writes m (16); pass 2 reads w, m, writes w (12): 28 B/param.

Testing: with ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors (slowly)
and are compared with the for-loop reference in ``tests/optim``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from gpuml.optim._common import dense_layout, interpreter_on

CHUNK = 65536
BLOCK = 1024
INTERPRET_CHUNK = 4096
INTERPRET_BLOCK = 1024

_P, _G, _M, _V, _W, _S, _N, _C0, _NC, _FL = range(10)
NCOL = 10
_ADAPT, _DECAY = 1, 2

_cache: dict[tuple, tuple[Tensor, Tensor, int]] = {}


def _sizes(chunk: int | None, block: int | None) -> tuple[int, int]:
    if interpreter_on():
        return chunk or INTERPRET_CHUNK, block or INTERPRET_BLOCK
    return chunk or CHUNK, block or BLOCK


def _upload(rows: list[int], dtype, device: torch.device) -> Tensor:
    host = torch.tensor(rows, dtype=dtype)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host


def _tables(cols: list[list], numels: list[int], flags: list[int], device: torch.device,
            chunk: int) -> tuple[Tensor, Tensor, int]:
    """Tensor table ``[T, NCOL]`` (int64) and chunk table ``[n_chunks, 2]`` (int32)."""
    rows, chunk_rows, first = [], [], 0
    for i, n in enumerate(numels):
        nc = max(1, -(-n // chunk))
        rows += [c[i] for c in cols] + [n, first, nc, flags[i]]
        for k in range(nc):
            chunk_rows += [i, k]
        first += nc
    key = (device, chunk, tuple(rows))
    hit = _cache.get(key)
    if hit is not None:
        return hit
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("fused step under CUDA-graph capture with tensors it has not seen: "
                           "run one eager step with the same tensors before capturing")
    out = (_upload(rows, torch.int64, device), _upload(chunk_rows, torch.int32, device), first)
    if len(_cache) > 8:
        _cache.clear()
    _cache[key] = out
    return out


def _ptr(t: Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _check_layout(*columns) -> None:
    for tensors in zip(*columns):
        if not dense_layout(*tensors):
            raise ValueError("the fused path needs each parameter, its gradient and its state "
                             "to share one dense layout (contiguous or channels_last); use "
                             "foreach=True for other layouts")


def _scalar_arg(x, device) -> tuple[Tensor, float, bool]:
    """A kernel scalar that may live on the device: (pointer, value, is_pointer)."""
    if isinstance(x, Tensor):
        return x.to(device=device, dtype=torch.float32).reshape(1), 0.0, True
    return _dummy(device), float(x), False


def _log(beta: float) -> float:
    return math.log(beta) if beta > 0 else -math.inf


def _dummy(device) -> Tensor:
    return torch.zeros(1, dtype=torch.float32, device=device)


@triton.jit
def _load_scalar(ptr, value, IS_PTR: tl.constexpr):
    if IS_PTR:
        out = tl.load(ptr).to(tl.float32)
    else:
        out = value
    return out


@triton.jit
def _to_param(x, p_w, PARAM_BF16: tl.constexpr):
    # Round-to-nearest-even into bfloat16 by hand: the Triton interpreter truncates.
    if PARAM_BF16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        bits = (bits >> 16) << 16
        x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    return x.to(p_w.dtype.element_ty)


@triton.jit
def _sumsq_kernel(tab, chunks, partials, g_w, NCOL: tl.constexpr, CHUNK: tl.constexpr,
                  BLOCK: tl.constexpr):
    c = tl.program_id(0)
    ti = tl.load(chunks + 2 * c)
    ci = tl.load(chunks + 2 * c + 1)
    row = tab + ti * NCOL
    g = tl.load(row + 1).to(g_w.dtype)
    n = tl.load(row + 6)
    start = ci.to(tl.int64) * CHUNK
    end = tl.minimum(start + CHUNK, n)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(start, end, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        x = tl.load(g + idx, mask=idx < end, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(partials + c, tl.sum(acc, axis=0))


def sum_of_squares(grads: list[Tensor], chunk: int | None = None,
                   block: int | None = None) -> Tensor:
    """Sum of squares of all ``grads`` (one device) as a 0-d fp32 tensor."""
    chunk, block = _sizes(chunk, block)
    device = grads[0].device
    _check_layout(grads)
    total = torch.zeros((), dtype=torch.float32, device=device)
    by_dtype: dict[torch.dtype, list[Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for gs in by_dtype.values():
        zero = [0] * len(gs)
        cols = [zero, [g.data_ptr() for g in gs]] + [zero] * 4
        tab, chunks, n_chunks = _tables(cols, [g.numel() for g in gs], zero, device, chunk)
        partials = torch.empty(n_chunks, dtype=torch.float32, device=device)
        _sumsq_kernel[(n_chunks,)](tab, chunks, partials, gs[0], NCOL=NCOL, CHUNK=chunk,
                                   BLOCK=block)
        total = total + partials.sum()
    return total


@triton.jit
def _one_minus_pow(log_beta, t):
    # 1 - beta**t = -expm1(t log beta), with Kahan's expm1 (exp(x) - 1 cancels for beta ~ 1);
    # beta = 0 gives log = -inf and 1 - 0**t = 1.
    x = t * log_beta
    u = tl.exp(x)
    um1 = u - 1.0
    safe = (um1 != 0.0) & (u > 0.0)
    expm1 = tl.where(safe, um1 * x / tl.log(tl.where(safe, u, 2.0)), tl.where(u > 0.0, x, -1.0))
    return -expm1


@triton.jit
def _lamb_coefs(t, beta1, beta2, beta3, lb1, lb2, omb2, BIAS_CORRECTION: tl.constexpr,
                VARIANT: tl.constexpr):
    # lb = log(beta) and omb2 = 1 - beta2 come from the host in double precision: in fp32,
    # 1 - beta2 for beta2 = 0.999 is off by 1e-5 relative.
    if VARIANT == 0:
        if BIAS_CORRECTION:
            a_m = 1.0 / _one_minus_pow(lb1, t)
            a_v = 1.0 / _one_minus_pow(lb2, t)
        else:
            a_m = 1.0 + 0.0 * t
            a_v = 1.0 + 0.0 * t
        a_g = 0.0 * t
        a_g2 = 0.0 * t
    else:
        a_m = beta1 / _one_minus_pow(lb1, t + 1.0)
        a_g = beta3 / _one_minus_pow(lb1, t)
        a_v = beta2 / _one_minus_pow(lb2, t + 1.0)
        if VARIANT == 2:
            a_g2 = omb2 / _one_minus_pow(lb2, t)
        else:
            a_g2 = 0.0 * t
    return a_m, a_g, a_v, a_g2


@triton.jit
def _lamb_update(mv, vv, gv, wv, a_m, a_g, a_v, a_g2, eps, wd, EPS_INSIDE: tl.constexpr):
    m_hat = a_m * mv + a_g * gv
    v_hat = a_v * vv + a_g2 * gv * gv
    if EPS_INSIDE:
        denom = tl.sqrt(v_hat + eps)
    else:
        denom = tl.sqrt(v_hat) + eps
    return m_hat / denom + wd * wv


@triton.jit
def _chunk_setup(tab, chunks, found_inf, NCOL: tl.constexpr, CHUNK: tl.constexpr,
                 HAS_INF: tl.constexpr):
    c = tl.program_id(0)
    ti = tl.load(chunks + 2 * c)
    ci = tl.load(chunks + 2 * c + 1)
    row = tab + ti * NCOL
    n = tl.load(row + 6)
    start = ci.to(tl.int64) * CHUNK
    end = tl.minimum(start + CHUNK, n)
    if HAS_INF:
        end = tl.where(tl.load(found_inf) != 0, start, end)
    return c, row, start, end


@triton.jit
def _tensor_norms(row, partials, PBLOCK: tl.constexpr):
    c0 = tl.load(row + 7)
    nc = tl.load(row + 8)
    acc0 = tl.zeros([PBLOCK], dtype=tl.float32)
    acc1 = tl.zeros([PBLOCK], dtype=tl.float32)
    for k in range(c0, c0 + nc, PBLOCK):
        idx = k + tl.arange(0, PBLOCK)
        msk = idx < c0 + nc
        acc0 += tl.load(partials + 2 * idx, mask=msk, other=0.0)
        acc1 += tl.load(partials + 2 * idx + 1, mask=msk, other=0.0)
    return tl.sqrt(tl.sum(acc0, axis=0)), tl.sqrt(tl.sum(acc1, axis=0))


@triton.jit
def _lamb_pass1(tab, chunks, partials, p_w, g_w, f_w, coef, found_inf, beta1, beta2, beta3,
                lb1, lb2, omb2, eps, weight_decay, HAS_COEF: tl.constexpr, HAS_INF: tl.constexpr,
                HAS_MASTER: tl.constexpr, BIAS_CORRECTION: tl.constexpr,
                VARIANT: tl.constexpr, EPS_INSIDE: tl.constexpr, NCOL: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    c, row, start, end = _chunk_setup(tab, chunks, found_inf, NCOL, CHUNK, HAS_INF)
    g = tl.load(row + 1).to(g_w.dtype)
    m = tl.load(row + 2).to(f_w.dtype)
    v = tl.load(row + 3).to(f_w.dtype)
    if HAS_MASTER:
        w = tl.load(row + 4).to(f_w.dtype)
    else:
        w = tl.load(row + 0).to(p_w.dtype)
    t = tl.load(tl.load(row + 5).to(f_w.dtype)) + 1.0
    flags = tl.load(row + 9)
    wd = tl.where((flags & 2) != 0, weight_decay, 0.0)
    scale = 1.0
    if HAS_COEF:
        scale = tl.load(coef)
    a_m, a_g, a_v, a_g2 = _lamb_coefs(t, beta1, beta2, beta3, lb1, lb2, omb2,
                                      BIAS_CORRECTION, VARIANT)
    acc_w = tl.zeros([BLOCK], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(start, end, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        mask = idx < end
        gv = tl.load(g + idx, mask=mask, other=0.0).to(tl.float32) * scale
        mv = beta1 * tl.load(m + idx, mask=mask, other=0.0) + beta3 * gv
        vv = beta2 * tl.load(v + idx, mask=mask, other=0.0) + omb2 * gv * gv
        tl.store(m + idx, mv, mask=mask)
        tl.store(v + idx, vv, mask=mask)
        wv = tl.load(w + idx, mask=mask, other=0.0).to(tl.float32)
        u = _lamb_update(mv, vv, gv, wv, a_m, a_g, a_v, a_g2, eps, wd, EPS_INSIDE)
        u = tl.where(mask, u, 0.0)
        acc_w += wv * wv
        acc_u += u * u
    tl.store(partials + 2 * c, tl.sum(acc_w, axis=0))
    tl.store(partials + 2 * c + 1, tl.sum(acc_u, axis=0))


@triton.jit
def _lamb_pass2(tab, chunks, partials, p_w, g_w, f_w, coef, found_inf, lr_ptr, lr_val,
                beta1, beta2, beta3, lb1, lb2, omb2, eps, weight_decay, lower, upper,
                HAS_COEF: tl.constexpr, HAS_INF: tl.constexpr, HAS_MASTER: tl.constexpr,
                LR_IS_PTR: tl.constexpr, BIAS_CORRECTION: tl.constexpr,
                VARIANT: tl.constexpr, EPS_INSIDE: tl.constexpr, NCOL: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr, PBLOCK: tl.constexpr,
                PARAM_BF16: tl.constexpr):
    c, row, start, end = _chunk_setup(tab, chunks, found_inf, NCOL, CHUNK, HAS_INF)
    p = tl.load(row + 0).to(p_w.dtype)
    g = tl.load(row + 1).to(g_w.dtype)
    m = tl.load(row + 2).to(f_w.dtype)
    v = tl.load(row + 3).to(f_w.dtype)
    if HAS_MASTER:
        w = tl.load(row + 4).to(f_w.dtype)
    else:
        w = p
    t = tl.load(tl.load(row + 5).to(f_w.dtype)) + 1.0
    flags = tl.load(row + 9)
    wd = tl.where((flags & 2) != 0, weight_decay, 0.0)
    scale = 1.0
    if HAS_COEF:
        scale = tl.load(coef)
    a_m, a_g, a_v, a_g2 = _lamb_coefs(t, beta1, beta2, beta3, lb1, lb2, omb2,
                                      BIAS_CORRECTION, VARIANT)
    w_norm, u_norm = _tensor_norms(row, partials, PBLOCK)
    ok = (w_norm > 0) & (u_norm > 0) & ((flags & 1) != 0)
    phi = tl.minimum(tl.maximum(w_norm, lower), upper)
    ratio = tl.where(ok, phi / tl.where(ok, u_norm, 1.0), 1.0)
    step_size = _load_scalar(lr_ptr, lr_val, LR_IS_PTR) * ratio
    for off in range(start, end, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        mask = idx < end
        if VARIANT == 0:
            gv = 0.0
        else:
            gv = tl.load(g + idx, mask=mask, other=0.0).to(tl.float32) * scale
        mv = tl.load(m + idx, mask=mask, other=0.0)
        vv = tl.load(v + idx, mask=mask, other=0.0)
        wv = tl.load(w + idx, mask=mask, other=0.0).to(tl.float32)
        u = _lamb_update(mv, vv, gv, wv, a_m, a_g, a_v, a_g2, eps, wd, EPS_INSIDE)
        wv = wv - step_size * u
        if HAS_MASTER:
            tl.store(w + idx, wv, mask=mask)
        tl.store(p + idx, _to_param(wv, p_w, PARAM_BF16), mask=mask)


def _buckets(params, masters):
    out: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        out.setdefault((p.dtype, masters[i] is not None), []).append(i)
    return out.items()


def _common_args(grad_scale, clip, found_inf, device):
    coef = None
    if grad_scale is not None:
        coef = 1.0 / grad_scale.to(device).float()
    if clip is not None:
        coef = clip.to(device) if coef is None else coef * clip.to(device)
    has_coef = coef is not None
    coef = coef.reshape(1) if has_coef else _dummy(device)
    has_inf = found_inf is not None
    inf = found_inf.to(device).reshape(1) if has_inf else _dummy(device)
    return coef, has_coef, inf, has_inf


def _finish_steps(steps: list[Tensor], found_inf: Tensor | None) -> None:
    torch._foreach_add_(steps, 1.0)
    if found_inf is not None:
        f = found_inf.to(steps[0].device, torch.float32)
        torch._foreach_sub_(steps, [f] * len(steps))


def lamb_step(params, grads, exp_avgs, exp_avg_sqs, master_params, state_steps, *, adapt,
              decay, clip, grad_scale, found_inf, lr, beta1, beta2, eps, weight_decay,
              bias_correction, grad_averaging, trust_bounds, eps_inside_sqrt, variant,
              chunk: int | None = None, block: int | None = None) -> None:
    """One fused LAMB step over tensors on one device (see :func:`gpuml.optim.lamb`)."""
    chunk, block = _sizes(chunk, block)
    device = params[0].device
    _check_layout(params, grads, exp_avgs, exp_avg_sqs, master_params)
    coef, has_coef, inf, has_inf = _common_args(grad_scale, clip, found_inf, device)
    lr_ptr, lr_val, lr_is_ptr = _scalar_arg(lr, device)
    beta1, beta2, eps, weight_decay = float(beta1), float(beta2), float(eps), float(weight_decay)
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    var = {"lamb": 0, "nlamb": 1, "nnlamb": 2}[variant]
    logs = (_log(beta1), _log(beta2), 1.0 - beta2)
    for (_, has_master), idx in _buckets(params, master_params):
        ps = [params[i] for i in idx]
        cols = [[_ptr(ps[k]) for k in range(len(idx))],
                [_ptr(grads[i]) for i in idx], [_ptr(exp_avgs[i]) for i in idx],
                [_ptr(exp_avg_sqs[i]) for i in idx], [_ptr(master_params[i]) for i in idx],
                [_ptr(state_steps[i]) for i in idx]]
        flags = [(_ADAPT if adapt[i] else 0) | (_DECAY if decay[i] else 0) for i in idx]
        tab, chunks, n_chunks = _tables(cols, [p.numel() for p in ps], flags, device, chunk)
        partials = torch.empty(2 * n_chunks, dtype=torch.float32, device=device)
        f_w = exp_avgs[idx[0]]
        common = dict(HAS_COEF=has_coef, HAS_INF=has_inf, HAS_MASTER=has_master,
                      BIAS_CORRECTION=bool(bias_correction), VARIANT=var,
                      EPS_INSIDE=bool(eps_inside_sqrt), NCOL=NCOL, CHUNK=chunk, BLOCK=block)
        _lamb_pass1[(n_chunks,)](tab, chunks, partials, ps[0], grads[idx[0]], f_w, coef, inf,
                                 beta1, beta2, beta3, *logs, eps, weight_decay, **common)
        _lamb_pass2[(n_chunks,)](tab, chunks, partials, ps[0], grads[idx[0]], f_w, coef, inf,
                                 lr_ptr, lr_val, beta1, beta2, beta3, *logs, eps, weight_decay,
                                 float(trust_bounds[0]), float(trust_bounds[1]),
                                 LR_IS_PTR=lr_is_ptr, PBLOCK=128,
                                 PARAM_BF16=ps[0].dtype == torch.bfloat16, **common)
    _finish_steps(state_steps, found_inf)


@triton.jit
def _lars_pass1(tab, chunks, partials, p_w, g_w, f_w, coef, found_inf, momentum,
                weight_decay, HAS_COEF: tl.constexpr, HAS_INF: tl.constexpr,
                HAS_MASTER: tl.constexpr, NORMALIZED: tl.constexpr, NCOL: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    c, row, start, end = _chunk_setup(tab, chunks, found_inf, NCOL, CHUNK, HAS_INF)
    g = tl.load(row + 1).to(g_w.dtype)
    buf = tl.load(row + 2).to(f_w.dtype)
    if HAS_MASTER:
        w = tl.load(row + 4).to(f_w.dtype)
    else:
        w = tl.load(row + 0).to(p_w.dtype)
    flags = tl.load(row + 9)
    wd = tl.where((flags & 2) != 0, weight_decay, 0.0)
    scale = 1.0
    if HAS_COEF:
        scale = tl.load(coef)
    acc_w = tl.zeros([BLOCK], dtype=tl.float32)
    acc_d = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(start, end, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        mask = idx < end
        gv = tl.load(g + idx, mask=mask, other=0.0).to(tl.float32) * scale
        wv = tl.load(w + idx, mask=mask, other=0.0).to(tl.float32)
        if NORMALIZED:
            mv = momentum * tl.load(buf + idx, mask=mask, other=0.0) \
                + (1.0 - momentum) * (gv + wd * wv)
            tl.store(buf + idx, mv, mask=mask)
            acc_d += mv * mv
        else:
            acc_d += gv * gv
        acc_w += wv * wv
    tl.store(partials + 2 * c, tl.sum(acc_w, axis=0))
    tl.store(partials + 2 * c + 1, tl.sum(acc_d, axis=0))


@triton.jit
def _lars_pass2(tab, chunks, partials, p_w, g_w, f_w, coef, found_inf, lr_ptr, lr_val,
                momentum, dampening, weight_decay, trust_coefficient, eps, lower, upper,
                HAS_COEF: tl.constexpr, HAS_INF: tl.constexpr, HAS_MASTER: tl.constexpr,
                LR_IS_PTR: tl.constexpr, NORMALIZED: tl.constexpr,
                HAS_MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr, CLIP: tl.constexpr,
                NCOL: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                PBLOCK: tl.constexpr, PARAM_BF16: tl.constexpr):
    c, row, start, end = _chunk_setup(tab, chunks, found_inf, NCOL, CHUNK, HAS_INF)
    p = tl.load(row + 0).to(p_w.dtype)
    g = tl.load(row + 1).to(g_w.dtype)
    buf = tl.load(row + 2).to(f_w.dtype)
    if HAS_MASTER:
        w = tl.load(row + 4).to(f_w.dtype)
    else:
        w = p
    t = tl.load(tl.load(row + 5).to(f_w.dtype)) + 1.0
    flags = tl.load(row + 9)
    wd = tl.where((flags & 2) != 0, weight_decay, 0.0)
    scale = 1.0
    if HAS_COEF:
        scale = tl.load(coef)
    lr = _load_scalar(lr_ptr, lr_val, LR_IS_PTR)
    w_norm, d_norm = _tensor_norms(row, partials, PBLOCK)
    ok = (w_norm > 0) & (d_norm > 0)
    if NORMALIZED:
        denom = d_norm + eps
    else:
        denom = d_norm + wd * w_norm + eps
    ratio = tl.where(ok, trust_coefficient * w_norm / tl.where(ok, denom, 1.0), 1.0)
    ratio = tl.minimum(tl.maximum(ratio, lower), upper)
    if CLIP:
        ratio = tl.minimum(ratio / lr, 1.0)
    ratio = tl.where((flags & 1) != 0, ratio, 1.0)
    first = t == 1.0
    for off in range(start, end, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        mask = idx < end
        wv = tl.load(w + idx, mask=mask, other=0.0).to(tl.float32)
        if NORMALIZED:
            direction = ratio * tl.load(buf + idx, mask=mask, other=0.0)
        else:
            gv = tl.load(g + idx, mask=mask, other=0.0).to(tl.float32) * scale
            d = ratio * (gv + wd * wv)
            if HAS_MOMENTUM:
                bv = tl.load(buf + idx, mask=mask, other=0.0)
                bv = tl.where(first, d, momentum * bv + (1.0 - dampening) * d)
                tl.store(buf + idx, bv, mask=mask)
                if NESTEROV:
                    direction = d + momentum * bv
                else:
                    direction = bv
            else:
                direction = d
        wv = wv - lr * direction
        if HAS_MASTER:
            tl.store(w + idx, wv, mask=mask)
        tl.store(p + idx, _to_param(wv, p_w, PARAM_BF16), mask=mask)


def lars_step(params, grads, momentum_buffers, master_params, state_steps, *, adapt, decay,
              grad_scale, found_inf, lr, momentum, dampening, nesterov, weight_decay,
              trust_coefficient, eps, clip, trust_bounds, mode, chunk: int | None = None,
              block: int | None = None) -> None:
    """One fused LARS step over tensors on one device (see :func:`gpuml.optim.lars`)."""
    chunk, block = _sizes(chunk, block)
    device = params[0].device
    _check_layout(params, grads, momentum_buffers, master_params)
    coef, has_coef, inf, has_inf = _common_args(grad_scale, None, found_inf, device)
    lr_ptr, lr_val, lr_is_ptr = _scalar_arg(lr, device)
    normalized = mode == "normalized"
    for (_, has_master), idx in _buckets(params, master_params):
        ps = [params[i] for i in idx]
        zero = [0] * len(idx)
        cols = [[_ptr(p) for p in ps], [_ptr(grads[i]) for i in idx],
                [_ptr(momentum_buffers[i]) for i in idx], zero,
                [_ptr(master_params[i]) for i in idx], [_ptr(state_steps[i]) for i in idx]]
        flags = [(_ADAPT if adapt[i] else 0) | (_DECAY if decay[i] else 0) for i in idx]
        tab, chunks, n_chunks = _tables(cols, [p.numel() for p in ps], flags, device, chunk)
        partials = torch.empty(2 * n_chunks, dtype=torch.float32, device=device)
        f_w = momentum_buffers[idx[0]]
        if f_w is None:
            f_w = _dummy(device)
        common = dict(HAS_COEF=has_coef, HAS_INF=has_inf, HAS_MASTER=has_master,
                      NORMALIZED=normalized, NCOL=NCOL, CHUNK=chunk, BLOCK=block)
        _lars_pass1[(n_chunks,)](tab, chunks, partials, ps[0], grads[idx[0]], f_w, coef, inf,
                                 float(momentum), float(weight_decay), **common)
        _lars_pass2[(n_chunks,)](tab, chunks, partials, ps[0], grads[idx[0]], f_w, coef, inf,
                                 lr_ptr, lr_val, float(momentum), float(dampening),
                                 float(weight_decay), float(trust_coefficient), float(eps),
                                 float(trust_bounds[0]), float(trust_bounds[1]),
                                 LR_IS_PTR=lr_is_ptr, HAS_MOMENTUM=momentum != 0,
                                 NESTEROV=bool(nesterov), CLIP=bool(clip), PBLOCK=128,
                                 PARAM_BF16=ps[0].dtype == torch.bfloat16,
                                 **common)
    _finish_steps(state_steps, found_inf)
