"""The Triton kernels of the fused LAMB and LARS steps: the device side.

One program handles one chunk of one tensor, found through the tables that
:mod:`gpuml.optim._triton` builds and launches over (its docstring holds the design:
the tables, the aligned and unaligned launches, the norms inside the passes and the
bytes each pass moves). Pass 1 stores the chunk's two partial sums of squares (LAMB
steps its moments there, normalized LARS its momentum); pass 2 sums its tensor's
partials in a fixed order into the trust ratio and writes the weight (classic LARS
steps its momentum there). A chunk runs its whole blocks unmasked and only its last,
partial block masked (``MASKED``).

First the helpers both rules share (table columns, a chunk's range, loads and stores,
the gradient's factor, the step count, the sums of squares, the weight write) and the
norm kernels (:func:`_sumsq_kernel`: the gradients' global norm; :func:`_tensor_sumsq_kernel`:
per-tensor sums of sharded tensors between the passes); then LAMB's passes
(:func:`_lamb_pass1`, :func:`_lamb_pass2`) and LARS' (:func:`_lars_pass1`,
:func:`_lars_pass2`). Their names and signatures are what the host launches and what
``tests/optim/test_optim_triton_compile.py`` compiles ahead of time.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
def _column(row, col, like, ALIGNED: tl.constexpr):
    """Column ``col`` of a tensor-table row as a pointer of ``like``'s type."""
    ptr = tl.load(row + col).to(like.dtype)
    if ALIGNED:
        # the host checked it; without the claim every access is one element wide
        ptr = tl.multiple_of(ptr, 16)
    return ptr


@triton.jit
def _offsets(off, BLOCK: tl.constexpr):
    # off is a multiple of BLOCK: a chunk starts at a multiple of CHUNK, itself one of BLOCK
    return tl.max_contiguous(tl.multiple_of(off + tl.arange(0, BLOCK), BLOCK), BLOCK)


@triton.jit
def _ld(ptr, idx, mask, MASKED: tl.constexpr):
    if MASKED:
        x = tl.load(ptr + idx, mask=mask, other=0.0)
    else:
        x = tl.load(ptr + idx)
    return x


@triton.jit
def _st(ptr, idx, x, mask, MASKED: tl.constexpr):
    if MASKED:
        tl.store(ptr + idx, x, mask=mask)
    else:
        tl.store(ptr + idx, x)


@triton.jit
def _chunk(tab, chunks, found_inf, NCOL: tl.constexpr, CHUNK: tl.constexpr,
           BLOCK: tl.constexpr, HAS_INF: tl.constexpr):
    """This program's tensor row, its slot in the partial sums, its chunk index within the
    tensor, whether the step is taken (``found_inf`` is zero), and its element range:
    whole blocks in ``[start, full)``, the partial block in ``[full, end)``."""
    c = tl.program_id(0)
    ti = tl.load(chunks + 2 * c)
    ci = tl.load(chunks + 2 * c + 1)
    row = tab + ti * NCOL
    n = tl.load(row + 6)
    slot = tl.load(row + 7) + ci
    start = ci.to(tl.int64) * CHUNK
    end = tl.minimum(start + CHUNK, n)
    live = ci >= 0
    if HAS_INF:
        live = tl.load(found_inf) == 0
    end = tl.where(live, end, start)
    full = end - (end - start) % BLOCK
    return row, slot, ci, live, start, full, end


@triton.jit
def _pointers(row, p_w, g_w, f_w, HAS_MASTER: tl.constexpr, ALIGNED: tl.constexpr):
    """A tensor-table row's parameter, gradient and two state buffers (LARS has one: the
    second is null and never read), and the weight the update is computed on: the fp32
    master copy, or the parameter itself."""
    p = _column(row, 0, p_w, ALIGNED)
    g = _column(row, 1, g_w, ALIGNED)
    s0 = _column(row, 2, f_w, ALIGNED)
    s1 = _column(row, 3, f_w, ALIGNED)
    if HAS_MASTER:
        w = _column(row, 4, f_w, ALIGNED)
    else:
        w = p
    return p, g, s0, s1, w


