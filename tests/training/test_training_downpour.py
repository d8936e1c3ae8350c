"""Downpour SGD (Dean et al. 2012, DistBelief): the parameter server's Adagrad and liveness in
one process, then 1 server + 2 workers over torch.distributed.rpc against synchronous
data-parallel Adagrad, and a worker that dies or raises mid-run."""

import threading
import time

import pytest
import torch
from _procs import free_port, gloo_missing, run_processes
from _training_workers import downpour, least_squares_loss, synchronous_adagrad

from gpuml.training import DownpourWorker, ParameterServer, PeerFailureError

missing = gloo_missing()
if missing is None and not torch.distributed.rpc.is_available():
    missing = "torch.distributed.rpc is not available in this build of torch"
needs_rpc = pytest.mark.skipif(missing is not None, reason=str(missing))


@pytest.fixture
def server_factory():
    made = []

    def make(*args, **kw):
        made.append(ParameterServer(*args, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_server_applies_each_push_with_adagrad(server_factory):
    torch.manual_seed(0)
    ours = [torch.randn(3, 2), torch.randn(2)]
    ref = [p.clone().requires_grad_() for p in ours]
    server = server_factory(ours, ["a", "b"], lr=0.1, eps=1e-8, initial_accumulator_value=0.1)
    adagrad = torch.optim.Adagrad(ref, lr=0.1, eps=1e-8, initial_accumulator_value=0.1)
    for k in range(5):
        grads = [torch.randn(3, 2), torch.randn(2)]
        server.push("ab"[k % 2], grads)
        for p, g in zip(ref, grads):
            p.grad = g
        adagrad.step()
        for a, b in zip(server.fetch("a"), ref):
            torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)
    assert server.updates == 5 and server.pushes == {"a": 3, "b": 2}


def test_fetch_is_a_copy(server_factory):
    w = torch.zeros(2)
    server = server_factory([w], ["a"], lr=1.0)
    got = server.fetch("a")[0]
    server.push("a", [torch.ones(2)])
    assert torch.equal(got, torch.zeros(2)) and not torch.equal(w, torch.zeros(2))


def test_server_errors(server_factory):
    with pytest.raises(ValueError, match="no parameters"):
        ParameterServer([], ["a"])
    with pytest.raises(ValueError, match="distinct RPC names"):
        ParameterServer([torch.zeros(1)], ["a", "a"])
    with pytest.raises(ValueError, match="distinct RPC names"):
        ParameterServer([torch.zeros(1)], "ab")
    with pytest.raises(ValueError, match="worker_timeout must be positive"):
        ParameterServer([torch.zeros(1)], ["a"], worker_timeout=0)
    server = server_factory([torch.zeros(2, 2)], ["a"])
    with pytest.raises(RuntimeError, match="already serving"):
        ParameterServer([torch.zeros(1)], ["b"])
    with pytest.raises(ValueError, match=r"pushed gradients of shapes \[\(2,\)\]"):
        server.push("a", [torch.zeros(2)])
    with pytest.raises(ValueError, match="not one of this server's workers"):
        server.fetch("z")


def test_serve_returns_when_every_worker_finished(server_factory):
    w = torch.zeros(2)
    server = server_factory([w], ["a", "b"], lr=1.0)

    def worker(name):
        server.push(name, [torch.ones(2)])
        server.finish(name, [torch.ones(2)])

    threads = [threading.Thread(target=worker, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    params = server.serve(timeout=10)
    for t in threads:
        t.join()
    assert params[0] is w and server.updates == 4


def test_silent_worker_fails_the_run_in_bounded_time(server_factory):
    server = server_factory([torch.zeros(1)], ["a", "b"], worker_timeout=0.3)
    server.finish("a", None)
    start = time.monotonic()
    with pytest.raises(PeerFailureError, match=r"no word from \['b'\] for more than 0.3 s"):
        server.serve(poll=0.05)
    assert time.monotonic() - start < 5


def test_worker_failure_reported_and_relayed(server_factory):
    server = server_factory([torch.zeros(1)], ["a", "b"], worker_timeout=5)
    server.fail("b", "ValueError: broken")
    with pytest.raises(PeerFailureError, match="worker 'b' failed: ValueError: broken"):
        server.heartbeat("a")  # every live worker is told; then serve stops without waiting
    start = time.monotonic()
    with pytest.raises(PeerFailureError, match="Downpour SGD failed: worker 'b' failed"):
        server.serve(poll=0.05)
    assert time.monotonic() - start < 1


def test_worker_needs_rpc():
    with pytest.raises(ValueError, match="n_fetch must be positive"):
        DownpourWorker([torch.zeros(1)], n_fetch=0)
    with pytest.raises(RuntimeError, match="init_rpc"):
        DownpourWorker([torch.zeros(1)])


SETTINGS = {"lr": 0.3, "epochs": 20, "batch": 16, "n_fetch": 2, "n_push": 2,
            "worker_timeout": 3.0, "heartbeat": 0.2}


@needs_rpc
def test_downpour_reaches_the_loss_of_synchronous_sgd():
    messages, exitcodes, _ = run_processes(downpour, 3, (free_port(), SETTINGS), 90)
    errors = [m[2] for m in messages if m[0] == "error"]
    assert not errors, "\n".join(errors)
    assert exitcodes == [0, 0, 0]
    (_, _, loss, updates, pushes), = [m for m in messages if m[0] == "server"]
    steps = {m[1]: m[2] for m in messages if m[0] == "worker"}
    # 256 samples, 128 per worker in batches of 16: 8 steps an epoch, a push every 2nd step
    assert steps == {1: 160, 2: 160}
    assert pushes == {"worker1": 80, "worker2": 80} and updates == 160
    sync = synchronous_adagrad(SETTINGS)
    best = least_squares_loss()
    # From 9.7 both get to the noise floor of the least-squares fit (0.0082): synchronous
    # data-parallel Adagrad (the same data split, batches and learning rate) ends at 0.00826.
    # Downpour computes each gradient at parameters up to a few pushes old, in an order the
    # scheduler picks, so its end point moves a little from run to run: 0.1-0.8 % above the
    # synchronous loss in 10 runs here. 5 % of the final loss (0.004 % of the initial loss)
    # leaves room for a loaded CI machine and still fails a run that has not converged.
    assert best <= loss <= 1.05 * sync
    assert sync <= 1.01 * best


@needs_rpc
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_failed_worker_ends_the_run_with_a_clear_error(how):
    settings = dict(SETTINGS, fail=(how, 30))
    messages, exitcodes, elapsed = run_processes(downpour, 3, (free_port(), settings), 60)
    errors = [m[2] for m in messages if m[0] == "error"]
    assert not errors, "\n".join(errors)
    (_, _, failed_at), = [m for m in messages if m[0] == "failing"]
    stopped = {m[1]: m for m in messages if m[0] == "stopped"}
    assert sorted(stopped) == [0, 1], messages
    reason = ("worker 'worker2' failed: ValueError: worker broke on purpose" if how == "raise"
              else "no word from ['worker2'] for more than 3 s (worker_timeout): presumed dead")
    assert stopped[0][3] == f"Downpour SGD failed: {reason}"
    assert stopped[1][3].startswith("worker 'worker1', at ")
    assert stopped[1][3].endswith(f"the Downpour run has stopped: {reason}")
    # a raise is reported at once; a death is noticed after worker_timeout (3 s) of silence
    bound = 5 if how == "raise" else SETTINGS["worker_timeout"] + 5
    assert all(m[2] - failed_at < bound for m in stopped.values())
    assert exitcodes == [0, 0, 0 if how == "raise" else -9]
    assert elapsed < 30
