"""Cascade SVM, DC-SVM and DC-Filter: one kernel SVM trained up a binary tree of SMO layers.

The tree methods of :class:`~gpuml.estimators.casvm.CASVMClassifier`
(``method="cascade"``, ``"dcsvm"``, ``"dcfilter"``). Layer 1 trains one SVM
per part of the split, as CA-SVM does. Every later layer merges the nodes of
the one before two by two, in order (an odd last node waits for the next
layer), and trains each merged node warm-started with its children's alphas,
until one node is left: its SVM is the model. What a node passes up is what
tells the methods apart: Cascade and DC-Filter pass each one-vs-one problem's
support vectors only (the filter of Graf et al.; a pair a node could not train
passes all its rows), DC-SVM passes every row, so its last layer solves the
whole problem from the parts' solution (Hsieh et al.).

References
----------
Yang You, "Fast and Accurate Machine Learning on Distributed Systems and
Supercomputers", PhD thesis, UC Berkeley, 2020, sections 2.2-2.3.
H. P. Graf, E. Cosatto, L. Bottou, I. Durdanovic, V. Vapnik, "Parallel support
vector machines: the Cascade SVM", NIPS 2004.
C.-J. Hsieh, S. Si, I. S. Dhillon, "A divide-and-conquer solver for kernel
support vector machines", ICML 2014.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._svm import class_pairs


@dataclass
class TreeFit:
    """The record of a tree fit (:attr:`gpuml.pipeline.FitResult.layers`).

    ``root``: the model's one part (the last node's rows, centred on the mean of
    X); ``n_iter``, ``layer_sizes``, ``layer_n_iter``: as :func:`fit_tree`
    returns them.
    """

    root: object
    n_iter: np.ndarray
    layer_sizes: list
    layer_n_iter: np.ndarray


@dataclass
class _TreeNode:
    """A node of a layer: its rows and what its children passed up.

    ``members`` (bool) and ``warm`` (the children's alphas) have shape
    ``(n_pairs, len(rows))``; ``members=None`` means every row of the pair's two
    classes, ``warm=None`` a cold start. ``fit`` (the node's
    :class:`~gpuml.estimators._svm.SVMPartFit`) is set once the node is trained.
    """

    rows: np.ndarray
    members: np.ndarray | None = None
    warm: np.ndarray | None = None
    fit: object = None


def fit_tree(fit_nodes, parts, y_idx, sample_C, n_classes, pass_every_row):
    """Train the layers of the tree over the parts of a split, up to one SVM.

    Parameters
    ----------
    fit_nodes : callable
        ``fit_nodes(node_rows, members, warm)``: one fitted
        :class:`~gpuml.estimators._svm.SVMPartFit` per node, given each node's
        rows, members and warm start (as :class:`_TreeNode`).
    parts : list of int ndarrays
        The rows of each part of the split: the nodes of the first layer.
    y_idx, sample_C : ndarray of shape (n_samples,)
        Every training row's class index and C.
    n_classes : int
    pass_every_row : bool
        DC-SVM: a node passes up every row; otherwise (Cascade, DC-Filter)
        each one-vs-one problem's support vectors.

    Returns
    -------
    root_rows : int ndarray
        The rows of the last node, ascending.
    root_fit : SVMPartFit
        Its model: the classifier's.
    n_iter : ndarray of shape (n_pairs,)
        SMO steps per pair, summed over every layer.
    layer_sizes : list of int ndarrays
        The rows of each node trained in each layer, first layer first (a node
        carried up unmerged is not repeated).
    layer_n_iter : int ndarray of shape (n_layers,)
        SMO steps per layer, over all its nodes and pairs.
    """
    nodes = [_TreeNode(np.asarray(rows, dtype=np.int64)) for rows in parts]
    n_iter = 0
    layer_sizes, layer_n_iter = [], []
    while True:
        todo = [node for node in nodes if node.fit is None]
        fits = fit_nodes([n.rows for n in todo], [n.members for n in todo],
                         [n.warm for n in todo])
        for node, fit in zip(todo, fits):
            node.fit = fit
        steps = np.sum([fit.n_iter for fit in fits], axis=0)
        n_iter = n_iter + steps
        layer_sizes.append(np.array([len(n.rows) for n in todo], dtype=np.int64))
        layer_n_iter.append(int(steps.sum()))
        if len(nodes) == 1:
            break
        odd = nodes[len(nodes) - len(nodes) % 2:]
        nodes = [_merge(nodes[i], nodes[i + 1], y_idx, sample_C, n_classes, pass_every_row)
                 for i in range(0, len(nodes) - 1, 2)] + odd
    root = nodes[0]
    return root.rows, root.fit, n_iter, layer_sizes, np.array(layer_n_iter, dtype=np.int64)


def _passed_up(node, y_idx, sample_C, n_classes, pass_every_row):
    """``(rows, members, alphas)`` that a trained node hands up (see :func:`fit_tree`)."""
    fit = node.fit
    alpha = np.zeros((fit.dual_coef.shape[0], len(node.rows)))
    alpha[:, fit.support] = np.abs(fit.dual_coef)
    if pass_every_row:
        return node.rows, node.members, alpha
    members = node.members
    if members is None:
        first, second = np.array(class_pairs(n_classes), dtype=np.int64).reshape(-1, 2).T
        cls = y_idx[node.rows]
        members = (((cls[None, :] == first[:, None]) | (cls[None, :] == second[:, None]))
                   & (sample_C[node.rows] > 0)[None, :])
    keep = members & ((alpha > 0) | (fit.pair_status < 2)[:, None])
    used = keep.any(axis=0)
    return node.rows[used], keep[:, used], alpha[:, used]


def _merge(left, right, y_idx, sample_C, n_classes, pass_every_row) -> _TreeNode:
    """The parent of two trained nodes: their rows (ascending), members and warm start."""
    (rows_a, mem_a, warm_a), (rows_b, mem_b, warm_b) = (
        _passed_up(left, y_idx, sample_C, n_classes, pass_every_row),
        _passed_up(right, y_idx, sample_C, n_classes, pass_every_row))
    rows = np.concatenate([rows_a, rows_b])
    order = np.argsort(rows, kind="stable")
    members = (None if mem_a is None and mem_b is None
               else np.concatenate([mem_a, mem_b], axis=1)[:, order])
    warm = np.concatenate([warm_a, warm_b], axis=1)[:, order]
    return _TreeNode(rows[order], members, warm)
