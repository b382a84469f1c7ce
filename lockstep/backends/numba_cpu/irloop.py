"""The loop every register intrinsic (``tiles``, ``int8gemm``) emits, in LLVM IR: a counted loop
whose accumulators stay in vector registers from the first step to the last; and the broadcast
(``splat``) they all use."""

from __future__ import annotations

from llvmlite import ir


def accumulator_loop(builder, name: str, count, init: list, step) -> list:
    """Emit ``for i in range(count): accs = step(i, accs)`` from ``accs = init`` (count >= 1, an
    i64 value; i an i64 counter) with the accumulators carried as phi nodes. Returns their
    final values; the builder is left at the loop's exit block."""
    i64 = ir.IntType(64)
    entry = builder.block
    loop = builder.append_basic_block(f"{name}.loop")
    done = builder.append_basic_block(f"{name}.done")
    builder.branch(loop)

    builder.position_at_end(loop)
    i = builder.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    accs = []
    for v in init:
        phi = builder.phi(v.type)
        phi.add_incoming(v, entry)
        accs.append(phi)
    new = step(i, accs)
    i_next = builder.add(i, ir.Constant(i64, 1))
    i.add_incoming(i_next, loop)
    for phi, v in zip(accs, new):
        phi.add_incoming(v, loop)
    builder.cbranch(builder.icmp_signed("<", i_next, count), loop, done)

    builder.position_at_end(done)
    return new


def splat(builder, value, lanes: int):
    """``value`` in every lane of a ``lanes``-wide vector (an insert, then an all-zero shuffle)."""
    i32 = ir.IntType(32)
    vec = ir.VectorType(value.type, lanes)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(i32, lanes), None))
