"""Each schedule against its formula, written out here; and the docstring examples run."""

import doctest
import math

import pytest
import torch

import gpuml.optim
from gpuml.optim import (
    LAMB,
    GoyalWarmupStepDecay,
    LEGWPolynomialDecay,
    RollerCoasterDecay,
    WarmupPolynomialDecay,
    legw_warmup_steps,
    scale_lr,
)


def opt(lr=0.4):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def lrs(optimizer, sched, n):
    out = []
    for _ in range(n):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        sched.step()
    return out


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
def test_warmup_polynomial_decay(power):
    o = opt()
    W, T, end = 10, 50, 0.01
    got = lrs(o, WarmupPolynomialDecay(o, W, T, power=power, end_lr=end), 60)
    for t, lr in enumerate(got):
        if t < W:
            want = 0.4 * t / W
        elif t < T:
            want = end + (0.4 - end) * (1 - (t - W) / (T - W)) ** power
        else:
            want = end
        assert lr == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_scale_lr_rules():
    assert scale_lr(0.1, 4096, 256, "linear") == pytest.approx(1.6)
    assert scale_lr(0.1, 4096, 256, "sqrt") == pytest.approx(0.4)
    # You 2020 Table 6.5: 5 / (2^3 * 1e3) at 512 scales to 5 / (2^0 * 1e3) at 32K
    assert scale_lr(5 / (2 ** 3 * 1e3), 32768, 512, "sqrt") == pytest.approx(5e-3)
    with pytest.raises(ValueError):
        scale_lr(0.1, 1024, 256, "cubic")
    with pytest.raises(ValueError):
        scale_lr(0.1, 0, 256)


def test_legw_warmup_iterations_are_constant():
    # You 2020 Table 6.6: warmup epochs 0.3125 at 512 ... 20 at 32K: same number of steps
    n = 1_281_167
    steps = {B: legw_warmup_steps(0.3125, B, 512, n) for B in (512, 1024, 4096, 32768)}
    assert len(set(steps.values())) == 1
    assert steps[32768] == round(20 * n / 32768)


def test_legw_scheduler_with_sqrt_scaling():
    o = opt(0.1)
    s = LEGWPolynomialDecay(o, base_warmup_epochs=1, batch_size=2048, base_batch_size=256,
                            dataset_size=60_000, epochs=10, scaling="sqrt")
    assert s.base_lrs == [pytest.approx(0.1 * math.sqrt(8))]
    assert s.warmup_steps == round(8 * 60_000 / 2048)
    assert s.total_steps == 10 * math.ceil(60_000 / 2048)
    got = lrs(o, s, s.total_steps + 1)
    peak = 0.1 * math.sqrt(8)
    assert got[s.warmup_steps] == pytest.approx(peak)
    assert got[s.warmup_steps // 2] == pytest.approx(peak * (s.warmup_steps // 2) / s.warmup_steps)
    assert got[-1] == 0.0


@pytest.mark.parametrize("q", [1.0, 2.0])
def test_roller_coaster_formula(q):
    o = opt(2e-3)
    W, T = 20, 100
    got = lrs(o, RollerCoasterDecay(o, W, T, warmup_power=q), 110)
    E, w = 10.0, 2.0  # epochs and warmup epochs in the paper's notation: W = (w/E) T
    for t, lr in enumerate(got):
        if t < W:
            want = 2e-3 * (t / W) ** q
        else:
            want = max((T - t) / ((1 - w / E) * T) * 2e-3, 1e-6)
        assert lr == pytest.approx(want, rel=1e-12, abs=1e-18)
    assert got[-1] == 1e-6 and min(got[W:]) == 1e-6


def test_goyal_gradual_warmup_and_step_decay():
    k = 32
    o = opt(0.1 * k)
    s = GoyalWarmupStepDecay(o, warmup_steps=5, milestones=[30, 60, 80], start_factor=1 / k)
    got = lrs(o, s, 90)
    for t, lr in enumerate(got):
        if t < 5:
            want = 0.1 + (0.1 * k - 0.1) * t / 5
        else:
            want = 0.1 * k * 0.1 ** sum(t >= m for m in (30, 60, 80))
        assert lr == pytest.approx(want, rel=1e-12)


def test_schedules_drive_lamb_and_reject_bad_arguments():
    p = torch.nn.Parameter(torch.ones(3, 3))
    o = LAMB([p], lr=0.01)
    s = RollerCoasterDecay(o, 2, 10)
    p.grad = torch.ones(3, 3)
    o.step()
    s.step()
    assert o.param_groups[0]["lr"] == pytest.approx(0.005)
    with pytest.raises(ValueError):
        WarmupPolynomialDecay(opt(), 10, 5)
    with pytest.raises(ValueError):
        RollerCoasterDecay(opt(), 5, 5)
    with pytest.raises(ValueError):
        GoyalWarmupStepDecay(opt(), 5, [60, 30])


@pytest.mark.parametrize("module", ["gpuml.optim.lamb", "gpuml.optim.lars",
                                    "gpuml.optim.schedules", "gpuml.optim._optimizer"])
def test_docstring_examples_run(module):
    import importlib

    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
    assert gpuml.optim.__all__
