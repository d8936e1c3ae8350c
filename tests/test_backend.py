import pickle
import subprocess
import sys

import numpy as np
import pytest

from gpuml import _backend
from gpuml._backend import CPU, float_dtype, parse_device, resolve, to_numpy, to_output


def test_import_gpuml_is_silent_and_does_not_import_cupy():
    code = "import sys, gpuml; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert out.stderr == ""


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_parse_device_accepts_the_documented_forms(device):
    kind, ordinal = parse_device(device)
    assert kind in {"auto", "cpu", "cuda"}
    assert ordinal is None or ordinal == int(device.split(":")[1])


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:-1", "CPU", "", 0, None, "cuda:x"])
def test_parse_device_rejects_everything_else(device):
    with pytest.raises(ValueError, match="device must be"):
        parse_device(device)


def test_cpu_is_cpu():
    backend = resolve("cpu", np.zeros(3))
    assert backend is CPU and backend.xp is np and not backend.is_gpu
    assert backend.device == "cpu"


@pytest.mark.skipif(_backend.cuda_available(), reason="checks the no-GPU behaviour")
def test_auto_without_gpu_is_cpu_and_cuda_raises_clearly():
    assert resolve("auto", np.zeros(3)) is CPU
    with pytest.raises(RuntimeError, match="device='cuda'"):
        resolve("cuda")
    with pytest.raises(RuntimeError, match="device='cuda:3'"):
        resolve("cuda:3")


def test_cupy_imports_without_gpu_but_counts_no_device():
    # The seam must swallow CuPy's CUDARuntimeError: gpu_count is 0 or the real count.
    assert _backend.gpu_count() >= 0
    if not _backend.cuda_available():
        assert _backend.gpu_name() is None


def test_float_dtype_rule():
    f32, f64 = np.zeros(2, np.float32), np.zeros(2, np.float64)
    assert float_dtype(f32) == np.float32
    assert float_dtype(f64) == np.float64
    assert float_dtype(f32, f64) == np.float64
    assert float_dtype(np.zeros(2, np.int32)) == np.float64
    assert float_dtype(np.zeros(2, np.float16)) == np.float64


def test_outputs_follow_numpy_inputs():
    a = np.arange(3.0)
    assert isinstance(to_output(a, np.zeros(1)), np.ndarray)
    assert isinstance(to_numpy([1, 2]), np.ndarray)


def test_backend_pickles():
    assert pickle.loads(pickle.dumps(CPU)) == CPU


@pytest.mark.gpu
def test_gpu_backend_round_trip():
    import cupy as cp

    x = cp.arange(4.0)
    backend = resolve("auto", x)
    assert backend.is_gpu and backend.device == "cuda:0"
    assert isinstance(to_output(np.arange(3.0), x), cp.ndarray)
    assert isinstance(backend.asarray(np.arange(3.0)), cp.ndarray)
    with pytest.raises(RuntimeError, match="does not exist"):
        resolve(f"cuda:{_backend.gpu_count()}")


def test_a_missing_gpu_is_named_in_the_error(monkeypatch):
    # As on a machine without a GPU (or with fewer than eight): the error names the
    # device that was asked for, not just "cuda".
    monkeypatch.setattr(_backend, "gpu_count", lambda: 0)
    with pytest.raises(RuntimeError, match=r"device='cuda:7' was asked for"):
        resolve("cuda:7")
    with pytest.raises(RuntimeError, match=r"device='cuda' was asked for"):
        resolve("cuda")
    monkeypatch.setattr(_backend, "gpu_count", lambda: 2)
    with pytest.raises(RuntimeError, match=r"device='cuda:7' does not exist: this machine has 2"):
        resolve("cuda:7")


def test_gpuml_optim_without_torch_says_to_install_it():
    # torch hidden in a fresh interpreter (an import hook answers "no module named torch",
    # as if it were not installed): gpuml imports, gpuml.optim says what to install.
    code = ("import sys\n"
            "class Hide:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.partition('.')[0] == 'torch':\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "import gpuml\n"
            "try:\n"
            "    import gpuml.optim\n"
            "except ImportError as e:\n"
            "    print(type(e).__name__, '|', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("ImportError |")
    assert "needs PyTorch" in out and "pip install torch" in out
