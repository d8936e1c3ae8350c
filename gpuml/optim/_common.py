"""What the implementations of :mod:`gpuml.optim.lamb` and :mod:`gpuml.optim.lars` share.

The choice of the path an update takes (:func:`choose_path`, the one place it is made),
what a path's update runs on (:func:`update_inputs`: local real tensors and, on the Triton
path, its launch tables), the dtypes an update is computed in, the state handling the
implementations share, and what each implementation does the same way for both rules:
the for-loop paths' walk over the tensors and their scratch buffers, the foreach paths'
start, norms and copy-back, the gradient's factor (unscaling, clipping, ``maximize``) and
the global gradient norm. The optimizer class around the rules is
:mod:`gpuml.optim._optimizer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import torch
from torch import Tensor

from gpuml.optim import _sharding as S
from gpuml.optim._layout import dense_layout, interpreter_on, triton_available  # noqa: F401

#: dtypes the update is computed in as they are (the others are computed in float32)
_WIDE = (torch.float32, torch.float64)
#: complex parameters are updated through torch.view_as_real, as torch.optim does
_COMPLEX = (torch.complex64, torch.complex128)

# C-level attribute getters: a step touches every tensor several times, and with a few
# hundred tensors the Python overhead per tensor is what the step time is made of
_device, _dtype, _is_cuda = attrgetter("device"), attrgetter("dtype"), attrgetter("is_cuda")
_grad, _is_sparse = attrgetter("grad"), attrgetter("is_sparse")


#: The paths of an update: the for-loop reference, ``torch._foreach_*``, and the two fused
#: ones (Triton kernels over every tensor of a group; numba kernels per CPU tensor).
PATHS = ("loop", "foreach", "triton", "numba")
#: The fused paths read and advance ``step`` in their kernels: it lives on the device.
FUSED_PATHS = ("triton", "numba")


def choose_path(params: Sequence[Tensor], foreach: bool | None, fused: bool | None,
                grads: Sequence[Tensor] | None = None, differentiable: bool = False) -> str:
    """The path of :data:`PATHS` an update of ``params`` takes: the one place it is chosen,
    for the optimizer classes (once per :class:`gpuml.optim._optimizer.GroupView`) and for
    the functional :func:`gpuml.optim.lamb` / :func:`gpuml.optim.lars` (per call).

    Unless asked explicitly: ``"triton"`` on CUDA tensors, ``"loop"`` on CPU tensors,
    ``"foreach"`` otherwise (CUDA without Triton, float64, complex). ``fused=True`` runs
    ``"triton"`` on CUDA tensors (and on CPU tensors under ``TRITON_INTERPRET=1``, Triton's
    interpreter: how the GPU kernels are tested without a GPU) and ``"numba"`` on CPU
    tensors (:mod:`gpuml.optim._numba`).

    The CPU has no multi-tensor kernels: ``torch._foreach_*`` there loops over the tensors
    with the per-tensor operation, so the foreach path does the loop's arithmetic one
    operation at a time over all tensors (nothing stays in cache from one operation to
    the next) and with a fresh list of temporaries per operation, while the loop path
    updates one tensor start to finish in reused scratch buffers (faster than the foreach
    step on ResNet-50 shapes: ``bench/bench_optim_cpu.py``,
    ``bench/results/cpu-2core/optim_cpu.md``).

    ``params`` and ``grads`` are local tensors (not DTensors); ``grads`` defaults to the
    parameters' ``.grad``. ``differentiable=True`` takes the loop (the only path autograd can
    record) and refuses the others, as torch.optim does. Without tensors every path does
    nothing: ``"loop"``.
    """
    if fused and foreach:
        raise ValueError("fused=True and foreach=True are mutually exclusive")
    if differentiable:
        check_differentiable(foreach, fused)
        return "loop"
    if not params:
        return "loop"
    # the fused kernels compute in float32: float64 parameters take the foreach path by
    # default and are refused when the fused path is asked for explicitly
    wide = next((p.dtype for p in params if p.dtype == torch.float64 or p.is_complex()), None)
    if fused:
        if wide is not None:
            raise TypeError(f"fused=True computes in float32 on real tensors and does not take "
                            f"{wide} parameters; use foreach=True (the default on float64 and "
                            f"complex parameters) or foreach=False")
        if all(map(_is_cuda, params)):
            return "triton"
        if all(p.device.type == "cpu" for p in params):
            return "triton" if interpreter_on() else "numba"
        devices = sorted({str(p.device) for p in params})
        raise RuntimeError(f"fused=True runs on CUDA or CPU tensors, got parameters on "
                           f"{devices}; use foreach=True or foreach=False there")
    if foreach is False:
        return "loop"
    if foreach:
        return "foreach"
    if fused is None and wide is None and all(map(_is_cuda, params)) and triton_available():
        grads = list(map(_grad, params)) if grads is None else grads
        if all(p.is_contiguous() and g.is_contiguous() or dense_layout(p, g)
               for p, g in zip(params, grads)):
            return "triton"
    if all(p.device.type == "cpu" for p in params):
        return "loop"
    return "foreach"


def check_differentiable(foreach: bool | None, fused: bool | None) -> None:
    """``differentiable=True`` runs the loop path only (torch.optim refuses ``fused`` with it
    by this error too; its foreach path asserts)."""
    for name, value in (("fused", fused), ("foreach", foreach)):
        if value:
            raise RuntimeError(f"`{name}` does not support `differentiable`: "
                               "differentiable=True runs the for-loop path (foreach=False)")


def compute_dtype(t: Tensor) -> torch.dtype:
    """The dtype a tensor's update and state are computed in: float64 for float64 tensors
    and complex ones for complex tensors (as torch.optim keeps the state in the parameter's
    dtype), float32 otherwise."""
    return t.dtype if t.dtype in _WIDE or t.dtype in _COMPLEX else torch.float32


def as_real(tensors: Sequence) -> list:
    """``torch.view_as_real`` of the complex tensors (others, and None, as they are): the
    update of a complex parameter is that of its real and imaginary parts as one real
    tensor, as torch.optim does; norms of the view are the complex norms."""
    return [torch.view_as_real(t) if t is not None and t.is_complex() else t
            for t in tensors]


def widen(t: Tensor) -> Tensor:
    """``t`` itself when float32 or float64, else its float32 copy (fp16/bf16 gradients)."""
    return t if t.dtype in _WIDE else t.float()


def compute_view(p: Tensor, master: Tensor | None) -> Tensor:
    """The tensor the update is computed on: the master copy, or the parameter (itself when
    float32 or float64, else a float32 copy)."""
    if master is not None:
        return master
    return widen(p)


def step_value(step: Tensor) -> float:
    return float(step.item()) if step.device.type == "cpu" else float(step)


_constants: dict[tuple, Tensor] = {}


def device_constant(values: Sequence, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A small constant vector on ``device``, uploaded once and cached.

    A fresh ``torch.tensor(..., device="cuda")`` copies from pageable memory, which
    synchronises; cached, the multi-tensor path makes no host synchronisation after the
    first step.
    """
    key = (tuple(values), dtype, torch.device(device))
    hit = _constants.get(key)
    if hit is None:
        if len(_constants) > 64:
            _constants.clear()
        hit = _constants[key] = torch.tensor(list(values), dtype=dtype, device=device)
    return hit


