"""Reductions and contractions in the spec's orders (``lockstep.spec.reduce``).

* ``lane_tree_sum``: lane j (0..31) sums elements j, j+32, ... ascending from +0.0,
  then the lanes fold 16, 8, 4, 2, 1 (``lane_tree``: THE lane tree of this backend,
  which the norms, the loss, attention's softmax and ``sum_of_squares`` use; the
  fold alone is ``lane_fold``). Rows run in parallel.
* ``matmul``: per output element ascending over k from +0.0, ``acc = acc + a*b`` with
  product and sum each rounded and flushed (``matmul_accumulate``: the same, continued from
  given accumulators instead of +0.0). The loop order is: for each output row
  (in parallel), for k ascending, for n vectorized: ``acc[n] += a[m, k] * b[k, n]``,
  which keeps every element's ascending order while SIMD runs across outputs.
  A block of rows whose products provably never flush (``fp.safe_products``) runs
  without the flush tests (same bits, faster), as register tiles over blocks of 12 rows x 64
  columns (``tiles``: three of 4 x 64; eight of 6 x 16 where the CPU lacks AVX-512) when the
  block is full.
* ``int8_matmul``: exact, so it may use any order: ``int8gemm.matmul`` (AVX-512
  VNNI or AVX2 ``vpmaddwd`` where the CPU has it, else float32 BLAS on int8 values in
  exact K chunks).
* ``max``/``argmax``: exact in the total order; rows in parallel.
* ``column_sum``: rows added in ascending order from +0.0, so threads split the
  columns instead, each visiting every row in order (``add_rows_into``: THE column
  sum, which the norm's gain gradient and the embedding's backward use too).
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.checks import check_int8_operands, check_matmul_accumulate_shapes, check_matmul_shapes
from lockstep.spec.reduce import LANES

from . import int8gemm
from .fp import (CANONICAL_NAN_BITS, ONE, SAFE_PRODUCT, ZERO, cn, contiguous_f32, entered, fl, from_bits, min_nonzero_abs,
                 safe_products, total_key)
from .tasks import (block_bounds, column_block, column_blocks, column_bounds, contiguous, element_blocks, host_cpu_features,
                    inlined, kernel, parallel_kernel, rows)
from .tiles import PANEL_ROWS, prefetch_for_read, prefetch_for_write, tile_4x64_panel, tile_6x16_ymm_panel

# Without AVX-512 (16 vector registers of 8 lanes) a 4 x 64 tile's 32 accumulators would spill: each
# 12 x 64 block then runs as eight 6 x 16 tiles (``tiles.tile_6x16_ymm_panel``), the same sums in the same order.
# Read at each call and passed to the kernels, so both tilings are compiled and either can be tested.
YMM_TILES = not host_cpu_features().get("avx512f", False)


# ---------------------------------------------------------------- lane tree

@kernel
def lane_fold(lanes):
    """The fold of the 32 lanes: lane j += lane j + w for w = 16, 8, 4, 2, 1; returns lane 0."""
    w = LANES // 2
    while w >= 1:
        for j in range(w):
            lanes[j] = fl(lanes[j] + lanes[j + w])
        w //= 2
    return lanes[0]


@kernel
def lane_tree(row, first, lanes):
    """Lane-tree(32) sum of a 1-D float32 array whose element jj is element ``first + jj`` of the
    row the spec sums (lane ``(first + jj) mod 32``; elements flushed on entry); ``lanes`` is
    scratch (32,). ``first`` > 0: the row's first elements are absent (attention's masked
    keys), so their lanes start later; ``first`` = 0 is ``spec.reduce.lane_tree_sum``."""
    for j in range(LANES):
        lanes[j] = ZERO
    n = row.size
    off = first % LANES
    head = min(n, (LANES - off) % LANES)
    for jj in range(head):
        lanes[off + jj] = fl(lanes[off + jj] + fl(row[jj]))
    full = head + ((n - head) // LANES) * LANES
    for s in range(head, full, LANES):
        grp = row[s:s + LANES]
        for j in range(LANES):
            lanes[j] = fl(lanes[j] + fl(grp[j]))
    tail = row[full:]
    for j in range(tail.size):
        lanes[j] = fl(lanes[j] + fl(tail[j]))
    return lane_fold(lanes)


@kernel
def lane_tree_value(row):
    """The canonical lane-tree sum of one row (a float32, returned to Python as a float)."""
    lanes = np.empty(LANES, dtype=np.float32)
    return cn(lane_tree(row, 0, lanes))


@parallel_kernel(rows)
def _lane_tree_rows(t0, t1, x, out):
    lanes = np.empty(LANES, dtype=np.float32)
    for r in range(t0, t1):
        out[r] = cn(lane_tree(x[r], 0, lanes))


def lane_tree_sum(x, axis: int = -1) -> np.ndarray:
    """``spec.reduce.lane_tree_sum``."""
    x = np.moveaxis(np.asarray(x, dtype=np.float32), axis, -1)
    lead = x.shape[:-1]
    x2 = contiguous_f32(x).reshape(-1, x.shape[-1]) if x.size else np.zeros((int(np.prod(lead)), 0), np.float32)
    out = np.empty(x2.shape[0], dtype=np.float32)
    if out.size:
        _lane_tree_rows(x2, out)
    return out.reshape(lead)


# ---------------------------------------------------------------- float32 contraction

@kernel
def accumulate_rows(acc, w, rows, col0, fast):
    """``acc[d] = acc[d] + w[j] * rows[j, col0 + d]`` for j ascending: THE ascending contraction
    (every product and sum rounded and flushed; never an FMA), which ``contract_row``
    and attention's scores, ``o = p v`` and ``dq = ds k`` use.

    ``fast``: the caller proved (``safe_products``) that nothing flushes, so the flush
    tests are left out; the bits are the same. The fast loop takes four j per pass
    over acc (unroll-and-jam): each element still gets its terms one at a time in
    ascending j, with every product and sum rounded, but acc is loaded and stored a
    quarter as often. The loops run over zero-based slices (``rows[j, col0:col0 + dh]``):
    Numba then knows the indices are non-negative and leaves out its wraparound checks,
    which would otherwise keep LLVM from vectorizing.
    """
    dh = acc.size
    n = w.size
    n4 = n - n % 4
    if fast:
        for j in range(0, n4, 4):
            w0 = w[j]
            w1 = w[j + 1]
            w2 = w[j + 2]
            w3 = w[j + 3]
            x0 = rows[j, col0:col0 + dh]
            x1 = rows[j + 1, col0:col0 + dh]
            x2 = rows[j + 2, col0:col0 + dh]
            x3 = rows[j + 3, col0:col0 + dh]
            for d in range(dh):
                acc[d] = (((acc[d] + w0 * x0[d]) + w1 * x1[d]) + w2 * x2[d]) + w3 * x3[d]
        for j in range(n4, n):
            wj = w[j]
            x = rows[j, col0:col0 + dh]
            for d in range(dh):
                acc[d] = acc[d] + wj * x[d]
    else:
        for j in range(n):
            wj = w[j]
            x = rows[j, col0:col0 + dh]
            for d in range(dh):
                acc[d] = fl(acc[d] + fl(wj * x[d]))


@kernel
def contract_row(a_row, b, acc, fast):
    """``acc[n] = sum_k a_row[k] * b[k, n]``, ascending k from +0.0, canonical output
    (``accumulate_rows`` from a zeroed acc)."""
    for j in range(acc.size):
        acc[j] = ZERO
    accumulate_rows(acc, a_row, b, 0, fast)
    for j in range(acc.size):
        acc[j] = cn(acc[j])


ROW_BLOCK = PANEL_ROWS  # output rows per pass over b (12): b streams from L2 once per block, not once per row


@kernel
def contract_rows(a_rows, b, acc_rows):
    """``contract_row`` (fast path) for a block of rows: four k at a time, each k-step
    applied to every row of the block while b's four rows are in L1."""
    r = a_rows.shape[0]
    n = acc_rows.shape[1]
    for i in range(r):
        acc = acc_rows[i]
        for j in range(n):
            acc[j] = ZERO
    continue_rows(a_rows, b, acc_rows)


