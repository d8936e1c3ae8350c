"""Reading device scalars back to the host without draining the GPU's queue.

An iterative method that decides on the host whether to go on (k-means'
centre shift) would, read naively, stop the host at every step until the GPU
has finished everything queued so far: ``float(x)`` copies on the current
stream, behind all the work queued after ``x`` was computed. Here a loop
instead takes a *reader* of the value when it is computed and calls it one
step later, after queueing the next step: the reader waits only for the work
that computed the value (an event) and copies it on a side stream, so the GPU
always has the next step queued while the host waits. On the host the value
is read at once and the loop runs no step ahead (:func:`read_lag` is 0), so
the NumPy path runs exactly as a plain loop would.
"""

from __future__ import annotations

import functools

from .._backend import is_cupy_array


def read_lag(like) -> int:
    """Steps a loop should run ahead of its readings where ``like`` lives (host 0, GPU 1).

    A loop that runs ``k`` steps ahead may have computed up to ``k`` steps it
    then throws away (their result is not wanted once the reading says stop),
    so a GPU loop keeps the results of its unread steps and goes back to the
    one its stopping rule picks.
    """
    return 1 if is_cupy_array(like) else 0


def read_later(x):
    """A callable returning ``float(x)`` for a scalar (0-d or 1-element) array ``x``.

    On the host the value is read now. On a GPU the call waits for the work
    queued before this function was called (not for work queued since) and
    copies the value on a non-blocking side stream, which the legacy default
    stream does not synchronise with.
    """
    if not is_cupy_array(x):
        value = float(x)
        return lambda: value
    return _DeviceRead(x)


class _DeviceRead:
    __slots__ = ("_x", "_event")

    def __init__(self, x):
        import cupy

        self._x = x  # held until read: the pool must not hand its memory to later work
        self._event = cupy.cuda.Event(disable_timing=True)
        self._event.record()

    def __call__(self) -> float:
        self._event.synchronize()
        stream = _side_stream(self._x.device.id)
        return float(self._x.reshape(1).get(stream=stream)[0])


@functools.cache
def _side_stream(device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.cuda.Stream(non_blocking=True)


__all__ = ["read_lag", "read_later"]
