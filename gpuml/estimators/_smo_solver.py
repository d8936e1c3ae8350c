"""CA-SVM's part solver: each part's one-vs-one SMO problems, solved as one batch.

:class:`SMOPartSolver` is what :class:`~gpuml.estimators.casvm.CASVMClassifier`
hands the partitioned fit (:mod:`gpuml.pipeline`): the kernel with its
resolved γ, LIBSVM's per-row ``C_i = C * class_weight[y_i] * sample_weight_i``
scaled per part (``part_C``), and the SMO settings. Every part of a batch is
solved by one call of :func:`gpuml.kernels.smo_solve_batch` (You 2020, Alg 1:
LIBSVM's SMO with second-order working-set selection, per part of Alg 5); the
tree methods (Cascade, DC-SVM, DC-Filter) train their layers with the same
solve (:meth:`SMOPartSolver.solve_layers`, :mod:`gpuml.estimators._tree`).
:class:`SMOCost` is what the parts cost: ``m^2`` to place them, their rows and
kernel block (at most ``cache_size``) in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._backend import namespace_of, to_numpy, to_output
from .._progress import Progress
from ..distributed import smo_cost
from ..kernels import SMOProblem, part_threads, smo_solve_batch
from ..kernels.pairwise import Kernel
from ..partition import Partitioning, split
from ..pipeline import FitResult, PartCost, PartSolver
from ._kept_svm import KeptSVMPart
from ._svm import SVMPartFit, class_pairs, row_C, support_vector_blocks
from ._tree import TreeFit, fit_tree

#: How C grows in a part of m of the n training rows (``part_C=``): the factor on C.
PART_C_SCALES = {"sqrt": lambda n, m: np.sqrt(n / m), "linear": lambda n, m: n / m,
                 "none": lambda n, m: 1.0}


def part_line(rows, n_problems, n_iter, converged) -> str:
    """The ``verbose`` line of one fitted part."""
    return (f"{rows} rows, {n_problems} SMO problem{'s' if n_problems != 1 else ''}, "
            f"{n_iter} iterations" + ("" if converged else ", stopped at max_iter"))


@dataclass
class SMOCost(PartCost):
    """What SMO parts cost: ``m^2`` steps' worth each (:func:`gpuml.distributed.smo_cost`),
    their rows and kernel block in memory (``cache_size`` MB per part at most, one part
    per solver thread at a time)."""

    name: str
    cache_size: float
    n_jobs: int | None = None

    def weights(self, sizes, n_features):
        return smo_cost(sizes)

    def part_bytes(self, sizes, n_features, itemsize):
        """Device bytes of each part solved alone: its rows and its kernel matrix (at most
        ``cache_size``)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        return (sizes * n_features * itemsize
                + np.minimum(sizes ** 2 * 8, int(self.cache_size * 2**20)))

    def worker_bytes(self, n_features, itemsize):
        """Bytes a worker holds to fit parts of given sizes: rows, and each part's kernel.

        The CPU SMO keeps a part's whole kernel matrix when it fits in ``cache_size``,
        else a row cache of at most ``cache_size``, one part per solver thread at a time
        (:func:`~gpuml.kernels.part_threads`); a GPU worker's device memory is checked by
        the solver itself.
        """
        cache = float(self.cache_size) * 2**20

        def need(sizes):
            m = sizes.astype(np.float64)
            # one matrix per solver thread at a time (gpuml.kernels.smo_solve_batch)
            blocks = np.sort(np.minimum(8.0 * m**2, cache))[::-1][:part_threads(self.n_jobs, m)]
            return int((8.0 * m * (n_features + 2)).sum() + blocks.sum())

        return need


