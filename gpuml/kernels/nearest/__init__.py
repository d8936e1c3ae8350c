"""Nearest-centre search and per-part sums: the inner steps of k-means and of routing.

Two implementations:

* **fused** (host, dense, ``P * d <= FUSED_MAX_ENTRIES``): one numba sweep over
  X computes each row's nearest centre and, when asked, adds the row into its
  centre's sum (``nearest/cpu.py``). Nothing of size n x P is written. Each
  block of SUM_BLOCK_ROWS rows is added into its own partial sums and those
  are added in block order; from ``2 * MIN_ROWS_PER_THREAD`` rows on, the
  blocks run on the cores at once (the loop releases the GIL).
* **blocked GEMM** (everything else: CuPy, CSR, many centres or features):
  row blocks of ``||c||^2 - 2 x.c`` by one GEMM each, an ``argmin`` per row.
  On the host and for CSR the sums are one sparse one-hot product. For dense
  CuPy input each block's one-hot matrix overwrites its distance block and
  one more GEMM adds ``onehot.T @ X_block`` into the sums, so a Lloyd pass
  builds no sparse matrix and reads nothing back to the host (building a
  sparse matrix and CuPy's ``bincount`` each synchronise with the device).

The two find the same nearest centres but for rows equally near two of them
within rounding, and their sums differ in the last bits (other orders of
addition). Which one runs depends only on the type and the shapes of ``X``
and the centres, so k-means labels and later routing of the same rows always
agree. Within the fused path the result is the same bits whatever the timing
and the machine's threads: while numba compiles the sweep in the background
(a first fit or predict in a fresh install, see :mod:`.._jit`), inputs of
at most NUMPY_TWIN_MAX_ENTRIES ``n * P * d`` take its NumPy twin, which does
the same arithmetic in the same order, block for block; and the order of the
additions is fixed by the blocks, not by the threads that ran them.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..._backend import is_cupy_array, namespace_of, sparse_module
from ..pairwise import gram, shifted_sq_distances, squared_norms

#: Bound on each temporary (rows x P) distance block of the GEMM path.
BLOCK_BYTES = 8 << 20

#: Largest ``P * d`` for which the fused loop runs: the crossover of one Lloyd pass's
#: time fused and as blocked GEMMs (BLAS on one thread), above which BLAS wins; the
#: measured ratios are quoted in docs/partition.md ("k-means").
FUSED_MAX_ENTRIES = 4096


def row_blocks(n_rows: int, n_cols: int, itemsize: int = 8, block_bytes: int | None = None):
    """``(start, stop)`` row ranges whose ``n_cols``-wide blocks stay under ``block_bytes``
    (default BLOCK_BYTES)."""
    block_bytes = BLOCK_BYTES if block_bytes is None else int(block_bytes)
    rows = max(1, block_bytes // max(1, n_cols * itemsize))
    for start in range(0, n_rows, rows):
        yield start, min(start + rows, n_rows)


#: Rows whose sums the fused pass adds into one partial sum (in row order); the
#: partial sums are then added in block order. Fixed, so that the sums do not
#: depend on how many threads shared the blocks.
SUM_BLOCK_ROWS = 16384

#: Fewest rows per thread of the fused pass: below it, starting threads costs more than it saves.
MIN_ROWS_PER_THREAD = 32768

#: Largest ``n * P * d`` that the fused pass's NumPy twin takes while numba compiles the
#: sweep: the twin's elementwise steps cost a few times a GEMM, so that a k-means of
#: tens of passes on larger inputs would take longer than the compile, which then
#: runs in the caller.
NUMPY_TWIN_MAX_ENTRIES = 1 << 23


@functools.lru_cache(maxsize=1)
def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=_cores(), thread_name_prefix="gpuml-nearest")


def _fused_applies(X, centers) -> bool:
    return (isinstance(X, np.ndarray) and isinstance(centers, np.ndarray)
            and centers.shape[0] * centers.shape[1] <= FUSED_MAX_ENTRIES)


def _dense_device(X) -> bool:
    return is_cupy_array(X) and not hasattr(X, "tocsr")


def _gemm_tn_accumulate(a, b, out):
    """``out += a.T @ b`` (cuBLAS with beta = 1 on a GPU: one launch, no temporary)."""
    if is_cupy_array(out):
        import cupy.cublas

        cupy.cublas.gemm("T", "N", a, b, out=out, alpha=1.0, beta=1.0)
    else:
        out += a.T @ b


def _add_block_sums(onehot, block_labels, parts, X_block, sums, counts):
    """Add one row block into the per-part ``sums`` and ``counts``, in place.

    ``onehot`` is a (rows, P) buffer of X's dtype that is overwritten with the
    block's one-hot matrix (a distance block no longer needed). The sums are
    exact products by 0 and 1 added in cuBLAS's fixed order, so the same
    labels always give the same sums; the counts are integer sums.
    """
    xp = namespace_of(onehot)
    xp.equal(block_labels[:, None], parts[None, :], out=onehot)
    _gemm_tn_accumulate(onehot, X_block, sums)
    counts += onehot.sum(axis=0, dtype=np.int64)


def _dense_part_sums(X, labels, n_parts: int):
    """Per-part sums and counts of dense ``X`` by blocked one-hot GEMMs (no sparse matrix)."""
    xp = namespace_of(X)
    sums = xp.zeros((n_parts, X.shape[1]), dtype=X.dtype)
    counts = xp.zeros(n_parts, dtype=np.int64)
    parts = xp.arange(n_parts, dtype=labels.dtype)
    for start, stop in row_blocks(X.shape[0], n_parts):
        onehot = xp.empty((stop - start, n_parts), dtype=X.dtype)
        _add_block_sums(onehot, labels[start:stop], parts, X[start:stop], sums, counts)
    return sums, counts


def part_sums(X, labels, n_parts: int):
    """Per-part sums of the rows of ``X`` and per-part counts.

    One sparse one-hot product on the host and for CSR; blocked one-hot GEMMs
    for dense CuPy input, which read nothing back to the host.
    """
    if _dense_device(X):
        return _dense_part_sums(X, labels, n_parts)
    xp = namespace_of(labels)
    n = X.shape[0]
    onehot = sparse_module(xp).coo_matrix(
        (xp.ones(n, dtype=X.dtype), (labels, xp.arange(n))), shape=(n_parts, n)).tocsr()
    sums = onehot @ X
    sums = xp.asarray(sums.toarray() if hasattr(sums, "toarray") else sums)
    return sums, xp.bincount(labels, minlength=n_parts)


def nearest_centres(X, centers, *, with_sums: bool = False):
    """Index of the nearest centre for every row of ``X``; with sums for a Lloyd update.

    Parameters
    ----------
    X : (n, d) float array, NumPy or CuPy, dense or CSR
    centers : (P, d) dense float array in X's namespace
    with_sums : bool
        Also return each centre's sum of its rows and their count.

    Returns
    -------
    labels : int64 (n,) — ties go to the lowest centre index
    sums, counts : (P, d) and int64 (P,), only with ``with_sums``

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.kernels import nearest_centres
    >>> X = np.array([[0.0, 0.1], [1.0, 0.9], [0.2, 0.0]])
    >>> centers = np.array([[0.0, 0.0], [1.0, 1.0]])
    >>> labels, sums, counts = nearest_centres(X, centers, with_sums=True)
    >>> labels.tolist(), counts.tolist()
    ([0, 1, 0], [2, 1])
    """
    if _fused_applies(X, centers):
        labels, sums, counts = _fused_nearest_sums(X, centers)
        return (labels, sums, counts) if with_sums else labels
    n_parts = centers.shape[0]
    xp = namespace_of(centers)
    c_norms = squared_norms(centers)
    labels = xp.empty(X.shape[0], dtype=np.int64)
    if with_sums and _dense_device(X) and centers.dtype == X.dtype:
        return _blocked_nearest_sums(X, centers, c_norms, labels)
    for start, stop in row_blocks(X.shape[0], n_parts):
        labels[start:stop] = shifted_sq_distances(X[start:stop], centers, c_norms).argmin(axis=1)
    if not with_sums:
        return labels
    return (labels, *part_sums(X, labels, n_parts))


def _fused_nearest_sums(X, centers):
    """The fused pass: numba's sweep, or its NumPy twin while numba compiles it.

    Both add each block of SUM_BLOCK_ROWS rows into its own partial sums and
    the partial sums in block order, whichever thread ran which block, and
    the twin repeats the sweep's arithmetic: the result is the same bits.
    """
    from .. import _jit
    from .cpu import nearest_centre_sums, nearest_centre_sums_numpy

    X = np.ascontiguousarray(X)
    n, d = X.shape
    n_parts = centers.shape[0]
    centers = np.ascontiguousarray(centers, dtype=X.dtype)
    half_norms = (0.5 * squared_norms(centers)).astype(X.dtype, copy=False)
    centers_t = np.ascontiguousarray(centers.T)
    labels = np.empty(n, dtype=np.int64)
    n_blocks = max(1, -(-n // SUM_BLOCK_ROWS))
    sums = np.zeros((n_blocks, n_parts, d), dtype=X.dtype)
    counts = np.zeros((n_blocks, n_parts), dtype=np.int64)
    args = (centers_t, half_norms, SUM_BLOCK_ROWS)
    if (n * n_parts * d <= NUMPY_TWIN_MAX_ENTRIES
            and not _jit.ready(nearest_centre_sums, X[:1], *args, labels[:1], sums[:1],
                               counts[:1])):
        nearest_centre_sums_numpy(X, *args, labels, sums, counts)
    elif n < 2 * MIN_ROWS_PER_THREAD or _cores() == 1:
        nearest_centre_sums(X, *args, labels, sums, counts)
    else:  # the loop releases the GIL: blocks on the cores at once
        def sweep(b):
            rows = slice(b * SUM_BLOCK_ROWS, (b + 1) * SUM_BLOCK_ROWS)
            nearest_centre_sums(X[rows], *args, labels[rows], sums[b:b + 1], counts[b:b + 1])

        list(_pool().map(sweep, range(n_blocks)))
    total = sums[0].copy()
    for b in range(1, n_blocks):  # in block order, whatever the threads
        total += sums[b]
    return labels, total, counts.sum(axis=0)


def _blocked_nearest_sums(X, centers, c_norms, labels):
    """The blocked GEMM pass with the sums taken block by block from the distance buffer.

    The labels come from the same block GEMMs and ``argmin`` as without sums;
    nothing is read back to the host, so a Lloyd loop can queue pass after
    pass on the GPU.
    """
    xp = namespace_of(centers)
    n_parts = centers.shape[0]
    sums = xp.zeros((n_parts, X.shape[1]), dtype=X.dtype)
    counts = xp.zeros(n_parts, dtype=np.int64)
    parts = xp.arange(n_parts, dtype=labels.dtype)
    for start, stop in row_blocks(X.shape[0], n_parts):
        D = shifted_sq_distances(X[start:stop], centers, c_norms)
        labels[start:stop] = D.argmin(axis=1)
        _add_block_sums(D, labels[start:stop], parts, X[start:stop], sums, counts)
    return labels, sums, counts


#: Candidates per row a fill of device distances reads back (:func:`fill_candidates`):
#: a row scans its distances only when this many nearest open parts all filled within
#: its block (or its distances are not finite).
FILL_CANDIDATES = 4
#: Rows whose distances such a fill reads back and scans at once, from a row that needs
#: its own.
FILL_SCAN_ROWS = 64
#: Bound on a device fill's distance blocks (twice this with the masked copy
#: :func:`fill_candidates` makes): larger than the host's BLOCK_BYTES, as each block costs a
#: few kernel launches and two reads back whatever its size (at 4,883 parts, 8 MiB blocks
#: are 214 rows), but not so large that many parts fill within one block, which sends
#: more rows to the scan (at 1,000,000 rows and 489 parts, candidates of four: 226 scans
#: of 64 rows with 32 MiB blocks, 2,476 with 256 MiB).
DEVICE_FILL_BLOCK_BYTES = 64 << 20


def fill_blocks(n_rows: int, centers):
    """The row ranges in which a fill of ``n_rows`` rows into ``centers``' parts computes
    its distance blocks: :data:`DEVICE_FILL_BLOCK_BYTES` on a device, :data:`BLOCK_BYTES`
    on the host (:func:`row_blocks`).

    >>> list(fill_blocks(5, np.zeros((BLOCK_BYTES // 16, 2))))
    [(0, 2), (2, 4), (4, 5)]
    """
    block_bytes = DEVICE_FILL_BLOCK_BYTES if is_cupy_array(centers) else BLOCK_BYTES
    return row_blocks(n_rows, centers.shape[0], block_bytes=block_bytes)


class OpenDistances:
    """The distance blocks of a greedy fill into the parts of ``centers``.

    ``OpenDistances(centers)(Xb, counts, caps)``: for the rows ``Xb``,
    :func:`~gpuml.kernels.pairwise.shifted_sq_distances` to the centres of the parts with room
    (``counts < caps``, host arrays) and ``inf`` to the full ones, which a fill skips
    (:func:`gpuml.kernels.fill_nearest_open`). So a row's ``argmin`` is its nearest part
    with room when the block began, and the fill's scan of every part is left to the rows
    whose part filled within the block. The open columns equal
    :func:`~gpuml.kernels.pairwise.shifted_sq_distances`' bit for bit: the ``-2`` is in the
    centres (a power of two: every product and sum of the GEMM scales exactly), which
    spares a pass over each block.

    >>> C = np.array([[0.0, 0.0], [3.0, 0.0]])
    >>> OpenDistances(C)(np.array([[1.0, 0.0]]), np.array([2, 0]), np.array([2, 2])).tolist()
    [[inf, 3.0]]
    """

    def __init__(self, centers):
        self.xp = namespace_of(centers)
        self.scaled = centers * -2.0
        self.norms = squared_norms(centers)
        self.inf = self.xp.asarray(np.inf, dtype=self.norms.dtype)

    def __call__(self, Xb, counts, caps):
        full = self.xp.asarray(np.asarray(counts) >= np.asarray(caps))
        D = gram(Xb, self.scaled)
        D += self.xp.where(full, self.inf, self.norms)[None, :]
        return D


def fill_candidates(D, full, r: int = FILL_CANDIDATES):
    """Each row's first ``r`` parts in the order (distance, part) among the parts not
    ``full`` (bools on ``D``'s device), and their distances: ``(cand, cand_d)`` on D's
    device, by ``r`` passes of ``argmin`` (the lowest of equal minima) over a copy of ``D``
    whose full parts, and the candidates found so far, are infinite. What a fill of
    ``D`` on a device reads back instead of ``D`` (:func:`gpuml.kernels.fill_nearest_open`).

    >>> D = np.array([[3.0, 1.0, 1.0, 0.0]])
    >>> cand, cand_d = fill_candidates(D, np.array([False, False, False, True]), 2)
    >>> cand.tolist(), cand_d.tolist()
    ([[1, 2]], [[1.0, 1.0]])
    """
    xp = namespace_of(D)
    masked = xp.where(xp.asarray(full)[None, :], xp.asarray(np.inf, dtype=D.dtype), D)
    rows = xp.arange(D.shape[0])
    cand = xp.empty((D.shape[0], r), dtype=np.int64)
    cand_d = xp.empty((D.shape[0], r), dtype=D.dtype)
    for t in range(r):
        nearest = masked.argmin(axis=1)
        cand[:, t] = nearest
        cand_d[:, t] = masked[rows, nearest]
        masked[rows, nearest] = np.inf
    return cand, cand_d


__all__ = ["BLOCK_BYTES", "DEVICE_FILL_BLOCK_BYTES", "FILL_CANDIDATES", "FILL_SCAN_ROWS",
           "FUSED_MAX_ENTRIES", "OpenDistances", "fill_blocks", "fill_candidates",
           "nearest_centres", "part_sums", "row_blocks"]
