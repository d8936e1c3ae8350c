"""Partitioners against literal transcriptions of You 2020's Alg 3, 4 and 9 (the oracles)."""

import functools

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.utils import check_random_state

import gpuml.partition.local as local_module
from gpuml.kernels import fill_nearest_open, nearest_centres, part_sums, read_lag, read_later
from gpuml.kernels import nearest as nearest_module
from gpuml.kernels.pairwise import squared_norms
from gpuml.partition import (
    PARTITIONERS,
    LocalRows,
    algorithms,
    assign_nearest,
    divide,
    kmeans,
    partition,
)
from gpuml.partition.algorithms import kmeans_pp

_BC = load_breast_cancer().data[:540]
# 540 samples, divisible by 3, 5 and 10 as the literal algorithms assume; standardised
# continuous features, so no two centres are exactly equidistant from a sample.
SMALL = (_BC - _BC.mean(0)) / _BC.std(0)
DIGITS = load_digits().data[:600]


# --- literal transcriptions, loop for loop ---------------------------------------------------

def euclid(a, b):
    return np.sqrt(((a - b) ** 2).sum())


def means(SA, MB, P):
    CT = np.zeros((P, SA.shape[1]))
    CS = np.zeros(P, dtype=int)
    for i in range(len(SA)):
        CT[MB[i]] += SA[i]
        CS[MB[i]] += 1
    for i in range(P):
        CT[i] = CT[i] / CS[i]
    return CT


def alg9_kbalance(SA, CT, P):
    """Algorithm 9, K-balance clustering, given the k-means centres CT."""
    n = len(SA)
    CS = [0] * P
    MB = [0] * n
    balanced = n / P
    for i in range(n):
        mindis, minind = np.inf, 0
        for j in range(P):
            dist = euclid(SA[i], CT[j])
            if dist < mindis and CS[j] < balanced:
                mindis, minind = dist, j
        CS[minind] += 1
        MB[i] = minind
    return np.array(MB), means(SA, MB, P)


def alg3_fcfs(SA, P, RS):
    """Algorithm 3, First Come First Served: its loop is line for line Algorithm 9's,
    with the randomly picked samples RS as centres instead of k-means'."""
    return alg9_kbalance(SA, [SA[RS[i]] for i in range(P)], P)


def alg4_bkm(SA, CT, MB, P):
    """Algorithm 4, Balanced K-means, given k-means centres CT and memberships MB."""
    m = len(SA)
    MB = list(MB)
    CS = [MB.count(j) for j in range(P)]
    balanced = m / P
    dist = [[euclid(SA[i], CT[j]) for j in range(P)] for i in range(m)]
    for j in range(P):
        while CS[j] > balanced:
            maxdist, maxind = 0, 0
            for i in range(m):
                if dist[i][j] > maxdist and MB[i] == j:
                    maxdist, maxind = dist[i][j], i
            mindist, minind = np.inf, j
            for k in range(P):
                if dist[maxind][k] < mindist and CS[k] < balanced:
                    mindist, minind = dist[maxind][k], k
            MB[maxind] = minind
            CS[j] -= 1
            CS[minind] += 1
    return np.array(MB), means(SA, MB, P)


# --- tests ------------------------------------------------------------------------------------

def test_fill_reproduces_the_papers_worked_example():
    # Figure 2.3: dist[j][i] between centres C0..C3 and samples S0..S7.
    dist = np.array([[5, 7, 3, 8, 2, 0, 8, 0],
                     [4, 1, 6, 3, 7, 3, 9, 4],
                     [1, 2, 8, 4, 4, 7, 6, 1],
                     [3, 0, 4, 1, 6, 1, 4, 9]], dtype=float)
    counts = np.zeros(4, dtype=np.int64)
    labels = fill_nearest_open(dist.T.copy(), counts, np.full(4, 2, dtype=np.int64))
    # S0->C2, S1->C3, S2->C0, S3->C3, S4->C0, S5->C1, S6->C2, S7->C1 (steps 2.3.2-2.3.9)
    assert labels.tolist() == [2, 3, 0, 3, 0, 1, 2, 1]
    assert counts.tolist() == [2, 2, 2, 2]


def test_fill_numpy_twin_takes_the_compiled_loops_decisions():
    """The twin that fills while numba compiles: same labels and counts, ties included."""
    from gpuml.kernels import _jit
    from gpuml.kernels.nearest.cpu import _fill_nearest_open_numpy
    from gpuml.kernels.nearest.cpu import fill_nearest_open as compiled

    rng = np.random.default_rng(3)
    D = rng.integers(0, 4, size=(500, 7)).astype(float)  # many ties
    D[5, :] = np.inf
    D[9, 2] = np.nan
    caps = np.array([90, 60, 80, 70, 100, 60, 40], dtype=np.int64)
    labels = {}
    D[11, :] = -np.inf
    D[12, 3:] = np.nan
    compiled_fill = functools.partial(_compiled_fill, compiled)
    for name, fill in (("twin", _fill_nearest_open_numpy), ("compiled", compiled_fill)):
        counts = np.zeros(7, dtype=np.int64)
        out = np.empty(500, dtype=np.int64)
        with _jit.synchronous():
            fill(D, counts, caps, out)
        labels[name] = (out, counts)
    np.testing.assert_array_equal(labels["twin"][0], labels["compiled"][0])
    np.testing.assert_array_equal(labels["twin"][1], labels["compiled"][1])
    assert labels["twin"][1].tolist() == caps.tolist()


