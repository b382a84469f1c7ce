"""Conformance records for the model ops (forward/backward pairs, the optimizer ops).

Inputs are small tensors of realistic magnitude from Philox streams, plus a few
boundary cases (ties in quantization, all-zero rows, masked attention rows).
Level 2 uses larger shapes.
"""

from __future__ import annotations

import numpy as np

from lockstep import spec

from . import inputs as gen
from .registry import Case, OpRecord, register

EPS = 1e-6


def _u(seed, purpose, shape, lo=-1.0, hi=1.0):
    return gen.random_uniform(seed, purpose, shape, lo, hi)


def _ids(seed, purpose, shape, vocab):
    return (gen.random_uint32(seed, purpose, shape) % np.uint32(vocab)).astype(np.int64)


def _dims(level):
    # (B, T, D, H, G, Dh, F, V)
    return [(2, 8, 16, 4, 2, 4, 24, 40)] if level <= 1 else [(2, 8, 16, 4, 2, 4, 24, 40), (2, 64, 64, 4, 1, 16, 96, 264)]


def _concat_cases(seed, level):
    return [Case("three", ([_u(seed, ("cat", i), (2, 3, 4 + i)) for i in range(3)],))]


def _column_sum_cases(seed, level):
    return [Case("rows", (_u(seed, ("colsum",), (3, 70, 5)),)),
            Case("specials", (gen.boundary_matrix(),))]


def _embedding_fwd_cases(seed, level):
    out = []
    for (b, t, d, *_rest, v) in _dims(level):
        out.append(Case(f"B{b}T{t}D{d}", (_u(seed, ("emb", d), (v, d)), _ids(seed, ("emb-ids", t), (b, t), v))))
    return out


def _embedding_bwd_cases(seed, level):
    out = []
    for (b, t, d, *_rest, v) in _dims(level):
        ids = _ids(seed, ("embb-ids", t), (b, t), v)
        ids[0, :3] = 7  # repeated ids: the scatter-add order matters
        out.append(Case(f"B{b}T{t}D{d}", (_u(seed, ("embb", d), (b, t, d)), ids, v)))
    return out


def _rms_fwd_cases(seed, level):
    out = []
    for (b, t, d, *_rest) in _dims(level):
        x = _u(seed, ("rms", d), (b, t, d), -3, 3)
        out.append(Case(f"gain-D{d}", (x, _u(seed, ("rms-g", d), (d,), 0.5, 1.5), EPS)))
        out.append(Case(f"nogain-D{d}", (x, None, EPS)))
    out.append(Case("zero-row", (np.zeros((2, 33), np.float32), np.ones(33, np.float32), EPS)))
    return out


def _rms_bwd_cases(seed, level):
    out = []
    for (b, t, d, *_rest) in _dims(level):
        x = _u(seed, ("rmsb", d), (b, t, d), -3, 3)
        g = _u(seed, ("rmsb-g", d), (d,), 0.5, 1.5)
        _, rstd = spec.rmsnorm_forward(x, g, EPS)
        dy = _u(seed, ("rmsb-dy", d), (b, t, d))
        out.append(Case(f"gain-D{d}", (dy, x, g, rstd)))
        out.append(Case(f"nogain-D{d}", (dy, x, None, spec.rmsnorm_forward(x, None, EPS)[1])))
    return out


def _rope_cases(seed, level):
    from lockstep.spec.rope import rope_tables

    out = []
    for (b, t, d, h, g, dh, *_rest) in _dims(level):
        cos, sin = rope_tables(t, dh, 500_000.0)
        out.append(Case(f"T{t}Dh{dh}", (_u(seed, ("rope", t, dh), (b, h, t, dh)), cos, sin)))
    return out


