"""An independent float64 forward of the model, for checking the spec's mathematics.

Written from the model's description (``lockstep/train/model.py``'s docstring) and the op docstrings, not from
``lockstep/train/model.py``: plain NumPy in float64, where ``np.exp``, ``np.log``,
``np.sin`` and ``@`` (BLAS) are fine because nothing here is published; this
file only answers "is the spec computing the right function?". A deterministic
bug is still a bug, so the spec's gradients are compared with finite
differences of ``loss`` below, and its int8 forward with ``loss(...,
quantize=True)`` (fake quantization: integer codes, dequantized, float64 GEMM).

Legend: B sequences, T positions, D d_model, H query heads, G KV heads,
Dh head dim, F FFN width, V vocabulary, N = B*T tokens.
"""

from __future__ import annotations

import numpy as np

F64 = np.float64
QMAX = 127.0  # symmetric int8 codes in [-127, 127]


def as_f64(params: dict) -> dict[str, np.ndarray]:
    """Float64 copies of the parameters (exact: every float32 is a float64)."""
    return {k: np.asarray(v, dtype=F64).copy() for k, v in params.items()}


# ---- quantization (float64 fake-quant; quantize=True semantics of lockstep/spec/quant.py)

def _nonzero(s):
    return np.where(s == 0, 1.0, s)


def weight_scale(w):
    """Per output channel n of w (K, N): 2 * mean_k |w[k, n]| / sqrt(127)."""
    return _nonzero(2.0 * np.mean(np.abs(w), axis=0) / np.sqrt(QMAX))


def activation_scale(x):
    """Per tensor: max |x| / 127."""
    return _nonzero(np.max(np.abs(x)) / QMAX)


def quantize_codes(x, scale, stats: dict | None = None, name: str = ""):
    """Integer codes ``clip(round_half_even(x / scale), -127, 127)`` (as float64).

    ``stats`` (optional) is how the tests see the rounding decisions. Codes whose
    ratio ``x / scale`` lies within ``stats["margin"]`` (default 1e-4) of a
    rounding tie are "near a tie": where float32 and float64 differ in the last
    bits of x or of the scale, only those can honestly round apart. Each call
    appends ``(name, n_near)`` to ``stats["near_ties"]``. With
    ``stats["follow"]``, a list of the other implementation's codes in call order
    (activation, then weight, per layer), near-tie codes take that
    implementation's decision if it is one of the tie's two neighbours
    (``stats["adopted"]`` counts them); any other code that differs is counted in
    ``stats["disagree"]``.
    """
    r = x / scale
    q = np.clip(np.rint(r), -QMAX, QMAX)
    if stats is None:
        return q
    frac = r - np.trunc(r)
    near = (np.abs(np.abs(frac) - 0.5) < stats.get("margin", 1e-4)) & (np.abs(r) < QMAX)
    stats.setdefault("near_ties", []).append((name, int(near.sum())))
    follow = stats.get("follow")
    if follow is not None:
        i = stats.setdefault("calls", 0)
        stats["calls"] = i + 1
        other = np.asarray(follow[i], dtype=F64).reshape(q.shape)
        apart = other != q
        honest = apart & near & (np.abs(other - q) == 1)
        stats.setdefault("adopted", []).append((name, int(honest.sum())))
        bad = int((apart & ~honest).sum())
        stats.setdefault("disagree", [])
        if bad:
            stats["disagree"].append((name, bad))
        q = np.where(honest, other, q)
    return q


def fake_quant_linear(x, w, stats: dict | None = None, name: str = ""):
    """W8A8 linear, float64: (..., K), (K, N) -> (..., N).

    ``y = (xq @ wq) * sx * sw[n]`` with ``xq = codes(x / sx)``, ``wq = codes(w / sw)``;
    the integer GEMM is exact in float64 here (|acc| <= K * 127**2 << 2**53).
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    sx = activation_scale(x2)
    sw = weight_scale(w)
    xq = quantize_codes(x2, sx, stats, name + ".x")
    wq = quantize_codes(w, sw[None, :], stats, name + ".w")
    y = (xq @ wq) * sx * sw[None, :]
    return y.reshape(lead + (w.shape[1],))


def linear(x, w, quantize: bool, stats: dict | None = None, name: str = ""):
    if quantize:
        return fake_quant_linear(x, w, stats, name)
    return x @ w


# ---- the blocks

def rmsnorm(x, gain, eps):
    """``x / sqrt(mean(x**2) + eps) * gain`` over the last axis (gain None: no gain)."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if gain is None else y * gain


