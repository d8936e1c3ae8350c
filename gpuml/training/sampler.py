"""Data assignment with overlap: a drop-in for ``torch.utils.data.DistributedSampler``.

André Håland and Bjørnar Birkeland, *Exploring data assignment schemes when training deep
neural networks using data parallelism*, MSc thesis, NTNU, 2020, §4.1, assign a data set
of N samples to M workers so that every sample is held by C workers ("number of copies",
1 ≤ C ≤ M), in one of four ways:

* **disjoint** (C = 1): worker i gets shard i of M.
* **coarse**: S = M / C shards; worker i gets shard i mod S, so groups of C workers hold
  equal data and different groups hold nothing in common.
* **medium-coarse**: M shards; worker i gets the C shards i, i+1, …, i+C−1 (mod M), so
  2C−1 workers intersect and no two are equal.
* **fine-grained**: samples, not shards: every sample goes to C workers chosen so that all
  pairs of workers intersect about equally; each worker gets C·N/M samples.

One construction gives all four. The (shuffled, padded) index list is laid out in rows of M
positions; the M columns are the shards of ``DistributedSampler`` (position ``p`` belongs to
shard ``p mod M``, exactly as it strides the list), and the sample in column c of row r goes
to the C workers ``(c + d) mod M`` for the offsets d in a set ``D_r`` of size C that contains
0. Each offset maps columns to workers one to one, so every worker receives exactly C
samples per row, C·N/M in all, whatever ``D_r`` is:

* disjoint: ``D = {0}``: worker i holds column i, ``DistributedSampler``'s partition exactly;
* coarse: ``D = {0, S, 2S, …, (C−1)S}``: worker i holds the columns ≡ i (mod S);
* medium-coarse: ``D = {0, −1, …, −(C−1)}``: worker i holds columns i, …, i+C−1;
* fine: ``D_r = {0} ∪`` a random (C−1)-subset of {1, …, M−1}, drawn anew for every row.
  Two workers a, b share the sample of a row's column c when both a−c and b−c lie in
  ``D_r``; for a random ``D_r`` the expected number of such c is C(C−1)/(M−1) for every
  pair, so over many rows all pairs intersect about equally (the thesis's aim: "variance of
  intersection approximately equal to 0").

Where samples are shared (C > 1) each worker shuffles its own list once more with a seed of
its own, so that workers holding the same samples do not process them in lockstep — the
thesis gives households with equal data different seeds for the same reason (§4.2.1).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sized

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

SCHEMES = ("disjoint", "coarse", "medium_coarse", "fine")


def _mixed_seed(*values: int) -> int:
    """A 63-bit seed from several integers, the same in every process (``hash`` is not)."""
    digest = hashlib.blake2b(",".join(map(str, values)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class DataAssignmentSampler(Sampler[int]):
    """Assign each sample to ``copies`` of the ``num_replicas`` workers by one of four schemes.

    Takes the arguments of :class:`torch.utils.data.distributed.DistributedSampler` and
    behaves like it (defaults from the process group, ``set_epoch``, shuffling seeded by
    ``seed + epoch``, padding by repetition or ``drop_last``); ``scheme="disjoint"`` yields
    exactly what ``DistributedSampler`` yields. Each worker iterates ``copies`` times as many
    samples as ``DistributedSampler`` would give it: ``copies * ceil(N / num_replicas)``
    (``copies * floor(N / num_replicas)`` with ``drop_last``), so an epoch over the sampler
    is what Håland & Birkeland call an *overlap epoch*; run ``ceil(E / copies)`` of them to
    see every sample about ``E`` times, as they do.

    Parameters
    ----------
    dataset : Sized
        Anything with ``len``; only its length is used.
    num_replicas : int, optional
        Number of workers M. Default: the world size of the default process group.
    rank : int, optional
        This worker's index in ``[0, num_replicas)``. Default: the rank in the default
        process group.
    shuffle : bool, default True
        Shuffle the data set before it is split (seeded by ``seed + epoch``, as
        ``DistributedSampler``); with ``copies > 1`` each worker also shuffles its own list
        (seeded by ``seed``, epoch and rank). ``False``: the same assignment and order in
        every epoch.
    seed : int, default 0
        Must be the same on every worker.
    drop_last : bool, default False
        Drop the tail of the data set to make it divisible by ``num_replicas`` instead of
        padding it by repeating samples from its start.
    scheme : {"disjoint", "coarse", "medium_coarse", "fine"}, default "disjoint"
        Håland & Birkeland 2020, §4.1; see the module docstring.
    copies : int, default 1
        C, the number of workers holding each sample, ``1 <= copies <= num_replicas``.
        ``"disjoint"`` needs 1; ``"coarse"`` needs ``copies`` to divide ``num_replicas``
        (its ``num_replicas // copies`` shards are held by ``copies`` workers each).

    Attributes
    ----------
    num_samples : int
        ``len(self)``: samples this worker iterates per epoch.
    total_size : int
        Length of the padded (or trimmed) index list, ``num_replicas`` times the size of one
        shard of ``DistributedSampler``.
    offsets : torch.Tensor or None
        The fixed offsets ``D`` (coarse, medium-coarse, disjoint); ``None`` for fine, whose
        offsets are drawn per row in :meth:`row_offsets`.

    References
    ----------
    André Håland, Bjørnar Birkeland, *Exploring data assignment schemes when training deep
    neural networks using data parallelism*, MSc thesis, NTNU, 2020, §4.1.

    Examples
    --------
    >>> from gpuml.training import DataAssignmentSampler
    >>> s = DataAssignmentSampler(range(8), num_replicas=4, rank=1, shuffle=False,
    ...                           scheme="medium_coarse", copies=2)
    >>> list(s)  # shards 1 and 2 of DistributedSampler: {1, 5} and {2, 6}
    [1, 2, 5, 6]
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, *,
                 scheme: str = "disjoint", copies: int = 1) -> None:
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        if num_replicas is None or rank is None:
            if not dist.is_available() or not dist.is_initialized():
                raise RuntimeError(
                    "DataAssignmentSampler: num_replicas and rank default to the default process "
                    "group, and none is initialized: call torch.distributed.init_process_group "
                    "first or pass num_replicas and rank")
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive integer, got {num_replicas!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(
                f"Invalid rank {rank!r}, rank should be in the interval [0, {num_replicas - 1}]")
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
            raise ValueError(f"copies must be a positive integer (C >= 1), got {copies!r}")
        if copies > num_replicas:
            raise ValueError(
                f"copies={copies} exceeds num_replicas={num_replicas}: a sample cannot be held by "
                f"more workers than there are (Håland & Birkeland 2020: 1 <= C <= M)")
        if scheme == "disjoint" and copies != 1:
            raise ValueError(f"scheme='disjoint' means copies=1, got copies={copies}; choose "
                             "'coarse', 'medium_coarse' or 'fine' for overlapping data")
        if scheme == "coarse" and num_replicas % copies:
            raise ValueError(
                f"scheme='coarse' splits the data into S = num_replicas / copies shards, each held "
                f"by `copies` workers: copies={copies} must divide num_replicas={num_replicas}")

        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.scheme = scheme
        self.copies = copies
        self.epoch = 0
        n = len(dataset)
        # DistributedSampler's sizes, so that scheme="disjoint" is its partition exactly.
        if drop_last and n % num_replicas:
            shard = math.ceil((n - num_replicas) / num_replicas)
        else:
            shard = math.ceil(n / num_replicas)
        self.shard_size = shard
        self.total_size = shard * num_replicas
        self.num_samples = copies * shard
        self.offsets = self._fixed_offsets()

    def _fixed_offsets(self) -> torch.Tensor | None:
        m, c = self.num_replicas, self.copies
        if self.scheme == "fine":
            return None
        if self.scheme == "coarse":
            return torch.arange(c) * (m // c)
        if self.scheme == "medium_coarse":
            return (-torch.arange(c)) % m
        return torch.zeros(1, dtype=torch.long)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch: with ``shuffle=True`` each epoch has its own order (and, for the
        fine scheme, its own assignment); the same on every worker for the same seed."""
        self.epoch = epoch

    def _generator(self, *salt: int) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(_mixed_seed(self.seed, self.epoch if self.shuffle else 0, *salt))
        return g

    def row_offsets(self) -> torch.Tensor:
        """The offsets ``D_r`` of every row for the current epoch: ``(rows, copies)``, row r's
        sample in column c going to workers ``(c + D_r) mod num_replicas``."""
        rows = self.total_size // self.num_replicas
        if self.offsets is not None:
            return self.offsets.expand(rows, self.copies)
        # Fine: 0 plus a random (C-1)-subset of the other offsets, per row, the same on every
        # worker (the generator depends on seed and epoch only).
        m = self.num_replicas
        others = torch.rand(rows, m - 1, generator=self._generator(-1)).argsort(dim=1)
        return torch.cat([torch.zeros(rows, 1, dtype=torch.long),
                          others[:, : self.copies - 1] + 1], dim=1)

    def _padded_indices(self) -> torch.Tensor:
        n = len(self.dataset)
        if self.shuffle:
            # DistributedSampler's generator, seeded the same way, for the same permutation.
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(n, generator=g)
        else:
            indices = torch.arange(n)
        if self.drop_last:
            return indices[: self.total_size]
        padding = self.total_size - n
        if padding > 0:
            indices = torch.cat([indices, indices.repeat(math.ceil(padding / n))[:padding]])
        return indices

    def positions(self) -> torch.Tensor:
        """Positions in the padded index list that this worker holds, in row-major order."""
        m = self.num_replicas
        rows = self.total_size // m
        columns = (self.rank - self.row_offsets()) % m
        columns = columns.sort(dim=1).values
        return (torch.arange(rows).unsqueeze(1) * m + columns).reshape(-1)

    def __iter__(self) -> Iterator[int]:
        if self.total_size == 0:
            return iter([])
        mine = self._padded_indices()[self.positions()]
        if self.shuffle and self.copies > 1:
            mine = mine[torch.randperm(mine.numel(), generator=self._generator(self.rank))]
        return iter(mine.tolist())

    def __len__(self) -> int:
        return self.num_samples
