"""Exact int8 GEMMs: ``C = A @ B``, int8 operands, int32 results (``spec.reduce.int8_matmul``).

An integer sum is exact in any order, so this module may use any instructions and
any blocking: nothing here can change a bit, as long as no int32 result overflows
(the spec refuses a K that could, and ``int8_linear_*`` stay far below it).

Three implementations, the same integers (``implementation()`` names the one this CPU uses):

* **VNNI** (x86 with AVX-512 VNNI: Intel Ice Lake and later, AMD Zen 4 and later):
  ``vpdpbusd`` multiplies 64 unsigned bytes by 64 signed bytes and adds each group
  of four products into one of 16 int32 lanes, four times the multiply-adds of a
  float32 FMA per instruction. Its first operand is unsigned, so B enters as
  ``B + 128`` (0..255) and each row's result is corrected by ``128 * sum_k A[i, k]``:
  ``sum_k A*(B + 128) - 128 * sum_k A = sum_k A*B``. int32 arithmetic wraps, so the
  corrected result is exact whenever the true one fits int32, whatever the biased
  sum did on the way. B is packed once per call into panels of 32 columns,
  each group of 4 consecutive k adjacent (``pack_b``); A is read in place, 4 bytes
  of a row broadcast to all lanes. The micro-kernel (``vnni_tile``) keeps an
  ``MR x 32`` tile of C in 16 AVX-512 registers over the whole K, starting from the
  row's correction, and stores it in place (``vnni_tile_rescaled``: already rescaled
  to float32 as the int8 layers need).
* **AVX2** (x86 with AVX2, without VNNI: most laptops, desktops and cloud instances):
  ``vpmaddwd`` multiplies 16 int16 pairs and adds each pair into one of 8 int32 lanes,
  exact for any int16 operands (a pair sum of int8 values is at most 2 x 128 x 128);
  twice the multiply-adds of a float32 FMA per instruction. A is widened to int16 once
  per call and packed in blocks of MR2 rows, each pair of k of the block's rows adjacent
  (K padded to even, rows to MR2, with zeros: ``_pack_a16``), B packed into int16 panels of 16 columns with
  each pair of consecutive k adjacent; the micro-kernel (``avx2_tile``) keeps an
  ``MR2 x 16`` tile of C in 12 of the 16 AVX2 registers over the whole K, broadcasting
  one pair of A per row and step.
* **BLAS** (everywhere else): float32 sgemm on int8-valued operands, K in chunks
  of 1024 (every partial sum an integer below 2**24, so exact in any order), the
  chunks summed in int32.

Both micro-kernels run under one driver (``_gemm_driver``): blocks of A's rows, bounded so that the
block and the C it writes stay in L2 (``_rows_per_block``), meet every panel of B in turn. B's
panels are packed with one vector load per row of a group and one shuffle (``_interleave_rows``).

``LOCKSTEP_INT8_GEMM=blas`` forces the BLAS path, ``LOCKSTEP_INT8_GEMM=avx2`` the AVX2 path on a
VNNI CPU; ``matmul(..., impl=...)`` picks one per call (tests compare them).
"""

from __future__ import annotations

import os
from types import FunctionType

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .fp import cn, fl
from .irloop import accumulator_loop, splat
from .tasks import TaskKernel, host_cpu_features, inlined, parallel_kernel, rows

MR = 8  # rows of A per micro-kernel call: 8 x 2 accumulators = 16 of the 32 AVX-512 registers
NR = 32  # columns of a B panel: two 16-lane int32 vectors
BLAS_CHUNK_K = 1024  # sgemm on int8 values is exact while K * 127 * 127 < 2**24 (K <= 1040)
A_BLOCK_BYTES = 1 << 18  # rows of A per L2 block: the block is reused across all panels
OUT_BLOCK_BYTES = 1 << 16  # and at most this much of C per block, where B stays in L2 (see ``_rows_per_block``)
B_RESIDENT_BYTES = 1 << 19  # packed B up to this size stays in L2 while blocks of A sweep it
MR2 = 6  # rows of the AVX2 micro-kernel: 6 x 2 accumulators = 12 of the 16 AVX2 registers
NR2 = 16  # columns of an AVX2 B panel: two 8-lane int32 vectors


_FORCED = os.environ.get("LOCKSTEP_INT8_GEMM", "").lower()
_FEATURES = host_cpu_features()
HAVE_AVX2 = _FORCED != "blas" and bool(_FEATURES.get("avx2", False))
HAVE_VNNI = _FORCED not in ("blas", "avx2") and all(_FEATURES.get(f, False)
                                                     for f in ("avx512f", "avx512bw", "avx512vnni"))
