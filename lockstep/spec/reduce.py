"""Reductions and contractions, each with one written order.

Legend: M, N output rows/columns; K the contracted length; ``...`` leading batch dims.

* ``lane_tree_sum``: the row-reduction order of every norm, softmax denominator,
  mean and loss sum (one CUDA warp / Metal SIMD-group / AVX register file).
* ``matmul``: float32 contraction, per output element ascending over k from +0.0,
  product rounded then sum rounded.
* ``matmul_accumulate``: the same contraction continued from a given accumulator
  (a contraction split over k in ascending pieces: ``matmul == matmul_accumulate`` from zeros).
* ``int8_matmul``: exact int32; any order gives the same bits.
* ``max``/``argmax``: exact in the total order ``-0.0 < +0.0``.
"""

from __future__ import annotations

import numpy as np

from . import fp
from .checks import check_int8_operands, check_matmul_accumulate_shapes, check_matmul_shapes  # noqa: F401 - re-exported: the shared input checks
from . import shapes as S
from .kinds import F32, HostInt, Int32, Int64, Int8, op

LANES = 32  # one CUDA warp / Metal SIMD-group
# Largest K for which a float32 GEMM of int8-valued operands is exact in any order.
# float32 holds every integer of magnitude <= 2**24. lockstep's quantizer is symmetric
# (values in [-127, 127]), so |a*b| <= 127*127 = 16129 and every partial sum of K
# products has magnitude <= K * 16129, which is <= 2**24 = 16777216 exactly while
# K <= 1040 (1041 * 16129 = 16790289 > 2**24). For operands that may hold -128 the
# bound is K <= 1024.
FLOAT32_EXACT_INT8_K = 1040


@op(S.lane_tree_sum)
def lane_tree_sum(x: F32, axis: HostInt = -1) -> F32:
    """Sum along ``axis`` in the lane-tree(32) order.

    1. Lane j (0..31) sums elements j, j+32, j+64, ... of the row in ascending
       order, starting from +0.0: ``lane[j] = lane[j] + x[j + 32*i]``, each add
       rounded and flushed.
    2. The lanes fold pairwise: ``lane[j] = lane[j] + lane[j+16]`` for j < 16, then
       ``+8``, ``+4``, ``+2``, ``+1``. Lane 0 holds the result.

    An empty row sums to +0.0. Missing elements of the last group of 32 leave
    their lanes unchanged (the same as adding nothing).
    """
    x = np.moveaxis(fp.f32(x), axis, -1)
    n = x.shape[-1]
    lanes = np.zeros(x.shape[:-1] + (LANES,), dtype=np.float32)
    for start in range(0, n, LANES):
        group = x[..., start : start + LANES]
        w = group.shape[-1]
        lanes[..., :w] = fp.add(lanes[..., :w], group)
    width = LANES // 2
    while width >= 1:
        lanes[..., :width] = fp.add(lanes[..., :width], lanes[..., width : 2 * width])
        width //= 2
    return lanes[..., 0].copy()


@op(S.column_sum)
def column_sum(x: F32) -> F32:
    """Sum over all leading axes, per last-axis feature: (..., D) -> (D,).

    Order (the "batch sum" of every per-feature parameter gradient): from +0.0,
    ascending over the flattened leading index, one rounded add per row — like a
    contraction over tokens.
    """
    x = fp.f32(x)
    rows = x.reshape(int(np.prod(x.shape[:-1], dtype=np.int64)), x.shape[-1])  # (not -1: D may be 0)
    acc = np.zeros(x.shape[-1], dtype=np.float32)
    for r in rows:
        acc = fp.add(acc, r)
    return acc


