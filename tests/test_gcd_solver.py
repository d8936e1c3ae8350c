"""The Asy-GCD solver (You 2020, Alg 13/14) against independent solutions of the same QP."""

import threading

import numpy as np
import pytest
from numba import njit
from scipy.optimize import minimize
from sklearn.datasets import load_breast_cancer, load_digits

from gpuml.kernels import Kernel, gcd_gradient, gcd_objectives, gcd_solve, make_kernel
from gpuml.kernels.gcd import cpu as cpu_gcd
from gpuml.kernels.gcd.atomics import atomic_add, atomic_add_seq, atomic_load, atomic_store


def _standardise(X):
    return (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)


X_BC, Y_BC = load_breast_cancer(return_X_y=True)
X_BC = _standardise(X_BC)
Y_BC = np.where(Y_BC == 1, 1.0, -1.0)
X_DIG, Y_DIG = load_digits(return_X_y=True)
X_DIG = _standardise(X_DIG)
Y_DIG = np.where(Y_DIG < 5, 1.0, -1.0)


def _objective(Q, alpha):
    return 0.5 * alpha @ Q @ alpha - alpha.sum()


def _q_matrix(kernel, X, y):
    return np.outer(y, y) * kernel.matrix(X)


def _lbfgsb(Q, C):
    res = minimize(lambda a: (_objective(Q, a), Q @ a - 1.0), np.zeros(len(C)), jac=True,
                   method="L-BFGS-B", bounds=list(zip(np.zeros(len(C)), C)),
                   options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 20000})
    return res.fun


def _split(n, workers, seed=0):
    labels = np.empty(n, dtype=np.int64)
    labels[np.random.default_rng(seed).permutation(n)] = np.arange(n) % workers
    return labels


@njit(nogil=True)
def _hammer(a, idx, reps, use_atomic):
    for k in range(reps):
        j = idx[k % idx.size]
        if use_atomic:
            atomic_add(a, j, 0.5)
        else:
            a[j] += 0.5


