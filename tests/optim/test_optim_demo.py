"""The optimizer demo of ``make demo``: its runs learn, its rows and its verdict say what ran.

The demo's own setting (20,000 Fashion-MNIST images, 5 epochs) takes a quarter of a minute;
the tests shrink it (fewer images) so that they check the code, not the claim, which
``bench/bench_large_batch.py`` measures.
"""

import pytest

pytest.importorskip("torch")


def _shrink(monkeypatch, demo, fashion: bool, tmp_path):
    monkeypatch.setattr(demo, "TRAIN_SIZE", 1024)
    monkeypatch.setattr(demo, "EPOCHS", 2)
    monkeypatch.setattr(demo, "LARGE_BATCH", 256)
    if not fashion:
        monkeypatch.setattr(demo, "FASHION_MNIST", tmp_path / "absent")


@pytest.mark.parametrize("fashion", [True, False], ids=["fashion-mnist", "digits-fallback"])
def test_demo_rows_learn(monkeypatch, tmp_path, fashion):
    from gpuml.optim import demo

    if fashion and not (demo.FASHION_MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("Fashion-MNIST (Debian package dataset-fashion-mnist) is not installed")
    _shrink(monkeypatch, demo, fashion, tmp_path)
    table = demo.rows(with_base=True)
    assert [(r["optimizer"], r["batch"]) for r in table] == [
        ("gpuml.optim.LAMB", 32), ("gpuml.optim.LAMB", 256),
        ("torch.optim.AdamW", 32), ("torch.optim.AdamW", 256)]
    assert table[0]["data"].startswith("Fashion-MNIST") == fashion
    for row in table:
        # far above chance (10 %); the large batch has only a few steps here
        assert row["test_accuracy_%"] > (45 if row["batch"] == 32 else 20), row
        # 8x the batch at the same epochs: 8x fewer steps
        assert row["steps"] == 2 * -(-len_train(fashion) // row["batch"])
    base = {r["optimizer"]: r["test_accuracy_%"] for r in table if r["batch"] == 32}
    for row in table:
        assert row["drop_vs_B0"] == pytest.approx(base[row["optimizer"]]
                                                  - row["test_accuracy_%"], abs=0.011)
    assert "LAMB reaches" in demo.verdict(table) and "from B0" in demo.verdict(table)
    # the default: the large batch only (training stubbed: the rows are the point)
    batches = []
    monkeypatch.setattr(demo, "train", lambda *a: batches.append(a[-1]) or (50.0, 8, 0.1))
    quick = demo.rows()
    assert batches == [256, 256] and [r["batch"] for r in quick] == [256, 256]
    assert "drop_vs_B0" not in quick[0] and "from B0" not in demo.verdict(quick)


def len_train(fashion: bool) -> int:
    return 1024 if fashion else 1257  # digits: 70 % of 1,797


def test_verdict_says_which_won():
    from gpuml.optim import demo

    def row(name, acc, drop):
        return {"optimizer": name, "batch": demo.LARGE_BATCH, "steps": 50,
                "test_accuracy_%": acc, "drop_vs_B0": drop}

    won = demo.verdict([row("gpuml.optim.LAMB", 85.5, 2.5), row("torch.optim.AdamW", 84.8, 3.1)])
    assert "trust ratio" in won and "85.50" in won and "drop 3.10" in won
    lost = demo.verdict([row("gpuml.optim.LAMB", 84.0, 3.0), row("torch.optim.AdamW", 84.8, 3.1)])
    assert "no LAMB advantage" in lost
