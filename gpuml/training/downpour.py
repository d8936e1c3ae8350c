"""Downpour SGD: asynchronous workers around a parameter server that applies Adagrad.

Jeffrey Dean et al., *Large Scale Distributed Deep Networks*, NeurIPS 2012 (DistBelief), as
presented in Joseph E. Gonzalez, *Distributed Deep Learning (part 1)*, UC Berkeley lecture:
each model replica works through its own part of the data on its own schedule; it asks the
parameter server for the current parameters every ``n_fetch`` steps and sends it the gradients
it accumulated every ``n_push`` steps; the server applies each push as it arrives, with
Adagrad (one learning rate per parameter, ``lr / sqrt(sum of squared gradients)``), which the
paper credits for keeping the asynchronous, stale updates stable. Between fetches a replica
computes its gradients at the parameters it last fetched.

Built on ``torch.distributed.rpc`` (TensorPipe; tensors travel on the CPU) and
``torch.optim.Adagrad``; there is no communication code here beyond ``rpc_sync`` calls.
DistBelief shards the parameters over many servers; here one server holds them all (several
servers would partition the parameter list, each running the same loop). Its warm start (one
replica alone before the others join) is not implemented.

Failures end the run in bounded time: every worker sends a heartbeat every ``heartbeat``
seconds; the server declares a worker dead after ``worker_timeout`` seconds of silence, a
worker that raises reports it, and from then on every call to the server raises
:class:`PeerFailureError` with the reason, so every worker stops at its next call or
heartbeat and :meth:`ParameterServer.serve` raises too.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Iterable, Sequence

import torch
import torch.distributed.rpc as rpc

from gpuml.errors import PeerFailureError

# The server of this process; the RPC handlers below (module level, so that RPC can name them)
# reach it through here. A worker may call before the server object exists: init_rpc returns
# on every process at once, and the server may still be building its model.
_ACTIVE: ParameterServer | None = None
_STOPPED: str | None = None  # why the last server of this process stopped
_ACTIVE_SET = threading.Condition()
_STARTUP_WAIT_S = 120.0


class _Stopped(PeerFailureError):
    """The run has stopped. Over RPC the reason goes back to the worker as a value, not as a
    remote exception (torch prints every exception a remote call raises, with its traceback);
    called in the server's process, the methods raise it as a :class:`PeerFailureError`."""


def _server() -> ParameterServer:
    with _ACTIVE_SET:
        if not _ACTIVE_SET.wait_for(lambda: _ACTIVE is not None or _STOPPED is not None,
                                    timeout=_STARTUP_WAIT_S):
            raise _Stopped(f"no ParameterServer in process {rpc.get_worker_info().name!r} "
                           f"(none created within {_STARTUP_WAIT_S:.0f} s)")
        if _ACTIVE is None:
            raise _Stopped(_STOPPED)
        return _ACTIVE


def _handler(method: str):
    """The module-level function RPC calls for ``ParameterServer.<method>``: it returns
    ``(None, result)``, or ``(reason, None)`` once the run has stopped."""

    def handler(worker: str, *args):
        try:
            return None, getattr(_server(), method)(worker, *args)
        except _Stopped as stop:
            return str(stop), None

    # RPC pickles a function by its qualified name: make it this module's attribute name.
    handler.__name__ = handler.__qualname__ = f"_{method}"
    return handler


_fetch = _handler("fetch")
_push = _handler("push")
_heartbeat = _handler("heartbeat")
_finish = _handler("finish")
_fail = _handler("fail")


def _positive(name: str, value, kind=(int, float)):
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return value


