"""Where a default search's time goes: its candidates' fits, their scoring, the refit.

``CASVMClassifierCV()`` at its defaults on the scale benchmark's synthetic set
(``bench_scale.draw_synthetic``), the grid and folds of ``bench_search``'s 200,000-row
row (C in (0.1, 1, 10), γ in (0.3, 1, 3) x scale, 3 stratified folds), beside one
``CASVMClassifier()`` fit of all the rows: the search's seconds split by its
``cv_results_`` (``mean_fit_time`` and ``mean_score_time`` times the folds, summed over
the candidates; a fit's time includes its share of the fold's split), its refit
(``refit_time_``), and per candidate the mean SMO steps and support vectors.

    python -m bench.studies.search_breakdown [--rows N]

Writes ``search_breakdown.md`` beside the other results of this machine.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from bench._harness import record
from bench.bench_scale import draw_synthetic
from bench.bench_search import MID_CS, MID_GAMMAS, _folds
from gpuml import CASVMClassifier, CASVMClassifierCV


def main(rows: int = 200_000) -> None:
    warnings.simplefilter("ignore")
    X, y = draw_synthetic(True, rows)
    CASVMClassifier().fit(X[:20000], y[:20000])  # compiled code loaded from the cache
    start = time.perf_counter()
    one = CASVMClassifier(random_state=0).fit(X, y)
    one_s = time.perf_counter() - start
    start = time.perf_counter()
    search = CASVMClassifierCV(Cs=MID_CS, gammas=MID_GAMMAS, gamma_unit="scale",
                               cv=_folds(False), random_state=0).fit(X, y)
    total = time.perf_counter() - start
    res, k = search.cv_results_, search.n_splits_
    fits = float(res["mean_fit_time"].sum() * k)
    scoring = float(res["mean_score_time"].sum() * k)
    out = [{"what": "one CASVMClassifier() fit, all rows", "seconds": one_s,
            "n_iter": int(np.sum(one.n_iter_)), "n_support": len(one.support_)},
           {"what": "the search", "seconds": total},
           {"what": "  its candidates' fits (with the shared split)", "seconds": fits},
           {"what": "  their scoring on the validation rows", "seconds": scoring},
           {"what": "  the refit", "seconds": float(search.refit_time_)},
           {"what": "  the rest", "seconds": total - fits - scoring - search.refit_time_}]
    for params, n_iter, n_support, fit_s, score_s in zip(
            res["params"], res["mean_n_iter"], res["mean_n_support"], res["mean_fit_time"],
            res["mean_score_time"]):
        out.append({"what": f"candidate C={params['C']:g}, gamma={params['gamma']:.3g}",
                    "seconds": float(fit_s + score_s), "fit_s": float(fit_s),
                    "score_s": float(score_s), "n_iter": int(n_iter),
                    "n_support": int(n_support)})
    record("search_breakdown", out, title="Where a default CASVMClassifierCV's time goes",
           notes=f"{rows:,} synthetic rows (28 features, float32), 3 x 3 grid, 3 folds; "
                 "candidates: means over the folds (a fold trains on two thirds of the rows).",
           command="python -m bench.studies.search_breakdown"
                   + ("" if rows == 200_000 else f" --rows {rows}"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    main(parser.parse_args().rows)