def test_atomic_float_add_loses_nothing_under_contention():
    idx = np.array([0, 1, 2, 3, 1, 0, 3, 2], dtype=np.int64)
    reps, n_threads = 300_000, 4
    a = np.zeros(4)
    threads = [threading.Thread(target=_hammer, args=(a, idx, reps, True))
               for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every add is exact in binary (halves); a lost update would show as a smaller total.
    assert a.sum() == 0.5 * reps * n_threads
    np.testing.assert_array_equal(a, np.full(4, 0.5 * reps * n_threads / 4))


def test_atomic_helpers_on_integers_and_float32():
    @njit
    def use(c, f):
        old = atomic_add_seq(c, 0, 5)
        atomic_store(c, 1, 7)
        atomic_add(f, 2, np.float32(1.5))
        return old, atomic_load(c, 0), atomic_load(c, 1)

    c = np.array([3, 0], dtype=np.int64)
    f = np.zeros(3, dtype=np.float32)
    assert use(c, f) == (3, 8, 7)
    assert f[2] == np.float32(1.5)


@pytest.mark.parametrize("name", ["linear", "poly", "rbf", "sigmoid", "precomputed"])
def test_columns_match_pairwise_kernels(name):
    X = X_BC[:60]
    kernel = Kernel(name, gamma=0.03, degree=2, coef0=0.5)
    data = Kernel("rbf", 0.03).matrix(X) if name == "precomputed" else X
    y = np.where(np.arange(60) % 3 == 0, -1.0, 1.0)
    expected = np.outer(y, y) * (data if name == "precomputed" else kernel.matrix(X))
    out = np.empty(60)
    for i in (0, 17, 59):
        cpu_gcd.fill_column(np.ascontiguousarray(data), np.einsum("ij,ij->i", X, X), y, i,
                            cpu_gcd.KERNEL_CODES[name], kernel.gamma, kernel.coef0,
                            kernel.degree, out)
        np.testing.assert_allclose(out, expected[:, i], rtol=1e-12, atol=1e-12)


def test_vectorised_exp_is_within_two_ulps_of_libm():
    from gpuml.kernels.vexp import XMIN, exp_nonpositive

    rng = np.random.default_rng(0)
    x = np.concatenate([[0.0, -0.0, -1e-300, XMIN, -745.0, -1e4, -np.inf],
                        -rng.exponential(1.0, 5000), rng.uniform(XMIN, 0.0, 5000)])
    out = np.empty_like(x)
    exp_nonpositive(x, out, np.empty(x.size, dtype=np.int64))
    normal = x >= XMIN
    expected = np.exp(x)
    assert out[0] == out[1] == 1.0
    np.testing.assert_array_less(np.abs(out[normal] - expected[normal]),
                                 2.0 * np.spacing(expected[normal]) + 1e-300)
    np.testing.assert_array_equal(out[~normal], 0.0)  # true values below 3.3e-308


def test_vectorised_float32_exp_is_within_two_ulps_of_the_exact_value():
    from gpuml.kernels.vexp import XMIN_F32, exp_nonpositive_f32

    rng = np.random.default_rng(0)
    x = np.concatenate([[0.0, -0.0, -1e-30, XMIN_F32, -87.4, -104.0, -1e4, -np.inf],
                        -rng.exponential(1.0, 5000), rng.uniform(XMIN_F32, 0.0, 5000)]
                       ).astype(np.float32)
    out = np.empty_like(x)
    exp_nonpositive_f32(x, out, np.empty(x.size, dtype=np.int32))
    assert out.dtype == np.float32 and out[0] == out[1] == 1.0
    normal = x >= np.float32(XMIN_F32)
    exact = np.exp(x.astype(np.float64))  # the float32 argument's exact exp
    np.testing.assert_array_less(np.abs(out[normal] - exact[normal]),
                                 2.0 * np.spacing(exact[normal].astype(np.float32)))
    np.testing.assert_array_equal(out[~normal], 0.0)  # true values below 1.2e-38


@pytest.fixture(scope="module")
def breast_cancer_reference():
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_BC)
    C = np.where(np.arange(len(Y_BC)) % 4 == 0, 0.5, 2.0)
    Q = _q_matrix(kernel, X_BC, Y_BC)
    return kernel, C, Q, _lbfgsb(Q, C)


@pytest.mark.parametrize(("workers", "selection"),
                         [(1, "greedy"), (2, "greedy"), (4, "greedy"), (1, "random"),
                          (2, "random")])
def test_objective_matches_lbfgsb(breast_cancer_reference, workers, selection):
    kernel, C, Q, f_star = breast_cancer_reference
    tol = 1e-5 if selection == "greedy" else 1e-4
    res = gcd_solve(X_BC, Y_BC, C, kernel, _split(len(Y_BC), workers), tol=tol,
                    selection=selection, random_state=0)
    assert res.converged and res.n_workers == workers
    f = _objective(Q, res.alpha)
    assert abs(f - f_star) <= 1e-4 * abs(f_star)
    assert abs(res.objective - f) <= 1e-8 * abs(f)
    assert np.all(res.alpha >= 0) and np.all(res.alpha <= C)
    # The stop certificate holds for the exact gradient, not only the maintained one:
    # every atomic add landed, so the maintained g is Q a - e to rounding.
    g = Q @ res.alpha - 1.0
    assert np.abs(res.gradient - g).max() <= 1e-10
    assert cpu_gcd.max_violation(res.alpha, g, C) < tol + 1e-9


@pytest.fixture(scope="module")
def digits_reference():
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_DIG)
    C = np.full(len(Y_DIG), 2.0)
    ref = gcd_solve(X_DIG, Y_DIG, C, kernel, np.zeros(len(Y_DIG), dtype=np.int64), tol=1e-8)
    assert ref.converged
    return kernel, C, ref


