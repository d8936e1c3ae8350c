"""The defaults of LAMB and LARS: what they reproduce, written out here.

* ``LAMB()`` with every default is Algorithm 16 of Yang You, *Fast and Accurate Machine
  Learning on Distributed Systems and Supercomputers*, PhD thesis, UC Berkeley, 2020,
  with that thesis' stated hyperparameters (§6.4 and §6.6: beta1 = 0.9, beta2 = 0.999,
  epsilon = 1e-6, weight decay 0.01) and phi(z) = z, in float64 to 1e-12.
* The documented settings reproduce timm's ``Lamb`` and ``Lars`` (run when timm is
  installed; skipped otherwise).
* ``LARS()`` adapts tensors with ``ndim <= 1`` (biases, norm weights) like every other
  layer and keeps them out of weight decay, so none of them steps at the raw global rate.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from gpuml.optim import LAMB, LARS

SHAPES = [(6, 5), (5,), (3, 4, 2), (1, 7), ()]


def _problem(seed=0, steps=5, scale=3.0):
    """Weights and gradients of a few layers; the gradients' global norm is well above 1, so
    any gradient clipping at 1.0 would change the result."""
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal(s) for s in SHAPES]
    grads = [[scale * (1 + k) * rng.standard_normal(s) for s in SHAPES] for k in range(steps)]
    return ws, grads


def _run(opt_class, ws, grads, dtype=torch.float64, **kw):
    ps = [torch.nn.Parameter(torch.tensor(w, dtype=dtype)) for w in ws]
    opt = opt_class(ps, **kw)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g, dtype=dtype)
        opt.step()
    return [p.detach().double().numpy() for p in ps]


def algorithm_16(x, grads, lr, beta1=0.9, beta2=0.999, eps=1e-6, lam=0.01, phi=lambda z: z):
    """You 2020, Algorithm 16 (LAMB), line by line, every layer i treated alike.

    The thesis writes the bias correction as ``m_t = m_t / (1 - beta1^t)``, reusing the
    name; the corrected moments feed only this step's ratio (as in Adam), never the next
    step's moments. Its experiments set beta1 = 0.9, beta2 = 0.999 (§6.4) and weight decay
    0.01, epsilon = 1e-6 (§6.6); phi(z) = z is its instructive case of
    phi(z) = min(max(z, gamma_l), gamma_u) with the bounds left open."""
    x = [xi.copy() for xi in x]
    m = [np.zeros_like(xi) for xi in x]
    v = [np.zeros_like(xi) for xi in x]
    for t, g in enumerate(grads, start=1):
        for i in range(len(x)):
            m[i] = beta1 * m[i] + (1 - beta1) * g[i]
            v[i] = beta2 * v[i] + (1 - beta2) * g[i] ** 2
            m_hat = m[i] / (1 - beta1 ** t)
            v_hat = v[i] / (1 - beta2 ** t)
            r = m_hat / np.sqrt(v_hat + eps)
            u = r + lam * x[i]
            x[i] = x[i] - lr * phi(np.linalg.norm(x[i])) / np.linalg.norm(u) * u
    return x


@pytest.mark.parametrize("foreach", [False, True])
def test_lamb_defaults_are_algorithm_16(foreach):
    ws, grads = _problem()
    got = _run(LAMB, ws, grads, lr=0.02, foreach=foreach)
    want = algorithm_16(ws, grads, lr=0.02)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    # and the default learning rate (the thesis tunes only the learning rate)
    got = _run(LAMB, ws, grads, foreach=foreach)
    for a, b in zip(got, algorithm_16(ws, grads, lr=1e-3)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_lamb_default_values():
    """Every default, as docs/optim.md's table lists it."""
    group = LAMB([torch.nn.Parameter(torch.zeros(2))]).param_groups[0]
    assert group["lr"] == 1e-3 and tuple(group["betas"]) == (0.9, 0.999)
    assert group["eps"] == 1e-6 and group["eps_inside_sqrt"] is True
    assert group["weight_decay"] == 0.01 and group["max_grad_norm"] is None
    assert group["bias_correction"] and group["grad_averaging"] and group["always_adapt"]
    assert tuple(group["trust_bounds"]) == (0.0, math.inf)
    assert group["variant"] == "lamb"
    assert group["exclude_from_adaptation"] is False
    assert group["exclude_from_weight_decay"] is False


# ---- timm ------------------------------------------------------------------------------------

def _timm_optim():
    """timm's ``optim`` package's Lamb and Lars modules, or skip.

    ``import timm`` imports its model layers, which need torchvision; the optimizers do not
    (``timm/optim/lamb.py`` and ``lars.py`` import torch and two helper modules of their own).
    When the package import fails for that reason, the two modules are loaded from timm's
    installed files under a private package name, leaving ``sys.modules["timm"]`` alone."""
    try:
        from timm.optim import lamb, lars
        return lamb, lars
    except ImportError:
        pass
    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("timm is not installed")
    folder = Path(spec.submodule_search_locations[0]) / "optim"
    name = "_gpuml_test_timm_optim"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    try:
        return (importlib.import_module(f"{name}.lamb"), importlib.import_module(f"{name}.lars"))
    except ImportError as err:  # a timm whose optimizers need more than torch
        pytest.skip(f"timm's optimizers do not import here: {err}")


