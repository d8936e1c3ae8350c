"""``CASVMClassifierCV`` against ``GridSearchCV``: one search over C and γ, its work shared.

In one process, on the same data, grids and folds (``StratifiedKFold(shuffle=True,
random_state=0)``, or one stratified 20 % hold-out), each search's time (the search and
its refit), its choice, its mean CV score, its refitted model's test accuracy, and for
``CASVMClassifierCV`` the gap ``GridSearchCV``'s best mean score minus ``GridSearchCV``'s
mean score at our choice (0: the same choice, or one as good):

* ``exact``: the exact SVM (``n_partitions=1``), C in (0.1, 1, 10, 100, 1000), γ in
  (0.1, 0.3, 1, 3, 10) x ``1 / (n_features * X.var())`` (``gamma_unit="scale"``), 3
  folds, beside ``GridSearchCV(SVC())`` (one process, and ``n_jobs=2``),
  ``GridSearchCV(CASVMClassifier(n_partitions=1))`` and, with the defaults,
  ``CASVMClassifierCV()`` beside ``GridSearchCV(CASVMClassifier())``; features
  standardised on the training rows (Fashion-MNIST: pixels / 255). Training rows:
  adult 6,000 (the issue's example), MAGIC 6,000, letter 6,000 (26 classes),
  Fashion-MNIST 3,000 drawn from its 60,000 (10 classes, 784 features), so
  that the exact baselines take minutes, not hours; test rows: 10,000 (adult),
  5,000 (the others);
* ``defaults at 200,000``: the scale benchmark's synthetic set (``bench_scale.
  draw_synthetic``: 28 features, float32), C in (0.1, 1, 10), γ in (0.3, 1, 3) x scale,
  3 folds, ``CASVMClassifierCV()`` beside ``GridSearchCV(CASVMClassifier())``;
  tested on 20,000 further rows;
* ``defaults at 1,000,000``: the same set, C in (0.1, 0.3, 1, 3, 10), γ in (0.25, 0.5,
  1, 2, 4) x scale, one 20 % hold-out; ``GridSearchCV(CASVMClassifier())`` timed on the
  five candidates of the grid's diagonal and its time estimated as 5x theirs (the
  ``estimated`` column says so); one ``CASVMClassifier()`` fit on the same rows, and the
  peak increase of the process's resident memory of that fit and of the search.

The SVC and exact baselines are not run at 200,000 rows and more (an exact SVM of
133,000 rows is hours on 2 cores): their rows say so.

Targets (the search issue, 2-core machine): exact, 5x5, 3 folds: at least 5x
``GridSearchCV(SVC())``'s speed on every set and 10x on adult, with the same choice or
one within 0.002 of GridSearchCV's best mean score; 200,000 rows: at least 4x
``GridSearchCV(CASVMClassifier())``, refit test accuracy within 0.1 point of its; 1,000,000
rows: at most 10x one fit's time; the search's peak memory at most 2x one fit's. The
notes of the table say which were met, with the figures.

``python -m bench.run search`` (about 40 minutes on 2 cores; run it when ``uptime``
shows a low load: the load before and after is in the notes); ``search:quick``: small
subsets and grids, a minute (``search_quick``); ``python -m bench.bench_search exact
magic adult``: the exact rows of the sets named only (``search_exact``).
"""

from __future__ import annotations

import gc
import os
import time
import warnings

import numpy as np
from sklearn.model_selection import GridSearchCV, StratifiedKFold, StratifiedShuffleSplit
from sklearn.svm import SVC

from bench._harness import record
from bench.datasets import DatasetMissing, load, train_test_split_std
from gpuml import CASVMClassifier, CASVMClassifierCV

EXACT_CS, EXACT_GAMMAS = (0.1, 1.0, 10.0, 100.0, 1000.0), (0.1, 0.3, 1.0, 3.0, 10.0)
MID_CS, MID_GAMMAS = (0.1, 1.0, 10.0), (0.3, 1.0, 3.0)
LARGE_CS, LARGE_GAMMAS = (0.1, 0.3, 1.0, 3.0, 10.0), (0.25, 0.5, 1.0, 2.0, 4.0)
#: training and test rows of the exact searches (quick: fewer, a 3 x 3 grid, 2 folds)
EXACT_SETS = {"adult": (6000, 10000), "magic": (6000, 5000), "letter": (6000, 5000),
              "fashion-mnist": (3000, 5000)}
