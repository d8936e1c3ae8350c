"""How the parts' models of :class:`~gpuml.estimators.casvm.CASVMClassifier` judge a sample.

Step 3 of CA-SVM (You 2020, Alg 5) and its variants: ``combine="nearest"``
sends every row to the model of the part whose centre is nearest;
``combine="neighbors"`` weighs the pairwise decision values of the parts that
hold the row's nearest support vectors by their share of them; ``combine="auto"``
keeps the nearest part's values where they settle the vote with room to spare
(:func:`~gpuml.estimators._svm.unsettled_votes`) and blends the other rows as
``"neighbors"`` does. After a fit on several devices (``devices``) every part
predicts on the device it was fitted on.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from .._backend import CPU, resolve, to_numpy
from .._validation import validate_X
from ..kernels import map_threads, rbf_from_sq_distances, row_ranges
from ..kernels.nearest.values import rbf_part_values
from ..pipeline import (
    block_threads,
    gpu_compute_dtype,
    on_device,
    on_host,
    predict_on_devices,
    prediction_group,
    route_on_devices,
)
from ..routing import NEIGHBOR_PARTS, PartVectors, neighbor_blocks, part_runs, route, rows_by_part
from ._svm import PAIR_BLOCKS_MIN_CLASSES, pair_table, pair_values, unsettled_votes

#: Rows predicted at a time (``predict``, ``decision_function``).
PREDICT_BLOCK_ROWS = 16384
#: ``n_jobs=None``: a prediction takes a CPU thread per this many rows, at most the
#: threads BLAS may use (:func:`gpuml.kernels.threads_for`); fewer rows, one thread.
PREDICT_THREAD_MIN_ROWS = 4096
#: ... and only while each thread's block holds this many rows per part: with more parts,
#: the Python steps per part (holding the GIL) outweigh the threads' gain, unless every
#: part's steps run in the compiled loops (:meth:`PartPredictionMixin._compiled_split`),
#: which hold no GIL (bench/results/cpu-2core/casvm-runs.md).
PREDICT_THREAD_ROWS_PER_PART = 128
#: The blend among more than :data:`~gpuml.routing.NEIGHBOR_PARTS` parts runs its search and
#: its values in compiled loops (:meth:`PartPredictionMixin._blended`) up to this many
#: features; the values' loop computes the distances of the parts a row weighs again, which
#: with more features costs more than the Python steps per part it saves
#: (bench/results/cpu-2core/casvm-runs.md).
BLEND_COMPILED_MAX_FEATURES = 128


class PartModels:
    """The parts' models for one prediction on one device: each part's support vectors and
    its coefficients, shared by every block and thread of the prediction.

    With ``split`` (a callable of the dtype giving :meth:`PartPredictionMixin._part_split`,
    a prediction on the device of the whole model) a part's support vectors are its slice
    of the model's split, made once per fit and device; without (a device holding some of
    the parts) they are gathered from the fitted arrays when the part is first asked for,
    and a GPU keeps them across predictions. The coefficients are gathered once per fit
    and device (:func:`~gpuml.pipeline.on_device`). ``columns``: the
    parts' support vectors, :meth:`PartPredictionMixin._part_columns` (when None, the
    model's).
    """

    def __init__(self, estimator, backend, columns=None, split=None):
        self._estimator = estimator
        self._backend = backend
        self.columns = estimator._part_columns() if columns is None else columns
        self._split = split
        self._made = {}

    def _once(self, key, make):
        # Two threads may both make a part's arrays at once; either copy serves.
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def coef(self, p):
        """Part ``p``'s ``alpha y`` per pair (:class:`~gpuml.estimators._svm.PairCoef`) and
        intercepts."""
        return self._once(("coef", p), lambda: self._estimator._part_coef(
            self._backend, p, self.columns[p]))

    def vectors(self, p, dtype=None):
        """Part ``p``'s support vectors (rows of the training kernel for a precomputed one),
        in ``dtype`` when given."""
        if self._split is not None and dtype is not None:
            vectors = self._split(dtype).vectors.get(p)
            if vectors is not None:
                return vectors
        return self._once(("vectors", p, str(dtype)), lambda: self._estimator._part_vectors_of(
            self._backend, p, self.columns[p], dtype))


class PartPredictionMixin:
    """``_ovo_values`` (see :class:`~gpuml.estimators._svm.KernelSVMMixin`) of a model of parts.

    Reads the fitted ``centers_``, ``support_``, ``support_vectors_``,
    ``support_part_``, ``ovo_dual_coef_``, ``part_intercept_`` and
    ``pair_status_``, and after a fit on several devices ``devices_`` and
    ``part_device_``.
    """

    def _rule(self) -> str:
        """The rule that predicts: ``combine``, or ``"nearest"`` where no row can weigh
        several parts (one part, or no support vector)."""
        combine = getattr(self, "combine", "nearest")
        if self.part_intercept_.shape[0] == 1 or not self.n_support_.any():
            return "nearest"
        return combine

    def _unsettled(self, values, owner):
        """``combine="auto"``: the rows (host bool) whose nearest part's values (``owner``:
        that part) leave the vote open within ``blend_margin``. A pair the part did not
        train (a constant vote for the class it held, or none) says nothing of the row: it
        may vote either way."""
        trained = self.pair_status_[owner] == 2
        return unsettled_votes(values, trained, len(self.classes_), self.blend_margin)

    def _weighted_blocks(self, backend, Xd, parts=None, distances=True):
        """The parts' weights for the rows ``Xd`` (the blend), by blocks of rows.

        Yields :func:`~gpuml.routing.neighbor_blocks`' ``(start, stop, weights,
        distances)`` (``parts``: :meth:`_part_vectors`, made here when None; ``distances``:
        whether the caller reads them, see there). A part
        without support vectors (it held one class, or none of its pairs needed one) is
        never among a row's neighbours, so the rows whose nearest centre is such a
        part's go to it alone, as with ``combine="nearest"``.
        """
        n_parts = self.part_intercept_.shape[0]
        parts = self._part_vectors(backend, Xd) if parts is None else parts
        centers = backend.asarray(self.centers_)
        empty = np.bincount(self.support_part_, minlength=n_parts) == 0
        for start, stop, weights, pieces in neighbor_blocks(Xd, parts, self.n_neighbors,
                                                            centers=centers,
                                                            distances=distances):
            if empty.any():
                owner = route(Xd[start:stop], centers)
                alone = empty[owner]
                weights[alone] = 0.0
                weights[np.flatnonzero(alone), owner[alone]] = 1.0
            yield start, stop, weights, pieces

    def _part_vectors(self, backend, Xd):
        """:meth:`_part_split` in the dtype the kernel values of ``Xd`` are computed in."""
        return self._part_split(backend, gpu_compute_dtype(backend, Xd,
                                                           self.support_vectors_.dtype))

    def _part_split(self, backend, dtype):
        """The support vectors split by part (:class:`~gpuml.routing.PartVectors`) on
        ``backend`` in ``dtype``: made by the first prediction after a fit and kept for the
        next ones, on the CPU too (as many bytes as ``support_vectors_``; a model of many
        parts would otherwise gather its vectors again for every call of ``predict``)."""
        return on_device(self, backend, ("part_vectors", str(np.dtype(dtype))),
                         lambda: PartVectors(
                             backend.asarray(self.support_vectors_.astype(dtype, copy=False)),
                             self.support_part_, self.part_intercept_.shape[0]), host=True)

    def _part_weights(self, backend, Xd):
        """``(n, P)`` host weights of the parts for the rows ``Xd`` (the blend)."""
        weights = np.zeros((Xd.shape[0], self.part_intercept_.shape[0]))
        for start, stop, block, _ in self._weighted_blocks(backend, Xd, distances=False):
            weights[start:stop] = block
        return weights

    def _ovo_values(self, X):
        """Pairwise decision values of every row and which pairs vote in it.

        ``combine="nearest"``: each row's values are those of the model of its
        part (Alg 5); ``"neighbors"``: the weighted sum of the values of the parts
        that hold its nearest support vectors; ``"auto"``: the first where they
        settle the vote within ``blend_margin``, else the second. Returns the values
        (on X's device) and a host bool array ``(n, n_pairs)``: the pairs that vote.
        """
        routes = self._given_routes(X)
        X = self._check_predict_input(X)
        group = prediction_group(getattr(self, "devices_", None))
        if group is not None:
            return self._ovo_values_on_devices(group, X, routes)
        backend = resolve(self.device, X)
        X = validate_X(self, X, reset=False)
        precomputed = self._kernel.name == "precomputed"
        n = X.shape[0]
        # one part: its vectors are the model's, no split to make
        whole = precomputed or self.part_intercept_.shape[0] == 1
        models = PartModels(self, backend, split=None if whole else
                            functools.partial(self._part_split, backend))
        rule = self._rule()
        # A thread's block must give each part enough rows to outweigh the part's Python
        # steps, which hold the GIL (an int n_jobs too: no more threads than that allows),
        # unless the parts' values and the neighbour search run in the compiled loops
        # (_compiled_split), which hold no GIL.
        per_thread = max(PREDICT_THREAD_MIN_ROWS // 4,
                         PREDICT_THREAD_ROWS_PER_PART * self.part_intercept_.shape[0])
        compiled = (per_thread > PREDICT_THREAD_MIN_ROWS // 4 and n >= 2 * PREDICT_THREAD_MIN_ROWS
                    and not precomputed and self._compiled_split(backend, X) is not None)
        if compiled:
            per_thread = PREDICT_THREAD_MIN_ROWS // 4
        threads = 1 if per_thread > PREDICT_BLOCK_ROWS else block_threads(
            backend, getattr(self, "n_jobs", None), n, PREDICT_THREAD_MIN_ROWS, n // per_thread)
        with backend.use():
            # the support vectors by part, kept from the first prediction after the fit
            # (made before the threads start when there are several)
            parts = functools.cache(lambda: self._part_vectors(backend, X))
            if threads > 1 and not precomputed:
                parts()
                if compiled:
                    self._sorted_coef(backend, parts())
            out = backend.xp.zeros((n, self.ovo_dual_coef_.shape[0]), dtype=np.float64)
            voting = np.zeros(out.shape, dtype=bool)

            def predict_block(bounds):
                start, stop = bounds
                Xd = backend.asarray(X[start:stop])
                if rule == "neighbors":
                    voting[start:stop] = self._blended(backend, Xd, out[start:stop], models,
                                                       parts())
                    return
                owner = self._nearest(backend, Xd, out[start:stop], precomputed, models,
                                      None if routes is None else routes[start:stop])
                voting[start:stop] = self.pair_status_[owner] > 0
                if rule == "auto":
                    self._blend_unsettled(backend, Xd, out[start:stop], voting[start:stop],
                                          owner, models, parts)

            # In blocks of rows: what a block needs beside its output (weights, routes,
            # kernel values) does not grow with the number of rows predicted. Each block
            # writes its own rows of the output, so blocks run in threads as they are.
            map_threads(predict_block, row_ranges(n, PREDICT_BLOCK_ROWS, threads), threads)
        return out, voting

    def _given_routes(self, X):
        """The parts of the rows of ``X`` when a search has routed them already (the same
        input object; :func:`given_routes`), else None."""
        given = getattr(self, "_routes", None)
        return given[1] if given is not None and given[0] is X else None

    def _nearest(self, backend, Xd, out, precomputed, models, owner=None):
        """The values of the rows ``Xd`` under their nearest centre's model (Alg 5), written
        to ``out`` (``models``: :class:`PartModels`); returns each row's part (host), routed
        here unless given (``owner``).

        Where the rows are spread over several parts, so many that each has fewer than
        :data:`PREDICT_THREAD_ROWS_PER_PART` on average (a model of hundreds of parts), on
        the host, for the rbf kernel and dense rows of the model's dtype: every part in one
        compiled loop (:func:`~gpuml.kernels.nearest.values.rbf_part_values`: the same
        values to rounding). Otherwise, and while that loop compiles, part by part.
        """
        if owner is None:
            owner = route(Xd, backend.asarray(self.centers_)) if not precomputed \
                else np.zeros(Xd.shape[0], dtype=np.int64)
        order, offsets = part_runs(owner, self.part_intercept_.shape[0])
        present = np.flatnonzero(np.diff(offsets)).tolist()
        if (1 < len(present) and Xd.shape[0] < PREDICT_THREAD_ROWS_PER_PART * len(present)
                and self._values_compiled(backend, Xd, out, order, offsets)):
            return owner
        for p in present:
            sel = backend.asarray(order[offsets[p]:offsets[p + 1]])
            out[sel] = self._part_values(backend, p, Xd[sel], models)
        return owner

    def _values_compiled(self, backend, Xd, out, order, offsets, weights=None) -> bool:
        """The parts' values of the rows ``Xd`` by
        :func:`~gpuml.kernels.nearest.values.rbf_part_values` (the rows of part ``p``:
        ``order[offsets[p]:offsets[p + 1]]``; with ``weights``, added weighted: the blend)
        where it applies (:meth:`_compiled_split`); False where it does not, or is not
        compiled yet."""
        split = self._compiled_split(backend, Xd)
        if split is None:
            return False
        coef, class_offsets, pair_of = self._sorted_coef(backend, split)
        return rbf_part_values(np.ascontiguousarray(Xd), order, offsets, split.sorted,
                               split.offsets, split.sorted_norms, coef, self.part_intercept_,
                               self._kernel.gamma, out, weights=weights,
                               class_offsets=class_offsets, pair_of=pair_of)

    def _compiled_split(self, backend, Xd):
        """The split of the support vectors (:meth:`_part_vectors`) that the compiled loops
        of the parts' values read, or None where they do not apply: they run on the host,
        for the rbf kernel and dense rows of the model's dtype."""
        if not on_host(backend, Xd) or self._kernel.name != "rbf":
            return None
        split = self._part_vectors(backend, Xd)
        return split if split.sorted is not None and split.dtype == Xd.dtype else None

    def _sorted_coef(self, backend, split):
        """The coefficients of the compiled loops in the order of ``split``'s sorted support
        vectors, made once per fit: ``(coef, class_offsets, pair_of)`` as
        :func:`~gpuml.kernels.nearest.values.rbf_part_values` takes them. Below
        :data:`~gpuml.estimators._svm.PAIR_BLOCKS_MIN_CLASSES` classes ``alpha y`` per pair
        (float64, a column per pair); from there on a column per other class (LIBSVM's
        packed rows, :func:`~gpuml.estimators._svm.pair_table`) and where each part's
        vectors of each class lie (the split keeps the model's order within a part, and the
        model's vectors are grouped by class)."""
        def make():
            coef = self.ovo_dual_coef_[:, split.order].T
            n_classes = len(self.classes_)
            if n_classes < PAIR_BLOCKS_MIN_CLASSES:
                return np.ascontiguousarray(coef, dtype=np.float64), None, None
            pair_of = pair_table(n_classes)
            sv_class = np.repeat(np.arange(n_classes), self.n_support_)[split.order]
            packed = np.take_along_axis(coef, pair_of[sv_class], axis=1)
            n_parts = split.offsets.size - 1
            sv_part = np.repeat(np.arange(n_parts), np.diff(split.offsets))
            counts = np.bincount(sv_part * n_classes + sv_class,
                                 minlength=n_parts * n_classes).reshape(n_parts, n_classes)
            class_offsets = split.offsets[:-1, None] + np.concatenate(
                [np.zeros((n_parts, 1), dtype=np.int64), np.cumsum(counts, axis=1)], axis=1)
            return (np.ascontiguousarray(packed, dtype=np.float64), class_offsets, pair_of)

        return on_device(self, backend, ("sorted_coef",), make, host=True)

    def _blended(self, backend, Xd, out, models, parts):
        """The values of the rows ``Xd`` blended over the parts holding their nearest support
        vectors (``parts``: :meth:`_part_vectors`; ``models``: :class:`PartModels`), written
        to ``out``; returns which pairs vote."""
        voting = np.zeros(out.shape, dtype=bool)
        # Among many parts the search and the values each run in one compiled loop (the
        # values' loop computing its own distances); among a few, or with many features,
        # the distances the search computed serve the values (their Python steps are few,
        # or cost less than the GEMMs done twice).
        compiled = (parts.held.size > NEIGHBOR_PARTS
                    and Xd.shape[1] <= BLEND_COMPILED_MAX_FEATURES
                    and self._compiled_split(backend, Xd) is not None)
        for start, stop, weights, pieces in self._weighted_blocks(backend, Xd, parts,
                                                                  distances=not compiled):
            self._blend(backend, Xd[start:stop], weights, pieces, out[start:stop], models)
            voting[start:stop] = weights @ (self.pair_status_ > 0) > 0
        return voting

    def _blend_unsettled(self, backend, Xd, out, voting, owner, models, parts):
        """``combine="auto"``: the rows whose nearest part's values (``out``, ``voting``;
        ``owner``: the part) leave the vote open get the blended values instead, in place
        (``parts``: a callable giving :meth:`_part_vectors`, called only when some row is
        open)."""
        rows = np.flatnonzero(self._unsettled(out, owner))
        if rows.size == 0:
            return
        sel = backend.asarray(rows)
        blended = backend.xp.zeros((rows.size, out.shape[1]), dtype=out.dtype)
        voting[rows] = self._blended(backend, Xd[sel], blended, models, parts())
        out[sel] = blended

    def _blend(self, backend, Xb, weights, pieces, out, models):
        """Add ``sum_p w_p f_p(x)`` for the rows ``Xb`` into ``out``, in part order.

        Where the search kept no distances (``pieces`` None), every part in one compiled
        loop (:meth:`_blend_compiled`). Else, for the RBF kernel, a part's kernel values
        come from the squared distances the neighbour search computed (``pieces``, see
        :func:`~gpuml.routing.neighbor_blocks`), for the rows that weigh the part; other
        kernels, and parts without a piece, evaluate :meth:`_part_values`.
        """
        if pieces is None and self._blend_compiled(backend, Xb, weights, out):
            return
        found = {p: (rows, D) for p, rows, D in pieces or ()}
        reuse = self._kernel.name == "rbf"
        for p in np.flatnonzero(weights.any(axis=0)).tolist():
            if reuse and p in found:
                coef, intercept = models.coef(p)
                rows, D = found[p]
                mine = np.flatnonzero(weights[rows, p])
                K = rbf_from_sq_distances(D[backend.asarray(mine)] if mine.size < rows.size
                                          else D, self._kernel.gamma)
                sel = backend.asarray(rows[mine])
                out[sel] += (backend.asarray(weights[rows[mine], p])[:, None]
                             * (intercept[None, :] + coef.times(K)))
                continue
            rows = np.flatnonzero(weights[:, p])
            sel = backend.asarray(rows)
            out[sel] += (backend.asarray(weights[rows, p])[:, None]
                         * self._part_values(backend, p, Xb[sel], models))

    def _blend_compiled(self, backend, Xb, weights, out) -> bool:
        """:meth:`_blend` in one compiled loop over the parts (:meth:`_values_compiled`
        with each row's weights); False where that does not apply, or is not compiled
        yet."""
        rows, parts = np.nonzero(weights)
        order, offsets = part_runs(parts, weights.shape[1])
        return self._values_compiled(backend, Xb, out, rows[order], offsets,
                                     weights=weights[rows, parts][order])

    def _part_vectors_of(self, backend, p, cols, dtype=None):
        """Part ``p``'s support vectors (their rows for a precomputed kernel; in ``dtype``
        when given) on ``backend``; copied to a GPU once and cached there. ``cols``: the
        part's support vectors (:meth:`_part_columns`)."""
        def upload():
            if self._kernel.name == "precomputed":
                vectors = self.support_[cols]
            else:  # a model of one part: its vectors are all of them, in order
                vectors = (self.support_vectors_ if len(cols) == self.support_vectors_.shape[0]
                           else self.support_vectors_[cols])
            if dtype is not None and self._kernel.name != "precomputed":
                vectors = vectors.astype(dtype, copy=False)
            return backend.asarray(vectors)

        return on_device(self, backend, ("part", p, str(dtype)), upload)

    def _part_coef(self, backend, p, cols):
        """Part ``p``'s ``alpha y`` per pair (:class:`~gpuml.estimators._svm.PairCoef`) and
        intercepts on ``backend``."""
        def upload():
            return self._ovo_coef(backend, cols), backend.asarray(self.part_intercept_[p])

        return on_device(self, backend, ("coef", p), upload, host=True)

    def _part_columns(self):
        """The support vectors (columns) of every part, in part order: host index arrays
        (made once per fit)."""
        def split():
            order, ends = part_runs(self.support_part_, self.part_intercept_.shape[0])
            return [order[a:b] for a, b in zip(ends[:-1], ends[1:])]

        return on_device(self, CPU, ("part_columns",), split, host=True)

    def _part_values(self, backend, p, Xp, models):
        """Pairwise decision values of the rows ``Xp`` (on ``backend``) under part ``p``'s model
        (``models``: :class:`PartModels` on ``backend``).

        Kernel values in :func:`~gpuml.pipeline.gpu_compute_dtype` (float32 on a GPU for
        float32 rows), summed against the float64 coefficients: float64 accumulation.
        """
        dtype = (None if self._kernel.name == "precomputed" else
                 gpu_compute_dtype(backend, Xp, self.support_vectors_.dtype))
        vectors = models.vectors(p, dtype)
        coef, intercept = models.coef(p)
        if not vectors.shape[0]:
            return intercept[None, :]
        values = pair_values(self._kernel, Xp, vectors, coef)
        values += intercept[None, :]
        return values

    def _ovo_values_on_devices(self, group, X, routes=None):
        """Step 3 on the devices of the fit, by the same rule as on one device: the
        nearest part's values (:meth:`_nearest_on_devices`; ``routes``: the rows' parts
        when known), blended values (:meth:`_blended_on_devices`), or both
        (``combine="auto"``)."""
        X = to_numpy(validate_X(self, X, reset=False))
        columns = self._part_columns()
        rule = self._rule()
        if rule == "neighbors":
            return self._blended_on_devices(group, X, columns)
        values, owner = self._nearest_on_devices(group, X, columns, routes)
        voting = self.pair_status_[owner] > 0
        if rule == "auto":
            rows = np.flatnonzero(self._unsettled(values, owner))
            if rows.size:
                values[rows], voting[rows] = self._blended_on_devices(group, X[rows], columns)
        return values, voting

    def _blended_on_devices(self, group, X, columns):
        """:meth:`_blended` over the devices of the fit: the weights found on the first
        device, each device weighing the values of its parts for the rows that need them;
        the host adds the parts' shares in part order, as the one-device prediction does
        (the same sums, to rounding). Host values and voting pairs."""
        backend = group.backends[0]
        with backend.use():
            weights = self._part_weights(backend, backend.asarray(X))

        def weighted_parts(rank, backend):
            models = PartModels(self, backend, columns)
            shares = {}
            for p in np.flatnonzero(self.part_device_ == rank).tolist():
                rows = np.flatnonzero(weights[:, p])
                if rows.size:
                    values = self._part_values(backend, p, backend.asarray(X[rows]), models)
                    shares[p] = (rows, to_numpy(backend.asarray(weights[rows, p])[:, None]
                                                * values))
            return shares

        shares = {}
        for device_shares in group.run(weighted_parts):
            shares.update(device_shares)
        total = np.zeros((X.shape[0], self.ovo_dual_coef_.shape[0]))
        for p in sorted(shares):
            rows, share = shares[p]
            total[rows] += share
        return total, weights @ (self.pair_status_ > 0) > 0

    def _nearest_on_devices(self, group, X, columns, owner=None):
        """:meth:`_nearest` over the devices of the fit: each row on its part's device, one
        batch per device. Host values and each row's part (routed here unless given)."""
        if owner is None:
            owner = route_on_devices(group, X, self.centers_)

        def predict_local(backend, Xd, parts):
            models = PartModels(self, backend, columns)
            out = backend.xp.empty((Xd.shape[0], self.ovo_dual_coef_.shape[0]),
                                   dtype=np.float64)
            for p, rows in rows_by_part(parts):
                sel = backend.asarray(rows)
                out[sel] = self._part_values(backend, p, Xd[sel], models)
            return out

        return predict_on_devices(group, X, owner, self.part_device_, predict_local), owner


@contextlib.contextmanager
def given_routes(estimator, X, owner):
    """Within the block, ``estimator`` predicts the rows of ``X`` (this object) with the
    nearest-centre parts ``owner`` (host ints, one per row) instead of routing them: a
    search routes its validation rows once per fold for every candidate fitted on the
    fold's split (the same centres)."""
    estimator._routes = (X, np.asarray(owner, dtype=np.int64))
    try:
        yield estimator
    finally:
        del estimator._routes
