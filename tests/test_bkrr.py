"""BKRRRegressor: exactness vs KernelRidge, the paper's settings, bad input, sklearn API."""

import pickle
import re

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.kernel_ridge import KernelRidge
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import gpuml.kernels.krr as krr
from gpuml import _backend
from gpuml.estimators import _krr, bkrr_regressor
from gpuml.estimators.bkrr import BKRRRegressor, BKRRRegressorCV
from gpuml.kernels import (
    Kernel,
    NotPositiveDefiniteError,
    cholesky_solve_batch,
    eigh_batch,
    gram_batch,
    krr_solve_parts,
)


def _rel(a, b):
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


@pytest.mark.parametrize("sigma, lam", [(1.0, 1e-4), (3.0, 1e-6), (0.5, 1e-2)])
def test_one_partition_is_kernel_ridge(diabetes, sigma, lam):
    X, y = diabetes
    ours = BKRRRegressor(sigma=sigma, lam=lam, fit_intercept=False, n_partitions=1,
                         device="cpu").fit(X[:350], y[:350])
    ref = KernelRidge(alpha=lam * 350, kernel="rbf", gamma=1 / (2 * sigma**2)).fit(
        X[:350], y[:350])
    assert _rel(ours.predict(X[350:]), ref.predict(X[350:])) < 1e-8
    assert _rel(ours.dual_coef_, ref.dual_coef_) < 1e-8


def test_one_partition_multi_output(diabetes):
    X, y = diabetes
    Y = np.column_stack([y, np.sqrt(y), -y])
    ours = BKRRRegressor(sigma=2.0, lam=1e-5, fit_intercept=False, n_partitions=1,
                         device="cpu").fit(X, Y)
    ref = KernelRidge(alpha=1e-5 * len(X), kernel="rbf", gamma=1 / 8).fit(X, Y)
    pred = ours.predict(X[:50])
    assert pred.shape == (50, 3)
    assert _rel(pred, ref.predict(X[:50])) < 1e-8


@pytest.mark.parametrize("kernel, params", [("linear", {}), ("poly", {"degree": 2, "coef0": 1.5})])
def test_other_kernels_match_kernel_ridge(diabetes, kernel, params):
    X, y = diabetes
    sigma, lam = 2.0, 1e-3
    ours = BKRRRegressor(kernel=kernel, sigma=sigma, lam=lam, fit_intercept=False,
                         n_partitions=1, device="cpu", **params).fit(X, y)
    ref = KernelRidge(alpha=lam * len(X), kernel=kernel, gamma=1 / (2 * sigma**2),
                      **params).fit(X, y)
    assert _rel(ours.predict(X), ref.predict(X)) < 1e-8


class _Centred:
    """A KernelRidge fitted on y minus its mean, predicting with the mean added back."""

    def __init__(self, model, mean):
        self.model, self.mean = model, mean

    def predict(self, X):
        return self.model.predict(X) + self.mean


def _local_models(est, X, y, lam, sigma):
    """One KernelRidge per fitted part, with alpha = lam * m_j (eq. 3.6), on centred y_j."""
    models = []
    for j in range(est.n_partitions_):
        lo, hi = est.part_offsets_[j], est.part_offsets_[j + 1]
        Xj = est.X_fit_[lo:hi]
        rows = [np.flatnonzero((X == r).all(axis=1))[0] for r in Xj]
        mean = y[rows].mean(axis=0) if est.fit_intercept else 0.0
        models.append(_Centred(KernelRidge(alpha=lam * (hi - lo), kernel="rbf",
                                           gamma=1 / (2 * sigma**2)).fit(Xj, y[rows] - mean),
                               mean))
    return models


@pytest.mark.parametrize("partition", ["kbalance", "kmeans"])
def test_nearest_routes_to_the_local_kernel_ridge(diabetes, partition):
    X, y = diabetes
    sigma, lam = 2.0, 1e-4
    est = BKRRRegressor(sigma=sigma, lam=lam, n_partitions=4, partition=partition,
                        device="cpu", random_state=0).fit(X, y)
    assert est.part_sizes_.sum() == len(X)
    if partition == "kbalance":
        assert est.part_sizes_.max() - est.part_sizes_.min() <= 1
    models = _local_models(est, X, y, lam, sigma)
    Xt = X[::7] + 0.01
    nearest = ((Xt[:, None, :] - est.centers_[None]) ** 2).sum(-1).argmin(1)
    expected = np.array([models[c].predict(x[None])[0] for x, c in zip(Xt, nearest)])
    assert _rel(est.predict(Xt), expected) < 1e-8


def test_average_is_dc_krr(diabetes):
    X, y = diabetes
    sigma, lam = 2.0, 1e-4
    est = BKRRRegressor(sigma=sigma, lam=lam, n_partitions=3, partition="random",
                        combine="average", device="cpu", random_state=1).fit(X, y)
    models = _local_models(est, X, y, lam, sigma)
    expected = np.mean([m.predict(X[:40]) for m in models], axis=0)
    assert _rel(est.predict(X[:40]), expected) < 1e-8


def test_random_partition_with_nearest_is_allowed(diabetes):
    X, y = diabetes
    est = BKRRRegressor(sigma=2.0, n_partitions=3, partition="random", combine="nearest",
                        device="cpu", random_state=0).fit(X, y)
    assert np.isfinite(est.predict(X)).all()


