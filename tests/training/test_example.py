"""The runnable example ``examples/train_fashion_mnist.py`` with real gloo processes.

Tiny synthetic data (the example's fallback when Fashion-MNIST is absent), a few steps each:
every optimizer and mode runs with 2 ranks; 2 ranks follow the one-process run (the
global batches are the same); a run killed mid-epoch and resumed from its last checkpoint
writes the same CSV, bit for bit, and ends with the same model as one never stopped; a
killed or hung rank stops the other with a clear error within the group timeout; bad settings
end the command line with one line on stderr and exit status 2, once under ``torchrun``.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _example_workers import run_example, run_main
from _procs import free_port, gloo_missing, run_processes

from examples.train_fashion_mnist import DEFAULT_LR, Config, parse_args, train

needs_gloo = pytest.mark.skipif(gloo_missing() is not None, reason=str(gloo_missing()))

# 512 synthetic images, global batch 64: 8 steps an epoch.
TINY = ["--data", "synthetic", "--train-size", "512", "--test-size", "128", "--batch-size", "64",
        "--base-batch-size", "32", "--warmup-epochs", "0.125", "--timeout", "20", "--quiet"]


def _run(argv, world=2, fault=None, deadline=180, until=None, grace=10.0):
    messages, exitcodes, elapsed = run_processes(run_example, world,
                                                 (free_port(), argv, fault), deadline,
                                                 until=until, grace_s=grace)
    errors = [m[2] for m in messages if m[0] == "error"]
    assert not errors, "\n".join(errors)
    return messages, exitcodes, elapsed


def _done(messages, world=2):
    done = {m[1]: m for m in messages if m[0] == "done"}
    assert sorted(done) == list(range(world)), messages
    return done


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@needs_gloo
@pytest.mark.parametrize("optimizer", ["lamb", "lars", "adamw", "sgd"])
def test_every_optimizer_with_ddp(optimizer, tmp_path):
    messages, exitcodes, _ = _run(TINY + ["--optimizer", optimizer, "--steps", "6",
                                          "--eval-every", "3", "--csv", str(tmp_path / "m.csv")])
    done = _done(messages)
    assert exitcodes == [0, 0]
    rows = done[0][2]
    assert [r["step"] for r in rows] == [3, 6]
    assert all(np.isfinite(float(r["loss"])) for r in rows)
    # LEGW: 0.125 epoch at B0 = 32 is 2 warmup steps; sqrt scaling to 64; linear decay over
    # the 4 steps after warmup: the lr of step 3 (t = 2) is the peak, of step 6 (t = 5) 1/4
    peak = DEFAULT_LR[optimizer] * 2 ** 0.5
    assert [float(r["lr"]) for r in rows] == pytest.approx([peak, peak / 4], rel=1e-8)
    # DDP: both replicas stay equal, bit for bit
    np.testing.assert_array_equal(done[0][3], done[1][3])
    assert [r["step"] for r in _read_csv(tmp_path / "m.csv")] == ["3", "6"]


@needs_gloo
@pytest.mark.parametrize("scheme,copies", [("fine", 2), ("coarse", 2), ("medium_coarse", 2)])
def test_overlapping_schemes(scheme, copies):
    messages, exitcodes, _ = _run(TINY + ["--scheme", scheme, "--copies", str(copies),
                                          "--epochs", "1", "--csv", ""])
    done = _done(messages)
    # each rank iterates C times its DistributedSampler share: 2 * 256 / 32 = 16 steps
    assert [r["step"] for r in done[0][2]] == [16]
    np.testing.assert_array_equal(done[0][3], done[1][3])


@needs_gloo
def test_households_average_every_world_period():
    # 2 households of one rank: local SGD, the replicas averaged after steps 3 and 6 only
    base = TINY + ["--optimizer", "sgd", "--households", "2", "--world-period", "3",
                   "--csv", ""]
    done = _done(_run(base + ["--steps", "6"])[0])
    np.testing.assert_array_equal(done[0][3], done[1][3])
    done = _done(_run(base + ["--steps", "5"])[0])
    assert not np.array_equal(done[0][3], done[1][3])


@needs_gloo
@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_sharded_runs(optimizer):
    # FSDP2: the flag and its plumbing (shard, train, evaluate, gather); the numbers of LAMB
    # and LARS on shards against one process are the sharded optimizer's tests.
    argv = TINY + ["--optimizer", optimizer, "--sharded", "--steps", "4", "--csv", ""]
    messages, _, _ = run_processes(run_example, 2, (free_port(), argv, None), 60)
    errors = [m[2] for m in messages if m[0] == "error"]
    if optimizer == "lamb" and errors and all("mixed torch.Tensor and DTensor" in e
                                              for e in errors):
        pytest.skip("this gpuml.optim.LAMB computes on local shards only: LAMB on FSDP2 "
                    "(DTensor) parameters is not merged yet")
    assert not errors, "\n".join(errors)
    stopped = [m for m in messages if m[0] == "stopped"]
    assert not stopped, stopped
    done = _done(messages)
    assert np.all(np.isfinite(done[0][3]))
    np.testing.assert_array_equal(done[0][3], done[1][3])  # the gathered model, on each rank


def _checkpoint(checkpoint_dir, rank=0):
    epoch = json.loads((checkpoint_dir / "latest.json").read_text())["epoch"]
    return torch.load(checkpoint_dir / f"epoch-{epoch:04d}" / f"rank-{rank}.pt",
                      weights_only=False)


@needs_gloo
def test_two_ranks_follow_one_process(tmp_path):
    argv = TINY + ["--optimizer", "sgd", "--steps", "12", "--eval-every", "2"]
    one = train(parse_args(argv + ["--csv", str(tmp_path / "one.csv")]))
    done = _done(_run(argv + ["--csv", ""])[0])
    two = done[0][2]
    assert [r["step"] for r in two] == [r["step"] for r in one["rows"]]
    np.testing.assert_allclose([float(r["loss"]) for r in two],
                               [float(r["loss"]) for r in one["rows"]], rtol=1e-5)
    flat_one = torch.cat([p.detach().reshape(-1) for p in one["model"].parameters()]).numpy()
    np.testing.assert_allclose(done[0][3], flat_one, rtol=1e-5, atol=1e-6)


@needs_gloo
@pytest.mark.parametrize("mode", [
    ["--optimizer", "lamb"],
    # local SGD: the averager's step must come back too, or the averages move
    ["--optimizer", "sgd", "--households", "2", "--world-period", "3"],
])
def test_killed_run_resumes_to_the_same_trajectory(mode, tmp_path):
    argv = TINY + mode + ["--epochs", "3", "--eval-every", "3", "--deterministic"]
    full = argv + ["--csv", str(tmp_path / "full.csv"), "--checkpoint", str(tmp_path / "a")]
    _done(_run(full)[0])

    cut = argv + ["--csv", str(tmp_path / "cut.csv"), "--checkpoint", str(tmp_path / "b")]
    # both ranks killed at step 13, in the middle of the second epoch (8 steps an epoch)
    messages, exitcodes, _ = _run(cut, fault=("kill", (0, 1), 13))
    assert not [m for m in messages if m[0] == "done"] and -9 in exitcodes, messages
    assert json.loads((tmp_path / "b" / "latest.json").read_text())["epoch"] == 1
    steps = [r["step"] for r in _read_csv(tmp_path / "cut.csv")]
    assert steps == ["3", "6", "8", "9", "12"]  # rows past the checkpoint: done again

    _done(_run(cut + ["--resume"])[0])
    assert (tmp_path / "cut.csv").read_text() == (tmp_path / "full.csv").read_text()
    for rank in (0, 1):
        a, b = _checkpoint(tmp_path / "a", rank), _checkpoint(tmp_path / "b", rank)
        assert a["step"] == b["step"] == 24
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), k
        opt_a, opt_b = a["optimizer"], b["optimizer"]
        assert opt_a.get("step") == opt_b.get("step")  # the averager's step (households)
        for p, sa in opt_a["state"].items():
            for key, value in sa.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(
                    opt_b["state"][p][key])), (p, key)


@needs_gloo
@pytest.mark.parametrize("how", ["kill", "hang"])
def test_failed_rank_stops_the_other_with_a_clear_error(how):
    timeout_s = 2
    argv = TINY + ["--steps", "1000", "--timeout", str(timeout_s), "--csv", ""]
    messages, exitcodes, elapsed = _run(
        argv, fault=(how, (1,), 5), deadline=60,
        until=lambda ms: any(m[0] in ("stopped", "error") for m in ms),
        grace=10 if how == "kill" else 1)
    failing = [m for m in messages if m[0] == "failing"]
    stopped = [m for m in messages if m[0] == "stopped"]
    assert len(failing) == 1 and len(stopped) == 1, messages
    _, rank, when, text = stopped[0]
    assert rank == 0
    assert "rank 0: step 6 (epoch 0) failed: a peer died, hung or failed" in text
    assert when - failing[0][2] < timeout_s + 10
    assert elapsed < 30
    assert exitcodes[0] == 0
    assert exitcodes[1] == (-9 if how == "kill" else None)  # None: hung, killed by the test


def test_resume_with_other_settings_is_an_error(tmp_path):
    argv = TINY + ["--optimizer", "sgd", "--epochs", "1", "--csv", "",
                   "--checkpoint", str(tmp_path)]
    train(parse_args(argv))
    with pytest.raises(ValueError, match=r"settings differ.*lr: checkpoint 0\.03, now 0\.1"):
        train(parse_args(argv + ["--resume", "--lr", "0.1"]))
    # the same settings: nothing left to do, no error
    assert train(parse_args(argv + ["--resume"]))["steps"] == 8


@pytest.mark.parametrize("cfg,match", [
    (Config(sharded=True, households=2), "--sharded with --households"),
    (Config(resume=True), "--resume needs --checkpoint"),
    (Config(optimizer="rmsprop"), "--optimizer must be one of"),
    (Config(copies=0), "--copies must be positive"),
    (Config(neighbourhoods=2), "need --households"),
    (Config(households=2, household_shards=1, scheme="fine", copies=2), "--household-shards"),
    (Config(copies=2), "--scheme disjoint gives each sample to one rank"),
    (Config(households=4, neighbourhoods=2), "go together"),
    (Config(households=4, neighbourhoods=3, neighbourhood_period=2), "must divide --households"),
    (Config(households=2, world_period=1), "--household-period 1 < --world-period 1 does not"),
])
def test_wrong_use_is_a_clear_error(cfg, match):
    with pytest.raises(ValueError, match=match):
        cfg.check()


@pytest.mark.parametrize("cfg,world,fits,match", [
    (Config(scheme="coarse", copies=3, batch_size=1200), 4, 6,
     "--copies must divide the number of ranks"),
    (Config(scheme="fine", copies=3, batch_size=1200), 2, 4, "--copies 3 on 2 rank"),
    (Config(batch_size=100), 3, 4, "--batch-size 100 must be a multiple of the 3 ranks"),
    (Config(households=3, batch_size=1200), 4, 6, "--households must divide the number of ranks"),
])
def test_wrong_use_for_the_number_of_ranks_is_a_clear_error(cfg, world, fits, match):
    cfg.check()
    with pytest.raises(ValueError, match=match):
        cfg.check_world(world, distributed=True)
    cfg.check_world(fits, distributed=True)  # the same settings on `fits` ranks: no error


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_fashion_mnist.py"


def _example_env(**extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(EXAMPLE.parents[1])] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    env.update(extra)
    return env


@pytest.mark.parametrize("argv,world,message", [
    (["--copies", "0"], None, "--copies must be positive, got 0"),
    (["--scheme", "bogus"], None, "argument --scheme: invalid choice: 'bogus'"),
    # depends on the number of ranks: rank 0 of the 4 torchrun starts, found before it waits
    # for the other 3 to join the process group
    (["--scheme", "coarse", "--copies", "3"], 4,
     "--scheme coarse --copies 3 on 4 ranks: the coarse scheme"),
])
def test_bad_settings_on_the_command_line_are_one_line_and_status_2(argv, world, message):
    env = _example_env()
    if world is not None:  # what torchrun gives rank 0 of `world` processes
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run([sys.executable, str(EXAMPLE), *TINY, "--timeout", "5", *argv],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"train_fashion_mnist.py: error: {message}"), \
        proc.stderr
    assert proc.stdout == ""


@pytest.mark.skipif(not torch.distributed.is_available(),
                    reason="torch.distributed is not available in this build of torch")
def test_bad_settings_under_torchrun_are_printed_once():
    """4 ranks under the real torchrun: the example's line once (local rank 0's), not a
    traceback per rank; rank 0 exits with status 2 (torchrun's own report follows it)."""
    argv = ["--standalone", "--nproc-per-node", "4", str(EXAMPLE), *TINY,
            "--scheme", "coarse", "--copies", "3"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", *argv],
                          env=_example_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "train_fashion_mnist.py: error:" in line]
    assert lines == ["train_fashion_mnist.py: error: --scheme coarse --copies 3 on 4 ranks: the "
                     "coarse scheme gives each shard of the data to a group of --copies ranks, "
                     "so --copies must divide the number of ranks"], proc.stderr
    assert "ValueError" not in proc.stderr and "[rank" not in proc.stderr, proc.stderr
    assert "exitcode  : 2" in proc.stderr, proc.stderr  # torchrun's report names rank 0's status


@pytest.mark.parametrize("flag", [["--sharded"], ["--households", "2"]])
def test_sharded_and_households_need_a_process_group(flag):
    with pytest.raises(ValueError, match="need a process group"):
        train(parse_args(TINY + flag + ["--steps", "1", "--csv", ""]))


def test_synthetic_fallback_and_validation_split(tmp_path):
    res = train(parse_args(TINY + ["--data-dir", str(tmp_path), "--data", "auto",
                                   "--val-size", "128", "--epochs", "1", "--csv", ""]))
    assert res["data"] == "synthetic" and res["steps"] == 8
    assert res["val_acc"] is not None and res["test_acc"] is not None
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        train(parse_args(TINY[2:] + ["--data", "fashion-mnist", "--data-dir", str(tmp_path)]))


@needs_gloo
def test_command_line_as_torchrun_runs_it(tmp_path):
    """main(): the process group from torchrun's environment (env:// rendezvous), the CSV,
    and exit status 1 with a one-line error on the survivor when a peer is killed."""
    argv = TINY + ["--steps", "4", "--csv", str(tmp_path / "m.csv")]
    messages, exitcodes, _ = run_processes(run_main, 2, (free_port(), argv, None), 60)
    assert not [m for m in messages if m[0] == "error"], messages
    assert sorted(m[1:3] for m in messages if m[0] == "exit") == [(0, 0), (1, 0)]
    assert [r["step"] for r in _read_csv(tmp_path / "m.csv")] == ["4"]

    argv = TINY + ["--steps", "100", "--csv", ""]
    messages, exitcodes, _ = run_processes(run_main, 2, (free_port(), argv, ("kill", (1,), 2)),
                                           60)
    exits = [m for m in messages if m[0] == "exit"]
    assert len(exits) == 1 and exits[0][1:3] == (0, 1), messages
    assert exits[0][3].startswith("ERROR rank 0: step 3 (epoch 0) failed: a peer died")
    assert exitcodes == [0, -9]
