"""Large-batch training in small, and the data assignment schemes, with the runnable example.

Part 1, the claim of Yang You, *Fast and Accurate Machine Learning on Distributed Systems and
Supercomputers*, PhD thesis, UC Berkeley, 2020, Tables 6.2-6.4: as the global batch grows
8x, 16x and 32x past a base batch B0, LAMB with sqrt learning-rate scaling and LEGW warmup
(Yang You et al., *Large-Batch Training for LSTM and Beyond*, SC 2019, §3.1 and §3.3) keeps
the base accuracy where AdamW and momentum SGD with the same schedule lose it. The small CNN
of ``examples/train_fashion_mnist.py`` on a subset of Fashion-MNIST, trained by the example's
``train`` in this one process: for the synchronous schemes with one copy the global batch of
M ranks is exactly the batch of one process (the example's docstring says why), so one
process stands for any number of ranks.

What makes the comparison fair (the same for the three optimizers):

* the same model, initialisations (seeds), training subset and validation split, and the
  same number of epochs at every batch size, hence 32x fewer steps at 32x the batch, as in
  the thesis;
* the same schedule family: LEGW warmup of ``w0`` epochs at B0 (the same number of warmup
  steps at every batch), peak rate ``lr0 * sqrt(B / B0)``, linear decay to 0 at the last step;
* the same tuning budget: one grid of 4 learning rates, about 3x apart, per optimizer, at B0
  only, seed 0, chosen by accuracy on 5,000 images held out of the training set (the test set
  is scored once, after training, for the reported numbers, and never used for a choice);
  weight decay not tuned but fixed at each optimizer's usual value (LAMB 0.01, AdamW 0.01,
  SGD 5e-4; never on biases), momentum 0.9, no gradient clipping for any of them;
* every larger batch reuses the tuned ``lr0`` through the rule unchanged: nothing is tuned
  per batch size.

Part 2, the data assignment schemes of André Håland, Bjørnar Birkeland, *Exploring data
assignment schemes when training deep neural networks using data parallelism*, MSc thesis,
NTNU, 2020, §4.1: the example's ``train`` in 4 gloo processes launched by ``torchrun``,
LAMB at its tuned rate, global batch 256 (64 a rank), the same number of steps for disjoint
(C = 1) and coarse, medium-coarse and fine (C = 2), each writing the example's CSV. The four
runs share one launch (the worker at the bottom of this file joins the group once and calls
``train`` per scheme, as the example's ``main`` does for one): starting 4 Python processes
that import torch costs more than the training itself on a small CPU machine.

Writes ``bench/results/<machine>/large_batch{,_grid,_schemes}.{json,md}``,
``docs/img/large_batch.png`` and ``docs/img/schemes_accuracy.png``. Run:
``python -m bench.run large_batch`` (its run time: bench/results/cpu-2core/training-runs.md).
``--quick`` (the test suite's run, most of it starting 2 processes that import torch and
gpuml): 1,024 images, 1 epoch, batches B0 and 8 B0, 2
learning rates, 2 ranks for 2 schemes, ``*_quick`` records and the plots next to them (in
``$GPUML_BENCH_OUT`` or the temporary folder), never in ``docs/``. Fashion-MNIST is the
Debian package ``dataset-fashion-mnist``; without it the benchmark says so and runs on the
example's synthetic stand-in, and the records say which data they come from.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
#: Where Fashion-MNIST's files are (the example's default; a test points it elsewhere).
DATA_DIR = Path("/usr/share/datasets/fashion-mnist")

BASE_BATCH = 32
MULTIPLES = (1, 8, 16, 32)  # B0, 8x, 16x, 32x: batches 32, 256, 512, 1024
EPOCHS = 5
TRAIN_SIZE, VAL_SIZE = 20_000, 5_000
#: w0 at B0: round(0.05 * 20000 / 32) = 31 warmup steps at every batch
WARMUP_EPOCHS = 0.05
SEEDS = (0, 1)
OPTIMIZERS = ("lamb", "adamw", "sgd")
LABEL = {"lamb": "LAMB", "adamw": "AdamW", "sgd": "SGD-momentum"}
#: Four learning rates at B0 per optimizer, about 3x apart, centred where each optimizer's
#: usual rate lies (the same number of values and the same span for all three).
GRID = {"lamb": (1e-3, 3e-3, 1e-2, 3e-2),
        "adamw": (3e-4, 1e-3, 3e-3, 1e-2),
        "sgd": (0.01, 0.03, 0.1, 0.3)}
WEIGHT_DECAY = {"lamb": 0.01, "adamw": 0.01, "sgd": 5e-4}
#: "keeps the base accuracy": within this many points of its own mean test accuracy at B0
KEEP = 1.0
#: The quick run: a smoke test of every step of the full one, in seconds.
QUICK = {"train_size": 1024, "val_size": 512, "test_size": 1000, "epochs": 1,
         "multiples": (1, 8), "seeds": (0,)}

# Part 2: the schemes, one launch of SCHEME_RANKS processes.
SCHEMES = (("disjoint", 1), ("coarse", 2), ("medium_coarse", 2), ("fine", 2))
SCHEME_RANKS, SCHEME_BATCH, SCHEME_STEPS, SCHEME_EVAL = 4, 256, 240, 20
QUICK_SCHEMES = (("disjoint", 1), ("fine", 2))
QUICK_RANKS, QUICK_BATCH, QUICK_STEPS, QUICK_EVAL = 2, 64, 8, 4


def _have_fashion_mnist(data_dir: Path) -> bool:
    return all((data_dir / f"{p}-{k}-idx{d}-ubyte.gz").exists()
               for p in ("train", "t10k") for k, d in (("images", 3), ("labels", 1)))


def load(quick: bool) -> dict:
    """The example's data set for the benchmark, read once: Fashion-MNIST when the package is
    there (saying so when it is not), else the example's synthetic stand-in."""
    from examples.train_fashion_mnist import Config, load_data

    real = _have_fashion_mnist(DATA_DIR)
    if not real:
        print(f"bench_large_batch: Fashion-MNIST is absent ({DATA_DIR}; Debian package "
              "dataset-fashion-mnist): running on the example's synthetic stand-in, whose "
              "numbers say nothing about Fashion-MNIST", flush=True)
    sizes = QUICK if quick else {"train_size": TRAIN_SIZE, "val_size": VAL_SIZE,
                                 "test_size": None}
    cfg = Config(data="fashion-mnist" if real else "synthetic", data_dir=str(DATA_DIR),
                 train_size=sizes["train_size"], val_size=sizes["val_size"],
                 test_size=sizes["test_size"])
    data = load_data(cfg)
    data["sizes"] = sizes
    return data


