"""Normal and truncated-normal samplers: accuracy of the transform, statistics, purity.

Statistical tolerances are 5 standard errors of the estimator for N samples
(a fixed seed makes each check deterministic; 5 sigma means a correct sampler
would fail with probability < 1e-6 for a fresh seed):
  mean: sd/sqrt(N);  variance: sqrt(2/N) (normal kurtosis; the truncated
  normal's is smaller, so this over-covers);  empirical CDF at a point x:
  sqrt(F(x) (1 - F(x)) / N).
"""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import numpy as np
import pytest

from lockstep.spec import fp, rng
from lockstep.spec.philox import PhiloxStream

F32 = np.float32
N = 1 << 18
STD_NORMAL = statistics.NormalDist()


def bits(x):
    return np.asarray(x, dtype=F32).view(np.uint32)


def odd_uniforms(j: np.ndarray) -> np.ndarray:
    """The uniforms uniform_open_from_uint32 produces: (2j + 1) * 2**-24, j < 2**23."""
    return (2 * j.astype(np.int64) + 1).astype(F32) * F32(2.0**-24)


def check_moments_and_quantiles(z, mean, var, cdf, quantile_points):
    n = z.size
    z64 = z.astype(np.float64)
    assert abs(z64.mean() - mean) <= 5 * math.sqrt(var / n)
    assert abs(z64.var() - var) <= 5 * math.sqrt(2.0 / n)
    for x in quantile_points:
        f = cdf(x)
        assert abs(np.mean(z64 <= x) - f) <= 5 * math.sqrt(f * (1 - f) / n) + 1e-12, x


# ---------------------------------------------------------------------------
# The float32 inverse CDF


def test_inverse_cdf_accuracy_on_the_uniform_grid():
    # every 61st of the 2**23 possible uniforms, plus the 2000 at each end (the tails)
    j = np.concatenate([np.arange(0, 1 << 23, 61), np.arange(2000), np.arange((1 << 23) - 2000, 1 << 23)])
    u = odd_uniforms(j)
    z = rng.normal_from_centered(fp.sub(u, F32(0.5)))
    ref = np.array([STD_NORMAL.inv_cdf(float(v)) for v in u.astype(np.float64)])
    err = np.abs(z.astype(np.float64) - ref)
    # float32 evaluation of Acklam (whose own error is 1.15e-9 relative):
    # measured max 4e-7 relative, 1.1e-6 absolute (~7 float32 ulps at worst)
    assert np.max(err / np.maximum(np.abs(ref), 1.0)) <= 1.2e-6
    assert np.max(err / np.abs(ref)) <= 1e-6
    # extremes: u = 2**-24 and 1 - 2**-24
    assert abs(float(z[np.argmin(u)]) - STD_NORMAL.inv_cdf(2.0**-24)) <= 2e-6


def test_inverse_cdf_is_exactly_odd_and_monotone():
    j = np.arange(0, 1 << 23, 17)
    q = fp.sub(odd_uniforms(j), F32(0.5))
    z = rng.normal_from_centered(q)
    assert np.array_equal(bits(rng.normal_from_centered(fp.neg(q))), bits(fp.neg(z)))
    assert np.all(np.diff(z.astype(np.float64)) >= 0)  # across the central/tail switch too


def test_inverse_cdf_domain():
    q = np.array([0.0, -0.0, 0.5, -0.5, 0.75, np.nan, np.inf], dtype=F32)
    z = rng.normal_from_centered(q)
    assert bits(z).tolist() == [0, 0x80000000] + [0x7FC00000] * 5


def test_central_coefficients_are_acklams_re_expanded():
    """ACKLAM_A/B are Acklam's A(r), B(r) rewritten in t = 1/4 - r, rounded to float32."""
    for published, stored in ((rng.ACKLAM_PUBLISHED_A, rng.ACKLAM_A), (rng.ACKLAM_PUBLISHED_B, rng.ACKLAM_B)):
        c = [Fraction(v) for v in published][::-1]  # lowest degree first
        shifted = [Fraction(0)] * len(c)
        for i, ci in enumerate(c):  # ci * (1/4 - t)**i
            for k in range(i + 1):
                shifted[k] += ci * math.comb(i, k) * Fraction(1, 4) ** (i - k) * (-1) ** k
        assert [F32(float(v)) for v in shifted[::-1]] == list(stored)
        assert all(v > 0 for v in shifted)  # no cancellation in float32 Horner


