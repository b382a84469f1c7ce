"""The int8 W8A8 linear layer and its backward (``lockstep.spec.quant``).

Every float step (scales, quantization, the Hadamard rotation of ``hadamard``,
dequantization, rescaling) is a Numba kernel that follows the spec's order. The quantized operands
are int8 arrays, as in the spec, and the int8 GEMMs are exact, so they run on
whatever this CPU does fastest (``int8gemm.matmul_rescaled``: AVX-512 VNNI, else
float32 BLAS on int8 values), with the spec's rescale applied as the result is stored.

Where the spec transposes (``dequantized_weight(w).T``, ``xdq.T``), the kernels
work on the untransposed array along the other axis and the GEMM takes the
transposed view (it packs B in any layout, and copies a transposed A once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np

from lockstep.spec.checks import check_linear_shapes
from lockstep.spec.fp import EXPONENT_MASK
from lockstep.spec.quant import ONE, QMAX, TWO, hadamard_block
from lockstep.spec.reduce import LANES

from . import int8gemm
from .fp import ABS_MASK, CANONICAL_NAN_BITS, ZERO, bits, cn, contiguous_f32, fl, from_bits, min_nonzero_abs
from .hadamard import ADDITIVE_SAFE, hadamard_columns, hadamard_row
from .tasks import column_block, column_blocks, column_bounds, inlined, kernel, parallel_kernel, rows

NEG_QMAX = -QMAX
SQRT_QMAX = np.float32(np.sqrt(QMAX))  # fp.sqrt(127): IEEE sqrt, one rounding, normal
INF_BITS = EXPONENT_MASK  # +inf is the exponent field alone


# ---------------------------------------------------------------- scalar pieces

@kernel
def quantize1(x, s):
    """``clip(rint(x / s), -127, 127)`` as a float32 integer; NaN -> 0 (x already entered)."""
    r = np.rint(fl(x / s))
    if r != r:
        return ZERO
    if r > QMAX:
        return QMAX
    if r < NEG_QMAX:
        return NEG_QMAX
    return r


@inlined
def codes_by_columns(src, scales, dst, tmp):
    """``dst[j] = quantize(fl(src[j]), scales[j])`` as int8 (``quantize1``'s integer), in two passes: the
    int32 codes into ``tmp`` (at least as long), then narrowed to int8. The same values as one pass.
    Where the CPU lacks AVX-512, LLVM left the one-pass loop scalar (``vdivss``); these two vectorize
    (0.58 -> 0.33 ns an element, AVX2 stood in; 0.29 -> 0.28 with AVX-512)."""
    for j in range(src.size):
        tmp[j] = np.int32(quantize1(fl(src[j]), scales[j]))
    for j in range(src.size):
        dst[j] = np.int8(tmp[j])


@inlined
def codes_by_scale(src, s, dst, tmp):
    """``dst[j] = quantize(src[j], s)`` as int8 (src already entered), in two passes (``codes_by_columns``)."""
    for j in range(src.size):
        tmp[j] = np.int32(quantize1(src[j], s))
    for j in range(src.size):
        dst[j] = np.int8(tmp[j])


@kernel
def nonzero_scale(s):
    """A zero scale becomes 1 (NaN stays NaN)."""
    return ONE if s == ZERO else s


@kernel
def abs_max_bits_to_float(m):
    """The max of |x| bit patterns (sign cleared) as a float: > inf's pattern means a NaN was seen."""
    if m > INF_BITS:
        return from_bits(CANONICAL_NAN_BITS)
    return from_bits(m)


@kernel
def scale_from_abs_max_bits(m):
    """``nonzero(max|x| / 127)`` from the max of the |x| bit patterns (exact in any order): a scale."""
    return nonzero_scale(fl(abs_max_bits_to_float(m) / QMAX))


@kernel
def abs_bits_entered(x):
    """Bits of ``|f32(x)|``: flushed to 0 if subnormal, sign cleared (NaNs stay above inf)."""
    return bits(fl(x)) & ABS_MASK


# ---------------------------------------------------------------- scales

def _chunks(x, nchunks, out) -> int:
    return nchunks


@parallel_kernel(_chunks)
def _abs_max_bits(t0, t1, x, nchunks, out):
    n = x.size
    for c in range(t0, t1):
        m = np.uint32(0)
        part = x[c * n // nchunks:(c + 1) * n // nchunks]
        for i in range(part.size):
            m = max(m, np.uint32(abs_bits_entered(part[i])))
        out[c] = m


def activation_scale(x_flat) -> np.float32:
    """``spec.quant.activation_scale``: ``max|x| / 127`` (total-order max, exact), 0 -> 1."""
    if x_flat.size == 0:
        raise ValueError("max of an empty axis")
    nchunks = max(1, min(64, x_flat.size // 65536))
    parts = np.zeros(nchunks, dtype=np.uint32)
    _abs_max_bits(x_flat, nchunks, parts)
    return np.float32(_activation_scale_from_bits(np.uint32(parts.max())))


@kernel
def _activation_scale_from_bits(m):
    return cn(scale_from_abs_max_bits(m))


@parallel_kernel(column_blocks, weight=4)
def _weight_scale_kernel(t0, t1, w, sw, col_block):
    """Per column n: ``(2 * (lane_tree_sum_k |w[k, n]| / K)) / sqrt(127)``, 0 -> 1.

    The lane tree of ``reduce.lane_tree`` runs down each column; lanes are held for a
    block of columns at once (a task), so the loads are contiguous rows and the adds and the
    fold vectorize across the columns.
    """
    k, n = w.shape
    kf = np.float32(k)
    for c in range(t0, t1):
        lo, hi = column_bounds(c, n, col_block)
        cw = hi - lo
        lanes = np.zeros((LANES, cw), dtype=np.float32)
        for i in range(k):
            lane = lanes[i % LANES]
            wr = w[i, lo:hi]
            for j in range(cw):
                lane[j] = fl(lane[j] + from_bits(abs_bits_entered(wr[j])))
        width = LANES // 2
        while width >= 1:
            for ln in range(width):
                la = lanes[ln]
                lb = lanes[ln + width]
                for j in range(cw):
                    la[j] = fl(la[j] + lb[j])
            width //= 2
        out = sw[lo:hi]
        for j in range(cw):
            mean_abs = fl(lanes[0, j] / kf)
            out[j] = cn(nonzero_scale(fl(fl(TWO * mean_abs) / SQRT_QMAX)))


def weight_scale(w2) -> np.ndarray:
    k, n = w2.shape
    sw = np.empty(n, dtype=np.float32)
    if n:
        _weight_scale_kernel(w2, sw, min(256, column_block(n)))  # lanes of <= 256 columns (32 KiB) stay in L1/L2
    return sw


# ---------------------------------------------------------------- forward

@parallel_kernel(rows)
def _quantize_by_columns(t0, t1, x, scales, q):
    """``q[r, j] = quantize(f32(x[r, j]), scales[j])`` (int8), rows in parallel."""
    tmp = np.empty(x.shape[1], dtype=np.int32)
    for r in range(t0, t1):
        codes_by_columns(x[r], scales, q[r], tmp)


TRANSPOSE_ROWS = 64  # rows of x per task of ``_quantize_columns_transposed``: 64 int8 = one line of qt


def _row_blocks(x, scales, qt) -> int:
    return -(-x.shape[0] // TRANSPOSE_ROWS)


@parallel_kernel(_row_blocks)
def _quantize_columns_transposed(t0, t1, x, scales, qt):
    """``qt[j, r] = quantize(f32(x[r, j]), scales[j])`` (int8, qt is x's transpose): the codes of
    ``_quantize_by_columns`` laid out for a GEMM that contracts over x's rows, without a separate
    transposing copy. Tasks are blocks of ``TRANSPOSE_ROWS`` rows; each block is quantized along
    its rows into a square int8 tile (the loop vectorizes), which is then written out transposed."""
    m, c = x.shape
    tile = np.empty((TRANSPOSE_ROWS, TRANSPOSE_ROWS), dtype=np.int8)
    tmp = np.empty(TRANSPOSE_ROWS, dtype=np.int32)
    for t in range(t0, t1):
        r0 = t * TRANSPOSE_ROWS
        nr = min(m, r0 + TRANSPOSE_ROWS) - r0
        for j0 in range(0, c, TRANSPOSE_ROWS):
            nc = min(c, j0 + TRANSPOSE_ROWS) - j0
            s = scales[j0:j0 + nc]
            for r in range(nr):
                codes_by_columns(x[r0 + r, j0:j0 + nc], s, tile[r, :nc], tmp)
            for j in range(nc):
                out = qt[j0 + j, r0:r0 + nr]
                for r in range(nr):
                    out[r] = tile[r, j]


def _rescale_is_exact(sa, sb, factor) -> bool:
    """True when ``((acc * sa) * sb) * factor`` can be neither subnormal nor NaN for any integer acc.

    |acc| >= 1 when nonzero, so each partial product is at least min|sa|, then
    min|sa| * min|sb|, then that times factor in magnitude (float64 products of
    float32 are exact); finite scales keep NaN out.
    """
    sa64 = np.abs(sa.astype(np.float64))
    sb64 = np.abs(sb.astype(np.float64))
    if not (np.isfinite(sa64).all() and np.isfinite(sb64).all()) or sa64.size == 0 or sb64.size == 0:
        return False
    tiny = 2.0**-126
    lo_a, lo_b = sa64.min(), sb64.min()
    return bool(lo_a >= tiny and lo_a * lo_b >= tiny and lo_a * lo_b * float(factor) >= tiny)


def _int8_gemm_rescaled(a, b, sa, sb, factor) -> np.ndarray:
    """``((float32(int8_matmul(a, b)) * sa[m]) * sb[n]) * factor`` for int8 operands (M, K) x (K, N),
    any strides, each product rounded and flushed (``int8gemm.rescale1``): the spec's rescale.
    ``factor`` is 1/block after a Hadamard rotation (an exact power of two), else 1 (a product
    by 1 changes nothing, so the spec's "no rescale" is the same bits)."""
    return int8gemm.matmul_rescaled(a, b, sa, sb, factor, _rescale_is_exact(sa, sb, factor))


# ---------------------------------------------------------------- weights that stay the same for a while

_memo: dict[int, tuple[object, dict]] | None = None  # id(w) -> (w, {form: value}) inside ``weights_unchanged``


@contextlib.contextmanager
def weights_unchanged(memo: dict | None = None) -> Iterator[None]:
    """Within the block, each weight array's quantized forms are made once and reused by
    every int8 linear call given *that same array object*: its column scales, its int8
    codes (forward), and its rotated, quantized transpose with their scales (backward).

    The caller promises that no weight array is modified while its forms are kept: a
    step's micro-batches all read the same parameters, so ``train.step.subtree_sums`` runs
    them in one block (the backend's capability ``weights_unchanged``), and
    ``use.generate.CachedModel`` keeps its own ``memo`` (a dict it passes in every time)
    for the life of the model. The bits are those of the calls without it: a form is
    exactly what the call would compute, computed once. Each entry holds its array, so an
    id cannot be reused while the memo lives. Without ``memo``, the block uses the
    enclosing block's memo, or a new one dropped on leaving. Why: re-quantizing every weight
    for every micro-batch costs a pass over all weights per micro-batch, which small
    micro-batches cannot hide.
    """
    global _memo
    outer = _memo
    if memo is not None:
        _memo = memo
    elif outer is None:
        _memo = {}
    try:
        yield
    finally:
        _memo = outer


def _weight_form(w, form: tuple, make: Callable[[], object]):
    """``make()``, or inside ``weights_unchanged`` the value it gave for this array object before."""
    memo = _memo
    if memo is None:
        return make()
    entry = memo.get(id(w))
    if entry is None or entry[0] is not w:
        entry = memo[id(w)] = (w, {})
    forms = entry[1]
    if form not in forms:
        forms[form] = make()
    return forms[form]


def _forward_weight(w, w2) -> tuple[np.ndarray, np.ndarray]:
    """``(sw, wq)``: the spec's ``weight_scale(w)`` and ``quantize(w, sw[None, :])``."""
    sw = _weight_form(w, ("scale",), lambda: weight_scale(w2))

    def codes() -> np.ndarray:
        wq = np.empty(w2.shape, dtype=np.int8)
        if wq.size:
            _quantize_by_columns(w2, sw, wq)
        return wq

    return sw, _weight_form(w, ("codes",), codes)


def int8_linear_forward(x, w) -> np.ndarray:
    """``spec.quant.int8_linear_forward``: (..., K), (K, N) -> (..., N)."""
    check_linear_shapes(x, w)
    x = np.asarray(x, dtype=np.float32)
    w2 = contiguous_f32(w)
    lead = x.shape[:-1]
    x2 = contiguous_f32(x).reshape(-1, x.shape[-1])
    sx = activation_scale(x2.reshape(-1))
    sw, wq = _forward_weight(w, w2)
    xq = np.empty(x2.shape, dtype=np.int8)
    if xq.size:
        _quantize_by_columns(x2, np.full(x2.shape[1], sx, dtype=np.float32), xq)
    y = _int8_gemm_rescaled(xq, wq, np.array([sx], dtype=np.float32), sw, ONE)
    return y.reshape(lead + (w2.shape[1],))


@kernel
def _rotate_quantize_row(row, blk, rotate, q, tmp):
    """Rotate the entered row in place (optional), then quantize it by ``max|row| / 127`` into q;
    returns that scale. ``tmp``: int32 scratch as long as the row."""
    if rotate:
        hadamard_row(row, blk)
    mx = np.uint32(0)
    for j in range(row.size):
        mx = max(mx, np.uint32(bits(row[j]) & ABS_MASK))
    s = scale_from_abs_max_bits(mx)
    codes_by_scale(row, s, q, tmp)
    return s


@parallel_kernel(rows, weight=4)
def _rows_rotate_quantize(t0, t1, a, blk, rotate, q, sa):
    """Rows of a (M, C), contracted along C: enter (flush), rotate (optional),
    ``sa[m] = max|.| / 127``, quantize. ``q`` (int8) receives the quantized rows."""
    row = np.empty(a.shape[1], dtype=np.float32)
    tmp = np.empty(a.shape[1], dtype=np.int32)
    for r in range(t0, t1):
        src = a[r]
        for j in range(row.size):
            row[j] = fl(src[j])
        sa[r] = cn(_rotate_quantize_row(row, blk, rotate, q[r], tmp))


@parallel_kernel(rows, weight=4)
def _weight_rows_rotate_quantize(t0, t1, w, sw, blk, rotate, q, sb):
    """Rows k of wdq = dequantized_weight(w) (K, N), rotated along N, scaled and quantized (int8 q).

    ``wdq[k, n] = quantize(w[k, n], sw[n]) * sw[n]`` (one rounded product). Rows in parallel.
    """
    row = np.empty(w.shape[1], dtype=np.float32)
    tmp = np.empty(w.shape[1], dtype=np.int32)
    for r in range(t0, t1):
        src = w[r]
        for j in range(row.size):
            row[j] = fl(quantize1(fl(src[j]), sw[j]) * sw[j])
        sb[r] = cn(_rotate_quantize_row(row, blk, rotate, q[r], tmp))


COL_CHUNK = 256  # columns per task of the column transform: a 256 x 256 tile stays in L2


def _row_blocks_by_column_chunks(src, dst, blk, rotate, dq_scale, partial) -> int:
    """Tasks of ``_cols_transform_max``: (block of ``blk`` rows) x (chunk of ``COL_CHUNK`` columns)."""
    return partial.shape[0] * -(-src.shape[1] // COL_CHUNK)


@parallel_kernel(_row_blocks_by_column_chunks, weight=4)
def _cols_transform_max(t0, t1, src, dst, blk, rotate, dq_scale, partial):
    """dst = ``spec.quant.hadamard_transform(e, axis=0)`` (or just e) with ``e = f32(src)``, or, for a
    nonzero ``dq_scale``, ``e = quantize(f32(src), dq_scale) * dq_scale`` (``spec.quant``'s
    ``dequantized_activation``, one rounded product, made as the block is entered: no pass of its own);
    and ``partial[row_block, c]`` = max over the block's rows of |dst[:, c]| (bit patterns).

    Tasks are (block of ``blk`` rows) x (chunk of columns); the rotation is
    ``hadamard.hadamard_columns``.
    """
    c = src.shape[1]
    ncc = (c + COL_CHUNK - 1) // COL_CHUNK
    for task in range(t0, t1):
        rb = task // ncc
        r0 = rb * blk
        lo = (task % ncc) * COL_CHUNK
        hi = min(c, lo + COL_CHUNK)
        mn = np.inf
        for i in range(r0, r0 + blk):
            srow = src[i, lo:hi]
            drow = dst[i, lo:hi]
            if dq_scale == ZERO:
                for j in range(drow.size):
                    drow[j] = fl(srow[j])
            else:
                for j in range(drow.size):
                    drow[j] = fl(quantize1(fl(srow[j]), dq_scale) * dq_scale)
            mn = min(mn, min_nonzero_abs(drow))
        if rotate:
            hadamard_columns(dst, r0, blk, lo, hi, mn >= ADDITIVE_SAFE)
        pm = partial[rb, lo:hi]
        for j in range(pm.size):
            pm[j] = np.uint32(0)
        for i in range(r0, r0 + blk):
            drow = dst[i, lo:hi]
            for j in range(pm.size):
                pm[j] = max(pm[j], np.uint32(bits(drow[j]) & ABS_MASK))


@kernel
def _col_scales(partial, s_out, sc):
    """Column scales from the partial maxima (max is exact in any order)."""
    c = partial.shape[1]
    for j in range(c):
        mx = np.uint32(0)
        for p in range(partial.shape[0]):
            mx = max(mx, partial[p, j])
        s = scale_from_abs_max_bits(mx)
        sc[j] = s
        s_out[j] = cn(s)


def _cols_rotate_quantize(src, dst, blk, rotate, s_out, q, dq_scale=ZERO, transposed=False):
    """Columns of src (M, C), contracted along M: enter into dst (float32 work, may be src; dequantized
    by a nonzero ``dq_scale`` on the way, ``_cols_transform_max``), rotate down the rows,
    ``s[c] = max_m |.| / 127``, quantize each column by its scale into q (int8; (M, C), or with
    ``transposed`` (C, M), the layout of a GEMM's A that contracts over M)."""
    m, c = src.shape
    if not rotate:
        blk = max(1, min(256, m))
        while m % blk:
            blk //= 2
    partial = np.empty((m // blk, c), dtype=np.uint32)
    _cols_transform_max(src, dst, blk, rotate, np.float32(dq_scale), partial)
    sc = np.empty(c, dtype=np.float32)
    _col_scales(partial, s_out, sc)
    if transposed:
        _quantize_columns_transposed(dst, sc, q)
    else:
        _quantize_by_columns(dst, sc, q)


def int8_linear_backward(dy, x, w, hadamard: bool = True):
    """``spec.quant.int8_linear_backward``: straight-through ``(dx, dw)``, both int8 GEMMs."""
    check_linear_shapes(x, w, dy)
    x = np.asarray(x, dtype=np.float32)
    lead = x.shape[:-1]
    kdim = x.shape[-1]
    x2 = contiguous_f32(x).reshape(-1, kdim)
    dy = np.asarray(dy, dtype=np.float32)
    dy2 = contiguous_f32(dy).reshape(-1, dy.shape[-1])
    w2 = contiguous_f32(w)
    m, n = dy2.shape

    # dx = int8_rotated_matmul(dy, wdq^T): contracted over N.
    blk_n = hadamard_block(n) if hadamard else 1

    def rotated_codes() -> tuple[np.ndarray, np.ndarray]:
        sw = _weight_form(w, ("scale",), lambda: weight_scale(w2))
        wq_t = np.empty((kdim, n), dtype=np.int8)  # (wdq rotated, quantized) laid out (K, N) = b'^T
        sb = np.empty(kdim, dtype=np.float32)
        if wq_t.size:
            _weight_rows_rotate_quantize(w2, sw, blk_n, hadamard, wq_t, sb)
        return wq_t, sb

    wq_t, sb = _weight_form(w, ("rotated", blk_n, bool(hadamard)), rotated_codes)
    dyq = np.empty((m, n), dtype=np.int8)
    sa = np.empty(m, dtype=np.float32)
    if dyq.size:
        _rows_rotate_quantize(dy2, blk_n, hadamard, dyq, sa)
    dx = _int8_gemm_rescaled(dyq, wq_t.T, sa, sb, np.float32(1.0 / blk_n))

    # dw = int8_rotated_matmul(xdq^T, dy): contracted over the M rows.
    blk_m = hadamard_block(m) if hadamard else 1
    xdq = np.empty((m, kdim), dtype=np.float32)  # xdq, made as it is rotated
    xq = np.empty((kdim, m), dtype=np.int8)  # ... and quantized, laid out as a' (K, M)
    s_x = np.empty(kdim, dtype=np.float32)
    dy_work = np.empty((m, n), dtype=np.float32)  # dy rotated along M
    dyq_m = np.empty((m, n), dtype=np.int8)  # ... and quantized: b'
    s_dy = np.empty(n, dtype=np.float32)
    sx = activation_scale(x2.reshape(-1))  # raises on an empty x, as the spec's does
    if xq.size:
        _cols_rotate_quantize(x2, xdq, blk_m, hadamard, s_x, xq, dq_scale=sx, transposed=True)
    if dyq_m.size:
        _cols_rotate_quantize(dy2, dy_work, blk_m, hadamard, s_dy, dyq_m)
    dw = _int8_gemm_rescaled(xq, dyq_m, s_x, s_dy, np.float32(1.0 / blk_m))
    return dx.reshape(lead + (kdim,)), dw