@kernel
def continue_rows(a_rows, b, acc_rows):
    """``contract_rows`` continued from acc_rows' current contents (fast path, canonical output)."""
    r = a_rows.shape[0]
    kk = a_rows.shape[1]
    n = acc_rows.shape[1]
    k4 = kk - kk % 4
    for k in range(0, k4, 4):
        b0 = b[k]
        b1 = b[k + 1]
        b2 = b[k + 2]
        b3 = b[k + 3]
        for i in range(r):
            a0 = a_rows[i, k]
            a1 = a_rows[i, k + 1]
            a2 = a_rows[i, k + 2]
            a3 = a_rows[i, k + 3]
            acc = acc_rows[i]
            for j in range(n):
                acc[j] = (((acc[j] + a0 * b0[j]) + a1 * b1[j]) + a2 * b2[j]) + a3 * b3[j]
    for k in range(k4, kk):
        bk = b[k]
        for i in range(r):
            av = a_rows[i, k]
            acc = acc_rows[i]
            for j in range(n):
                acc[j] = acc[j] + av * bk[j]
    for i in range(r):
        acc = acc_rows[i]
        for j in range(n):
            acc[j] = cn(acc[j])


K_PANEL = 512  # k per packed panel of b: 512 x 64 float32 (128 KiB) stays in L2 while a task's row blocks use it
K_PANEL_YMM = 256  # the same with 16 registers: a strip of the panel (256 x 16 float32, 16 KiB) stays in L1
PANEL_N = 64  # columns per packed panel of b, and of a block of accumulators
STRIP_YMM = 16  # columns per strip of a panel with 16 registers (one 6 x 16 tile's); 64 (the panel) otherwise
GROUP_BLOCKS = 64  # blocks whose rows of a are packed at once: 64 x 512 x 12 float32 (1.5 MiB) at most
PACK_AHEAD = 8  # rows of b ahead that packing asks the cache for