@pytest.mark.parametrize("workers", [2, 4])
def test_many_workers_match_long_serial_run(digits_reference, workers):
    kernel, C, ref = digits_reference
    res = gcd_solve(X_DIG, Y_DIG, C, kernel, _split(len(Y_DIG), workers, seed=workers),
                    tol=1e-4, cache_bytes=4 << 20)
    assert res.converged
    assert abs(res.objective - ref.objective) <= 1e-4 * abs(ref.objective)
    Q = _q_matrix(kernel, X_DIG, Y_DIG)
    assert abs(_objective(Q, res.alpha) - ref.objective) <= 1e-4 * abs(ref.objective)
    assert np.abs(res.gradient - (Q @ res.alpha - 1.0)).max() <= 1e-10


def test_one_worker_is_deterministic_and_cache_size_does_not_change_it():
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_BC)
    blocks = np.zeros(len(Y_BC), dtype=np.int64)
    C = np.ones(len(Y_BC))
    a = gcd_solve(X_BC, Y_BC, C, kernel, blocks, tol=1e-4, cache_bytes=1 << 30)
    b = gcd_solve(X_BC, Y_BC, C, kernel, blocks, tol=1e-4, cache_bytes=0)
    np.testing.assert_array_equal(a.alpha, b.alpha)
    assert a.n_updates == b.n_updates


def _alg13(Q, C, n_updates):
    """Serial greedy coordinate descent (You 2020, Alg 13), written out plainly."""
    alpha, g = np.zeros(len(C)), -np.ones(len(C))
    for _ in range(n_updates):
        pg = np.abs(alpha - np.clip(alpha - g, 0.0, C))  # eq. 4.11
        i = int(np.argmax(pg))
        new = min(max(alpha[i] - g[i] / Q[i, i], 0.0), C[i])  # eq. 4.10
        g += (new - alpha[i]) * Q[:, i]
        alpha[i] = new
    return alpha, g


def test_one_worker_follows_algorithm_13_step_by_step():
    # One worker is serial GCD: its picks and steps must be Alg 13's, one by one.
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_BC)
    C = np.full(len(Y_BC), 0.05)  # small C: many steps end on the bound
    Q = _q_matrix(kernel, X_BC, Y_BC)
    for n_updates in (1, 7, 1000):
        res = gcd_solve(X_BC, Y_BC, C, kernel, np.zeros(len(Y_BC), dtype=np.int64), tol=1e-8,
                        max_updates=n_updates)
        alpha, g = _alg13(Q, C, n_updates)
        # kernel columns agree with Q to ~1e-15; over 1,000 steps that grows to ~4e-8
        np.testing.assert_allclose(res.alpha, alpha, rtol=0, atol=1e-6)
        np.testing.assert_allclose(res.gradient, g, rtol=0, atol=1e-6)


def test_max_updates_stops_early():
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_DIG)
    C = np.ones(len(Y_DIG))
    for workers in (1, 3):
        res = gcd_solve(X_DIG, Y_DIG, C, kernel, _split(len(Y_DIG), workers), tol=1e-6,
                        max_updates=50)
        assert res.n_updates == 50 and not res.converged
        # Stopped mid-run, the maintained gradient still holds every update that was made.
        np.testing.assert_allclose(res.gradient, gcd_gradient(X_DIG, Y_DIG, kernel, res.alpha),
                                   rtol=0, atol=1e-10)


