"""Batched dense solvers for partitioned kernel ridge regression (You 2020, Alg 6, 8, 10).

BKRR2 and its family solve P independent SPD systems ``(K_j + s_j I) a_j = y_j``
and, for the fast σ/λ search, reduce the P kernel blocks once to
``K_j = Q_j T_j Q_j^T`` (:class:`Tridiagonal`) so that every shift costs O(m_j).
This module is the only place that knows how that runs on each device:

* **NumPy**: one SciPy/LAPACK call per part (``potrf``/``potrs``, ``sytrd``,
  ``syevd``);
  parts run in parallel threads through joblib when ``n_jobs`` allows
  (LAPACK and BLAS release the GIL).
* **CuPy**: parts of equal size are stacked into one ``(g, m, m)`` array and
  their kernel blocks built by one batched GEMM and one fused elementwise
  map. Small blocks (m <= :data:`POTRF_BATCHED_MAX`) are then factored
  together by cuSOLVER's ``potrfBatched``/``potrsBatched`` (``cupyx.lapack.posv``);
  larger ones one at a time by the single-matrix ``potrf``/``potrs``, in
  place (:func:`gpu_solve_plan` says which). K-balance gives sizes that differ
  by at most one, so P parts form at most two groups; k-means gives one group
  per distinct size.

Every function takes lists of per-part arrays (sizes may differ) and returns
lists in the same order, on the same device.
"""

from __future__ import annotations

import functools

import numpy as np
import scipy.linalg

from .._backend import is_cupy_array, namespace_of
from ._threads import map_threads, part_threads
from .pairwise import Kernel

__all__ = [
    "NotPositiveDefiniteError",
    "Tridiagonal",
    "cholesky_solve_batch",
    "eigh_batch",
    "gpu_solve_bytes",
    "gpu_solve_plan",
    "gram_batch",
    "krr_lstsq_part",
    "krr_solve_parts",
    "tridiagonal_batch",
]

#: Largest block size for which cuSOLVER's batched Jacobi eigensolver is used;
#: larger blocks are each one ``syevd`` call, which fills the GPU on its own.
_SYEVJ_BATCHED_MAX = 32

#: Largest block size m for which equal-size parts are factored together by one
#: ``potrfBatched`` call; larger blocks get one single-matrix ``potrf`` each.
#: ``potrfBatched`` is built for many small matrices: it wins on small blocks and
#: loses on large ones, and this value lies between the largest block size at which
#: it was measured faster and the smallest at which it was slower (the crossover of
#: ``bench/studies/bkrr_gpu_profile.py``, bench/results/h100-80gb-hbm3/profile_bkrr.txt).
POTRF_BATCHED_MAX = 1536

#: Kernel blocks built and factored by one call are at most this large together
#: (a group of many equal-size parts is cut into chunks of this size; one block
#: larger than this is a chunk of its own). It bounds peak memory; 1 GiB is
#: already 512 float64 blocks of 512 rows, enough to fill any GPU.
BATCH_BYTES = 1 << 30

#: Device memory the estimate keeps free beyond the kernel blocks: cuSOLVER's and
#: cuBLAS's workspaces, the right-hand sides and solutions, the norms and indices.
GPU_HEADROOM_BYTES = 256 << 20


class NotPositiveDefiniteError(np.linalg.LinAlgError):
    """A system of the batch is not (numerically) positive definite.

    Attributes
    ----------
    part : int or None
        Index of the failing system in the batch (None when the device only
        reports that one of them failed).
    """

    def __init__(self, part=None):
        self.part = part
        where = "one of the systems" if part is None else f"system {part}"
        super().__init__(f"{where} is not positive definite (Cholesky failed)")


def _size_groups(sizes) -> list[np.ndarray]:
    """Indices of the parts, grouped by size (one batched call per group)."""
    sizes = np.asarray(sizes)
    return [np.flatnonzero(sizes == m) for m in np.unique(sizes)]


