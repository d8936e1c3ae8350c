"""gpuml benchmarks: ours and the baseline in one process, on the same data, as ratios."""
