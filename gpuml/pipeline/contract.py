"""The contract of a partitioned fit: what an estimator supplies, what runs it, and where.

Four roles, each an abstract class:

* :class:`PartitionedEstimator`, the estimator: its parameters and rules. It
  checks its input (``_validate``), says how many parts and split how
  (``_n_parts``, ``_split_method``), derives the settings that come from the
  data and hands over a solver with them (``_part_solver``), and turns the
  parts' fits into its fitted attributes (``_assemble``). It says what the fit
  needs that not every executor has (``_fit_needs``: :class:`Need` s, each a
  :class:`Capability` and the setting that asks for it); it never asks where it
  runs.
* :class:`PartSolver`, the solver of one fit's settings (C and γ; σ and λ): it
  fits the local models of given parts on a given device (``solve``). The
  executors run it in this process, in the threads of a device group, or
  shipped to Dask workers (so it pickles, and holds everything its solve reads).
* :class:`PartCost`, what solving parts costs, known from the parameters alone
  (before the data's settings): the weights that place parts on devices and
  workers, the bytes a part takes on a device and on a Dask worker, and the
  refusal of parts too large for a device.
* :class:`Executor`, where the fit runs: it holds the data, splits them, places
  the parts and runs the solvers on them. It declares its ``capabilities`` and
  refuses a fit whose needs it lacks, before any work, naming the setting that
  asks for it (:meth:`Executor.refuse`).

One split, many solves: the estimator's validation and split do not depend on
its ``_solve_params``, so the data of one split serve several solvers, one per
setting (:func:`gpuml.pipeline.fit_settings`): the executor places the parts once
and fits each part with every solver; each solver's :class:`~gpuml.pipeline.FitResult`
is assembled into its own estimator. An ordinary fit is the case of one solver.
A solver may fit several settings at once (``n_settings > 1``: a C path, each
part's kernel values computed once for every C): its fit of a part is then a
tuple of one fit per setting, which the executors carry as any part's fit and
the fit splits into one :class:`~gpuml.pipeline.FitResult` per setting as it
assembles each (:meth:`~gpuml.pipeline.FitResult.take`). The estimator says which of its
settings' solvers one solver fits together (``_solve_together``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from .._backend import Backend
from .._progress import Progress


class Capability(Enum):
    """What a fit may need that not every executor can run."""

    #: the parts are blocks of a precomputed kernel matrix, not rows with features (no
    #: split by distance, no streaming of rows, no routing)
    KERNEL_MATRIX = "parts of a precomputed kernel matrix"
    #: a layered fit: each layer's parts are made from the fits of the layer before
    LAYERS = "layered fits"
    #: calibration after the fit, by refits on the training rows in memory
    PROBABILITY = "probability calibration"
    #: a kernel computed on the CPU by scikit-learn's ``pairwise_kernels``
    HOST_KERNEL = "kernels computed on the CPU"
    #: data-driven settings (a kernel width, λ) read with the sample weights
    WEIGHTED_SETTINGS = "settings weighted by sample_weight"
    #: several devices of this process (``devices=``)
    DEVICE_GROUP = "a group of devices of this process"
    #: the parts streamed through one device under a memory budget (``max_device_memory``)
    STREAM = "parts streamed under a memory budget"


@dataclass(frozen=True)
class Need:
    """A capability a fit needs, and the setting that asks for it.

    ``setting`` names it as the user wrote it (``"kernel='precomputed'"``),
    ``instead`` (optional) a setting that would not need it (``"method='casvm'"``):
    the executor's refusal quotes both.
    """

    capability: Capability
    setting: str
    instead: str | None = None


class PartCost(ABC):
    """What solving parts costs, from the estimator's parameters alone.

    ``name`` is the estimator's class name, which memory refusals quote.
    """

    name: str

    @abstractmethod
    def weights(self, sizes, n_features: int) -> np.ndarray:
        """The relative cost of solving each part (placement by Graham's LPT rule,
        :func:`gpuml.distributed.balance`)."""

    @abstractmethod
    def part_bytes(self, sizes, n_features: int, itemsize: int) -> np.ndarray:
        """Device bytes of each part solved alone: its rows and its solve (a stream of parts
        under a memory budget, :class:`gpuml.pipeline.executors.Streamed`)."""

    @abstractmethod
    def worker_bytes(self, n_features: int, itemsize: int) -> Callable[[np.ndarray], int]:
        """``need(sizes)``: the bytes a Dask worker holds to fit parts of these sizes (its
        rows and its solves)."""

    def check_device(self, sizes, itemsize: int, backend: Backend, *, n_samples=None,
                     n_parts=None) -> None:
        """Refuse, before allocating, parts too large for ``backend`` (its free memory).

        ``sizes`` are the part sizes, or before the split ``[ceil(n / P)]`` with
        ``n_samples=n, n_parts=P`` (a lower bound on the largest part). Default: no
        refusal (a solver that sizes its own work to the device).
        """
        return None


class PartSolver(ABC):
    """The local models of parts, for one fit's settings (picklable: it travels to workers).

    ``cost`` is its :class:`PartCost`. ``progress`` (optional) is where it
    reports each part as the part ends, when it solves in the thread that called
    ``fit``: the executor passes it to :meth:`solve` then, and None elsewhere (it
    stays in this process: it is not pickled).
    """

    cost: PartCost
    progress: Progress | None = None
    #: on Dask, the fitted parts stay on the workers that fitted them (as :meth:`keep` makes
    #: them); the client gathers each part's :meth:`summary`
    keeps_parts_on_workers: bool = False
    #: what :meth:`keep` makes needs the training index of each of the part's rows (the
    #: client sends them with the part's fit task)
    keeps_row_ids: bool = False
    #: a layered fit (:attr:`Capability.LAYERS`): the executor calls :meth:`solve_layers`
    #: with all the parts instead of :meth:`solve`
    layered: bool = False
    #: the settings one solve fits: with more than one, :meth:`solve` gives each part a
    #: tuple of that many fits, one per setting in order (:meth:`to_host` and
    #: :meth:`summary` take and give such tuples); such a solver is neither layered nor
    #: keeps its parts on Dask workers (the fit splits its results per setting)
    n_settings: int = 1

    @abstractmethod
    def solve(self, backend: Backend, X, targets, weights, part_rows: list, part_ids,
              progress: Progress | None = None) -> list:
        """The local models of the parts ``part_rows`` as one batch on ``backend`` (current).

        ``X``, ``targets`` and ``weights`` (per row, as the data holds them: see
        :class:`~gpuml.pipeline.FitData`; ``weights`` may be None) are the rows
        that ``part_rows[k]``, the positions of part ``part_ids[k]``, index. One fit
        per part, in order.
        """

    def solve_layers(self, backend: Backend, X, targets, weights, partitioning):
        """A layered fit over the parts of ``partitioning``: a
        :class:`~gpuml.pipeline.FitResult` whose ``layers`` holds the solver's record."""
        raise NotImplementedError(f"{type(self).__name__} is not a layered solver")

    def to_host(self, fit, X_part):
        """A part's fit as the host keeps it (``X_part``: the part's host rows)."""
        return fit

    def keep(self, fit, X_part, targets_part, row_ids):
        """What a Dask worker keeps of a part it fitted, when
        :attr:`keeps_parts_on_workers` (``X_part``, ``targets_part``: the part's host rows
        and targets; ``row_ids``: their training indices with :attr:`keeps_row_ids`, else
        None). Default: the part as the host keeps it (:meth:`to_host`)."""
        return self.to_host(fit, X_part)

    def summary(self, fit):
        """What the client keeps of a part that stays on its Dask worker (``fit``: what
        :meth:`keep` made)."""
        return fit

    def __getstate__(self):
        # The progress lines are printed by the thread that called fit: never shipped.
        return {k: v for k, v in self.__dict__.items() if k != "progress"}


