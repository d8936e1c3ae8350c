"""Sequential steps of the balanced partitioners (seed 001, Alg 3, 4 and 9) as numba loops."""

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def fill_nearest_open(D, counts, caps, labels):
    """Give each row of ``D``, in order, to its nearest part that is not yet full.

    ``D[i, j]`` is the (squared) distance of sample i to centre j; part j is
    full once ``counts[j] == caps[j]``. ``counts`` is updated in place, so
    consecutive blocks of rows can be filled one after another. Ties go to
    the lowest part index, as the strict ``dist < mindis`` of the paper.
    """
    n, p = D.shape
    for i in range(n):
        best = -1
        best_d = np.inf
        for j in range(p):
            if counts[j] < caps[j] and D[i, j] < best_d:
                best_d = D[i, j]
                best = j
        counts[best] += 1
        labels[i] = best
