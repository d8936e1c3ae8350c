"""Plot the large-batch LR schedules of :mod:`gpuml.optim.schedules` into docs/img.

Not a timing benchmark: it draws each schedule from the scheduler classes
themselves (so the plot shows what the code does) and writes
``docs/img/optim_schedules.png``. Run: ``python -m bench.run optim_schedules``.
"""

from __future__ import annotations

from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "optim_schedules.png"


def _trace(make, lr, steps):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def main(quick: bool = True, gpu: bool = False) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuml.optim import (
        GoyalWarmupStepDecay,
        LEGWPolynomialDecay,
        RollerCoasterDecay,
        WarmupPolynomialDecay,
        scale_lr,
    )

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    ax = axes[0, 0]
    for power in (0.5, 1.0, 2.0):
        ax.plot(_trace(lambda o, p=power: WarmupPolynomialDecay(o, 100, 1000, power=p), 1.0,
                       1000), label=f"power={power}")
    ax.set_title("WarmupPolynomialDecay (W=100, T=1000)")
    ax.legend()

    ax = axes[0, 1]
    n, epochs, b0, lr0 = 60_000, 10, 256, 0.01
    for batch in (256, 1024, 4096, 8192):
        steps = epochs * -(-n // batch)
        lrs = _trace(lambda o, b=batch: LEGWPolynomialDecay(o, 0.25, b, b0, n, epochs,
                                                            scaling="sqrt"), lr0, steps)
        ax.plot([k * epochs / steps for k in range(steps)], lrs, label=f"B={batch}")
    ax.set_title("LEGW + sqrt scaling (w0=0.25 epoch at B0=256)")
    ax.set_xlabel("epoch")
    ax.legend()

    ax = axes[1, 0]
    peak = scale_lr(1.25e-3, 8192, 1024, "sqrt")
    for q in (1.0, 2.0):
        ax.plot(_trace(lambda o, q=q: RollerCoasterDecay(o, 117, 220, warmup_power=q), peak,
                       230), label=f"warmup (t/W)^{q:g}")
    ax.set_yscale("log")
    ax.set_title("RollerCoasterDecay (You et al. 2019 §3.6 example, floor 1e-6)")
    ax.legend()

    ax = axes[1, 1]
    k = 32
    ax.plot(_trace(lambda o: GoyalWarmupStepDecay(o, 5, [30, 60, 80], start_factor=1 / k),
                   0.1 * k, 90))
    ax.set_yscale("log")
    ax.set_title("Goyal: warmup 0.1 to 3.2 (k=32), x0.1 at 30/60/80")
    ax.set_xlabel("epoch")
    for a in axes.flat:
        a.set_ylabel("lr")
        a.grid(alpha=0.3)
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=90)
    plt.close(fig)
    print(f"wrote {OUT}")
    return OUT


if __name__ == "__main__":
    main()
