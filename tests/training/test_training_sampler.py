"""DataAssignmentSampler: the properties of each scheme of Håland & Birkeland 2020 (§4.1),
checked against torch's DistributedSampler where a scheme is made of its shards."""

import itertools
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gpuml.training import SCHEMES, DataAssignmentSampler


def lists(n, m, scheme, copies, **kw):
    return [list(DataAssignmentSampler(range(n), m, r, scheme=scheme, copies=copies, **kw))
            for r in range(m)]


def ds_shard(n, m, r, **kw):
    return list(DistributedSampler(range(n), m, r, **kw))


@pytest.mark.parametrize("n", [0, 3, 20, 21, 23])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_disjoint_is_distributed_sampler(n, shuffle, drop_last):
    for m, epoch in [(4, 0), (4, 3), (3, 1), (1, 0)]:
        for r in range(m):
            ours = DataAssignmentSampler(range(n), m, r, shuffle, seed=7, drop_last=drop_last)
            theirs = DistributedSampler(range(n), m, r, shuffle, seed=7, drop_last=drop_last)
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs)


@pytest.mark.parametrize("m,c", [(4, 1), (4, 2), (4, 3), (4, 4), (6, 2), (6, 4), (8, 3)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_fine_every_sample_on_c_workers(m, c, shuffle):
    n = 24 * m
    per_worker = lists(n, m, "fine", c, shuffle=shuffle, seed=1)
    for idx in per_worker:
        assert len(idx) == c * n // m  # C*N/M each
        assert len(set(idx)) == len(idx)  # a worker holds a sample once
    counts = Counter(itertools.chain.from_iterable(per_worker))
    assert set(counts) == set(range(n))
    assert set(counts.values()) == {c}


def test_fine_pairs_intersect_about_equally():
    m, c, n = 8, 3, 8000
    sets = [set(idx) for idx in lists(n, m, "fine", c, seed=3)]
    inter = [len(a & b) for a, b in itertools.combinations(sets, 2)]
    expected = (n // m) * c * (c - 1) / (m - 1)  # rows x E[shared per row] for every pair
    assert min(inter) > 0  # all workers intersect (unlike coarse and medium-coarse)
    assert max(abs(k - expected) for k in inter) < 0.12 * expected


def test_fine_with_one_copy_is_disjoint():
    assert lists(21, 4, "fine", 1, seed=2) == lists(21, 4, "disjoint", 1, seed=2)


@pytest.mark.parametrize("m,c", [(4, 2), (5, 2), (5, 3), (6, 4), (4, 4)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_medium_coarse_gets_shards_i_to_i_plus_c(m, c, shuffle):
    n, epoch = 10 * m + 3, 2
    for r in range(m):
        s = DataAssignmentSampler(range(n), m, r, shuffle, seed=5, scheme="medium_coarse",
                                  copies=c)
        s.set_epoch(epoch)
        mine = list(s)
        shards = []
        for k in range(c):
            d = DistributedSampler(range(n), m, (r + k) % m, shuffle, seed=5)
            d.set_epoch(epoch)
            shards += list(d)
        assert sorted(mine) == sorted(shards)
        assert len(mine) == len(s) == c * len(d)
    if 2 * c - 1 <= m:
        sets = [set(x) for x in lists(n - 3, m, "medium_coarse", c, seed=5)]
        for a, b in itertools.permutations(range(m), 2):
            assert sets[a] != sets[b]  # no two workers equal
            near = min((a - b) % m, (b - a) % m) < c  # 2C-1 workers intersect worker a
            assert bool(sets[a] & sets[b]) == near


@pytest.mark.parametrize("m,c", [(4, 2), (6, 2), (6, 3), (8, 4), (4, 4)])
def test_coarse_groups_of_c_equal_workers(m, c):
    n, s_shards = 12 * m, m // c
    per_worker = lists(n, m, "coarse", c, seed=9)
    for r in range(m):
        # worker i gets shard i mod S of the S = M/C shards: DistributedSampler shards j = i (mod S)
        expected = sorted(x for k in range(m) if k % s_shards == r % s_shards
                          for x in ds_shard(n, m, k, seed=9))
        assert sorted(per_worker[r]) == expected
        assert len(per_worker[r]) == c * n // m
    for a, b in itertools.combinations(range(m), 2):
        same = a % s_shards == b % s_shards
        assert (sorted(per_worker[a]) == sorted(per_worker[b])) == same
        assert bool(set(per_worker[a]) & set(per_worker[b])) == same


@pytest.mark.parametrize("scheme,c", [("coarse", 2), ("medium_coarse", 2), ("fine", 3)])
def test_copies_are_not_processed_in_lockstep(scheme, c):
    # Workers holding the same samples see them in different orders (Håland & Birkeland give
    # households with equal data different seeds so that they do not process the same batches).
    per_worker = lists(64, 4, scheme, c, seed=0)
    pairs = [(a, b, set(a) & set(b)) for a, b in itertools.combinations(per_worker, 2)]
    assert any(shared for _, _, shared in pairs)
    for a, b, shared in pairs:
        if shared:
            assert [x for x in a if x in shared] != [x for x in b if x in shared]


@pytest.mark.parametrize("scheme,c", [("disjoint", 1), ("coarse", 2), ("medium_coarse", 3),
                                      ("fine", 2)])
def test_deterministic_per_seed_and_epoch(scheme, c):
    def run(seed, epoch, shuffle=True, n=50):
        s = DataAssignmentSampler(range(n), 4, 1, shuffle, seed, scheme=scheme, copies=c)
        s.set_epoch(epoch)
        return list(s)

    assert run(0, 3) == run(0, 3)
    assert run(0, 3) != run(0, 4)
    assert run(0, 3) != run(1, 3)
    assert run(0, 3, shuffle=False) == run(0, 4, shuffle=False)
    # unshuffled and unpadded: the worker's samples in their order in the data set
    assert run(0, 0, shuffle=False, n=48) == sorted(run(0, 0, shuffle=False, n=48))


@pytest.mark.parametrize("scheme,c", [("coarse", 2), ("medium_coarse", 3), ("fine", 2)])
@pytest.mark.parametrize("n", [21, 22, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_padding_and_drop_last_like_distributed_sampler(scheme, c, n, drop_last):
    m = 4
    ours = [DataAssignmentSampler(range(n), m, r, seed=4, drop_last=drop_last, scheme=scheme,
                                  copies=c) for r in range(m)]
    theirs = Counter(x for r in range(m) for x in ds_shard(n, m, r, seed=4, drop_last=drop_last))
    got = Counter(x for s in ours for x in s)
    # Every position of DistributedSampler's padded (or trimmed) list is held C times.
    assert got == Counter({k: c * v for k, v in theirs.items()})
    for s in ours:
        assert len(list(s)) == len(s) == c * len(DistributedSampler(range(n), m, 0,
                                                                    drop_last=drop_last))


def test_dataloader_drop_in():
    data = TensorDataset(torch.arange(40.0))
    sampler = DataAssignmentSampler(data, num_replicas=4, rank=2, scheme="fine", copies=2)
    sampler.set_epoch(1)
    seen = torch.cat([b for (b,) in DataLoader(data, batch_size=7, sampler=sampler)])
    assert sorted(seen.long().tolist()) == sorted(sampler)
    assert len(seen) == 20


@pytest.mark.parametrize("kw,match", [
    ({"copies": 5}, "exceeds num_replicas=4"),
    ({"copies": 0, "scheme": "fine"}, "positive integer"),
    ({"copies": -1, "scheme": "coarse"}, "positive integer"),
    ({"copies": 1.5, "scheme": "fine"}, "positive integer"),
    ({"scheme": "random"}, "scheme must be one of"),
    ({"copies": 2, "scheme": "disjoint"}, "scheme='disjoint' means copies=1"),
    ({"copies": 3, "scheme": "coarse"}, "must divide num_replicas=4"),
    ({"rank": 4}, "Invalid rank 4"),
    ({"rank": -1}, "Invalid rank -1"),
    ({"num_replicas": 0, "rank": 0}, "num_replicas must be a positive integer"),
])
def test_clear_errors(kw, match):
    args = {"num_replicas": 4, "rank": 0, "scheme": "medium_coarse"} | kw
    with pytest.raises(ValueError, match=match):
        DataAssignmentSampler(range(10), **args)


def test_defaults_need_a_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        DataAssignmentSampler(range(10))


def test_schemes_listed():
    assert SCHEMES == ("disjoint", "coarse", "medium_coarse", "fine")
