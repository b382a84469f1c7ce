"""Causal grouped-query attention with an optional sliding window.

Legend: B batch, H query heads, G key/value heads (H = G * R, R query heads per
KV head; query head h reads KV head h // R), T positions, Dh head dimension.

Query i may attend key j iff ``j <= i`` and, with a window W, ``i - j < W``: the
allowed keys of query i are ``A(i) = [max(0, i - W + 1), i]`` (``[0, i]`` without a
window), and the queries that may attend key j are ``Q(j) = [j, min(T - 1, j + W - 1)]``.
Both are never empty (j = i is always allowed).

Masked terms are ABSENT. Every sum over keys or queries runs over the allowed ones
only; a masked pair contributes nothing, not a zero:

* a lane tree over keys (the softmax denominator ``l``): key j belongs to lane
  ``j mod 32`` (its absolute index, not its position in ``A(i)``); each lane adds its
  allowed keys in ascending j from +0.0, and a masked key is skipped by its lane --
  the same as adding nothing; then the lanes fold (16, 8, 4, 2, 1) as in
  ``reduce.lane_tree_sum``;
* an ascending contraction over keys (``o = p v``, ``dq = ds k``) or over
  (head, query) pairs (``dk = ds^T q``, ``dv = p^T do``): the accumulator starts at
  +0.0 and adds the allowed terms only, in ascending order.

Absent, not ``+0.0`` weights: a ``+0.0`` term after a partial sum that flushed to
-0.0 would make it +0.0, and ``0 * inf`` would make a masked infinite value NaN, so
every kernel would have to visit the masked pairs to reproduce them.

The int8 recipe (``attention_forward_int8``, ``attention_backward_int8``) keeps the
scores, the mask and the softmax above and changes two sums, both exact in any
order: ``o = p v`` is an int8 x int8 -> int32 contraction (p quantized with the fixed
scale ``P_SCALE = 1/127``, v per (batch, KV head, channel)) with one rescale, and
``dq = ds k`` is summed in 64-bit fixed point (``fixed_point_contract``: one grid per
query row, int64 sums, one conversion back).
"""

from __future__ import annotations

import numpy as np

from types import SimpleNamespace

from . import fp
from .checks import check_attention_shapes  # noqa: F401 - re-exported: the shared input check
from .checks import check_decode_attention
from .layout import concat_last
from .quant import QMAX, _nonzero_scale, quantize
from .reduce import LANES, int8_matmul, lane_tree_sum, matmul
from .reduce import max as row_max
from .transcendental import exp
from . import shapes as S
from .kinds import F32, HostInt, Window, op

NEG_INF = np.float32(-np.inf)


def attention_scale(head_dim: int) -> np.float32:
    """``1 / sqrt(Dh)`` in float32: ``fp.div(1, fp.sqrt(Dh))``."""
    return fp.div(np.float32(1.0), fp.sqrt(np.float32(head_dim)))[()]


def attention_mask(seq_len: int, window: int | None) -> np.ndarray:
    """Boolean (T, T): True where query i may attend key j."""
    i = np.arange(seq_len)[:, None]
    j = np.arange(seq_len)[None, :]
    allowed = j <= i
    if window is not None and window > 0:
        allowed &= (i - j) < window
    return allowed


def _expand_kv(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, G, T, Dh) -> (B, H, T, Dh): query head h sees KV head h // (H / G) (a copy)."""
    rep = n_heads // x.shape[1]
    return np.repeat(x, rep, axis=1)


def _scores(q, k, window):
    """Scaled scores (B, H, T, T) with masked entries at -inf, and the mask."""
    h, t, dh = q.shape[1], q.shape[2], q.shape[3]
    kh = _expand_kv(k, h)
    s = fp.mul(matmul(q, np.swapaxes(kh, -1, -2)), attention_scale(dh))
    allowed = attention_mask(t, window)
    return np.where(allowed, s, NEG_INF), allowed


