r"""Fused LAMB and LARS steps as Triton kernels: many tensors per launch.

Design
------
*Tensor table and chunk table.* The tensors of one param group that share a
device, a dtype and the presence of fp32 master weights are described by an
``int64`` table, one row per tensor: the addresses of the parameter, the gradient,
the two state buffers, the fp32 master copy and the ``step`` counter, the element
count, the tensor's first chunk and chunk count, and two flag bits (adapt, decay).
Every tensor is cut into chunks of ``CHUNK`` elements; a chunk table maps each chunk
to ``(tensor, chunk index)`` and one Triton program handles one chunk, looping over
it in ``BLOCK``-wide vectors. A whole group is therefore one launch per pass, however
many tensors it has, without copying parameters into a flat buffer.

*Wide accesses.* An address read from a table tells Triton nothing about its
alignment, and a mask built from an element count read from memory may change at
any element, so by default the compiler emits one 4-byte access per element. Here a
chunk starts at a multiple of ``CHUNK`` elements (itself a multiple of ``BLOCK``);
its whole blocks run without a mask and only its last, partial block is masked. The
host checks that every address of a row is 16-byte aligned (PyTorch's allocator
aligns to 512 bytes; a view into a flat buffer may not be). The chunks of aligned
tensors run in a launch that declares their addresses 16-byte aligned
(``tl.multiple_of``) and the offsets of a block contiguous from a multiple of
``BLOCK``, so whole blocks move 16 bytes per access (``ld.global.v4.b32``: four fp32
or eight bf16 values); the chunks of other tensors run in a second launch without
that claim, with 2- or 4-byte accesses.

*Table cache and CUDA graphs.* Building a table walks the tensors, checks their
layouts and uploads through pinned memory (``non_blocking``), so tables are cached,
keyed by every address they hold, the element counts, the flags and the layout of
each gradient: a training loop whose tensors keep their addresses uploads nothing
and checks layouts only when something changed. The cache of recent tables is small
and is cleared when full, which hands their device memory back to the allocator —
memory that a captured CUDA graph reads again at every replay. So a table used while
a graph is captured is also held apart, for as long as the ``step`` tensor of the
table's first parameter lives (a graph that updates an optimizer's state is only
valid while that state lives), and is never evicted from there. Capture cannot
upload: run one eager step with the same tensors first (the warm-up that torch asks
for before capturing anyway), or capture fails with a message that says so.

*Devices.* Triton launches on the current CUDA device, so every launch runs under
``torch.cuda.device`` of its tensors, and the tensors of one call are grouped by
device.

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
and are compared with the for-loop reference in ``tests/optim``; the instructions
the compiler emits for sm_90 are checked in ``tests/optim/test_optim_triton_compile.py``.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from operator import attrgetter
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from gpuml.optim._common import dense_layout, interpreter_on

CHUNK = 65536
BLOCK = 1024
INTERPRET_CHUNK = 4096
INTERPRET_BLOCK = 1024
ALIGN = 16
RECENT_TABLES = 8

_P, _G, _M, _V, _W, _S, _N, _C0, _NC, _FL = range(10)
NCOL = 10
_ADAPT, _DECAY = 1, 2

_data_ptr = Tensor.data_ptr
_is_contiguous = Tensor.is_contiguous
_device_of, _dtype_of = attrgetter("device"), attrgetter("dtype")


class Tables(NamedTuple):
    """The device tables of one bucket of tensors.

    ``launches`` holds ``(chunk table, number of chunks, aligned)`` for the chunks of
    the 16-byte-aligned tensors and for those of the others (each only when non-empty);
    ``n_chunks`` counts all of them (the partial sums are indexed by a chunk's position
    in the whole bucket, so the two launches of a pass share one buffer).
    """

    tensors: Tensor
    launches: tuple[tuple[Tensor, int, bool], ...]
    n_chunks: int


_recent: dict[tuple, Tables] = {}
_captured: dict[int, dict[tuple, Tables]] = {}
_dummies: dict[torch.device, Tensor] = {}


def _sizes(chunk: int | None, block: int | None) -> tuple[int, int]:
    if interpreter_on():
        chunk, block = chunk or INTERPRET_CHUNK, block or INTERPRET_BLOCK
    else:
        chunk, block = chunk or CHUNK, block or BLOCK
    if block < ALIGN or block & (block - 1) or chunk % block:
        raise ValueError(f"block must be a power of two >= {ALIGN} and chunk a multiple of it "
                         f"(the kernels claim that blocks start at multiples of block); got "
                         f"chunk={chunk}, block={block}")
    return chunk, block


def _device_guard(device: torch.device):
    """Triton launches on the current device: make it the tensors' device."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _upload(rows: list[int], dtype, device: torch.device) -> Tensor:
    host = torch.tensor(rows, dtype=dtype)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host


