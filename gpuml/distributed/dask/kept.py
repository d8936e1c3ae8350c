"""A model whose parts stay on the Dask workers that fitted them, and its prediction there.

A BKRR model holds every training row (You 2020, Alg 10: each part's kernel
expansion is over its own rows), and a kernel SVM's support vectors are often a
large share of its data, so gathering either model can take more than the client
or any one worker holds. After a Dask fit the parts stay where they were fitted
(:func:`gpuml.distributed.dask.ship_and_fit` for a solver that keeps its parts):
the client keeps one future per worker's group of parts, and what the prediction
rule reads before it touches a part (the centres, each part's intercepts).

Prediction goes to the parts (:func:`predict_parts`), by a rule object the
estimator supplies (:class:`PartsRule`; BKRR's is :class:`KernelPartsRule`,
CA-SVM's ``gpuml.estimators._kept_svm.KeptSVMRule``). For each row block, where it
lies: **route** the rows, then for each group of parts **select** the rows its
parts judge, which travel to the group's worker where the parts' **values** are
computed, and **place** them back in row order. A rule that **blends** several
parts for some rows (CA-SVM's ``combine="neighbors"``) then **searches** them:
those rows travel to every group, each group returns their nearest support
vectors among its parts with those parts' values, and one task merges them
(:meth:`gpuml.kernels.nearest.neighbors.NearestMerge.absorb`: the candidates a
search of every part keeps) and **blends** the values. Rows move to the parts,
never a part to the rows (each task reading a group is restricted to the group's
worker by :class:`KeptPlacement`): a worker holds its own parts and a block of
rows, and nothing of the model comes to the client. With ``combine="average"``
(DC-KRR) every part judges every row: each block travels to each group.

A worker lost after the fit loses its parts with it; Dask computes them again from
the fit's tasks when a prediction needs them, as long as the training input can be
computed again. When it cannot, the prediction ends with :class:`LostParts`, naming
the worker and its parts.
"""

from __future__ import annotations

import uuid
import warnings
import weakref

import dask
import dask.array as da
import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.utils import CancelledError

from .data import _as_array, check_features
from .driver import KEY_PREFIX, compute, fmt_bytes
from .fit import KEPT_STEP

#: The most bytes reading a fitted attribute of a kept model gathers to the client (a
#: CA-SVM's ``support_vectors_``, ...); a larger model refuses, naming ``to_local()``.
GATHER_LIMIT_BYTES = 256 * 2**20


class LostParts(RuntimeError):
    """Kept parts lost with their Dask worker, and the training rows they were fitted from
    cannot be computed again."""


class PartsRule:
    """How a model whose parts are kept on the workers judges a block of rows: the steps
    :func:`predict_parts` runs as tasks, and the shape of its result.

    A rule is shipped to the workers once per prediction, so it holds only what every
    step reads (centres, intercepts, the kernel), never a part. ``group`` in the steps
    is what a kept group's future holds (its parts' fits as ``group[0]``, in the order
    of ``ids``). ``tail`` and ``dtype``: each row's result's trailing shape and dtype;
    ``every_row``: every part judges every row (no selection: each group gets the block);
    ``nearest``: the values of each row's part are asked for (:meth:`select`,
    :meth:`values`); ``blends``: some rows are blended over several parts
    (:meth:`search`, :meth:`candidates`, :meth:`blend`).
    """

    tail: tuple = ()
    dtype = np.dtype(np.float64)
    every_row = False
    nearest = True
    blends = False

    def route(self, chunk):
        """The block's rows as the steps read them, and where each goes."""
        raise NotImplementedError

    def select(self, routed, ids):
        """What the group of parts ``ids`` needs of the routed block (its rows)."""
        raise NotImplementedError

    def values(self, selection, group, ids):
        """The group's values for its selection (on the group's worker)."""
        raise NotImplementedError

    def placed(self, routed, n_rows, pieces):
        """The block's result from every group's values (the rows' values, where it blends)."""
        raise NotImplementedError

    def search(self, routed, placed):
        """The rows to blend, as every group reads them."""
        raise NotImplementedError

    def candidates(self, blend_rows, group, ids):
        """The group's nearest candidates, with its parts' values, for the rows to blend."""
        raise NotImplementedError

    def blend(self, placed, blend_rows, found):
        """The block's result, the rows to blend merged over every group's candidates."""
        raise NotImplementedError


def _step(rule, name, *args):
    """One step of a rule (the rule travels once per worker, as one key)."""
    return getattr(rule, name)(*args)