def _probabilities(s, allowed, m, l):
    """``p = exp(s - m) / l`` at the allowed pairs (the forward's order); masked entries are
    +0.0 placeholders that no sum reads."""
    e = np.where(allowed, exp(fp.sub(s, m[..., None])), np.float32(0.0))
    return fp.div(e, l[..., None])


def _softmax(q, k, v, window):
    """The forwards' shared start: the float32 operands, then ``p``, ``m``, ``l`` and the mask.

    ``m`` is each row's max score, ``e = exp(s - m)`` at the allowed pairs (+0.0 elsewhere),
    ``l`` its lane tree and ``p = e / l``.
    """
    check_attention_shapes(q, k, v)
    q, k, v = fp.f32(q), fp.f32(k), fp.f32(v)
    s, allowed = _scores(q, k, window)
    m = row_max(s, axis=-1)
    e = np.where(allowed, exp(fp.sub(s, m[..., None])), np.float32(0.0))
    l = lane_tree_sum(e)
    return q, k, v, fp.div(e, l[..., None]), m, l, allowed


def _rebuilt_softmax(do, q, k, v, o, m, l, window):
    """The backwards' shared start: the float32 operands and ``p`` rebuilt from the kept ``m`` and
    ``l``, bit for bit the forward's, with the mask."""
    check_attention_shapes(q, k, v, do, o, m, l)
    do, q, k, v, o = (fp.f32(a) for a in (do, q, k, v, o))
    s, allowed = _scores(q, k, window)
    return do, q, k, v, o, _probabilities(s, allowed, fp.f32(m), fp.f32(l)), allowed


def _score_gradient(do, o, p, v, n_heads: int, head_dim: int):
    """``ds = p * (dO V^T - rowsum(dO * O)) * scale``, the backwards' gradient of the scaled scores
    (``v``: the values the forward contracted with, dequantized in the int8 recipe)."""
    dp = matmul(do, np.swapaxes(_expand_kv(v, n_heads), -1, -2))
    drow = lane_tree_sum(fp.mul(do, o))
    return fp.mul(fp.mul(p, fp.sub(dp, drow[..., None])), attention_scale(head_dim))


def _allowed_contract(a, b, allowed):
    """``out[..., m, n] = sum over k with allowed[m, k] of a[..., m, k] * b[..., k, n]``.

    a: (..., M, K), b: (..., K, N), allowed: (M, K) bool. Per output element: from
    +0.0, ascending k, ``acc = acc + a*b`` (product rounded, then sum rounded) for the
    allowed k only; a masked k leaves acc as it is (absent, not a zero term).
    """
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    acc = np.zeros(batch + (a.shape[-2], b.shape[-1]), dtype=np.float32)
    for k in range(a.shape[-1]):
        summed = fp.add(acc, fp.mul(a[..., :, k : k + 1], b[..., k : k + 1, :]))
        acc = np.where(allowed[:, k : k + 1], summed, acc)
    return acc


@op(S.attention_forward, S.attention_pairs)
def attention_forward(q: F32, k: F32, v: F32, window: Window = None) -> tuple[F32, F32, F32]:
    """Softmax attention: (B, H, T, Dh), (B, G, T, Dh), (B, G, T, Dh) -> ``(o, m, l)``.

    Order::

        s[i, j] = (sum_d q[i, d] * k[j, d]) * scale   # contraction ascending over d, then one product
        m[i]    = max_{j in A(i)} s[i, j]              # exact
        e[i, j] = exp(s[i, j] - m[i])                  # spec exp, j in A(i)
        l[i]    = lane_tree_sum_{j in A(i)} e[i, j]    # key j in lane j mod 32; masked keys absent
        p[i, j] = e[i, j] / l[i]
        o[i, :] = sum_{j in A(i)} p[i, j] * v[j, :]    # ascending j from +0.0, masked keys absent

    with ``scale = attention_scale(Dh)``. ``m`` and ``l`` (B, H, T) are kept so the
    backward can rebuild ``p`` bit for bit. (The code sets masked scores to -inf,
    which never wins the max, and masked e to +0.0, which a lane of non-negative
    values adds as nothing: the same bits as skipping them.)
    """
    q, k, v, p, m, l, allowed = _softmax(q, k, v, window)
    o = _allowed_contract(p, _expand_kv(v, q.shape[1]), allowed)
    return o, m, l


