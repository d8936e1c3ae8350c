"""A default search's peak memory against one fit's: bench_search's largest row alone.

``CASVMClassifierCV()`` at its defaults, without halving, on the scale benchmark's
synthetic set (``bench_scale.draw_synthetic``) with bench_search's large grid (C in (0.1,
0.3, 1, 3, 10), γ in (0.25, 0.5, 1, 2, 4) x scale) and one stratified 20 % hold-out,
beside one ``CASVMClassifier()`` fit of the same rows: each in a fresh process, the peak
increase of its resident memory (``bench_search._measured``), its seconds and the test
accuracy of the model (the search's refit). The issue's target: the search's peak at most
twice one fit's.

    python -m bench.studies.search_memory [--rows N]

Writes ``search_memory.md`` beside the other results of this machine.
"""

from __future__ import annotations

import argparse

from bench._harness import record
from bench.bench_search import LARGE_CS, LARGE_GAMMAS, N_TEST, _in_child


def main(rows: int = 1_000_000) -> None:
    one = _in_child("fit", rows, N_TEST, LARGE_CS, LARGE_GAMMAS, True)
    search = _in_child("search", rows, N_TEST, LARGE_CS, LARGE_GAMMAS, True)
    out = [{"what": "one CASVMClassifier() fit", "seconds": one["seconds"],
            "peak_mib": one["peak_mib"], "peak_ratio": 1.0, "test_acc": one["test_acc"]},
           {"what": "CASVMClassifierCV(), 5 x 5, 20 % hold-out", "seconds": search["seconds"],
            "peak_mib": search["peak_mib"], "peak_ratio": search["peak_mib"] / one["peak_mib"],
            "test_acc": search["test_acc"]}]
    ratio = search["peak_mib"] / one["peak_mib"]
    print(f"{rows:,} rows: search peak {search['peak_mib']:.0f} MiB, one fit's "
          f"{one['peak_mib']:.0f} MiB ({ratio:.2f}x); {search['seconds']:.1f} s against "
          f"{one['seconds']:.1f} s ({search['seconds'] / one['seconds']:.1f}x)", flush=True)
    record("search_memory", out, title="A default CASVMClassifierCV's peak memory",
           notes=f"{rows:,} synthetic rows (28 features, float32); each row measured in a "
                 f"fresh process; peak_mib the peak increase of its resident memory; "
                 f"peak_ratio over one fit's (target <= 2): "
                 f"{'met' if ratio <= 2 else 'missed'}.",
           command="python -m bench.studies.search_memory"
                   + ("" if rows == 1_000_000 else f" --rows {rows}"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    main(parser.parse_args().rows)
