"""Layer-wise norms of parameters sharded across processes (FSDP2, HSDP, DTensor).

Under sharded data parallelism (PyTorch's FSDP2 ``fully_shard``, ZeRO) each rank holds a
slice of every parameter, of its gradient and of its optimizer state. The updates of LAMB
and LARS are elementwise except for their norms: the per-tensor norms of the trust ratios
(weight and update for LAMB, weight and gradient or momentum for LARS) and LAMB's global
gradient norm for clipping. So each rank can update its own slices exactly as one process
updates the whole tensors, once it knows the norms of the *full* tensors: the square root of
the sum over ranks of its slices' squared norms. A trust ratio computed from the local slice
alone is simply wrong (it differs on every rank, and from the one-process ratio).

Here the per-tensor partial squared norms of every sharded tensor of every param group are
gathered into one vector and summed over the ranks by **one** ``all_reduce`` per step,
issued on the device data (no host synchronisation); LAMB's global gradient norm, which the
update depends on before any trust ratio can be computed, takes one scalar ``all_reduce``
more when clipping is on (the same one ``torch.nn.utils.clip_grad_norm_`` costs AdamW).

Sharded parameters are detected by type: a ``DTensor`` whose placements are ``Replicate``
and at most one ``Shard(d)`` (FSDP2: ``Shard(0)`` on a 1-D mesh; HSDP: ``(Replicate(),
Shard(0))`` on a 2-D mesh). The update runs on the local tensors (a DTensor's local tensor is
exactly its chunk of the full tensor, never padded, so any single shard dimension is exact);
the norms of the sharded ones are summed over the process group of their shard mesh
dimension. Everything else is refused with a message that says why: partial placements
(a gradient that has not been reduced), strided shards and tensors sharded over several mesh
dimensions (FSDP combined with tensor parallelism), tensors sharded over different process
groups (there would be more than one reduction), a gradient not placed like its parameter.

Each implementation of the update (loop, foreach, fused) is written as a generator that yields
once, with the partial squared norms of its sharded tensors, and receives their sums over the
ranks (:func:`full_norms`); :func:`run_steps` advances the steps of every param group to that
point, makes the one all-reduce, and finishes them. A step with nothing sharded never yields.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from itertools import repeat
from operator import attrgetter

import torch
from torch import Tensor

_local_tensor = attrgetter("_local_tensor")  # DTensor's local shard (what FSDP2 itself reads)
_dtensor_type = None


def dtensor_type():
    """torch's ``DTensor`` class, or None where this build of torch has no torch.distributed."""
    global _dtensor_type
    if _dtensor_type is None:
        if not torch.distributed.is_available():
            _dtensor_type = False
        else:
            from torch.distributed.tensor import DTensor

            _dtensor_type = DTensor
    return _dtensor_type or None


class Sharding:
    """Which tensors of a param group are sharded, and the process group of their norms.

    ``flags[i]``: tensor ``i`` (of the group's tensors with a gradient) is sharded;
    ``index``: the positions of those tensors; ``group``: the process group over which their
    partial squared norms are summed.
    """

    __slots__ = ("group", "flags", "index", "_on")

    def __init__(self, group, flags: list[bool]):
        self.group, self.flags = group, flags
        self.index = [i for i, f in enumerate(flags) if f]
        self._on: dict[torch.device, Tensor | None] = {}

    def index_on(self, device: torch.device) -> Tensor | None:
        """``index`` as a device tensor (uploaded once), or None when every tensor is sharded."""
        hit = self._on.get(device, False)
        if hit is False:
            every = len(self.index) == len(self.flags)
            hit = self._on[device] = None if every else torch.tensor(self.index, device=device)
        return hit


def _describe(i: int, t) -> str:
    return f"parameter {i} (shape {tuple(t.shape)}, placements {tuple(t.placements)})"


