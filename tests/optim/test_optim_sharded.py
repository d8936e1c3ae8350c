"""LAMB and LARS under data parallelism, with real gloo processes on the CPU.

DDP: nothing changes (plain tensors, gradients averaged by DDP). FSDP2 (``fully_shard``) and
HSDP: the parameters are DTensors sharded on dim 0; the update runs on the local shards with
the norms of the full tensors, summed over the ranks in one all-reduce per step (LAMB with
clipping: one scalar all-reduce more, for the global gradient norm). Each run trains the same
small MLP for 20 steps on the same global batches, split over the ranks, and must follow the
one-process trajectory; the collectives each ``opt.step()`` dispatches are counted.

The processes come from the forkserver of ``tests/_procs.py``; each launch is bounded by a
deadline after which what still runs is killed.
"""

import pytest
import torch
from _procs import free_port, gloo_missing, run_processes
from _sharded_workers import (
    failing,
    fused_trajectories,
    one_process,
    placements,
    trajectories,
)

pytestmark = pytest.mark.skipif(gloo_missing() is not None, reason=str(gloo_missing()))

NO_TRITON = ("triton is not installed: the fused kernels are Triton's (on the CPU in its "
             "interpreter); `make test` installs it, the test extra does not")
STEPS = 20
TOL = 1e-6  # float32, max |difference| of any parameter over the 20 steps

# (optimizer, options, param_groups_by_name)
LAMB_DEFAULTS = ("lamb", dict(lr=0.02, foreach=True), False)  # Alg 16: wd 0.01, no clipping
LAMB_PLAIN = ("lamb", dict(lr=0.02, weight_decay=0.0, max_grad_norm=None,
                           exclude_from_adaptation=False, foreach=False), False)
LAMB_CLIPPING = ("lamb", dict(lr=0.02, max_grad_norm=0.05, always_adapt=False,
                              trust_bounds=(0.0, 5.0), eps_inside_sqrt=False, foreach=True),
                 False)
LAMB_GROUPS = ("lamb", dict(lr=0.02, foreach=False), True)
LARS_ADAPT_ALL = ("lars", dict(lr=0.5, trust_coefficient=0.02, exclude_from_adaptation=False,
                               foreach=True), False)
LARS_OPTIONS = ("lars", dict(lr=0.05, weight_decay=5e-4, nesterov=True, clip=True,
                             foreach=False), False)
LARS_NORMALIZED = ("lars", dict(lr=0.5, trust_coefficient=0.02, mode="normalized",
                                weight_decay=1e-3, exclude_from_adaptation=False,
                                foreach=True), False)
LARS_GROUPS = ("lars", dict(lr=0.5, weight_decay=1e-4, exclude_from_adaptation=False,
                            foreach=False), True)
CONFIGS = {"lamb_defaults": LAMB_DEFAULTS, "lamb_plain": LAMB_PLAIN,
           "lamb_clipping": LAMB_CLIPPING, "lamb_groups": LAMB_GROUPS,
           "lars_adapt_all": LARS_ADAPT_ALL, "lars_options": LARS_OPTIONS,
           "lars_normalized": LARS_NORMALIZED, "lars_groups": LARS_GROUPS}


N_TENSORS, N_WEIGHTS = 6, 3  # the MLP's weights and biases; its weights


def collectives_per_step(config):
    """The sizes of the all-reduces of one step: one of the layer-wise norms of every tensor
    of every group that adapts (two each: weight and update, or weight and gradient /
    momentum; param_groups_by_name puts the biases in a group that does not), after one of
    the global gradient norm (a scalar) when LAMB clips."""
    name, kwargs, by_name = config
    clip = name == "lamb" and kwargs.get("max_grad_norm") is not None  # default: no clipping
    return [1] * clip + [2 * (N_WEIGHTS if by_name else N_TENSORS)]


def launch(target, nprocs, args, deadline_s=120):
    messages, exitcodes, _ = run_processes(target, nprocs, (free_port(), *args), deadline_s)
    errors = [m for m in messages if m[0] == "error"]
    assert not errors, "\n".join(m[2] for m in errors)
    assert exitcodes == [0] * nprocs, exitcodes
    return messages