def _attn_inputs(seed, dims, tag):
    b, t, d, h, g, dh, *_rest = dims
    q = _u(seed, (tag, "q", t), (b, h, t, dh), -2, 2)
    k = _u(seed, (tag, "k", t), (b, g, t, dh), -2, 2)
    v = _u(seed, (tag, "v", t), (b, g, t, dh), -2, 2)
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
    q = _u(seed, ("attn-inf", "q"), (1, 2, 6, 4), -2, 2)
    k = _u(seed, ("attn-inf", "k"), (1, 1, 6, 4), -2, 2)
    v = _u(seed, ("attn-inf", "v"), (1, 1, 6, 4), -2, 2)
    v[0, 0, 5, :] = np.inf
    return q, k, v


def _attn_fwd_cases(seed, level):
    out = []
    for dims in _dims(level):
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
    for dims in _dims(level):
        q, k, v = _attn_inputs(seed, dims, "attnb")
        t = dims[1]
        for window in (None, 3):
            o, m, l = spec.attention_forward(q, k, v, window)
            do = _u(seed, ("attnb-do", t, window or 0), o.shape)
            out.append(Case(f"{'causal' if window is None else 'window3'}-T{t}", (do, q, k, v, o, m, l, window)))
    z, _, do = _masked_negzero_inputs()
    ones = np.ones((1, 1, 3, 1), np.float32)
    o, m, l = spec.attention_forward(z, z, ones, 2)
    out.append(Case("masked-absent-negzero", (do, z, z, ones, o, m, l, 2)))
    q, k, v = _masked_inf_inputs(seed)
    o, m, l = spec.attention_forward(q, k, v, None)
    do = _u(seed, ("attn-inf", "do"), o.shape)
    out.append(Case("masked-absent-inf", (do, q, k, v, o, m, l, None)))
    return out


def _swiglu_fwd_cases(seed, level):
    return [Case(f"F{f}", (_u(seed, ("swi", f), (b, t, 2 * f), -6, 6),)) for (b, t, _d, _h, _g, _dh, f, _v) in _dims(level)]


def _swiglu_bwd_cases(seed, level):
    return [Case(f"F{f}", (_u(seed, ("swib-dh", f), (b, t, f)), _u(seed, ("swib", f), (b, t, 2 * f), -6, 6)))
            for (b, t, _d, _h, _g, _dh, f, _v) in _dims(level)]


def _int8_fwd_cases(seed, level):
    out = []
    for (b, t, d, _h, _g, _dh, f, _v) in _dims(level):
        x = _u(seed, ("i8f-x", d), (b, t, d), -3, 3)
        x[0, 0, 0] = 25.0  # an outlier sets the activation scale
        out.append(Case(f"D{d}F{f}", (x, _u(seed, ("i8f-w", d), (d, 2 * f), -0.1, 0.1))))
    ties = np.array([[0.5, 1.5, -2.5, 127.0]], dtype=np.float32)  # x/scale lands on .5: ties to even
    out.append(Case("ties", (ties, np.eye(4, dtype=np.float32))))
    out.append(Case("zeros", (np.zeros((3, 4), np.float32), np.zeros((4, 2), np.float32))))
    return out


def _int8_bwd_cases(seed, level):
    out = []
    for (b, t, d, _h, _g, _dh, f, _v) in _dims(level):
        x = _u(seed, ("i8b-x", d), (b, t, d), -3, 3)
        w = _u(seed, ("i8b-w", d), (d, f), -0.1, 0.1)
        dy = _u(seed, ("i8b-dy", d), (b, t, f), -0.01, 0.01)
        out.append(Case(f"hadamard-D{d}F{f}", (dy, x, w, True)))
        out.append(Case(f"plain-D{d}F{f}", (dy, x, w, False)))
    return out


def _ce_fwd_cases(seed, level):
    out = []
    for (b, t, *_rest, v) in _dims(level):
        n = b * t
        out.append(Case(f"N{n}V{v}", (_u(seed, ("ce", v), (n, v), -8, 8), _ids(seed, ("ce-t", v), (n,), v), 1e-4)))
    return out


