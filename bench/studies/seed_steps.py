"""How much the C path's warm start saves: SMO steps from four starts, C by factors of 10.

One binary problem of MAGIC and of adult (4,000 rows each, standardised; MAGIC is
bench_exact_work's hard set) at γ in (0.3, 3) x scale: solved at C, then at 10 C from a
cold start (zeros), from the path's seed (``gpuml.kernels.smo.path.seed_alpha``:
variables at the old bound moved to the new one, then rebalanced), from the solution at
C unchanged (feasible, its gradient the same), and from it times 10 (DeCoste and
Wagstaff's scaling), for C in (1, 10, 100). The steps and seconds of each
(``smo_solve_batch`` on the precomputed kernel matrix).

    python -m bench.studies.seed_steps

Writes ``seed_steps.md`` beside the other results of this machine.
"""

from __future__ import annotations

import time

import numpy as np

from bench._harness import record
from gpuml.kernels import SMOProblem, smo_solve_batch
from gpuml.kernels.pairwise import kernel_matrix, make_kernel
from gpuml.kernels.smo.path import seed_alpha


def main() -> None:
    from sklearn.preprocessing import StandardScaler

    from bench.datasets import load_adult, load_magic

    precomputed = make_kernel("precomputed")
    rows = []
    for name, load in (("magic", load_magic), ("adult", load_adult)):
        X, y = load()
        pick = np.random.RandomState(0).permutation(len(y))[:4000]
        X = StandardScaler().fit_transform(X[pick])
        y = np.where(y[pick] == y[pick].max(), 1.0, -1.0)
        scale = 1.0 / (X.shape[1] * X.var())
        for multiple in (0.3, 3.0):
            K = kernel_matrix(X, kernel="rbf", gamma=multiple * scale)

            def solve(C, start, K=K, y=y):
                problem = SMOProblem(0, np.arange(len(y)), y, C, start)
                return smo_solve_batch(precomputed, [K], [problem], tol=1e-3)[0]

            solve(1.0, None)  # compiled
            for C in (1.0, 10.0, 100.0):
                alpha = np.asarray(solve(C, None).alpha)
                starts = {"cold": None,
                          "seed_alpha": seed_alpha(alpha, y, np.full_like(alpha, C),
                                                   np.full_like(alpha, 10 * C)),
                          "unchanged": alpha.copy(), "x 10": alpha * 10.0}
                row = {"data": name, "gamma_x_scale": multiple, "C": f"{C:g} -> {10 * C:g}"}
                for start_name, start in starts.items():
                    t0 = time.perf_counter()
                    res = solve(10 * C, start)
                    row[f"{start_name}_s"] = round(time.perf_counter() - t0, 3)
                    row[f"{start_name}_iter"] = int(res.n_iter)
                rows.append(row)
                print(row, flush=True)
    record("seed_steps", rows, title="SMO steps at 10 C from four starts (4,000 rows)",
           notes="One binary problem each, tol=1e-3, shrinking on, the kernel matrix "
                 "precomputed. Starts: cold (zeros); seed_alpha (the C path's); the solution "
                 "at C unchanged; that solution times 10.",
           command="python -m bench.studies.seed_steps")


if __name__ == "__main__":
    main()