@op(S.matmul)
def matmul(a: F32, b: F32) -> F32:
    """Float32 contraction ``(..., M, K) x (..., K, N) -> (..., M, N)``.

    For every output element: ``acc = +0.0``; for k = 0, 1, ..., K-1 in ascending
    order: ``acc = acc + a[m, k] * b[k, n]`` with the product rounded (and flushed)
    and then the sum rounded (and flushed): never an FMA. Leading dims broadcast.
    """
    check_matmul_shapes(a, b)
    a = fp.f32(a)
    b = fp.f32(b)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    acc = np.zeros(batch + (a.shape[-2], b.shape[-1]), dtype=np.float32)
    for k in range(a.shape[-1]):
        acc = fp.add(acc, fp.mul(a[..., :, k : k + 1], b[..., k : k + 1, :]))
    return acc


@op(S.matmul_accumulate)
def matmul_accumulate(acc: F32, a: F32, b: F32) -> F32:
    """``matmul``'s contraction continued from ``acc``: (M, N), (M, K), (K, N) -> (M, N).

    For every output element: ``c = acc[m, n]`` (as float32: rounded, flushed, canonical);
    for k = 0, 1, ..., K-1 in ascending order: ``c = c + a[m, k] * b[k, n]``, the product
    rounded (and flushed), then the sum rounded (and flushed): never an FMA. 2-d operands
    only, nothing broadcast.

    ``matmul(a, b) == matmul_accumulate(zeros, a, b)`` bit for bit (``matmul`` starts from
    +0.0), and a contraction over K split into ascending pieces (columns k0..k1-1 of ``a``,
    rows k0..k1-1 of ``b``; prose, no ``@`` is called), each continuing the last one's result, gives the whole contraction's bits: how the LM
    head's weight gradient runs over chunks of tokens (``train.model``).
    """
    check_matmul_accumulate_shapes(acc, a, b)
    out = fp.f32(acc).copy()
    a = fp.f32(a)
    b = fp.f32(b)
    for k in range(a.shape[-1]):
        out = fp.add(out, fp.mul(a[:, k : k + 1], b[k : k + 1, :]))
    return out


@op(S.int8_matmul)
def int8_matmul(a: Int8, b: Int8) -> Int32:
    """Exact ``(..., M, K) int8 x (..., K, N) int8 -> (..., M, N) int32``.

    Integer sums are exact in any order, so the order is not part of the spec.
    Raises if a result could not fit int32 (K > 2**31 / 2**14).
    """
    a, b = check_int8_operands(a, b)
    # exact: float64 holds every partial sum (|sum| <= K * 2**14 < 2**53), so BLAS order is irrelevant (int8 values)
    out = np.matmul(a.astype(np.float64), b.astype(np.float64))  # exact: int8 values, sums < 2**53
    return out.astype(np.int32)


@op(S.max_)
def max(x: F32, axis: HostInt = -1) -> F32:  # noqa: A001 - the op is called max in every backend
    """Maximum along ``axis`` in the total order (-0.0 < +0.0); any NaN -> canonical NaN.

    Exact, so no order is part of the spec. Computed as the maximum of integer keys
    that sort like the floats (``fp._total_key``), then mapped back. An empty axis
    is an error.
    """
    x = np.moveaxis(fp.f32(x), axis, -1)
    if x.shape[-1] == 0:
        raise ValueError("max of an empty axis")
    key = fp._total_key(x)
    idx = np.argmax(key, axis=-1)[..., None]  # exact: integer keys
    r = np.take_along_axis(x, idx, axis=-1)[..., 0]
    r = np.where(np.isnan(x).any(axis=-1), fp.from_bits(fp.CANONICAL_NAN_BITS), r)
    return fp.canon(r)


@op(S.argmax)
def argmax(x: F32, axis: HostInt = -1) -> Int64:
    """Index (int64) of the first maximum along ``axis`` in the total order (-0.0 < +0.0).

    A row containing NaN returns the index of its first NaN.
    """
    x = np.moveaxis(fp.f32(x), axis, -1)
    if x.shape[-1] == 0:
        raise ValueError("argmax of an empty axis")
    key = fp._total_key(x)
    nan = np.isnan(x)
    key = np.where(nan, np.iinfo(np.int64).max, key)
    return np.argmax(key, axis=-1).astype(np.int64)  # exact: integer keys, first maximum
