"""A software prefetch for the numba kernels: :func:`prefetch` ``(a, i, j)`` asks the CPU to
bring the cache line of ``a[i, j]`` (a 2-D array) in, and returns nothing.

FedMC-ADMM's made combination rows (:func:`._fedmc_admm_kernels._combination_rows`) read
one random row of a broadcast per rated item and round a client took part in, from a
history of ``rounds x n_items x r`` numbers (127 MB at the Netflix shape): each read misses
every cache, and the loop holds too few of them in flight. Asked for a few items ahead, the
reads overlap (measured: 1.7x on that loop). A prefetch changes no value.
"""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["prefetch"]


@intrinsic
def prefetch(typingctx, a, i, j):
    """``llvm.prefetch`` of ``a[i, j]``'s address: a read, high locality, data cache."""
    sig = types.void(a, i, j)

    def codegen(context, builder, signature, args):
        aryty, ity, jty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        index = [context.cast(builder, args[1], ity, types.intp),
                 context.cast(builder, args[2], jty, types.intp)]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, index)
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, byte_ptr), ir.Constant(i32, 0),
                          ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen
