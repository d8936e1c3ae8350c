"""Prediction where a fitted model lives: its device, or the devices of its fit.

A partitioned model is fitted arrays on the host (or on its one fitting GPU)
and, for prediction, copies of them on the devices that predict
(:func:`on_device`: a cache per device, never pickled). A model fitted on a
device group predicts there: every row routed to its part in row shards, one
per device (:func:`route_on_devices`), then predicted on its part's device
(:func:`predict_on_devices`). Pickled, a model's device arrays travel as NumPy
(:func:`host_state`) and go back onto the fitting GPU when it is there
(:func:`state_on_device`). These helpers are the only place the estimators'
prediction learns which device it is on; the estimators ask them.
"""

from __future__ import annotations

import numpy as np

from .._backend import CPU, from_device, resolve, resolve_devices, to_numpy
from ..distributed import DeviceGroup
from ..distributed.placement import shard_bounds
from ..kernels import threads_for
from ..routing import route


def on_device(estimator, backend, key, make, *args, host: bool = False):
    """``make(*args)`` run with ``backend`` current and cached on the estimator per device.

    For fitted arrays copied to a GPU for prediction, and (``host=True``) for arrays
    derived from the fitted ones that every prediction on the CPU would otherwise make
    again (the support vectors split by part): a cache, not part of the model (the
    estimators drop ``_device_cache`` when pickled or refitted). Otherwise on the CPU the
    result of ``make(*args)`` is returned as is.
    """
    if not backend.is_gpu and not host:
        return make(*args)
    cache = estimator.__dict__.setdefault("_device_cache", {})
    key = (backend.device,) + tuple(key)
    if key not in cache:
        with backend.use():
            cache[key] = make(*args)
    return cache[key]


def gpu_compute_dtype(backend, X, model_dtype):
    """The dtype kernel values are computed in for prediction on ``backend``.

    On a GPU, float32 input is computed in float32 (the kernel GEMM, the bulk of
    the work, at float32 speed) even for a model fitted on float64; the decision
    values are still accumulated in float64 (``K @ dual_coef`` against the
    float64 coefficients). float64 input is the way to ask for float64. On the
    CPU the model's dtype is kept, so the CPU result is the float64 oracle.
    """
    if backend.is_gpu and X.dtype == np.float32:
        return np.dtype(np.float32)
    return np.dtype(model_dtype)


def block_threads(backend, n_jobs, n, min_rows, most) -> int:
    """Host threads that predict ``n`` rows in blocks on ``backend``: one on a GPU (the
    device runs the blocks in turn), else :func:`gpuml.kernels.threads_for`."""
    return 1 if backend.is_gpu else threads_for(n_jobs, n, min_rows, most)


def on_host(backend, X) -> bool:
    """Whether ``X`` are dense NumPy rows predicted on the CPU: what compiled host loops
    (:mod:`gpuml.kernels.nearest`) take."""
    return not backend.is_gpu and isinstance(X, np.ndarray)


def host_state(state: dict) -> dict:
    """A model's state with its device arrays as NumPy (what a pickle holds)."""
    return {k: from_device(v) for k, v in state.items()}


def state_on_device(state: dict, names) -> dict:
    """A loaded model's state on its fitting device (``device_``) when that device is
    here, else on the CPU (``device_`` says which): the arrays ``names`` copied there."""
    device = state.get("device_")
    if device in (None, "cpu"):
        return state
    try:
        backend = resolve(device)
    except RuntimeError:
        backend = CPU
    state = dict(state, device_=backend.device)
    if backend.is_gpu:
        with backend.use():
            state.update({k: backend.asarray(state[k]) for k in names if k in state})
    return state


def prediction_group(devices) -> DeviceGroup | None:
    """The devices a model fitted on several devices predicts on.

    None for a one-device model, and where those devices are not there (a model
    unpickled on another machine): it then predicts on one device from its host
    arrays.
    """
    if devices is None:
        return None
    try:
        return DeviceGroup(resolve_devices(list(devices)))
    except RuntimeError:
        return None


def route_on_devices(group, X, centers) -> np.ndarray:
    """Part index of every row of host ``X``, routed in row shards, one per device (host)."""
    if centers.shape[0] == 1:
        return np.zeros(X.shape[0], dtype=np.int64)
    bounds = shard_bounds(X.shape[0], group.size)

    def work(rank, backend):
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        if hi == lo:
            return np.zeros(0, dtype=np.int64)
        return route(backend.asarray(X[lo:hi]), backend.asarray(centers))

    return np.concatenate(group.run(work))


def predict_on_devices(group, X, owner, part_device, predict_local) -> np.ndarray:
    """Prediction over several devices: rows grouped by their part's device, results in row
    order.

    ``predict_local(backend, X_rows, owner_rows)`` gets one device's rows (on
    that device) and their parts, and returns their values; every device runs
    once, in its own thread. The result is a host array.
    """
    device_of_row = np.asarray(part_device)[owner]

    def work(rank, backend):
        rows = np.flatnonzero(device_of_row == rank)
        if rows.size == 0:
            return rows, None
        values = predict_local(backend, backend.asarray(X[rows]), owner[rows])
        return rows, to_numpy(values)

    out = None
    for rows, values in group.run(work):
        if values is None:
            continue
        if out is None:
            out = np.empty((X.shape[0],) + values.shape[1:], dtype=values.dtype)
        out[rows] = values
    return out