def _compiled_fill(compiled, D, counts, caps, out):
    compiled(D, np.argmin(D, axis=1), counts, caps, out)


def test_fill_takes_the_nearest_part_at_once_only_when_the_scan_would():
    """The compiled fill takes each row's argmin without scanning when it has room; rows
    whose nearest part is full scan, and both give the paper's loop, written out here."""
    from gpuml.kernels.nearest.cpu import fill_nearest_open as compiled

    rng = np.random.default_rng(5)
    D = rng.integers(0, 6, size=(3000, 40)).astype(np.float32)  # ties everywhere
    D[rng.random(D.shape) < 0.01] = np.inf
    caps = np.full(40, 75, dtype=np.int64)  # every part full by the end
    expected = _paper_fill(D, np.zeros(40, dtype=np.int64), caps)
    out, counts = np.empty(3000, dtype=np.int64), np.zeros(40, dtype=np.int64)
    compiled(D, np.argmin(D, axis=1), counts, caps, out)
    np.testing.assert_array_equal(out, expected)
    assert counts.tolist() == caps.tolist()


def _paper_fill(D, counts, caps):
    """Alg 3's loop as the paper writes it: each row to its nearest part with room left."""
    labels = np.empty(D.shape[0], dtype=np.int64)
    for i, row in enumerate(D):
        best, best_d = -1, np.inf
        for j in range(D.shape[1]):
            if counts[j] < caps[j] and row[j] < best_d:
                best, best_d = j, row[j]
        counts[best] += 1
        labels[i] = best
    return labels


@pytest.mark.parametrize("kind", ["float32", "float64", "csr", "csr centres"])
def test_open_distances_are_the_shifted_distances_of_open_parts_bit_for_bit(kind):
    """A fill's blocks carry the -2 in the centres (exact) and inf for full parts: the
    open columns equal shifted_sq_distances' exactly, so the fill's decisions cannot move."""
    from gpuml.kernels import OpenDistances
    from gpuml.kernels.pairwise import shifted_sq_distances

    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 17)) * rng.uniform(0.01, 100, size=17)
    X = X.astype(np.float64 if kind == "float64" else np.float32)
    C = X[rng.choice(300, 23, replace=False)].copy()
    if kind.startswith("csr"):
        X[rng.random(X.shape) < 0.7] = 0.0
        C = X[:23].copy()
        X = sp.csr_matrix(X)
        C = sp.csr_matrix(C) if kind == "csr centres" else C
    counts = rng.integers(0, 5, size=23)
    caps = np.full(23, 3)
    D = OpenDistances(C)(X, counts, caps)
    ref = shifted_sq_distances(X, C)
    open_ = counts < caps
    assert D.dtype == ref.dtype
    assert np.array_equal(D[:, open_], ref[:, open_])
    assert np.isposinf(D[:, ~open_]).all() and (~open_).any() and open_.any()


def test_fill_in_blocks_is_the_papers_loop_over_the_distances(monkeypatch):
    """The in-process fill (full parts masked block by block, small blocks here) gives the
    paper's loop over every row's distances to every centre."""
    from gpuml.kernels.pairwise import shifted_sq_distances

    monkeypatch.setattr(nearest_module, "BLOCK_BYTES", 8 * 40 * 37)  # blocks of 37 rows
    rng = np.random.default_rng(11)
    X = rng.integers(-2, 3, size=(2000, 3)).astype(np.float64)  # ties everywhere
    C = X[rng.choice(2000, 40, replace=False)]
    caps = np.full(40, 50, dtype=np.int64)  # every part full by the end
    expected = _paper_fill(shifted_sq_distances(X, C), np.zeros(40, dtype=np.int64), caps)
    counts = np.zeros(40, dtype=np.int64)
    np.testing.assert_array_equal(local_module.fill(X, C, counts, caps), expected)
    assert counts.tolist() == caps.tolist()