def test_lru_cache_evicts_the_least_recently_used_column():
    X = X_BC[:10]
    y = np.ones(10)
    sq = np.einsum("ij,ij->i", X, X)
    cache = np.empty((2, 10))
    slot_of = np.full(10, -1, dtype=np.int64)
    slot_var = np.full(2, -1, dtype=np.int64)
    slot_time = np.zeros(2, dtype=np.int64)

    def get(i, clock):
        slot = cpu_gcd._column(X, sq, y, i, 0, 10, 2, 0.1, 0.0, 3, cache, slot_of, slot_var,
                               slot_time, clock, np.empty(10), np.empty(10, dtype=np.int64))
        return cache[slot]

    get(3, 1)
    get(5, 2)
    get(3, 3)  # 3 is now more recent than 5
    col = get(7, 4)  # evicts 5
    assert slot_of[5] == -1 and slot_of[3] >= 0 and slot_of[7] >= 0
    np.testing.assert_allclose(col, Kernel("rbf", 0.1).matrix(X)[:, 7], rtol=1e-12)


def test_precomputed_kernel_and_empty_blocks():
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_BC)
    C = np.ones(len(Y_BC))
    labels = _split(len(Y_BC), 2) * 3  # blocks 0 and 3: 1 and 2 are empty and get no worker
    a = gcd_solve(X_BC, Y_BC, C, kernel, labels, tol=1e-6)
    K = kernel.matrix(X_BC)
    b = gcd_solve(K, Y_BC, C, Kernel("precomputed"), labels, tol=1e-6)
    assert a.n_workers == b.n_workers == 2
    assert abs(a.objective - b.objective) <= 1e-6 * abs(a.objective)


@pytest.mark.parametrize("workers", [1, 2])
def test_trace_snapshots_are_feasible_and_evaluate_exactly(workers):
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_DIG)
    C = np.full(len(Y_DIG), 2.0)
    res = gcd_solve(X_DIG, Y_DIG, C, kernel, _split(len(Y_DIG), workers), tol=1e-5,
                    trace_interval=0.0005)
    times, updates = (np.array(column) for column in list(zip(*res.trace))[:2])
    alphas = np.stack([alpha for _, _, alpha in res.trace], axis=1)
    assert len(res.trace) >= 2 and np.all(np.diff(times) >= 0) and np.all(np.diff(updates) >= 0)
    assert np.all(alphas >= 0) and np.all(alphas <= C[:, None])
    np.testing.assert_array_equal(alphas[:, -1], res.alpha)
    Q = _q_matrix(kernel, X_DIG, Y_DIG)
    exact = 0.5 * np.einsum("is,ij,js->s", alphas, Q, alphas) - alphas.sum(axis=0)
    objectives = gcd_objectives(X_DIG, Y_DIG, kernel, alphas)
    np.testing.assert_allclose(objectives, exact, rtol=1e-10, atol=1e-10)
    assert abs(objectives[-1] - res.objective) <= 1e-9 * abs(res.objective)
    if workers == 1:  # serial GCD minimises exactly along each coordinate: f never rises
        assert np.all(np.diff(objectives) <= 1e-9 * abs(res.objective))


@pytest.mark.parametrize("kernel", [Kernel("poly", 0.1, 2, 1.0), Kernel("linear")])
def test_exact_objective_and_gradient_match_the_written_out_formulas(kernel):
    rng = np.random.default_rng(0)
    alphas = rng.uniform(0.0, 1.0, (len(Y_BC), 3)) * (rng.random((len(Y_BC), 3)) < 0.3)
    Q = _q_matrix(kernel, X_BC, Y_BC)
    expected = 0.5 * np.einsum("is,ij,js->s", alphas, Q, alphas) - alphas.sum(axis=0)
    np.testing.assert_allclose(gcd_objectives(X_BC, Y_BC, kernel, alphas), expected,
                               rtol=1e-12)
    assert gcd_objectives(X_BC, Y_BC, kernel, alphas[:, 1]) == pytest.approx(expected[1],
                                                                             rel=1e-12)
    K = kernel.matrix(X_BC)
    assert gcd_objectives(K, Y_BC, Kernel("precomputed"), alphas[:, 2]) == \
        pytest.approx(expected[2], rel=1e-12)
    np.testing.assert_allclose(gcd_gradient(X_BC, Y_BC, kernel, alphas[:, 0]),
                               Q @ alphas[:, 0] - 1.0, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gcd_gradient(K, Y_BC, Kernel("precomputed"), alphas[:, 0]),
                               Q @ alphas[:, 0] - 1.0, rtol=1e-12, atol=1e-12)
    assert gcd_objectives(X_BC, Y_BC, kernel, np.zeros(len(Y_BC))) == 0.0


