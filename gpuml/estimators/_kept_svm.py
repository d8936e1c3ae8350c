"""CA-SVM's parts kept on the Dask workers that fitted them (after a fit on Dask input).

A kernel SVM's support vectors are often a large share of its data, so after a Dask
fit each part of a :class:`~gpuml.estimators.casvm.CASVMClassifier` stays on the
worker that fitted it, as that worker keeps it (:class:`KeptSVMPart`, made by
:meth:`~gpuml.estimators._smo_solver.SMOPartSolver.keep`); the client keeps what the
prediction rule reads before it touches a support vector: the centres, each part's
intercepts, pair status and support vectors per class (:meth:`KeptSVMPart.summary`).

* **Prediction** goes to the parts (:class:`KeptSVMRule`, run by
  :func:`gpuml.distributed.dask.predict_parts`): the rows of a block are routed where
  they lie and the values of each part computed on its worker, by the rules of the
  in-memory model (:mod:`gpuml.estimators._part_prediction`): the nearest part's
  values; the blend of the parts holding a row's nearest support vectors, each group
  of parts searching its own and the nearest of all kept by the same tie rule
  (:meth:`gpuml.kernels.nearest.neighbors.NearestMerge.absorb`); or the nearest part's
  values where they settle the vote, the blend elsewhere.
* **The support-vector arrays** (:data:`SUPPORT_ATTRIBUTES`) stay on the workers:
  reading one gathers them all once when they take at most
  :data:`gpuml.distributed.dask.GATHER_LIMIT_BYTES`, and refuses otherwise, naming
  their size and ``to_local()``, which gathers the whole model on purpose, as pickling
  does (:class:`~gpuml.estimators._kept.KeptPartsMixin`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from .._backend import is_dask_collection, stack_rows, to_output
from .._validation import validate_X
from ..kernels import rbf_from_sq_distances
from ..kernels.nearest.neighbors import NearestMerge
from ..kernels.pairwise import squared_norms
from ..pipeline import dask_module
from ..routing import NEIGHBOR_BLOCK_BYTES, nearest_parts, route, rows_by_part, search_width
from ._kept import KEPT_PREDICT_ROWS, KeptPartsMixin
from ._svm import PairCoef, ovo_output, pack_dual_coef, pair_values, unsettled_votes

#: The fitted arrays with an entry per support vector: on the Dask workers after a Dask fit.
SUPPORT_ATTRIBUTES = ("support_", "support_part_", "support_vectors_", "dual_coef_",
                      "ovo_dual_coef_")
#: What a model kept on Dask workers holds of them (a refit drops it).
KEPT_STATE = ("_kept_parts", "_kept_n_support", "_kept_vectors")


@dataclass
class KeptSVMPart:
    """A fitted part as its Dask worker keeps it: its support vectors in SVC's order within
    the part (by class, then by training row), ready for prediction there.

    ``rows``: their training indices; ``sv_class``: their classes; ``vectors`` and
    ``norms``: the vectors and their squared norms; ``coef``: ``(n_pairs, n_SV)``, each
    vector's ``alpha y`` per one-vs-one pair (``ovo_dual_coef_``'s layout);
    ``n_support``: vectors per class; ``intercept``, ``pair_status``, ``n_iter``,
    ``objective``, ``converged`` and ``n_problems`` as
    :class:`~gpuml.estimators._svm.SVMPartFit`'s; ``finite``: its coefficients and
    intercepts are finite.
    """

    rows: np.ndarray
    sv_class: np.ndarray
    vectors: np.ndarray
    norms: np.ndarray
    coef: np.ndarray
    n_support: np.ndarray
    intercept: np.ndarray
    pair_status: np.ndarray
    n_iter: np.ndarray
    objective: np.ndarray
    converged: bool
    n_problems: int
    finite: bool

    @classmethod
    def of(cls, fit, targets, row_ids, n_classes: int) -> KeptSVMPart:
        """A part's :class:`~gpuml.estimators._svm.SVMPartFit` kept: ``targets`` (class
        indices) and ``row_ids`` (training indices) of the part's rows."""
        sv_class = np.asarray(targets)[fit.support].astype(np.int64)
        order = np.lexsort((fit.support, sv_class))
        vectors = np.ascontiguousarray(fit.support_vectors[order])
        return cls(np.asarray(row_ids, dtype=np.int64)[fit.support][order], sv_class[order],
                   vectors, squared_norms(vectors), np.ascontiguousarray(fit.dual_coef[:, order]),
                   np.bincount(sv_class, minlength=n_classes), fit.intercept, fit.pair_status,
                   fit.n_iter, fit.objective, fit.converged, fit.n_problems,
                   bool(np.isfinite(fit.dual_coef).all() and np.isfinite(fit.intercept).all()))

    def summary(self) -> KeptSVMPart:
        """What the client keeps: everything but the support vectors' arrays (kept empty,
        with their dtypes and trailing shapes)."""
        return replace(self, rows=self.rows[:0], sv_class=self.sv_class[:0],
                       vectors=self.vectors[:0], norms=self.norms[:0], coef=self.coef[:, :0])

    def pair_coef(self, n_classes: int) -> PairCoef:
        """Its coefficients ready for products with kernel values (as in memory)."""
        return PairCoef(self.coef.T, self.sv_class, n_classes)


