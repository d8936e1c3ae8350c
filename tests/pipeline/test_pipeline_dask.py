"""The partitioned fit on a Dask cluster (:class:`gpuml.pipeline.dask.OnDask`), driven by the
stand-in estimator and by the real ones: a two-process ``LocalCluster`` serves the module.

The stand-in's parts equal NumPy's ridge over the rows of the in-process split (the
Dask split is the same); the settings of one split equal separate Dask fits, bit for
bit, the chunks loaded and split once.
"""

import faulthandler

import numpy as np
import pytest
from sklearn.base import clone

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")
cloudpickle = pytest.importorskip("cloudpickle")

import _standin  # noqa: E402
from _standin import KeptRidge, PartRidge, integer_rows, ridge  # noqa: E402

from gpuml import BKRRRegressor, CASVMClassifier  # noqa: E402
from gpuml.partition import split  # noqa: E402
from gpuml.pipeline import fit_settings  # noqa: E402

#: Seconds any one test may take before the run is stopped with every thread's stack.
TEST_LIMIT = 240


@pytest.fixture(scope="module")
def client():
    faulthandler.dump_traceback_later(TEST_LIMIT, exit=True)
    # The workers import gpuml, not the tests: the stand-in's solver travels by value.
    cloudpickle.register_pickle_by_value(_standin)
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       memory_limit="1GiB", dashboard_address=":0",
                                       silence_logs=40)
    c = distributed.Client(cluster)
    faulthandler.cancel_dump_traceback_later()
    yield c
    c.close()
    cluster.close()
    cloudpickle.unregister_pickle_by_value(_standin)


@pytest.fixture(scope="module")
def data():
    return integer_rows(1200)


def _dask(*arrays, rows=300):
    return [da.from_array(a, chunks=(rows,) + a.shape[1:]) for a in arrays]


@pytest.mark.parametrize("weighted", [False, True])
def test_parts_on_dask_are_numpys_ridge_over_the_same_split(client, data, weighted):
    X, y, w = data
    Xd, yd, wd = _dask(X, y, w)
    est = PartRidge(lam=0.5, partition="kmeans").fit(Xd, yd, sample_weight=wd if weighted
                                                     else None)
    parts = split(X, 3, "kmeans", 0)
    assert [r.tolist() for r in est.part_rows_] == [p.tolist() for p in parts.parts]
    np.testing.assert_allclose(est.centers_, parts.centers, rtol=1e-12)
    for rows, coef in zip(parts.parts, est.coef_):
        np.testing.assert_allclose(
            coef, ridge(X[rows], y[rows], w[rows] if weighted else None, 0.5),
            rtol=1e-10, atol=1e-10)
    workers = set(client.scheduler_info(n_workers=-1)["workers"])
    assert set(est.part_worker_.tolist()) <= workers and not est.reported_
    assert est.n_features_in_ == 4


def test_kept_parts_hold_their_rows_and_training_indices(client, data):
    """A solver that keeps its parts on the workers (``keep``, with ``keeps_row_ids``) gets
    each part's rows, targets and training indices as the split made them; the client
    gets each part's summary, and one future per worker's group of parts."""
    X, y, _ = data
    Xd, yd = _dask(X, y)
    est = KeptRidge(lam=0.5, partition="kmeans").fit(Xd, yd)
    parts = split(X, 3, "kmeans", 0)
    kept = {p: line for ids, future in est.kept_
            for p, line in zip(ids, future.result()[0])}
    assert sorted(kept) == [0, 1, 2] and len(est.kept_) == len(set(est.part_worker_))
    for p, rows in enumerate(parts.parts):
        np.testing.assert_array_equal(kept[p].row_ids, rows)
        np.testing.assert_array_equal(kept[p].X, X[rows])
        np.testing.assert_array_equal(kept[p].y, y[rows])
        np.testing.assert_allclose(kept[p].coef, ridge(X[rows], y[rows], None, 0.5),
                                   rtol=1e-10, atol=1e-10)
        np.testing.assert_array_equal(est.coef_[p], kept[p].coef)  # the summaries


def test_settings_on_dask_are_the_separate_fits(client, data):
    X, y, w = data
    Xd, yd, wd = _dask(X, y, w)
    base = PartRidge(partition="fcfs")
    fits = fit_settings(base, [{"lam": 0.01}, {"lam": 10.0}], Xd, yd, sample_weight=wd)
    for fitted in fits:
        alone = clone(fitted).fit(Xd, yd, sample_weight=wd)
        np.testing.assert_array_equal(fitted.coef_, alone.coef_)
        np.testing.assert_array_equal(fitted.centers_, alone.centers_)
    assert not np.array_equal(fits[0].coef_, fits[1].coef_)