@inlined
def _strip(out_addr, ldo, a_addr, strip_addr, kb, cont, last, ymm):
    """One block's ROW_BLOCK rows of accumulators by one strip of a packed panel, over ``kb`` k, its rows of
    a packed too (``a_addr``: kb x ROW_BLOCK, k-major). With ``ymm`` (``YMM_TILES``: 16 vector registers)
    the strip is 16 columns and two 6 x 16 tiles of 8-lane vectors cover it (12 accumulators, two
    vectors of b and a broadcast); otherwise the strip is the whole 64-column panel and three 4 x 64
    tiles cover it (4 broadcasts of a per 16 vector products: measured faster than one 8 x 32 tile).
    ``last``: the last panel of k, whose sums are final: stored canonical."""
    if ymm:
        for r in range(0, ROW_BLOCK, 6):
            tile_6x16_ymm_panel(out_addr + 4 * r * ldo, ldo, a_addr + 4 * r, 0, 0, strip_addr, STRIP_YMM, kb, cont,
                                last)
    else:
        for r in range(0, ROW_BLOCK, 4):
            tile_4x64_panel(out_addr + 4 * r * ldo, ldo, a_addr + 4 * r, 0, 0, strip_addr, PANEL_N, kb, cont, last)


@inlined
def _pack_rows(a, r0, k0, kb, dst):
    """``dst[k, r] = a[r0 + r, k0 + k]`` for k < kb, r < ROW_BLOCK: a block's rows of a as the tiles read them."""
    for r in range(ROW_BLOCK):  # each row of a read in order (rows K apart would share L1 sets)
        src = a[r0 + r, k0:k0 + kb]
        for kk in range(kb):
            dst[kk, r] = src[kk]


