"""Each row's values under its own part's model, every part in one compiled loop: the
nearest-centre rule of CA-SVM's prediction (You 2020, Alg 5, step 3) on the host, and
the blend of ``combine="neighbors"`` (each row's weighted sum over the parts it weighs).

A model of thousands of parts routes a block of rows to nearly as many parts, a few rows
each; a Python loop over them (gather the rows, a GEMM, the rbf map, the product with
the coefficients, a scatter) costs tens of microseconds a part in the interpreter, more
than the arithmetic. :func:`rbf_part_values` runs the same steps for every part in one
numba function (``nogil``): the same GEMMs (numba's ``np.dot`` calls the BLAS NumPy
uses), the same compiled rbf pass (:func:`gpuml.kernels.vexp._rbf_rows_f32`), the same
float64 product with the coefficients, so its values equal the Python loop's to
rounding (the rows' squared norms and the gathered copies may round in other bits).
Where numba has not compiled it yet (:mod:`.._jit`), the caller takes its Python loop.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import _jit
from .._threads import blas_controller
from ..vexp import _rbf_rows_f32, _rbf_rows_f64


@njit(nogil=True, cache=True)
def _pair_products(K, a, coef, class_offsets, pair_of, p, n_pairs):
    """``K @ coef`` of part ``p`` (its vectors from ``a`` on in the sorted order), float64:
    one product (``pair_of`` empty: ``coef`` a column per pair), or one per class of the
    part's vectors with its columns in that class's pairs, added in class order (as
    :meth:`gpuml.estimators._svm.PairCoef.times`)."""
    if pair_of.shape[0] == 0:
        return np.dot(K.astype(np.float64), coef[a:a + K.shape[1]])
    values = np.zeros((K.shape[0], n_pairs))
    for c in range(pair_of.shape[0]):
        s, e = class_offsets[p, c], class_offsets[p, c + 1]
        if e == s:
            continue
        block = np.dot(K[:, s - a:e - a].astype(np.float64), coef[s:e])
        for i in range(K.shape[0]):
            for j in range(pair_of.shape[1]):
                values[i, pair_of[c, j]] += block[i, j]
    return values


@njit(nogil=True, cache=True)
def _rbf_part_values(X, x_norms, rows, row_offsets, weights, add, vectors, offsets, v_norms,
                     coef, class_offsets, pair_of, intercept, gamma, single, out):
    n_pairs = intercept.shape[1]
    for p in range(row_offsets.shape[0] - 1):
        first = row_offsets[p]
        mine = rows[first:row_offsets[p + 1]]
        if mine.shape[0] == 0:
            continue
        a, b = offsets[p], offsets[p + 1]
        if b == a:  # no support vector: the part's intercepts
            for i in range(mine.shape[0]):
                for q in range(n_pairs):
                    if add:
                        out[mine[i], q] += weights[first + i] * intercept[p, q]
                    else:
                        out[mine[i], q] = intercept[p, q]
            continue
        K = np.dot(X[mine], vectors[a:b].T)
        if single:  # float32 rows
            _rbf_rows_f32(K, -2.0, x_norms[mine], v_norms[a:b], gamma)
        else:
            _rbf_rows_f64(K, -2.0, x_norms[mine], v_norms[a:b], gamma)
        values = _pair_products(K, a, coef, class_offsets, pair_of, p, n_pairs)
        for i in range(mine.shape[0]):
            for q in range(n_pairs):
                if add:
                    out[mine[i], q] += weights[first + i] * (values[i, q] + intercept[p, q])
                else:
                    out[mine[i], q] = values[i, q] + intercept[p, q]


def rbf_part_values(X, rows, row_offsets, vectors, offsets, v_norms, coef, intercept, gamma,
                    out, weights=None, class_offsets=None, pair_of=None) -> bool:
    """``out[i] = K(X[i], V_p) @ coef_p + intercept[p]`` for the rows ``i`` of each part
    ``p``, ``rows[row_offsets[p]:row_offsets[p + 1]]`` (:func:`gpuml.routing.part_runs`),
    with the rbf kernel of ``gamma``; ``V_p = vectors[offsets[p]:offsets[p + 1]]`` (the
    support vectors sorted by part, ``v_norms`` their squared norms) and ``coef_p`` the
    same rows of ``coef`` (float64, a column per pair).

    With ``pair_of`` (``(n_classes, n_classes - 1)`` ints, :func:`gpuml.estimators._svm.
    pair_table`) ``coef`` holds a column per other class instead (LIBSVM's packed
    layout, a row per vector): a vector of class ``c`` takes part in the pairs
    ``pair_of[c]`` only, and each part's vectors of class ``c`` are the sorted vectors
    ``class_offsets[p, c]:class_offsets[p, c + 1]`` (``(n_parts, n_classes + 1)``): one
    product per class and part, ``n_classes / 2`` times less work than a column per pair.

    With ``weights`` (float64, one per entry of ``rows``) a row may appear in several
    parts' runs, and each adds its weighted values instead, in part order:
    ``out[i] += w * (K(X[i], V_p) @ coef_p + intercept[p])`` (the blend).

    Host arrays: ``X`` and ``vectors`` C-contiguous of one float dtype, ``out``
    float64 ``(n, n_pairs)``. Returns False, writing nothing, while the compiled loop is
    not loaded yet (the caller computes the values its own way). BLAS runs on one thread
    meanwhile.

    >>> X = np.array([[0.0, 0.0], [1.0, 0.0]])
    >>> vectors = np.array([[0.0, 0.0], [1.0, 0.0]])
    >>> out = np.zeros((2, 1))
    >>> done = rbf_part_values(X, np.array([1, 0]), np.array([0, 1, 2]), vectors,
    ...                        np.array([0, 1, 2]), np.array([0.0, 1.0]),
    ...                        np.array([[1.0], [2.0]]), np.array([[0.0], [0.5]]), 1.0, out)
    >>> not done or np.allclose(out[:, 0], [2 * np.exp(-1) + 0.5, np.exp(-1)])
    True
    """
    add = weights is not None
    none = np.zeros((0, 0), dtype=np.int64)
    args = (X, np.ascontiguousarray(np.einsum("ij,ij->i", X, X)),
            np.asarray(rows, dtype=np.int64), np.asarray(row_offsets, dtype=np.int64),
            np.ascontiguousarray(weights if add else np.zeros(0), dtype=np.float64), add,
            vectors, np.asarray(offsets, dtype=np.int64),
            np.ascontiguousarray(v_norms, dtype=X.dtype), coef,
            none if pair_of is None else np.asarray(class_offsets, dtype=np.int64),
            none if pair_of is None else np.asarray(pair_of, dtype=np.int64), intercept,
            float(gamma),
            X.dtype == np.float32, out)
    if not _jit.ready(_rbf_part_values, *args, from_cache=True):
        return False
    # numba's np.dot calls the OpenBLAS that SciPy loads, a second library beside NumPy's
    # with threads of its own: for these small products they only cost (and, left
    # spinning, slow the products that follow), so it runs on one thread
    with blas_controller().limit(limits=1, user_api="blas"):
        _rbf_part_values(*args)
    return True
