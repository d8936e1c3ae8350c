r"""LARS: layer-wise adaptive rate scaling (You 2020 eq. 5.1 and Alg 15; You et al. 2019 §3.5).

Same structure as :mod:`gpuml.optim.lamb`: :class:`LARS` and :func:`lars` →
:func:`_lars_step` (the dispatch on the path) → :func:`_single_tensor_lars` (reference) /
:func:`_multi_tensor_lars` (``torch._foreach_*``) / :func:`_fused_lars` (Triton,
:mod:`gpuml.optim._triton`, on CUDA) / :func:`_fused_cpu_lars` (numba,
:mod:`gpuml.optim._numba`, on the CPU).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpuml.optim import _common as C
from gpuml.optim import _sharding as S
from gpuml.optim._optimizer import (
    LayerwiseOptimizer,
    check_beta,
    check_bounds,
    check_nonneg,
    check_positive,
    pinned_to_fused,
)

__all__ = ["LARS", "FusedLARS", "lars"]

_MODES = ("classic", "normalized")


class LARS(LayerwiseOptimizer):
    r"""LARS optimizer (You, Gitman & Ginsburg; You 2020 eq. 5.1, §5.3 and Algorithm 15).

    ``mode="classic"`` is the five-step sequence of chapter 5 with torch's SGD
    momentum (lr applied after the momentum buffer, as in ``torch.optim.SGD``,
    timm and apex; identical to the thesis' :math:`a = \mu a + \eta\nabla w`
    while the learning rate is constant):

    .. math::

        \alpha &= l\,\frac{\|w\|}{\|g\| + \beta\|w\| + \epsilon}, \qquad
            \alpha \leftarrow \min(\max(\alpha, r_l), r_u), \qquad
            \alpha \leftarrow \min(\alpha/\gamma, 1)\ \text{(clip)}\\
        d &= \alpha\,(g + \beta w)\\
        a &= \mu a + (1-\text{dampening})\, d \quad (a = d \text{ at the first step})\\
        w &\leftarrow w - \gamma\,(d + \mu a \text{ if nesterov else } a)

    with :math:`l` the trust coefficient, :math:`\beta` the weight decay and
    :math:`\gamma` the learning rate. (The thesis prints the denominator of step
    (1) as :math:`\|\nabla w\| + \beta\|\nabla w\|`; we use
    :math:`\|\nabla w\| + \beta\|w\|`, the form of the original LARS paper,
    apex's LARC and timm.)

    ``mode="normalized"`` is Algorithm 15 (normalized momentum):

    .. math::

        m_t &= \mu m_{t-1} + (1-\mu)(g + \beta w)\\
        w &\leftarrow w - \gamma\, \alpha\, m_t, \qquad
            \alpha = l\,\frac{\|w\|}{\|m_t\| + \epsilon}

    (``trust_coefficient=1``, ``eps=0`` give exactly :math:`\phi(z)=z`).

    In both modes :math:`\alpha = 1` when :math:`\|w\| = 0` or the denominator
    norm is 0 (then bounds and clip still apply, as in You et al. 2019 Alg 1), and
    :math:`\alpha = 1` for tensors excluded from adaptation.

    Parameters
    ----------
    params : iterable
        Tensors or param groups (group keys override the options below).
    lr : float or Tensor, default 1.0
        :math:`\gamma` (timm's default; the per-layer rate is
        :math:`\gamma\alpha`, typically ~1e-3 of it).
    momentum : float, default 0.9
        :math:`\mu` in [0, 1) (the thesis' experiments use 0.9).
    dampening : float, default 0
    nesterov : bool, default False
    weight_decay : float, default 0
        :math:`\beta \ge 0`.
    trust_coefficient : float, default 0.001
        :math:`l` of eq. 5.1 (the thesis' value for AlexNet and ResNet-50).
    eps : float, default 1e-8
    clip : bool, default False
        LARC clipping :math:`\alpha \leftarrow \min(\alpha/\gamma, 1)`.
    trust_bounds : (float, float), default (0, inf)
        Lower and upper limits on :math:`\alpha` (You et al. 2019 §3.5).
    mode : {"classic", "normalized"}, default "classic"
    always_adapt : bool, default True
        Adapt tensors without weight decay too; False is timm's default.
    exclude_from_adaptation : bool or None, default False
        False adapts every tensor, biases and norm weights included (see Notes); None
        excludes tensors with ``ndim <= 1``; True every tensor of the group.
    exclude_from_weight_decay : bool or None, default None
        None keeps tensors with ``ndim <= 1`` out of the weight decay (they still get the
        local rate, with :math:`\beta = 0` in it); True/False every/no tensor.
    master_weights, capturable, foreach, fused, differentiable
        As in :class:`gpuml.optim.LAMB` (float64 parameters included: loop and foreach
        paths only; ``differentiable=True``: the for-loop path only). The momentum buffer
        is fp32 (float64 for float64 parameters).
    maximize : bool, default False
        Maximise the objective (the gradient negated first, as in torch.optim), on every
        path.

    Notes
    -----
    timm ``Lars(lr, momentum, dampening, weight_decay, nesterov, trust_coeff, eps,
    trust_clip, always_adapt)`` is ``LARS(..., mode="classic", clip=trust_clip,
    always_adapt=always_adapt, exclude_from_adaptation=False,
    exclude_from_weight_decay=False)`` (timm's defaults: momentum 0, eps 1e-8,
    always_adapt False). apex ``LARC(SGD(lr, momentum, weight_decay=wd),
    trust_coefficient=0.02, clip=True)`` is ``LARS(lr, momentum, weight_decay=wd,
    trust_coefficient=0.02, clip=True, exclude_from_adaptation=False,
    exclude_from_weight_decay=False)`` for tensors with nonzero norms.

    Biases and norm weights. A tensor excluded from adaptation steps with
    :math:`\alpha = 1`, i.e. with the raw global rate :math:`\gamma`, which for LARS
    is large (the default 1.0, against a per-layer scale of about :math:`\gamma l`):
    a plain momentum-SGD step at rate 1.0. So by default every tensor is adapted,
    tensors with ``ndim <= 1`` included, and those are only kept out of the weight
    decay: their local rate is :math:`l\|w\|/(\|g\| + \epsilon)`. Measured by
    ``bench/bench_optim_defaults.py`` (``lr=1.0``, momentum 0.9, weight decay 5e-4, LEGW
    + sqrt scaling, a CNN on Fashion-MNIST at batches 32, 256 and 1024:
    bench/results/cpu-2core/optim_defaults.md), this trains better than excluding them at
    every batch, and as well as decaying them too (apex's LARC, timm) or giving them their
    own group at :math:`\gamma l`. A tensor whose norm is 0 (a LayerNorm bias at
    initialisation) still takes one step with :math:`\alpha = 1` (You et al. 2019,
    Alg 1; apex, timm), after which its norm is positive.
    ``exclude_from_adaptation=None`` gives the former rule (1-D tensors excluded, the
    BERT recipe's choice for LAMB).

    GradScaler, NaN gradients and ``capturable`` behave as described in
    :class:`gpuml.optim.LAMB`.

    References
    ----------
    .. [1] Y. You, "Fast and Accurate Machine Learning on Distributed Systems and
       Supercomputers", PhD thesis, UC Berkeley, 2020 (You 2020): eq. (5.1) and the five-step LARS
       sequence (§5.3), Algorithm 15 (LARS with normalized momentum).
    .. [2] Y. You et al., "Large-Batch Training for LSTM and Beyond", SC 2019,
       §3.5 dynamic per-layer lower/upper limits.
    .. [3] Y. You, I. Gitman, B. Ginsburg, "Large Batch Training of Convolutional
       Networks", arXiv:1708.03888, 2017.

    Examples
    --------
    >>> import torch
    >>> from gpuml.optim import LARS
    >>> model = torch.nn.Linear(8, 2)
    >>> opt = LARS(model.parameters(), lr=0.5, weight_decay=5e-4)
    >>> model(torch.randn(16, 8)).square().mean().backward()
    >>> opt.step()
    """

    _KIND = "lars"
    _STATE_KEYS = ("momentum_buffer",)

    def __init__(self, params, lr: float | Tensor = 1.0, momentum: float = 0.9,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, *,
                 trust_coefficient: float = 0.001, eps: float = 1e-8, clip: bool = False,
                 trust_bounds=(0.0, float("inf")), mode: str = "classic",
                 always_adapt: bool = True, exclude_from_adaptation: bool | None = False,
                 exclude_from_weight_decay: bool | None = None, master_weights: bool = False,
                 capturable: bool = False, foreach: bool | None = None,
                 fused: bool | None = None, maximize: bool = False,
                 differentiable: bool = False):
        super().__init__(params, dict(
            lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
            nesterov=nesterov, trust_coefficient=trust_coefficient, eps=eps, clip=clip,
            trust_bounds=trust_bounds, mode=mode, always_adapt=always_adapt),
            exclude_from_adaptation, exclude_from_weight_decay, master_weights, capturable,
            foreach, fused, maximize, differentiable)

    def _check_rule(self, group: dict) -> None:
        check_beta("momentum", group["momentum"])
        check_nonneg("dampening", group["dampening"])
        if group["dampening"] > 1:
            raise ValueError(f"Invalid dampening: {group['dampening']!r} (must lie in [0, 1])")
        check_nonneg("weight_decay", group["weight_decay"])
        check_positive("trust_coefficient", group["trust_coefficient"])
        check_nonneg("eps", group["eps"])  # 0 allowed, as torch.optim.AdamW allows it
        group["trust_bounds"] = check_bounds(group["trust_bounds"])
        if group["mode"] not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {group['mode']!r}")
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("nesterov=True needs momentum > 0 and dampening = 0")
        if group["mode"] == "normalized" and (group["nesterov"] or group["dampening"] != 0):
            raise ValueError("mode='normalized' (Alg 15) uses m = mu m + (1 - mu) d; "
                             "it takes neither nesterov nor dampening")

    def _new_state(self, group, state, p):
        if group["momentum"] != 0 or group["mode"] == "normalized":
            state["momentum_buffer"] = C.zero_state(p)

    def _rule_options(self, group: dict) -> dict:
        return dict(momentum=group["momentum"], dampening=group["dampening"],
                    nesterov=group["nesterov"], weight_decay=group["weight_decay"],
                    trust_coefficient=group["trust_coefficient"], eps=group["eps"],
                    clip=group["clip"], trust_bounds=group["trust_bounds"], mode=group["mode"])

    def _group_step(self, *tensors, **options):
        return _lars_step(*tensors, **options)


class FusedLARS(LARS):
    """:class:`LARS` pinned to the fused path (Triton on CUDA tensors, numba on CPU ones)."""

    def __init__(self, params, *args, **kwargs):
        super().__init__(params, *args, **pinned_to_fused("LARS", kwargs))


def lars(params: list[Tensor], grads: list[Tensor], momentum_buffers: list[Tensor | None],
         master_params: list[Tensor | None], state_steps: list[Tensor], *, adapt: list[bool],
         decay: list[bool], grad_scale: Tensor | None = None, found_inf: Tensor | None = None,
         foreach: bool | None = None, fused: bool | None = None, lr: float | Tensor,
         momentum: float, dampening: float, nesterov: bool, weight_decay: float,
         trust_coefficient: float, eps: float, clip: bool, trust_bounds: tuple[float, float],
         mode: str, capturable: bool = False,
         maximize: bool = False, differentiable: bool = False) -> None:
    """Functional LARS: see :class:`LARS` for the update rule and the options.

    DTensor parameters (FSDP2) are updated through their local shards with the norms of the
    full tensors (see :mod:`gpuml.optim._sharding`).
    """
    params, grads, (momentum_buffers,), master_params, path, prepared, sharding = \
        C.functional_inputs("lars", params, grads, (momentum_buffers,), master_params,
                            state_steps, adapt, decay, foreach, fused, differentiable)
    S.run_steps([_lars_step(
        params, grads, momentum_buffers, master_params, state_steps, adapt=adapt,
        decay=decay, path=path, prepared=prepared, sharding=sharding, grad_scale=grad_scale,
        found_inf=found_inf, lr=lr, momentum=momentum, dampening=dampening,
        nesterov=nesterov, weight_decay=weight_decay, trust_coefficient=trust_coefficient,
        eps=eps, clip=clip, trust_bounds=trust_bounds, mode=mode, capturable=capturable,
        maximize=maximize, differentiable=differentiable)], S.reduction_for([sharding], "lars"))


def _lars_step(params, grads, momentum_buffers, master_params, state_steps, *, path,
               **options):
    """One LARS step of one param group's local real tensors on ``path``: the dispatch to
    the path's implementation, for :class:`LARS` (every group, from its view) and for
    :func:`lars`; a generator for :func:`gpuml.optim._sharding.run_steps`."""
    yield from _IMPLS[path](params, grads, momentum_buffers, master_params, state_steps,
                            **options)


def _lars_ratio(w_norm, d_norm, wd, *, trust_coefficient, eps, lr, clip, trust_bounds,
                normalized):
    denom = d_norm + eps if normalized else d_norm + wd * w_norm + eps
    ok = (w_norm > 0) & (d_norm > 0)
    ratio = torch.where(ok, trust_coefficient * w_norm / torch.where(ok, denom, 1.0), 1.0)
    ratio = torch.clamp(ratio, min=trust_bounds[0], max=trust_bounds[1])
    if clip:
        ratio = torch.clamp(ratio / lr, max=1.0)
    return ratio


def _single_tensor_lars(params, grads, momentum_buffers, master_params, state_steps, *, adapt,
                        decay, grad_scale, found_inf, lr, momentum, dampening, nesterov,
                        weight_decay, trust_coefficient, eps, clip, trust_bounds, mode,
                        capturable, maximize, sharding, differentiable, prepared):
    # The order of work over the tensors (one at a time, two scratch buffers for all of
    # them; or, with sharded tensors, one yield for all their norms) is C.layerwise_loop's.
    if not params or C.skip_step(found_inf):
        return
    factor = C.signed_factor(C.scaled_step_coefficient(grad_scale), maximize)
    normalized = mode == "normalized"
    scratch = C.Scratch(params, fresh=differentiable or sharding is not None)
    neg_lr = -lr
    kw = dict(trust_coefficient=trust_coefficient, eps=eps, lr=lr, clip=clip,
              trust_bounds=trust_bounds, normalized=normalized)

    def prepare(i):
        """Tensor ``i`` with its scaled gradient, its compute view and its weight decay; in
        Alg 15 its momentum stepped, m = mu m + (1 - mu) (g + wd w)."""
        g = C.widen(grads[i])
        if factor is not None:
            g = torch.mul(g, factor, out=scratch.take(0, g))
        state_steps[i] += 1
        w = C.compute_view(params[i], master_params[i])
        wd = weight_decay if decay[i] else 0.0
        if normalized:
            d = torch.add(g, w, alpha=wd, out=scratch.take(1, g)) if wd != 0 else g
            momentum_buffers[i].lerp_(d, 1.0 - momentum)
        return i, g, w, wd

    def norms(i, g, w, wd):
        # the norm of the new momentum (Alg 15) or of the gradient (eq. 5.1); autograd keeps
        # the tensor a norm was taken of, and w changes in place afterwards
        w = w.clone() if differentiable else w
        return torch.stack([torch.linalg.vector_norm(w), torch.linalg.vector_norm(
            momentum_buffers[i] if normalized else g)])

    def apply(i, g, w, wd, norms):
        # ratio None: not adapted (alpha = 1)
        ratio = None if norms is None else _lars_ratio(*norms, wd, **kw)
        buf = momentum_buffers[i]
        if normalized:
            C.add_scaled_(w, buf, neg_lr if ratio is None else ratio * neg_lr)
        else:
            # d = alpha e with e = g + wd w, folded into the operations that use d
            e = torch.add(g, w, alpha=wd, out=scratch.take(1, g)) if wd != 0 else g
            if momentum == 0:
                C.add_scaled_(w, e, neg_lr if ratio is None else ratio * neg_lr)
            else:
                step = state_steps[i]
                first = step == 1 if capturable else C.step_value(step) == 1
                if capturable:
                    d = e if ratio is None else e * ratio
                    buf.copy_(torch.where(first, d, momentum * buf + (1.0 - dampening) * d))
                elif first:  # a = d at the first step
                    buf.copy_(e if ratio is None else e * ratio)
                else:
                    keep = 1.0 - dampening
                    C.add_scaled_(buf.mul_(momentum), e, keep if ratio is None else ratio * keep)
                if nesterov:  # w - lr (d + mu a)
                    C.add_scaled_(w, e, neg_lr if ratio is None else ratio * neg_lr)
                    C.add_scaled_(w, buf, neg_lr * momentum)
                else:
                    C.add_scaled_(w, buf, neg_lr)
        if w is not params[i]:
            params[i].copy_(w)

    yield from C.layerwise_loop(len(params), adapt, sharding, prepare, norms, apply)


def _multi_tensor_lars(params, grads, momentum_buffers, master_params, state_steps, *, adapt,
                       decay, grad_scale, found_inf, lr, momentum, dampening, nesterov,
                       weight_decay, trust_coefficient, eps, clip, trust_bounds, mode,
                       capturable, maximize, sharding, differentiable, prepared):
    gs = C.foreach_start(params, grads, state_steps, found_inf=found_inf,
                         differentiable=differentiable, maximize=maximize, grad_scale=grad_scale)
    if gs is None:
        return
    device = params[0].device
    normalized = mode == "normalized"
    ws = [C.compute_view(p, mp) for p, mp in zip(params, master_params)]
    dec = [i for i, x in enumerate(decay) if x] if weight_decay != 0 else []
    ds = list(gs)
    if dec:
        for i, t in zip(dec, torch._foreach_add([gs[i] for i in dec], [ws[i] for i in dec],
                                                alpha=weight_decay)):
            ds[i] = t
    decayed = set(dec)
    # the norms' dtype: float64 when a tensor is float64 (a float32 weight decay or ratio
    # would round its update)
    dtype = torch.float64 if torch.float64 in {w.dtype for w in ws} else torch.float32
    wd_vec = C.device_constant([weight_decay if i in decayed else 0.0 for i in range(len(params))],
                               dtype, device)
    adapt_mask = C.device_constant(adapt, torch.bool, device)
    neg_lr = -lr.to(device) if isinstance(lr, Tensor) else -lr
    if normalized:  # Alg 15: m = mu m + (1 - mu) d
        torch._foreach_mul_(momentum_buffers, momentum)
        torch._foreach_add_(momentum_buffers, ds, alpha=1.0 - momentum)
    ratio = torch.ones(len(params), dtype=dtype, device=device)
    if any(adapt):
        # the norm of the new momentum (Alg 15) or of the gradient (eq. 5.1)
        w_norms, d_norms = yield from C.foreach_norms(
            ws, momentum_buffers if normalized else gs, sharding)
        ratio = torch.where(adapt_mask, _lars_ratio(
            w_norms, d_norms, wd_vec, trust_coefficient=trust_coefficient, eps=eps, lr=lr,
            clip=clip, trust_bounds=trust_bounds, normalized=normalized), 1.0)
    if normalized:
        torch._foreach_add_(ws, torch._foreach_mul(momentum_buffers,
                                                   list((ratio * neg_lr).unbind(0))))
    else:
        ds = torch._foreach_mul(ds, list(ratio.unbind(0)))
        if momentum != 0:
            bufs = momentum_buffers
            if capturable:
                new = torch._foreach_mul(bufs, momentum)
                torch._foreach_add_(new, ds, alpha=1.0 - dampening)
                for b, d, n, s in zip(bufs, ds, new, state_steps):
                    b.copy_(torch.where(s == 1, d, n))
            else:
                first = [i for i, s in enumerate(state_steps) if C.step_value(s) == 1]
                rest = [i for i in range(len(bufs)) if i not in set(first)]
                if first:
                    torch._foreach_copy_([bufs[i] for i in first], [ds[i] for i in first])
                if rest:
                    rb = [bufs[i] for i in rest]
                    torch._foreach_mul_(rb, momentum)
                    torch._foreach_add_(rb, [ds[i] for i in rest], alpha=1.0 - dampening)
            dirs = torch._foreach_add(ds, bufs, alpha=momentum) if nesterov else bufs
        else:
            dirs = ds
        if isinstance(lr, Tensor):
            torch._foreach_add_(ws, torch._foreach_mul(dirs, neg_lr))
        else:
            torch._foreach_add_(ws, dirs, alpha=neg_lr)
    C.foreach_copy_back(params, ws)


def _fused_lars(params, grads, momentum_buffers, master_params, state_steps, *, adapt, decay,
                grad_scale, found_inf, lr, momentum, dampening, nesterov, weight_decay,
                trust_coefficient, eps, clip, trust_bounds, mode, capturable, maximize,
                sharding, differentiable, prepared):
    """The Triton path: the two passes launched from ``prepared``, the launch tables of these
    tensors (:func:`gpuml.optim._triton.prepare`), which also hold their sharding."""
    from gpuml.optim import _triton

    yield from _triton.lars_passes(
        prepared, grad_scale=grad_scale, found_inf=found_inf, lr=lr, momentum=momentum,
        dampening=dampening, nesterov=nesterov, weight_decay=weight_decay,
        trust_coefficient=trust_coefficient, eps=eps, clip=clip, trust_bounds=trust_bounds,
        mode=mode, maximize=maximize)


def _fused_cpu_lars(params, grads, momentum_buffers, master_params, state_steps, *, adapt,
                    decay, grad_scale, found_inf, lr, momentum, dampening, nesterov,
                    weight_decay, trust_coefficient, eps, clip, trust_bounds, mode, capturable,
                    maximize, sharding, differentiable, prepared):
    """``fused=True`` on CPU tensors: per tensor, pass 1 (the two sums of squares; Alg 15
    steps the momentum there) then, once every ratio is known, pass 2 (momentum and
    update), in numba kernels (:mod:`gpuml.optim._numba`)."""
    from gpuml.optim import _numba as K

    if C.skip_step(found_inf):
        return
    gs = [C.widen(g) for g in grads]
    ws = [C.compute_view(p, mp) for p, mp in zip(params, master_params)]
    K.check_layouts(ws, gs, momentum_buffers)
    coef = C.scaled_step_coefficient(grad_scale)
    c = 1.0 if coef is None else coef.item()
    c = -c if maximize else c  # the gradient negated first, as torch.optim does
    normalized = mode == "normalized"
    wds = [weight_decay if d else 0.0 for d in decay]
    views = [tuple(map(K.flat, t)) for t in zip(gs, ws, momentum_buffers)]
    neg_lr = -float(lr)
    nest_d, nest_b = (1.0, momentum) if nesterov else (0.0, 1.0)

    def sums(i):
        g, w, buf = views[i]
        state_steps[i] += 1
        if normalized:
            return K.run("lars_normalized", w.size, g, w, buf, c, wds[i], momentum)
        return K.run("sumsq2", w.size, w, g, c)

    def ratios(w_norms, d_norms):
        return _lars_ratio(w_norms, d_norms, torch.tensor(wds),
                           trust_coefficient=trust_coefficient, eps=eps, lr=lr, clip=clip,
                           trust_bounds=trust_bounds, normalized=normalized)

    def update(i, ratio):
        g, w, buf = views[i]
        if normalized:
            K.run("axpy", w.size, w, buf, neg_lr * ratio)
        elif momentum == 0:
            K.run("lars_plain", w.size, g, w, c, wds[i], ratio, neg_lr)
        else:
            keep, take = (0.0, 1.0) if C.step_value(state_steps[i]) == 1 \
                else (momentum, 1.0 - dampening)
            K.run("lars_momentum", w.size, g, w, buf, c, wds[i], ratio, keep, take, nest_d,
                  nest_b, neg_lr)

    yield from K.two_passes(params, ws, adapt, sharding, sums, ratios, update)


#: The implementation of each path of :data:`gpuml.optim._common.PATHS`.
_IMPLS = {"loop": _single_tensor_lars, "foreach": _multi_tensor_lars, "triton": _fused_lars,
          "numba": _fused_cpu_lars}