def test_auto_partitions(monkeypatch, diabetes):
    X, y = diabetes
    assert BKRRRegressor(device="cpu").fit(X, y).n_partitions_ == 1
    monkeypatch.setattr(_krr, "AUTO_PART_SIZE", 100)
    est = BKRRRegressor(device="cpu", random_state=0).fit(X, y)
    assert est.n_partitions_ == 5 and est.part_sizes_.max() <= 100


def test_prediction_is_chunk_independent(diabetes):
    X, y = diabetes
    est = BKRRRegressor(sigma=2.0, n_partitions=4, device="cpu", random_state=0).fit(X, y)
    rng = np.random.default_rng(0)
    Xt = rng.normal(size=(30000, X.shape[1]))
    whole = est.predict(Xt)
    parts = np.concatenate([est.predict(c) for c in np.array_split(Xt, 7)])
    np.testing.assert_allclose(whole, parts, rtol=1e-12, atol=1e-12)


def test_float32_close_to_float64(diabetes):
    X, y = diabetes
    kw = dict(sigma=2.0, lam=1e-3, n_partitions=2, device="cpu", random_state=0)
    p64 = BKRRRegressor(**kw).fit(X, y).predict(X)
    est32 = BKRRRegressor(dtype="float32", **kw).fit(X, y)
    p32 = est32.predict(X)
    assert p32.dtype == np.float32 and est32.dual_coef_.dtype == np.float32
    assert _rel(p32.astype(np.float64), p64) < 1e-3
    follow = BKRRRegressor(dtype=None, **kw).fit(X.astype(np.float32), y)
    assert follow.X_fit_.dtype == np.float32


# -- defaults: sigma="scale", lam="auto", fit_intercept=True, dtype follows X ---------
def test_sigma_scale_is_svc_gamma_scale(diabetes):
    X, y = diabetes
    est = BKRRRegressor(lam=1e-3, device="cpu").fit(X, y)
    d, var = X.shape[1], X.var()
    assert est.gamma_ == pytest.approx(1.0 / (d * var), rel=1e-12)
    assert est.sigma_ == pytest.approx(np.sqrt(d * var / 2.0), rel=1e-12)
    # KernelRidge's spelling of the same rule, and sparse input without densifying
    assert BKRRRegressor(gamma="scale", lam=1e-3, device="cpu").fit(X, y).gamma_ == \
        pytest.approx(est.gamma_, rel=1e-12)
    assert BKRRRegressor(lam=1e-3, device="cpu").fit(sp.csr_matrix(X), y).gamma_ == \
        pytest.approx(est.gamma_, rel=1e-10)
    # it follows X's scale: 10x the features, 1/100 the gamma
    assert BKRRRegressor(lam=1e-3, device="cpu").fit(10 * X, y).gamma_ == \
        pytest.approx(est.gamma_ / 100, rel=1e-10)
    constant = BKRRRegressor(lam=1e-3, device="cpu").fit(np.ones((5, 2)), np.arange(5.0))
    assert constant.gamma_ == pytest.approx(1.0, rel=1e-12)  # SVC's fallback


def _loo_lam_oracle(X, y, gamma, lams):
    """argmin over lams of the leave-one-out squared error, by dense inverses."""
    from sklearn.metrics.pairwise import rbf_kernel

    K = rbf_kernel(X, gamma=gamma)
    t = y - y.mean()
    m = len(t)
    losses = []
    for lam in lams:
        H = K @ np.linalg.inv(K + lam * m * np.eye(m))
        e = (t - H @ t) / (1.0 - np.diag(H))
        losses.append(np.sum(e**2))
    return lams[int(np.argmin(losses))]


def test_lam_auto_is_the_leave_one_out_choice(diabetes, monkeypatch):
    X, y = diabetes
    X, y = X[:150], y[:150]
    est = BKRRRegressor(device="cpu").fit(X, y)
    lams = list(bkrr_regressor.AUTO_LAMS)
    assert est.lam_ in lams
    assert est.lam_ == _loo_lam_oracle(X, y, est.gamma_, lams)
    # a noise-free smooth target: the oracle's choice too
    smooth = np.sin(X @ np.linspace(-20, 20, X.shape[1]))
    lam_smooth = BKRRRegressor(device="cpu").fit(X, smooth).lam_
    assert lam_smooth == _loo_lam_oracle(X, smooth, est.gamma_, lams)
    # above AUTO_LAM_SAMPLES rows, a fixed subsample: the same choice on every fit
    monkeypatch.setattr(bkrr_regressor, "AUTO_LAM_SAMPLES", 60)
    a = BKRRRegressor(device="cpu").fit(X, y).lam_
    assert a == BKRRRegressor(device="cpu", random_state=3).fit(X, y).lam_
    rows = np.sort(np.random.default_rng(0).choice(len(y), 60, replace=False))
    assert a == _loo_lam_oracle(X[rows], y[rows], est.gamma_, lams)
    # alpha= replaces lam: nothing searched
    assert BKRRRegressor(alpha=0.5, device="cpu").fit(X, y).shifts_.tolist() == [0.5]


