"""``spec.swiglu``: silu(gate) * up against float64, a hand case, the backward against float64."""

import numpy as np

from lockstep import spec
from lockstep.conformance import inputs as gen

F64 = np.float64
F = 48


def _gu():
    return gen.random_uniform(0, ("swiglu-test", "gu"), (5, 2 * F), -8, 8)


def _sigmoid64(x):
    return 1 / (1 + np.exp(-x))


def test_zero_gate_gives_a_zero_of_up_s_sign():
    """sigmoid(0) = 1 / (1 + exp(-0)) = 1 / 2 exactly, silu(0) = 0 * 0.5 = +0, h = +0 * up."""
    gu = np.concatenate([np.zeros((1, 3), np.float32), np.array([[2.0, -3.0, 0.5]], np.float32)], axis=1)
    h = spec.swiglu_forward(gu)
    assert h.view(np.uint32).tolist() == [[0x00000000, 0x80000000, 0x00000000]]


def test_forward_matches_float64():
    """silu = g * (1 / (1 + exp(-g))): exp within 0.531 ulp, then an add, a division and two
    products: 5 roundings and a bit, so 4e-7 relative; the add 1 + exp(-g) does not cancel."""
    gu = _gu()
    h = spec.swiglu_forward(gu).astype(F64)
    g, u = gu[:, :F].astype(F64), gu[:, F:].astype(F64)
    want = g * _sigmoid64(g) * u
    assert (np.abs(h - want) <= 4e-7 * np.abs(want) + 1e-38).all()


def test_backward_matches_float64():
    """dup = dh * silu(g): as the forward (4e-7 relative). dgate = (dh * up) * s * (1 + g (1 - s)):
    1 + g (1 - s) cancels near g = -1.28, so the bound is absolute, 1e-6 times
    |dh up| s (1 + |g| (1 - s)), the size of the terms before they cancel."""
    gu = _gu()
    dh = gen.random_uniform(0, ("swiglu-test", "dh"), (5, F))
    d = spec.swiglu_backward(dh, gu).astype(F64)
    g, u, dh64 = gu[:, :F].astype(F64), gu[:, F:].astype(F64), dh.astype(F64)
    s = _sigmoid64(g)
    dup = dh64 * g * s
    dgate = dh64 * u * s * (1 + g * (1 - s))
    assert (np.abs(d[:, F:] - dup) <= 4e-7 * np.abs(dup) + 1e-38).all()
    assert (np.abs(d[:, :F] - dgate) <= 1e-6 * np.abs(dh64 * u) * s * (1 + np.abs(g) * (1 - s)) + 1e-38).all()