class Scratch:
    """Temporaries that the for-loop paths reuse from one tensor to the next.

    The loop paths update one tensor start to finish before the next, so a handful of
    buffers as large as the largest tensor serve every tensor of a step. On the CPU a
    fresh temporary per operation costs more than the operation: memory that large comes
    from ``mmap`` and every page of it faults on first touch. ``take(k, like)``
    is buffer ``k`` viewed with ``like``'s shape (contiguous; ``like`` may be
    channels-last, elementwise operations do not care). Disabled (``fresh=True``, for
    ``differentiable=True`` where autograd refuses ``out=``, and where a step must keep
    every tensor's temporaries at once), it gives None: ``torch.mul(a, b, out=None)``
    allocates as usual.
    """

    __slots__ = ("_fresh", "_size", "_bufs")

    def __init__(self, tensors: Sequence[Tensor], fresh: bool = False):
        self._fresh = fresh
        self._size = max((t.numel() for t in tensors), default=0)
        self._bufs: dict[tuple, Tensor] = {}

    def take(self, k: int, like: Tensor) -> Tensor | None:
        if self._fresh:
            return None
        key = (k, like.dtype)
        buf = self._bufs.get(key)
        if buf is None:
            buf = self._bufs[key] = torch.empty(self._size, dtype=like.dtype,
                                                device=like.device)
        return buf[:like.numel()].view(like.shape)


