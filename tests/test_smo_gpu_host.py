"""The host side of the GPU SMO solver, run without a GPU.

``gpuml.kernels.smo.cuda.solve_batch`` is run against a stand-in for CuPy
(NumPy arrays) and for the three kernels of ``smo.cu`` (a NumPy transcription
of ``smo_core``, step for step, ties to the larger index). This checks what
the host decides and passes: the chunk plan and launch layout, offsets and
pointer slices, warm-start gradients, iteration limits, result order, and
every launch argument's type against the kernel's C signature (an int64
passed for an ``int`` is a silent wrong read on the device). It does not
check the CUDA code itself: tests/test_smo_gpu.py does that on a GPU, and
tests/test_cuda_sources.py compiles it.
"""

import sys
import types

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.preprocessing import StandardScaler

from gpuml.kernels import SMOProblem, make_kernel, smo_solve_batch
from gpuml.kernels.smo import cuda as gpu_smo


class _DeviceArray(np.ndarray):
    """A NumPy array with CuPy's ``get``."""

    def get(self):
        return np.array(self)


def _device(a):
    return np.asarray(a).view(_DeviceArray)


class _Device:
    def __init__(self, i=0):
        self.id = i
        self.attributes = {"MultiProcessorCount": 8}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _empty(shape, dtype=np.float64):
    # Garbage, as on a device: NaN or -7, so a value read before it is written shows.
    fill = np.nan if np.dtype(dtype).kind == "f" else -7
    return _device(np.full(shape, fill, dtype=dtype))


def _fake_cupy():
    cp = types.ModuleType("cupy")
    cp.asarray = lambda a, dtype=None: _device(np.asarray(a, dtype=dtype))
    cp.full = lambda *a, **k: _device(np.full(*a, **k))
    cp.empty = _empty
    cp.zeros = lambda *a, **k: _device(np.zeros(*a, **k))
    cp.flatnonzero = lambda a: _device(np.flatnonzero(a))
    cp.ascontiguousarray = lambda a: _device(np.ascontiguousarray(a))
    cp.float64, cp.float32, cp.int32, cp.int64 = np.float64, np.float32, np.int32, np.int64
    cp.cuda = types.SimpleNamespace(
        Device=_Device, runtime=types.SimpleNamespace(memGetInfo=lambda: (8 << 30, 80 << 30)))
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_bytes=lambda: 1 << 30)
    return cp


def _core(row, qd, y, C, alpha, G, tol, max_iter):
    """``smo_core`` of smo.cu: returns (steps, rho, objective, status)."""
    it, status = 0, 1
    while it < max_iter:
        up = np.where(y > 0, alpha < C, alpha > 0)
        if not up.any():
            status = 0
            break
        v = np.where(up, -y * G, -np.inf)
        g_max = v.max()
        i = int(np.flatnonzero(v == g_max)[-1])
        Ki = row(i, 0).copy()
        low = np.where(y > 0, alpha > 0, alpha < C)
        yg = y * G
        g_max2 = yg[low].max() if low.any() else -1e308
        diff = g_max + yg
        j = -1
        if (low & (diff > 0)).any():
            quad = qd[i] + qd - 2.0 * Ki
            score = np.where(low & (diff > 0), diff * diff / np.where(quad <= 0, 1e-12, quad),
                             -np.inf)
            j = int(np.flatnonzero(score == score.max())[-1])
        if g_max + g_max2 < tol or j < 0:
            status = 0
            break
        Kj = row(j, 1).copy()
        yi, yj, Ci, Cj = y[i], y[j], C[i], C[j]
        old_i, old_j = alpha[i], alpha[j]
        quad = qd[i] + qd[j] - 2.0 * Ki[j]
        quad = 1e-12 if quad <= 0 else quad
        ai, aj = old_i, old_j
        if yi != yj:
            delta = (-G[i] - G[j]) / quad
            d = ai - aj
            ai, aj = ai + delta, aj + delta
            if d > 0:
                if aj < 0:
                    aj, ai = 0.0, d
            elif ai < 0:
                ai, aj = 0.0, -d
            if d > Ci - Cj:
                if ai > Ci:
                    ai, aj = Ci, Ci - d
            elif aj > Cj:
                aj, ai = Cj, Cj + d
        else:
            delta = (G[i] - G[j]) / quad
            total = ai + aj
            ai, aj = ai - delta, aj + delta
            if total > Ci:
                if ai > Ci:
                    ai, aj = Ci, total - Ci
            elif aj < 0:
                aj, ai = 0.0, total
            if total > Cj:
                if aj > Cj:
                    aj, ai = Cj, total - Cj
            elif ai < 0:
                ai, aj = 0.0, total
        alpha[i], alpha[j] = ai, aj
        G += y * (Ki * ((ai - old_i) * yi) + Kj * ((aj - old_j) * yj))
        it += 1
    yg = y * G
    bound = (alpha >= C) | (alpha <= 0)
    upper_side = ((alpha >= C) & (y < 0)) | ((alpha <= 0) & (y > 0))
    ub = (-yg[bound & upper_side]).max(initial=-1e308)
    lb = yg[bound & ~upper_side].max(initial=-1e308)
    rho = yg[~bound].mean() if (~bound).any() else (lb - ub) / 2
    return it, rho, (alpha * (G - 1.0)).sum() / 2, status


