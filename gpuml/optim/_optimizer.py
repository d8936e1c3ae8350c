"""The optimizer class around the update rules of LAMB and LARS, and its param groups.

:class:`LayerwiseOptimizer` checks a group's options when the group is added, gathers
its tensors into a :class:`GroupView` that is reused from step to step (the path, the
state, the adaptation and decay flags, the Triton path's tables), hands each group's step
to the rule's functional step (the one that :func:`gpuml.optim.lamb` /
:func:`gpuml.optim.lars` run, which dispatches on the view's path), and keeps fp32 state
fp32 across ``load_state_dict``.
:func:`param_groups_by_name` applies the exclusion rules (which tensors skip layer-wise
adaptation and weight decay) to a model's parameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import compress, repeat
from operator import is_, is_not

import torch
from torch import Tensor
from torch.optim.optimizer import _use_grad_for_differentiable

from gpuml.optim import _sharding as S
from gpuml.optim._common import (
    _COMPLEX,
    FUSED_PATHS,
    _device,
    _dtype,
    _grad,
    _is_sparse,
    as_real,
    check_differentiable,
    choose_path,
    compute_dtype,
    update_inputs,
)

__all__ = ["param_groups_by_name"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

DEFAULT_EXCLUDE = ("bias", "norm", "ln", "bn")


def param_groups_by_name(model: torch.nn.Module, weight_decay: float | None = None,
                         exclude: Iterable[str] = DEFAULT_EXCLUDE, exclude_1d: bool = True,
                         **group_options) -> list[dict]:
    """Two param groups: tensors that get adaptation and weight decay, and those that do not.

    A parameter is excluded (no layer-wise adaptation, no weight decay) when any
    string of ``exclude`` occurs in its lower-cased qualified name (the BERT
    recipe's ``["bias", "LayerNorm", "layer_norm"]``), or, with ``exclude_1d``,
    when it has at most one dimension.

    Parameters
    ----------
    model : torch.nn.Module
    weight_decay : float, optional
        Weight decay of the first group (the optimizer's default when None).
    exclude : iterable of str
        Substrings of parameter names to exclude.
    exclude_1d : bool
        Also exclude tensors with ``ndim <= 1``.
    **group_options
        Extra options copied into both groups (for example ``lr``).

    Returns
    -------
    list of dict
        ``[{"params": [...], "exclude_from_adaptation": False,
        "exclude_from_weight_decay": False, ...}, {"params": [...], ...: True}]``;
        empty groups are dropped.

    Examples
    --------
    >>> import torch
    >>> from gpuml.optim import LAMB, param_groups_by_name
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    >>> groups = param_groups_by_name(model, weight_decay=0.01)
    >>> [len(g["params"]) for g in groups]
    [1, 3]
    >>> opt = LAMB(groups, lr=1e-3)
    """
    patterns = tuple(s.lower() for s in exclude)
    keep, skip = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        out = any(s in name.lower() for s in patterns) or (exclude_1d and p.ndim <= 1)
        (skip if out else keep).append(p)
    first = {"params": keep, "exclude_from_adaptation": False,
             "exclude_from_weight_decay": False, **group_options}
    if weight_decay is not None:
        first["weight_decay"] = weight_decay
    second = {"params": skip, "exclude_from_adaptation": True,
              "exclude_from_weight_decay": True, **group_options}
    return [g for g in (first, second) if g["params"]]


def check_nonneg(name: str, value) -> None:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        # read once, when the group is checked (as torch.optim does: a negative or NaN
        # tensor lr is refused like a float one)
        if not 0.0 <= float(value.detach()):
            raise ValueError(f"Invalid {name}: {value!r} (must be a number >= 0)")
        return
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"Invalid {name}: {value!r} (must be a finite number >= 0)")


def check_positive(name: str, value) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"Invalid {name}: {value!r} (must be a finite number > 0)")


def check_beta(name: str, value) -> None:
    if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"Invalid {name}: {value!r} (must lie in [0, 1))")


def check_bounds(bounds) -> tuple[float, float]:
    try:
        lower, upper = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"trust_bounds must be a pair (lower, upper), got {bounds!r}") from None
    if not (lower >= 0 and upper > 0 and lower <= upper) or math.isnan(upper):
        raise ValueError(f"Invalid trust_bounds {bounds!r}: need 0 <= lower <= upper, upper > 0")
    return lower, upper


def check_exclusion(name: str, value) -> None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be None (exclude tensors with ndim <= 1), True or False; "
                         f"got {value!r}")


def check_group_tensors(params: Sequence[Tensor]) -> list[Tensor]:
    """The parameters that have a gradient; rejects sparse gradients, unsupported dtypes
    (complex ones included) and mixed devices within one group."""
    with_grad = [p for p in params if p.grad is not None]
    if any(map(_is_sparse, map(_grad, with_grad))):
        raise RuntimeError("LAMB/LARS do not support sparse gradients "
                           "(layer-wise norms need dense tensors); use torch.optim.SparseAdam")
    for dtype in set(map(_dtype, with_grad)):
        if dtype not in _SUPPORTED and dtype not in _COMPLEX:
            raise TypeError(f"parameters must be float32, float64, float16, bfloat16, "
                            f"complex64 or complex128, got {dtype}")
    devices = set(map(_device, with_grad))
    if len(devices) > 1:
        raise ValueError(f"parameters of one param group live on several devices "
                         f"{sorted(map(str, devices))}; put each device's parameters in their "
                         "own param group")
    return with_grad


def step_tensor(device: torch.device, on_device: bool) -> Tensor:
    return torch.zeros((), dtype=torch.float32, device=device if on_device else "cpu")


def fix_state_dtypes(optimizer: torch.optim.Optimizer, state_dict: dict, keys: Sequence[str]):
    """Undo ``Optimizer.load_state_dict``'s cast of fp32 state to a low-precision param dtype.

    The moments and master weights stay fp32 whatever the parameter's dtype (float64 for
    float64 parameters), so they are taken from ``state_dict`` again, exactly, and only
    moved to the parameter's device.
    """
    saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for pid, p in zip(saved_ids, params):
        saved = state_dict["state"].get(pid)
        if not saved or p not in optimizer.state:
            continue
        for k in keys:
            v = saved.get(k)
            if isinstance(v, Tensor):
                optimizer.state[p][k] = v.detach().to(device=p.device,
                                                      dtype=compute_dtype(p), copy=True)


def pinned_to_fused(name: str, kwargs: dict) -> dict:
    """``kwargs`` of a ``Fused*`` class: the fused path, and an error if asked for another."""
    if kwargs.get("fused") is False or kwargs.get("foreach"):
        raise ValueError(f"Fused{name} always uses the fused path; use {name} for the others")
    return {**kwargs, "fused": True, "foreach": None}


def _view_options(group: dict) -> tuple:
    """The group options a :class:`GroupView` depends on (path, step placement, flags)."""
    return (group["foreach"], group["fused"], group["capturable"], group["differentiable"],
            group["exclude_from_adaptation"], group["exclude_from_weight_decay"],
            group["always_adapt"], bool(group["weight_decay"] != 0), group["master_weights"])


class GroupView:
    """A param group's tensors as its step needs them, gathered once and reused.

    Gathering a group (checks, path, state creation, flags) walks its tensors in
    Python, which with a few hundred tensors costs as much host time as the fused
    step's kernels take on the GPU. A view keeps the result; :meth:`grads` checks
    with C-level maps over the tensors (no Python per tensor) that it still holds: the
    same group with the same options and parameters, gradients on the same parameters,
    the same state tensors (``step`` included, by identity, in each parameter's state
    dict; the optimizer checks once per step that those dicts are still the ones in its
    state) and no sparse gradient. ``prepared`` is the fused path's launch preparation
    (:func:`gpuml.optim._triton.prepare`), which also checks the addresses of the
    parameters and gradients it encodes.

    With DTensor parameters (FSDP2, HSDP) ``dtensors`` is true: ``params``, ``columns``
    and ``masters`` hold the local tensors the update runs on (``checks`` the DTensors the
    state dicts hold), and :meth:`grads` returns the gradients' local tensors; ``sharding``
    (:class:`gpuml.optim._sharding.Sharding`, or None) says which of them are sharded.
    ``path`` is the group's path (:func:`gpuml.optim._common.choose_path`).
    """

    __slots__ = ("group", "options", "all_params", "has_grad", "path", "params", "columns",
                 "masters", "steps", "adapt", "decay", "state_dicts", "checks", "prepared",
                 "dtensors", "sharding", "complex")

    def grads(self, group: dict) -> list[Tensor] | None:
        """The gradients of ``params`` when the view still holds, else None."""
        ps = group["params"]
        if (group is not self.group or len(ps) != len(self.all_params)
                or not all(map(is_, ps, self.all_params))
                or _view_options(group) != self.options):
            return None
        grads = list(map(_grad, ps))
        has = list(map(is_not, grads, repeat(None)))
        if has != self.has_grad:
            return None
        if len(grads) != len(self.params):
            grads = list(compress(grads, has))
        if self.dtensors:
            grads = S.local(grads)
        if self.complex:
            grads = as_real(grads)
        for key, column in self.checks:
            if not all(map(is_, map(dict.get, self.state_dicts, repeat(key)), column)):
                return None
        if self.prepared is not None:
            return grads if self.prepared.matches(self.params, grads) else None
        return None if any(map(_is_sparse, grads)) else grads


class LayerwiseOptimizer(torch.optim.Optimizer):
    """What LAMB and LARS share around their update rules.

    Group validation on every added group, the ``torch.amp.GradScaler``
    fused-optimizer protocol, per-tensor state creation (step counter, fp32 master copy),
    the adaptation/decay flags, and the step: each group's tensors, with the path chosen
    for them when the group's view was built, handed to the rule's functional step (as
    ``torch.optim.Adam.step`` hands them to ``adam``). Subclasses define ``_KIND``,
    ``_STATE_KEYS``, ``_check_rule``, ``_new_state``, ``_rule_options`` and
    ``_group_step``.
    """

    _step_supports_amp_scaling = True
    #: The fused kernels' name for the rule, and its state keys in table-column order.
    _KIND: str = ""
    _STATE_KEYS: tuple[str, ...] = ()

    def __init__(self, params, rule: dict, exclude_from_adaptation: bool | None,
                 exclude_from_weight_decay: bool | None, master_weights: bool,
                 capturable: bool, foreach: bool | None, fused: bool | None, maximize: bool,
                 differentiable: bool):
        """``rule``: the update rule's options, in the order of its signature; the options
        every rule has follow them in the defaults (and in each group)."""
        defaults = dict(rule, exclude_from_adaptation=exclude_from_adaptation,
                        exclude_from_weight_decay=exclude_from_weight_decay,
                        master_weights=master_weights, capturable=capturable, foreach=foreach,
                        fused=fused, maximize=maximize, differentiable=differentiable)
        self._validate_group(defaults)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict) -> None:
        check_nonneg("lr", group["lr"])
        self._check_rule(group)
        check_exclusion("exclude_from_adaptation", group["exclude_from_adaptation"])
        check_exclusion("exclude_from_weight_decay", group["exclude_from_weight_decay"])
        if group["fused"] and group["foreach"]:
            raise ValueError("fused=True and foreach=True are mutually exclusive")
        if group["differentiable"]:
            check_differentiable(group["foreach"], group["fused"])

    def _check_rule(self, group: dict) -> None:
        """Check the update rule's options of ``group`` (``trust_bounds`` made a pair of
        floats)."""
        raise NotImplementedError

    def _new_state(self, group: dict, state: dict, p: Tensor) -> None:
        """Create the update rule's buffers for ``p`` (its first step)."""
        raise NotImplementedError

    def _rule_options(self, group: dict) -> dict:
        """The update rule's keyword arguments of the functional step, from ``group``."""
        raise NotImplementedError

    def _step_options(self, plan, grad_scale: Tensor | None) -> dict:
        """Keyword arguments of every group's step computed over all groups at once."""
        return {}

    def _group_step(self, *tensors, **options):
        """The rule's functional step of one group (a generator for
        :func:`gpuml.optim._sharding.run_steps`; it dispatches on ``options["path"]``)."""
        raise NotImplementedError

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._validate_group(self.param_groups[-1])

    def load_state_dict(self, state_dict: dict) -> None:
        """``torch.optim.Optimizer.load_state_dict``, keeping the fp32 state fp32.

        torch casts floating state to each parameter's dtype; the moments and master weights
        are fp32 whatever the parameter's (:func:`fix_state_dtypes`). That fix must see what
        the load-state-dict pre-hooks returned and come before the post-hooks, whose edits
        must stand: so the hooks run here, around the load, in torch's order.
        """
        state_dict = state_dict.copy()
        for hook in list(self._optimizer_load_state_dict_pre_hooks.values()):
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        pre, post = (self._optimizer_load_state_dict_pre_hooks,
                     self._optimizer_load_state_dict_post_hooks)
        self._optimizer_load_state_dict_pre_hooks = type(pre)()
        self._optimizer_load_state_dict_post_hooks = type(post)()
        try:
            super().load_state_dict(state_dict)
        finally:
            self._optimizer_load_state_dict_pre_hooks = pre
            self._optimizer_load_state_dict_post_hooks = post
        fix_state_dtypes(self, state_dict, (*self._STATE_KEYS, "master_param"))
        for hook in list(post.values()):
            hook(self)

    def __setstate__(self, state: dict) -> None:
        """Fill what an older or hand-made state dict lacks, as torch's optimizers do: the
        group options missing (this optimizer's defaults, e.g. ``foreach``, ``fused``,
        ``capturable``; ``maximize=False``, what such a state was saved with) and a
        ``step`` saved as a number rather than a tensor."""
        super().__setstate__(state)
        for group in self.param_groups:
            # a group saved before ``maximize`` existed minimised, whatever this optimizer's
            # default (torch.optim fills False too)
            group.setdefault("maximize", False)
            for key, value in self.defaults.items():
                group.setdefault(key, value)
            for p in group["params"]:
                p_state = self.state.get(p)
                if p_state and "step" in p_state and not isinstance(p_state["step"], Tensor):
                    # placed where the group's path needs it when its view is built
                    p_state["step"] = torch.tensor(float(p_state["step"]),
                                                   dtype=torch.float32)

    def _update(self, plan, grad_scale: Tensor | None, found_inf: Tensor | None) -> None:
        """Apply the update rule to every ``(group, view, grads)`` of ``plan``: each group's
        step through the rule's functional step on the view's path (with the Triton path's
        tables the view keeps). With sharded parameters the norms of every group take one
        all-reduce (:func:`gpuml.optim._sharding.run_steps`).
        """
        shared = self._step_options(plan, grad_scale)
        S.run_steps([self._group_step(
            view.params, grads, *view.columns, view.masters, view.steps, adapt=view.adapt,
            decay=view.decay, path=view.path, prepared=view.prepared, sharding=view.sharding,
            grad_scale=grad_scale, found_inf=found_inf, maximize=group["maximize"],
            lr=group["lr"], capturable=group["capturable"],
            differentiable=group["differentiable"], **self._rule_options(group), **shared)
            for group, view, grads in plan], self._reduction)

    @_use_grad_for_differentiable
    def step(self, closure=None, grad_scale: Tensor | None = None,
             found_inf: Tensor | None = None):
        """One optimizer step (without autograd, or recorded by it when the optimizer was
        made with ``differentiable=True``, as in torch.optim).

        ``grad_scale`` (the loss scale, or None if the gradients are unscaled) and
        ``found_inf`` (nonzero: skip the step) are the fused-optimizer protocol of
        ``torch.amp.GradScaler``, which sets them as attributes of the optimizer
        during ``scaler.step(optimizer)``; they can also be passed directly.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale, found_inf, plan = self._step_plan(grad_scale, found_inf)
        self._update(plan, grad_scale, found_inf)
        return loss

    def _step_plan(self, grad_scale: Tensor | None, found_inf: Tensor | None):
        """The scaler tensors and the ``(group, view, grads)`` of the groups with gradients.

        ``torch.amp.GradScaler`` sets ``grad_scale`` / ``found_inf`` as attributes
        of optimizers that support scaling; explicit arguments win. Each group's
        :class:`GroupView` is reused while it holds, else built again.
        """
        if grad_scale is None:
            grad_scale = getattr(self, "grad_scale", None)
        if found_inf is None:
            found_inf = getattr(self, "found_inf", None)
        views = self.__dict__.get("_views")
        if views is None or len(views) != len(self.param_groups):
            views = self._views = [None] * len(self.param_groups)
        # The views hold each parameter's state dict: valid while the state mapping holds
        # the same dicts (one C-level pass; looking up each parameter would call the
        # Python-level Tensor.__hash__ once per tensor).
        states = self.state
        snapshot = self.__dict__.get("_state_dicts")
        same = (snapshot is not None and snapshot[0] is states
                and len(states) == len(snapshot[1])
                and all(map(is_, states.values(), snapshot[1])))
        plan, rebuilt = [], not same
        for i, group in enumerate(self.param_groups):
            view = views[i]
            grads = view.grads(group) if same and view is not None else None
            if grads is None:
                view, grads = self._view(group)
                views[i] = view
                rebuilt = True
            if view.params:
                plan.append((group, view, grads))
        if rebuilt:  # a new view may have created state, or sharded tensors
            self._state_dicts = (states, list(states.values()))
            self._reduction = S.reduction_for((v.sharding for v in views if v is not None),
                                              type(self).__name__)
        return grad_scale, found_inf, plan

    def _view(self, group: dict) -> tuple[GroupView, list[Tensor]]:
        """Check a group's tensors, pick its path, gather its state: a new view."""
        with_grad = check_group_tensors(group["params"])
        grads = list(map(_grad, with_grad))
        dtensors, sharding = S.inspect(with_grad, grads)
        local_params, local_grads = (S.local(with_grad), S.local(grads)) if dtensors \
            else (with_grad, grads)
        path = choose_path(local_params, group["foreach"], group["fused"], local_grads,
                           group["differentiable"]) if with_grad else ""
        params, grads, columns, masters, steps, adapt, decay = self._gather(
            group, path, self._STATE_KEYS)
        view = GroupView()
        view.group, view.options, view.path = group, _view_options(group), path
        view.all_params = list(group["params"])
        view.has_grad = [p.grad is not None for p in view.all_params]
        view.state_dicts = [self.state[p] for p in params]
        view.checks = [("step", steps), *zip(self._STATE_KEYS, columns),
                       ("master_param", masters)]
        view.dtensors, view.sharding = dtensors, sharding
        # the update runs on local shards and real views; the checks keep the originals
        view.complex, params, grads, columns, masters, view.prepared = update_inputs(
            self._KIND, path, dtensors, sharding, params, grads, columns, masters, steps,
            adapt, decay)
        view.params, view.columns, view.masters, view.steps = params, columns, masters, steps
        view.adapt, view.decay = adapt, decay
        return view, grads

    def _gather(self, group: dict, path: str, keys: Sequence[str]):
        """The tensors of ``group`` that have a gradient, their state and their flags.

        State is created on first use and ``step`` placed where ``path`` needs it.
        Returns ``(params, grads, [state[k] or None for each of keys], masters, steps,
        adapt, decay)``, lists over those tensors; ``adapt``/``decay``: whether a tensor
        gets the trust ratio and weight decay under the group's exclusion rules (a rule
        of None excludes tensors with ``ndim <= 1``). Runs when a :class:`GroupView` is
        built, not at every step.
        """
        on_device = path in FUSED_PATHS or group["capturable"]
        rule_adapt = group["exclude_from_adaptation"]
        rule_decay = group["exclude_from_weight_decay"]
        always, has_wd = group["always_adapt"], group["weight_decay"] != 0
        params, grads, masters, steps, adapt, decay = [], [], [], [], [], []
        columns = [[] for _ in keys]
        states = self.state
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            state = states[p]
            if not state:
                state["step"] = step_tensor(p.device, on_device)
                self._new_state(group, state, p)
                if group["master_weights"] and p.dtype in _LOW_PRECISION:
                    state["master_param"] = p.detach().float().clone()
            step = state["step"]
            if (step.device != p.device) if on_device else not step.is_cpu:
                step = state["step"] = step.to(p.device if on_device else "cpu", torch.float32)
            low = p.ndim <= 1
            d = not (low if rule_decay is None else rule_decay)
            params.append(p)
            grads.append(g)
            for col, k in zip(columns, keys):
                col.append(state.get(k))
            masters.append(state.get("master_param"))
            steps.append(step)
            decay.append(d)
            adapt.append(not (low if rule_adapt is None else rule_adapt)
                         and (always or (d and has_wd)))
        return params, grads, columns, masters, steps, adapt, decay