def add_scaled_(x: Tensor, y: Tensor, a) -> Tensor:
    """``x += a y`` in place, ``a`` a number or a 0-d tensor (not read on the host)."""
    return x.addcmul_(y, a) if isinstance(a, Tensor) else x.add_(y, alpha=a)


def skip_step(found_inf: Tensor | None) -> bool:
    """The loop and foreach paths read ``found_inf`` on the host (one synchronisation)."""
    return found_inf is not None and bool(found_inf.item())


def global_grad_norm(parts: Sequence[tuple], reduction: S.NormReduction | None,
                     grad_scale: Tensor | None) -> Tensor:
    """LAMB's global gradient norm for clipping, over every param group at once (as apex and
    timm do), unscaled by ``grad_scale``: a 0-d fp32 tensor (no host synchronisation).

    ``parts``: each group's ``(grads, sharding, path, prepared)`` (local tensors, their
    :class:`gpuml.optim._sharding.Sharding`, the group's path and the Triton path's launch
    tables, see :func:`update_inputs`). When every group has launch tables the norm is taken
    by the Triton kernels over them (:func:`gpuml.optim._triton.grad_norm`), else by torch's
    norms (:func:`torch._foreach_norm` when a group takes the foreach path). The squared
    norms of the sharded tensors are summed over the ranks by ``reduction`` (one scalar
    all-reduce for all groups).
    """
    if all(prepared is not None for _, _, _, prepared in parts):
        from gpuml.optim import _triton

        norm = _triton.grad_norm([prepared for _, _, _, prepared in parts], reduction)
    else:
        impl = "foreach" if any(path == "foreach" for _, _, path, _ in parts) else "loop"
        norm = _torch_grad_norm([(grads, sharding) for grads, sharding, _, _ in parts], impl,
                                reduction)
    if grad_scale is not None:
        norm = norm / grad_scale.to(norm.device).float()
    return norm


def _torch_grad_norm(parts: Sequence[tuple[Sequence[Tensor], S.Sharding | None]], impl: str,
                     reduction: S.NormReduction | None) -> Tensor:
    """L2 norm of all gradients together by torch's norms (:func:`torch._foreach_norm` for
    ``impl="foreach"``); ``parts``: each group's gradients and their sharding."""
    norms = [(_per_tensor_norms(grads, impl), sharding) for grads, sharding in parts if grads]
    if not norms:
        return torch.zeros((), dtype=torch.float32)
    device = norms[0][0].device
    if all(sharding is None for _, sharding in norms):
        return torch.linalg.vector_norm(torch.cat([n.to(device) for n, _ in norms]))
    local_sq, sharded_sq = [], []
    for group_norms, sharding in norms:
        sq = group_norms.to(device).square()
        index = None if sharding is None else sharding.index_on(device)
        if sharding is None:
            local_sq.append(sq.sum())
        elif index is None:
            sharded_sq.append(sq.sum())
        else:
            sharded_sq.append(sq[index].sum())
            sq = sq.clone()
            sq[index] = 0.0
            local_sq.append(sq.sum())
    (total,) = reduction.all_reduce([torch.stack(sharded_sq).sum().reshape(1)])
    total = total.reshape(())
    if local_sq:
        total = total + torch.stack(local_sq).sum()
    return total.sqrt()


def _per_tensor_norms(grads: Sequence[Tensor], impl: str) -> Tensor:
    """The L2 norm of each gradient, in order, on the first gradient's device: float32, or
    float64 when any gradient is float64 (a float32 global norm would round the clipping
    factor of float64 parameters)."""
    device = grads[0].device
    dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    if impl != "foreach":
        return torch.stack([torch.linalg.vector_norm(g, dtype=dtype).to(device)
                            for g in grads])
    by_key: dict[tuple, list[int]] = {}
    for i, g in enumerate(grads):
        by_key.setdefault((g.device, g.dtype), []).append(i)
    if len(by_key) == 1:
        return torch.stack(torch._foreach_norm(list(grads), 2, dtype=dtype))
    out: list = [None] * len(grads)
    for idx in by_key.values():
        for i, n in zip(idx, torch._foreach_norm([grads[i] for i in idx], 2, dtype=dtype)):
            out[i] = n.to(device)
    return torch.stack(out)


