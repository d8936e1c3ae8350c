"""The kept CA-SVM model's benchmark (``python -m bench.run dask_model:quick``): both
configurations run on a small cluster and report what the full run reports, the cluster's
predictions equal to the in-memory model's."""

import json

import pytest

pytest.importorskip("distributed")

from bench import _harness, bench_dask_model  # noqa: E402


def test_quick_run_reports_every_configuration(tmp_path, monkeypatch):
    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    rows = bench_dask_model.main(quick=True)
    assert [row["config"] for row in rows] == list(bench_dask_model.QUICK)
    for row in rows:
        assert row["same_predictions"] and row["n_differ"] == 0, row
        assert row["dask_score"] == row["local_score"]
        assert 0 < row["n_SV"] <= row["n"] and row["model_MB"] > 0
        assert not row["workers_restarted"]
        # the fit gathered the part summaries, not the support vectors
        assert row["fit_gathered_MB"] < row["model_MB"]
    assert rows[1]["partition"] == "contiguous" and rows[1]["n_SV"] > rows[0]["n_SV"]
    written, = tmp_path.glob("*/dask_model_quick.json")
    recorded = json.loads(written.read_text())
    assert [r["config"] for r in recorded["rows"]] == list(bench_dask_model.QUICK)
