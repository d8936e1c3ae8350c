"""Large-batch convergence in small: an MLP on Fashion-MNIST at batch sizes 64 ... 8192.

The paper's claim (You 2020 Table 6.5): with LEGW warmup and sqrt LR scaling,
LAMB tuned once at a small batch keeps its accuracy at large batches for a
fixed number of epochs. The experiment, in order:

1. Split the 60k training images into 50k train / 10k validation (fixed split,
   independent of the training seed). The test set is used only for the final
   numbers, never for a choice.
2. At batch 64 only, choose each optimizer's base learning rate by a grid
   (at its default weight decay; extended when the best value lies on its
   edge), then its weight decay among three values at that learning rate, by
   validation accuracy (one seed).
3. Apply LEGW (warmup *iterations* fixed: ``w0`` epochs at batch 64, i.e.
   ``w0 * B / 64`` epochs at batch ``B``; You 2020 ch. 6, You et al. 2019 §3.1) and
   sqrt scaling (``lr = lr64 * sqrt(B / 64)``, You et al. 2019 §3.3) unchanged to every
   larger batch, with linear decay to 0 (``eta0 * (1 - t/T)``, You 2020 §6.4),
   and train every (optimizer, batch) with several seeds.

Biases are excluded from weight decay for every optimizer, and from the
layer-wise adaptation for LAMB (the BERT recipe, LAMB's default). LARS adapts
every tensor: an excluded tensor would step with LARS' raw global rate (about
1000x the per-layer rate), see :class:`gpuml.optim.LARS`.

Data: Debian package ``dataset-fashion-mnist`` (files under
``/usr/share/datasets/fashion-mnist/``); the benchmark says so and returns when
it is missing. Run: ``python -m bench.run optim_convergence [--quick]`` (the
quick run writes ``*_quick`` result files and no plot).
"""

from __future__ import annotations

import gzip
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from bench._harness import record

DATA = Path("/usr/share/datasets/fashion-mnist")
IMG = Path(__file__).resolve().parent.parent / "docs" / "img" / "optim_convergence.png"
BASE_BATCH = 64
BASE_WARMUP_EPOCHS = 0.02  # w0 at batch 64: 16 warmup steps at every batch size
VAL_SIZE = 10_000
SPLIT_SEED = 2019
EPOCHS = 20
BATCHES = (64, 256, 1024, 2048, 4096, 8192)
SEEDS = (0, 1)
# Per optimizer: the base-lr grid (at batch 64) and the weight decays, default first.
GRID = {
    "LAMB": ((1e-3, 3e-3, 1e-2, 3e-2), (0.01, 0.0, 0.1)),
    "AdamW": ((3e-4, 1e-3, 3e-3, 1e-2), (0.01, 0.0, 0.1)),
    "SGD-momentum": ((0.01, 0.03, 0.1, 0.3), (5e-4, 0.0, 5e-3)),
    "LARS": ((0.3, 1.0, 3.0, 10.0), (5e-4, 0.0, 5e-3)),
}
TARGET_DROP = 1.0


