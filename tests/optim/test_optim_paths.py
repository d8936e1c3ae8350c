"""The three implementations agree (loop = reference, foreach, fused Triton), and the
protocol pieces: GradScaler, master weights, capturable, state_dict, NaN, bad input.

The fused path runs on CUDA when there is a GPU, else in the Triton interpreter on CPU
(``TRITON_INTERPRET=1``, set before the kernels are first imported). Without triton (the
``test`` extra leaves it out; ``make test`` installs it) the fused cases skip, saying so, and
the loop and foreach cases run.
"""

import copy
import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from gpuml.optim import LAMB, LARS, FusedLAMB, FusedLARS  # noqa: E402
from gpuml.optim._layout import triton_available  # noqa: E402

if triton_available():
    from gpuml.optim import _triton
else:
    _triton = None
needs_triton = pytest.mark.skipif(
    _triton is None, reason="triton is not installed: the fused path runs Triton's kernels "
    "(on the CPU in its interpreter); `make test` installs it, the test extra does not")
#: The fused case as a parameter: skipped, with the reason, where triton is missing.
FUSED = pytest.param("fused", marks=needs_triton)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(7, 5), (5,), (70, 100), (3, 1, 4), (1,)]
IMPLS = {"loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}
ALL_IMPLS = ["loop", "foreach", FUSED]

# On CUDA where there is a GPU: part of the GPU selection (see tests/conftest.py).
pytestmark = pytest.mark.cuda_also


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    # several chunks per tensor, so the in-kernel per-tensor reductions are exercised
    if _triton is None:
        return
    monkeypatch.setattr(_triton, "INTERPRET_CHUNK", 1024)
    monkeypatch.setattr(_triton, "INTERPRET_BLOCK", 256)


def params(dtype=torch.float32, seed=0, device=None):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(device or DEV, dtype))
            for s in SHAPES]


def grads_for(ps, step, scale=1.0):
    g = torch.Generator().manual_seed(100 + step)
    return [(torch.randn(p.shape, generator=g) * (1 + step) * scale).to(p.device, p.dtype)
            for p in ps]


def train(cls, impl, steps=3, dtype=torch.float32, kw=None, ps=None):
    ps = ps if ps is not None else params(dtype)
    opt = cls(ps, **IMPLS[impl], **(kw or {}))
    for k in range(steps):
        for p, g in zip(ps, grads_for(ps, k)):
            p.grad = g
        opt.step()
    return ps, opt


def assert_same(a, b, rtol=1e-5, atol=1e-6):
    for x, y in zip(a, b):
        torch.testing.assert_close(x.detach().float().cpu(), y.detach().float().cpu(),
                                   rtol=rtol, atol=atol)


LAMB_OPTS = [
    {},
    {"max_grad_norm": None, "eps_inside_sqrt": False, "trust_bounds": (0.5, 2.0)},
    {"variant": "nlamb", "weight_decay": 0.1},
    {"variant": "nnlamb", "grad_averaging": False, "always_adapt": False},
    {"bias_correction": False, "exclude_from_adaptation": False,
     "exclude_from_weight_decay": False},
]
LARS_OPTS = [
    {},
    {"momentum": 0.0, "weight_decay": 1e-3, "clip": True, "lr": 0.01},
    {"nesterov": True, "weight_decay": 1e-4, "trust_bounds": (1e-4, 1e-3)},
    {"dampening": 0.5, "always_adapt": False, "weight_decay": 1e-4},
    {"mode": "normalized", "weight_decay": 1e-3, "exclude_from_adaptation": False},
]


@pytest.mark.parametrize("impl", ["foreach", FUSED])
@pytest.mark.parametrize("kw", LAMB_OPTS)
def test_lamb_paths_agree(impl, kw):
    ref, _ = train(LAMB, "loop", kw=dict(lr=0.05, **kw))
    got, _ = train(LAMB, impl, kw=dict(lr=0.05, **kw))
    assert_same(got, ref)


@pytest.mark.parametrize("impl", ["foreach", FUSED])
@pytest.mark.parametrize("kw", LARS_OPTS)
def test_lars_paths_agree(impl, kw):
    kw = dict({"lr": 1.0}, **kw)
    ref, _ = train(LARS, "loop", kw=kw)
    got, _ = train(LARS, impl, kw=kw)
    assert_same(got, ref)


def test_default_is_the_loop_on_cpu_and_fused_classes_pin_fused():
    from gpuml.optim._common import choose_path

    cpu = [torch.zeros(2)]
    assert choose_path(cpu, None, None) == "loop"
    assert choose_path(cpu, True, None) == "foreach"
    assert choose_path(cpu, False, None) == "loop"
    assert FusedLAMB(params()).param_groups[0]["fused"] is True
    assert FusedLARS(params()).param_groups[0]["fused"] is True
    with pytest.raises(ValueError):
        FusedLAMB(params(), fused=False)