@pytest.mark.parametrize("r", [1, 2, 4, 40])
def test_fill_from_candidates_takes_the_scans_decisions(r, monkeypatch):
    """A device's fill reads back each row's first r candidates among the parts open when
    its block began, and a row's distances (with the next FILL_SCAN_ROWS rows') only where
    all its candidates filled within the block or are not at a finite distance: block by
    block, with ties, infinite and NaN distances, the paper's loop's labels and counts
    (here with NumPy arrays, the GPU's oracle)."""
    import gpuml.kernels.nearest.cpu as nearest_cpu
    from gpuml.kernels import fill_by_candidates

    rng = np.random.default_rng(7)
    D = rng.integers(0, 6, size=(3000, 40)).astype(np.float32)  # ties everywhere
    D[rng.random(D.shape) < 0.01] = np.inf
    D[17, :] = np.inf
    D[23, 5] = np.nan
    D[31, :] = -np.inf
    caps = np.full(40, 75, dtype=np.int64)  # every part full by the end
    expected = _paper_fill(D, np.zeros(40, dtype=np.int64), caps)
    scanned = []
    real_scan = nearest_cpu.fill_nearest_open
    monkeypatch.setattr(nearest_cpu, "fill_nearest_open",
                        lambda rows, *a: (scanned.append(rows.shape[0]), real_scan(rows, *a))[1])
    counts, got = np.zeros(40, dtype=np.int64), []
    for start in range(0, 3000, 700):  # blocks: counts carried from one to the next
        got.append(fill_by_candidates(D[start:start + 700], counts, caps, r))
    np.testing.assert_array_equal(np.concatenate(got), expected)
    assert counts.tolist() == caps.tolist()
    # the rows with non-finite distances scan; with every part a candidate, only they do
    assert scanned and (r < 40 or len(scanned) <= 4)


def test_only_a_small_fill_takes_the_numpy_twin(monkeypatch):
    """While numba compiles the fill loop, a small fill takes the twin; a large one, filled
    block by block, takes the loop for every block: the twin's Python step per row would
    cost it far more than the compile (a 1,000,000-row fill: seconds)."""
    from gpuml.kernels import _jit
    from gpuml.kernels.nearest import cpu as nearest_cpu
    from gpuml.kernels.pairwise import shifted_sq_distances, squared_norms
    from gpuml.partition.local import fill

    twin_rows = []
    real_twin = nearest_cpu._fill_nearest_open_numpy

    def spy(D, *args):
        twin_rows.append(D.shape[0])
        real_twin(D, *args)

    monkeypatch.setattr(nearest_cpu, "_fill_nearest_open_numpy", spy)
    monkeypatch.setattr(_jit, "ready", lambda *args, **kw: False)  # as if numba were compiling
    monkeypatch.setattr(nearest_cpu, "NUMPY_TWIN_MAX_ENTRIES", 4_000)
    monkeypatch.setattr("gpuml.kernels.nearest.BLOCK_BYTES", 8 * 4 * 300)  # 300-row blocks
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((4, 3))
    results = {}
    for n in (900, 3_000):  # 3,600 and 12,000 entries: 3 and 10 blocks
        X = rng.standard_normal((n, 3))
        counts = np.zeros(4, dtype=np.int64)
        caps = np.full(4, n // 4 + 1, dtype=np.int64)
        twin_rows.clear()
        labels = fill(X, centers, counts, caps)
        results[n] = list(twin_rows)
        # the same decisions as one pass over all the distances
        expected = np.empty(n, dtype=np.int64)
        real_twin(shifted_sq_distances(X, centers, squared_norms(centers)),
                  np.zeros(4, dtype=np.int64), caps, expected)
        np.testing.assert_array_equal(labels, expected)
        assert counts.sum() == n
    assert results == {900: [300, 300, 300], 3_000: []}


@pytest.mark.parametrize("P", [3, 5, 10])
def test_fcfs_matches_algorithm_3(P):
    labels, centers = partition(SMALL, P, "fcfs", random_state=7)
    RS = np.sort(check_random_state(7).choice(len(SMALL), P, replace=False))
    MB, CT = alg3_fcfs(SMALL, P, RS)
    np.testing.assert_array_equal(labels, MB)
    np.testing.assert_allclose(centers, CT, rtol=1e-12)


@pytest.mark.parametrize("P", [3, 5, 10])
def test_kbalance_matches_algorithm_9(P):
    labels, centers = partition(SMALL, P, "kbalance", random_state=3)
    _, CT = kmeans(SMALL, P, random_state=3)
    MB, CT_final = alg9_kbalance(SMALL, CT, P)
    np.testing.assert_array_equal(labels, MB)
    np.testing.assert_allclose(centers, CT_final, rtol=1e-12)


@pytest.mark.parametrize("P", [3, 5, 10])
def test_bkm_matches_algorithm_4(P):
    labels, centers = partition(SMALL, P, "bkm", random_state=5)
    km_labels, CT = kmeans(SMALL, P, random_state=5)
    MB, CT_final = alg4_bkm(SMALL, CT, km_labels, P)
    np.testing.assert_array_equal(labels, MB)
    np.testing.assert_allclose(centers, CT_final, rtol=1e-12)


def test_kmeans_is_a_fixed_point_and_as_good_as_sklearn():
    labels, centers = kmeans(DIGITS, 10, random_state=0, tol=0)
    np.testing.assert_array_equal(assign_nearest(DIGITS, centers), labels)
    for j in range(10):
        np.testing.assert_allclose(centers[j], DIGITS[labels == j].mean(0), rtol=1e-10)
    inertia = ((DIGITS - centers[labels]) ** 2).sum()
    reference = KMeans(10, n_init=1, random_state=0).fit(DIGITS).inertia_
    assert inertia <= 1.05 * reference


@pytest.mark.parametrize("method", ["random", "contiguous", "fcfs", "kbalance", "bkm"])
@pytest.mark.parametrize("P", [1, 7, 64, 599, 600])
def test_balanced_methods_differ_by_at_most_one(method, P):
    labels, centers = partition(DIGITS, P, method, random_state=0)
    sizes = np.bincount(labels, minlength=P)
    assert sizes.sum() == len(DIGITS)
    assert sizes.max() - sizes.min() <= 1
    assert centers.shape == (P, DIGITS.shape[1])


@pytest.mark.parametrize("method", ["random", "contiguous", "fcfs", "kbalance", "bkm"])
def test_centres_are_part_means(method):
    labels, centers = partition(DIGITS, 6, method, random_state=1)
    for j in range(6):
        np.testing.assert_allclose(centers[j], DIGITS[labels == j].mean(0), rtol=1e-10)


def test_contiguous_parts_are_the_runs_of_rows_as_they_lie():
    # You 2020, Alg 5 as run (casvm2): part j is the j-th run of rows, the first n % P
    # runs one row longer; no random draw.
    n, P = len(DIGITS), 7
    labels, _ = partition(DIGITS, P, "contiguous", random_state=0)
    lo, r = divmod(n, P)
    expected = np.concatenate([np.full(lo + (j < r), j) for j in range(P)])
    np.testing.assert_array_equal(labels, expected)
    np.testing.assert_array_equal(partition(DIGITS, P, "contiguous", random_state=5)[0], labels)


def test_kmeans_is_unbalanced_but_kbalance_is_not():
    blobs = np.concatenate([np.zeros((90, 2)), np.ones((10, 2)) * 10]) + \
        np.random.default_rng(0).normal(scale=0.1, size=(100, 2))
    km = np.bincount(partition(blobs, 2, "kmeans", random_state=0)[0])
    kb = np.bincount(partition(blobs, 2, "kbalance", random_state=0)[0])
    assert sorted(km.tolist()) == [10, 90]
    assert kb.tolist() == [50, 50]


@pytest.mark.parametrize("method", sorted(PARTITIONERS))
def test_deterministic_sparse_equal_and_input_untouched(method):
    # dense rows take the fused nearest-centre loop, CSR the GEMM path: the same result
    X = DIGITS.copy()
    a = partition(X, 8, method, random_state=11)
    b = partition(X, 8, method, random_state=11)
    c = partition(sp.csr_matrix(X), 8, method, random_state=11)
    np.testing.assert_array_equal(X, DIGITS)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[0], c[0])
    np.testing.assert_allclose(a[1], c[1], rtol=1e-10)