def gpu_solve_plan(sizes, itemsize: int) -> list[tuple[np.ndarray, bool]]:
    """How :func:`krr_solve_parts` runs on a GPU: one ``(parts, batched)`` per chunk.

    Each chunk holds parts of one size whose kernel blocks are built together
    (one batched GEMM), at most :data:`BATCH_BYTES` of blocks, or one block when
    a single block is larger. ``batched`` chunks (several parts of at most
    :data:`POTRF_BATCHED_MAX` rows) are factored by one ``potrfBatched`` call;
    the others by one single-matrix ``potrf`` per part, in place. Pure: decides
    from the sizes alone, so it is tested without a GPU.

    Examples
    --------
    >>> from gpuml.kernels.krr import gpu_solve_plan
    >>> [(c.tolist(), b) for c, b in gpu_solve_plan([18432], 8)]
    [([0], False)]
    >>> [(c.tolist(), b) for c, b in gpu_solve_plan([100, 100, 99], 8)]
    [([2], False), ([0, 1], True)]
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    plan = []
    for group in _size_groups(sizes):
        m = int(sizes[group[0]])
        per_chunk = max(1, BATCH_BYTES // max(1, m * m * itemsize))
        for start in range(0, group.size, per_chunk):
            chunk = group[start:start + per_chunk]
            plan.append((chunk, bool(chunk.size > 1 and m <= POTRF_BATCHED_MAX)))
    return plan


def gpu_solve_bytes(sizes, itemsize: int) -> int:
    """Peak device memory of :func:`krr_solve_parts` on a GPU for parts of these sizes.

    The largest chunk of :func:`gpu_solve_plan`: its ``g`` kernel blocks of
    ``m^2`` values, twice for a batched chunk (``cupyx.lapack.posv`` factors a
    copy of the stack), once otherwise (``potrf`` works in place); plus
    :data:`GPU_HEADROOM_BYTES`. The data, targets and solutions are small next
    to it and covered by the headroom.

    Examples
    --------
    >>> from gpuml.kernels.krr import gpu_solve_bytes, GPU_HEADROOM_BYTES
    >>> (gpu_solve_bytes([18432], 8) - GPU_HEADROOM_BYTES) / 2**30
    2.53125
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    peak = 0
    for chunk, batched in gpu_solve_plan(sizes, itemsize):
        m = int(sizes[chunk[0]])
        peak = max(peak, (2 if batched else 1) * chunk.size * m * m * itemsize)
    return int(peak) + GPU_HEADROOM_BYTES


def gpu_search_bytes(sizes, itemsize: int) -> int:
    """Peak device bytes of the σ/λ search of :class:`~gpuml.estimators.bkrr_cv.BKRRRegressorCV`
    for parts of these sizes.

    All parts at once: their squared distances, their kernel blocks at one σ,
    the eigenvectors of each (``Tridiagonal.Q``) and ``Q * Q`` for the
    leave-one-out diagonal, four ``m_j^2`` arrays per part; plus ``syevd``'s
    copy and workspace for the largest block (about two more ``m^2``).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    blocks = 4 * int((sizes**2).sum()) + 2 * int(sizes.max()) ** 2
    return blocks * itemsize + GPU_HEADROOM_BYTES


def krr_fit_bytes(backend, sizes, itemsize: int, n_jobs=None, search=False) -> int:
    """Peak bytes on ``backend`` of :func:`krr_solve_parts` (or, ``search``, of the σ/λ
    search) for parts of these sizes.

    CPU: :func:`~gpuml.kernels.part_threads` blocks of ``m_j^2`` live at once (each
    factored in place), three times over for the search. GPU: the solve's largest chunk
    (:func:`gpu_solve_bytes`), or for the search :func:`gpu_search_bytes`.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if backend.is_gpu:
        return (gpu_search_bytes if search else gpu_solve_bytes)(sizes, itemsize)
    blocks = int((np.sort(sizes)[::-1][:part_threads(n_jobs, sizes)] ** 2).sum())
    return blocks * itemsize * (3 if search else 1)


def tridiagonal_form(backend, eigen=False) -> str:
    """The representation :func:`tridiagonal_batch` gives on ``backend``: ``"eigen"`` when
    asked (``eigen``) and always on a GPU, else ``"householder"``."""
    return "eigen" if eigen or backend.is_gpu else "householder"


def _is_sparse(X) -> bool:
    return hasattr(X, "tocsr")


