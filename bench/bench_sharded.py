"""Full training step of FSDP2 + LAMB against FSDP2 + AdamW and DDP + LAMB, 2 gloo ranks.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) each rank holds a slice of every tensor,
and LAMB's trust ratios need the norms of the full tensors: ``gpuml.optim.LAMB`` sums the
per-tensor partial squared norms of all param groups over the ranks in one all-reduce per
step (and one scalar all-reduce more for the global gradient norm when it clips, as
``torch.nn.utils.clip_grad_norm_`` costs AdamW). This benchmark measures what that costs in
a whole training step (forward, backward with FSDP2's all-gathers and reduce-scatters,
optimizer step) against ``torch.optim.AdamW`` on the same sharded model, with DDP + LAMB
(where LAMB sees plain tensors and adds no collective) beside them.

Two processes on the CPU (gloo, one thread each), all setups side by side in one run: each
round times every setup once, in turn, so that the load of the shared machine falls on all of
them alike; each figure is the median over the rounds of the slower rank's time for a few
steps. The collectives are counted in an untimed step with a dispatch mode that sees every
``c10d`` operation: those of ``opt.step()`` (the optimizer's own) and those of the whole step.

Run: ``python -m bench.run sharded [--quick]``.
"""

from __future__ import annotations

import os
import queue
import statistics
import time
import traceback
from datetime import timedelta

from bench._harness import record

#: (name, wrapper, optimizer, clip): clip is LAMB's own max_grad_norm, or
#: torch.nn.utils.clip_grad_norm_ before AdamW's step.
SETUPS = [
    ("FSDP2 + AdamW", "fsdp", "adamw", False),
    ("FSDP2 + LAMB", "fsdp", "lamb", False),
    ("FSDP2 + AdamW, clip_grad_norm_", "fsdp", "adamw", True),
    ("FSDP2 + LAMB, max_grad_norm", "fsdp", "lamb", True),
    ("DDP + AdamW", "ddp", "adamw", False),
    ("DDP + LAMB", "ddp", "lamb", False),
]
WORLD = 2


def _sizes(quick: bool) -> dict:
    if quick:
        return dict(width=128, depth=3, batch=32, rounds=2, steps=1)
    # ~6.3 M parameters in 12 tensors; 256 samples per rank and step
    return dict(width=1024, depth=6, batch=256, rounds=15, steps=3)


def _model(width: int, depth: int):
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


class _Counter:
    """Counts the collectives dispatched while active (name, elements)."""

    def __new__(cls):
        from torch.distributed.tensor import DTensor
        from torch.utils._python_dispatch import TorchDispatchMode

        class Counter(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.seen = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if any(issubclass(t, DTensor) for t in types):
                    return NotImplemented  # DTensor desugars it; its collectives come back
                name = str(func)
                if name.startswith(("c10d.", "_c10d_functional.")) and not (
                        "wait_tensor" in name or "wrap_tensor" in name):
                    first = args[0] if args else None
                    ts = first if isinstance(first, (list, tuple)) else [first]
                    self.seen.append((name.split(".")[1],
                                      sum(t.numel() for t in ts if hasattr(t, "numel"))))
                return func(*args, **(kwargs or {}))

        return Counter()


def _setup(spec, sizes, mesh):
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from gpuml.optim import LAMB

    _, how, opt_name, clip = spec
    model = _model(sizes["width"], sizes["depth"])
    if how == "fsdp":
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        params = model.parameters()
    else:
        model = DistributedDataParallel(model)
        params = model.module.parameters()
    if opt_name == "lamb":
        # LAMB's own clipping (its default); off: the trust ratios' all-reduce alone
        opt = LAMB(params, lr=1e-3, weight_decay=0.01, max_grad_norm=1.0 if clip else None)
        clip = False
    else:
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=True)
    return model, opt, clip


def _step(model, opt, clip, x, y, counter=None):
    import torch

    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if counter is None:
        opt.step()
        return 0
    before = len(counter.seen)
    opt.step()
    return before