class PartitionedEstimator(ABC):
    """What an estimator supplies to the partitioned fit (:func:`gpuml.pipeline.fit_partitioned`).

    A scikit-learn estimator (its parameters checked by ``_parameter_constraints``)
    whose parameters include ``device``, ``devices``, ``max_device_memory`` and
    ``random_state``, which the pipeline reads, with these members:

    ``_fit_needs(sample_weight)``
        optional: the :class:`Need` s of this fit (none by default); settings that
        no executor can run are refused here, before any work;
    ``_validate(X, y, sample_weight, backend)``
        in-memory input checked and placed on ``backend``: a
        :class:`~gpuml.pipeline.FitData` (Dask input is checked chunk by chunk
        on the workers and summarised into the same fields);
    ``_fit_dtype(X)``
        optional: the dtype chunked input is fitted in (default float64);
    ``_n_parts(n, gpu)``, ``_split_method()``
        how many parts (``gpu``: the parts are solved on a GPU), split how;
    ``_part_cost()``
        the :class:`PartCost` of its solver, from the parameters;
    ``_part_solver(data)``
        the settings that come from the data (classes, kernel width, λ) set as
        fitted attributes, and the :class:`PartSolver` with them;
    ``_assemble(partitioning, result, data)``
        the fitted attributes from the parts' fits (a
        :class:`~gpuml.pipeline.FitResult`, in part order);
    ``_finish_fit(data, y, sample_weight)``
        optional: anything after the model (SVC's ``probability=True``);
    ``_solve_together(solvers)``
        optional: the solvers of several settings on one split grouped into
        solvers that fit a group at once (each a :class:`PartSolver` with
        ``n_settings`` fits per part), as ``(solver, members)``: ``members[k]``
        is the index in ``solvers`` of its k-th setting (default: each alone);
    ``_solve_params``
        the parameters that change only the solve and the model, not the
        validation or the split: those :func:`gpuml.pipeline.fit_settings` may vary;
    ``_refit_drops``
        further fitted attributes a refit drops (those not every fit sets).
    """

    _solve_params: tuple = ()
    _refit_drops: tuple = ()

    def _fit_needs(self, sample_weight=None) -> tuple:
        return ()

    def _solve_together(self, solvers) -> list:
        """``(solver, members)`` groups of ``solvers``: by default each alone."""
        return [(solver, [k]) for k, solver in enumerate(solvers)]

    @abstractmethod
    def _validate(self, X, y, sample_weight, backend: Backend):
        """In-memory input checked, on ``backend``: a :class:`~gpuml.pipeline.FitData`."""

    def _fit_dtype(self, X) -> np.dtype:
        return np.dtype(np.float64)

    @abstractmethod
    def _n_parts(self, n: int, gpu: bool = False) -> int:
        """The number of parts P for ``n`` rows."""

    @abstractmethod
    def _split_method(self) -> str:
        """The partitioner (a name of :data:`gpuml.partition.PARTITIONERS`)."""

    @abstractmethod
    def _part_cost(self) -> PartCost:
        """The cost of the solver this estimator's parameters make."""

    @abstractmethod
    def _part_solver(self, data) -> PartSolver:
        """The data-driven settings (set on the estimator) and the solver with them."""

    @abstractmethod
    def _assemble(self, partitioning, result, data) -> None:
        """The fitted attributes from the parts' fits."""

    def _finish_fit(self, data, y, sample_weight) -> None:
        return None


