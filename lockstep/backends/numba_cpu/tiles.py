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

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from lockstep.spec.fp import CANONICAL_NAN_BITS

from .irloop import accumulator_loop, splat
from .tasks import host_cpu_features

LANES16 = 16  # float32 lanes of one AVX-512 register (LLVM splits it where the CPU is narrower)


class _TileIR:
    """What every tile's code generator emits alike: an ``mr`` x ``nv`` tile of vectors of ``lanes``
    elements stored ``ldo`` elements apart from ``out_addr``, rows of an operand loaded as ``nv``
    vectors, and one value broadcast to every lane."""

    def __init__(self, builder, mr: int, nv: int, lanes: int, out_i, out_elem, ldo_v):
        self.b, self.mr, self.nv, self.lanes = builder, mr, nv, lanes
        self.i32, self.i64 = ir.IntType(32), ir.IntType(64)
        self.out_vec = ir.VectorType(out_elem, lanes)
        self.out_p = builder.inttoptr(out_i, out_elem.as_pointer())
        self.ldo_v = ldo_v

    def c64(self, x: int):
        return ir.Constant(self.i64, x)

    def pointer(self, addr, elem):
        return self.b.inttoptr(addr, elem.as_pointer())

    def slot(self, r: int, h: int):
        """The address of vector h of the tile's row r in ``out``."""
        ptr = self.b.gep(self.out_p, [self.b.add(self.b.mul(self.ldo_v, self.c64(r)), self.c64(self.lanes * h))])
        return self.b.bitcast(ptr, self.out_vec.as_pointer())

    def row_vectors(self, base_p, row_start, elem, align: int) -> list:
        """The ``nv`` vectors of ``elem`` from element ``row_start`` of ``base_p`` on."""
        vec = ir.VectorType(elem, self.lanes)
        return [self.b.load(self.b.bitcast(self.b.gep(base_p, [self.b.add(row_start, self.c64(self.lanes * h))]),
                                           vec.as_pointer()), align=align) for h in range(self.nv)]

    def splat(self, value):
        """``value`` in every lane."""
        return splat(self.b, value, self.lanes)

    def element(self, base_p, index, align: int):
        return self.b.load(self.b.gep(base_p, [index]), align=align)

    def accumulate(self, name: str, k_v, init: list, b_row, a_value, term, align: int, finish=None) -> None:
        """The tile's loop over k, then its store (of ``finish(vector)`` when given): per k, ``b_row(k)``
        (the ``nv`` vectors of b's row k), and per row r ``acc[r, h] = term(acc[r, h], splat(a_value(k, r)),
        b_vecs[h])``."""
        def step(kk, accs):
            b_vecs = b_row(kk)
            new = []
            for r in range(self.mr):
                a_all = self.splat(a_value(kk, r))
                for h in range(self.nv):
                    new.append(term(accs[r * self.nv + h], a_all, b_vecs[h]))
            return new

        accs = accumulator_loop(self.b, name, k_v, init, step)
        for r in range(self.mr):
            for h in range(self.nv):
                v = accs[r * self.nv + h]
                self.b.store(finish(v) if finish else v, self.slot(r, h), align=align)


def _canonical_nan_store(builder, t, flag, lanes: int):
    """The store's ``finish`` of a float tile: NaN lanes (unordered with themselves) become the canonical
    NaN where the i1/i8 ``flag`` is set."""
    canon = builder.icmp_unsigned("!=", flag, ir.Constant(flag.type, 0))
    i32v = ir.VectorType(ir.IntType(32), lanes)
    nan = builder.bitcast(ir.Constant(i32v, [ir.Constant(ir.IntType(32), int(CANONICAL_NAN_BITS))] * lanes), t.out_vec)

    def finish(v):
        return builder.select(builder.and_(builder.fcmp_unordered("uno", v, v), t.splat(canon)), nan, v)

    return finish


