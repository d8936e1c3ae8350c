"""torch.optim's conventions, LAMB and LARS side by side with torch.optim.AdamW.

Each test does the same thing to AdamW and to gpuml's optimizers and expects the same kind of
outcome: what a user swapping ``AdamW`` for ``LAMB`` relies on.
"""

import ast
from pathlib import Path

import pytest
import torch

from gpuml.optim import LAMB, LARS

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
    """``_triton`` (the fused kernels) takes its helpers from ``_layout``; only ``_common``
    reaches ``_triton``, and only inside the functions of the fused path."""
    triton_imports = _imports(OPTIM / "_triton.py")
    assert not any("_common" in m for m in triton_imports), triton_imports
    assert not any("_triton" in m for m in _imports(OPTIM / "_common.py"))
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