def _check_args(args, kinds, T):
    """Each argument as the C signature wants it: "p" a device pointer, else a NumPy scalar."""
    assert len(args) == len(kinds)
    for a, kind in zip(args, kinds):
        if isinstance(kind, str):
            assert isinstance(a, np.ndarray)
            assert a.dtype == {"K": T, "d": np.float64, "l": np.int64, "i": np.int32}[kind]
        else:
            assert type(a) is kind


def _smo_block(T):
    def launch(grid, block, args):
        _check_args(args, ["K", "l", "l", "i", "l", "i", "d", "d", "d", "d", "d", np.float64,
                           "l", "l", "d", "d", "i"], T)
        K, k_off, ld, idx, off, size, y, C, alpha, G, qd, tol, limit, n_iter, rho, obj, status \
            = args
        for p in range(grid[0]):
            s = slice(int(off[p]), int(off[p]) + int(size[p]))
            row = _matrix_rows(K[int(k_off[p]):], int(ld[p]), idx[s], qd[s])
            n_iter[p], rho[p], obj[p], status[p] = _core(row, qd[s], y[s], C[s], alpha[s], G[s],
                                                         tol, limit[p])
    return launch


def _matrix_rows(Kg, ld, idx, qd):
    """MatrixRows of smo.cu: fills the diagonal ``qd`` (prepare), returns ``row(i, slot)``."""
    rows = idx.astype(np.int64)
    qd[:] = Kg[rows * ld + rows]
    return lambda i, _: Kg[rows[i] * ld + rows].astype(np.float64)


def _smo_grid(T):
    def launch(grid, block, args):
        _check_args(args, ["K", np.int64, "i", np.int32, "d", "d", "d", "d", "d", np.float64,
                           np.int64, "d", "i", "l", "d", "d", "i"], T)
        K, L, idx, n, y, C, alpha, G, qd, tol, limit, _, _, n_iter, rho, obj, status = args
        assert idx.size == y.size == C.size == alpha.size == G.size == qd.size == n
        row = _matrix_rows(K, int(L), idx, qd)
        n_iter[0], rho[0], obj[0], status[0] = _core(row, qd, y, C, alpha, G, tol, limit)
    return launch


def _smo_grid_rows(T):
    def launch(grid, block, args):
        _check_args(args, ["K", "K", "d", np.int32, np.int32, np.int32, T, T, np.int32, "d",
                           "d", "d", "d", np.float64, np.int64, "d", "i", "K", "l", "d", "d",
                           "i"], T)
        (XT, norms, qd, n, d, kind, gamma, coef0, degree, y, C, alpha, G, tol, limit, _, _,
         scratch, n_iter, rho, obj, status) = args
        assert XT.shape == (d, n) and XT.flags.c_contiguous and scratch.size == 2 * n

        def row(i, slot):
            dot = (XT[:, i][:, None] * XT).sum(axis=0)
            values = [dot, (gamma * dot + coef0) ** degree,
                      np.exp(-gamma * np.maximum(norms[i] + norms - T(2) * dot, 0)),
                      np.tanh(gamma * dot + coef0)][kind]
            scratch[slot * n:(slot + 1) * n] = values
            return scratch[slot * n:(slot + 1) * n].astype(np.float64)

        n_iter[0], rho[0], obj[0], status[0] = _core(row, qd, y, C, alpha, G, tol, limit)
    return launch