QUICK_EXACT_SETS = {"adult": (800, 1000), "magic": (800, 1000), "letter": (1000, 1000),
                    "fashion-mnist": (500, 500)}
LARGE, QUICK_LARGE = (200_000, 1_000_000), (20_000, 40_000)
#: the elimination measured beside the full searches (``halving_factor``)
HALVING = 3
N_TEST = 20_000


def _scale(X):
    return 1.0 / (X.shape[1] * X.var())


def _exact_data(name, sizes):
    """Training and test rows of one exact set (standardised; Fashion-MNIST / 255)."""
    n_train, n_test = sizes
    if name == "fashion-mnist":
        from bench.bench_scale import load_fashion

        Xtr, Xte, ytr, yte = load_fashion(quick=False)
        rng = np.random.default_rng(0)
        keep = np.sort(rng.choice(len(ytr), n_train, replace=False))
        return (Xtr[keep].astype(np.float64), Xte[:n_test].astype(np.float64), ytr[keep],
                yte[:n_test])
    X, y = load(name)
    return train_test_split_std(X, y, train_size=n_train, test_size=n_test, random_state=0,
                                stratify=True)


def _load_average():
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _timed(fn):
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _choice(search, scale):
    C, gamma = search.best_params_["C"], search.best_params_["gamma"]
    return C, round(gamma / scale, 6)


def _row(data, n_train, grid, cv, method, search, seconds, scale, Xte, yte, **more):
    C, multiple = _choice(search, scale)
    return {"data": data, "n_train": n_train, "grid": grid, "cv": cv, "method": method,
            "ran": True, "seconds": seconds, "ratio": None, "C": C, "gamma_x_scale": multiple,
            "cv_score": float(search.best_score_), "gs_gap": None,
            "test_acc": float(search.score(Xte, yte)), **more}


def _gap(ours, reference):
    """GridSearchCV's best mean score minus its mean score at our choice."""
    means = reference.cv_results_["mean_test_score"]
    return float(means.max() - means[ours.best_index_])


def _ours(params, Xtr, ytr, folds, **settings):
    return CASVMClassifierCV(Cs=params["C"], gammas=params["gamma_x"], gamma_unit="scale",
                             cv=folds, random_state=0, **settings).fit(Xtr, ytr)


def exact_set(name, sizes, Cs, gammas, n_folds):
    """One exact set's rows: our searches and their baselines, in one process."""
    Xtr, Xte, ytr, yte = _exact_data(name, sizes)
    scale = _scale(Xtr)
    grid = {"C": list(Cs), "gamma": [g * scale for g in gammas]}
    folds = StratifiedKFold(n_folds, shuffle=True, random_state=0)
    shape, n_train = f"{len(Cs)}x{len(gammas)}", len(ytr)
    params = {"C": Cs, "gamma_x": gammas}
    rows = []

    def add(method, search, seconds, **more):
        rows.append(_row(name, n_train, shape, n_folds, method, search, seconds, scale, Xte,
                         yte, **more))
        print(f"{name}: {method} {seconds:.1f} s, choice {rows[-1]['C']}, "
              f"{rows[-1]['gamma_x_scale']} x scale (load {_load_average()})", flush=True)

    # ours first and last: the machine's load moves; the mean of the two is reported
    exact_first, t_first = _timed(lambda: _ours(params, Xtr, ytr, folds, n_partitions=1))
    svc, t_svc = _timed(lambda: GridSearchCV(SVC(), grid, cv=folds).fit(Xtr, ytr))
    svc2, t_svc2 = _timed(lambda: GridSearchCV(SVC(), grid, cv=folds, n_jobs=2).fit(Xtr, ytr))
    one, t_one = _timed(lambda: GridSearchCV(CASVMClassifier(n_partitions=1), grid,
                                             cv=folds).fit(Xtr, ytr))
    exact, t_last = _timed(lambda: _ours(params, Xtr, ytr, folds, n_partitions=1))
    t_exact = (t_first + t_last) / 2
    add("CASVMClassifierCV(n_partitions=1)", exact, t_exact, gs_gap=_gap(exact, svc),
        svc_ratio=t_svc / t_exact, note=f"runs {t_first:.1f} s and {t_last:.1f} s")
    add("GridSearchCV(SVC())", svc, t_svc, ratio=t_svc / t_exact)
    add("GridSearchCV(SVC(), n_jobs=2)", svc2, t_svc2, ratio=t_svc2 / t_exact)
    add("GridSearchCV(CASVMClassifier(n_partitions=1))", one, t_one, ratio=t_one / t_exact,
        gs_gap=_gap(one, svc))
    halved, t_halved = _timed(lambda: _ours(params, Xtr, ytr, folds, n_partitions=1,
                                            halving_factor=HALVING))
    add(f"CASVMClassifierCV(n_partitions=1, halving_factor={HALVING})", halved, t_halved,
        gs_gap=_gap(halved, svc), svc_ratio=t_svc / t_halved)
    ours, t_ours = _timed(lambda: _ours(params, Xtr, ytr, folds))
    parts, t_parts = _timed(lambda: GridSearchCV(CASVMClassifier(random_state=0), grid,
                                                 cv=folds).fit(Xtr, ytr))
    add("CASVMClassifierCV()", ours, t_ours, gs_gap=_gap(ours, parts))
    add("GridSearchCV(CASVMClassifier())", parts, t_parts, ratio=t_parts / t_ours)
    return rows


