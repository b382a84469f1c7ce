"""Conformance of ``spec.attention``: attention_forward, attention_backward (GQA, causal or sliding window),
decode_attention (one query over a KV cache).

Causal and window-3 cases at the model shapes, plus two built to catch a kernel that
computes masked pairs (they are absent, not zero-weighted): one whose sum flushes to
-0.0, one with +inf in a value only the last query may see. The search adds H not a
multiple of G, Dh = 0, k and v of another T or head dim (refused), windows at every
edge, and o, m, l that the forward did not make. decode_attention: n below, at and above
multiples of 32 (the lane of key j0), windows that cut or not, H = G and H = 2G, boundary
values in q, k and v, and positions past n holding values no sum may read (inf, NaN).
"""

from __future__ import annotations

import numpy as np

from lockstep import spec

from .. import inputs as gen
from ..draws import Viewed, canonical_host, composite, f32_array, mismatched, rarely, sometimes, st
from ..registry import Case, OpRecord, register


def _attn_inputs(seed, dims, tag):
    b, t, d, h, g, dh, *_rest = dims
    q = gen.random_uniform(seed, (tag, "q", t), (b, h, t, dh), -2, 2)
    k = gen.random_uniform(seed, (tag, "k", t), (b, g, t, dh), -2, 2)
    v = gen.random_uniform(seed, (tag, "v", t), (b, g, t, dh), -2, 2)
    return q, k, v


def _masked_negzero_inputs():
    """q = k = 0, so p splits evenly; query 1 sums 0.5*v0 + 0.5*v1 = -2**-148, which flushes to -0.0.

    Masked pairs are absent (SPEC_VERSION 2), so it stays -0.0; a kernel that adds a masked
    +0 * v2 term makes it +0.0. Backward (window 2): key 0 gets 1*do0 + 0.5*do1 = -2**-148
    from its allowed queries 0 and 1 (query 2 is masked for it).
    """
    f = np.float32
    z = np.zeros((1, 1, 3, 1), f)
    v = np.array([2.0**-125, -(2.0**-125 + 2.0**-147), 1.0], f).reshape(1, 1, 3, 1)
    do = np.array([2.0**-126, -(2.0**-125 + 2.0**-147), 1.0], f).reshape(1, 1, 3, 1)
    return z, v, do


def _masked_inf_inputs(seed):
    """v is +inf at the last key: only the last query may attend it, so every other output is finite
    (a kernel that multiplies masked zeros by v gets NaN there)."""
    q = gen.random_uniform(seed, ("attn-inf", "q"), (1, 2, 6, 4), -2, 2)
    k = gen.random_uniform(seed, ("attn-inf", "k"), (1, 1, 6, 4), -2, 2)
    v = gen.random_uniform(seed, ("attn-inf", "v"), (1, 1, 6, 4), -2, 2)
    v[0, 0, 5, :] = np.inf
    return q, k, v


def _attn_fwd_cases(seed, level):
    out = []
    for dims in gen.model_dims(level):
        q, k, v = _attn_inputs(seed, dims, "attn")
        t = dims[1]
        out.append(Case(f"causal-T{t}", (q, k, v, None)))
        out.append(Case(f"window3-T{t}", (q, k, v, 3)))
    z, v, _ = _masked_negzero_inputs()
    out.append(Case("masked-absent-negzero", (z, z, v, None)))
    q, k, v = _masked_inf_inputs(seed)
    out.append(Case("masked-absent-inf", (q, k, v, None)))
    return out


