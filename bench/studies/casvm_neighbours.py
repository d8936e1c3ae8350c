"""Can CA-SVM's neighbours rule search fewer support vectors? Two candidates, measured.

``combine="neighbors"`` weighs the parts by a row's ``n_neighbors`` nearest support
vectors, searched among all of them: its cost grows with the model's size. Two
ways to search fewer, each against the full search on the data sets of
``bench/results/cpu-2core/casvm_defaults.md`` (CASVMClassifier's defaults, P=16, three
seeds):

* **pruned**: skip a part whose support vectors' ball (its centre, its farthest
  support vector) lies farther than a row's k-th nearest found so far (triangle
  inequality): the same neighbours, exactly; reported: the parts visited per row.
* **q nearest parts**: the neighbours among the support vectors of each row's q
  nearest parts (by centre) only: an approximation; reported: the accuracy change
  and the speed-up of ``predict``.

    python -m bench.studies.casvm_neighbours [--quick] [--partition P] [--large]

``--large``: the rule as shipped at large P (since ``n_partitions="auto"``, P grows with
n; beyond 16 parts with support vectors a row's neighbours are searched among its 16
nearest parts), against the search over every part, on 100,000 to 400,000 synthetic
rows (``casvm_neighbours_large.md``).

Writes ``casvm_neighbours.md`` beside the other results of this machine.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import gpuml.routing as routing
from bench._harness import RESULTS, machine_name
from bench.datasets import CASVM_SETS, casvm_split
from gpuml import CASVMClassifier
from gpuml.kernels.pairwise import sq_distances, squared_norms

QS = (2, 3, 4, 6)


def _members(vector_part, n_parts):
    part = np.asarray(vector_part, dtype=np.int64)
    order = np.argsort(part, kind="stable")
    ends = np.searchsorted(part[order], np.arange(n_parts + 1))
    return [order[ends[p]:ends[p + 1]] for p in range(n_parts)]


class _Search:
    """The k nearest support vectors of rows, visited part by part, merged as they come."""

    def __init__(self, X, vectors, members, k):
        self.X, self.vectors, self.members, self.k = X, vectors, members, k
        self.y_norms = squared_norms(vectors)
        self.best_d = np.full((X.shape[0], k), np.inf)
        self.best_p = np.full((X.shape[0], k), -1, dtype=np.int64)
        self.visits = 0

    def visit(self, p, rows):
        idx = self.members[p]
        if not rows.size or not idx.size:
            return
        self.visits += rows.size
        D = sq_distances(self.X[rows], self.vectors[idx], self.y_norms[idx])
        k = self.k
        if D.shape[1] > k:
            D = np.take_along_axis(D, np.argpartition(D, k - 1, axis=1)[:, :k], axis=1)
        cand_d = np.concatenate([self.best_d[rows], D], axis=1)
        cand_p = np.concatenate([self.best_p[rows], np.full(D.shape, p)], axis=1)
        keep = np.argpartition(cand_d, k - 1, axis=1)[:, :k]
        self.best_d[rows] = np.take_along_axis(cand_d, keep, axis=1)
        self.best_p[rows] = np.take_along_axis(cand_p, keep, axis=1)

    def weights(self, n_parts):
        out = np.zeros((self.X.shape[0], n_parts))
        for j in range(self.k):
            rows = np.flatnonzero(self.best_p[:, j] >= 0)
            np.add.at(out, (rows, self.best_p[rows, j]), 1.0)
        return out / out.sum(axis=1, keepdims=True)


def pruned_weights(X, vectors, vector_part, n_parts, n_neighbors, centers):
    """The full rule's weights, skipping parts the triangle inequality rules out; returns
    the weights and the parts visited per row."""
    members = _members(vector_part, n_parts)
    search = _Search(X, vectors, members, min(n_neighbors, vectors.shape[0]))
    radii = np.array([np.sqrt(sq_distances(vectors[m], centers[p:p + 1]).max())
                      if m.size else 0.0 for p, m in enumerate(members)])
    lower = np.maximum(np.sqrt(np.maximum(sq_distances(X, centers), 0.0)) - radii, 0.0) ** 2
    lower[:, [p for p, m in enumerate(members) if not m.size]] = np.inf
    first = np.argmin(lower, axis=1)
    for p in np.unique(first).tolist():
        search.visit(p, np.flatnonzero(first == p))
    visited = np.zeros_like(lower, dtype=bool)
    visited[np.arange(len(first)), first] = True
    for p in range(n_parts):
        kth = search.best_d.max(axis=1)
        need = np.flatnonzero(~visited[:, p] & (lower[:, p] <= kth * (1 + 1e-6)))
        search.visit(p, need)
    return search.weights(n_parts), search.visits / X.shape[0]


def large(quick: bool) -> int:
    """``--large``: the rule as shipped at large P (``CASVMClassifier()``'s
    ``n_partitions="auto"`` on synthetic data): each row's neighbours among its
    ``NEIGHBOR_PARTS`` (16) nearest parts, against every part and the nearest centre."""
    from sklearn.datasets import make_classification

    n_test = 10_000
    sizes = (30_000,) if quick else (100_000, 200_000, 400_000)
    X, y = make_classification(max(sizes) + n_test, n_features=28, n_informative=20,
                               n_redundant=4, flip_y=0.05, class_sep=0.8, random_state=0)
    X = X.astype(np.float32)
    Xte, yte = X[-n_test:], y[-n_test:]
    lines, shipped = [], routing.NEIGHBOR_PARTS
    for n in sizes:
        clf = CASVMClassifier(random_state=0).fit(X[:n], y[:n])
        cells = [f"{n:,}", str(clf.n_partitions_), f"{len(clf.support_):,}"]
        for _rule, q, combine in (("16 nearest parts", shipped, "neighbors"),
                                  ("every part", clf.n_partitions_, "neighbors"),
                                  ("nearest centre", shipped, "nearest")):
            routing.NEIGHBOR_PARTS, clf.combine = q, combine
            try:
                clf.predict(Xte[:200])  # warm
                t0 = time.perf_counter()
                acc = float((clf.predict(Xte) == yte).mean())
                cells.append(f"{100 * acc:.2f} %, {time.perf_counter() - t0:.2f} s")
            finally:
                routing.NEIGHBOR_PARTS, clf.combine = shipped, "neighbors"
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    out = RESULTS / machine_name() / f"casvm_neighbours_large{'_quick' if quick else ''}.md"
    out.write_text(
        "# CA-SVM's neighbours rule at large P: the 16 nearest parts searched\n\n"
        f"Machine: `{machine_name()}`. Command: `python -m bench.studies.casvm_neighbours "
        f"--large{' --quick' if quick else ''}`.\n\n"
        "CASVMClassifier() (n_partitions='auto': parts of at most 2,048 rows) on "
        "make_classification(n_features=28, n_informative=20, n_redundant=4, flip_y=0.05, "
        "class_sep=0.8), float32; accuracy on 10,000 test rows and the time to predict them "
        "(one run after a warm-up, shared 2-core machine) with each row's 20 nearest support "
        "vectors searched among its 16 nearest parts (the shipped rule, "
        "gpuml.routing.NEIGHBOR_PARTS), among every part, and with the nearest-centre rule "
        "(combine='nearest') on the same model.\n\n"
        "| n_train | P | support vectors | 16 nearest parts | every part | nearest centre |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--large", action="store_true", help="the shipped rule at large P "
                    "(synthetic data, n_partitions='auto')")
    ap.add_argument("--partition", default="fcfs", help="the partitioner (default: fcfs, "
                    "CASVMClassifier's)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.large:
        return large(args.quick)
    lines, shipped = [], routing.NEIGHBOR_PARTS
    for name in CASVM_SETS:
        Xtr, Xte, ytr, yte = casvm_split(name, (3000, 1000) if args.quick else None)
        for seed in ((0,) if args.quick else (0, 1, 2)):
            clf = CASVMClassifier(n_partitions=16, partition=args.partition,
                                  random_state=seed).fit(Xtr, ytr)
            t0 = time.perf_counter()
            full = float((clf.predict(Xte) == yte).mean())
            t_full = time.perf_counter() - t0
            V, part, P = clf.support_vectors_, clf.support_part_, clf.part_intercept_.shape[0]
            exact, visits = pruned_weights(Xte, V, part, P, clf.n_neighbors, clf.centers_)
            same = bool(np.array_equal(exact, routing.neighbor_weights(Xte, V, part, P,
                                                                       clf.n_neighbors)))
            cells = [f"{name} | {seed} | {100 * full:.2f} | {visits:.1f} of {P} | "
                     f"{'yes' if same else 'no'}"]
            for q in QS:
                routing.NEIGHBOR_PARTS = q  # the shipped search, bounded to q parts
                try:
                    t0 = time.perf_counter()
                    acc = float((clf.predict(Xte) == yte).mean())
                    t_q = time.perf_counter() - t0
                finally:
                    routing.NEIGHBOR_PARTS = shipped
                cells.append(f"{100 * (acc - full):+.2f} pt, {t_full / t_q:.1f}x")
            lines.append("| " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    head = ("| data | seed | accuracy, full rule (%) | pruned: parts visited per row | "
            "pruned: weights equal to the full rule's (ties at the k-th place aside) | "
            + " | ".join(f"q={q}" for q in QS) + " |")
    rule = "|" + "---|" * (5 + len(QS))
    suffix = "" if args.partition == "fcfs" else f"_{args.partition}"
    out = RESULTS / machine_name() / f"casvm_neighbours{suffix}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        "# CA-SVM's neighbours rule over fewer support vectors\n\n"
        f"Machine: `{machine_name()}`. Command: `python -m bench.studies.casvm_neighbours"
        f"{' --quick' if args.quick else ''}"
        f"{'' if args.partition == 'fcfs' else ' --partition ' + args.partition}`.\n\n"
        f"CASVMClassifier(n_partitions=16, partition={args.partition!r}) with its other "
        "defaults (part_C='sqrt', combine='neighbors', 20 neighbours). q=*: the "
        "accuracy change against the full rule and predict's speed-up when each row's "
        "neighbours are searched among its q nearest parts' support vectors only.\n\n"
        + head + "\n" + rule + "\n" + "\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