class Runs:
    """Every training run of part 1, once each: (optimizer, lr0, batch, seed) -> result."""

    def __init__(self, data: dict, epochs: int):
        self.data, self.epochs = data, epochs
        # train() evaluates its "test" set at every epoch's end: hand it the validation set,
        # so that the runs never see the test set and the choice of lr0 can use what
        # train() reports; the test set is scored once, on the trained model.
        self.train_data = {"train": data["train"], "test": data["val"], "source": data["source"]}
        self.results: dict = {}

    def config(self, name: str, lr: float, batch: int, seed: int):
        from examples.train_fashion_mnist import Config

        return Config(optimizer=name, lr=lr, weight_decay=WEIGHT_DECAY[name], batch_size=batch,
                      base_batch_size=BASE_BATCH, scaling="sqrt", warmup_epochs=WARMUP_EPOCHS,
                      epochs=self.epochs, seed=seed, csv=None, quiet=True, threads=1, cpu=True)

    def __call__(self, name: str, lr: float, batch: int, seed: int) -> dict:
        from examples.train_fashion_mnist import evaluate, train

        key = (name, lr, batch, seed)
        if key not in self.results:
            r = train(self.config(name, lr, batch, seed), data=self.train_data)
            test_acc = evaluate(r["model"], *self.data["test"], 0, 1, False)
            self.results[key] = {"val_acc": r["test_acc"], "test_acc": test_acc,
                                 "steps": r["steps"], "warmup_steps": r["warmup_steps"],
                                 "peak_lr": r["peak_lr"], "seconds": r["seconds"]}
            print({"optimizer": name, "lr0": lr, "batch": batch, "seed": seed,
                   "val": round(r["test_acc"], 2), "test": round(test_acc, 2),
                   "steps": r["steps"], "s": round(r["seconds"], 1)}, flush=True)
        return self.results[key]


