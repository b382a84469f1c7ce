"""Causal grouped-query attention with an optional sliding window.

Legend: B batch, H query heads, G key/value heads (H = G * R, R query heads per
KV head; query head h reads KV head h // R), T positions, Dh head dimension.

Query i may attend key j iff ``j <= i`` and, with a window W, ``i - j < W``: the
allowed keys of query i are ``A(i) = [max(0, i - W + 1), i]`` (``[0, i]`` without a
window), and the queries that may attend key j are ``Q(j) = [j, min(T - 1, j + W - 1)]``.
Both are never empty (j = i is always allowed).

Masked terms are ABSENT (SPEC_VERSION 2). Every sum over keys or queries runs over
the allowed ones only; a masked pair contributes nothing, not a zero:

* a lane tree over keys (the softmax denominator ``l``): key j belongs to lane
  ``j mod 32`` (its absolute index, not its position in ``A(i)``); each lane adds its
  allowed keys in ascending j from +0.0, and a masked key is skipped by its lane --
  the same as adding nothing; then the lanes fold (16, 8, 4, 2, 1) as in
  ``reduce.lane_tree_sum``;
* an ascending contraction over keys (``o = p v``, ``dq = ds k``) or over
  (head, query) pairs (``dk = ds^T q``, ``dv = p^T do``): the accumulator starts at
  +0.0 and adds the allowed terms only, in ascending order.

(Under SPEC_VERSION 1 masked entries entered the sums as ``+0.0`` weights, so a
partial sum that flushed to -0.0 became +0.0 when a masked term followed it, and
``0 * inf`` made a masked infinite value NaN; every kernel had to replay them.)
"""

from __future__ import annotations

import numpy as np

from types import SimpleNamespace

from . import fp
from .checks import check_attention_shapes  # noqa: F401 - re-exported: the shared input check
from .checks import check_decode_attention
from .layout import concat_last
from .reduce import LANES, lane_tree_sum, matmul
from .reduce import max as row_max
from .transcendental import exp

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


def attention_forward(q, k, v, window: int | None = None):
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
    check_attention_shapes(q, k, v)
    q, k, v = fp.f32(q), fp.f32(k), fp.f32(v)
    s, allowed = _scores(q, k, window)
    m = row_max(s, axis=-1)
    e = np.where(allowed, exp(fp.sub(s, m[..., None])), np.float32(0.0))
    l = lane_tree_sum(e)
    p = fp.div(e, l[..., None])
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


def attention_backward(do, q, k, v, o, m, l, window: int | None = None):
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
    check_attention_shapes(q, k, v, do, o, m, l)
    do, q, k, v, o = (fp.f32(a) for a in (do, q, k, v, o))
    h, dh = q.shape[1], q.shape[3]
    g = k.shape[1]
    s, allowed = _scores(q, k, window)
    p = _probabilities(s, allowed, fp.f32(m), fp.f32(l))
    vh = _expand_kv(v, h)
    dp = matmul(do, np.swapaxes(vh, -1, -2))
    drow = lane_tree_sum(fp.mul(do, o))
    ds = fp.mul(fp.mul(p, fp.sub(dp, drow[..., None])), attention_scale(dh))
    dq = _allowed_contract(ds, _expand_kv(k, h), allowed)
    dk = _group_sum_contract(ds, q, g, allowed)
    dv = _group_sum_contract(p, do, g, allowed)
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


def decode_attention(q, k, v, n: int, window: int | None = None):
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
    first n positions, with the keys before ``j0`` absent (SPEC_VERSION 2). Each step is an
    op of the contract (``compose_decode_attention``).
    """
    return compose_decode_attention(_SPEC_OPS, fp.f32(q), fp.f32(k), fp.f32(v), n, window)
