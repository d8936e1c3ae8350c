"""Which LAMB and LARS defaults train best where the papers leave the choice open.

Yang You, *Fast and Accurate Machine Learning on Distributed Systems and Supercomputers*,
PhD thesis, UC Berkeley, 2020, Algorithm 16 (LAMB) gives every layer the same update (weight
decay and the trust ratio) and clips no gradient; the BERT recipe that apex and timm follow
clips the global gradient norm at 1.0 and keeps biases and norm weights (``ndim <= 1``) out
of the weight decay and, for LAMB, out of the trust ratio. The thesis is silent on whether
those changes help, so this benchmark measures them:

* **LAMB**: global clipping at 1.0 or none, times 1-D tensors excluded (adaptation and
  decay) or treated as every other layer (Alg 16), at one learning rate (the one
  ``bench_large_batch`` tuned at B0 for LAMB without clipping; the thesis tunes only the
  learning rate, §6.5).
* **LARS**: how tensors with ``ndim <= 1`` step at LARS' default ``lr=1.0``: excluded from
  adaptation (they take plain momentum-SGD steps at the global rate, ~1/trust_coefficient
  times the per-layer one), adapted like every layer but kept out of weight decay, adapted
  and decayed (apex's LARC, timm), or excluded and given their own group at ``lr *
  trust_coefficient`` (the per-layer scale, by hand).

Two tasks, the same for every variant (same data, initialisations and seeds, LEGW warmup +
sqrt learning-rate scaling + linear decay, as ``bench_large_batch``):

* ``fashion-cnn``: the small CNN of ``examples/train_fashion_mnist.py`` (biases only, no norm
  layer), 20,000 Fashion-MNIST training images, 5 epochs, batches 32 (B0), 256 and 1024,
  seeds 0 and 1; accuracy on 5,000 held-out training images (validation) and on the 10,000
  test images.
* ``digits-mlp``: a 64-256-10 MLP with a LayerNorm (whose bias starts at
  zero), scikit-learn's digits, batch 512 from B0 = 32, 30 epochs, seeds 0-2.

Writes ``bench/results/<machine>/optim_defaults.{json,md}``. ``python -m bench.run
optim_defaults`` (its run time: bench/results/cpu-2core/optim-runs.md; ``--quick``: 1,024
images, one epoch, batches 32 and 256, one seed). Without Fashion-MNIST (Debian package
``dataset-fashion-mnist``) the CNN task runs on the example's synthetic stand-in and the
record says so.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
BASE_BATCH, WARMUP_EPOCHS = 32, 0.05
FULL = {"train_size": 20_000, "val_size": 5_000, "test_size": None, "epochs": 5,
        "batches": (32, 256, 1024), "seeds": (0, 1), "digits_seeds": (0, 1, 2)}
QUICK = {"train_size": 1024, "val_size": 512, "test_size": 1000, "epochs": 1,
         "batches": (32, 256), "seeds": (0,), "digits_seeds": (0,)}
LAMB_LR, LARS_LR = 0.01, 1.0
LAMB_WD, LARS_WD = 0.01, 5e-4


def _lamb(clip, exclude):
    from gpuml.optim import LAMB

    def make(model, lr):
        return LAMB(model.parameters(), lr=lr, weight_decay=LAMB_WD, max_grad_norm=clip,
                    exclude_from_adaptation=exclude, exclude_from_weight_decay=exclude)
    return make


def _lars(exclude_adapt, exclude_decay, scaled=False):
    from gpuml.optim import LARS

    def make(model, lr):
        kw = dict(momentum=0.9, weight_decay=LARS_WD, trust_coefficient=1e-3)
        if scaled:
            big = [p for p in model.parameters() if p.ndim > 1]
            small = [p for p in model.parameters() if p.ndim <= 1]
            return LARS([{"params": big},
                         {"params": small, "lr": lr * kw["trust_coefficient"],
                          "exclude_from_adaptation": True, "exclude_from_weight_decay": True}],
                        lr=lr, **kw)
        return LARS(model.parameters(), lr=lr, exclude_from_adaptation=exclude_adapt,
                    exclude_from_weight_decay=exclude_decay, **kw)
    return make


#: (optimizer, variant label, factory, lr0)
VARIANTS = [
    ("LAMB", "clip 1.0, 1-D excluded (BERT recipe; old default)", _lamb(1.0, None), LAMB_LR),
    ("LAMB", "clip 1.0, every tensor adapted and decayed", _lamb(1.0, False), LAMB_LR),
    ("LAMB", "no clip, 1-D excluded", _lamb(None, None), LAMB_LR),
    ("LAMB", "no clip, every tensor adapted and decayed (Alg 16)", _lamb(None, False), LAMB_LR),
    ("LARS", "1-D excluded from adaptation and decay (old default)", _lars(None, None),
     LARS_LR),
    ("LARS", "1-D adapted, not decayed", _lars(False, None), LARS_LR),
    ("LARS", "every tensor adapted and decayed (LARC, timm)", _lars(False, False), LARS_LR),
    ("LARS", "1-D excluded, own group at lr * trust_coefficient", _lars(None, None, True),
     LARS_LR),
]


def _fit(model, make, lr0, x, y, batch, epochs, seed):
    """LEGW warmup (w0 epochs at B0), peak lr0 * sqrt(B / B0), linear decay to 0."""
    import torch
    import torch.nn.functional as F

    from gpuml.optim import WarmupPolynomialDecay, legw_warmup_steps, scale_lr

    peak = scale_lr(lr0, batch, BASE_BATCH, "sqrt")
    opt = make(model, peak)
    for group in opt.param_groups:  # a group's own lr (the scaled variant) keeps its ratio
        group["initial_lr"] = group["lr"]
    steps_per_epoch = math.ceil(len(x) / batch)
    total = epochs * steps_per_epoch
    warmup = min(legw_warmup_steps(WARMUP_EPOCHS, batch, BASE_BATCH, len(x)), total)
    sched = WarmupPolynomialDecay(opt, warmup, total)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(batch):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            sched.step()
    return model


def _accuracy(model, x, y) -> float:
    import torch

    with torch.no_grad():
        hits = sum(int((model(x[k:k + 2000]).argmax(1) == y[k:k + 2000]).sum())
                   for k in range(0, len(x), 2000))
    return 100.0 * hits / len(x)


def fashion_cnn(sizes) -> tuple[list[dict], str]:
    import torch

    from examples.train_fashion_mnist import Config, load_data, make_model

    real = (DATA_DIR / "train-images-idx3-ubyte.gz").exists()
    cfg = Config(data="fashion-mnist" if real else "synthetic", data_dir=str(DATA_DIR),
                 train_size=sizes["train_size"], val_size=sizes["val_size"],
                 test_size=sizes["test_size"])
    data = load_data(cfg)
    (x, y), val, test = data["train"], data["val"], data["test"]
    rows = []
    for opt_name, label, make, lr0 in VARIANTS:
        for batch in sizes["batches"]:
            vals, tests, seconds = [], [], []
            for seed in sizes["seeds"]:
                torch.manual_seed(seed)
                model = make_model("cnn")
                t0 = time.perf_counter()
                _fit(model, make, lr0, x, y, batch, sizes["epochs"], seed)
                seconds.append(time.perf_counter() - t0)
                vals.append(_accuracy(model, *val))
                tests.append(_accuracy(model, *test))
            rows.append({"task": "fashion-cnn", "optimizer": opt_name, "variant": label,
                         "batch": batch, "lr0": lr0, "val_acc_%": statistics.fmean(vals),
                         "test_acc_%": statistics.fmean(tests),
                         "test_per_seed": " / ".join(f"{a:.2f}" for a in tests),
                         "train_s": statistics.fmean(seconds)})
            print(rows[-1], flush=True)
    return rows, data["source"]


def digits_mlp(seeds) -> list[dict]:
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, test_size=0.3,
                                                        random_state=0, stratify=y)
    x, xt = (torch.tensor(a, dtype=torch.float32) for a in (X_train, X_test))
    y, yt = torch.tensor(y_train), torch.tensor(y_test)
    rows = []
    for opt_name, label, make, lr0 in VARIANTS:
        tests = []
        for seed in seeds:
            torch.manual_seed(seed)
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                        torch.nn.LayerNorm(256), torch.nn.Linear(256, 10))
            _fit(model, make, lr0 if opt_name == "LARS" else 2e-3, x, y, 512, 30, seed)
            tests.append(_accuracy(model, xt, yt))
        rows.append({"task": "digits-mlp", "optimizer": opt_name, "variant": label,
                     "batch": 512, "lr0": lr0 if opt_name == "LARS" else 2e-3,
                     "val_acc_%": "", "test_acc_%": statistics.fmean(tests),
                     "test_per_seed": " / ".join(f"{a:.2f}" for a in tests), "train_s": ""})
        print(rows[-1], flush=True)
    return rows


def main(quick: bool = True, gpu: bool = False) -> list[dict]:
    import torch

    from bench._harness import record

    torch.set_num_threads(1)
    sizes = QUICK if quick else FULL
    t0 = time.perf_counter()
    rows, source = fashion_cnn(sizes)
    rows += digits_mlp(sizes["digits_seeds"])
    minutes = (time.perf_counter() - t0) / 60
    src = ("Fashion-MNIST" if source == "fashion-mnist" else
           "SYNTHETIC stand-in (Fashion-MNIST absent)")
    notes = (f"fashion-cnn: {src}, {sizes['train_size']} training images, "
             f"{sizes['val_size']} validation, {sizes['epochs']} epochs, seeds "
             f"{list(sizes['seeds'])}; digits-mlp: batch 512, 30 epochs, seeds "
             f"{list(sizes['digits_seeds'])} (LAMB at lr0 2e-3 there). LEGW warmup "
             f"w0 = {WARMUP_EPOCHS} epoch at B0 = {BASE_BATCH}, sqrt scaling, linear decay. "
             f"LAMB weight decay {LAMB_WD}, LARS {LARS_WD}, momentum 0.9, trust coefficient "
             f"1e-3. One torch thread; {minutes:.1f} min wall on a machine shared with other "
             "jobs.")
    record("optim_defaults_quick" if quick else "optim_defaults", rows,
           title="LAMB and LARS: the defaults the papers leave open, measured", notes=notes)
    return rows


if __name__ == "__main__":
    main(quick=False)