def _sd(values) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def large_batch(data: dict, quick: bool) -> dict:
    """Part 1: tune lr0 at B0, then every optimizer at every batch with every seed."""
    from bench._harness import record

    epochs = QUICK["epochs"] if quick else EPOCHS
    batches = [m * BASE_BATCH for m in (QUICK["multiples"] if quick else MULTIPLES)]
    seeds = QUICK["seeds"] if quick else SEEDS
    grid = {k: v[1:3] for k, v in GRID.items()} if quick else GRID
    runs = Runs(data, epochs)
    t0 = time.perf_counter()

    grid_rows, chosen = [], {}
    for name in OPTIMIZERS:
        vals = {lr: runs(name, lr, BASE_BATCH, seeds[0])["val_acc"] for lr in grid[name]}
        chosen[name] = max(vals, key=vals.get)
        for lr, v in vals.items():
            grid_rows.append({"optimizer": LABEL[name], "lr_at_B0": lr, "val_acc_%": v,
                              "chosen": lr == chosen[name]})
    rows, acc = [], {}
    for name in OPTIMIZERS:
        for b in batches:
            res = [runs(name, chosen[name], b, s) for s in seeds]
            acc[name, b] = [r["test_acc"] for r in res]
            mean = statistics.fmean(acc[name, b])
            rows.append({"optimizer": LABEL[name], "batch": b, "x_B0": b // BASE_BATCH,
                         "steps": res[0]["steps"], "warmup_steps": res[0]["warmup_steps"],
                         "lr0": chosen[name], "peak_lr": res[0]["peak_lr"],
                         "val_acc_%": statistics.fmean(r["val_acc"] for r in res),
                         "test_acc_%": mean, "test_sd": _sd(acc[name, b]),
                         "test_per_seed": " / ".join(f"{a:.2f}" for a in acc[name, b]),
                         "drop_vs_B0": statistics.fmean(acc[name, batches[0]]) - mean,
                         "train_s": statistics.fmean(r["seconds"] for r in res)})
    minutes = (time.perf_counter() - t0) / 60
    verdict = []
    for name in OPTIMIZERS:
        drops = {r["batch"]: r["drop_vs_B0"] for r in rows if r["optimizer"] == LABEL[name]}
        kept = [b for b in batches[1:] if drops[b] <= KEEP]
        verdict.append(f"{LABEL[name]} keeps its B0 accuracy (drop <= {KEEP:g} point) at "
                       f"{'batches ' + ', '.join(map(str, kept)) if kept else 'no larger batch'}"
                       f" (drop at {batches[-1]}: {drops[batches[-1]]:.2f})")
    edges = [LABEL[n] for n in OPTIMIZERS if chosen[n] in (grid[n][0], grid[n][-1])]
    sizes = data["sizes"]
    source = ("Fashion-MNIST" if data["source"] == "fashion-mnist" else
              "SYNTHETIC stand-in (Fashion-MNIST absent)")
    notes = (f"Data: {source}, {len(data['train'][0]):,} training images, "
             f"{sizes['val_size']:,} validation images held out of the training set, "
             f"{len(data['test'][0]):,} test images. Model: the example's small CNN (9.2 k "
             f"parameters), one process, one torch thread, {epochs} epochs at every batch. "
             f"lr0 tuned at B0 = {BASE_BATCH} per optimizer over {len(grid['lamb'])} values "
             f"by validation accuracy, seed {seeds[0]} (`large_batch_grid`): "
             + ", ".join(f"{LABEL[n]} {chosen[n]:g}" for n in OPTIMIZERS)
             + (f" (on the edge of its grid: {', '.join(edges)})" if edges else "")
             + f". Weight decay fixed, not on biases: {WEIGHT_DECAY}; momentum 0.9; no "
             f"clipping. Schedule for all: LEGW warmup (w0 = {WARMUP_EPOCHS} epoch at B0, the "
             f"same warmup steps at every batch), peak lr = lr0 * sqrt(B/B0), linear decay to 0. "
             f"Test accuracy mean (and sd) over seeds {list(seeds)}; drop_vs_B0 is from the "
             f"optimizer's own B0 mean. " + "; ".join(verdict)
             + f". Part 1 took {minutes:.1f} min wall on a shared 2-core machine.")
    suffix = "_quick" if quick else ""
    record("large_batch_grid" + suffix, grid_rows,
           title="Large batch: learning-rate tuning at the base batch (validation accuracy)",
           notes=f"{source}; {epochs} epochs at B0 = {BASE_BATCH}, seed {seeds[0]}, LEGW "
           "warmup + linear decay; the same number of values for every optimizer.")
    record("large_batch" + suffix, rows, title=f"Large batch in small: LAMB, AdamW and momentum "
           f"SGD from batch {batches[0]} to {batches[-1]}, LEGW + sqrt scaling", notes=notes)
    return {"batches": batches, "acc": acc, "epochs": epochs, "seeds": seeds,
            "chosen": chosen, "rows": rows, "grid_rows": grid_rows, "source": data["source"]}


