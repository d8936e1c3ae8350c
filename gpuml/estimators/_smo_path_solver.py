"""CA-SVM's settings that differ in C and γ only, solved together: one C path per γ.

A search over C and γ fits, on one split, settings whose parts hold the same rows and the
same one-vs-one problems; only the bounds (C) and the kernel (γ) change.
:class:`SMOPathSolver` fits them at once, as the pipeline's solver of several settings
(``n_settings``, :func:`gpuml.pipeline.fit_settings` with ``jointly=True``):

* the problems of the parts are laid out once (:meth:`SMOPartSolver._problems`), with
  their bounds for C = 1 (class and sample weights, ``part_C``'s factor);
* per γ, :func:`gpuml.kernels.smo_solve_path` solves them for every C: each part's
  kernel values computed once and reused by every C, each C started from the previous
  C's solution (alpha seeding: DeCoste and Wagstaff, "Alpha seeding for support vector
  machines", KDD 2000), each result the cold start's optimum to ``tol``; on a GPU the
  problems of small parts for every C in one launch (``one_launch="auto"``);
* the γ values run side by side in threads when the parts alone would leave threads
  idle (fewer parts than threads: the exact SVM), one after another otherwise.

:func:`solve_together` is CA-SVM's ``_solve_together``: it groups the solvers of
settings that differ in C and γ only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..kernels import map_threads, path_threads, smo_solve_path
from ._smo_solver import SMOPartSolver


@dataclass
class SMOPathSolver(SMOPartSolver):
    """The parts' one-vs-one problems for every ``(kernel, Cs)`` of ``paths`` (each ``Cs``
    increasing): ``n_settings`` fits per part, path after path, C after C. The other
    fields are :class:`SMOPartSolver`'s (its ``C`` unused: 1)."""

    paths: tuple = ()
    #: a search scores every setting's model in this process: its fits are gathered
    keeps_parts_on_workers = False

    @property
    def n_settings(self) -> int:
        return sum(len(Cs) for _, Cs in self.paths)

    @property
    def layered(self) -> bool:
        return False

    def solve(self, backend, X, targets, weights, part_rows, part_ids, progress=None):
        """Every setting's fit of the given parts: per part, a tuple of ``n_settings`` fits."""
        X = backend.asarray(X)
        problems, layout, Xs = self._problems(X, part_rows, targets,
                                              self.row_C(targets, weights))
        partitioned = max(map(len, part_rows), default=0) < self.n_samples  # P > 1
        sizes = np.array([np.size(p.idx) for p in problems], dtype=np.int64)
        outer, inner = path_threads(X, self.n_jobs, sizes, len(self.paths), len(Xs))

        def path_fits(path):
            kernel, Cs = path
            if not problems:
                return [self._part_fits(X, part_rows, layout, [])] * len(Cs)
            by_C = smo_solve_path(kernel, Xs, problems, Cs, tol=self.tol, max_iter=self.max_iter,
                                  cache_size=self.cache_size, shrinking=self.shrinking,
                                  n_jobs=inner, partitioned=partitioned, one_launch="auto")
            # With the rows in this process, the support vectors are gathered as each
            # setting's model is assembled, not here: every C's at once would be as many
            # copies of the support vectors as there are Cs.
            return [self._part_fits(X, part_rows, layout, results, gather=not self.rows_here)
                    for results in by_C]

        per_setting = [fits for path in map_threads(path_fits, self.paths, outer)
                       for fits in path]
        return [tuple(fits[k] for fits in per_setting) for k in range(len(part_rows))]


#: The fields of :class:`SMOPartSolver` that settings solved together share (all but C, the
#: kernel's γ, the progress and the cost, which follow from them).
_SHARED = tuple(f.name for f in fields(SMOPartSolver)
                if f.name not in ("C", "kernel", "progress", "cost", "class_weight"))


def _shared_key(solver):
    """What settings solved together must share, or None where a solver goes alone: the
    tree methods (layered), infinite C (no path), solvers of other kinds."""
    if type(solver) is not SMOPartSolver or solver.layered or not np.isfinite(solver.C):
        return None
    kernel = solver.kernel
    return (tuple(getattr(solver, name) for name in _SHARED), kernel.name, kernel.degree,
            kernel.coef0, tuple(np.asarray(solver.class_weight, dtype=np.float64).tolist()))


def solve_together(solvers) -> list:
    """CA-SVM's groups of settings on one split (``_solve_together``): the solvers that
    share everything but C and γ become one :class:`SMOPathSolver`, one C path per γ;
    the others (and a setting repeated within a group) are solved alone.

    Returns ``(solver, members)`` pairs: ``members[k]`` is the index in ``solvers`` of
    the solver's k-th setting.
    """
    alone, groups = [], {}
    for k, solver in enumerate(solvers):
        key = _shared_key(solver)
        if key is None:
            alone.append((solver, [k]))
        else:
            groups.setdefault(key, []).append(k)
    together = []
    for members in groups.values():
        by_kernel = {}
        for k in members:
            by_C = by_kernel.setdefault(solvers[k].kernel, {})
            by_C.setdefault(float(solvers[k].C), []).append(k)
        paths, order = [], []
        for kernel, by_C in by_kernel.items():
            Cs = sorted(by_C)
            paths.append((kernel, tuple(Cs)))
            order += [by_C[C][0] for C in Cs]
            alone += [(solvers[k], [k]) for C in Cs for k in by_C[C][1:]]
        if len(order) == 1:
            alone.append((solvers[order[0]], order))
            continue
        first = solvers[order[0]]
        shared = {f.name: getattr(first, f.name) for f in fields(SMOPartSolver)}
        together.append((SMOPathSolver(**dict(shared, C=1.0, progress=None),
                                       paths=tuple(paths)), order))
    return together + alone