IMPLEMENTATIONS = ("vnni", "avx2", "blas")
# the kernels only one path calls: on a CPU without its instructions they are never compiled
VNNI_ONLY_KERNELS = ("_pack_b", "_row_corrections", "_vnni_gemm")
AVX2_ONLY_KERNELS = ("_pack_b16", "_pack_a16", "_avx2_gemm")


def implementation() -> str:
    """Which implementation ``matmul`` uses on this machine: ``"vnni"``, ``"avx2"`` or ``"blas"``."""
    return "vnni" if HAVE_VNNI else "avx2" if HAVE_AVX2 else "blas"


def available() -> tuple[str, ...]:
    """The implementations this machine can run, fastest first (``"blas"`` always)."""
    return tuple(i for i, ok in zip(IMPLEMENTATIONS, (HAVE_VNNI, HAVE_AVX2, True)) if ok)


# ---------------------------------------------------------------- the VNNI micro-kernel

def _int_tile_codegen(builder, name: str, rows: int, lanes: int, elem, a_i, lda_v, b_i, groups_v, corr_i,
                      combine, out_i, ldo_v, epilogue, packed_a: bool = False) -> None:
    """Emit an integer micro-kernel: ``rows`` x 2 vectors of ``lanes`` int32 accumulators, row r's
    starting at ``-corr[r]`` (``corr_addr``: ``rows`` int32; int32 wraps, so a correction subtracted
    first gives the same final value as one subtracted last, and costs nothing); each of ``groups``
    steps broadcasts 32 bits of each row of a (a group of k: 4 int8 or 2 int16, ``elem`` a's element
    type) over the two vectors of b it meets in the packed panel, and ``combine(acc, a_all, b_vec)``
    gives the new accumulator. Then the results go through ``epilogue(r, h, vector) -> (vector,
    element type)`` to ``out + r * ldo + lanes * h`` (elements).

    a's rows are ``lda`` elements apart, or with ``packed_a`` interleaved by group (group g of row r
    at group ``g * rows + r``; ``lda`` unused): then every broadcast of a step is a constant offset
    from one pointer, which leaves the general registers free (with rows read in place the AVX2
    tile ran out of them and reloaded ``lda`` from the stack on every row)."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    per_group = 32 // elem.width  # k per group
    b_vec = ir.VectorType(elem, lanes * per_group)  # one b vector: ``lanes`` columns x one group of k
    a_p = builder.inttoptr(a_i, elem.as_pointer())
    b_p = builder.inttoptr(b_i, elem.as_pointer())
    corr_p = builder.inttoptr(corr_i, i32.as_pointer())
    init = []
    for r in range(rows):
        start = splat(builder, builder.neg(builder.load(builder.gep(corr_p, [ir.Constant(i64, r)]), align=4)), lanes)
        init += [start, start]

    def step(g, acc):
        panel_off = builder.mul(g, ir.Constant(i64, 2 * b_vec.count))
        b_vecs = [builder.load(builder.bitcast(builder.gep(b_p, [builder.add(panel_off, ir.Constant(i64, b_vec.count * h))]),
                                               b_vec.as_pointer()), align=elem.width // 8) for h in range(2)]
        a_off = builder.mul(g, ir.Constant(i64, per_group * (rows if packed_a else 1)))
        new = []
        for r in range(rows):
            row_off = ir.Constant(i64, per_group * r) if packed_a else builder.mul(lda_v, ir.Constant(i64, r))
            a_ptr = builder.gep(a_p, [builder.add(a_off, row_off)])
            group = builder.load(builder.bitcast(a_ptr, i32.as_pointer()), align=elem.width // 8)  # row r's group
            a_all = builder.bitcast(splat(builder, group, lanes), b_vec)
            for h in range(2):
                new.append(combine(acc[2 * r + h], a_all, b_vecs[h]))
        return new

    accs = accumulator_loop(builder, name, groups_v, init, step)
    for r in range(rows):
        for h in range(2):
            vec, out_elem = epilogue(r, h, accs[2 * r + h])
            base = builder.inttoptr(out_i, out_elem.as_pointer())
            ptr = builder.gep(base, [builder.add(builder.mul(ldo_v, ir.Constant(i64, r)), ir.Constant(i64, lanes * h))])
            builder.store(vec, builder.bitcast(ptr, vec.type.as_pointer()), align=4)


def _vnni_tile_codegen(builder, out_i, ldo_v, a_i, lda_v, b_i, k4_v, corr_i, epilogue):
    """Emit the tile loop: accumulators start at ``-corr[r]`` (the row correction), then ``k4`` steps
    of 2 x MR ``vpdpbusd``; the MR x 32 int32 results go to ``epilogue(r, h, vector) -> (vector,
    element type)``, stored at ``out + r * ldo + 16 * h`` (elements)."""
    i8, i32 = ir.IntType(8), ir.IntType(32)
    v16, v64b = ir.VectorType(i32, 16), ir.VectorType(i8, 64)
    dpbusd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16, v64b, v64b]),
                                            "llvm.x86.avx512.vpdpbusd.512")
    _int_tile_codegen(builder, "vnni", MR, 16, i8, a_i, lda_v, b_i, k4_v, corr_i,
                      lambda acc, a_all, b_vec: builder.call(dpbusd, [acc, b_vec, a_all]), out_i, ldo_v, epilogue)


def _rescaled_epilogue(builder, lanes: int, sa_i, sa_step_v, sb_i, factor_v):
    """The epilogue of a rescaled integer tile of ``lanes``-wide int32 vectors (two per row):
    ``((float32(v) * sa[r * sa_step]) * sb[c]) * factor``, each product one IEEE multiplication."""
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vf = ir.VectorType(f32, lanes)
    sa_p = builder.inttoptr(sa_i, f32.as_pointer())
    sb_p = builder.inttoptr(sb_i, f32.as_pointer())
    factor_vec = splat(builder, factor_v, lanes)
    sb_vecs = [builder.load(builder.bitcast(builder.gep(sb_p, [ir.Constant(i64, lanes * h)]), vf.as_pointer()),
                            align=4) for h in range(2)]

    def epilogue(r, h, v):
        sa_r = builder.load(builder.gep(sa_p, [builder.mul(sa_step_v, ir.Constant(i64, r))]), align=4)
        x = builder.sitofp(v, vf)  # int32 -> float32, round to nearest even
        x = builder.fmul(x, splat(builder, sa_r, lanes))
        x = builder.fmul(x, sb_vecs[h])
        return builder.fmul(x, factor_vec), f32

    return epilogue


def _tile_intrinsics(tile_codegen, lanes: int):
    """The two intrinsics of one micro-kernel, both with the signature ``_gemm_driver`` calls:
    ``tile(out_addr, ldo, a_addr, lda, b_addr, groups, corr_addr)`` stores the int32 tile, and
    ``tile_rescaled(..., corr_addr, sa_addr, sa_step, sb_addr, factor)`` stores it as
    ``((float32(v) * sa[r * sa_step]) * sb[c]) * factor`` (float32), each product one IEEE
    multiplication: ``rescale1`` without flush tests, for callers that proved none can fire.
    ``tile_codegen(builder, out, ldo, a, lda, b, groups, corr, epilogue)`` emits the loop, on
    vectors of ``lanes`` int32."""
    ptr, n = types.uintp, types.intp

    @intrinsic
    def tile(typingctx, out_addr, ldo, a_addr, lda, b_addr, groups, corr_addr):
        def codegen(context, builder, sig, args):
            tile_codegen(builder, *args, epilogue=lambda r, h, v: (v, ir.IntType(32)))
            return context.get_dummy_value()

        return types.void(ptr, n, ptr, n, ptr, n, ptr), codegen

    @intrinsic
    def tile_rescaled(typingctx, out_addr, ldo, a_addr, lda, b_addr, groups, corr_addr, sa_addr, sa_step, sb_addr,
                      factor):
        def codegen(context, builder, sig, args):
            sa_i, sa_step_v, sb_i, factor_v = args[7:]
            epilogue = _rescaled_epilogue(builder, lanes, sa_i, sa_step_v, sb_i, factor_v)
            tile_codegen(builder, *args[:7], epilogue=epilogue)
            return context.get_dummy_value()

        return types.void(ptr, n, ptr, n, ptr, n, ptr, ptr, n, ptr, types.float32), codegen

    return tile, tile_rescaled


# ``vnni_tile``: ``out[r, c] = sum_g dot4(a[r, 4g:4g+4], panel[g, c, 0:4]) - corr[r]`` for r < MR, c < 32 (int32).
# ``a_addr``: MR rows of signed bytes, ``lda`` bytes apart; ``b_addr``: a packed panel (k4, 32 columns, 4 bytes:
# ``B + 128`` as unsigned bytes); ``out_addr``: int32 rows ``ldo`` elements apart; ``corr_addr``: MR int32. The
# caller guarantees ``k4 >= 1`` and the CPU features.
vnni_tile, vnni_tile_rescaled = _tile_intrinsics(_vnni_tile_codegen, 16)


def _interleave_rows(nrows: int, lanes: int, widen: bool, unit: int = 1):
    """The intrinsic ``f(dst_addr, src_addr, stride)``: ``nrows`` rows of ``lanes`` int8 (``stride`` bytes
    apart) stored interleaved by units of ``unit`` elements, ``dst[u, t, e] = row_t[unit * u + e]``:
    each widened to int16 (``widen``), or as the unsigned byte ``row_t[jj] + 128`` (the int8's bits with
    the top one flipped). One load per row, one shuffle, one store: the packers' inner loop, which
    scalar code ran at about 2 cycles an element."""

    @intrinsic
    def interleave(typingctx, dst_addr, src_addr, stride):
        sig = types.void(types.uintp, types.uintp, types.intp)

        def codegen(context, builder, sig, args):
            dst_i, src_i, stride_v = args
            i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
            vin = ir.VectorType(i8, lanes)
            src_p = builder.inttoptr(src_i, i8.as_pointer())
            rows = []
            for t in range(nrows):
                ptr = builder.gep(src_p, [builder.mul(stride_v, ir.Constant(i64, t))])
                v = builder.load(builder.bitcast(ptr, vin.as_pointer()), align=1)
                if widen:
                    v = builder.sext(v, ir.VectorType(ir.IntType(16), lanes))
                else:
                    v = builder.xor(v, ir.Constant(vin, [ir.Constant(i8, 0x80)] * lanes))
                if unit > 1:
                    v = builder.bitcast(v, ir.VectorType(ir.IntType(v.type.element.width * unit), lanes // unit))
                rows.append(v)
            units = lanes // unit
            while len(rows) & (len(rows) - 1):  # a power of two of vectors (the padding is never read)
                rows.append(ir.Constant(rows[0].type, ir.Undefined))
            while len(rows) > 1:  # concatenated: rows[0] ++ rows[1] ++ ...
                width = 2 * rows[0].type.count
                rows = [builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, width), list(range(width))))
                        for a, b in zip(rows[0::2], rows[1::2])]
            whole = rows[0]
            order = [t * units + u for u in range(units) for t in range(nrows)]
            out = builder.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined),
                                         ir.Constant(ir.VectorType(i32, nrows * units), order))
            dst_p = builder.inttoptr(dst_i, out.type.element.as_pointer())
            builder.store(out, builder.bitcast(dst_p, out.type.as_pointer()), align=1)
            return context.get_dummy_value()

        return sig, codegen

    return interleave


_interleave4_biased = _interleave_rows(4, NR, widen=False)  # a VNNI panel's group: 4 k x 32 columns
_interleave2_int16 = _interleave_rows(2, NR2, widen=True)  # an AVX2 panel's group: 2 k x 16 columns
A16_GROUPS = 8  # pairs of k of a block of A per interleave: 16 int8 of each of MR2 rows
_interleave_a16 = _interleave_rows(MR2, 2 * A16_GROUPS, widen=True, unit=2)  # A's pairs of k, MR2 rows


def _packed_blocks(src, packed) -> int:
    """Tasks of a packer: the packed array's first axis (panels of B, blocks of A's rows)."""
    return packed.shape[0]


@inlined
def _biased_byte(v):
    """A VNNI panel's byte: ``v + 128`` as an unsigned byte (``vpdpbusd``'s first operand is unsigned)."""
    return np.uint8(np.int32(v) + np.int32(128))


@inlined
def _int16(v):
    """An AVX2 panel's element: ``v`` as int16 (``vpmaddwd``'s operands)."""
    return np.int16(v)


def _pack_template(t0, t1, b, bp):
    """The body of ``_packer``'s kernels."""
    nr, kpg = PANEL_COLUMNS, GROUP_K  # noqa: F821 - these, ``interleave`` and ``element``: bound by ``_packer``
    k, n = b.shape
    groups = bp.shape[1]
    row_stride = b.strides[0]
    in_rows = b.strides[1] == 1
    group_bytes = nr * kpg * bp.itemsize
    for p in range(t0, t1):
        j0 = p * nr
        jn = min(nr, n - j0)
        for g in range(groups):
            full = jn == nr and kpg * (g + 1) <= k
            if full and in_rows:  # rows of b in place: one shuffle
                interleave(bp.ctypes.data + (p * groups + g) * group_bytes,  # noqa: F821
                           b.ctypes.data + kpg * g * row_stride + j0, row_stride)
                continue
            dst = bp[p, g]
            for t in range(kpg):
                kk = kpg * g + t
                if full:  # a transposed b (a weight's rotated codes)
                    src = b[kk, j0:j0 + nr]
                    for jj in range(nr):
                        dst[jj, t] = element(src[jj])  # noqa: F821
                else:  # the edges: zeros past K and N
                    for jj in range(nr):
                        dst[jj, t] = element(b[kk, j0 + jj] if (kk < k and jj < jn) else np.int8(0))  # noqa: F821