def _shard_mesh_dim(i: int, p) -> int | None:
    """The mesh dimension ``p`` is sharded over (None: replicated), or a clear error."""
    from torch.distributed.tensor import Replicate, Shard

    dims = []
    for mesh_dim, placement in enumerate(p.placements):
        if type(placement) is Shard:
            dims.append(mesh_dim)
        elif not isinstance(placement, Replicate):
            kind = "partial" if placement.is_partial() else type(placement).__name__
            raise ValueError(
                f"LAMB/LARS: {_describe(i, p)} has a {kind} placement on mesh dimension "
                f"{mesh_dim}. Supported: Shard(d) on at most one mesh dimension and Replicate "
                "on the others (FSDP2 fully_shard, HSDP); strided shards (FSDP combined with "
                "tensor parallelism) and partial (unreduced) tensors are not.")
    if len(dims) > 1:
        raise ValueError(
            f"LAMB/LARS: {_describe(i, p)} is sharded over {len(dims)} mesh dimensions "
            "(tensor parallelism combined with FSDP?): not supported. The layer-wise norms "
            "would have to be summed over several process groups, one collective each; shard "
            "every parameter over one mesh dimension (FSDP2 / HSDP).")
    return dims[0] if dims else None


def inspect(params: Sequence[Tensor], grads: Sequence[Tensor]) -> tuple[bool, Sharding | None]:
    """Whether ``params`` hold DTensors (then the update runs on their local tensors), and
    their :class:`Sharding` (None when no tensor is sharded).

    Checks every DTensor: supported placements, the gradient placed like its parameter, and
    one process group for every sharded tensor. Runs when a param group's view is built,
    not at every step.
    """
    dtensor = dtensor_type()
    if dtensor is None:
        return False, None
    is_dt = list(map(isinstance, params, repeat(dtensor)))
    grad_dt = list(map(isinstance, grads, repeat(dtensor)))
    if not any(is_dt) and not any(grad_dt):
        return False, None
    group, flags = None, []
    for i, (p, g, p_dt, g_dt) in enumerate(zip(params, grads, is_dt, grad_dt)):
        if not p_dt:
            if g_dt:
                raise ValueError(f"LAMB/LARS: parameter {i} (shape {tuple(p.shape)}) is a "
                                 "plain tensor but its gradient is a DTensor")
            flags.append(False)
            continue
        mesh_dim = _shard_mesh_dim(i, p)
        if not g_dt or g.device_mesh != p.device_mesh or tuple(g.placements) != tuple(
                p.placements):
            got = (f"placements {tuple(g.placements)}" if g_dt else "a plain tensor")
            raise ValueError(
                f"LAMB/LARS: {_describe(i, p)} has a gradient with {got}: the gradient must "
                "be placed like its parameter (FSDP2 reduce-scatters it so; a Partial gradient "
                "has not been reduced over the ranks yet)")
        flags.append(mesh_dim is not None)
        if mesh_dim is None:
            continue
        pg = p.device_mesh.get_group(mesh_dim)
        if group is None:
            group = pg
        elif pg is not group:
            raise ValueError(
                f"LAMB/LARS: {_describe(i, p)} is sharded over another process group than "
                "the parameters before it (several meshes, or tensor parallelism): the norms "
                "of one step must be summed over one group, in one all-reduce")
    return True, (Sharding(group, flags) if group is not None else None)


def local(tensors: Iterable) -> list:
    """The local tensors of DTensors (other entries, None included, unchanged)."""
    dtensor = dtensor_type()
    return [_local_tensor(t) if isinstance(t, dtensor) else t for t in tensors]


def check_local_shapes(params: Sequence[Tensor], *columns) -> None:
    """Each state tensor's local shard has its parameter's local shape (a state dict loaded
    from another sharding, or a full tensor given for a sharded parameter, has not)."""
    for col in columns:
        for i, (p, s) in enumerate(zip(params, col)):
            if s is not None and s.shape != p.shape:
                raise ValueError(
                    f"LAMB/LARS: the optimizer state of parameter {i} has local shape "
                    f"{tuple(s.shape)}, its parameter's local shard {tuple(p.shape)}: state "
                    "and parameters must be sharded alike (load sharded state with "
                    "torch.distributed.checkpoint, or create it by stepping)")