def _worker(rank, port, quick, q):
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        torch.set_num_threads(1)  # 2 ranks on a 2-core machine
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD, timeout=timedelta(seconds=120))
        mesh = init_device_mesh("cpu", (WORLD,))
        sizes = _sizes(quick)
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(sizes["batch"], sizes["width"], generator=g)
        y = torch.randint(0, 10, (sizes["batch"],), generator=g)
        setups = [_setup(spec, sizes, mesh) for spec in SETUPS]
        counts = []
        for model, opt, clip in setups:
            _step(model, opt, clip, x, y)  # warm up: state created, first-call costs paid
            counter = _Counter()
            with counter:
                start = _step(model, opt, clip, x, y, counter)
            counts.append((counter.seen[start:], counter.seen[:start]))
        times = [[] for _ in setups]
        for _ in range(sizes["rounds"]):
            for k, (model, opt, clip) in enumerate(setups):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(sizes["steps"]):
                    _step(model, opt, clip, x, y)
                dt = torch.tensor([(time.perf_counter() - t0) / sizes["steps"]])
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the slower rank's time
                times[k].append(float(dt))
        n_params = sum(p.numel() for p in setups[0][0].parameters())
        q.put(("result", rank, times, counts, n_params))
        dist.destroy_process_group()
    except BaseException:
        q.put(("error", rank, traceback.format_exc()))
        raise


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(quick: bool, deadline_s: float = 900.0):
    """Launch the 2 ranks; rank 0's ``(times, counts, n_params)`` (bounded in time)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, quick, q), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()
    end = time.monotonic() + deadline_s
    messages = []
    try:
        while len(messages) < WORLD and time.monotonic() < end:
            try:
                messages.append(q.get(timeout=0.5))
            except queue.Empty:
                if not all(p.is_alive() for p in procs) and q.empty():
                    time.sleep(1.0)
                    if q.empty():
                        break
    finally:
        for p in procs:
            p.join(max(0.0, min(10.0, end - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join(5)
    errors = [m[2] for m in messages if m[0] == "error"]
    if errors:
        raise RuntimeError("a rank failed:\n" + errors[0])
    results = {m[1]: m[2:] for m in messages if m[0] == "result"}
    if 0 not in results:
        raise TimeoutError(f"the ranks did not report within {deadline_s:.0f} s (exit codes "
                           f"{[p.exitcode for p in procs]})")
    return results[0]


def _describe(seen) -> str:
    return ", ".join(f"{name}[{n}]" for name, n in seen) or "none"


def main(quick: bool = False, gpu: bool = False):
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    times, counts, n_params = run(quick)
    sizes = _sizes(quick)
    med = [statistics.median(t) for t in times]
    base = {how: med[k] for k, (_, how, opt, clip) in enumerate(SETUPS)
            if opt == "adamw" and not clip}
    base_clip = next(med[k] for k, s in enumerate(SETUPS) if s[1:] == ("fsdp", "adamw", True))
    rows = []
    for k, (name, how, _, clip) in enumerate(SETUPS):
        ref = base_clip if clip else base[how]
        opt_seen, step_seen = counts[k]
        rows.append({
            "setup": name,
            "step_ms": 1e3 * med[k],
            "min_ms": 1e3 * min(times[k]),
            "vs_AdamW_same_wrapper": med[k] / ref,
            "optimizer_collectives": len(opt_seen),
            "optimizer_allreduce_sizes": _describe(opt_seen),
            "fwd_bwd_collectives": len(step_seen),
        })
    notes = (
        f"2 gloo ranks on this machine's CPU, one thread each; an MLP of {sizes['depth']} "
        f"Linear({sizes['width']}, {sizes['width']}) + GELU and a Linear({sizes['width']}, 10) "
        f"({n_params / 1e6:.2f} M parameters in {2 * sizes['depth'] + 2} tensors), "
        f"{sizes['batch']} samples per rank; FSDP2 shards every Linear and the root. "
        "step_ms: forward + backward + optimizer step, median over "
        f"{sizes['rounds']} interleaved rounds of the slower rank's mean over "
        f"{sizes['steps']} steps; vs_AdamW_same_wrapper: against AdamW(foreach=True) under "
        "the same wrapper (the clipping rows against AdamW + clip_grad_norm_). "
        "optimizer_collectives: the collectives dispatched inside opt.step() (what "
        "clip_grad_norm_ costs is counted with the backward), with the elements each "
        "reduces: LAMB's one all-reduce holds 2 norms per tensor, its clipping one scalar. "
        "fwd_bwd_collectives: those of zero_grad + forward + backward (+ clip_grad_norm_): "
        "FSDP2's all-gathers and reduce-scatters, DDP's gradient all-reduce buckets. "
        "LAMB: gpuml.optim.LAMB (foreach path on the CPU, the update on the local shards). "
        "The machine is shared with other jobs: read the ratios, not the milliseconds "
        f"(load average over the minute before this run: {load:.2f} on {os.cpu_count()} "
        "cores).")
    record("sharded", rows, title="FSDP2 + LAMB vs FSDP2 + AdamW vs DDP + LAMB: full training "
           "step, 2 gloo ranks", notes=notes)
    return rows