def _measured(task, n_train, n_test, Cs, gammas, hold_out):
    """One of the large set's measurements in this (fresh) process: ``task`` ``"fit"`` (one
    ``CASVMClassifier()`` fit), ``"search"`` or ``"halving"`` (``CASVMClassifierCV()``, without
    and with ``halving_factor``): its seconds, the peak increase of the process's resident
    memory over it, and what the rows report."""
    from bench.bench_scale import PeakRSS, _malloc_trim, draw_synthetic

    warnings.simplefilter("ignore")
    X, y = draw_synthetic(True, n_train + n_test)
    Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
    del X, y
    CASVMClassifier().fit(Xtr[:20000], ytr[:20000])  # compiled code loaded from the cache
    folds = _folds(hold_out)
    settings = {} if task != "halving" else {"halving_factor": HALVING}
    gc.collect()
    if _malloc_trim:
        _malloc_trim(0)
    with PeakRSS() as memory:
        if task == "fit":
            model, seconds = _timed(lambda: CASVMClassifier(random_state=0).fit(Xtr, ytr))
        else:
            model, seconds = _timed(lambda: _ours({"C": Cs, "gamma_x": gammas}, Xtr, ytr,
                                                  folds, **settings))
    out = {"seconds": seconds, "peak_mib": memory.mib, "test_acc": float(model.score(Xte, yte))}
    if task != "fit":
        C, multiple = _choice(model, _scale(Xtr))
        out.update(C=C, gamma_x_scale=multiple, cv_score=float(model.best_score_),
                   cv_results=model.cv_results_)
    return out


def _folds(hold_out):
    return (StratifiedShuffleSplit(1, test_size=0.2, random_state=0) if hold_out
            else StratifiedKFold(3, shuffle=True, random_state=0))


