"""Process entry points for the tests of LAMB/LARS under DDP, FSDP2 and HSDP (run in children
started by ``tests/_procs.py``; no pytest here).

Each takes ``(rank, world_size, ..., queue)`` and reports on ``queue``; every failure is
reported too, as ``("error", rank, text)``.
"""

import os
import signal
import time
from datetime import timedelta

import torch

if not torch.cuda.is_available():
    # The fused kernels run in Triton's interpreter here, which needs the variable set before
    # triton is first imported (triton's own library functions are decorated at import), and
    # the first optimizer below imports torch._dynamo, which imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.distributed as dist  # noqa: E402
from _procs import report_errors  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import gpuml.optim  # noqa: E402, F401  (preloaded once in the forkserver, not in every child)

# Build one optimizer here, in the forkserver: the first one imports torch._dynamo.
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)

IN, HIDDEN, OUT, BATCH = 8, 13, 3, 24




def init_gloo(rank, world, port, timeout_s=30):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))


def make_model():
    """A small MLP whose widths do not divide 2 or 4 (uneven shards; the last bias, of 3,
    has an empty shard on the fourth of 4 ranks). The same on every rank and in the parent."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, 7), torch.nn.Tanh(),
                               torch.nn.Linear(7, OUT))


def batch(step):
    """The global batch of a step (every rank draws all of it and takes its slice)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, IN, generator=g)
    y = torch.sin(x[:, :OUT] * 2.0) + 0.1 * torch.randn(BATCH, OUT, generator=g)
    return x, y


def make_optimizer(model, config):
    from gpuml.optim import LAMB, LARS, param_groups_by_name

    name, kwargs, by_name = config
    cls = {"lamb": LAMB, "lars": LARS}[name]
    params = param_groups_by_name(model) if by_name else model.parameters()
    return cls(params, **kwargs)


def flat(params):
    return torch.cat([p.detach().reshape(-1) for p in params]).clone()


def one_process(config, steps):
    """The reference: the whole model and the whole batch in this process."""
    model = make_model()
    opt = make_optimizer(model, config)
    out = []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        out.append(flat(model.parameters()))
    return torch.stack(out)


class CollectiveCounter(TorchDispatchMode):
    """Counts the collectives dispatched while active: explicit ones (``c10d.*``) and those
    DTensor issues on its own (``_c10d_functional.*``)."""

    def __init__(self):
        super().__init__()
        self.names = []
        self.sizes = []  # elements reduced by each collective

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            # A mode runs before the subclass: NotImplemented lets DTensor run the op and
            # desugar it into plain ops, its collectives included, which come back here
            # (what torch's CommDebugMode does); else those collectives would go unseen.
            return NotImplemented
        name = str(func)
        if (name.startswith("c10d.") or name.startswith("_c10d_functional.")) and not (
                "wait_tensor" in name or "wrap_tensor" in name):
            self.names.append(name)
            first = args[0] if args else None
            tensors = first if isinstance(first, (list, tuple)) else [first]
            self.sizes.append(sum(t.numel() for t in tensors if isinstance(t, torch.Tensor)))
        return func(*args, **(kwargs or {}))


def _local_slice(rank, dp_world, x):
    b = x.shape[0] // dp_world
    return x[rank * b:(rank + 1) * b]


def _train(model, opt, rank, dp_world, steps, full):
    """``steps`` steps on this rank's slice of each global batch; the full parameters after
    each step (``full``: how to read them) and the collectives of each ``opt.step()``."""
    traj, counts = [], []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(_local_slice(rank, dp_world, x)),
                                     _local_slice(rank, dp_world, y)).backward()
        counter = CollectiveCounter()
        with counter:
            opt.step()
        counts.append(list(zip(counter.names, counter.sizes)))
        traj.append(full(model))
    return torch.stack(traj), counts


def _full_params(model):
    return flat(p.full_tensor() if hasattr(p, "full_tensor") else p
                for p in model.parameters())


