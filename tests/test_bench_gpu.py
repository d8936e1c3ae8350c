"""The GPU benchmark's CPU dry run: every target runs at tiny sizes and reports.

On a machine without a GPU, ``python -m bench.run gpu`` runs the same functions as
the GPU run with CUDA-only figures marked as skipped; this keeps that harness from
rotting between the rare runs on a GPU machine.
"""

import json

import pytest

from bench import _harness, bench_gpu
from bench.datasets import DatasetMissing, load_adult


def test_timings_times_each_call_after_the_warmups():
    calls = []
    out = _harness.timings(lambda: calls.append("call"), repeat=3, warmup=2,
                           sync=lambda: calls.append("sync"))
    assert len(out) == 3 and all(t >= 0 for t in out)
    assert calls == ["call", "sync"] * 5


@pytest.mark.slow
def test_dry_run_reports_every_target(tmp_path, monkeypatch):
    try:
        load_adult()
    except DatasetMissing as err:
        pytest.skip(str(err))
    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    recorded = {}
    real_record = bench_gpu.record

    def capture(name, rows, **kwargs):
        recorded[name] = rows
        return real_record(name, rows, **kwargs)

    monkeypatch.setattr(bench_gpu, "record", capture)
    summary = bench_gpu.main(gpu=False)

    assert [row["target"] for row in summary] == list(bench_gpu.GOALS)
    for row in summary:
        assert not row["measured"].startswith("error"), row
        assert row["met"] is None  # a dry run says nothing about the targets
    assert set(recorded) == {f"gpu_{key}_dryrun" for key in [*bench_gpu.GOALS, "targets"]}
    json.dumps(recorded, default=float)
    cells = [str(v) for rows in recorded.values() for row in rows for v in row.values()]
    assert any(bench_gpu.SKIPPED in cell for cell in cells)
    # The CPU figures that do run are real: exact KRR equals KernelRidge, the optimizer
    # paths agree, and the refusal on the CPU comes with its size and advice.
    krr = {row["method"]: row for row in recorded["gpu_krr_dryrun"]}
    assert krr["exact KRR (gpuml)"]["rel_diff_vs_ref"] < 1e-6
    for row in recorded["gpu_optim_dryrun"][:2]:
        assert row["fp32_rel_diff"] < 1e-6 and row["bf16_max_ulps"] <= 1
    refusal = recorded["gpu_memory_dryrun"][0]
    assert refusal["outcome"].startswith("refused") and refusal["met"] is True