def _ce_bwd_cases(seed, level):
    out = []
    for (b, t, *_rest, v) in _dims(level):
        n = b * t
        logits = _u(seed, ("ceb", v), (n, v), -8, 8)
        tg = _ids(seed, ("ceb-t", v), (n,), v)
        _, lse = spec.cross_entropy_forward(logits, tg, 1e-4)
        out.append(Case(f"N{n}V{v}", (logits, tg, lse, 1e-4, np.float32(1.0 / (3 * n)))))
    return out


def _sumsq_cases(seed, level):
    """Below one block of 4096 (one lane tree), a few blocks with a short last one, and more than
    32 blocks (the second lane tree takes two rounds); both give other bits than one lane tree
    over the whole tensor (SPEC_VERSION 1), so a backend that kept that order fails."""
    block = spec.optim.SUM_OF_SQUARES_BLOCK
    return [Case("matrix", (_u(seed, ("ssq",), (33, 17)),)), Case("vector", (_u(seed, ("ssq-v",), (1000,)),)),
            Case("blocks-3.02", (_u(seed, ("ssq-b",), (3 * block + 100,)),)),
            Case("blocks-33x", (gen.random_normal_range(seed, ("ssq-33",), (33, block + 7), -20, 20),)),
            Case("specials", (gen.boundary_matrix(),))]


def _global_norm_cases(seed, level):
    s = [np.float32(x) for x in _u(seed, ("gn",), (7,), 0, 3)]
    return [Case("seven", (s,)), Case("empty", ([],))]


def _clip_cases(seed, level):
    return [Case(f"norm{n}", (np.float32(n), 1.0)) for n in (0.0, 0.5, 1.0, 1.0000001, 3.7, 1e30)]


def _scale_cases(seed, level):
    return [Case("matrix", (_u(seed, ("scale",), (9, 13)), np.float32(0.3711)))]


def _adamw_cases(seed, level):
    f = np.float32
    shape = (13, 9)
    p, g = _u(seed, ("aw-p",), shape), _u(seed, ("aw-g",), shape, -0.01, 0.01)
    m, v = _u(seed, ("aw-m",), shape, -0.001, 0.001), _u(seed, ("aw-v",), shape, 0, 1e-5)
    common = (f(3e-3), f(0.9), f(0.95), f(0.1), f(0.05), f(1e-8))
    return [
        Case("decay", (p, g, m, v, *common, f(0.1), f(0.271), f(0.0975))),
        Case("no-decay", (p, g, m, v, *common, f(0.0), f(0.271), f(0.0975))),
        Case("first-step", (p, g, np.zeros(shape, np.float32), np.zeros(shape, np.float32), *common, f(0.1), f(0.1), f(0.05))),
    ]


for _name, _cases in [
    ("concat_last", _concat_cases),
    ("column_sum", _column_sum_cases),
    ("embedding_forward", _embedding_fwd_cases),
    ("embedding_backward", _embedding_bwd_cases),
    ("rmsnorm_forward", _rms_fwd_cases),
    ("rmsnorm_backward", _rms_bwd_cases),
    ("rope_forward", _rope_cases),
    ("rope_backward", _rope_cases),
    ("attention_forward", _attn_fwd_cases),
    ("attention_backward", _attn_bwd_cases),
    ("swiglu_forward", _swiglu_fwd_cases),
    ("swiglu_backward", _swiglu_bwd_cases),
    ("int8_linear_forward", _int8_fwd_cases),
    ("int8_linear_backward", _int8_bwd_cases),
    ("cross_entropy_forward", _ce_fwd_cases),
    ("cross_entropy_backward", _ce_bwd_cases),
    ("sum_of_squares", _sumsq_cases),
    ("global_norm", _global_norm_cases),
    ("clip_coefficient", _clip_cases),
    ("scale", _scale_cases),
    ("adamw_update", _adamw_cases),
]:
    register(OpRecord(_name, _cases))