class NormReduction:
    """The all-reduce of a step's partial squared norms over one process group."""

    __slots__ = ("group", "what")

    def __init__(self, group, what: str):
        self.group, self.what = group, what

    def all_reduce(self, parts: list[Tensor]) -> list[Tensor]:
        """Sum ``parts`` (1-D fp32 tensors) over the ranks in one collective; their sums, in
        order (views of one buffer)."""
        import torch.distributed as dist

        flat = parts[0] if len(parts) == 1 else torch.cat([p.to(parts[0].device)
                                                          for p in parts])
        try:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        except Exception as err:  # gloo: "Connection closed by peer", a timeout, ...
            raise _peer_failure(self, err) from err
        if len(parts) == 1:
            return [flat]
        return list(flat.split([p.numel() for p in parts]))


def _peer_failure(reduction: NormReduction, err: Exception) -> Exception:
    import torch.distributed as dist

    from gpuml.errors import PeerFailureError

    try:
        ranks = dist.get_process_group_ranks(reduction.group)
    except Exception:  # the group may be gone with the failure
        ranks = "?"
    return PeerFailureError(
        f"{reduction.what}: the all-reduce of the layer-wise norms over ranks {ranks} failed: "
        "a peer died, hung or failed (the wait is bounded by the process group's timeout, "
        f"that of init_process_group / the device mesh). Cause: {err}")


def reduction_for(shardings: Iterable[Sharding | None], what: str) -> NormReduction | None:
    """The one :class:`NormReduction` of an optimizer's groups (None when nothing is sharded);
    an error when they are sharded over different process groups."""
    groups = {id(s.group): s.group for s in shardings if s is not None}
    if not groups:
        return None
    if len(groups) > 1:
        raise ValueError(f"{what}: param groups sharded over {len(groups)} different process "
                         "groups; the layer-wise norms of one step are summed in one all-reduce "
                         "over one group")
    return NormReduction(next(iter(groups.values())), what)


Step = Generator[Tensor, Tensor, None]


def run_steps(steps: Sequence[Step], reduction: NormReduction | None) -> None:
    """Run the update of every param group: each to the point where it needs the norms of
    its full tensors, then one all-reduce of all their partial squared norms, then the rest.
    """
    waiting, parts = [], []
    for step in steps:
        try:
            parts.append(next(step))
        except StopIteration:
            continue
        waiting.append(step)
    if not waiting:
        return
    if reduction is None:
        raise RuntimeError("LAMB/LARS: sharded tensors but no process group to sum their "
                           "norms over")
    for step, summed in zip(waiting, reduction.all_reduce(parts)):
        try:
            step.send(summed)
        except StopIteration:
            continue
        raise RuntimeError("an update asked for its norms twice in one step")


def full_norms(norms: Tensor, sharding: Sharding | None) -> Generator[Tensor, Tensor, Tensor]:
    """The norms of the full tensors, from ``norms`` (``[k, n]``: k kinds of norm of the n
    tensors of a group, each of the local tensor).

    Without sharding, ``norms`` themselves (no yield). Otherwise yields the squares of the
    sharded tensors' columns, flattened, receives their sums over the ranks and returns
    ``norms`` with those columns replaced by the square roots of the sums.
    """
    if sharding is None:
        return norms
    index = sharding.index_on(norms.device)
    part = norms if index is None else norms[:, index]
    summed = yield part.square().reshape(-1)
    full = summed.to(norms.device).view(norms.shape[0], -1).sqrt()
    if index is None:
        return full
    out = norms.clone()
    out[:, index] = full
    return out
