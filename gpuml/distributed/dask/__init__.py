"""Partitioned estimators on a Dask cluster: the parts are fitted on the workers.

``CASVMClassifier.fit`` and ``BKRRRegressor.fit`` run on Dask input (a
``dask.array.Array`` or a ``dask.dataframe`` of rows) with the executor
:class:`gpuml.pipeline.dask.OnDask`; it needs a ``distributed.Client``.
The estimator stays the same object, and the fitted model is the one an
in-process fit of the same rows with the same partition gives (You 2020,
"Fast and Accurate Machine Learning on Distributed Systems and
Supercomputers", ch. 2-3: the local models never communicate, so only the
partitioning needs a few small reductions).

The steps, each a set of Dask tasks run from the client (the "driver",
:mod:`.driver`):

1. **Check the chunks** before any work: known row chunk sizes, ``y`` (and
   ``sample_weight``) chunked like ``X`` along the rows, one chunk along the
   columns (re-chunked if not), and the size of a part against the smallest
   worker's memory budget (:mod:`.data`). The chunks are grouped by the worker
   holding each (:class:`DaskRows`: from here on every step is one task per worker over its
   chunks); that task validates them (finite, numeric) and keeps them, and a
   first pass sums what ``gamma="scale"``, k-means' tolerance and the class list
   need (and returns FCFS's seed rows, drawn before it).
2. **Partition with a distributed Lloyd** over the chunks (k-means++ seeding,
   Lloyd steps, the greedy fill of FCFS and K-balance; You 2020, Alg. 3 and 9;
   :mod:`.steps`): the algorithms of :mod:`gpuml.partition.algorithms` with the
   same random draws as in process. Every Lloyd step sends the P x d centres
   to each worker and brings back one small array of per-centre sums and counts
   per chunk, summed on the client in chunk order. k-means++ and the Lloyd steps
   are a chain of small exchanges, so they run on one Dask actor per worker
   (:class:`_RowsActor`: a method call on the worker holding the chunks, without
   the scheduler's round trip of a task), where the k-means++ distances stay;
   if an actor's worker is lost they run again as tasks. The greedy fill is
   sequential over the rows: when P <= d the workers compute their rows' n_k x P
   distances to the centres (in parallel), the client gathers them in chunk order
   and runs the fill, as the SPMD fill of :mod:`gpuml.distributed.partition` does
   on rank 0; when the distances would outweigh the rows (P > d) it runs as a
   chain along the chunks that passes the P fill counts on (one task per chunk,
   or after K-balance's k-means one actor call per run of chunks on a worker). The
   labels end on the client and go to the workers with the tasks that need them.
   The
   partition is the one :func:`gpuml.partition.partition` computes on the same
   rows with the same seed (the tests check the labels).
3. **Ship each part's rows** to the worker it is placed on: each part starts on
   the worker holding most of its rows and parts move only to balance the
   solver's cost model (:func:`gpuml.distributed.placement.balance_local`;
   Graham's LPT rule when that balances better by over 2 %), one group of parts
   per worker; the group's fit task cuts the rows of its parts out of its worker's chunks,
   and a task on each other worker holding some of them out of that worker's (a
   classifier's ``y`` as class indices, with the sample weights): the only time rows
   move, once. With ``partition="contiguous"`` (You 2020's casvm2: each part the
   rows as they lie) and parts that do not straddle workers, no row moves and
   there is no partitioning step at all (:mod:`.fit`).
4. **Fit** each group on its worker with the estimator's part solver, shipped
   there (:class:`gpuml.pipeline.PartSolver`; one per setting of
   :func:`gpuml.pipeline.fit_settings`, each fitting the rows gathered once), in
   one batch: one SMO launch or one batched Cholesky (on a GPU under
   dask-cuda, where each worker sees one GPU, ``device="auto"`` resolves to it).
5. **Keep** the fitted parts on the workers that fitted them (each as the part
   solver's :meth:`~gpuml.pipeline.PartSolver.keep` makes it: CA-SVM's support
   vectors ready to predict, BKRR's rows and α) and gather each part's summary
   (:meth:`~gpuml.pipeline.PartSolver.summary`), with each group's sums and counts of
   its parts' rows (the centres: the parts' means); the fitted attributes are
   assembled on the client as an in-process fit does, but for the parts themselves:
   one future per worker's group of parts.

Prediction goes to the parts (:mod:`.kept`, :func:`predict_parts`): each chunk of
rows routed where it lies, its rows sent to the workers of their parts, the values
back in row order, lazily. A model fitted in memory predicts Dask input with
``map_blocks`` (:func:`predict_blocks`, :mod:`.predict`), the model sent once to each
worker that predicts, the rows never moving.

A worker lost mid-fit: every task here is a pure function of its inputs, so
the scheduler recomputes what was on the lost worker and runs the lost tasks
again elsewhere, with the same result. A task whose workers keep dying ends
the fit with a :class:`RuntimeError` that says so. The k-means actors are not
retried by Dask; when one is lost (a call waits only while the actor's worker
runs), k-means runs again from the same random draws as tasks (a
:class:`RuntimeWarning` says so), with the same result. Input that Dask cannot
compute again (scattered rows) lost with its worker ends the fit with
:class:`LostData`, naming that worker; after the fit, parts kept on such a
worker end a prediction with :class:`LostParts`, naming it and them.
"""

from .data import DaskRows, check_dask_input, check_features, feature_source, is_dask, load_rows
from .driver import (
    KEY_PREFIX,
    Driver,
    LostData,
    LostWorker,
    Traffic,
    counting,
    current_client,
    live_workers,
    workers_and_budget,
)
from .fit import check_budget, check_group_budget, place_parts, ship_and_fit
from .kept import (
    GATHER_LIMIT_BYTES,
    KeptPlacement,
    KernelPartsRule,
    LostParts,
    PartsRule,
    check_gather,
    check_reachable,
    compute_kept,
    gather_parts,
    gathered,
    kept_arrays,
    predict_kept,
    predict_kept_in_memory,
    predict_parts,
    predict_parts_in_memory,
    register_placement,
)
from .predict import predict_blocks, score
from .steps import (
    DASK_PARTITIONERS,
    LLOYD_MAX_ITER,
    LLOYD_TOL,
    ChunkRows,
    SplitStart,
    fills_on_client,
    partition_chunks,
)

__all__ = [
    "DASK_PARTITIONERS",
    "GATHER_LIMIT_BYTES",
    "KEY_PREFIX",
    "KeptPlacement",
    "KernelPartsRule",
    "LLOYD_MAX_ITER",
    "LLOYD_TOL",
    "ChunkRows",
    "DaskRows",
    "Driver",
    "LostData",
    "LostParts",
    "LostWorker",
    "PartsRule",
    "SplitStart",
    "Traffic",
    "check_budget",
    "check_group_budget",
    "check_reachable",
    "check_dask_input",
    "check_features",
    "check_gather",
    "compute_kept",
    "counting",
    "current_client",
    "feature_source",
    "fills_on_client",
    "gather_parts",
    "gathered",
    "is_dask",
    "kept_arrays",
    "live_workers",
    "load_rows",
    "partition_chunks",
    "place_parts",
    "predict_blocks",
    "predict_kept",
    "predict_kept_in_memory",
    "predict_parts",
    "predict_parts_in_memory",
    "register_placement",
    "score",
    "ship_and_fit",
    "workers_and_budget",
]