def _attn_bwd_cases(seed, level):
    out = []
    for dims in gen.model_dims(level):
        q, k, v = _attn_inputs(seed, dims, "attnb")
        t = dims[1]
        for window in (None, 3):
            o, m, l = spec.attention_forward(q, k, v, window)
            do = gen.random_uniform(seed, ("attnb-do", t, window or 0), o.shape)
            out.append(Case(f"{'causal' if window is None else 'window3'}-T{t}", (do, q, k, v, o, m, l, window)))
    z, _, do = _masked_negzero_inputs()
    ones = np.ones((1, 1, 3, 1), np.float32)
    o, m, l = spec.attention_forward(z, z, ones, 2)
    out.append(Case("masked-absent-negzero", (do, z, z, ones, o, m, l, 2)))
    q, k, v = _masked_inf_inputs(seed)
    o, m, l = spec.attention_forward(q, k, v, None)
    do = gen.random_uniform(seed, ("attn-inf", "do"), o.shape)
    out.append(Case("masked-absent-inf", (do, q, k, v, o, m, l, None)))
    return out


# ---------------------------------------------------------------- search

@composite
def _attention_dims(draw):
    g = draw(st.integers(1, 2))
    rep = draw(st.integers(1, 3))
    h = g * rep + 1 if rarely(draw) else g * rep  # H not a multiple of G: refused
    t = draw(st.one_of(st.sampled_from((1, 2, 31, 32, 33, 40)), st.integers(1, 40)))
    dh = 0 if rarely(draw) else draw(st.sampled_from((1, 2, 3, 4, 8)))  # Dh = 0: refused
    return draw(st.integers(1, 2)), h, g, t, dh


def _window(draw, t: int):
    return draw(st.one_of(st.none(), st.sampled_from(sorted({0, 1, 2, 3, t - 1, t, t + 1, -1, 31, 32, 33})), st.integers(0, t + 2)))


@composite
def _qkv(draw, dims, profile="finite"):
    b, h, g, t, dh = dims
    k_shape = (b, g, mismatched(draw, t), mismatched(draw, dh))
    return tuple(draw(f32_array(s, profile)) for s in ((b, h, t, dh), k_shape, (b, g, t, dh)))


def _draw_forward(draw, op):
    dims = draw(_attention_dims())
    profile = draw(st.sampled_from(("finite", "finite", "wild", "tiny")))
    q, k, v = draw(_qkv(dims, profile))
    window = _window(draw, dims[3])
    return ((q, k, v, window), {}) if draw(st.booleans()) else ((q, k, v), {"window": window})


def _draw_backward(draw, op):
    dims = draw(_attention_dims())
    b, h, g, t, dh = dims
    profile = draw(st.sampled_from(("finite", "finite", "wild", "tiny")))
    q, k, v = draw(_qkv(dims, profile))
    window = _window(draw, t)
    do = draw(f32_array((b, h, t, mismatched(draw, dh)), profile))
    k_shape = (k.value if isinstance(k, Viewed) else k).shape
    if h % g == 0 and dh > 0 and k_shape[2:] == (t, dh) and not sometimes(draw):  # o, m, l as the forward makes them
        o, m, l = spec.attention_forward(canonical_host(q), canonical_host(k), canonical_host(v), window)
    else:
        o, m, l = draw(f32_array((b, h, t, dh), profile)), draw(f32_array((b, h, t), profile)), draw(f32_array((b, h, mismatched(draw, t))))
    return (do, q, k, v, o, m, l, window), {}


# ---------------------------------------------------------------- regressions found by the search
# numba answered with k of head dim 2 for q of head dim 1; the spec refused (conformance_search --seed 11)

def _one():
    return gen.f32_zeros(1, 1, 1, 1)


def _forward_refusals():
    return [Case("search-k-head-dim", (_one(), gen.f32_zeros(1, 1, 1, 2), _one(), None)),
            # opencl answered Dh = 0, which the spec now refuses (conformance_search --seed 21 --examples 300)
            Case("search-head-dim-0", (gen.f32_zeros(1, 1, 1, 0),) * 3, {"window": None})]


def _backward_refusals():
    return [Case("search-k-head-dim", (_one(), _one(), gen.f32_zeros(1, 1, 1, 2), _one(), _one(),
                                       gen.f32_zeros(1, 1, 1), gen.f32_zeros(1, 1, 1), None))]


