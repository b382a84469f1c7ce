"""``spec.attention``: causal grouped-query attention, checked directly.

Exact properties (bytes): a query that may attend only itself (query 0; every query
with window 1) returns its value row. Accuracy against a float64 softmax attention
written here from the definition (tolerances below, each with its reason).
"""

import numpy as np
import pytest

from lockstep import spec
from lockstep.conformance import inputs as gen
from lockstep.spec.attention import attention_mask

F64 = np.float64

# Inputs in [-1, 1], Dh = 8, T = 16. The float32 path rounds each score's 8 products and
# sums (|error| <= 16 * 2**-24 * 8, about 8e-6 absolute), which exp turns into a relative
# error of p of the same size, then adds at most 16 rounded terms into o and l (another
# 16 * 2**-24, 1e-6). 2e-5 relative to max |v| leaves about a factor 2 of margin.
FORWARD_TOL = 2e-5
# The backward chains three more contractions of at most 16 terms on those p (each adding
# ~1e-6 relative): 1e-4 relative to each gradient's largest entry.
BACKWARD_TOL = 1e-4


def _inputs(b=1, h=4, g=2, t=16, dh=8, seed=0):
    q = gen.random_uniform(seed, ("attn-test", "q"), (b, h, t, dh))
    k = gen.random_uniform(seed, ("attn-test", "k"), (b, g, t, dh))
    v = gen.random_uniform(seed, ("attn-test", "v"), (b, g, t, dh))
    return q, k, v


def _reference(q, k, v, window):
    """float64 softmax attention from the definition: (o, p), with k and v repeated per query head."""
    r = q.shape[1] // k.shape[1]
    kk, vv = np.repeat(k.astype(F64), r, axis=1), np.repeat(v.astype(F64), r, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q.astype(F64), kk) / np.sqrt(q.shape[-1])
    s = np.where(attention_mask(q.shape[2], window), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", p, vv), p


def _reference_backward(do, q, k, v, window):
    """float64 gradients of the attention output (softmax backward), summed over each KV group's heads."""
    r = q.shape[1] // k.shape[1]
    kk, vv = np.repeat(k.astype(F64), r, axis=1), np.repeat(v.astype(F64), r, axis=1)
    o, p = _reference(q, k, v, window)
    do = do.astype(F64)
    dp = np.einsum("bhid,bhjd->bhij", do, vv)
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True)) / np.sqrt(q.shape[-1])
    dq = np.einsum("bhij,bhjd->bhid", ds, kk)
    dk = np.einsum("bhij,bhid->bhjd", ds, q.astype(F64))
    dv = np.einsum("bhij,bhid->bhjd", p, do)
    group = lambda x: x.reshape(x.shape[0], k.shape[1], r, *x.shape[2:]).sum(axis=2)  # noqa: E731
    return dq, group(dk), group(dv)


def test_a_query_that_sees_only_itself_returns_its_value_row():
    """p = exp(0) / 1 = 1 exactly, and 1 * v added to +0.0 is v: query 0 always, every query with window 1."""
    q, k, v = _inputs()
    o, _, _ = spec.attention_forward(q, k, v)
    assert o[:, :, 0].tobytes() == np.repeat(v, 2, axis=1)[:, :, 0].tobytes()
    o1, _, l1 = spec.attention_forward(q, k, v, 1)
    assert o1.tobytes() == np.repeat(v, 2, axis=1).tobytes()
    assert (l1 == 1.0).all()


@pytest.mark.parametrize("window", [None, 5])
def test_forward_matches_float64_softmax_attention(window):
    q, k, v = _inputs()
    o, _, _ = spec.attention_forward(q, k, v, window)
    want, _ = _reference(q, k, v, window)
    assert np.abs(o - want).max() <= FORWARD_TOL * np.abs(v).max()


@pytest.mark.parametrize("window", [None, 5])
def test_backward_matches_float64_gradients(window):
    q, k, v = _inputs()
    do = gen.random_uniform(1, ("attn-test", "do"), q.shape)
    o, m, l = spec.attention_forward(q, k, v, window)
    got = spec.attention_backward(do, q, k, v, o, m, l, window)
    for name, g, want in zip(("dq", "dk", "dv"), got, _reference_backward(do, q, k, v, window)):
        assert g.shape == want.shape, name
        assert np.abs(g - want).max() <= BACKWARD_TOL * np.abs(want).max(), name


# ---------------------------------------------------------------- decode_attention (one query over a KV cache)

def _composition_generate_used(q, k_cache, v_cache, n, window):
    """The decode attention that ``use/generate.py`` composed from spec ops before it became the op
    ``spec.decode_attention`` (kept here as the reference: the op must give these bits).
    q (H, Dh); caches (G, C, Dh); returns (H, Dh)."""
    h, dh = q.shape
    g = k_cache.shape[0]
    j0 = max(0, n - window) if window else 0
    rep = h // g
    kh = np.repeat(k_cache[:, j0:n], rep, axis=0)
    vh = np.repeat(v_cache[:, j0:n], rep, axis=0)
    s = spec.mul(spec.matmul(q.reshape(h, 1, dh), np.ascontiguousarray(kh.transpose(0, 2, 1))),
                 spec.attention.attention_scale(dh))
    m = spec.max(s, axis=-1)
    e = spec.exp(spec.sub(s, m.reshape(h, 1, 1)))
    pad = j0 % 32
    lanes = spec.concat_last([np.zeros((h, 1, pad), dtype=np.float32), e]) if pad else e
    p = spec.div(e, spec.lane_tree_sum(lanes).reshape(h, 1, 1))
    return spec.matmul(p, vh).reshape(h, dh)


