"""The placement and the fit of a Dask fit: parts placed by cost, rows shipped once, fitted.

Each part is placed on the worker holding most of its rows and parts move only
to balance the solver's cost model (:func:`gpuml.distributed.placement.balance_local`);
each group's rows move at most once, to the worker fitting it, where the
estimator's part solvers (a :class:`gpuml.pipeline.PartSolver` per setting) fit them.
"""

from __future__ import annotations

import numpy as np
from dask.sizeof import sizeof
from distributed import get_worker

from ..._backend import resolve
from ...kernels import part_sums
from ...partition import divide
from ..placement import balance_local
from .driver import BUDGET_RULE, _in_order_sum, _on, fmt_bytes
from .steps import _pack, _unpack


def _take_parts(chunk, labels, part_ids, classes):
    """The rows of each of ``part_ids`` in this chunk, ascending: ``[(X, y, w), ...]``,
    ``y`` and ``w`` as the part solvers take them: a classifier's (``classes`` given)
    class indices, and the sample weights (None without)."""
    y = chunk.y if classes is None else np.searchsorted(classes, chunk.y)
    w = chunk.w
    out = []
    for p in part_ids:
        sel = np.flatnonzero(labels == p)
        out.append((chunk.X[sel], y[sel], None if w is None else w[sel]))
    return out


def _group_rows(pieces, n_parts):
    """The pieces of each part, chunk after chunk, laid end to end part after part."""
    per_part = [[piece[j] for piece in pieces] for j in range(n_parts)]
    X = np.concatenate([b[0] for blocks in per_part for b in blocks])
    y = np.concatenate([b[1] for blocks in per_part for b in blocks])
    w = (None if pieces[0][0][2] is None else
         np.concatenate([b[2] for blocks in per_part for b in blocks]))
    sizes = [sum(b[0].shape[0] for b in blocks) for blocks in per_part]
    ends = np.cumsum(sizes)
    local = [np.arange(hi - m, hi) for m, hi in zip(sizes, ends.tolist())]
    return X, y, w, local


def _group_sums(pieces, n_parts):
    """The group's per-part row sums and counts (packed as :func:`_pack`), over the chunks.

    Each chunk's sums are the ones :func:`part_sums` gives on the whole chunk (its
    rows of a part, in order) and they are added in chunk order, so the parts' means
    have the bits of summing every chunk's sums on the client, without that pass.
    """
    packs = []
    for piece in pieces:
        X = np.concatenate([b[0] for b in piece])
        labels = np.repeat(np.arange(n_parts), [b[0].shape[0] for b in piece])
        packs.append(_pack(*part_sums(X, labels, n_parts)))
    return _in_order_sum(packs)


def _cut(chunks, labels, part_ids, classes):
    """:func:`_take_parts` for each of a worker's chunks; ``labels``: theirs, end to end."""
    ends = np.cumsum([c.X.shape[0] for c in chunks])
    return [_take_parts(c, labels[e - c.X.shape[0]: e], part_ids, classes)
            for c, e in zip(chunks, ends.tolist())]


def _take(chunks, labels, part_ids, classes):
    """The rows a group of parts takes from this worker's chunks, packed to travel.

    :func:`_cut`'s pieces laid end to end, chunk after chunk and part after part,
    as ``(X, y, w, counts)`` with ``counts[i, j]`` the rows of part j in chunk i:
    three arrays on the wire however many chunks and parts (:func:`_unpack_take`).
    """
    pieces = _cut(chunks, labels, part_ids, classes)
    flat = [b for piece in pieces for b in piece]
    counts = np.array([[b[0].shape[0] for b in piece] for piece in pieces], dtype=np.int64)
    w = None if flat[0][2] is None else np.concatenate([b[2] for b in flat])
    return (np.concatenate([b[0] for b in flat]), np.concatenate([b[1] for b in flat]), w,
            counts)


def _unpack_take(packed):
    """:func:`_take`'s pieces again, as views of its arrays."""
    X, y, w, counts = packed
    ends = np.cumsum(counts.ravel()).tolist()
    flat = [(X[a:b], y[a:b], None if w is None else w[a:b])
            for a, b in zip([0] + ends[:-1], ends)]
    P = counts.shape[1]
    return [flat[i * P: (i + 1) * P] for i in range(counts.shape[0])]