def scaled_step_coefficient(grad_scale: Tensor | None, global_grad_norm: Tensor | None = None,
                            max_grad_norm: float | None = None) -> Tensor | None:
    """The one factor every gradient is multiplied by (None for 1): ``1 / grad_scale``
    (unscaling) times, when LAMB clips, apex/timm's global clipping factor
    ``1 / max(1, global_grad_norm / max_grad_norm)``."""
    coef = None
    if grad_scale is not None:
        coef = 1.0 / grad_scale.float()
    if global_grad_norm is not None and max_grad_norm is not None:
        clip = 1.0 / torch.clamp(global_grad_norm / max_grad_norm, min=1.0)
        coef = clip if coef is None else coef * clip
    return coef


def signed_factor(coef: Tensor | None, maximize: bool) -> Tensor | float | None:
    """``coef`` with ``maximize``'s sign folded in (None for 1): maximize negates the
    gradient before anything else, as torch.optim does, and (-c) g is exactly -(c g), so
    the sign costs no pass of its own."""
    if not maximize:
        return coef
    return -1.0 if coef is None else -coef


def zero_state(p: Tensor) -> Tensor:
    """A state buffer for ``p``, zero: in the dtype the update is computed in, in ``p``'s
    layout."""
    return torch.zeros_like(p, dtype=compute_dtype(p), memory_format=torch.preserve_format)


def local_real(dtensors: bool, params: list, grads: list, columns: Sequence[list],
               masters: list) -> tuple[bool, list, list, list, list]:
    """The tensors an update runs on: the local tensors of DTensors (``dtensors``; each
    state tensor must have its parameter's local shape) and real views of complex tensors
    (see :func:`as_real`). Returns whether there were complex tensors, then ``params``,
    ``grads``, ``columns`` (the rule's state, a list per key) and ``masters`` as the update
    sees them."""
    if dtensors:
        params, grads, masters = S.local(params), S.local(grads), S.local(masters)
        columns = [S.local(c) for c in columns]
        S.check_local_shapes(params, *columns, masters)
    is_complex = any(p.is_complex() for p in params)
    if is_complex:
        params, grads, masters = as_real(params), as_real(grads), as_real(masters)
        columns = [as_real(c) for c in columns]
    return is_complex, params, grads, list(columns), masters


def update_inputs(kind: str, path: str, dtensors: bool, sharding: S.Sharding | None,
                  params: list, grads: list, columns: Sequence[list], masters: list,
                  steps: list[Tensor], adapt: list[bool], decay: list[bool]):
    """What an update on ``path`` runs on: the local real tensors (:func:`local_real`) and,
    on the Triton path, its launch tables for rule ``kind`` (``prepared``, see
    :func:`gpuml.optim._triton.prepare`; None on the other paths), built here once so that
    the optimizer classes keep them from step to step.

    Returns ``(is_complex, params, grads, columns, masters, prepared)``.
    """
    is_complex, params, grads, columns, masters = local_real(dtensors, params, grads, columns,
                                                             masters)
    prepared = None
    if path == "triton":
        from gpuml.optim import _triton

        prepared = _triton.prepare(kind, params, grads, (*columns, None)[:2], masters, steps,
                                   adapt, decay,
                                   sharded=None if sharding is None else sharding.flags)
    return is_complex, params, grads, columns, masters, prepared


