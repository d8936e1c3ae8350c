import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import pairwise as skp

from gpuml.kernels.pairwise import Kernel, kernel_matrix, make_kernel, resolve_gamma, sq_distances

X_REAL = load_breast_cancer().data[:120]
X_STD = (X_REAL - X_REAL.mean(0)) / X_REAL.std(0)

SKLEARN = {
    "linear": lambda X, Y, g, d, c: skp.linear_kernel(X, Y),
    "poly": lambda X, Y, g, d, c: skp.polynomial_kernel(X, Y, degree=d, gamma=g, coef0=c),
    "rbf": lambda X, Y, g, d, c: skp.rbf_kernel(X, Y, gamma=g),
    "sigmoid": lambda X, Y, g, d, c: skp.sigmoid_kernel(X, Y, gamma=g, coef0=c),
}


@pytest.mark.parametrize("kernel", sorted(SKLEARN))
@pytest.mark.parametrize("sparse", [False, True])
def test_matches_sklearn_float64(kernel, sparse):
    X, Y = X_STD[:80], X_STD[80:]
    g, d, c = 0.02, 3, 0.5
    expected = SKLEARN[kernel](X, Y, g, d, c)
    Xin = sp.csr_matrix(X) if sparse else X
    got = kernel_matrix(Xin, Y, kernel, gamma=g, degree=d, coef0=c)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel", sorted(SKLEARN))
def test_float32_kept_and_close(kernel):
    X = X_STD[:60].astype(np.float32)
    got = kernel_matrix(X, kernel=kernel, gamma=0.02, degree=2, coef0=0.5)
    assert got.dtype == np.float32
    expected = SKLEARN[kernel](X_STD[:60], X_STD[:60], 0.02, 2, 0.5)
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)


def test_rbf_distance_is_clamped_at_zero():
    # Equal rows far from the origin: ||x||^2 + ||y||^2 - 2 x.y cancels to about +-eps.
    X = np.full((4, 3), 1e4) + np.arange(3) * 1e-9
    K = kernel_matrix(X, kernel="rbf", gamma=1.0)
    assert np.all(K <= 1.0) and np.all(np.isfinite(K))
    np.testing.assert_allclose(K, 1.0)


def test_blocks_give_the_same_answer():
    k = Kernel("rbf", gamma=0.03)
    full = k.matrix(X_STD)
    coef = np.random.default_rng(0).normal(size=(X_STD.shape[0], 2))
    tiny_block = 8 * X_STD.shape[0] * 7  # 7 rows per block
    np.testing.assert_allclose(k.dot(X_STD, X_STD, coef, block_bytes=tiny_block), full @ coef,
                               rtol=1e-12)


def test_matrix_refuses_to_exceed_the_memory_budget():
    X = np.zeros((1000, 2))
    with pytest.raises(MemoryError, match="max_bytes"):
        kernel_matrix(X, kernel="rbf", gamma=1.0, max_bytes=1000 * 999 * 8)
    huge = Kernel("rbf", 1.0)
    # 1M x 1M would be 8 TB: refused before any allocation.
    with pytest.raises(MemoryError, match="7450.6 GiB"):
        huge.matrix(np.broadcast_to(np.zeros(2), (1_000_000, 2)))


@pytest.mark.parametrize("kernel", sorted(SKLEARN))
def test_diag_and_rows(kernel):
    k = Kernel(kernel, gamma=0.02, degree=3, coef0=0.5)
    K = k.matrix(X_STD)
    np.testing.assert_allclose(k.diag(X_STD), np.diag(K), rtol=1e-10, atol=1e-12)
    idx = np.array([3, 0, 17])
    np.testing.assert_allclose(k.rows(X_STD, idx), K[idx], rtol=1e-12)


def test_precomputed_passes_the_matrix_through():
    K = skp.rbf_kernel(X_STD, gamma=0.1)
    k = make_kernel("precomputed")
    assert k.matrix(K) is K
    np.testing.assert_array_equal(k.diag(K), np.diag(K))
    np.testing.assert_array_equal(k.rows(K, [2, 5]), K[[2, 5]])
    np.testing.assert_allclose(k.dot(K, None, np.ones(len(K))), K.sum(1))


def test_gamma_scale_and_auto_match_sklearn_svc():
    from sklearn.svm import SVC

    svc = SVC(gamma="scale").fit(X_REAL, np.arange(len(X_REAL)) % 2)
    assert resolve_gamma("scale", X_REAL) == pytest.approx(svc._gamma, rel=1e-12)
    assert resolve_gamma("scale", sp.csr_matrix(X_REAL)) == pytest.approx(svc._gamma, rel=1e-9)
    assert resolve_gamma("auto", X_REAL) == 1 / X_REAL.shape[1]
    assert resolve_gamma("scale", np.ones((3, 2))) == 1.0


def test_gamma_scale_is_the_same_to_the_bit_for_sparse_and_dense():
    """The variance of the entries over the non-zero ones in row-major order: a dense X and
    any CSR form of it (duplicates, unsorted indices, stored zeros) give one gamma."""
    from sklearn.datasets import load_digits

    from gpuml.kernels.pairwise import entry_variance

    X = load_digits().data  # pixels: many zeros, and X.var() and E[x^2] - E[x]^2 differ
    assert entry_variance(X) == pytest.approx(X.var(), rel=1e-13)
    S = sp.csr_matrix(X)
    # three more entries in the last row: a stored zero and a duplicate pair summing to 0
    messy = sp.csr_matrix((np.concatenate([S.data, [0.0, 2.0, -2.0]]),
                           np.concatenate([S.indices, [5, 7, 7]]),
                           np.concatenate([S.indptr[:-1], [S.indptr[-1] + 3]])), shape=S.shape)
    before = messy.copy()
    for form in (S, messy, S.tocoo(), np.asfortranarray(X)):
        assert entry_variance(form) == entry_variance(X)
        assert resolve_gamma("scale", form) == resolve_gamma("scale", X)
    assert (messy != before).nnz == 0 and messy.data.size == before.data.size  # input kept


