"""LAMB (for-loop reference path) against the update rules written out in NumPy.

Also: which option settings reproduce apex FusedLAMB and timm Lamb, each written
here from their documented behaviour.
"""

import math

import numpy as np
import pytest
import torch

from gpuml.optim import LAMB, param_groups_by_name

SHAPES = [(6, 5), (5,), (3, 4, 2), (1, 7)]


def make(seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) * (0.5 + k) for s in shapes] for k in range(4)]
    return ws, grads


def run_torch(ws, grads, param_groups=None, **kw):
    ps = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float32)) for w in ws]
    groups = ps if param_groups is None else param_groups(ps)
    opt = LAMB(groups, foreach=False, **kw)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    return [p.detach().double().numpy() for p in ps]


def np_lamb(ws, grads, *, lr, beta1, beta2, eps, wd, adapt, decay, bias_correction=True,
            grad_averaging=True, max_grad_norm=None, bounds=(0.0, math.inf), eps_inside=True,
            variant="lamb"):
    """You 2020 Alg 16 (and Alg 17/18 for the variants), line by line, in float64."""
    ws = [w.copy() for w in ws]
    m = [np.zeros_like(w) for w in ws]
    v = [np.zeros_like(w) for w in ws]
    b3 = 1 - beta1 if grad_averaging else 1.0
    for t, gs in enumerate(grads, start=1):
        if max_grad_norm is not None:
            total = math.sqrt(sum(float((g * g).sum()) for g in gs))
            gs = [g / max(1.0, total / max_grad_norm) for g in gs]
        for i, g in enumerate(gs):
            m[i] = beta1 * m[i] + b3 * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            if variant == "lamb":
                mh = m[i] / (1 - beta1 ** t) if bias_correction else m[i]
                vh = v[i] / (1 - beta2 ** t) if bias_correction else v[i]
            else:
                mh = beta1 * m[i] / (1 - beta1 ** (t + 1)) + b3 * g / (1 - beta1 ** t)
                vh = beta2 * v[i] / (1 - beta2 ** (t + 1))
                if variant == "nnlamb":
                    vh = vh + (1 - beta2) * g * g / (1 - beta2 ** t)
            r = mh / np.sqrt(vh + eps) if eps_inside else mh / (np.sqrt(vh) + eps)
            u = r + (wd * ws[i] if decay[i] else 0.0)
            ratio = 1.0
            if adapt[i]:
                wn, un = np.linalg.norm(ws[i]), np.linalg.norm(u)
                if wn > 0 and un > 0:
                    ratio = min(max(wn, bounds[0]), bounds[1]) / un
            ws[i] = ws[i] - lr * ratio * u
    return ws


def assert_close(a, b, rtol=2e-5, atol=2e-6):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


ONE_D = [len(s) <= 1 for s in SHAPES]


@pytest.mark.parametrize("opts", [
    {},
    {"bias_correction": False},
    {"grad_averaging": False},
    {"max_grad_norm": 0.5},
    {"max_grad_norm": None},
    {"eps_inside_sqrt": False, "eps": 1e-3},
    {"trust_bounds": (4.0, 5.0)},
    {"trust_bounds": (0.0, 1.5)},
    {"variant": "nlamb"},
    {"variant": "nnlamb"},
    {"weight_decay": 0.0},
    {"weight_decay": 0.1, "betas": (0.0, 0.0)},
    {"lr": 0.0},
    {"exclude_from_adaptation": None, "exclude_from_weight_decay": None},
    {"exclude_from_adaptation": None, "max_grad_norm": None},
])
def test_lamb_matches_numpy(opts):
    ws, grads = make()
    kw = dict(lr=0.05, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=1.0)
    kw.update(opts)
    got = run_torch(ws, grads, **kw)
    # default exclusion: none (Alg 16); None excludes the 1-D tensors (the BERT recipe)
    one_d = {o: [s and kw.get(o, False) is None for s in ONE_D]
             for o in ("exclude_from_adaptation", "exclude_from_weight_decay")}
    want = np_lamb(ws, grads, lr=kw["lr"], beta1=kw["betas"][0], beta2=kw["betas"][1],
                   eps=kw["eps"], wd=kw["weight_decay"],
                   adapt=[not o for o in one_d["exclude_from_adaptation"]],
                   decay=[not o for o in one_d["exclude_from_weight_decay"]],
                   bias_correction=kw.get("bias_correction", True),
                   grad_averaging=kw.get("grad_averaging", True),
                   max_grad_norm=kw["max_grad_norm"], bounds=kw.get("trust_bounds", (0, math.inf)),
                   eps_inside=kw.get("eps_inside_sqrt", True), variant=kw.get("variant", "lamb"))
    assert_close(got, want)


@pytest.mark.parametrize("always_adapt", [True, False])
def test_exclusion_flags_and_always_adapt(always_adapt):
    ws, grads = make(1)

    def groups(ps):
        return [{"params": ps[:2], "exclude_from_adaptation": False,
                 "exclude_from_weight_decay": True},
                {"params": ps[2:], "exclude_from_adaptation": True,
                 "exclude_from_weight_decay": False}]

    got = run_torch(ws, grads, param_groups=groups, lr=0.02, weight_decay=0.05,
                    always_adapt=always_adapt, max_grad_norm=None)
    want = np_lamb(ws, grads, lr=0.02, beta1=0.9, beta2=0.999, eps=1e-6, wd=0.05,
                   adapt=[always_adapt, always_adapt, False, False],
                   decay=[False, False, True, True])
    assert_close(got, want)


