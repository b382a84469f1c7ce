"""Exact int8 x int8 -> int32 GEMMs through cuBLAS ``gemmEx`` (CUBLAS_COMPUTE_32I).

Integer sums are exact in any order, so cuBLAS may pick any algorithm, tiling,
split-K or tensor-core path: the bits cannot change. ``cupy.matmul`` is never used
on int8: it returns int8 (NumPy promotion) and wraps (docs/gpu-kernels.md, "Toolchain traps").

cuBLAS's 32-bit integer path needs alpha = 1, beta = 0 as int32 host scalars,
4-byte aligned pointers (CuPy allocations are 256-byte aligned) and leading
dimensions that are multiples of 4. So every dimension is padded with zeros to a
multiple of 4 (``padded``): a zero row or column adds nothing to an integer sum,
and the padding is sliced off the result.

Row-major <-> column-major: cuBLAS reads a matrix as column-major. A row-major
(r, c) array with row stride ``ld`` is, byte for byte, the column-major (c, r)
matrix of its transpose with leading dimension ``ld``. So for row-major
``C (M, N) = A (M, K) @ B (K, N)`` we ask cuBLAS for the column-major product
``C^T (N, M) = B^T (N, K) @ A^T (K, M)`` with no transposes:
``gemmEx(OP_N, OP_N, m=N, n=M, k=K, B, ldb=N, A, lda=K, C, ldc=N)``: cuBLAS's
first operand is our B and its second our A (``cublas_arguments``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Values from CUDA's headers (library_types.h, cublas_api.h); CuPy does not export all of them.
CUDA_R_8I = 3
CUDA_R_32I = 10
CUBLAS_COMPUTE_32I = 72
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_OP_N = 0
CUBLAS_POINTER_MODE_HOST = 0
ALIGN = 4


def padded(n: int) -> int:
    """``n`` rounded up to a multiple of 4 (at least 4)."""
    return max(ALIGN, -(-int(n) // ALIGN) * ALIGN)


@dataclass(frozen=True)
class GemmArguments:
    """The shape arguments of one column-major ``gemmEx`` call for a row-major product."""

    m: int      # cuBLAS rows of its C = our N (padded)
    n: int      # cuBLAS columns of its C = our M (padded)
    k: int      # contracted length (padded)
    lda: int    # leading dimension of cuBLAS's first operand = our B: padded N
    ldb: int    # leading dimension of cuBLAS's second operand = our A: padded K
    ldc: int    # leading dimension of cuBLAS's C = our C: padded N


def cublas_arguments(m: int, k: int, n: int) -> GemmArguments:
    """Arguments for row-major ``C (m, n) = A (m, k) @ B (k, n)`` on buffers padded by ``padded``."""
    mp, kp, np_ = padded(m), padded(k), padded(n)
    return GemmArguments(m=np_, n=mp, k=kp, lda=np_, ldb=kp, ldc=np_)


def _pad_2d(xp, x, rows: int, cols: int):
    """``x`` (int8, 2-D) zero-padded to (rows, cols), C-contiguous; no copy when already so."""
    if x.shape == (rows, cols) and x.flags.c_contiguous:
        return x
    out = xp.zeros((rows, cols), dtype=xp.int8)
    out[: x.shape[0], : x.shape[1]] = x
    return out


def int8_matmul_2d(xp, a, b, gemm_ex):
    """(M, K) int8 @ (K, N) int8 -> (M, N) int32 on ``xp`` arrays, through ``gemm_ex(args, first, second, c)``.

    ``gemm_ex`` is the column-major cuBLAS call (``Int8Gemm._gemm_ex``), or its NumPy
    emulation in the tests; everything else (padding, operand swap, slicing) is shared.
    """
    m, k = a.shape
    n = b.shape[1]
    args = cublas_arguments(m, k, n)
    a_p = _pad_2d(xp, a, args.n, args.k)   # (Mp, Kp) row-major = A^T column-major, ld Kp
    b_p = _pad_2d(xp, b, args.k, args.m)   # (Kp, Np) row-major = B^T column-major, ld Np
    c_p = xp.empty((args.n, args.m), dtype=xp.int32)  # (Mp, Np) row-major = C^T column-major, ld Np
    gemm_ex(args, b_p, a_p, c_p)
    if (args.n, args.m) == (m, n):
        return c_p
    return xp.ascontiguousarray(c_p[:m, :n])


class Int8Gemm:
    """``int8_gemm(a, b)`` on CuPy arrays, through the current device's cuBLAS handle."""

    def __init__(self, cp):
        self.cp = cp
        self._one = np.ones(1, dtype=np.int32)   # alpha, beta: int32 host scalars (32I path)
        self._zero = np.zeros(1, dtype=np.int32)

    def _gemm_ex(self, args: GemmArguments, first, second, c) -> None:
        from cupy_backends.cuda.libs import cublas

        handle = self.cp.cuda.device.get_cublas_handle()
        mode = cublas.getPointerMode(handle)
        cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST)
        try:
            cublas.gemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, args.m, args.n, args.k,
                          self._one.ctypes.data, first.data.ptr, CUDA_R_8I, args.lda,
                          second.data.ptr, CUDA_R_8I, args.ldb,
                          self._zero.ctypes.data, c.data.ptr, CUDA_R_32I, args.ldc,
                          CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT)
        finally:
            cublas.setPointerMode(handle, mode)

    def __call__(self, a, b):
        """``(..., M, K) @ (..., K, N)`` int8 -> int32, leading dims broadcast (one GEMM per matrix)."""
        cp = self.cp
        if a.ndim == 2 and b.ndim == 2:
            return int8_matmul_2d(cp, a, b, self._gemm_ex)
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a = cp.broadcast_to(a, batch + a.shape[-2:])
        b = cp.broadcast_to(b, batch + b.shape[-2:])
        out = cp.empty(batch + (a.shape[-2], b.shape[-1]), dtype=cp.int32)
        for idx in np.ndindex(*batch):
            out[idx] = int8_matmul_2d(cp, a[idx], b[idx], self._gemm_ex)
        return out


def emulate_gemm_ex(args: GemmArguments, first: np.ndarray, second: np.ndarray, c: np.ndarray) -> None:
    """Column-major ``gemmEx(OP_N, OP_N)`` on NumPy buffers, written into ``c``'s buffer.

    ``first``/``second`` are the buffers passed as cuBLAS's A and B, read the way
    cuBLAS reads them (column-major, leading dimensions ``args.lda``/``ldb``). Used by
    the tests (no GPU needed) to check the row-major mapping above.
    """
    a_cm = first.reshape(-1)[: args.lda * args.k].reshape(args.k, args.lda).T[: args.m, :]      # (m, k)
    b_cm = second.reshape(-1)[: args.ldb * args.n].reshape(args.n, args.ldb).T[: args.k, :]     # (k, n)
    c_cm = a_cm.astype(np.int64) @ b_cm.astype(np.int64)  # exact: integer GEMM
    c.reshape(-1)[: args.ldc * args.n].reshape(args.n, args.ldc)[:, : args.m] = c_cm.T