def _group_sum_contract(a, b, n_kv: int, allowed):
    """``out[g, j, :] = sum over (h in group g, i in Q(j)) of a[h, i, j] * b[h, i, :]``.

    a: (B, H, T, T), b: (B, H, T, X) -> (B, G, T, X). The contracted index is
    ``(h, i)`` with h major: ascending over the group's heads, and within a head
    ascending over the allowed queries i of key j (masked pairs absent).
    """
    bsz, h, t, _ = a.shape
    rep = h // n_kv
    a = a.reshape(bsz, n_kv, rep, t, t)
    a = np.transpose(a, (0, 1, 4, 2, 3)).reshape(bsz, n_kv, t, rep * t)  # (B, G, Tj, R*Ti)
    b = b.reshape(bsz, n_kv, rep * t, b.shape[-1])
    return _allowed_contract(a, b, np.tile(allowed.T, (1, rep)))  # (Tj, R*Ti): allowed[i, j] per head


@op(S.attention_backward, S.attention_backward_pairs)
def attention_backward(do: F32, q: F32, k: F32, v: F32, o: F32, m: F32, l: F32,
                       window: Window = None) -> tuple[F32, F32, F32]:
    """Gradients of ``attention_forward``: returns ``(dq, dk, dv)``.

    ``p`` is rebuilt from the saved ``m`` and ``l`` exactly as in the forward. Then::

        dp[i, j]  = sum_d do[i, d] * v[j, d]          # ascending over d (j in A(i))
        D[i]      = lane_tree_sum_d do[i, d] * o[i, d]
        ds[i, j]  = (p[i, j] * (dp[i, j] - D[i])) * scale    # j in A(i)
        dq[i, :]  = sum_{j in A(i)} ds[i, j] * k[j, :]       # ascending j from +0.0
        dk[g, j]  = sum_{h, i in Q(j)} ds[h, i, j] * q[h, i] # (h, i) ascending, h major, h in group g
        dv[g, j]  = sum_{h, i in Q(j)} p[h, i, j] * do[h, i] # likewise

    Masked pairs are absent from every sum (module docstring).
    """
    do, q, k, v, o, p, allowed = _rebuilt_softmax(do, q, k, v, o, m, l, window)
    h, dh, g = q.shape[1], q.shape[3], k.shape[1]
    ds = _score_gradient(do, o, p, v, h, dh)
    dq = _allowed_contract(ds, _expand_kv(k, h), allowed)
    dk = _group_sum_contract(ds, q, g, allowed)
    dv = _group_sum_contract(p, do, g, allowed)
    return dq, dk, dv


# ---------------------------------------------------------------- the int8 recipe: int8 P.V, fixed-point dQ

P_SCALE = fp.div(np.float32(1.0), QMAX)[()]  # probabilities lie in [0, 1]: 127 codes, q = rint(p / (1/127))
DQ_BITS = 62  # every fixed-point sum of dq stays below 2**62 in magnitude (int64 holds 2**63 - 1)
DQ_MIN_GRID = -252  # the finest grid used: 2**-252 is below the smallest product of two normal float32


def value_scale(v) -> np.ndarray:
    """Per (batch, KV head, channel): ``max_j |v[b, g, j, d]| / 127`` over all T positions (exact
    max), then a scale that is 0 after the flush becomes 1 (``quant._nonzero_scale``). (B, G, T, Dh)
    -> (B, G, Dh).

    Why per channel of each head: the scale must be the same for every term of one output's sum,
    so that the sum is one exact int32 contraction followed by one rescale; ``o[i, d]`` sums over
    the keys j, so the scale may vary with (b, g, d) but not with j. Per channel is the finest such
    granularity (a channel with small values keeps its resolution next to a large one); a scale
    per key row or per block of keys would need a float sum of rescaled partial sums, in an order.
    Like the per-tensor activation scale of ``quant.activation_scale``, it is taken over all T
    positions of the sequence (so an inf or NaN value makes its channel's scale, and that
    channel's output for every query, non-finite).
    """
    v = fp.f32(v)
    return _nonzero_scale(fp.div(row_max(fp.abs(v), axis=-2), QMAX))