def np_apex_fused_lamb(ws, grads, lr, wd=0.01, eps=1e-6, betas=(0.9, 0.999),
                       max_grad_norm=1.0, use_nvlamb=False):
    """apex.optimizers.FusedLAMB as documented: adam_w_mode, grad_averaging, bias correction,
    global grad-norm clipping, eps outside the sqrt, trust ratio only where weight decay != 0
    unless use_nvlamb, ratio 1 for zero norms; no per-shape exclusions."""
    b1, b2 = betas
    ws = [w.copy() for w in ws]
    m = [np.zeros_like(w) for w in ws]
    v = [np.zeros_like(w) for w in ws]
    for t, gs in enumerate(grads, 1):
        gnorm = math.sqrt(sum(float((g ** 2).sum()) for g in gs))
        clip = gnorm / max_grad_norm if gnorm > max_grad_norm else 1.0
        for i, g in enumerate(gs):
            g = g / clip
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g ** 2
            update = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * ws[i]
            trust = 1.0
            if wd != 0 or use_nvlamb:
                pn, un = np.linalg.norm(ws[i]), np.linalg.norm(update)
                trust = pn / un if pn > 0 and un > 0 else 1.0
            ws[i] = ws[i] - lr * trust * update
    return ws


APEX_SETTINGS = dict(eps=1e-6, weight_decay=0.01, max_grad_norm=1.0, eps_inside_sqrt=False,
                     always_adapt=False, exclude_from_adaptation=False,
                     exclude_from_weight_decay=False)


@pytest.mark.parametrize("wd", [0.01, 0.0])
@pytest.mark.parametrize("nvlamb", [False, True])
def test_apex_fused_lamb_semantics(wd, nvlamb):
    ws, grads = make(2)
    settings = dict(APEX_SETTINGS, weight_decay=wd, always_adapt=nvlamb)
    got = run_torch(ws, grads, lr=0.01, **settings)
    assert_close(got, np_apex_fused_lamb(ws, grads, 0.01, wd=wd, use_nvlamb=nvlamb))


def np_timm_lamb(ws, grads, lr, wd=0.01, eps=1e-6, betas=(0.9, 0.999), max_grad_norm=1.0,
                 always_adapt=False):
    """timm.optim.Lamb as documented (trust_clip=False): clip by global norm, Adam direction
    with eps added to the bias-corrected sqrt, decoupled decay added, trust ratio
    ||w||/||update|| if weight decay != 0 or always_adapt."""
    b1, b2 = betas
    ws = [w.copy() for w in ws]
    m = [np.zeros_like(w) for w in ws]
    v = [np.zeros_like(w) for w in ws]
    for t, gs in enumerate(grads, 1):
        n = math.sqrt(sum(float((g ** 2).sum()) for g in gs))
        gs = [g / max(n / max_grad_norm, 1.0) for g in gs]
        for i, g in enumerate(gs):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            denom = np.sqrt(v[i]) / math.sqrt(1 - b2 ** t) + eps
            upd = (m[i] / (1 - b1 ** t)) / denom
            if wd != 0:
                upd = upd + wd * ws[i]
            if wd != 0 or always_adapt:
                wn, un = np.linalg.norm(ws[i]), np.linalg.norm(upd)
                upd = upd * (wn / un if wn > 0 and un > 0 else 1.0)
            ws[i] = ws[i] - lr * upd
    return ws


@pytest.mark.parametrize("always_adapt", [False, True])
def test_timm_lamb_semantics(always_adapt):
    ws, grads = make(3)
    got = run_torch(ws, grads, lr=0.01, **dict(APEX_SETTINGS, always_adapt=always_adapt))
    assert_close(got, np_timm_lamb(ws, grads, 0.01, always_adapt=always_adapt))


def test_zero_norm_weights_and_updates_give_ratio_one():
    ws = [np.zeros((3, 3)), np.ones((2, 2))]
    grads = [[np.ones((3, 3)), np.zeros((2, 2))]]
    got = run_torch(ws, grads, lr=0.1, weight_decay=0.0, max_grad_norm=None)
    assert all(np.isfinite(w).all() for w in got)
    want = np_lamb(ws, grads, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-6, wd=0.0,
                   adapt=[True, True], decay=[True, True])
    assert_close(got, want)
    # zero weights: ratio 1, so the step is lr * Adam direction (~ lr * 1 per element)
    np.testing.assert_allclose(got[0], -0.1 * np.ones((3, 3)) / np.sqrt(1 + 1e-6), rtol=1e-5)
    np.testing.assert_array_equal(got[1], np.ones((2, 2)))


def test_param_groups_by_name():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3),
                                torch.nn.Linear(3, 2, bias=False))
    model.register_parameter("scale_norm", torch.nn.Parameter(torch.ones(2, 2)))
    groups = param_groups_by_name(model, weight_decay=0.1, lr=0.5)
    assert [len(g["params"]) for g in groups] == [2, 4]
    assert groups[0]["weight_decay"] == 0.1 and groups[0]["lr"] == 0.5
    assert groups[1]["exclude_from_adaptation"] and groups[1]["exclude_from_weight_decay"]
    assert any(p is model.scale_norm for p in groups[1]["params"])
    only_names = param_groups_by_name(model, exclude=("norm",), exclude_1d=False)
    assert [len(g["params"]) for g in only_names] == [5, 1]  # Sequential names: "1.weight"
    opt = LAMB(groups)
    assert opt.param_groups[1]["exclude_from_adaptation"] is True
