"""Lock-free atomic operations on array elements for numba ``nopython`` code.

Numba has no float atomics of its own, so these intrinsics emit LLVM's
``atomicrmw`` / atomic ``load`` / atomic ``store`` instructions directly on the
address of ``arr[i]``. ``atomicrmw fadd`` is lowered by LLVM to the target's
native instruction or to a compare-and-swap loop (x86), so concurrent adds
from several threads never lose an update. Asy-GCD's CPU workers (You 2020,
Alg 14) use them for their update counter and the publication of update-log
entries (:mod:`.cpu`); they no longer add into a shared gradient with them
(a ``lock cmpxchg`` loop per entry kept two workers slower than one:
bench/results/cpu-2core/asygcd-runs.md).

Orderings: ``atomic_add`` is ``monotonic`` (every add lands, in some order);
``atomic_add_seq``, ``atomic_load`` and ``atomic_store`` are ``seq_cst``, so a
log entry written before its number is stored is complete for whoever loads
that number.
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _element_pointer(context, builder, arr_type, arr, idx):
    ary = context.make_array(arr_type)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, arr_type, ary, [idx], wraparound=False)


def _check_array(arr):
    if not isinstance(arr, types.Array) or arr.ndim != 1:
        raise TypeError("atomic operations need a 1-D array")
    if not isinstance(arr.dtype, (types.Float, types.Integer)):
        raise TypeError(f"atomic operations need a float or integer array, got {arr.dtype}")


def _make_rmw(float_op, int_op, ordering):
    """An intrinsic ``f(arr, i, v)`` doing ``arr[i] <op>= v`` atomically; returns the old value."""

    @intrinsic
    def rmw(typingctx, arr, idx, val):
        _check_array(arr)
        if not isinstance(idx, types.Integer):
            return None
        op = float_op if isinstance(arr.dtype, types.Float) else int_op
        sig = arr.dtype(arr, types.intp, arr.dtype)

        def codegen(context, builder, signature, args):
            ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
            return builder.atomic_rmw(op, ptr, args[2], ordering)

        return sig, codegen

    return rmw


#: ``atomic_add(arr, i, v)``: ``arr[i] += v`` for float (``fadd``) or integer arrays, relaxed.
atomic_add = _make_rmw("fadd", "add", "monotonic")
#: ``atomic_add_seq(arr, i, v)``: the same with sequentially consistent ordering (counters).
atomic_add_seq = _make_rmw("fadd", "add", "seq_cst")


@intrinsic
def atomic_load(typingctx, arr, idx):
    """``arr[i]`` read atomically (seq_cst): never torn, never hoisted out of a spin loop."""
    _check_array(arr)
    sig = arr.dtype(arr, types.intp)

    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        align = context.get_abi_sizeof(context.get_value_type(signature.args[0].dtype))
        return builder.load_atomic(ptr, "seq_cst", align)

    return sig, codegen


@intrinsic
def atomic_store(typingctx, arr, idx, val):
    """``arr[i] = v`` written atomically (seq_cst)."""
    _check_array(arr)
    sig = types.void(arr, types.intp, arr.dtype)

    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        align = context.get_abi_sizeof(context.get_value_type(signature.args[0].dtype))
        builder.store_atomic(args[2], ptr, "seq_cst", align)
        return context.get_dummy_value()

    return sig, codegen
