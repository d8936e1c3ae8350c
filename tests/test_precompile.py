"""``python -m gpuml.precompile`` fits every CPU code path (and so fills numba's disk cache)."""

import warnings

from sklearn.datasets import make_classification

from gpuml.precompile import precompile


def _numba_functions():
    """Every numba dispatcher of gpuml's CPU kernels."""
    from gpuml.kernels import vexp
    from gpuml.kernels.gcd import cpu as gcd
    from gpuml.kernels.nearest import cpu as partition
    from gpuml.kernels.smo import cpu as smo
    from gpuml.kernels.smo import loop as smo_loop

    return {f"{mod.__name__}.{name}": obj for mod in (vexp, gcd, partition, smo, smo_loop)
            for name, obj in vars(mod).items() if hasattr(obj, "overloads")}


def test_precompile_fits_every_cpu_path_and_covers_the_default_fits():
    seconds = precompile(verbose=False)
    # seven fits and the float32 part matrices in two dtypes, and the optimizers' fused
    # CPU kernels (torch is installed)
    assert len(seconds) == 17 and all(s > 0 for s in seconds.values())
    assert "LAMB/LARS fused CPU kernels" in seconds
    # The specialisations the default fits need are exactly among those precompile made:
    # the first fit after `python -m gpuml.precompile` compiles nothing (a signature that
    # differed, by dtype, layout or an argument typed None, would compile here).
    before = {name: set(f.overloads) for name, f in _numba_functions().items()}
    from gpuml import AsyGCDSVC, CASVMClassifier

    X, y = make_classification(2000, 20, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fit_X in (X, X.astype("float32")):
            CASVMClassifier(n_partitions=16, device="cpu", random_state=0).fit(fit_X, y)
            CASVMClassifier(n_partitions=4, partition="fcfs", device="cpu",
                            random_state=0).fit(fit_X, y)
            AsyGCDSVC(device="cpu", random_state=0).fit(fit_X, y)
        # parts of 1,024+ rows: float32 kernel matrices
        X2, y2 = make_classification(2100, 20, random_state=0)
        CASVMClassifier(n_partitions=2, device="cpu", random_state=0).fit(X2, y2)
    after = {name: set(f.overloads) for name, f in _numba_functions().items()}
    new = {name: after[name] - before[name] for name in after if after[name] - before[name]}
    assert not new, f"compiled after precompile: {new}"
