"""numba-jitted CPU loops (the parts that are sequential by nature or need no Python per step)."""