def _check_layout(*columns) -> None:
    for tensors in zip(*columns):
        if not dense_layout(*tensors):
            raise ValueError("the fused path needs each parameter, its gradient and its state "
                             "to share one dense layout (contiguous or channels_last); use "
                             "foreach=True for other layouts")


def _build(columns: list, numels: tuple[int, ...], flags: tuple[int, ...],
           device: torch.device, chunk: int) -> Tables:
    """Check the layouts, then lay out and upload the tensor and chunk tables."""
    _check_layout(*(c for c in columns[:_S] if c is not None))
    ptrs = [[0] * len(numels) if c is None else [t.data_ptr() for t in c] for c in columns]
    rows: list[int] = []
    chunk_rows: dict[bool, list[int]] = {True: [], False: []}
    first = 0
    for i, n in enumerate(numels):
        nc = max(1, -(-n // chunk))
        row = [col[i] for col in ptrs]
        rows += row + [n, first, nc, flags[i]]
        aligned = all(a % ALIGN == 0 for a in row)
        chunk_rows[aligned] += [x for k in range(nc) for x in (i, k)]
        first += nc
    launches = tuple((_upload(r, torch.int32, device), len(r) // 2, aligned)
                     for aligned, r in chunk_rows.items() if r)
    return Tables(_upload(rows, torch.int64, device), launches, first)


def _tables(kind: str, columns: list, numels: tuple[int, ...], flags: tuple[int, ...],
            grads: list[Tensor], anchor: Tensor, device: torch.device, chunk: int) -> Tables:
    """The tables of ``columns`` (each a list of tensors, or None for a zero column).

    Cached under every address, count and flag they encode and each gradient's
    layout, so a hit needs no further checks; see the module docstring for why a
    table used under CUDA-graph capture is held as long as ``anchor`` lives.
    """
    key = (kind, device, chunk, flags, numels, tuple(map(_is_contiguous, grads)),
           *(None if c is None else tuple(map(_data_ptr, c)) for c in columns))
    hit = _recent.get(key)
    if hit is None:
        held = _captured.get(id(anchor))
        hit = held.get(key) if held else None
    capturing = _capturing(device)
    if hit is None:
        if capturing:
            raise RuntimeError("fused step under CUDA-graph capture with tensors it has not "
                               "seen: run one eager step with the same tensors before "
                               "capturing")
        hit = _build(columns, numels, flags, device, chunk)
        if len(_recent) >= RECENT_TABLES:
            _recent.clear()
        _recent[key] = hit
    if capturing:
        _hold(anchor, key, hit)
    return hit


def _hold(anchor: Tensor, key: tuple, tables: Tables) -> None:
    held = _captured.get(id(anchor))
    if held is None:
        held = _captured[id(anchor)] = {}
        weakref.finalize(anchor, _captured.pop, id(anchor), None)
    held[key] = tables


def _dummy(device: torch.device) -> Tensor:
    """A pointer for kernel arguments that a constexpr flag keeps from being read."""
    out = _dummies.get(device)
    if out is None:
        out = _dummies[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return out


def _scalar_arg(x, device) -> tuple[Tensor, float, bool]:
    """A kernel scalar that may live on the device: (pointer, value, is_pointer)."""
    if isinstance(x, Tensor):
        return x.to(device=device, dtype=torch.float32).reshape(1), 0.0, True
    return _dummy(device), float(x), False


def _log(beta: float) -> float:
    return math.log(beta) if beta > 0 else -math.inf


def _column_or_none(tensors: list) -> list | None:
    if any(t is None for t in tensors):
        if all(t is None for t in tensors):
            return None
        raise ValueError("a state buffer is missing for some tensors of a group only")
    return tensors


def _buckets(params: list[Tensor], masters: list) -> list[tuple[tuple, list[int]]]:
    """Indices of the tensors sharing (device, dtype, has master): one table each."""
    keys = list(zip(map(_device_of, params), map(_dtype_of, params),
                    [m is not None for m in masters]))
    if keys.count(keys[0]) == len(keys):
        return [(keys[0], list(range(len(keys))))]
    out: dict[tuple, list[int]] = {}
    for i, k in enumerate(keys):
        out.setdefault(k, []).append(i)
    return list(out.items())


def _pick(xs: list, idx: list[int]) -> list:
    return xs if len(idx) == len(xs) else [xs[i] for i in idx]


def _flags(adapt, decay, idx) -> tuple[int, ...]:
    return tuple((_ADAPT if adapt[i] else 0) | (_DECAY if decay[i] else 0) for i in idx)


def _coefficient(grad_scale, clip, device) -> Tensor | None:
    coef = None
    if grad_scale is not None:
        coef = 1.0 / grad_scale.to(device).float()
    if clip is not None:
        coef = clip.to(device) if coef is None else coef * clip.to(device)
    return None if coef is None else coef.reshape(1)


def _finish_steps(steps: list[Tensor], found_inf: Tensor | None) -> None:
    torch._foreach_add_(steps, 1.0)
    if found_inf is not None:
        f = found_inf.to(steps[0].device, torch.float32).reshape(())
        torch._foreach_sub_(steps, [f] * len(steps))


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
def _chunk(tab, chunks, found_inf, NCOL: tl.constexpr, CHUNK: tl.constexpr,
           BLOCK: tl.constexpr, HAS_INF: tl.constexpr):
    """This program's tensor row, its slot in the partial sums, and its element range:
    whole blocks in ``[start, full)``, the partial block in ``[full, end)``."""
    c = tl.program_id(0)
    ti = tl.load(chunks + 2 * c)
    ci = tl.load(chunks + 2 * c + 1)
    row = tab + ti * NCOL
    n = tl.load(row + 6)
    slot = tl.load(row + 7) + ci
    start = ci.to(tl.int64) * CHUNK
    end = tl.minimum(start + CHUNK, n)
    if HAS_INF:
        end = tl.where(tl.load(found_inf) != 0, start, end)
    full = end - (end - start) % BLOCK
    return row, slot, start, full, end


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
def _sumsq_kernel(tab, chunks, partials, g_w, NCOL: tl.constexpr, CHUNK: tl.constexpr,
                  BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    row, slot, start, full, end = _chunk(tab, chunks, None, NCOL, CHUNK, BLOCK, False)
    g = _column(row, 1, g_w, ALIGNED)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(start, full, BLOCK):
        x = _ld(g, _offsets(off, BLOCK), None, False).to(tl.float32)
        acc += x * x
    idx = _offsets(full, BLOCK)
    x = _ld(g, idx, idx < end, True).to(tl.float32)
    acc += x * x
    tl.store(partials + slot, tl.sum(acc, axis=0))


def sum_of_squares(grads: list[Tensor], chunk: int | None = None,
                   block: int | None = None) -> Tensor:
    """Sum of squares of all ``grads`` as a 0-d fp32 tensor on the first one's device."""
    chunk, block = _sizes(chunk, block)
    total = None
    for (device, _, _), idx in _buckets(grads, [None] * len(grads)):
        gs = _pick(grads, idx)
        with _device_guard(device):
            tables = _tables("sumsq", [None, gs, None, None, None, None],
                             tuple(map(Tensor.numel, gs)), (0,) * len(gs), gs, gs[0], device,
                             chunk)
            partials = torch.empty(tables.n_chunks, dtype=torch.float32, device=device)
            for chunks, n, aligned in tables.launches:
                _sumsq_kernel[(n,)](tables.tensors, chunks, partials, gs[0], NCOL=NCOL,
                                    CHUNK=chunk, BLOCK=block, ALIGNED=aligned)
            part = partials.sum().to(grads[0].device)
        total = part if total is None else total + part
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
def _lamb_pass1(tab, chunks, partials, p_w, g_w, f_w, coef, found_inf, beta1, beta2, beta3,
                lb1, lb2, omb2, eps, weight_decay, HAS_COEF: tl.constexpr, HAS_INF: tl.constexpr,
                HAS_MASTER: tl.constexpr, BIAS_CORRECTION: tl.constexpr,
                VARIANT: tl.constexpr, EPS_INSIDE: tl.constexpr, NCOL: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    row, slot, start, full, end = _chunk(tab, chunks, found_inf, NCOL, CHUNK, BLOCK, HAS_INF)
    g = _column(row, 1, g_w, ALIGNED)
    m = _column(row, 2, f_w, ALIGNED)
    v = _column(row, 3, f_w, ALIGNED)
    if HAS_MASTER:
        w = _column(row, 4, f_w, ALIGNED)
    else:
        w = _column(row, 0, p_w, ALIGNED)
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
    tl.store(partials + 2 * slot, tl.sum(acc_w, axis=0))
    tl.store(partials + 2 * slot + 1, tl.sum(acc_u, axis=0))


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
    wv = wv - step_size * u
    if HAS_MASTER:
        _st(w, idx, wv, mask, MASKED)
    _st(p, idx, _to_param(wv, p_w, PARAM_BF16), mask, MASKED)


@triton.jit
def _lamb_pass2(tab, chunks, partials, p_w, g_w, f_w, coef, found_inf, lr_ptr, lr_val,
                beta1, beta2, beta3, lb1, lb2, omb2, eps, weight_decay, lower, upper,
                HAS_COEF: tl.constexpr, HAS_INF: tl.constexpr, HAS_MASTER: tl.constexpr,
                LR_IS_PTR: tl.constexpr, BIAS_CORRECTION: tl.constexpr,
                VARIANT: tl.constexpr, EPS_INSIDE: tl.constexpr, NCOL: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr, PBLOCK: tl.constexpr,
                PARAM_BF16: tl.constexpr, ALIGNED: tl.constexpr):
    row, slot, start, full, end = _chunk(tab, chunks, found_inf, NCOL, CHUNK, BLOCK, HAS_INF)
    p = _column(row, 0, p_w, ALIGNED)
    g = _column(row, 1, g_w, ALIGNED)
    m = _column(row, 2, f_w, ALIGNED)
    v = _column(row, 3, f_w, ALIGNED)
    if HAS_MASTER:
        w = _column(row, 4, f_w, ALIGNED)
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
    for off in range(start, full, BLOCK):
        _lamb_apply(p, g, m, v, w, _offsets(off, BLOCK), None, scale, step_size, a_m, a_g,
                    a_v, a_g2, eps, wd, p_w, HAS_MASTER, VARIANT, EPS_INSIDE, PARAM_BF16,
                    False)
    idx = _offsets(full, BLOCK)
    _lamb_apply(p, g, m, v, w, idx, idx < end, scale, step_size, a_m, a_g, a_v, a_g2, eps, wd,
                p_w, HAS_MASTER, VARIANT, EPS_INSIDE, PARAM_BF16, True)


class _Launcher:
    """What every launch of one step shares, per device: the scalars that live there."""

    def __init__(self, grad_scale, clip, found_inf, lr):
        self.grad_scale, self.clip, self.found_inf, self.lr = grad_scale, clip, found_inf, lr

    def scalars(self, device):
        coef = _coefficient(self.grad_scale, self.clip, device)
        has_inf = self.found_inf is not None
        inf = self.found_inf.to(device).reshape(1) if has_inf else _dummy(device)
        lr_ptr, lr_val, lr_is_ptr = _scalar_arg(self.lr, device)
        return dict(coef=_dummy(device) if coef is None else coef, inf=inf, lr_ptr=lr_ptr,
                    lr_val=lr_val, HAS_COEF=coef is not None, HAS_INF=has_inf,
                    LR_IS_PTR=lr_is_ptr)


def lamb_step(params, grads, exp_avgs, exp_avg_sqs, master_params, state_steps, *, adapt,
              decay, clip, grad_scale, found_inf, lr, beta1, beta2, eps, weight_decay,
              bias_correction, grad_averaging, trust_bounds, eps_inside_sqrt, variant,
              chunk: int | None = None, block: int | None = None) -> None:
    """One fused LAMB step (see :func:`gpuml.optim.lamb`); tensors may span devices."""
    chunk, block = _sizes(chunk, block)
    launcher = _Launcher(grad_scale, clip, found_inf, lr)
    beta1, beta2, eps, weight_decay = float(beta1), float(beta2), float(eps), float(weight_decay)
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    var = {"lamb": 0, "nlamb": 1, "nnlamb": 2}[variant]
    logs = (_log(beta1), _log(beta2), 1.0 - beta2)
    for (device, dtype, has_master), idx in _buckets(params, master_params):
        ps, gs, ms, vs = (_pick(x, idx) for x in (params, grads, exp_avgs, exp_avg_sqs))
        steps = _pick(state_steps, idx)
        masters = _pick(master_params, idx) if has_master else None
        with _device_guard(device):
            s = launcher.scalars(device)
            tables = _tables("lamb", [ps, gs, ms, vs, masters, steps],
                             tuple(map(Tensor.numel, ps)), _flags(adapt, decay, idx), gs,
                             steps[0], device, chunk)
            partials = torch.empty(2 * tables.n_chunks, dtype=torch.float32, device=device)
            common = dict(HAS_COEF=s["HAS_COEF"], HAS_INF=s["HAS_INF"], HAS_MASTER=has_master,
                          BIAS_CORRECTION=bool(bias_correction), VARIANT=var,
                          EPS_INSIDE=bool(eps_inside_sqrt), NCOL=NCOL, CHUNK=chunk,
                          BLOCK=block)
            for chunks, n, aligned in tables.launches:
                _lamb_pass1[(n,)](tables.tensors, chunks, partials, ps[0], gs[0], ms[0],
                                  s["coef"], s["inf"], beta1, beta2, beta3, *logs, eps,
                                  weight_decay, ALIGNED=aligned, **common)
            for chunks, n, aligned in tables.launches:
                _lamb_pass2[(n,)](tables.tensors, chunks, partials, ps[0], gs[0], ms[0],
                                  s["coef"], s["inf"], s["lr_ptr"], s["lr_val"], beta1, beta2,
                                  beta3, *logs, eps, weight_decay, float(trust_bounds[0]),
                                  float(trust_bounds[1]), LR_IS_PTR=s["LR_IS_PTR"],
                                  PBLOCK=128, PARAM_BF16=dtype == torch.bfloat16,
                                  ALIGNED=aligned, **common)
            _finish_steps(steps, found_inf)


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
def _lars_pass1(tab, chunks, partials, p_w, g_w, f_w, coef, found_inf, momentum,
                weight_decay, HAS_COEF: tl.constexpr, HAS_INF: tl.constexpr,
                HAS_MASTER: tl.constexpr, NORMALIZED: tl.constexpr, NCOL: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    row, slot, start, full, end = _chunk(tab, chunks, found_inf, NCOL, CHUNK, BLOCK, HAS_INF)
    g = _column(row, 1, g_w, ALIGNED)
    buf = _column(row, 2, f_w, ALIGNED)
    if HAS_MASTER:
        w = _column(row, 4, f_w, ALIGNED)
    else:
        w = _column(row, 0, p_w, ALIGNED)
    flags = tl.load(row + 9)
    wd = tl.where((flags & 2) != 0, weight_decay, 0.0)
    scale = 1.0
    if HAS_COEF:
        scale = tl.load(coef)
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
    tl.store(partials + 2 * slot, tl.sum(acc_w, axis=0))
    tl.store(partials + 2 * slot + 1, tl.sum(acc_d, axis=0))


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
    wv = wv - lr * direction
    if HAS_MASTER:
        _st(w, idx, wv, mask, MASKED)
    _st(p, idx, _to_param(wv, p_w, PARAM_BF16), mask, MASKED)


@triton.jit
def _lars_pass2(tab, chunks, partials, p_w, g_w, f_w, coef, found_inf, lr_ptr, lr_val,
                momentum, dampening, weight_decay, trust_coefficient, eps, lower, upper,
                HAS_COEF: tl.constexpr, HAS_INF: tl.constexpr, HAS_MASTER: tl.constexpr,
                LR_IS_PTR: tl.constexpr, NORMALIZED: tl.constexpr,
                HAS_MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr, CLIP: tl.constexpr,
                NCOL: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                PBLOCK: tl.constexpr, PARAM_BF16: tl.constexpr, ALIGNED: tl.constexpr):
    row, slot, start, full, end = _chunk(tab, chunks, found_inf, NCOL, CHUNK, BLOCK, HAS_INF)
    p = _column(row, 0, p_w, ALIGNED)
    g = _column(row, 1, g_w, ALIGNED)
    buf = _column(row, 2, f_w, ALIGNED)
    if HAS_MASTER:
        w = _column(row, 4, f_w, ALIGNED)
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
    for off in range(start, full, BLOCK):
        _lars_apply(p, g, buf, w, _offsets(off, BLOCK), None, scale, lr, ratio, first,
                    momentum, dampening, wd, p_w, HAS_MASTER, NORMALIZED, HAS_MOMENTUM,
                    NESTEROV, PARAM_BF16, False)
    idx = _offsets(full, BLOCK)
    _lars_apply(p, g, buf, w, idx, idx < end, scale, lr, ratio, first, momentum, dampening,
                wd, p_w, HAS_MASTER, NORMALIZED, HAS_MOMENTUM, NESTEROV, PARAM_BF16, True)


def lars_step(params, grads, momentum_buffers, master_params, state_steps, *, adapt, decay,
              grad_scale, found_inf, lr, momentum, dampening, nesterov, weight_decay,
              trust_coefficient, eps, clip, trust_bounds, mode, chunk: int | None = None,
              block: int | None = None) -> None:
    """One fused LARS step (see :func:`gpuml.optim.lars`); tensors may span devices."""
    chunk, block = _sizes(chunk, block)
    launcher = _Launcher(grad_scale, None, found_inf, lr)
    normalized = mode == "normalized"
    for (device, dtype, has_master), idx in _buckets(params, master_params):
        ps, gs, steps = (_pick(x, idx) for x in (params, grads, state_steps))
        bufs = _column_or_none(_pick(momentum_buffers, idx))
        masters = _pick(master_params, idx) if has_master else None
        with _device_guard(device):
            s = launcher.scalars(device)
            tables = _tables("lars", [ps, gs, bufs, None, masters, steps],
                             tuple(map(Tensor.numel, ps)), _flags(adapt, decay, idx), gs,
                             steps[0], device, chunk)
            partials = torch.empty(2 * tables.n_chunks, dtype=torch.float32, device=device)
            f_w = _dummy(device) if bufs is None else bufs[0]
            common = dict(HAS_COEF=s["HAS_COEF"], HAS_INF=s["HAS_INF"], HAS_MASTER=has_master,
                          NORMALIZED=normalized, NCOL=NCOL, CHUNK=chunk, BLOCK=block)
            for chunks, n, aligned in tables.launches:
                _lars_pass1[(n,)](tables.tensors, chunks, partials, ps[0], gs[0], f_w,
                                  s["coef"], s["inf"], float(momentum), float(weight_decay),
                                  ALIGNED=aligned, **common)
            for chunks, n, aligned in tables.launches:
                _lars_pass2[(n,)](tables.tensors, chunks, partials, ps[0], gs[0], f_w,
                                  s["coef"], s["inf"], s["lr_ptr"], s["lr_val"],
                                  float(momentum), float(dampening), float(weight_decay),
                                  float(trust_coefficient), float(eps),
                                  float(trust_bounds[0]), float(trust_bounds[1]),
                                  LR_IS_PTR=s["LR_IS_PTR"], HAS_MOMENTUM=momentum != 0,
                                  NESTEROV=bool(nesterov), CLIP=bool(clip), PBLOCK=128,
                                  PARAM_BF16=dtype == torch.bfloat16, ALIGNED=aligned,
                                  **common)
            _finish_steps(steps, found_inf)