def support_arrays(rows, classes, vectors, coefs, n_classes: int, sparse: bool) -> dict:
    """SVC's support-vector arrays from the parts' (in part order): each part's training
    indices, classes, vectors and ``(n_pairs, n_SV)`` coefficients, laid out in SVC's
    order (by class, then by training row). ``vectors`` None: a precomputed kernel."""
    support = np.concatenate(rows + [np.zeros(0, np.int64)])
    sv_class = np.concatenate(classes + [np.zeros(0, np.int64)])
    order = np.lexsort((support, sv_class))
    out = {"support_": support[order],
           "support_part_": np.repeat(np.arange(len(rows)), [len(r) for r in rows])[order],
           "ovo_dual_coef_": np.ascontiguousarray(np.concatenate(coefs, axis=1)[:, order]),
           "support_vectors_": (np.empty((0, 0)) if vectors is None
                                else stack_rows(vectors)[order])}
    # SVC's public arrays: LIBSVM's packing, and for two classes SVC's sign (its decision
    # function is minus LIBSVM's, positive for classes_[1]).
    sign = -1.0 if n_classes == 2 else 1.0
    packed = sign * pack_dual_coef(out["ovo_dual_coef_"], sv_class[order], n_classes)
    out["dual_coef_"] = sp.csr_matrix(packed) if sparse else packed
    return out


