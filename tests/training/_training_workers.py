"""Process entry points for the multi-process tests (run in spawned children; no pytest here).

Each takes ``(rank, world_size, ..., queue)`` and reports on ``queue``; every failure is
reported too, as ``("error", rank, text)``, so the parent shows what went wrong in a child.
"""

import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from _procs import report_errors

import gpuml.training  # noqa: F401  (preloaded once in the forkserver, not in every child)

# The first optimizer a process builds imports torch._dynamo (some 900 modules, seconds on a
# loaded CI machine): build one here, in the forkserver that preloads this module, once.
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)




def _init_gloo(rank, world, port, timeout_s):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def _local_step(model, opt, gen):
    x = torch.randn(8, 3, generator=gen)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


@report_errors
def households_schedule(rank, world, port, steps, q):
    """Train a replica per rank; report its parameters before and after every averaging call.

    First H=2 households (L_H=2, L_W=6) called by hand; then H=4 in NB=2 neighbourhoods
    (L_H=1, L_N=2, L_W=4) through torch's PostLocalSGDOptimizer.
    """
    from torch.distributed.optim import PostLocalSGDOptimizer

    from gpuml.training import HouseholdAverager

    _init_gloo(rank, world, port, 30)
    gen = torch.Generator().manual_seed(100 + rank)  # each replica its own data: they drift
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    averager = HouseholdAverager(households=2, household_period=2, world_period=6, timeout=30)
    q.put(("layout", rank, averager.household, averager.neighbourhood))
    for _ in range(steps):
        _local_step(model, opt, gen)
        before = _flat(model)
        averager.average_parameters(model.parameters())
        q.put(("A", rank, averager.step, before, _flat(model)))

    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    averager = HouseholdAverager(households=4, household_period=1, world_period=4,
                                 neighbourhoods=2, neighbourhood_period=2, timeout=30)
    opt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), averager)
    for _ in range(steps):
        _local_step(model, opt, gen)
        q.put(("B", rank, averager.step, None, _flat(model)))
    q.put(("state", rank, opt.state_dict()["step"]))
    dist.destroy_process_group()


@report_errors
def households_failing(rank, world, port, timeout_s, how, bad_rank, bad_step, q):
    """H=2 (L_H=1, L_W=4); at step ``bad_step`` rank ``bad_rank`` kills itself
    (``how="kill"``) or stops answering (``how="hang"``); the others report the error they
    stop with and when."""
    from gpuml.training import HouseholdAverager, PeerFailureError

    _init_gloo(rank, world, port, timeout_s)
    gen = torch.Generator().manual_seed(rank)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    averager = HouseholdAverager(2, 1, 4, timeout=timeout_s)
    for step in range(1, 1000):
        if rank == bad_rank and step == bad_step:
            q.put(("failing", rank, time.time()))
            q.close()
            q.join_thread()
            if how == "kill":
                time.sleep(0.2)  # let the peers finish the last average it took part in
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)  # alive but silent: only the group timeout ends the others' wait
        _local_step(model, opt, gen)
        try:
            averager.average_parameters(model.parameters())
        except PeerFailureError as err:
            q.put(("stopped", rank, step, time.time(), str(err)))
            return  # no destroy_process_group: its peers are gone
        time.sleep(0.01)
    q.put(("finished", rank))


def regression_data(n=256, d=8, noise=0.1):
    """A small least-squares problem, the same in every process."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 1, generator=g)
    return x, x @ w + noise * torch.randn(n, 1, generator=g)


def regression_model():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 1)


def mse(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


@report_errors
def downpour(rank, world, port, settings, q):
    """Rank 0 serves the parameters, ranks 1.. are workers on disjoint halves of the data.

    ``settings``: lr, epochs, batch, n_fetch, n_push, worker_timeout, heartbeat, and
    ``fail`` = None | ("kill" | "raise", step): the last worker fails at that step while the
    others train on (slowly) until they are stopped.
    """
    from gpuml.training import (
        DataAssignmentSampler,
        DownpourWorker,
        ParameterServer,
        PeerFailureError,
        rpc_session,
    )

    torch.set_num_threads(1)
    x, y = regression_data()
    model = regression_model()
    workers = [f"worker{r}" for r in range(1, world)]
    fail = settings.get("fail")
    name = "ps" if rank == 0 else workers[rank - 1]
    try:
        with rpc_session(name, rank, world, init_method=f"tcp://127.0.0.1:{port}",
                         rpc_timeout=30, shutdown_timeout=30):
            if rank == 0:
                server = ParameterServer(model.parameters(), workers, lr=settings["lr"],
                                         worker_timeout=settings["worker_timeout"])
                server.serve(timeout=60)
                with torch.no_grad():
                    q.put(("server", rank, mse(model, x, y).item(), server.updates,
                           server.pushes))
                return
            sampler = DataAssignmentSampler(range(len(x)), world - 1, rank - 1, seed=0)
            with DownpourWorker(model.parameters(), "ps", n_fetch=settings["n_fetch"],
                                n_push=settings["n_push"],
                                heartbeat=settings["heartbeat"]) as worker:
                epochs = settings["epochs"] if fail is None else 10**6
                for epoch in range(epochs):
                    sampler.set_epoch(epoch)
                    idx = torch.tensor(list(sampler))
                    for batch in idx.split(settings["batch"]):
                        if fail and name == workers[-1] and worker.steps == fail[1]:
                            q.put(("failing", rank, time.time()))
                            if fail[0] == "kill":
                                q.close()
                                q.join_thread()
                                time.sleep(0.2)  # let its last push be answered
                                os.kill(os.getpid(), signal.SIGKILL)
                            raise ValueError("worker broke on purpose")
                        model.zero_grad()
                        mse(model, x[batch], y[batch]).backward()
                        worker.step()
                        if fail:
                            time.sleep(0.01)
            q.put(("worker", rank, worker.steps))
    except PeerFailureError as err:
        q.put(("stopped", rank, time.time(), str(err)))
    except ValueError as err:
        q.put(("raised", rank, time.time(), str(err)))


def synchronous_adagrad(settings, world_workers=2):
    """The synchronous baseline of the Downpour test: at every step each worker's mini-batch
    gradient, averaged, one Adagrad step: data-parallel SGD with Adagrad, one process."""
    from gpuml.training import DataAssignmentSampler

    x, y = regression_data()
    model = regression_model()
    opt = torch.optim.Adagrad(model.parameters(), lr=settings["lr"])
    samplers = [DataAssignmentSampler(range(len(x)), world_workers, r, seed=0)
                for r in range(world_workers)]
    for epoch in range(settings["epochs"]):
        batches = []
        for s in samplers:
            s.set_epoch(epoch)
            batches.append(torch.tensor(list(s)).split(settings["batch"]))
        for parts in zip(*batches):
            opt.zero_grad()
            for b in parts:
                (mse(model, x[b], y[b]) / world_workers).backward()
            opt.step()
    with torch.no_grad():
        return mse(model, x, y).item()


def least_squares_loss():
    x, y = regression_data()
    xb = torch.cat([x, torch.ones(len(x), 1)], 1)
    w = torch.linalg.lstsq(xb, y).solution
    return torch.nn.functional.mse_loss(xb @ w, y).item()
