"""``spec.norm``: RMSNorm against float64, and a hand case."""

import numpy as np

from lockstep import spec
from lockstep.conformance import inputs as gen

F64 = np.float64
EPS = 1e-6


def _case(rows=6, d=64):
    x = gen.random_uniform(0, ("norm-test", "x"), (rows, d), -2, 2)
    gain = gen.random_uniform(0, ("norm-test", "g"), (d,), 0.5, 1.5)
    dy = gen.random_uniform(0, ("norm-test", "dy"), (rows, d))
    return x, gain, dy


def test_constant_rows_normalize_to_exactly_one():
    """x = 2 everywhere, eps = 0: ss = 4 * 4 = 16, ms = 4, sqrt = 2, rstd = 0.5, y = 2 * 0.5 = 1, all exact."""
    y, rstd = spec.rmsnorm_forward(np.full((2, 4), 2.0, np.float32), None, 0.0)
    assert y.tobytes() == np.ones((2, 4), np.float32).tobytes()
    assert rstd.tobytes() == np.full(2, 0.5, np.float32).tobytes()


def test_forward_matches_float64():
    """Positive quantities only up to rstd (squares, a lane tree of 64 of them: 7 rounding levels,
    a division, an add, a sqrt, a division) and two products after: at most ~13 roundings of
    2**-24 each, so 1e-6 relative (about 17 ulp) bounds every output."""
    x, gain, _ = _case()
    y, rstd = spec.rmsnorm_forward(x, gain, EPS)
    x64 = x.astype(F64)
    rstd64 = 1 / np.sqrt((x64 * x64).mean(axis=-1) + np.float32(EPS))
    y64 = x64 * rstd64[:, None] * gain
    assert np.abs(rstd - rstd64).max() <= 1e-6 * np.abs(rstd64).max()
    assert (np.abs(y - y64) <= 1e-6 * np.abs(y64) + 1e-30).all()


def test_backward_matches_float64_gradient():
    """dx = rstd * (gy - xhat * mean(gy * xhat)) has a difference that can cancel, so the bound is
    absolute: a dozen roundings on terms no larger than rstd * max|gy| * (1 + max xhat**2) ~ 4,
    hence 2e-6 times that scale. dgain (a column sum of 6 products) within 1e-6 of its scale."""
    x, gain, dy = _case()
    _, rstd = spec.rmsnorm_forward(x, gain, EPS)
    dx, dgain = spec.rmsnorm_backward(dy, x, gain, rstd)
    x64, dy64 = x.astype(F64), dy.astype(F64)
    r64 = rstd.astype(F64)[:, None]
    xhat = x64 * r64
    gy = dy64 * gain
    dx64 = r64 * (gy - xhat * (gy * xhat).mean(axis=-1, keepdims=True))
    scale = float((r64 * np.abs(gy).max(axis=-1, keepdims=True) * (1 + (xhat**2).max(axis=-1, keepdims=True))).max())
    assert np.abs(dx - dx64).max() <= 2e-6 * scale
    dgain64 = (dy64 * xhat).sum(axis=0)
    assert np.abs(dgain - dgain64).max() <= 1e-6 * np.abs(dy64 * xhat).sum(axis=0).max()