def predict_parts(estimator, X, rule: PartsRule, checked=False):
    """The predictions of a kept model for Dask ``X`` by ``rule``, lazily: a Dask array
    chunked as X's rows (their lengths computed first for a dataframe).

    ``checked``: X's features were checked already. Every block is routed where it
    lies; see the module's description for the steps.
    """
    check_reachable(estimator)
    if not checked:
        check_features(estimator, X)
    X, _ = _as_array(X, "X", lengths=True)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (rows, features), got a {X.ndim}-D Dask array")
    if X.numblocks[1] > 1:
        X = X.rechunk({1: -1})
    token = uuid.uuid4().hex[:8]

    def key(step, i, g=None):
        return f"{KEY_PREFIX}-predict-{step}-{token}-{i}" + ("" if g is None else f"-{g}")

    rules = dask.delayed(rule, name=f"{KEY_PREFIX}-predict-rule-{token}")
    kept = estimator._kept_parts
    register_placement(kept[0][1].client)
    blocks = []
    for i, (chunk, rows) in enumerate(zip(X.to_delayed().ravel(), X.chunks[0])):
        routed = dask.delayed(_step)(rules, "route", chunk, dask_key_name=key("route", i))
        pieces = []
        if rule.nearest:
            for g, (ids, future) in enumerate(kept):
                mine = routed if rule.every_row else dask.delayed(_step)(
                    rules, "select", routed, ids, dask_key_name=key("select", i, g))
                pieces.append(dask.delayed(_step)(rules, "values", mine, future, ids,
                                                  dask_key_name=key("parts", i, g)))
        block = dask.delayed(_step)(rules, "placed", routed, rows, pieces,
                                    dask_key_name=key("rows", i))
        if rule.blends:
            blend_rows = dask.delayed(_step)(rules, "search", routed, block,
                                             dask_key_name=key("search", i))
            found = [dask.delayed(_step)(rules, "candidates", blend_rows, future, ids,
                                         dask_key_name=key("candidates", i, g))
                     for g, (ids, future) in enumerate(kept)]
            block = dask.delayed(_step)(rules, "blend", block, blend_rows, found,
                                        dask_key_name=key("blend", i))
        blocks.append(da.from_delayed(block, shape=(rows,) + tuple(rule.tail),
                                      dtype=rule.dtype))
    return da.concatenate(blocks)


def predict_parts_in_memory(estimator, X, rule: PartsRule, block_rows):
    """:func:`predict_parts` for in-memory ``X`` (NumPy, checked): its rows sent to the
    cluster in blocks of ``block_rows``, the predictions gathered (host array)."""
    Xd = da.from_array(np.asarray(X), chunks=(block_rows, X.shape[1]))
    out, = compute_kept(estimator, predict_parts(estimator, Xd, rule, checked=True))
    return out


def compute_kept(estimator, *collections):
    """``dask.compute`` of what reads a kept model's parts, on the current client (a worker
    paused for memory ends it with a MemoryError); parts lost for good end it with
    :class:`LostParts` (:func:`check_parts`)."""
    try:
        return compute(*collections)
    except CancelledError:
        check_parts(estimator)
        raise


#: The prediction steps whose tasks read a group of parts (:func:`predict_parts`).
GROUP_STEPS = ("parts", "candidates")


class KeptPlacement(SchedulerPlugin):
    """Sends each prediction task that reads a kept group of parts to the worker holding the
    group: a scheduler plugin, registered by :func:`predict_parts`.

    As each graph arrives, a task of the steps :data:`GROUP_STEPS` is restricted to the
    workers holding its kept group (its dependency of :data:`KEPT_STEP`), loosely: where
    they are gone it runs elsewhere, with the group fitted again. Without it Dask's
    scheduler places such a task where its inputs are cheapest to bring, which is the
    group's worker only while that worker is no busier than the group takes to move
    (:class:`~gpuml.distributed.dask.fit.KeptGroup` gives Dask the group's size), and a
    busy cluster copies groups between workers. Work stealing may still move a restricted
    task to an idle worker, as it does any task whose restriction is loose.
    """

    name = f"{KEY_PREFIX}-kept-placement"
    #: registered again (another client of the scheduler), it stays as it is
    idempotent = True

    def update_graph(self, scheduler, *, tasks=(), **kwargs):
        steps = tuple(f"{KEY_PREFIX}-predict-{step}-" for step in GROUP_STEPS)
        kept = f"{KEY_PREFIX}-{KEPT_STEP}-"
        for key in tasks:
            if not (isinstance(key, str) and key.startswith(steps)):
                continue
            ts = scheduler.tasks.get(key)
            for dep in () if ts is None else ts.dependencies:
                holders = {ws.address for ws in dep.who_has or ()}
                if isinstance(dep.key, str) and dep.key.startswith(kept) and holders:
                    ts.worker_restrictions = holders
                    ts.loose_restrictions = True


#: The clients whose scheduler has :class:`KeptPlacement` (registered once each).
_placed = weakref.WeakSet()