def test_centring_is_kernel_ridge_on_centred_y(diabetes):
    X, y = diabetes
    est = BKRRRegressor(sigma=0.1, lam=1e-3, n_partitions=1, device="cpu").fit(X, y)
    ref = KernelRidge(alpha=1e-3 * len(y), kernel="rbf", gamma=1 / (2 * 0.1**2)).fit(
        X, y - y.mean())
    np.testing.assert_allclose(est.predict(X), ref.predict(X) + y.mean(), rtol=1e-8, atol=1e-8)
    assert est.intercept_.shape == (1,) and est.intercept_[0] == pytest.approx(y.mean())
    # weighted mean with sample_weight; one mean per target
    sw = np.random.default_rng(0).uniform(0.2, 2.0, len(y))
    Y = np.column_stack([y, -2 * y + 7])
    est = BKRRRegressor(sigma=0.1, lam=1e-3, n_partitions=1, device="cpu").fit(
        X, Y, sample_weight=sw)
    mean = sw @ Y / sw.sum()
    # the part's size in the shift lam * m is its total weight
    ref = KernelRidge(alpha=1e-3 * sw.sum(), kernel="rbf", gamma=1 / (2 * 0.1**2)).fit(
        X, Y - mean, sample_weight=sw)
    np.testing.assert_allclose(est.predict(X), ref.predict(X) + mean, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(est.intercept_[0], mean, rtol=1e-12)
    # off: KernelRidge itself
    off = BKRRRegressor(sigma=0.1, lam=1e-3, fit_intercept=False, n_partitions=1,
                        device="cpu").fit(X, y)
    ref = KernelRidge(alpha=1e-3 * len(y), kernel="rbf", gamma=1 / (2 * 0.1**2)).fit(X, y)
    np.testing.assert_allclose(off.predict(X), ref.predict(X), rtol=1e-8, atol=1e-8)
    assert off.intercept_.tolist() == [0.0]


def test_centring_is_per_part(diabetes):
    X, y = diabetes
    est = BKRRRegressor(sigma=0.1, lam=1e-3, n_partitions=3, device="cpu",
                        random_state=0).fit(X, y + 100.0)
    for j in range(3):
        lo, hi = est.part_offsets_[j], est.part_offsets_[j + 1]
        rows = [np.flatnonzero((X == r).all(axis=1))[0] for r in est.X_fit_[lo:hi]]
        assert est.intercept_[j] == pytest.approx(y[rows].mean() + 100.0, rel=1e-12)


def test_float32_in_float32_out(diabetes):
    X, y = diabetes
    X32 = X.astype(np.float32)
    est = BKRRRegressor(n_partitions=2, device="cpu", random_state=0).fit(X32, y)
    assert est.X_fit_.dtype == est.dual_coef_.dtype == est.intercept_.dtype == np.float32
    assert est.predict(X32).dtype == np.float32
    # a float64 model predicts float32 for float32 input, float64 for float64 input
    est64 = BKRRRegressor(n_partitions=2, device="cpu", random_state=0).fit(X, y)
    assert est64.dual_coef_.dtype == np.float64
    assert est64.predict(X32).dtype == np.float32 and est64.predict(X).dtype == np.float64
    assert _rel(est.predict(X32).astype(np.float64), est64.predict(X)) < 1e-3
    # dtype= overrides the input's
    assert BKRRRegressor(dtype="float64", n_partitions=2, device="cpu", random_state=0).fit(
        X32, y).dual_coef_.dtype == np.float64


def test_sparse_input_matches_dense(diabetes):
    X, y = diabetes
    kw = dict(sigma=2.0, n_partitions=3, device="cpu", random_state=0)
    dense = BKRRRegressor(**kw).fit(X, y).predict(X)
    sparse = BKRRRegressor(**kw).fit(sp.csr_matrix(X), y).predict(sp.csr_matrix(X))
    np.testing.assert_allclose(sparse, dense, rtol=1e-8)


def test_inputs_not_modified(diabetes):
    X, y = diabetes
    X0, y0 = X.copy(), y.copy()
    BKRRRegressor(n_partitions=3, device="cpu", random_state=0).fit(X, y).predict(X)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)


# -- bad input ---------------------------------------------------------------
@pytest.mark.parametrize("params, match", [
    ({"sigma": 0.0}, "sigma"),
    ({"sigma": -1.0}, "sigma"),
    ({"lam": -1e-3}, "lam"),
    ({"partition": "spectral"}, "partition"),
    ({"combine": "vote"}, "combine"),
    ({"kernel": "bessel"}, "kernel"),
    ({"alpha": -1.0}, "alpha"),
    ({"gamma": 0.0}, "gamma"),
    ({"dtype": "float16"}, "dtype"),
    ({"device": "tpu"}, "device"),
    ({"sigma": "wide"}, "sigma"),
    ({"lam": "best"}, "lam"),
    ({"gamma": "wide"}, "gamma"),
    ({"fit_intercept": "yes"}, "fit_intercept"),
])
def test_bad_parameters(diabetes, params, match):
    X, y = diabetes
    with pytest.raises(ValueError, match=match):
        BKRRRegressor(**params).fit(X, y)


def test_lam_zero_singular_system_falls_back_to_least_squares_as_kernel_ridge():
    X = np.repeat(np.arange(6.0).reshape(-1, 1), 2, axis=0)
    y = np.arange(12.0)
    with pytest.warns(UserWarning, match="part 0.*not positive definite.*least-squares"):
        est = BKRRRegressor(sigma=1.0, lam=0.0, fit_intercept=False, n_partitions=1,
                            device="cpu").fit(X, y)
    ref = KernelRidge(alpha=0.0, kernel="rbf", gamma=0.5)
    with pytest.warns(UserWarning, match="least-squares"):
        ref.fit(X, y)
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-8, atol=1e-8)
    est = BKRRRegressor(lam=0.0, n_partitions=1, device="cpu").fit(X[::2], y[::2])
    np.testing.assert_allclose(est.predict(X[::2]), y[::2], atol=1e-6)


