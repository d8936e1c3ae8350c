"""The partitioned fit (gpuml.pipeline.fit) driven by a stand-in estimator, in this process.

:class:`_standin.PartRidge` (ridge regression per part) goes through every executor
that runs here without a cluster: :class:`InProcess` on the CPU, :class:`Streamed`
under a memory budget, :class:`OnDevices` over CPU ranks. Its fitted parts equal
NumPy's ridge over the rows of the same split; the settings of one split
(:func:`fit_settings`) equal separate fits, bit for bit, the split computed once.
"""

import numpy as np
import pytest
from _standin import PartRidge, RidgePathSolver, RidgeSolver, integer_rows, ridge
from sklearn.base import clone

import gpuml.pipeline.fit as pipeline_fit
from gpuml.partition import split
from gpuml.pipeline import InProcess, OnDevices, Streamed, fit_executor, fit_settings
from gpuml.pipeline.executors import placement_needs


@pytest.fixture(scope="module")
def data():
    return integer_rows(600)


#: The executors that run here, by the stand-in's parameters that choose them.
WHERE = {
    "in_process": (dict(), InProcess),
    "streamed": (dict(max_device_memory=12000), Streamed),
    "devices": (dict(device="auto", devices=["cpu", "cpu"]), OnDevices),
}


@pytest.mark.parametrize("where", list(WHERE))
@pytest.mark.parametrize("weighted", [False, True])
def test_parts_are_numpys_ridge_over_the_same_split(data, where, weighted):
    X, y, w = data
    params, kind = WHERE[where]
    est = PartRidge(lam=0.5, **params)
    assert isinstance(fit_executor(est, placement_needs(est), X, y), kind)
    weights = w if weighted else None
    est.fit(X, y, sample_weight=weights)
    parts = split(X, 3, "kmeans", 0)
    assert [r.tolist() for r in est.part_rows_] == [p.tolist() for p in parts.parts]
    np.testing.assert_array_equal(est.centers_, parts.centers)
    for rows, coef in zip(parts.parts, est.coef_):
        np.testing.assert_allclose(
            coef, ridge(X[rows], y[rows], None if weights is None else weights[rows], 0.5),
            rtol=1e-10, atol=1e-10)
    assert est.n_rows_ == 600 and est.n_features_in_ == 4
    # Only the solver in the calling thread reports the parts as they end.
    assert est.reported_ == (where == "in_process")
    if where == "devices":
        assert est.devices_ == ("cpu", "cpu")
        assert sorted(set(est.part_device_.tolist())) == [0, 1]
    else:
        assert not hasattr(est, "part_device_")


def test_a_stream_fits_the_parts_in_groups_under_the_budget(data, monkeypatch):
    X, y, _ = data
    calls = []
    solve = RidgeSolver.solve

    def counted(self, backend, X, targets, weights, part_rows, part_ids, progress=None):
        calls.append((X.shape[0], list(part_ids)))
        return solve(self, backend, X, targets, weights, part_rows, part_ids, progress)

    monkeypatch.setattr(RidgeSolver, "solve", counted)
    sizes = split(X, 3, "kmeans", 0).sizes
    # Each part's rows take 8 * 5 bytes a row: a budget of the two largest parts.
    budget = int(np.sort(sizes)[-2:].sum()) * 40
    streamed = PartRidge(max_device_memory=budget).fit(X, y)
    assert sorted(sum((ids for _, ids in calls), [])) == [0, 1, 2] and len(calls) >= 2
    assert all(rows * 40 <= budget for rows, _ in calls)
    np.testing.assert_array_equal(streamed.coef_, PartRidge().fit(X, y).coef_)


