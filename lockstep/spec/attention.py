"""Causal grouped-query attention with an optional sliding window.

Legend: B batch, H query heads, G key/value heads (H = G * R, R query heads per
KV head; query head h reads KV head h // R), T positions, Dh head dimension.
Query i may attend key j iff ``j <= i`` and, with a window W, ``i - j < W``.

Every sum below visits every key j = 0 .. T-1 in ascending order; a masked entry
enters as an exact +0.0 score weight (e = +0.0, p = +0.0). Such a term usually
changes nothing, but not always under round-then-flush: a partial sum that
flushed to -0.0 becomes +0.0 when a masked +0.0 term is added, and a masked
``+0.0 * v`` is NaN when v is infinite or NaN. A kernel that skips masked keys
must reproduce those effects. Key j always belongs to lane ``j mod 32`` of the
softmax denominator's lane tree.
"""

from __future__ import annotations

import numpy as np

from . import fp
from .reduce import lane_tree_sum, matmul
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
    """``p = exp(s - m) / l``, masked entries +0.0 (the forward's order)."""
    e = np.where(allowed, exp(fp.sub(s, m[..., None])), np.float32(0.0))
    return fp.div(e, l[..., None])


def attention_forward(q, k, v, window: int | None = None):
    """Softmax attention: (B, H, T, Dh), (B, G, T, Dh), (B, G, T, Dh) -> ``(o, m, l)``.

    Order::

        s[i, j] = (sum_d q[i, d] * k[j, d]) * scale   # contraction ascending over d, then one product
        s[i, j] = -inf where masked
        m[i]    = max_j s[i, j]                        # exact
        e[i, j] = exp(s[i, j] - m[i])                  # spec exp; masked -> +0.0
        l[i]    = lane_tree_sum_j e[i, j]
        p[i, j] = e[i, j] / l[i]
        o[i, :] = sum_j p[i, j] * v[j, :]              # contraction ascending over j

    with ``scale = attention_scale(Dh)``. ``m`` and ``l`` (B, H, T) are kept so the
    backward can rebuild ``p`` bit for bit.
    """
    q, k, v = fp.f32(q), fp.f32(k), fp.f32(v)
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of KV heads {k.shape[1]}")
    s, allowed = _scores(q, k, window)
    m = row_max(s, axis=-1)
    e = np.where(allowed, exp(fp.sub(s, m[..., None])), np.float32(0.0))
    l = lane_tree_sum(e)
    p = fp.div(e, l[..., None])
    o = matmul(p, _expand_kv(v, q.shape[1]))
    return o, m, l


def _group_sum_contract(a, b, n_kv: int):
    """``out[g, j, :] = sum over (h in group g, i) of a[h, i, j] * b[h, i, :]``.

    a: (B, H, T, T), b: (B, H, T, X) -> (B, G, T, X). The contracted index is
    ``(h, i)`` with h major: ascending over the group's heads, and within a head
    ascending over i.
    """
    bsz, h, t, _ = a.shape
    rep = h // n_kv
    a = a.reshape(bsz, n_kv, rep, t, t)
    a = np.transpose(a, (0, 1, 4, 2, 3)).reshape(bsz, n_kv, t, rep * t)  # (B, G, Tj, R*Ti)
    b = b.reshape(bsz, n_kv, rep * t, b.shape[-1])
    return matmul(a, b)


def attention_backward(do, q, k, v, o, m, l, window: int | None = None):
    """Gradients of ``attention_forward``: returns ``(dq, dk, dv)``.

    ``p`` is rebuilt from the saved ``m`` and ``l`` exactly as in the forward. Then::

        dp[i, j]  = sum_d do[i, d] * v[j, d]          # ascending over d
        D[i]      = lane_tree_sum_d do[i, d] * o[i, d]
        ds[i, j]  = (p[i, j] * (dp[i, j] - D[i])) * scale
        dq[i, :]  = sum_j ds[i, j] * k[j, :]          # ascending over j
        dk[g, j]  = sum_(h, i) ds[h, i, j] * q[h, i]  # (h, i) ascending, h major, h in group g
        dv[g, j]  = sum_(h, i) p[h, i, j] * do[h, i]  # likewise
    """
    do, q, k, v, o = (fp.f32(a) for a in (do, q, k, v, o))
    h, dh = q.shape[1], q.shape[3]
    g = k.shape[1]
    s, allowed = _scores(q, k, window)
    p = _probabilities(s, allowed, fp.f32(m), fp.f32(l))
    vh = _expand_kv(v, h)
    dp = matmul(do, np.swapaxes(vh, -1, -2))
    drow = lane_tree_sum(fp.mul(do, o))
    ds = fp.mul(fp.mul(p, fp.sub(dp, drow[..., None])), attention_scale(dh))
    dq = matmul(ds, _expand_kv(k, h))
    dk = _group_sum_contract(ds, q, g)
    dv = _group_sum_contract(p, do, g)
    return dq, dk, dv