def load(split: str):
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(DATA / f"{prefix}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(DATA / f"{prefix}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = torch.tensor(x, dtype=torch.float32) / 255.0
    return (x - 0.2860) / 0.3530, torch.tensor(y, dtype=torch.int64)


def splits():
    """``{"train", "val", "test"}`` -> (x, y); train/val carved from the training set."""
    x, y = load("train")
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, train = perm[:VAL_SIZE], perm[VAL_SIZE:]
    return {"train": (x[train], y[train]), "val": (x[val], y[val]), "test": load("test")}


def make_optimizer(name: str, model: torch.nn.Module, lr: float, weight_decay: float):
    """``name`` at peak rate ``lr``; biases get no weight decay (and no adaptation in LAMB).
    LAMB: the BERT recipe (global clipping at 1.0, 1-D tensors excluded), LAMB's defaults
    when the recorded results were measured, pinned here so that they reproduce."""
    from gpuml.optim import LAMB, LARS, param_groups_by_name

    if name == "LAMB":
        return LAMB(model.parameters(), lr=lr, weight_decay=weight_decay, max_grad_norm=1.0,
                    exclude_from_adaptation=None, exclude_from_weight_decay=None)
    if name == "LARS":
        return LARS(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay,
                    exclude_from_adaptation=False)
    groups = param_groups_by_name(model, weight_decay=weight_decay)
    for g in groups:
        if g["exclude_from_weight_decay"]:
            g["weight_decay"] = 0.0
    if name == "AdamW":
        return torch.optim.AdamW(groups, lr=lr)
    if name == "SGD-momentum":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    raise ValueError(f"unknown optimizer {name!r}")


def train(name: str, lr64: float, weight_decay: float, batch: int, epochs: int, data,
          seed: int) -> dict:
    """One run: LEGW + sqrt scaling from ``lr64``; validation and test accuracy (%) at the end."""
    from gpuml.optim import LEGWPolynomialDecay

    xtr, ytr = data["train"]
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    opt = make_optimizer(name, model, lr64, weight_decay)
    sched = LEGWPolynomialDecay(opt, BASE_WARMUP_EPOCHS, batch, BASE_BATCH, len(xtr), epochs,
                                scaling="sqrt")
    loss_fn = torch.nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    steps = 0
    for _ in range(epochs):
        perm = torch.randperm(len(xtr))
        for k in range(0, len(xtr), batch):
            idx = perm[k:k + batch]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
            sched.step()
            steps += 1
    assert steps == sched.total_steps, (steps, sched.total_steps)
    out = {"steps": steps, "warmup": sched.warmup_steps, "peak_lr": sched.base_lrs[0],
           "train_s": time.perf_counter() - t0}
    with torch.no_grad():
        for split in ("val", "test"):
            x, y = data[split]
            out[split] = float((model(x).argmax(1) == y).float().mean()) * 100
    return out


def tune(name: str, epochs: int, data, quick: bool, runs: dict) -> tuple[float, float, list]:
    """Base lr, then weight decay, at batch 64 by validation accuracy (seed 0)."""
    lrs, wds = GRID[name]
    if quick:
        lrs, wds = lrs[1:3], wds[:1]

    def run(lr, wd):
        key = (name, lr, wd, BASE_BATCH, SEEDS[0])
        if key not in runs:
            runs[key] = train(name, lr, wd, BASE_BATCH, epochs, data, SEEDS[0])
            print({"tune": name, "lr": lr, "wd": wd, "val": runs[key]["val"]}, flush=True)
        return runs[key]["val"]

    lrs = list(lrs)
    lr = max(lrs, key=lambda lr: run(lr, wds[0]))
    # A best lr on the edge of the grid: extend the grid that way (same ratio), at most twice.
    for _ in range(0 if quick else 2):
        if lr not in (lrs[0], lrs[-1]):
            break
        new = lr * lrs[1] / lrs[0] if lr == lrs[-1] else lr * lrs[0] / lrs[1]
        lrs = sorted(lrs + [new])
        lr = max(lrs, key=lambda lr: run(lr, wds[0]))
    wd = max(wds, key=lambda wd: run(lr, wd))
    grid = [{"optimizer": name, "lr_at_b64": k[1], "weight_decay": k[2], "val_acc_%": r["val"],
             "chosen": (k[1], k[2]) == (lr, wd)}
            for k, r in runs.items() if k[0] == name]
    return lr, wd, grid


def _spread(values):
    return statistics.stdev(values) if len(values) > 1 else 0.0


def main(quick: bool = True, gpu: bool = False) -> None:
    if not DATA.exists():
        print(f"bench_optim_convergence: {DATA} missing (apt-get install dataset-fashion-mnist); "
              "skipped")
        return
    # One thread: the model is tiny, and on a shared 2-core machine a second OpenMP thread only
    # adds contention.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    data = splits()
    batches = (64, 1024, 8192) if quick else BATCHES
    seeds = SEEDS[:1] if quick else SEEDS
    epochs = 2 if quick else EPOCHS
    names = tuple(GRID)
    runs: dict = {}
    rows, grid_rows, acc = [], [], {}
    for name in names:
        lr, wd, grid = tune(name, epochs, data, quick, runs)
        grid_rows += grid
        for b in batches:
            res = []
            for s in seeds:
                key = (name, lr, wd, b, s)
                if key not in runs:
                    runs[key] = train(name, lr, wd, b, epochs, data, s)
                res.append(runs[key])
            acc[name, b] = [r["test"] for r in res]
            test = statistics.fmean(acc[name, b])
            rows.append({"optimizer": name, "batch": b, "steps": res[0]["steps"],
                         "warmup_steps": res[0]["warmup"], "peak_lr": res[0]["peak_lr"],
                         "weight_decay": wd,
                         "val_acc_%": statistics.fmean(r["val"] for r in res),
                         "test_acc_%": test, "test_std": _spread(acc[name, b]),
                         "drop_vs_b64": statistics.fmean(acc[name, batches[0]]) - test,
                         "train_s": statistics.fmean(r["train_s"] for r in res)})
            print(rows[-1], flush=True)
    torch.set_num_threads(threads)
    minutes = (time.perf_counter() - t_start) / 60
    lamb_drops = {r["batch"]: r["drop_vs_b64"] for r in rows if r["optimizer"] == "LAMB"}
    ok = [b for b in batches if lamb_drops[b] <= TARGET_DROP]
    worst = max(lamb_drops, key=lamb_drops.get)
    verdict = ("met" if len(ok) == len(batches) else
               f"missed: largest drop {lamb_drops[worst]:.2f} points at batch {worst}")
    chosen = ", ".join(f"{r['optimizer']} lr {r['lr_at_b64']:g} wd {r['weight_decay']:g}"
                       for r in grid_rows if r["chosen"])
    notes = (f"MLP 784-128-10 on a 50k/10k train/validation split of the training set, "
             f"{epochs} epochs at every batch size (steps = epochs x ceil(50000/B)), test "
             f"accuracy on the 10k test set, mean and standard deviation over seeds "
             f"{list(seeds)}. Hyper-parameters chosen at batch 64 only, by validation accuracy "
             f"(table `optim_convergence_grid`): {chosen}. Every larger batch uses them "
             f"unchanged with LEGW (w0 = {BASE_WARMUP_EPOCHS} epoch at B0 = {BASE_BATCH}: the "
             f"same warmup steps at every batch) + sqrt LR scaling (peak_lr) + linear decay to 0. "
             f"Target from the issue: LAMB within {TARGET_DROP:g} point of its batch-64 accuracy "
             f"up to batch 8192: {verdict}. One torch thread; whole run (tuning included) "
             f"{minutes:.1f} min wall on the shared 2-core machine (other jobs running, so "
             "train_s is noisy).")
    suffix = "_quick" if quick else ""
    record("optim_convergence_grid" + suffix, grid_rows, gpu=False,
           title="Large-batch convergence: tuning at batch 64 (validation accuracy, seed 0)",
           notes=f"{epochs} epochs at batch 64, LEGW warmup + linear decay; lr grid at the "
           "default weight decay, then the weight decays at the best lr.")
    record("optim_convergence" + suffix, rows, gpu=False,
           title="Large-batch convergence, Fashion-MNIST", notes=notes)
    if not quick:
        plot(names, batches, acc, epochs, len(seeds))


def plot(names, batches, acc, epochs: int, n_seeds: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name in names:
        ax.errorbar(batches, [statistics.fmean(acc[name, b]) for b in batches],
                    yerr=[_spread(acc[name, b]) for b in batches], marker="o", capsize=3,
                    label=name)
    ax.axhline(statistics.fmean(acc["LAMB", batches[0]]) - TARGET_DROP, color="grey", ls="--",
               lw=1, label=f"LAMB batch-64 - {TARGET_DROP:g} point")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"Fashion-MNIST MLP, {epochs} epochs, LEGW + sqrt scaling "
                 f"(mean ± sd, {n_seeds} seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    IMG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
