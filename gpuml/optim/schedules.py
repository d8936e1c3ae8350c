r"""Large-batch learning-rate schedules for any ``torch.optim`` optimizer.

Every scheduler is a :class:`torch.optim.lr_scheduler.LRScheduler` with a
closed form in the step count :math:`t` (``scheduler.last_epoch``, the number of
``scheduler.step()`` calls; call it once per optimizer step). :math:`\eta_0` is
the group's initial ``lr``.

==============================  ===================================================
:class:`WarmupPolynomialDecay`  linear warmup, then :math:`(1-\text{progress})^p`
:class:`LEGWPolynomialDecay`    the same with LEGW's warmup length (You 2020 ch. 6,
                                You et al. 2019 §3.1)
:class:`RollerCoasterDecay`     DATE's linear decay with floor :math:`10^{-6}`
                                (You et al. 2019 §3.4)
:class:`GoyalWarmupStepDecay`   gradual warmup from :math:`\eta/k`, then step decay
                                (Goyal et al. 2017)
:func:`scale_lr`                sqrt (You et al. 2019 §3.3) or linear LR scaling
==============================  ===================================================

References
----------
.. [1] Y. You, "Fast and Accurate Machine Learning on Distributed Systems and
   Supercomputers", PhD thesis, UC Berkeley, 2020 (You 2020), ch. 6 "Linear Epoch
   Gradual Warmup" and Tables 6.5-6.6 (sqrt scaling + LEGW).
.. [2] Y. You et al., "Large-Batch Training for LSTM and Beyond", SC 2019,
   §3.1 LEGW, §3.3 Sqrt scaling, §3.4 roller-coaster decay, Algorithm 1.
.. [3] P. Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1
   Hour", 2017: linear scaling rule and gradual warmup.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from torch.optim.lr_scheduler import LRScheduler

__all__ = ["scale_lr", "legw_warmup_steps", "WarmupPolynomialDecay", "LEGWPolynomialDecay",
           "RollerCoasterDecay", "GoyalWarmupStepDecay"]


def scale_lr(lr0: float, batch_size: int, base_batch_size: int, rule: str = "sqrt") -> float:
    r"""Scale a learning rate tuned at ``base_batch_size`` to ``batch_size``.

    ``rule="sqrt"``: :math:`\eta = \eta_0\sqrt{B/B_0}` (keeps the gradient
    estimator's variance constant; You et al. 2019 §3.3, used with LAMB + LEGW in
    You 2020, Tables 6.5-6.6). ``rule="linear"``: :math:`\eta = \eta_0 B/B_0` (Krizhevsky;
    Goyal et al.).

    Examples
    --------
    >>> from gpuml.optim import scale_lr
    >>> scale_lr(0.1, 1024, 256, "sqrt"), scale_lr(0.1, 1024, 256, "linear")
    (0.2, 0.4)
    """
    if batch_size <= 0 or base_batch_size <= 0:
        raise ValueError(f"batch sizes must be positive, got {batch_size}, {base_batch_size}")
    if lr0 < 0:
        raise ValueError(f"lr0 must be >= 0, got {lr0}")
    k = batch_size / base_batch_size
    if rule == "sqrt":
        return lr0 * math.sqrt(k)
    if rule == "linear":
        return lr0 * k
    raise ValueError(f"rule must be 'sqrt' or 'linear', got {rule!r}")


def legw_warmup_steps(base_warmup_epochs: float, batch_size: int, base_batch_size: int,
                      dataset_size: int) -> int:
    r"""LEGW warmup length in steps: :math:`w = w_0 B/B_0` epochs of :math:`N/B` steps.

    The number of warmup *iterations*, :math:`w_0 N / B_0`, does not depend on
    ``batch_size`` (You et al. 2019 Algorithm 1 line 1; You 2020 Table 6.6).

    Examples
    --------
    >>> from gpuml.optim import legw_warmup_steps
    >>> n = 1_281_167  # ImageNet; You 2020 Table 6.6: 0.3125 epochs at 512, 5 at 8K
    >>> legw_warmup_steps(0.3125, 512, 512, n), legw_warmup_steps(0.3125, 8192, 512, n)
    (782, 782)
    """
    if base_warmup_epochs < 0 or batch_size <= 0 or base_batch_size <= 0 or dataset_size <= 0:
        raise ValueError("need base_warmup_epochs >= 0 and positive sizes")
    warmup_epochs = base_warmup_epochs * batch_size / base_batch_size
    return int(round(warmup_epochs * dataset_size / batch_size))


class _ClosedForm(LRScheduler):
    def lr_at(self, base_lr: float, t: int) -> float:
        raise NotImplementedError

    def get_lr(self):
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]


def _check_steps(warmup_steps: int, total_steps: int) -> None:
    if warmup_steps < 0 or total_steps <= 0 or warmup_steps > total_steps:
        raise ValueError(f"need 0 <= warmup_steps <= total_steps and total_steps > 0, got "
                         f"warmup_steps={warmup_steps}, total_steps={total_steps}")


class WarmupPolynomialDecay(_ClosedForm):
    r"""Linear warmup to :math:`\eta_0`, then polynomial decay to ``end_lr``.

    .. math::

        \eta_t = \begin{cases}
            \eta_0\, t / W & t < W\\
            \eta_e + (\eta_0 - \eta_e)\,\bigl(1 - \frac{t - W}{T - W}\bigr)^{p} & W \le t < T\\
            \eta_e & t \ge T
        \end{cases}

    ``power=1`` is the thesis' :math:`\eta_t = \eta_0(1 - t/T)` after warmup
    (You 2020, §6.4); ``power=2`` the "poly" policy of its Tables 5.4 and 5.7.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
    warmup_steps : int
        :math:`W` (0: no warmup).
    total_steps : int
        :math:`T`.
    power : float, default 1.0
    end_lr : float, default 0.0
    last_epoch : int, default -1

    Examples
    --------
    >>> import torch
    >>> from gpuml.optim import LAMB, WarmupPolynomialDecay
    >>> opt = LAMB([torch.nn.Parameter(torch.ones(2, 2))], lr=0.1)
    >>> sched = WarmupPolynomialDecay(opt, warmup_steps=2, total_steps=4)
    >>> lrs = []
    >>> for _ in range(5):
    ...     lrs.append(round(opt.param_groups[0]["lr"], 4))
    ...     opt.step()
    ...     sched.step()
    >>> lrs
    [0.0, 0.05, 0.1, 0.05, 0.0]
    """

    def __init__(self, optimizer, warmup_steps: int, total_steps: int, power: float = 1.0,
                 end_lr: float = 0.0, last_epoch: int = -1):
        _check_steps(warmup_steps, total_steps)
        if power <= 0 or end_lr < 0:
            raise ValueError(f"need power > 0 and end_lr >= 0, got {power}, {end_lr}")
        self.warmup_steps, self.total_steps = int(warmup_steps), int(total_steps)
        self.power, self.end_lr = float(power), float(end_lr)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, t: int) -> float:
        W, T = self.warmup_steps, self.total_steps
        if t < W:
            return base_lr * t / W
        if t >= T:
            return self.end_lr
        frac = 1.0 - (t - W) / (T - W)
        return self.end_lr + (base_lr - self.end_lr) * frac ** self.power


class LEGWPolynomialDecay(WarmupPolynomialDecay):
    r"""LEGW: warmup epochs grow linearly with the batch size, then polynomial decay.

    With a baseline tuned at batch :math:`B_0` with :math:`w_0` warmup epochs,
    batch :math:`B` warms up for :math:`w_0 B/B_0` epochs, i.e. a fixed number of
    :math:`w_0 N/B_0` steps (:func:`legw_warmup_steps`), and the run lasts
    ``epochs`` epochs of :math:`\lceil N/B \rceil` steps. With ``scaling`` the
    peak learning rate is :func:`scale_lr` of the optimizer's ``lr`` (You 2020
    Tables 6.5-6.6 use LEGW with ``"sqrt"``).

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
    base_warmup_epochs : float
        :math:`w_0`, tuned at ``base_batch_size``.
    batch_size, base_batch_size : int
        :math:`B`, :math:`B_0`.
    dataset_size : int
        :math:`N`, examples per epoch.
    epochs : float
        Length of the run.
    power, end_lr : float
        As in :class:`WarmupPolynomialDecay`.
    scaling : {None, "sqrt", "linear"}, default None
        Scale the optimizer's ``lr`` (taken as :math:`\eta_0` at :math:`B_0`).

    Examples
    --------
    >>> import torch
    >>> from gpuml.optim import LEGWPolynomialDecay
    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    >>> s = LEGWPolynomialDecay(opt, base_warmup_epochs=1, batch_size=1024,
    ...                         base_batch_size=256, dataset_size=60_000, epochs=10,
    ...                         scaling="sqrt")
    >>> s.warmup_steps, s.total_steps, s.base_lrs
    (234, 590, [0.2])
    """

    def __init__(self, optimizer, base_warmup_epochs: float, batch_size: int,
                 base_batch_size: int, dataset_size: int, epochs: float, power: float = 1.0,
                 end_lr: float = 0.0, scaling: str | None = None, last_epoch: int = -1):
        warmup = legw_warmup_steps(base_warmup_epochs, batch_size, base_batch_size,
                                   dataset_size)
        total = int(math.ceil(epochs * math.ceil(dataset_size / batch_size)))
        if scaling is not None and last_epoch == -1:
            for group in optimizer.param_groups:
                group["lr"] = scale_lr(float(group["lr"]), batch_size, base_batch_size, scaling)
        super().__init__(optimizer, min(warmup, total), total, power=power, end_lr=end_lr,
                         last_epoch=last_epoch)


class RollerCoasterDecay(_ClosedForm):
    r"""DATE's schedule (You et al. 2019 §3.4, Algorithm 1): warmup, then linear decay with a floor.

    .. math::

        \eta_t = \begin{cases}
            \eta_0\,(t/W)^{q} & t < W\\
            \max\Bigl\{\frac{T - t}{(1 - w/E)\,T}\,\eta_0,\ \hat\eta\Bigr\}
                = \max\Bigl\{\frac{T - t}{T - W}\,\eta_0,\ \hat\eta\Bigr\} & t \ge W
        \end{cases}

    with :math:`W = (w/E)T` warmup steps, :math:`\hat\eta = 10^{-6}` the paper's
    untuned floor and :math:`q \in \{1, 2\}` (Algorithm 1 line 6 offers both).
    :math:`\eta_0` is the scaled peak, e.g. ``scale_lr(lr0, B, B0, "sqrt")``.

    Examples
    --------
    >>> import torch
    >>> from gpuml.optim import RollerCoasterDecay
    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    >>> s = RollerCoasterDecay(opt, warmup_steps=10, total_steps=100)
    >>> s.lr_at(0.1, 10), s.lr_at(0.1, 55), s.lr_at(0.1, 100)
    (0.1, 0.05, 1e-06)
    """

    def __init__(self, optimizer, warmup_steps: int, total_steps: int, floor: float = 1e-6,
                 warmup_power: float = 1.0, last_epoch: int = -1):
        _check_steps(warmup_steps, total_steps)
        if warmup_steps == total_steps:
            raise ValueError("RollerCoasterDecay needs warmup_steps < total_steps")
        if floor < 0 or warmup_power <= 0:
            raise ValueError(f"need floor >= 0 and warmup_power > 0, got {floor}, "
                             f"{warmup_power}")
        self.warmup_steps, self.total_steps = int(warmup_steps), int(total_steps)
        self.floor, self.warmup_power = float(floor), float(warmup_power)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, t: int) -> float:
        W, T = self.warmup_steps, self.total_steps
        if t < W:
            return base_lr * (t / W) ** self.warmup_power
        return max((T - t) / (T - W) * base_lr, self.floor)


class GoyalWarmupStepDecay(_ClosedForm):
    r"""Gradual warmup from :math:`\eta_0/k` to :math:`\eta_0`, then step decay (Goyal et al.).

    With the linear scaling rule the target is :math:`\eta_0 = k\eta` for a
    :math:`k`-times larger batch; warmup starts at the small-batch rate
    :math:`\eta` (``start_factor = 1/k``) and rises linearly over ``warmup_steps``
    (5 epochs in the paper); afterwards the rate is multiplied by ``gamma`` at
    each milestone (epochs 30, 60, 80 for ResNet-50):

    .. math::

        \eta_t = \begin{cases}
            \eta_0\,\bigl(s + (1 - s)\,t/W\bigr) & t < W\\
            \eta_0\,\gamma^{\#\{m_i \le t\}} & t \ge W
        \end{cases}

    Examples
    --------
    >>> import torch
    >>> from gpuml.optim import GoyalWarmupStepDecay, scale_lr
    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=scale_lr(0.1, 8192, 256,
    ...                                                                          "linear"))
    >>> s = GoyalWarmupStepDecay(opt, warmup_steps=5, milestones=[30, 60, 80],
    ...                          start_factor=256 / 8192)
    >>> [round(s.lr_at(3.2, t), 4) for t in (0, 5, 30, 60, 80)]
    [0.1, 3.2, 0.32, 0.032, 0.0032]
    """

    def __init__(self, optimizer, warmup_steps: int, milestones: Sequence[int],
                 gamma: float = 0.1, start_factor: float = 0.0, last_epoch: int = -1):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if list(milestones) != sorted(milestones):
            raise ValueError(f"milestones must be increasing, got {milestones}")
        if not 0 <= start_factor <= 1 or gamma <= 0:
            raise ValueError(f"need 0 <= start_factor <= 1 and gamma > 0, got {start_factor}, "
                             f"{gamma}")
        self.warmup_steps = int(warmup_steps)
        self.milestones = [int(m) for m in milestones]
        self.gamma, self.start_factor = float(gamma), float(start_factor)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, t: int) -> float:
        if t < self.warmup_steps:
            s = self.start_factor
            return base_lr * (s + (1.0 - s) * t / self.warmup_steps)
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, t)