def test_nan_inf_and_shapes(diabetes):
    X, y = diabetes
    bad = X.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        BKRRRegressor(device="cpu").fit(bad, y)
    bad[3, 2] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        BKRRRegressor(device="cpu").fit(bad, y)
    ybad = y.copy()
    ybad[0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        BKRRRegressor(device="cpu").fit(X, ybad)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        BKRRRegressor(device="cpu").fit(X, y[:-1])
    est = BKRRRegressor(device="cpu").fit(X, y)
    with pytest.raises(ValueError, match="NaN"):
        est.predict(bad.copy() * np.nan)
    with pytest.raises(ValueError, match="features"):
        est.predict(X[:, :3])


def test_too_many_partitions(diabetes):
    X, y = diabetes
    with pytest.raises(ValueError, match="larger than the number of samples"):
        BKRRRegressor(n_partitions=11, device="cpu").fit(X[:10], y[:10])


def test_memory_estimate_suggests_more_partitions(monkeypatch, diabetes):
    X, y = diabetes
    budget = 8 * 120**2
    monkeypatch.setattr(_krr, "available_bytes", lambda xp: budget)
    with pytest.raises(MemoryError, match=r"n_partitions>=(\d+)") as info:
        BKRRRegressor(n_partitions=2, device="cpu", random_state=0).fit(X, y)
    suggested = int(info.value.args[0].rsplit(">=", 1)[1].split()[0])
    assert suggested > 2
    est = BKRRRegressor(n_partitions=suggested, device="cpu", random_state=0).fit(X, y)
    assert est.part_sizes_.max() ** 2 * 8 <= budget


def test_indefinite_sigmoid_falls_back_to_least_squares(diabetes):
    X, y = diabetes
    X, y = X[:120], y[:120]
    with pytest.warns(UserWarning, match="not positive definite"):
        est = BKRRRegressor(kernel="sigmoid", sigma=0.05, lam=0.0, coef0=-5.0, n_partitions=1,
                            fit_intercept=False, device="cpu").fit(X, y)
    ref = KernelRidge(alpha=0.0, kernel="sigmoid", gamma=1 / (2 * 0.05**2), coef0=-5.0)
    with pytest.warns(UserWarning):
        ref.fit(X, y)
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-6, atol=1e-6)


# -- KernelRidge's interface (issue 14): alpha, gamma, sample_weight, other kernels ---------
@pytest.mark.parametrize("kernel", ["rbf", "linear", "poly", "polynomial", "sigmoid",
                                    "laplacian", "chi2", "additive_chi2", "cosine"])
def test_kernel_ridge_arguments_map_one_to_one(diabetes, kernel):
    X, y = diabetes
    X = np.abs(X[:150]) if "chi2" in kernel else X[:150]
    y = y[:150]
    sw = np.random.default_rng(0).uniform(0.2, 2.0, len(y))
    kw = dict(alpha=0.5, kernel=kernel, degree=2, coef0=0.5)
    ref = KernelRidge(gamma=0.05, **kw).fit(X, y, sample_weight=sw)
    ours = BKRRRegressor(gamma=0.05, fit_intercept=False, n_partitions=1, device="cpu",
                         **kw).fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(ours.dual_coef_, ref.dual_coef_, rtol=1e-6, atol=1e-8)
    if kernel != "chi2":  # KernelRidge itself fails on chi2 with gamma=None
        auto = BKRRRegressor(gamma="auto", fit_intercept=False, n_partitions=1, device="cpu",
                             **kw).fit(X, y)
        np.testing.assert_allclose(auto.predict(X), KernelRidge(**kw).fit(X, y).predict(X),
                                   rtol=1e-7, atol=1e-7)
    assert ours.shifts_.tolist() == [0.5] and ours.lam_ == pytest.approx(0.5 / sw.sum())


def test_precomputed_and_callable_kernels_as_kernel_ridge(diabetes):
    from sklearn.metrics.pairwise import rbf_kernel

    X, y = diabetes
    K = rbf_kernel(X, gamma=0.1)
    K0 = K.copy()
    pre = BKRRRegressor(kernel="precomputed", alpha=1e-2, fit_intercept=False,
                        device="cpu").fit(K, y)
    np.testing.assert_array_equal(K, K0)  # the caller's matrix is left alone
    ref = KernelRidge(kernel="precomputed", alpha=1e-2).fit(K, y)
    np.testing.assert_allclose(pre.predict(K[:20]), ref.predict(K[:20]), rtol=1e-8)
    rbf = BKRRRegressor(gamma=0.1, alpha=1e-2, fit_intercept=False, n_partitions=1,
                        device="cpu").fit(X, y)
    np.testing.assert_allclose(rbf.predict(X[:20]), ref.predict(K[:20]), rtol=1e-8)
    def gaussian(a, b, gamma):  # KernelRidge's callables take two samples
        return np.exp(-gamma * np.sum((a - b) ** 2))

    call = BKRRRegressor(kernel=gaussian, kernel_params={"gamma": 0.1}, alpha=1e-2,
                         fit_intercept=False, n_partitions=1, device="cpu").fit(X[:200], y[:200])
    ref = KernelRidge(kernel="precomputed", alpha=1e-2).fit(K[:200, :200], y[:200])
    np.testing.assert_allclose(call.predict(X[:20]), ref.predict(K[:20, :200]), rtol=1e-8)
    with pytest.raises(ValueError, match="precomputed.*n_partitions=1"):
        BKRRRegressor(kernel="precomputed", n_partitions=2, device="cpu").fit(K, y)
    with pytest.raises(ValueError, match="on the CPU"):
        BKRRRegressor(kernel="laplacian", device="cuda").fit(X, y)