def _in_child(*args):
    """:func:`_measured` in a fresh process (spawned): each measurement starts from the
    same memory, whatever ran before."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_measured, args)


def large_set(n_train, Cs, gammas, hold_out, quick):
    """The defaults on the synthetic set: one fit, ours with and without halving (each in a
    fresh process), beside GridSearchCV(CASVMClassifier()) (with ``hold_out``: estimated
    from the grid's diagonal)."""
    from bench.bench_scale import draw_synthetic

    n_test = 5000 if quick else N_TEST
    cv, shape = ("20% hold-out" if hold_out else 3), f"{len(Cs)}x{len(gammas)}"
    name, rows = "synthetic", []
    one = _in_child("fit", n_train, n_test, Cs, gammas, hold_out)
    t_fit = one["seconds"]
    searches = {}
    for task, method in (("search", "CASVMClassifierCV()"),
                         ("halving", f"CASVMClassifierCV(halving_factor={HALVING})")):
        searches[task] = _in_child(task, n_train, n_test, Cs, gammas, hold_out)
        found = dict(searches[task])
        found.pop("cv_results")
        rows.append({"data": name, "n_train": n_train, "grid": shape, "cv": cv,
                     "method": method, "ran": True, **found, "gs_gap": None,
                     "per_fit": found["seconds"] / t_fit})
        print(f"{name} {n_train}: {method} {found['seconds']:.1f} s (one fit {t_fit:.1f} s; "
              f"load {_load_average()})", flush=True)
    X, y = draw_synthetic(True, n_train + n_test)
    Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
    del X, y
    scale, folds = _scale(Xtr), _folds(hold_out)
    if hold_out:
        # GridSearchCV on the five candidates of the diagonal; its whole time estimated
        diagonal = [{"C": [C], "gamma": [g * scale]} for C, g in zip(Cs, gammas)]
        _, t_part = _timed(lambda: GridSearchCV(CASVMClassifier(random_state=0), diagonal,
                                                cv=folds, refit=False).fit(Xtr, ytr))
        factor = len(Cs) * len(gammas) / len(diagonal)
        estimate = t_part * factor + t_fit
        for row in rows:
            row["base_ratio"] = estimate / row["seconds"]
        rows.append({"data": name, "n_train": n_train, "grid": shape, "cv": cv,
                     "method": "GridSearchCV(CASVMClassifier())", "ran": False,
                     "seconds": estimate,
                     "note": f"estimated: its {len(diagonal)} diagonal candidates took "
                             f"{t_part:.1f} s, times {factor:g}, plus one fit ({t_fit:.1f} s)"})
    else:
        grid = {"C": list(Cs), "gamma": [g * scale for g in gammas]}
        parts, t_parts = _timed(lambda: GridSearchCV(CASVMClassifier(random_state=0), grid,
                                                     cv=folds).fit(Xtr, ytr))
        means = parts.cv_results_["mean_test_score"]
        for row, task in zip(rows, ("search", "halving")):
            best = int(np.argmin(searches[task]["cv_results"]["rank_test_score"]))
            row["gs_gap"] = float(means.max() - means[best])
            row["base_ratio"] = t_parts / row["seconds"]
        rows.append(_row(name, n_train, shape, cv, "GridSearchCV(CASVMClassifier())", parts,
                         t_parts, scale, Xte, yte))
    rows.append({"data": name, "n_train": n_train, "grid": "1", "cv": "-",
                 "method": "CASVMClassifier() (one fit)", "ran": True, "seconds": t_fit,
                 "test_acc": one["test_acc"], "peak_mib": one["peak_mib"]})
    for method in ("GridSearchCV(SVC())", "GridSearchCV(CASVMClassifier(n_partitions=1))"):
        rows.append({"data": name, "n_train": n_train, "grid": shape, "cv": cv,
                     "method": method, "ran": False,
                     "note": "not run: exact SVMs of this many rows take hours on 2 cores"})
    return rows


def targets(rows, quick) -> list[str]:
    """Each target of the search issue, met or missed, with its figures: for the search as
    it is by default and with ``halving_factor``."""
    def find(data, method, n=None):
        return next((r for r in rows if r["data"] == data and r["method"] == method
                     and (n is None or r["n_train"] == n)), None)

    def verdict(ok):
        return "met" if ok else "missed"

    lines = []
    exact = ("CASVMClassifierCV(n_partitions=1)",
             f"CASVMClassifierCV(n_partitions=1, halving_factor={HALVING})")
    for name in EXACT_SETS:
        need = 10.0 if name == "adult" else 5.0
        for method in exact:
            ours = find(name, method)
            if ours is None:
                lines.append(f"- exact, {name}: not run")
                break
            speed, gap = ours["svc_ratio"], ours["gs_gap"]
            lines.append(f"- exact, {name}, {method}: {speed:.1f}x GridSearchCV(SVC())'s "
                         f"speed (target >= {need:g}x), its choice {gap:.4f} below "
                         f"GridSearchCV's best mean score (target <= 0.002): "
                         f"{verdict(speed >= need and gap <= 0.002)}")
    small, large = QUICK_LARGE if quick else LARGE
    base = find("synthetic", "GridSearchCV(CASVMClassifier())", small)
    for method in ("CASVMClassifierCV()", f"CASVMClassifierCV(halving_factor={HALVING})"):
        ours = find("synthetic", method, small)
        if ours and base:
            speed = ours["base_ratio"]
            drop = 100 * (base["test_acc"] - ours["test_acc"])
            lines.append(f"- defaults, {small:,} rows, 3x3, 3 folds, {method}: {speed:.1f}x "
                         f"GridSearchCV(CASVMClassifier())'s speed (target >= 4x), refit "
                         f"test accuracy {drop:+.2f} point below its (target <= 0.1): "
                         f"{verdict(speed >= 4.0 and drop <= 0.1)}")
    one = find("synthetic", "CASVMClassifier() (one fit)", large)
    for method in ("CASVMClassifierCV()", f"CASVMClassifierCV(halving_factor={HALVING})"):
        ours = find("synthetic", method, large)
        if ours and one:
            ratio = ours["peak_mib"] / one["peak_mib"]
            lines.append(f"- defaults, {large:,} rows, 5x5, hold-out, {method}: "
                         f"{ours['per_fit']:.1f}x one fit's time (target <= 10x): "
                         f"{verdict(ours['per_fit'] <= 10)}; peak memory {ours['peak_mib']:.0f}"
                         f" MiB against one fit's {one['peak_mib']:.0f} MiB, {ratio:.2f}x "
                         f"(target <= 2x): {verdict(ratio <= 2)}")
    return lines


def exact_only(names) -> None:
    """The exact rows of the sets ``names`` (``search_exact``), the targets of those."""
    warnings.simplefilter("ignore")
    before = _load_average()
    rows = []
    for name in names:
        rows += exact_set(name, EXACT_SETS[name], EXACT_CS, EXACT_GAMMAS, 3)
    verdicts = [line for line in targets(rows, False) if "not run" not in line]
    record("search_exact", rows, title="CASVMClassifierCV against GridSearchCV: exact rows",
           notes=f"The exact rows of `python -m bench.run search` for {', '.join(names)} "
                 f"only; columns as there.\n\nLoad average before: {before}; after: "
                 f"{_load_average()}.\n\nTargets:\n" + "\n".join(verdicts))


def main(quick: bool = False, gpu: bool = False) -> None:
    warnings.simplefilter("ignore")
    before = _load_average()
    sets = QUICK_EXACT_SETS if quick else EXACT_SETS
    Cs, gammas = (MID_CS, MID_GAMMAS) if quick else (EXACT_CS, EXACT_GAMMAS)
    rows = []
    for name, sizes in sets.items():
        try:
            rows += exact_set(name, sizes, Cs, gammas, 2 if quick else 3)
        except DatasetMissing as err:
            print(f"{name}: skipped ({err})", flush=True)
    small, large = QUICK_LARGE if quick else LARGE
    rows += large_set(small, MID_CS, MID_GAMMAS, hold_out=False, quick=quick)
    rows += large_set(large, (MID_CS if quick else LARGE_CS),
                      (MID_GAMMAS if quick else LARGE_GAMMAS), hold_out=True, quick=quick)
    verdicts = targets(rows, quick)
    notes = ("Columns: `seconds` the search with its refit (ours on the exact sets: the mean "
             "of a run before and one after the baselines); `ratio` the baseline's time over "
             "ours (on the row of the baseline); `C`, `gamma_x_scale` the choice (γ in units "
             "of 1 / (n_features X.var())); `cv_score` its mean CV score; `gs_gap` "
             "GridSearchCV's best mean score minus its mean score at our choice (the "
             "exact rows: GridSearchCV(SVC())'s; the defaults: GridSearchCV("
             "CASVMClassifier())'s); `test_acc` the refitted model's; `peak_mib` the peak "
             "increase of the process's resident memory (the synthetic sets: each measured "
             "in a fresh process); `per_fit` the search's time over one fit's; `base_ratio`"
             " GridSearchCV(CASVMClassifier())'s time over the row's. n_jobs=None "
             "everywhere: CASVMClassifier and CASVMClassifierCV use "
             "both cores where the work is large enough, SVC one (the `n_jobs=2` row "
             f"runs two fits at a time).\n\nLoad average before: {before}; after: "
             f"{_load_average()}.\n\nTargets:\n" + "\n".join(verdicts))
    record("search_quick" if quick else "search", rows, notes=notes,
           title="CASVMClassifierCV against GridSearchCV")


if __name__ == "__main__":
    import sys

    names = sys.argv[2:]
    if sys.argv[1:2] != ["exact"] or not names or any(n not in EXACT_SETS for n in names):
        sys.exit("usage: python -m bench.bench_search exact SET [SET ...]; sets: "
                 + ", ".join(EXACT_SETS))
    exact_only(names)
