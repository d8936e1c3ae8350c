"""The fused optimizers on a real GPU (marker ``gpu``; skipped without CUDA).

Run with ``make gpu-check`` (``pytest -m gpu``) on the lent machine: fused vs the loop
reference on CUDA with full-size chunks, no host synchronisation inside ``step()``, and a
step captured in a CUDA graph.
"""

import copy

import pytest
import torch

from gpuml.optim import LAMB, LARS, FusedLAMB, FusedLARS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# a tensor of 300k elements spans several 65,536-element chunks
SHAPES = [(300, 1000), (1000,), (64, 3, 7, 7), (64,), (30, 1), (1,)]


def make(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to("cuda", dtype)) for s in SHAPES]


def set_grads(ps, k):
    g = torch.Generator().manual_seed(10 + k)
    for p in ps:
        p.grad = (torch.randn(p.shape, generator=g) * (1 + k)).to("cuda", p.dtype)


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


@pytest.mark.parametrize("cls", [FusedLAMB, FusedLARS])
def test_cuda_graph_capture(cls):
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