def _decode_inputs(kind, h, g, cap, dh, seed):
    shapes = ((h, dh), (g, cap, dh), (g, cap, dh))
    if kind == "random":
        return tuple(gen.random_normal_range(seed, ("decode-test", i), s, -3, 3) for i, s in enumerate(shapes))
    # boundary: q and k from the table's values below 100 in magnitude (zeros, subnormals, smallest
    # normals, ties, 88.7 ...: scores whose exp flushes or overflows), v from all its finite values;
    # every third trial one inf or NaN at a drawn filled position of k or v
    b = gen.boundary_values()
    small, finite = b[np.abs(b) < 100], b[np.isfinite(b)]
    out = []
    for i, (s, table) in enumerate(zip(shapes, (small, small, finite))):
        pick = gen.random_uint32(seed, ("decode-test-b", i), (int(np.prod(s)),)) % table.size
        out.append(table[pick].reshape(s))
    if seed % 3 == 0:
        u = gen.random_uint32(seed, ("decode-test-special",), (4,))
        out[1 + int(u[0] % 2)][u[1] % g, u[2] % min(cap, 1 + seed % cap), 0] = b[34 + u[3] % 6]
    return tuple(out)


@pytest.mark.parametrize("kind", ["random", "boundary"])
@pytest.mark.parametrize("h,g", [(4, 2), (2, 2), (2, 1)])
def test_decode_attention_gives_the_bits_of_the_composition_generate_used(kind, h, g):
    cap, dh = 100, 8
    for trial, (n, window) in enumerate([(n, w) for n in (1, 2, 31, 32, 33, 63, 64, 65, 96, 97, 100)
                                         for w in (None, 0, 1, 16, 31, 32, 33, 64, 99, 100, 200)]):
        q, k, v = _decode_inputs(kind, h, g, cap, dh, trial)
        got = spec.decode_attention(q, k, v, n, window)
        want = _composition_generate_used(q, k, v, n, window)
        assert got.dtype == np.float32 and got.shape == (h, dh)
        assert got.tobytes() == want.tobytes(), (kind, h, g, n, window)


@pytest.mark.parametrize("window", [None, 1, 5, 32, 33])
def test_decode_attention_is_the_last_row_of_attention_forward(window):
    """Finite inputs: query n - 1 over the first n positions, as the training forward computes it
    (the keys before j0 absent there, and +0.0 lanes here: the same bits)."""
    h, g, dh, cap = 4, 2, 8, 72
    for n in (1, 7, 32, 33, 40, 64, 65, 72):
        q, k, v = (gen.random_normal_range(n, ("decode-last-row", i), s, -2, 2)
                   for i, s in enumerate(((1, h, n, dh), (1, g, cap, dh), (1, g, cap, dh))))
        o = spec.attention_forward(q, k[:, :, :n], v[:, :, :n], window)[0]
        got = spec.decode_attention(q[0, :, n - 1], k[0], v[0], n, window)
        assert got.tobytes() == np.ascontiguousarray(o[0, :, n - 1]).tobytes(), (n, window)


def test_decode_attention_never_reads_past_n():
    q, k, v = _decode_inputs("random", 2, 1, 40, 4, 0)
    want = spec.decode_attention(q, k, v, 20, None)
    k2, v2 = k.copy(), v.copy()
    k2[:, 20:], v2[:, 20:] = np.nan, np.inf
    assert spec.decode_attention(q, k2, v2, 20, None).tobytes() == want.tobytes()


@pytest.mark.parametrize("args, match", [
    (((1, 1), (1, 2, 1), (1, 2, 1), 0, None), "n = 0"),
    (((1, 1), (1, 2, 1), (1, 2, 1), 3, None), "n = 3"),
    (((1, 1), (1, 2, 1), (1, 2, 1), True, None), "must be an int"),
    (((1, 1), (1, 2, 1), (1, 2, 1), 1.0, None), "must be an int"),
    (((1, 1), (1, 2, 1), (1, 2, 1), 1, 2.5), "window must be an int or None"),
    (((1, 1), (1, 2, 1), (1, 2, 1), 1, True), "window must be an int or None"),
    (((3, 1), (2, 2, 1), (2, 2, 1), 1, None), "not a positive multiple"),
    (((0, 1), (1, 2, 1), (1, 2, 1), 1, None), "not a positive multiple"),
    (((1, 0), (1, 2, 0), (1, 2, 0), 1, None), "Dh >= 1"),
    (((1, 2), (1, 2, 1), (1, 2, 2), 1, None), "must both be"),
    (((1, 1), (1, 2, 1), (1, 3, 1), 1, None), "must both be"),
    (((1, 1, 1, 1), (1, 2, 1), (1, 2, 1), 1, None), r"q \(H, Dh\)"),
])
def test_decode_attention_refuses_bad_input(args, match):
    q, k, v, n, window = args
    q, k, v = (np.zeros(s, np.float32) for s in (q, k, v))
    with pytest.raises(ValueError, match=match):
        spec.decode_attention(q, k, v, n, window)