def test_bad_arguments():
    kernel = Kernel("linear")
    with pytest.raises(ValueError, match="selection"):
        gcd_solve(X_BC, Y_BC, np.ones(len(Y_BC)), kernel, np.zeros(len(Y_BC), int),
                  selection="cyclic")
    with pytest.raises(ValueError, match="tol"):
        gcd_solve(X_BC, Y_BC, np.ones(len(Y_BC)), kernel, np.zeros(len(Y_BC), int), tol=0.0)


def test_workers_run_outside_the_gil():
    import time

    kernel = make_kernel("rbf", "scale", 3, 0.0, X_DIG)
    done = threading.Event()
    solve = threading.Thread(target=lambda: (
        gcd_solve(X_DIG, Y_DIG, np.full(len(Y_DIG), 10.0), kernel,
                  np.zeros(len(Y_DIG), dtype=np.int64), tol=1e-5, cache_bytes=0),
        done.set()))
    start = last = time.perf_counter()
    longest_stall = 0.0
    solve.start()
    while not done.is_set():
        now = time.perf_counter()
        longest_stall = max(longest_stall, now - last)
        last = now
    solve.join()
    # Had the solver held the GIL, this pure-Python loop would have stalled for the whole solve.
    elapsed = time.perf_counter() - start
    assert elapsed > 0.2
    assert longest_stall < 0.5 * elapsed


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_multi_worker_solve_works_in_a_forked_child():
    import multiprocessing

    kernel = make_kernel("rbf", "scale", 3, 0.0, X_BC)
    C = np.ones(len(Y_BC))
    parent = gcd_solve(X_BC, Y_BC, C, kernel, _split(len(Y_BC), 2), tol=1e-4)  # pool exists
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        child = pool.apply_async(_child_objective, (kernel, C)).get(timeout=120)
    assert abs(child - parent.objective) <= 1e-4 * abs(parent.objective)


def _child_objective(kernel, C):
    return gcd_solve(X_BC, Y_BC, C, kernel, _split(len(Y_BC), 2), tol=1e-4).objective


def _lockstep(Q, C, blocks, damped, rounds, tol=1e-4):
    """A synchronous model of W GPU blocks in lockstep (greedy Asy-GCD, Alg 14).

    Every round each block picks the largest movable violator of its block and
    steps from the same gradient, as blocks running side by side do; all steps
    land before the next round. ``damped``: each block's step factor follows
    the shipped rule (:func:`damped_step_factor`), looking again at its last
    coordinate at its next scan, as gcd.cu does. Returns (rounds run, alpha).
    """
    n = len(C)
    q = np.diag(Q)
    alpha, g = np.zeros(n), -np.ones(n)
    members = [np.flatnonzero(blocks == b) for b in np.unique(blocks)]
    eta = np.ones(len(members))
    last = [None] * len(members)
    for r in range(rounds):
        pg = np.abs(alpha - np.clip(alpha - g, 0.0, C))
        if pg.max() < tol:
            return r, alpha
        picks, steps = [], []
        for w, m in enumerate(members):
            if damped and last[w] is not None:
                eta[w] = cpu_gcd.damped_step_factor(eta[w], g[last[w][0]], last[w][1])
                last[w] = None
            i = m[np.argmax(pg[m])]
            if pg[i] < tol:
                continue
            step = np.clip(alpha[i] - eta[w] * g[i] / q[i], 0.0, C[i]) - alpha[i]
            picks.append(i)
            steps.append(step)
            last[w] = (i, g[i])
        picks, steps = np.array(picks), np.array(steps)
        alpha[picks] += steps
        g += Q[:, picks] @ steps
    return rounds, alpha