@functools.lru_cache(maxsize=1)
def _rbf_from_gram_kernel():
    """``g <- exp(-gamma * max(ni + nj - 2 g, 0))`` in one pass over the block, in place.

    The five NumPy-style passes it replaces each read and write every value of
    the ``g m^2`` stack (for one 18,432 block in float64, 2.7 GB per pass). The
    arithmetic is that of :func:`gpuml.kernels.pairwise.sq_distances` and
    :meth:`Kernel.matrix` in the same order (``-2 g`` is exact), so the blocks
    agree with the CPU's to rounding.
    """
    import cupy

    return cupy.ElementwiseKernel(
        "T ni, T nj, T gamma", "T g",
        "T d = (g * (T)-2 + nj) + ni; g = exp((d > (T)0 ? d : (T)0) * -gamma);",
        "gpuml_rbf_from_gram")


def _stacked_gram(kernel: Kernel, Xs):
    """Kernel blocks of a (g, m, d) stack of parts: one batched GEMM plus the kernel's map."""
    xp = namespace_of(Xs)
    G = xp.matmul(Xs, Xs.transpose(0, 2, 1))
    if kernel.name != "rbf":
        return kernel._from_gram(G)
    norms = xp.einsum("gij,gij->gi", Xs, Xs)
    _rbf_from_gram_kernel()(norms[:, :, None], norms[:, None, :], G.dtype.type(kernel.gamma), G)
    return G


def gram_batch(kernel: Kernel, parts: list, *, n_jobs=None) -> list:
    """Kernel matrices ``K(X_j, X_j)`` of every part.

    On the GPU, dense parts of equal size are stacked and built by one batched
    GEMM; on the CPU (and for CSR parts) each part is one blocked
    :meth:`Kernel.matrix`, parts in parallel threads.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.kernels.krr import gram_batch
    >>> from gpuml.kernels.pairwise import Kernel
    >>> parts = [np.zeros((2, 3)), np.ones((3, 3))]
    >>> [K.shape for K in gram_batch(Kernel("rbf", gamma=0.5), parts)]
    [(2, 2), (3, 3)]
    """
    if parts and is_cupy_array(parts[0]) and not _is_sparse(parts[0]):
        xp = namespace_of(parts[0])
        out = [None] * len(parts)
        for group in _size_groups([p.shape[0] for p in parts]):
            stack = _stacked_gram(kernel, xp.stack([parts[j] for j in group]))
            for slot, j in enumerate(group):
                out[j] = stack[slot]
        return out
    return map_threads(lambda X: kernel.matrix(X, max_bytes=1 << 62), parts, n_jobs)


#: Rows per block of :func:`_upper_gram_host`.
_TRIANGLE_ROWS = 128


def _upper_gram_host(kernel: Kernel, X):
    """``K(X, X)`` with only its upper triangle (and diagonal) filled, by row blocks.

    :func:`_cho_solve_host` factors the C-ordered block through its Fortran-ordered
    transpose with ``lower=True``, which reads exactly this triangle: building only it
    halves the kernel evaluations (the exp of the Gaussian kernel) of a fit.
    """
    m = X.shape[0]
    K = np.empty((m, m), dtype=X.dtype)
    for start in range(0, m, _TRIANGLE_ROWS):
        stop = min(start + _TRIANGLE_ROWS, m)
        K[start:stop, start:] = kernel.matrix(X[start:stop], X[start:], max_bytes=1 << 62)
    return K


def _cho_solve_host(A, B, part, overwrite):
    # LAPACK wants Fortran order; the transpose of a C-ordered symmetric matrix is the same
    # matrix in Fortran order, so potrf works in place instead of on an m x m copy.
    if A.flags.c_contiguous:
        A = A.T
    try:
        factor = scipy.linalg.cho_factor(A, lower=True, overwrite_a=overwrite, check_finite=False)
    except np.linalg.LinAlgError:
        raise NotPositiveDefiniteError(part) from None
    if not np.all(np.isfinite(np.diagonal(factor[0]))):
        raise NotPositiveDefiniteError(part)
    return scipy.linalg.cho_solve(factor, B, check_finite=False)


def _posv_device(A_stack, B_stack):
    """One batched Cholesky solve on the GPU; raises NotPositiveDefiniteError on failure."""
    import cupyx
    import cupyx.lapack

    with cupyx.errstate(linalg="raise"):
        try:
            X = cupyx.lapack.posv(A_stack, B_stack)
        except np.linalg.LinAlgError:
            raise NotPositiveDefiniteError(None) from None
    xp = namespace_of(X)
    if not bool(xp.isfinite(X).all()):
        raise NotPositiveDefiniteError(None)
    return X