def _contract_tile(mr: int, nv: int, lanes: int = LANES16, packed_rows: int = 0):
    """The intrinsic ``f(out_addr, ldo, a_addr, lda, a_inc, b_addr, ldb, k, accumulate)`` for one tile shape:
    ``mr`` rows x ``nv`` vectors of ``lanes`` float32. With ``packed_rows`` a is a packed panel of that
    many rows, k-major (``a[r, k]`` at ``a_addr + 4 * (k * packed_rows + r)``; ``lda`` and ``a_inc``
    unused): every broadcast of a step is then a constant offset from one pointer, where rows ``lda``
    apart cost a general register each (and with 16 vector registers, address arithmetic in the loop).
    Those tiles take one more argument, ``canonical``: store every NaN as the canonical one, which is
    all ``fp.cn`` does to a sum that provably never flushes (the sums end in the tile, and no pass
    over the output is left to canonicalize them)."""

    sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.intp, types.uintp, types.intp,
                     types.intp, types.boolean, *([types.boolean] if packed_rows else []))

    def generate():
        def codegen(context, builder, sig, args):
            out_i, ldo_v, a_i, lda_v, ainc_v, b_i, ldb_v, k_v, acc_flag = args[:9]
            f32 = ir.FloatType()
            t = _TileIR(builder, mr, nv, lanes, out_i, f32, ldo_v)
            a_p, b_p = t.pointer(a_i, f32), t.pointer(b_i, f32)
            acc_bool = builder.icmp_unsigned("!=", acc_flag, ir.Constant(acc_flag.type, 0))
            zero = ir.Constant(t.out_vec, None)  # +0.0 in every lane
            init = [builder.select(acc_bool, builder.load(t.slot(r, h), align=4), zero)
                    for r in range(mr) for h in range(nv)]

            def term(acc, a_all, b_vec):  # a[r, k] * b[k, c] rounded, then the sum rounded: never an FMA
                return builder.fadd(acc, builder.fmul(a_all, b_vec))

            def a_value(kk, r):
                if packed_rows:
                    return t.element(a_p, builder.add(builder.mul(kk, t.c64(packed_rows)), t.c64(r)), 4)
                return t.element(a_p, builder.add(builder.mul(kk, ainc_v), builder.mul(lda_v, t.c64(r))), 4)

            finish = _canonical_nan_store(builder, t, args[9], lanes) if packed_rows else None
            t.accumulate("tile", k_v, init, lambda kk: t.row_vectors(b_p, builder.mul(kk, ldb_v), f32, 4),
                         a_value, term, align=4, finish=finish)
            return context.get_dummy_value()

        return sig, codegen

    if packed_rows:
        @intrinsic
        def contract_tile(typingctx, out_addr, ldo, a_addr, lda, a_inc, b_addr, ldb, k, accumulate, canonical):
            return generate()
    else:
        @intrinsic
        def contract_tile(typingctx, out_addr, ldo, a_addr, lda, a_inc, b_addr, ldb, k, accumulate):
            return generate()
    return contract_tile