def test_damped_steps_stop_the_lockstep_oscillation(digits_reference):
    # The GPU run that never ends with exact steps (greedy, 8 blocks, digits; docs/asygcd.md,
    # "Damped steps"): blocks in lockstep take exact steps from one gradient on correlated
    # coordinates and overshoot together, forever.
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_DIG)
    C = np.ones(len(Y_DIG))
    Q = _q_matrix(kernel, X_DIG, Y_DIG)
    f_star = gcd_solve(X_DIG, Y_DIG, C, kernel, np.zeros(len(Y_DIG), dtype=np.int64),
                       tol=1e-8).objective
    assert f_star == pytest.approx(-217.7601, abs=1e-4)
    blocks = _split(len(Y_DIG), 8)
    rounds, alpha = _lockstep(Q, C, blocks, damped=False, rounds=3000)
    assert rounds == 3000 and _objective(Q, alpha) > 0.5 * f_star  # nowhere near
    rounds, alpha = _lockstep(Q, C, blocks, damped=True, rounds=3000)
    assert rounds < 3000
    assert abs(_objective(Q, alpha) - f_star) <= 1e-5 * abs(f_star)


def test_damped_step_factor_rule():
    rule = cpu_gcd.damped_step_factor
    assert rule(1.0, -0.6, 1.0) == 0.5  # sign flipped, over half kept: overshoot
    assert rule(1.0, -0.4, 1.0) == 1.0  # a small flip is rounding or the others' progress
    assert rule(0.5, 0.3, -2.0) == pytest.approx(0.55)
    assert rule(0.5, 1.2, -1.0) == 0.25
    assert rule(cpu_gcd.ETA_MIN, -5.0, 1.0) == cpu_gcd.ETA_MIN
    assert rule(1.0, 1e-17, 0.3) == 1.0  # after one worker's exact step g_i is about 0


@pytest.mark.parametrize("selection", ["greedy", "random"])
def test_many_workers_reach_the_exact_objective_on_digits(selection):
    # More workers than cores here: the threads interleave, and damping must not cost accuracy.
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_DIG)
    C = np.ones(len(Y_DIG))
    Q = _q_matrix(kernel, X_DIG, Y_DIG)
    for workers in (8, 16):
        res = gcd_solve(X_DIG, Y_DIG, C, kernel, _split(len(Y_DIG), workers), tol=1e-4,
                        selection=selection, random_state=0, cache_bytes=8 << 20)
        assert res.converged and res.n_workers == workers and res.max_violation < 1e-4
        assert _objective(Q, res.alpha) == pytest.approx(-217.7601, abs=3e-3)
        assert np.abs(res.gradient - (Q @ res.alpha - 1.0)).max() <= 1e-10


def test_scan_passes_over_variables_that_cannot_move():
    # Variable 1 violates most but its exact step (g / Q_ii = 1e-20 on a_i = 0.5) rounds to
    # zero: picking it would stall the worker, and it must not keep the block from certifying.
    g = np.array([0.2, -1.0, 5e-4])
    alpha = np.array([0.0, 0.5, 0.0])
    C = np.ones(3)
    qdiag = np.array([1.0, 1e20, 1.0])
    assert cpu_gcd._scan(g, alpha, C, qdiag, 0, 3) == (-1, 0.0)  # 0: at its bound, pg = 0
    g[0] = -0.2
    assert cpu_gcd._scan(g, alpha, C, qdiag, 0, 3) == (0, pytest.approx(0.2))