def run_all(target, nprocs, runs, steps=STEPS, deadline_s=120):
    """Every run of ``runs`` (key, how, config) in one launch: {key: (trajectory, counts per
    rank)}."""
    messages = launch(target, nprocs, (runs, steps), deadline_s)
    out = {}
    for _, rank, key, traj, counts in (m for m in messages if m[0] == "run"):
        entry = out.setdefault(key, [None, {}])
        if traj is not None:
            entry[0] = torch.from_numpy(traj)
        entry[1][rank] = counts
    assert set(out) == {key for key, _, _ in runs}
    return out


_oracles: dict = {}


def oracle(config, steps=STEPS):
    """The one-process trajectory (loop path: the oracle of the other two)."""
    name, kwargs, by_name = config
    plain = {k: v for k, v in kwargs.items() if k not in ("fused", "foreach")}
    key = (name, tuple(sorted(plain.items())), by_name, steps)
    if key not in _oracles:
        _oracles[key] = one_process((name, {**plain, "foreach": False}, by_name), steps)
    return _oracles[key]


def check(results, key, config, nprocs, collectives, tol=TOL, steps=STEPS):
    traj, counts = results[key]
    ref = oracle(config, steps)
    assert traj.shape == ref.shape
    diff = float((traj - ref).abs().max())
    assert diff <= tol, f"{key}: max |sharded - one process| = {diff:.3g}"
    assert float((ref[-1] - ref[0]).abs().max()) > 1e-2, "the run must move the parameters"
    assert sorted(counts) == list(range(nprocs))
    for rank, per_step in counts.items():
        for step, seen in enumerate(per_step):
            assert [size for _, size in seen] == collectives, (key, rank, step, seen)
            assert all(n == "c10d.allreduce_.default" for n, _ in seen), seen


@pytest.fixture(scope="module")
def two_ranks():
    runs = [(f"ddp/{k}", "ddp", CONFIGS[k]) for k in ("lamb_defaults", "lamb_plain",
                                                       "lars_adapt_all", "lars_options")]
    runs += [(f"fsdp/{k}", "fsdp", c) for k, c in CONFIGS.items()]
    return run_all(trajectories, 2, runs)


@pytest.mark.parametrize("key", ["lamb_defaults", "lamb_plain", "lars_adapt_all",
                                 "lars_options"])
def test_ddp_changes_nothing(two_ranks, key):
    """DDP averages the gradients in the backward pass; the optimizer sees plain tensors and
    issues no collective of its own."""
    check(two_ranks, f"ddp/{key}", CONFIGS[key], 2, collectives=[])


@pytest.mark.parametrize("key", list(CONFIGS))
def test_fsdp2_two_ranks_follows_one_process(two_ranks, key):
    check(two_ranks, f"fsdp/{key}", CONFIGS[key], 2, collectives_per_step(CONFIGS[key]))


@pytest.fixture(scope="module")
def four_ranks():
    runs = [(f"fsdp/{k}", "fsdp", CONFIGS[k]) for k in ("lamb_clipping", "lamb_plain",
                                                        "lars_options", "lars_normalized")]
    runs += [(f"hsdp/{k}", "hsdp", CONFIGS[k]) for k in ("lamb_groups", "lars_groups")]
    return run_all(trajectories, 4, runs)


@pytest.mark.parametrize("key", ["fsdp/lamb_clipping", "fsdp/lamb_plain", "fsdp/lars_options",
                                 "fsdp/lars_normalized", "hsdp/lamb_groups",
                                 "hsdp/lars_groups"])
def test_four_ranks_fsdp2_and_hsdp_follow_one_process(four_ranks, key):
    """4 ranks: some shards of the last bias are empty; HSDP (2 replicas x 2 shards, placements
    Replicate x Shard(0)) sums the norms over the shard group only."""
    config = CONFIGS[key.split("/")[1]]
    check(four_ranks, key, config, 4, collectives_per_step(config))


FUSED_STEPS = 6