def test_sample_weight_with_partitions_weighs_each_part(diabetes):
    # Integer weights equal repeated samples when the shift does not depend on
    # the part size (alpha=): the split must keep the copies together, so the
    # weights are compared on one part and, for P parts, against the per-part
    # KernelRidge models.
    X, y = diabetes
    sw = np.random.default_rng(1).integers(1, 4, len(y)).astype(float)
    est = BKRRRegressor(alpha=0.3, sigma=3.0, fit_intercept=False, n_partitions=3,
                        random_state=0, device="cpu").fit(X, y, sample_weight=sw)
    for j in range(3):
        lo, hi = est.part_offsets_[j], est.part_offsets_[j + 1]
        rows = [np.flatnonzero((X == r).all(axis=1))[0] for r in est.X_fit_[lo:hi]]
        ref = KernelRidge(alpha=0.3, kernel="rbf", gamma=est.gamma_).fit(
            X[rows], y[rows], sample_weight=sw[rows])
        np.testing.assert_allclose(est.dual_coef_[lo:hi], ref.dual_coef_, rtol=1e-8)
    with pytest.raises(ValueError, match="[Nn]egative"):
        BKRRRegressor(device="cpu").fit(X, y, sample_weight=-sw)


def test_cuda_without_gpu_is_clear(diabetes):
    from gpuml._backend import cuda_available

    if cuda_available():
        pytest.skip("a GPU is present")
    X, y = diabetes
    with pytest.raises(RuntimeError, match="device='cuda'"):
        BKRRRegressor(device="cuda").fit(X, y)


# -- scikit-learn citizenship -------------------------------------------------
def _expected_failures(estimator):
    if isinstance(estimator, BKRRRegressor) and estimator.n_partitions not in (1, "auto"):
        # With one part (n_partitions="auto" is one part on the checks' data) a
        # weight counts as that many copies everywhere (sigma="scale",
        # lam="auto", the shift lam * m); with several the split is not.
        why = ("with P >= 2, rows repeated may land in different parts while a weighted "
               "row lands in one")
        return {"check_sample_weight_equivalence_on_dense_data": why,
                "check_sample_weight_equivalence_on_sparse_data": why}
    return {}


@parametrize_with_checks([
    BKRRRegressor(device="cpu"),
    BKRRRegressor(n_partitions=1, device="cpu"),
    BKRRRegressor(n_partitions=2, device="cpu", random_state=0),
    BKRRRegressor(alpha=1.0, n_partitions=1, device="cpu"),
    BKRRRegressorCV(device="cpu", sigmas=(0.5, 2.0), lams=(1e-4, 1e-2)),
], expected_failed_checks=_expected_failures)
def test_sklearn_compatible(estimator, check):
    check(estimator)


def run_unless_too_few_rows(check, estimator):
    """Run a check; skip it when its data has fewer rows than ``n_partitions``.

    The estimator must then refuse the fit with its clear error (a ValueError
    naming ``n_partitions`` and the number of samples), whether the check
    lets that error through, wraps it or chains it; any other failure fails.
    """
    try:
        check(estimator)
    except Exception as exc:
        cause = exc
        while cause is not None:
            found = re.search(rf"n_partitions={estimator.n_partitions} is larger than the "
                              r"number of samples \((\d+)\)", str(cause))
            if isinstance(cause, ValueError) and found:
                pytest.skip(f"the check fits {found.group(1)} samples, fewer than "
                            f"n_partitions={estimator.n_partitions}")
            cause = cause.__cause__ or cause.__context__
        raise


@parametrize_with_checks([BKRRRegressor(n_partitions=16, device="cpu", random_state=0)],
                         expected_failed_checks=_expected_failures)
def test_sklearn_compatible_sixteen_parts(estimator, check):
    run_unless_too_few_rows(check, estimator)


@pytest.mark.parametrize("n_partitions", ["auto", 1])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_integer_weights_are_repeated_rows_with_the_defaults(diabetes, n_partitions,
                                                             fit_intercept):
    """sigma="scale", lam="auto" and the shift lam * m count a weight w as w copies of the row."""
    X, y = diabetes
    X, y = X[:150], y[:150]
    sw = np.random.default_rng(0).integers(0, 5, len(y))
    kw = dict(n_partitions=n_partitions, fit_intercept=fit_intercept, device="cpu")
    weighted = BKRRRegressor(**kw).fit(X, y, sample_weight=sw.astype(float))
    repeated = BKRRRegressor(**kw).fit(X.repeat(sw, axis=0), y.repeat(sw))
    assert weighted.lam_ == repeated.lam_
    assert weighted.sigma_ == pytest.approx(repeated.sigma_, rel=1e-12)
    assert weighted.gamma_ == pytest.approx(repeated.gamma_, rel=1e-12)
    np.testing.assert_allclose(weighted.shifts_, repeated.shifts_, rtol=1e-12)
    np.testing.assert_allclose(weighted.intercept_, repeated.intercept_, rtol=1e-12)
    np.testing.assert_allclose(weighted.predict(X), repeated.predict(X), rtol=1e-9)


