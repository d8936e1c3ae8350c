"""Process entry points for the tests of ``examples/train_fashion_mnist.py`` (no pytest here).

Each rank joins a gloo group and calls the example's ``train`` as ``torchrun`` would have it
do, with the rank's report on the queue: ``("done", rank, rows, flat parameters)``,
``("stopped", rank, time, text)`` for a :class:`PeerFailureError`, ``("error", rank,
traceback)`` for anything else.
"""

import os
import signal
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from examples.train_fashion_mnist import main, parse_args, train
from gpuml.training import PeerFailureError


def _flat(model):
    """All parameters as one NumPy vector (whole tensors also under FSDP: a collective)."""
    parts = []
    for p in model.parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        parts.append(t.reshape(-1))
    return torch.cat(parts).numpy().copy()


def _fault_callback(rank, fault, q):
    def callback(info):
        if fault and rank in fault[1] and info["step"] == fault[2]:
            q.put(("failing", rank, time.time()))
            q.close()
            q.join_thread()
            if fault[0] == "kill":
                time.sleep(0.2)  # let the peer finish the step it shares with this rank
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)  # alive but silent: only the group timeout ends the wait

    return callback


def run_example(rank, world, port, argv, fault, q):
    """Train with the example's command line ``argv``.

    ``fault``: ``None``, or ``(how, ranks, step)``: after step ``step`` the ranks in
    ``ranks`` kill themselves with SIGKILL (``how="kill"``) or stop answering
    (``how="hang"``).
    """
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        cfg = parse_args(argv)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=cfg.timeout))
        try:
            result = train(cfg, _fault_callback(rank, fault, q))
        except PeerFailureError as err:
            q.put(("stopped", rank, time.time(), str(err)))
            return  # no destroy_process_group: the peer is gone
        q.put(("done", rank, result["rows"], _flat(result["model"])))
        dist.destroy_process_group()
    except BaseException:
        q.put(("error", rank, traceback.format_exc()))
        raise
    finally:
        q.close()
        q.join_thread()


def run_main(rank, world, port, argv, fault, q):
    """The example's ``main(argv)`` with the environment ``torchrun`` gives each process;
    reports ``("exit", rank, status, stderr text)``."""
    import contextlib
    import io

    try:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                          LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
        torch.set_num_threads(1)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = main(argv, _fault_callback(rank, fault, q))
        q.put(("exit", rank, status, err.getvalue()))
    except BaseException:
        q.put(("error", rank, traceback.format_exc()))
        raise
    finally:
        q.close()
        q.join_thread()
