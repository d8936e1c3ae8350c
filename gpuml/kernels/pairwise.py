r"""Kernel functions as blocked GEMM, on any array namespace (NumPy or CuPy), dense or CSR.

The kernels of You 2020, Table 2.1 (with scikit-learn's parameter names):

=============  ====================================================
linear         :math:`K(x, y) = x^\top y`
poly           :math:`K(x, y) = (\gamma\, x^\top y + r)^d`
rbf            :math:`K(x, y) = \exp(-\gamma \lVert x - y\rVert^2)`
sigmoid        :math:`K(x, y) = \tanh(\gamma\, x^\top y + r)`
precomputed    ``X`` already holds kernel values
=============  ====================================================

Kernel values come from one GEMM ``X @ Y.T`` (per row block in
:meth:`Kernel.dot`) followed by the kernel's elementwise map in place. For
rbf the squared distance is :math:`\lVert x\rVert^2 + \lVert y\rVert^2 - 2 x^\top y`, clamped at 0.
Memory is bounded two ways:

* ``block_bytes`` bounds the temporary block of :meth:`Kernel.dot` (which
  never holds the whole kernel matrix), and
* ``max_bytes`` bounds the *output* of :func:`kernel_matrix`: asking for a
  kernel matrix larger than that raises ``MemoryError`` before allocating,
  so a 1M x 1M kernel is never materialised by accident.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from .._backend import namespace_of

KERNELS = ("linear", "poly", "rbf", "sigmoid", "precomputed")

#: Default bound on a materialised kernel matrix (4 GiB).
MAX_BYTES = 4 << 30
#: Default bound on the temporary block of a blocked kernel product (64 MiB).
BLOCK_BYTES = 64 << 20


def _is_sparse(X) -> bool:
    return hasattr(X, "tocsr")


def squared_norms(X):
    """Row-wise squared Euclidean norms, dense or CSR, as a 1-D array on X's device."""
    xp = namespace_of(X)
    if _is_sparse(X):
        return xp.asarray(X.multiply(X).sum(axis=1)).ravel().astype(X.dtype, copy=False)
    return xp.einsum("ij,ij->i", X, X)


def gram(X, Y):
    """``X @ Y.T`` as a dense array, for any mix of dense and CSR."""
    if _is_sparse(X):
        if _is_sparse(Y) and Y.shape[0] * Y.shape[1] * Y.dtype.itemsize <= BLOCK_BYTES:
            # sparse x dense writes the dense result directly: much faster than sparse x sparse
            Y = Y.toarray()
        G = X @ Y.T
        return G.toarray() if _is_sparse(G) else namespace_of(X).asarray(G)
    if _is_sparse(Y):
        return namespace_of(X).asarray((Y @ X.T).T)
    return X @ Y.T


#: Bytes of the float64 copy of a float32 block's rows that :func:`widened_dot` makes at a time:
#: small enough to stay in cache between the copy and the product.
WIDEN_BLOCK_BYTES = 1 << 20


