"""The host-side planning of the GPU SMO solver (pure functions, run without a GPU)."""

import itertools

import numpy as np
import pytest

from gpuml.kernels.smo.cuda import launch_order, plan_chunks


def test_everything_fits_in_one_chunk():
    chunks, too_large = plan_chunks({0: 10, 1: 20, 2: 5}, 8, 10**9)
    assert chunks == [[0, 1, 2]] and too_large == []


def test_chunks_respect_the_budget_and_hold_every_group_once():
    rng = np.random.default_rng(0)
    sizes = {g: int(n) for g, n in enumerate(rng.integers(1, 60, size=40))}
    budget = 8 * 60 * 60 * 3
    chunks, too_large = plan_chunks(sizes, 8, budget)
    assert too_large == []
    assert sorted(itertools.chain(*chunks)) == list(sizes)
    for chunk in chunks:
        assert chunk == sorted(chunk)
        assert sum(8 * sizes[g] ** 2 for g in chunk) <= budget
    # First fit never leaves two chunks half empty (the later one's groups would have
    # gone into the earlier), so it needs fewer than twice the total over the budget, + 1.
    total = sum(8 * n * n for n in sizes.values())
    assert len(chunks) < 2 * total / budget + 1


def test_groups_too_large_alone_are_set_apart():
    # 600^2 * 8 = 2.88 MB exceeds the budget; 400^2 * 8 = 1.28 MB, two fit together.
    chunks, too_large = plan_chunks({0: 600, 1: 400, 2: 400, 3: 397}, 8, 2 * 400 * 400 * 8)
    assert too_large == [0]
    assert chunks == [[1, 2], [3]]


def test_budget_edge_is_inclusive_and_a_negative_budget_fits_nothing():
    assert plan_chunks({0: 10, 1: 10}, 4, 800) == ([[0, 1]], [])
    assert plan_chunks({0: 10, 1: 10}, 4, 799) == ([[0], [1]], [])
    assert plan_chunks({0: 10, 1: 10}, 4, -5) == ([], [0, 1])
    assert plan_chunks({}, 4, 100) == ([], [])


def test_plan_is_deterministic_with_ties():
    sizes = {g: 10 for g in range(7)}
    first = plan_chunks(sizes, 8, 3 * 800)
    assert first == plan_chunks(dict(reversed(list(sizes.items()))), 8, 3 * 800)
    assert first == ([[0, 1, 2], [3, 4, 5], [6]], [])


def test_launch_order_lays_chunks_out_then_the_large_groups():
    groups = [2, 0, 1, 0, 3, 2, 1]
    order, spans = launch_order(groups, [[0, 2], [3]], [1])
    assert order.tolist() == [0, 1, 3, 5, 4, 2, 6]
    assert spans == [(0, 4), (4, 5)]
    order, spans = launch_order(groups, [], [0, 1, 2, 3])
    assert order.tolist() == list(range(7)) and spans == []
    order, spans = launch_order(groups, [[0, 1, 2, 3]], [])
    assert order.tolist() == list(range(7)) and spans == [(0, 7)]


def test_launch_order_refuses_a_group_left_out():
    with pytest.raises(ValueError, match="exactly one chunk"):
        launch_order([0, 1], [[0]], [])
