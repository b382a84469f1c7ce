"""``spec.optim``: AdamW against float64, the norm and clipping by hand."""

import numpy as np

from lockstep import spec
from lockstep.conformance import inputs as gen

F64 = np.float64


def test_sum_of_squares_and_global_norm_by_hand():
    """Small integers: every square and partial sum is exact, so the results are the integers'."""
    assert spec.sum_of_squares(np.array([1.0, 2.0, 3.0], np.float32)) == np.float32(14.0)
    assert spec.global_norm([np.float32(9.0), np.float32(16.0)]) == np.float32(5.0)  # sqrt(25), exact


def test_clip_coefficient_by_hand():
    """min(1, max_norm / (norm + 1e-6)): 1 below the threshold; 1 / (3 + 1e-6) rounded once above."""
    assert spec.clip_coefficient(np.float32(0.5), 1.0) == np.float32(1.0)
    want = np.float32(np.float32(1.0) / (np.float32(3.0) + np.float32(1e-6)))
    assert spec.clip_coefficient(np.float32(3.0), 1.0).tobytes() == np.asarray(want).tobytes()


def test_adamw_matches_float64():
    """m = b1*m + (1-b1)*g: two products and a sum, 3 roundings of 2**-24 on terms of at most
    |b1 m| + |(1-b1) g| (the sum can cancel, so the bound is absolute); v: the same on positive
    terms, 4 roundings (relative). u = (m / bc1) / (sqrt(v / bc2) + eps) with v >= 0.01 keeps the
    denominator >= 0.3, and |lr * u| stays below |p|, so p = p - lr * (u + wd p) is within
    1e-6 of |p| + |lr u| (about 16 ulp; the chain has a dozen roundings)."""
    shape = (1000,)
    p = gen.random_uniform(0, ("adamw-test", "p"), shape, 0.5, 1.5).astype(F64)
    g = gen.random_uniform(0, ("adamw-test", "g"), shape).astype(F64)
    m = gen.random_uniform(0, ("adamw-test", "m"), shape, -0.1, 0.1).astype(F64)
    v = gen.random_uniform(0, ("adamw-test", "v"), shape, 0.01, 0.1).astype(F64)
    s = [np.float32(x) for x in (1e-3, 0.9, 0.95, 0.1, 0.05, 1e-8, 0.1, 0.19, 0.0975)]
    p1, m1, v1 = spec.adamw_update(*(x.astype(np.float32) for x in (p, g, m, v)), *s)
    lr, b1, b2, omb1, omb2, eps, wd, bc1, bc2 = (float(x) for x in s)
    m64 = b1 * m + omb1 * g
    v64 = b2 * v + omb2 * g * g
    u64 = (m64 / bc1) / (np.sqrt(v64 / bc2) + eps)
    p64 = p - lr * (u64 + wd * p)
    assert (np.abs(m1 - m64) <= 3 * 2.0**-24 * (np.abs(b1 * m) + np.abs(omb1 * g))).all()
    assert (np.abs(v1 - v64) <= 4 * 2.0**-24 * v64).all()  # b2*v, g*g, (1-b2)*gg, the sum
    assert (np.abs(p1 - p64) <= 1e-6 * (np.abs(p) + np.abs(lr * u64))).all()
