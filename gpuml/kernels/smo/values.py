"""The kernel values an SMO problem reads, in one precision: single rows and whole matrices.

One problem's values (:class:`Values`) come from its rows in one of two precisions:

* **float32 from centred rows** (rbf, where :func:`sgemm_rows` applies: enough rows, or a
  problem computing its rows on demand, and a small rounding bound), as LIBSVM caches its
  values (``Qfloat``): half the memory and traffic of float64;
* **the rows' own dtype** otherwise (every other kernel, small problems, a large gamma).

Either way a value is the kernel's map of an inner product computed by BLAS: a single
row (what a working set needs, :meth:`Values.products`) by one matrix-vector product, a
block of rows (the rest of a matrix, or a whole float32 matrix: :meth:`Values.fill_lower`)
by matrix products over its lower triangle, mirrored so that the matrix is exactly
symmetric; a whole matrix in the rows' dtype is :meth:`gpuml.kernels.pairwise.Kernel.matrix`'s.
The orders of summation differ in the last bit only, and the solver never mixes them
within one value. In rows and blocks the diagonal is :meth:`gpuml.kernels.pairwise.Kernel.diag`
exactly (1 for rbf), the float64 ``QD`` the solver reads, so that a row and the diagonal
agree to the bit.
"""

from __future__ import annotations

import types

import numpy as np
from numba import njit

from .._threads import blas_controller, threads_for
from ..pairwise import gram, squared_norms
from ..vexp import exp_nonpositive_f32, exp_nonpositive_f64, rbf_exponent
from .loop import _FILL, _NEED, _run

#: Largest bound on the float32 rounding error of an rbf exponent that
#: :func:`sgemm_matrix` accepts: 10x below SMO's default tolerance for the
#: worst pair (accuracy and speed against float64: ``bench/bench_casvm_sgemm.py``,
#: bench/results/cpu-2core/casvm_sgemm.md).
SGEMM_EXPONENT_ERROR = 1e-4

#: Smaller problems are computed in the data's dtype: their products are cheap,
#: and small problems then solve exactly as before, as the GPU
#: solver does and as with a precomputed kernel matrix.
SGEMM_MIN_ROWS = 2048
#: ... except the parts of a partitioned fit (``smo_solve_batch(partitioned=True)``): the
#: default CA-SVM parts hold just under 2,048 rows, and their matrices in float32 make a
#: float64 fit faster at the same accuracy (bench/results/cpu-2core/casvm_sgemm.md).
PART_SGEMM_MIN_ROWS = 1024

#: Bytes of the products of one block of :meth:`Values.fill_lower` (a few rows against
#: all before them): small enough to stay in the core's cache while they are mapped.
BLOCK_BYTES = 4 << 20
#: A matrix made alone takes a thread per this many values (:func:`matrix_threads`).
MATRIX_THREAD_MIN_VALUES = 2048 ** 2


def _centred(X):
    dense = X.toarray() if hasattr(X, "toarray") else np.asarray(X)
    return dense - dense.mean(axis=0)


def sgemm_rows(kernel, X, min_rows=None):
    """The centred rows of ``X`` when its rbf values are float32 (:func:`sgemm_matrix`), else None.

    rbf, at least ``min_rows`` rows (None: :data:`SGEMM_MIN_ROWS`), no more features than rows
    (a sparse part is densified: the dense copy is then no larger than the
    matrix) and a rounding bound ``2 gamma max ||x - mean||^2 eps32`` at most
    :data:`SGEMM_EXPONENT_ERROR` (a large gamma falls back to float64). It
    depends on the shape and the values only, never on the format.
    """
    n, d = X.shape
    if kernel.name != "rbf" or n < (SGEMM_MIN_ROWS if min_rows is None else min_rows) or d > n:
        return None
    centred = _centred(X)
    radius = float(np.einsum("ij,ij->i", centred, centred).max())
    if 2.0 * kernel.gamma * radius * np.finfo(np.float32).eps > SGEMM_EXPONENT_ERROR:
        return None
    return centred


def sgemm_applies(kernel, X, min_rows=None) -> bool:
    """Whether the rbf values of ``X`` are float32 from centred rows (see :func:`sgemm_rows`)."""
    return sgemm_rows(kernel, X, min_rows) is not None


