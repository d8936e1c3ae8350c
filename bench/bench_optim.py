"""Step time of LAMB and LARS on the parameter shapes of BERT-large and ResNet-50.

The shapes are generated from the architectures (no downloads): BERT-large
(24 layers, hidden 1024, vocab 30522: 391 tensors, ~335 M parameters) and
ResNet-50 (bottlenecks [3, 4, 6, 3]: 161 tensors, ~25.6 M parameters).

CPU: the for-loop reference against the multi-tensor (foreach) path, with
``torch.optim.AdamW(foreach=True)`` for scale; ``--quick`` uses ResNet-50 and
two BERT-large encoder layers. GPU (``--gpu``): loop, foreach, fused (Triton),
``torch.optim.AdamW(fused=True)`` and a device copy of the bytes the fused LAMB
step moves (44 B/param fp32 with global clipping, see gpuml/optim/_triton.py),
all in one process; the copy gives the bandwidth reference.

Run: ``python -m bench.run optim [--quick] [--gpu]``.
"""

from __future__ import annotations

import torch

from bench._harness import record, timeit

LAMB_BYTES_PER_PARAM = 44
LARS_BYTES_PER_PARAM = 28


def resnet50_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of torchvision's ResNet-50, from the architecture."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for width, blocks in zip((64, 128, 256, 512), (3, 4, 6, 3)):
        for b in range(blocks):
            out = width * 4
            shapes += [(width, inplanes, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (out, width, 1, 1), (out,), (out,)]
            if b == 0:
                shapes += [(out, inplanes, 1, 1), (out,), (out,)]
            inplanes = out
    shapes += [(1000, 2048), (1000,)]
    return shapes


def bert_large_shapes(layers: int = 24, hidden: int = 1024, vocab: int = 30522,
                      positions: int = 512, ffn: int = 4096,
                      word_embeddings: bool = True) -> list[tuple[int, ...]]:
    """Parameter shapes of BERT-large (embeddings, encoder layers, pooler)."""
    h = hidden
    shapes: list[tuple[int, ...]] = [(vocab, h)] if word_embeddings else []
    shapes += [(positions, h), (2, h), (h,), (h,)]
    for _ in range(layers):
        shapes += [(h, h), (h,)] * 4 + [(h,), (h,)]
        shapes += [(ffn, h), (ffn,), (h, ffn), (h,), (h,), (h,)]
    shapes += [(h, h), (h,)]
    return shapes


def numel(shapes) -> int:
    """Number of parameters in tensors of these shapes."""
    n = 0
    for s in shapes:
        k = 1
        for d in s:
            k *= d
        n += k
    return n


def make_params(shapes, device):
    """fp32 parameters of these shapes with gradients (seeded: every call gives the same)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(device)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(device) * 1e-2
    return params


def variants(gpu: bool, **options):
    """``(optimizer, path, make)`` for LAMB and LARS on each path, and torch's AdamW.

    ``make(params)`` builds the optimizer with this benchmark's settings: LAMB
    lr=1e-3 (defaults otherwise: max_grad_norm=1.0), LARS lr=1.0 and
    weight_decay=1e-4, AdamW lr=1e-3 (fused on the GPU, foreach on the CPU).
    ``options`` go to LAMB and LARS only (for instance ``master_weights=True``).
    """
    from gpuml.optim import LAMB, LARS

    impls = {"loop": dict(foreach=False), "foreach": dict(foreach=True)}
    if gpu:
        impls["fused"] = dict(fused=True)
    out = []
    for name, kw in impls.items():
        kw = {**kw, **options}
        # global clipping pinned on: the step the recorded timings measured (44 B/param)
        out.append(("LAMB", name, lambda ps, kw=kw: LAMB(ps, lr=1e-3, max_grad_norm=1.0,
                                                         **kw)))
        out.append(("LARS", name, lambda ps, kw=kw: LARS(ps, lr=1.0, weight_decay=1e-4,
                                                          **kw)))
    adamw = dict(fused=True) if gpu else dict(foreach=True)
    out.append(("AdamW (torch)", "fused" if gpu else "foreach",
                lambda ps: torch.optim.AdamW(ps, lr=1e-3, **adamw)))
    return out


def _bench_model(model: str, shapes, gpu: bool, quick: bool) -> list[dict]:
    device = "cuda" if gpu else "cpu"
    sync = torch.cuda.synchronize if gpu else None
    n = numel(shapes)
    params = make_params(shapes, device)
    rounds = 3 if quick else 5
    # Interleaved rounds (every variant once per round, best round kept), so that load from
    # other processes on a shared machine hits all variants alike.
    opts = {(opt_name, impl): make(params) for opt_name, impl, make in variants(gpu)}
    for key, opt in opts.items():
        timeit(opt.step, repeat=1, warmup=2 if key[1] == "fused" else 0, sync=sync)
    times: dict[tuple[str, str], float] = {k: float("inf") for k in opts}
    for _ in range(rounds):
        for key, opt in opts.items():
            times[key] = min(times[key], timeit(opt.step, repeat=1, sync=sync))
    del opts
    rows = []
    copy_time = None
    if gpu:
        src = torch.empty(n * LAMB_BYTES_PER_PARAM // 2, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        copy_time = timeit(lambda: dst.copy_(src), repeat=rounds, warmup=2, sync=sync)
        del src, dst
    for (opt_name, impl), t in times.items():
        row = {"model": model, "tensors": len(shapes), "params_M": n / 1e6,
               "optimizer": opt_name, "path": impl, "step_ms": t * 1e3}
        loop = times.get((opt_name, "loop"))
        if loop is not None:
            row["speedup_vs_loop"] = loop / t
        if gpu:
            row["vs_adamw_fused"] = t / times[("AdamW (torch)", "fused")]
            bytes_moved = {"LAMB": LAMB_BYTES_PER_PARAM, "LARS": LARS_BYTES_PER_PARAM}.get(
                opt_name)
            if bytes_moved and impl == "fused":
                row["GB_per_s"] = n * bytes_moved / t / 1e9
                row["frac_of_copy_bw"] = (n * bytes_moved / t) / (
                    n * LAMB_BYTES_PER_PARAM / copy_time)
        rows.append(row)
    if gpu:
        rows.append({"model": model, "tensors": len(shapes), "params_M": n / 1e6,
                     "optimizer": "device copy", "path": f"{LAMB_BYTES_PER_PARAM} B/param",
                     "step_ms": copy_time * 1e3,
                     "GB_per_s": n * LAMB_BYTES_PER_PARAM / copy_time / 1e9})
    del params
    return rows


def main(quick: bool = True, gpu: bool = False) -> None:
    torch.manual_seed(0)
    if gpu and not torch.cuda.is_available():
        print("bench_optim: --gpu asked but no CUDA device; running the CPU variant")
        gpu = False
    if gpu or not quick:
        models = [("ResNet-50", resnet50_shapes()), ("BERT-large", bert_large_shapes())]
    else:
        models = [("ResNet-50", resnet50_shapes()),
                  ("BERT-large: 2 layers, no word emb.",
                   bert_large_shapes(layers=2, word_embeddings=False))]
    threads = torch.get_num_threads()
    if not gpu:
        # One thread: on a shared machine a second OpenMP thread mostly adds contention, and
        # the loop-vs-foreach comparison is about per-tensor overheads, not threading.
        torch.set_num_threads(1)
    rows = []
    for name, shapes in models:
        rows += _bench_model(name, shapes, gpu, quick)
    torch.set_num_threads(threads)
    notes = ("Best of interleaved rounds on the same tensors; ratios are what to read on shared "
             "machines. speedup_vs_loop: loop step time / this step time. ")
    if gpu:
        notes += ("frac_of_copy_bw: (bytes the fused step moves / its time) / (bandwidth of a "
                  "device copy of 44 B/param). vs_adamw_fused: step time / "
                  "torch.optim.AdamW(fused=True) step time.")
    else:
        notes += ("CPU, one thread (torch.set_num_threads(1)): the fused Triton path needs a "
                  "GPU and is not timed here.")
    record("optim_step", rows, gpu=gpu, title="LAMB / LARS step time", notes=notes,
           command="python -m bench.run optim" + (" --quick" if quick else "")
           + (" --gpu" if gpu else ""))


if __name__ == "__main__":
    main()
