"""Register-tiled ascending contractions: the spec's order, at the speed of a GEMM micro-kernel.

The spec's contraction order (``acc = acc + a[k] * b[k]``, ascending k from +0.0,
product rounded then sum rounded) fixes what each output element computes, not how
many outputs are computed at once. A loop vectorized across outputs loads and stores
its accumulators on every k; these micro-kernels keep a tile of ``MR`` rows x
``16 * NV`` columns of accumulators in vector registers for the whole k loop,
broadcasting one ``a`` per row and loading ``NV`` vectors of ``b`` per k:

    out[r, c] = ((init[r, c] + a[r, 0] * b[0, c]) + a[r, 1] * b[1, c]) + ...

Each ``fmul``/``fadd`` is one IEEE operation in LLVM IR without fast-math flags, so
nothing is contracted into an FMA and nothing is reordered; ``init`` is +0.0, or the
tile's current contents when ``accumulate`` (a sum continued across calls in its
ascending order). There are no flush tests: callers use a tile only where
``fp.safe_products`` proves that no product or partial sum can be subnormal, and
canonicalize what they store. A zero ``a`` with a finite ``b`` adds ``+-0.0`` to an
accumulator that can never be -0.0 (a sum from +0.0 in round-to-nearest is -0.0 only
if every term is), so it changes nothing: padding with zeros is the same as leaving
the term out, which lets masked attention pairs be zeros inside a tile.

Addresses and strides are in float32 elements: ``a[r, k]`` is at
``a_addr + 4 * (r * lda + k * a_inc)``, ``b[k, c]`` at ``b_addr + 4 * (k * ldb + c)``,
``out[r, c]`` at ``out_addr + 4 * (r * ldo + c)``. Callers guarantee ``k >= 1`` and that
every addressed element exists.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .irloop import accumulator_loop

LANES16 = 16  # float32 lanes of one AVX-512 register (LLVM splits it where the CPU is narrower)


def _contract_tile(mr: int, nv: int, lanes: int = LANES16):
    """The intrinsic ``f(out_addr, ldo, a_addr, lda, a_inc, b_addr, ldb, k, accumulate)`` for one tile shape:
    ``mr`` rows x ``nv`` vectors of ``lanes`` float32."""

    @intrinsic
    def contract_tile(typingctx, out_addr, ldo, a_addr, lda, a_inc, b_addr, ldb, k, accumulate):
        sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.intp, types.uintp, types.intp,
                         types.intp, types.boolean)

        def codegen(context, builder, sig, args):
            out_i, ldo_v, a_i, lda_v, ainc_v, b_i, ldb_v, k_v, acc_flag = args
            f32, i64 = ir.FloatType(), ir.IntType(64)
            vec = ir.VectorType(f32, lanes)
            f_p = f32.as_pointer()
            a_p = builder.inttoptr(a_i, f_p)
            b_p = builder.inttoptr(b_i, f_p)
            out_p = builder.inttoptr(out_i, f_p)

            def c64(x):
                return ir.Constant(i64, x)

            def out_slot(r, h):
                ptr = builder.gep(out_p, [builder.add(builder.mul(ldo_v, c64(r)), c64(lanes * h))])
                return builder.bitcast(ptr, vec.as_pointer())

            init = []
            acc_bool = builder.icmp_unsigned("!=", acc_flag, ir.Constant(acc_flag.type, 0))
            zero = ir.Constant(vec, None)  # +0.0 in every lane
            for r in range(mr):
                for h in range(nv):
                    loaded = builder.load(out_slot(r, h), align=4)
                    init.append(builder.select(acc_bool, loaded, zero))
            def step(kk, accs):  # one k: every accumulator += a[r, k] * b[k, c]
                b_row = builder.mul(kk, ldb_v)
                b_vecs = [builder.load(builder.bitcast(builder.gep(b_p, [builder.add(b_row, c64(lanes * h))]),
                                                       vec.as_pointer()), align=4) for h in range(nv)]
                a_col = builder.mul(kk, ainc_v)
                new = []
                for r in range(mr):
                    a_val = builder.load(builder.gep(a_p, [builder.add(a_col, builder.mul(lda_v, c64(r)))]),
                                         align=4)
                    splat = builder.insert_element(ir.Constant(vec, ir.Undefined), a_val,
                                                   ir.Constant(ir.IntType(32), 0))
                    splat = builder.shuffle_vector(splat, ir.Constant(vec, ir.Undefined),
                                                   ir.Constant(ir.VectorType(ir.IntType(32), lanes), None))
                    for h in range(nv):
                        prod = builder.fmul(splat, b_vecs[h])  # rounded
                        new.append(builder.fadd(accs[r * nv + h], prod))  # rounded: two roundings, never an FMA
                return new

            new = accumulator_loop(builder, "tile", k_v, init, step)
            for r in range(mr):
                for h in range(nv):
                    builder.store(new[r * nv + h], out_slot(r, h), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return contract_tile


# The tile shapes in use: rows x (16 * vectors) columns, at most 16 accumulator registers.
tile_8x32 = _contract_tile(8, 2)  # scores and dp: 8 queries x 32 keys, contracted over the head dim
tile_4x64 = _contract_tile(4, 4)  # o, dq, dk, dv: 4 rows x 64 head-dim columns, contracted over keys/queries
tile_4x16 = _contract_tile(4, 1)  # the same for a head dim that is a multiple of 16 but not of 64
# AVX2 (16 registers of 8 lanes): 4 rows x 2 vectors = 8 accumulators, enough independent adds to keep
# both adders busy; ``reduce``'s 8 x 32 blocks run as four of these where the CPU lacks AVX-512.
tile_4x16_ymm = _contract_tile(4, 2, lanes=8)