@inlined
def _pack_panel(b, k0, kb, c0, w, strip, pack):
    """``pack[s, k, j] = b[k0 + k, c0 + s * strip + j]`` (pack (PANEL_N / strip, kb, strip), read flat),
    zero past b's last column: a panel of b as strips of ``strip`` columns, each contiguous."""
    for k in range(kb):  # each row of the panel read once, in order
        if k + PACK_AHEAD < kb:  # rows N apart: the hardware prefetchers miss them
            ahead = b[k0 + k + PACK_AHEAD, c0:].ctypes.data
            for j in range(0, w, 16):
                prefetch_for_read(ahead + 4 * j)
        src = b[k0 + k, c0:c0 + w]
        for s in range(PANEL_N // strip):
            d = pack[(s * kb + k) * strip:(s * kb + k + 1) * strip]
            lo = s * strip
            filled = min(strip, w - lo) if w > lo else 0  # columns of this strip inside b
            for j in range(filled):
                d[j] = src[lo + j]
            for j in range(filled, strip):
                d[j] = ZERO


@kernel
def _tiled_blocks(a, b, out, starts, count, pack, apack, tile, accumulate, ymm):
    """``contract_rows`` (fast path) for the row blocks ``starts[:count]`` (each ROW_BLOCK full rows)
    of ``out = a @ b`` (a (M, K), b (K, N), out (M, N)), with register tiles (``_strip``).

    In groups of up to GROUP_BLOCKS blocks (``_tiled_group``): b is packed a panel at a time, K_PANEL
    (K_PANEL_YMM) k by PANEL_N columns, as strips of columns each contiguous and zero-padded past
    the last column (``pack``), and every block of the group uses a strip before the next: b
    streams from memory once per group rather than once per block of rows, and a strip from L2
    into L1 once per strip rather than once per tile (with 16 registers a strip, 16 KiB, stays
    in L1: measured with AVX2 stood in, a 6 x 16 tile ran at 110 GFLOP/s with its b in L1 and at
    70 with b streaming from L2 256 bytes apart). The blocks' rows of a are packed once per
    panel of k (``apack``, K_PANEL x ROW_BLOCK each, k-major), so a tile reads its broadcasts
    from one contiguous stream rather than from 6 or 4 rows K elements apart (one general
    register each, and on a large K the same L1 set). Each output's sum still runs over
    ascending k in one accumulator: the tile starts from +0.0 (or out's contents when
    ``accumulate``) on the first panel and continues from the value it stored on the next, so
    the bits are those of one pass. No flush tests (the caller proved none can fire, so no sum is
    ever subnormal); canonical output: the tiles of the last panel store NaNs as the canonical one,
    all that ``cn`` would do to these sums (a pass over the output less)."""
    for g0 in range(0, count, apack.shape[0]):
        _tiled_group(a, b, out, starts[g0:min(count, g0 + apack.shape[0])], pack, apack, tile, accumulate, ymm)


@kernel
def _tiled_group(a, b, out, starts, pack, apack, tile, accumulate, ymm):
    """``_tiled_blocks`` for at most ``apack.shape[0]`` blocks."""
    kk = a.shape[1]
    n = out.shape[1]
    count = starts.size
    k_panel = K_PANEL_YMM if ymm else K_PANEL
    strip = STRIP_YMM if ymm else PANEL_N
    for k0 in range(0, kk, k_panel):
        kb = min(k_panel, kk - k0)
        cont = accumulate or k0 > 0
        last = k0 + kb == kk
        for i in range(count):
            _pack_rows(a, starts[i], k0, kb, apack[i])
        for c0 in range(0, n, PANEL_N):
            w = min(PANEL_N, n - c0)
            _pack_panel(b, k0, kb, c0, w, strip, pack)
            if w == PANEL_N:
                for s in range(PANEL_N // strip):
                    strip_addr = pack.ctypes.data + 4 * s * kb * strip
                    for i in range(count):
                        if i + 1 < count:  # the next block's accumulators
                            nxt = out[starts[i + 1], c0 + s * strip:].ctypes.data
                            for r in range(ROW_BLOCK):
                                prefetch_for_write(nxt + 4 * r * n)
                                prefetch_for_write(nxt + 4 * r * n + 4 * (strip - 1))
                        _strip(out[starts[i], c0 + s * strip:].ctypes.data, n, apack[i].ctypes.data, strip_addr, kb,
                               cont, last, ymm)
            else:  # the last columns: through a block-wide buffer
                for i in range(count):
                    r0 = starts[i]
                    if cont:
                        tile[:, :w] = out[r0 : r0 + ROW_BLOCK, c0:]
                    for s in range(PANEL_N // strip):
                        _strip(tile[:, s * strip:].ctypes.data, PANEL_N, apack[i].ctypes.data,
                               pack.ctypes.data + 4 * s * kb * strip, kb, cont, last, ymm)
                    out[r0 : r0 + ROW_BLOCK, c0:] = tile[:, :w]


@inlined
def _tile_buffers(tasks, kk):
    """The scratch of ``_tiled_blocks`` for up to ``tasks`` blocks over K = kk: b's packed panel, a group's
    packed rows of a, a block-wide edge tile, and the blocks' first rows."""
    return (np.empty(min(K_PANEL, kk) * PANEL_N, dtype=np.float32),
            np.empty((min(tasks, GROUP_BLOCKS), min(K_PANEL, kk), ROW_BLOCK), dtype=np.float32),
            np.empty((ROW_BLOCK, PANEL_N), dtype=np.float32), np.empty(tasks, dtype=np.int64))


def _row_blocks(a, *rest) -> int:
    """Tasks of ``_matmul_kernel``: blocks of ROW_BLOCK output rows of each batch element."""
    return a.shape[0] * -(-a.shape[1] // ROW_BLOCK)


@parallel_kernel(_row_blocks, weight=16)
def _matmul_kernel(t0, t1, a, b, out, ymm):
    """a (Bt, M, K), b (Bt, K, N), both canonical; out (Bt, M, N). Tasks: blocks of output rows.

    The full blocks of a batch element whose products provably never flush run together as
    register tiles over packed panels of b (``_tiled_blocks``); a last partial block on the
    fast path runs as ``contract_rows``; any other block row by row with the flush tests."""
    nb, m, kk = a.shape
    blocks = (m + ROW_BLOCK - 1) // ROW_BLOCK
    pack, apack, tile, starts = _tile_buffers(t1 - t0, kk)
    task = t0
    while task < t1:
        bi = task // blocks
        end = min(t1, (bi + 1) * blocks)
        min_b = min_nonzero_abs(b[bi].reshape(-1))
        count = 0
        for tk in range(task, end):
            r0 = (tk % blocks) * ROW_BLOCK
            r1 = min(m, r0 + ROW_BLOCK)
            fast = True
            for r in range(r0, r1):
                fast = fast and safe_products(min_nonzero_abs(a[bi, r]), min_b)
            if fast and r1 - r0 == ROW_BLOCK:
                starts[count] = r0
                count += 1
            elif fast:
                contract_rows(a[bi, r0:r1], b[bi], out[bi, r0:r1])
            else:
                for r in range(r0, r1):
                    contract_row(a[bi, r], b[bi], out[bi, r], safe_products(min_nonzero_abs(a[bi, r]), min_b))
        if count > 0:
            _tiled_blocks(a[bi], b[bi], out[bi], starts, count, pack, apack, tile, False, ymm)
        task = end


@inlined
def _entered_row_min(src, dst):
    """``dst = cn(src)`` (the accumulators as the spec enters them), returning ``min_nonzero_abs(dst)``
    (a second pass over a row still in L1)."""
    for j in range(src.size):
        dst[j] = cn(src[j])
    return min_nonzero_abs(dst)


@parallel_kernel(_row_blocks, weight=16)
def _accumulate_kernel(t0, t1, a, b, acc, out, ymm):
    """``_matmul_kernel`` continued from acc: a (1, M, K), b (1, K, N) canonical; acc (1, M, N) any float32,
    entered (``cn``) into out (1, M, N) row by row as the task's blocks are sorted into tiled and
    row-by-row ones, the flush test's minimum taken on the entered row (one pass over acc in place
    of a canonical copy, an in-place pass and a scan). A block runs without
    flush tests when its products provably never flush and its accumulators are multiples of
    2**-126 (every nonzero |acc| >= 2**-103: ``fp.safe_products``' argument then holds for the
    continued sum too)."""
    m, kk = a.shape[1], a.shape[2]
    blocks = (m + ROW_BLOCK - 1) // ROW_BLOCK
    min_b = min_nonzero_abs(b[0].reshape(-1))
    pack, apack, tile, starts = _tile_buffers(t1 - t0, kk)
    count = 0
    for task in range(t0, t1):
        r0 = (task % blocks) * ROW_BLOCK
        r1 = min(m, r0 + ROW_BLOCK)
        fast = True
        for r in range(r0, r1):
            min_acc = _entered_row_min(acc[0, r], out[0, r])
            fast = fast and safe_products(min_nonzero_abs(a[0, r]), min_b) and min_acc >= SAFE_PRODUCT
        if fast and r1 - r0 == ROW_BLOCK:
            starts[count] = r0
            count += 1
        elif fast:
            continue_rows(a[0, r0:r1], b[0], out[0, r0:r1])
        else:
            for r in range(r0, r1):
                row = out[0, r]
                accumulate_rows(row, a[0, r], b[0], 0, False)
                for j in range(row.size):
                    row[j] = cn(row[j])
    if count > 0:
        _tiled_blocks(a[0], b[0], out[0], starts, count, pack, apack, tile, True, ymm)


def canonical_copy(x, shape=None) -> np.ndarray:
    """``spec.fp.f32`` of x (optionally broadcast to ``shape`` first): a fresh canonical C array."""
    a = np.asarray(x, dtype=np.float32)
    if shape is not None and a.shape != tuple(shape):
        a = np.broadcast_to(a, shape)
    out = contiguous(a, copy=True)
    canon_inplace(out.reshape(-1))
    return out


@parallel_kernel(element_blocks)
def canon_inplace(t0, t1, x):
    for blk in range(t0, t1):
        lo, hi = block_bounds(blk, x.size)
        x_b = x[lo:hi]
        for i in range(hi - lo):
            x_b[i] = cn(x_b[i])


def matmul(a, b) -> np.ndarray:
    """``spec.reduce.matmul``: (..., M, K) x (..., K, N) -> (..., M, N), leading dims broadcast."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    check_matmul_shapes(a, b)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k = a.shape[-2:]
    n = b.shape[-1]
    out = np.empty(batch + (m, n), dtype=np.float32)
    if out.size == 0:
        return out
    if k == 0:
        out[...] = 0.0
        return out
    if b.ndim == 2 and a.shape == batch + (m, k):
        # One b for the whole batch (a linear layer): the batch's rows are one (B * M, K) matrix. Each
        # output is the same ascending sum, so the same bits, and b is not copied once per batch entry.
        a3 = entered(a)[0].reshape(1, -1, k)
        b3 = entered(b)[0].reshape(1, k, n)
        _matmul_kernel(a3, b3, out.reshape(1, -1, n), YMM_TILES)
        return out
    a3 = (entered(a)[0] if a.shape == batch + (m, k) else canonical_copy(a, batch + (m, k))).reshape(-1, m, k)
    b3 = (entered(b)[0] if b.shape == batch + (k, n) else canonical_copy(b, batch + (k, n))).reshape(-1, k, n)
    _matmul_kernel(a3, b3, out.reshape(-1, m, n), YMM_TILES)
    return out


def matmul_accumulate(acc, a, b) -> np.ndarray:
    """``spec.reduce.matmul_accumulate``: (M, N), (M, K), (K, N) -> (M, N), ``matmul`` continued from acc."""
    check_matmul_accumulate_shapes(acc, a, b)
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if a.shape[1] == 0 or a.shape[0] == 0 or b.shape[1] == 0:
        return canonical_copy(acc)
    acc = contiguous(np.asarray(acc, dtype=np.float32))
    out = np.empty(acc.shape, dtype=np.float32)
    a3 = entered(a)[0].reshape(1, *a.shape)
    b3 = entered(b)[0].reshape(1, *b.shape)
    _accumulate_kernel(a3, b3, acc.reshape(1, *acc.shape), out.reshape(1, *out.shape), YMM_TILES)
    return out


# ---------------------------------------------------------------- int8 contraction

def int8_matmul(a, b) -> np.ndarray:
    """``spec.reduce.int8_matmul``: exact (..., M, K) int8 x (..., K, N) int8 -> int32 (leading dims broadcast)."""
    a, b = check_int8_operands(a, b)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    nb = int(np.prod(batch, dtype=np.int64))  # not -1: reshape cannot infer it when K (or M, N) is 0
    a3 = np.broadcast_to(a, batch + (m, k)).reshape(nb, m, k)
    b3 = np.broadcast_to(b, batch + (k, n)).reshape(nb, k, n)
    out = np.empty((nb, m, n), dtype=np.int32)
    for i in range(out.shape[0]):
        out[i] = int8gemm.matmul(a3[i], b3[i])
    return out.reshape(batch + (m, n))


# ---------------------------------------------------------------- max / argmax

@inlined
def row_max_total(row):
    """``spec.reduce.max`` of one non-empty row, elements flushed on entry: the exact max in
    the total order (-0.0 < +0.0); any NaN -> canonical NaN. THE row max: ``max``, the loss's
    row max and attention's score max use it."""
    best = cn(row[0])
    bk = total_key(best)
    nan = False
    for j in range(row.size):
        v = cn(row[j])  # (cn, not fl: the same value here, and LLVM makes a loop 5x faster of it)
        if v != v:
            nan = True
        else:
            kv = total_key(v)
            if kv > bk:
                best = v
                bk = kv
    if nan:
        return from_bits(CANONICAL_NAN_BITS)
    return best


@parallel_kernel(rows)
def _max_rows(t0, t1, x, out):
    for r in range(t0, t1):
        out[r] = row_max_total(x[r])


@parallel_kernel(rows)
def _argmax_rows(t0, t1, x, out):
    n = x.shape[1]
    for r in range(t0, t1):
        idx = 0
        bk = np.int64(-(2**62))
        for j in range(n):
            v = cn(x[r, j])
            if v != v:
                idx = j
                break
            kv = total_key(v)
            if kv > bk:
                bk = kv
                idx = j
        out[r] = idx


def _rows_along(x, axis: int, what: str):
    x = np.moveaxis(np.asarray(x, dtype=np.float32), axis, -1)
    if x.shape[-1] == 0:
        raise ValueError(f"{what} of an empty axis")
    return contiguous_f32(x).reshape(-1, x.shape[-1]), x.shape[:-1]


def max(x, axis: int = -1) -> np.ndarray:  # noqa: A001 - the op is called max in every backend
    """``spec.reduce.max``: total order (-0.0 < +0.0), any NaN -> canonical NaN."""
    x2, lead = _rows_along(x, axis, "max")
    out = np.empty(x2.shape[0], dtype=np.float32)
    if out.size:
        _max_rows(x2, out)
    return out.reshape(lead)


def argmax(x, axis: int = -1) -> np.ndarray:
    """``spec.reduce.argmax``: first index of the total-order maximum; a NaN row gives its first NaN."""
    x2, lead = _rows_along(x, axis, "argmax")
    out = np.empty(x2.shape[0], dtype=np.int64)
    if out.size:
        _argmax_rows(x2, out)
    return out.reshape(lead)


# ---------------------------------------------------------------- column sum

@parallel_kernel(column_blocks)
def add_rows_into(t0, t1, x, ids, out, col_block):
    """``out[v] = +0.0 + x[p] + x[p'] + ...`` over the rows p with ``ids[p] = v``, ascending p
    (each add rounded, flushed; canonical result): x (N, D), ids (N,), out (V, D).

    THE column sum: ``column_sum`` is the case V = 1 (every id 0), the embedding's backward
    the case of the token ids. Tasks are blocks of ``col_block`` columns, each visiting
    every row in order.
    """
    v, d = out.shape
    for c in range(t0, t1):
        lo, hi = column_bounds(c, d, col_block)
        for r in range(v):
            acc = out[r, lo:hi]
            for j in range(acc.size):
                acc[j] = ZERO
        for p in range(ids.size):
            acc = out[ids[p], lo:hi]
            xr = x[p, lo:hi]
            for j in range(acc.size):
                acc[j] = fl(acc[j] + fl(xr[j]))
        for r in range(v):
            acc = out[r, lo:hi]
            for j in range(acc.size):
                acc[j] = cn(acc[j])


def column_sum(x) -> np.ndarray:
    """``spec.reduce.column_sum``: (..., D) -> (D,), rows added in ascending order from +0.0."""
    x = np.asarray(x, dtype=np.float32)
    x2 = contiguous_f32(x).reshape(int(np.prod(x.shape[:-1], dtype=np.int64)), x.shape[-1])  # (not -1: D may be 0)
    out = np.empty((1, x2.shape[1]), dtype=np.float32)
    if out.size:
        add_rows_into(x2, np.zeros(x2.shape[0], dtype=np.int64), out, column_block(x2.shape[1]))
    return out.reshape(-1)


# names the other modules share
__all__ = ["LANES", "lane_fold", "lane_tree", "lane_tree_value", "lane_tree_sum", "accumulate_rows", "contract_row",
           "continue_rows", "matmul_accumulate",
           "row_max_total", "matmul", "int8_matmul", "max", "argmax", "add_rows_into", "column_sum", "canonical_copy",
           "ONE", "ZERO"]