class ParameterServer:
    """Hold the parameters, apply every worker's push with Adagrad, serve fetches.

    Create it in the process whose RPC name the workers are given (before or after
    ``rpc.init_rpc``), then call :meth:`serve`, which returns when every worker has finished.
    One per process at a time.

    Parameters
    ----------
    params : iterable of Tensor
        The parameters (e.g. ``model.parameters()``), updated in place; on the CPU.
    workers : sequence of str
        RPC names of the workers that will push and fetch; the run is over when each of
        them has called :meth:`DownpourWorker.finish`.
    lr, lr_decay, weight_decay, initial_accumulator_value, eps
        Adagrad's settings (``torch.optim.Adagrad``), applied to each push.
    worker_timeout : float, default 30
        Seconds of silence (no call, no heartbeat) after which a worker counts as dead and the
        run fails.

    Attributes
    ----------
    updates : int
        Pushes applied so far.
    pushes : dict
        Pushes applied per worker.

    References
    ----------
    Jeffrey Dean, Greg S. Corrado, Rajat Monga, Kai Chen, Matthieu Devin, Quoc V. Le,
    Mark Z. Mao, Marc'Aurelio Ranzato, Andrew Senior, Paul Tucker, Ke Yang, Andrew Y. Ng,
    *Large Scale Distributed Deep Networks*, NeurIPS 2012 (Downpour SGD, §4.1).
    """

    def __init__(self, params: Iterable[torch.Tensor], workers: Sequence[str], *,
                 lr: float = 0.01, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10,
                 worker_timeout: float = 30.0):
        global _ACTIVE, _STOPPED
        self.params = list(params)
        if not self.params:
            raise ValueError("ParameterServer: no parameters given")
        for p in self.params:
            if p.device.type != "cpu":
                raise ValueError(f"ParameterServer keeps its parameters on the CPU (TensorPipe "
                                 f"sends CPU tensors); got one on {p.device}")
        if isinstance(workers, str) or not workers or len(set(workers)) != len(workers):
            raise ValueError(f"workers must be a non-empty sequence of distinct RPC names, "
                             f"got {workers!r}")
        self.workers = list(workers)
        self.worker_timeout = float(_positive("worker_timeout", worker_timeout))
        self._optimizer = torch.optim.Adagrad(
            self.params, lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value, eps=eps)
        self._cond = threading.Condition()
        self._started = time.monotonic()
        self._last_seen = dict.fromkeys(self.workers, self._started)
        self._finished: set[str] = set()
        self._told: set[str] = set()
        self._failure: str | None = None
        self.updates = 0
        self.pushes = dict.fromkeys(self.workers, 0)
        with _ACTIVE_SET:
            if _ACTIVE is not None:
                raise RuntimeError("a ParameterServer is already serving in this process")
            _ACTIVE, _STOPPED = self, None
            _ACTIVE_SET.notify_all()

    # -- handlers, run on RPC threads ------------------------------------------------------

    def _contact(self, worker: str) -> None:
        """Note that ``worker`` is alive; raise if the run has failed. Holds the lock."""
        if worker not in self._last_seen:
            raise ValueError(f"{worker!r} is not one of this server's workers {self.workers}")
        self._last_seen[worker] = time.monotonic()
        if self._failure is not None:
            self._told.add(worker)
            raise _Stopped(f"the Downpour run has stopped: {self._failure}")

    def fetch(self, worker: str) -> list[torch.Tensor]:
        with self._cond:
            self._contact(worker)
            # Copies: the reply is serialized after the lock is released, while pushes go on.
            return [p.detach().clone() for p in self.params]

    def push(self, worker: str, grads: list[torch.Tensor]) -> None:
        with self._cond:
            self._contact(worker)
            if len(grads) != len(self.params) or any(
                    g.shape != p.shape for g, p in zip(grads, self.params)):
                raise ValueError(
                    f"{worker!r} pushed gradients of shapes {[tuple(g.shape) for g in grads]}; "
                    f"the server's parameters have {[tuple(p.shape) for p in self.params]}")
            for p, g in zip(self.params, grads):
                p.grad = g.to(p.dtype)
            self._optimizer.step()
            for p in self.params:
                p.grad = None
            self.updates += 1
            self.pushes[worker] += 1

    def heartbeat(self, worker: str) -> None:
        with self._cond:
            self._contact(worker)

    def finish(self, worker: str, grads: list[torch.Tensor] | None) -> None:
        if grads is not None:
            self.push(worker, grads)
        with self._cond:
            self._contact(worker)
            self._finished.add(worker)
            self._cond.notify_all()

    def fail(self, worker: str, message: str) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = f"worker {worker!r} failed: {message}"
            self._told.add(worker)
            self._cond.notify_all()

    # -- the serving loop, on the caller's thread ------------------------------------------

    def _silent_workers(self, now: float) -> list[str]:
        return [w for w in self.workers if w not in self._finished
                and now - self._last_seen[w] > self.worker_timeout]

    def serve(self, timeout: float | None = None, poll: float = 0.2) -> list[torch.Tensor]:
        """Apply pushes until every worker has finished; return the parameters.

        Raises :class:`PeerFailureError` when a worker failed (it reported an exception, or
        was silent for ``worker_timeout`` seconds) or the run took longer than ``timeout``
        seconds; before raising it keeps answering for up to ``worker_timeout`` seconds, until
        every live worker has been told, so that they stop with the reason rather than with a
        broken connection. Either way the server is then closed (another may be created).

        ``poll``: seconds between checks for silent workers.
        """
        try:
            with self._cond:
                while self._failure is None and len(self._finished) < len(self.workers):
                    now = time.monotonic()
                    silent = self._silent_workers(now)
                    if silent:
                        self._failure = (f"no word from {silent} for more than "
                                         f"{self.worker_timeout:g} s (worker_timeout): "
                                         "presumed dead")
                    elif timeout is not None and now - self._started > timeout:
                        self._failure = f"the run took longer than serve(timeout={timeout:g} s)"
                    else:
                        self._cond.wait(poll)
                if self._failure is None:
                    return self.params
                deadline = time.monotonic() + self.worker_timeout
                while time.monotonic() < deadline:
                    now = time.monotonic()
                    waiting = [w for w in self.workers if w not in self._told
                               and w not in self._finished and w not in self._silent_workers(now)]
                    if not waiting:
                        break
                    self._cond.wait(poll)
                raise PeerFailureError(f"Downpour SGD failed: {self._failure}")
        finally:
            self.close()

    def close(self) -> None:
        """Stop answering (later calls get "stopped"); :meth:`serve` does it on return."""
        global _ACTIVE, _STOPPED
        with _ACTIVE_SET:
            if _ACTIVE is self:
                _ACTIVE = None
                _STOPPED = (f"the Downpour run has stopped: {self._failure}" if self._failure
                            else "the parameter server has finished serving")
                _ACTIVE_SET.notify_all()