def _packer(name: str, panel_columns: int, group_k: int, interleave, element) -> TaskKernel:
    """The kernel ``f(b, bp)`` that packs b (K, N) int8, any strides, for one micro-kernel:
    ``bp[p, g, jj, t] = element(b[group_k * g + t, panel_columns * p + jj])``, ``element(0)`` past the
    edges (the K padding meets A's zero padding; the N padding lands in columns never stored); tasks
    are panels. A group whose rows lie in place in b is one ``interleave`` (``_interleave_rows``); the
    others go element by element. One template, compiled per micro-kernel (as ``_gemm_driver``)."""
    fn = FunctionType(_pack_template.__code__, {**_pack_template.__globals__, "PANEL_COLUMNS": panel_columns,
                                                 "GROUP_K": group_k, "interleave": interleave,
                                                 "element": element}, name)
    fn.__qualname__ = name
    fn.__doc__ = _packer.__doc__
    return TaskKernel(fn, _packed_blocks)


# VNNI: bp[p, g, jj, t] = b[4g + t, 32p + jj] + 128 as uint8. AVX2: int16(b[2g + t, 16p + jj]).
_pack_b = _packer("_pack_b", NR, 4, _interleave4_biased, _biased_byte)
_pack_b16 = _packer("_pack_b16", NR2, 2, _interleave2_int16, _int16)