def test_fused_path_under_fsdp2_in_the_triton_interpreter():
    """The fused kernels (Triton interpreter, CPU tensors, chunks of 32 elements): pass 1,
    per-tensor sums, one all-reduce, pass 2 with the sums over the ranks. A smaller case than
    the others (6 steps, not 20): the interpreter takes seconds per step on a CPU."""
    pytest.importorskip("triton", reason=NO_TRITON)
    if torch.cuda.is_available():
        pytest.skip("the interpreter runs where there is no GPU (test_optim_gpu.py covers the "
                    "fused kernels on one)")
    keys = ["lamb_defaults", "lamb_clipping", "lars_adapt_all", "lars_normalized"]
    runs = []
    for k in keys:
        name, kwargs, by_name = CONFIGS[k]
        kwargs = {**{o: v for o, v in kwargs.items() if o != "foreach"}, "fused": True}
        runs.append((k, "fsdp", (name, kwargs, by_name)))
    results = run_all(fused_trajectories, 2, runs, FUSED_STEPS, deadline_s=240)
    for key, _, config in runs:
        check(results, key, config, 2, collectives_per_step(config), tol=TOL,
              steps=FUSED_STEPS)


def test_placements_and_refusals():
    """Hand-made DTensors: Shard(0) and Shard(1) with uneven shards, a Replicate DTensor and
    a plain tensor in one group follow the one-process update (class and functional API,
    loop and foreach); unsupported shardings are clear errors."""
    messages = launch(placements, 2, ())
    reports = [m for m in messages if m[0] == "placements"]
    assert len(reports) == 2
    for _, rank, results, errors in reports:
        for (key, (diff, counts)) in results.items():
            assert diff <= TOL, (rank, key, diff)
            lamb = key == "functional" or key[0] == "lamb"
            assert counts == ([] if key == "functional" else [2 if lamb else 1] * 4), key
        expected = {
            "partial": "partial placement",
            "strided": "_StridedShard placement",
            "two_dims": "sharded over 2 mesh dimensions",
            "grad_partial": "must be placed like its parameter",
            "plain_grad": "a plain tensor: the gradient must be placed like",
            "two_groups": "sharded over another process group",
            "state_shape": "has local shape (4, 6), its parameter's local shard (2, 6)",
        }
        for case, text in expected.items():
            assert text in errors[case], (rank, case, errors[case])


@pytest.mark.parametrize("how", ["kill", "hang"])
def test_a_failed_rank_stops_the_others_with_a_clear_error(how):
    """A rank dies (or hangs) after the backward pass of step 3, before its optimizer step:
    the other rank's step raises PeerFailureError from the optimizer's all-reduce, at once
    when the peer is gone, within the process group's timeout (3 s) when it hangs."""
    timeout_s = 3
    messages, exitcodes, elapsed = run_processes(
        failing, 2, (free_port(), timeout_s, how, 1, 3), deadline_s=60,
        until=lambda ms: any(m[0] in ("stopped", "error") and m[1] == 0 for m in ms),
        grace_s=2)
    errors = [m for m in messages if m[0] == "error" and m[1] == 0]
    assert not errors, errors[0][2]
    stopped = [m for m in messages if m[0] == "stopped"]
    assert len(stopped) == 1, messages
    _, rank, step, seconds, text = stopped[0]
    assert (rank, step) == (0, 3)
    assert "all-reduce of the layer-wise norms over ranks [0, 1] failed" in text
    assert "a peer died, hung or failed" in text
    assert seconds < (2.0 if how == "kill" else timeout_s + 3.0), seconds
    assert exitcodes[0] == 0
    assert elapsed < 50


def test_no_process_group_needed_without_dtensors():
    """Plain tensors never reach torch.distributed (no process group exists here)."""
    from gpuml.optim import LAMB

    p = torch.nn.Parameter(torch.ones(3, 2))
    p.grad = torch.full((3, 2), 0.5)
    opt = LAMB([p], lr=0.1)
    opt.step()
    assert opt._reduction is None
    assert not torch.distributed.is_initialized()


@pytest.fixture
def world_of_one():
    """A process group of one rank in this process (nccl on a GPU, else gloo), destroyed
    after the test."""
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield "cuda" if torch.cuda.is_available() else "cpu"
    finally:
        dist.destroy_process_group()