class KeptSVMMixin(KeptPartsMixin):
    """A CA-SVM whose parts may be kept on Dask workers: its summaries set as the fitted
    attributes, the support-vector arrays gathered when read, pickling, prediction on the
    cluster."""

    def _keep_parts(self, kept, summaries):
        """The fitted attributes of a model kept on the workers (``kept``: one
        ``(part_ids, future)`` per worker's group; ``summaries``: each part's
        :meth:`KeptSVMPart.summary`, in part order)."""
        for name in SUPPORT_ATTRIBUTES:
            self.__dict__.pop(name, None)
        self._kept_parts = kept
        self._kept_n_support = np.stack([s.n_support for s in summaries])
        self._kept_vectors = summaries[0].vectors
        self.n_support_ = self._kept_n_support.sum(axis=0).astype(np.int32)
        # each part's coefficients and intercepts were checked on its worker
        self._check_finite_model(np.where([s.finite for s in summaries], 0.0, np.nan))

    def _support_bytes(self) -> int:
        """Bytes of the support-vector arrays of a kept model, as gathered."""
        n_sv = int(self.n_support_.sum())
        n_classes = len(self.classes_)
        per_vector = (self._kept_vectors.shape[1] * self._kept_vectors.dtype.itemsize
                      + 8 * (n_classes * (n_classes - 1) // 2 + n_classes - 1 + 2))
        return n_sv * per_vector

    def _gathered_support(self) -> dict:
        """The support-vector arrays of a kept model, from its parts gathered."""
        parts = dask_module().gather_parts(self)
        return support_arrays([p.rows for p in parts], [p.sv_class for p in parts],
                              [p.vectors for p in parts], [p.coef for p in parts],
                              len(self.classes_), self._sparse)

    def __getattr__(self, name):
        # Only reached when the attribute is not set: a kept model's support-vector arrays.
        if name in SUPPORT_ATTRIBUTES and self.__dict__.get("_kept_parts") is not None:
            dask_module().check_gather(self, name, self._support_bytes())
            self.__dict__.update(self._gathered_support())
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self):
        # A kept model pickles as the in-memory one: its parts gathered, whatever their size.
        state = super().__getstate__()
        if state.get("_kept_parts") is not None:
            state.update(self._gathered_support())
            for name in KEPT_STATE:
                del state[name]
        return state

    def _on_cluster(self, X) -> bool:
        """Dask input, or any input for a model kept on Dask workers."""
        return self._kept() or super()._on_cluster(X)

    def _lazy(self, X, method):
        """A kept model's ``method`` on the cluster: lazily for Dask ``X``; in-memory ``X``
        sent in blocks of :data:`KEPT_PREDICT_ROWS` rows and its result gathered."""
        if not self._kept():
            return super()._lazy(X, method)
        rule = KeptSVMRule(self, method, *self._output_layout(X, method))
        if is_dask_collection(X):
            return dask_module().predict_parts(self, X, rule)
        X_checked = validate_X(self, self._check_predict_input(X), reset=False)
        return to_output(dask_module().predict_parts_in_memory(self, X_checked, rule,
                                                               KEPT_PREDICT_ROWS), X)


class KeptSVMRule:
    """How a kept CA-SVM judges a block of rows on the cluster, step by step (the protocol of
    :class:`gpuml.distributed.dask.PartsRule`): what every step reads (the centres, the
    parts' intercepts and pair status, the rule's settings) and the steps.

    ``method``: ``"predict"`` or ``"decision_function"``; ``columns`` and ``dtype``:
    its result's (columns None: one value a row).
    """

    every_row = False

    def __init__(self, estimator, method, columns, dtype):
        combine = estimator._rule()
        self.kernel = estimator._kernel
        self.classes = estimator.classes_
        self.output = dict(method=method, shape=estimator.decision_function_shape,
                           break_ties=estimator.break_ties, dtype=dtype)
        self.tail = () if columns is None else (columns,)
        self.dtype = np.dtype(dtype)
        self.combine = combine
        self.nearest = combine != "neighbors"
        self.blends = combine != "nearest"
        self.margin = estimator.blend_margin
        self.centers = np.asarray(estimator.centers_)
        self.intercept = estimator.part_intercept_
        self.pair_status = estimator.pair_status_
        counts = estimator._kept_n_support.sum(axis=1)
        self.empty = counts == 0
        self.held = np.flatnonzero(counts)
        self.k, self.searched = search_width(self.held.size, int(counts.sum()),
                                             estimator.n_neighbors)

    # -- a row's nearest part ----------------------------------------------------------------
    def route(self, chunk):
        """The block's rows (float32 kept, else float64, as in memory) and each one's part."""
        X = np.asarray(chunk)
        X = X if X.dtype == np.float32 else X.astype(np.float64, copy=False)
        return X, route(X, self.centers)

    def select(self, routed, ids):
        X, owner = routed
        idx = np.flatnonzero(np.isin(owner, ids))
        return idx, X[idx], owner[idx]

    def values(self, selection, group, ids):
        """The pairwise values of the selected rows under their parts (of this group)."""
        idx, X, owner = selection
        where = {p: k for k, p in enumerate(ids)}
        out = np.empty((idx.size, self.pair_status.shape[1]))
        for p, rows in rows_by_part(owner):
            out[rows] = self._part_values(group[0][where[p]], p, X[rows])
        return idx, out

    def _part_values(self, part, p, X, distances=None):
        """Part ``p``'s pairwise values of the rows ``X`` (``distances``: their squared
        distances to its vectors, which an rbf kernel's values read)."""
        if not part.vectors.shape[0]:
            return np.broadcast_to(self.intercept[p], (X.shape[0], self.intercept.shape[1]))
        coef = part.pair_coef(len(self.classes))
        if distances is not None and self.kernel.name == "rbf":
            return self.intercept[p][None, :] + coef.times(
                rbf_from_sq_distances(distances, self.kernel.gamma))
        values = pair_values(self.kernel, X, part.vectors, coef)
        values += self.intercept[p]
        return values

    def placed(self, routed, n_rows, pieces):
        """The nearest parts' values of the block's rows, and the rows left to blend (or,
        without a blend, the block's result)."""
        _, owner = routed
        values = np.zeros((n_rows, self.pair_status.shape[1]))
        for idx, piece in pieces:
            values[idx] = piece
        voting = self.pair_status[owner] > 0
        if not self.blends:
            return ovo_output(values, voting, self.classes, **self.output)
        if self.combine == "neighbors":
            return values, np.zeros_like(voting), np.arange(n_rows)
        trained = self.pair_status[owner] == 2
        return values, voting, np.flatnonzero(unsettled_votes(values, trained,
                                                              len(self.classes), self.margin))

    # -- the blend of the parts holding a row's nearest support vectors ----------------------
    def search(self, routed, placed):
        """The rows to blend: their features, and the parts each one searches (its
        ``searched`` nearest by centre among the parts with vectors); a row whose nearest
        centre's part has none goes to that part alone (searched in none)."""
        X, owner = routed
        rows = placed[2]
        alone = self.empty[owner[rows]]
        searching = rows[~alone]
        Xs = X[searching]
        near = (self.held[nearest_parts(Xs, self.centers[self.held], self.searched)]
                if searching.size else np.zeros((0, self.searched), dtype=np.int64))
        return searching, Xs, near, rows[alone], owner[rows[alone]]

    def candidates(self, blend_rows, group, ids):
        """The rows' nearest support vectors among this group's parts (each row among the
        parts it searches), and those parts' values for the rows where a part holds one of
        them: ``(rows, best_d, best_r, [(p, rows of p, values)])``."""
        _, X, near, _, _ = blend_rows
        mine = np.flatnonzero(np.isin(near, ids).any(axis=1))
        local = np.full(near.shape[0], -1, dtype=np.int64)
        local[mine] = np.arange(mine.size)
        merge = NearestMerge(np, mine.size, self.k)
        x_norms = squared_norms(X)
        found = []
        for k, p in enumerate(ids):
            part = group[0][k]
            rows = np.flatnonzero((near == p).any(axis=1))
            if not rows.size or not part.vectors.shape[0]:
                continue
            step = max(1, NEIGHBOR_BLOCK_BYTES // (8 * part.vectors.shape[0]))
            for start in range(0, rows.size, step):
                sel = rows[start:start + step]
                Xb = X[sel]
                G = Xb @ part.vectors.T
                merge.add(G, x_norms[sel], part.norms, local[sel], p)  # G: squared distances
                found.append((p, sel, self._part_values(part, p, Xb, G)))
        held = merge.parts_of()
        kept = []
        for p, sel, values in found:
            weighed = (held[local[sel]] == p).any(axis=1)
            if weighed.any():
                kept.append((p, sel[weighed], values[weighed]))
        return mine, merge.best_d, merge.best_r, kept

    def blend(self, placed, blend_rows, found):
        """The block's result: the rows to blend get the weighted sum of the values of the
        parts holding their nearest support vectors (each part's share of them), added in
        part order as in memory."""
        values, voting, _ = placed
        searching, _, _, alone, alone_parts = blend_rows
        merge = NearestMerge(np, searching.size, self.k)
        pieces = {}
        for mine, best_d, best_r, kept in found:
            merge.absorb(mine, best_d, best_r)
            for p, sel, part_values in kept:
                pieces.setdefault(p, []).append((sel, part_values))
        row, part, share = merge.shares()
        blended = np.zeros((searching.size, values.shape[1]))
        weighed = np.zeros((searching.size, values.shape[1]), dtype=bool)
        bounds = np.searchsorted(part, np.arange(self.intercept.shape[0] + 1))
        for p in np.unique(part).tolist():
            sel, w = row[bounds[p]:bounds[p + 1]], share[bounds[p]:bounds[p + 1]]
            at = np.concatenate([s for s, _ in pieces[p]])
            part_values = np.concatenate([v for _, v in pieces[p]])
            order = np.argsort(at, kind="stable")
            blended[sel] += w[:, None] * part_values[order[np.searchsorted(at[order], sel)]]
            weighed[sel] |= self.pair_status[p] > 0
        values[searching], voting[searching] = blended, weighed
        # as in memory: weight 1 on the part, whose values are its intercepts
        values[alone] = 0.0
        values[alone] += 1.0 * self.intercept[alone_parts]
        voting[alone] = self.pair_status[alone_parts] > 0
        return ovo_output(values, voting, self.classes, **self.output)