# ---------------------------------------------------------------------------
# normal


def test_normal_statistics():
    z = rng.normal(PhiloxStream(2026, "test", "normal"), 0, N)
    assert z.dtype == F32 and z.shape == (N,)
    check_moments_and_quantiles(z, 0.0, 1.0, STD_NORMAL.cdf, [-3, -2, -1, -0.5, 0, 0.5, 1, 2, 3])
    assert np.abs(z).max() <= 5.2948


def test_normal_purity_and_independence():
    s = PhiloxStream(7, "init", "w")
    batch = rng.normal(s, 0, 1000)
    for i in (0, 1, 2, 3, 4, 5, 517, 999):
        assert bits(rng.normal(s, i, 1))[0] == bits(batch)[i]
    assert np.array_equal(bits(rng.normal(s, 37, 300)), bits(batch[37:337]))
    # a fresh stream object with the same key gives the same values
    assert np.array_equal(bits(rng.normal(PhiloxStream(7, "init", "w"), 0, 1000)), bits(batch))
    # another purpose, another sample
    other = rng.normal(PhiloxStream(7, "init", "v"), 0, 1000)
    assert np.mean(bits(other) == bits(batch)) < 0.01
    assert rng.normal(s, 10**12, 4).shape == (4,)  # far into the stream
    assert rng.normal(s, 5, 0).shape == (0,)


# ---------------------------------------------------------------------------
# truncated_normal


@pytest.mark.parametrize("bound", [2.0, 1.0, 3.0])
def test_truncated_normal_statistics_and_bound(bound):
    z = rng.truncated_normal(PhiloxStream(2026, "test", "trunc", str(bound)), 0, N, bound=bound)
    assert z.dtype == F32
    assert np.all(np.abs(z) <= F32(bound))
    assert np.abs(z).max() >= bound * (1 - 1e-3)  # reaches the bound (expected ~100 within 0.1%)
    mass = 2 * STD_NORMAL.cdf(bound) - 1
    pdf_b = math.exp(-bound * bound / 2) / math.sqrt(2 * math.pi)
    var = 1 - 2 * bound * pdf_b / mass

    def cdf(x):
        return (STD_NORMAL.cdf(x) - STD_NORMAL.cdf(-bound)) / mass

    pts = [v * bound for v in (-0.9, -0.5, -0.1, 0.0, 0.3, 0.7, 0.95)]
    check_moments_and_quantiles(z, 0.0, var, cdf, pts)


def test_truncated_normal_purity_constants_and_errors():
    s = PhiloxStream(11, "init", "emb")
    batch = rng.truncated_normal(s, 0, 500, bound=2.0)
    for i in (0, 3, 4, 250, 499):
        assert bits(rng.truncated_normal(s, i, 1, bound=2.0))[0] == bits(batch)[i]
    mass, b32 = rng.truncated_normal_constants(2.0)
    assert mass == F32(math.erf(2.0 / math.sqrt(2.0))) and b32 == F32(2.0)
    # a huge bound: the mass rounds to 1 and the sample is the plain normal one
    assert np.array_equal(bits(rng.truncated_normal(s, 0, 500, bound=50.0)), bits(rng.normal(s, 0, 500)))
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            rng.truncated_normal(s, 0, 10, bound=bad)


def test_inverse_cdf_shapes():
    assert rng.normal_from_centered(F32(0.25)).shape == ()
    q = np.linspace(-0.49, 0.49, 12).astype(F32).reshape(3, 4)
    z = rng.normal_from_centered(q)
    assert z.shape == (3, 4) and np.array_equal(bits(z.reshape(-1)), bits(rng.normal_from_centered(q.reshape(-1))))