def test_weighted_lam_auto_leaves_one_unit_of_weight_out(diabetes):
    """lam="auto"'s losses with weights: the rows repeated's, and refits without one unit."""
    X, y = diabetes
    X, y = X[:60], y[:60]
    est = BKRRRegressor(device="cpu")
    lams = np.asarray(bkrr_regressor.AUTO_LAMS)
    sigma = 3.0
    # integer weights (zeros included): the unweighted losses of the rows repeated
    sw = np.random.default_rng(0).integers(0, 5, len(y))
    weighted = est._auto_lam_losses(_backend.CPU, X, y, sw.astype(float), sigma, lams)
    repeated = est._auto_lam_losses(_backend.CPU, X.repeat(sw, axis=0), y.repeat(sw), None,
                                    sigma, lams)
    np.testing.assert_allclose(weighted, repeated, rtol=1e-10)
    # any weights: row i's residual after refitting without min(w_i, 1) of its weight,
    # at the full fit's shift lam * sum(w) and weighted mean; loss sum w_i e_i^2 / var_w
    from sklearn.metrics.pairwise import rbf_kernel

    sw = np.random.default_rng(1).uniform(0.1, 3.0, len(y))
    K = rbf_kernel(X, gamma=1 / (2 * sigma**2))
    total = sw.sum()
    t = y - sw @ y / total
    var = sw @ (t - sw @ t / total) ** 2 / total
    by_refits = []
    for lam in lams[::3]:
        loss = 0.0
        for i in range(len(y)):
            w = sw.copy()
            w[i] -= min(w[i], 1.0)
            a = np.linalg.solve(w[:, None] * K + lam * total * np.eye(len(y)), w * t)
            loss += sw[i] * (t[i] - K[i] @ a) ** 2
        by_refits.append(loss / var)
    np.testing.assert_allclose(
        est._auto_lam_losses(_backend.CPU, X, y, sw, sigma, lams[::3]), by_refits, rtol=1e-10)


def test_weighted_shift_is_lam_times_the_part_weight(diabetes):
    """With sample_weight, m_j in lam * m_j is part j's total weight (row count if all zero)."""
    X, y = diabetes
    sw = np.random.default_rng(2).uniform(0.2, 2.0, len(y))
    est = BKRRRegressor(sigma=3.0, lam=1e-3, n_partitions=3, random_state=0,
                        device="cpu").fit(X, y, sample_weight=sw)
    for j in range(3):
        lo, hi = est.part_offsets_[j], est.part_offsets_[j + 1]
        rows = [np.flatnonzero((X == r).all(axis=1))[0] for r in est.X_fit_[lo:hi]]
        assert est.shifts_[j] == pytest.approx(1e-3 * sw[rows].sum(), rel=1e-12)
        mean = sw[rows] @ y[rows] / sw[rows].sum()
        ref = KernelRidge(alpha=1e-3 * sw[rows].sum(), kernel="rbf", gamma=est.gamma_).fit(
            X[rows], y[rows] - mean, sample_weight=sw[rows])
        np.testing.assert_allclose(est.dual_coef_[lo:hi], ref.dual_coef_, rtol=1e-8)
    assert _krr._part_masses([[0, 1], [2, 3, 4]],
                                    [np.zeros(2), np.array([1.0, 2.0, 0.0])]) == [2, 3.0]


def test_pipeline_clone_pickle_gridsearch(diabetes):
    X, y = diabetes
    pipe = make_pipeline(StandardScaler(), BKRRRegressor(n_partitions=3, device="cpu",
                                                         random_state=0))
    pipe.fit(X, y)
    restored = pickle.loads(pickle.dumps(pipe))
    np.testing.assert_array_equal(restored.predict(X), pipe.predict(X))
    fresh = clone(pipe[-1])
    assert not hasattr(fresh, "dual_coef_") and fresh.get_params() == pipe[-1].get_params()
    search = GridSearchCV(BKRRRegressor(n_partitions=2, device="cpu", random_state=0),
                          {"sigma": [1.0, 3.0], "lam": [1e-4, 1e-2]}, cv=3, n_jobs=2)
    search.fit(X, y)
    serial = GridSearchCV(BKRRRegressor(n_partitions=2, device="cpu", random_state=0),
                          {"sigma": [1.0, 3.0], "lam": [1e-4, 1e-2]}, cv=3).fit(X, y)
    np.testing.assert_allclose(search.cv_results_["mean_test_score"],
                               serial.cv_results_["mean_test_score"])


