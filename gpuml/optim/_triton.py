r"""Fused LAMB and LARS steps as Triton kernels: many tensors per launch.

This module is the host side (the tables, their cache, the launches); the kernels
themselves are :mod:`gpuml.optim._triton_kernels`.

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
and checks layouts only when something changed. The scratch buffer the passes write
(see below) is allocated with the tables and lives as long as they do, so a step
allocates nothing. :func:`prepare` groups a call's tensors into buckets and finds
their tables; :func:`lamb_passes` / :func:`lars_passes` launch a prepared call. The
cache of recent tables is small and is cleared when full, which hands their device
memory back to the allocator — memory that a captured CUDA graph reads again at every
replay. So tables launched while a graph is captured are also held apart, for as long
as the ``step`` tensor of the bucket's first parameter lives (a graph that updates an
optimizer's state is only valid while that state lives), and are never evicted from
there. Capture cannot upload: run one eager step with the same tensors first (the
warm-up that torch asks for before capturing anyway), or capture fails with a message
that says so.

*Devices.* Triton launches on the current CUDA device, so every launch runs under
``torch.cuda.device`` of its tensors, and the tensors of one call are grouped by
device.

*Norms inside the passes.* Each program writes the partial sums of squares of
its chunk (weight and update for LAMB, weight and gradient/momentum for LARS)
to a ``[n_chunks, 3]`` scratch buffer. The second pass sums the partials of its own
tensor in a fixed order (deterministic, no atomics) and turns them into the
trust ratio, so no separate norm kernel and no host synchronisation is needed.

*Nothing per step on the host but launches.* ``lr`` (when a tensor), ``grad_scale``,
``found_inf`` and LAMB's global gradient norm are read from device memory inside the
kernels, which compute the clipping factor ``1 / max(1, norm / max_grad_norm)`` and the
unscaling ``1 / grad_scale`` themselves (apex passes the norm the same way); the norm
is one launch of :func:`_sumsq_kernel` per bucket over the step's own tables, then a
sum and a square root. The step count is advanced by the kernels too: every program of
pass 1 reads ``step`` and the first chunk of each tensor keeps ``step + 1`` in the third
column of its scratch row; pass 2 reads it from there and that chunk's program stores it
into ``step`` (pass 1 cannot: its other programs are still reading). A step with
``found_inf != 0`` makes every program's range empty and stores no step count, so
nothing changes.

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
from itertools import repeat
from operator import attrgetter
from typing import NamedTuple

import torch
from torch import Tensor

from gpuml.optim._layout import dense_layout, interpreter_on
from gpuml.optim._sharding import NormReduction, dtensor_type
from gpuml.optim._triton_kernels import (
    _lamb_pass1,
    _lamb_pass2,
    _lars_pass1,
    _lars_pass2,
    _sumsq_kernel,
    _tensor_sumsq_kernel,
)

CHUNK = 65536
BLOCK = 1024
INTERPRET_CHUNK = 4096
INTERPRET_BLOCK = 1024
ALIGN = 16
RECENT_TABLES = 8

_P, _G, _M, _V, _W, _S, _N, _C0, _NC, _FL = range(10)
NCOL = 10
_ADAPT, _DECAY = 1, 2
_VARIANT_IDS = {"lamb": 0, "nlamb": 1, "nnlamb": 2}

_data_ptr = Tensor.data_ptr
_is_contiguous = Tensor.is_contiguous
_device_of, _dtype_of = attrgetter("device"), attrgetter("dtype")


class Tables(NamedTuple):
    """The device tables of one bucket of tensors, and the scratch its passes write.

    ``launches`` holds ``(chunk table, number of chunks, aligned)`` for the chunks of
    the 16-byte-aligned tensors and for those of the others (each only when non-empty);
    ``n_chunks`` counts all of them (the partial sums are indexed by a chunk's position
    in the whole bucket, so the two launches of a pass share one buffer). ``scratch``
    (``[n_chunks, 3]`` fp32) takes pass 1's two partial sums of squares per chunk and, in
    the row of a tensor's first chunk, its new step count; every pass writes what it reads
    before it reads it, so one buffer serves every step and lives as long as the tables.
    ``full_sq`` (``[n_tensors, 2]`` fp32) takes, for sharded tensors, each tensor's two
    sums of squares, which are then summed over the ranks (:func:`lamb_passes`).
    """

    tensors: Tensor
    launches: tuple[tuple[Tensor, int, bool], ...]
    n_chunks: int
    scratch: Tensor
    n_tensors: int
    full_sq: Tensor


class Bucket(NamedTuple):
    """The tensors of a prepared call that share a device, dtypes, master weights and
    whether they are shards of tensors spread over several processes (``sharded``: their
    norms are summed over the ranks between the two passes)."""

    device: torch.device
    param_dtype: torch.dtype
    grad_dtype: torch.dtype
    has_master: bool
    sharded: bool
    tables: Tables
    key: tuple
    anchor: Tensor


class Prepared(NamedTuple):
    """What the launches of one call need beyond its scalars, and what it was built from.

    A caller that keeps the same tensor objects across steps (the optimizer classes do)
    reuses it while :meth:`matches` holds: the tables encode the addresses of the
    parameters, the gradients and the state, and a gradient's layout was checked when
    they were built. The state tensors are the caller's to keep (their identity is
    checked there); parameters and gradients can change their storage in place
    (``p.data = ...``, a new gradient each backward), so their addresses are compared.
    """

    buckets: tuple[Bucket, ...]
    param_ptrs: tuple[int, ...]
    grad_ptrs: tuple[int, ...]
    grad_contiguous: tuple[bool, ...]
    chunk: int
    block: int

    def matches(self, params: list[Tensor], grads: list[Tensor]) -> bool:
        try:
            return (tuple(map(_data_ptr, grads)) == self.grad_ptrs
                    and tuple(map(_is_contiguous, grads)) == self.grad_contiguous
                    and tuple(map(_data_ptr, params)) == self.param_ptrs)
        except RuntimeError:  # no storage (a sparse gradient): the full checks say why
            return False


_recent: dict[tuple, Tables] = {}
_captured: dict[int, dict[tuple, Tables]] = {}
_typed: dict[tuple, Tensor] = {}


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
    scratch = torch.empty(3 * first, dtype=torch.float32, device=device)
    full_sq = torch.empty(2 * len(numels), dtype=torch.float32, device=device)
    return Tables(_upload(rows, torch.int64, device), launches, first, scratch, len(numels),
                  full_sq)


def _tables(kind: str, columns: list, numels: tuple[int, ...], flags: tuple[int, ...],
            grads: list[Tensor], device: torch.device, chunk: int) -> tuple[Tables, tuple]:
    """The tables of ``columns`` (each a list of tensors, or None for a zero column), and
    their cache key.

    Cached under every address, count and flag they encode and each gradient's
    layout, so a hit needs no further checks. Under CUDA-graph capture nothing can be
    uploaded: tables not seen before are an error.
    """
    key = (kind, device, chunk, flags, numels, tuple(map(_is_contiguous, grads)),
           *(None if c is None else tuple(map(_data_ptr, c)) for c in columns))
    hit = _recent.get(key)
    if hit is None:
        for held in _captured.values():
            hit = held.get(key)
            if hit is not None:
                break
    if hit is None:
        if _capturing(device):
            raise RuntimeError("fused step under CUDA-graph capture with tensors it has not "
                               "seen: run one eager step with the same tensors before "
                               "capturing")
        hit = _build(columns, numels, flags, device, chunk)
        if len(_recent) >= RECENT_TABLES:
            _recent.clear()
        _recent[key] = hit
    return hit, key


def _hold(anchor: Tensor, key: tuple, tables: Tables) -> None:
    held = _captured.get(id(anchor))
    if held is None:
        held = _captured[id(anchor)] = {}
        weakref.finalize(anchor, _captured.pop, id(anchor), None)
    held[key] = tables


def _hold_if_capturing(bucket: Bucket) -> None:
    """A captured graph reads the bucket's tables at every replay: see the module docstring."""
    if _capturing(bucket.device):
        _hold(bucket.anchor, bucket.key, bucket.tables)