def test_casvm_and_bkrr_settings_on_dask_are_the_separate_fits(client):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(1200, 5))
    y = (X[:, 0] + X[:, 1] ** 2 > 1).astype(np.int64) + (X[:, 2] > 0.5)
    Xd, yd = _dask(X, y)
    base = CASVMClassifier(n_partitions=3, random_state=0)
    settings = [{"C": 0.5, "gamma": 0.1}, {"C": 4.0, "gamma": "scale"}]
    for fitted, setting in zip(fit_settings(base, settings, Xd, yd), settings):
        alone = clone(base).set_params(**setting).fit(Xd, yd)
        for name in ("support_", "dual_coef_", "intercept_", "centers_", "n_iter_"):
            np.testing.assert_array_equal(getattr(fitted, name), getattr(alone, name))
        np.testing.assert_array_equal(fitted.decision_function(X), alone.decision_function(X))
    reg = BKRRRegressor(n_partitions=3, random_state=0)
    settings = [{"sigma": 1.0, "lam": 1e-3}, {"sigma": 3.0, "lam": "auto"}]
    target = da.from_array(X @ np.arange(1.0, 6.0), chunks=300)
    for fitted, setting in zip(fit_settings(reg, settings, Xd, target), settings):
        alone = clone(reg).set_params(**setting).fit(Xd, target)
        assert fitted.lam_ == alone.lam_
        # The parts stay on the workers: each setting's model is its own there.
        np.testing.assert_array_equal(fitted.X_fit_.compute(), alone.X_fit_.compute())
        np.testing.assert_array_equal(fitted.dual_coef_.compute(), alone.dual_coef_.compute())
        np.testing.assert_allclose(fitted.predict(X), alone.predict(X), rtol=1e-12, atol=0)


def test_solvers_of_several_settings_run_on_dask(client, data):
    """One solver for several settings (the stand-in's λ; CA-SVM's C path per γ) shipped to
    the workers: the stand-in's fits are the separate fits bit for bit, CA-SVM's the
    in-process C path's (the same split, the same solves)."""
    X, y, w = data
    Xd, yd, wd = _dask(X, y, w)
    base = PartRidge(partition="fcfs")
    lams = [{"lam": 0.01}, {"lam": 10.0}]
    for fitted in fit_settings(base, lams, Xd, yd, sample_weight=wd, jointly=True):
        alone = clone(fitted).fit(Xd, yd, sample_weight=wd)
        np.testing.assert_array_equal(fitted.coef_, alone.coef_)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(1200, 5))
    y = (X[:, 0] + X[:, 1] ** 2 > 1).astype(np.int64) + (X[:, 2] > 0.5)
    Xd, yd = _dask(X, y)
    casvm = CASVMClassifier(n_partitions=3, partition="contiguous", random_state=0)
    settings = [{"C": C, "gamma": g} for C in (0.5, 4.0) for g in (0.1, 0.4)]
    on_dask = fit_settings(casvm, settings, Xd, yd, jointly=True)
    here = fit_settings(clone(casvm).set_params(device="cpu"), settings, X, y, jointly=True)
    for a, b in zip(on_dask, here):
        for name in ("support_", "dual_coef_", "intercept_", "n_iter_"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert len(set(a.part_worker_.tolist())) == 2


def test_dask_refuses_what_it_does_not_run(client, data):
    X, y, w = data
    Xd, yd, wd = _dask(X, y, w)
    with pytest.raises(ValueError, match="^kernel_matrix=True does not run on Dask input"):
        PartRidge(kernel_matrix=True).fit(Xd, yd)
    with pytest.raises(ValueError, match=r"^probability=True does not run on Dask input: "
                                         r"fit CalibratedClassifierCV\(PartRidge"):
        PartRidge(probability=True).fit(Xd, yd)
    with pytest.raises(ValueError, match="^layered=True does not run on Dask input .* use "
                                         "layered=False or in-memory data"):
        PartRidge(layered=True).fit(Xd, yd)
    with pytest.raises(ValueError, match="^devices= is for several devices of one process"):
        PartRidge(device="auto", devices=["cpu"]).fit(Xd, yd)
    with pytest.raises(ValueError, match="^max_device_memory is for a fit in this process"):
        PartRidge(max_device_memory="1GB").fit(Xd, yd)
    with pytest.raises(ValueError, match="^sample_weight is not supported on Dask input for "
                                         "BKRRRegressor"):
        BKRRRegressor().fit(Xd, yd, sample_weight=wd)
