"""``spec.rope``: the tables against float64, the rotation by hand and against float64."""

import numpy as np

from lockstep import spec
from lockstep.conformance import inputs as gen
from lockstep.spec.rope import rope_tables

F64 = np.float64
T, DH, THETA = 32, 16, 10000.0


def _x():
    return gen.random_uniform(0, ("rope-test", "x"), (2, 3, T, DH), -2, 2)


def test_tables_are_float64_cos_and_sin_rounded_once():
    """hostmath's float64 cos/sin are within a few float64 ulps of libm's; rounding to float32
    adds at most half a float32 ulp (2**-25 at |value| <= 1)."""
    cos, sin = rope_tables(T, DH, THETA)
    freq = THETA ** (-(2.0 * np.arange(DH // 2)) / DH)
    angle = np.arange(T, dtype=F64)[:, None] * freq[None, :]
    assert np.abs(cos - np.cos(angle)).max() <= 2.0**-25 + 1e-12
    assert np.abs(sin - np.sin(angle)).max() <= 2.0**-25 + 1e-12


def test_position_zero_is_left_as_it_is():
    """cos 0 = 1 and sin 0 = 0 exactly: y1 = x1 * 1 - x2 * 0 = x1 (x1 nonzero), the same for y2."""
    x = _x()
    cos, sin = rope_tables(T, DH, THETA)
    y = spec.rope_forward(x, cos, sin)
    assert y[..., 0, :].tobytes() == x[..., 0, :].tobytes()


def test_rotation_matches_float64_on_the_same_tables():
    """y1 = x1 cos - x2 sin: two rounded products and a rounded difference, so
    |y1 - exact| <= 2 * 2**-24 * (|x1 cos| + |x2 sin|); y2 = x2 cos + x1 sin likewise."""
    x = _x()
    cos, sin = rope_tables(T, DH, THETA)
    y = spec.rope_forward(x, cos, sin).astype(F64)
    x1, x2 = x[..., : DH // 2].astype(F64), x[..., DH // 2:].astype(F64)
    c, s = cos.astype(F64), sin.astype(F64)
    bound1 = 2 * 2.0**-24 * (np.abs(x1 * c) + np.abs(x2 * s))
    bound2 = 2 * 2.0**-24 * (np.abs(x2 * c) + np.abs(x1 * s))
    assert (np.abs(y[..., : DH // 2] - (x1 * c - x2 * s)) <= bound1).all()
    assert (np.abs(y[..., DH // 2:] - (x2 * c + x1 * s)) <= bound2).all()


def test_backward_rotates_back():
    """rope_backward is the transpose (rotation by -angle): applied to the forward's output it
    returns x up to the two rotations' roundings and cos**2 + sin**2 = 1 of the rounded
    tables (each within 2**-24): 8 * 2**-24 relative to max |x|."""
    x = _x()
    cos, sin = rope_tables(T, DH, THETA)
    back = spec.rope_backward(spec.rope_forward(x, cos, sin), cos, sin)
    assert np.abs(back - x).max() <= 8 * 2.0**-24 * np.abs(x).max()