@pytest.mark.parametrize("P", [3, 10, 64])
def test_fused_nearest_matches_the_gemm_path_and_a_plain_loop(P, monkeypatch):
    # P = 64 on 30 features (1,920 entries) runs the fused loop, as do 3 and 10; with the
    # bound at 0 the same call takes the blocked-GEMM path (the CuPy and CSR one).
    centers = SMALL[np.random.default_rng(P).choice(len(SMALL), P, replace=False)] + 0.1
    fused = nearest_centres(SMALL, centers, with_sums=True)
    monkeypatch.setattr(nearest_module, "FUSED_MAX_ENTRIES", 0)
    gemm = nearest_centres(SMALL, centers, with_sums=True)
    plain = np.array([np.argmin([euclid(x, c) for c in centers]) for x in SMALL])
    for labels, sums, counts in (fused, gemm):
        np.testing.assert_array_equal(labels, plain)
        np.testing.assert_array_equal(counts, np.bincount(plain, minlength=P))
        np.testing.assert_allclose(sums, [SMALL[plain == j].sum(0) for j in range(P)],
                                   rtol=1e-12, atol=1e-12)
    assert nearest_centres(SMALL.astype(np.float32), centers.astype(np.float32)).dtype == np.int64


def _rotated_lattice(side, d, seed=0):
    """The points of a square lattice, turned by a random rotation. Many rows are exactly
    as far from two others (or two means of others) but for rounding: any change in
    how a distance is rounded gives some of them to the other centre."""
    rotation, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    points = np.stack(np.meshgrid(*[np.arange(float(side))] * d, indexing="ij"), -1)
    return points.reshape(-1, d) @ rotation


def _fused_data(data, dtype):
    # More rows than one sum block of the fused pass, so that partial sums are added.
    if data == "lattice":
        return _rotated_lattice(12, 4).astype(dtype)
    return np.random.default_rng(5).normal(size=(40_000, 6)).astype(dtype)


