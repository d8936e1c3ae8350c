"""The host side of the GPU Asy-GCD solver (``_cuda/gcd.py``), run without a GPU.

``gcd.cu`` only runs on a GPU, but most of what can go wrong around it is on the host:
the batch layout (problem and block tables, offsets of each problem's Q and feature-major
rows), which problems get a precomputed Q, launches split to fit the resident blocks, and
the way back to each problem's row order. These tests drive that code with NumPy standing
in for CuPy and ``model_kernel``, a transliteration of ``gcd_solve`` in gcd.cu into Python
(the blocks interleaved one iteration at a time), and compare with the CPU solver. Keep the
model in step with gcd.cu; the GPU tests (tests/test_gcd_gpu.py) check the kernel itself.
"""

import contextlib
import sys
import types

import numpy as np
import pytest
from sklearn.datasets import load_digits

from gpuml.kernels import GCDProblem, Kernel, gcd_solve, make_kernel

STARTED, FINISHED, STOP, COUNTERS = 0, 1, 2, 4  # gcd.cu's counter words
RUNNING, CERTIFIED, CAPPED = 0, 1, 2


class DeviceArray(np.ndarray):
    """A NumPy array that answers ``.device.id`` and ``.get()`` as a CuPy array does."""

    @property
    def device(self):
        return types.SimpleNamespace(id=0)

    def get(self):
        return np.asarray(self).copy()


def _on_device(a):
    return np.asarray(a).view(DeviceArray)


def _fake_cupy():
    cp = types.ModuleType("cupy")
    for name in ("float32", "float64", "uint64", "int64", "int32"):
        setattr(cp, name, getattr(np, name))
    cp.asarray = lambda a, dtype=None: _on_device(np.asarray(a, dtype=dtype))
    for name in ("empty", "zeros", "ones", "full"):
        setattr(cp, name, (lambda f: lambda *a, **k: _on_device(f(*a, **k)))(getattr(np, name)))
    cp.empty_like = lambda a, **k: _on_device(np.empty_like(np.asarray(a), **k))
    cp.maximum = lambda a, b: _on_device(np.maximum(a, b))
    cp.ascontiguousarray = lambda a: _on_device(np.ascontiguousarray(a))
    cp.asnumpy = np.asarray
    cp.cuda = types.SimpleNamespace(Device=lambda i: contextlib.nullcontext())
    return cp


def _clip(v, c):
    return 0.0 if v < 0 else (c if v > c else v)


def _pg(g, a, c):
    return abs(a - _clip(a - g, c))


