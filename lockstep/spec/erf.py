"""float64 host ``erf`` and the normal CDF, from ``+ - * /`` and ``hostmath``'s exp.

Only the truncated normal's constants use them (``rng.truncated_normal_constants``:
the probability mass inside the bound, rounded once to float32), so they are plain
rather than perfect; the building blocks (``_two_prod``, the double-double exp) are
``hostmath``'s, under the same rules: IEEE float64, no FMA, no libm.
"""

from __future__ import annotations

import numpy as np

from .hostmath import _args, _exp_dd, _from_bits, _ret, _two_prod

# erf: below ERF_SERIES_MAX a positive power series, above it a continued
# fraction for erfc; from ERF_SATURATION on erf rounds to +-1 in float64
# (1 - erf(6) = 2.2e-17 < 2**-54).
TWO_OVER_SQRT_PI = _from_bits(0x3FF20DD750429B6D)  # 2/sqrt(pi) = 1.1283791670955126
INV_SQRT_PI = _from_bits(0x3FE20DD750429B6D)  # 1/sqrt(pi) = 0.5641895835477563
ERF_SERIES_MAX = 1.5  # 0x3FF8000000000000
# The term counts are part of the definition (the erf docstring says why these values).
ERF_SERIES_TERMS = 50  # |x| < 1.5: terms n = 0..49; the first omitted is < 2**-161 of the sum
ERF_CF_TERMS = 100  # 1.5 <= |x| < 6: 100 levels; erf's truncation error < 2**-60.7 at 1.5
ERF_SATURATION = 6.0  # 0x4018000000000000
SQRT1_2 = _from_bits(0x3FE6A09E667F3BCD)  # 1/sqrt(2) = 0.7071067811865476



def erf(x):
    """float64 error function from ``+ - * /`` and ``hostmath._exp_dd``.

    Used for constants that are then rounded to float32 (the truncated normal's
    probability mass), so it is plain rather than perfect: within 4 float64 ulp
    (measured max 3.4, tests/test_hostmath.py). For ``a = |x|``:

    * ``a < 1.5``: the everywhere-positive series
      ``erf(a) = 2/sqrt(pi) * a * exp(-a*a) * sum_n (2a*a)**n / (1*3*5*...*(2n+1))``;
    * ``1.5 <= a < 6``: ``erf(a) = 1 - erfc(a)`` with the continued fraction
      ``erfc(a) = exp(-a*a) / sqrt(pi) / (a + (1/2)/(a + (2/2)/(a + (3/2)/(a + ...))))``;
    * ``a >= 6`` (``+inf`` included): 1.

    Order of operations (``exp_dd(hi, lo)`` is ``hostmath._exp_dd``, e**(hi + lo))::

        (X_hi, X_lo) = two_prod(a, a)                  # exact square; a := 0 if a >= 6 or NaN
        series:  S = 1;  for n = ERF_SERIES_TERMS-1 down to 1:  S = 1 + ((2 * X_hi) / (2n + 1)) * S
                 y = ((TWO_OVER_SQRT_PI * a) * exp_dd(-X_hi, 0)) * S
        fraction: K = a (1 if a == 0); for n = ERF_CF_TERMS down to 1:  K = a + (0.5 * n) / K
                 y = 1 - (exp_dd(-X_hi, -X_lo) * INV_SQRT_PI) / K
        y = series if a < ERF_SERIES_MAX else fraction;  y = 1 if a >= ERF_SATURATION
        result = -y if x < 0 else y;  NaN -> NaN

    The sign comes from the comparison ``x < 0``, not from x's sign bit, so
    ``erf(-0.0)`` is ``+0.0`` (the series gives ``+0.0`` at ``a = 0``); every other
    non-NaN argument has ``erf(-x) == -erf(x)``. No published bit depends on it: the spec
    calls ``erf`` only at ``b * SQRT1_2`` for a truncation bound ``b > 0``.

    The series uses the same rounded X_hi in exp(-X_hi) and in S(X_hi), which
    cancels X_hi's rounding error to first order (exp(-X) * S(X) varies slowly).

    The term counts are definitions, not derived from an accuracy target; a port must
    use these exact values. ``ERF_SERIES_TERMS = 50`` (the terms n = 0..49) is far
    more than needed: at ``a = 1.5``, where the series converges slowest, the first
    omitted term is below ``2**-161`` of the sum, and on 400,000 sampled arguments
    every count from 28 on gives the same bits. ``ERF_CF_TERMS = 100`` levels: at
    ``a = 1.5``, where the fraction converges slowest, the truncated fraction's erfc
    is within ``2**-55.8`` of the exact erfc relatively, so erf within ``2**-60.7``
    absolutely (about 1/200 of its ulp, 2**-53). More levels move the real value by
    less than that, but change the float64 roundings along the way: 114 or 200
    levels give results 1 ulp away from 100's for about 0.15% of arguments in
    [1.5, 1.6) (0.003% over [1.5, 6); tests/test_hostmath.py finds some).
    """
    (x,), how = _args(x)
    with np.errstate(all="ignore"):
        a = np.abs(x)
        ac = np.where(a < ERF_SATURATION, a, 0.0)
        x2_hi, x2_lo = _two_prod(ac, ac)

        S = np.ones_like(ac)
        two_X = 2.0 * x2_hi
        for n in range(ERF_SERIES_TERMS - 1, 0, -1):
            S = 1.0 + (two_X / float(2 * n + 1)) * S
        y_series = ((TWO_OVER_SQRT_PI * ac) * _exp_dd(-x2_hi, np.zeros_like(ac))) * S

        K = np.where(ac > 0, ac, 1.0)
        for n in range(ERF_CF_TERMS, 0, -1):
            K = ac + (0.5 * n) / K
        y_fraction = 1.0 - (_exp_dd(-x2_hi, -x2_lo) * INV_SQRT_PI) / K

        y = np.where(a < ERF_SERIES_MAX, y_series, y_fraction)
        y = np.where(a >= ERF_SATURATION, 1.0, y)
        y = np.where(x < 0, -y, y)
        y = np.where(np.isnan(x), np.nan, y)
    return _ret(y, how)


def normal_cdf(x):
    """Standard normal CDF ``Phi(x) = (1 + erf(x * SQRT1_2)) / 2`` (float64, host).

    Order: ``t = x * SQRT1_2``; ``y = 0.5 * (1.0 + erf(t))``. Accurate in absolute
    terms (not for the far lower tail, where 1 + erf cancels).
    """
    (x,), how = _args(x)
    with np.errstate(all="ignore"):
        y = 0.5 * (1.0 + erf(x * SQRT1_2))
    return _ret(y, how)
