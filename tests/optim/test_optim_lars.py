"""LARS (for-loop reference path) against eq. 5.1 / Alg 15 written out in NumPy.

Also: the option settings that reproduce timm Lars and apex LARC, written here
from their documented behaviour.
"""

import math

import numpy as np
import pytest
import torch

from gpuml.optim import LARS

SHAPES = [(6, 5), (5,), (3, 4, 2), (1, 7)]
ONE_D = [len(s) <= 1 for s in SHAPES]


def make(seed=0, shapes=SHAPES, steps=4):
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) * (0.5 + k) for s in shapes] for k in range(steps)]
    return ws, grads


def run_torch(ws, grads, param_groups=None, **kw):
    ps = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float32)) for w in ws]
    opt = LARS(ps if param_groups is None else param_groups(ps), foreach=False, **kw)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    return [p.detach().double().numpy() for p in ps]


def np_lars_classic(ws, grads, *, lr, momentum, wd, l, eps, adapt, decay, dampening=0.0,
                    nesterov=False, clip=False, bounds=(0.0, math.inf)):
    """The five steps of You 2020 §5.3 (denominator ||g|| + beta ||w||), with You et al. 2019 §3.5
    bounds on the local rate, LARC clipping, and torch-style momentum (buffer = d at step 1)."""
    ws = [w.copy() for w in ws]
    a = [None] * len(ws)
    for gs in grads:
        for i, g in enumerate(gs):
            beta = wd if decay[i] else 0.0
            alpha = 1.0
            if adapt[i]:
                wn, gn = np.linalg.norm(ws[i]), np.linalg.norm(g)
                alpha = l * wn / (gn + beta * wn + eps) if wn > 0 and gn > 0 else 1.0
                alpha = min(max(alpha, bounds[0]), bounds[1])
                if clip:
                    alpha = min(alpha / lr, 1.0)
            d = alpha * (g + beta * ws[i])
            if momentum:
                a[i] = d.copy() if a[i] is None else momentum * a[i] + (1 - dampening) * d
                d = d + momentum * a[i] if nesterov else a[i]
            ws[i] = ws[i] - lr * d
    return ws


def np_lars_alg15(ws, grads, *, lr, beta1, wd, l, eps, adapt, decay, bounds=(0.0, math.inf)):
    """You 2020 Algorithm 15: m = b1 m + (1 - b1)(g + lambda x); x -= eta phi / ||m|| m."""
    ws = [w.copy() for w in ws]
    m = [np.zeros_like(w) for w in ws]
    for gs in grads:
        for i, g in enumerate(gs):
            lam = wd if decay[i] else 0.0
            m[i] = beta1 * m[i] + (1 - beta1) * (g + lam * ws[i])
            ratio = 1.0
            if adapt[i]:
                wn, mn = np.linalg.norm(ws[i]), np.linalg.norm(m[i])
                ratio = l * wn / (mn + eps) if wn > 0 and mn > 0 else 1.0
                ratio = min(max(ratio, bounds[0]), bounds[1])
            ws[i] = ws[i] - lr * ratio * m[i]
    return ws


def assert_close(a, b, rtol=2e-5, atol=2e-6):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


@pytest.mark.parametrize("opts", [
    {},
    {"momentum": 0.0},
    {"dampening": 0.3},
    {"nesterov": True},
    {"weight_decay": 0.0},
    {"clip": True},
    {"clip": True, "lr": 1e-4},
    {"trust_bounds": (0.01, 0.02)},
    {"trust_coefficient": 0.02, "eps": 1e-3},
    {"exclude_from_adaptation": None},
])
def test_lars_classic_matches_numpy(opts):
    ws, grads = make()
    kw = dict(lr=2.0, momentum=0.9, weight_decay=5e-4, trust_coefficient=0.001, eps=1e-8)
    kw.update(opts)
    got = run_torch(ws, grads, **kw)
    # default: every tensor adapted, 1-D ones kept out of weight decay; None: 1-D not adapted
    adapt = [not (o and kw.get("exclude_from_adaptation", False) is None) for o in ONE_D]
    want = np_lars_classic(ws, grads, lr=kw["lr"], momentum=kw["momentum"],
                           wd=kw["weight_decay"], l=kw["trust_coefficient"], eps=kw["eps"],
                           adapt=adapt, decay=[not o for o in ONE_D],
                           dampening=kw.get("dampening", 0.0),
                           nesterov=kw.get("nesterov", False), clip=kw.get("clip", False),
                           bounds=kw.get("trust_bounds", (0.0, math.inf)))
    assert_close(got, want)


@pytest.mark.parametrize("opts", [{}, {"trust_bounds": (0.05, 0.5)}, {"weight_decay": 0.0}])
def test_lars_alg15_matches_numpy(opts):
    ws, grads = make(1)
    kw = dict(lr=0.1, momentum=0.9, weight_decay=1e-3, trust_coefficient=1.0, eps=1e-9)
    kw.update(opts)
    got = run_torch(ws, grads, mode="normalized", **kw)
    want = np_lars_alg15(ws, grads, lr=kw["lr"], beta1=kw["momentum"], wd=kw["weight_decay"],
                         l=kw["trust_coefficient"], eps=kw["eps"],
                         adapt=[True] * len(ONE_D), decay=[not o for o in ONE_D],
                         bounds=kw.get("trust_bounds", (0.0, math.inf)))
    assert_close(got, want)


