"""LAMB and LARS equal timm's Lamb and Lars under the mappings their docstrings' Notes give.

Skipped when timm is not installed (``pip install --no-deps timm``; the benchmark's loader
takes its two optimizer modules without torchvision, see ``bench/bench_optim_cpu.py``).
"""

import pytest
import torch

from gpuml.optim import LAMB, LARS

try:
    from bench.bench_optim_cpu import timm_optimizers

    TimmLamb, TimmLars = timm_optimizers()
except ImportError as e:
    pytest.skip(f"timm not usable: {e}", allow_module_level=True)

SHAPES = [(16, 8, 3, 3), (16,), (40, 30), (30,), (5, 7)]
#: timm Lamb (trust_clip=False) = LAMB with these options (LAMB's Notes)
LAMB_AS_TIMM = dict(eps_inside_sqrt=False, exclude_from_adaptation=False,
                    exclude_from_weight_decay=False, max_grad_norm=1.0)
#: timm Lars(trust_clip, always_adapt) = LARS(mode="classic", clip=trust_clip, ...) (Notes)
LARS_AS_TIMM = dict(mode="classic", exclude_from_adaptation=False,
                    exclude_from_weight_decay=False)


def _params():
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def _run(make, steps=6):
    ps = _params()
    opt = make(ps)
    for k in range(steps):
        g = torch.Generator().manual_seed(10 + k)
        for p in ps:
            # large enough that global clipping at 1.0 acts on some steps and not others
            p.grad = torch.randn(p.shape, generator=g) * (0.02 if k % 2 else 0.5)
        opt.step()
    return ps


# (timm's arguments, ours on top of the mapping); timm's defaults first
LAMB_CASES = [
    (dict(lr=1e-2), dict(always_adapt=False)),
    (dict(lr=1e-2, weight_decay=0.0, always_adapt=True), dict(weight_decay=0.0)),
    (dict(lr=5e-3, weight_decay=0.1, grad_averaging=False, max_grad_norm=None),
     dict(weight_decay=0.1, grad_averaging=False, max_grad_norm=None, always_adapt=False)),
    (dict(lr=1e-2, bias_correction=False, betas=(0.8, 0.99)),
     dict(bias_correction=False, betas=(0.8, 0.99), always_adapt=False)),
]


@pytest.mark.parametrize("impl", [dict(foreach=False), dict(foreach=True), {}])
@pytest.mark.parametrize("timm_kw, ours_kw", LAMB_CASES)
def test_lamb_equals_timm_lamb(timm_kw, ours_kw, impl):
    ref = _run(lambda ps: TimmLamb(ps, **timm_kw))
    got = _run(lambda ps: LAMB(ps, lr=timm_kw["lr"], **{**LAMB_AS_TIMM, **ours_kw}, **impl))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-6)


LARS_CASES = [
    dict(lr=0.5, momentum=0.9, weight_decay=1e-4),
    dict(lr=0.5, momentum=0.9, weight_decay=1e-4, nesterov=True),
    dict(lr=0.5, momentum=0.9, dampening=0.5, weight_decay=1e-3, trust_clip=True),
    dict(lr=2.0, momentum=0.0, weight_decay=0.0, always_adapt=True),
    dict(lr=0.5, momentum=0.9, weight_decay=0.0),  # no adaptation at all (timm's default rule)
]


@pytest.mark.parametrize("impl", [dict(foreach=False), dict(foreach=True), {}])
@pytest.mark.parametrize("kw", LARS_CASES)
def test_lars_equals_timm_lars(kw, impl):
    ref = _run(lambda ps: TimmLars(ps, **kw))
    ours = dict(kw, clip=kw.get("trust_clip", False), always_adapt=kw.get("always_adapt", False))
    ours.pop("trust_clip", None)
    got = _run(lambda ps: LARS(ps, **LARS_AS_TIMM, **ours, **impl))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-6)
