"""float32 in, float32 out: decision_function and predict_proba of the SVM classifiers.

CPU: the values are computed with float64 accumulation and returned in the input's
float dtype, so float32 output equals the float64 output rounded to float32. GPU: the
kernel values of float32 rows are computed in float32 (summed in float64); the CPU
result is the oracle.
"""

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification

from gpuml import AsyGCDSVC, CASVMClassifier
from gpuml._backend import cuda_available
from gpuml.estimators._svm import value_dtype

pytestmark = pytest.mark.filterwarnings("ignore::gpuml.PartitionWarning")


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(900, 6, n_classes=3, n_informative=4, random_state=0)
    return X, y


def _estimators(device="cpu"):
    return [CASVMClassifier(n_partitions=2, device=device, random_state=0),
            CASVMClassifier(n_partitions=1, decision_function_shape="ovo", device=device),
            AsyGCDSVC(device=device, random_state=0),
            AsyGCDSVC(decision_function_shape="ovo", device=device, random_state=0)]


@pytest.mark.parametrize("make", range(4))
def test_float32_in_float32_out_cpu(data, make):
    X, y = data
    est = _estimators()[make].fit(X, y)
    d64 = est.decision_function(X)
    d32 = est.decision_function(X.astype(np.float32))
    assert d64.dtype == np.float64 and d32.dtype == np.float32
    # float64 accumulation: the float32 rows' values agree with the float64 rows' to float32
    # rounding (of the inputs and the output).
    np.testing.assert_allclose(d32, d64, rtol=1e-5, atol=1e-5)
    # predict keeps the labels' dtype, as SVC; the labels agree.
    assert est.predict(X.astype(np.float32)).dtype == y.dtype
    np.testing.assert_array_equal(est.predict(X.astype(np.float32)), est.predict(X))


def test_float32_fit_float32_decision_binary(data):
    X, y = data
    Xb, yb = X[y < 2].astype(np.float32), y[y < 2]
    for est in (CASVMClassifier(n_partitions=2, device="cpu", random_state=0),
                AsyGCDSVC(device="cpu", random_state=0)):
        d = est.fit(Xb, yb).decision_function(Xb)
        assert d.dtype == np.float32 and d.shape == (len(yb),)
        assert est.score(Xb, yb) > 0.8


def test_predict_proba_dtype(data):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        est = CASVMClassifier(n_partitions=1, probability=True, random_state=0,
                              device="cpu").fit(X, y)
    p64 = est.predict_proba(X)
    p32 = est.predict_proba(X.astype(np.float32))
    assert p64.dtype == np.float64 and p32.dtype == np.float32
    np.testing.assert_allclose(p32, p64, atol=1e-6)


def test_value_dtype_rule():
    import pandas as pd
    import scipy.sparse as sp

    X = np.ones((2, 2), dtype=np.float32)
    assert value_dtype(X) == np.float32
    assert value_dtype(sp.csr_matrix(X)) == np.float32
    assert value_dtype(pd.DataFrame(X)) == np.float32
    assert value_dtype(pd.DataFrame({"a": [1.0, 2.0], "b": np.float32([1, 2])})) == np.float64
    assert value_dtype(X.astype(np.float64)) == np.float64
    assert value_dtype(X.astype(np.int32)) == np.float64
    assert value_dtype([[1.0, 2.0]]) == np.float64


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("make", range(4))
def test_float32_on_gpu_matches_cpu_oracle(data, make):
    """GPU: float32 rows computed in float32 with float64 accumulation, against the CPU."""
    import cupy

    X, y = data
    est = _estimators()[make].fit(X, y)
    expected = est.decision_function(X.astype(np.float32))
    est.set_params(device="cuda")
    got = est.decision_function(cupy.asarray(X.astype(np.float32)))
    assert got.dtype == cupy.float32
    np.testing.assert_allclose(cupy.asnumpy(got), expected, atol=1e-4, rtol=1e-4)