def test_fused_kernels_refuse_dtensors(world_of_one):
    """The fused kernels take the local shards, which the optimizers hand them; a DTensor
    reaching them directly is a clear error."""
    pytest.importorskip("triton", reason=NO_TRITON)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from gpuml.optim import _triton

    mesh = init_device_mesh(world_of_one, (1,))
    p = distribute_tensor(torch.randn(4, 6, device=world_of_one), mesh, [Shard(0)])
    with pytest.raises(TypeError, match="the fused kernels take the local tensors"):
        _triton.prepare("lamb", [p], [p], ([p], [p]), [None], [torch.zeros(())], [True],
                        [True])


@pytest.mark.cuda_also
@pytest.mark.parametrize("config", ["lamb_clipping", "lars_normalized"])
def test_fused_path_sharded_on_one_rank(world_of_one, config):
    """FSDP2 over a mesh of one rank: the parameters are Shard(0) DTensors, so the fused
    kernels take their sharded branch (per-tensor sums, one all-reduce, pass 2 reading the
    sums) — on the GPU where there is one (compiled kernels, nccl), else in the interpreter.
    Must match the fused path on the plain model, and dispatch the counted collectives."""
    pytest.importorskip("triton", reason=NO_TRITON)
    from _sharded_workers import CollectiveCounter, batch, make_model, make_optimizer
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from gpuml.optim import _triton

    device = world_of_one
    name, kwargs, by_name = CONFIGS[config]
    kwargs = {**{k: v for k, v in kwargs.items() if k != "foreach"}, "fused": True}
    old = _triton.INTERPRET_CHUNK, _triton.INTERPRET_BLOCK
    _triton.INTERPRET_CHUNK, _triton.INTERPRET_BLOCK = 32, 16
    try:
        plain = make_model().to(device)
        sharded = make_model().to(device)
        fully_shard(sharded, mesh=init_device_mesh(device, (1,)))
        runs = []
        for model in (plain, sharded):
            opt = make_optimizer(model, (name, kwargs, by_name))
            counts = []
            for step in range(3):
                x, y = (t.to(device) for t in batch(step))
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                counter = CollectiveCounter()
                with counter:
                    opt.step()
                counts.append(counter.sizes)
            runs.append(([p.full_tensor() if hasattr(p, "full_tensor") else p
                          for p in model.parameters()], counts))
            assert all(v.prepared is not None for v in opt._views), "not the fused path"
    finally:
        _triton.INTERPRET_CHUNK, _triton.INTERPRET_BLOCK = old
    (ref, ref_counts), (got, got_counts) = runs
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=0, atol=TOL)
    assert ref_counts == [[]] * 3
    assert got_counts == [collectives_per_step((name, kwargs, by_name))] * 3


def test_benchmark_quick(tmp_path, monkeypatch):
    """``python -m bench.run sharded:quick``: the six setups run side by side in 2 gloo
    processes, and the optimizer's collectives are those counted above (LAMB under FSDP2: one
    all-reduce of 2 norms per tensor, one scalar more with clipping; AdamW and DDP + LAMB:
    none)."""
    from bench import _harness, bench_sharded

    monkeypatch.setenv(_harness.OUT_ENV, str(tmp_path))
    rows = bench_sharded.main(quick=True)
    by_setup = {r["setup"]: r for r in rows}
    n = 2 * 8  # 2 norms of each tensor: the quick model has 4 Linear layers
    assert (tmp_path / "sharded.md").exists() and (tmp_path / "sharded.json").exists()
    expected = {"FSDP2 + AdamW": "none", "FSDP2 + LAMB": f"allreduce_[{n}]",
                "FSDP2 + AdamW, clip_grad_norm_": "none",
                "FSDP2 + LAMB, max_grad_norm": f"allreduce_[1], allreduce_[{n}]",
                "DDP + AdamW": "none", "DDP + LAMB": "none"}
    assert {k: r["optimizer_allreduce_sizes"] for k, r in by_setup.items()} == expected
    assert all(r["step_ms"] > 0 for r in rows)
    fsdp = by_setup["FSDP2 + LAMB"]["fwd_bwd_collectives"]
    assert by_setup["FSDP2 + AdamW, clip_grad_norm_"]["fwd_bwd_collectives"] == fsdp + 1