def _potrf_potrs_inplace(A, B, info, scratch):
    """Solve ``A X = B`` by one cuSOLVER ``potrf`` (overwriting A with its factor) and ``potrs``.

    ``A`` is a C- or Fortran-contiguous symmetric (m, m) float32/float64 CuPy
    array. Read in Fortran order a C-ordered symmetric matrix is itself
    (``A^T = A``), so ``potrf`` factors the buffer in place: no m x m copy, where
    ``cupyx.lapack.posv`` and ``cupy.linalg.cholesky`` copy it first. With
    ``lower`` in Fortran order it reads the upper triangle of the C-ordered
    array, the triangle the CPU path factors too.

    ``info`` (a one-element int32 device array) receives ``potrf``'s status
    (> 0: not positive definite); nothing is read back here, so a chain of
    solves runs without a host synchronisation. ``scratch`` takes ``potrs``'s
    status, which only reports invalid arguments. Returns X shaped like B, a
    new array (B is not modified).
    """
    import cupy
    from cupy.cuda import device
    from cupy_backends.cuda.libs import cublas, cusolver

    if A.dtype == np.float64:
        buffer_size, potrf, potrs = cusolver.dpotrf_bufferSize, cusolver.dpotrf, cusolver.dpotrs
    elif A.dtype == np.float32:
        buffer_size, potrf, potrs = cusolver.spotrf_bufferSize, cusolver.spotrf, cusolver.spotrs
    else:
        raise TypeError(f"the Cholesky solve takes float32 or float64 blocks, got {A.dtype}")
    if not (A.flags.c_contiguous or A.flags.f_contiguous):
        raise ValueError("the block factored in place must be contiguous")
    m = A.shape[0]
    handle = device.get_cusolver_handle()
    lower = cublas.CUBLAS_FILL_MODE_LOWER
    lwork = buffer_size(handle, lower, m, A.data.ptr, m)
    work = cupy.empty(max(1, lwork), dtype=A.dtype)
    potrf(handle, lower, m, A.data.ptr, m, work.data.ptr, lwork, info.data.ptr)
    X = B.reshape(m, -1).astype(A.dtype, order="F", copy=True)
    potrs(handle, lower, m, X.shape[1], A.data.ptr, m, X.data.ptr, m, scratch.data.ptr)
    return cupy.ascontiguousarray(X).reshape(B.shape)


class _DeviceCholesky:
    """Cholesky solves of the parts on one GPU, their failures reported once at the end.

    Single-matrix solves only record ``potrf``'s status and whether the
    solution is finite, on the device; :meth:`raise_if_failed` reads both back
    in one host synchronisation and names the first failing part. A batched
    chunk is checked at once (``cupyx.lapack.posv`` reads its status back
    itself) and cannot say which of its parts failed.
    """

    def __init__(self, xp, n_parts: int):
        self.xp = xp
        self.info = xp.zeros(n_parts, dtype=np.int32)
        self.finite = xp.ones(n_parts, dtype=bool)
        self.scratch = xp.zeros(1, dtype=np.int32)

    def single(self, j: int, A, B):
        X = _potrf_potrs_inplace(A, B, self.info[j:j + 1], self.scratch)
        self.finite[j] = self.xp.isfinite(X).all()
        return X

    def batched(self, chunk, A_stack, B_stack):
        try:
            return _posv_device(A_stack, B_stack)
        except NotPositiveDefiniteError:
            raise NotPositiveDefiniteError(int(chunk[0]) if len(chunk) == 1 else None) from None

    def raise_if_failed(self):
        bad = ((self.info != 0) | ~self.finite).get()
        failed = np.flatnonzero(bad)
        if failed.size:
            raise NotPositiveDefiniteError(int(failed[0]))