def _block(b, args):
    """One thread block of gcd_solve, as a generator: one loop iteration per ``next``."""
    (XT, sq_norms, Q, y, C, qdiag, starts, block_problem, problem_vars, problem_blocks,
     problem_q, problem_x, caps, seeds, d, kind, gamma, coef0, degree, greedy, tol, alpha, g,
     counters, quiet) = args
    p = int(block_problem[b])
    lo, hi = int(starts[b]), int(starts[b + 1])
    base, end = int(problem_vars[p]), int(problem_vars[p + 1])
    n = end - base
    first, last = int(problem_blocks[p]), int(problem_blocks[p + 1])
    cnt = COUNTERS * p
    rng = np.random.default_rng(int(seeds[p]) + b)
    picks, eta, last_i, last_g = 0, 1.0, -1, 0.0
    while True:
        yield
        if counters[cnt + STOP] != RUNNING:
            return
        action = "update"
        if not greedy:
            picks = 0 if picks + 1 >= hi - lo else picks + 1
        scan = greedy or picks == 0
        if scan:
            consistent = counters[cnt + FINISHED] == counters[cnt + STARTED]
            seen = int(counters[cnt + STARTED])
            best, best_v = -1, 0.0
            for j in range(lo, hi):
                v = _pg(g[j], alpha[j], C[j])
                if v > best_v and _clip(alpha[j] - g[j] / qdiag[j], C[j]) != alpha[j]:
                    best, best_v = j, v
            if best < 0 or best_v < tol:
                action = "quiet"
                if not greedy:
                    picks = hi - lo - 1
                if consistent and counters[cnt + STARTED] == seen:
                    quiet[b] = seen
                    if all(quiet[v] == seen for v in range(first, last)):
                        counters[cnt + STOP] = CERTIFIED
            elif greedy:
                i = best
        if action != "update":
            continue
        if last_i >= 0:
            overshot = g[last_i] * last_g < -0.5 * last_g * last_g
            eta = max(0.5 * eta, 1 / 4096) if overshot else min(1.0, 1.1 * eta)
            last_i = -1
        if not greedy:
            i = lo + int(rng.integers(hi - lo))
        a_i, g_i = alpha[i], g[i]
        delta = 0.0
        if greedy or _pg(g_i, a_i, C[i]) >= tol:
            delta = _clip(a_i - eta * g_i / qdiag[i], C[i]) - a_i
            if delta == 0.0:
                delta = _clip(a_i - g_i / qdiag[i], C[i]) - a_i
        if delta == 0.0:
            continue
        counters[cnt + STARTED] += 1
        if counters[cnt + STARTED] - 1 >= caps[p]:
            counters[cnt + STOP] = CAPPED
            return
        last_i, last_g = i, g_i
        il = i - base
        if problem_q[p] >= 0:
            off = int(problem_q[p]) + il * n
            column = Q[off:off + n].astype(np.float64)
        else:
            XTp = XT[int(problem_x[p]):int(problem_x[p]) + d * n].reshape(d, n)
            dot = (XTp[:, il] @ XTp).astype(np.float64)
            sq = sq_norms[base:end].astype(np.float64)
            if kind == 0:
                kernel = dot
            elif kind == 1:
                kernel = (gamma * dot + coef0) ** degree
            elif kind == 2:
                kernel = np.exp(-gamma * np.maximum(sq[il] + sq - 2 * dot, 0.0))
            else:
                kernel = np.tanh(gamma * dot + coef0)
            column = y[i] * y[base:end] * kernel
        g[base:end] += delta * column
        alpha[i] += delta
        counters[cnt + FINISHED] += 1