def sgemm_matrix(kernel, X, *, max_bytes, centred=None, threads=1):
    """``K(X, X)`` for rbf in float32, as LIBSVM caches its values (``Qfloat``).

    Half the memory of float64, and faster: matrix products over the lower triangle of
    the rows' products and one compiled pass per block that turns them into kernel
    values (:meth:`Values.fill_lower`; building the matrix is most of a CA-SVM part's
    fit: ``bench/bench_casvm_sgemm.py``, bench/results/cpu-2core/casvm_sgemm.md). The
    rows are centred first (``centred``: :func:`sgemm_rows`' result, when the caller has
    it), which leaves distances unchanged and removes the cancellation of
    ``||x||^2 + ||y||^2 - 2 x.y`` for data far from the origin. The diagonal is its
    exact value 1 and the matrix exactly symmetric: SMO's incremental gradient reads
    rows and a fresh one columns, which must agree to the last bit for a warm start
    from a solution to take no step. The gradient and the dual variables stay in
    float64. Use where :func:`sgemm_applies`.
    """
    centred = _centred(X) if centred is None else centred
    n = centred.shape[0]
    if n * n * 4 > max_bytes:
        raise MemoryError(f"the {n} x {n} float32 kernel matrix would take "
                          f"{n * n * 4 / 2**30:.1f} GiB, more than max_bytes="
                          f"{max_bytes / 2**30:.1f} GiB")
    return Values(kernel, X, centred).matrix(threads)


def values_of(kernel, X, min_rows=None, alone_above=None):
    """The :class:`Values` of the rows ``X``: float32 from centred rows where
    :func:`sgemm_rows` applies (``min_rows`` as there), else in the rows' dtype. A problem
    of more than ``alone_above`` rows (one computing its rows on demand) takes float32
    values from any size, as LIBSVM's row cache keeps them: a row costs it a third less."""
    if alone_above is not None and X.shape[0] > alone_above:
        min_rows = 0
    return Values(kernel, X, sgemm_rows(kernel, X, min_rows))


