"""Households and neighbourhoods: hierarchical local SGD by periodic model averaging.

André Håland and Bjørnar Birkeland, *Exploring data assignment schemes when training deep
neural networks using data parallelism*, MSc thesis, NTNU, 2020, §4.2: the M workers are
grouped into H households, the households into NB neighbourhoods; every worker trains its
own replica, and the replicas are averaged within each household every L_H steps, within each
neighbourhood every L_N steps and across the world every L_W steps (typically
L_H < L_N < L_W; the hierarchical local SGD of Lin et al., *Don't Use Large Mini-Batches, Use
Local SGD*, 2020). The data goes to households as S_H household shards (§4.2.1): household h
holds household shard h mod S_H, split disjointly among its workers, so H / S_H households
hold equal data and, with S_H = H / NB, every neighbourhood holds the whole data set.

Built on ``torch.distributed.algorithms.model_averaging``: the averaging itself is torch's
``average_parameters_or_parameter_groups`` (one flat all-reduce per average), the class is a
``ModelAverager`` and so plugs into ``torch.distributed.optim.PostLocalSGDOptimizer``, and
the groups come from ``torch.distributed.new_subgroups``. What ``HierarchicalModelAverager``
does not give, and this adds: the step count of the paper (averaging right after steps L,
2L, …, where torch's averagers also average after the first step), the process-group
``timeout`` on the subgroups (torch's make theirs with the 30-minute default, so a dead peer
would hold its household for half an hour), a clear error naming the level, step and ranks
when a peer fails, the layout and its checks, and the household shards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sized
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager
from torch.distributed.algorithms.model_averaging.utils import (
    average_parameters_or_parameter_groups,
)

from gpuml.errors import PeerFailureError
from gpuml.training.sampler import DataAssignmentSampler


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class HouseholdLayout:
    """Which ranks form which household and neighbourhood (consecutive blocks of ranks).

    Household h holds ranks ``h*m, …, h*m + m − 1`` with ``m = world_size // households``;
    neighbourhood n holds households ``n*k, …, n*k + k − 1`` with
    ``k = households // neighbourhoods``, hence consecutive ranks too — the blocks
    ``torch.distributed.new_subgroups`` makes, and usually the machines of a cluster (ranks
    on one machine are consecutive under ``torchrun``), so that the frequent household
    averages stay inside a machine.

    Parameters
    ----------
    world_size : int
        M, the number of workers.
    households : int
        H, must divide ``world_size``.
    neighbourhoods : int, optional
        NB, must divide ``households``. ``None``: no neighbourhood level.
    household_shards : int, optional
        S_H, the number of distinct household shards, must divide ``households``; default
        ``households`` (disjoint household shards).
    """

    world_size: int
    households: int
    neighbourhoods: int | None = None
    household_shards: int | None = None

    def __post_init__(self):
        m = _positive_int("world_size", self.world_size)
        h = _positive_int("households", self.households)
        if m % h:
            raise ValueError(f"households={h} does not divide the world of {m} workers: every "
                             "household must have the same number of workers")
        if self.neighbourhoods is not None:
            nb = _positive_int("neighbourhoods", self.neighbourhoods)
            if h % nb:
                raise ValueError(f"neighbourhoods={nb} does not divide households={h}: every "
                                 "neighbourhood must have the same number of households")
        if self.household_shards is None:
            object.__setattr__(self, "household_shards", h)
        s = _positive_int("household_shards", self.household_shards)
        if h % s:
            raise ValueError(f"household_shards={s} does not divide households={h}: household "
                             f"h holds household shard h mod S_H, and each must go to the same "
                             "number of households")

    @property
    def household_size(self) -> int:
        return self.world_size // self.households

    @property
    def neighbourhood_size(self) -> int:
        """Workers per neighbourhood (the world when there is no neighbourhood level)."""
        nb = self.neighbourhoods or 1
        return self.world_size // nb

    def household_of(self, rank: int) -> int:
        return rank // self.household_size

    def neighbourhood_of(self, rank: int) -> int:
        return rank // self.neighbourhood_size

    def household_ranks(self, household: int) -> list[int]:
        m = self.household_size
        return list(range(household * m, (household + 1) * m))

    def neighbourhood_ranks(self, neighbourhood: int) -> list[int]:
        m = self.neighbourhood_size
        return list(range(neighbourhood * m, (neighbourhood + 1) * m))

    @property
    def copies(self) -> int:
        """Workers holding each sample: H / S_H (households holding the same household shard)."""
        return self.households // self.household_shards

    def sampler(self, dataset: Sized, rank: int, **kwargs) -> DataAssignmentSampler:
        """The sampler that gives ``rank`` its worker shard of its household's household shard.

        Household h holds household shard ``h mod S_H`` (Håland & Birkeland 2020,
        Figures 4.7 and 4.8), split disjointly among its ``household_size`` workers. With
        households as consecutive blocks of ranks this is the coarse scheme with
        ``copies = H / S_H``: rank ``h*m + l`` holds worker shard ``(h mod S_H)*m + l``
        of ``S_H * m``. ``kwargs`` (``shuffle``, ``seed``, ``drop_last``) go to
        :class:`DataAssignmentSampler`; workers holding equal data shuffle with seeds of
        their own, as the thesis gives such households different seeds (footnote to §4.2.1).
        """
        return DataAssignmentSampler(dataset, num_replicas=self.world_size, rank=rank,
                                     scheme="coarse", copies=self.copies, **kwargs)


def _as_timedelta(timeout) -> timedelta | None:
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds or a timedelta, "
                         f"got {timeout!r}")
    return timedelta(seconds=timeout)


class HouseholdAverager(ModelAverager):
    """Average the replicas within households every L_H steps, neighbourhoods every L_N steps
    and the world every L_W steps (Håland & Birkeland 2020, §4.2).

    Call :meth:`average_parameters` once after every ``optimizer.step()``, or hand the
    averager to ``torch.distributed.optim.PostLocalSGDOptimizer``, which does. After step t
    (counted from 1) the widest level whose period divides t averages: the world when
    ``t % world_period == 0``, else the neighbourhood when ``t % neighbourhood_period == 0``,
    else the household when ``t % household_period == 0``; the wider average contains the
    narrower one, so only one all-reduce runs per step. The periods need not divide each
    other.

    Every rank of the default process group must construct it, with the same arguments, in
    the same order relative to other process groups (it creates the subgroups).

    Parameters
    ----------
    households : int
        H, must divide the world size.
    household_period : int
        L_H, steps between household averages (1: after every step).
    world_period : int
        L_W, steps between world averages; larger than the other periods.
    neighbourhoods : int, optional
        NB, must divide ``households``; give it with ``neighbourhood_period``.
    neighbourhood_period : int, optional
        L_N, with ``household_period < neighbourhood_period < world_period``.
    household_shards : int, optional
        S_H for :meth:`sampler`; default ``households`` (disjoint household shards).
    timeout : float or timedelta, optional
        Timeout of the household and neighbourhood process groups (seconds): how long an
        average waits for a dead or hung peer before it fails with
        :class:`PeerFailureError`. Give the same as to ``init_process_group``, whose group
        does the world averages. ``None``: torch's default (30 minutes for gloo).

    Attributes
    ----------
    layout : HouseholdLayout
    rank, household, neighbourhood : int
        This process's rank and the indices of its household and neighbourhood.
    household_group, neighbourhood_group : ProcessGroup or None
        This rank's subgroups (``None`` for a level that is absent).
    step : int
        Steps done (``PostLocalSGDOptimizer`` saves it in its ``state_dict``).

    References
    ----------
    André Håland, Bjørnar Birkeland, *Exploring data assignment schemes when training deep
    neural networks using data parallelism*, MSc thesis, NTNU, 2020, §4.2.
    """

    def __init__(self, households: int, household_period: int, world_period: int, *,
                 neighbourhoods: int | None = None, neighbourhood_period: int | None = None,
                 household_shards: int | None = None, timeout=None):
        _positive_int("household_period", household_period)
        _positive_int("world_period", world_period)
        if (neighbourhoods is None) != (neighbourhood_period is None):
            raise ValueError("give neighbourhoods and neighbourhood_period together (NB and L_N), "
                             "or neither")
        periods = [("household_period", household_period)]
        if neighbourhood_period is not None:
            periods.append(("neighbourhood_period", _positive_int("neighbourhood_period",
                                                                  neighbourhood_period)))
        periods.append(("world_period", world_period))
        for (lo_name, lo), (hi_name, hi) in zip(periods, periods[1:]):
            if lo >= hi:
                raise ValueError(
                    f"{lo_name}={lo} must be smaller than {hi_name}={hi}: a wider group averages "
                    "less often (L_H < L_N < L_W, Håland & Birkeland 2020, §4.2); otherwise the "
                    "narrower average is never the one that runs, or runs between wider ones "
                    "for no gain")
        self._timeout = _as_timedelta(timeout)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("HouseholdAverager needs the default process group: call "
                               "torch.distributed.init_process_group first")
        super().__init__(process_group=None)
        self.layout = HouseholdLayout(dist.get_world_size(), households, neighbourhoods,
                                      household_shards)
        self.rank = dist.get_rank()
        self.household = self.layout.household_of(self.rank)
        self.neighbourhood = self.layout.neighbourhood_of(self.rank)
        self.household_period = household_period
        self.neighbourhood_period = neighbourhood_period
        self.world_period = world_period
        self.household_group = self._subgroup(self.layout.household_size)
        self.neighbourhood_group = (self._subgroup(self.layout.neighbourhood_size)
                                    if neighbourhoods is not None else None)

    def _subgroup(self, size: int):
        # Every rank must create every subgroup (new_subgroups does), even those it is not in.
        group, _ = dist.new_subgroups(group_size=size, timeout=self._timeout)
        return group

    def level_at(self, step: int) -> str | None:
        """The level that averages after step ``step`` (from 1): ``"world"``,
        ``"neighbourhood"``, ``"household"`` or ``None``."""
        if step % self.world_period == 0:
            return "world"
        if self.neighbourhood_period is not None and step % self.neighbourhood_period == 0:
            return "neighbourhood"
        if step % self.household_period == 0:
            return "household"
        return None

    def _group_of(self, level: str):
        if level == "world":
            return self.process_group, list(range(self.layout.world_size))
        if level == "neighbourhood":
            return self.neighbourhood_group, self.layout.neighbourhood_ranks(self.neighbourhood)
        return self.household_group, self.layout.household_ranks(self.household)

    def average_parameters(self, params: Iterable[torch.nn.Parameter] | Iterable[dict]):
        """Count one step; average ``params`` (parameters or an optimizer's param groups)
        over the level whose turn it is.

        As torch's averagers, only parameters whose ``.grad`` is not ``None`` are averaged
        (the others did not change) — call it after ``optimizer.step()`` and before
        ``zero_grad()``. Raises :class:`PeerFailureError` when a peer of the group died or
        did not answer within the group's timeout.
        """
        self.step += 1
        level = self.level_at(self.step)
        if level is None:
            return
        group, ranks = self._group_of(level)
        if len(ranks) == 1:
            return
        try:
            average_parameters_or_parameter_groups(params, group)
        except RuntimeError as err:  # gloo and NCCL failures are RuntimeError subclasses
            raise PeerFailureError(
                f"rank {self.rank}: {level} averaging after step {self.step} over ranks {ranks} "
                f"failed: a peer died, hung or failed (group timeout: "
                f"{self._timeout if level != 'world' else 'that of init_process_group'}). "
                f"Cause: {err}") from err

    def sampler(self, dataset: Sized, **kwargs) -> DataAssignmentSampler:
        """This rank's sampler for the household shards S_H (see
        :meth:`HouseholdLayout.sampler`); ``kwargs`` go to :class:`DataAssignmentSampler`."""
        return self.layout.sampler(dataset, self.rank, **kwargs)
