"""``fused=True`` on CPU tensors: the numba kernels (gpuml/optim/_numba.py) against the loop.

The other test modules run ``fused=True`` on CPU tensors in Triton's interpreter (to test the
GPU kernels); here ``TRITON_INTERPRET`` is off, so CPU tensors take the CPU kernels. Tensors
span several chunks and both the one-thread and the parallel kernels.
"""

import copy

import pytest
import torch

from gpuml.optim import LAMB, LARS, FusedLAMB, FusedLARS, _numba

# (130, 300): three chunks of _numba.CHUNK (16,384), the last one partial
SHAPES = [(7, 5), (5,), (130, 300), (3, 1, 4), (1,), (5000,)]
LAMB_OPTS = [
    {},
    {"max_grad_norm": None, "eps_inside_sqrt": False, "trust_bounds": (0.5, 2.0)},
    {"variant": "nlamb", "weight_decay": 0.1},
    {"variant": "nnlamb", "grad_averaging": False, "always_adapt": False},
    {"bias_correction": False, "exclude_from_adaptation": False,
     "exclude_from_weight_decay": False, "maximize": True},
]
LARS_OPTS = [
    {},
    {"momentum": 0.0, "weight_decay": 1e-3, "clip": True, "lr": 0.01},
    {"nesterov": True, "weight_decay": 1e-4, "trust_bounds": (1e-4, 1e-3)},
    {"dampening": 0.5, "always_adapt": False, "weight_decay": 1e-4, "maximize": True},
    {"mode": "normalized", "weight_decay": 1e-3, "exclude_from_adaptation": False},
]


@pytest.fixture(autouse=True)
def cpu_kernels(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    # the parallel kernels from 2,000 elements on: both kinds run in every test
    monkeypatch.setattr(_numba, "PARALLEL_MIN", 2000)


def params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]


def set_grads(ps, step, scale=1.0):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = (torch.randn(p.shape, generator=g) * (1 + step) * scale).to(p.dtype)


def train(cls, kw, steps=3, dtype=torch.float32, ps=None):
    ps = params(dtype) if ps is None else ps
    opt = cls(ps, **kw)
    for k in range(steps):
        set_grads(ps, k)
        opt.step()
    return ps, opt


def assert_same(a, b, rtol=1e-5, atol=1e-6):
    for x, y in zip(a, b):
        torch.testing.assert_close(x.detach().float(), y.detach().float(), rtol=rtol, atol=atol)


def test_a_tensor_spans_several_chunks():
    assert 2 * _numba.CHUNK < 130 * 300 < 3 * _numba.CHUNK


@pytest.mark.parametrize("kw", LAMB_OPTS)
def test_lamb_fused_cpu_equals_loop(kw):
    ref, _ = train(LAMB, dict(lr=0.05, foreach=False, **kw))
    got, opt = train(LAMB, dict(lr=0.05, fused=True, **kw))
    assert opt._views[0].path == "numba" and opt._views[0].prepared is None
    assert_same(got, ref)


@pytest.mark.parametrize("kw", LARS_OPTS)
def test_lars_fused_cpu_equals_loop(kw):
    kw = dict({"lr": 1.0}, **kw)
    ref, _ = train(LARS, dict(foreach=False, **kw))
    got, _ = train(LARS, dict(fused=True, **kw))
    assert_same(got, ref)


@pytest.mark.parametrize("cls", [FusedLAMB, FusedLARS])
def test_fused_classes_run_on_cpu(cls):
    base = LAMB if cls is FusedLAMB else LARS
    ref, _ = train(base, dict(lr=0.01, foreach=False))
    got, _ = train(cls, dict(lr=0.01))
    assert_same(got, ref)