class Values:
    """The kernel values of one problem's rows ``X`` (dense or CSR), in one precision:
    float32 from the centred rows ``centred`` (:func:`sgemm_rows`' result) when given,
    else in the rows' dtype. ``dtype`` is the values' type, ``diag`` the kernel's
    diagonal in it and ``QD`` its float64 copy.
    """

    def __init__(self, kernel, X, centred=None):
        self.kernel = kernel
        self.X = X
        self.from_centred = centred is not None
        if centred is not None:
            self.rows = np.ascontiguousarray(centred, dtype=np.float32)
        elif hasattr(X, "tocsr"):
            self.rows = X.tocsr()
        else:
            self.rows = np.ascontiguousarray(X)
        self.dtype = np.dtype(self.rows.dtype)
        self.rbf = kernel.name == "rbf"
        self.norms = (np.asarray(squared_norms(self.rows), dtype=self.dtype) if self.rbf
                      else None)
        self.diag = np.asarray(kernel.diag(self.rows), dtype=self.dtype)
        self.QD = self.diag.astype(np.float64)
        single = self.dtype == np.float32
        self._map = _rbf_map_f32 if single else _rbf_map_f64
        self._fill_row = _fill_row_f32 if single else _fill_row_f64
        self._fill_and_run = _fill_and_run_f32 if single else _fill_and_run_f64
        self._columns = self._products = None
        self._version = -1

    def _workspaces(self):
        """The workspaces of single rows, made at the first: a row's products as
        ``x_r @ rows.T`` with ``rows.T`` stored (features, rows), which BLAS sweeps a
        feature at a time over all rows, several times faster than a product per row
        when rows have few features."""
        n = self.rows.shape[0]
        if not hasattr(self.rows, "tocsr"):
            self._columns = np.ascontiguousarray(self.rows.T)
        self._products = np.empty(n, self.dtype)
        self._row = np.empty((1, n), self.dtype)
        self._arg = np.empty(n, self.dtype)
        self._scratch = np.empty(n, np.int32 if self.dtype == np.float32 else np.int64)

    @property
    def n_features(self) -> int:
        """Features per row that a product reads (stored entries for CSR)."""
        if hasattr(self.rows, "nnz"):
            return max(1, self.rows.nnz // max(1, self.rows.shape[0]))
        return self.rows.shape[1]

    def row(self, r, out, slot):
        """Row ``r`` over every column into ``out[slot]`` (one matrix-vector product)."""
        products = self.products(r)
        if self.rbf:
            self._map(products[None, :], self.norms[r:r + 1], self.norms, self.kernel.gamma,
                      out, slot, 0, -1, self._arg, self._scratch)
        else:
            out[slot] = products
        out[slot, r] = self.diag[r]

    def products(self, r):
        """Row ``r``'s inner products with every row (rbf), or its kernel values (the
        other kernels), in a workspace: what :meth:`fill_and_run` turns into a row."""
        if self._products is None:
            self._workspaces()
        products = self._dot(self.rows, self._columns, r, self.rows.shape[0])
        return products if self.rbf else self.kernel._from_gram(products)

    def fill(self, cache, slot_of, slot_row, r, slot):
        """Row ``r`` of :meth:`products` into ``cache[slot]`` (:func:`_fill_row`)."""
        self._fill_row(self._products, self.norms, self.kernel.gamma, self.diag, slot_row,
                       self._arg, self._scratch, cache, slot_of, r, slot)

    def fill_and_run(self, cache, slot_of, slot_time, slot_row, y, C, alpha, G, active, state,
                     tol, shrinking, masks):
        """The iteration (:func:`~.loop._run`) after the row ``state[_NEED]`` of
        :meth:`products` is put in the slot ``state[_FILL] - 1`` (when set), in one
        compiled call: its values, its diagonal, and its values at the rows in the slots
        before it taken from theirs, so that the rows agree to the bit."""
        if self._products is None:
            self._workspaces()
        return self._fill_and_run(self._products, self.norms, self.kernel.gamma, self.diag,
                                  slot_row, self._arg, self._scratch, y, C, self.QD, alpha, G,
                                  active, cache, slot_of, slot_time, state, tol, shrinking,
                                  masks)

    def active_row(self, r, active, version):
        """Row ``r`` over the columns ``active`` (the unshrunk variables), their rows
        gathered once per ``version`` of the active set; a view of a workspace."""
        if self._products is None:
            self._workspaces()
        if version != self._version:
            self._active = self.rows[active]
            self._active_columns = (None if self._columns is None
                                    else np.ascontiguousarray(self._columns[:, active]))
            self._active_norms = None if self.norms is None else self.norms[active]
            self._version = version
        n = len(active)
        products = self._dot(self._active, self._active_columns, r, n)
        if not self.rbf:
            return self.kernel._from_gram(products)
        self._map(products[None, :], self.norms[r:r + 1], self._active_norms, self.kernel.gamma,
                  self._row, 0, 0, -1, self._arg, self._scratch)
        return self._row[0, :n]

    def _dot(self, rows, columns, r, n):
        products = self._products[:n]
        if columns is None:  # CSR
            products[:] = rows @ self.rows[r].toarray().ravel()
        else:
            np.dot(self.rows[r], columns, out=products)
        return products


    def fill_lower(self, out, start=0, order=None, threads=1):
        """``out[start:, start:] = K(rows[order], rows[order])`` (all rows by default): the
        products of the lower triangle by blocks of rows (one matrix product each, BLAS on
        one thread: on these small products its threads cost more than they save, as every
        product waits for all of them), their values, then the diagonal and the upper
        triangle as its mirror. The blocks run in ``threads`` threads."""
        rows = self.rows if order is None else self.rows[order]
        norms = None if self.norms is None else (self.norms if order is None
                                                 else self.norms[order])
        diag = self.diag if order is None else self.diag[order]
        k = rows.shape[0]
        step = max(32, BLOCK_BYTES // max(1, k * self.dtype.itemsize))
        blocks = [(a, min(a + step, k)) for a in range(0, k, step)]

        def block(bounds):
            a, b = bounds
            products = np.asarray(gram(rows[a:b], rows[:b]), dtype=self.dtype)
            if self.rbf:
                arg = np.empty(b, self.dtype)
                scratch = np.empty(b, np.int32 if self.dtype == np.float32 else np.int64)
                self._map(products, norms[a:b], norms, self.kernel.gamma, out, start + a,
                          start, a, arg, scratch)
            else:
                out[start + a:start + b, start:start + b] = self.kernel._from_gram(products)

        with blas_controller().limit(limits=1, user_api="blas"):
            if threads > 1 and len(blocks) > 1:
                from joblib import Parallel, delayed

                Parallel(n_jobs=threads, prefer="threads")(delayed(block)(b) for b in blocks)
            else:
                for bounds in blocks:
                    block(bounds)
        _mirror_lower(out, start, diag)
        return out

    def matrix(self, threads=1):
        """The whole kernel matrix: float32 values by :meth:`fill_lower` (exactly
        symmetric, its blocks in ``threads`` threads); values in the rows' dtype as
        :meth:`gpuml.kernels.pairwise.Kernel.matrix` computes them (one product of all rows), so
        that they equal a precomputed Gram matrix ``X @ X.T`` to the bit, as the GPU
        solver's do."""
        if self.from_centred:
            n = self.rows.shape[0]
            return self.fill_lower(np.empty((n, n), dtype=self.dtype), threads=threads)
        return np.ascontiguousarray(self.kernel.matrix(self.rows, max_bytes=1 << 62))


    def dot(self, rows, cols, coef):
        """``K[rows][:, cols] @ coef`` from the original rows, in float64, blocked."""
        return self.kernel.dot(self.X[rows], self.X[cols], coef)


#: The exponential :func:`_rbf_map` and :func:`_fill_and_run` call; each compiled variant
#: binds its own (:func:`_with_exp`).
_exp = exp_nonpositive_f64


def _rbf_map(P, x_terms, y_terms, gamma, out, row0, col0, first, arg, scratch):
    """``out[row0 + a, col0:col0 + w]`` = the rbf values of the products ``P[a, :w]``
    (:func:`~gpuml.kernels.vexp.rbf_exponent` with scale -2, then the vectorised
    ``exp``): ``w`` every column (``first < 0``) or the strict lower triangle of a block
    whose row ``a`` is row ``first + a`` (``w = first + a``). ``arg`` and ``scratch``:
    workspaces as long as a row."""
    for a in range(P.shape[0]):
        w = P.shape[1] if first < 0 else first + a
        rbf_exponent(P[a, :w], -2.0, x_terms[a], y_terms[:w], gamma, arg[:w])
        _exp(arg[:w], out[row0 + a, col0:col0 + w], scratch)


def _fill_row(products, norms, gamma, diag, slot_row, arg, scratch, cache, slot_of, r, f):
    """Row ``r`` into slot ``f``: the rbf values of ``products`` (or ``products`` as they
    are when ``norms`` is None: the other kernels' values), ``cache[f, r] = diag[r]``, and
    ``cache[f, slot_row[t]] = cache[t, r]`` for the slots ``t < f`` (their values, so that
    the rows agree to the bit)."""
    row = cache[f]
    if norms is not None:
        rbf_exponent(products, -2.0, norms[r], norms, gamma, arg)
        _exp(arg, row, scratch)
    else:
        for k in range(row.shape[0]):
            row[k] = products[k]
    row[r] = diag[r]
    for t in range(f):
        row[slot_row[t]] = cache[t, r]
    slot_of[r] = f
    slot_row[f] = r


def _fill_and_run(products, norms, gamma, diag, slot_row, arg, scratch, y, C, QD, alpha, G,
                  active, cache, slot_of, slot_time, state, tol, shrinking, masks):
    """Row ``state[_NEED]`` into slot ``state[_FILL] - 1`` when set (:func:`_fill_row`),
    then :func:`~.loop._run`: one compiled call per row missed."""
    f = state[_FILL] - 1
    if f >= 0:
        _fill_row(products, norms, gamma, diag, slot_row, arg, scratch, cache, slot_of,
                  state[_NEED], f)
        state[_FILL] = 0
    return _run(y, C, QD, alpha, G, active, cache, slot_of, slot_time, state, tol, shrinking,
                masks)


def _with_exp(py_func, name, **bound):
    """``py_func`` compiled with the globals ``bound`` (its exponential ``_exp``, the
    variant of :func:`_fill_row` it calls), under its own name (numba's disk cache is per
    qualified name)."""
    fn = types.FunctionType(py_func.__code__, dict(py_func.__globals__, **bound), name)
    fn.__qualname__ = name
    fn.__doc__ = py_func.__doc__
    return njit(nogil=True, cache=True)(fn)


_rbf_map_f32 = _with_exp(_rbf_map, "_rbf_map_f32", _exp=exp_nonpositive_f32)
_rbf_map_f64 = _with_exp(_rbf_map, "_rbf_map_f64", _exp=exp_nonpositive_f64)
_fill_row_f32 = _with_exp(_fill_row, "_fill_row_f32", _exp=exp_nonpositive_f32)
_fill_row_f64 = _with_exp(_fill_row, "_fill_row_f64", _exp=exp_nonpositive_f64)
_fill_and_run_f32 = _with_exp(_fill_and_run, "_fill_and_run_f32", _fill_row=_fill_row_f32)
_fill_and_run_f64 = _with_exp(_fill_and_run, "_fill_and_run_f64", _fill_row=_fill_row_f64)


@njit(nogil=True, cache=True, _nrt=False)
def _mirror_lower(K, start, diag):
    """``K[start:, start:]``: the diagonal set to ``diag`` and the upper triangle a copy of
    the lower one (by tiles, so that both sides stay in the cache)."""
    n = K.shape[0] - start
    for i in range(n):
        K[start + i, start + i] = diag[i]
    step = 64
    for a in range(0, n, step):
        for b in range(0, a + 1, step):
            for i in range(a, min(a + step, n)):
                for j in range(b, min(b + step, i)):
                    K[start + j, start + i] = K[start + i, start + j]


def matrix_threads(n) -> int:
    """Threads that build an ``n``-row matrix made alone (no other work beside it): one per
    :data:`MATRIX_THREAD_MIN_VALUES` of its values, at most the threads BLAS may use
    (:func:`~gpuml.kernels.threads_for`)."""
    return threads_for(None, n * n, MATRIX_THREAD_MIN_VALUES, most=64)