def register_placement(client):
    """:class:`KeptPlacement` on ``client``'s scheduler, once. A scheduler that cannot load
    it (gpuml not installed there) is warned about: its tasks are placed by locality."""
    if client in _placed:
        return
    try:
        client.register_plugin(KeptPlacement())
    except Exception as err:  # noqa: BLE001 - the prediction runs without it
        warnings.warn(f"the Dask scheduler could not load gpuml's placement of kept parts "
                      f"({type(err).__name__}: {err}): each prediction task goes where Dask's "
                      "scheduler finds its inputs cheapest to bring, which may copy a group of "
                      "parts to another worker; install gpuml where the scheduler runs",
                      RuntimeWarning, stacklevel=3)
    _placed.add(client)


def check_reachable(estimator):
    """Refuse, with what to do, a kept model whose cluster is gone (its client closed), or
    whose parts were lost for good (:func:`check_parts`)."""
    futures = [future for _, future in estimator._kept_parts]
    client = futures[0].client
    if getattr(client, "status", "running") != "running":
        raise RuntimeError(
            f"this {type(estimator).__name__} was fitted on Dask and its parts are kept on "
            "the cluster's workers, but that cluster's client is closed or the parts were "
            "released (cancelled): predict while the cluster runs, or pickle the model "
            "while it runs (the pickle holds the parts) and load that")
    check_parts(estimator)


def check_parts(estimator):
    """Raise, naming them, for kept parts that are gone: lost with their worker where the
    training rows cannot be computed again (:class:`LostParts`), or released. (Parts whose
    future is ``"lost"`` are being fitted again by Dask: a prediction waits for them.)"""
    gone = [(ids, future) for ids, future in estimator._kept_parts
            if future.status in ("cancelled", "error")]
    if not gone:
        return
    workers = np.asarray(estimator.part_worker_, dtype=object)
    where = "; ".join(f"{workers[ids[0]]}: parts {', '.join(map(str, ids))}"
                      for ids, _ in gone)
    name = type(estimator).__name__
    if not any(_lost(f) for _, f in gone):
        raise RuntimeError(
            f"this {name} was fitted on Dask and its parts are kept on the cluster's workers, "
            f"but some were released (cancelled: {where}): predict while the cluster runs, or "
            "pickle the model while it runs (the pickle holds the parts) and load that")
    raise LostParts(
        f"the parts of this {name} kept on a lost Dask worker are gone ({where}), and the "
        "training rows they were fitted from cannot be computed again (scattered, or held "
        "only by that worker), so Dask cannot fit them again: fit again on input Dask can "
        "read again (dask.array.from_array, dask.dataframe.read_parquet, ...), or keep a "
        "copy of the model while it is whole (to_local(), or a pickle)")


#: Why the scheduler cancels a client's future whose data it lost and cannot compute again.
LOST_REASONS = ("already forgotten", "lost dependencies")


def _lost(future) -> bool:
    """Whether a gone future was lost with its data, not released on purpose (the reason
    the scheduler gave; an error while computing counts as lost)."""
    if future.status != "cancelled":
        return True
    try:
        future.result(timeout=5)
    except CancelledError as err:
        return getattr(err, "reason", None) in LOST_REASONS
    except Exception:  # noqa: BLE001 - any other end of the future: not released on purpose
        return True
    return False


def gather_parts(estimator) -> list:
    """Every kept part as its worker keeps it, in part order, gathered to the client."""
    check_reachable(estimator)
    kept = estimator._kept_parts
    groups = compute_kept(estimator, *[dask.delayed(_fits)(future) for _, future in kept])
    out = [None] * sum(len(ids) for ids, _ in kept)
    for (ids, _), fits in zip(kept, groups):
        for p, fit in zip(ids, fits):
            out[p] = fit
    return out


def _fits(group):
    return group[0]


def check_gather(estimator, what, nbytes):
    """Refuse, before any transfer, reading ``what`` of a kept model when its arrays take
    more than :data:`GATHER_LIMIT_BYTES`."""
    if nbytes > GATHER_LIMIT_BYTES:
        raise MemoryError(
            f"{what} of this {type(estimator).__name__} takes {fmt_bytes(nbytes)} with the "
            "other arrays of its support vectors, which stay on the Dask workers that "
            f"fitted them; reading it gathers them to this process up to "
            f"{fmt_bytes(GATHER_LIMIT_BYTES)} (gpuml.distributed.dask.GATHER_LIMIT_BYTES). "
            "Gather the whole model on purpose with to_local() (or a pickle), or predict "
            "where the parts are")