class DownpourWorker:
    """One model replica of Downpour SGD: fetch every ``n_fetch`` steps, push every ``n_push``.

    Call :meth:`step` after each ``loss.backward()`` (instead of ``optimizer.step()``): it
    adds the gradients to the accumulator, pushes the sum every ``n_push`` steps and fetches
    the server's parameters every ``n_fetch`` steps (push first when both fall due, so the
    fetch includes this replica's own update). Use it as a context manager, or call
    :meth:`finish` at the end; leaving the ``with`` block by an exception reports the failure
    to the server, which stops the other workers.

    Parameters
    ----------
    params : iterable of Tensor
        The replica's parameters (``model.parameters()``), overwritten by each fetch; any
        device (gradients travel to the server on the CPU).
    server : str, default "ps"
        RPC name of the process running :class:`ParameterServer`.
    n_fetch, n_push : int, default 1
        Steps between fetches and between pushes (Dean et al. 2012: n_fetch and n_push).
    heartbeat : float, default 1.0
        Seconds between the background heartbeats that tell the server this worker is alive;
        well below the server's ``worker_timeout``.
    timeout : float, default 60
        Seconds an RPC to the server may take before it counts as failed.

    Attributes
    ----------
    steps : int
        Calls to :meth:`step` so far.
    name : str
        This worker's RPC name.
    """

    def __init__(self, params: Iterable[torch.Tensor], server: str = "ps", *, n_fetch: int = 1,
                 n_push: int = 1, heartbeat: float = 1.0, timeout: float = 60.0):
        self.params = list(params)
        if not self.params:
            raise ValueError("DownpourWorker: no parameters given")
        self.n_fetch = _positive("n_fetch", n_fetch, int)
        self.n_push = _positive("n_push", n_push, int)
        self.heartbeat = float(_positive("heartbeat", heartbeat))
        self.timeout = float(_positive("timeout", timeout))
        if not rpc.is_available():
            raise RuntimeError("torch.distributed.rpc is not available in this build of torch")
        try:
            self.name = rpc.get_worker_info().name
        except RuntimeError as err:
            raise RuntimeError("DownpourWorker needs RPC: call torch.distributed.rpc.init_rpc "
                               "(or gpuml.training.rpc_session) first") from err
        self.server = server
        self.steps = 0
        self._pending = 0
        self._accumulated = [torch.zeros_like(p) for p in self.params]
        self._closed = False
        self._stop = threading.Event()
        self._heartbeat_error: BaseException | None = None
        self.fetch()
        self._beat = threading.Thread(target=self._beat_loop, name=f"{self.name}-heartbeat",
                                      daemon=True)
        self._beat.start()

    def _call(self, handler, *args, timeout: float | None = None):
        what = handler.__name__.lstrip("_")
        try:
            stopped, result = rpc.rpc_sync(self.server, handler, args=(self.name, *args),
                                           timeout=self.timeout if timeout is None else timeout)
        except RuntimeError as err:
            raise PeerFailureError(
                f"worker {self.name!r}: {what} to the parameter server {self.server!r} failed "
                f"(dead, hung or unreachable; RPC timeout {self.timeout:g} s): {err}") from err
        if stopped is not None:
            raise PeerFailureError(f"worker {self.name!r}, at {what}: {stopped}")
        return result

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                self._call(_heartbeat)
            except Exception as err:  # the main thread raises it at its next step
                self._heartbeat_error = err
                return

    def fetch(self) -> None:
        """Overwrite the replica's parameters with the server's."""
        values = self._call(_fetch)
        if len(values) != len(self.params) or any(
                v.shape != p.shape for v, p in zip(values, self.params)):
            raise ValueError(
                f"the server's parameters have shapes {[tuple(v.shape) for v in values]}; this "
                f"replica's have {[tuple(p.shape) for p in self.params]}")
        with torch.no_grad():
            for p, v in zip(self.params, values):
                p.copy_(v)

    def push(self) -> None:
        """Send the gradients accumulated since the last push (their sum)."""
        self._call(_push, [a.cpu() for a in self._accumulated])
        self._reset()

    def _reset(self) -> None:
        for a in self._accumulated:
            a.zero_()
        self._pending = 0

    def step(self) -> None:
        """Accumulate this step's gradients; push and fetch when they fall due."""
        if self._closed:
            raise RuntimeError(f"worker {self.name!r} has finished")
        if self._heartbeat_error is not None:
            raise self._heartbeat_error
        with torch.no_grad():
            for a, p in zip(self._accumulated, self.params):
                if p.grad is not None:
                    a.add_(p.grad)
        self.steps += 1
        self._pending += 1
        if self.steps % self.n_push == 0:
            self.push()
        if self.steps % self.n_fetch == 0:
            self.fetch()

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        if self._beat.is_alive() and self._beat is not threading.current_thread():
            self._beat.join()

    def finish(self) -> None:
        """Push what is left and tell the server this worker is done."""
        if self._closed:
            return
        self._closed = True
        self._stop_heartbeat()
        grads = [a.cpu() for a in self._accumulated] if self._pending else None
        self._call(_finish, grads)
        self._reset()

    def fail(self, message: str) -> None:
        """Tell the server this worker failed (best effort: the server may be gone)."""
        if self._closed:
            return
        self._closed = True
        self._stop_heartbeat()
        with contextlib.suppress(Exception):
            self._call(_fail, message, timeout=min(self.timeout, 10.0))

    def __enter__(self) -> DownpourWorker:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            self.finish()
        else:
            self.fail(f"{exc_type.__name__}: {exc}")
        return False


