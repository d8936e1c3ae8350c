"""A stand-in partitioned estimator for the pipeline's tests: ridge regression per part.

:class:`PartRidge` supplies the contract of :class:`gpuml.pipeline.PartitionedEstimator`
and nothing else: per part, ``min |W^1/2 (y - [X 1] b)|^2 + lam |b|^2`` solved by
NumPy (:func:`ridge`, the reference the tests compare with), prediction by the
nearest part's centre. Its settings ask for the capabilities not every executor
has (``kernel_matrix``, ``layered``, ``probability``), so the tests see each
executor refuse them; its settings of λ are solved together by one solver of several
settings (:class:`RidgePathSolver`) when the fit asks for it. Workers of a Dask cluster
get its solver by value (``cloudpickle.register_pickle_by_value``): this module is not
importable there.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import validate_data

from gpuml._backend import to_numpy
from gpuml.partition import Partitioning
from gpuml.pipeline import (
    Capability,
    FitData,
    FitResult,
    Need,
    PartCost,
    PartitionedEstimator,
    PartSolver,
)
from gpuml.pipeline.fit import fit_partitioned
from gpuml.routing import route


def integer_rows(n, seed=0):
    """``X`` of integer values (the parts' centres are then exact sums, whatever their order),
    a linear ``y`` with noise and positive weights ``w``."""
    rng = np.random.default_rng(seed)
    X = rng.integers(-20, 20, size=(n, 4)).astype(np.float64)
    y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + rng.normal(size=n)
    return X, y, rng.uniform(0.5, 2.0, size=n)


def ridge(X, y, w, lam):
    """The reference: ``(A' W A + lam I) b = A' W y`` with ``A = [X 1]`` (NumPy)."""
    A = np.hstack([X, np.ones((X.shape[0], 1))])
    w = np.ones(X.shape[0]) if w is None else w
    return np.linalg.solve(A.T @ (w[:, None] * A) + lam * np.eye(A.shape[1]), A.T @ (w * y))


@dataclass
class PartLine:
    """One part's fit: its coefficients (the intercept last) and its rows' count."""

    coef: np.ndarray
    rows: int


@dataclass
class RidgeCost(PartCost):
    """Linear in the rows: their bytes, a row's weight to place them."""

    name: str = "PartRidge"

    def weights(self, sizes, n_features):
        return np.asarray(sizes, dtype=np.float64)

    def part_bytes(self, sizes, n_features, itemsize):
        return np.asarray(sizes, dtype=np.int64) * (n_features + 1) * itemsize

    def worker_bytes(self, n_features, itemsize):
        return lambda sizes: int(np.sum(sizes)) * (n_features + 1) * itemsize


@dataclass
class RidgeSolver(PartSolver):
    """:func:`ridge` of each part; ``layered``: one more layer, a fit of all the parts' rows
    (the stand-in of a tree method)."""

    lam: float
    cost: RidgeCost
    layers: bool = False

    @property
    def layered(self):
        return self.layers

    def solve(self, backend, X, targets, weights, part_rows, part_ids, progress=None):
        X, y = to_numpy(X), to_numpy(targets)
        w = None if weights is None else to_numpy(weights)
        fits = []
        for k, idx in enumerate(part_rows):
            fits.append(PartLine(ridge(X[idx], y[idx], None if w is None else w[idx], self.lam),
                                 len(idx)))
            if progress is not None:
                progress.update(int(part_ids[k]), f"{len(idx)} rows")
        return fits

    def solve_layers(self, backend, X, targets, weights, partitioning):
        first = self.solve(backend, X, targets, weights, partitioning.parts,
                           np.arange(len(partitioning.parts)))
        rows = np.sort(np.concatenate(partitioning.parts))
        root = self.solve(backend, X, targets, weights, [rows], [0])
        one = Partitioning(np.zeros(len(rows), dtype=np.int64),
                           np.asarray(X).mean(axis=0, keepdims=True), [rows])
        return FitResult(root, solver=self, backend=backend, reported=True,
                         layers=(one, first))


@dataclass
class KeptLine:
    """What a Dask worker keeps of a part with :class:`KeptRidgeSolver`: the fit, and the
    part's rows, targets and training indices as the worker saw them."""

    coef: np.ndarray
    X: np.ndarray
    y: np.ndarray
    row_ids: np.ndarray


@dataclass
class KeptRidgeSolver(RidgeSolver):
    """:class:`RidgeSolver` whose parts stay on the Dask workers, with their rows' training
    indices; the client keeps each part's coefficients."""

    keeps_parts_on_workers = True
    keeps_row_ids = True

    def keep(self, fit, X_part, targets_part, row_ids):
        return KeptLine(fit.coef, np.asarray(X_part), np.asarray(targets_part),
                        np.asarray(row_ids))

    def summary(self, fit):
        return PartLine(fit.coef, len(fit.row_ids))


@dataclass
class RidgePathSolver(PartSolver):
    """:func:`ridge` of each part for every λ of ``lams`` at once (a solver of several
    settings): each part's normal equations formed once, solved once per λ."""

    lams: tuple
    cost: RidgeCost

    @property
    def n_settings(self):
        return len(self.lams)

    def solve(self, backend, X, targets, weights, part_rows, part_ids, progress=None):
        X, y = to_numpy(X), to_numpy(targets)
        w = np.ones(X.shape[0]) if weights is None else to_numpy(weights)
        fits = []
        for idx in part_rows:
            A = np.hstack([X[idx], np.ones((len(idx), 1))])
            normal, right = A.T @ (w[idx][:, None] * A), A.T @ (w[idx] * y[idx])
            fits.append(tuple(PartLine(np.linalg.solve(normal + lam * np.eye(A.shape[1]),
                                                       right), len(idx))
                              for lam in self.lams))
        return fits


class PartRidge(PartitionedEstimator, RegressorMixin, BaseEstimator):
    """Ridge regression per part, the parts split by ``partition``; predictions by the
    nearest centre's part."""

    _solve_params = ("lam",)
    _parameter_constraints = {"lam": [Interval(Real, 0.0, None, closed="left")],
                              "n_partitions": [Interval(Integral, 1, None, closed="left")]}

    def __init__(self, lam=1.0, n_partitions=3, partition="kmeans", kernel_matrix=False,
                 layered=False, probability=False, device="cpu", devices=None,
                 max_device_memory=None, random_state=0):
        self.lam = lam
        self.n_partitions = n_partitions
        self.partition = partition
        self.kernel_matrix = kernel_matrix
        self.layered = layered
        self.probability = probability
        self.device = device
        self.devices = devices
        self.max_device_memory = max_device_memory
        self.random_state = random_state

    def fit(self, X, y, sample_weight=None):
        return fit_partitioned(self, X, y, sample_weight)

    def _fit_needs(self, sample_weight=None):
        needs = []
        if self.kernel_matrix:
            needs.append(Need(Capability.KERNEL_MATRIX, "kernel_matrix=True"))
        if self.probability:
            needs.append(Need(Capability.PROBABILITY, "probability=True"))
        if self.layered:
            needs.append(Need(Capability.LAYERS, "layered=True", instead="layered=False"))
        return tuple(needs)

    def _validate(self, X, y, sample_weight, backend):
        X, y = validate_data(self, X, y, dtype=np.float64)
        w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        return FitData(backend.asarray(X), X.shape[0], X.shape[1], targets=y, weights=w,
                       stats=X, backend=backend)

    def _n_parts(self, n, gpu=False):
        return self.n_partitions

    def _split_method(self):
        return self.partition

    def _part_cost(self):
        return RidgeCost(type(self).__name__)

    def _part_solver(self, data):
        self.n_rows_ = data.n
        return RidgeSolver(self.lam, self._part_cost(), layers=self.layered)

    def _solve_together(self, solvers):
        """The λ of solvers that are not layered: one :class:`RidgePathSolver`."""
        single = [k for k, solver in enumerate(solvers) if not solver.layered]
        groups = [(solvers[k], [k]) for k, solver in enumerate(solvers) if solver.layered]
        if len(single) < 2:
            return groups + [(solvers[k], [k]) for k in single]
        path = RidgePathSolver(tuple(solvers[k].lam for k in single), self._part_cost())
        return groups + [(path, single)]

    def _assemble(self, partitioning, result, data):
        self.kept_ = result.kept
        if result.layers is not None:
            partitioning = result.layers[0]
        self.coef_ = np.stack([fit.coef for fit in result.fits])
        self.part_rows_ = [np.asarray(rows) for rows in partitioning.parts]
        self.centers_ = np.asarray(to_numpy(partitioning.centers))
        self.reported_ = result.reported

    def predict(self, X):
        X = validate_data(self, X, reset=False, dtype=np.float64)
        part = route(X, self.centers_)
        return np.einsum("ij,ij->i", np.hstack([X, np.ones((X.shape[0], 1))]),
                         self.coef_[part])


class KeptRidge(PartRidge):
    """:class:`PartRidge` whose parts stay on the Dask workers that fitted them."""

    def _part_solver(self, data):
        self.n_rows_ = data.n
        return KeptRidgeSolver(self.lam, self._part_cost(), layers=self.layered)
