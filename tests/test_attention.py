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