class KernelPartsRule(PartsRule):
    """BKRR's rule: each row's value under its nearest part's kernel expansion, or
    (``average``) the mean of every part's (DC-KRR).

    ``kernel``, ``intercepts`` (one row per part) and ``centers`` are the model's; the
    values are computed in ``dtype`` (the model's) and returned in ``out_dtype``;
    ``tail``: the trailing shape of the coefficients (several targets).
    """

    def __init__(self, kernel, intercepts, centers, dtype, out_dtype, tail, average):
        self.kernel, self.intercepts = kernel, np.asarray(intercepts)
        self.centers, self.model_dtype = np.asarray(centers), np.dtype(dtype)
        self.dtype, self.tail, self.every_row = np.dtype(out_dtype), tuple(tail), average

    def route(self, chunk):
        from ...routing import route

        rows = np.asarray(chunk, dtype=self.model_dtype)
        return rows, None if self.every_row else route(rows, self.centers)

    def select(self, routed, ids):
        """The rows routed to the parts ``ids``: ``(positions, rows, parts)``."""
        rows, labels = routed
        idx = np.flatnonzero(np.isin(labels, ids))
        return idx, rows[idx], labels[idx]

    def values(self, selection, group, ids):
        fits = group[0]
        if self.every_row:
            rows, _ = selection
            total = None
            for fit in fits:
                value = self.kernel.dot(rows, fit.X, fit.dual_coef)
                total = value if total is None else total + value
            return total
        idx, rows, parts = selection
        out = np.empty((idx.size,) + fits[0].dual_coef.shape[1:], dtype=rows.dtype)
        for k, p in enumerate(ids):
            mine = np.flatnonzero(parts == p)
            if mine.size:
                out[mine] = (self.kernel.dot(rows[mine], fits[k].X, fits[k].dual_coef)
                             + self.intercepts[p])
        return idx, out

    def placed(self, routed, n_rows, pieces):
        if self.every_row:
            total = pieces[0].copy()
            for piece in pieces[1:]:
                total += piece
            total /= self.intercepts.shape[0]
            total += self.intercepts.mean(axis=0)
            return total.astype(self.dtype, copy=False)
        out = np.empty((n_rows,) + self.tail, dtype=self.dtype)
        for idx, values in pieces:
            out[idx] = values
        return out


def kept_arrays(kept, summaries, sizes):
    """``X_fit_`` and ``dual_coef_`` as Dask arrays, one chunk per part in part order.

    ``kept``: ``(part_ids, future)`` per group (a group's future holds its parts'
    fits); ``summaries``: each part's summary (its arrays with no rows, which carry
    their dtypes and trailing shapes); ``sizes``: each part's rows.
    """
    where = {}
    for ids, future in kept:
        for k, p in enumerate(ids):
            where[p] = (future, k)
    X_parts, coef_parts = [], []
    for p, (summary, m) in enumerate(zip(summaries, np.asarray(sizes).tolist())):
        future, k = where[p]
        X_parts.append(da.from_delayed(dask.delayed(_part_rows)(future, k),
                                       shape=(m,) + summary.X.shape[1:], dtype=summary.X.dtype))
        coef_parts.append(da.from_delayed(dask.delayed(_part_coef)(future, k),
                                          shape=(m,) + summary.dual_coef.shape[1:],
                                          dtype=summary.dual_coef.dtype))
    return da.concatenate(X_parts), da.concatenate(coef_parts)


def _part_rows(group, k):
    return group[0][k].X


def _part_coef(group, k):
    return group[0][k].dual_coef


def predict_kept(estimator, X, kernel, intercepts, dtype, checked=False):
    """A kept BKRR model's predictions for Dask ``X``, lazily (:func:`predict_parts` by
    :class:`KernelPartsRule`): in ``dtype`` (the model's), or float32 for float32 ``X``
    (as in memory)."""
    single = _as_array(X, "X", lengths=False)[0].dtype == np.float32
    out_dtype = np.dtype(np.float32) if single else np.dtype(dtype)
    rule = KernelPartsRule(kernel, intercepts, estimator.centers_, dtype, out_dtype,
                           estimator.dual_coef_.shape[1:], estimator.combine == "average")
    return predict_parts(estimator, X, rule, checked=checked)


def predict_kept_in_memory(estimator, X, kernel, intercepts, dtype, block_rows):
    """:func:`predict_kept` for in-memory ``X`` (NumPy): its rows sent to the cluster in
    blocks of ``block_rows``, the predictions gathered (host array)."""
    Xd = da.from_array(np.asarray(X), chunks=(block_rows, X.shape[1]))
    out, = compute_kept(estimator, predict_kept(estimator, Xd, kernel, intercepts, dtype,
                                                checked=True))
    return out


def gathered(estimator):
    """``X_fit_`` and ``dual_coef_`` of a kept BKRR model computed to the client (NumPy)."""
    check_reachable(estimator)
    return compute_kept(estimator, estimator.X_fit_, estimator.dual_coef_)