def functional_inputs(kind: str, params: list, grads: list, columns: Sequence[list],
                      masters: list, steps: list[Tensor], adapt: list[bool], decay: list[bool],
                      foreach: bool | None, fused: bool | None, differentiable: bool):
    """What the functional :func:`gpuml.optim.lamb` / :func:`gpuml.optim.lars` hand to their
    step, as the optimizer classes build it for a param group: DTensors inspected
    (:func:`gpuml.optim._sharding.inspect`), the path chosen on the local tensors
    (:func:`choose_path`), the tensors the update runs on (:func:`update_inputs`).

    Returns ``(params, grads, columns, masters, path, prepared, sharding)``.
    """
    dtensors, sharding = S.inspect(params, grads)
    local_params, local_grads = (S.local(params), S.local(grads)) if dtensors \
        else (params, grads)
    path = choose_path(local_params, foreach, fused, local_grads, differentiable)
    _, params, grads, columns, masters, prepared = update_inputs(
        kind, path, dtensors, sharding, params, grads, columns, masters, steps, adapt, decay)
    return params, grads, columns, masters, path, prepared, sharding


def layerwise_loop(n: int, adapt: Sequence[bool], sharding: S.Sharding | None, prepare, norms,
                   apply):
    """How the for-loop paths walk their ``n`` tensors; a generator, as the other paths.

    ``part = prepare(i)`` steps tensor ``i``'s state and returns what its update needs;
    ``norms(*part)`` its two norms as a ``[2]`` tensor (the weight's, the direction's), taken
    when ``adapt[i]``; ``apply(*part, norms)`` updates it, ``norms`` a pair of 0-d tensors,
    or None for a tensor left out of adaptation (trust ratio 1).

    Without sharded tensors each tensor is updated start to finish before the next: what
    ``prepare`` computed is still in cache for its norms and its update, and a few
    :class:`Scratch` buffers serve every tensor. With sharded tensors (``sharding``) every
    tensor is prepared first; the generator then yields the partial squared norms once and
    receives their sums over the ranks (:func:`gpuml.optim._sharding.run_steps`).
    """
    if sharding is None:
        for i in range(n):
            part = prepare(i)
            apply(*part, tuple(norms(*part)) if adapt[i] else None)
        return
    parts = [prepare(i) for i in range(n)]
    if any(adapt):
        stacked = torch.stack([norms(*part) for part in parts], dim=1)
        w_norms, d_norms = yield from S.full_norms(stacked, sharding)
    for i, part in enumerate(parts):
        apply(*part, (w_norms[i], d_norms[i]) if adapt[i] else None)


def foreach_start(params: list[Tensor], grads: list[Tensor], state_steps: list[Tensor], *,
                  found_inf: Tensor | None, differentiable: bool, maximize: bool,
                  grad_scale: Tensor | None, global_grad_norm: Tensor | None = None,
                  max_grad_norm: float | None = None) -> list[Tensor] | None:
    """How a foreach step starts: None when it has nothing to do (no tensors, or the scaler
    found an inf; ``differentiable=True`` is refused, as torch.optim does), else the
    gradients it steps with, every step count advanced. The gradients are widened to the
    compute dtype, negated first for ``maximize`` (as torch.optim does) and multiplied by
    :func:`scaled_step_coefficient`."""
    if differentiable:
        check_differentiable(True, False)
    if not params or skip_step(found_inf):
        return None
    coef = scaled_step_coefficient(grad_scale, global_grad_norm, max_grad_norm)
    gs = [widen(g) for g in grads]
    if maximize:
        gs = torch._foreach_neg(gs)
    if coef is not None:
        gs = torch._foreach_mul(gs, coef.to(params[0].device))
    torch._foreach_add_(state_steps, 1.0)
    return gs


def foreach_norms(ws: list[Tensor], ds: list[Tensor], sharding: S.Sharding | None):
    """The norms of the weights ``ws`` and of the directions ``ds``, a ``[2, n]`` tensor
    (of the full tensors for sharded ones: yields as
    :func:`gpuml.optim._sharding.full_norms`)."""
    norms = torch.stack([torch.stack(torch._foreach_norm(ws)),
                         torch.stack(torch._foreach_norm(ds))])
    return (yield from S.full_norms(norms, sharding))


def foreach_copy_back(params: list[Tensor], ws: list[Tensor]) -> None:
    """Round each updated compute view into its parameter where they differ (the fp32
    master copy, or the float32 copy of an fp16/bf16 parameter)."""
    low = [(p, w) for p, w in zip(params, ws) if w is not p]
    if low:
        torch._foreach_copy_([p for p, _ in low], [w for _, w in low])
