"""``python -m gpuml.precompile`` fits every CPU code path (and so fills numba's disk cache)."""

import warnings

from sklearn.datasets import make_classification

from gpuml.precompile import precompile


def _numba_functions():
    """Every numba dispatcher of gpuml's CPU kernels."""
    from gpuml.kernels import vexp
    from gpuml.kernels.gcd import cpu as gcd
    from gpuml.kernels.nearest import cpu as partition
    from gpuml.kernels.nearest import neighbors, values
    from gpuml.kernels.smo import cpu as smo
    from gpuml.kernels.smo import loop as smo_loop
    from gpuml.kernels.smo import values as smo_values

    return {f"{mod.__name__}.{name}": obj for mod in (vexp, gcd, partition, neighbors, values,
                                                      smo, smo_loop, smo_values)
            for name, obj in vars(mod).items() if hasattr(obj, "overloads")}


def test_precompile_fits_every_cpu_path_and_covers_the_default_fits():
    seconds = precompile(verbose=False)
    # eight fits, the float32 part matrices, four fits on kernel rows on demand and a C
    # path in two dtypes, and the optimizers' fused CPU kernels (torch is installed)
    assert len(seconds) == 29 and all(s > 0 for s in seconds.values())
    assert "LAMB/LARS fused CPU kernels" in seconds
    # The specialisations the default fits need are exactly among those precompile made:
    # the first fit after `python -m gpuml.precompile` compiles nothing (a signature that
    # differed, by dtype, layout or an argument typed None, would compile here).
    before = {name: set(f.overloads) for name, f in _numba_functions().items()}
    from gpuml import AsyGCDSVC, CASVMClassifier

    X, y = make_classification(2000, 20, random_state=0)
    y5 = make_classification(2000, 20, n_informative=10, n_classes=5, random_state=0)[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fit_X in (X, X.astype("float32")):
            CASVMClassifier(n_partitions=16, device="cpu", random_state=0).fit(fit_X, y)
            # predictions: the default rule among many parts, and the neighbours rule
            many = CASVMClassifier(n_partitions=40, device="cpu", random_state=0).fit(fit_X, y)
            many.predict(fit_X)
            many.set_params(combine="neighbors").predict(fit_X)
            # five classes: the compiled loops' products by class blocks
            CASVMClassifier(n_partitions=40, device="cpu", random_state=0).fit(
                fit_X, y5).predict(fit_X)
            CASVMClassifier(n_partitions=4, partition="fcfs", device="cpu",
                            random_state=0).fit(fit_X, y)
            AsyGCDSVC(device="cpu", random_state=0).fit(fit_X, y)
        # parts of 1,024+ rows: float32 kernel matrices
        X2, y2 = make_classification(2100, 20, random_state=0)
        CASVMClassifier(n_partitions=2, device="cpu", random_state=0).fit(X2, y2)
    after = {name: set(f.overloads) for name, f in _numba_functions().items()}
    new = {name: after[name] - before[name] for name in after if after[name] - before[name]}
    assert not new, f"compiled after precompile: {new}"


def _cached_kernels():
    """Every numba dispatcher with a disk cache in the modules of gpuml.kernels."""
    import importlib
    import pkgutil

    import gpuml.kernels

    found = {}
    for info in pkgutil.walk_packages(gpuml.kernels.__path__, "gpuml.kernels."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # a GPU module whose package is missing here
            continue
        for name, obj in vars(module).items():
            if getattr(obj, "_cache", None) is not None and hasattr(obj, "overloads"):
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_kernel_cache_is_stamped_with_all_kernel_sources():
    """numba keys a function's cached machine code by its own file, yet a compiled function
    inlines those it calls from other files: every gpuml kernel's cache is stamped with one
    digest of all the kernel sources instead, so that no edit leaves stale code loaded."""
    from gpuml.kernels import _jit

    kernels = _cached_kernels()
    assert {"gpuml.kernels.vexp._rbf_rows_f32", "gpuml.kernels.smo.values._rbf_map_f32",
            "gpuml.kernels.nearest.neighbors._merge_loop"} <= set(kernels)
    for name, dispatcher in kernels.items():
        locator = dispatcher._cache._impl._locator
        assert type(locator).__name__.startswith("GpumlStamped"), name
        assert locator.get_source_stamp() == _jit.sources_stamp(), name


def test_sources_stamp_follows_every_file_and_other_code_keeps_numbas_cache(tmp_path,
                                                                           monkeypatch):
    import importlib

    from gpuml.kernels import _jit

    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    first = _jit.sources_stamp.__wrapped__(tmp_path)
    assert _jit.sources_stamp.__wrapped__(tmp_path) == first
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")  # another file than the function's
    second = _jit.sources_stamp.__wrapped__(tmp_path)
    assert second != first
    (tmp_path / "sub" / "b.py").rename(tmp_path / "sub" / "c.py")
    assert _jit.sources_stamp.__wrapped__(tmp_path) != second
    # a cached function outside gpuml.kernels keeps numba's own locator
    (tmp_path / "outside_module.py").write_text(
        "import numba\n\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    outside = importlib.import_module("outside_module")
    assert not type(outside.f._cache._impl._locator).__name__.startswith("GpumlStamped")