@triton.jit
def _grad_coef(norm, max_norm, gscale, HAS_CLIP: tl.constexpr, HAS_SCALE: tl.constexpr):
    """The factor every gradient is multiplied by: ``1 / grad_scale`` (unscaling) times the
    global clipping factor ``1 / max(1, norm / max_norm)``, in the loop path's order. Read
    from device memory by every program: no host-side arithmetic per step."""
    coef = 1.0
    if HAS_SCALE:
        coef = 1.0 / tl.load(gscale).to(tl.float32)
    if HAS_CLIP:
        # max(r, 1) that keeps a NaN norm NaN, as torch.clamp does (tl.maximum would not)
        r = tl.load(norm).to(tl.float32) / max_norm
        coef = coef * (1.0 / tl.where(r < 1.0, 1.0, r))
    return coef


@triton.jit
def _tensor_factors(row, weight_decay, norm, max_norm, gscale, HAS_CLIP: tl.constexpr,
                    HAS_SCALE: tl.constexpr, MAXIMIZE: tl.constexpr):
    """A row's flags (1: adapted, 2: decayed), its weight decay (0 unless decayed) and the
    factor of its gradient (:func:`_grad_coef`), negated for ``MAXIMIZE``: -g * c equals
    g * -c exactly, so the gradient is negated first, as torch.optim does."""
    flags = tl.load(row + 9)
    wd = tl.where((flags & 2) != 0, weight_decay, 0.0)
    scale = _grad_coef(norm, max_norm, gscale, HAS_CLIP, HAS_SCALE)
    if MAXIMIZE:
        scale = -scale
    return flags, wd, scale


@triton.jit
def _step_in(row, partials, slot, ci, f_w):
    """Pass 1: the new step count ``step + 1``. The tensor's first chunk keeps it in the
    third column of its partials row for pass 2 (``step`` itself is read by every program
    of this pass, so it cannot be written here)."""
    t = tl.load(tl.load(row + 5).to(f_w.dtype)) + 1.0
    tl.store(partials + 3 * slot + 2, t, mask=ci == 0)
    return t


@triton.jit
def _step_out(row, partials, ci, live, f_w):
    """Pass 2: the new step count from pass 1, stored into ``step`` by the tensor's first
    chunk unless ``found_inf`` skips the step (then nothing changes, ``step`` included)."""
    t = tl.load(partials + 3 * tl.load(row + 7) + 2)
    tl.store(tl.load(row + 5).to(f_w.dtype), t, mask=(ci == 0) & live)
    return t


@triton.jit
def _store_sums(partials, slot, acc_w, acc_d):
    """Pass 1: the chunk's two partial sums of squares (weight, direction)."""
    tl.store(partials + 3 * slot, tl.sum(acc_w, axis=0))
    tl.store(partials + 3 * slot + 1, tl.sum(acc_d, axis=0))


@triton.jit
def _step_weight(p, w, wv, step, direction, idx, mask, p_w, HAS_MASTER: tl.constexpr,
                 PARAM_BF16: tl.constexpr, MASKED: tl.constexpr):
    """Pass 2 on one block, last: the weight ``wv - step * direction`` into the fp32 master
    copy (if any) and, rounded, into the parameter."""
    wv = wv - step * direction
    if HAS_MASTER:
        _st(w, idx, wv, mask, MASKED)
    _st(p, idx, _to_param(wv, p_w, PARAM_BF16), mask, MASKED)


