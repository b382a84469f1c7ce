"""Exact int8 GEMMs: ``C = A @ B``, int8 operands, int32 results (``spec.reduce.int8_matmul``).

An integer sum is exact in any order, so this module may use any instructions and
any blocking: nothing here can change a bit, as long as no int32 result overflows
(the spec refuses a K that could, and ``int8_linear_*`` stay far below it).

Two implementations, the same integers:

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
  ``MR x 32`` tile of C in 16 AVX-512 registers over the whole K.
* **BLAS** (everywhere else): float32 sgemm on int8-valued operands, K in chunks
  of 1024 (every partial sum an integer below 2**24, so exact in any order), the
  chunks summed in int32.

``LOCKSTEP_INT8_GEMM=blas`` forces the second (tests compare the two).
"""

from __future__ import annotations

import os

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .fp import kernel, parallel_kernel

MR = 8  # rows of A per micro-kernel call: 8 x 2 accumulators = 16 of the 32 AVX-512 registers
NR = 32  # columns of a B panel: two 16-lane int32 vectors
BLAS_CHUNK_K = 1024  # sgemm on int8 values is exact while K * 127 * 127 < 2**24 (K <= 1040)
A_BLOCK_BYTES = 1 << 18  # rows of A per L2 block: the block is reused across all panels


def _host_has_vnni() -> bool:
    """True when Numba compiles for this host and the host has AVX-512 F, BW and VNNI.

    A target named by ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` (portable caches) may
    lack them; compiling ``vpdpbusd`` for such a target would abort, so it gets BLAS.
    """
    if os.environ.get("LOCKSTEP_INT8_GEMM", "").lower() == "blas":
        return False
    if numba.config.CPU_NAME not in (None, "", "host") or numba.config.CPU_FEATURES not in (None, ""):
        return False
    try:
        import llvmlite.binding as llvm

        feats = llvm.get_host_cpu_features()
    except Exception:  # noqa: BLE001 - a host llvmlite cannot describe gets the portable path
        return False
    return all(feats.get(f, False) for f in ("avx512f", "avx512bw", "avx512vnni"))


HAVE_VNNI = _host_has_vnni()


def implementation() -> str:
    """Which implementation ``matmul`` uses on this machine: ``"vnni"`` or ``"blas"``."""
    return "vnni" if HAVE_VNNI else "blas"


# ---------------------------------------------------------------- the VNNI micro-kernel

@intrinsic
def vnni_tile(typingctx, out_addr, a_addr, lda, b_addr, k4):
    """``out[r, 0:32] = sum_g dot4(a[r, 4g:4g+4], panel[g, :, 0:4])`` for r < MR, g < k4 (int32).

    ``a_addr``: MR rows of signed bytes, ``lda`` bytes apart; ``b_addr``: a packed
    panel (k4, 32 columns, 4 bytes: ``B + 128`` as unsigned bytes); ``out_addr``: MR x 32
    int32, row-major. The caller guarantees ``k4 >= 1`` and the CPU features.
    """
    sig = types.void(types.uintp, types.uintp, types.intp, types.uintp, types.intp)

    def codegen(context, builder, sig, args):
        out_i, a_i, lda_v, b_i, k4_v = args
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        v16 = ir.VectorType(i32, 16)
        v64b = ir.VectorType(i8, 64)
        name = "llvm.x86.avx512.vpdpbusd.512"
        dpbusd = builder.module.globals.get(name) or ir.Function(builder.module, ir.FunctionType(v16, [v16, v64b, v64b]),
                                                                 name)
        a_p = builder.inttoptr(a_i, i8.as_pointer())
        b_p = builder.inttoptr(b_i, i8.as_pointer())
        zero = ir.Constant(v16, None)
        entry = builder.block
        loop = builder.append_basic_block("vnni.loop")
        done = builder.append_basic_block("vnni.done")
        builder.branch(loop)

        builder.position_at_end(loop)  # one group of 4 k per iteration
        g = builder.phi(i64)
        g.add_incoming(ir.Constant(i64, 0), entry)
        acc = []
        for _ in range(2 * MR):
            phi = builder.phi(v16)
            phi.add_incoming(zero, entry)
            acc.append(phi)
        panel_off = builder.mul(g, ir.Constant(i64, 4 * NR))
        b_vecs = [builder.load(builder.bitcast(builder.gep(b_p, [builder.add(panel_off, ir.Constant(i64, 64 * h))]),
                                               v64b.as_pointer()), align=1) for h in range(2)]
        a_off = builder.mul(g, ir.Constant(i64, 4))
        new = []
        for r in range(MR):
            a_ptr = builder.gep(a_p, [builder.add(a_off, builder.mul(lda_v, ir.Constant(i64, r)))])
            a4 = builder.load(builder.bitcast(a_ptr, i32.as_pointer()), align=1)  # 4 bytes of row r
            splat = builder.insert_element(ir.Constant(v16, ir.Undefined), a4, ir.Constant(i32, 0))
            splat = builder.bitcast(builder.shuffle_vector(splat, ir.Constant(v16, ir.Undefined), zero), v64b)
            for h in range(2):
                new.append(builder.call(dpbusd, [acc[2 * r + h], b_vecs[h], splat]))
        g_next = builder.add(g, ir.Constant(i64, 1))
        g.add_incoming(g_next, loop)
        for phi, v in zip(acc, new):
            phi.add_incoming(v, loop)
        builder.cbranch(builder.icmp_signed("<", g_next, k4_v), loop, done)

        builder.position_at_end(done)
        out_p = builder.bitcast(builder.inttoptr(out_i, i32.as_pointer()), v16.as_pointer())
        for j, v in enumerate(new):
            builder.store(v, builder.gep(out_p, [ir.Constant(i64, j)]), align=4)
        return context.get_dummy_value()

    return sig, codegen


