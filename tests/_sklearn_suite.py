"""Run scikit-learn's own SVC and KernelRidge tests against gpuml (helper of test_sklearn_*.py).

A user adopts gpuml by swapping one class name; the strongest check that
nothing else has to change is scikit-learn's own test files for the classes
being replaced. They ship inside the installed scikit-learn. :func:`load`
executes such a file as a fresh module whose imports of ``sklearn.svm.SVC`` and
``sklearn.kernel_ridge.KernelRidge`` are rebound to the constructor adapters
below; nothing of scikit-learn itself is patched, so the rest of the session
(and every other class those files use) sees the real scikit-learn.

The rebinding happens at import time, through the module's own ``__import__``,
so it also reaches the names bound while the file is imported (parametrize
lists such as ``(svm.SVC, svm.NuSVC)``) and the imports inside test functions.

Which collected tests run is decided by each test module's ``DESELECT``
(``{test name or name[param id]: one-line reason}``) and ``KNOWN_FAILURES``
(the same shape; those run as strict ``xfail``), applied by
``tests/conftest.py``.
"""

from __future__ import annotations

import builtins
import types
from pathlib import Path

import pytest
import sklearn

from gpuml import AsyGCDSVC, BKRRRegressor, CASVMClassifier

#: The installed scikit-learn's source tree.
SKLEARN_DIR = Path(sklearn.__file__).parent


def SVC(C=1.0, kernel="rbf", degree=3, gamma="scale", coef0=0.0, shrinking=True,
        probability="deprecated", tol=1e-3, cache_size=200, class_weight=None, verbose=False,
        max_iter=-1, decision_function_shape="ovr", break_ties=False, random_state=None):
    """``sklearn.svm.SVC(...)`` mapped to ``CASVMClassifier(n_partitions=1, ...)``.

    Every argument keeps its name and meaning. The CPU is pinned so that the
    results do not depend on the machine.
    """
    return CASVMClassifier(probability=probability, C=C, kernel=kernel, degree=degree,
                           gamma=gamma, coef0=coef0,
                           shrinking=shrinking, tol=tol, cache_size=cache_size,
                           class_weight=class_weight, verbose=int(verbose), max_iter=max_iter,
                           decision_function_shape=decision_function_shape,
                           break_ties=break_ties,
                           random_state=random_state, n_partitions=1,
                           device="cpu")


def SVC_AsyGCD(C=1.0, kernel="rbf", degree=3, gamma="scale", coef0=0.0, shrinking=True,
               probability="deprecated", tol=1e-3, cache_size=200, class_weight=None, verbose=False,
               max_iter=-1, decision_function_shape="ovr", break_ties=False,
               random_state=None):
    """``sklearn.svm.SVC(...)`` mapped to ``AsyGCDSVC(...)``, for SVC's contract tests.

    ``max_iter`` is the cap on coordinate updates (``max_updates``; -1: none
    given); ``shrinking`` has no counterpart in coordinate descent. One worker
    keeps every fit deterministic; the CPU is pinned.
    """
    del shrinking
    return AsyGCDSVC(probability=probability, C=C, kernel=kernel, degree=degree, gamma=gamma,
                     coef0=coef0, tol=tol,
                     cache_size=cache_size, class_weight=class_weight, verbose=int(verbose),
                     max_updates=None if max_iter == -1 else max_iter,
                     decision_function_shape=decision_function_shape, break_ties=break_ties,
                     random_state=random_state, n_workers=1, device="cpu")


def KernelRidge(alpha=1.0, *, kernel="linear", gamma=None, degree=3, coef0=1,
                kernel_params=None):
    """``sklearn.kernel_ridge.KernelRidge(...)`` mapped to a one-part ``BKRRRegressor``.

    Argument for argument: ``alpha`` is BKRR's ``alpha`` (KernelRidge's
    unnormalised shift; the paper's ``lam`` would need n, which a constructor
    does not know), and KernelRidge's ``gamma=None`` (1 / n_features) is
    ``gamma="auto"``. KernelRidge fits no intercept: ``fit_intercept=False``.
    The CPU is pinned so that the results do not depend on the machine.
    """
    return BKRRRegressor(alpha=alpha, kernel=kernel, gamma="auto" if gamma is None else gamma,
                         degree=degree, coef0=coef0, kernel_params=kernel_params,
                         fit_intercept=False, n_partitions=1, device="cpu")


class _Rebound(types.ModuleType):
    """A stand-in for a module: some names replaced, every other name the module's own."""

    def __init__(self, module, names):
        super().__init__(module.__name__, getattr(module, "__doc__", None))
        self.__dict__.update(names)
        self.__dict__["_module"] = module

    def __getattr__(self, name):
        return getattr(self.__dict__["_module"], name)


def _importer(rebound: dict[str, types.ModuleType]):
    """An ``__import__`` that hands out the rebound stand-ins in place of the real modules."""
    real_import = builtins.__import__

    def import_(name, globals=None, locals=None, fromlist=(), level=0):
        module = real_import(name, globals, locals, fromlist, level)
        if level == 0 and fromlist and name in rebound:
            return rebound[name]
        return module

    return import_


def load(relative_path: str, rebound_tests: dict[str, types.ModuleType] | None = None,
         svc=SVC):
    """Execute scikit-learn's test file ``relative_path`` with SVC and KernelRidge rebound.

    ``rebound_tests`` maps test-module names of ``sklearn.svm.tests`` to modules
    already loaded here (test_sparse.py imports test_svm); ``svc`` is the SVC
    adapter (:func:`SVC` or :func:`SVC_AsyGCD`). Returns the module; its
    functions keep scikit-learn's file and line numbers in tracebacks.
    """
    import sklearn.kernel_ridge
    import sklearn.svm
    import sklearn.svm.tests

    svm = _Rebound(sklearn.svm, {"SVC": svc})
    rebound = {
        "sklearn": _Rebound(sklearn, {"svm": svm}),
        "sklearn.svm": svm,
        "sklearn.kernel_ridge": _Rebound(sklearn.kernel_ridge, {"KernelRidge": KernelRidge}),
        "sklearn.svm.tests": _Rebound(sklearn.svm.tests, dict(rebound_tests or {})),
    }
    path = SKLEARN_DIR / relative_path
    module = types.ModuleType(f"sklearn_suite.{path.stem}")
    module.__file__ = str(path)
    module.__dict__["__builtins__"] = {**vars(builtins), "__import__": _importer(rebound)}
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def functions_of(module) -> dict:
    """The module's test functions, to be bound in a gpuml test module's namespace."""
    return {name: value for name, value in vars(module).items()
            if name.startswith("test_") and isinstance(value, types.FunctionType)}


@pytest.fixture
def global_random_seed():
    """scikit-learn's fixture, at its default (SKLEARN_TESTS_GLOBAL_RANDOM_SEED unset): 42."""
    return 42


def selected(items, table_name: str):
    """Pairs ``(item, reason)`` for the items that ``table_name`` of their module names."""
    for item in items:
        table = getattr(getattr(item, "module", None), table_name, None)
        if not table:
            continue
        name = getattr(item, "originalname", item.name)
        reason = table.get(item.name, table.get(name))
        if reason is not None:
            yield item, reason

