"""Data-parallel training of a small CNN on Fashion-MNIST with gpuml.optim and gpuml.training.

One script, one process per worker, launched by ``torchrun``; the same command runs on CPUs
(gloo) and on GPUs (NCCL, one GPU per rank)::

    torchrun --nproc-per-node 4 examples/train_fashion_mnist.py --optimizer lamb \\
        --batch-size 1024 --epochs 5 --csv run.csv --checkpoint ckpt
    # killed? the same command with --resume goes on from the last finished epoch
    torchrun --nproc-per-node 4 examples/train_fashion_mnist.py --optimizer lamb \\
        --batch-size 1024 --epochs 5 --csv run.csv --checkpoint ckpt --resume

What it puts together:

* **Optimizer and schedule**: ``--optimizer lamb|lars|adamw|sgd`` at the learning rate
  ``--lr`` tuned at the base batch ``--base-batch-size`` B0, scaled to the global batch B by
  ``--scaling sqrt`` (You et al., *Large-Batch Training for LSTM and Beyond*, SC 2019, §3.3)
  or ``linear`` (Goyal et al., *Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour*,
  2017), with LEGW warmup — ``--warmup-epochs`` w0 at B0, i.e. ``w0 * B/B0`` epochs at B, the
  same number of warmup steps at every batch (You et al. 2019, §3.1; Yang You, *Fast and
  Accurate Machine Learning on Distributed Systems and Supercomputers*, PhD thesis, UC
  Berkeley, 2020, ch. 6) — then linear decay to 0 (``--decay-power``).
* **Data assignment**: ``--scheme disjoint|coarse|medium_coarse|fine --copies C`` (Håland &
  Birkeland, *Exploring data assignment schemes when training deep neural networks using
  data parallelism*, MSc thesis, NTNU, 2020, §4.1) through
  :class:`gpuml.training.DataAssignmentSampler`.
* **Synchronisation**: by default synchronous data parallelism, ``DistributedDataParallel``
  (gradients averaged every step), or with ``--sharded`` FSDP2's ``fully_shard`` (each rank
  holds a shard of every parameter and of the optimizer state). ``--households H`` switches
  to hierarchical local SGD instead (same thesis, §4.2): every rank steps its own replica and
  :class:`gpuml.training.HouseholdAverager` averages the replicas in households every
  ``--household-period`` steps, in ``--neighbourhoods`` every ``--neighbourhood-period``
  and across the world every ``--world-period``.
* **Output**: rank 0 prints one line per evaluation (every ``--eval-every`` steps and at each
  epoch's end) and appends it to the CSV ``--csv`` (columns ``step, epoch, loss, val_acc,
  test_acc, lr``: the mean training loss since the previous row over all ranks, accuracies
  in %, the learning rate of the row's step).
* **Bad settings** (also those that depend on the number of ranks, such as ``--scheme coarse``
  with a ``--copies`` that does not divide it) stop the run before the process group forms:
  one line ``train_fashion_mnist.py: error: ...`` on stderr, from local rank 0 only, and exit
  status 2, as argparse reports a bad option.
* **Checkpoints**: with ``--checkpoint DIR`` every rank writes its model, optimizer,
  scheduler and sampler epoch (and the averager's step) after every epoch; ``--resume``
  continues from the last complete one, and the run then follows the trajectory of one that
  was never stopped (bit for bit on the CPU with ``--deterministic``).

The global batch ``--batch-size`` is split evenly over the ranks. For the synchronous schemes
with one copy the M-rank run takes the same global batches as one process with the whole
batch (:class:`~gpuml.training.DataAssignmentSampler` lays out one shuffled order in rows of
M; the M local batches of step k are one contiguous block of it), so ``train()`` in one
process simulates any number of ranks up to floating-point summation order; the benchmark
``bench/bench_large_batch.py`` relies on it.

Without the Debian package ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``)
the script trains on a small synthetic set of the same shapes (``--data synthetic``): ten
classes of noisy 28x28 patterns.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gzip
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gpuml.optim import LAMB, LARS, WarmupPolynomialDecay, legw_warmup_steps, scale_lr
from gpuml.training import (
    SCHEMES,
    DataAssignmentSampler,
    HouseholdAverager,
    PeerFailureError,
)

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
#: Mean and standard deviation of the Fashion-MNIST training pixels (in [0, 1]).
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530
#: Seed of the fixed train/validation split (independent of the training seed).
SPLIT_SEED = 2019
OPTIMIZERS = ("lamb", "lars", "adamw", "sgd")
#: Learning rate at the base batch per optimizer: the choices of the optimizer convergence
#: benchmark at batch 64 on a validation split (an MLP, ``bench/bench_optim_convergence.py``);
#: for this CNN at B0 = 32 the large-batch benchmark (``bench/bench_large_batch.py``) tunes
#: its own (bench/results/cpu-2core/large_batch_grid.md). Weight decay: each optimizer's
#: usual value.
DEFAULT_LR = {"lamb": 3e-3, "lars": 3.0, "adamw": 1e-3, "sgd": 0.03}
DEFAULT_WEIGHT_DECAY = {"lamb": 0.01, "lars": 5e-4, "adamw": 0.01, "sgd": 5e-4}
CSV_COLUMNS = ("step", "epoch", "loss", "val_acc", "test_acc", "lr")
# The settings a resumed run must share with its checkpoint to follow the same trajectory.
_TRAJECTORY = ("optimizer", "batch_size", "base_batch_size", "lr", "scaling", "warmup_epochs",
               "decay_power", "weight_decay", "momentum", "clip", "epochs", "steps", "scheme",
               "copies", "households", "household_period", "neighbourhoods",
               "neighbourhood_period", "world_period", "household_shards", "sharded", "data",
               "train_size", "val_size", "model", "seed")


@dataclasses.dataclass
class Config:
    """Every setting of a run; the command line's options, ``--batch-size`` -> ``batch_size``."""

    optimizer: str = "lamb"
    batch_size: int = 1024
    base_batch_size: int = 64
    lr: float | None = None
    scaling: str = "sqrt"
    warmup_epochs: float = 0.05
    decay_power: float = 1.0
    weight_decay: float | None = None
    momentum: float = 0.9
    clip: float | None = None
    epochs: int = 5
    steps: int | None = None
    scheme: str = "disjoint"
    copies: int = 1
    households: int | None = None
    household_period: int = 1
    neighbourhoods: int | None = None
    neighbourhood_period: int | None = None
    world_period: int = 8
    household_shards: int | None = None
    sharded: bool = False
    checkpoint: str | None = None
    resume: bool = False
    csv: str | None = None
    eval_every: int = 0
    data: str = "auto"
    data_dir: str = str(FASHION_MNIST)
    train_size: int | None = None
    val_size: int = 0
    test_size: int | None = None
    model: str = "cnn"
    seed: int = 0
    backend: str = "auto"
    timeout: float = 300.0
    threads: int | None = None
    deterministic: bool = False
    cpu: bool = False
    quiet: bool = False

    def __post_init__(self):
        if self.lr is None:
            self.lr = DEFAULT_LR.get(self.optimizer, 0.0)
        if self.weight_decay is None:
            self.weight_decay = DEFAULT_WEIGHT_DECAY.get(self.optimizer, 0.0)

    def check(self) -> None:
        """Errors a run would otherwise meet later, or worse, not at all."""
        def positive(name):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value!r}")

        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.scheme not in SCHEMES:
            raise ValueError(f"--scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if self.scaling not in ("sqrt", "linear", "none"):
            raise ValueError(f"--scaling must be sqrt, linear or none, got {self.scaling!r}")
        if self.data not in ("auto", "fashion-mnist", "synthetic"):
            raise ValueError(f"--data must be auto, fashion-mnist or synthetic, got {self.data!r}")
        if self.model not in ("cnn", "mlp"):
            raise ValueError(f"--model must be cnn or mlp, got {self.model!r}")
        for name in ("batch_size", "base_batch_size", "epochs", "steps", "copies", "households",
                     "household_period", "world_period", "neighbourhoods",
                     "neighbourhood_period", "household_shards", "train_size", "test_size",
                     "timeout", "threads", "decay_power", "clip"):
            positive(name)
        if self.lr < 0 or self.weight_decay < 0 or self.warmup_epochs < 0 or self.val_size < 0:
            raise ValueError("--lr, --weight-decay, --warmup-epochs and --val-size must be >= 0")
        if self.eval_every < 0:
            raise ValueError(f"--eval-every must be >= 0, got {self.eval_every}")
        if self.scheme == "disjoint" and self.copies != 1:
            raise ValueError(f"--scheme disjoint gives each sample to one rank: --copies "
                             f"{self.copies} needs --scheme coarse, medium_coarse or fine")
        if self.households is None and (self.neighbourhoods is not None
                                        or self.household_shards is not None):
            raise ValueError("--neighbourhoods and --household-shards need --households")
        if (self.neighbourhoods is None) != (self.neighbourhood_period is None):
            raise ValueError("--neighbourhoods and --neighbourhood-period go together")
        if self.households is not None:
            for name in ("neighbourhoods", "household_shards"):
                value = getattr(self, name)
                if value is not None and self.households % value:
                    raise ValueError(f"--{name.replace('_', '-')} {value} must divide "
                                     f"--households {self.households}")
            periods = {name: getattr(self, name) for name in
                       ("household_period", "neighbourhood_period", "world_period")
                       if getattr(self, name) is not None}
            if list(periods.values()) != sorted(set(periods.values())):
                raise ValueError(
                    " < ".join(f"--{k.replace('_', '-')} {v}" for k, v in periods.items())
                    + " does not hold: a wider group averages less often")
        if self.household_shards is not None and (self.scheme != "disjoint" or self.copies != 1):
            raise ValueError("--household-shards assigns the data by household (the coarse "
                             "scheme over households); leave --scheme and --copies at their "
                             "defaults with it")
        if self.sharded and self.households is not None:
            raise ValueError(
                "--sharded with --households: the household averager averages whole replicas, "
                "but under fully_shard every rank holds a shard of one model spread over the "
                "world; local SGD needs a replica per rank (leave out --sharded)")
        if self.resume and not self.checkpoint:
            raise ValueError("--resume needs --checkpoint DIR")

    def check_world(self, world: int, distributed: bool) -> None:
        """Errors that depend on the number of ranks ``world`` (``distributed``: the ranks
        are, or will be, a process group)."""
        if (self.sharded or self.households) and not distributed:
            raise ValueError("--sharded and --households need a process group: launch with "
                             "torchrun")
        if self.batch_size % world:
            raise ValueError(f"--batch-size {self.batch_size} must be a multiple of the {world} "
                             "ranks: each rank takes an equal share of the global batch")
        if self.copies > world:
            raise ValueError(f"--copies {self.copies} on {world} rank(s): a sample cannot be "
                             "held by more ranks than there are")
        if self.scheme == "coarse" and world % self.copies:
            raise ValueError(f"--scheme coarse --copies {self.copies} on {world} ranks: the "
                             "coarse scheme gives each shard of the data to a group of --copies "
                             "ranks, so --copies must divide the number of ranks")
        if self.households is not None and world % self.households:
            raise ValueError(f"--households {self.households} on {world} ranks: every household "
                             "has the same number of ranks, so --households must divide the "
                             "number of ranks")


# ---- data ----------------------------------------------------------------------------------

def _read_idx(prefix: str, data_dir: Path):
    with gzip.open(data_dir / f"{prefix}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(data_dir / f"{prefix}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (torch.tensor(x, dtype=torch.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return x, torch.tensor(y, dtype=torch.int64)


def synthetic(n: int, seed: int):
    """``n`` images of ten classes: a smooth random 28x28 pattern per class (the same for every
    call) plus noise, standardised; learnable in a few steps, not trivially."""
    g = torch.Generator().manual_seed(1234)
    templates = F.interpolate(torch.randn(10, 1, 7, 7, generator=g), size=(28, 28),
                              mode="bilinear", align_corners=False)
    g.manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = templates[y] + 1.5 * torch.randn(n, 1, 28, 28, generator=g)
    return (x - x.mean()) / x.std(), y


def load_data(cfg: Config) -> dict:
    """``{"train", "val", "test"}`` -> ``(x, y)`` on the CPU (``"val"`` only with
    ``val_size``): Fashion-MNIST, or the synthetic set when it is asked for or, with
    ``data="auto"``, when the package's files are absent. The validation split is carved out
    of the training set with a fixed seed; the test set is never used for a choice."""
    data_dir = Path(cfg.data_dir)
    use_real = cfg.data == "fashion-mnist" or (
        cfg.data == "auto" and (data_dir / "train-images-idx3-ubyte.gz").exists())
    if use_real:
        if not (data_dir / "train-images-idx3-ubyte.gz").exists():
            raise FileNotFoundError(f"--data fashion-mnist: no Fashion-MNIST under {data_dir} "
                                    "(apt-get install dataset-fashion-mnist)")
        x, y = _read_idx("train", data_dir)
        test = _read_idx("t10k", data_dir)
    else:
        n_train = (cfg.train_size or 2048) + cfg.val_size
        x, y = synthetic(n_train, seed=1)
        test = synthetic(cfg.test_size or 512, seed=2)
    out = {}
    if cfg.val_size:
        if cfg.val_size >= len(x):
            raise ValueError(f"--val-size {cfg.val_size} leaves no training data of {len(x)}")
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
        out["val"] = (x[perm[:cfg.val_size]], y[perm[:cfg.val_size]])
        keep = perm[cfg.val_size:]
        x, y = x[keep], y[keep]
    if cfg.train_size:
        x, y = x[:cfg.train_size], y[:cfg.train_size]
    out["train"] = (x, y)
    out["test"] = (test[0][:cfg.test_size], test[1][:cfg.test_size]) if cfg.test_size else test
    out["source"] = "fashion-mnist" if use_real else "synthetic"
    return out


# ---- model and optimizer -------------------------------------------------------------------

def make_model(name: str = "cnn") -> nn.Sequential:
    """``"cnn"``: a 5x5 convolution to 8 channels and a 3x3 one to 16, both with stride 2 and
    ReLU, then a linear classifier (9.2 k parameters, 0.1 M multiply-adds an image: an epoch
    of Fashion-MNIST takes seconds on one CPU thread); ``"mlp"``: 784-128-10. No batch
    norm and no dropout: each rank's forward depends on its own batch only, so the M-rank run
    and one process agree, and a resumed run draws nothing."""
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Conv2d(1, 8, 5, stride=2, padding=2), nn.ReLU(),  # 8 x 14 x 14
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),  # 16 x 7 x 7
        nn.Flatten(), nn.Linear(16 * 7 * 7, 10))


def make_optimizer(cfg: Config, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer at ``cfg.lr`` (the scheduler scales it). Biases get no weight decay for
    every optimizer; LAMB also keeps them out of the layer-wise adaptation (the BERT recipe,
    ``exclude_from_*=None``; LAMB's defaults are Algorithm 16's, which adapts and decays every
    tensor and trained as well in ``bench/bench_optim_defaults.py``: kept here so that the
    recorded large-batch results reproduce). LARS adapts every tensor (its default): an
    excluded one would step at LARS' raw global rate, about 1/trust_coefficient times the
    per-layer one. ``clip`` clips the global gradient norm for every optimizer (LAMB inside
    its step, the others before theirs)."""
    if cfg.optimizer == "lamb":
        return LAMB(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                    max_grad_norm=cfg.clip, exclude_from_adaptation=None,
                    exclude_from_weight_decay=None)
    if cfg.optimizer == "lars":
        return LARS(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                    weight_decay=cfg.weight_decay, exclude_from_adaptation=False)
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim <= 1 else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)


# ---- distributed helpers -------------------------------------------------------------------

_PEER_SIGNS = ("connection closed by peer", "connection reset by peer", "timed out", "timeout",
               "broken pipe", "nccl", "gloo", "socket")


def _peer_failure(err: BaseException, rank: int, what: str) -> BaseException:
    """A backend's error in a collective as :class:`PeerFailureError` naming the rank and the
    step; any other error as it is (a shape error is not a dead peer)."""
    if isinstance(err, PeerFailureError):
        return err
    dist_error = getattr(dist, "DistError", ())
    text = str(err)
    if isinstance(err, dist_error) or any(s in text.lower() for s in _PEER_SIGNS):
        return PeerFailureError(f"rank {rank}: {what} failed: a peer died, hung or failed "
                                f"(process group timeout applies). Cause: {text.strip()}")
    return err


def _all_reduce_sum(t: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        dist.all_reduce(t)
    return t


def _local(t):
    """The tensor a rank holds: the local shard of a DTensor, the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int, world: int,
             sliced: bool, batch: int = 1000) -> float:
    """Accuracy in %. ``sliced``: rank r scores positions r, r+M, ... of the set (padded by
    repetition so that every rank runs the same number of forwards, which FSDP needs; padding
    is not counted) and one all-reduce adds the counts. Otherwise this rank scores its own
    replica on the whole set, with no collective."""
    n = len(x)
    if sliced and world > 1:
        per_rank = math.ceil(n / world)
        pos = torch.arange(rank, per_rank * world, world, device=x.device)
        valid = pos < n
        pos = torch.where(valid, pos, pos % n)
    else:
        pos = torch.arange(n, device=x.device)
        valid = torch.ones(n, dtype=torch.bool, device=x.device)
    counts = torch.zeros(2, dtype=torch.float64, device=x.device)
    for k in range(0, len(pos), batch):
        idx, ok = pos[k:k + batch], valid[k:k + batch]
        hit = model(x[idx]).argmax(1) == y[idx]
        counts[0] += (hit & ok).sum()
        counts[1] += ok.sum()
    if sliced:
        _all_reduce_sum(counts, world)
    return float(100.0 * counts[0] / counts[1])


# ---- checkpoints ---------------------------------------------------------------------------

def _fingerprint(cfg: Config, world: int) -> dict:
    out = {k: getattr(cfg, k) for k in _TRAJECTORY}
    out["world_size"] = world
    return out


def _save_checkpoint(root: Path, epoch: int, rank: int, world: int, state: dict) -> None:
    """Every rank writes ``epoch-E/rank-R.pt`` (through a temporary name), all wait for each
    other, then rank 0 points ``latest.json`` at the epoch and removes older ones. A crash at
    any moment leaves ``latest.json`` naming a complete checkpoint."""
    folder = root / f"epoch-{epoch:04d}"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".rank-{rank}.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(folder / f"rank-{rank}.pt")
    if world > 1:
        dist.barrier()
    if rank == 0:
        tmp = root / ".latest.json.tmp"
        tmp.write_text(json.dumps({"epoch": epoch, "step": state["step"], "world_size": world}))
        tmp.replace(root / "latest.json")
        for old in root.glob("epoch-*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint(root: Path, rank: int, world: int, cfg: Config) -> dict | None:
    latest = root / "latest.json"
    if not latest.exists():
        return None
    meta = json.loads(latest.read_text())
    if meta["world_size"] != world:
        raise ValueError(f"checkpoint {root} was written by {meta['world_size']} ranks, this run "
                         f"has {world}: resume with the same number of processes")
    state = torch.load(root / f"epoch-{meta['epoch']:04d}" / f"rank-{rank}.pt",
                       map_location="cpu", weights_only=False)
    mine, theirs = _fingerprint(cfg, world), state["fingerprint"]
    diff = {k: (theirs.get(k), v) for k, v in mine.items() if theirs.get(k) != v}
    if diff:
        raise ValueError("--resume: this run's settings differ from the checkpoint's, so it "
                         "would not continue its trajectory: "
                         + ", ".join(f"{k}: checkpoint {a!r}, now {b!r}"
                                     for k, (a, b) in diff.items()))
    return state


def _load_model_state(model: nn.Module, saved: dict) -> None:
    """Copy saved tensors into the model's (local shards into local shards under FSDP)."""
    with torch.no_grad():
        for name, target in model.state_dict().items():
            _local(target).copy_(_local(saved[name]))


# ---- the run -------------------------------------------------------------------------------

class _CSV:
    """Rank 0's CSV, appended row by row; on resume, the rows past the checkpoint are dropped
    (they belong to the part of the run that is done again)."""

    def __init__(self, path: str | None, resume_step: int | None):
        self.path = Path(path) if path else None
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = []
        if resume_step is not None and self.path.exists():
            with self.path.open(newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
        with self.path.open("w", newline="") as f:
            w = csv.DictWriter(f, CSV_COLUMNS)
            w.writeheader()
            w.writerows(rows)

    def write(self, row: dict) -> None:
        if self.path is None:
            return
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, CSV_COLUMNS).writerow(row)


def _fmt(v, digits=9):
    return "" if v is None else f"{v:.{digits}g}"


def train(cfg: Config, callback: Callable[[dict], None] | None = None,
          data: dict | None = None) -> dict:
    """Train as ``cfg`` says, in the default process group when there is one (every rank calls
    it), in this process alone otherwise. ``callback(info)`` runs after every step with
    ``info = {"rank", "step", "epoch"}`` (after that step's evaluation and checkpoint).
    ``data``: what :func:`load_data` returned for these settings, to skip reading the files
    again (a benchmark's many runs).

    Returns ``{"rows": [...], "val_acc", "test_acc", "steps", "warmup_steps", "peak_lr",
    "steps_per_epoch", "seconds", "data", "model"}`` (rows and accuracies as rank 0 sees
    them; ``model`` is the trained module, unwrapped from DDP).
    Raises :class:`gpuml.training.PeerFailureError` when another rank dies or hangs.
    """
    cfg.check()
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    cfg.check_world(world, distributed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if torch.cuda.is_available() and not cfg.cpu:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    say = (lambda *a: print(*a, flush=True)) if rank == 0 and not cfg.quiet else (lambda *a: 0)

    data = load_data(cfg) if data is None else data
    (x, y), (xt, yt) = data["train"], data["test"]
    x, y, xt, yt = x.to(device), y.to(device), xt.to(device), yt.to(device)
    val = tuple(t.to(device) for t in data["val"]) if "val" in data else None

    torch.manual_seed(cfg.seed)  # the same initial model on every rank
    model = make_model(cfg.model).to(device)
    net = model  # what the loop calls; evaluation uses `model` unless sharded
    averager = None
    if cfg.sharded:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif cfg.households:
        averager = HouseholdAverager(
            cfg.households, cfg.household_period, cfg.world_period,
            neighbourhoods=cfg.neighbourhoods, neighbourhood_period=cfg.neighbourhood_period,
            household_shards=cfg.household_shards, timeout=cfg.timeout)
    elif world > 1:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)

    inner = make_optimizer(cfg, model)
    if averager is not None:
        from torch.distributed.optim import PostLocalSGDOptimizer

        opt = PostLocalSGDOptimizer(inner, averager)
    else:
        opt = inner

    n = len(x)
    if cfg.household_shards is not None:
        sampler = averager.sampler(range(n), seed=cfg.seed)
    else:
        sampler = DataAssignmentSampler(range(n), world, rank, seed=cfg.seed, scheme=cfg.scheme,
                                        copies=cfg.copies)
    local_batch = cfg.batch_size // world
    steps_per_epoch = math.ceil(len(sampler) / local_batch)
    total = cfg.steps or cfg.epochs * steps_per_epoch
    epochs = math.ceil(total / steps_per_epoch)
    rule = None if cfg.scaling == "none" else cfg.scaling
    peak = scale_lr(cfg.lr, cfg.batch_size, cfg.base_batch_size, rule) if rule else cfg.lr
    for group in inner.param_groups:
        group["lr"] = peak
        group["initial_lr"] = peak
    warmup = min(legw_warmup_steps(cfg.warmup_epochs, cfg.batch_size, cfg.base_batch_size, n),
                 total)
    sched = WarmupPolynomialDecay(inner, warmup, total, power=cfg.decay_power)

    step, start_epoch = 0, 0
    root = Path(cfg.checkpoint) if cfg.checkpoint else None
    if cfg.resume:
        state = _load_checkpoint(root, rank, world, cfg)
        if state is None:
            say(f"--resume: no checkpoint in {root} yet, starting from step 0")
        else:
            _load_model_state(model, state["model"])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["rng"])
            step, start_epoch = state["step"], state["epoch"]
            say(f"resumed from {root} after epoch {start_epoch} (step {step})")
    table = _CSV(cfg.csv, step if cfg.resume else None) if rank == 0 else _CSV(None, None)

    say(f"{world} rank(s) on {device.type}, {data['source']} ({n} train, {len(xt)} test), "
        f"{cfg.model}, {cfg.optimizer}, global batch {cfg.batch_size} "
        f"({local_batch} per rank), {steps_per_epoch} steps/epoch, {total} steps "
        f"({warmup} warmup), peak lr {peak:.4g}, scheme {cfg.scheme} x{cfg.copies}"
        + (f", households {cfg.households}" if cfg.households else "")
        + (", sharded (FSDP2)" if cfg.sharded else ""))

    sliced = averager is None  # replicas equal (or sharded): split the evaluation over ranks
    rows = []
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    since = 0
    t0 = time.perf_counter()
    val_acc = test_acc = lr = None

    def record_row(epoch_float: float) -> None:
        nonlocal loss_sum, since, val_acc, test_acc
        stats = torch.stack([loss_sum, torch.tensor(float(since), dtype=torch.float64,
                                                    device=device)])
        _all_reduce_sum(stats, world)
        loss = float(stats[0] / stats[1]) if stats[1] else float("nan")
        loss_sum = torch.zeros_like(loss_sum)
        since = 0
        evaluator = model if (sliced or rank == 0) else None
        if evaluator is not None:
            if val is not None:
                val_acc = evaluate(evaluator, *val, rank, world, sliced)
            test_acc = evaluate(evaluator, xt, yt, rank, world, sliced)
        if rank == 0:
            row = {"step": step, "epoch": f"{epoch_float:.4f}", "loss": _fmt(loss),
                   "val_acc": _fmt(val_acc, 6), "test_acc": _fmt(test_acc, 6),
                   "lr": _fmt(lr)}
            rows.append(row)
            table.write(row)
            say(f"epoch {epoch_float:7.3f}  step {step:6d}  loss {loss:.4f}"
                + (f"  val {val_acc:.2f}%" if val_acc is not None else "")
                + f"  test {test_acc:.2f}%  lr {lr:.4g}"
                f"  ({time.perf_counter() - t0:.1f} s)")

    what = "training"
    try:
        for epoch in range(start_epoch, epochs):
            sampler.set_epoch(epoch)
            order = torch.tensor(list(sampler), dtype=torch.long, device=device)
            for k in range(steps_per_epoch):
                if step >= total:
                    break
                what = f"step {step + 1} (epoch {epoch})"
                idx = order[k * local_batch:(k + 1) * local_batch]
                opt.zero_grad(set_to_none=True)
                lr = inner.param_groups[0]["lr"]  # this step's, for the CSV
                loss = F.cross_entropy(net(x[idx]), y[idx])
                loss.backward()
                if cfg.clip and cfg.optimizer != "lamb":
                    nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
                opt.step()
                sched.step()
                step += 1
                loss_sum += loss.detach()
                since += 1
                end_of_epoch = k == steps_per_epoch - 1 or step == total
                if end_of_epoch or (cfg.eval_every and step % cfg.eval_every == 0):
                    what = f"evaluation after step {step}"
                    record_row(epoch + (k + 1) / steps_per_epoch)
                if end_of_epoch and root is not None:
                    what = f"checkpoint after epoch {epoch}"
                    state = {"fingerprint": _fingerprint(cfg, world), "step": step,
                             "epoch": epoch + 1, "model": model.state_dict(),
                             "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                             "rng": torch.get_rng_state()}
                    _save_checkpoint(root, epoch + 1, rank, world, state)
                if callback is not None:
                    callback({"rank": rank, "step": step, "epoch": epoch})
    except RuntimeError as err:
        failure = _peer_failure(err, rank, what)
        if failure is err:
            raise
        raise failure from err
    return {"rows": rows, "val_acc": val_acc, "test_acc": test_acc, "steps": step,
            "warmup_steps": warmup, "peak_lr": peak, "steps_per_epoch": steps_per_epoch,
            "seconds": time.perf_counter() - t0, "data": data["source"], "model": model}


# ---- command line --------------------------------------------------------------------------

#: How long a rank that leaves the error message to local rank 0 waits for torchrun to stop it.
_SILENT_RANK_WAIT_S = 60.0


def usage_error(message: str) -> NoReturn:
    """Report bad settings as argparse does, on one line (``train_fashion_mnist.py: error:
    ...``), and exit with status 2. Under ``torchrun`` every rank finds the same error; only
    local rank 0 prints it. The other ranks print nothing and wait (at most
    ``_SILENT_RANK_WAIT_S``) for torchrun to stop them when rank 0 exits: a rank that exited
    first would make torchrun stop rank 0 before its line is out."""
    silent = "TORCHELASTIC_RUN_ID" in os.environ and os.environ.get("LOCAL_RANK", "0") != "0"
    if silent:
        time.sleep(_SILENT_RANK_WAIT_S)
    else:
        print(f"{Path(__file__).name}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        usage_error(message)


def parse_args(argv=None) -> Config:
    defaults = Config()
    p = _Parser(prog=Path(__file__).name, description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--optimizer", choices=OPTIMIZERS, default=defaults.optimizer)
    a("--batch-size", type=int, default=defaults.batch_size, help="global batch B")
    a("--base-batch-size", type=int, default=defaults.base_batch_size,
      help="B0: the batch --lr and --warmup-epochs were tuned at")
    a("--lr", type=float, help=f"learning rate at B0 (default per optimizer: {DEFAULT_LR})")
    a("--scaling", choices=("sqrt", "linear", "none"), default=defaults.scaling,
      help="peak lr = lr * (B/B0)^(1/2) or B/B0")
    a("--warmup-epochs", type=float, default=defaults.warmup_epochs,
      help="LEGW w0: warmup epochs at B0 (w0 * B/B0 epochs at B, the same number of steps)")
    a("--decay-power", type=float, default=defaults.decay_power,
      help="after warmup the lr falls as (1 - progress)^p to 0")
    a("--weight-decay", type=float,
      help=f"default per optimizer: {DEFAULT_WEIGHT_DECAY} (never on biases)")
    a("--momentum", type=float, default=defaults.momentum, help="sgd and lars")
    a("--clip", type=float, help="clip the global gradient norm (every optimizer)")
    a("--epochs", type=int, default=defaults.epochs)
    a("--steps", type=int, help="stop after this many steps instead (the schedule ends there)")
    a("--scheme", choices=SCHEMES, default=defaults.scheme, help="data assignment (§4.1)")
    a("--copies", type=int, default=defaults.copies, help="C: ranks holding each sample")
    a("--households", type=int, help="H: local SGD in H households (§4.2)")
    a("--household-period", type=int, default=defaults.household_period, help="L_H")
    a("--neighbourhoods", type=int, help="NB (with --neighbourhood-period)")
    a("--neighbourhood-period", type=int, help="L_N")
    a("--world-period", type=int, default=defaults.world_period, help="L_W")
    a("--household-shards", type=int,
      help="S_H: household h holds household shard h mod S_H (default: disjoint)")
    a("--sharded", action="store_true", help="FSDP2 fully_shard instead of DDP")
    a("--checkpoint", metavar="DIR", help="write a checkpoint into DIR after every epoch")
    a("--resume", action="store_true", help="go on from the last checkpoint in DIR, if any")
    a("--csv", default="train_fashion_mnist.csv", help="rank 0's metrics ('' for none)")
    a("--eval-every", type=int, default=defaults.eval_every,
      help="also evaluate every N steps (0: at each epoch's end only)")
    a("--data", choices=("auto", "fashion-mnist", "synthetic"), default=defaults.data)
    a("--data-dir", default=defaults.data_dir)
    a("--train-size", type=int, help="use the first N training images (after the split)")
    a("--val-size", type=int, default=defaults.val_size,
      help="hold out N training images for validation")
    a("--test-size", type=int, help="use the first N test images")
    a("--model", choices=("cnn", "mlp"), default=defaults.model)
    a("--seed", type=int, default=defaults.seed, help="initial model and shuffling")
    a("--backend", choices=("auto", "gloo", "nccl"), default=defaults.backend,
      help="auto: nccl with CUDA, gloo otherwise")
    a("--timeout", type=float, default=defaults.timeout,
      help="seconds a collective waits for a dead or hung peer")
    a("--threads", type=int, help="torch threads per process")
    a("--deterministic", action="store_true",
      help="torch.use_deterministic_algorithms (bit-identical resumes on the CPU)")
    a("--cpu", action="store_true", help="stay on the CPU even where CUDA is available")
    a("--quiet", action="store_true")
    args = vars(p.parse_args(argv))
    args["csv"] = args["csv"] or None
    return Config(**args)


def main(argv=None, callback: Callable[[dict], None] | None = None) -> int:
    """The command line: join the process group ``torchrun`` describes in the environment
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), if any, and train.
    ``callback`` goes to :func:`train`. Returns the exit status: 1 when a peer failed.
    Bad settings, also those that depend on the number of ranks (``WORLD_SIZE``), end the
    process before it joins the group: one line on stderr, exit status 2 (:func:`usage_error`).
    """
    cfg = parse_args(argv)
    initialized = dist.is_available() and dist.is_initialized()
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ and not initialized
    if initialized:
        world = dist.get_world_size()
    elif launched:
        world = int(os.environ["WORLD_SIZE"])
    else:
        world = 1
    try:
        cfg.check()
        cfg.check_world(world, initialized or launched)
    except ValueError as err:
        usage_error(str(err))
    if launched:
        backend = cfg.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() and not cfg.cpu else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout))
    try:
        train(cfg, callback)
    except PeerFailureError as err:
        # The peers are gone or stuck: report and leave without destroy_process_group, which
        # would wait for them.
        print(f"ERROR {err}", file=sys.stderr, flush=True)
        return 1
    if launched:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
