"""A first fit in a fresh install: the NumPy twins that run while numba compiles.

The conftest makes numba compile in the calling thread for the rest of the suite;
here the background compile is on again (``GPUML_JIT_BACKGROUND=1``) and the twins are
checked against the compiled solvers at the estimator level (the solver-level checks
are in test_smo.py, test_partition.py and test_gcd_solver.py).
"""

import time
import warnings
from collections import Counter

import numpy as np
import pytest
from numba import njit
from sklearn.datasets import make_classification

from gpuml import AsyGCDSVC, CASVMClassifier
from gpuml.kernels import _jit


@pytest.fixture
def background(monkeypatch):
    monkeypatch.setenv("GPUML_JIT_BACKGROUND", "1")


@pytest.fixture
def not_compiled(monkeypatch, background):
    """Every gated numba function looks uncompiled: the fit takes the twins."""
    asked = []
    monkeypatch.setattr(_jit, "ready", lambda dispatcher, *args, **kw: asked.append(
        dispatcher.py_func.__name__) or False)
    return asked


def test_ready_queues_a_background_compile(background):
    @njit
    def twice(x):
        return 2 * x

    assert not _jit.ready(twice, 1.5)
    _jit.wait()
    assert _jit.ready(twice, 1.5) and twice(1.5) == 3.0
    with _jit.synchronous():
        assert _jit.ready(twice, np.int64(1))  # compiled by the caller's own call


_CACHE_PROBE = """
import sys, threading
import numpy as np
from gpuml.kernels import _jit
from gpuml.kernels.nearest.cpu import fill_nearest_open
done = threading.Event()
if sys.argv[1] == "busy":  # the background thread at work: no load in the caller
    _jit._worker = threading.Thread(target=done.wait, daemon=True)
    _jit._worker.start()
ints = lambda: np.zeros(2, dtype=np.int64)
args = (np.zeros((2, 2)), ints(), ints(), np.full(2, 2, dtype=np.int64), ints())
print(int(_jit.ready(fill_nearest_open, *args, from_cache=True)), int(_jit._worker is not None))
done.set()
_jit.wait()
"""