def _pieces(part_ids, classes, sources):
    """A group's rows, per chunk in chunk order (:func:`_take_parts`' pieces).

    ``sources``: one ``(ks, chunks, labels, taken)`` per worker holding chunks:
    ``taken``, what a task on that worker took (:func:`_take`: the rows that move),
    or None for this worker's own chunks, cut here from ``chunks`` by ``labels``.
    """
    pieces = {}
    for ks, chunks, labels, taken in sources:
        pieces.update(zip(ks, _cut(chunks, labels, part_ids, classes) if taken is None
                          else _unpack_take(taken)))
    return [pieces[k] for k in sorted(pieces)]


#: A worker fits its group of parts in waves of consecutive parts whose rows take at most
#: this many bytes (at least one part a wave): a wave's rows are laid end to end and cut
#: per part by the solver, two copies of them beside the rows the worker took, so the
#: memory of a fit grows with its largest part, not with its whole group.
FIT_WAVE_BYTES = 64 * 2**20


def _waves(sizes, row_bytes, wave_bytes):
    """Runs of consecutive positions of ``sizes`` whose rows fit ``wave_bytes``."""
    waves, current, held = [], [], 0
    for j, m in enumerate(np.asarray(sizes).tolist()):
        if current and held + m * row_bytes > wave_bytes:
            waves.append(current)
            current, held = [], 0
        current.append(j)
        held += m * row_bytes
    return waves + ([current] if current else [])


def _fit_group(solvers, device, classes, part_ids, sources, wave_bytes, row_ids=None):
    """The parts ``part_ids`` fitted on this worker (its GPU when it has one: ``device``
    resolved here) by each solver, in waves of at most ``wave_bytes`` of rows
    (:data:`FIT_WAVE_BYTES`, sent by the client), each wave's rows gathered once for every
    solver: each solver's fits as the host keeps them (solvers that keep their parts on
    the workers: as :meth:`~gpuml.pipeline.PartSolver.keep` makes them, with ``row_ids``,
    each part's training indices, when they ask for them), their rows' sums and counts
    (the parts' means) and this worker's address."""
    pieces = _pieces(part_ids, classes, sources)
    sums = _group_sums(pieces, len(part_ids))
    sizes = np.array([sum(piece[j][0].shape[0] for piece in pieces)
                      for j in range(len(part_ids))], dtype=np.int64)
    itemsize = pieces[0][0][0].dtype.itemsize
    row_bytes = pieces[0][0][0].shape[1] * itemsize
    backend = resolve(device)
    ids = np.asarray(part_ids)
    host = [[] for _ in solvers]
    with backend.use():
        for solver in solvers:
            solver.cost.check_device(sizes, itemsize, backend)
        for wave in _waves(sizes, row_bytes, wave_bytes):
            X, y, w, local = _group_rows([[piece[j] for j in wave] for piece in pieces],
                                         len(wave))
            for piece in pieces:
                # This wave's rows are in X now: the copies cut from this worker's chunks go
                # (the rows the others sent stay with their task's arguments), so the parts
                # kept grow as the rows held shrink.
                for j in wave:
                    piece[j] = None
            for k, solver in enumerate(solvers):
                fits = solver.solve(backend, X, y, w, local, ids[wave])
                if solver.keeps_parts_on_workers:
                    host[k] += [solver.keep(fit, X[rows], y[rows],
                                            None if row_ids is None else row_ids[j])
                                for fit, rows, j in zip(fits, local, wave)]
                else:
                    host[k] += [solver.to_host(fit, X[rows]) for fit, rows in zip(fits, local)]
                del fits
            del X, y, w
    return host, sums, get_worker().address


#: The step whose tasks hold the groups of parts kept on the workers (:func:`_setting`).
KEPT_STEP = "fit-setting"


class KeptGroup(tuple):
    """What a group of parts kept on its worker holds: ``(fits, sums, address)``, one
    solver's fits of the group's parts (:func:`_setting`)."""


@sizeof.register(KeptGroup)
def _sizeof_kept(group) -> int:
    """The bytes of its parts' arrays. Without this Dask sizes each part by
    ``sys.getsizeof`` (the object alone), and its scheduler, thinking a group of parts
    free to move, may send it to the rows a prediction task reads instead of those rows to
    it (its parts, megabytes or gigabytes of support vectors or training rows, copied to
    another worker)."""
    return int(sum(sizeof(v) for fit in group[0] for v in getattr(fit, "__dict__", {}).values()
                   if hasattr(v, "nbytes") or hasattr(v, "data")) + group[1].nbytes)


