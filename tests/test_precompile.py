"""``python -m gpuml.precompile`` fits every CPU code path (and so fills numba's disk cache)."""

from gpuml.precompile import precompile


def test_precompile_fits_every_cpu_path():
    seconds = precompile(verbose=False)
    # five fits in two dtypes, and the optimizers' fused CPU kernels (torch is installed)
    assert len(seconds) == 11 and all(s > 0 for s in seconds.values())
    assert "LAMB/LARS fused CPU kernels" in seconds
