"""Walsh-Hadamard butterflies in vector registers (``spec.quant.hadamard_transform``), no flush tests.

The spec's transform is a sequence of stages h = 1, 2, 4, ...; stage h replaces each
pair ``(x[i], x[i + h])`` (i in the lower half of its 2h-group) by ``(a + b, a - b)``,
each rounded. The pairs of a stage are independent, so any grouping of them gives
the same bits as long as every stage sees the previous stage's results. These
micro-kernels load a whole group into 16-lane registers, run several stages there,
and store once:

* ``transform16`` ... ``transform256``: a contiguous block of ``16 * n`` elements (n = 1, 2, ..., 16:
  blocks of 16 to 256), all its stages. Stages h < 16 pair lanes of one register
  (lane i with lane i ^ h: a shuffle, one add, one subtract, a blend); stages h >= 16
  pair whole registers.
* ``radix16_columns``: 16 rows ``h`` rows apart, 16 columns: stages h, 2h, 4h, 8h of a
  transform that runs down the rows (each register is one row's 16 columns);
  ``radix16_columns_ymm`` the same on 8 columns, for CPUs with 16 registers of 8 floats.

No flush tests: callers use them only where every input is a multiple of 2**-126
(zero or ``|x| >= 2**-103``, see ``quant.ADDITIVE_SAFE``), so no sum or difference is
ever subnormal. Each add and subtract is one IEEE operation in LLVM IR without
fast-math flags. Addresses are of float32 elements; strides are in elements.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

LANES16 = 16


def _vec_type():
    return ir.VectorType(ir.FloatType(), LANES16)


def _lane_stage(builder, v, h):
    """Stage h (< 16) inside one register: lane i pairs with lane i ^ h."""
    i32 = ir.IntType(32)
    partner = builder.shuffle_vector(v, ir.Constant(_vec_type(), ir.Undefined),
                                     ir.Constant(ir.VectorType(i32, LANES16), [i ^ h for i in range(LANES16)]))
    total = builder.fadd(v, partner)  # lower lane i: x[i] + x[i + h]
    diff = builder.fsub(partner, v)  # upper lane i: x[i - h] - x[i]
    pick = [i if not i & h else LANES16 + i for i in range(LANES16)]
    return builder.shuffle_vector(total, diff, ir.Constant(ir.VectorType(i32, LANES16), pick))


def _register_stages(builder, vecs, first_hv, last_hv):
    """Stages hv = first_hv, 2 first_hv, ... < last_hv between registers (pairs m, m + hv)."""
    hv = first_hv
    while hv < last_hv:
        for m in range(len(vecs)):
            if not m & hv:
                a, b = vecs[m], vecs[m + hv]
                vecs[m], vecs[m + hv] = builder.fadd(a, b), builder.fsub(a, b)
        hv *= 2
    return vecs


def _block_transform(nvec: int):
    @intrinsic
    def block_transform(typingctx, addr):
        """The whole transform of the 16 * nvec floats at ``addr``, in place."""
        sig = types.void(types.uintp)

        def codegen(context, builder, sig, args):
            vec = _vec_type()
            base = builder.bitcast(builder.inttoptr(args[0], ir.FloatType().as_pointer()), vec.as_pointer())
            ptrs = [builder.gep(base, [ir.Constant(ir.IntType(64), m)]) for m in range(nvec)]
            vecs = [builder.load(p, align=4) for p in ptrs]
            for h in (1, 2, 4, 8):
                vecs = [_lane_stage(builder, v, h) for v in vecs]
            vecs = _register_stages(builder, vecs, 1, nvec)
            for p, v in zip(ptrs, vecs):
                builder.store(v, p, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return block_transform


# One intrinsic per block size (Numba code cannot index a dict of intrinsics).
transform16 = _block_transform(1)
transform32 = _block_transform(2)
transform64 = _block_transform(4)
transform128 = _block_transform(8)
transform256 = _block_transform(16)


def _radix16_columns(lanes: int):
    @intrinsic
    def radix16_columns(typingctx, addr, row_stride, h):
        """Stages h, 2h, 4h, 8h on the 16 rows ``addr + m * h * row_stride`` (m < 16), ``lanes`` columns each."""
        sig = types.void(types.uintp, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            addr, stride, h = args
            vec = ir.VectorType(ir.FloatType(), lanes)
            i64 = ir.IntType(64)
            base = builder.inttoptr(addr, ir.FloatType().as_pointer())
            step = builder.mul(stride, h)
            ptrs = [builder.bitcast(builder.gep(base, [builder.mul(step, ir.Constant(i64, m))]), vec.as_pointer())
                    for m in range(16)]
            vecs = [builder.load(p, align=4) for p in ptrs]
            vecs = _register_stages(builder, vecs, 1, 16)
            for p, v in zip(ptrs, vecs):
                builder.store(v, p, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return radix16_columns


# 16 rows of 16 columns: 16 AVX-512 registers. Where the CPU has 16 registers of 8 lanes, 16 rows of 16
# columns are 32 registers' worth and spill; 16 rows of 8 columns fit (measured with AVX2 stood in, a
# 2048 x 768 column transform in blocks of 256: 1.34 -> 1.01 ms).
radix16_columns = _radix16_columns(LANES16)
radix16_columns_ymm = _radix16_columns(8)
