"""The quick run of ``bench/bench_large_batch.py`` (large batch in small, and the schemes).

It runs every step of the full benchmark on the example's synthetic stand-in (the data
package pointed away, as on a machine without it): the lr tuning at the base batch, the
larger batches through LEGW + sqrt scaling, one ``torchrun`` of 2 gloo ranks training two
data assignment schemes, the records and both plots. The records' numbers are checked against
the rules (steps, warmup, peak rate, the choice by validation accuracy) and against the
example's ``train`` run again here.
"""

import json
import math

import pytest
from _procs import gloo_missing

import bench.bench_large_batch as lb
from examples.train_fashion_mnist import evaluate, train
from gpuml.optim import legw_warmup_steps

needs_gloo = pytest.mark.skipif(gloo_missing() is not None, reason=str(gloo_missing()))


@needs_gloo
def test_quick_run_on_the_synthetic_fallback(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lb, "DATA_DIR", tmp_path / "no-fashion-mnist")
    out = tmp_path / "out"
    monkeypatch.setenv("GPUML_BENCH_OUT", str(out))
    res = lb.main(quick=True)
    assert "Fashion-MNIST is absent" in capsys.readouterr().out

    def rows(name):
        doc = json.loads((out / f"{name}.json").read_text())
        return doc["rows"], doc["meta"]["notes"]

    grid, _ = rows("large_batch_grid_quick")
    table, notes = rows("large_batch_quick")
    assert "SYNTHETIC" in notes
    n, b0 = lb.QUICK["train_size"], lb.BASE_BATCH
    chosen = {}
    for name in lb.OPTIMIZERS:
        mine = [r for r in grid if r["optimizer"] == lb.LABEL[name]]
        assert [r["lr_at_B0"] for r in mine] == list(lb.GRID[name][1:3])
        best = max(mine, key=lambda r: r["val_acc_%"])
        assert [r["chosen"] for r in mine] == [r is best for r in mine]
        chosen[name] = best["lr_at_B0"]
    assert len(table) == len(lb.OPTIMIZERS) * len(lb.QUICK["multiples"])
    for r in table:
        b = r["batch"]
        assert r["lr0"] == chosen[{v: k for k, v in lb.LABEL.items()}[r["optimizer"]]]
        assert r["steps"] == math.ceil(n / b) * lb.QUICK["epochs"]
        # LEGW: the same warmup steps at every batch; sqrt scaling of the tuned rate
        assert r["warmup_steps"] == legw_warmup_steps(lb.WARMUP_EPOCHS, b, b0, n) == 2
        assert r["peak_lr"] == pytest.approx(r["lr0"] * math.sqrt(b / b0), rel=1e-12)
        assert 0 <= r["test_acc_%"] <= 100
        base = next(x for x in table if x["optimizer"] == r["optimizer"] and x["batch"] == b0)
        assert r["drop_vs_B0"] == pytest.approx(base["test_acc_%"] - r["test_acc_%"])

    # The record is what the example's train() gives: LAMB at 8 B0 once more, test scored
    # on the trained model.
    runs = lb.Runs(lb.load(quick=True), lb.QUICK["epochs"])
    again = train(runs.config("lamb", chosen["lamb"], 8 * b0, 0), data=runs.train_data)
    row = next(r for r in table if r["optimizer"] == "LAMB" and r["batch"] == 8 * b0)
    assert row["val_acc_%"] == pytest.approx(again["test_acc"], abs=1e-9)
    assert row["test_acc_%"] == pytest.approx(
        evaluate(again["model"], *runs.data["test"], 0, 1, False), abs=1e-9)

    schemes, notes = rows("large_batch_schemes_quick")
    assert [r["scheme"] for r in schemes] == ["disjoint (C=1)", "fine (C=2)"]
    # 2 ranks, 1024 images: a disjoint assignment is 512 a rank, 16 local batches of 32;
    # with C = 2 it is twice that, so the same 8 steps are a quarter of a pass
    assert [(r["steps"], r["epochs_of_assignment"]) for r in schemes] == [(8, 0.5), (8, 0.25)]
    csv_steps = [[int(x["step"]) for x in t] for t in res["schemes"].values()]
    assert csv_steps == [[4, 8], [4, 8]]
    for path in res["plots"]:
        assert path.parent == out and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