@pytest.mark.parametrize("name", ["lamb", "lars"])
def test_functional_fused_on_cpu_equals_loop(name):
    from gpuml.optim import lamb, lars

    out = {}
    for impl in ("loop", "fused"):
        ps = params()
        set_grads(ps, 0)
        n = len(ps)
        state = [torch.zeros_like(p) for p in ps]
        steps = [torch.zeros(()) for _ in ps]
        flags = dict(adapt=[p.ndim > 1 for p in ps], decay=[p.ndim > 1 for p in ps])
        pick = dict(foreach=False) if impl == "loop" else dict(fused=True)
        with torch.no_grad():
            if name == "lamb":
                lamb(ps, [p.grad for p in ps], state, [torch.zeros_like(p) for p in ps],
                     [None] * n, steps, **flags, **pick, lr=0.01, beta1=0.9, beta2=0.999,
                     eps=1e-6, weight_decay=0.01, bias_correction=True, grad_averaging=True,
                     max_grad_norm=1.0, trust_bounds=(0.0, float("inf")),
                     eps_inside_sqrt=True, variant="lamb")
            else:
                lars(ps, [p.grad for p in ps], state, [None] * n, steps, **flags, **pick,
                     lr=0.5, momentum=0.9, dampening=0.0, nesterov=False, weight_decay=1e-4,
                     trust_coefficient=1e-3, eps=1e-8, clip=False,
                     trust_bounds=(0.0, float("inf")), mode="classic")
        out[impl] = ps
    assert_same(out["fused"], out["loop"])


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_grad_scale_and_found_inf(cls):
    """The GradScaler protocol: gradients unscaled on the fly; a found inf skips the step
    and changes no state."""
    ref, _ = train(cls, dict(lr=0.01, foreach=False))
    ps = params()
    opt = cls(ps, lr=0.01, fused=True)
    scale = torch.tensor(1024.0)
    for k in range(3):
        set_grads(ps, k, scale=1024.0)
        opt.step(grad_scale=scale, found_inf=torch.tensor(0.0))
    assert_same(ps, ref, rtol=1e-5, atol=1e-5)
    before = [p.detach().clone() for p in ps]
    state = copy.deepcopy(opt.state_dict()["state"])
    set_grads(ps, 9)
    opt.step(grad_scale=scale, found_inf=torch.tensor(1.0))
    assert_same(ps, before, rtol=0, atol=0)
    after = opt.state_dict()["state"]
    for i in state:
        for key, value in state[i].items():
            torch.testing.assert_close(after[i][key], value, rtol=0, atol=0)


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_torch_grad_scaler_end_to_end(cls):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    ref_model = copy.deepcopy(model)
    x = torch.randn(16, 6)
    opt = cls(model.parameters(), lr=0.01, fused=True)
    ref = cls(ref_model.parameters(), lr=0.01, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    for _ in range(3):
        opt.zero_grad()
        ref.zero_grad()
        scaler.scale(model(x).square().mean()).backward()
        scaler.step(opt)
        scaler.update()
        ref_model(x).square().mean().backward()
        ref.step()
    assert_same(list(model.parameters()), list(ref_model.parameters()), atol=1e-5)


@pytest.mark.parametrize("cls", [LAMB, LARS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_master_weights_and_low_precision(cls, dtype):
    kw = dict(lr=0.01, master_weights=True)
    ref, ref_opt = train(cls, dict(foreach=False, **kw), dtype=dtype)
    got, opt = train(cls, dict(fused=True, **kw), dtype=dtype)
    masters = [opt.state[p]["master_param"] for p in got]
    for p, m, r in zip(got, masters, (ref_opt.state[p]["master_param"] for p in ref)):
        torch.testing.assert_close(m, r, rtol=1e-5, atol=1e-6)
        assert torch.equal(p, m.to(dtype))  # the parameter is its master rounded
    ref, _ = train(cls, dict(lr=0.01, foreach=False), dtype=dtype)
    got, _ = train(cls, dict(lr=0.01, fused=True), dtype=dtype)
    assert_same(got, ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_state_dict_round_trip_and_switching_paths(cls):
    """A state saved by the fused CPU path resumes on the loop path and vice versa."""
    ref, _ = train(cls, dict(lr=0.01, foreach=False), steps=4)
    ps, opt = train(cls, dict(lr=0.01, fused=True), steps=2)
    saved = copy.deepcopy(opt.state_dict())
    resumed = cls(ps, lr=0.01, foreach=False)
    resumed.load_state_dict(saved)
    resumed.param_groups[0]["foreach"] = False
    resumed.param_groups[0]["fused"] = None
    for k in (2, 3):
        set_grads(ps, k)
        resumed.step()
    assert_same(ps, ref)


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_tensor_lr_and_capturable(cls):
    ref, _ = train(cls, dict(lr=0.01, foreach=False))
    got, _ = train(cls, dict(lr=torch.tensor(0.01), capturable=True, fused=True))
    assert_same(got, ref)


def test_nan_gradient_makes_nan_as_the_loop_does():
    out = {}
    for impl in (dict(foreach=False), dict(fused=True)):
        ps = params()
        opt = LAMB(ps, lr=0.01, max_grad_norm=None, **impl)
        set_grads(ps, 0)
        ps[2].grad[3, 4] = float("nan")
        opt.step()
        out[str(impl)] = [p.detach().isnan() for p in ps]
    for a, b in zip(*out.values()):
        assert torch.equal(a, b)
    assert out["{'fused': True}"][2].any() and not out["{'fused': True}"][0].any()


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_channels_last_and_layout_mismatch(cls):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(8, 3, 5, 5, generator=g).contiguous(memory_format=torch.channels_last)
    ref_p, got_p = (torch.nn.Parameter(w.clone(memory_format=torch.channels_last))
                    for _ in range(2))
    ref, got = cls([ref_p], lr=0.05, foreach=False), cls([got_p], lr=0.05, fused=True)
    for _ in range(2):
        grad = torch.randn(w.shape, generator=g).contiguous(memory_format=torch.channels_last)
        ref_p.grad, got_p.grad = grad.clone(), grad.clone()
        ref.step()
        got.step()
    assert got_p.is_contiguous(memory_format=torch.channels_last)
    assert_same([got_p], [ref_p])
    got_p.grad = torch.randn(w.shape, generator=g)  # contiguous, unlike the parameter
    with pytest.raises(ValueError, match="dense layout"):
        got.step()


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_float64_and_complex_refused_by_name(cls):
    p = torch.nn.Parameter(torch.ones(3, 3, dtype=torch.float64))
    p.grad = torch.ones(3, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64"):
        cls([p], fused=True).step()


def test_kernels_use_torch_thread_count():
    import numba

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        _numba.use_torch_threads()
        assert numba.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
