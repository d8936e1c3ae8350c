"""The partitioned estimators over several devices, run on the CPU with thread ranks.

``devices=["cpu"] * k`` takes the multi-GPU code path (sharded partitioning with
collectives, parts placed by cost, one host thread per device, routed prediction)
with ``k`` CPU ranks. The oracle is the one-device fit: the same partition, so the
same local models and the same predictions. Also the seam the multi-device and
cluster fits build on: fitting the parts in subsets and assembling them gives the
one-batch fit.
"""

import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from _threads import bounded
from sklearn.datasets import load_digits
from sklearn.utils._param_validation import InvalidParameterError

from gpuml._backend import CPU, cuda_available, resolve_devices
from gpuml.estimators.bkrr import BKRRRegressor
from gpuml.estimators.casvm import CASVMClassifier
from gpuml.partition import split

METHODS = ["random", "contiguous", "fcfs", "kmeans", "kbalance", "bkm"]
CASVM_ATTRS = ["support_", "support_part_", "n_support_", "pair_status_", "n_iter_",
               "part_n_iter_", "partition_sizes_", "fit_status_"]




@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X[:900] / 16.0, y[:900]


def assert_same_casvm(a, b):
    for name in CASVM_ATTRS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_allclose(a.dual_coef_, b.dual_coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.ovo_dual_coef_, b.ovo_dual_coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.intercept_, b.intercept_, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(a.support_vectors_, b.support_vectors_)
    np.testing.assert_allclose(a.centers_, b.centers_, rtol=1e-12, atol=1e-12)


# -- CA-SVM ---------------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_casvm_ranks_equal_one_device(method, ranks, digits):
    X, y = digits
    params = dict(n_partitions=6, partition=method, random_state=0)
    one = CASVMClassifier(device="cpu", **params).fit(X, y)
    many = bounded(lambda: CASVMClassifier(devices=["cpu"] * ranks, **params).fit(X, y))
    assert many.devices_ == ("cpu",) * ranks
    assert sorted(set(many.part_device_.tolist())) == list(range(min(ranks, 6)))
    assert_same_casvm(one, many)
    np.testing.assert_array_equal(one.predict(X), many.predict(X))
    np.testing.assert_allclose(one.decision_function(X), many.decision_function(X),
                               rtol=1e-10, atol=1e-10)


def test_casvm_ranks_sparse_weights_and_pickle(digits):
    X, y = digits
    Xs = sp.csr_matrix(np.where(X > 0.3, X, 0.0))
    weights = np.r_[np.zeros(30), np.ones(len(y) - 30)]
    params = dict(n_partitions=4, partition="kbalance", random_state=1, class_weight="balanced")
    one = CASVMClassifier(device="cpu", **params).fit(Xs, y, sample_weight=weights)
    many = CASVMClassifier(devices=["cpu", "cpu"], **params).fit(Xs, y, sample_weight=weights)
    for name in CASVM_ATTRS:
        np.testing.assert_array_equal(getattr(one, name), getattr(many, name))
    # A sparse fit keeps dual_coef_ sparse, as SVC.
    assert sp.issparse(one.dual_coef_) and sp.issparse(many.dual_coef_)
    np.testing.assert_allclose(one.dual_coef_.toarray(), many.dual_coef_.toarray(), rtol=1e-10,
                               atol=1e-12)
    assert sp.issparse(many.support_vectors_)
    np.testing.assert_array_equal(one.predict(Xs), many.predict(Xs))
    loaded = pickle.loads(pickle.dumps(many))
    assert "_device_cache" not in loaded.__dict__
    np.testing.assert_array_equal(loaded.predict(Xs), one.predict(Xs))


def test_casvm_more_ranks_than_rows():
    X = np.array([[0.0, 0.0], [0.1, 0.0], [3.0, 3.0], [3.1, 3.0], [0.0, 0.2]])
    y = np.array([0, 1, 0, 1, 0])
    one = CASVMClassifier(device="cpu", n_partitions=2, partition="kmeans",
                          random_state=0).fit(X, y)
    many = CASVMClassifier(devices=["cpu"] * 8, n_partitions=2, partition="kmeans",
                           random_state=0).fit(X, y)
    assert_same_casvm(one, many)
    np.testing.assert_array_equal(one.predict(X), many.predict(X))


def test_refit_drops_the_previous_models_device_copies(digits):
    X, y = digits
    est = CASVMClassifier(devices=["cpu", "cpu"], n_partitions=3, random_state=0).fit(X, y)
    est._device_cache = {("cuda:0", "part", 0): "stale"}
    est.fit(X[:400], y[:400])
    assert "stale" not in est.__dict__.get("_device_cache", {}).values()
    reg = BKRRRegressor(devices=["cpu"], n_partitions=2, random_state=0)
    reg.fit(X, y.astype(float))._device_cache = {("cuda:0", "part", 0): "stale"}
    reg.fit(X[:400], y[:400].astype(float))
    assert "stale" not in reg.__dict__.get("_device_cache", {}).values()


def test_model_from_absent_devices_predicts_on_one_device(digits):
    # As a model fitted on GPUs and unpickled where there are none: its host
    # arrays predict on one device.
    X, y = digits
    many = CASVMClassifier(devices=["cpu", "cpu"], n_partitions=3, random_state=0).fit(X, y)
    expected = many.predict(X)
    many.devices_ = ("cuda:7", "cuda:8")
    if cuda_available():
        pytest.skip("needs a machine without GPUs 7 and 8")
    np.testing.assert_array_equal(many.predict(X), expected)


# -- BKRR -----------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["kbalance", "kmeans", "random", "bkm"])
@pytest.mark.parametrize("combine", ["nearest", "average"])
@pytest.mark.parametrize("ranks", [2, 4])
def test_bkrr_ranks_equal_one_device(method, combine, ranks, diabetes):
    X, y = diabetes
    params = dict(n_partitions=5, partition=method, combine=combine, sigma=3.0,
                  random_state=0)
    one = BKRRRegressor(device="cpu", **params).fit(X, y)
    many = bounded(lambda: BKRRRegressor(devices=["cpu"] * ranks, **params).fit(X, y))
    assert many.device_ == "cpu" and many.devices_ == ("cpu",) * ranks
    np.testing.assert_array_equal(one.part_sizes_, many.part_sizes_)
    np.testing.assert_array_equal(one.X_fit_, many.X_fit_)
    np.testing.assert_allclose(one.dual_coef_, many.dual_coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(one.centers_, many.centers_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(one.predict(X), many.predict(X), rtol=1e-10, atol=1e-9)


def test_bkrr_ranks_float32_multi_target_sparse_pickle(diabetes):
    X, y = diabetes
    Y = np.c_[y, -2.0 * y]
    params = dict(n_partitions=3, sigma=3.0, lam=1e-3, random_state=0)
    one = BKRRRegressor(device="cpu", dtype="float32", **params).fit(X, Y)
    many = BKRRRegressor(devices=["cpu"] * 3, dtype="float32", **params).fit(X, Y)
    assert many.dual_coef_.dtype == np.float32 and many.dual_coef_.shape == Y.shape
    np.testing.assert_allclose(one.predict(X), many.predict(X), rtol=1e-4, atol=1e-3)

    Xs = sp.csr_matrix(np.where(np.abs(X) > 0.5, X, 0.0))
    one = BKRRRegressor(device="cpu", **params).fit(Xs, y)
    many = BKRRRegressor(devices=["cpu"] * 2, **params).fit(Xs, y)
    np.testing.assert_allclose(one.predict(Xs), many.predict(Xs), rtol=1e-10, atol=1e-9)
    loaded = pickle.loads(pickle.dumps(many))
    assert "_device_cache" not in loaded.__dict__
    np.testing.assert_allclose(loaded.predict(Xs), one.predict(Xs), rtol=1e-10, atol=1e-9)


def test_error_in_one_rank_names_part_and_device(diabetes, monkeypatch):
    from gpuml.estimators import _cholesky_solver

    X, y = diabetes
    X = np.repeat(X[:60], 2, axis=0)  # duplicate rows: K + 0*I is singular in every part
    y = np.repeat(y[:60], 2)

    def refuse(*args, **kwargs):
        raise ValueError("least squares refused")

    # The singular parts fall back to least squares (as KernelRidge); make that fail
    # too, to see an error raised inside a rank come out with its device named.
    monkeypatch.setattr(_cholesky_solver, "krr_lstsq_part", refuse)
    est = BKRRRegressor(devices=["cpu", "cpu"], n_partitions=4, lam=0.0, random_state=0)
    with pytest.warns(UserWarning, match="part [0-3]"):
        with pytest.raises(ValueError, match="least squares refused") as info:
            bounded(lambda: est.fit(X, y))
    assert any("cpu (rank" in note for note in getattr(info.value, "__notes__", []))


# -- the seam: parts fitted in subsets, then assembled ---------------------------------

def _solver(est, X, y, n_parts):
    """The estimator's validated data and its part solver, as the pipeline makes them."""
    data = est._validate(X, y, None, CPU)
    data.n_parts = n_parts
    return data, est._part_solver(data)


def test_casvm_subset_fit_and_assemble_equals_one_batch(digits):
    X, y = digits
    est = CASVMClassifier(device="cpu", n_partitions=5, partition="kbalance", random_state=0)
    full = est.fit(X, y)
    snapshot = {k: np.copy(getattr(full, k))
                for k in CASVM_ATTRS + ["dual_coef_", "ovo_dual_coef_", "intercept_"]}
    data, solver = _solver(est, X, y, 5)
    Xv, y_idx, w = data.X, data.targets, data.weights
    parts = split(Xv, 5, "kbalance", 0)
    # One subset fitted on all of X; the other on its own rows only, by a copy of the
    # solver that travelled (as a remote worker holds them), with positions local to the
    # gathered block.
    fits = solver.solve(CPU, Xv, y_idx, w, parts.parts[:2], [0, 1])
    rows = np.concatenate(parts.parts[2:])
    ends = np.cumsum([len(p) for p in parts.parts[2:]])
    local = [np.arange(e - len(p), e) for p, e in zip(parts.parts[2:], ends)]
    shipped = pickle.loads(pickle.dumps(solver))
    assert shipped.progress is None  # the progress lines stay in the fitting process
    fits += shipped.solve(CPU, Xv[rows], y_idx[rows], w[rows], local, [2, 3, 4])
    fits = pickle.loads(pickle.dumps(fits))  # per-part results travel
    est._assemble_parts(parts, fits, data)
    for name, value in snapshot.items():
        np.testing.assert_array_equal(getattr(est, name), value, err_msg=name)


def test_casvm_assemble_sorts_parts_given_in_another_row_order(digits):
    # Parts whose rows are not ascending (as a caller other than split may give
    # them) still assemble into SVC's order (by class, rows ascending), each
    # support vector with its own part and its own coefficients.
    X, y = digits
    est = CASVMClassifier(device="cpu", n_partitions=3, random_state=0).fit(X, y)
    data, solver = _solver(est, X, y, 3)
    Xv, y_idx = data.X, data.targets
    parts = split(Xv, 3, "random", 0)
    parts.parts = [p[::-1].copy() for p in parts.parts]
    fits = solver.solve(CPU, Xv, y_idx, data.weights, parts.parts, [0, 1, 2])
    expected = [dict(zip(rows[f.support].tolist(), f.dual_coef.T.tolist()))
                for rows, f in zip(parts.parts, fits)]
    est._assemble_parts(parts, fits, data)
    np.testing.assert_array_equal(np.lexsort((est.support_, y_idx[est.support_])),
                                  np.arange(len(est.support_)))
    for p, coef_of_row in enumerate(expected):
        cols = np.flatnonzero(est.support_part_ == p)
        rows = est.support_[cols]
        assert sorted(rows.tolist()) == sorted(coef_of_row)
        np.testing.assert_array_equal(est.ovo_dual_coef_[:, cols].T,
                                      [coef_of_row[r] for r in rows.tolist()])
        np.testing.assert_array_equal(est.support_vectors_[cols], Xv[rows])


def test_bkrr_subset_fit_and_store_equals_one_batch(diabetes):
    X, y = diabetes
    est = BKRRRegressor(device="cpu", n_partitions=4, sigma=3.0, random_state=0).fit(X, y)
    expected = est.X_fit_.copy(), est.dual_coef_.copy()
    parts = est._split(X)
    data, solver = _solver(est, X, y, 4)
    assert (solver.sigma, solver.lam) == (3.0, est.lam_)
    shipped = pickle.loads(pickle.dumps(solver))
    fits = (solver.solve(CPU, data.X, data.targets, None, parts.parts[:3], [0, 1, 2])
            + shipped.solve(CPU, data.X, data.targets, None, parts.parts[3:], [3]))
    est._store_fit(CPU, parts, pickle.loads(pickle.dumps(fits)), solver.sigma, solver.lam)
    np.testing.assert_array_equal(est.X_fit_, expected[0])
    np.testing.assert_array_equal(est.dual_coef_, expected[1])


# -- validation of devices, before any work -------------------------------------------

@pytest.mark.parametrize("devices, error, match", [
    ([], ValueError, "non-empty list"),
    ("cuda", ValueError, "devices must be None, 'all' or a list"),
    (["cuda"], ValueError, "name one device"),
    (["auto"], ValueError, "name one device"),
    ([True], ValueError, "GPU ids"),
    ([-1], ValueError, ">= 0"),
    (["gpu0"], ValueError, "'cuda:N'"),
    ([0, 0], ValueError, "GPU 0 more than once"),
    (["cuda:1", 1], ValueError, "GPU 1 more than once"),
    (["cpu", 0], ValueError, "mixes GPUs and CPU ranks"),
])
def test_bad_devices(devices, error, match):
    with pytest.raises(error, match=match):
        resolve_devices(devices)


def test_devices_parameter_checks(digits, diabetes):
    X, y = digits
    with pytest.raises(InvalidParameterError):
        CASVMClassifier(devices=2).fit(X, y)
    with pytest.raises(ValueError, match="not both"):
        CASVMClassifier(device="cpu", devices=["cpu", "cpu"]).fit(X, y)
    with pytest.raises(ValueError, match="precomputed' fits on one device"):
        CASVMClassifier(kernel="precomputed", n_partitions=1,
                        devices=["cpu"]).fit(X @ X.T, y)
    with pytest.raises(ValueError, match="not both"):
        BKRRRegressor(device="cuda", devices=["cpu"]).fit(*diabetes)


@pytest.mark.skipif(cuda_available(), reason="checks the errors of a machine without GPUs")
def test_gpu_devices_without_gpu_are_clear_errors(digits):
    X, y = digits
    with pytest.raises(RuntimeError, match="devices='all' asks for every GPU"):
        CASVMClassifier(devices="all").fit(X, y)
    with pytest.raises(RuntimeError, match=r"devices=\[0, 'cuda:1'\] names GPUs but"):
        BKRRRegressor(devices=[0, "cuda:1"]).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_devices(None) is None