def test_first_step_is_eq_5_1():
    """One step without momentum and weight decay: w -= gamma * l * ||w||/||g|| * g."""
    ws, grads = make(2, steps=1)
    got = run_torch(ws, grads, lr=3.0, momentum=0.0, eps=1e-12, exclude_from_adaptation=False)
    for w0, g, w1 in zip(ws, grads[0], got):
        eta = 0.001 * 3.0 * np.linalg.norm(w0) / np.linalg.norm(g)
        np.testing.assert_allclose(w1, w0 - eta * g, rtol=1e-5, atol=1e-7)


def np_timm_lars(ws, grads, lr, momentum=0.0, dampening=0.0, wd=0.0, nesterov=False,
                 trust_coeff=0.001, eps=1e-8, trust_clip=False, always_adapt=False):
    """timm.optim.Lars as documented: if wd != 0 or always_adapt, scale (g + wd w) by
    trust_coeff ||w|| / (||g|| + wd ||w|| + eps) (1 for zero norms; min(ratio / lr, 1) with
    trust_clip), then SGD momentum (buffer = grad at the first step), nesterov, p -= lr * d."""
    ws = [w.copy() for w in ws]
    bufs = [None] * len(ws)
    for gs in grads:
        for i, g in enumerate(gs):
            if wd != 0 or always_adapt:
                wn, gn = np.linalg.norm(ws[i]), np.linalg.norm(g)
                tr = trust_coeff * wn / (gn + wn * wd + eps) if wn > 0 and gn > 0 else 1.0
                if trust_clip:
                    tr = min(tr / lr, 1.0)
                g = (g + wd * ws[i]) * tr
            if momentum != 0:
                bufs[i] = g.copy() if bufs[i] is None else momentum * bufs[i] + (1 - dampening) * g
                g = g + momentum * bufs[i] if nesterov else bufs[i]
            ws[i] = ws[i] - lr * g
    return ws


TIMM = dict(exclude_from_adaptation=False, exclude_from_weight_decay=False)


@pytest.mark.parametrize("kw", [
    dict(momentum=0.0, weight_decay=0.0, always_adapt=False),
    dict(momentum=0.9, weight_decay=1e-4, always_adapt=False),
    dict(momentum=0.9, weight_decay=0.0, always_adapt=True, nesterov=True),
    dict(momentum=0.9, weight_decay=1e-4, always_adapt=False, clip=True),
])
def test_timm_lars_semantics(kw):
    ws, grads = make(3)
    got = run_torch(ws, grads, lr=1.0, trust_coefficient=0.001, eps=1e-8, **TIMM, **kw)
    want = np_timm_lars(ws, grads, 1.0, momentum=kw["momentum"], wd=kw["weight_decay"],
                        nesterov=kw.get("nesterov", False), trust_clip=kw.get("clip", False),
                        always_adapt=kw["always_adapt"])
    assert_close(got, want)


def np_apex_larc(ws, grads, lr, momentum, wd, trust_coefficient=0.02, eps=1e-8):
    """apex.parallel.LARC(SGD(lr, momentum, weight_decay=wd), clip=True) as documented: for
    nonzero norms, adaptive_lr = min(tc ||w|| / (||g|| + wd ||w|| + eps) / lr, 1), the
    gradient becomes (g + wd w) * adaptive_lr, and plain SGD (weight decay 0) steps."""
    ws = [w.copy() for w in ws]
    bufs = [None] * len(ws)
    for gs in grads:
        for i, g in enumerate(gs):
            wn, gn = np.linalg.norm(ws[i]), np.linalg.norm(g)
            alr = min(trust_coefficient * wn / (gn + wn * wd + eps) / lr, 1.0)
            g = (g + wd * ws[i]) * alr
            bufs[i] = g.copy() if bufs[i] is None else momentum * bufs[i] + g
            ws[i] = ws[i] - lr * bufs[i]
    return ws


def test_apex_larc_semantics():
    ws, grads = make(4)
    got = run_torch(ws, grads, lr=0.5, momentum=0.9, weight_decay=1e-4,
                    trust_coefficient=0.02, clip=True, always_adapt=True, **TIMM)
    assert_close(got, np_apex_larc(ws, grads, 0.5, 0.9, 1e-4))


def test_zero_norms_give_ratio_one():
    ws = [np.zeros((3, 3)), np.ones((2, 2))]
    grads = [[np.ones((3, 3)), np.zeros((2, 2))]]
    got = run_torch(ws, grads, lr=0.1, momentum=0.0, weight_decay=0.0)
    np.testing.assert_allclose(got[0], -0.1 * np.ones((3, 3)), rtol=1e-6)
    np.testing.assert_array_equal(got[1], np.ones((2, 2)))
    got = run_torch(ws, grads, lr=0.1, momentum=0.5, mode="normalized")
    assert all(np.isfinite(w).all() for w in got)