# The tile shapes in use: rows x (16 * vectors) columns, at most 16 accumulator registers.
tile_8x32 = _contract_tile(8, 2)  # scores and dp: 8 queries x 32 keys, contracted over the head dim
tile_4x64 = _contract_tile(4, 4)  # o, dq, dk, dv (4 rows x 64 head-dim columns), and ``reduce``'s matmul blocks
tile_4x16 = _contract_tile(4, 1)  # the same for a head dim that is a multiple of 16 but not of 64
# AVX2 (16 registers of 8 lanes): 4 rows x 2 vectors = 8 accumulators, enough independent adds to keep
# both adders busy (attention's blocks); ``reduce``'s 12 x 64 blocks run as eight 6 x 16 tiles where the CPU
# lacks AVX-512: 12 accumulators, two vectors of b and a broadcast, 15 of the 16 registers.
tile_4x16_ymm = _contract_tile(4, 2, lanes=8)
# ``reduce``'s matmul blocks read a from a packed panel of PANEL_ROWS rows (k-major).
PANEL_ROWS = 12
tile_4x64_panel = _contract_tile(4, 4, packed_rows=PANEL_ROWS)
tile_6x16_ymm_panel = _contract_tile(6, 2, lanes=8, packed_rows=PANEL_ROWS)


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
            i8, i32 = ir.IntType(8), ir.IntType(32)
            t = _TileIR(builder, mr, nv, lanes, out_i, i32, ldo_v)
            a_p, b_p = t.pointer(a_i, i32), t.pointer(b_i, i8)

            init = [ir.Constant(t.out_vec, None)] * (mr * nv)
            t.accumulate("itile", k_v, init,
                         lambda kk: [builder.sext(v, t.out_vec) for v in t.row_vectors(b_p, builder.mul(kk, ldb_v), i8, 1)],
                         lambda kk, r: t.element(a_p, builder.add(kk, builder.mul(lda_v, t.c64(r))), 4),
                         lambda acc, a_all, b_vec: builder.add(acc, builder.mul(a_all, b_vec)), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return int8_tile


# The integer tiles of the int8 P.V, shaped as the float ones: 4 rows x 64 or 16 columns (AVX-512), 4 x 16
# of 8-lane vectors where the CPU has 16 vector registers (``reduce.YMM_TILES``).
int8_tile_4x64 = _int8_tile(4, 4)
int8_tile_4x16 = _int8_tile(4, 1)
int8_tile_4x16_ymm = _int8_tile(4, 2, lanes=8)


MAGIC_INT = 6755399441055744.0  # 2**52 + 2**51: v + MAGIC_INT, read as an integer, is MAGIC's bits + v for |v| < 2**51
SPLIT_BITS = 11  # the in-parts conversion splits a term at 2**11
MAGIC_HIGH = 2.0**63 + 2.0**62  # x + MAGIC_HIGH lies in [2**63, 2**64), whose unit is 2**SPLIT_BITS, for |x| < 2**62
_MAGIC_INT_BITS = int(np.float64(MAGIC_INT).view(np.int64))
_MAGIC_HIGH_BITS = int(np.float64(MAGIC_HIGH).view(np.int64))
# What ``_biased_rint_in_parts`` adds to every term: an int64, modulo 2**64.
IN_PARTS_BIAS = ((_MAGIC_HIGH_BITS << SPLIT_BITS) + _MAGIC_INT_BITS + 2**63) % 2**64 - 2**63


def _biased_rint_in_parts(builder, x, lanes: int):
    """``llrint(x) + IN_PARTS_BIAS`` (int64, modulo 2**64) for a vector of float64 that are exact products
    with |x| <= 2**61, in four float additions and two integer operations, without a float64 -> int64
    conversion instruction (x86 has one only with AVX-512DQ; without it LLVM converts lane by lane).

    ``s = x + MAGIC_HIGH`` rounds x to a multiple of 2**11 (s lies in [2**63, 2**64), whose unit is 2**11:
    MAGIC_HIGH = 1.5 * 2**63 and |x| < 2**62), so ``h = s - MAGIC_HIGH`` is that multiple, exactly, and
    ``bits(s) - bits(MAGIC_HIGH)`` is ``h / 2**11`` as an integer. ``l = x - h`` is exact (|l| <= 2**10,
    its digits are x's below 2**11), and ``r = l + MAGIC_INT`` rounds it to an integer, ties to even (r
    lies in [2**52, 2**53), unit 1), ``bits(r) - bits(MAGIC_INT)`` being that integer. h is an even
    integer, so rounding x is rounding l: ``rint(x) = h + rint(l)``. The result is
    ``(bits(s) << 11) + bits(r)``: ``rint(x)`` plus ``(bits(MAGIC_HIGH) << 11) + bits(MAGIC_INT)``, which
    the caller removes once per term from the sum (integers modulo 2**64: the true sum fits int64, so
    what is left is that sum exactly).
    """
    f64, i64 = ir.DoubleType(), ir.IntType(64)
    dvec, ivec = ir.VectorType(f64, lanes), ir.VectorType(i64, lanes)

    def splat_d(v):
        return ir.Constant(dvec, [ir.Constant(f64, v)] * lanes)

    high = splat_d(MAGIC_HIGH)
    s = builder.fadd(x, high)
    low = builder.fsub(x, builder.fsub(s, high))
    r = builder.fadd(low, splat_d(MAGIC_INT))
    shift = ir.Constant(ivec, [ir.Constant(i64, SPLIT_BITS)] * lanes)
    return builder.add(builder.shl(builder.bitcast(s, ivec), shift), builder.bitcast(r, ivec))


def _fixed_point_tile(mr: int, nv: int, lanes: int, in_parts: bool = False):
    """The intrinsic ``f(out_addr, ldo, a_addr, lda, b_addr, ldb, k)`` for one fixed-point tile: ``mr`` rows
    x ``nv`` vectors of ``lanes`` int64, ``out[r, c] = sum_k rint(a[r, k] * b[k, c])`` with ``a`` float64
    (the caller's float32 scaled by its row's power of two, ``a[r, k] * inv[r]``: exact) and ``b`` float32
    widened to float64: the product is exact in float64 (24 x 24 significant bits, scaled by a power of
    two far inside float64's range), then one rounding to the nearest integer, ties to even, and the
    conversion to int64 in one step (``llvm.llrint``, the default rounding mode: ``vcvtpd2qq`` with
    AVX-512DQ; with ``in_parts``, ``_biased_rint_in_parts``, the same integers, each with a bias the
    sums start without), and int64 sums: ``spec.attention.fixed_point_contract``'s terms, summed
    exactly, so in any order. The caller guarantees finite operands and the contract's grid (every term
    at most 2**61 and every sum below 2**62: terms below ``2**(62 - L)`` for L >= 1); a zero ``a`` adds
    nothing, so masked pairs may be zeros."""

    @intrinsic
    def fixed_point_tile(typingctx, out_addr, ldo, a_addr, lda, b_addr, ldb, k):
        sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            out_i, ldo_v, a_i, lda_v, b_i, ldb_v, k_v = args
            f32, f64, i64 = ir.FloatType(), ir.DoubleType(), ir.IntType(64)
            t = _TileIR(builder, mr, nv, lanes, out_i, i64, ldo_v)
            dvec = ir.VectorType(f64, lanes)
            if in_parts:
                def to_int(x):
                    return _biased_rint_in_parts(builder, x, lanes)

                # every term carries IN_PARTS_BIAS: the sums start from -k of them (modulo 2**64)
                init = [t.splat(builder.mul(k_v, ir.Constant(i64, -IN_PARTS_BIAS)))] * (mr * nv)
            else:
                llrint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t.out_vec, [dvec]),
                                                        f"llvm.llrint.v{lanes}i64.v{lanes}f64")

                def to_int(x):
                    return builder.call(llrint, [x])

                init = [ir.Constant(t.out_vec, None)] * (mr * nv)
            a_p, b_p = t.pointer(a_i, f64), t.pointer(b_i, f32)
            t.accumulate("fxtile", k_v, init,
                         lambda kk: [builder.fpext(v, dvec) for v in t.row_vectors(b_p, builder.mul(kk, ldb_v), f32, 4)],
                         lambda kk, r: t.element(a_p, builder.add(kk, builder.mul(lda_v, t.c64(r))), 8),
                         lambda acc, a_all, b_vec: builder.add(acc, to_int(builder.fmul(a_all, b_vec))), align=8)
            return context.get_dummy_value()

        return sig, codegen

    return fixed_point_tile


