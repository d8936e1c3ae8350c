"""The optimizer demo of ``make demo`` trains to a useful accuracy with every optimizer."""

import pytest

pytest.importorskip("torch")


def test_demo_rows_learn_digits():
    from gpuml.optim.demo import rows

    result = rows()
    assert [r["optimizer"] for r in result] == ["gpuml.optim.LAMB", "gpuml.optim.LARS",
                                                "torch.optim.AdamW"]
    for row in result:
        assert row["test_accuracy"] > 0.9, row