def _setting(result, k):
    """Solver ``k``'s part of a group's result (:func:`_fit_group`): what a group kept on
    its worker holds (:class:`KeptGroup`)."""
    host, sums, address = result
    return KeptGroup((host[k], sums, address))


def _kept_summaries(result, solver):
    """What the client gathers of a group fitted with its parts kept on the worker: each
    part's :meth:`~gpuml.pipeline.PartSolver.summary` (no rows), the group's sums and the
    worker's address."""
    host, sums, address = result
    return [solver.summary(fit) for fit in host], sums, address


def check_budget(need, sizes, n, budget, what):
    """Refuse a fit whose largest part needs more than a worker's budget.

    ``need(sizes)`` estimates the bytes one worker holds for parts of these
    sizes; the message names the smallest ``n_partitions`` whose balanced
    parts fit by the same estimate.
    """
    if budget is None:
        return
    sizes = np.asarray(sizes, dtype=np.int64)
    needed = need(sizes)
    if needed <= budget:
        return
    suggest = next((P for P in _candidates(len(sizes), n)
                    if need(np.array([-(-n // P)], dtype=np.int64)) <= budget), None)
    change = (f"use a larger n_partitions (n_partitions>={suggest} should fit)" if suggest
              else "use workers with more memory")
    raise MemoryError(
        f"{what} needs about {fmt_bytes(needed)} on one Dask worker (a part of "
        f"{int(sizes.max())} rows: its rows and kernel block), but the smallest worker's "
        f"budget is {fmt_bytes(budget)} ({BUDGET_RULE}); {change}, or workers with a larger "
        "memory_limit")


def check_group_budget(need, sizes, held_rows, row_bytes, budget, what, address):
    """Refuse a placement that gives a worker more than its budget.

    A worker holds the input rows of its chunks (``held_rows`` rows of
    ``row_bytes`` bytes) and, while it fits, the rows of the parts placed on it
    with their solver's blocks (``need(sizes)``) and two copies of one wave of
    them (:func:`_fit_group`); the other workers' parts are not there.
    """
    if budget is None or not len(sizes):
        return
    sizes = np.asarray(sizes, dtype=np.int64)
    held_bytes = int(held_rows) * int(row_bytes)
    # the parts' rows and blocks, and a wave's two copies of its rows (_fit_group)
    wave = max(min(FIT_WAVE_BYTES, int(sizes.sum()) * row_bytes), int(sizes.max()) * row_bytes)
    needed = held_bytes + need(sizes) + 2 * wave
    if needed <= budget:
        return
    raise MemoryError(
        f"{what} needs about {fmt_bytes(needed)} on the Dask worker {address}: the input "
        f"rows it holds ({fmt_bytes(held_bytes)}) and the {len(sizes)} parts placed there "
        f"({int(sizes.sum())} rows, with their solver's blocks), but the smallest worker's "
        f"budget is {fmt_bytes(budget)} ({BUDGET_RULE}); use more workers, or workers with a "
        "larger memory_limit")


def _candidates(P, n):
    """n_partitions values above P to suggest, doubling then n itself."""
    Q = max(P, 1) + 1
    while Q < n:
        yield Q
        Q = max(Q + 1, int(Q * 1.25))
    yield n


def _held_labels(rows, labels):
    """Each worker group's labels, its chunks' laid end to end (``rows.groups`` order)."""
    return [np.concatenate([labels[k] for k in ks]) for _, ks, _ in rows.groups]


def place_parts(rows, labels, sizes, costs, addresses, check=None) -> list[np.ndarray]:
    """Step 3: the parts placed on the workers, ``placement[a]`` the parts of worker ``a``.

    Each part starts on the worker holding most of its rows and parts move only to
    balance ``costs`` (:func:`gpuml.distributed.placement.balance_local`); the rows
    that will move are counted in the driver's traffic. ``check(address, part_sizes,
    held_rows)``, when given, is called for every worker with the sizes of the parts
    placed on it and the input rows its chunks hold, before any row moves (a refusal
    raises there).
    """
    P = len(sizes)
    # held[p, a]: the rows of part p that worker a holds already
    held_rows = np.zeros((P, len(addresses)), dtype=np.int64)
    for (holder, _, _), mine in zip(rows.groups, _held_labels(rows, labels)):
        if holder in addresses:
            held_rows[:, addresses.index(holder)] += np.bincount(mine, minlength=P)
    placement = balance_local(costs, held_rows)
    if check is not None:
        for a, ids in enumerate(placement):
            check(addresses[a], np.asarray(sizes)[ids], int(held_rows[:, a].sum()))
    rows.driver.traffic.rows_moved = int(sum(held_rows[ids].sum() - held_rows[ids, a].sum()
                                             for a, ids in enumerate(placement)))
    return placement


def ship_and_fit(rows, labels, placement, solvers, classes, device, addresses, centers,
                 part_rows=None):
    """Step 4: each group's rows shipped to the worker it is placed on and fitted there.

    ``placement[a]`` are the parts of worker ``addresses[a]`` (:func:`place_parts`);
    ``solvers`` the part solvers the tasks get (one per setting: each fits every
    part, from rows shipped and gathered once), ``classes`` a classifier's (its
    targets travel as class indices; None otherwise), ``device`` what each worker
    resolves to solve on. Returns each solver's per-part fits in part order
    (gathered), the worker each part was fitted on (where its task ran, which is
    not the planned one when that worker was lost), the centres: ``centers``
    as given, or when None the parts' means from the sums the fit tasks return
    with the fits (no pass of their own), and each solver's groups kept on the workers.

    Solvers that keep their parts on the workers
    (:attr:`~gpuml.pipeline.PartSolver.keeps_parts_on_workers`): the fitted parts stay
    on the workers that fitted them; the client gathers each part's
    ``solver.summary(fit)`` in place of its fit, and each solver's kept groups are one
    ``(part_ids, future)`` per group, the future holding that solver's fits of the group
    (:func:`_setting`). Otherwise they are None. Solvers that keep the training indices of
    their parts' rows (:attr:`~gpuml.pipeline.PartSolver.keeps_row_ids`) get them from
    ``part_rows`` (each part's, the split's), sent with each group's fit task.
    """
    driver = rows.driver
    P = sum(len(ids) for ids in placement)
    # The fit task cuts the group's rows out of its own worker's chunks; a take task on
    # each other worker holding some of them cuts them out of its chunks. Every take is
    # submitted before any fit, and ahead of them in each worker's queue: a worker that
    # starts its own fit first keeps the other waiting for its rows until that fit ends.
    groups = []
    held = _held_labels(rows, labels)
    for address, ids in zip(addresses, placement):
        if ids.size == 0:
            continue
        ids_list = ids.tolist()
        sources = []
        for (holder, ks, chunks), mine in zip(rows.groups, held):
            if holder == address:
                sources.append((ks, chunks, mine, None))
            elif np.isin(mine, ids).any():
                take = driver.submit("take", _take, chunks, mine, ids_list, classes,
                                     priority=1, **_on(holder))
                sources.append((ks, None, None, take))
        groups.append((ids_list, address, sources))
    with_ids = solvers[0].keeps_parts_on_workers and solvers[0].keeps_row_ids
    futures = [driver.submit("fit-parts", _fit_group, solvers, device, classes, ids, sources,
                             FIT_WAVE_BYTES,
                             [part_rows[p] for p in ids] if with_ids else None,
                             **_on(address))
               for ids, address, sources in groups]
    kept = [None] * len(solvers)
    if solvers[0].keeps_parts_on_workers:
        kept = [[(ids, driver.submit(KEPT_STEP, _setting, future, k))
                 for (ids, _, _), future in zip(groups, futures)]
                for k in range(len(solvers))]
        summaries = [driver.submit("fit-summary", _kept_summaries, future, solver)
                     for solver, groups_k in zip(solvers, kept) for _, future in groups_k]
        results = driver.gather(summaries, as_they_finish=True)
        per_setting = [results[k * len(groups):(k + 1) * len(groups)]
                       for k in range(len(solvers))]
    else:
        results = driver.gather(futures, as_they_finish=True)
        per_setting = [[(host[k], pack, address) for host, pack, address in results]
                       for k in range(len(solvers))]
    fits = [[None] * P for _ in solvers]
    part_worker = [None] * P
    sums = np.zeros((P, rows.n_features + 1), dtype=np.float64)
    for k, setting in enumerate(per_setting):
        for (ids, _, _), (group, pack, address) in zip(groups, setting):
            sums[ids] = pack
            for p, fit in zip(ids, group):
                fits[k][p] = fit
                part_worker[p] = address
    if centers is None:
        centers = divide(*_unpack(sums, rows.dtype))
    return fits, part_worker, centers, kept