class _ModelKernel:
    """Stands in for the compiled ``gcd_solve``: the blocks of a launch, round-robin."""

    num_regs = 60

    def __init__(self):
        self.grids = []

    def __call__(self, grid, threads, args):
        args = [np.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        self.grids.append(grid[0])
        blocks = {b: _block(b, args) for b in range(grid[0])}
        for _ in range(1_000_000):
            for b in list(blocks):
                try:
                    next(blocks[b])
                except StopIteration:
                    del blocks[b]
            if not blocks:
                return
        raise AssertionError("the model kernel did not end")


@pytest.fixture
def host(monkeypatch):
    """``gcd.cuda`` with NumPy for CuPy, the model kernel, and a given resident capacity."""
    from gpuml import _backend
    from gpuml.kernels.gcd import cuda as cuda_gcd

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    model = _ModelKernel()
    monkeypatch.setattr(cuda_gcd, "get_kernel", lambda *a, **k: model)
    monkeypatch.setattr(_backend, "available_bytes", lambda xp: 1 << 30)
    monkeypatch.setattr(cuda_gcd, "resident_blocks", lambda fn, device: 1000)
    monkeypatch.setattr(cuda_gcd, "model", model, raising=False)
    return cuda_gcd


def _pairs(pairs, workers):
    X, digit = load_digits(return_X_y=True)
    X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    problems = []
    for (a, b), w in zip(pairs, workers):
        rows = np.flatnonzero((digit == a) | (digit == b))
        y = np.where(digit[rows] == b, 1.0, -1.0)
        C = np.where(np.arange(len(rows)) % 3 == 0, 0.5, 2.0)
        blocks = np.random.default_rng(a).permutation(np.arange(len(rows)) % w)
        problems.append(GCDProblem(rows, y, C, blocks, a))
    return X, make_kernel("rbf", "scale", 3, 0.0, X), problems


def _check(X, kernel, problems, out, dtype, rel=1e-6):
    for p, res in zip(problems, out):
        ref = gcd_solve(X[p.rows], p.y, p.C, kernel, np.zeros(len(p.rows), int), tol=1e-8)
        alpha = np.asarray(res.alpha)
        assert alpha.dtype == dtype and res.converged
        assert res.n_workers == len(np.unique(p.blocks))
        Q = np.outer(p.y, p.y) * kernel.matrix(X[p.rows])
        a = alpha.astype(np.float64)
        assert abs(0.5 * a @ Q @ a - a.sum() - ref.objective) <= rel * abs(ref.objective)
        assert abs(res.objective - ref.objective) <= rel * abs(ref.objective)
        tol_g = 1e-12 if dtype == np.float64 else 1e-5
        assert np.abs(np.asarray(res.gradient) - (Q @ a - 1.0)).max() <= tol_g


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("selection", ["greedy", "random"])
def test_batch_layout_with_q_and_on_the_fly_problems(host, dtype, selection):
    # Three problems of 1, 2 and 3 blocks in one launch; the cache holds the first Q only,
    # so the others read their rows feature-major and compute kernel values on the fly.
    X, kernel, problems = _pairs([(0, 1), (2, 7), (3, 8)], [1, 2, 3])
    cache = len(problems[0].rows) ** 2 * np.dtype(dtype).itemsize
    out = host.solve_batch(_on_device(X.astype(dtype)), kernel, problems, selection=selection,
                           tol=1e-4, cache_bytes=cache, seeds=[1, 2, 3])
    assert host.model.grids == [6]
    _check(X, kernel, problems, out, dtype, rel=1e-6 if dtype == np.float64 else 1e-5)


def test_launches_split_to_fit_the_resident_blocks(host, monkeypatch):
    X, kernel, problems = _pairs([(0, 1), (2, 7), (3, 8), (4, 9)], [3, 2, 2, 1])
    monkeypatch.setattr(host, "resident_blocks", lambda fn, device: 4)
    out = host.solve_batch(_on_device(X), kernel, problems, tol=1e-4, seeds=[1, 2, 3, 4])
    assert host.model.grids == [3, 4, 1]
    _check(X, kernel, problems, out, np.float64)
    monkeypatch.setattr(host, "resident_blocks", lambda fn, device: 2)
    with pytest.raises(ValueError, match="3 GPU workers asked for but this GPU keeps only 2"):
        host.solve_batch(_on_device(X), kernel, problems, seeds=[1, 2, 3, 4])


def test_precomputed_kernel_rows_are_gathered_per_problem(host):
    X, kernel, problems = _pairs([(0, 1), (5, 6)], [2, 1])
    out = host.solve_batch(_on_device(kernel.matrix(X)), Kernel("precomputed"), problems,
                           tol=1e-4, cache_bytes=0, seeds=[1, 2])  # Q is needed whatever
    _check(X, kernel, problems, out, np.float64)


def test_memory_refusal_names_the_bytes(host, monkeypatch):
    from gpuml import _backend

    X, kernel, problems = _pairs([(0, 1)], [1])
    n = len(problems[0].rows)
    monkeypatch.setattr(_backend, "available_bytes", lambda xp: host.BUILD_BYTES + (n * n * 4))
    with pytest.raises(MemoryError, match=rf"needs [0-9.]+ MiB of GPU 0 .* {n} x {n} kernel"):
        host.solve_batch(_on_device(kernel.matrix(X)), Kernel("precomputed"), problems)
    assert host.model.grids == []


def test_update_cap_and_empty_problems(host, monkeypatch):
    X, kernel, problems = _pairs([(0, 1), (2, 7)], [2, 1])
    empty = GCDProblem(np.zeros(0, int), np.zeros(0), np.zeros(0), np.zeros(0, int), 0)
    out = host.solve_batch(_on_device(X), kernel, [problems[0], empty, problems[1]],
                           max_updates=25, seeds=[1, 2, 3])
    assert [r.n_updates for r in out] == [25, 0, 25]
    assert [r.converged for r in out] == [False, True, False]
    monkeypatch.setattr(host, "default_max_updates", lambda n: 11)
    (res,) = host.solve_batch(_on_device(X), kernel, problems[:1], seeds=[1])
    assert res.n_updates == 11 and not res.converged
