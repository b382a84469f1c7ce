"""Causal grouped-query attention with an optional sliding window (``lockstep.spec.attention``).

The spec defines masked pairs as absent from every sum, so these kernels visit only
the allowed keys ``j in [i - W + 1, i]`` of each query, and the allowed queries
``i in [j, j + W - 1]`` of each key, and nothing else:

* ``m`` is the exact max over the allowed scores; ``l`` the lane tree over the
  allowed ``e`` with key j in lane ``j mod 32`` (``reduce.lane_tree`` from the first
  allowed key).
* The contractions (``o = p v``, ``dq = ds k``, ``dk = ds^T q``, ``dv = p^T do``)
  add the allowed terms only, in ascending order from +0.0.
* In the int8 recipe (``attention_forward_int8``, ``attention_backward_int8``; the
  kernels take an ``int8`` switch), ``o = p v`` sums int8 codes in int32
  (``_int8_pv_rows``: integer register tiles, ``tiles.int8_tile_*``) and ``dq = ds k``
  sums fixed-point terms in int64 (``_fixed_point_rows``: fixed-point register tiles,
  ``tiles.fixed_point_tile_*``): both exact, so their order is free; the values are
  quantized once per (batch, KV head) beforehand (``_value_quantize``).

Queries go in blocks of ``QB`` = 8 rows. Where ``fp.safe_products`` proves that no
flush can happen (and the operand that meets padding zeros is finite), a block's
contractions run as register tiles (``tiles``: scores and dp 8 queries x 32 keys over
the head dim; o, dq, dk, dv 4 rows x 64 columns over keys or queries; without AVX-512,
4 x 16 tiles of 8-lane vectors throughout, ``reduce.YMM_TILES``), with the
block's masked pairs as zeros, which ``tiles`` shows is the same as leaving them out.
Otherwise the block goes row by row, vectorized across outputs with ascending order
per output and every flush test. Tasks: (batch, head) in the forward; (batch, KV
group) in the backward, one pass that makes each block of p and ds, finishes its dq
rows and adds it into dk and dv.
"""

from __future__ import annotations

import numpy as np

from types import SimpleNamespace

import math

from lockstep.spec.attention import DQ_BITS, DQ_MIN_GRID, P_SCALE, compose_decode_attention
from lockstep.spec.checks import check_attention_shapes

from . import fp as _fp
from . import layout as _layout
from . import reduce as _reduce
from . import transcendental as _transcendental
from .quant import abs_bits_entered, quantize1, scale_from_abs_max_bits

from .fp import CANONICAL_NAN_BITS, EXPONENT_MASK, ONE, ZERO, bits, cn, entered, fl, from_bits, min_nonzero_abs, safe_products
from .reduce import LANES, YMM_TILES, accumulate_rows, lane_tree, row_max_total
from .tasks import kernel, parallel_kernel
from .tiles import (fixed_point_tile_4x32, fixed_point_tile_ymm, int8_tile_4x16, int8_tile_4x16_ymm, int8_tile_4x64,
                    tile_4x16, tile_4x16_ymm, tile_4x64, tile_8x32)
from .transcendental import exp_diff_row

QB = 8  # queries per block (the rows of a score tile)
KEY_PAD = 32  # score tiles run over keys in steps of 32: key-indexed buffers carry this much slack
KEY_CHUNK = 256  # keys per pass of ``_block_rows``' 16-column tiles
KV_BLOCKS = 4  # blocks of queries whose dk/dv terms the backward adds in one pass (tiles over 32 queries)

@kernel
def attention_scale(head_dim):
    """``1 / sqrt(Dh)``: ``fp.div(1, fp.sqrt(Dh))``."""
    return fl(ONE / fl(np.sqrt(np.float32(head_dim))))


@kernel
def _scores_row(qi, kt, lo, hi, fast, scale, s):
    """``s[j] = (sum_d qi[d] * kt[d, j]) * scale`` for j in [lo, hi), ascending d from +0.0
    (``reduce.accumulate_rows`` over the rows of kt, vectorized across j)."""
    ss = s[lo:hi]
    for j in range(ss.size):
        ss[j] = ZERO
    accumulate_rows(ss, qi, kt, lo, fast)
    for j in range(ss.size):
        ss[j] = fl(ss[j] * scale)


@kernel
def _accumulate(acc, w, x, fast):
    """``acc[d] = acc[d] + w * x[d]`` (product and sum rounded; flushed unless ``fast``)."""
    if fast:
        for d in range(acc.size):
            acc[d] = acc[d] + w * x[d]
    else:
        for d in range(acc.size):
            acc[d] = fl(acc[d] + fl(w * x[d]))


# ---------------------------------------------------------------- register-tiled blocks

@kernel
def _all_finite(x):
    """True when no element of the 1-D array is inf or NaN."""
    for i in range(x.size):
        if (bits(x[i]) & EXPONENT_MASK) == EXPONENT_MASK:
            return False
    return True