def test_ready_from_cache_loads_what_numbas_disk_cache_holds_in_the_caller(tmp_path):
    """``from_cache``: a specialisation in numba's disk cache is loaded by the caller (no
    twin, nothing queued) unless the background thread is at work (it would hold numba's
    compiler lock); one that is not there is queued as without it."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, GPUML_JIT_BACKGROUND="1", NUMBA_CACHE_DIR=str(tmp_path))

    def probe(state="idle"):
        return subprocess.run([sys.executable, "-c", _CACHE_PROBE, state], env=env,
                              check=True, capture_output=True, text=True,
                              timeout=300).stdout.split()

    assert probe() == ["0", "1"]  # an empty cache: queued, compiled in the background
    assert any(tmp_path.rglob("*fill_nearest_open*.nbc"))
    assert probe() == ["1", "0"]  # a fresh process finds it in the cache: loaded here
    assert probe("busy") == ["0", "1"]  # the same, the background thread at work: queued


def test_a_known_specialisation_is_found_without_numba_typing(background, monkeypatch):
    # None, as the SMO solver passes for "no shrinking", keeps the cheap key: once a
    # specialisation is known, numba's own typing of the arguments is not asked again.
    @njit
    def first(x, flag):
        return x[0] if flag is None else -x[0]

    args = (np.ones(3), None)
    assert not _jit.ready(first, *args)
    _jit.wait()
    assert _jit.ready(first, *args)
    monkeypatch.setattr(_jit, "signature", lambda *a: pytest.fail("typed again"))
    assert _jit.ready(first, *args) and first(*args) == 1.0


def test_compiles_queued_during_a_fit_start_after_it(background):
    @njit
    def half(x):
        return x / 2

    @_jit.deferring
    def fit():
        assert not _jit.ready(half, 1.0)
        time.sleep(0.05)
        assert not _jit._jobs.empty()  # queued, not started while the fit runs
        return "fitted"

    assert fit() == "fitted"
    _jit.wait()
    assert _jit.ready(half, 1.0)


def _data():
    X, y = make_classification(1200, 10, random_state=0)
    return X, y


def test_casvm_first_fit_by_the_twins_equals_the_compiled_fit(monkeypatch, background):
    X, y = _data()
    make = lambda: CASVMClassifier(n_partitions=8, device="cpu", random_state=0)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _jit.synchronous():
            compiled = make().fit(X, y)
        monkeypatch.setattr(_jit, "ready", lambda dispatcher, *args, **kw: False)
        twin = make().fit(X, y)
    # The dense SMO twin takes the compiled solver's steps bit for bit; FCFS's fill too.
    np.testing.assert_array_equal(twin.dual_coef_, compiled.dual_coef_)
    np.testing.assert_array_equal(twin.intercept_, compiled.intercept_)
    np.testing.assert_array_equal(twin.support_, compiled.support_)
    np.testing.assert_array_equal(twin.decision_function(X), compiled.decision_function(X))


@pytest.mark.parametrize("method", ["casvm", "cascade", "dcsvm", "dcfilter"])
def test_fit_is_the_same_whether_the_compile_ends_before_during_or_after_it(method,
                                                                             monkeypatch,
                                                                             background):
    """Every k-means pass and every SMO batch (one per layer of the tree methods) asks afresh
    whether numba has compiled, so a compile that finishes mid-fit gives a fit that ran the
    twins first and the compiled loops after. Every such fit is the compiled one."""
    X, y = make_classification(600, 8, n_informative=5, n_classes=3, random_state=0)
    make = lambda: CASVMClassifier(n_partitions=4, method=method, partition="kmeans",  # noqa: E731
                                   device="cpu", random_state=0)
    asked = Counter()

    def not_before(calls, ready=_jit.ready):
        """``_jit.ready`` answering False to its first ``calls[f]`` questions about each ``f``."""
        def answer(dispatcher, *args, **kw):
            asked[dispatcher] += 1
            return (asked[dispatcher] > calls.get(dispatcher, np.inf)
                    and ready(dispatcher, *args, **kw))
        return answer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _jit.synchronous():  # the real ready then answers True
            compiled = make().fit(X, y)
            monkeypatch.setattr(_jit, "ready", not_before({}))
            twins = make().fit(X, y)
            calls = dict(asked)
            asked.clear()
            monkeypatch.setattr(_jit, "ready", not_before({f: n // 2 for f, n in calls.items()}))
            mixed = make().fit(X, y)
    # k-means' sweep, the rbf kernel blocks and the SMO, each asked often enough to switch
    # midway.
    assert len(calls) == 3 and min(calls.values()) >= 2 and asked == calls
    for fit in (twins, mixed):
        for name in ("support_", "dual_coef_", "intercept_", "n_iter_", "centers_"):
            np.testing.assert_array_equal(getattr(fit, name), getattr(compiled, name), name)
        np.testing.assert_array_equal(fit.decision_function(X), compiled.decision_function(X))


def test_asygcd_first_fit_by_the_one_worker_twin_matches_within_tol(not_compiled):
    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        twin = AsyGCDSVC(n_workers=2, device="cpu", random_state=0).fit(X, y)
        assert "_work" in not_compiled
        with _jit.synchronous():
            one = AsyGCDSVC(n_workers=1, device="cpu", random_state=0)
            # n_workers=1 keeps its compiled, deterministic path even when not compiled
            compiled = one.fit(X, y)
    assert not_compiled.count("_work") == 1
    assert twin.n_workers_ == 2  # what was asked; the twin ran it as one worker
    dec_twin, dec_one = twin.decision_function(X), compiled.decision_function(X)
    # Both stop with every projected gradient below tol=1e-3, visiting the variables in
    # another order (the twin's follows the two blocks): decision values agree to about tol.
    assert np.max(np.abs(dec_twin - dec_one)) < 1e-2
    assert np.mean(twin.predict(X) == compiled.predict(X)) >= 0.995


def _compile_in_child(_):
    from numba import njit

    @njit
    def third(x):
        return x / 3

    assert not _jit.ready(third, 3.0)
    _jit.wait()
    return _jit.ready(third, 3.0)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_background_compile_works_in_a_forked_child(background):
    import multiprocessing

    @_jit.deferring
    def fit_forking():
        with _jit._lock:  # held at the fork: the child gets a fresh one
            ctx = multiprocessing.get_context("fork")
            pool = ctx.Pool(1)
        with pool:
            return pool.apply_async(_compile_in_child, (0,)).get(timeout=120)

    assert fit_forking()
