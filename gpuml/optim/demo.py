"""A short optimizer demo: ``python -m gpuml.optim.demo`` (also part of ``make demo``).

Trains the same small MLP on scikit-learn's digits (1,797 real images) at a
large batch for its size, under LEGW warmup with sqrt learning-rate scaling
from a batch-32 baseline, with gpuml's LAMB and LARS and with
``torch.optim.AdamW`` beside them. LAMB runs the fused Triton path on a GPU
and the multi-tensor path on a CPU. A few seconds on a CPU.
"""

from __future__ import annotations

import time

import torch

from gpuml.optim import LAMB, LARS, LEGWPolynomialDecay, param_groups_by_name

BATCH, BASE_BATCH, EPOCHS = 512, 32, 30


def _digits(device):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, test_size=0.3,
                                                        random_state=0, stratify=y)
    as_x = lambda a: torch.tensor(a, dtype=torch.float32, device=device)  # noqa: E731
    as_y = lambda a: torch.tensor(a, device=device)  # noqa: E731
    return as_x(X_train), as_y(y_train), as_x(X_test), as_y(y_test)


def _train(make, X, y, X_test, y_test):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.LayerNorm(256), torch.nn.Linear(256, 10)).to(X.device)
    opt = make(model)
    sched = LEGWPolynomialDecay(opt, base_warmup_epochs=0.5, batch_size=BATCH,
                                base_batch_size=BASE_BATCH, dataset_size=len(X), epochs=EPOCHS,
                                scaling="sqrt")
    t0 = time.perf_counter()
    for _ in range(EPOCHS):
        for idx in torch.randperm(len(X), device=X.device).split(BATCH):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
            opt.step()
            sched.step()
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        accuracy = float((model(X_test).argmax(1) == y_test).float().mean())
    return accuracy, seconds


#: (name, optimizer factory) with the base rate tuned at batch 32; LEGW scales it by sqrt(16).
OPTIMIZERS = [
    ("gpuml.optim.LAMB", lambda m: LAMB(param_groups_by_name(m), lr=2e-3, weight_decay=0.01)),
    # every tensor adapted: an excluded tensor would step with LARS's large global rate
    ("gpuml.optim.LARS", lambda m: LARS(m.parameters(), lr=1.0, momentum=0.9,
                                        weight_decay=1e-4, exclude_from_adaptation=False)),
    ("torch.optim.AdamW", lambda m: torch.optim.AdamW(m.parameters(), lr=2e-3,
                                                      weight_decay=0.01)),
]


def rows() -> list[dict]:
    """One row per optimizer: test accuracy and training seconds on digits."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = _digits(device)
    out = []
    for name, make in OPTIMIZERS:
        accuracy, seconds = _train(make, *data)
        out.append({"optimizer": name, "device": device,
                    "setting": f"digits MLP, batch {BATCH}, {EPOCHS} epochs, LEGW + sqrt",
                    "test_accuracy": round(accuracy, 4), "seconds": round(seconds, 2)})
    return out


def main() -> None:
    for row in rows():
        print(row)


if __name__ == "__main__":
    main()