@kernel
def _block_min(a, lo, hi):
    """Smallest nonzero |a[r, lo:hi]| over the rows of a block (``fp.min_nonzero_abs``)."""
    mn = np.inf
    for r in range(a.shape[0]):
        mn = min(mn, min_nonzero_abs(a[r, lo:hi]))
    return mn


@kernel
def _tiled_width(dh):
    """Columns per 4-row tile over the head dim: 64 or 16 (0: the head dim does not tile); 16 where the
    CPU has 16 vector registers (``reduce.YMM_TILES``: a 4 x 64 tile's 32 accumulators would spill)."""
    if dh % 64 == 0 and not YMM_TILES:
        return 64
    if dh % 16 == 0:
        return 16
    return 0


@kernel
def _block_scores(qblk, ktp, klo, n, out):
    """``out[r, klo + c] = sum_d qblk[r, d] * ktp[d, klo + c]`` for r < QB and c < n rounded up to 32
    (unscaled, no flush tests). qblk: QB contiguous rows; ktp: (Dh, T + KEY_PAD), zero past T.
    Each 8 x 32 block is one tile, or four 4 x 16 tiles of 8-lane vectors (``reduce.YMM_TILES``)."""
    dh = qblk.shape[1]
    for c0 in range(0, n, 32):
        if YMM_TILES:
            for r in range(0, QB, 4):
                for c in range(0, 32, 16):
                    tile_4x16_ymm(out[0, klo + c0 + c:].ctypes.data + 4 * r * out.shape[1], out.shape[1],
                                  qblk.ctypes.data + 4 * r * dh, dh, 1,
                                  ktp[0, klo + c0 + c:].ctypes.data, ktp.shape[1], dh, False)
        else:
            tile_8x32(out[0, klo + c0:].ctypes.data, out.shape[1], qblk.ctypes.data, dh, 1,
                      ktp[0, klo + c0:].ctypes.data, ktp.shape[1], dh, False)


@kernel
def _pack_strips(rows, strips):
    """``strips[s, j, :] = rows[j, 16 s : 16 s + 16]``: rows (T, Dh) as Dh / 16 strips of 16 columns, each
    contiguous over the keys (strips (Dh / 16, T, 16)), the layout ``_block_rows``' 16-column tiles read."""
    for j in range(rows.shape[0]):
        src = rows[j]
        for st in range(strips.shape[0]):
            dst = strips[st, j]
            for c in range(16):
                dst[c] = src[16 * st + c]