# -- the batched solvers of gpuml.kernels (CPU path) --------------------------
def test_batched_solvers_cpu():
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(m, 3)) for m in (5, 6, 6)]
    kernel = Kernel("rbf", gamma=0.3)
    blocks = gram_batch(kernel, parts, n_jobs=2)
    for Xj, K in zip(parts, blocks):
        np.testing.assert_allclose(K, kernel.matrix(Xj))
    shifted = [K + 0.1 * np.eye(len(K)) for K in blocks]
    rhs = [rng.normal(size=(len(K), 2)) for K in blocks]
    sols = cholesky_solve_batch(shifted, rhs, n_jobs=2)
    for A, b, x in zip(shifted, rhs, sols):
        np.testing.assert_allclose(A @ x, b, atol=1e-10)
    direct = krr_solve_parts(kernel, parts, rhs, [0.1] * 3)
    for x, d in zip(sols, direct):
        np.testing.assert_allclose(d, x, rtol=1e-10)
    for K, (w, Q) in zip(blocks, eigh_batch(blocks)):
        np.testing.assert_allclose((Q * w) @ Q.T, K, atol=1e-12)


@pytest.mark.parametrize("m", [1, 127, 128, 300])
@pytest.mark.parametrize("name", ["rbf", "poly"])
def test_upper_gram_is_the_upper_triangle_of_the_kernel_matrix(m, name):
    X = np.random.default_rng(4).normal(size=(m, 3))
    kernel = Kernel(name, gamma=0.3, degree=2, coef0=1.0)
    upper = np.triu_indices(m)
    np.testing.assert_allclose(krr._upper_gram_host(kernel, X)[upper], kernel.matrix(X)[upper],
                               rtol=1e-13, atol=1e-15)


def _dense_tridiagonal(form):
    T = np.diag(form.d)
    if form.e is not None and form.size > 1:
        T += np.diag(form.e, 1) + np.diag(form.e, -1)
    return T


@pytest.mark.parametrize("eigen", [False, True])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 2e-3)])
def test_tridiagonal_form_against_dense_algebra(eigen, dtype, tol):
    """A = Q T Q^T, and every shifted solve and inverse diagonal, against numpy.linalg."""
    rng = np.random.default_rng(3)
    blocks = []
    for m in (1, 2, 3, 7, 40):
        X = rng.normal(size=(m, 4))
        blocks.append(Kernel("rbf", gamma=0.2).matrix(X) + 1e-3 * np.eye(m))
    forms = krr.tridiagonal_batch([A.astype(dtype) for A in blocks], eigen=eigen, n_jobs=2)
    for A, form in zip(blocks, forms):
        m = len(A)
        assert (form.e is None) == eigen and form.d.dtype == dtype
        Q = form.expand(np.eye(m, dtype=dtype))
        np.testing.assert_allclose(Q.T @ Q, np.eye(m), atol=tol)
        np.testing.assert_allclose(Q @ _dense_tridiagonal(form) @ Q.T, A, atol=tol)
        B = rng.normal(size=(m, 3)).astype(dtype)
        np.testing.assert_allclose(form.project(B), Q.T @ B, atol=tol)
        shifts = np.array([1e-2, 0.5, 3.0])
        X = form.solve(shifts, form.project(B))
        X0 = form.solve(shifts, form.project(B[:, 0]))
        assert X.shape == (3, m, 3) and X0.shape == (3, m)
        diagonals = form.inverse_diagonal(shifts)
        for k, shift in enumerate(shifts):
            exact = np.linalg.solve(A + shift * np.eye(m), B)
            scale = tol * np.abs(exact).max()
            np.testing.assert_allclose(form.expand(X[k]), exact, atol=scale)
            np.testing.assert_allclose(form.expand(X0[k]), exact[:, 0], atol=scale)
            inv = np.linalg.inv(A + shift * np.eye(m))
            np.testing.assert_allclose(diagonals[k], np.diag(inv), atol=tol * np.abs(inv).max())


def test_tridiagonal_form_needs_one_representation():
    with pytest.raises(ValueError, match="give Q"):
        krr.Tridiagonal(np.ones(3), np.ones(2), Q=np.eye(3))
    with pytest.raises(ValueError, match="give Q"):
        krr.Tridiagonal(np.ones(3))


def test_batched_cholesky_names_the_failing_part():
    good = np.eye(3)
    bad = -np.eye(3)
    with pytest.raises(NotPositiveDefiniteError) as info:
        cholesky_solve_batch([good, bad], [np.ones(3), np.ones(3)])
    assert info.value.part == 1
    assert isinstance(info.value, np.linalg.LinAlgError)


def test_available_bytes_is_positive():
    assert _backend.available_bytes(np) > 0


def test_gpu_fitted_pickle_loads_on_cpu(monkeypatch, diabetes):
    """A model whose state says cuda:0 loads on the CPU where no GPU answers, and predicts."""
    X, y = diabetes
    est = BKRRRegressor(sigma=2.0, n_partitions=2, device="cpu", random_state=0).fit(X, y)
    expected = est.predict(X)
    est.device_ = "cuda:0"
    monkeypatch.setattr(_backend, "gpu_count", lambda: 0)  # as on a machine without a GPU
    restored = pickle.loads(pickle.dumps(est))
    assert restored.device_ == "cpu"
    np.testing.assert_array_equal(restored.predict(X), expected)


# -- the GPU plan and memory estimate (pure functions, tested without a GPU) ----------------
def _plan(sizes, itemsize=8):
    return [(chunk.tolist(), batched) for chunk, batched in krr.gpu_solve_plan(sizes, itemsize)]


def test_gpu_plan_one_large_block_is_a_single_matrix_solve():
    """Exact KRR (one part) never goes through potrfBatched, whatever its size."""
    for m in (1, 100, krr.POTRF_BATCHED_MAX, 18432):
        assert _plan([m]) == [([0], False)]


