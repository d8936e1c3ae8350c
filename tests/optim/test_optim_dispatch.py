"""One dispatch point: the path of an update is chosen by ``_common.choose_path`` alone, and
the classes' ``step`` and the functional ``lamb()``/``lars()`` reach the implementations only
through the rule's functional step (``_lamb_step``/``_lars_step``), once per group and step.
"""

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available():  # the fused path in the Triton interpreter, as elsewhere
    os.environ.setdefault("TRITON_INTERPRET", "1")

from gpuml.optim import LAMB, LARS, FusedLAMB, FusedLARS, lamb, lars  # noqa: E402
from gpuml.optim._common import PATHS, choose_path  # noqa: E402
from gpuml.optim._layout import triton_available  # noqa: E402

# the modules, not the functions of the same name that gpuml.optim exports
MODULES = {"LAMB": importlib.import_module("gpuml.optim.lamb"),
           "LARS": importlib.import_module("gpuml.optim.lars")}
SHAPES = [(6, 5), (5,), (3, 4)]


def _params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]


def _set_grads(ps, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


@pytest.fixture
def calls(monkeypatch):
    """Every implementation of both rules wrapped to record ``(rule, path, prepared)``."""
    seen = []
    for rule, module in MODULES.items():
        for path, impl in list(module._IMPLS.items()):
            def spy(*args, _rule=rule, _path=path, _impl=impl, **kwargs):
                seen.append((_rule, _path, kwargs["prepared"]))
                return _impl(*args, **kwargs)

            monkeypatch.setitem(module._IMPLS, path, spy)
    return seen


def test_every_rule_has_an_implementation_for_every_path():
    for module in MODULES.values():
        assert set(module._IMPLS) == set(PATHS)


def test_choose_path_on_cpu_tensors(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = [torch.zeros(2, 3), torch.zeros(3)]
    assert choose_path(cpu, None, None) == "loop"
    assert choose_path(cpu, False, None) == "loop"
    assert choose_path(cpu, True, None) == "foreach"
    assert choose_path(cpu, None, True) == "numba"
    assert choose_path(cpu, None, None, differentiable=True) == "loop"
    assert choose_path([], None, True) == "loop"  # nothing to update
    assert choose_path([torch.zeros(2, dtype=torch.complex64)], None, None) == "loop"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose_path(cpu, None, True) == "triton"
    assert choose_path(cpu, None, None) == "loop"  # the interpreter only on request


def test_choose_path_refusals():
    cpu = [torch.zeros(2)]
    with pytest.raises(ValueError, match="mutually exclusive"):
        choose_path(cpu, True, True)
    with pytest.raises(RuntimeError, match="`fused` does not support `differentiable`"):
        choose_path(cpu, None, True, differentiable=True)
    for dtype in (torch.float64, torch.complex64):
        with pytest.raises(TypeError, match=f"does not take {dtype} parameters"):
            choose_path([torch.zeros(2, dtype=dtype)], None, True)
    with pytest.raises(RuntimeError, match=r"CUDA or CPU tensors, got parameters on \['meta'\]"):
        choose_path([torch.zeros(2, device="meta")], None, True)


@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_the_class_steps_each_group_through_the_functional_step(cls, calls, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ps = _params()
    opt = cls([{"params": ps[:1], "foreach": False}, {"params": ps[1:2], "foreach": True},
               {"params": ps[2:], "fused": True}], lr=0.01)
    for step in range(2):
        _set_grads(ps, step)
        opt.step()
    rule = cls.__name__
    assert calls == [(rule, "loop", None), (rule, "foreach", None), (rule, "numba", None)] * 2
    assert [view.path for view in opt._views] == ["loop", "foreach", "numba"]


@pytest.mark.parametrize("cls", [FusedLAMB, FusedLARS])
def test_fused_classes_go_through_the_same_dispatch(cls, calls, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ps = _params()
    _set_grads(ps, 0)
    cls(ps, lr=0.01).step()
    assert calls == [(cls.__name__.removeprefix("Fused"), "numba", None)]


def _functional(rule, ps, **pick):
    n = len(ps)
    grads = [p.grad for p in ps]
    steps = [torch.zeros(()) for _ in ps]
    flags = dict(adapt=[True] * n, decay=[True] * n)
    with torch.no_grad():
        if rule == "LAMB":
            lamb(ps, grads, [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps],
                 [None] * n, steps, **flags, **pick, lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6,
                 weight_decay=0.01, bias_correction=True, grad_averaging=True,
                 max_grad_norm=1.0, trust_bounds=(0.0, float("inf")), eps_inside_sqrt=True,
                 variant="lamb")
        else:
            lars(ps, grads, [torch.zeros_like(p) for p in ps], [None] * n, steps, **flags,
                 **pick, lr=0.5, momentum=0.9, dampening=0.0, nesterov=False,
                 weight_decay=1e-4, trust_coefficient=1e-3, eps=1e-8, clip=False,
                 trust_bounds=(0.0, float("inf")), mode="classic")


@pytest.mark.parametrize("rule", ["LAMB", "LARS"])
def test_the_functional_api_dispatches_on_the_same_choice(rule, calls, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for pick, path in ((dict(foreach=False), "loop"), (dict(foreach=True), "foreach"),
                       (dict(fused=True), "numba"), ({}, "loop")):
        ps = _params()
        _set_grads(ps, 0)
        _functional(rule, ps, **pick)
        assert calls.pop() == (rule, path, None)
    assert not calls


@pytest.mark.parametrize("rule", ["LAMB", "LARS"])
def test_the_functional_api_refuses_what_the_class_refuses(rule):
    """The functional API chooses on the parameters as given, as the class does: complex
    parameters are not taken by the fused path (``TypeError``), whatever their real views."""
    ps = [p.detach() for p in _params(torch.complex64)]
    for p in ps:
        p.grad = torch.ones_like(p)
    with pytest.raises(TypeError, match="does not take torch.complex64 parameters"):
        _functional(rule, ps, fused=True)
    cls = LAMB if rule == "LAMB" else LARS
    qs = _params(torch.complex64)
    _set_grads(qs, 0)
    with pytest.raises(TypeError, match="does not take torch.complex64 parameters"):
        cls(qs, fused=True).step()


@pytest.mark.skipif(not triton_available() or torch.cuda.is_available(),
                    reason="the Triton path on CPU tensors needs triton's interpreter "
                    "(tests/optim/test_optim_gpu.py covers it on a GPU)")
@pytest.mark.parametrize("cls", [LAMB, LARS])
def test_the_triton_path_launches_from_the_views_tables(cls, calls, monkeypatch):
    """The class hands its view's launch tables to the Triton implementation at every step
    (built once while the gradients keep their addresses); the functional call builds them
    for itself."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ps = _params()
    opt = cls(ps, lr=0.01, fused=True)
    _set_grads(ps, 0)
    grads = [p.grad for p in ps]
    for step in range(3):
        for g, p in zip(grads, _params(seed=10 + step)):
            g.copy_(p.detach())
        opt.step()
    prepared = opt._views[0].prepared
    assert prepared is not None
    assert [(rule, path) for rule, path, _ in calls] == [(cls.__name__, "triton")] * 3
    assert all(tables is prepared for _, _, tables in calls)
    calls.clear()
    qs = _params(seed=1)
    _set_grads(qs, 0)
    _functional(cls.__name__, qs, fused=True)
    (rule, path, tables), = calls
    assert (rule, path) == (cls.__name__, "triton") and tables is not None
