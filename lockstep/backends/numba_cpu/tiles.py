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


def _int8_tile(mr: int, nv: int, lanes: int = LANES16):
    """The intrinsic ``f(out_addr, ldo, a_addr, lda, b_addr, ldb, k)`` for one integer tile shape: ``mr``
    rows x ``nv`` vectors of ``lanes`` int32, ``out[r, c] = sum_k a[r, k] * b[k, c]`` with ``a`` int32
    (``lda`` elements apart), ``b`` int8 (``ldb`` apart, widened to int32) and ``out`` int32 (``ldo`` apart).

    Every product and partial sum is an exact integer while the true sums fit int32 (the caller's
    bound), so this is the spec's sum whatever the order: the attention's int8 P.V
    (``spec.attention._int8_pv``), with zero codes at masked pairs adding nothing. Plain LLVM
    vector IR (widen, multiply, add): any target's vector unit runs it."""

    @intrinsic
    def int8_tile(typingctx, out_addr, ldo, a_addr, lda, b_addr, ldb, k):
        sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            out_i, ldo_v, a_i, lda_v, b_i, ldb_v, k_v = args
            i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
            vec, bvec = ir.VectorType(i32, lanes), ir.VectorType(i8, lanes)
            a_p = builder.inttoptr(a_i, i32.as_pointer())
            b_p = builder.inttoptr(b_i, i8.as_pointer())
            out_p = builder.inttoptr(out_i, i32.as_pointer())

            def c64(x):
                return ir.Constant(i64, x)

            def step(kk, accs):  # one k: every accumulator += a[r, k] * b[k, c]
                b_row = builder.mul(kk, ldb_v)
                b_vecs = [builder.sext(builder.load(builder.bitcast(builder.gep(b_p, [builder.add(b_row, c64(lanes * h))]),
                                                                    bvec.as_pointer()), align=1), vec) for h in range(nv)]
                new = []
                for r in range(mr):
                    a_val = builder.load(builder.gep(a_p, [builder.add(kk, builder.mul(lda_v, c64(r)))]), align=4)
                    splat = builder.insert_element(ir.Constant(vec, ir.Undefined), a_val, ir.Constant(i32, 0))
                    splat = builder.shuffle_vector(splat, ir.Constant(vec, ir.Undefined),
                                                   ir.Constant(ir.VectorType(i32, lanes), None))
                    for h in range(nv):
                        new.append(builder.add(accs[r * nv + h], builder.mul(splat, b_vecs[h])))
                return new

            init = [ir.Constant(vec, None)] * (mr * nv)
            new = accumulator_loop(builder, "itile", k_v, init, step)
            for r in range(mr):
                for h in range(nv):
                    ptr = builder.gep(out_p, [builder.add(builder.mul(ldo_v, c64(r)), c64(lanes * h))])
                    builder.store(new[r * nv + h], builder.bitcast(ptr, vec.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return int8_tile


# The integer tiles of the int8 P.V, shaped as the float ones: 4 rows x 64 or 16 columns (AVX-512), 4 x 16
# of 8-lane vectors where the CPU has 16 vector registers (``reduce.YMM_TILES``).
int8_tile_4x64 = _int8_tile(4, 4)
int8_tile_4x16 = _int8_tile(4, 1)
int8_tile_4x16_ymm = _int8_tile(4, 2, lanes=8)


def _fixed_point_tile(mr: int, nv: int, lanes: int):
    """The intrinsic ``f(out_addr, ldo, a_addr, lda, b_addr, ldb, k, inv_addr)`` for one fixed-point tile:
    ``mr`` rows x ``nv`` vectors of ``lanes`` int64, ``out[r, c] = sum_k rint((a[r, k] * b[k, c]) * inv[r])``
    with ``a``, ``b`` float32 widened to float64 and ``inv`` float64 powers of two: the product of the
    three is exact in float64 in either order (24 x 24 significant bits, scaled by a power of two far
    inside float64's range), so it is computed as ``(a[r, k] * inv[r]) * b[k, c]``, one product per
    element; then one rounding to the nearest integer, ties to even, and the conversion to int64 in one
    step (``llvm.llrint``, the default rounding mode: ``vcvtpd2qq`` with AVX-512DQ), and int64 sums:
    ``spec.attention.fixed_point_contract``'s terms, summed exactly, so in any order. The caller
    guarantees finite operands and the contract's grid (every term and sum below 2**62); a zero ``a``
    adds nothing, so masked pairs may be zeros."""

    @intrinsic
    def fixed_point_tile(typingctx, out_addr, ldo, a_addr, lda, b_addr, ldb, k, inv_addr):
        sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.intp, types.intp,
                         types.uintp)

        def codegen(context, builder, sig, args):
            out_i, ldo_v, a_i, lda_v, b_i, ldb_v, k_v, inv_i = args
            f32, f64, i32, i64 = ir.FloatType(), ir.DoubleType(), ir.IntType(32), ir.IntType(64)
            fvec, dvec, ivec = ir.VectorType(f32, lanes), ir.VectorType(f64, lanes), ir.VectorType(i64, lanes)
            llrint_name = f"llvm.llrint.v{lanes}i64.v{lanes}f64"
            llrint = builder.module.globals.get(llrint_name) or ir.Function(
                builder.module, ir.FunctionType(ivec, [dvec]), llrint_name)
            a_p = builder.inttoptr(a_i, f32.as_pointer())
            b_p = builder.inttoptr(b_i, f32.as_pointer())
            inv_p = builder.inttoptr(inv_i, f64.as_pointer())
            out_p = builder.inttoptr(out_i, i64.as_pointer())

            def c64(x):
                return ir.Constant(i64, x)

            def splat(value):
                v = builder.insert_element(ir.Constant(dvec, ir.Undefined), value, ir.Constant(i32, 0))
                return builder.shuffle_vector(v, ir.Constant(dvec, ir.Undefined), ir.Constant(ir.VectorType(i32, lanes), None))

            invs = [builder.load(builder.gep(inv_p, [c64(r)]), align=8) for r in range(mr)]

            def step(kk, accs):  # one k: every accumulator += llrint((a[r, k] * inv[r]) * b[k, c])
                b_row = builder.mul(kk, ldb_v)
                b_vecs = [builder.fpext(builder.load(builder.bitcast(builder.gep(b_p, [builder.add(b_row, c64(lanes * h))]),
                                                                     fvec.as_pointer()), align=4), dvec) for h in range(nv)]
                new = []
                for r in range(mr):
                    a_val = builder.fpext(builder.load(builder.gep(a_p, [builder.add(kk, builder.mul(lda_v, c64(r)))]),
                                                       align=4), f64)
                    a_all = splat(builder.fmul(a_val, invs[r]))  # exact: a power of two
                    for h in range(nv):
                        new.append(builder.add(accs[r * nv + h], builder.call(llrint, [builder.fmul(a_all, b_vecs[h])])))
                return new

            init = [ir.Constant(ivec, None)] * (mr * nv)
            new = accumulator_loop(builder, "fxtile", k_v, init, step)
            for r in range(mr):
                for h in range(nv):
                    ptr = builder.gep(out_p, [builder.add(builder.mul(ldo_v, c64(r)), c64(lanes * h))])
                    builder.store(new[r * nv + h], builder.bitcast(ptr, ivec.as_pointer()), align=8)
            return context.get_dummy_value()

        return sig, codegen

    return fixed_point_tile


# The fixed-point tiles of the int8 recipe's dq: 4 rows x 32 int64 columns (16 AVX-512 registers), or 4 x 8
# of 4-lane vectors where the CPU has 16 vector registers of 256 bits (``reduce.YMM_TILES``).
fixed_point_tile_4x32 = _fixed_point_tile(4, 4, 8)
fixed_point_tile_4x8_ymm = _fixed_point_tile(4, 2, 4)
