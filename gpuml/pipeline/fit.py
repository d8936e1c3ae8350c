"""The fit of a partitioned estimator: validate, split, place, fit the parts, assemble."""

from __future__ import annotations

from sklearn.utils.validation import validate_data

from .executors import fit_executor

#: Fitted attributes that say where the parts were fitted; a refit sets the ones that apply.
PLACEMENT_ATTRIBUTES = ("devices_", "part_device_", "part_worker_")


class PartitionedFit:
    """``fit`` for the partitioned estimators (You 2020, Alg 5 and Alg 10), written once.

    :meth:`_fit_partitioned` runs the steps below on the executor
    :func:`~gpuml.pipeline.fit_executor` picks; the estimator supplies:

    ``_check_fit(executor, sample_weight)``
        refuse settings the executor cannot run, before any work;
    ``_validate(X, y, sample_weight, backend)``
        in-memory input checked and placed on ``backend``: a
        :class:`~gpuml.pipeline.FitData` (a Dask executor validates its chunks
        itself and summarises them into the same fields);
    ``_chunk_dtype(X)``, ``_chunk_targets(y, w)``, ``_worker_memory_need(d, dtype)``,
    ``_part_solver_reads``
        for chunked input: the dtype its rows are fitted in, a chunk's targets
        and weights as the part solver takes them, the bytes a worker holds for
        parts of given sizes, and the fitted attributes the part solver reads;
    ``_setup(data)``
        the fitted settings that come from the data before the split (classes,
        kernel width, λ, ...), set on the estimator;
    ``_n_parts(n, gpu)``, ``_split_method()``
        how many parts, split how;
    ``_check_fit_memory(sizes, data, backend, n_samples=, n_parts=)``
        refuse, before allocating, parts too large for a device;
    ``_part_costs(sizes, n_features)``
        the cost model that places the parts;
    ``_solve_parts(backend, data, X, targets, weights, part_rows, part_ids)``
        the local models of the given parts, fitted on ``backend`` (``X``,
        ``targets`` and ``weights``: the rows those parts index);
    ``_part_to_host(fit, X_part)``, ``_keep_on_device(backend, j, fit)``
        a part's fit as the host keeps it, and a device copy kept for
        prediction where the part was fitted (device groups);
    ``_keeps_parts_on_workers``, ``_part_summary(fit)``
        on Dask: whether the fitted parts stay on the workers that fitted them,
        and then what the client gets of each (``FitResult.kept`` holds the rest);
    ``_fit_split(executor, data, partitioning)``
        optional: the parts' fits from the split (default: the executor's
        :meth:`fit_parts`; CA-SVM's tree methods layer their parts instead);
    ``_assemble(partitioning, result, data)``
        the fitted attributes from the parts' fits, in part order;
    ``_finish_fit(data, X, y, sample_weight)``
        anything after the model (SVC's ``probability=True``).
    """

    def _fit_partitioned(self, X, y, sample_weight=None):
        executor = fit_executor(self, X, y, sample_weight)
        self._check_fit(executor, sample_weight)
        self._forget_fit()
        data = executor.load(self, X, y, sample_weight)
        if data.features is not None:  # chunked input: its metadata, scikit-learn's rules
            validate_data(self, data.features, skip_check_array=True, reset=True)
        n_parts = self._n_parts(data.n, executor.gpu)
        # No partition of n rows into P parts has a smaller largest part: refuse before work.
        executor.check_memory(self, data, [-(-data.n // n_parts)], n_parts)
        data = executor.summarise(self, data, n_parts)
        data.n_parts = n_parts
        self._setup(data)
        partitioning = executor.split(data, n_parts, self._split_method(), self.random_state)
        result = self._fit_split(executor, data, partitioning)
        if result.centers is not None:
            partitioning.centers = result.centers
        self._assemble(partitioning, result, data)
        for name, value in (("devices_", result.devices), ("part_device_", result.part_device),
                            ("part_worker_", result.part_worker)):
            if value is not None:
                setattr(self, name, value)
        self._finish_fit(data, X, y, sample_weight)
        return self

    def _fit_split(self, executor, data, partitioning):
        return executor.fit_parts(self, data, partitioning)

    def _forget_fit(self):
        """A refit drops the previous model's placement and its device copies; the new
        model's go to a fresh, empty cache (:func:`gpuml.estimators._partitioned.on_device`)."""
        for name in (*PLACEMENT_ATTRIBUTES, *self._refit_drops):
            self.__dict__.pop(name, None)
        self._device_cache = {}

    #: further attributes a refit drops (those not every fit sets)
    _refit_drops: tuple = ()

    def _check_fit(self, executor, sample_weight=None):
        return None

    def _check_fit_memory(self, sizes, data, backend, n_samples=None, n_parts=None):
        return None

    def _keep_on_device(self, backend, j, fit):
        return None

    #: on Dask, the fitted parts stay on the workers (:meth:`_part_summary` comes back)
    _keeps_parts_on_workers = False

    def _part_summary(self, fit):
        return fit

    def _part_to_host(self, fit, X_part):
        return fit

    def _finish_fit(self, data, X, y, sample_weight):
        return None