@contextlib.contextmanager
def rpc_session(name: str, rank: int, world_size: int, *, init_method: str | None = None,
                rpc_timeout: float = 60.0, shutdown_timeout: float = 60.0):
    """``rpc.init_rpc`` on entry (TensorPipe), ``rpc.shutdown`` on exit: graceful (waiting
    up to ``shutdown_timeout`` s for every process) after success, local after an exception,
    so that a failed run does not wait for peers that are gone.

    ``init_method``: e.g. ``"tcp://127.0.0.1:29500"``; ``None`` reads ``MASTER_ADDR`` and
    ``MASTER_PORT`` from the environment (``env://``, what ``torchrun`` sets).
    """
    options = rpc.TensorPipeRpcBackendOptions(
        rpc_timeout=rpc_timeout, **({"init_method": init_method} if init_method else {}))
    with warnings.catch_warnings():
        # torch's own TensorPipe set-up gathers over a bare ProcessGroupGloo and warns about
        # that deprecated use (torch 2.13); nothing the caller did or can change.
        warnings.filterwarnings("ignore", message="You are using a Backend",
                                category=UserWarning)
        rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    ok = False
    try:
        yield
        ok = True
    finally:
        rpc.shutdown(graceful=ok, timeout=shutdown_timeout if ok else 0)