@dataclass
class SMOPartSolver(PartSolver):
    """The one-vs-one SMO problems of CA-SVM's parts (You 2020, Alg 1 in each part of Alg 5).

    ``kernel`` has its γ resolved; ``n_classes`` classes weigh C by
    ``class_weight`` (one per class); ``n_samples`` training rows: a part of ``m``
    of them multiplies C by ``PART_C_SCALES[part_C](n_samples, m)`` under
    ``method="casvm"`` (the tree methods keep C and train their layers:
    :meth:`solve_layers`). ``tol``, ``max_iter``, ``cache_size``, ``shrinking`` and
    ``n_jobs`` are the estimator's. The targets it takes are class indices, the
    weights the sample weights (None: ones). ``rows_here``: the fit's rows are in this
    process, where the model is assembled (not on Dask workers): a joint solve of many
    settings leaves its support vectors to each model's assembly.
    """

    kernel: Kernel
    n_classes: int
    C: float
    class_weight: np.ndarray
    n_samples: int
    part_C: str
    method: str
    tol: float
    max_iter: int
    cache_size: float
    shrinking: bool | str
    n_jobs: int | None
    cost: SMOCost
    progress: Progress | None = None
    rows_here: bool = False

    #: on Dask each part stays on the worker that fitted it (:meth:`keep`), with the training
    #: indices of its support vectors
    keeps_parts_on_workers = True
    keeps_row_ids = True

    @property
    def layered(self) -> bool:
        """Cascade, DC-SVM and DC-Filter train a tree of layers (:meth:`solve_layers`)."""
        return self.method != "casvm"

    def row_C(self, targets, weights):
        """LIBSVM's per-row ``C_i = C * class_weight[y_i] * sample_weight_i`` (float64)."""
        return np.asarray(row_C(self.C, self.class_weight, targets,
                                1.0 if weights is None else weights), dtype=np.float64)

    def solve(self, backend, X, targets, weights, part_rows, part_ids, progress=None):
        """The one-vs-one SMO problems of the given parts, as one batch on ``backend``."""
        return self._fit_parts(backend.asarray(X), part_rows, targets,
                               self.row_C(targets, weights), progress)

    def solve_layers(self, backend, X, targets, weights, partitioning) -> FitResult:
        """The tree methods: layers of SMO fits up the tree over the parts of the split
        (:func:`~gpuml.estimators._tree.fit_tree`) to one SVM, the model (one part,
        centred on the mean of X: no routing). The layers report as a whole."""
        sample_C = self.row_C(targets, weights)

        def fit_nodes(node_rows, members, warm):
            return self._fit_parts(X, node_rows, targets, sample_C, members=members,
                                   warm=warm)

        rows, fit, n_iter, layer_sizes, layer_n_iter = fit_tree(
            fit_nodes, partitioning.parts, targets, sample_C, self.n_classes,
            pass_every_row=self.method == "dcsvm")
        one = split(X, 1, "random", None)
        root = Partitioning(one.labels, one.centers, [rows])
        return FitResult([fit], solver=self, backend=backend, reported=True,
                         layers=TreeFit(root, n_iter, layer_sizes, layer_n_iter))

    def _fit_parts(self, X, part_rows, y_idx, sample_C, progress=None, members=None,
                   warm=None) -> list[SVMPartFit]:
        """The one-vs-one SMO problems of the given parts, solved as one batch.

        ``X`` is on the current device; ``part_rows[k]`` are the rows of X of the
        k-th part, ``y_idx`` and ``sample_C`` (host) are aligned with X's rows.
        The layers of the tree methods pass, per part, ``members[k]`` (bool,
        ``(n_pairs, len(part_rows[k]))``: the rows that take part in each pair's
        problem; None: every row of the pair's two classes) and ``warm[k]``
        (the same shape: each pair's starting alphas; None: zeros).
        Returns one :class:`SVMPartFit` per part, in order. ``progress`` (a
        :class:`gpuml._progress.Progress`, only when called from the fitting
        thread) gets one line per part as the part's last problem is solved.
        """
        problems, layout, Xs = self._problems(X, part_rows, y_idx, sample_C, members, warm)
        report = None
        if progress:
            for k, (_, _, q, _, _) in enumerate(layout):
                if not len(q):  # one class (or none) in the part: nothing to solve
                    progress.update(k, part_line(len(part_rows[k]), 0, 0, True))

            def report(k, res):
                progress.update(k, part_line(len(part_rows[k]), len(res),
                                              sum(int(r.n_iter) for r in res),
                                              all(bool(r.converged) for r in res)))
        partitioned = max(map(len, part_rows), default=0) < self.n_samples  # P > 1
        results = smo_solve_batch(self.kernel, Xs, problems, tol=self.tol,
                                  max_iter=self.max_iter, cache_size=self.cache_size,
                                  shrinking=self.shrinking, n_jobs=self.n_jobs, progress=report,
                                  partitioned=partitioned)
        return self._part_fits(X, part_rows, layout, results)

    def _problems(self, X, part_rows, y_idx, sample_C, members=None, warm=None):
        """The one-vs-one SMO problems of the given parts (arguments as :meth:`_fit_parts`):
        the problems, each part's layout (which pairs hold which class, each variable's
        row and label) and each part's rows as the solver gets them."""
        n_classes = self.n_classes
        pairs = class_pairs(n_classes)
        n_pairs = len(pairs)
        # Per pair its first class's run, then its second's: labels +1, then -1.
        runs = np.array(pairs, dtype=np.int64).reshape(-1)
        sign = np.where(np.arange(2 * n_pairs) % 2 == 0, 1.0, -1.0)
        problems, layout, Xs = [], [], []
        for k, rows in enumerate(part_rows):
            rows = np.asarray(rows, dtype=np.int64)
            pos = np.flatnonzero(sample_C[rows] > 0)
            # Grouped by class, as LIBSVM does: every one-vs-one problem is then
            # two index runs whose kernel blocks the solver can share.
            pos = pos[np.argsort(y_idx[rows[pos]], kind="stable")]
            sel = to_output(rows[pos], X)
            Xs.append(self._solver_rows(X[sel]) if self.kernel.name != "precomputed"
                      else X[sel][:, sel])
            # Class c holds the part's rows bounds[c]:bounds[c + 1].
            bounds = np.searchsorted(y_idx[rows[pos]], np.arange(n_classes + 1))
            # Every pair's candidate rows are its two class runs, laid end to end
            # for all pairs of the part at once (entry e: pair pair_of[e]).
            lengths = np.diff(bounds)[runs]
            starts = np.repeat(bounds[runs] - np.concatenate([[0], np.cumsum(lengths)[:-1]]),
                               lengths)
            idx = starts + np.arange(starts.size)
            labels = np.repeat(sign, lengths)
            pair_of = np.repeat(np.arange(n_pairs), lengths[0::2] + lengths[1::2])
            if members is not None and members[k] is not None:
                keep = members[k][pair_of, pos[idx]]
                idx, labels, pair_of = idx[keep], labels[keep], pair_of[keep]
            has_first = np.bincount(pair_of[labels > 0], minlength=n_pairs) > 0
            has_second = np.bincount(pair_of[labels < 0], minlength=n_pairs) > 0
            # A pair with both classes present is one problem; the others are left out.
            q = np.flatnonzero(has_first & has_second)
            trained = (has_first & has_second)[pair_of]
            idx, labels, pair_of = idx[trained], labels[trained], pair_of[trained]
            C_part = sample_C[rows[pos][idx]] * self._part_C_factor(len(rows))
            start = (warm[k][pair_of, pos[idx]] if warm is not None and warm[k] is not None
                     else None)
            ends = np.cumsum(np.bincount(pair_of, minlength=n_pairs)[q]).tolist()
            problems += [SMOProblem(k, idx[lo:hi], labels[lo:hi], C_part[lo:hi],
                                    None if start is None else start[lo:hi])
                         for lo, hi in zip([0] + ends[:-1], ends)]
            layout.append((has_first, has_second, q, pos[idx], labels))
        return problems, layout, Xs

    def _part_fits(self, X, part_rows, layout, results, gather=True) -> list[SVMPartFit]:
        """One :class:`SVMPartFit` per part from its problems' results (in the order of
        :meth:`_problems`, whose ``layout`` it reads). ``gather=False``: the support
        vectors are left to the model's assembly (``support_vectors`` None)."""
        n_pairs = len(class_pairs(self.n_classes))
        # One copy to the host: the GPU solver's alphas are joined on the device first.
        alphas = [res.alpha for res in results]
        alpha = (to_numpy(namespace_of(alphas[0]).concatenate(alphas)) if alphas
                 else np.zeros(0))
        fits, supports = [], []
        first_problem = first_alpha = 0
        for rows, (has_first, has_second, q, owner, labels) in zip(part_rows, layout):
            mine = results[first_problem: first_problem + len(q)]
            first_problem += len(q)
            # 2: trained; 1: one class of the pair in the part (constant vote); 0: none.
            status = (has_first.astype(np.int8) + has_second).astype(np.int8)
            intercept = np.where(status == 1, has_first * 1.0 - has_second, 0.0)
            intercept[q] = [res.intercept for res in mine]
            n_iter = np.zeros(n_pairs, dtype=np.int64)
            n_iter[q] = [res.n_iter for res in mine]
            objective = np.full(n_pairs, np.nan)
            objective[q] = [res.objective for res in mine]
            part_alpha = alpha[first_alpha: first_alpha + len(owner)]
            first_alpha += len(owner)
            sv = part_alpha > 0
            # A row may be a support vector of several pairs: one column per row,
            # rows ascending.
            used = np.zeros(len(rows), dtype=bool)
            used[owner[sv]] = True
            support = np.flatnonzero(used)
            column = (np.cumsum(used) - 1)[owner[sv]]
            dual_coef = np.zeros((n_pairs, len(support)))
            sizes = [len(res.alpha) for res in mine]
            dual_coef[np.repeat(q, sizes)[sv], column] = (part_alpha * labels)[sv]
            supports.append(np.asarray(rows, dtype=np.int64)[support])
            fits.append(SVMPartFit(support, None, dual_coef, intercept, status, n_iter,
                                   objective, all(bool(res.converged) for res in mine), len(q)))
        if self.kernel.name == "precomputed":
            vectors = [np.empty((0, 0))] * len(fits)
        elif gather:
            vectors = support_vector_blocks(X, supports)
        else:
            vectors = [None] * len(fits)
        for fit, block in zip(fits, vectors):
            fit.support_vectors = block
        return fits


    def keep(self, fit, X_part, targets_part, row_ids) -> KeptSVMPart:
        """A part as its Dask worker keeps it, ready to predict there (``targets_part``: the
        class index of each of its rows, ``row_ids`` their training indices)."""
        return KeptSVMPart.of(fit, targets_part, row_ids, self.n_classes)

    def summary(self, fit: KeptSVMPart) -> KeptSVMPart:
        """What the client keeps of a kept part: everything but its support vectors."""
        return fit.summary()

    def _part_C_factor(self, m) -> float:
        """The factor on C in a part of ``m`` rows (``part_C``; 1 for the tree methods)."""
        if self.method != "casvm" or m == 0:
            return 1.0
        return float(PART_C_SCALES[self.part_C](self.n_samples, m))

    def _solver_rows(self, Xp):
        """A part's rows as the solver gets them: sparse ones dense when that costs little.

        A sparse part with no more features than rows is no larger dense than the kernel
        matrix its solver holds anyway. Densified, its kernel values come from the same GEMM
        as a dense fit's, bit for bit, so the sparse fit takes the same SMO steps and gives
        the same model (as SVC's dense and sparse LIBSVM agree); a product of sparse matrices
        sums in another order, and rounding differences then steer the working-set selection
        elsewhere (differences of the order of ``tol``). Wide sparse data (text) stays sparse.
        """
        if not hasattr(Xp, "tocsr"):
            return Xp
        m, d = Xp.shape
        if d <= m and m * d * Xp.dtype.itemsize <= self.cache_size * (1 << 20):
            return Xp.toarray()
        return Xp
