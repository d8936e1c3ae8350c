"""The GPU plan of a C path in one launch (smo_solve_path's ``one_launch``), run on the host.

No GPU here: the GPU branch of :func:`gpuml.kernels.smo_solve_path` is driven with the
batch solver replaced by the CPU one, which is what the plan hands the GPU solver (one
:func:`~gpuml.kernels.smo_solve_batch` of every (problem, C) pair, the groups as given).
"""

import numpy as np
import pytest
from sklearn.datasets import load_digits

import gpuml.kernels as kernels
from gpuml.kernels import Kernel, SMOProblem
from gpuml.kernels.smo import cpu
from gpuml.kernels.smo import cuda as smo_cuda
from gpuml.kernels.smo.path import path_batch


def _pairs():
    X, y = load_digits(return_X_y=True)
    X, y = X[:400] / 16.0, y[:400]
    Xs, problems = [X[:200], X[200:]], []
    for g, labels in enumerate((y[:200], y[200:])):
        for a, b in ((0, 1), (3, 8)):
            idx = np.flatnonzero((labels == a) | (labels == b))
            problems.append(SMOProblem(g, idx, np.where(labels[idx] == a, 1.0, -1.0),
                                       np.full(idx.size, 1.5)))
    return Xs, problems


def test_one_launch_solves_every_problem_for_every_c_in_one_batch(monkeypatch,
                                                                  smo_gpu_on_host):
    Xs, problems = _pairs()
    kernel = Kernel("rbf", 0.05)
    Cs = [0.1, 1.0, 10.0]
    batches = smo_gpu_on_host
    path = kernels.smo_solve_path(kernel, Xs, problems, Cs, one_launch=True)
    monkeypatch.undo()
    assert len(batches) == 1 and len(batches[0]) == len(problems) * len(Cs)
    # problem w for C index c is entry c * n + w, in its own group, its bounds times C
    for c, C in enumerate(Cs):
        for w, problem in enumerate(problems):
            copy = batches[0][c * len(problems) + w]
            assert copy.group == problem.group and copy.idx is problem.idx
            np.testing.assert_array_equal(copy.C, C * problem.C)
    # each result is the cold solve of its C
    for c, C in enumerate(Cs):
        cold = cpu.solve_batch(kernel, Xs, [SMOProblem(p.group, p.idx, p.y, C * p.C)
                                            for p in problems])
        for a, b in zip(path[c], cold):
            assert a.n_iter == b.n_iter
            np.testing.assert_array_equal(a.alpha, b.alpha)


def test_auto_takes_one_launch_for_problems_of_one_block_each(monkeypatch, smo_gpu_on_host):
    Xs, problems = _pairs()
    kernel = Kernel("rbf", 0.05)
    batches = smo_gpu_on_host
    kernels.smo_solve_path(kernel, Xs, problems, [0.5, 5.0], one_launch="auto")
    assert len(batches) == 1
    # a problem at least GRID_MIN_SIZE long takes the whole device: one batch per C, seeded
    monkeypatch.setattr(smo_cuda, "GRID_MIN_SIZE", 30)
    batches.clear()
    kernels.smo_solve_path(kernel, Xs, problems, [0.5, 5.0], one_launch="auto")
    assert len(batches) == 2 and batches[1][0].alpha0 is not None


def test_path_batch_needs_an_increasing_path():
    _, problems = _pairs()
    with pytest.raises(ValueError, match="increasing"):
        path_batch(problems, [1.0, 0.5])