@report_errors
def trajectories(rank, world, port, runs, steps, q):
    """For each ``(key, how, config)`` of ``runs``: train with ``how`` = "ddp", "fsdp"
    (FSDP2 on a 1-D mesh of all ranks) or "hsdp" (a 2 x world/2 mesh, Replicate x Shard);
    rank 0 reports the trajectory of the full parameters, every rank its collectives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    init_gloo(rank, world, port)
    for key, how, config in runs:
        model = make_model()
        if how == "ddp":
            model = DistributedDataParallel(model)
        else:
            mesh = (init_device_mesh("cpu", (world,)) if how == "fsdp" else
                    init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "shard")))
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        opt = make_optimizer(model.module if how == "ddp" else model, config)
        traj, counts = _train(model, opt, rank, world, steps, _full_params)
        # numpy, not torch: a torch tensor travels as a shared-memory handle that dies with
        # the child
        q.put(("run", rank, key, traj.numpy() if rank == 0 else None, counts))
    dist.destroy_process_group()


@report_errors
def fused_trajectories(rank, world, port, runs, steps, q):
    """FSDP2 with the fused (Triton) path, in Triton's interpreter on CPU tensors (switched on
    at the import of this module), with chunks of 32 elements (most tensors span several
    programs)."""
    from gpuml.optim import _triton

    _triton.INTERPRET_CHUNK, _triton.INTERPRET_BLOCK = 32, 16
    trajectories.__wrapped__(rank, world, port, runs, steps, q)


@report_errors
def placements(rank, world, port, q):
    """Hand-made DTensors on a 1-D mesh of 2 ranks (Shard(0) and Shard(1), both uneven, a
    Replicate DTensor and a plain tensor) follow the one-process update, for LAMB and LARS in
    the loop and foreach paths and the functional API; then the refusals."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    from gpuml.optim import LAMB, LARS, _sharding, lamb

    init_gloo(rank, world, port)
    mesh = init_device_mesh("cpu", (world,))
    shapes = [(7, 5), (5, 7), (6,), (4, 3)]
    layout = [[Shard(0)], [Shard(1)], [Replicate()], None]

    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(s, generator=g) for s in shapes]

    def dist_params():
        return [torch.nn.Parameter(t if pl is None else distribute_tensor(t, mesh, pl))
                for t, pl in zip(make(0), layout)]

    def set_grads(ps, step, wrap):
        for p, g, pl in zip(ps, make(10 + step), layout):
            p.grad = distribute_tensor(g, mesh, pl) if wrap and pl is not None else g

    results = {}
    for name, cls, kw in [("lamb", LAMB, dict(lr=0.05, max_grad_norm=0.5)),
                          ("lars", LARS, dict(lr=1.0, weight_decay=1e-3,
                                              exclude_from_adaptation=False))]:
        for impl in ("loop", "foreach"):
            ref = [torch.nn.Parameter(t) for t in make(0)]
            got = dist_params()
            ref_opt = cls(ref, foreach=impl == "foreach", **kw)
            opt = cls(got, foreach=impl == "foreach", **kw)
            counts = []
            for step in range(4):
                set_grads(ref, step, False)
                set_grads(got, step, True)
                ref_opt.step()
                counter = CollectiveCounter()
                with counter:
                    opt.step()
                counts.append(len(counter.names))
            full = [p.full_tensor() if isinstance(p, DTensor) else p for p in got]
            diff = max(float((a - b).abs().max()) for a, b in zip(full, ref))
            results[name, impl] = (diff, counts)
    # the functional API unwraps DTensors as the class does
    ref, got = [torch.nn.Parameter(t) for t in make(0)], dist_params()
    for ps, wrap in ((ref, False), (got, True)):
        set_grads(ps, 0, wrap)
        state = [torch.zeros_like(p) for p in ps]
        with torch.no_grad():
            lamb(ps, [p.grad for p in ps], state, [torch.zeros_like(p) for p in ps],
                 [None] * len(ps), [torch.zeros(()) for _ in ps], adapt=[True] * 4,
                 decay=[True] * 4, lr=0.05, beta1=0.9, beta2=0.999, eps=1e-6,
                 weight_decay=0.01, bias_correction=True, grad_averaging=True,
                 max_grad_norm=1.0, trust_bounds=(0.0, float("inf")), eps_inside_sqrt=True,
                 variant="lamb")
    full = [p.full_tensor() if isinstance(p, DTensor) else p for p in got]
    results["functional"] = (max(float((a - b).abs().max()) for a, b in zip(full, ref)), [])

    def refusal(params, grads=None):
        ps = [torch.nn.Parameter(p) for p in params]
        for p, g in zip(ps, grads or [None] * len(ps)):
            p.grad = g if g is not None else torch.zeros_like(p)
        try:
            LAMB(ps).step()
        except (ValueError, TypeError) as err:
            return f"{type(err).__name__}: {err}"
        return "no error"

    full = torch.randn(4, 6)
    mesh2 = init_device_mesh("cpu", (world, 1), mesh_dim_names=("a", "b"))
    errors = {
        "partial": refusal([DTensor.from_local(full, mesh, [Partial()])]),
        "strided": refusal([DTensor.from_local(full[:2], mesh,
                                               [_StridedShard(0, split_factor=2)],
                                               shape=torch.Size((4, 6)),
                                               stride=(6, 1))]),
        "two_dims": refusal([distribute_tensor(full, mesh2, [Shard(0), Shard(1)])]),
        "grad_partial": refusal(
            [distribute_tensor(full, mesh, [Shard(0)])],
            [DTensor.from_local(full[:2], mesh, [Partial()], shape=torch.Size((4, 6)),
                                stride=(6, 1))]),
        "plain_grad": refusal([distribute_tensor(full, mesh, [Shard(0)])], [full.clone()]),
        "two_groups": refusal([distribute_tensor(full, mesh2, [Shard(0), Replicate()]),
                               distribute_tensor(full, mesh2, [Replicate(), Shard(0)])]),
    }
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    opt = LAMB([torch.nn.Parameter(sharded)])
    opt.param_groups[0]["params"][0].grad = distribute_tensor(torch.ones(4, 6), mesh,
                                                              [Shard(0)])
    opt.step()
    opt.state[opt.param_groups[0]["params"][0]]["exp_avg"] = torch.zeros(4, 6)  # full, not local
    try:
        opt.step()
        errors["state_shape"] = "no error"
    except ValueError as err:
        errors["state_shape"] = f"ValueError: {err}"
    assert _sharding.dtensor_type() is DTensor
    q.put(("placements", rank, results, errors))
    dist.destroy_process_group()


@report_errors
def failing(rank, world, port, timeout_s, how, bad_rank, bad_step, q):
    """FSDP2 + LAMB; at step ``bad_step``, after the backward pass (whose reduce-scatter every
    rank completed), rank ``bad_rank`` kills itself (``how="kill"``) or stops answering
    (``"hang"``) instead of stepping. The others report the error their step raised and how
    long it took to come."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from gpuml.optim import LAMB
    from gpuml.training import PeerFailureError

    init_gloo(rank, world, port, timeout_s)
    mesh = init_device_mesh("cpu", (world,))
    model = make_model()
    fully_shard(model, mesh=mesh)
    opt = LAMB(model.parameters(), lr=0.01)
    for step in range(bad_step + 3):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(_local_slice(rank, world, x)),
                                     _local_slice(rank, world, y)).backward()
        if rank == bad_rank and step == bad_step:
            q.put(("failing", rank, step))
            q.close()
            q.join_thread()
            if how == "kill":
                time.sleep(0.2)  # the others are inside the optimizer's all-reduce by now
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)
        start = time.monotonic()
        try:
            opt.step()
        except PeerFailureError as err:
            q.put(("stopped", rank, step, time.monotonic() - start, str(err)))
            return
    q.put(("finished", rank))