@kernel(nogil=True)
def _pack_b(b, bp):
    """bp[p, g, jj, t] = b[4g + t, 32p + jj] + 128 as uint8 (0 + 128 past the edges).

    The padding's products meet zeros of A (K padding) or land in columns that are
    never stored (N padding).
    """
    k, n = b.shape
    npanel, k4 = bp.shape[0], bp.shape[1]
    for p in range(npanel):
        for g in range(k4):
            dst = bp[p, g]
            for jj in range(NR):
                j = p * NR + jj
                for t in range(4):
                    kk = 4 * g + t
                    v = np.int32(b[kk, j]) if (j < n and kk < k) else np.int32(0)
                    dst[jj, t] = np.uint8(v + 128)


@kernel(nogil=True)
def _row_corrections(a, corr):
    """corr[i] = 128 * sum_k a[i, k] (int32, wrapping: it is subtracted from a wrapping sum)."""
    for i in range(a.shape[0]):
        s = np.int32(0)
        row = a[i]
        for kk in range(row.size):
            s += np.int32(row[kk])
        corr[i] = s * np.int32(128)


@parallel_kernel(weight=64)
def _vnni_gemm(t0, t1, a, bp, corr, n, rows_per_block, out):
    """out (M, N) int32 = a (M, Kp) int8 @ B, B packed in bp; tasks are blocks of MR rows.

    Within this call's rows: blocks of ``rows_per_block`` rows of A (kept in L2) meet
    every panel of B in turn. A last partial block of rows goes through a zero-padded copy.
    """
    m, kp = a.shape
    k4 = kp // 4
    npanel = bp.shape[0]
    ntasks = (m + MR - 1) // MR
    if t0 < 0:
        return ntasks
    tile = np.empty((MR, NR), dtype=np.int32)
    spare = np.zeros((MR, kp), dtype=np.int8)
    t_end = min(t1, ntasks)
    per_block = max(1, rows_per_block // MR)
    for blk0 in range(t0, t_end, per_block):
        blk1 = min(t_end, blk0 + per_block)
        for p in range(npanel):
            j0 = p * NR
            jn = min(NR, n - j0)
            panel = bp[p]
            for rb in range(blk0, blk1):
                i0 = rb * MR
                rows = min(MR, m - i0)
                if rows == MR:
                    vnni_tile(tile.ctypes.data, a[i0:].ctypes.data, kp, panel.ctypes.data, k4)
                else:
                    spare[:rows] = a[i0:m]
                    vnni_tile(tile.ctypes.data, spare.ctypes.data, kp, panel.ctypes.data, k4)
                for r in range(rows):
                    c = corr[i0 + r]
                    dst = out[i0 + r, j0:j0 + jn]
                    src = tile[r]
                    for jj in range(jn):
                        dst[jj] = src[jj] - c
    return ntasks


def _vnni_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    m, k = a.shape
    n = b.shape[1]
    kp = -(-k // 4) * 4
    if k != kp or not a.flags.c_contiguous:
        padded = np.zeros((m, kp), dtype=np.int8)
        padded[:, :k] = a
        a = padded
    bp = np.empty((-(-n // NR), kp // 4, NR, 4), dtype=np.uint8)
    _pack_b(b, bp)
    corr = np.empty(m, dtype=np.int32)
    _row_corrections(a, corr)
    out = np.empty((m, n), dtype=np.int32)
    _vnni_gemm(a, bp, corr, n, max(MR, A_BLOCK_BYTES // kp), out)
    return out


def _blas_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = a.shape[1]
    acc = None
    for s in range(0, k, BLAS_CHUNK_K):
        part = np.matmul(a[:, s:s + BLAS_CHUNK_K].astype(np.float32), b[s:s + BLAS_CHUNK_K].astype(np.float32))
        part = part.astype(np.int32)
        acc = part if acc is None else acc + part
    return acc


def matmul(a: np.ndarray, b: np.ndarray, use_vnni: bool | None = None) -> np.ndarray:
    """Exact (M, K) int8 x (K, N) int8 -> (M, N) int32, any strides.

    ``use_vnni``: None picks this machine's fastest (``implementation()``); False forces
    BLAS; True requires VNNI (an error where the CPU lacks it).
    """
    if a.dtype != np.int8 or b.dtype != np.int8:
        raise TypeError(f"int8 GEMM needs int8 operands, got {a.dtype} and {b.dtype}")
    m, k = a.shape
    n = b.shape[1]
    if use_vnni is None:
        use_vnni = HAVE_VNNI
    elif use_vnni and not HAVE_VNNI:
        raise RuntimeError("this CPU (or NUMBA_CPU_NAME target) has no AVX-512 VNNI")
    if m == 0 or n == 0 or k == 0:
        return np.zeros((m, n), dtype=np.int32)
    return _vnni_matmul(a, b) if use_vnni else _blas_matmul(a, b)