#: The settings docs/optim.md gives for timm ``Lamb()`` (trust_clip=False, its defaults).
TIMM_LAMB = dict(eps=1e-6, weight_decay=0.01, max_grad_norm=1.0, eps_inside_sqrt=False,
                 always_adapt=False, exclude_from_adaptation=False,
                 exclude_from_weight_decay=False)


@pytest.mark.parametrize("kw", [{}, {"always_adapt": True}, {"weight_decay": 0.0},
                                {"weight_decay": 0.0, "always_adapt": True}])
def test_timm_lamb_mapping_numerically(kw):
    timm_lamb, _ = _timm_optim()
    ws, grads = _problem(1)
    theirs = _run(timm_lamb.Lamb, ws, grads, lr=0.02, **kw)
    ours = _run(LAMB, ws, grads, lr=0.02, **dict(TIMM_LAMB, **kw))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    # the defaults are Algorithm 16, not timm: eps inside the square root, no clipping, every
    # tensor adapted -- a different trajectory (tens of percent apart after 5 steps here)
    default = _run(LAMB, ws, grads, lr=0.02, **{k: v for k, v in kw.items()
                                                if k == "weight_decay"})
    assert max(np.abs(a - b).max() for a, b in zip(default, theirs)) > 1e-3


@pytest.mark.parametrize("kw", [{}, {"momentum": 0.9, "weight_decay": 5e-4},
                                {"momentum": 0.9, "nesterov": True, "always_adapt": True},
                                {"weight_decay": 1e-3, "trust_clip": True}])
def test_timm_lars_mapping_numerically(kw):
    _, timm_lars = _timm_optim()
    ws, grads = _problem(2)
    theirs = _run(timm_lars.Lars, ws, grads, lr=0.5, **kw)
    ours_kw = {"momentum": 0.0, "always_adapt": False, "exclude_from_adaptation": False,
               "exclude_from_weight_decay": False}
    for k, v in kw.items():
        ours_kw["clip" if k == "trust_clip" else k] = v
    ours = _run(LARS, ws, grads, lr=0.5, **ours_kw)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


# ---- LARS and tensors with ndim <= 1 ---------------------------------------------------------

def test_lars_default_adapts_1d_tensors_without_weight_decay():
    """Two steps of LARS() (lr 1.0, momentum 0.9, trust coefficient 1e-3) with weight decay
    5e-4 on a matrix, a bias and a scalar, against eq. 5.1 and the five-step sequence of You
    2020 §5.3 written out: every tensor gets its local rate alpha = l ||w|| / (||g|| +
    beta ||w|| + eps); the 1-D tensors with beta = 0."""
    rng = np.random.default_rng(3)
    ws = [rng.standard_normal((4, 3)), rng.standard_normal(3), np.array(0.7)]
    grads = [[rng.standard_normal(w.shape) for w in ws] for _ in range(2)]
    lr, mu, l, eps, wd = 1.0, 0.9, 1e-3, 1e-8, 5e-4
    got = _run(LARS, ws, grads, weight_decay=wd)

    want = [w.copy() for w in ws]
    a = [None] * 3
    for gs in grads:
        for i, g in enumerate(gs):
            beta = wd if want[i].ndim > 1 else 0.0
            wn, gn = np.linalg.norm(want[i]), np.linalg.norm(g)
            alpha = l * wn / (gn + beta * wn + eps)
            d = alpha * (g + beta * want[i])
            a[i] = d if a[i] is None else mu * a[i] + d
            want[i] = want[i] - lr * a[i]
    for x, y in zip(got, want):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-15)
    # the bias moved by about l ||w|| per step, not by lr ||g|| as an excluded tensor would
    step = np.linalg.norm(got[1] - ws[1])
    assert step < 3 * l * np.linalg.norm(ws[1]) < 0.01 * np.linalg.norm(grads[0][1])


def test_lars_default_values_and_the_old_rule():
    group = LARS([torch.nn.Parameter(torch.zeros(2))]).param_groups[0]
    assert group["exclude_from_adaptation"] is False
    assert group["exclude_from_weight_decay"] is None  # ndim <= 1: no weight decay
    # the former default is one argument away, and then a bias steps at the raw rate
    ws, grads = [np.ones(3)], [[np.full(3, 0.5)]]
    got = _run(LARS, ws, grads, exclude_from_adaptation=None)
    np.testing.assert_allclose(got[0], np.ones(3) - 1.0 * 0.5)