def rope(x, theta):
    """Half-split RoPE on (..., T, Dh): pair i = (x[i], x[i + Dh/2]) turns by t * theta**(-2i/Dh)."""
    t, dh = x.shape[-2], x.shape[-1]
    half = dh // 2
    freq = theta ** (-(2.0 * np.arange(half)) / dh)
    ang = np.arange(t)[:, None] * freq[None, :]
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def causal_gqa_attention(q, k, v, window, quantize: bool = False):
    """q (B, H, T, Dh), k and v (B, G, T, Dh); query head h reads KV head h // (H/G).

    Query i sees key j iff j <= i and (no window, or i - j < window). With ``quantize`` P.V is the
    int8 recipe's: ``p`` in codes of the fixed scale 1/127, ``v`` in codes of a scale per (b, g, d)
    (``max_j |v| / 127``), the product of the codes exact in float64 (|sum| <= T * 127**2), one rescale.
    """
    b, h, t, dh = q.shape
    g = k.shape[1]
    rep = h // g
    kh = np.repeat(k, rep, axis=1)
    vh = np.repeat(v, rep, axis=1)
    s = (q @ np.swapaxes(kh, -1, -2)) / np.sqrt(dh)
    i = np.arange(t)[:, None]
    j = np.arange(t)[None, :]
    seen = j <= i
    if window is not None:
        seen &= (i - j) < window
    s = np.where(seen, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(axis=-1, keepdims=True)
    if not quantize:
        return p @ vh
    sv = _nonzero(np.max(np.abs(v), axis=2, keepdims=True) / QMAX)         # (B, G, 1, Dh)
    vq = np.repeat(quantize_codes(v, sv), rep, axis=1)
    pq = quantize_codes(p, 1.0 / QMAX)
    return (pq @ vq) * (1.0 / QMAX) * np.repeat(sv, rep, axis=1)


def silu(x):
    return x / (1.0 + np.exp(-x))


def logits(params: dict, inputs, cfg, quantize: bool = False, stats: dict | None = None):
    """Float64 logits (N, V) for inputs (B, T)."""
    P = params
    b, t = inputs.shape
    h, g, dh, f = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    eps = cfg.norm_eps
    x = rmsnorm(P["embed"][inputs], P["embed_norm.gain"], eps)             # (B, T, D)
    for layer in range(cfg.n_layers):
        p = f"layers.{layer:02d}."
        a = rmsnorm(x, P[p + "attn_norm.gain"], eps)
        qkv = linear(a, P[p + "attn.wqkv"], quantize, stats, p + "wqkv")     # (B, T, (H+2G)Dh)
        q = qkv[..., : h * dh].reshape(b, t, h, dh).transpose(0, 2, 1, 3)
        k = qkv[..., h * dh : (h + g) * dh].reshape(b, t, g, dh).transpose(0, 2, 1, 3)
        v = qkv[..., (h + g) * dh :].reshape(b, t, g, dh).transpose(0, 2, 1, 3)
        q = rope(rmsnorm(q, None, eps), cfg.rope_theta)                     # QK-norm, no gain
        k = rope(rmsnorm(k, None, eps), cfg.rope_theta)
        o = causal_gqa_attention(q, k, v, cfg.window(layer), quantize)              # (B, H, T, Dh)
        o = o.transpose(0, 2, 1, 3).reshape(b, t, h * dh)
        x = x + linear(o, P[p + "attn.wo"], quantize, stats, p + "wo")
        fin = rmsnorm(x, P[p + "ffn_norm.gain"], eps)
        gu = linear(fin, P[p + "ffn.w_gate_up"], quantize, stats, p + "w_gate_up")  # (B, T, 2F)
        hid = silu(gu[..., :f]) * gu[..., f:]
        x = x + linear(hid, P[p + "ffn.w_down"], quantize, stats, p + "w_down")
    xf = rmsnorm(x, P["final_norm.gain"], eps)
    return xf.reshape(b * t, -1) @ P["lm_head"]                             # LM head stays float


def loss(params: dict, windows, cfg, quantize: bool = False, stats: dict | None = None) -> float:
    """Mean over the N target tokens of ``lse - logit[target] + z * lse**2``."""
    windows = np.asarray(windows)
    inputs, targets = windows[:, :-1], windows[:, 1:].reshape(-1)
    z = logits(params, inputs, cfg, quantize, stats)
    m = z.max(axis=-1)
    lse = m + np.log(np.exp(z - m[:, None]).sum(axis=-1))
    per_token = lse - z[np.arange(z.shape[0]), targets] + cfg.z_loss * lse * lse
    return float(per_token.mean())
