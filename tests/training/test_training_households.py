"""Households and neighbourhoods (Håland & Birkeland 2020, §4.2): the layout, the household
shards, the averaging schedule with 4 real gloo processes, and a killed rank."""

import itertools

import numpy as np
import pytest
from _procs import free_port, gloo_missing, run_processes
from _training_workers import households_failing, households_schedule

from gpuml.training import HouseholdAverager, HouseholdLayout

needs_gloo = pytest.mark.skipif(gloo_missing() is not None, reason=str(gloo_missing()))


def test_layout_blocks_of_consecutive_ranks():
    lay = HouseholdLayout(16, households=4, neighbourhoods=2)
    assert lay.household_size == 4 and lay.neighbourhood_size == 8
    assert lay.household_ranks(2) == [8, 9, 10, 11]
    assert lay.neighbourhood_ranks(1) == list(range(8, 16))
    assert [lay.household_of(r) for r in (0, 3, 4, 15)] == [0, 0, 1, 3]
    assert [lay.neighbourhood_of(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    assert lay.household_shards == 4 and lay.copies == 1


@pytest.mark.parametrize("kw,match", [
    ({"households": 3}, "households=3 does not divide the world of 8"),
    ({"households": 4, "neighbourhoods": 3}, "neighbourhoods=3 does not divide households=4"),
    ({"households": 4, "household_shards": 3}, "household_shards=3 does not divide"),
    ({"households": 0}, "households must be a positive integer"),
    ({"households": 2, "neighbourhoods": 0}, "neighbourhoods must be a positive integer"),
])
def test_layout_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        HouseholdLayout(8, **kw)


def test_household_shards_disjoint():
    lay = HouseholdLayout(8, households=4)
    data = [set(lay.sampler(range(64), r, seed=1)) for r in range(8)]
    assert set().union(*data) == set(range(64))
    assert all(not (a & b) for a, b in itertools.combinations(data, 2))


def test_household_shards_overlapping():
    # Figure 4.7 in small: M=8, H=4, S_H=2; household h holds household shard h mod 2.
    lay = HouseholdLayout(8, households=4, household_shards=2)
    data = [set(lay.sampler(range(64), r, seed=1)) for r in range(8)]
    shard = [set().union(*(data[r] for r in lay.household_ranks(h))) for h in range(4)]
    assert shard[0] == shard[2] and shard[1] == shard[3]
    assert not shard[0] & shard[1] and shard[0] | shard[1] == set(range(64))
    for h in range(4):  # worker shards inside a household are disjoint
        a, b = (data[r] for r in lay.household_ranks(h))
        assert not a & b and len(a) == len(b) == 16
    # equal data, different order (footnote to §4.2.1: different seeds per household)
    assert list(lay.sampler(range(64), 0, seed=1)) != list(lay.sampler(range(64), 4, seed=1))


def test_every_neighbourhood_holds_the_data_set():
    # Figure 4.8: S_H = H / NB gives each neighbourhood one copy of the whole data set.
    lay = HouseholdLayout(8, households=4, neighbourhoods=2, household_shards=2)
    for nb in range(2):
        got = sorted(x for r in lay.neighbourhood_ranks(nb)
                     for x in lay.sampler(range(40), r, seed=3))
        assert got == list(range(40))


@pytest.mark.parametrize("kw,match", [
    ({"household_period": 4, "world_period": 4}, "household_period=4 must be smaller than "
                                                  "world_period=4"),
    ({"household_period": 1, "world_period": 8, "neighbourhoods": 2, "neighbourhood_period": 8},
     "neighbourhood_period=8 must be smaller than world_period=8"),
    ({"household_period": 2, "world_period": 8, "neighbourhoods": 2, "neighbourhood_period": 2},
     "household_period=2 must be smaller than neighbourhood_period=2"),
    ({"household_period": 1, "world_period": 8, "neighbourhoods": 2},
     "give neighbourhoods and neighbourhood_period together"),
    ({"household_period": 0, "world_period": 8}, "household_period must be a positive integer"),
    ({"household_period": 1, "world_period": 8, "timeout": -1}, "timeout must be a positive"),
])
def test_averager_argument_errors_before_any_collective(kw, match):
    with pytest.raises(ValueError, match=match):
        HouseholdAverager(2, **kw)


def test_averager_needs_a_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        HouseholdAverager(2, 1, 4)


def _by_step(messages, tag):
    out = {}
    for m in messages:
        if m[0] == tag:
            _, rank, step, before, after = m
            out.setdefault(step, {})[rank] = (before, after)
    return out


def _check_no_child_errors(messages, exitcodes):
    errors = [m[2] for m in messages if m[0] == "error"]
    assert not errors, "\n".join(errors)
    assert exitcodes == [0] * len(exitcodes), exitcodes


@needs_gloo
def test_schedule_with_four_gloo_processes():
    steps = 12
    messages, exitcodes, _ = run_processes(households_schedule, 4, (free_port(), steps), 90)
    _check_no_child_errors(messages, exitcodes)
    layout = {m[1]: m[2:] for m in messages if m[0] == "layout"}
    assert layout == {0: (0, 0), 1: (0, 0), 2: (1, 0), 3: (1, 0)}

    # A: H=2, L_H=2, L_W=6, averaged by hand after each optimizer step.
    households = [[0, 1], [2, 3]]
    a = _by_step(messages, "A")
    assert sorted(a) == list(range(1, steps + 1))
    for step, ranks in a.items():
        groups = ([[0, 1, 2, 3]] if step % 6 == 0 else households if step % 2 == 0
                  else [[r] for r in range(4)])
        for g in groups:
            mean = np.mean([ranks[r][0] for r in g], axis=0)
            for r in g:  # each replica is the mean of its group's replicas before
                np.testing.assert_allclose(ranks[r][1], mean, rtol=1e-6, atol=1e-7)
                np.testing.assert_array_equal(ranks[r][1], ranks[g[0]][1])  # equal, bit for bit
        if step % 6:  # only the world average makes households equal
            assert not np.array_equal(ranks[0][1], ranks[2][1])
        if step % 2:  # local steps: replicas differ
            assert not np.array_equal(ranks[0][1], ranks[1][1])

    # B: H=4 households of one worker, NB=2 (L_N=2), L_W=4, through PostLocalSGDOptimizer.
    b = _by_step(messages, "B")
    for step, ranks in b.items():
        after = [ranks[r][1] for r in range(4)]
        if step % 4 == 0:
            assert all(np.array_equal(after[0], x) for x in after)
        elif step % 2 == 0:
            assert np.array_equal(after[0], after[1]) and np.array_equal(after[2], after[3])
            assert not np.array_equal(after[0], after[2])
        else:
            assert not np.array_equal(after[0], after[1])
    assert {m[2] for m in messages if m[0] == "state"} == {steps}  # step kept in state_dict


@needs_gloo
@pytest.mark.parametrize("how", ["kill", "hang"])
def test_failed_rank_stops_the_others_with_a_clear_error(how):
    # A killed rank closes its connections: its peers fail at their next average with it.
    # A hung rank keeps them open: its peers fail when the group timeout runs out.
    timeout_s, bad_rank, bad_step = 2, 3, 6
    messages, exitcodes, elapsed = run_processes(
        households_failing, 4, (free_port(), timeout_s, how, bad_rank, bad_step), 60,
        until=lambda ms: sum(m[0] in ("stopped", "error") for m in ms) >= 3,
        grace_s=10 if how == "kill" else 2)  # a hung rank never exits: do not wait long
    errors = [m[2] for m in messages if m[0] == "error"]
    assert not errors, "\n".join(errors)
    failing = [m for m in messages if m[0] == "failing"]
    assert len(failing) == 1
    stopped = {m[1]: m for m in messages if m[0] == "stopped"}
    assert sorted(stopped) == [0, 1, 2], messages
    for rank, (_, _, step, when, text) in stopped.items():
        # rank 2 shares the household of rank 3 and stops at that step; ranks 0 and 1 at the
        # next world average (step 8), each within the group timeout (plus slack for CI)
        assert step == (bad_step if rank == 2 else 8)
        assert when - failing[0][2] < timeout_s + 10
        assert "averaging after step" in text and "a peer died" in text
        assert ("household" if rank == 2 else "world") in text
    assert elapsed < 45
    assert exitcodes[:3] == [0, 0, 0], exitcodes
    assert exitcodes[bad_rank] == (-9 if how == "kill" else None)  # None: hung, killed by us
