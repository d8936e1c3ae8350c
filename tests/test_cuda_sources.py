"""Every shipped .cu file compiles with nvcc for Ampere and Hopper, GPU or not."""

import shutil
import subprocess

import pytest

from gpuml.kernels import _cuda as loader

NVCC = shutil.which("nvcc")

# GPU code, checked on every machine: part of the GPU selection (see tests/conftest.py).
pytestmark = pytest.mark.cuda_also


def test_sources_ship_as_package_data():
    from pathlib import Path

    import tomllib

    root = Path(__file__).parents[1]
    package_data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]
    assert loader.sources()
    for source in loader.sources():  # each beside its solver, in that concept's package
        package = ".".join(source.parent.relative_to(root).parts)
        assert "*.cu" in package_data[package], source


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source", loader.sources(), ids=lambda p: p.name)
def test_nvcc_compiles(source, arch, tmp_path):
    result = subprocess.run(
        [NVCC, "-std=c++17", "-DGPUML_NVCC_CHECK", f"-arch={arch}", "-c", str(source),
         "-o", str(tmp_path / "out.o")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.o").stat().st_size > 0


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_nvcc_check_catches_a_broken_kernel(tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text("template <typename T> __global__ void k(T* x) { x[0] = undefined; }\n"
                      "#ifdef GPUML_NVCC_CHECK\ntemplate __global__ void k<float>(float*);\n"
                      "#endif\n")
    result = subprocess.run([NVCC, "-std=c++17", "-DGPUML_NVCC_CHECK", "-arch=sm_80", "-c",
                             str(broken), "-o", str(tmp_path / "out.o")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "undefined" in result.stderr


def test_template_names():
    import numpy as np

    assert loader.template_name("smo", np.float32) == "smo<float>"
    assert loader.template_name("smo", np.dtype("float64")) == "smo<double>"