def plot_large_batch(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches, acc = res["batches"], res["acc"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    styles = {"lamb": ("C0", "o"), "adamw": ("C1", "s"), "sgd": ("C2", "^")}
    for name, (color, marker) in styles.items():
        means = [statistics.fmean(acc[name, b]) for b in batches]
        sds = [_sd(acc[name, b]) for b in batches]
        axes[0].errorbar(batches, means, yerr=sds, color=color, marker=marker, capsize=3,
                         label=f"{LABEL[name]} (lr0 {res['chosen'][name]:g})")
        axes[1].plot(batches, [means[0] - m for m in means], color=color, marker=marker,
                     label=LABEL[name])
    axes[1].axhline(KEEP, color="grey", ls="--", lw=1, label=f"{KEEP:g} point")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [f"{b}\n({b // BASE_BATCH}x)" for b in batches])
        ax.set_xlabel("global batch size")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("final test accuracy (%)")
    axes[1].set_ylabel(f"drop from its own batch-{BASE_BATCH} accuracy (points)")
    data = "Fashion-MNIST" if res["source"] == "fashion-mnist" else "SYNTHETIC data"
    fig.suptitle(f"{data}, small CNN, {res['epochs']} epochs at every batch; LEGW warmup + "
                 f"sqrt scaling from B0 = {BASE_BATCH}, lr0 tuned at B0 (mean ± sd, "
                 f"{len(res['seeds'])} seeds)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scheme_argv(scheme: str, copies: int, lr0: float, quick: bool, source: str,
                csv_path: Path) -> list[str]:
    """The example's command line for one scheme (what ``torchrun ... train_fashion_mnist.py``
    would be given)."""
    batch, steps, every = ((QUICK_BATCH, QUICK_STEPS, QUICK_EVAL) if quick else
                           (SCHEME_BATCH, SCHEME_STEPS, SCHEME_EVAL))
    sizes = QUICK if quick else {"train_size": TRAIN_SIZE, "val_size": VAL_SIZE,
                                 "test_size": None}
    argv = ["--data", source, "--data-dir", str(DATA_DIR), "--train-size",
            str(sizes["train_size"]), "--val-size", str(sizes["val_size"]),
            "--optimizer", "lamb", "--lr", repr(lr0), "--weight-decay",
            repr(WEIGHT_DECAY["lamb"]), "--batch-size", str(batch), "--base-batch-size",
            str(BASE_BATCH), "--warmup-epochs", str(WARMUP_EPOCHS), "--steps", str(steps),
            "--eval-every", str(every), "--scheme", scheme, "--copies", str(copies),
            "--threads", "1", "--cpu", "--quiet", "--timeout", "120", "--csv", str(csv_path)]
    if sizes["test_size"]:
        argv += ["--test-size", str(sizes["test_size"])]
    return argv


def schemes(quick: bool, lr0: float, source: str) -> dict:
    """Part 2: one ``torchrun`` of this file's worker, which trains every scheme in turn;
    the CSVs the example wrote, as ``{label: rows}``."""
    from bench._harness import record

    plan = QUICK_SCHEMES if quick else SCHEMES
    ranks = QUICK_RANKS if quick else SCHEME_RANKS
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                                         if os.environ.get("PYTHONPATH") else [])))
    curves, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="gpuml-schemes-") as tmp:
        jobs = []
        for scheme, copies in plan:
            path = Path(tmp) / f"{scheme}.csv"
            jobs.append({"label": f"{scheme} (C={copies})", "csv": str(path),
                         "argv": scheme_argv(scheme, copies, lr0, quick, source, path)})
        (Path(tmp) / "jobs.json").write_text(json.dumps(jobs))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
               str(Path(__file__).resolve()), "--schemes-worker", str(Path(tmp) / "jobs.json")]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True,
                             timeout=900)
        wall = time.perf_counter() - t0
        if out.returncode:
            raise RuntimeError(f"torchrun of the schemes failed ({out.returncode}):\n"
                               f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        seconds = json.loads((Path(tmp) / "seconds.json").read_text())
        for job in jobs:
            with open(job["csv"], newline="") as f:
                table = list(csv.DictReader(f))
            curves[job["label"]] = table
            last = table[-1]
            rows.append({"scheme": job["label"], "steps": int(last["step"]),
                         "epochs_of_assignment": float(last["epoch"]),
                         "final_loss": float(last["loss"]), "val_acc_%": float(last["val_acc"]),
                         "test_acc_%": float(last["test_acc"]),
                         "best_test_acc_%": max(float(r["test_acc"]) for r in table),
                         "train_s": seconds[job["label"]]})
    batch, steps = (QUICK_BATCH, QUICK_STEPS) if quick else (SCHEME_BATCH, SCHEME_STEPS)
    data = "Fashion-MNIST" if source == "fashion-mnist" else "SYNTHETIC stand-in"
    record("large_batch_schemes" + ("_quick" if quick else ""), rows,
           title=f"Data assignment schemes: {ranks} gloo ranks, the example's CSVs",
           notes=f"examples/train_fashion_mnist.py's train() in {ranks} CPU processes "
           f"(torchrun, gloo, DDP), {data} (the training subset and validation split of part "
           f"1), LAMB at lr0 {lr0:g} tuned at B0 = {BASE_BATCH}, global batch {batch} "
           f"({batch // ranks} a rank) with sqrt scaling and LEGW warmup, {steps} steps for "
           "every scheme, seed 0. epochs_of_assignment counts passes over each rank's "
           "assignment, which holds C times the data of a disjoint one: the same steps "
           "process the same number of samples, but see fewer distinct ones per pass. "
           f"One launch for all, {wall:.0f} s wall including the start of the processes.")
    return curves


def plot_schemes(curves: dict, ranks: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for label, table in curves.items():
        steps = [int(r["step"]) for r in table]
        axes[0].plot(steps, [float(r["test_acc"]) for r in table], marker=".", label=label)
        axes[1].plot(steps, [float(r["loss"]) for r in table], marker=".", label=label)
    axes[0].set_ylabel("test accuracy (%)")
    axes[1].set_ylabel("training loss (mean since the previous point)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    lo = min(float(r["test_acc"]) for t in curves.values() for r in t[len(t) // 4:])
    axes[0].set_ylim(max(lo - 2, 0), None)
    fig.suptitle(f"Data assignment schemes (Håland & Birkeland 2020), {ranks} gloo ranks, "
                 "synchronous DDP, LAMB, the example's CSVs", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(quick: bool = True, gpu: bool = False) -> dict:
    from bench._harness import OUT_ENV

    data = load(quick)
    res = large_batch(data, quick)
    curves = schemes(quick, res["chosen"]["lamb"], data["source"])
    if quick:  # a smoke run: its plots go beside its records, never into docs/
        img = Path(os.environ.get(OUT_ENV) or tempfile.gettempdir())
        names = ("large_batch_quick.png", "schemes_accuracy_quick.png")
    else:
        img, names = IMG, ("large_batch.png", "schemes_accuracy.png")
    plot_large_batch(res, img / names[0])
    plot_schemes(curves, QUICK_RANKS if quick else SCHEME_RANKS, img / names[1])
    print(f"plots: {img / names[0]}, {img / names[1]}", flush=True)
    return {"large_batch": res, "schemes": curves, "plots": [img / n for n in names]}


def _schemes_worker(jobs_file: str) -> int:
    """One rank of part 2 under ``torchrun``: join the gloo group once, then train each job's
    command line with the example's ``train`` (data read once), as its ``main`` would."""
    from datetime import timedelta

    import torch.distributed as dist

    from examples.train_fashion_mnist import load_data, parse_args, train

    jobs = json.loads(Path(jobs_file).read_text())
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    data, seconds = None, {}
    for job in jobs:
        cfg = parse_args(job["argv"])
        data = data or load_data(cfg)  # every job has the same data settings
        seconds[job["label"]] = train(cfg, data=data)["seconds"]
    if dist.get_rank() == 0:
        (Path(jobs_file).parent / "seconds.json").write_text(json.dumps(seconds))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--schemes-worker":
        sys.path.insert(0, str(ROOT))
        code = _schemes_worker(sys.argv[2])
        # Leave without the interpreter's teardown: torch's C++ threads can still be running
        # as its static objects are destroyed, and the rank then aborts ("terminate called
        # without an active exception", SIGABRT) after its work is done and the group is
        # destroyed (bench/results/cpu-2core/training-runs.md).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    main(quick="--quick" in sys.argv)
