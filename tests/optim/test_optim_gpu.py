"""The fused optimizers on a real GPU (marker ``gpu``; skipped without CUDA).

Run with ``make gpu-check`` (``pytest -m gpu``) on a GPU machine: fused vs the loop
reference on CUDA with full-size chunks (16-byte-aligned tensors and views that are not), no
host synchronisation inside ``step()``, a step captured in a CUDA graph (also after the cache
of kernel tables was cleared), and launches on the parameters' device.
"""

import copy
import math

import pytest
import torch

from gpuml.optim import LAMB, LARS, FusedLAMB, FusedLARS

# gpuml.optim._triton is imported inside the tests: importing it here, at collection,
# would fix Triton's mode before test_optim_paths switches on the interpreter on CPU.

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# a tensor of 300k elements spans several 65,536-element chunks
SHAPES = [(300, 1000), (1000,), (64, 3, 7, 7), (64,), (30, 1), (1,)]


def make(dtype=torch.float32, seed=0, device="cuda", offset=0):
    """The SHAPES as parameters; ``offset`` > 0 starts each one that many elements into its
    storage (a view, as into a flat buffer), so that with an odd offset no address is
    16-byte aligned."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in SHAPES:
        x = torch.randn(offset + math.prod(s), generator=g).to(device, dtype)
        out.append(torch.nn.Parameter(x[offset:].view(s)))
    return out


def set_grads(ps, k):
    g = torch.Generator().manual_seed(10 + k)
    for p in ps:
        p.grad = (torch.randn(p.shape, generator=g) * (1 + k)).to(p.device, p.dtype)


def run(cls, ps, steps=4, **kw):
    opt = cls(ps, **kw)
    for k in range(steps):
        set_grads(ps, k)
        opt.step()
    return opt


@pytest.mark.parametrize("cls,kw", [
    (LAMB, {}), (LAMB, {"variant": "nnlamb", "eps_inside_sqrt": False}),
    (LAMB, {"max_grad_norm": None, "trust_bounds": (0.5, 2.0), "always_adapt": False}),
    (LARS, {"weight_decay": 1e-4}), (LARS, {"nesterov": True, "clip": True, "lr": 0.1}),
    (LARS, {"mode": "normalized", "weight_decay": 1e-3}),
])
def test_fused_matches_loop_on_cuda(cls, kw):
    ref, got = make(), make()
    run(cls, ref, foreach=False, **kw)
    opt = run(cls, got, **kw)
    assert opt.param_groups[0]["fused"] is None  # the default picked the fused path
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("cls,kw", [(LAMB, {}), (LARS, {"weight_decay": 1e-4}),
                                    (LARS, {"mode": "normalized", "weight_decay": 1e-3})])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_unaligned_views_on_cuda(cls, kw, dtype):
    """Views that start one element into their storage run in the launch without alignment
    claims (a row is aligned only if all its addresses are), and agree with the loop."""
    from gpuml.optim import _triton

    ref, got = make(dtype, offset=1), make(dtype, offset=1)
    assert all(p.data_ptr() % 16 for p in got)
    kw = dict(kw, master_weights=dtype != torch.float32)
    o1 = run(cls, ref, foreach=False, **kw)
    _triton._recent.clear()
    o2 = run(cls, got, fused=True, **kw)
    steps = [t for k, t in _triton._recent.items() if k[0] != "sumsq"]  # norm: aligned grads
    assert steps and {a for t in steps for _, _, a in t.launches} == {False}
    for a, b in zip(got, ref):
        if dtype == torch.float32:
            torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6)
        else:
            torch.testing.assert_close(o2.state[a]["master_param"],
                                       o1.state[b]["master_param"], rtol=2e-5, atol=2e-6)
            torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_master_weights_on_cuda(dtype):
    ref, got = make(dtype), make(dtype)
    o1 = run(LAMB, ref, foreach=False, master_weights=True)
    o2 = run(FusedLAMB, got, master_weights=True)
    for a, b in zip(got, ref):
        torch.testing.assert_close(o2.state[a]["master_param"], o1.state[b]["master_param"],
                                   rtol=2e-5, atol=2e-6)
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("cls,kw", [(FusedLAMB, {}), (FusedLARS, {}),
                                    (LAMB, {"foreach": True}), (LARS, {"foreach": True})])
def test_no_host_sync_in_step(cls, kw):
    """After the first steps (tables and masks cached) step() never synchronises. The foreach
    path reads found_inf on the host, so it is checked without a scaler."""
    ps = make()
    opt = run(cls, ps, steps=2, **kw)
    scaling = {} if kw else {"grad_scale": torch.tensor(4.0, device="cuda"),
                             "found_inf": torch.zeros((), device="cuda")}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            opt.step(**scaling)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("evict", [False, True])
@pytest.mark.parametrize("cls", [FusedLAMB, FusedLARS])
def test_cuda_graph_capture(cls, evict):
    """A captured step replays like eager steps; with ``evict``, eager steps on other
    tensors between capture and replay fill the cache of kernel tables past full, so
    that tables it dropped would have their memory handed to new tables (and a graph
    still reading them would update the other tensors instead)."""
    from gpuml.optim import _triton

    ps = make()
    set_grads(ps, 0)
    kw = {"lr": torch.tensor(1e-3 if cls is FusedLAMB else 1.0, device="cuda"),
          "capturable": True}
    opt = cls(ps, **kw)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    if evict:
        for k in range(2 * _triton.RECENT_TABLES):
            other = make(seed=100 + k)
            set_grads(other, k)
            cls(other, lr=1e-3).step()
        torch.cuda.synchronize()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    # capturing does not execute the step: 2 warm-up steps + 3 replays
    assert float(opt.state[ps[0]]["step"]) == 5.0
    ref = [torch.nn.Parameter(p.detach().clone()) for p in make()]
    for p, q in zip(ref, ps):
        p.grad = q.grad.clone()
    check = cls(ref, **copy.deepcopy(kw))
    for _ in range(5):
        check.step()
    for a, b in zip(ps, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_launches_run_under_the_parameters_device(monkeypatch):
    """Triton launches on the current device: every launch runs under the guard of its
    tensors' device (on one GPU this checks that the guard is taken; the case of another
    device is the two-GPU test below)."""
    from gpuml.optim import _triton

    guarded, launched_on = [], []
    guard = _triton._device_guard

    def spy_guard(device):
        guarded.append(device)
        return guard(device)

    def watch(kernel):
        class Watch:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    launched_on.append(torch.cuda.current_device())
                    return kernel[grid](*args, **kwargs)
                return launch
        return Watch()

    monkeypatch.setattr(_triton, "_device_guard", spy_guard)
    for name in ("_sumsq_kernel", "_lamb_pass1", "_lamb_pass2", "_lars_pass1", "_lars_pass2"):
        monkeypatch.setattr(_triton, name, watch(getattr(_triton, name)))
    with torch.cuda.device(0):
        run(FusedLAMB, make(device="cuda:0"), steps=2)
        run(FusedLARS, make(device="cuda:0"), steps=2)
    assert guarded and set(guarded) == {torch.device("cuda:0")}
    assert len(launched_on) == 2 * (3 + 2) and set(launched_on) == {0}


needs_two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason=f"needs two GPUs (parameters on cuda:1 while cuda:0 is current); this machine "
           f"has {torch.cuda.device_count()}")


@needs_two_gpus
@pytest.mark.parametrize("cls,kw", [(LAMB, {}), (LARS, {"weight_decay": 1e-4})])
def test_fused_on_a_device_that_is_not_current(cls, kw):
    ref, got = make(device="cuda:1"), make(device="cuda:1")
    with torch.cuda.device(0):
        run(cls, ref, foreach=False, **kw)
        run(cls, got, fused=True, **kw)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6)


@needs_two_gpus
def test_fused_lamb_groups_on_two_devices():
    """One param group per device; the global gradient norm spans both."""
    def groups(ps0, ps1):
        return [{"params": ps0}, {"params": ps1}]

    ref = (make(device="cuda:0"), make(device="cuda:1", seed=1))
    got = (make(device="cuda:0"), make(device="cuda:1", seed=1))
    o1, o2 = LAMB(groups(*ref), foreach=False), LAMB(groups(*got), fused=True)
    for k in range(3):
        for ps in (*ref, *got):
            set_grads(ps, k)
        o1.step()
        o2.step()
    for a, b in zip(got[0] + got[1], ref[0] + ref[1]):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6)
