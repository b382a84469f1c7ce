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
ERF_SERIES_MAX = 1.5
ERF_SERIES_TERMS = 50  # |x| < 1.5: the omitted terms are below 2**-60 of the sum
ERF_CF_TERMS = 100  # 1.5 <= |x| < 6: the continued fraction has converged (< 2**-60)
ERF_SATURATION = 6.0
SQRT1_2 = _from_bits(0x3FE6A09E667F3BCD)  # 1/sqrt(2) = 0.7071067811865476



def erf(x):
    """float64 error function from ``+ - * /`` and this module's ``exp``.

    Used for constants that are then rounded to float32 (the truncated normal's
    probability mass), so it is plain rather than perfect: within 4 float64 ulp
    (measured max 3.4, tests/test_hostmath.py). For ``a = |x|``:

    * ``a < 1.5``: the everywhere-positive series
      ``erf(a) = 2/sqrt(pi) * a * exp(-a*a) * sum_n (2a*a)**n / (1*3*5*...*(2n+1))``;
    * ``1.5 <= a < 6``: ``erf(a) = 1 - erfc(a)`` with the continued fraction
      ``erfc(a) = exp(-a*a) / sqrt(pi) / (a + (1/2)/(a + (2/2)/(a + (3/2)/(a + ...))))``;
    * ``a >= 6``: 1.

    Order of operations::

        (X_hi, X_lo) = two_prod(a, a)                  # exact square
        series:  S = 1;  for n = ERF_SERIES_TERMS-1 down to 1:  S = 1 + ((2 * X_hi) / (2n + 1)) * S
                 y = ((TWO_OVER_SQRT_PI * a) * exp(-X_hi)) * S
        fraction: K = a; for n = ERF_CF_TERMS down to 1:  K = a + (0.5 * n) / K
                 y = 1 - (exp(-(X_hi + X_lo)) * INV_SQRT_PI) / K   # exp of a double-double
        result = y with the sign of x;  NaN -> NaN

    The series uses the same rounded X_hi in exp(-X_hi) and in S(X_hi), which
    cancels X_hi's rounding error to first order (exp(-X) * S(X) varies slowly).
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