class Executor(ABC):
    """Where a partitioned fit runs: it holds the validated data and runs the split, the
    placement and the parts' fits (:mod:`gpuml.pipeline.executors`,
    :mod:`gpuml.pipeline.dask`).

    ``capabilities``: what it runs beyond independent parts of rows with
    features. ``refusals``: for each capability it lacks, the error it raises
    (a template of ``{setting}``, ``{instead}`` and ``{name}``, the estimator's
    class), checked in that order. ``gpu``: whether the parts are solved on a
    GPU (an estimator's number of parts may follow it).
    """

    capabilities: frozenset = frozenset()
    refusals: dict = {}
    #: the solver reports each part as it ends (it solves in the thread that called fit)
    reports_parts = False
    gpu = False

    def refuse(self, estimator, needs) -> None:
        """Raise ValueError for the first need (in :attr:`refusals`' order) this executor
        cannot run."""
        lacking = {need.capability: need for need in needs
                   if need.capability not in self.capabilities}
        for capability, message in self.refusals.items():
            need = lacking.get(capability)
            if need is not None:
                raise ValueError(message.format(setting=need.setting, instead=need.instead,
                                                name=type(estimator).__name__))
        for need in lacking.values():
            raise ValueError(f"{need.setting} needs {need.capability.value}, which "
                             f"{type(self).__name__} does not run")

    @abstractmethod
    def load(self, estimator, X, y, sample_weight):
        """The input checked (the estimator's ``_validate``, or the layout of chunked
        input): a :class:`~gpuml.pipeline.FitData`."""

    @abstractmethod
    def check_memory(self, costs, data, sizes, n_parts=None) -> None:
        """Refuse, before any work, parts of ``sizes`` that the devices or workers cannot
        hold by each :class:`PartCost` of ``costs``."""

    def summarise(self, estimator, data, n_parts):
        """The data-driven summaries the settings read (in memory: the data as it is)."""
        return data

    @abstractmethod
    def split(self, data, n_parts, method, random_state):
        """The :class:`~gpuml.partition.Partitioning` of the rows into ``n_parts`` parts."""

    @abstractmethod
    def place(self, solvers, data, partitioning):
        """Where each part is fitted (by the solvers' cost model), refusing before any work
        parts that would not fit there: what :meth:`fit_parts` takes."""

    @abstractmethod
    def fit_parts(self, solvers, data, partitioning, placement) -> list:
        """The parts fitted where ``placement`` puts them, by each solver: one
        :class:`~gpuml.pipeline.FitResult` per solver, in order."""
