"""Run benchmarks: ``python -m bench.run [NAME ...] [--quick] [--gpu]``.

Each ``bench/bench_<name>.py`` defines ``main(quick: bool, gpu: bool)``. With
no names, every benchmark runs (GPU ones only with ``--gpu``).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
from pathlib import Path


def available() -> list[str]:
    here = Path(__file__).resolve().parent
    return sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([str(here)])
                  if m.name.startswith("bench_"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default all): {available()}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for smoke runs")
    parser.add_argument("--gpu", action="store_true", help="run the GPU variants too")
    args = parser.parse_args(argv)
    names = args.names or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; available: {available()}")
    from bench import _harness

    flags = (" --quick" if args.quick else "") + (" --gpu" if args.gpu else "")
    for name in names:
        _harness.COMMAND = f"python -m bench.run {name}{flags}"
        module = importlib.import_module(f"bench.bench_{name}")
        t0 = time.perf_counter()
        print(f"=== bench_{name} ===", flush=True)
        module.main(quick=args.quick, gpu=args.gpu)
        print(f"=== bench_{name} done in {time.perf_counter() - t0:.1f}s ===", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