@pytest.mark.parametrize("where", list(WHERE))
def test_settings_of_one_split_are_the_separate_fits(data, where, monkeypatch):
    X, y, w = data
    params, _ = WHERE[where]
    splits = []
    choose = pipeline_fit.fit_executor

    def counting(*args, **kwargs):
        executor = choose(*args, **kwargs)
        one_split = executor.split

        def counted(*a, **k):
            splits.append(1)
            return one_split(*a, **k)

        executor.split = counted
        return executor

    monkeypatch.setattr(pipeline_fit, "fit_executor", counting)
    base = PartRidge(**params)
    lams = [0.01, 1.0, 30.0]
    fits = fit_settings(base, [{"lam": lam} for lam in lams], X, y, sample_weight=w)
    assert len(splits) == 1
    for lam, fitted in zip(lams, fits):
        assert fitted is not base and fitted.lam == lam
        alone = clone(base).set_params(lam=lam).fit(X, y, sample_weight=w)
        np.testing.assert_array_equal(fitted.coef_, alone.coef_)
        np.testing.assert_array_equal(fitted.centers_, alone.centers_)
        assert fitted.n_features_in_ == 4
        np.testing.assert_array_equal(fitted.predict(X), alone.predict(X))
    assert not hasattr(base, "coef_")  # the estimator given is a template, left unfitted
    # Different λ, different models: the settings were solved, not copied.
    assert not np.array_equal(fits[0].coef_, fits[2].coef_)


@pytest.mark.parametrize("where", list(WHERE))
def test_a_solver_of_several_settings_runs_on_every_executor(data, where, monkeypatch):
    """The λ of one split solved by one solver (a fit per λ per part): its fits, split per
    setting, are the separate fits', bit for bit; the one-setting solver never runs."""
    X, y, w = data
    params, _ = WHERE[where]
    calls = []
    solve = RidgePathSolver.solve

    def counted(self, backend, X, targets, weights, part_rows, part_ids, progress=None):
        calls.append(list(part_ids))
        return solve(self, backend, X, targets, weights, part_rows, part_ids, progress)

    monkeypatch.setattr(RidgePathSolver, "solve", counted)
    monkeypatch.setattr(RidgeSolver, "solve", None)
    base = PartRidge(**params)
    lams = [0.01, 1.0, 30.0]
    fits = fit_settings(base, [{"lam": lam} for lam in lams], X, y, sample_weight=w,
                        jointly=True)
    assert sorted(sum(calls, [])) == [0, 1, 2]  # each part solved once, for every λ
    monkeypatch.undo()
    for lam, fitted in zip(lams, fits):
        alone = clone(base).set_params(lam=lam).fit(X, y, sample_weight=w)
        np.testing.assert_array_equal(fitted.coef_, alone.coef_)
        np.testing.assert_array_equal(fitted.centers_, alone.centers_)
        np.testing.assert_array_equal(fitted.predict(X), alone.predict(X))
        assert not fitted.reported_
    if where == "devices":
        np.testing.assert_array_equal(fits[0].part_device_, fits[2].part_device_)


def test_a_split_fits_some_parts_alone(data):
    """Split.fit(parts=...): those parts' models, as the whole fit has them."""
    from gpuml.pipeline.fit import Split

    X, y, _ = data
    est = PartRidge(lam=0.5)
    whole = clone(est).fit(X, y)
    some = Split([est], X, y).fit([est], parts=[0, 2])[0]
    np.testing.assert_array_equal(some.coef_, whole.coef_[[0, 2]])
    np.testing.assert_array_equal(some.centers_, whole.centers_[[0, 2]])
    assert [r.tolist() for r in some.part_rows_] == [whole.part_rows_[0].tolist(),
                                                     whole.part_rows_[2].tolist()]


def test_a_layered_fit_runs_in_process(data):
    X, y, _ = data
    est = PartRidge(layered=True).fit(X, y)
    np.testing.assert_allclose(est.coef_[0], ridge(X, y, None, 1.0), rtol=1e-10, atol=1e-10)
    assert len(est.part_rows_) == 1 and est.reported_


def test_settings_vary_the_solve_only(data):
    X, y, _ = data
    with pytest.raises(ValueError, match=r"solve \(lam\).* not n_partitions"):
        fit_settings(PartRidge(), [{"lam": 1.0}, {"n_partitions": 2}], X, y)
    with pytest.raises(ValueError, match="at least one setting"):
        fit_settings(PartRidge(), [], X, y)