@kernel
def _strips(dh, t, tiled_width):
    """The buffer ``_pack_strips`` fills, where the 16-column tiles run (a placeholder elsewhere)."""
    return np.empty((dh // 16, t, 16) if tiled_width == 16 else (1, 1, 16), dtype=np.float32)


@kernel
def _block_rows(a, klo, n, rows, strips, out):
    """``out[r, :] = sum_{c < n ascending} a[r, klo + c] * rows[c, :]`` for r < QB (no flush tests).

    rows: n contiguous rows of the head dim (values or keys from key klo on); strips: all of
    them packed by ``_pack_strips``, which the 16-column tiles read instead (one 64-byte line a
    key, in order, where rows Dh apart left the hardware prefetcher behind: with AVX2 stood in,
    a 4 x 16 tile ran at 105 GFLOP/s on contiguous columns and 64-76 on rows 512 bytes apart)."""
    dh = out.shape[1]
    w = _tiled_width(dh)
    if w == 64:
        for r0 in range(0, QB, 4):
            for d0 in range(0, dh, w):
                tile_4x64(out[r0, d0:].ctypes.data, dh, a[r0, klo:].ctypes.data, a.shape[1], 1,
                          rows[0, d0:].ctypes.data, dh, n, False)
        return
    # 16 columns: both 4-row tiles of a chunk of keys meet the same strip (KEY_CHUNK x 64 bytes) in
    # turn, so the second reads it from L1; each sum continues from the value stored at the end of
    # the previous chunk, in the same ascending order
    for c0 in range(0, n, KEY_CHUNK):
        cnt = min(KEY_CHUNK, n - c0)
        for d0 in range(0, dh, w):
            for r0 in range(0, QB, 4):
                tile_4x16(out[r0, d0:].ctypes.data, dh, a[r0, klo + c0:].ctypes.data, a.shape[1], 1,
                          strips[d0 // 16, klo + c0:].ctypes.data, 16, cnt, c0 > 0)


@kernel
def _block_contract(w, klo, khi, i0, nr, window, rows, strips, min_rows, tiled, buf, out):
    """``out[i0 + r] = sum_j w[r, j] * rows[j]`` over the allowed keys j of query i0 + r, ascending
    from +0.0, canonical, for r < nr: ``o = p v`` and ``dq = ds k`` of one block of queries.

    ``tiled``: the caller proved that no flush can happen anywhere in the block, so it runs
    as register tiles (``_block_rows``, masked pairs as zeros); else row by row, each row
    with its own flush proof (``accumulate_rows``). buf: (QB, Dh) scratch."""
    dh = out.shape[1]
    if tiled:
        _block_rows(w, klo, khi - klo, rows[klo:khi], strips, buf)
    else:
        for r in range(nr):
            i = i0 + r
            lo = max(0, i - window + 1)
            seg = w[r, lo:i + 1]
            acc = buf[r]
            for d in range(dh):
                acc[d] = ZERO
            accumulate_rows(acc, seg, rows[lo:i + 1], 0, safe_products(min_nonzero_abs(seg), min_rows))
    for r in range(nr):
        orow = out[i0 + r]
        for d in range(dh):
            orow[d] = cn(buf[r, d])


@kernel
def _block_keys_accumulate(a, klo, n, rows, acc):
    """``acc[klo + j, :] += a[r, klo + j] * rows[r, :]`` for r < a.shape[0] ascending, j < n rounded up to 4.

    The continuation of each key's ascending sum over (head, query), no flush tests;
    acc has 4 spare rows, a is zero past the keys it has (masked pairs are zeros)."""
    dh = acc.shape[1]
    w = _tiled_width(dh)
    nq = a.shape[0]
    for j0 in range(0, n, 4):
        for d0 in range(0, dh, w):
            if w == 64:
                tile_4x64(acc[klo + j0, d0:].ctypes.data, dh, a[0, klo + j0:].ctypes.data, 1, a.shape[1],
                          rows[0, d0:].ctypes.data, dh, nq, True)
            else:
                tile_4x16(acc[klo + j0, d0:].ctypes.data, dh, a[0, klo + j0:].ctypes.data, 1, a.shape[1],
                          rows[0, d0:].ctypes.data, dh, nq, True)


@kernel
def _flush_keys(slots, klos, khis, i0_first, dsbuf, pwbuf, qh, doh, dk_acc, dv_acc):
    """dk/dv's terms of ``slots`` consecutive full blocks of queries (from query ``i0_first`` on), held in
    dsbuf/pwbuf (block s in rows [s QB, (s + 1) QB), its keys [klos[s], khis[s])), added in one pass:
    ``_block_keys_accumulate`` over all their queries, ascending, on the union of their keys. Each
    block's rows are first zeroed outside its own keys within that union (below its klo, and from
    its khi + 4, where its score tiles left other values): zeros add nothing (``tiles``), so every
    key's sum receives the same terms in the same order as block by block, and each tile contracts
    over slots x QB queries instead of QB, its accumulators loaded and stored once for all of them."""
    klo = klos[0]
    khi = khis[slots - 1]
    for sl in range(slots):
        for r in range(sl * QB, (sl + 1) * QB):
            for jj in range(klo, klos[sl]):
                dsbuf[r, jj] = ZERO
                pwbuf[r, jj] = ZERO
            for jj in range(khis[sl] + 4, khi + 4):
                dsbuf[r, jj] = ZERO
                pwbuf[r, jj] = ZERO
    rows = slots * QB
    _block_keys_accumulate(dsbuf[:rows], klo, khi - klo, qh[i0_first:i0_first + rows], dk_acc)
    _block_keys_accumulate(pwbuf[:rows], klo, khi - klo, doh[i0_first:i0_first + rows], dv_acc)



# ---------------------------------------------------------------- the int8 recipe: int8 P.V, fixed-point dQ

@kernel
def _int8_pv_rows(p, klo, khi, i0, nr, window, vq, c, pq, acc, out):
    """``out[i0 + r, d] = float32(sum_j pq[r, j] * vq[j, d]) * c[d]`` over the allowed keys j of query
    i0 + r, ``pq = quantize(p, P_SCALE)``: ``spec.attention._int8_pv``. The sums are int32, exact in any
    order, so the block's rows run as integer register tiles over all its keys [klo, khi), the masked
    pairs as zero codes (they add nothing); a head dim that does not tile goes row by row.
    pq: (QB, T + KEY_PAD) int32 scratch; acc: (QB, Dh) int32 scratch."""
    dh = out.shape[1]
    for r in range(QB):
        row = pq[r]
        for j in range(klo, khi):
            row[j] = 0
        if r < nr:
            i = i0 + r
            for j in range(max(0, i - window + 1), i + 1):
                row[j] = np.int32(quantize1(p[r, j], P_SCALE))
    w = _tiled_width(dh)
    n = khi - klo
    if w == 0:
        for r in range(nr):
            for d in range(dh):
                acc[r, d] = 0
            for j in range(klo, khi):
                code = pq[r, j]
                if code != 0:
                    vrow = vq[j]
                    for d in range(dh):
                        acc[r, d] += code * np.int32(vrow[d])
    else:
        lda = pq.shape[1]
        for r0 in range(0, QB, 4):
            for d0 in range(0, dh, w):
                a_addr = pq[r0, klo:].ctypes.data
                b_addr = vq[klo, d0:].ctypes.data
                if YMM_TILES:
                    int8_tile_4x16_ymm(acc[r0, d0:].ctypes.data, dh, a_addr, lda, b_addr, dh, n)
                elif w == 64:
                    int8_tile_4x64(acc[r0, d0:].ctypes.data, dh, a_addr, lda, b_addr, dh, n)
                else:
                    int8_tile_4x16(acc[r0, d0:].ctypes.data, dh, a_addr, lda, b_addr, dh, n)
    for r in range(nr):
        orow = out[i0 + r]
        for d in range(dh):
            orow[d] = cn(fl(np.float32(acc[r, d]) * c[d]))


@kernel
def _fixed_point_width(dh):
    """Columns per fixed-point tile over the head dim: 32 (AVX-512), 8 (``reduce.YMM_TILES``), 0: no tile."""
    if not YMM_TILES and dh % 32 == 0:
        return 32
    if YMM_TILES and dh % 8 == 0:
        return 8
    return 0


@kernel
def _fixed_point_rows(ds, klo, khi, i0, nr, window, kg, k_max, k_finite, lbits, grid, inv, scaled, acc, out):
    """``dq = ds k`` of a block's rows in 64-bit fixed point: ``spec.attention.fixed_point_contract``
    (one grid per row from its largest |ds| and the head's largest |k|; int64 sums, exact in any order).
    A full block whose rows and keys are all finite runs as fixed-point register tiles over all its keys
    [klo, khi) (``tiles.fixed_point_tile_*``: masked pairs are zeros in ds and add nothing), from ds's rows
    scaled by their grids in float64 (exact: powers of two); otherwise row by row. grid (QB,) int64, inv
    (QB,) float64, scaled (QB, ds.shape[1]) float64 and acc (QB, Dh) int64 are scratch."""
    dh = out.shape[1]
    _, eb = math.frexp(np.float64(k_max))
    tiled = k_finite and nr == QB
    for r in range(nr):
        i = i0 + r
        finite = k_finite
        a_max = ZERO
        for j in range(max(0, i - window + 1), i + 1):
            x = ds[r, j]
            if (bits(x) & EXPONENT_MASK) == EXPONENT_MASK:
                finite = False
            else:
                a_max = max(a_max, abs(x))
        if finite:
            _, ea = math.frexp(np.float64(a_max))
            grid[r] = max(ea + eb - (DQ_BITS - lbits), DQ_MIN_GRID)
            inv[r] = math.ldexp(1.0, -grid[r])
        else:
            grid[r] = DQ_MIN_GRID - 1  # the row is the canonical NaN
            inv[r] = 1.0
            tiled = False
    w = _fixed_point_width(dh)
    if tiled and w > 0:
        lda = scaled.shape[1]
        for r in range(QB):
            src = ds[r]
            dst = scaled[r]
            for j in range(klo, khi):
                dst[j] = np.float64(src[j]) * inv[r]
        for r0 in range(0, QB, 4):
            for d0 in range(0, dh, w):
                if YMM_TILES:
                    fixed_point_tile_ymm(acc[r0, d0:].ctypes.data, dh, scaled[r0, klo:].ctypes.data, lda,
                                         kg[klo, d0:].ctypes.data, dh, khi - klo)
                else:
                    fixed_point_tile_4x32(acc[r0, d0:].ctypes.data, dh, scaled[r0, klo:].ctypes.data, lda,
                                          kg[klo, d0:].ctypes.data, dh, khi - klo)
    else:
        for r in range(nr):
            i = i0 + r
            for d in range(dh):
                acc[r, d] = 0
            if grid[r] < DQ_MIN_GRID:
                continue
            for j in range(max(0, i - window + 1), i + 1):
                wj = np.float64(ds[r, j])
                if wj != 0.0:
                    krow = kg[j]
                    for d in range(dh):
                        acc[r, d] += np.int64(np.rint((wj * np.float64(krow[d])) * inv[r]))
    for r in range(nr):
        orow = out[i0 + r]
        if grid[r] < DQ_MIN_GRID:
            for d in range(dh):
                orow[d] = from_bits(CANONICAL_NAN_BITS)
            continue
        g1 = min(max(grid[r], -126), 127)
        f1 = np.float32(math.ldexp(1.0, g1))
        f2 = np.float32(math.ldexp(1.0, grid[r] - g1))
        for d in range(dh):
            orow[d] = cn(fl(fl(np.float32(acc[r, d]) * f1) * f2))


def _kv_heads(v, *args) -> int:
    """Tasks of the value quantizer: one per (batch, KV head)."""
    return v.shape[0] * v.shape[1]


@parallel_kernel(_kv_heads)
def _value_quantize(t0, t1, v, sv, vq, vdq):
    """Per (batch, KV head): ``sv = value_scale(v)`` (max |v| per channel / 127, 0 -> 1), ``vq =
    quantize(v, sv)`` and ``vdq = vq * sv`` (``spec.attention._quantized_pv``)."""
    t, dh = v.shape[2], v.shape[3]
    for task in range(t0, t1):
        b = task // v.shape[1]
        g = task % v.shape[1]
        for d in range(dh):
            mb = np.uint32(0)
            for j in range(t):
                mb = max(mb, np.uint32(abs_bits_entered(v[b, g, j, d])))
            sv[b, g, d] = scale_from_abs_max_bits(mb)
        for j in range(t):
            for d in range(dh):
                r = quantize1(fl(v[b, g, j, d]), sv[b, g, d])
                vq[b, g, j, d] = np.int8(np.int32(r))
                vdq[b, g, j, d] = cn(fl(r * sv[b, g, d]))


def _quantized_values(v):
    """``(sv, vq, vdq)`` of entered values v (B, G, T, Dh)."""
    b, g, t, dh = v.shape
    sv = np.empty((b, g, dh), dtype=np.float32)
    vq = np.empty(v.shape, dtype=np.int8)
    vdq = np.empty(v.shape, dtype=np.float32)
    if v.size:
        _value_quantize(v, sv, vq, vdq)
    return sv, vq, vdq


_NO_VQ = np.zeros((1, 1, 1, 1), dtype=np.int8)  # the float path's placeholders for the int8 arguments
_NO_C = np.zeros((1, 1, 1), dtype=np.float32)


# ---------------------------------------------------------------- forward

def _query_heads(q, *args) -> int:
    """Tasks of the forward: one per (batch, head)."""
    return q.shape[0] * q.shape[1]


@parallel_kernel(_query_heads, weight=16)
def _forward_kernel(t0, t1, q, k, ktp, v, window, o, m_out, l_out, int8, vq, cs):
    """q (B, H, T, Dh); k, v (B, G, T, Dh); ktp (B, G, Dh, T + KEY_PAD) = k transposed, zero-padded.
    ``int8``: P.V as ``attention_forward_int8`` (vq (B, G, T, Dh) int8, cs (B, G, Dh) = P_SCALE * sv).

    Per block of QB queries [i0, i0 + QB): the allowed keys of the block's rows span
    [klo, khi) = [max(0, i0 - W + 1), i0 + QB). Scores, p and o are made for the whole
    block (tiles) where no flush can happen, else row by row (every flush test).
    """
    nb, nh, t, dh = q.shape
    ng = k.shape[1]
    rep = nh // ng
    scale = attention_scale(dh)
    tiled_width = _tiled_width(dh)
    min_k = np.empty(nb * ng)
    min_v = np.empty(nb * ng)
    v_finite = np.empty(nb * ng, dtype=np.bool_)
    for bg in range(nb * ng):
        min_k[bg] = min_nonzero_abs(k[bg // ng, bg % ng].reshape(-1))
        min_v[bg] = min_nonzero_abs(v[bg // ng, bg % ng].reshape(-1))
        v_finite[bg] = _all_finite(v[bg // ng, bg % ng].reshape(-1))
    width = t + KEY_PAD
    sc = np.zeros((QB, width), dtype=np.float32)  # scores, keys by absolute index
    p = np.zeros((QB, width), dtype=np.float32)  # probabilities, zero at the block's masked keys
    ob = np.empty((QB, dh), dtype=np.float32)
    lanes = np.empty(LANES, dtype=np.float32)
    pq = np.zeros((QB, width), dtype=np.int32)  # the block's P codes, zero at its masked keys
    acc32 = np.empty((QB, dh), dtype=np.int32)
    vs = _strips(dh, t, tiled_width)
    for bh in range(t0, t1):
        b = bh // nh
        h = bh % nh
        g = h // rep
        bg = b * ng + g
        qh = q[b, h]
        kg = ktp[b, g]
        vg = v[b, g]
        if tiled_width == 16 and not int8:
            _pack_strips(vg, vs)
        for i0 in range(0, t, QB):
            nr = min(QB, t - i0)
            klo = max(0, i0 - window + 1)
            khi = i0 + nr
            n = khi - klo
            q_min = min_nonzero_abs(qh[i0:khi].reshape(-1))
            tiled = nr == QB and tiled_width > 0 and safe_products(q_min, min_k[bg])
            if tiled:
                _block_scores(qh[i0:khi], kg, klo, n, sc)
            for r in range(nr):
                i = i0 + r
                lo = max(0, i - window + 1)
                hi = i + 1
                srow = sc[r, lo:hi]
                if tiled:
                    for jj in range(srow.size):
                        srow[jj] = fl(srow[jj] * scale)
                else:
                    _scores_row(qh[i], kg, lo, hi, safe_products(min_nonzero_abs(qh[i]), min_k[bg]), scale, sc[r])
                mx = row_max_total(srow)
                prow = p[r]
                for jj in range(klo, lo):
                    prow[jj] = ZERO  # masked keys of the block: zeros, the same as absent (see ``tiles``)
                for jj in range(hi, khi + KEY_PAD):
                    prow[jj] = ZERO
                seg = prow[lo:hi]
                exp_diff_row(srow, mx, seg)  # (separate in/out arrays: in-place would not vectorize)
                li = lane_tree(seg, lo, lanes)  # masked keys absent
                for jj in range(seg.size):
                    seg[jj] = fl(seg[jj] / li)
                m_out[b, h, i] = cn(mx)
                l_out[b, h, i] = cn(li)
            if int8:
                _int8_pv_rows(p, klo, khi, i0, nr, window, vq[b, g], cs[b, g], pq, acc32, o[b, h])
            else:
                tiled_o = tiled and v_finite[bg] and safe_products(_block_min(p, klo, khi), min_v[bg])
                _block_contract(p, klo, khi, i0, nr, window, vg, vs, min_v[bg], tiled_o, ob, o[b, h])


def _window(window, t: int) -> int:
    return int(window) if window is not None and window > 0 else t


def attention_forward(q, k, v, window: int | None = None):
    """``spec.attention.attention_forward``: returns ``(o, m, l)``."""
    return _forward(q, k, v, window, False)


def attention_forward_int8(q, k, v, window: int | None = None):
    """``spec.attention.attention_forward_int8``: returns ``(o, m, l)``."""
    return _forward(q, k, v, window, True)


def _forward(q, k, v, window, int8: bool):
    check_attention_shapes(q, k, v)
    (q, _, _), (k, _, _), (v, _, _) = (entered(a) for a in (q, k, v))
    b, h, t, dh = q.shape
    o = np.empty(q.shape, dtype=np.float32)
    m = np.empty((b, h, t), dtype=np.float32)
    l = np.empty((b, h, t), dtype=np.float32)
    if o.size == 0:
        return o, m, l
    ktp = np.zeros((b, k.shape[1], dh, t + KEY_PAD), dtype=np.float32)
    ktp[..., :t] = k.transpose(0, 1, 3, 2)
    if int8:
        sv, vq, _ = _quantized_values(v)
        cs = np.empty(sv.shape, dtype=np.float32)
        cs[...] = _fp.mul(P_SCALE, sv)
        _forward_kernel(q, k, ktp, v, _window(window, t), o, m, l, True, vq, cs)
    else:
        _forward_kernel(q, k, ktp, v, _window(window, t), o, m, l, False, _NO_VQ, _NO_C)
    return o, m, l


# ---------------------------------------------------------------- backward

def _kv_groups(do, q, k, *args) -> int:
    """Tasks of the backward: one per (batch, KV group)."""
    return k.shape[0] * k.shape[1]


@parallel_kernel(_kv_groups, weight=16)
def _backward_kernel(t0, t1, do, q, k, v, o, m, l, window, dq, dk, dv, int8, lbits):
    """One task per (batch, KV group g): dq rows of the group's heads, dk and dv of its keys.

    ``int8``: ``attention_backward_int8`` (v is then the dequantized values vdq): dv adds
    ``pdq = quantize(p, P_SCALE) * P_SCALE`` in place of p, dq is fixed point (``_fixed_point_rows``,
    ``lbits`` = bit length of T).

    dk[j] and dv[j] sum over (head h ascending, query i ascending): the loop order
    here (heads, then blocks of QB queries, then the block's rows), so each key's
    accumulator receives its terms in the spec's order while the blocks of p and ds
    are consumed as they are made (nothing else is stored). A first attempt adds
    into dk/dv without flush tests (tiles, which also needs q and do finite); if some
    product there could flush, the group is redone with them (``fast_kv`` False):
    the no-flush argument of ``fp.safe_products`` holds only for a whole sum.
    (One flat function: Numba re-optimizes every callee inside each caller, so
    nesting this body in a helper would double its compile time.)
    """
    nb, nh, t, dh = q.shape
    ng = k.shape[1]
    rep = nh // ng
    scale = attention_scale(dh)
    tiled_width = _tiled_width(dh)
    width = t + KEY_PAD
    sc = np.zeros((QB, width), dtype=np.float32)
    # p, ds and pdq of KV_BLOCKS blocks of queries: each block writes its slot, and dk/dv take the
    # slots' terms together (``_flush_keys``) where they run as tiles
    pbuf = np.zeros((QB * KV_BLOCKS, width), dtype=np.float32)
    dsbuf = np.zeros((QB * KV_BLOCKS, width), dtype=np.float32)
    pdbuf = np.zeros((QB * KV_BLOCKS, width), dtype=np.float32)  # pdq (int8): zero at the block's masked keys, as p
    pwbuf = pdbuf if int8 else pbuf  # the weights of dv: pdq in the int8 recipe
    klos = np.empty(KV_BLOCKS, dtype=np.int64)
    khis = np.empty(KV_BLOCKS, dtype=np.int64)
    acc64 = np.empty((QB, dh), dtype=np.int64)
    grid = np.empty(QB, dtype=np.int64)
    inv = np.empty(QB, dtype=np.float64)
    scaled = np.empty((QB, width), dtype=np.float64)
    d_rows = np.empty(t, dtype=np.float32)
    lanes = np.empty(LANES, dtype=np.float32)
    tmp = np.empty(dh, dtype=np.float32)
    qb = np.empty((QB, dh), dtype=np.float32)
    dk_acc = np.empty((t + 4, dh), dtype=np.float32)  # 4 spare rows: tiles of 4 keys may pass T
    dv_acc = np.empty((t + 4, dh), dtype=np.float32)
    ks = _strips(dh, t, tiled_width)
    for task in range(t0, t1):
        b = task // ng
        g = task % ng
        ktp = np.zeros((dh, width), dtype=np.float32)
        ktp[:, :t] = k[b, g].T
        vtp = np.zeros((dh, width), dtype=np.float32)
        vtp[:, :t] = v[b, g].T
        kg = k[b, g]
        vg = v[b, g]
        if tiled_width == 16 and not int8:
            _pack_strips(kg, ks)
        k_max = ZERO
        for x in kg.reshape(-1):
            if (bits(x) & EXPONENT_MASK) != EXPONENT_MASK:
                k_max = max(k_max, abs(x))
        min_k = min_nonzero_abs(kg.reshape(-1))
        min_v = min_nonzero_abs(vg.reshape(-1))
        k_finite = _all_finite(kg.reshape(-1))
        fast_kv = tiled_width > 0
        for h in range(g * rep, (g + 1) * rep):
            fast_kv = fast_kv and _all_finite(q[b, h].reshape(-1)) and _all_finite(do[b, h].reshape(-1))
        for attempt in range(2):
            ok = True
            dk_acc[:] = ZERO
            dv_acc[:] = ZERO
            for h in range(g * rep, (g + 1) * rep):
                if not ok:
                    break
                qh = q[b, h]
                doh = do[b, h]
                oh = o[b, h]
                lh = l[b, h]
                min_q = min_nonzero_abs(qh.reshape(-1))
                min_do = min_nonzero_abs(doh.reshape(-1))
                for i in range(t):  # D[i] = lane_tree_sum_d do[i, d] * o[i, d]
                    dor = doh[i]
                    orow = oh[i]
                    for d in range(dh):
                        tmp[d] = fl(dor[d] * orow[d])
                    d_rows[i] = lane_tree(tmp, 0, lanes)
                slots = 0  # blocks held for dk/dv (fast_kv)
                i0_first = 0
                for i0 in range(0, t, QB):
                    nr = min(QB, t - i0)
                    klo = max(0, i0 - window + 1)
                    khi = i0 + nr
                    n = khi - klo
                    full = nr == QB and tiled_width > 0
                    p = pbuf[slots * QB:(slots + 1) * QB]
                    ds = dsbuf[slots * QB:(slots + 1) * QB]
                    pd = pdbuf[slots * QB:(slots + 1) * QB]
                    tiled_s = full and safe_products(min_nonzero_abs(qh[i0:khi].reshape(-1)), min_k)
                    tiled_dp = full and safe_products(min_nonzero_abs(doh[i0:khi].reshape(-1)), min_v)
                    if tiled_s:
                        _block_scores(qh[i0:khi], ktp, klo, n, sc)
                    if tiled_dp:
                        _block_scores(doh[i0:khi], vtp, klo, n, ds)  # dp, unscaled
                    for r in range(nr):
                        i = i0 + r
                        lo = max(0, i - window + 1)  # allowed keys [lo, hi): the rest are absent
                        hi = i + 1
                        mi = fl(m[b, h, i])
                        li = fl(lh[i])
                        d_i = d_rows[i]
                        srow = sc[r, lo:hi]
                        if tiled_s:
                            for jj in range(srow.size):
                                srow[jj] = fl(srow[jj] * scale)
                        else:
                            _scores_row(qh[i], ktp, lo, hi, safe_products(min_nonzero_abs(qh[i]), min_k), scale, sc[r])
                        if not tiled_dp:
                            _scores_row(doh[i], vtp, lo, hi, safe_products(min_nonzero_abs(doh[i]), min_v), ONE, ds[r])
                        prow = p[r]
                        dsrow = ds[r]
                        for jj in range(klo, lo):
                            prow[jj] = ZERO  # masked keys of the block: zeros, the same as absent (``tiles``)
                            dsrow[jj] = ZERO
                        for jj in range(hi, khi + 4):
                            prow[jj] = ZERO
                            dsrow[jj] = ZERO
                        pv = prow[lo:hi]
                        exp_diff_row(srow, mi, pv)
                        for jj in range(pv.size):
                            pv[jj] = fl(pv[jj] / li)  # p
                        if int8:
                            pdrow = pd[r]
                            for jj in range(klo, khi + 4):
                                pdrow[jj] = ZERO
                            for jj in range(lo, hi):
                                pdrow[jj] = fl(quantize1(prow[jj], P_SCALE) * P_SCALE)
                        dsv = dsrow[lo:hi]
                        for jj in range(dsv.size):
                            dsv[jj] = fl(fl(pv[jj] * fl(dsv[jj] - d_i)) * scale)  # ds
                    # dq[i] = sum_{j allowed} ds[j] k[j, :], ascending j
                    ds_min = _block_min(ds[:nr], klo, khi)
                    if int8:
                        _fixed_point_rows(ds, klo, khi, i0, nr, window, kg, k_max, k_finite, lbits, grid, inv, scaled, acc64,
                                          dq[b, h])
                    else:
                        tiled_dq = full and k_finite and safe_products(ds_min, min_k)
                        _block_contract(ds, klo, khi, i0, nr, window, kg, ks, min_k, tiled_dq, qb, dq[b, h])
                    pw = pd if int8 else p  # the weights of dv: pdq in the int8 recipe
                    # dk[j] += ds[i, j] q[i], dv[j] += pw[i, j] do[i] for the block's rows i ascending
                    if fast_kv:
                        if not (full and safe_products(ds_min, min_q) and safe_products(_block_min(pw[:nr], klo, khi),
                                                                                         min_do)):
                            ok = False
                            break
                        if slots == 0:
                            i0_first = i0
                        klos[slots] = klo
                        khis[slots] = khi
                        slots += 1
                        if slots == KV_BLOCKS:
                            _flush_keys(slots, klos, khis, i0_first, dsbuf, pwbuf, qh, doh, dk_acc, dv_acc)
                            slots = 0
                    else:
                        for r in range(nr):
                            i = i0 + r
                            for j in range(max(0, i - window + 1), i + 1):
                                _accumulate(dk_acc[j], ds[r, j], qh[i], False)
                                _accumulate(dv_acc[j], pw[r, j], doh[i], False)
                if ok and slots > 0:  # the head's last blocks, before the next head's terms
                    _flush_keys(slots, klos, khis, i0_first, dsbuf, pwbuf, qh, doh, dk_acc, dv_acc)
            if ok:
                break
            fast_kv = False
        dk_out = dk[b, g]
        dv_out = dv[b, g]
        for j in range(t):
            for d in range(dh):
                dk_out[j, d] = cn(dk_acc[j, d])
                dv_out[j, d] = cn(dv_acc[j, d])


def attention_backward(do, q, k, v, o, m, l, window: int | None = None):
    """``spec.attention.attention_backward``: returns ``(dq, dk, dv)``."""
    return _backward(do, q, k, v, o, m, l, window, False)


def attention_backward_int8(do, q, k, v, o, m, l, window: int | None = None):
    """``spec.attention.attention_backward_int8``: returns ``(dq, dk, dv)``."""
    return _backward(do, q, k, v, o, m, l, window, True)


def _backward(do, q, k, v, o, m, l, window, int8: bool):
    check_attention_shapes(q, k, v, do, o, m, l)
    do, q, k, v, o = (entered(a)[0] for a in (do, q, k, v, o))
    b, h, t, dh = q.shape
    m, l = (entered(a)[0] for a in (m, l))
    dq = np.empty(q.shape, dtype=np.float32)
    dk = np.empty(k.shape, dtype=np.float32)
    dv = np.empty(v.shape, dtype=np.float32)
    if q.size == 0:
        dk[...] = 0.0
        dv[...] = 0.0
        return dq, dk, dv
    if int8:
        v = _quantized_values(v)[2]
    _backward_kernel(do, q, k, v, o, m, l, _window(window, t), dq, dk, dv, int8, t.bit_length())
    return dq, dk, dv


# ---------------------------------------------------------------- decode: one query over a KV cache

_DECODE_OPS = SimpleNamespace(mul=_fp.mul, sub=_fp.sub, div=_fp.div, exp=_transcendental.exp, max=_reduce.max,
                              lane_tree_sum=_reduce.lane_tree_sum, matmul=_reduce.matmul,
                              concat_last=_layout.concat_last)


def decode_attention(q, k, v, n: int, window: int | None = None):
    """``spec.attention.decode_attention``: the spec's composition (``compose_decode_attention``) of
    this backend's ops (mul, matmul, max, sub, exp, concat_last, lane_tree_sum, div)."""
    return compose_decode_attention(_DECODE_OPS, np.asarray(q), np.asarray(k), np.asarray(v), n, window)
