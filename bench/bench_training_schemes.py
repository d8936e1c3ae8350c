"""Draw the data assignment schemes of :class:`gpuml.training.DataAssignmentSampler`.

Not a timing benchmark: for M = 4 workers, C = 2 copies and N = 20 samples (the example of
Håland & Birkeland, *Exploring data assignment schemes when training deep neural networks
using data parallelism*, 2020, Figures 4.2 and 4.3) it asks the sampler which samples each
worker holds and writes ``docs/img/training_schemes.png``. Run:
``python -m bench.run training_schemes``.
"""

from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "training_schemes.png"


def main(quick: bool = True, gpu: bool = False) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    from gpuml.training import DataAssignmentSampler

    m, n = 4, 20
    panels = [("disjoint", 1, "disjoint (C = 1)"),
              ("coarse", 2, "coarse (C = 2: S = 2 shards)"),
              ("medium_coarse", 2, "medium-coarse (C = 2)"),
              ("fine", 2, "fine-grained (C = 2)")]
    # Rows: samples grouped by DistributedSampler's shard (sample s is in shard s mod M when
    # nothing is shuffled), so that shards read as blocks, as in the thesis's figures.
    order = sorted(range(n), key=lambda s: (s % m, s))
    colours = ListedColormap(["#f2f2f2", "#4e79a7", "#f28e2b", "#59a14f", "#e15759"])
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 4.6), sharey=True)
    for ax, (scheme, copies, title) in zip(axes, panels):
        held = np.zeros((n, m), dtype=int)
        for worker in range(m):
            sampler = DataAssignmentSampler(range(n), m, worker, shuffle=False, seed=3,
                                            scheme=scheme, copies=copies)
            for s in sampler:
                held[order.index(s), worker] = s % m + 1
        ax.imshow(held, cmap=colours, vmin=0, vmax=m, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(m), [f"w{k}" for k in range(m)])
        ax.set_yticks(range(n), [str(s) for s in order], fontsize=7)
        ax.set_xticks(np.arange(-0.5, m), minor=True)
        ax.set_yticks(np.arange(-0.5, n), minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="minor", length=0)
        for k in range(1, m):
            ax.axhline(k * n // m - 0.5, color="black", linewidth=0.8)
        counts = (held > 0).sum(axis=0)
        ax.set_title(f"{title}\n{counts[0]} samples per worker", fontsize=10)
        ax.set_xlabel("worker")
    axes[0].set_ylabel("sample, grouped and coloured by shard")
    fig.suptitle("Which worker holds which sample: M = 4 workers, N = 20 samples "
                 "(DataAssignmentSampler, shuffle=False)", fontsize=11)
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110)
    plt.close(fig)
    print(f"wrote {OUT}")
    return OUT