@triton.jit
def _tensor_sumsq(row, partials, PBLOCK: tl.constexpr):
    """A tensor's two sums of squares: its chunks' partials from pass 1, in a fixed order."""
    c0 = tl.load(row + 7)
    nc = tl.load(row + 8)
    acc0 = tl.zeros([PBLOCK], dtype=tl.float32)
    acc1 = tl.zeros([PBLOCK], dtype=tl.float32)
    for k in range(c0, c0 + nc, PBLOCK):
        idx = k + tl.arange(0, PBLOCK)
        msk = idx < c0 + nc
        acc0 += tl.load(partials + 3 * idx, mask=msk, other=0.0)
        acc1 += tl.load(partials + 3 * idx + 1, mask=msk, other=0.0)
    return tl.sum(acc0, axis=0), tl.sum(acc1, axis=0)


@triton.jit
def _tensor_norms(row, chunks, partials, full_sq, PBLOCK: tl.constexpr,
                  REDUCED: tl.constexpr):
    """Pass 2: the two norms of this program's tensor. ``REDUCED``: the tensor is a shard,
    and ``full_sq`` holds the sums of squares of the full tensor (summed over the ranks),
    indexed by the tensor's row; else the sums of this tensor's own chunks."""
    if REDUCED:
        ti = tl.load(chunks + 2 * tl.program_id(0))
        s0 = tl.load(full_sq + 2 * ti)
        s1 = tl.load(full_sq + 2 * ti + 1)
    else:
        s0, s1 = _tensor_sumsq(row, partials, PBLOCK)
    return tl.sqrt(s0), tl.sqrt(s1)


