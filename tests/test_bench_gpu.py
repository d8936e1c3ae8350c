"""The GPU benchmark's CPU dry run: every target runs at tiny sizes and reports.

On a machine without a GPU, ``python -m bench.run gpu`` runs the same functions as
the GPU run with CUDA-only figures marked as skipped; this keeps that harness from
rotting between the rare runs on a GPU machine.
"""

import json
import time

import pytest

from bench import _harness, bench_gpu
from bench.datasets import DatasetMissing, load_adult


def test_timings_times_each_call_after_the_warmups():
    calls = []
    out = _harness.timings(lambda: calls.append("call"), repeat=3, warmup=2,
                           sync=lambda: calls.append("sync"))
    assert len(out) == 3 and all(t >= 0 for t in out)
    assert calls == ["call", "sync"] * 5


def _recording(module, tmp_path, monkeypatch) -> dict:
    """The rows each ``record`` call of the benchmark ``module`` writes (to ``tmp_path``), by
    name."""
    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    recorded = {}
    real_record = module.record

    def capture(name, rows, **kwargs):
        recorded[name] = rows
        return real_record(name, rows, **kwargs)

    monkeypatch.setattr(module, "record", capture)
    return recorded


@pytest.mark.slow
def test_dry_run_reports_every_target(tmp_path, monkeypatch):
    try:
        load_adult()
    except DatasetMissing as err:
        pytest.skip(str(err))
    recorded = _recording(bench_gpu, tmp_path, monkeypatch)
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


@pytest.mark.slow
def test_scale_dry_run_measures_every_point_and_plans_by_the_time_left(tmp_path, monkeypatch):
    from bench import bench_gpu_scale

    monkeypatch.delenv(_harness.DEADLINE_ENV, raising=False)
    recorded = _recording(bench_gpu_scale, tmp_path, monkeypatch)
    bench_gpu_scale.main(gpu=False)

    curve = recorded["gpu_scale_dryrun"]
    assert [(r["method"], r["n_train"]) for r in curve] == [
        (method, n) for method in ("CASVMClassifier", "BKRRRegressor")
        for n in bench_gpu_scale.DRY_SIZES]
    assert all(r["score"] > 0.8 for r in curve)  # accuracy, R²: real fits
    for row in recorded["gpu_streamed_dryrun"]:  # the streamed fit is the same model
        assert row["same_predictions"] is True
    peers = {r["method"]: r for r in recorded["gpu_peers_dryrun"] if "first_s" in r}
    assert peers["gpuml BKRRRegressor(n_partitions=1)"]["rel_diff_vs_cholesky"] < 1e-10
    assert peers["torch.linalg.cholesky"]["rel_diff_vs_cholesky"] == 0.0
    try:
        load_adult()
    except DatasetMissing:
        assert "gpu_asygcd_threads_dryrun" not in recorded
    else:
        sweep = recorded["gpu_asygcd_threads_dryrun"]
        assert [(r["blocks"], r["workers"]) for r in sweep] == [
            (b, w) for b in ("kbalance", "random") for w in (1, 2)]
        assert all(r["accuracy"] > 0.75 and r["updates"] > 0 for r in sweep)

    # With little time left, the curve stops after its first point instead of being
    # killed in the middle of a larger one, and the peers are not started.
    monkeypatch.setenv(_harness.DEADLINE_ENV, repr(time.time() + 300))
    monkeypatch.setattr(bench_gpu_scale, "PEERS_RESERVE", 200.0)
    monkeypatch.setattr(bench_gpu_scale, "MARGIN", 1e6)  # any next point "would not finish"
    rows, streamed = bench_gpu_scale.scale_curve(False)
    first, second = bench_gpu_scale.DRY_SIZES
    assert [(r["n_train"], r.get("note")) for r in rows] == [
        (first, None), (second, "skipped: time left")] * 2
    assert streamed == []
    monkeypatch.setenv(_harness.DEADLINE_ENV, repr(time.time() + 5))
    assert all(r["note"].startswith(("skipped", "not run"))
               for r in bench_gpu_scale.peers(False))
    assert bench_gpu_scale.fashion_exact(False)[0]["note"].startswith("skipped")