def _dummy(device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
    """A pointer of ``dtype`` for kernel arguments that are only typed, or that a constexpr
    flag keeps from being read (a real tensor held here would hold its memory)."""
    out = _typed.get((device, dtype))
    if out is None:
        out = _typed[device, dtype] = torch.zeros(1, dtype=dtype, device=device)
    return out


def _on(x: Tensor | None, device: torch.device) -> Tensor:
    """A device scalar (``norm``, ``grad_scale``, ``found_inf``) as a kernel pointer."""
    return _dummy(device) if x is None else x.to(device)


def _scalar_arg(x, device) -> tuple[Tensor, float, bool]:
    """A kernel scalar that may live on the device: (pointer, value, is_pointer)."""
    if isinstance(x, Tensor):
        return x.to(device=device, dtype=torch.float32), 0.0, True
    return _dummy(device), float(x), False


def _log(beta: float) -> float:
    return math.log(beta) if beta > 0 else -math.inf


def _column_or_none(tensors: list) -> list | None:
    if any(t is None for t in tensors):
        if all(t is None for t in tensors):
            return None
        raise ValueError("a state buffer is missing for some tensors of a group only")
    return tensors


def _buckets(params: list[Tensor], grads: list[Tensor], masters: list,
             sharded: list[bool] | None) -> list[tuple[tuple, list[int]]]:
    """Indices of the tensors sharing (device, dtype, grad dtype, has master, sharded): one
    table each."""
    keys = list(zip(map(_device_of, params), map(_dtype_of, params), map(_dtype_of, grads),
                    [m is not None for m in masters],
                    repeat(False) if sharded is None else sharded))
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


def prepare(kind: str, params: list[Tensor], grads: list[Tensor], state: tuple[list, list],
            master_params: list, state_steps: list[Tensor], adapt: list[bool],
            decay: list[bool], chunk: int | None = None, block: int | None = None,
            sharded: list[bool] | None = None) -> Prepared:
    """Group the tensors of one call into buckets and find (or build) their tables.

    ``state`` holds the two state columns of the update rule (LAMB's moments; LARS' momentum
    buffers and None), each a list over the tensors or None. ``sharded[i]``: tensor ``i`` is
    the local shard of a tensor spread over several processes (its norms are summed over the
    ranks: :mod:`gpuml.optim._sharding`); the tensors themselves are plain local tensors.
    """
    dtensor = dtensor_type()
    if dtensor is not None and any(map(isinstance, params, repeat(dtensor))):
        raise TypeError("the fused kernels take the local tensors of DTensor parameters; "
                        "gpuml.optim.LAMB/LARS and lamb()/lars() unwrap them (and sum the "
                        "norms of sharded ones over the ranks)")
    chunk, block = _sizes(chunk, block)
    buckets = []
    for (device, dtype, grad_dtype, has_master, is_sharded), idx in _buckets(
            params, grads, master_params, sharded):
        ps, gs, steps = (_pick(x, idx) for x in (params, grads, state_steps))
        cols = [None if c is None else _column_or_none(_pick(c, idx)) for c in state]
        masters = _pick(master_params, idx) if has_master else None
        tables, key = _tables(kind, [ps, gs, *cols, masters, steps],
                              tuple(map(Tensor.numel, ps)), _flags(adapt, decay, idx), gs,
                              device, chunk)
        buckets.append(Bucket(device, dtype, grad_dtype, has_master, is_sharded, tables, key,
                              steps[0]))
    return Prepared(tuple(buckets), tuple(map(_data_ptr, params)), tuple(map(_data_ptr, grads)),
                    tuple(map(_is_contiguous, grads)), chunk, block)


def grad_norm(preps: list[Prepared], reduction: NormReduction | None = None) -> Tensor:
    """L2 norm of the gradients of all ``preps`` together, as a 0-d fp32 tensor on the
    device of the first (no host synchronisation).

    One launch per bucket writes a partial sum of squares per chunk into one buffer per
    device; the partials are summed in a fixed order (deterministic, no atomics). The sum
    over sharded buckets is summed over the ranks by ``reduction`` (one scalar all-reduce).
    """
    by_device: dict[torch.device, list[tuple[Bucket, int, int]]] = {}
    for prep in preps:
        for b in prep.buckets:
            by_device.setdefault(b.device, []).append((b, prep.chunk, prep.block))
    local = sharded = None
    for device, buckets in by_device.items():
        buckets.sort(key=lambda entry: not entry[0].sharded)  # sharded first (stable)
        n_sharded = sum(b.tables.n_chunks for b, _, _ in buckets if b.sharded)
        with _device_guard(device):
            out = torch.empty(sum(b.tables.n_chunks for b, _, _ in buckets),
                              dtype=torch.float32, device=device)
            offset = 0
            for b, chunk, block in buckets:
                part = out[offset:] if offset else out
                for chunks, n, aligned in b.tables.launches:
                    _sumsq_kernel[(n,)](b.tables.tensors, chunks, part,
                                        _dummy(device, b.grad_dtype), NCOL=NCOL, CHUNK=chunk,
                                        BLOCK=block, ALIGNED=aligned)
                offset += b.tables.n_chunks
            if n_sharded == 0:
                local = _add(local, out.sum())
            else:
                sharded = _add(sharded, out[:n_sharded].sum())
                if n_sharded < offset:
                    local = _add(local, out[n_sharded:].sum())
    if sharded is not None:
        if reduction is None:
            raise RuntimeError("sharded tensors but no process group to sum their norms over")
        (summed,) = reduction.all_reduce([sharded.reshape(1)])
        local = _add(local, summed.reshape(()))
    return local.sqrt()


def _add(total: Tensor | None, x: Tensor) -> Tensor:
    return x if total is None else total + x.to(total.device)


def _two_passes(prep: Prepared, pass1: tuple, pass2: tuple, *, grad_scale: Tensor | None,
                found_inf: Tensor | None, lr, weight_decay, trust_bounds, maximize,
                tensors: dict | None = None):
    """The two passes of a fused step over the buckets of ``prep``, a generator.

    ``pass1`` and ``pass2`` are ``(kernel, arguments)``: a rule's pass and the arguments
    (numbers and constexprs, by name) that only the rule's kernels take; ``tensors`` the
    0-d tensors those read from device memory besides ``grad_scale`` and ``found_inf``
    (None: absent). Pass 1 runs on every bucket, then pass 2: at once for the unsharded
    buckets, and for the sharded ones after the one all-reduce of their partial squared
    norms (the ``yield``, answered by :func:`gpuml.optim._sharding.run_steps`).
    """
    tensors = {"gscale": grad_scale, "found_inf": found_inf, **(tensors or {})}
    lower, upper = float(trust_bounds[0]), float(trust_bounds[1])

    def first(b: Bucket) -> dict:
        device = b.device
        with _device_guard(device):
            _hold_if_capturing(b)
            args = {name: _on(x, device) for name, x in tensors.items()}
            args.update(p_w=_dummy(device, b.param_dtype), g_w=_dummy(device, b.grad_dtype),
                        f_w=_dummy(device), weight_decay=float(weight_decay),
                        HAS_SCALE=grad_scale is not None, HAS_INF=found_inf is not None,
                        HAS_MASTER=b.has_master, NCOL=NCOL, CHUNK=prep.chunk,
                        BLOCK=prep.block, MAXIMIZE=bool(maximize))
            _launch(b, pass1, args)
        return args

    def second(b: Bucket, args: dict, full_sq: Tensor | None) -> None:
        with _device_guard(b.device):
            lr_ptr, lr_val, lr_is_ptr = _scalar_arg(lr, b.device)
            _launch(b, pass2, dict(args, full_sq=args["f_w"] if full_sq is None else full_sq,
                                   lr_ptr=lr_ptr, lr_val=lr_val, lower=lower, upper=upper,
                                   LR_IS_PTR=lr_is_ptr, PBLOCK=128,
                                   PARAM_BF16=b.param_dtype == torch.bfloat16,
                                   REDUCED=full_sq is not None))

    sharded = []
    for b in prep.buckets:
        args = first(b)
        if b.sharded:
            sharded.append((b, args))
        else:
            second(b, args, None)
    if sharded:
        buckets = [b for b, _ in sharded]
        summed = yield _sharded_sums(buckets)
        for (b, args), full_sq in zip(sharded, _split_sums(summed, buckets)):
            second(b, args, full_sq)


def _launch(b: Bucket, kernel_args: tuple, args: dict) -> None:
    """One pass over a bucket: a launch per chunk table (aligned tensors, the others)."""
    kernel, rule_args = kernel_args
    for chunks, n, aligned in b.tables.launches:
        kernel[(n,)](b.tables.tensors, chunks, b.tables.scratch, ALIGNED=aligned, **args,
                     **rule_args)


def _sharded_sums(buckets: list[Bucket]) -> Tensor:
    """Each tensor's two local sums of squares (pass 1's partials summed per tensor) for the
    buckets of sharded tensors, in one vector: what is summed over the ranks."""
    parts = []
    for b in buckets:
        with _device_guard(b.device):
            _tensor_sumsq_kernel[(b.tables.n_tensors,)](b.tables.tensors, b.tables.scratch,
                                                         b.tables.full_sq, NCOL=NCOL,
                                                         PBLOCK=128)
        parts.append(b.tables.full_sq)
    if len(parts) == 1:
        return parts[0]
    return torch.cat([x.to(parts[0].device) for x in parts])


def _split_sums(summed: Tensor, buckets: list[Bucket]) -> list[Tensor]:
    out, offset = [], 0
    for b in buckets:
        n = 2 * b.tables.n_tensors
        out.append(summed[offset:offset + n].to(b.device))
        offset += n
    return out


def lamb_passes(prep: Prepared, *, global_grad_norm: Tensor | None,
                max_grad_norm: float | None, grad_scale: Tensor | None,
                found_inf: Tensor | None, lr, beta1, beta2, eps, weight_decay,
                bias_correction, grad_averaging, trust_bounds, eps_inside_sqrt, variant,
                maximize=False):
    """The two passes of a fused LAMB step over prepared tensors (``step`` included).

    A generator (driven by :func:`gpuml.optim._sharding.run_steps`): buckets of local tensors
    run both passes at once; buckets of sharded tensors run pass 1, then it yields their
    per-tensor sums of squares (weight, update) and runs their pass 2 with the sums over the
    ranks it receives. Without sharded buckets it never yields.
    """
    beta1, beta2 = float(beta1), float(beta2)
    clip = global_grad_norm is not None and max_grad_norm is not None
    rule = dict(max_norm=float(max_grad_norm) if clip else 1.0, beta1=beta1, beta2=beta2,
                beta3=1.0 - beta1 if grad_averaging else 1.0, lb1=_log(beta1),
                lb2=_log(beta2), omb2=1.0 - beta2, eps=float(eps), HAS_CLIP=clip,
                BIAS_CORRECTION=bool(bias_correction), VARIANT=_VARIANT_IDS[variant],
                EPS_INSIDE=bool(eps_inside_sqrt))
    yield from _two_passes(prep, (_lamb_pass1, rule), (_lamb_pass2, rule),
                           grad_scale=grad_scale, found_inf=found_inf, lr=lr,
                           weight_decay=weight_decay, trust_bounds=trust_bounds,
                           maximize=maximize, tensors={"norm": global_grad_norm if clip else None})


def lars_passes(prep: Prepared, *, grad_scale: Tensor | None, found_inf: Tensor | None, lr,
                momentum, dampening, nesterov, weight_decay, trust_coefficient, eps, clip,
                trust_bounds, mode, maximize=False):
    """The two passes of a fused LARS step over prepared tensors (``step`` included); a
    generator that yields the per-tensor sums of squares (weight, gradient or momentum) of
    sharded buckets between their passes, as :func:`lamb_passes`."""
    rule = dict(momentum=float(momentum), NORMALIZED=mode == "normalized")
    yield from _two_passes(
        prep, (_lars_pass1, rule),
        (_lars_pass2, dict(rule, dampening=float(dampening),
                           trust_coefficient=float(trust_coefficient), eps=float(eps),
                           HAS_MOMENTUM=momentum != 0, NESTEROV=bool(nesterov), CLIP=bool(clip))),
        grad_scale=grad_scale, found_inf=found_inf, lr=lr, weight_decay=weight_decay,
        trust_bounds=trust_bounds, maximize=maximize)