class _Loader:
    """Stands in for ``gpuml.kernels._cuda`` (the loader); records the kernels launched."""

    launched: list = []

    @classmethod
    def get_kernel(cls, name, kernel, dtype, device_id, all_kernels=(), cooperative=False):
        assert name == "smo" and device_id == 0 and set(all_kernels) == set(gpu_smo._KERNELS)
        assert cooperative == (kernel != "smo_block")
        make = {"smo_block": _smo_block, "smo_grid": _smo_grid, "smo_grid_rows": _smo_grid_rows}
        fn = make[kernel](np.dtype(dtype).type)

        def launch(grid, block, args):
            cls.launched.append(kernel)
            fn(grid, block, args)
        return launch


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setattr(gpu_smo, "loader", _Loader)
    monkeypatch.setattr(gpu_smo, "_device_of", lambda X: 0)
    _Loader.launched.clear()


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), np.where(y == 1, 1.0, -1.0)


def digits_parts(sizes):
    """Digits split into parts of the given sizes, with every one-vs-one problem of each."""
    X, y = load_digits(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    parts = np.split(np.random.default_rng(0).permutation(len(y)), np.cumsum(sizes)[:-1])
    problems, Xs = [], []
    for g, rows in enumerate(parts):
        Xs.append(X[rows])
        labels = y[rows]
        for a in range(10):
            for b in range(a + 1, 10):
                local = np.flatnonzero((labels == a) | (labels == b))
                problems.append(SMOProblem(g, local, np.where(labels[local] == a, 1.0, -1.0),
                                           1.0))
    return X, Xs, problems


def budget(monkeypatch, nbytes):
    monkeypatch.setattr(gpu_smo, "_matrix_budget", lambda cp, reserved: nbytes)


def assert_same(cpu, gpu, rel=1e-12, atol=1e-9, same_steps=True):
    """The emulated GPU run against the CPU solver without shrinking (the same steps)."""
    for c, g in zip(cpu, gpu, strict=True):
        assert g.converged == c.converged
        assert g.n_iter == c.n_iter or not same_steps
        assert g.objective == pytest.approx(c.objective, rel=rel)
        assert g.intercept == pytest.approx(c.intercept, abs=max(atol, 1e-12))
        assert g.alpha.dtype == np.float64 and g.gradient.dtype == np.float64
        np.testing.assert_allclose(np.asarray(g.alpha), c.alpha, atol=atol)


@pytest.mark.parametrize("grid", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_one_problem_on_each_shape(cancer, grid, dtype, monkeypatch):
    monkeypatch.setattr(gpu_smo, "GRID_MIN_SIZE", 0 if grid else 1 << 30)
    X, y = cancer
    X = X.astype(dtype)
    kernel = make_kernel("rbf", "scale", X=X)
    problems = [SMOProblem(0, np.arange(len(y)), y, 1.0)]
    cpu = smo_solve_batch(kernel, [X], problems, shrinking=False)
    assert_same(cpu, gpu_smo.solve_batch(kernel, [X], problems), rel=1e-7, atol=1e-5)
    assert _Loader.launched == ["smo_grid" if grid else "smo_block"]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_chunks_and_a_group_on_the_fly(dtype, monkeypatch):
    itemsize = np.dtype(dtype).itemsize
    budget(monkeypatch, 2 * 400 * 400 * itemsize)
    X, Xs, problems = digits_parts([600, 400, 400, 397])
    Xs = [x.astype(dtype) for x in Xs]
    kernel = make_kernel("rbf", "scale", X=X)
    cpu = smo_solve_batch(kernel, Xs, problems, shrinking=False)
    gpu = gpu_smo.solve_batch(kernel, Xs, problems)
    # Groups 1+2, then 3, one launch each; group 0's 45 problems on the fly (its rows are
    # summed in another order, so its steps may differ by rounding).
    assert _Loader.launched == ["smo_block", "smo_block"] + ["smo_grid_rows"] * 45
    assert_same(cpu[45:], gpu[45:])
    assert_same(cpu[:45], gpu[:45], rel=1e-6, atol=1e-2, same_steps=False)


def test_problems_out_of_group_order_and_warm_starts(monkeypatch):
    X, Xs, problems = digits_parts([450, 450, 450, 447])
    problems = [problems[i] for i in np.random.default_rng(1).permutation(len(problems))]
    kernel = make_kernel("rbf", "scale", X=X)
    budget(monkeypatch, 2 * 450 * 450 * 8)
    cpu = smo_solve_batch(kernel, Xs, problems, shrinking=False)
    assert_same(cpu, gpu_smo.solve_batch(kernel, Xs, problems))
    assert _Loader.launched == ["smo_block", "smo_block"]
    # Every other problem warm-started from a solution: zero steps there.
    cold = smo_solve_batch(kernel, Xs, problems, tol=1e-5)
    mixed = [SMOProblem(p.group, p.idx, p.y, p.C, c.alpha) if w % 2 else p
             for w, (p, c) in enumerate(zip(problems, cold))]
    cpu = smo_solve_batch(kernel, Xs, mixed, shrinking=False)
    budget(monkeypatch, 450 * 450 * 8)
    gpu = gpu_smo.solve_batch(kernel, Xs, mixed)
    assert_same(cpu, gpu, rel=1e-9)
    assert all(g.n_iter == 0 for g in gpu[1::2])
    budget(monkeypatch, 0)
    assert_same(cpu, gpu_smo.solve_batch(kernel, Xs, mixed), rel=1e-7, atol=1e-2,
                same_steps=False)


@pytest.mark.parametrize("name", ["linear", "poly", "sigmoid", "rbf"])
def test_rows_on_the_fly_for_every_kernel(cancer, name, monkeypatch):
    budget(monkeypatch, 0)
    X, y = cancer
    kernel = make_kernel(name, "scale", degree=2, coef0=0.5, X=X)
    problems = [SMOProblem(0, np.arange(len(y)), y, 0.5)]
    cpu = smo_solve_batch(kernel, [X], problems, shrinking=False)
    gpu = gpu_smo.solve_batch(kernel, [X], problems)
    assert gpu[0].objective == pytest.approx(cpu[0].objective, rel=1e-6)


@pytest.mark.parametrize("matrix_budget", [None, 0])
def test_iteration_limit_reaches_every_launch(cancer, matrix_budget, monkeypatch):
    if matrix_budget is not None:
        budget(monkeypatch, matrix_budget)
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    problems = [SMOProblem(0, np.arange(len(y)), y, 1.0)]
    cpu = smo_solve_batch(kernel, [X], problems, max_iter=7, shrinking=False)
    gpu = gpu_smo.solve_batch(kernel, [X], problems, max_iter=7)
    assert_same(cpu, gpu, rel=1e-9)
    assert not gpu[0].converged and gpu[0].n_iter == 7


def test_precomputed_kernel_and_its_memory_error(cancer, monkeypatch):
    X, y = cancer
    K = X @ X.T
    kernel = make_kernel("precomputed")
    problems = [SMOProblem(0, np.arange(len(y)), y, 1.0)]
    cpu = smo_solve_batch(kernel, [K], problems, shrinking=False)
    assert_same(cpu, gpu_smo.solve_batch(kernel, [K], problems))
    budget(monkeypatch, 0)
    with pytest.raises(MemoryError, match="precomputed kernel matrix .* device='cpu'"):
        gpu_smo.solve_batch(kernel, [K], problems)


def test_bad_row_indices_are_refused_before_any_launch(cancer):
    X, y = cancer
    kernel = make_kernel("rbf", "scale", X=X)
    with pytest.raises(ValueError, match="outside its group"):
        gpu_smo.solve_batch(kernel, [X[:100]], [SMOProblem(0, np.arange(len(y)), y, 1.0)])
    with pytest.raises(ValueError, match="one row index per label"):
        gpu_smo.solve_batch(kernel, [X], [SMOProblem(0, np.arange(5), y, 1.0)])
    assert _Loader.launched == []


def test_memory_budget_counts_the_pool(monkeypatch):
    # 0.8 * (8 GiB free on the device + 1 GiB free in CuPy's pool) - reserved.
    import cupy

    assert gpu_smo._matrix_budget(cupy, 1000) == int(0.8 * (9 << 30)) - 1000
