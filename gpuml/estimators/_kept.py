"""A model whose parts stay on the Dask workers that fitted them: what the estimators share.

After a Dask fit, :class:`~gpuml.estimators.bkrr.BKRRRegressor` and
:class:`~gpuml.estimators.casvm.CASVMClassifier` keep their parts on the workers
that fitted them (:mod:`gpuml.distributed.dask.kept`): the estimator holds one
future per worker's group of parts (``_kept_parts``) and its prediction goes to
them. Pickling such a model gathers its parts (the pickle is the in-memory model);
:meth:`KeptPartsMixin.to_local` does the same on purpose, without the pickle.
"""

from __future__ import annotations

from sklearn.utils.validation import check_is_fitted

#: Rows of in-memory input sent to the cluster per task by a model kept on Dask workers.
KEPT_PREDICT_ROWS = 16384


class KeptPartsMixin:
    """``to_local`` and the test of a kept model, for an estimator whose ``__getstate__``
    gathers its kept parts (the state of the in-memory model)."""

    def _kept(self) -> bool:
        """Whether the parts are on the Dask workers that fitted them (a Dask fit)."""
        return self.__dict__.get("_kept_parts") is not None

    def to_local(self):
        """The fitted model with every part in this process: its parts gathered from the Dask
        workers that keep them.

        After a fit on Dask input the parts stay on the workers that fitted them and the
        prediction goes to them (docs/scale-out.md, "A model larger than a worker"); this
        gathers the whole model on purpose (as pickling does) and returns a new estimator
        that predicts in this process, with the same parameters and the same predictions.
        A model fitted in memory is returned as it is. The model must fit in this
        process's memory; the workers keep their parts (the estimator it was called on
        still predicts there).

        Returns
        -------
        estimator
            The same class, fitted, its arrays in this process (NumPy).

        Examples
        --------
        >>> import dask.array as da
        >>> from distributed import Client, LocalCluster
        >>> from sklearn.datasets import make_classification
        >>> from gpuml.estimators.casvm import CASVMClassifier
        >>> cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
        ...                        dashboard_address=":0")
        >>> client = Client(cluster)
        >>> X, y = make_classification(2000, 8, random_state=0)
        >>> clf = CASVMClassifier(n_partitions=4, random_state=0, device="cpu").fit(
        ...     da.from_array(X, chunks=(500, 8)), da.from_array(y, chunks=500))
        >>> local = clf.to_local()
        >>> bool((local.predict(X) == clf.predict(X)).all())
        True
        >>> local.support_vectors_.shape == (int(clf.n_support_.sum()), 8)
        True
        >>> client.close(); cluster.close()
        """
        check_is_fitted(self)
        if not self._kept():
            return self
        local = object.__new__(type(self))
        local.__setstate__(self.__getstate__())
        return local