def cholesky_solve_batch(As: list, Bs: list, *, overwrite_a=False, n_jobs=None) -> list:
    """Solve ``A_j X_j = B_j`` for SPD ``A_j`` by Cholesky, for every part ``j``.

    Parameters
    ----------
    As : list of (m_j, m_j) SPD arrays (NumPy or CuPy; sizes may differ)
    Bs : list of (m_j,) or (m_j, k) right-hand sides
    overwrite_a : bool
        Let the CPU path factor ``A_j`` in place (saves one m_j × m_j copy).
    n_jobs : int or None
        Threads over parts on the CPU.

    Returns
    -------
    list of solutions shaped like ``Bs``.

    Raises
    ------
    NotPositiveDefiniteError
        When a Cholesky factorisation fails (``.part`` says which on the CPU).

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.kernels.krr import cholesky_solve_batch
    >>> A = [np.eye(2) * 2.0, np.eye(3) * 4.0]
    >>> [np.round(x, 12).tolist() for x in cholesky_solve_batch(A, [np.ones(2), np.ones(3)])]
    [[0.5, 0.5], [0.25, 0.25, 0.25]]
    """
    if As and is_cupy_array(As[0]):
        xp = namespace_of(As[0])
        out = [None] * len(As)
        solver = _DeviceCholesky(xp, len(As))
        itemsize = np.result_type(As[0].dtype, np.float32).itemsize
        for chunk, batched in gpu_solve_plan([A.shape[0] for A in As], itemsize):
            if batched:
                X = solver.batched(chunk, xp.stack([As[j] for j in chunk]),
                                   xp.stack([Bs[j] for j in chunk]))
                for slot, j in enumerate(chunk):
                    out[j] = X[slot]
                continue
            for j in chunk:
                A = As[j]
                dtype = np.result_type(A.dtype, Bs[j].dtype, np.float32)
                if not (overwrite_a and A.dtype == dtype
                        and (A.flags.c_contiguous or A.flags.f_contiguous)):
                    A = A.astype(dtype, order="C", copy=True)
                out[j] = solver.single(j, A, Bs[j])
        solver.raise_if_failed()
        return out
    return map_threads(lambda j: _cho_solve_host(As[j], Bs[j], j, overwrite_a),
                       range(len(As)), n_jobs)


def _weigh(K, targets, w):
    """Sample weights as KernelRidge applies them: ``S K S`` and ``S y`` with ``S = diag(sqrt w)``.

    The solution of the weighted system is then ``S a``. Only the filled part of
    ``K`` matters; the rest may hold anything, hence no floating-point warnings.
    """
    xp = namespace_of(K)
    root = xp.sqrt(w)
    with np.errstate(all="ignore"):
        K *= root[..., :, None]
        K *= root[..., None, :]
    scale = root[..., :, None] if targets.ndim == K.ndim else root
    return targets * scale, root


def _own_block(kernel: Kernel, X):
    """A part's kernel matrix that the solver may overwrite (a copy of a precomputed one)."""
    if kernel.name == "precomputed":
        xp = namespace_of(X)
        return xp.array(X.toarray() if hasattr(X, "toarray") else X, dtype=X.dtype, copy=True)
    if kernel.name == "pairwise":
        return kernel.matrix(X, max_bytes=1 << 62)
    return _upper_gram_host(kernel, X) if not is_cupy_array(X) else kernel.matrix(X)


def krr_lstsq_part(kernel: Kernel, X, y, shift: float, weights=None):
    """``(K + s I) a = y`` of one part by least squares, for a singular or indefinite system.

    What ``sklearn.kernel_ridge.KernelRidge`` falls back to when the Cholesky
    factorisation fails (``lam=0`` with duplicate samples, an indefinite
    sigmoid kernel): LAPACK's ``gelsd`` on the host, ``cupy.linalg.lstsq`` on
    a GPU. ``weights`` as in :func:`krr_solve_parts`.
    """
    xp = namespace_of(X)
    K = kernel.matrix(X) if kernel.name != "precomputed" else _own_block(kernel, X)
    K = xp.array(K, copy=True)
    if weights is not None:
        y, root = _weigh(K, y, weights)
    diagonal = xp.arange(K.shape[0])
    K[diagonal, diagonal] += shift
    if xp is np:
        a = scipy.linalg.lstsq(K, y)[0]
    else:
        a = xp.linalg.lstsq(K, y, rcond=None)[0]
    if weights is not None:
        a = a * (root[:, None] if a.ndim == 2 else root)
    return a