def test_the_run_stops_only_when_every_worker_is_quiet_at_the_last_update():
    # Workers publish the log position at which they found their block quiet (one cache
    # line each); the run stops when all agree and no update was claimed after it.
    pad = cpu_gcd.PAD
    quiet = np.full(3 * pad, -1, dtype=np.int64)
    counters = np.zeros(2 * pad, dtype=np.int64)
    counters[cpu_gcd.C_STARTED] = 7
    quiet[::pad] = [7, 7, 6]
    assert not cpu_gcd._agree(counters, quiet, 3, 7)  # worker 2 has not read update 6 yet
    quiet[2 * pad] = 7
    assert cpu_gcd._agree(counters, quiet, 3, 7)
    counters[cpu_gcd.C_STARTED] = 8  # someone claimed update 7: its block was not quiet
    assert not cpu_gcd._agree(counters, quiet, 3, 7)


def test_default_update_cap_ends_every_run(monkeypatch):
    assert cpu_gcd.default_max_updates(10) == 10**7
    assert cpu_gcd.default_max_updates(200_000) == 20_000_000
    monkeypatch.setattr(cpu_gcd, "default_max_updates", lambda n: 40)
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_DIG)
    for workers in (1, 3):
        res = gcd_solve(X_DIG, Y_DIG, np.ones(len(Y_DIG)), kernel, _split(len(Y_DIG), workers),
                        tol=1e-6)
        assert res.n_updates == 40 and not res.converged and res.max_violation > 1e-6


def test_batch_equals_problem_by_problem():
    from gpuml.kernels import GCDProblem, gcd_solve_batch

    kernel = make_kernel("rbf", "scale", 3, 0.0, X_DIG)
    digit = load_digits().target
    problems = []
    for a, b in ((0, 1), (2, 7), (3, 8)):
        rows = np.flatnonzero((digit == a) | (digit == b))
        y = np.where(digit[rows] == b, 1.0, -1.0)
        problems.append(GCDProblem(rows, y, np.full(len(rows), 0.5),
                                   np.zeros(len(rows), dtype=np.int64), random_state=a))
    for n_jobs in (1, 2):
        batch = gcd_solve_batch(X_DIG, kernel, problems, tol=1e-5, n_jobs=n_jobs)
        for p, res in zip(problems, batch):
            alone = gcd_solve(X_DIG[p.rows], p.y, p.C, kernel, p.blocks, tol=1e-5,
                              random_state=p.random_state)
            np.testing.assert_array_equal(res.alpha, alone.alpha)
            assert res.converged and res.n_updates == alone.n_updates
    K = kernel.matrix(X_DIG)
    pre = gcd_solve_batch(K, Kernel("precomputed"), problems, tol=1e-5)
    for res, ref in zip(pre, batch):
        assert res.objective == pytest.approx(ref.objective, rel=1e-9)


def test_a_small_update_log_wraps_around_without_losing_updates(monkeypatch):
    # The log is a ring: a worker about to overwrite an entry some worker has not read yet
    # waits (reading the log itself meanwhile). A 16-entry ring makes that happen constantly.
    monkeypatch.setattr(cpu_gcd, "LOG_SIZE", 16)
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_DIG)
    C = np.ones(len(Y_DIG))
    res = gcd_solve(X_DIG, Y_DIG, C, kernel, _split(len(Y_DIG), 4), tol=1e-3)
    assert res.converged and res.n_updates > 16
    assert len(res.worker_cpu_s) == 4 and min(res.worker_cpu_s) > 0
    np.testing.assert_allclose(res.gradient, gcd_gradient(X_DIG, Y_DIG, kernel, res.alpha),
                               rtol=0, atol=1e-10)
    assert abs(res.objective + 217.76) < 0.05


