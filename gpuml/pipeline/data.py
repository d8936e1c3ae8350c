"""What the steps of a partitioned fit hand each other: the data, and the parts' fits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .._backend import CPU, Backend


@dataclass
class FitData:
    """The validated training data of one fit, as its executor holds it.

    ``X``: the rows (on the fitting device in process, on the host for a device
    group or a stream of parts, the workers' chunks on Dask); ``n`` rows of
    ``n_features``, stored ``itemsize`` bytes a value. ``targets`` and
    ``weights``: per row, in this process (None on Dask: the chunks hold them);
    a classifier's targets are the class index of each row, and ``weights`` the
    sample weights (None: none given). ``stats``: what data-driven defaults read
    (``shape`` and ``var()``: X itself in memory, the chunks' summaries on Dask).
    A classifier's sorted ``classes``, the rows of each (``class_counts``) and
    ``class_index``, the class of every row in this process (the targets in
    memory; on Dask, gathered from the chunks). ``backend``: where in-memory rows
    live. ``features``: where scikit-learn reads the feature names and count of
    chunked input (its metadata); None when the estimator's own validation did.
    ``n_parts``: the number of parts P (set once chosen). ``sparse``: the rows
    are a sparse matrix. ``sample(rows)``: rows ``rows`` of X, the targets and
    the weights as arrays of the fitting device (a small subsample: a search of
    λ on it), where the estimator's validation provides it.
    """

    X: object
    n: int
    n_features: int
    targets: object = None
    weights: object = None
    stats: object = None
    classes: np.ndarray | None = None
    class_counts: np.ndarray | None = None
    class_index: np.ndarray | None = None
    backend: Backend | None = None
    features: object = None
    n_parts: int | None = None
    itemsize: int = 8
    sparse: bool = False
    sample: Callable | None = None


@dataclass
class FitResult:
    """The parts' fits of one solver in part order, on ``backend``, and where each was fitted.

    ``solver``: the :class:`~gpuml.pipeline.PartSolver` that fitted them (its
    settings). ``part_device``/``devices``: a device group's index of each part
    and its devices; ``device_fits``: there, each part's ``(backend, fit)`` as
    its device holds it (before :meth:`~gpuml.pipeline.PartSolver.to_host`: an
    estimator may keep its arrays for prediction there). ``part_worker``: the
    Dask worker that fitted each part. ``centers``: the parts' centres when the
    fit computed them (on Dask, the fit tasks sum their parts' rows); None when
    the split gave them. ``kept``: on Dask, for a solver that keeps its parts on
    the workers, one ``(part_ids, future)`` per group fitted there (``fits`` then
    holds each part's summary). ``reported``: the solver reported each part to
    its progress as the part ended. ``layers``: a layered fit's record (the
    solver's own type; ``fits`` then holds the last layer's).
    """

    fits: list
    solver: object = None
    backend: Backend = CPU
    part_device: np.ndarray | None = None
    devices: list | None = None
    device_fits: list | None = None
    part_worker: np.ndarray | None = None
    centers: object = None
    kept: list | None = None
    reported: bool = False
    layers: object = None

    def take(self, k: int, solver) -> FitResult:
        """The fits of setting ``k`` of a solver that fits several at once (its
        ``n_settings``; each part's fit a tuple, one per setting), named as ``solver``'s:
        the same parts, placed where they were. Handed over: this result forgets them, so
        that a setting's part fits go once its model is assembled and dropped (a search
        holds one setting's model at a time, not every setting's)."""
        if self.kept is not None or self.layers is not None:
            raise ValueError("the fits of a layered solve, or of parts kept on Dask workers, "
                             "hold one setting")
        device_fits = (None if self.device_fits is None else
                       [(backend, fit[k]) for backend, fit in self.device_fits])
        one = replace(self, fits=[fit[k] for fit in self.fits], solver=solver,
                      device_fits=device_fits, reported=False)
        self.fits = [fit[:k] + (None,) + fit[k + 1:] for fit in self.fits]
        if self.device_fits is not None:
            self.device_fits = [(backend, fit[:k] + (None,) + fit[k + 1:])
                                for backend, fit in self.device_fits]
        return one