def krr_solve_parts(kernel: Kernel, parts: list, targets: list, shifts, *, n_jobs=None,
                    weights=None) -> list:
    """Dual coefficients of every part: solve ``(K(X_j, X_j) + s_j I) a_j = y_j`` (eq. 3.6).

    The kernel block of a part is built, shifted, factored in place and freed
    before the next part of the same thread starts (CPU), or per chunk of
    equal-size parts (GPU, :func:`gpu_solve_plan`): peak memory is ``n_jobs``
    blocks on the CPU and :func:`gpu_solve_bytes` on the GPU.

    With ``kernel.name == "precomputed"`` each part is its own kernel block
    (left untouched). ``weights[j]`` (optional, non-negative, one per sample)
    weighs part j's squared errors as ``KernelRidge(...).fit(..., sample_weight)``
    does: the system becomes ``(S K S + s I) b = S y`` with ``S = diag(sqrt w)``
    and ``a = S b``.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.kernels.krr import krr_solve_parts
    >>> from gpuml.kernels.pairwise import Kernel
    >>> X = np.array([[0.0], [1.0]])
    >>> a, = krr_solve_parts(Kernel("linear"), [X], [np.array([0.0, 2.0])], [1.0])
    >>> np.round(a, 12).tolist()
    [0.0, 1.0]
    """
    shifts = [float(s) for s in shifts]
    if parts and is_cupy_array(parts[0]):
        return _solve_parts_device(kernel, parts, targets, shifts, weights)

    def solve(j):
        K = _own_block(kernel, parts[j])
        y = targets[j]
        if weights is not None:
            y, root = _weigh(K, y, weights[j])
        K.flat[:: K.shape[0] + 1] += shifts[j]
        a = _cho_solve_host(K, y, j, overwrite=True)
        if weights is not None:
            a = a * (root[:, None] if a.ndim == 2 else root)
        return a

    return map_threads(solve, range(len(parts)), n_jobs)


def _solve_parts_device(kernel: Kernel, parts: list, targets: list, shifts: list,
                        weights=None) -> list:
    """The GPU side of :func:`krr_solve_parts`, chunk by chunk of :func:`gpu_solve_plan`.

    Per chunk: the kernel blocks of its parts as one (g, m, m) stack (batched
    GEMM and one fused map), the shifts added to the diagonals, then one
    ``potrfBatched`` solve for the stack or one in-place ``potrf`` per block.
    Nothing is read back to the host until the end (one synchronisation for
    the failure check), and a chunk's stack is freed before the next is built.
    """
    xp = namespace_of(parts[0])
    sizes = [p.shape[0] for p in parts]
    out = [None] * len(parts)
    solver = _DeviceCholesky(xp, len(parts))
    for chunk, batched in gpu_solve_plan(sizes, np.dtype(parts[0].dtype).itemsize):
        members = [parts[j] for j in chunk]
        if kernel.name == "precomputed":
            A = xp.stack([_own_block(kernel, X) for X in members])
        elif _is_sparse(parts[0]):
            A = xp.stack(gram_batch(kernel, members))
        else:
            A = _stacked_gram(kernel, xp.stack(members))
        rhs = xp.stack([targets[j] for j in chunk])
        root = None
        if weights is not None:
            rhs, root = _weigh(A, rhs, xp.stack([xp.asarray(weights[j]) for j in chunk]))
        diagonal = xp.arange(A.shape[1])
        A[:, diagonal, diagonal] += xp.asarray([shifts[j] for j in chunk],
                                               dtype=A.dtype)[:, None]
        if batched:
            X = solver.batched(chunk, A, rhs)
            for slot, j in enumerate(chunk):
                out[j] = X[slot]
        else:
            for slot, j in enumerate(chunk):
                out[j] = solver.single(int(j), A[slot], rhs[slot])
        if root is not None:
            for slot, j in enumerate(chunk):
                out[j] = out[j] * (root[slot][:, None] if out[j].ndim == 2 else root[slot])
        del A
    solver.raise_if_failed()
    return out


def eigh_batch(As: list, *, overwrite_a=False, n_jobs=None) -> list:
    """Eigendecomposition ``A_j = Q_j diag(w_j) Q_j^T`` of every symmetric ``A_j``.

    CPU: LAPACK ``syevd`` per part (threads over parts). GPU: parts of equal
    size up to 32 go through one batched Jacobi call (cuSOLVER
    ``syevjBatched``, via :func:`cupy.linalg.eigh` on the stack); larger
    blocks are one ``syevd`` each.

    Returns
    -------
    list of ``(w_j, Q_j)``, eigenvalues ascending.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.kernels.krr import eigh_batch
    >>> (w, Q), = eigh_batch([np.diag([3.0, 1.0])])
    >>> w.tolist()
    [1.0, 3.0]
    """
    if As and is_cupy_array(As[0]):
        xp = namespace_of(As[0])
        out = [None] * len(As)
        for group in _size_groups([A.shape[0] for A in As]):
            if As[group[0]].shape[0] <= _SYEVJ_BATCHED_MAX:
                w, Q = xp.linalg.eigh(xp.stack([As[j] for j in group]))
                for slot, j in enumerate(group):
                    out[j] = (w[slot], Q[slot])
            else:
                for j in group:
                    out[j] = xp.linalg.eigh(As[j])
        return out

    def decompose(A):
        if A.flags.c_contiguous:  # the Fortran-ordered view of a symmetric matrix: no copy
            A = A.T
        return scipy.linalg.eigh(A, overwrite_a=overwrite_a, check_finite=False, driver="evd")

    return map_threads(decompose, As, n_jobs)