register(OpRecord("attention_forward", _attn_fwd_cases, draw=_draw_forward, search_cost=4, refusals=_forward_refusals))
register(OpRecord("attention_backward", _attn_bwd_cases, draw=_draw_backward, search_cost=8,
                  refusals=_backward_refusals))


# ---------------------------------------------------------------- decode_attention

def _decode_cache(seed, h, g, cap, dh, n):
    """k and v caches (G, C, Dh) with positions 0 .. n-1 random and the rest NaN / +inf (never read)."""
    k = gen.random_uniform(seed, ("decode", "k", h, g, n), (g, cap, dh), -2, 2)
    v = gen.random_uniform(seed, ("decode", "v", h, g, n), (g, cap, dh), -2, 2)
    k[:, n:] = np.nan
    v[:, n:] = np.inf
    return k, v


def _decode_cases(seed, level):
    out = []
    cap = 80 if level <= 1 else 200
    for h, g, dh in ((4, 2, 4), (2, 2, 8)):
        for n, window in ((1, None), (31, None), (32, None), (33, None), (64, 16), (65, 33), (70, 32), (77, 1),
                          (cap, 40), (40, 64), (33, 0)):
            q = gen.random_uniform(seed, ("decode", "q", h, n), (h, dh), -2, 2)
            k, v = _decode_cache(seed, h, g, cap, dh, n)
            out.append(Case(f"H{h}-G{g}-n{n}-{'causal' if window is None else f'window{window}'}", (q, k, v, n, window)))
    # boundary values (zeros, subnormals, ties, huge, inf, NaN) in q, k and v
    b = gen.boundary_values()
    q = np.resize(b, (4, 5)).astype(np.float32)
    k = np.resize(b[::-1], (2, 40, 5)).astype(np.float32)
    v = np.resize(np.roll(b, 7), (2, 40, 5)).astype(np.float32)
    for n, window in ((40, None), (37, 3), (8, None)):
        out.append(Case(f"boundary-n{n}-{'causal' if window is None else f'window{window}'}", (q, k, v, n, window)))
    # scores that all flush: q = k = 0 gives p = 1/n', and a P.V sum that flushes to -0.0
    z = np.zeros((1, 3, 1), np.float32)
    vz = np.array([2.0**-125, -(2.0**-125 + 2.0**-147), 1.0], np.float32).reshape(1, 3, 1)
    out.append(Case("negzero-n2", (np.zeros((1, 1), np.float32), z, vz, 2, None)))
    return out


def _draw_decode(draw, op):
    g = draw(st.integers(1, 2))
    h = g * draw(st.integers(1, 3))
    if rarely(draw):
        h += 1  # H not a multiple of G: refused
    dh = 0 if rarely(draw) else draw(st.sampled_from((1, 2, 3, 4, 8)))  # Dh = 0: refused
    cap = draw(st.one_of(st.sampled_from((1, 31, 32, 33, 40, 65)), st.integers(1, 70)))
    n = draw(st.one_of(st.sampled_from((1, cap, cap - 1, 31, 32, 33, 64, 65)), st.integers(0, cap + 1)))  # 0, > C: refused
    profile = draw(st.sampled_from(("finite", "finite", "wild", "tiny")))
    q = draw(f32_array((h, dh), profile))
    k = draw(f32_array((g, cap, mismatched(draw, dh)), profile))
    v = draw(f32_array((g, mismatched(draw, cap), dh), profile))
    window = _window(draw, max(n, 1))
    return ((q, k, v, n, window), {}) if draw(st.booleans()) else ((q, k, v, n), {"window": window})


def _decode_refusals():
    one = gen.f32_zeros(1, 1)
    cache = gen.f32_zeros(1, 2, 1)
    return [Case("n-0", (one, cache, cache, 0, None)),
            Case("n-past-cache", (one, cache, cache, 3, None)),
            Case("heads-not-a-multiple", (gen.f32_zeros(3, 1), gen.f32_zeros(2, 2, 1), gen.f32_zeros(2, 2, 1), 1, None)),
            Case("head-dim-0", (gen.f32_zeros(1, 0), gen.f32_zeros(1, 2, 0), gen.f32_zeros(1, 2, 0), 1, None)),
            Case("v-other-capacity", (one, cache, gen.f32_zeros(1, 3, 1), 1, None)),
            Case("q-4d", (gen.f32_zeros(1, 1, 1, 1), cache, cache, 1, None))]


