"""Probabilities the way scikit-learn recommends: CalibratedClassifierCV around each classifier.

scikit-learn deprecated ``SVC(probability=True)`` (1.9, removed in 1.11) for
``CalibratedClassifierCV(SVC(), ensemble=False)``. The same wrapper works around
every gpuml classifier; the oracle is the same wrapper around SVC on the same folds.
"""

import numpy as np
import pytest
from sklearn.calibration import CalibratedClassifierCV
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.metrics import brier_score_loss, log_loss
from sklearn.model_selection import StratifiedKFold, train_test_split
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from gpuml import AsyGCDSVC, CASVMClassifier


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    scaler = StandardScaler().fit(Xtr)
    return scaler.transform(Xtr), scaler.transform(Xte), ytr, yte


def calibrated(estimator, method="sigmoid"):
    folds = StratifiedKFold(5, shuffle=True, random_state=0)
    return CalibratedClassifierCV(estimator, method=method, cv=folds, ensemble=False)


def test_one_part_casvm_gives_svc_probabilities(cancer):
    Xtr, Xte, ytr, _ = cancer
    ours = calibrated(CASVMClassifier(n_partitions=1, device="cpu")).fit(Xtr, ytr)
    ref = calibrated(SVC()).fit(Xtr, ytr)
    # The decision values agree to SMO's tolerance, and so do the fitted sigmoids.
    np.testing.assert_allclose(ours.predict_proba(Xte), ref.predict_proba(Xte), atol=2e-3)


def test_one_part_casvm_multiclass_probabilities(cancer):
    X, y = load_digits(return_X_y=True)
    X = X[:600] / 16.0
    y = y[:600]
    ours = calibrated(CASVMClassifier(n_partitions=1, device="cpu")).fit(X[:400], y[:400])
    ref = calibrated(SVC()).fit(X[:400], y[:400])
    np.testing.assert_allclose(ours.predict_proba(X[400:]), ref.predict_proba(X[400:]),
                               atol=5e-3)


@pytest.mark.parametrize("estimator", [
    CASVMClassifier(n_partitions=4, partition="fcfs", random_state=0, device="cpu"),
    AsyGCDSVC(n_workers=1, random_state=0, device="cpu"),
], ids=["casvm-4-parts", "asygcd"])
@pytest.mark.parametrize("method", ["sigmoid", "isotonic"])
def test_calibrated_partitioned_and_bias_free_classifiers(cancer, estimator, method):
    Xtr, Xte, ytr, yte = cancer
    ours = calibrated(estimator, method).fit(Xtr, ytr)
    ref = calibrated(SVC(), method).fit(Xtr, ytr)
    proba = ours.predict_proba(Xte)
    assert proba.shape == (len(yte), 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    # Calibrated about as well as SVC's (P parts and no bias cost little here).
    ref_proba = ref.predict_proba(Xte)
    assert brier_score_loss(yte, proba[:, 1]) <= brier_score_loss(yte, ref_proba[:, 1]) + 0.01
    if method == "sigmoid":  # isotonic gives 0 and 1, where log loss says little
        assert log_loss(yte, proba) <= log_loss(yte, ref_proba) + 0.05
