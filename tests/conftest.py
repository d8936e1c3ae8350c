"""Test configuration: tests marked ``gpu`` skip cleanly where no CUDA device answers."""

import pytest

from gpuml._backend import cuda_available


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (CuPy and a GPU); none answers here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