def _quantized_pv(p, v):
    """``(pq, vq, sv)``: ``pq = quantize(p, P_SCALE)`` (codes 0 .. 127; the masked +0.0 placeholders
    give 0), ``sv = value_scale(v)`` (B, G, Dh) and ``vq = quantize(v, sv)`` (B, G, T, Dh)."""
    sv = value_scale(v)
    return quantize(p, P_SCALE), quantize(v, sv[..., None, :]), sv


def _int8_pv(pq, vq, sv, n_heads):
    """``o = float32(int8_matmul(pq, vq)) * (P_SCALE * sv[d])``: the exact int32 contraction over
    the keys (a masked key's code is 0, so including it adds nothing: in integers absent and zero
    are the same) and one rounded product per output."""
    acc = int8_matmul(pq, _expand_kv(vq, n_heads))                       # (B, H, T, Dh) int32, exact
    c = fp.mul(P_SCALE, _expand_kv(sv[..., None, :], n_heads))          # (B, H, 1, Dh)
    return fp.mul(acc.astype(np.float32), c)


@op(S.attention_forward, S.attention_pairs)
def attention_forward_int8(q: F32, k: F32, v: F32, window: Window = None) -> tuple[F32, F32, F32]:
    """Softmax attention with P.V as an int8 contraction (the int8 recipe): returns ``(o, m, l)``.

    ``s``, ``m``, ``e``, ``l`` and ``p`` are ``attention_forward``'s, bit for bit. Then::

        pq[i, j] = quantize(p[i, j], P_SCALE)          # P_SCALE = fp.div(1, 127): rint(p / P_SCALE),
                                                       # ties to even, codes 0 .. 127
        sv[d]    = value_scale(v)                      # per (b, g, d): max_j |v[j, d]| / 127, 0 -> 1
        vq[j, d] = quantize(v[j, d], sv[d])            # -127 .. 127
        acc[i, d] = sum_{j in A(i)} pq[i, j] * vq[j, d]    # int32, exact in any order
        o[i, d]  = float32(acc[i, d]) * (P_SCALE * sv[d])  # int32 -> float32 to nearest even,
                                                           # then one rounded product

    ``float32(acc)`` is exact while ``|acc| <= 2**24`` (T <= 1040 allowed keys); an int32 cannot
    overflow while T < 2**31 / 127**2 (133,143 keys). The probabilities need no computed scale:
    they lie in [0, 1], so a fixed 1/127 gives them all 127 steps. ``m`` and ``l`` are kept, as in
    the float forward, for ``attention_backward_int8``.
    """
    q, k, v, p, m, l, allowed = _softmax(q, k, v, window)
    pq, vq, sv = _quantized_pv(p, v)
    return _int8_pv(pq, vq, sv, q.shape[1]), m, l


def int64_to_float32(x) -> np.ndarray:
    """int64 -> float32, rounded once to nearest (ties to even), by integer arithmetic (|x| < 2**63).

    The magnitude keeps its top 24 significant bits; the bits shifted out decide the rounding
    (more than half: up; exactly half: to the even one). The same as a correctly rounded hardware
    conversion (``cvtsi2ss``, ``scvtf``, ``cvt.rn.f32.s64``), written out so nothing else decides.
    """
    x = np.asarray(x, dtype=np.int64)
    a = np.abs(x).astype(np.uint64)
    nbits = np.zeros(a.shape, dtype=np.int64)
    for b in range(64):
        nbits += (a >> np.uint64(b)) != 0
    shift = np.maximum(nbits - 24, 0).astype(np.uint64)
    q = a >> shift
    rem = a - (q << shift)
    half = np.where(shift > 0, np.uint64(1) << np.maximum(shift, np.uint64(1)) - np.uint64(1), np.uint64(0))
    up = (shift > 0) & ((rem > half) | ((rem == half) & ((q & np.uint64(1)) == 1)))
    q = q + up.astype(np.uint64)                                  # at most 2**24: exact in float32
    mag = np.ldexp(q.astype(np.float64), shift.astype(np.int64))  # exact: q * 2**shift, below 2**64
    return np.where(x < 0, -mag, mag).astype(np.float32)


