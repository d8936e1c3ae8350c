"""What the steps of a partitioned fit hand each other: the data, and the parts' fits."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._backend import CPU, Backend


@dataclass
class FitData:
    """The validated training data of one fit, as its executor holds it.

    ``X`` the rows (on the fitting device in process, on the host for a device
    group, the workers' chunks on Dask); ``targets`` and ``weights`` per row
    (the estimator's own: class indices and C for an SVM, y and
    ``sample_weight`` for kernel ridge; on Dask the chunks hold them).
    ``stats`` is what data-driven defaults read (``shape`` and ``var()``: X
    itself in memory). A classifier's ``classes`` (sorted) and their
    ``class_counts``. ``n_parts``: the number of parts P (set once chosen).
    ``features``: where scikit-learn reads the feature names
    and count of chunked input (its metadata); None when the estimator's own
    validation did. ``extra``: the estimator's and the executor's values for
    this fit; those whose key starts with ``_`` stay in this process.
    """

    X: object
    n: int
    n_features: int
    targets: object = None
    weights: object = None
    stats: object = None
    classes: np.ndarray | None = None
    class_counts: np.ndarray | None = None
    backend: Backend | None = None
    features: object = None
    n_parts: int | None = None
    extra: dict = field(default_factory=dict)

    def for_workers(self) -> FitData:
        """What a part solver on another process reads: the sizes and the shareable
        ``extra`` values, without the rows."""
        return FitData(None, self.n, self.n_features,
                       extra={k: v for k, v in self.extra.items() if not k.startswith("_")})


@dataclass
class FitResult:
    """The parts' fits in part order, on ``backend``, and where each part was fitted.

    ``part_device``/``devices``: a device group's index of each part and its
    devices; ``part_worker``: the Dask worker that fitted each part.
    ``centers``: the parts' centres when the fit computed them (on Dask, the
    fit tasks sum their parts' rows); None when the split gave them.
    ``kept``: on Dask, for an estimator that keeps its parts on the workers, one
    ``(part_ids, future)`` per group fitted there (``fits`` then holds each part's
    summary, without its rows).
    """

    fits: list
    backend: Backend = CPU
    part_device: np.ndarray | None = None
    devices: list | None = None
    part_worker: np.ndarray | None = None
    centers: object = None
    kept: list | None = None