class Tridiagonal:
    r"""A symmetric matrix as ``A = Q T Q^T``, T tridiagonal, for solves at many shifts.

    ``T`` has diagonal ``d`` and off-diagonal ``e``. Two representations of Q:

    * **Householder** (CPU, LAPACK ``sytrd``): Q is the product of the
      reflectors ``sytrd`` leaves below the first subdiagonal; it is applied by
      ``ormqr`` (level-3 BLAS) and never formed. The reduction costs a few
      Cholesky factorisations of A, well under ``syevd`` (the measured unit costs:
      bench/results/cpu-2core/bkrr-runs.md).
    * **Eigen** (``e=None``, T diagonal): ``Q`` explicit, from ``eigh``; this
      is what the GPU path and the leave-one-out diagonal use.

    Then ``(A + s I)^{-1} B = Q (T + s I)^{-1} Q^T B``, and with ``Q^T B``
    kept, every shift ``s`` costs one O(m) tridiagonal solve per column
    (:meth:`solve` takes all the shifts at once).

    Parameters
    ----------
    d : (m,) array
    e : (m - 1,) array or None
        None: T is diagonal and ``Q`` must be given.
    Q : (m, m) array or None
        Explicit orthogonal factor (eigen representation).
    reflectors, tau : arrays or None
        ``sytrd``'s reflectors (lower storage, the block ``a[1:, :-1]`` in
        Fortran order) and their scalars (Householder representation).
    """

    def __init__(self, d, e=None, *, Q=None, reflectors=None, tau=None):
        if (e is None) != (Q is not None):
            raise ValueError("give Q for a diagonal T (e=None), reflectors and tau otherwise")
        self.d, self.e, self.Q = d, e, Q
        self.reflectors, self.tau = reflectors, tau
        self._squares = None  # Q * Q, or Q^T when Q is implicit: kept for inverse_diagonal

    @property
    def size(self) -> int:
        return int(self.d.shape[0])

    def _apply_reflectors(self, B, trans):
        # sytrd (lower) gives Q = diag(1, Q'), Q' = H(1)...H(m-1) in ormqr's (QR) storage.
        out = np.array(B, dtype=self.d.dtype, order="F", ndmin=2, copy=True)
        if B.ndim == 1:
            out = out.T
        if self.size > 1 and out.shape[1]:
            (ormqr,) = scipy.linalg.get_lapack_funcs(("ormqr",), (self.reflectors,))
            n_rhs = out.shape[1]
            tail, _, info = ormqr("L", trans, self.reflectors, self.tau,
                                  np.asfortranarray(out[1:]), lwork=64 * n_rhs + 65 * 64,
                                  overwrite_c=1)
            if info != 0:  # argument error: a bug here, not bad input
                raise RuntimeError(f"LAPACK ormqr failed (info={info})")
            out[1:] = tail
        return out[:, 0] if B.ndim == 1 else out

    def project(self, B):
        """``Q^T B`` for B of shape (m,) or (m, k)."""
        if self.Q is not None:
            return self.Q.T @ B
        return self._apply_reflectors(B, "T")

    def expand(self, B):
        """``Q B`` (the inverse of :meth:`project`)."""
        if self.Q is not None:
            return self.Q @ B
        return self._apply_reflectors(B, "N")

    def solve(self, shifts, B):
        """``(T + s I)^{-1} B`` for every shift ``s``: shape ``(len(shifts),) + B.shape``.

        Householder form: the shifted systems are stacked into one block-diagonal
        tridiagonal system (zero couplings between blocks) and solved by one LAPACK
        ``gtsv`` call (LU with partial pivoting), O(m) per shift and column.
        """
        xp = namespace_of(self.d)
        shifts = xp.asarray(shifts, dtype=self.d.dtype).reshape(-1)
        m, L = self.size, shifts.shape[0]
        if self.e is None or m == 1:
            inv = 1.0 / (self.d[None, :] + shifts[:, None])
            return inv * B[None] if B.ndim == 1 else inv[:, :, None] * B[None]
        (gtsv,) = scipy.linalg.get_lapack_funcs(("gtsv",), (self.d,))
        coupling = np.zeros((L, m), dtype=self.d.dtype)
        coupling[:, :-1] = self.e
        rhs = np.tile(B.reshape(m, -1), (L, 1))
        *_, X, info = gtsv(coupling.ravel()[:-1], (self.d[None, :] + shifts[:, None]).ravel(),
                           coupling.ravel()[:-1], rhs, overwrite_b=1)
        if info > 0:
            raise np.linalg.LinAlgError("T + s I is exactly singular for one of the shifts")
        return X.reshape((L,) + B.shape)

    def inverse_diagonal(self, shifts):
        """``diag((A + s I)^{-1})`` for every shift, shape (len(shifts), m).

        O(m) per shift with explicit eigenvectors; O(m^2) per shift from T.
        """
        xp = namespace_of(self.d)
        shifts = xp.asarray(shifts, dtype=self.d.dtype).reshape(-1)
        if self.e is None:
            if self._squares is None:
                self._squares = self.Q * self.Q
            return (self._squares @ (1.0 / (self.d[:, None] + shifts[None, :]))).T
        if self._squares is None:
            self._squares = self.project(np.eye(self.size, dtype=self.d.dtype))  # Q^T
        # diag(Q S Q^T)_i = sum_k (Q^T)_ki (S Q^T)_ki with S = (T + s I)^{-1}
        return np.stack([(self._squares * self.solve([s], self._squares)[0]).sum(axis=0)
                         for s in shifts.tolist()])