def _every_way(monkeypatch, run, switch=False):
    """``run()`` by the compiled sweep on 1, 2 and 3 cores, by its NumPy twin (numba still
    compiling), and with ``switch`` by the twin until the compile ends midway."""
    from gpuml.kernels import _jit

    # Threads from 2,000 rows, so that test-sized inputs are split among the cores.
    monkeypatch.setattr(nearest_module, "MIN_ROWS_PER_THREAD", 1000)
    results, real_ready = {}, _jit.ready
    for cores in (1, 2, 3):
        monkeypatch.setattr(nearest_module, "_cores", lambda cores=cores: cores)
        results[f"compiled, {cores} cores"] = run()
    asked = []
    monkeypatch.setattr(_jit, "ready",
                        lambda dispatcher, *args, **kw: asked.append(dispatcher) or False)
    results["twin"] = run()
    assert asked  # the twin ran (the input is under its size bound)
    if switch:
        passes = len(asked)
        asked.clear()
        monkeypatch.setattr(_jit, "ready", lambda dispatcher, *args, **kw: (
            asked.append(dispatcher) or len(asked) > passes // 2) and real_ready(dispatcher, *args))
        results["twin, then compiled"] = run()
        assert passes >= 4 and len(asked) == passes
    return results


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("data", ["lattice", "random"])
def test_fused_sweep_gives_the_same_bits_compiled_or_not_on_any_cores(data, dtype, monkeypatch):
    # Which of the sweep and its NumPy twin runs depends on whether numba's background
    # compile has ended, and the sweep's threads on the machine: neither may change a bit
    # of the labels, the sums or the counts (the lattice's centres are rows of it: near-ties).
    X = _fused_data(data, dtype)
    centers = X[np.random.default_rng(1).choice(len(X), 16, replace=False)]
    results = _every_way(monkeypatch, lambda: nearest_centres(X, centers, with_sums=True))
    (_, (labels, sums, counts)), *others = results.items()
    assert sums.dtype == dtype and len(np.unique(labels)) == 16
    for way, (other_labels, other_sums, other_counts) in others:
        np.testing.assert_array_equal(other_labels, labels, way)
        np.testing.assert_array_equal(other_sums, sums, way)
        np.testing.assert_array_equal(other_counts, counts, way)


def test_fused_twin_passes_over_nan_distances_as_the_sweep(monkeypatch):
    # Infinite coordinates make some distances NaN: argmin would pick a NaN, the sweep's
    # strict < never does, and a row at NaN from every centre goes to centre 0.
    X = np.random.default_rng(2).normal(size=(50, 3))
    X[:5, 0] = np.inf  # NaN from centres 0 and 1, -inf from centre 2
    X[5, 1] = np.nan
    centers = np.array([[np.inf, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    with np.errstate(invalid="ignore"):
        results = _every_way(monkeypatch, lambda: nearest_centres(X, centers, with_sums=True))
    (_, (labels, sums, counts)), *others = results.items()
    assert labels[:6].tolist() == [2] * 5 + [0] and set(labels[6:]) == {1, 2}
    for way, (other_labels, other_sums, other_counts) in others:
        np.testing.assert_array_equal(other_labels, labels, way)
        np.testing.assert_array_equal(other_sums, sums, way)
        np.testing.assert_array_equal(other_counts, counts, way)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("method, data", [("kmeans", "lattice"), ("kbalance", "lattice"),
                                          ("bkm", "lattice"), ("kmeans", "random")])
def test_kmeans_partitions_are_the_same_bits_compiled_or_not_on_any_cores(method, data, dtype,
                                                                          monkeypatch):
    # Every Lloyd pass asks afresh whether numba has compiled, so a compile ending midway
    # mixes the twin's passes and the sweep's: the partition must not depend on it.
    X = _fused_data(data, dtype)
    results = _every_way(monkeypatch, lambda: partition(X, 16, method, random_state=0),
                         switch=True)
    (_, (labels, centers)), *others = results.items()
    for way, (other_labels, other_centers) in others:
        np.testing.assert_array_equal(other_labels, labels, way)
        np.testing.assert_array_equal(other_centers, centers, way)


def test_assign_nearest_routes_to_the_closest_centre():
    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    X = np.array([[1.0, 1.0], [9.0, -1.0], [-1.0, 8.0], [4.0, 0.0]])
    assert assign_nearest(X, centers).tolist() == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="features"):
        assign_nearest(X, centers[:, :1])


@pytest.mark.parametrize("bad, match", [
    (np.array([[1.0, np.nan]] * 4), "NaN"),
    (np.array([[1.0, np.inf]] * 4), "infinity"),
    (np.ones(4), "2D array"),
    (np.empty((0, 3)), "0 sample"),
    (np.array([["a", "b"]] * 4), "could not convert|dtype"),
])
def test_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        partition(bad, 2, "kmeans")


@pytest.mark.parametrize("P, error", [(0, ValueError), (-1, ValueError), (601, ValueError),
                                      (2.5, TypeError), (True, TypeError)])
def test_bad_n_partitions(P, error):
    with pytest.raises(error, match="n_partitions"):
        partition(DIGITS, P, "random")


def test_unknown_method():
    with pytest.raises(ValueError, match="partition method must be one of"):
        partition(DIGITS, 2, "spectral")


# --- the GPU path's logic, run on NumPy: what a GPU run does differently must not change results

def _count_passes(monkeypatch):
    passes = []
    original = local_module.nearest_centres

    def counted(*args, **kwargs):
        passes.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(local_module, "nearest_centres", counted)
    return passes


@pytest.mark.parametrize("lag", [1, 3])
@pytest.mark.parametrize("max_iter, tol", [(100, 1e-4), (30, 1e-4), (31, 1e-4), (32, 1e-4),
                                           (1, 1e-4), (0, 1e-4), (100, 0.0), (100, 1e9)])
def test_lloyd_reading_behind_stops_where_the_host_does(lag, max_iter, tol, monkeypatch):
    # DIGITS, P = 8, random_state=2 stops after 31 Lloyd passes (past the first) at tol=1e-4;
    # a loop reading its shifts `lag` passes late must return the very same labels and
    # centres, whether it stops on the tolerance or on max_iter, and run at most `lag`
    # passes more. (The patched read_lag also takes the seeding-ahead path.)
    passes = _count_passes(monkeypatch)
    labels, centers = kmeans(DIGITS, 8, random_state=2, max_iter=max_iter, tol=tol)
    host_passes = len(passes)
    monkeypatch.setattr(local_module, "read_lag", lambda like: lag)
    passes.clear()
    lag_labels, lag_centers = kmeans(DIGITS, 8, random_state=2, max_iter=max_iter, tol=tol)
    np.testing.assert_array_equal(lag_labels, labels)
    np.testing.assert_array_equal(lag_centers, centers)
    assert lag_centers.flags.c_contiguous
    assert host_passes <= len(passes) <= min(host_passes + lag, max_iter + 1)
    if (max_iter, tol) == (100, 1e-4):
        assert host_passes == 32


@pytest.mark.parametrize("P", [1, 2, 10, 64, 600])
def test_seeding_ahead_draws_what_seeding_in_turn_draws(P):
    # The device seeding draws every uniform first and picks with total * u; on float64
    # input that is the host's rng.uniform(0, total) pick for pick, and the generator
    # ends in the same state.
    rng_turn, rng_ahead = check_random_state(4), check_random_state(4)
    in_turn = kmeans_pp(LocalRows(DIGITS), P, rng_turn)  # draws the first row itself
    first = int(rng_ahead.randint(len(DIGITS)))
    ahead = LocalRows(DIGITS).seed_ahead(first, P, rng_ahead)
    np.testing.assert_array_equal(ahead, in_turn)
    assert rng_ahead.randint(2**31) == rng_turn.randint(2**31)


def test_seeding_ahead_falls_back_when_the_host_would_draw_otherwise(monkeypatch):
    # Three distinct points, five parts: from the fourth pick on every distance is 0 and
    # the host draws randint instead of uniform. The speculative picks are dropped and
    # the seeding repeated in turn from the saved state: same centres, same generator.
    X = np.repeat([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]], 4, axis=0)  # exact distances
    assert LocalRows(X).seed_ahead(0, 5, check_random_state(0)) is None
    host_rng, lag_rng = check_random_state(9), check_random_state(9)
    expected = kmeans_pp(LocalRows(X), 5, host_rng)
    monkeypatch.setattr(local_module, "read_lag", lambda like: 1)
    assert LocalRows(X).read_lag == 1
    np.testing.assert_array_equal(kmeans_pp(LocalRows(X), 5, lag_rng), expected)
    assert lag_rng.randint(2**31) == host_rng.randint(2**31)
    # distances that overflow: the host raises on uniform(0, nan); so must the fallback
    huge = np.array([[1e200, 0.0], [0.0, 1e200], [1.0, 1.0]] * 3)
    with np.errstate(all="ignore"), pytest.raises(OverflowError):
        kmeans_pp(LocalRows(huge), 3, check_random_state(0))


@pytest.mark.parametrize("P", [3, 64])
def test_one_hot_gemm_sums_match_the_sparse_product(P, monkeypatch):
    # The dense-GPU sums (one-hot GEMM per row block into the distance buffer), run on
    # NumPy with blocks of 50 rows: labels as the plain GEMM pass, sums and counts as
    # the sparse one-hot product and a plain loop.
    monkeypatch.setattr(nearest_module, "BLOCK_BYTES", 50 * P * 8)
    centers = SMALL[np.random.default_rng(P).choice(len(SMALL), P, replace=False)] + 0.1
    plain = np.array([np.argmin([euclid(x, c) for c in centers]) for x in SMALL])
    labels, sums, counts = nearest_module._blocked_nearest_sums(
        SMALL, centers, squared_norms(centers), np.empty(len(SMALL), dtype=np.int64))
    dense_sums, dense_counts = nearest_module._dense_part_sums(SMALL, plain, P)
    sparse_sums, sparse_counts = part_sums(SMALL, plain, P)
    np.testing.assert_array_equal(labels, plain)
    for s, c in ((sums, counts), (dense_sums, dense_counts)):
        assert c.dtype == np.int64
        np.testing.assert_array_equal(c, sparse_counts)
        np.testing.assert_allclose(s, sparse_sums, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s, [SMALL[plain == j].sum(0) for j in range(P)],
                                   rtol=1e-12, atol=1e-12)


def test_means_of_empty_parts_keep_the_fallback_without_a_mask():
    sums = np.array([[2.0, 4.0], [0.0, 0.0], [3.0, 3.0]])
    counts = np.array([2, 0, 3])
    fallback = np.array([[9.0, 9.0], [7.0, 8.0], [9.0, 9.0]])
    means = divide(sums, counts, fallback)
    np.testing.assert_array_equal(means, [[1.0, 2.0], [7.0, 8.0], [1.0, 1.0]])
    np.testing.assert_array_equal(divide(sums, counts),
                                  [[1.0, 2.0], [0.0, 0.0], [1.0, 1.0]])


def test_reads_on_the_host_are_immediate():
    x = np.array(2.5)
    reader = read_later(x)
    x[...] = 7.0  # read when asked for, not when called
    assert reader() == 2.5 and isinstance(reader(), float)
    assert read_lag(x) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("method", sorted(PARTITIONERS))
def test_gpu_matches_cpu(method):
    import cupy as cp

    cpu_labels, cpu_centers = partition(DIGITS, 8, method, random_state=2)
    labels, centers = partition(cp.asarray(DIGITS), 8, method, random_state=2)
    assert isinstance(labels, cp.ndarray) and isinstance(centers, cp.ndarray)
    np.testing.assert_array_equal(labels.get(), cpu_labels)
    np.testing.assert_allclose(centers.get(), cpu_centers, rtol=1e-9)
    routed = assign_nearest(cp.asarray(DIGITS[:50]), centers)
    np.testing.assert_array_equal(routed.get(), assign_nearest(DIGITS[:50], cpu_centers))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_one_hot_gemm_sums_match_cpu(dtype, monkeypatch):
    # Several row blocks (50 rows each) through the dense-GPU pass and part_sums.
    import cupy as cp

    monkeypatch.setattr(nearest_module, "BLOCK_BYTES", 50 * 10 * 8)
    X = SMALL.astype(dtype)
    centers = X[np.random.default_rng(0).choice(len(X), 10, replace=False)] + dtype(0.1)
    labels, sums, counts = nearest_centres(cp.asarray(X), cp.asarray(centers), with_sums=True)
    labels = labels.get()
    assert labels.dtype == np.int64 and counts.dtype == np.int64 and sums.dtype == dtype
    if dtype == np.float64:  # float32 distances may order near-ties differently on the GPU
        np.testing.assert_array_equal(labels, nearest_centres(X, centers))
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    expected_sums, expected_counts = part_sums(X, labels, 10)
    for s, c in ((sums, counts), part_sums(cp.asarray(X), cp.asarray(labels), 10)):
        np.testing.assert_array_equal(c.get(), expected_counts)
        np.testing.assert_allclose(s.get(), expected_sums, rtol=rtol, atol=rtol * 10)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("max_iter", [100, 31, 32, 3])
def test_gpu_reading_behind_is_bitwise_reading_at_once(dtype, max_iter, monkeypatch):
    # On one GPU: seeding ahead + Lloyd reading one pass late against seeding in turn +
    # reading every shift at once (read_lag 0): the same labels and centres, bit for bit.
    import cupy as cp

    X = cp.asarray(DIGITS.astype(dtype))
    labels, centers = kmeans(X, 8, random_state=2, max_iter=max_iter)
    monkeypatch.setattr(local_module, "read_lag", lambda like: 0)
    at_once_labels, at_once_centers = kmeans(X, 8, random_state=2, max_iter=max_iter)
    np.testing.assert_array_equal(labels.get(), at_once_labels.get())
    np.testing.assert_array_equal(centers.get(), at_once_centers.get())


@pytest.mark.gpu
@pytest.mark.parametrize("r", [1, 4])
def test_gpu_fill_reads_candidates_and_takes_the_scans_decisions(r):
    """A fill of CuPy distances (fill_nearest_open: the candidates' path) gives the paper's
    loop's labels and counts, ties first to the lower part as NumPy's argmin."""
    import cupy as cp

    from gpuml.kernels import fill_by_candidates

    rng = np.random.default_rng(7)
    D = rng.integers(0, 6, size=(3000, 40)).astype(np.float32)
    D[rng.random(D.shape) < 0.01] = np.inf
    D[17, :] = np.inf
    caps = np.full(40, 75, dtype=np.int64)
    expected = _paper_fill(D, np.zeros(40, dtype=np.int64), caps)
    counts, got = np.zeros(40, dtype=np.int64), []
    for start in range(0, 3000, 700):
        block = cp.asarray(D[start:start + 700])
        got.append((fill_by_candidates(block, counts, caps, r) if r != 4
                    else fill_nearest_open(block, counts, caps)).get())
    np.testing.assert_array_equal(np.concatenate(got), expected)
    assert counts.tolist() == caps.tolist()


@pytest.mark.gpu
def test_gpu_seeding_ahead_falls_back_like_the_host():
    import cupy as cp

    X = np.repeat([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]], 4, axis=0)
    host_rng, gpu_rng = check_random_state(9), check_random_state(9)
    expected = kmeans_pp(LocalRows(X), 5, host_rng)
    np.testing.assert_array_equal(kmeans_pp(LocalRows(cp.asarray(X)), 5, gpu_rng).get(),
                                  expected)
    assert gpu_rng.randint(2**31) == host_rng.randint(2**31)


# -- k-means on a sample (many rows) --------------------------------------------------------------

def _blobs(n, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(12, 6))
    return centres[rng.integers(0, 12, size=n)] + rng.normal(size=(n, 6))


def test_kmeans_on_many_rows_runs_on_a_sample_then_assigns_every_row(monkeypatch):
    X = _blobs(6000)
    monkeypatch.setattr(algorithms, "KMEANS_MIN_ROWS", 500)
    monkeypatch.setattr(algorithms, "KMEANS_ROWS_PER_CENTRE", 50)
    assert algorithms.kmeans_rows(6000, 8) == 500 and algorithms.kmeans_rows(6000, 20) == 1000
    assert algorithms.kmeans_rows(300, 20) == 300
    # Written out: k-means (k-means++ seeds, Lloyd) on 1,000 rows drawn without
    # replacement from the same generator, then every row to its nearest centre.
    rng = check_random_state(4)
    ids = np.sort(rng.choice(6000, 1000, replace=False))
    expected, _ = algorithms.lloyd(LocalRows(X[ids]), 20, rng)
    centers, sizes = algorithms.lloyd(LocalRows(X), 20, check_random_state(4))
    np.testing.assert_array_equal(centers, expected)
    np.testing.assert_array_equal(sizes, np.bincount(assign_nearest(X, centers), minlength=20))
    # K-balance stays balanced.
    sizes = np.bincount(partition(X, 20, "kbalance", random_state=0)[0], minlength=20)
    assert sizes.max() - sizes.min() <= 1
    # As good a clustering of all rows as k-means on all of them.
    labels, centers = partition(X, 20, "kmeans", random_state=0)
    monkeypatch.setattr(algorithms, "KMEANS_MIN_ROWS", 10**9)
    labels_all, centers_all = partition(X, 20, "kmeans", random_state=0)
    assert not np.array_equal(centers, centers_all)
    inertia = ((X - centers[labels]) ** 2).sum()
    assert inertia <= 1.03 * ((X - centers_all[labels_all]) ** 2).sum()


def test_apportion_shares_the_parts_by_rows():
    rng = np.random.default_rng(0)
    for _ in range(500):
        sizes = rng.integers(0, 40, size=rng.integers(1, 10))
        held = int((sizes > 0).sum())
        if not held:
            continue
        total = int(rng.integers(held, sizes.sum() + 1))
        share = algorithms.apportion(sizes, total)
        assert share.sum() == total and (share <= sizes).all()
        assert (share[sizes > 0] >= 1).all() and (share[sizes == 0] == 0).all()
        # proportional: no group is more than one part (plus its floor of one) off its quota
        quota = sizes * total / sizes.sum()
        assert (np.abs(share - quota) < 1 + (quota < 1)).all()
    assert algorithms.apportion(np.array([100, 1, 1, 1]), 4).tolist() == [1, 1, 1, 1]


def test_kmeans_with_many_centres_runs_in_two_levels_on_the_sample(monkeypatch):
    X = _blobs(8000, seed=1)
    monkeypatch.setattr(algorithms, "KMEANS_MIN_ROWS", 500)
    monkeypatch.setattr(algorithms, "KMEANS_ROWS_PER_CENTRE", 40)
    monkeypatch.setattr(algorithms, "KMEANS_TWO_LEVEL_PARTS", 30)
    P = 40
    # Written out: the same 1,600 rows drawn, ceil(sqrt(40)) = 7 centres of them, then in
    # each of their groups its share of the 40 by k-means on the group, same generator.
    rng = check_random_state(3)
    S = X[np.sort(rng.choice(8000, 1600, replace=False))]
    top, _ = algorithms.lloyd(LocalRows(S), 7, rng)
    groups = assign_nearest(S, top)
    share = algorithms.apportion(np.bincount(groups, minlength=7), P)
    expected = np.concatenate([algorithms.lloyd(LocalRows(S[groups == g]), int(share[g]), rng)[0]
                               for g in np.flatnonzero(share)])
    centers, sizes = algorithms.lloyd(LocalRows(X), P, check_random_state(3))
    np.testing.assert_array_equal(centers, expected)
    np.testing.assert_array_equal(sizes, np.bincount(assign_nearest(X, centers), minlength=P))
    # K-balance stays balanced, and the clustering of every row is about as good as that
    # of flat k-means on the same sample.
    sizes = np.bincount(partition(X, P, "kbalance", random_state=0)[0], minlength=P)
    assert sizes.max() - sizes.min() <= 1
    labels, centers = partition(X, P, "kmeans", random_state=0)
    monkeypatch.setattr(algorithms, "KMEANS_TWO_LEVEL_PARTS", 10**9)
    labels_flat, centers_flat = partition(X, P, "kmeans", random_state=0)
    inertia = ((X - centers[labels]) ** 2).sum()
    assert inertia <= 1.1 * ((X - centers_flat[labels_flat]) ** 2).sum()
