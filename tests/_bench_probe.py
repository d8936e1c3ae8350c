"""A benchmark for the harness's own tests (``tests/test_gpu_check.py``): instant, two
tables; ``GPUML_PROBE=fail`` makes it raise after its first table, ``GPUML_PROBE=hang``
makes it sleep until it is killed."""

import os
import time

from bench._harness import record


def main(quick: bool = False, gpu: bool = False) -> None:
    mode = os.environ.get("GPUML_PROBE", "")
    record("probe_a", [{"quick": quick, "gpu": gpu, "value": 1.5}], gpu=gpu, title="Probe A")
    if mode == "fail":
        raise RuntimeError("the probe failed on purpose")
    if mode == "hang":
        time.sleep(3600)
    record("probe_b", [{"x": 1}, {"x": 2}], gpu=gpu, title="Probe B", notes="two rows")