def _tridiagonalize_host(A, overwrite_a):
    if A.flags.c_contiguous:  # the Fortran-ordered view of a symmetric matrix: no copy
        A = A.T
    sytrd, = scipy.linalg.get_lapack_funcs(("sytrd",), (A,))
    m = A.shape[0]
    c, d, e, tau, info = sytrd(A, lower=1, lwork=max(1, 64 * m), overwrite_a=overwrite_a)
    if info != 0:
        raise RuntimeError(f"LAPACK sytrd failed (info={info})")
    # The reflectors are c[1:, :-1] in ormqr's storage. Viewed as an m x (m-1) Fortran array
    # with leading dimension m (its last row is c[0, 1:], which ormqr never reads when C has
    # m-1 rows), they reach LAPACK without an m^2 copy.
    item = c.itemsize
    reflectors = np.lib.stride_tricks.as_strided(c[1:], shape=(m, m - 1), strides=(item, m * item))
    return Tridiagonal(d, e, reflectors=reflectors, tau=tau)


def tridiagonal_batch(As: list, *, eigen=False, overwrite_a=False, n_jobs=None) -> list:
    """``A_j = Q_j T_j Q_j^T`` (:class:`Tridiagonal`) for every symmetric ``A_j``.

    CPU: LAPACK ``sytrd`` per part (Householder representation), or with
    ``eigen=True`` ``syevd`` (diagonal T, explicit Q: what a diagonal of
    ``(A + s I)^{-1}`` at many shifts needs). GPU: always the eigen
    representation, by :func:`eigh_batch` (cuSOLVER has no batched
    tridiagonal reduction).

    Examples
    --------
    >>> import numpy as np
    >>> from gpuml.kernels.krr import tridiagonal_batch
    >>> A = np.array([[2.0, 1.0, 0.0], [1.0, 2.0, 1.0], [0.0, 1.0, 2.0]])
    >>> form, = tridiagonal_batch([A])
    >>> b = np.array([1.0, 0.0, 1.0])
    >>> x = form.expand(form.solve([1.0], form.project(b))[0])
    >>> np.allclose((A + np.eye(3)) @ x, b)
    True
    """
    if eigen or (As and is_cupy_array(As[0])):
        return [Tridiagonal(w, Q=Q) for w, Q in eigh_batch(As, overwrite_a=overwrite_a,
                                                             n_jobs=n_jobs)]
    return map_threads(lambda A: _tridiagonalize_host(A, overwrite_a), As, n_jobs)
