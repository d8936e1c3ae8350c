"""CPU step time of LAMB and LARS against timm's Lamb/Lars and torch's AdamW, side by side.

ResNet-50's parameter shapes (161 tensors, 25.6 M parameters, generated from the
architecture in :func:`bench.bench_optim.resnet50_shapes`), fp32 on the CPU. In one
process, on the same tensors, interleaved rounds (every variant once per round), the
median of the rounds after warm-up steps (so numba's compilation of the fused CPU path,
and its loading from the disk cache, fall outside: they are timed apart, as
``first_step_ms``).

Variants: ours with the default path, the for-loop (``foreach=False``), ``foreach=True``
and ``fused=True``; timm's ``Lamb`` and ``Lars`` with their default path (the
single-tensor one on CPU); ``torch.optim.AdamW(foreach=True)`` and
``torch.optim.AdamW(fused=True)``. Every variant gets the same hyperparameters: LAMB and
timm Lamb lr=1e-3 with their defaults otherwise (weight decay 0.01, global clipping at
1.0), LARS and timm Lars lr=1.0, momentum 0.9, weight decay 1e-4, AdamW lr=1e-3. Ratios
are step time over ``AdamW(foreach=True)``'s and over timm's.

timm: ``from timm.optim import Lamb, Lars`` imports timm's package, whose model zoo needs
torchvision; the two optimizer modules need only torch, so when the package import fails
they are loaded alone from the installed files (:func:`timm_optimizers`). Without timm
installed (``pip install --no-deps timm``) its columns are left out, with a message.

Run: ``python -m bench.run optim_cpu [--quick]`` (quick: one thread; full: one and two).
"""

from __future__ import annotations

import importlib
import importlib.util
import statistics
import sys
import time
import types
from pathlib import Path

import torch

from bench._harness import record
from bench.bench_optim import make_params, numel, resnet50_shapes

LAMB_KW = dict(lr=1e-3)
LARS_KW = dict(lr=1.0, momentum=0.9, weight_decay=1e-4)


def timm_optimizers():
    """timm's ``(Lamb, Lars)`` classes; ImportError saying why when timm is not usable.

    Tries ``timm.optim`` first. timm's ``__init__`` imports its models, which need
    torchvision; ``timm/optim/lamb.py`` and ``lars.py`` need only torch and two helper
    modules of their own folder, so they are then loaded under a stand-in package whose
    path is that folder (nothing of timm's package ``__init__`` runs).
    """
    try:
        from timm.optim import Lamb, Lars
        return Lamb, Lars
    except ImportError as e:
        reason = e
    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("timm is not installed (pip install --no-deps timm)") from reason
    folder = Path(list(spec.submodule_search_locations)[0]) / "optim"
    name = "_gpuml_bench_timm_optim"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    try:
        lamb = importlib.import_module(f"{name}.lamb")
        lars = importlib.import_module(f"{name}.lars")
    except ImportError as e:
        raise ImportError(f"timm's optimizers could not be loaded: {e} "
                          f"(the package import failed first: {reason})") from e
    return lamb.Lamb, lars.Lars


def variants() -> tuple[list[tuple[str, str, object]], str]:
    """``(optimizer, path, make)`` for every variant, and a note on what is missing."""
    from gpuml.optim import LAMB, LARS

    paths = {"default": {}, "loop": dict(foreach=False), "foreach": dict(foreach=True),
             "fused": dict(fused=True)}
    out = []
    for path, kw in paths.items():
        out.append(("LAMB", path, lambda ps, kw=kw: LAMB(ps, **LAMB_KW, **kw)))
        out.append(("LARS", path, lambda ps, kw=kw: LARS(ps, **LARS_KW, **kw)))
    note = ""
    try:
        Lamb, Lars = timm_optimizers()
        out.append(("timm Lamb", "default", lambda ps: Lamb(ps, **LAMB_KW)))
        out.append(("timm Lars", "default", lambda ps: Lars(ps, **LARS_KW)))
    except ImportError as e:
        note = f"timm columns left out: {e}. "
        print(f"bench_optim_cpu: {note}")
    out.append(("AdamW", "foreach", lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True)))
    out.append(("AdamW", "fused", lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)))
    return out, note