def dq_grid_exponent(a_max, b_max, n_terms: int) -> np.ndarray:
    """The grid of a fixed-point row: the exponent G of its unit ``2**G`` (int64 array).

    ``a_max``, ``b_max``: float32 arrays (broadcasting) of the largest |a| of the row's terms and
    the largest |b| they meet; with ``a_max = fa * 2**ea`` and ``b_max = fb * 2**eb`` (``frexp``:
    fa, fb in [0.5, 1), exact), every term satisfies ``|a * b| < 2**(ea + eb)``. With
    ``L = bit_length(n_terms)`` (``n_terms < 2**L``)::

        G = max(ea + eb - (DQ_BITS - L), DQ_MIN_GRID)      # DQ_BITS = 62, DQ_MIN_GRID = -252

    So each term in grid units is below ``2**(62 - L)`` and rounds to at most that, and any sum of
    at most ``n_terms`` of them is at most ``n_terms * 2**(62 - L) < 2**62``: no int64 sum can
    overflow, in any order. (A zero a_max or b_max makes every term 0; G is then irrelevant.)
    G lies in [-252, 256 - 30] for finite float32 and n_terms < 2**32.
    """
    _, ea = np.frexp(np.asarray(a_max, dtype=np.float64))
    _, eb = np.frexp(np.asarray(b_max, dtype=np.float64))
    lbits = int(n_terms).bit_length()
    return np.maximum(ea.astype(np.int64) + eb.astype(np.int64) - (DQ_BITS - lbits), DQ_MIN_GRID)


def _pow2_f32(e) -> np.ndarray:
    """``2**e`` as float32 for integer e in [-126, 127] (exact)."""
    return np.ldexp(np.float32(1.0), np.asarray(e, dtype=np.int64)).astype(np.float32)