@pytest.mark.parametrize("share", [None, 0.0, 0.9])
def test_unequal_blocks_reach_the_exact_objective_whatever_the_greedy_share(share):
    # 90% / 10% blocks: the small block's worker waits while the large block holds a violator
    # over 1/share times its own (share 0: Alg 14 as written, it never waits).
    kernel = make_kernel("rbf", "scale", 3, 0.0, X_DIG)
    C = np.ones(len(Y_DIG))
    blocks = (np.random.default_rng(1).random(len(Y_DIG)) < 0.1).astype(np.int64)
    res = cpu_gcd.solve(X_DIG, Y_DIG, C, kernel, blocks, tol=1e-4, greedy_share=share)
    assert res.converged and res.n_workers == 2 and res.max_violation < 1e-4
    Q = _q_matrix(kernel, X_DIG, Y_DIG)
    assert _objective(Q, res.alpha) == pytest.approx(-217.7601, abs=3e-3)
    np.testing.assert_allclose(res.gradient, Q @ res.alpha - 1.0, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kernel", ["rbf", "linear", "precomputed"])
def test_numpy_twin_is_the_one_worker_run(kernel):
    """The NumPy twin (small problems while numba compiles) takes the compiled one-worker
    run's steps: same updates, the objective to rounding (kernel values from one GEMM)."""
    X, y = load_breast_cancer(return_X_y=True)
    X = _standardise(X)[:400]
    y = np.where(y[:400] == 1, 1.0, -1.0)
    C = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    k = make_kernel("rbf" if kernel == "precomputed" else kernel, "scale", X=X)
    data = k.matrix(X) if kernel == "precomputed" else X
    k = make_kernel(kernel, "scale", X=X) if kernel != "precomputed" else Kernel("precomputed")
    for cap in (None, 50):
        ref = gcd_solve(data, y, C, k, np.zeros(len(y), dtype=np.int64), max_updates=cap)
        alpha, g = np.zeros(len(y)), -np.ones(len(y))
        qdiag = np.maximum(np.diagonal(data) if kernel == "precomputed"
                           else np.asarray(k.diag(X), dtype=np.float64), cpu_gcd.TAU)
        n_updates, converged = cpu_gcd._one_worker_numpy(
            data, k, y, C, qdiag, 1e-3, 10**7 if cap is None else cap, alpha, g)
        assert (n_updates, converged) == (ref.n_updates, ref.converged)
        assert cpu_gcd.objective_from_gradient(alpha, g) == pytest.approx(ref.objective,
                                                                          rel=1e-10)
        np.testing.assert_allclose(alpha, ref.alpha, atol=1e-9)
        if cap is None:
            assert cpu_gcd.max_violation(alpha, g, C) < 1e-3


def test_numpy_twin_serves_small_multi_worker_runs_only(monkeypatch):
    """Not compiled: a small run asked for 2 workers goes to the twin (one worker); one
    worker, random selection and watched runs keep the compiled workers."""
    from gpuml.kernels import _jit

    X, y = load_breast_cancer(return_X_y=True)
    X = _standardise(X)
    y = np.where(y == 1, 1.0, -1.0)
    C = np.ones(len(y))
    k = make_kernel("rbf", "scale", X=X)
    compiled = gcd_solve(X, y, C, k, _split(len(y), 2))
    monkeypatch.setattr(_jit, "ready", lambda dispatcher, *args, **kw: False)
    twin = gcd_solve(X, y, C, k, _split(len(y), 2))
    assert (twin.n_workers, compiled.n_workers) == (1, 2) and twin.converged
    assert twin.max_violation < 1e-3
    assert twin.objective == pytest.approx(compiled.objective, rel=1e-4)
    assert gcd_solve(X, y, C, k, np.zeros(len(y), dtype=np.int64)).n_workers == 1
    for options in ({"selection": "random"}, {"trace_interval": 10.0}):
        assert gcd_solve(X, y, C, k, _split(len(y), 2), **options).n_workers == 2
    monkeypatch.setattr(cpu_gcd, "NUMPY_TWIN_MAX_BYTES", 8 * len(y) ** 2 - 1)
    assert gcd_solve(X, y, C, k, _split(len(y), 2)).n_workers == 2