def _bench(shapes, threads: int, rounds: int, warmup: int) -> tuple[list[dict], str]:
    torch.set_num_threads(threads)
    params = make_params(shapes, "cpu")
    saved = [p.detach().clone() for p in params]
    made, note = variants()
    opts, first = {}, {}
    for opt_name, path, make in made:
        try:
            opt = make(params)
            t0 = time.perf_counter()
            opt.step()
            first[(opt_name, path)] = time.perf_counter() - t0
        except (RuntimeError, TypeError, ValueError) as e:  # a path this build lacks
            note += f"{opt_name} {path}: not available ({str(e).splitlines()[0]}). "
            print(f"bench_optim_cpu: {opt_name} {path} not available: {e}")
            continue
        opts[(opt_name, path)] = opt
    for _ in range(warmup):
        for opt in opts.values():
            opt.step()
    times: dict[tuple[str, str], list[float]] = {k: [] for k in opts}
    for _ in range(rounds):
        for key, opt in opts.items():
            t0 = time.perf_counter()
            opt.step()
            times[key].append(time.perf_counter() - t0)
            # the same parameters for every variant: steps of the others must not drift
            # them far (LARS lr=1.0 moves weights by ~1e-3 relative per step)
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
    med = {k: statistics.median(v) for k, v in times.items()}
    adamw = med.get(("AdamW", "foreach"))
    rows = []
    for (opt_name, path), t in med.items():
        row = {"threads": threads, "optimizer": opt_name, "path": path,
               "step_ms": t * 1e3, "min_ms": min(times[(opt_name, path)]) * 1e3,
               "first_step_ms": first[(opt_name, path)] * 1e3,
               "vs_adamw_foreach": t / adamw if adamw else float("nan")}
        base = {"LAMB": ("timm Lamb", "default"), "LARS": ("timm Lars", "default")}.get(opt_name)
        row["vs_timm"] = t / med[base] if base in med else ""
        row["vs_adamw_fused"] = t / med[("AdamW", "fused")] if ("AdamW", "fused") in med else ""
        rows.append(row)
    return rows, note


def main(quick: bool = True, gpu: bool = False) -> None:
    if gpu:
        print("bench_optim_cpu: a CPU benchmark; --gpu ignored")
    torch.manual_seed(0)
    shapes = resnet50_shapes()
    threads_before = torch.get_num_threads()
    rows, notes = [], set()
    try:
        for threads in ((1,) if quick else (1, 2)):
            r, note = _bench(shapes, threads, rounds=5 if quick else 9, warmup=2)
            rows += r
            notes.add(note)
    finally:
        torch.set_num_threads(threads_before)
    text = (f"ResNet-50 shapes: {len(shapes)} tensors, {numel(shapes) / 1e6:.2f} M fp32 "
            "parameters. step_ms: median of interleaved rounds after 2 warm-up steps (min_ms: "
            "the fastest round); first_step_ms: the first step of a fresh optimizer (state "
            "creation; for the fused path also numba's load from its disk cache, or its "
            "compilation when the cache is cold). vs_adamw_foreach / vs_timm / vs_adamw_fused: "
            "step time over that variant's, in the same rounds. Same hyperparameters for ours "
            "and timm's (LAMB lr 1e-3, wd 0.01, clipping 1.0; LARS lr 1.0, momentum 0.9, wd "
            "1e-4). The machine was shared with other jobs: read the ratios. "
            + " ".join(n for n in notes if n))
    record("optim_cpu", rows, title="LAMB / LARS CPU step time vs timm and torch AdamW",
           notes=text, command="python -m bench.run optim_cpu" + (" --quick" if quick else ""))


if __name__ == "__main__":
    main()
