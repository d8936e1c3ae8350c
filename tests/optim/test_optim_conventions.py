"""torch.optim's conventions, LAMB and LARS side by side with torch.optim.AdamW.

Each test does the same thing to AdamW and to gpuml's optimizers and expects the same kind of
outcome: what a user swapping ``AdamW`` for ``LAMB`` relies on.
"""

import ast
import os
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # the fused path in the Triton interpreter, as elsewhere
    os.environ.setdefault("TRITON_INTERPRET", "1")

from gpuml.optim import LAMB, LARS  # noqa: E402

OPTIM = Path(__file__).resolve().parents[2] / "gpuml" / "optim"
OPTIMIZERS = {"AdamW": lambda ps, **kw: torch.optim.AdamW(ps, **kw),
              "LAMB": lambda ps, **kw: LAMB(ps, **kw),
              "LARS": lambda ps, **kw: LARS(ps, **kw)}


def _imports(path: Path) -> set[str]:
    """The gpuml modules ``path`` imports at module level (not inside functions)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("gpuml")}


def test_common_and_triton_do_not_import_each_other():
    """``_triton`` (the fused path's host side) and ``_triton_kernels`` take their helpers
    from ``_layout``; only ``_common`` and ``_optimizer`` reach ``_triton``, and only inside
    the functions of the fused path."""
    for name in ("_triton.py", "_triton_kernels.py"):
        triton_imports = _imports(OPTIM / name)
        assert not any("_common" in m or "_optimizer" in m for m in triton_imports), \
            (name, triton_imports)
    for name in ("_common.py", "_optimizer.py"):
        assert not any("_triton" in m for m in _imports(OPTIM / name)), name
    assert not any("_common" in m or "_triton" in m for m in _imports(OPTIM / "_layout.py"))


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in [(5, 4), (4,), (3, 5)]]


def _set_grads(ps, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)


def _train(opt, ps, steps, start=0):
    for k in range(start, start + steps):
        _set_grads(ps, k)
        opt.step()


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("lr", [torch.tensor(-0.1), torch.tensor(float("nan")), -0.1])
def test_negative_lr_refused_even_as_a_tensor(name, lr):
    with pytest.raises(ValueError, match="(?i)invalid.*(lr|learning rate)"):
        OPTIMIZERS[name](_params(), lr=lr)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_tensor_lr_accepted(name):
    ps = _params()
    _train(OPTIMIZERS[name](ps, lr=torch.tensor(0.01)), ps, 2)
    assert all(torch.isfinite(p).all() for p in ps)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_eps_zero_allowed(name):
    """AdamW takes eps=0 (the user's risk where a second moment is 0); so do LAMB and LARS,
    and with non-zero gradients the step is finite. LARS with eps=0 and trust_coefficient=1 is
    the plain ratio ||w|| / (||g|| + wd ||w||)."""
    ps = _params()
    opt = OPTIMIZERS[name](ps, lr=0.01, eps=0.0)
    assert opt.param_groups[0]["eps"] == 0.0
    _train(opt, ps, 3)
    assert all(torch.isfinite(p).all() for p in ps)
    with pytest.raises(ValueError):
        OPTIMIZERS[name](_params(), lr=0.01, eps=-1e-8)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_old_state_dict_without_new_keys_and_with_float_step(name):
    """A state dict saved before ``foreach``/``fused``/``capturable`` existed, with a number
    for ``step``: torch's optimizers fill the defaults in ``__setstate__``; the resumed run
    equals the uninterrupted one."""
    ps_ref = _params()
    ref = OPTIMIZERS[name](ps_ref, lr=0.01)
    _train(ref, ps_ref, 4)
    ps = _params()
    opt = OPTIMIZERS[name](ps, lr=0.01)
    _train(opt, ps, 2)
    sd = opt.state_dict()
    for group in sd["param_groups"]:
        for key in ("foreach", "fused", "capturable"):
            group.pop(key, None)
    for st in sd["state"].values():
        st["step"] = float(st["step"])
    resumed = OPTIMIZERS[name](ps, lr=0.01)
    resumed.load_state_dict(sd)
    for group in resumed.param_groups:
        assert {"foreach", "fused", "capturable"} <= set(group)
    _train(resumed, ps, 2, start=2)
    for a, b in zip(ps, ps_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_load_state_dict_hooks_are_respected(name):
    """A pre-hook's returned dict is what is loaded; a post-hook's edits of the state stand."""
    ps = _params()
    opt = OPTIMIZERS[name](ps, lr=0.01)
    _train(opt, ps, 1)
    sd = opt.state_dict()
    target = OPTIMIZERS[name](_params(1), lr=0.01)

    def pre(optimizer, state_dict):
        out = dict(state_dict)
        out["param_groups"] = [dict(g, lr=0.125) for g in state_dict["param_groups"]]
        return out

    def post(optimizer):
        # new tensors, not in-place fills: the loaded state may share its tensors with `sd`
        for st in optimizer.state.values():
            for key, value in list(st.items()):
                if key != "step" and isinstance(value, torch.Tensor):
                    st[key] = torch.full_like(value, 7.0)

    target.register_load_state_dict_pre_hook(pre)
    target.register_load_state_dict_post_hook(post)
    target.load_state_dict(sd)
    assert [g["lr"] for g in target.param_groups] == [0.125]
    buffers = [v for st in target.state.values() for k, v in st.items()
               if k != "step" and isinstance(v, torch.Tensor)]
    assert buffers and all(bool((b == 7.0).all()) for b in buffers)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_torch_compile_of_a_training_step_matches_eager(name):
    """torch.compile of forward + backward + ``opt.step()`` (graph breaks allowed) follows
    eager to 1e-6. Dynamo treats an optimizer method named ``_init_group`` specially (it
    expects torch's own contract back): gpuml's optimizers must not define one."""
    if name != "AdamW":
        cls = {"LAMB": LAMB, "LARS": LARS}[name]
        own = [k for c in cls.__mro__ if c is not torch.optim.Optimizer
               and issubclass(c, torch.optim.Optimizer) for k in vars(c)]
        assert "_init_group" not in own
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=g), torch.randn(32, 2, generator=g)
    out = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                    torch.nn.Linear(16, 2))
        opt = OPTIMIZERS[name](model.parameters(), lr=0.01, foreach=True)

        def step(model=model, opt=opt):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss

        fn = torch.compile(step) if compiled else step
        for _ in range(3):
            fn()
        out.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch._dynamo.reset()
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=1e-6)


# ---- float64 parameters ------------------------------------------------------------------

F64_SHAPES = [(6, 5), (5,), (3, 4, 2), (1, 7)]


def _f64_problem(steps=10, seed=3):
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal(s) for s in F64_SHAPES]
    grads = [[rng.standard_normal(s) * (0.5 + k) for s in F64_SHAPES] for k in range(steps)]
    return ws, grads


def _run_f64(cls, ws, grads, **kw):
    ps = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float64)) for w in ws]
    opt = cls(ps, **kw)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    return ps, opt


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_float64_parameters_accepted_and_state_is_float64(name):
    """torch.optim keeps float64 parameters and their state in float64; so do LAMB/LARS."""
    ws, grads = _f64_problem(steps=2)
    ps = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float64)) for w in ws]
    opt = OPTIMIZERS[name](ps, lr=0.01)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    assert all(p.dtype == torch.float64 and torch.isfinite(p).all() for p in ps)
    buffers = [v for st in opt.state.values() for k, v in st.items()
               if k != "step" and isinstance(v, torch.Tensor)]
    assert buffers and all(b.dtype == torch.float64 for b in buffers)


@pytest.mark.parametrize("impl", [dict(foreach=False), dict(foreach=True)])
@pytest.mark.parametrize("opts", [{}, {"weight_decay": 0.1, "max_grad_norm": 0.5}])
def test_lamb_float64_matches_the_written_out_algorithm(impl, opts):
    """10 steps of LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT
    in 76 minutes", 2019, Alg. 2) on float64 parameters, against the algorithm written out
    plainly in NumPy float64 (tests/optim/test_optim_lamb.py), to 1e-12: with the defaults
    (no clipping, every tensor adapted and decayed, the trust ratio 1 where a norm is 0), and
    with global clipping."""
    from test_optim_lamb import np_lamb

    ws, grads = _f64_problem()
    kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=None)
    kw.update(opts)
    ps, _ = _run_f64(LAMB, ws, grads, **{**opts, **impl})
    every = [True] * len(F64_SHAPES)
    want = np_lamb(ws, grads, lr=kw["lr"], beta1=kw["betas"][0], beta2=kw["betas"][1],
                   eps=kw["eps"], wd=kw["weight_decay"], adapt=every, decay=every,
                   max_grad_norm=kw["max_grad_norm"])
    for p, w in zip(ps, want):
        np.testing.assert_allclose(p.detach().numpy(), w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", [dict(foreach=False), dict(foreach=True)])
@pytest.mark.parametrize("opts", [{}, {"weight_decay": 5e-4, "nesterov": True}])
def test_lars_float64_matches_the_written_out_algorithm(impl, opts):
    """10 steps of LARS (You, Gitman, Ginsburg, "Large Batch Training of Convolutional
    Networks", 2017) on float64 parameters against the algorithm written out in NumPy float64
    (tests/optim/test_optim_lars.py), to 1e-12, with the defaults (lr 1, momentum 0.9,
    trust coefficient 1e-3, every tensor adapted, 1-D tensors without weight decay)."""
    from test_optim_lars import np_lars_classic

    ws, grads = _f64_problem()
    ps, _ = _run_f64(LARS, ws, grads, **{**opts, **impl})
    rule = [len(s) > 1 for s in F64_SHAPES]
    want = np_lars_classic(ws, grads, lr=1.0, momentum=0.9, wd=opts.get("weight_decay", 0.0),
                           l=1e-3, eps=1e-8, adapt=[True] * len(rule), decay=rule,
                           nesterov=opts.get("nesterov", False))
    for p, w in zip(ps, want):
        np.testing.assert_allclose(p.detach().numpy(), w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_float64_on_the_fused_path_is_a_clear_error(cls):
    """The Triton kernels compute in float32: fused=True refuses float64 by name (before any
    kernel runs) and points to the foreach path."""
    ws, grads = _f64_problem(steps=1)
    with pytest.raises(TypeError, match="float64.*foreach"):
        _run_f64(cls, ws, grads, fused=True)


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_float64_state_dict_round_trip_keeps_float64(cls):
    ws, grads = _f64_problem(steps=4)
    ps_ref, _ = _run_f64(cls, ws, grads)
    ps, opt = _run_f64(cls, ws, grads[:2])
    sd = opt.state_dict()
    resumed = cls(ps)
    resumed.load_state_dict(sd)
    assert all(v.dtype == torch.float64 for st in resumed.state.values()
               for k, v in st.items() if k != "step")
    for gs in grads[2:]:
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g, dtype=torch.float64)
        resumed.step()
    for a, b in zip(ps, ps_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---- maximize ----------------------------------------------------------------------------

def _max_run(cls, impl, maximize, steps=4, device="cpu", **kw):
    """``steps`` steps on f (maximize=True) or on -f (maximize=False): the gradients of -f are
    the negated gradients of f, exactly."""
    ps = [torch.nn.Parameter(p.detach().to(device)) for p in _params()]
    opt = cls(ps, maximize=maximize, **impl, **kw)
    for k in range(steps):
        g = torch.Generator().manual_seed(100 + k)
        for p in ps:
            grad = torch.randn(p.shape, generator=g).to(device)
            p.grad = grad if maximize else -grad
        opt.step()
    return ps, opt


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_maximize_is_an_option_with_default_false(name):
    opt = OPTIMIZERS[name](_params(), lr=0.01)
    assert opt.defaults["maximize"] is False
    assert opt.param_groups[0]["maximize"] is False


MAX_IMPLS = {"loop": dict(foreach=False), "foreach": dict(foreach=True),
             "fused": dict(fused=True)}


@pytest.mark.parametrize("impl", list(MAX_IMPLS))
@pytest.mark.parametrize("cls,kw", [
    (LAMB, {}), (LAMB, {"max_grad_norm": None, "variant": "nnlamb"}),
    (LARS, {"lr": 0.5}), (LARS, {"lr": 0.5, "mode": "normalized", "weight_decay": 0.01}),
    (LARS, {"lr": 0.5, "nesterov": True, "weight_decay": 0.01})])
def test_maximize_on_f_equals_minimizing_minus_f_bit_for_bit(cls, kw, impl):
    """torch.optim's ``maximize=True`` negates the gradient: the same steps as minimising -f,
    bit for bit on the CPU, on every path (the fused one in the Triton interpreter)."""
    device = "cpu"
    if impl == "fused":
        pytest.importorskip("triton")
        device = "cuda" if torch.cuda.is_available() else "cpu"
    up, _ = _max_run(cls, MAX_IMPLS[impl], True, device=device, **kw)
    down, _ = _max_run(cls, MAX_IMPLS[impl], False, device=device, **kw)
    for a, b in zip(up, down):
        assert torch.equal(a, b)
    # and it is not a no-op: maximising f moves away from where minimising f goes
    ps = [torch.nn.Parameter(p.detach().to(device)) for p in _params()]
    opt = cls(ps, **MAX_IMPLS[impl], **kw)
    for k in range(4):
        g = torch.Generator().manual_seed(100 + k)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(device)
        opt.step()
    assert not all(torch.equal(a, b) for a, b in zip(up, ps))


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_state_dict_from_before_maximize_gets_the_default(cls):
    """A state dict saved before ``maximize`` existed loads with ``maximize=False`` (filled in
    ``__setstate__``, as torch.optim does) and resumes as the uninterrupted run."""
    ps_ref = _params()
    ref = cls(ps_ref, lr=0.01)
    _train(ref, ps_ref, 4)
    ps = _params()
    opt = cls(ps, lr=0.01)
    _train(opt, ps, 2)
    sd = opt.state_dict()
    for group in sd["param_groups"]:
        del group["maximize"]
    resumed = cls(ps, lr=0.01, maximize=True)
    resumed.load_state_dict(sd)
    assert [g["maximize"] for g in resumed.param_groups] == [False]
    _train(resumed, ps, 2, start=2)
    for a, b in zip(ps, ps_ref):
        assert torch.equal(a, b)


# ---- complex parameters ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("impl", [dict(foreach=False), dict(foreach=True)])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_complex_parameters_step_as_their_real_views(name, impl, dtype):
    """torch.optim updates a complex parameter as ``torch.view_as_real`` of it: the same steps
    as a real parameter holding its real and imaginary parts (norms are the complex norms).
    Exclusion from adaptation is off: it looks at ``ndim``, which the real view changes."""
    kw = dict(lr=0.05, **impl)
    if name != "AdamW":
        kw.update(exclude_from_adaptation=False, exclude_from_weight_decay=False)
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 3), (5,), (2, 3, 2)]
    cs = [torch.nn.Parameter(torch.randn(s, dtype=dtype, generator=g)) for s in shapes]
    rs = [torch.nn.Parameter(torch.view_as_real(c.detach()).clone()) for c in cs]
    opt_c, opt_r = OPTIMIZERS[name](cs, **kw), OPTIMIZERS[name](rs, **kw)
    for k in range(4):
        g = torch.Generator().manual_seed(10 + k)
        for c, r in zip(cs, rs):
            c.grad = torch.randn(c.shape, dtype=dtype, generator=g)
            r.grad = torch.view_as_real(c.grad).clone()
        opt_c.step()
        opt_r.step()
    for c, r in zip(cs, rs):
        assert c.dtype == dtype
        torch.testing.assert_close(torch.view_as_real(c.detach()), r.detach(), rtol=0,
                                   atol=1e-6 if dtype == torch.complex64 else 1e-12)
    assert all(v.dtype == dtype for st in opt_c.state.values() for k, v in st.items()
               if k != "step")


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_complex_on_the_fused_path_is_a_clear_error(cls):
    p = torch.nn.Parameter(torch.randn(3, 3, dtype=torch.complex64))
    p.grad = torch.randn_like(p)
    with pytest.raises(TypeError, match="complex64.*foreach"):
        cls([p], fused=True).step()


# ---- differentiable=True ---------------------------------------------------------------------

def _one_step(p, grad, state, name, kwargs, *tensors):
    """torch's own differentiable-optimizer test (test/optim/test_optim.py, ``_diff_fn``): one
    step on copies, returning the new parameter and the state tensors that need gradients.
    ``tensors`` repeats the inputs inside ``state`` and ``kwargs`` so that gradcheck sees them."""
    p = p.clone()
    p.grad = grad
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    opt = OPTIMIZERS[name]([p], **kwargs)
    opt.state[p].update(state)
    opt.step()
    return (p, *(v for v in opt.state[p].values() if isinstance(v, torch.Tensor)
                 and v.requires_grad))


def _diff_inputs(name, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.rand(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_()

    # 2-D so that LAMB/LARS adapt it (1-D tensors are excluded by default); a gradient of norm
    # above 1 so that LAMB's global clipping acts
    p, grad = rand(3, 4), rand(3, 4, scale=2.0)
    step = torch.tensor(10.0, dtype=torch.float32 if name != "AdamW" else torch.float64)
    state = ({"step": step, "momentum_buffer": rand(3, 4, scale=0.1)} if name == "LARS" else
             {"step": step, "exp_avg": rand(3, 4, scale=0.1), "exp_avg_sq": rand(3, 4,
                                                                             scale=0.1)})
    return p, grad, state


DIFF_KWARGS = {
    "AdamW": [dict(lr=0.05, weight_decay=0.1)],
    "LAMB": [dict(lr=0.05), dict(lr=0.05, variant="nnlamb", eps_inside_sqrt=False),
             dict(lr=0.05, max_grad_norm=None, maximize=True)],
    "LARS": [dict(lr=0.5, weight_decay=1e-2), dict(lr=0.5, nesterov=True, dampening=0.0),
             dict(lr=0.5, mode="normalized", weight_decay=1e-2)],
}


@pytest.mark.parametrize("name, kwargs", [(n, k) for n, ks in DIFF_KWARGS.items() for k in ks])
def test_differentiable_step_passes_gradcheck(name, kwargs):
    """As torch tests AdamW: gradcheck (finite differences in float64) of one step with
    respect to the parameter, its gradient, the state and a tensor learning rate."""
    p, grad, state = _diff_inputs(name)
    lr = torch.tensor(kwargs["lr"], dtype=torch.float64, requires_grad=True)
    kwargs = dict(kwargs, lr=lr, differentiable=True)
    assert torch.autograd.gradcheck(
        _one_step, (p, grad, state, name, kwargs, lr, *state.values()))


@pytest.mark.parametrize("name", ["LAMB", "LARS"])
def test_differentiable_step_equals_the_plain_step(name):
    p, grad, state = _diff_inputs(name)
    with torch.no_grad():
        plain = _one_step(p.detach(), grad.detach(), {k: v.detach() for k, v in state.items()},
                          name, dict(lr=0.05))
    recorded = _one_step(p, grad, state, name, dict(lr=0.05, differentiable=True))
    assert recorded[0].requires_grad
    torch.testing.assert_close(recorded[0].detach(), plain[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["LAMB", "LARS"])
@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_differentiable_refuses_foreach_and_fused(name, impl):
    with pytest.raises(RuntimeError, match=f"`{impl}` does not support `differentiable`"):
        OPTIMIZERS[name](_params(), differentiable=True, **{impl: True})


@pytest.mark.parametrize("name", ["LAMB", "LARS"])
def test_differentiable_is_a_group_option_filled_for_old_state_dicts(name):
    ps = _params()
    opt = OPTIMIZERS[name](ps)
    assert opt.param_groups[0]["differentiable"] is False
    saved = opt.state_dict()
    del saved["param_groups"][0]["differentiable"]
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["differentiable"] is False