@pytest.mark.parametrize("bad", [0.0, -1.0, "wide", float("nan")])
def test_bad_gamma(bad):
    with pytest.raises(ValueError, match="gamma"):
        resolve_gamma(bad, X_REAL)


def test_bad_inputs_raise_before_work_and_inputs_are_untouched():
    X = X_STD[:10].copy()
    before = X.copy()
    kernel_matrix(X, kernel="rbf", gamma=0.1)
    np.testing.assert_array_equal(X, before)
    with pytest.raises(ValueError, match="kernel must be one of"):
        kernel_matrix(X, kernel="laplacian")
    with pytest.raises(ValueError, match="NaN"):
        kernel_matrix(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="2D array"):
        kernel_matrix(np.ones(3))
    with pytest.raises(ValueError, match="features"):
        kernel_matrix(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError):
        kernel_matrix(np.array([["a", "b"]]))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", sorted(SKLEARN))
@pytest.mark.parametrize("sparse", [False, True])
def test_gpu_matches_cpu(kernel, sparse):
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    X = X_STD[:70]
    expected = kernel_matrix(X, kernel=kernel, gamma=0.02, degree=3, coef0=0.5)
    Xg = cpsp.csr_matrix(cp.asarray(X)) if sparse else cp.asarray(X)
    got = kernel_matrix(Xg, kernel=kernel, gamma=0.02, degree=3, coef0=0.5)
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(got.get(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_host_rbf_blocks_are_the_same_compiled_or_by_numpy(dtype, monkeypatch):
    """On the host an rbf block is one compiled pass (the vectorised exp); while numba has not
    compiled it, NumPy computes the same steps: the same values to the bit, within two ulps
    of the exact kernel."""
    from gpuml.kernels import _jit, vexp
    from gpuml.kernels.vexp import (
        exp_nonpositive_f32,
        exp_nonpositive_f64,
        exp_nonpositive_numpy,
        rbf_from_sq_distances,
    )

    rng = np.random.default_rng(3)
    X = rng.normal(size=(70, 5)).astype(dtype)
    Y = rng.normal(size=(90, 5)).astype(dtype)
    kernel = Kernel("rbf", gamma=0.7)
    with _jit.synchronous():
        compiled = kernel.matrix(X, Y)
        D = sq_distances(X.astype(np.float64), Y.astype(np.float64))
        from_d = rbf_from_sq_distances(D.astype(dtype), 0.7)
    monkeypatch.setattr(_jit, "ready", lambda dispatcher, *args, **kw: False)
    monkeypatch.setattr(vexp, "_twin_spent", 0)
    monkeypatch.setattr(vexp, "TWIN_CHUNK", 1000)  # 6,300 values: by chunks, the last short
    np.testing.assert_array_equal(kernel.matrix(X, Y), compiled)
    np.testing.assert_array_equal(rbf_from_sq_distances(D.astype(dtype), 0.7), from_d)
    exact = np.exp(-0.7 * D)
    assert compiled.dtype == dtype
    np.testing.assert_allclose(compiled, exact, rtol=30 * np.finfo(dtype).eps, atol=0)
    # the exp alone, over its whole range
    x = np.concatenate([[0.0, -1e-30, -87.33, -87.5, -708.0, -709.0, -1e4],
                        rng.uniform(-100.0, 0.0, 5000)]).astype(dtype)
    out = np.empty_like(x)
    scratch = np.empty(x.size, np.int32 if dtype == np.float32 else np.int64)
    (exp_nonpositive_f32 if dtype == np.float32 else exp_nonpositive_f64)(x, out, scratch)
    np.testing.assert_array_equal(exp_nonpositive_numpy(x.copy()), out)
    exact = np.exp(x.astype(np.float64))
    normal = x >= (-87.33 if dtype == np.float32 else -708.0)
    np.testing.assert_array_less(np.abs(out - exact)[normal],
                                 2.0 * np.spacing(exact[normal].astype(dtype)))
    np.testing.assert_array_equal(out[~normal], 0.0)


def test_host_rbf_blocks_take_the_numpy_twin_within_the_budget_then_the_compiled_pass(monkeypatch):
    """While the compiled rbf pass is not loaded, blocks take the NumPy twin until the
    process has computed TWIN_BUDGET values that way; later blocks run the compiled pass
    (compiling it in the caller), with the same values."""
    from gpuml.kernels import _jit, vexp

    rng = np.random.default_rng(4)
    G = rng.uniform(0.0, 3.0, size=(10, 9))
    with _jit.synchronous():
        expected = vexp.rbf_from_sq_distances(G.copy(), 0.5)
    monkeypatch.setattr(_jit, "ready", lambda dispatcher, *args, **kw: False)
    monkeypatch.setattr(vexp, "TWIN_BUDGET", 100)
    monkeypatch.setattr(vexp, "_twin_spent", 0)
    first = G.copy()
    assert not vexp.rbf_in_place(first, 0.5)  # 90 values: within the budget, the twin's
    assert vexp._twin_spent == 90
    np.testing.assert_array_equal(first, G)  # left as it was
    second = G.copy()
    assert vexp.rbf_in_place(second, 0.5)  # 180 > 100: the compiled pass
    np.testing.assert_array_equal(second, expected)
    np.testing.assert_array_equal(vexp.rbf_by_arrays(first, 0.5), expected)
