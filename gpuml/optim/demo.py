"""A short optimizer demo: ``python -m gpuml.optim.demo``.

Fits a small MLP to a synthetic regression task with LAMB (fused on a GPU, the
multi-tensor path on CPU) under LEGW warmup with sqrt LR scaling, and LARS for
comparison, and prints the loss before and after. Runs in a few seconds on CPU.
"""

from __future__ import annotations

import time

import torch

from gpuml.optim import LAMB, LARS, LEGWPolynomialDecay, param_groups_by_name


def _run(name: str, make, x, y, batch: int, epochs: int) -> tuple[float, float, float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 1)).to(x.device)
    opt = make(model)
    sched = LEGWPolynomialDecay(opt, base_warmup_epochs=0.1, batch_size=batch,
                                base_batch_size=64, dataset_size=len(x), epochs=epochs,
                                scaling="sqrt")
    loss_fn = torch.nn.MSELoss()
    with torch.no_grad():
        first = float(loss_fn(model(x), y))
    t0 = time.perf_counter()
    for _ in range(epochs):
        perm = torch.randperm(len(x), device=x.device)
        for k in range(0, len(x), batch):
            idx = perm[k:k + batch]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
            sched.step()
    with torch.no_grad():
        last = float(loss_fn(model(x), y))
    return first, last, time.perf_counter() - t0


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=gen)
    y = (torch.sin(x[:, :4]).sum(1, keepdim=True) + 0.1 * torch.randn(4096, 1, generator=gen))
    x, y = x.to(device), y.to(device)
    path = "fused Triton" if device == "cuda" else "foreach"
    print(f"gpuml.optim demo on {device} ({path} path), batch 512, LEGW + sqrt scaling")
    # LARS: every tensor gets the trust ratio here; a tensor excluded from adaptation would
    # step with the raw global rate, which for LARS is large (lr * trust_coefficient is the
    # per-layer scale).
    for name, make in [
        ("LAMB", lambda m: LAMB(param_groups_by_name(m), lr=2e-3, weight_decay=0.01)),
        ("LARS", lambda m: LARS(m.parameters(), lr=1.0, weight_decay=1e-4,
                                exclude_from_adaptation=False)),
    ]:
        first, last, secs = _run(name, make, x, y, batch=512, epochs=10)
        print(f"  {name}: mse {first:.3f} -> {last:.3f} in {secs:.1f}s")


if __name__ == "__main__":
    main()
