"""Test configuration and the GPU test selection.

Two markers (registered in pyproject.toml) say which tests matter on a GPU machine:

* ``gpu``: needs a CUDA device. Skipped where none answers (CI, laptops).
* ``cuda_also``: runs everywhere, and exercises GPU code where a GPU is: the nvcc
  compile checks of every ``.cu`` file (``tests/test_cuda_sources.py``), Triton's
  ahead-of-time compile of the fused optimizer kernels
  (``tests/optim/test_optim_triton_compile.py``), and the optimizer path tests that run
  on CUDA when it is there and in Triton's interpreter on the CPU otherwise
  (``tests/optim/test_optim_paths.py``). They must keep running in CI, so they cannot
  carry ``gpu``.

The GPU machine runs ``pytest -m "gpu or cuda_also"`` (``make gpu-check-tests``);
CI runs everything (``make test``), where the ``gpu`` tests skip.

On the GPU machine a missing GPU must not pass for a green run that tested nothing
(a broken CuPy would skip every ``gpu`` test): with the environment variable
``GPUML_REQUIRE_GPU=1`` the session stops at once with a nonzero status unless CuPy
sees a CUDA device and, where torch imports, ``torch.cuda.is_available()`` is true.
"""

import os

import pytest

from gpuml._backend import cuda_available

# Compile numba code in the calling thread, as plain numba: which path a small fit takes
# (compiled, or the NumPy twin while numba compiles in the background) would otherwise
# depend on what earlier tests compiled. tests/test_first_fit.py turns the background
# compile back on where it tests the twins.
os.environ.setdefault("GPUML_JIT_BACKGROUND", "0")


def pytest_sessionstart(session):
    if os.environ.get("GPUML_REQUIRE_GPU", "") not in ("", "0"):
        from bench.gpu_check import gpu_problems

        problems = gpu_problems()
        if problems:
            pytest.exit("GPUML_REQUIRE_GPU=1 but no CUDA device answers: " + ", ".join(problems)
                        + " (a run that skipped every GPU test would look green)",
                        returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_collection_modifyitems(config, items):
    _apply_sklearn_suite_tables(config, items)
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (CuPy and a GPU); none answers here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _apply_sklearn_suite_tables(config, items):
    """scikit-learn's own test files (tests/test_sklearn_*.py): their DESELECT and KNOWN_FAILURES.

    A test named in its module's ``DESELECT`` is not run (reported as deselected);
    one named in ``KNOWN_FAILURES`` runs as a strict ``xfail``, so that a fix shows
    up as a failure until its entry is removed. Keys are test names, or names with
    a parameter id (``test_x[param]``); values are the one-line reasons.
    """
    from _sklearn_suite import selected

    deselected = {id(item) for item, _ in selected(items, "DESELECT")}
    if deselected:
        config.hook.pytest_deselected(items=[i for i in items if id(i) in deselected])
        items[:] = [i for i in items if id(i) not in deselected]
    for item, reason in selected(items, "KNOWN_FAILURES"):
        item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.fixture(scope="session")
def diabetes():
    """scikit-learn's diabetes regression set, features standardised (shared by the KRR tests)."""
    from sklearn.datasets import load_diabetes
    from sklearn.preprocessing import StandardScaler

    X, y = load_diabetes(return_X_y=True)
    return StandardScaler().fit_transform(X), y


@pytest.fixture(scope="session")
def cp():
    """CuPy, for tests that only run where a GPU answers (marked ``gpu``)."""
    import cupy

    return cupy


@pytest.fixture
def smo_gpu_on_host(monkeypatch):
    """The GPU branch of :mod:`gpuml.kernels`' SMO entry points, run on the host: every
    array taken for CuPy's, each batch the branch hands to ``smo_solve_batch`` solved by
    the CPU solver and recorded in the list returned. ``monkeypatch.undo()`` ends it."""
    import gpuml.kernels as kernels
    from gpuml.kernels.smo import cpu

    batches = []

    def host_batch(kernel, Xs, batch, **kw):
        batches.append(batch)
        return cpu.solve_batch(kernel, Xs, batch, tol=kw["tol"], max_iter=kw["max_iter"],
                               shrinking=kw["shrinking"])

    monkeypatch.setattr(kernels, "is_cupy_array", lambda X: True)
    monkeypatch.setattr(kernels, "smo_solve_batch", host_batch)
    return batches