@parallel_kernel(rows)
def _row_corrections(t0, t1, a, corr):
    """corr[i] = 128 * sum_k a[i, k] (int32, wrapping: it is subtracted from a wrapping sum)."""
    for i in range(t0, t1):
        s = np.int32(0)
        row = a[i]
        for kk in range(row.size):
            s += np.int32(row[kk])
        corr[i] = s * np.int32(128)


@inlined
def rescale1(v, sa, sb, factor, fast):
    """``((float32(v) * sa) * sb) * factor``, each product rounded and flushed (``quant``'s rescale).

    ``float32()`` of an int32 rounds to nearest even, as the spec's ``astype``; ``fast``:
    the caller proved no product can be subnormal or NaN, so the tests are left out."""
    x = np.float32(v)
    if fast:
        return ((x * sa) * sb) * factor
    return cn(fl(fl(fl(x * sa) * sb) * factor))


def _rows_per_block(a_row_bytes: int, n: int, mr: int, b_bytes: int) -> int:
    """Rows of A per block of the GEMM driver: the block (A_BLOCK_BYTES) stays in L2 while it meets
    every panel of B. Where the packed B (``b_bytes``) is small enough to stay in L2 too
    (B_RESIDENT_BYTES), the C a block writes over that sweep (4 bytes per element) is also kept
    within OUT_BLOCK_BYTES: measured (one thread, RESULTS.md), a block bounded by A alone writes up
    to 1024 x 768 of C on the ``small`` linears' shapes, and those lines push the block out of L2
    (2048 x 256 x 768: 3.4x sgemm on VNNI and 1.25x on AVX2, 4.1x and 1.47x with C bounded). A large
    B is read from memory once per block, so there the blocks stay as large as A allows
    (512 x 2048 x 2048 on AVX2: 1.03x sgemm with blocks of 6 rows)."""
    rows = A_BLOCK_BYTES // a_row_bytes
    if b_bytes <= B_RESIDENT_BYTES:
        rows = min(rows, OUT_BLOCK_BYTES // (4 * max(n, 1)))
    return max(mr, rows)


def _vnni_matmul(a: np.ndarray, b: np.ndarray, scales=None) -> np.ndarray:
    m, k = a.shape
    n = b.shape[1]
    kp = -(-k // 4) * 4
    if k == kp:
        a = np.ascontiguousarray(a)  # A's rows are read in place (a transposed A is copied once)
    else:
        padded = np.zeros((m, kp), dtype=np.int8)  # K padded with zeros: they meet B's padding
        padded[:, :k] = a
        a = padded
    bp = np.empty((-(-n // NR), kp // 4, NR, 4), dtype=np.uint8)
    _pack_b(b, bp)
    corr = np.empty(m, dtype=np.int32)
    _row_corrections(a, corr)
    return _run_driver(_vnni_gemm, a, bp, corr, n, _rows_per_block(kp, n, MR, bp.nbytes), scales)


# ---------------------------------------------------------------- the AVX2 micro-kernel

def _avx2_tile_codegen(builder, out_i, ldo_v, a_i, lda_v, b_i, k2_v, corr_i, epilogue):
    """Emit the AVX2 tile loop: accumulators start at ``-corr[r]``, then ``k2`` steps of 2 x MR2
    ``vpmaddwd`` + ``vpaddd``; the MR2 x 16 int32 results go to ``epilogue(r, h, vector) -> (vector, element type)``, stored at
    ``out + r * ldo + 8 * h`` (elements)."""
    i16, i32 = ir.IntType(16), ir.IntType(32)
    v8, v16s = ir.VectorType(i32, 8), ir.VectorType(i16, 16)
    pmaddwd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v16s, v16s]), "llvm.x86.avx2.pmadd.wd")
    _int_tile_codegen(builder, "avx2", MR2, 8, i16, a_i, lda_v, b_i, k2_v, corr_i,
                      lambda acc, a_all, b_vec: builder.add(acc, builder.call(pmaddwd, [a_all, b_vec])),
                      out_i, ldo_v, epilogue, packed_a=True)


# ``avx2_tile``: ``out[r, c] = sum_g a[r, 2g] * panel[g, c, 0] + a[r, 2g + 1] * panel[g, c, 1] - corr[r]`` for
# r < MR2, c < 16 (int32, every product and sum exact; the GEMM passes zeros as ``corr``). ``a_addr``: a block
# of MR2 rows of int16 packed by ``_pack_a16`` (``lda`` unused); ``b_addr``: a packed panel (k2, 16 columns,
# 2 int16); ``out_addr``: int32 rows ``ldo`` elements apart; ``corr_addr``: MR2 int32. Each step broadcasts one
# pair of a row (as one int32) and issues 2 x MR2 ``vpmaddwd`` + ``vpaddd``. The caller guarantees ``k2 >= 1``
# and AVX2.
avx2_tile, avx2_tile_rescaled = _tile_intrinsics(_avx2_tile_codegen, 8)


@parallel_kernel(_packed_blocks)
def _pack_a16(t0, t1, a, ap):
    """A widened to int16 and packed for ``avx2_tile``: ``ap[blk, g, r, :] = a[blk * MR2 + r, 2g : 2g + 2]``
    (ap (blocks, Kp / 2, MR2, 2)), zero past A's last row and column; tasks are blocks of MR2 rows."""
    m, k = a.shape
    groups = ap.shape[1]
    lda = a.strides[0]
    in_rows = a.strides[1] == 1
    for blk in range(t0, t1):
        dst = ap[blk]
        g0 = 0
        if in_rows and (blk + 1) * MR2 <= m:  # a whole block in place: A16_GROUPS pairs of k a shuffle
            src_addr = a.ctypes.data + blk * MR2 * lda
            for g0 in range(0, k // 2 - A16_GROUPS + 1, A16_GROUPS):
                _interleave_a16(dst[g0].ctypes.data, src_addr + 2 * g0, lda)
            g0 = (k // 2) // A16_GROUPS * A16_GROUPS
        for r in range(MR2):
            i = blk * MR2 + r
            if i < m:
                src = a[i]
                for g in range(g0, k // 2):
                    dst[g, r, 0] = np.int16(src[2 * g])
                    dst[g, r, 1] = np.int16(src[2 * g + 1])
                if k % 2:  # K padded to even with a zero
                    dst[groups - 1, r, 0] = np.int16(src[k - 1])
                    dst[groups - 1, r, 1] = np.int16(0)
            else:
                for g in range(groups):
                    dst[g, r, 0] = np.int16(0)
                    dst[g, r, 1] = np.int16(0)


# ---------------------------------------------------------------- one driver for both micro-kernels

def _gemm_template(t0, t1, a, bp, corr, n, rows_per_block, out, rescale, sa, sb, factor, fast, out_f32):
    """The body of ``_gemm_driver``'s kernels."""
    tm, tn = TILE_M, TILE_N  # noqa: F821 - these, ``tile`` and ``tile_rescaled`` are bound by ``_gemm_driver``
    m = corr.shape[0]
    kp = a.shape[1]
    groups = bp.shape[1]
    npanel = bp.shape[0]
    sa_step = 1 if sa.size > 1 else 0
    tile_i = np.empty((tm, tn), dtype=np.int32)
    tile_f = np.empty((tm, tn), dtype=np.float32)
    spare = np.zeros((tm, kp), dtype=a.dtype)
    spare_corr = np.zeros(tm, dtype=np.int32)
    spare_sa = np.ones(tm, dtype=np.float32)
    sb_pad = np.zeros(npanel * tn, dtype=np.float32)
    sb_pad[:sb.size] = sb
    per_block = max(1, rows_per_block // tm)
    a_row = kp * a.itemsize
    a_base, corr_base, sa_base = a.ctypes.data, corr.ctypes.data, sa.ctypes.data
    out_base, out_f_base, sb_base = out.ctypes.data, out_f32.ctypes.data, sb_pad.ctypes.data
    for blk0 in range(t0, t1, per_block):
        blk1 = min(t1, blk0 + per_block)
        for p in range(npanel):
            j0 = p * tn
            jn = min(tn, n - j0)
            panel = bp[p].ctypes.data
            sb_addr = sb_base + 4 * j0
            for rb in range(blk0, blk1):
                i0 = rb * tm
                rows = min(tm, m - i0)
                a_addr = a_base + i0 * a_row
                c_addr = corr_base + 4 * i0
                sa_addr = sa_base + 4 * i0 * sa_step
                if rows < tm:
                    if not A_PACKED:  # noqa: F821 - a packed A's last block is already padded with zero rows
                        spare[:rows] = a[i0:m]
                        a_addr = spare.ctypes.data
                    spare_corr[:rows] = corr[i0:m]
                    c_addr = spare_corr.ctypes.data
                    if sa_step:
                        spare_sa[:rows] = sa[i0:m]
                        sa_addr = spare_sa.ctypes.data
                full = rows == tm and jn == tn
                if rescale and fast:
                    if full:
                        tile_rescaled(out_f_base + 4 * (i0 * n + j0), n, a_addr, kp, panel, groups,  # noqa: F821
                                      c_addr, sa_addr, sa_step, sb_addr, factor)
                    else:
                        tile_rescaled(tile_f.ctypes.data, tn, a_addr, kp, panel, groups, c_addr,  # noqa: F821
                                      sa_addr, sa_step, sb_addr, factor)
                        out_f32[i0:i0 + rows, j0:j0 + jn] = tile_f[:rows, :jn]
                elif full and not rescale:
                    tile(out_base + 4 * (i0 * n + j0), n, a_addr, kp, panel, groups, c_addr)  # noqa: F821
                else:
                    tile(tile_i.ctypes.data, tn, a_addr, kp, panel, groups, c_addr)  # noqa: F821
                    if rescale:
                        for r in range(rows):
                            s_row = sa[(i0 + r) * sa_step]
                            dst_f = out_f32[i0 + r, j0:j0 + jn]
                            src = tile_i[r]
                            s_col = sb[j0:j0 + jn]
                            for jj in range(jn):
                                dst_f[jj] = rescale1(src[jj], s_row, s_col[jj], factor, False)
                    else:
                        out[i0:i0 + rows, j0:j0 + jn] = tile_i[:rows, :jn]


def _gemm_driver(name: str, tile, tile_rescaled, tile_m: int, tile_n: int, a_packed: bool) -> TaskKernel:
    """The GEMM driver of one micro-kernel: ``out (M, N) int32 = a (M, Kp) @ B`` (a int8 or int16;
    B packed in ``bp``: panels of ``tile_n`` columns, then groups of k; ``corr``: the M rows'
    corrections, which the tile subtracts), tasks blocks of ``tile_m`` rows. a's rows are read in
    place, or with ``a_packed`` a holds whole blocks of ``tile_m`` rows, each block's bytes in the
    micro-kernel's order (``_pack_a16``; rows past M zero).

    With ``rescale``, ``out_f32[i, j] = rescale1(C[i, j], sa[i or 0], sb[j], factor, fast)`` is
    written instead of ``out`` (in the micro-kernel when ``fast``, else from a tile buffer with
    every flush test). Within the call's rows, blocks of ``rows_per_block`` rows of A (kept in
    L2, ``_rows_per_block``) meet every panel of B in turn. Full tiles are stored in place, by
    address; edge tiles (last rows, last columns) go through a zero-padded copy of A's rows and
    a tile buffer. ``tile(out, ldo, a, lda, panel, groups, corr)`` and ``tile_rescaled(..., corr,
    sa, sa_step, sb, factor)`` are the micro-kernel's intrinsics (``vnni_tile``, ``avx2_tile``).
    One template, compiled per micro-kernel under ``name`` (as ``fp.elementwise`` does): a kernel
    is compiled only where it runs, so the VNNI one never meets a CPU without VNNI."""
    fn = FunctionType(_gemm_template.__code__, {**_gemm_template.__globals__, "tile": tile,
                                                 "tile_rescaled": tile_rescaled, "TILE_M": tile_m,
                                                 "TILE_N": tile_n, "A_PACKED": a_packed}, name)
    fn.__qualname__ = name
    fn.__doc__ = _gemm_driver.__doc__
    return TaskKernel(fn, lambda a, *args: -(-a.shape[0] // tile_m), weight=64)


_vnni_gemm = _gemm_driver("_vnni_gemm", vnni_tile, vnni_tile_rescaled, MR, NR, False)
_avx2_gemm = _gemm_driver("_avx2_gemm", avx2_tile, avx2_tile_rescaled, MR2, NR2, True)


def _avx2_matmul(a: np.ndarray, b: np.ndarray, scales=None) -> np.ndarray:
    """int32 ``a @ b``; with ``scales = (sa, sb, factor, fast)``, float32 rescaled (``_gemm_driver``)."""
    m, k = a.shape
    n = b.shape[1]
    kp = k + k % 2
    npanel = -(-n // NR2)
    a16 = np.empty((-(-m // MR2), kp // 2, MR2, 2), dtype=np.int16)
    _pack_a16(a, a16)
    bp = np.empty((npanel, kp // 2, NR2, 2), dtype=np.int16)
    _pack_b16(b, bp)
    corr = np.zeros(m, dtype=np.int32)  # int16 pairs need no correction
    return _run_driver(_avx2_gemm, a16.reshape(-1, kp), bp, corr, n, _rows_per_block(2 * kp, n, MR2, bp.nbytes),
                       scales)


def _run_driver(driver: TaskKernel, a, bp, corr, n: int, rows: int, scales) -> np.ndarray:
    """``driver`` (``_vnni_gemm``, ``_avx2_gemm``) over all of a: the int32 C, or with ``scales = (sa, sb,
    factor, fast)`` the rescaled float32 C."""
    m = corr.shape[0]
    if scales is None:
        out = np.empty((m, n), dtype=np.int32)
        one = np.ones(1, dtype=np.float32)
        driver(a, bp, corr, n, rows, out, False, one, one, np.float32(1), True, np.empty((0, 0), np.float32))
        return out
    sa, sb, factor, fast = scales
    out_f = np.empty((m, n), dtype=np.float32)
    driver(a, bp, corr, n, rows, np.empty((0, 0), np.int32), True, sa, sb, np.float32(factor), bool(fast), out_f)
    return out_f


def _blas_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = a.shape[1]
    acc = None
    for s in range(0, k, BLAS_CHUNK_K):
        part = np.matmul(a[:, s:s + BLAS_CHUNK_K].astype(np.float32), b[s:s + BLAS_CHUNK_K].astype(np.float32))
        part = part.astype(np.int32)
        acc = part if acc is None else acc + part
    return acc


def _resolve(impl: str | None) -> str:
    if impl is None:
        return implementation()
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"int8 GEMM implementation must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl not in available():
        raise RuntimeError(f"this CPU (or NUMBA_CPU_NAME target, or LOCKSTEP_INT8_GEMM) does not allow the {impl} "
                           "int8 GEMM")
    return impl


def matmul(a: np.ndarray, b: np.ndarray, impl: str | None = None) -> np.ndarray:
    """Exact (M, K) int8 x (K, N) int8 -> (M, N) int32, any strides.

    ``impl``: None picks this machine's fastest (``implementation()``); ``"vnni"``, ``"avx2"`` or
    ``"blas"`` force one (an error where the CPU lacks it).
    """
    if a.dtype != np.int8 or b.dtype != np.int8:
        raise TypeError(f"int8 GEMM needs int8 operands, got {a.dtype} and {b.dtype}")
    m, k = a.shape
    n = b.shape[1]
    impl = _resolve(impl)
    if m == 0 or n == 0 or k == 0:
        return np.zeros((m, n), dtype=np.int32)
    if impl == "vnni":
        return _vnni_matmul(a, b)
    return _avx2_matmul(a, b) if impl == "avx2" else _blas_matmul(a, b)


@parallel_kernel(rows)
def _rescale_kernel(t0, t1, acc, sa, sb, factor, fast, out):
    """out[m, n] = rescale1(acc[m, n], sa[m or 0], sb[n], factor, fast), rows in parallel."""
    n = acc.shape[1]
    per_row = sa.size > 1
    for r in range(t0, t1):
        a = sa[r] if per_row else sa[0]
        row = acc[r]
        dst = out[r]
        for j in range(n):
            dst[j] = rescale1(row[j], a, sb[j], factor, fast)


def matmul_rescaled(a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray, factor: np.float32,
                    fast: bool) -> np.ndarray:
    """``rescale1(int8 GEMM)`` as float32 (M, N): the int8 layers' GEMM and dequantization in one pass.

    ``sa`` has M entries or 1, ``sb`` N; with VNNI the rescale happens as each tile of C
    is stored, so the int32 result never reaches memory.
    """
    if a.dtype != np.int8 or b.dtype != np.int8:
        raise TypeError(f"int8 GEMM needs int8 operands, got {a.dtype} and {b.dtype}")
    m, k = a.shape
    n = b.shape[1]
    impl = implementation()
    if impl == "vnni" and m and n and k:
        return _vnni_matmul(a, b, (sa, sb, np.float32(factor), bool(fast)))
    if impl == "avx2" and m and n and k:
        return _avx2_matmul(a, b, (sa, sb, np.float32(factor), bool(fast)))
    acc = matmul(a, b, impl=impl)
    out = np.empty((m, n), dtype=np.float32)
    if out.size:
        _rescale_kernel(acc, sa, sb, np.float32(factor), bool(fast), out)
    return out