@triton.jit
def _sumsq_kernel(tab, chunks, partials, g_w, NCOL: tl.constexpr, CHUNK: tl.constexpr,
                  BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    row, slot, _, _, start, full, end = _chunk(tab, chunks, None, NCOL, CHUNK, BLOCK, False)
    g = _column(row, 1, g_w, ALIGNED)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(start, full, BLOCK):
        x = _ld(g, _offsets(off, BLOCK), None, False).to(tl.float32)
        acc += x * x
    idx = _offsets(full, BLOCK)
    x = _ld(g, idx, idx < end, True).to(tl.float32)
    acc += x * x
    tl.store(partials + slot, tl.sum(acc, axis=0))


@triton.jit
def _tensor_sumsq_kernel(tab, partials, full_sq, NCOL: tl.constexpr, PBLOCK: tl.constexpr):
    """Between the passes of a sharded bucket: each tensor's (program's) two local sums of
    squares, into ``full_sq`` for the all-reduce over the ranks."""
    t = tl.program_id(0)
    s0, s1 = _tensor_sumsq(tab + t * NCOL, partials, PBLOCK)
    tl.store(full_sq + 2 * t, s0)
    tl.store(full_sq + 2 * t + 1, s1)


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
def _lamb_moments(g, m, v, w, idx, mask, scale, beta1, beta2, beta3, omb2, a_m, a_g, a_v,
                  a_g2, eps, wd, EPS_INSIDE: tl.constexpr, MASKED: tl.constexpr):
    """Pass 1 on one block: new moments, stored; squares of the weight and the update."""
    # every load before the first store: the compiler cannot move a load past a store
    # that may alias it, and each wait for memory costs a full round trip
    gv = _ld(g, idx, mask, MASKED).to(tl.float32) * scale
    mv = _ld(m, idx, mask, MASKED)
    vv = _ld(v, idx, mask, MASKED)
    wv = _ld(w, idx, mask, MASKED).to(tl.float32)
    mv = beta1 * mv + beta3 * gv
    vv = beta2 * vv + omb2 * gv * gv
    _st(m, idx, mv, mask, MASKED)
    _st(v, idx, vv, mask, MASKED)
    u = _lamb_update(mv, vv, gv, wv, a_m, a_g, a_v, a_g2, eps, wd, EPS_INSIDE)
    if MASKED:
        u = tl.where(mask, u, 0.0)
    return wv * wv, u * u


@triton.jit
def _lamb_pass1(tab, chunks, partials, p_w, g_w, f_w, norm, gscale, found_inf, max_norm,
                beta1, beta2, beta3, lb1, lb2, omb2, eps, weight_decay,
                HAS_CLIP: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_INF: tl.constexpr,
                HAS_MASTER: tl.constexpr, BIAS_CORRECTION: tl.constexpr,
                VARIANT: tl.constexpr, EPS_INSIDE: tl.constexpr, NCOL: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr,
                MAXIMIZE: tl.constexpr):
    """LAMB pass 1 on one chunk: the moments stepped; the partial sums of squares of the
    weight and of the update."""
    row, slot, ci, live, start, full, end = _chunk(tab, chunks, found_inf, NCOL, CHUNK,
                                                   BLOCK, HAS_INF)
    _, g, m, v, w = _pointers(row, p_w, g_w, f_w, HAS_MASTER, ALIGNED)
    t = _step_in(row, partials, slot, ci, f_w)
    _, wd, scale = _tensor_factors(row, weight_decay, norm, max_norm, gscale, HAS_CLIP,
                                   HAS_SCALE, MAXIMIZE)
    a_m, a_g, a_v, a_g2 = _lamb_coefs(t, beta1, beta2, beta3, lb1, lb2, omb2,
                                      BIAS_CORRECTION, VARIANT)
    acc_w = tl.zeros([BLOCK], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(start, full, BLOCK):
        dw, du = _lamb_moments(g, m, v, w, _offsets(off, BLOCK), None, scale, beta1, beta2,
                               beta3, omb2, a_m, a_g, a_v, a_g2, eps, wd, EPS_INSIDE, False)
        acc_w += dw
        acc_u += du
    idx = _offsets(full, BLOCK)
    dw, du = _lamb_moments(g, m, v, w, idx, idx < end, scale, beta1, beta2, beta3, omb2, a_m,
                           a_g, a_v, a_g2, eps, wd, EPS_INSIDE, True)
    acc_w += dw
    acc_u += du
    _store_sums(partials, slot, acc_w, acc_u)


@triton.jit
def _lamb_apply(p, g, m, v, w, idx, mask, scale, step_size, a_m, a_g, a_v, a_g2, eps, wd,
                p_w, HAS_MASTER: tl.constexpr, VARIANT: tl.constexpr,
                EPS_INSIDE: tl.constexpr, PARAM_BF16: tl.constexpr, MASKED: tl.constexpr):
    """Pass 2 on one block: recompute the update and apply it with the trust ratio."""
    if VARIANT == 0:
        gv = 0.0
    else:
        gv = _ld(g, idx, mask, MASKED).to(tl.float32) * scale
    mv = _ld(m, idx, mask, MASKED)
    vv = _ld(v, idx, mask, MASKED)
    wv = _ld(w, idx, mask, MASKED).to(tl.float32)
    u = _lamb_update(mv, vv, gv, wv, a_m, a_g, a_v, a_g2, eps, wd, EPS_INSIDE)
    _step_weight(p, w, wv, step_size, u, idx, mask, p_w, HAS_MASTER, PARAM_BF16, MASKED)


@triton.jit
def _lamb_pass2(tab, chunks, partials, full_sq, p_w, g_w, f_w, norm, gscale, found_inf,
                lr_ptr, max_norm, lr_val, beta1, beta2, beta3, lb1, lb2, omb2, eps,
                weight_decay, lower, upper, HAS_CLIP: tl.constexpr, HAS_SCALE: tl.constexpr,
                HAS_INF: tl.constexpr, HAS_MASTER: tl.constexpr,
                LR_IS_PTR: tl.constexpr, BIAS_CORRECTION: tl.constexpr,
                VARIANT: tl.constexpr, EPS_INSIDE: tl.constexpr, NCOL: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr, PBLOCK: tl.constexpr,
                PARAM_BF16: tl.constexpr, ALIGNED: tl.constexpr, REDUCED: tl.constexpr,
                MAXIMIZE: tl.constexpr):
    """LAMB pass 2 on one chunk: the tensor's trust ratio from its norms, then the update
    recomputed from the stored moments and applied."""
    row, slot, ci, live, start, full, end = _chunk(tab, chunks, found_inf, NCOL, CHUNK,
                                                   BLOCK, HAS_INF)
    p, g, m, v, w = _pointers(row, p_w, g_w, f_w, HAS_MASTER, ALIGNED)
    t = _step_out(row, partials, ci, live, f_w)
    flags, wd, scale = _tensor_factors(row, weight_decay, norm, max_norm, gscale, HAS_CLIP,
                                       HAS_SCALE, MAXIMIZE)
    a_m, a_g, a_v, a_g2 = _lamb_coefs(t, beta1, beta2, beta3, lb1, lb2, omb2,
                                      BIAS_CORRECTION, VARIANT)
    w_norm, u_norm = _tensor_norms(row, chunks, partials, full_sq, PBLOCK, REDUCED)
    ok = (w_norm > 0) & (u_norm > 0) & ((flags & 1) != 0)
    phi = tl.minimum(tl.maximum(w_norm, lower), upper)
    ratio = tl.where(ok, phi / tl.where(ok, u_norm, 1.0), 1.0)
    step_size = _load_scalar(lr_ptr, lr_val, LR_IS_PTR) * ratio
    for off in range(start, full, BLOCK):
        _lamb_apply(p, g, m, v, w, _offsets(off, BLOCK), None, scale, step_size, a_m, a_g,
                    a_v, a_g2, eps, wd, p_w, HAS_MASTER, VARIANT, EPS_INSIDE, PARAM_BF16,
                    False)
    idx = _offsets(full, BLOCK)
    _lamb_apply(p, g, m, v, w, idx, idx < end, scale, step_size, a_m, a_g, a_v, a_g2, eps, wd,
                p_w, HAS_MASTER, VARIANT, EPS_INSIDE, PARAM_BF16, True)


@triton.jit
def _lars_norms(g, buf, w, idx, mask, scale, momentum, wd, NORMALIZED: tl.constexpr,
                MASKED: tl.constexpr):
    """Pass 1 on one block: squares of the weight and of the gradient (classic) or of the
    new momentum (normalized, which stores it)."""
    gv = _ld(g, idx, mask, MASKED).to(tl.float32) * scale
    wv = _ld(w, idx, mask, MASKED).to(tl.float32)
    if NORMALIZED:
        mv = momentum * _ld(buf, idx, mask, MASKED) + (1.0 - momentum) * (gv + wd * wv)
        _st(buf, idx, mv, mask, MASKED)
        d2 = mv * mv
    else:
        d2 = gv * gv
    return wv * wv, d2


@triton.jit
def _lars_pass1(tab, chunks, partials, p_w, g_w, f_w, gscale, found_inf, momentum,
                weight_decay, HAS_SCALE: tl.constexpr, HAS_INF: tl.constexpr,
                HAS_MASTER: tl.constexpr, NORMALIZED: tl.constexpr, NCOL: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr,
                MAXIMIZE: tl.constexpr):
    """LARS pass 1 on one chunk: the partial sums of squares of the weight and of the
    gradient (eq. 5.1) or of the momentum, stepped here (Alg 15)."""
    row, slot, ci, live, start, full, end = _chunk(tab, chunks, found_inf, NCOL, CHUNK,
                                                   BLOCK, HAS_INF)
    _, g, buf, _, w = _pointers(row, p_w, g_w, f_w, HAS_MASTER, ALIGNED)
    _step_in(row, partials, slot, ci, f_w)
    _, wd, scale = _tensor_factors(row, weight_decay, gscale, 1.0, gscale, False, HAS_SCALE,
                                   MAXIMIZE)
    acc_w = tl.zeros([BLOCK], dtype=tl.float32)
    acc_d = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(start, full, BLOCK):
        dw, dd = _lars_norms(g, buf, w, _offsets(off, BLOCK), None, scale, momentum, wd,
                             NORMALIZED, False)
        acc_w += dw
        acc_d += dd
    idx = _offsets(full, BLOCK)
    dw, dd = _lars_norms(g, buf, w, idx, idx < end, scale, momentum, wd, NORMALIZED, True)
    acc_w += dw
    acc_d += dd
    _store_sums(partials, slot, acc_w, acc_d)


@triton.jit
def _lars_apply(p, g, buf, w, idx, mask, scale, lr, ratio, first, momentum, dampening, wd,
                p_w, HAS_MASTER: tl.constexpr, NORMALIZED: tl.constexpr,
                HAS_MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr,
                PARAM_BF16: tl.constexpr, MASKED: tl.constexpr):
    """Pass 2 on one block: the scaled direction, the momentum, the new weight."""
    wv = _ld(w, idx, mask, MASKED).to(tl.float32)
    if NORMALIZED:
        direction = ratio * _ld(buf, idx, mask, MASKED)
    else:
        gv = _ld(g, idx, mask, MASKED).to(tl.float32) * scale
        d = ratio * (gv + wd * wv)
        if HAS_MOMENTUM:
            bv = _ld(buf, idx, mask, MASKED)
            bv = tl.where(first, d, momentum * bv + (1.0 - dampening) * d)
            _st(buf, idx, bv, mask, MASKED)
            if NESTEROV:
                direction = d + momentum * bv
            else:
                direction = bv
        else:
            direction = d
    _step_weight(p, w, wv, lr, direction, idx, mask, p_w, HAS_MASTER, PARAM_BF16, MASKED)


@triton.jit
def _lars_pass2(tab, chunks, partials, full_sq, p_w, g_w, f_w, gscale, found_inf, lr_ptr,
                lr_val, momentum, dampening, weight_decay, trust_coefficient, eps, lower, upper,
                HAS_SCALE: tl.constexpr, HAS_INF: tl.constexpr, HAS_MASTER: tl.constexpr,
                LR_IS_PTR: tl.constexpr, NORMALIZED: tl.constexpr,
                HAS_MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr, CLIP: tl.constexpr,
                NCOL: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                PBLOCK: tl.constexpr, PARAM_BF16: tl.constexpr, ALIGNED: tl.constexpr,
                REDUCED: tl.constexpr, MAXIMIZE: tl.constexpr):
    """LARS pass 2 on one chunk: the tensor's local rate from its norms, then the momentum
    and the weight updated."""
    row, slot, ci, live, start, full, end = _chunk(tab, chunks, found_inf, NCOL, CHUNK,
                                                   BLOCK, HAS_INF)
    p, g, buf, _, w = _pointers(row, p_w, g_w, f_w, HAS_MASTER, ALIGNED)
    t = _step_out(row, partials, ci, live, f_w)
    flags, wd, scale = _tensor_factors(row, weight_decay, gscale, 1.0, gscale, False,
                                       HAS_SCALE, MAXIMIZE)
    lr = _load_scalar(lr_ptr, lr_val, LR_IS_PTR)
    w_norm, d_norm = _tensor_norms(row, chunks, partials, full_sq, PBLOCK, REDUCED)
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
    for off in range(start, full, BLOCK):
        _lars_apply(p, g, buf, w, _offsets(off, BLOCK), None, scale, lr, ratio, first,
                    momentum, dampening, wd, p_w, HAS_MASTER, NORMALIZED, HAS_MOMENTUM,
                    NESTEROV, PARAM_BF16, False)
    idx = _offsets(full, BLOCK)
    _lars_apply(p, g, buf, w, idx, idx < end, scale, lr, ratio, first, momentum, dampening,
                wd, p_w, HAS_MASTER, NORMALIZED, HAS_MOMENTUM, NESTEROV, PARAM_BF16, True)