def widened_dot(K, coef):
    """``K @ coef`` for float32 ``K`` and float64 ``coef``: float64 accumulation, as NumPy's
    mixed product, without its float64 copy of all of ``K`` (a pass through main memory
    that cost several times the product itself): the copy is made a few rows at a time.
    Any other dtypes, and CuPy, take ``K @ coef`` directly.

    >>> import numpy as np
    >>> K = np.arange(6, dtype=np.float32).reshape(3, 2)
    >>> widened_dot(K, np.array([0.5, 1.0])).tolist()
    [1.0, 4.0, 7.0]
    """
    if (namespace_of(K) is not np or K.dtype != np.float32 or coef.dtype != np.float64
            or K.ndim != 2):
        return K @ coef
    rows = max(1, WIDEN_BLOCK_BYTES // max(1, 8 * K.shape[1]))
    if rows >= K.shape[0]:
        return K @ coef
    out = np.empty((K.shape[0],) + coef.shape[1:], dtype=np.float64)
    wide = np.empty((rows, K.shape[1]), dtype=np.float64)
    for start in range(0, K.shape[0], rows):
        stop = min(start + rows, K.shape[0])
        block = wide[:stop - start]
        block[...] = K[start:stop]
        np.matmul(block, coef, out=out[start:stop])
    return out


def entry_variance(X) -> float:
    """The variance of all entries of ``X``, the same to the bit whether ``X`` is dense or CSR.

    Two passes over the non-zero entries in row-major order (a dense matrix's ``X[X != 0]``
    is a canonical CSR matrix's data), the zeros adding only their count: the mean, then
    the squared deviations. A sparse and a dense fit of the same data then get the same
    ``gamma="scale"`` and, on the same kernel values, take the same steps
    (``X.var()`` and ``E[x^2] - E[x]^2`` differ in the last bit, which moves an SMO
    working-set choice where two candidates tie, as on pixel data).

    >>> import numpy as np, scipy.sparse as sp
    >>> X = np.array([[0.0, 1.0], [3.0, 0.0]])
    >>> entry_variance(X), entry_variance(sp.csr_matrix(X))
    (1.5, 1.5)
    """
    size = X.shape[0] * X.shape[1]
    if size == 0:
        return 0.0
    if _is_sparse(X):
        X = X.tocsr()
        if not X.has_canonical_format:
            X = X.copy()
            X.sum_duplicates()
        values = X.data[X.data != 0]
    else:
        values = X[X != 0]
    mean = float(values.sum()) / size
    deviations = values - mean
    return (float((deviations * deviations).sum()) + (size - values.size) * mean * mean) / size


def resolve_gamma(gamma, X) -> float:
    """The numeric gamma: ``"scale"`` is 1 / (n_features * variance of X's entries)
    (:func:`entry_variance`; scikit-learn's ``X.var()``), ``"auto"`` 1 / n_features.

    ``None`` means ``"auto"`` (scikit-learn's pairwise functions default). ``X`` may also be
    a summary with ``shape`` and ``var()`` (a Dask fit's chunks).
    """
    n_features = X.shape[1]
    if gamma is None or (isinstance(gamma, str) and gamma == "auto"):
        return 1.0 / n_features
    if isinstance(gamma, str):
        if gamma != "scale":
            raise ValueError(f"gamma must be 'scale', 'auto' or a positive float, got {gamma!r}")
        var = (entry_variance(X) if _is_sparse(X) or hasattr(X, "__array_namespace__")
               else float(X.var()))
        return 1.0 / (n_features * var) if var > 0 else 1.0
    if not isinstance(gamma, numbers.Real) or not gamma > 0:
        raise ValueError(f"gamma must be 'scale', 'auto' or a positive float, got {gamma!r}")
    return float(gamma)


@dataclass(frozen=True)
class Kernel:
    """A kernel function with its parameters resolved to numbers.

    Build one with :func:`make_kernel`; call it on any pair of matrices.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.kernels.pairwise import Kernel
    >>> k = Kernel("rbf", gamma=0.5)
    >>> X = np.array([[0.0, 0.0], [1.0, 0.0]])
    >>> np.round(k.matrix(X), 4)
    array([[1.    , 0.6065],
           [0.6065, 1.    ]])
    """

    name: str = "rbf"
    gamma: float = 1.0
    degree: int = 3
    coef0: float = 0.0

    def __post_init__(self):
        if self.name not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.name!r}")

    def _from_gram(self, G):
        """The elementwise map from inner products to kernel values, in place (not rbf)."""
        xp = namespace_of(G)
        if self.name == "linear":
            return G
        G *= self.gamma
        G += self.coef0
        if self.name == "poly":
            return xp.power(G, self.degree, out=G)
        return xp.tanh(G, out=G)

    def _block(self, Xb, Y, y_norms):
        """Kernel values ``K(Xb, Y)`` for one row block (one GEMM plus a map)."""
        if self.name == "rbf":
            from .vexp import rbf_by_arrays, rbf_in_place

            G, x_norms = gram(Xb, Y), squared_norms(Xb)
            y_norms = squared_norms(Y) if y_norms is None else y_norms
            # on the host one compiled pass (the vectorised exp), else the same by arrays
            if rbf_in_place(G, self.gamma, -2.0, x_norms, y_norms):
                return G
            return rbf_by_arrays(gram_to_sq_distances(G, x_norms, y_norms), self.gamma)
        return self._from_gram(gram(Xb, Y))

    def blocks(self, X, Y, block_bytes: int = BLOCK_BYTES):
        """Yield ``(start, stop, K(X[start:stop], Y))`` over row blocks of ``X``, each block
        at most about ``block_bytes``: for products with the kernel values that need more
        than :meth:`dot` (a precomputed kernel yields the rows of ``X``)."""
        if self.name == "precomputed":
            rows = max(1, block_bytes // max(1, X.shape[1] * X.dtype.itemsize))
            for start in range(0, X.shape[0], rows):
                stop = min(start + rows, X.shape[0])
                yield start, stop, X[start:stop]
            return
        if X.shape[1] != Y.shape[1]:
            raise ValueError(f"X has {X.shape[1]} features but Y has {Y.shape[1]}")
        y_norms = squared_norms(Y) if self.name == "rbf" else None
        rows = max(1, block_bytes // max(1, Y.shape[0] * X.dtype.itemsize))
        for start in range(0, X.shape[0], rows):
            stop = min(start + rows, X.shape[0])
            yield start, stop, self._block(X[start:stop], Y, y_norms)

    def matrix(self, X, Y=None, *, max_bytes: int = MAX_BYTES):
        """The kernel matrix ``K(X, Y)`` (``Y=X`` by default), at most ``max_bytes`` large."""
        Y = X if Y is None else Y
        if self.name == "precomputed":
            return X
        n, m = X.shape[0], Y.shape[0]
        nbytes = n * m * np.dtype(X.dtype).itemsize
        if nbytes > max_bytes:
            raise MemoryError(
                f"the {n} x {m} kernel matrix would take {nbytes / 2**30:.1f} GiB, more than "
                f"max_bytes={max_bytes / 2**30:.1f} GiB; use kernel_dot for products with it, "
                "or raise max_bytes if you really want it in memory"
            )
        if X.shape[1] != Y.shape[1]:
            raise ValueError(f"X has {X.shape[1]} features but Y has {Y.shape[1]}")
        # The output is the only n x m allocation: one GEMM into it, the map in place.
        return self._block(X, Y, squared_norms(Y) if self.name == "rbf" else None)

    def dot(self, X, Y, coef, *, block_bytes: int = BLOCK_BYTES):
        """``K(X, Y) @ coef`` without forming ``K``: memory bounded by ``block_bytes``."""
        xp = namespace_of(X)
        coef = xp.asarray(coef)
        out = xp.empty((X.shape[0],) + coef.shape[1:], dtype=xp.result_type(X.dtype, coef.dtype))
        for start, stop, block in self.blocks(X, Y, block_bytes):
            out[start:stop] = widened_dot(block, coef)
        return out

    def diag(self, X):
        """The diagonal ``K(x_i, x_i)`` in O(n d) (O(n) for precomputed)."""
        xp = namespace_of(X)
        if self.name == "precomputed":
            return xp.asarray(X.diagonal()).copy()
        if self.name == "rbf":
            return xp.ones(X.shape[0], dtype=X.dtype)
        return self._from_gram(squared_norms(X))

    def rows(self, X, idx, Y=None):
        """Rows ``K(X[idx], Y)`` (``Y=X`` by default): what an SMO or GCD step needs."""
        Y = X if Y is None else Y
        if self.name == "precomputed":
            return X[idx]
        return self.matrix(X[idx], Y)


def make_kernel(kernel="rbf", gamma="scale", degree=3, coef0=0.0, X=None) -> Kernel:
    """A :class:`Kernel` with ``gamma`` resolved against the training data ``X``."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel in ("linear", "precomputed"):
        return Kernel(kernel, 1.0, int(degree), float(coef0))
    return Kernel(kernel, resolve_gamma(gamma, X), int(degree), float(coef0))


def kernel_matrix(X, Y=None, kernel="rbf", *, gamma=None, degree=3, coef0=1.0,
                  max_bytes: int = MAX_BYTES):
    """Kernel matrix ``K(X, Y)`` with the defaults of ``sklearn.metrics.pairwise``.

    Parameters
    ----------
    X : array of shape (n, d), NumPy/CuPy, dense or CSR
    Y : array of shape (m, d), default X
    kernel : {"linear", "poly", "rbf", "sigmoid", "precomputed"}
    gamma : float, "scale", "auto" or None (= 1 / d, as scikit-learn)
    degree, coef0 : polynomial degree and offset (scikit-learn's defaults 3 and 1)
    max_bytes : refuse (``MemoryError``) to build a larger output

    Returns
    -------
    K : dense array of shape (n, m) in X's dtype and namespace

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.metrics.pairwise import rbf_kernel
    >>> from gpuml.kernels.pairwise import kernel_matrix
    >>> X = np.random.default_rng(0).normal(size=(5, 3))
    >>> bool(np.allclose(kernel_matrix(X, gamma=0.3), rbf_kernel(X, gamma=0.3)))
    True
    """
    from .._validation import as_float_matrix

    X = as_float_matrix(X)
    Y = X if Y is None else as_float_matrix(Y, "Y")
    return make_kernel(kernel, gamma, degree, coef0, X).matrix(X, Y, max_bytes=max_bytes)


def shifted_sq_distances(X, Y, y_norms=None):
    """``||y||^2 - 2 x.y``: the squared distance less the row's own ``||x||^2``.

    Along a row it orders the columns exactly as the squared distance does,
    one pass cheaper; nearest-centre searches compare within rows only.
    """
    D = gram(X, Y)
    D *= -2.0
    D += (squared_norms(Y) if y_norms is None else y_norms)[None, :]
    return D


def sq_distances(X, Y, y_norms=None):
    """Squared Euclidean distances ``||x||^2 + ||y||^2 - 2 x.y`` (one GEMM), clamped at 0."""
    return gram_to_sq_distances(gram(X, Y), squared_norms(X),
                                squared_norms(Y) if y_norms is None else y_norms)


def gram_to_sq_distances(G, x_norms, y_norms):
    """:func:`sq_distances` from the inner products ``G = X @ Y.T`` and both sides' squared
    norms, in place in ``G``: ``(-2 x.y + ||y||^2) + ||x||^2``, clamped at 0."""
    G *= -2.0
    G += y_norms[None, :]
    G += x_norms[:, None]
    return namespace_of(G).maximum(G, 0.0, out=G)


#: Kernels of ``sklearn.kernel_ridge.KernelRidge`` that gpuml computes through
#: scikit-learn's ``pairwise_kernels`` on the host (no GEMM form to put on a GPU).
HOST_KERNELS = ("laplacian", "chi2", "additive_chi2", "cosine")


@dataclass
class PairwiseKernel:
    """A kernel that ``sklearn.metrics.pairwise.pairwise_kernels`` computes, on the host.

    KernelRidge's kernels beyond :data:`KERNELS` (laplacian, chi2,
    additive_chi2, cosine) and callables, with KernelRidge's parameters:
    ``gamma``, ``degree`` and ``coef0`` for a named kernel (``gamma=None``
    is 1 / n_features), ``params`` for a callable. The interface is
    :class:`Kernel`'s (``matrix``, ``dot``), NumPy only.
    """

    metric: object
    gamma: float | None = None
    degree: int = 3
    coef0: float = 1.0
    params: dict | None = None
    name = "pairwise"

    def _kwargs(self):
        if callable(self.metric):
            return dict(self.params or {})
        return {"gamma": self.gamma, "degree": self.degree, "coef0": self.coef0}

    def matrix(self, X, Y=None, *, max_bytes: int = MAX_BYTES):
        """``K(X, Y)`` as a dense float64 host array (``Y=X`` by default)."""
        from sklearn.metrics.pairwise import pairwise_kernels

        n, m = X.shape[0], (X if Y is None else Y).shape[0]
        if n * m * 8 > max_bytes:
            raise MemoryError(f"the {n} x {m} kernel matrix would take more than "
                              f"max_bytes={max_bytes / 2**30:.1f} GiB")
        K = pairwise_kernels(X, Y, metric=self.metric, filter_params=True, **self._kwargs())
        return np.ascontiguousarray(K, dtype=np.float64)

    def dot(self, X, Y, coef, *, block_bytes: int = BLOCK_BYTES):
        """``K(X, Y) @ coef`` by row blocks of at most ``block_bytes``."""
        coef = np.asarray(coef)
        rows = max(1, block_bytes // max(1, Y.shape[0] * 8))
        out = np.empty((X.shape[0],) + coef.shape[1:], dtype=np.float64)
        for start in range(0, X.shape[0], rows):
            stop = min(start + rows, X.shape[0])
            out[start:stop] = self.matrix(X[start:stop], Y, max_bytes=1 << 62) @ coef
        return out