register(OpRecord("decode_attention", _decode_cases, draw=_draw_decode, search_cost=2, refusals=_decode_refusals))


# ---------------------------------------------------------------- the int8 recipe (SPEC_VERSION 4)
# attention_forward_int8 / attention_backward_int8: the float ops' cases, plus values whose channel
# scale is 0 (-> 1) or inf/NaN, boundary values everywhere, and large keys and dO that put the
# fixed-point dq's terms near the top of its grid.

def _int8_extra_inputs(seed):
    b = gen.boundary_values()
    q = np.resize(b, (1, 2, 37, 4)).astype(np.float32)
    k = np.resize(b[::-1], (1, 1, 37, 4)).astype(np.float32)
    v = np.resize(np.roll(b, 5), (1, 1, 37, 4)).astype(np.float32)
    qz, kz, vz = _attn_inputs(seed, (1, 33, 0, 2, 1, 4), "attn-int8")
    vz[..., 1] = 0.0  # an all-zero channel: scale 1, codes 0
    vz[..., 2] *= np.float32(2.0**-140)  # a channel whose scale flushes: codes 0
    big = gen.random_uniform(seed, ("attn-int8", "big"), (1, 1, 33, 4), -2, 2) * np.float32(2.0**100)
    return [("boundary", (q, k, v)), ("zero-channels", (qz, kz, vz)), ("huge-k", (qz, big.astype(np.float32), vz))]


def _attn_fwd_int8_cases(seed, level):
    out = _attn_fwd_cases(seed, level)
    for name, (q, k, v) in _int8_extra_inputs(seed):
        out.append(Case(f"{name}-causal", (q, k, v, None)))
        out.append(Case(f"{name}-window5", (q, k, v, 5)))
    return out


def _attn_bwd_int8_cases(seed, level):
    out = []
    for case in _attn_bwd_cases(seed, level):
        do, q, k, v, _o, _m, _l, window = case.args
        o, m, l = spec.attention_forward_int8(q, k, v, window)
        out.append(Case(case.label, (do, q, k, v, o, m, l, window)))
    for name, (q, k, v) in _int8_extra_inputs(seed):
        for window in (None, 5):
            o, m, l = spec.attention_forward_int8(q, k, v, window)
            do = gen.random_uniform(seed, ("attn-int8-do", name, window or 0), o.shape, -2, 2)
            if name == "huge-k":
                do = (do * np.float32(2.0**90)).astype(np.float32)  # |ds| * |k| near 2**190: the grid's top
            out.append(Case(f"{name}-{'causal' if window is None else 'window5'}", (do, q, k, v, o, m, l, window)))
    return out


def _draw_backward_int8(draw, op):
    (do, q, k, v, o, m, l, window), kw = _draw_backward(draw, op)
    k_shape = (k.value if isinstance(k, Viewed) else k).shape
    q_shape = (q.value if isinstance(q, Viewed) else q).shape
    if q_shape[1] % k_shape[1] == 0 and q_shape[3] > 0 and k_shape[2:] == q_shape[2:] and not sometimes(draw):
        o, m, l = spec.attention_forward_int8(canonical_host(q), canonical_host(k), canonical_host(v), window)
    return (do, q, k, v, o, m, l, window), kw


register(OpRecord("attention_forward_int8", _attn_fwd_int8_cases, draw=_draw_forward, search_cost=4,
                  refusals=_forward_refusals))
register(OpRecord("attention_backward_int8", _attn_bwd_int8_cases, draw=_draw_backward_int8, search_cost=8,
                  refusals=_backward_refusals))