def fixed_point_contract(a, b, allowed):
    """``out[..., m, n] = sum over k with allowed[m, k] of a[..., m, k] * b[..., k, n]`` in 64-bit
    fixed point: a (..., M, K), b (..., K, N), allowed (M, K) -> (..., M, N) float32.

    Row m of each batch slice has its own grid ``2**G[..., m]`` with
    ``G = dq_grid_exponent(max_{allowed k} |a[m, k]|, max_{k, n} |b[k, n]|, K)``. Then::

        c[m, k, n] = round_half_even(a[m, k] * b[k, n] * 2**-G)   # the exact product (float64 holds
                                                                   # it: 24 x 24 bits), scaled
                                                                   # exactly, rounded once: int64
        S[m, n]    = sum over allowed k of c[m, k, n]              # int64, exact in any order
        r          = int64_to_float32(S)                           # one rounding, ties to even
        out[m, n]  = (r * 2**G1) * 2**G2                           # G1 = clip(G, -126, 127),
                                                                   # G2 = G - G1: spec products

    The two products are exact except where the result leaves the normal range: r is an integer,
    so ``r * 2**-126`` is 0 or normal, and ``r * 2**127`` overflows only where ``r * 2**G`` does;
    the last product rounds then flushes (``fp.mul``). A row whose a (allowed) or b holds an inf
    or NaN is the canonical NaN in every column.

    Worst error against the exact sum (float64 is exact enough to check it): each term is off
    by at most half a unit, ``2**(G - 1)``, so ``|S * 2**G - exact| <= n * 2**(G - 1)`` for n
    allowed terms; ``2**G < 2**(ea + eb - 62) * 2K <= 8 K * a_max * b_max * 2**-62``; then one
    rounding to float32 (half an ulp of the result) and the flush below 2**-126. For K = 4096 the
    sum error is below ``2**-36 * a_max * b_max``, far below a float32 ascending sum's.
    """
    a, b = fp.f32(a), fp.f32(b)
    kdim = a.shape[-1]
    finite_a = np.where(allowed, np.isfinite(a), True).all(axis=-1)                 # (..., M)
    finite_b = np.isfinite(b).all(axis=(-2, -1))                                    # (...)
    a_abs = np.where(allowed & np.isfinite(a), np.abs(a), np.float32(0.0))
    b_abs = np.where(np.isfinite(b), np.abs(b), np.float32(0.0))
    a_max = a_abs.max(axis=-1) if kdim else np.zeros(a.shape[:-1], np.float32)     # exact
    b_max = b_abs.reshape(b.shape[:-2] + (-1,)).max(axis=-1) if b.size else np.zeros(b.shape[:-2], np.float32)
    grid = dq_grid_exponent(a_max, b_max[..., None], kdim)                          # (..., M)
    inv = np.ldexp(1.0, -grid)[..., None]                                           # (..., M, 1) exact
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    acc = np.zeros(batch + (a.shape[-2], b.shape[-1]), dtype=np.int64)
    a64 = np.where(np.isfinite(a), a, np.float32(0.0)).astype(np.float64)
    b64 = np.where(np.isfinite(b), b, np.float32(0.0)).astype(np.float64)
    for k in range(kdim):
        c = np.rint((a64[..., :, k : k + 1] * b64[..., k : k + 1, :]) * inv)       # exact, then one rounding
        acc += np.where(allowed[:, k : k + 1], c, 0.0).astype(np.int64)
    r = int64_to_float32(acc)
    g1 = np.clip(grid, -126, 127)
    out = fp.mul(fp.mul(r, _pow2_f32(g1)[..., None]), _pow2_f32(grid - g1)[..., None])
    bad = ~(finite_a & finite_b[..., None])
    return np.where(bad[..., None], fp.from_bits(fp.CANONICAL_NAN_BITS), out).astype(np.float32)


@op(S.attention_backward, S.attention_backward_pairs)
def attention_backward_int8(do: F32, q: F32, k: F32, v: F32, o: F32, m: F32, l: F32,
                            window: Window = None) -> tuple[F32, F32, F32]:
    """Straight-through gradients of ``attention_forward_int8``: returns ``(dq, dk, dv)``.

    The quantizers pass gradients through unchanged, with the dequantized operands the forward
    used (``pdq = float32(pq) * P_SCALE``, ``vdq = float32(vq) * sv[d]``, one rounded product
    each; pq, vq, sv as in the forward, from the rebuilt p and from v)::

        dp[i, j]  = sum_d do[i, d] * vdq[j, d]        # ascending over d (j in A(i))
        D[i]      = lane_tree_sum_d do[i, d] * o[i, d]
        ds[i, j]  = (p[i, j] * (dp[i, j] - D[i])) * scale    # j in A(i): the float p, as the softmax
        dq        = fixed_point_contract(ds, k, allowed)      # 64-bit fixed point, any order
        dk[g, j]  = sum_{h, i in Q(j)} ds[h, i, j] * q[h, i]  # (h, i) ascending, h major
        dv[g, j]  = sum_{h, i in Q(j)} pdq[h, i, j] * do[h, i]

    ``dq`` of query row (b, h, i) uses the grid of ``fixed_point_contract`` with ``a_max`` the
    row's largest |ds| over its allowed keys and ``b_max`` the largest |k| of KV head (b, g) over
    all T positions and channels, and K = T.
    """
    do, q, k, v, o, p, allowed = _rebuilt_softmax(do, q, k, v, o, m, l, window)
    h, dh, g = q.shape[1], q.shape[3], k.shape[1]
    pq, vq, sv = _quantized_pv(p, v)
    pdq = fp.mul(pq.astype(np.float32), P_SCALE)
    vdq = fp.mul(vq.astype(np.float32), sv[..., None, :])
    ds = _score_gradient(do, o, p, vdq, h, dh)
    dq = fixed_point_contract(ds, _expand_kv(k, h), allowed)
    dk = _group_sum_contract(ds, q, g, allowed)
    dv = _group_sum_contract(pdq, do, g, allowed)
    return dq, dk, dv