def test_gpu_plan_batches_small_equal_blocks_only():
    small, large = krr.POTRF_BATCHED_MAX, krr.POTRF_BATCHED_MAX + 1
    assert _plan([small] * 4) == [([0, 1, 2, 3], True)]
    assert _plan([large] * 3) == [([0, 1, 2], False)]
    # K-balance sizes differ by one: two groups, the lone odd size on its own
    assert _plan([100, 99, 100, 100]) == [([1], False), ([0, 2, 3], True)]
    # k-means sizes all differ: each its own single-matrix solve
    assert _plan([30, 20, 10]) == [([2], False), ([1], False), ([0], False)]


def test_gpu_plan_chunks_cover_every_part_once_within_the_byte_bound(monkeypatch):
    monkeypatch.setattr(krr, "BATCH_BYTES", 10 * 64 * 64 * 8)
    sizes = [64] * 25 + [65] * 3 + [2000]
    plan = krr.gpu_solve_plan(sizes, 8)
    seen = np.concatenate([chunk for chunk, _ in plan])
    assert sorted(seen.tolist()) == list(range(len(sizes)))
    for chunk, batched in plan:
        m = sizes[chunk[0]]
        assert all(sizes[j] == m for j in chunk)
        assert chunk.size == 1 or chunk.size * m * m * 8 <= krr.BATCH_BYTES
        assert batched == (chunk.size > 1 and m <= krr.POTRF_BATCHED_MAX)
    assert [c.size for c, _ in plan if sizes[c[0]] == 64] == [10, 10, 5]


def test_gpu_solve_bytes():
    head = krr.GPU_HEADROOM_BYTES
    # one block factored in place: m^2 values, no copy
    assert krr.gpu_solve_bytes([18432], 8) == 18432**2 * 8 + head
    assert krr.gpu_solve_bytes([18432], 4) == 18432**2 * 4 + head
    # a batched chunk is copied by cupyx.lapack.posv: twice its blocks
    assert krr.gpu_solve_bytes([100] * 16, 8) == 2 * 16 * 100**2 * 8 + head
    # single-matrix blocks of one size are built together, factored one by one
    m = krr.POTRF_BATCHED_MAX + 1
    assert krr.gpu_solve_bytes([m] * 4, 8) == 4 * m * m * 8 + head


def test_balanced_sizes():
    for n, P in ((442, 4), (18432, 16), (10, 10), (7, 1), (1000, 7)):
        sizes = _krr._balanced_sizes(n, P)
        assert sizes.size == P and sizes.sum() == n and sizes.max() - sizes.min() <= 1


def test_fitting_partitions_bisects_to_the_smallest():
    from gpuml.partition import fewest_parts_fitting

    assert fewest_parts_fitting(1000, 3, lambda P: P >= 17) == 17
    assert fewest_parts_fitting(1000, 3, lambda P: True) == 4
    assert fewest_parts_fitting(1000, 3, lambda P: False) is None
    assert fewest_parts_fitting(5, 5, lambda P: True) is None


def _fake_gpu():
    # The GPU branch of the estimate only needs backend.is_gpu; the arrays never move.
    return _backend.Backend(np, 0)


def test_gpu_memory_refusal_says_what_it_needs_and_what_to_change(monkeypatch):
    n = 18432
    need_exact = krr.gpu_solve_bytes([n], 8)
    budget = need_exact // 2
    monkeypatch.setattr(_krr, "available_bytes", lambda xp: budget)
    est = BKRRRegressor(n_partitions=1)
    with pytest.raises(MemoryError) as info:
        est._check_memory([n], 8, _fake_gpu())
    msg = str(info.value)
    assert f"needs about {need_exact / 2**30:.2f} GiB" in msg and "cuda:0" in msg
    assert "dtype='float32'" in msg
    suggested = int(msg.rsplit(">=", 1)[1].split()[0])
    fits = krr.gpu_solve_bytes(_krr._balanced_sizes(n, suggested), 8)
    assert fits <= budget < krr.gpu_solve_bytes(_krr._balanced_sizes(n, suggested - 1), 8)
    est._check_memory(_krr._balanced_sizes(n, suggested), 8, _fake_gpu())


def test_gpu_memory_refusal_when_nothing_fits(monkeypatch):
    monkeypatch.setattr(_krr, "available_bytes", lambda xp: krr.GPU_HEADROOM_BYTES // 2)
    with pytest.raises(MemoryError, match="free memory on the device"):
        BKRRRegressor(n_partitions=2)._check_memory([500, 500], 4, _fake_gpu())


def test_memory_is_refused_before_partitioning(monkeypatch, diabetes):
    """The lower bound ceil(n / P) is checked before k-means runs."""
    X, y = diabetes

    def no_split(*args, **kwargs):
        raise AssertionError("partitioned before the memory check")

    monkeypatch.setattr(_krr, "available_bytes", lambda xp: 8 * 100**2)
    monkeypatch.setattr(_krr, "split", no_split)
    with pytest.raises(MemoryError, match=r"2 part\(s\), largest 221 samples"):
        BKRRRegressor(n_partitions=2, device="cpu").fit(X, y)
    with pytest.raises(MemoryError, match="σ/λ search"):
        BKRRRegressorCV(n_partitions=2, device="cpu").fit(X, y)