# The fixed-point tiles of the int8 recipe's dq: 4 rows x 32 int64 columns (16 AVX-512 registers), or 4 x 8
# of 4-lane vectors where the CPU has 16 vector registers of 256 bits (``reduce.YMM_TILES``).
fixed_point_tile_4x32 = _fixed_point_tile(4, 4, 8)
fixed_point_tile_4x8_ymm = _fixed_point_tile(4, 2, 4)
# The same without a vector float64 -> int64 conversion: for x86 CPUs without AVX-512DQ, where LLVM
# would convert lane by lane (the bits are the same; tests run it on every CPU).
fixed_point_tile_4x8_ymm_in_parts = _fixed_point_tile(4, 2, 4, in_parts=True)
_FEATURES = host_cpu_features()
FIXED_POINT_IN_PARTS = bool(_FEATURES.get("avx2")) and not _FEATURES.get("avx512dq", False)
# The 16-register fixed-point tile this CPU runs (``reduce.YMM_TILES``): in parts on x86 without AVX-512DQ.
fixed_point_tile_ymm = fixed_point_tile_4x8_ymm_in_parts if FIXED_POINT_IN_PARTS else fixed_point_tile_4x8_ymm


def _prefetch(write: bool):
    """The intrinsic ``f(addr)``: ask the cache for the line holding byte ``addr`` (``llvm.prefetch``, a hint
    with no effect on any value: x86 ``prefetcht0``, or ``prefetchw`` for a line about to be written)."""

    @intrinsic
    def prefetch(typingctx, addr):
        sig = types.void(types.uintp)

        def codegen(context, builder, sig, args):
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                                "llvm.prefetch.p0i8")
            builder.call(fn, [builder.inttoptr(args[0], i8p), ir.Constant(i32, int(write)), ir.Constant(i32, 3),
                              ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return sig, codegen

    return prefetch


# A tile's first adds wait for the accumulators it loads: fetched while the previous tile runs, they no
# longer wait on L3 or memory. Rows of b far apart (a large N) defeat the hardware's prefetchers when packing.
prefetch_for_write = _prefetch(True)
prefetch_for_read = _prefetch(False)