# ---------------------------------------------------------------- decode: one query over a KV cache

def decode_window_start(n: int, window: int | None) -> int:
    """``j0``, the first key the last query ``n - 1`` may attend: ``max(0, n - W)`` with a window
    ``W > 0``, else 0 (None or ``W <= 0`` is fully causal, as in ``attention_forward``)."""
    return max(0, n - int(window)) if window is not None and window > 0 else 0


def compose_decode_attention(ops, q, k, v, n: int, window: int | None):
    """``decode_attention`` computed with the ops of ``ops`` (the spec module, or a backend's op table).

    Every step is one op of the contract, so a backend whose ops conform gets the spec's bits
    by composing its own: the numba backend and the shared GPU kernels call this with theirs.
    Query head ``h = g * R + r`` reads KV head ``g``: the heads are a (G, R) batch, no copy.
    """
    check_decode_attention(q, k, v, n, window)
    h, dh = q.shape
    g = k.shape[0]
    rep = h // g
    j0 = decode_window_start(n, window)
    kt = k[:, j0:n].transpose(0, 2, 1)                                        # (G, Dh, n')
    s = ops.mul(ops.matmul(q.reshape(g, rep, dh), kt), attention_scale(dh))   # (G, R, n')
    m = ops.max(s, -1)                                                        # (G, R)
    e = ops.exp(ops.sub(s, m.reshape(g, rep, 1)))
    pad = j0 % LANES  # key j in lane j mod 32: the lanes before j0's come first, +0.0
    lanes = ops.concat_last([np.zeros((g, rep, pad), dtype=np.float32), e]) if pad else e
    l = ops.lane_tree_sum(lanes, -1)                                          # (G, R)
    p = ops.div(e, l.reshape(g, rep, 1))
    return ops.matmul(p, v[:, j0:n]).reshape(h, dh)                           # (G, R, Dh) -> (H, Dh)


_SPEC_OPS = SimpleNamespace(mul=fp.mul, sub=fp.sub, div=fp.div, exp=exp, max=row_max, lane_tree_sum=lane_tree_sum,
                            matmul=matmul, concat_last=concat_last)


@op(S.decode_attention, S.decode_pairs)
def decode_attention(q: F32, k: F32, v: F32, n: HostInt, window: Window = None) -> F32:
    """The last query's attention over a KV cache (generation's decode step): (H, Dh), (G, C, Dh),
    (G, C, Dh), n -> o (H, Dh).

    q is the query of position ``i = n - 1``, one row per head; k and v are caches of C
    positions with ``0 .. n-1`` filled (1 <= n <= C; positions from n on are never read).
    Query head h reads KV head ``h // (H / G)``. The keys are ``j0 .. n-1`` with
    ``j0 = decode_window_start(n, window)`` (``max(0, n - W)`` with a window W > 0, else 0).
    Order::

        s[j] = (sum_d q[d] * k[j, d]) * scale   # contraction ascending over d, then one product
        m    = max_{j0 <= j < n} s[j]           # exact
        e[j] = exp(s[j] - m)                    # spec exp
        l    = lane_tree_sum_j e[j]             # key j in lane j mod 32: the row is preceded
                                                # by j0 mod 32 lanes of +0.0
        p[j] = e[j] / l
        o[:] = sum_{j0 <= j < n} p[j] * v[j, :] # ascending j from +0.0

    with ``scale = attention_scale(Dh)``: the last row of ``attention_forward`` over the
    first n positions, with the keys before ``j0`` absent. Each step is an
    op of the contract (``compose_decode_attention``).
    """
    return compose_decode_attention(_SPEC_OPS, fp.f32(q), fp.f32(k), fp.f32(v), n, window)
