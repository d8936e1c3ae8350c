r"""LAMB: layer-wise adaptive moments (You 2020, ch. 6, Alg 16; N-LAMB/NN-LAMB Alg 17-18).

Structure as in ``torch/optim/adam.py``: the :class:`LAMB` optimizer gathers the
tensors of each param group and hands them to the functional step, :func:`_lamb_step`,
which is also what the functional :func:`lamb` runs (after gathering a call's tensors
the same way, :func:`gpuml.optim._common.functional_inputs`). It dispatches on the path
chosen for the tensors (:func:`gpuml.optim._common.choose_path`) to one of four
implementations with one signature:

* :func:`_single_tensor_lamb`, a for-loop over tensors: the readable reference
  and the oracle of the tests;
* :func:`_multi_tensor_lamb`, ``torch._foreach_*`` over all tensors of a group,
  per-tensor norms with ``torch._foreach_norm`` (no host synchronisation);
* :func:`_fused_lamb`, two Triton kernels over all tensors of a group on CUDA (see
  :mod:`gpuml.optim._triton`), launched from tables prepared beforehand;
* :func:`_fused_cpu_lamb`, two numba kernels per tensor on the CPU (see
  :mod:`gpuml.optim._numba`).

A step is a generator for :func:`gpuml.optim._sharding.run_steps`, so that the optimizer
sums the norms of the sharded tensors of all its groups in one all-reduce.
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

__all__ = ["LAMB", "FusedLAMB", "lamb"]

_VARIANTS = ("lamb", "nlamb", "nnlamb")


class LAMB(LayerwiseOptimizer):
    r"""LAMB optimizer (You et al.; You 2020 Algorithm 16, with Alg 17-18 as variants).

    For every tensor :math:`x^{(i)}` (a "layer") with gradient :math:`g` at step
    :math:`t`:

    .. math::

        g &\leftarrow g \,/\, \max(1, \|g_{\text{all}}\|_2 / \text{max\_grad\_norm})
            \quad\text{(global clipping, optional)}\\
        m_t &= \beta_1 m_{t-1} + \beta_3 g, \qquad
            \beta_3 = 1-\beta_1 \text{ (grad\_averaging) else } 1\\
        v_t &= \beta_2 v_{t-1} + (1-\beta_2) g^2\\
        \hat m &= m_t/(1-\beta_1^t), \qquad \hat v = v_t/(1-\beta_2^t)
            \quad\text{(bias\_correction)}\\
        r_t &= \hat m / \sqrt{\hat v + \epsilon}\ \ \text{(eps\_inside\_sqrt)}
            \quad\text{or}\quad \hat m / (\sqrt{\hat v} + \epsilon)\\
        u_t &= r_t + \lambda x_t\\
        x_{t+1} &= x_t - \eta_t \,\frac{\phi(\|x_t\|)}{\|u_t\|}\, u_t, \qquad
            \phi(z) = \min(\max(z, \gamma_l), \gamma_u)

    The trust ratio :math:`\phi(\|x\|)/\|u\|` is replaced by 1 when
    :math:`\|x\| = 0` or :math:`\|u\| = 0` (never NaN), and for tensors excluded
    from adaptation. ``variant="nlamb"`` (Alg 17) uses Nesterov-style moments
    with a constant :math:`\beta_1`:
    :math:`\hat m = \beta_1 m_t/(1-\beta_1^{t+1}) + \beta_3 g/(1-\beta_1^t)`,
    :math:`\hat v = \beta_2 v_t/(1-\beta_2^{t+1})`; ``"nnlamb"`` (Alg 18) adds
    :math:`(1-\beta_2) g^2/(1-\beta_2^t)` to :math:`\hat v`.

    Parameters
    ----------
    params : iterable
        Tensors or param groups. Group keys override every option below except
        ``foreach``/``fused``/``capturable`` which are per group as well.
    lr : float or Tensor, default 1e-3
        :math:`\eta`. A tensor keeps it on the device (``capturable=True``).
    betas : (float, float), default (0.9, 0.999)
        :math:`\beta_1, \beta_2` in [0, 1) (the thesis' values, §6.4).
    eps : float, default 1e-6
        :math:`\epsilon \ge 0` (the thesis' value, §6.6).
    weight_decay : float, default 0.01
        :math:`\lambda \ge 0` (decoupled: added to the update, as in Alg 16; the thesis'
        value, §6.6).
    bias_correction : bool, default True
        Divide the moments by :math:`1-\beta^t` (Alg 16).
    grad_averaging : bool, default True
        :math:`\beta_3 = 1-\beta_1` (Alg 16); False gives :math:`\beta_3 = 1`.
    max_grad_norm : float or None, default None
        Global gradient clipping over all param groups, off by default as in Alg 16; apex
        and timm clip at 1.0 (the BERT recipe), which measured no better (see Notes).
    trust_bounds : (float, float), default (0, inf)
        :math:`(\gamma_l, \gamma_u)` of the scaling function :math:`\phi`.
    eps_inside_sqrt : bool, default True
        Alg 16 writes :math:`\sqrt{\hat v + \epsilon}`; apex, timm and the BERT
        code use :math:`\sqrt{\hat v} + \epsilon` (``False``).
    always_adapt : bool, default True
        Adapt tensors whose weight decay is 0 too (the paper adapts every layer).
        False is apex's default and timm's ``always_adapt=False``: tensors
        without weight decay get a plain Adam step.
    variant : {"lamb", "nlamb", "nnlamb"}, default "lamb"
        Algorithm 16, 17 or 18 (17 and 18 need ``bias_correction=True``).
    exclude_from_adaptation, exclude_from_weight_decay : bool or None, default False
        False (Alg 16) gives every tensor the trust ratio and the weight decay; None
        excludes tensors with ``ndim <= 1`` (biases, norm weights), the BERT recipe;
        True excludes every tensor of the group. See
        :func:`gpuml.optim.param_groups_by_name` for the name-based rule.
    master_weights : bool, default False
        Keep an fp32 copy of fp16/bf16 parameters in the state (``master_param``),
        update it and round it into the parameter. The moments are fp32 always.
    capturable : bool, default False
        Keep ``step`` on the parameter's device so a step can be captured in a
        CUDA graph (pass ``lr`` as a device tensor to change it inside the graph).
    foreach, fused : bool or None
        Implementation: default fused (Triton) on CUDA tensors, the for-loop on CPU
        tensors (faster there than foreach, see :func:`gpuml.optim._common.choose_path`),
        foreach otherwise; ``foreach=False`` gives the for-loop reference. ``fused=True``
        on CPU tensors runs numba kernels (:mod:`gpuml.optim._numba`), as torch's
        ``AdamW(fused=True)`` has a CPU kernel.
        float64 parameters are updated in float64 (state too, as torch.optim does) by the
        loop and foreach paths; the fused kernels compute in float32, so the default picks
        foreach for a group with a float64 parameter and ``fused=True`` refuses it with a
        ``TypeError``. Complex parameters are updated as ``torch.view_as_real`` of them (as
        torch.optim does; state complex, loop and foreach paths only, like float64); the
        ``ndim <= 1`` exclusion rule looks at the complex tensor.
    maximize : bool, default False
        Maximise the objective: the gradient is negated before anything else (as in
        torch.optim), on every path (a sign flag in the fused kernels).

    differentiable : bool, default False
        Record the step with autograd, as torch.optim's ``differentiable=True``: the
        updated parameters and state are differentiable functions of the parameters,
        gradients, state and tensor hyperparameters (``lr``) before the step (for
        meta-learning). For-loop path only: ``foreach=True`` and ``fused=True`` are
        refused with it (``RuntimeError``, as torch.optim refuses ``fused``).

    Notes
    -----
    ``LAMB(params, lr)`` with every other option at its default is Algorithm 16 of
    You 2020 with the thesis' hyperparameters: :math:`\beta = (0.9, 0.999)`
    (§6.4), :math:`\epsilon = 10^{-6}` inside the square root and
    :math:`\lambda = 0.01` (Alg 16, §6.6), bias correction, gradient averaging,
    every layer adapted and decayed, no clipping, :math:`\phi(z) = z` (the
    thesis leaves :math:`\gamma_l, \gamma_u` open). A test checks this in
    float64 to 1e-12. The thesis is silent on the BERT recipe's global clipping at
    1.0 and on keeping 1-D tensors out of the trust ratio and the weight decay;
    measured by ``bench/bench_optim_defaults.py`` (a CNN on Fashion-MNIST at batch
    32, 256 and 1024, an MLP with a LayerNorm on digits:
    bench/results/cpu-2core/optim_defaults.md), neither trained better than Alg 16,
    so the defaults stay the paper's.

    apex ``FusedLAMB`` (defaults) equals ``LAMB(params, eps=1e-6, weight_decay=0.01,
    max_grad_norm=1.0, eps_inside_sqrt=False, always_adapt=False,
    exclude_from_adaptation=False, exclude_from_weight_decay=False)``; apex's
    ``use_nvlamb=True`` is ``always_adapt=True``. timm ``Lamb`` (defaults,
    ``trust_clip=False``) is the same setting (checked against timm in the tests).

    ``step(grad_scale=..., found_inf=...)`` follows the fused-optimizer protocol
    of ``torch.amp.GradScaler``: gradients are unscaled on the fly and the step is
    skipped (no state changes) when ``found_inf`` is nonzero. The fused path does
    this on the device; the loop and foreach paths read ``found_inf`` on the host.

    Without a scaler the gradients are not inspected: a NaN or inf gradient makes
    that tensor's moments and parameter NaN, and, with ``max_grad_norm`` set, the
    global norm is NaN so every parameter becomes NaN (as with
    ``torch.nn.utils.clip_grad_norm_`` followed by ``torch.optim.AdamW``).

    References
    ----------
    .. [1] Y. You, "Fast and Accurate Machine Learning on Distributed Systems and
       Supercomputers", PhD thesis, UC Berkeley, 2020, ch. 6: Algorithm 16
       (LAMB), Algorithms 17-18 (N-LAMB, NN-LAMB).
    .. [2] Y. You et al., "Large Batch Optimization for Deep Learning: Training
       BERT in 76 minutes", ICLR 2020.

    Examples
    --------
    >>> import torch
    >>> from gpuml.optim import LAMB
    >>> model = torch.nn.Linear(8, 2)
    >>> opt = LAMB(model.parameters(), lr=1e-2)
    >>> loss = model(torch.randn(16, 8)).square().mean()
    >>> loss.backward()
    >>> opt.step()
    """

    _KIND = "lamb"
    _STATE_KEYS = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr: float | Tensor = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, *, bias_correction: bool = True,
                 grad_averaging: bool = True, max_grad_norm: float | None = None,
                 trust_bounds=(0.0, float("inf")), eps_inside_sqrt: bool = True,
                 always_adapt: bool = True, variant: str = "lamb",
                 exclude_from_adaptation: bool | None = False,
                 exclude_from_weight_decay: bool | None = False, master_weights: bool = False,
                 capturable: bool = False, foreach: bool | None = None,
                 fused: bool | None = None, maximize: bool = False,
                 differentiable: bool = False):
        super().__init__(params, dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
            bias_correction=bias_correction, grad_averaging=grad_averaging,
            max_grad_norm=max_grad_norm, trust_bounds=trust_bounds,
            eps_inside_sqrt=eps_inside_sqrt, always_adapt=always_adapt, variant=variant),
            exclude_from_adaptation, exclude_from_weight_decay, master_weights, capturable,
            foreach, fused, maximize, differentiable)

    def _check_rule(self, group: dict) -> None:
        if not isinstance(group["betas"], (tuple, list)) or len(group["betas"]) != 2:
            raise ValueError(f"betas must be a pair, got {group['betas']!r}")
        check_beta("beta1", group["betas"][0])
        check_beta("beta2", group["betas"][1])
        check_nonneg("eps", group["eps"])  # 0 allowed, as torch.optim.AdamW allows it
        check_nonneg("weight_decay", group["weight_decay"])
        if group["max_grad_norm"] is not None:
            check_positive("max_grad_norm", group["max_grad_norm"])
        group["trust_bounds"] = check_bounds(group["trust_bounds"])
        if group["variant"] not in _VARIANTS:
            raise ValueError(f"variant must be one of {_VARIANTS}, got {group['variant']!r}")
        if group["variant"] != "lamb" and not group["bias_correction"]:
            raise ValueError(f"variant={group['variant']!r} is bias-corrected by construction "
                             "(Alg 17-18); it needs bias_correction=True")

    def _new_state(self, group, state, p):
        state["exp_avg"] = C.zero_state(p)
        state["exp_avg_sq"] = torch.zeros_like(state["exp_avg"])

    def _rule_options(self, group: dict) -> dict:
        beta1, beta2 = group["betas"]
        return dict(beta1=beta1, beta2=beta2, eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    bias_correction=group["bias_correction"],
                    grad_averaging=group["grad_averaging"],
                    max_grad_norm=group["max_grad_norm"], trust_bounds=group["trust_bounds"],
                    eps_inside_sqrt=group["eps_inside_sqrt"], variant=group["variant"])

    def _step_options(self, plan, grad_scale) -> dict:
        """One global gradient norm over every group (clipping, as apex and timm:
        :func:`gpuml.optim._common.global_grad_norm`); with sharded parameters one scalar
        all-reduce."""
        norm = None
        if any(group["max_grad_norm"] is not None for group, _, _ in plan):
            norm = C.global_grad_norm(
                [(grads, view.sharding, view.path, view.prepared) for _, view, grads in plan],
                self._reduction, grad_scale)
        return {"global_grad_norm": norm}

    def _group_step(self, *tensors, **options):
        return _lamb_step(*tensors, **options)


class FusedLAMB(LAMB):
    """:class:`LAMB` pinned to the fused path (Triton on CUDA tensors, numba on CPU ones)."""

    def __init__(self, params, *args, **kwargs):
        super().__init__(params, *args, **pinned_to_fused("LAMB", kwargs))


def lamb_coefficients(t, beta1: float, beta2: float, beta3: float, bias_correction: bool,
                      variant: str):
    r"""Coefficients :math:`(a_m, a_g, a_v, a_{g^2})` with :math:`\hat m = a_m m_t + a_g g`
    and :math:`\hat v = a_v v_t + a_{g^2} g^2` at step ``t`` (float or tensor)."""
    if variant == "lamb":
        if not bias_correction:
            return 1.0, 0.0, 1.0, 0.0
        return 1.0 / (1.0 - beta1 ** t), 0.0, 1.0 / (1.0 - beta2 ** t), 0.0
    a_m = beta1 / (1.0 - beta1 ** (t + 1))
    a_g = beta3 / (1.0 - beta1 ** t)
    a_v = beta2 / (1.0 - beta2 ** (t + 1))
    a_g2 = (1.0 - beta2) / (1.0 - beta2 ** t) if variant == "nnlamb" else 0.0
    return a_m, a_g, a_v, a_g2


def lamb(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
         exp_avg_sqs: list[Tensor], master_params: list[Tensor | None],
         state_steps: list[Tensor], *, adapt: list[bool], decay: list[bool],
         global_grad_norm: Tensor | None = None, grad_scale: Tensor | None = None,
         found_inf: Tensor | None = None, foreach: bool | None = None,
         fused: bool | None = None, lr: float | Tensor, beta1: float, beta2: float,
         eps: float, weight_decay: float, bias_correction: bool, grad_averaging: bool,
         max_grad_norm: float | None, trust_bounds: tuple[float, float],
         eps_inside_sqrt: bool, variant: str, capturable: bool = False,
         maximize: bool = False, differentiable: bool = False) -> None:
    """Functional LAMB: see :class:`LAMB` for the update rule and the options.

    ``adapt[i]`` / ``decay[i]`` say whether tensor ``i`` gets the trust ratio and
    weight decay. ``global_grad_norm`` is the unscaled norm used for clipping
    (computed from ``grads`` when None and ``max_grad_norm`` is set; the fused path
    computes it from the tables it builds for the step). DTensor parameters (FSDP2) are
    updated through their local shards with the norms of the full tensors (see
    :mod:`gpuml.optim._sharding`).
    """
    params, grads, (exp_avgs, exp_avg_sqs), master_params, path, prepared, sharding = \
        C.functional_inputs("lamb", params, grads, (exp_avgs, exp_avg_sqs), master_params,
                            state_steps, adapt, decay, foreach, fused, differentiable)
    S.run_steps([_lamb_step(
        params, grads, exp_avgs, exp_avg_sqs, master_params, state_steps, adapt=adapt,
        decay=decay, path=path, prepared=prepared, sharding=sharding,
        global_grad_norm=global_grad_norm, grad_scale=grad_scale, found_inf=found_inf, lr=lr,
        beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
        bias_correction=bias_correction, grad_averaging=grad_averaging,
        max_grad_norm=max_grad_norm, trust_bounds=trust_bounds,
        eps_inside_sqrt=eps_inside_sqrt, variant=variant, capturable=capturable,
        maximize=maximize, differentiable=differentiable)], S.reduction_for([sharding], "lamb"))


def _lamb_step(params, grads, exp_avgs, exp_avg_sqs, master_params, state_steps, *, path,
               prepared, sharding, global_grad_norm, max_grad_norm, grad_scale, **options):
    """One LAMB step of one param group's local real tensors on ``path``: the dispatch to
    the path's implementation, for :class:`LAMB` (every group, from its view) and for
    :func:`lamb`; a generator for :func:`gpuml.optim._sharding.run_steps`.

    ``prepared``: the Triton path's launch tables (:func:`gpuml.optim._common.update_inputs`).
    Without ``global_grad_norm`` (the functional call) and with ``max_grad_norm`` the norm
    of ``grads`` is computed here, as :class:`LAMB` computes it over all its groups.
    """
    if max_grad_norm is not None and global_grad_norm is None and params:
        global_grad_norm = C.global_grad_norm([(grads, sharding, path, prepared)],
                                              S.reduction_for([sharding], "lamb"), grad_scale)
    yield from _IMPLS[path](params, grads, exp_avgs, exp_avg_sqs, master_params, state_steps,
                            prepared=prepared, sharding=sharding,
                            global_grad_norm=global_grad_norm, max_grad_norm=max_grad_norm,
                            grad_scale=grad_scale, **options)


def _trust_ratio(w_norm: Tensor, u_norm: Tensor, bounds: tuple[float, float]) -> Tensor:
    phi = torch.clamp(w_norm, min=bounds[0], max=bounds[1])
    ok = (w_norm > 0) & (u_norm > 0)
    return torch.where(ok, phi / torch.where(ok, u_norm, 1.0), 1.0)


def _single_tensor_lamb(params, grads, exp_avgs, exp_avg_sqs, master_params, state_steps, *,
                        adapt, decay, global_grad_norm, grad_scale, found_inf, lr, beta1, beta2,
                        eps, weight_decay, bias_correction, grad_averaging, max_grad_norm,
                        trust_bounds, eps_inside_sqrt, variant, capturable, maximize,
                        sharding, differentiable, prepared):
    # The order of work over the tensors (one at a time, three scratch buffers for all of
    # them; or, with sharded tensors, one yield for all their norms) is C.layerwise_loop's.
    if not params or C.skip_step(found_inf):
        return
    factor = C.signed_factor(
        C.scaled_step_coefficient(grad_scale, global_grad_norm, max_grad_norm), maximize)
    if isinstance(factor, Tensor) and factor.device.type == "cpu" and not differentiable:
        # a number folds into the moments' updates (no pass to scale g); on the CPU reading
        # it costs nothing, elsewhere it would synchronise, and autograd needs the tensor
        factor = factor.item()
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    scratch = C.Scratch(params, fresh=differentiable or sharding is not None)
    neg_lr = -lr

    def direction(i):
        """Tensor ``i``'s moments stepped; its compute view ``w``, a direction ``d`` and a
        positive ``k`` (a number or a 0-d tensor) such that ``k d`` is its update ``u``."""
        g = C.widen(grads[i])
        c = 1.0
        if isinstance(factor, Tensor):
            g = torch.mul(g, factor, out=scratch.take(0, g))
        elif factor is not None:
            c = factor
        m, v, step = exp_avgs[i], exp_avg_sqs[i], state_steps[i]
        step += 1
        # the coefficients in the moments' dtype (a float32 step would round float64's)
        t = step.to(m.dtype) if capturable else C.step_value(step)
        # m = beta1 m + beta3 (c g), v = beta2 v + (1 - beta2) (c g)^2
        m.mul_(beta1).add_(g, alpha=beta3 * c)
        v.mul_(beta2).addcmul_(g, g, value=(1.0 - beta2) * c * c)
        a_m, a_g, a_v, a_g2 = lamb_coefficients(t, beta1, beta2, beta3, bias_correction, variant)
        w = C.compute_view(p := params[i], master_params[i])
        if variant == "lamb":
            # Alg 16's r = a_m m / sqrt(a_v v + eps) (or a_m m / (sqrt(a_v v) + eps)) is
            # k m / sqrt(v + eps / a_v) (or k m / (sqrt(v) + eps / sqrt(a_v))) with
            # k = a_m / sqrt(a_v): the bias corrections leave the elementwise passes
            root_a_v = a_v ** 0.5
            k = a_m / root_a_v
            denom = scratch.take(1, v)
            if eps_inside_sqrt:
                denom = torch.add(v, eps / a_v, out=denom).sqrt_()
            else:
                # out-of-place add: autograd keeps sqrt's result (differentiable=True)
                denom = torch.add(torch.sqrt(v, out=denom), eps / root_a_v, out=denom)
            d = torch.div(m, denom, out=scratch.take(1, v))  # denom's buffer, or a new one
            if decay[i] and weight_decay != 0:  # u = k (d + (lambda / k) w)
                d = C.add_scaled_(d, w, weight_decay / k)
            return p, w, d, k
        g = g if c == 1.0 else g * c  # Alg 17-18 use the (scaled) gradient again
        m_hat = torch.mul(m, a_m, out=scratch.take(1, m)).add_(g * a_g)
        v_hat = torch.mul(v, a_v, out=scratch.take(2, v))
        if variant == "nnlamb":
            v_hat = v_hat.add_(g * g * a_g2)
        denom = v_hat.add_(eps).sqrt_() if eps_inside_sqrt else torch.add(
            v_hat.sqrt_(), eps, out=scratch.take(2, v))
        update = torch.div(m_hat, denom, out=scratch.take(1, m))
        if decay[i] and weight_decay != 0:
            update = update.add_(w, alpha=weight_decay)
        return p, w, update, 1.0

    def norms(p, w, d, k):
        # autograd keeps the tensor a norm was taken of, and w changes in place afterwards
        w = w.clone() if differentiable else w
        return torch.stack([torch.linalg.vector_norm(w), torch.linalg.vector_norm(d) * k])

    def apply(p, w, d, k, norms):
        # w - lr ratio u = w - lr ratio k d
        ratio = None if norms is None else _trust_ratio(*norms, trust_bounds)
        C.add_scaled_(w, d, neg_lr * k if ratio is None else ratio * (neg_lr * k))
        if w is not p:
            p.copy_(w)

    yield from C.layerwise_loop(len(params), adapt, sharding, direction, norms, apply)


def _multi_tensor_lamb(params, grads, exp_avgs, exp_avg_sqs, master_params, state_steps, *,
                       adapt, decay, global_grad_norm, grad_scale, found_inf, lr, beta1, beta2,
                       eps, weight_decay, bias_correction, grad_averaging, max_grad_norm,
                       trust_bounds, eps_inside_sqrt, variant, capturable, maximize,
                       sharding, differentiable, prepared):
    gs = C.foreach_start(params, grads, state_steps, found_inf=found_inf,
                         differentiable=differentiable, maximize=maximize,
                         grad_scale=grad_scale, global_grad_norm=global_grad_norm,
                         max_grad_norm=max_grad_norm)
    if gs is None:
        return
    device = params[0].device
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, gs, alpha=beta3)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, gs, gs, value=1.0 - beta2)

    if capturable:
        # float64 coefficients when a moment is float64 (a float32 step would round them)
        wide = torch.float64 in {m.dtype for m in exp_avgs}
        t = torch.stack(state_steps).to(torch.float64 if wide else torch.float32)
        a_m, a_g, a_v, a_g2 = (
            list(torch.as_tensor(c, dtype=t.dtype, device=device)
                 .expand(len(params)).unbind(0))
            for c in lamb_coefficients(t, beta1, beta2, beta3, bias_correction, variant))
    else:
        cs = [lamb_coefficients(C.step_value(s), beta1, beta2, beta3, bias_correction, variant)
              for s in state_steps]
        a_m, a_g, a_v, a_g2 = (list(x) for x in zip(*cs))
    m_hat = torch._foreach_mul(exp_avgs, a_m)
    v_hat = torch._foreach_mul(exp_avg_sqs, a_v)
    if variant != "lamb":
        torch._foreach_add_(m_hat, torch._foreach_mul(gs, a_g))
        if variant == "nnlamb":
            torch._foreach_add_(v_hat, torch._foreach_mul(torch._foreach_mul(gs, gs), a_g2))
    if eps_inside_sqrt:
        torch._foreach_add_(v_hat, eps)
        torch._foreach_sqrt_(v_hat)
    else:
        torch._foreach_sqrt_(v_hat)
        torch._foreach_add_(v_hat, eps)
    torch._foreach_div_(m_hat, v_hat)
    updates = m_hat
    del v_hat

    ws = [C.compute_view(p, mp) for p, mp in zip(params, master_params)]
    dec = [i for i, d in enumerate(decay) if d]
    if dec and weight_decay != 0:
        torch._foreach_add_([updates[i] for i in dec], [ws[i] for i in dec], alpha=weight_decay)
    adapt_mask = C.device_constant(adapt, torch.bool, device) if any(adapt) else None
    if adapt_mask is not None:
        w_norms, u_norms = yield from C.foreach_norms(ws, updates, sharding)
        ratio = torch.where(adapt_mask, _trust_ratio(w_norms, u_norms, trust_bounds), 1.0)
        scale = ratio * (-lr if not isinstance(lr, Tensor) else -lr.to(device))
        torch._foreach_mul_(updates, list(scale.unbind(0)))
        torch._foreach_add_(ws, updates)
    elif isinstance(lr, Tensor):
        torch._foreach_mul_(updates, -lr.to(device))
        torch._foreach_add_(ws, updates)
    else:
        torch._foreach_add_(ws, updates, alpha=-lr)
    C.foreach_copy_back(params, ws)


def _fused_lamb(params, grads, exp_avgs, exp_avg_sqs, master_params, state_steps, *,
                adapt, decay, global_grad_norm, grad_scale, found_inf, lr, beta1, beta2,
                eps, weight_decay, bias_correction, grad_averaging, max_grad_norm,
                trust_bounds, eps_inside_sqrt, variant, capturable, maximize, sharding,
                differentiable, prepared):
    """The Triton path: the two passes launched from ``prepared``, the launch tables of these
    tensors (:func:`gpuml.optim._triton.prepare`), which also hold their sharding."""
    from gpuml.optim import _triton

    yield from _triton.lamb_passes(
        prepared, global_grad_norm=global_grad_norm, max_grad_norm=max_grad_norm,
        grad_scale=grad_scale, found_inf=found_inf, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
        weight_decay=weight_decay, bias_correction=bias_correction,
        grad_averaging=grad_averaging, trust_bounds=trust_bounds,
        eps_inside_sqrt=eps_inside_sqrt, variant=variant, maximize=maximize)


def _fused_cpu_lamb(params, grads, exp_avgs, exp_avg_sqs, master_params, state_steps, *,
                    adapt, decay, global_grad_norm, grad_scale, found_inf, lr, beta1, beta2,
                    eps, weight_decay, bias_correction, grad_averaging, max_grad_norm,
                    trust_bounds, eps_inside_sqrt, variant, capturable, maximize, sharding,
                    differentiable, prepared):
    """``fused=True`` on CPU tensors: per tensor, pass 1 (moments, the two sums of squares)
    then, once every trust ratio is known, pass 2 (the update), in numba kernels
    (:mod:`gpuml.optim._numba`). fp16/bf16 parameters without master weights are updated
    through float32 copies, as on the loop path."""
    from gpuml.optim import _numba as K

    if C.skip_step(found_inf):
        return
    gs = [C.widen(g) for g in grads]
    ws = [C.compute_view(p, mp) for p, mp in zip(params, master_params)]
    K.check_layouts(ws, gs, exp_avgs, exp_avg_sqs)
    coef = C.scaled_step_coefficient(grad_scale, global_grad_norm, max_grad_norm)
    c = 1.0 if coef is None else coef.item()
    c = -c if maximize else c  # the gradient negated first, as torch.optim does
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    eps_in, eps_out = (eps, 0.0) if eps_inside_sqrt else (0.0, eps)
    views = [tuple(map(K.flat, t)) for t in zip(gs, exp_avgs, exp_avg_sqs, ws)]
    rows = []
    neg_lr = -float(lr)

    def moments(i):
        step = state_steps[i]
        step += 1
        row = (c, *lamb_coefficients(C.step_value(step), beta1, beta2, beta3, bias_correction,
                                     variant), eps_in, eps_out,
               weight_decay if decay[i] else 0.0)
        rows.append(row)
        return K.run("lamb_moments", views[i][3].size, *views[i], c, beta1, beta3, beta2,
                     1.0 - beta2, *row[1:])

    def update(i, ratio):
        K.run("lamb_apply", views[i][3].size, *views[i], *rows[i], neg_lr * ratio)

    yield from K.two_passes(params, ws, adapt, sharding, moments,
                            lambda w, u: _trust_ratio(w, u, trust_bounds), update)


#: The implementation of each path of :data:`gpuml.optim._common.PATHS`.
_IMPLS = {"loop": _single_tensor_lamb, "foreach": _multi_tensor_lamb, "triton": _fused_lamb,
          "numba": _fused_cpu_lamb}
