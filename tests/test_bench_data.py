"""The benchmark data that travels to the GPU machine (``make gpu-data``): the exported
``.npz`` files give back exactly what the package loaders give, in a few MiB."""

import json

import numpy as np
import pytest

from bench import _harness, datasets


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    try:
        sizes = datasets.export(folder)
    except datasets.DatasetMissing as e:
        pytest.skip(str(e))
    return folder, sizes


def test_export_is_small(exported):
    _, sizes = exported
    assert set(sizes) == set(datasets.LOADERS)
    # the whole source tree travels in 64 MiB
    assert sum(sizes.values()) < 8 * 2**20


@pytest.mark.parametrize("name", sorted(datasets.LOADERS))
def test_npz_equals_the_package_loader(exported, name, monkeypatch):
    folder, _ = exported
    X, y = datasets.LOADERS[name].from_package()
    monkeypatch.setenv("GPUML_BENCH_DATA", str(folder))
    X2, y2 = datasets.load(name)
    assert X2.dtype == X.dtype == np.float64
    assert y2.dtype == y.dtype
    assert X2.shape == X.shape and y2.shape == y.shape
    np.testing.assert_array_equal(X2, X)
    np.testing.assert_array_equal(y2, y)
    assert X2.flags.f_contiguous == X.flags.f_contiguous
    # the named loader reads the file too
    X3, _ = getattr(datasets, f"load_{name}")()
    np.testing.assert_array_equal(X3, X)


def test_missing_set_names_both_ways_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUML_BENCH_DATA", str(tmp_path))
    monkeypatch.setitem(datasets._FILES, "letter", ("no-such-package-xyz", "x.dat"))
    with pytest.raises(datasets.DatasetMissing, match="gpu-data"):
        datasets.load("letter")


def test_narrowest_is_exact():
    assert datasets.narrowest(np.array([0.0, 1.0, 255.0])).dtype == np.uint8
    assert datasets.narrowest(np.array([-1.0, 300.0])).dtype == np.int16
    assert datasets.narrowest(np.array([0.0, 1_490_400.0])).dtype == np.uint32
    assert datasets.narrowest(np.array([0.5, 0.25])).dtype == np.float32
    assert datasets.narrowest(np.array([0.1])).dtype == np.float64
    # -0.0 would come back as +0.0 through an integer
    assert datasets.narrowest(np.array([-0.0, 1.0])).dtype == np.float32
    assert datasets.narrowest(np.array([3, 7], dtype=np.int64)).dtype == np.uint8


def test_record_writes_to_the_out_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUML_BENCH_OUT", str(tmp_path))
    path = _harness.record("probe", [{"a": 1, "b": 0.5}], title="Probe", notes="n")
    assert path == tmp_path / "probe.md"
    assert "| a | b |" in path.read_text()
    data = json.loads((tmp_path / "probe.json").read_text())
    assert data["rows"] == [{"a": 1, "b": 0.5}] and data["meta"]["name"] == "probe"