@pytest.mark.parametrize("cls", [LAMB, LARS])
@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_grad_scale_unscales_on_the_fly(cls, impl):
    kw = {"lr": 0.05} if cls is LAMB else {"lr": 1.0, "weight_decay": 1e-4}
    ref, _ = train(cls, "loop", kw=kw)
    ps = params()
    opt = cls(ps, **IMPLS[impl], **kw)
    scale = torch.tensor(1024.0, device=DEV)
    for k in range(3):
        for p, g in zip(ps, grads_for(ps, k, scale=1024.0)):
            p.grad = g
        opt.step(grad_scale=scale, found_inf=torch.zeros((), device=DEV))
    assert_same(ps, ref, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("cls", [LAMB, LARS])
@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_found_inf_skips_the_step(cls, impl):
    ps, opt = train(cls, impl, steps=2)
    before = [p.detach().clone() for p in ps]
    state = copy.deepcopy(opt.state_dict())
    for p in ps:
        p.grad = torch.full_like(p, float("inf"))
    opt.step(grad_scale=torch.tensor(2.0, device=DEV), found_inf=torch.ones((), device=DEV))
    assert_same(ps, before, rtol=0, atol=0)
    after = opt.state_dict()
    for k, s in state["state"].items():
        for name, v in s.items():
            torch.testing.assert_close(after["state"][k][name].cpu(), v.cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("make", [
    lambda ps, impl: LAMB(ps, lr=0.01, eps=1e-2, max_grad_norm=None, **IMPLS[impl]),
    lambda ps, impl: LARS(ps, lr=1.0, weight_decay=0.1, **IMPLS[impl]),
])
def test_torch_grad_scaler_end_to_end(make, impl):
    """scaler.step(opt) hands grad_scale/found_inf to the optimizer (attributes); the result
    equals an unscaled run (both optimizers here are not scale-invariant), and a step whose
    gradients hold an inf is skipped."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(),
                                torch.nn.Linear(4, 1)).to(DEV)
    ref = copy.deepcopy(model)
    x, y = torch.randn(32, 6, device=DEV), torch.randn(32, 1, device=DEV)
    opt, opt_ref = make(list(model.parameters()), impl), make(list(ref.parameters()), "loop")
    scaler = torch.amp.GradScaler(DEV, init_scale=256.0)
    for k in range(4):
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        if k == 2:
            before = [p.detach().clone() for p in model.parameters()]
            model[0].weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        if k == 2:
            assert_same(list(model.parameters()), before, rtol=0, atol=0)
            assert scaler.get_scale() == 128.0
            continue
        opt_ref.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt_ref.step()
    assert not hasattr(opt, "grad_scale")
    assert_same(list(model.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["foreach", FUSED])
@pytest.mark.parametrize("cls", [LAMB, LARS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_master_weights_low_precision(cls, dtype, impl):
    kw = dict(lr=0.05, master_weights=True) if cls is LAMB else dict(lr=1.0, master_weights=True)
    runs = {name: train(cls, name, dtype=dtype, kw=kw) for name in ("loop", impl)}
    masters = {name: [opt.state[p]["master_param"] for p in ps]
               for name, (ps, opt) in runs.items()}
    assert all(m.dtype == torch.float32 for m in masters["loop"])
    assert_same(masters[impl], masters["loop"], rtol=1e-5, atol=1e-6)
    for p, q in zip(runs[impl][0], runs["loop"][0]):
        assert p.dtype == dtype
        torch.testing.assert_close(p.float(), q.float(), rtol=1e-2, atol=1e-2)
    # the masters follow the fp32 run on the same (low-precision) data
    ps32 = [torch.nn.Parameter(p.detach().float()) for p in params(dtype)]
    opt = cls(ps32, foreach=False, **{k: v for k, v in kw.items() if k != "master_weights"})
    for k in range(3):
        for p, g in zip(ps32, grads_for(params(dtype), k)):
            p.grad = g.float()
        opt.step()
    assert_same(masters["loop"], ps32, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", [LAMB, LARS])
@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_low_precision_without_master(cls, impl):
    ref, _ = train(cls, "loop", dtype=torch.bfloat16)
    got, opt = train(cls, impl, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in got)
    assert "master_param" not in opt.state[got[0]]
    assert_same(got, ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("cls", [LAMB, LARS])
@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_capturable_and_tensor_lr(cls, impl):
    lr = 0.05 if cls is LAMB else 1.0
    ref, _ = train(cls, "loop", kw={"lr": lr})
    ps = params()
    kw = {"lr": torch.tensor(lr, device=DEV)}
    if impl != "fused":
        kw["capturable"] = True
    got, opt = train(cls, impl, kw=kw, ps=ps)
    assert opt.state[got[0]]["step"].device.type == torch.device(DEV).type
    assert float(opt.state[got[0]]["step"]) == 3.0
    assert_same(got, ref)


@pytest.mark.parametrize("cls", [LAMB, LARS])
@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip(cls, impl, dtype):
    ps, opt = train(cls, impl, steps=2, dtype=dtype, kw={"master_weights": True})
    sd = copy.deepcopy(opt.state_dict())
    ps2 = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    opt2 = cls(ps2, **IMPLS[impl], master_weights=True)
    opt2.load_state_dict(sd)
    sd2 = opt2.state_dict()
    for k, s in sd["state"].items():
        for name, v in s.items():
            w = sd2["state"][k][name]
            assert w.dtype == v.dtype, name
            torch.testing.assert_close(w.cpu(), v.cpu(), rtol=0, atol=0)
    assert sd2["param_groups"] == sd["param_groups"]
    for o, pp in ((opt, ps), (opt2, ps2)):
        for p, g in zip(pp, grads_for(pp, 7)):
            p.grad = g
        o.step()
    assert_same(ps2, ps, rtol=0, atol=0)


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_nan_gradients_without_scaler(impl):
    """Documented: gradients are not inspected. A NaN gradient makes its own tensor NaN;
    with global clipping (LAMB max_grad_norm) the NaN norm makes every tensor NaN."""
    for clip, all_nan in ((None, False), (1.0, True)):
        ps = params()
        opt = LAMB(ps, max_grad_norm=clip, **IMPLS[impl])
        for p, g in zip(ps, grads_for(ps, 0)):
            p.grad = g
        ps[0].grad[0, 0] = float("nan")
        opt.step()
        assert torch.isnan(ps[0]).any()
        assert all(torch.isnan(p).all() == all_nan for p in ps[1:])
    ps = params()
    opt = LARS(ps, **IMPLS[impl])
    for p, g in zip(ps, grads_for(ps, 0)):
        p.grad = g
    ps[0].grad[0, 0] = float("nan")
    opt.step()
    assert torch.isnan(ps[0]).any() and all(torch.isfinite(p).all() for p in ps[1:])


# ---- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [
    {"lr": -1.0}, {"betas": (-0.1, 0.9)}, {"betas": (0.9, 1.0)}, {"betas": (1.0, 0.9)},
    {"lr": torch.tensor(-1.0)}, {"eps": -1e-8}, {"weight_decay": -0.01}, {"variant": "adam"},
    {"variant": "nlamb", "bias_correction": False}, {"trust_bounds": (2.0, 1.0)},
    {"max_grad_norm": 0.0}, {"exclude_from_adaptation": "bias"},
    {"fused": True, "foreach": True}, {"lr": float("nan")},
])
def test_lamb_rejects_bad_arguments(kw):
    with pytest.raises(ValueError):
        LAMB(params(), **kw)


@pytest.mark.parametrize("kw", [
    {"lr": -1.0}, {"momentum": 1.0}, {"momentum": -0.5}, {"eps": -1e-8},
    {"lr": torch.tensor(-1.0)},
    {"weight_decay": -1e-4}, {"trust_coefficient": 0.0}, {"nesterov": True, "momentum": 0.0},
    {"mode": "normalized", "nesterov": True}, {"mode": "sgd"}, {"dampening": 2.0},
])
def test_lars_rejects_bad_arguments(kw):
    with pytest.raises(ValueError):
        LARS(params(), **kw)


def test_bad_group_options_are_rejected_too():
    opt = LAMB(params()[:2])
    with pytest.raises(ValueError):
        opt.add_param_group({"params": params()[2:], "lr": -0.1})


@pytest.mark.parametrize("cls", [LAMB, LARS])
@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_sparse_gradients_are_rejected(cls, impl):
    emb = torch.nn.Embedding(10, 3, sparse=True).to(DEV)
    emb(torch.tensor([1, 2], device=DEV)).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        cls(emb.parameters(), **IMPLS[impl]).step()


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_mixed_devices_in_one_group_are_rejected(cls):
    a = torch.nn.Parameter(torch.ones(2, 2))
    b = torch.nn.Parameter(torch.ones(2, 2, device="meta"))
    a.grad, b.grad = torch.ones(2, 2), torch.ones(2, 2, device="meta")
    with pytest.raises(ValueError, match="several devices"):
        cls([a, b]).step()


@pytest.mark.parametrize("cls", [FusedLAMB, FusedLARS])
def test_fused_on_a_device_without_kernels_is_a_clear_error(cls):
    """CUDA tensors take the Triton kernels, CPU tensors the numba ones
    (tests/optim/test_optim_fused_cpu.py); other devices are refused by name."""
    ps = [torch.nn.Parameter(torch.ones(2, 2, device="meta"))]
    ps[0].grad = torch.ones(2, 2, device="meta")
    with pytest.raises(RuntimeError, match="CUDA or CPU tensors.*meta"):
        cls(ps).step()


def test_unsupported_dtype_is_rejected():
    # float64 and complex are supported (tests/optim/test_optim_conventions.py)
    p = torch.nn.Parameter(torch.ones(2, 2).to(torch.float8_e4m3fn))
    p.grad = torch.ones(2, 2).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="float32"):
        LAMB([p]).step()


@needs_triton
@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_fused_channels_last_and_layout_mismatch(cls):
    def conv_params():
        g = torch.Generator().manual_seed(5)
        w = torch.randn(8, 3, 5, 5, generator=g).to(DEV)
        w = w.contiguous(memory_format=torch.channels_last)
        return [torch.nn.Parameter(w), torch.nn.Parameter(torch.randn(8, generator=g).to(DEV))]

    runs = {}
    for impl in ("loop", "fused"):
        ps = conv_params()
        opt = cls(ps, **IMPLS[impl])
        for k in range(2):
            for p, g in zip(ps, grads_for(ps, k)):
                p.grad = g.contiguous(memory_format=torch.channels_last) if p.ndim == 4 else g
            opt.step()
        runs[impl] = ps
    assert runs["fused"][0].is_contiguous(memory_format=torch.channels_last)
    assert_same(runs["fused"], runs["loop"])
    ps = conv_params()
    ps[0].grad = torch.ones(8, 3, 5, 5, device=DEV)  # contiguous grad, channels_last param
    ps[1].grad = torch.ones(8, device=DEV)
    with pytest.raises(ValueError, match="layout"):
        cls(ps, fused=True).step()
    from gpuml.optim._common import dense_layout

    assert not dense_layout(ps[0], ps[0].grad)
    assert not dense_layout(torch.ones(4, 4).t())


# ---- fused path: alignment, table cache, CUDA-graph capture ----------------------------

def offset_views(dtype=torch.float32, seed=0):
    """Parameters that start one element into their storage (as views into a flat
    buffer can): no address is 16-byte aligned."""
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(1 + math.prod(s), generator=g).to(DEV, dtype)[1:]
                               .view(s)) for s in SHAPES]


@needs_triton
@pytest.mark.parametrize("cls,kw", [(LAMB, {"lr": 0.05}), (LARS, {"lr": 1.0}),
                                    (LARS, {"lr": 1.0, "mode": "normalized"})])
def test_fused_unaligned_tensors_take_the_path_without_alignment_claims(cls, kw):
    aligned = params()
    mixed = offset_views()[:2] + aligned[2:]  # two unaligned views, three aligned
    assert all(p.data_ptr() % _triton.ALIGN for p in mixed[:2])
    ref = [torch.nn.Parameter(p.detach().clone()) for p in mixed]
    train(cls, "loop", kw=kw, ps=ref)
    _triton._recent.clear()
    got, _ = train(cls, "fused", kw=kw, ps=mixed)
    assert_same(got, ref)
    kinds = {aligned for t in _triton._recent.values() for _, _, aligned in t.launches}
    assert kinds == {True, False}  # one launch per kind in each pass


@needs_triton
def test_fused_tables_are_cached_by_address():
    ps, opt = train(LAMB, "fused", steps=1)
    _triton._recent.clear()
    for p in ps:
        p.grad = p.grad.clone()  # new addresses: new tables
    opt.step()
    first = dict(_triton._recent)
    prepared = opt._views[0].prepared
    opt.step()  # same gradients: the group's view and its tables are reused
    assert len(first) == 1 and set(_triton._recent) == set(first)
    assert opt._views[0].prepared is prepared
    for p in ps:
        p.grad = p.grad.clone()
    opt.step()
    assert len(_triton._recent) == 2 and opt._views[0].prepared is not prepared


def _twins(cls, kw, impl):
    """The loop path (uncached) and ``impl`` on the same start, two steps each."""
    runs = [(ps, cls(ps, **IMPLS[path], **kw)) for path, ps in (("loop", params()),
                                                               (impl, params()))]
    for k in range(2):
        _step_both(runs, k)
    return runs


def _step_both(runs, k, change=None):
    """A step of each run; the first (the reference) gathers its groups afresh every step."""
    for i, (ps, opt) in enumerate(runs):
        for p, g in zip(ps, grads_for(ps, k)):
            # into the same gradient tensors: a cached view stays valid unless `change` acts
            p.grad = g if p.grad is None else p.grad.copy_(g)
        if change is not None:
            change(ps, opt)
        if i == 0:
            opt.__dict__.pop("_views", None)
        opt.step()


# What a group's cached view must notice between steps; each case is applied to both paths.
def _replace_state(ps, opt):
    state = opt.state[ps[2]]
    key = "exp_avg" if "exp_avg" in state else "momentum_buffer"
    state[key] = state[key] * 0.5


def _new_storage(ps, opt):
    ps[2].data = ps[2].data.clone() * 1.5  # same Parameter object, new storage


def _reset_state(ps, opt):
    opt.state[ps[0]] = {}  # starts again from step 1 with fresh state


def _swap_param(ps, opt):
    new = torch.nn.Parameter(ps[2].detach().clone())
    new.grad = ps[2].grad.clone()
    ps[2] = opt.param_groups[0]["params"][2] = new


_OLD_GRADS = []


def _new_grads(ps, opt):
    for p in ps:  # new gradient tensors; the old ones stay allocated, with other values
        old, p.grad = p.grad, p.grad.clone()
        _OLD_GRADS.append(old.fill_(7.0))


def _drop_grad(ps, opt):
    ps[1].grad = None


def _flip_exclusion(ps, opt):
    opt.param_groups[0]["exclude_from_adaptation"] = False


def _reload(ps, opt):
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))


def _added_group(ps, opt):
    extra = torch.nn.Parameter(torch.ones(4, 3, device=ps[0].device))
    extra.grad = torch.full_like(extra, 0.1)
    opt.add_param_group({"params": [extra]})


@pytest.mark.parametrize("change", [_replace_state, _new_storage, _swap_param, _new_grads,
                                    _reset_state, _drop_grad, _flip_exclusion, _reload,
                                    _added_group])
@pytest.mark.parametrize("impl", ["foreach", FUSED])
@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_cached_views_follow_changes_between_steps(cls, impl, change):
    kw = {"weight_decay": 1e-3} if cls is LARS else {}
    runs = _twins(cls, kw, impl)
    _step_both(runs, 2, change)
    _step_both(runs, 3)
    _OLD_GRADS.clear()
    (ref, ref_opt), (got, got_opt) = runs
    assert_same(got, ref)
    for a, b in zip(got, ref):
        for k, v in ref_opt.state[b].items():
            assert_same([got_opt.state[a][k]], [v])


@needs_triton
@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_tables_used_under_capture_are_held_while_the_state_lives(cls, monkeypatch):
    """A table used while a CUDA graph is captured must outlive the cache of recent
    tables (the graph reads it at every replay) and go with the optimizer's state. The
    capture is simulated: the cache's policy does not depend on the device."""
    import gc

    ps, opt = train(cls, "fused", steps=1)
    opt.step()  # the warm-up step: tables for these exact tensors
    monkeypatch.setattr(_triton, "_capturing", lambda device: True)
    opt.step()
    monkeypatch.setattr(_triton, "_capturing", lambda device: False)
    anchor = opt.state[ps[0]]["step"]
    held = dict(_triton._captured[id(anchor)])
    assert len(held) == 1 and set(held) <= set(_triton._recent)
    for k in range(_triton.RECENT_TABLES + 1):  # fill the cache of recent tables past full
        for p, g in zip(ps, grads_for(ps, k)):
            p.grad = g
        opt.step()
    assert not set(held) & set(_triton._recent)
    still = _triton._captured[id(anchor)]
    assert set(still) == set(held) and all(still[k] is v for k, v in held.items())
    key = id(anchor)
    del opt, anchor
    gc.collect()
    assert key not in _triton._captured


@needs_triton
def test_capture_with_unseen_tensors_is_a_clear_error(monkeypatch):
    ps, opt = train(LAMB, "fused", steps=1)
    monkeypatch.setattr(_triton, "_capturing", lambda device: True)
    for p, g in zip(ps, grads_for(ps, 5)):
        p.grad = g
    with pytest.raises(RuntimeError, match="eager step"):
        opt.step()


@needs_triton
def test_block_and_chunk_sizes_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        _triton._sizes(1000, 100)
    with pytest.raises(ValueError, match="multiple"):
        _triton._sizes(1000, 256)
