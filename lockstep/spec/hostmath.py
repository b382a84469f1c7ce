"""float64 host math: ``exp``, ``log``, ``pow``, ``sin``, ``cos``, ``sinpi``, ``cospi`` (``erf``: ``spec.erf``).

The host computes a few scalars and tables in float64 before they enter the
device as float32: the learning-rate schedule (a cosine), AdamW's bias
corrections (``beta**t``), RoPE tables (``theta**(-2i/d)`` and sin/cos of angles
up to ~1e5 rad). libm's ``exp``/``sin``/``pow`` differ between platforms in the last
bit, and one flipped float64 bit can flip the float32 it rounds to. So these are
defined here from float64 ``+ - * /`` (IEEE, round to nearest even, no FMA) and
exact bit manipulation only, in a fixed order, like the float32 spec.

Arguments are Python numbers (a Python ``float`` comes back) or float64 arrays
(an array of the broadcast shape comes back). Accuracy, measured against
mpmath (tests/test_hostmath.py): exp, log, pow within 0.52 ulp of the exact
result; sin, cos, sinpi, cospi within 0.7 ulp; erf (only used for float32
constants) within 4 ulp.
float64 subnormals are *not* flushed here (the host is IEEE); the float32 flush
happens when a value enters the spec through ``fp.f32``.

Building blocks, all error-free in round-to-nearest binary64 (no FMA needed):

* ``_two_sum(a, b)``: s + e == a + b exactly (Knuth, 6 ops);
* ``_fast_two_sum(a, b)``: the same when ``|a| >= |b|`` (Dekker, 3 ops);
* ``_split(a)``: a == hi + lo with hi, lo of <= 26 bits each (Veltkamp, factor
  2**27 + 1), for |a| < 2**995;
* ``_two_prod(a, b)``: p + e == a * b exactly (Dekker, via ``_split``).

A "double-double" (hi, lo) carries ~106 bits; ``log`` and ``exp`` use them inside
``pow`` so that ``y * log(x)`` keeps its accuracy when it is large.
"""

from __future__ import annotations

import numpy as np

F64 = np.float64


def _factorial(n: int) -> int:
    """n! as an exact Python integer (for deriving series coefficients)."""
    out = 1
    for i in range(2, n + 1):
        out *= i
    return out


def _from_bits(pattern: int) -> float:
    """The float64 with bit pattern ``pattern`` (a Python float)."""
    return float(np.array([pattern], dtype=np.uint64).view(F64)[0])


# ---------------------------------------------------------------------------
# Constants. Each float64 is given by its bit pattern beside it (in _from_bits, in
# the comment, or, for a tuple, in the comment below it, in order) and by its
# decimal or the real number it stands for (tests/test_hostmath.py checks the bits).

# ln 2 split for Cody-Waite: LN2_HI = round(ln2 * 2**42) / 2**42 has 42
# significant bits, so k * LN2_HI is exact for |k| < 2**11 (every exponent we
# meet); LN2_LO = ln2 - LN2_HI rounded to float64.
LN2_HI = _from_bits(0x3FE62E42FEFA3800)  # 0.6931471805598903
LN2_LO = _from_bits(0x3D2EF35793C76730)  # 5.497923018708371e-14
INV_LN2 = _from_bits(0x3FF71547652B82FE)  # 1/ln2 = 1.4426950408889634
# 1.5 * 2**52: (v + ROUND_MAGIC) - ROUND_MAGIC rounds |v| < 2**51 to the nearest
# integer, ties to even (the sum has ulp 1).
ROUND_MAGIC = _from_bits(0x4338000000000000)  # 6755399441055744.0

# exp saturates outside [EXP_ARG_MIN, EXP_ARG_MAX]: exp(710) > 2**1024 overflows,
# exp(-746) < 2**-1075 rounds to 0. The argument is clamped to them first.
EXP_ARG_MAX = 710.0  # 0x4086300000000000
EXP_ARG_MIN = -746.0  # 0xC087500000000000

# 1/n! for the Taylor series of exp on |r| <= 0.3466 (terms after 1/14! are
# below 2**-66 there). Each is 1.0 / float(n!) -- n! is exact in float64 for
# n <= 22, so each is the float64 nearest 1/n!.
EXP_INV_FACTORIALS = tuple(1.0 / float(_factorial(n)) for n in range(3, 15))  # 1/3! .. 1/14!
# EXP_INV_FACTORIALS as float64 bit patterns, in order:
# 0x3FC5555555555555 0x3FA5555555555555 0x3F81111111111111 0x3F56C16C16C16C17
# 0x3F2A01A01A01A01A 0x3EFA01A01A01A01A 0x3EC71DE3A556C734 0x3E927E4FB7789F5C
# 0x3E5AE64567F544E4 0x3E21EED8EFF8D898 0x3DE6124613A86D09 0x3DA93974A8C07C9D

# log: a significand m >= 0x3FF6A09E667F3BCD (the first float64 above sqrt(2))
# is halved, so m lies in [sqrt(2)/2, sqrt(2)).
LOG_SQRT2_MANTISSA = np.uint64(0x6A09E667F3BCD)
# 2/(2n+1) for n = 2..13, the atanh series 2*atanh(s) = 2s + 2s**3/3 + 2s**5/5 + ...
# beyond the 2/3 term; with s**2 <= 0.0295 the terms after 2/27 are below 2**-70.
LOG_ATANH_COEFFS = tuple(2.0 / (2 * n + 1) for n in range(2, 14))  # 2/5 .. 2/27
# LOG_ATANH_COEFFS as float64 bit patterns, in order:
# 0x3FD999999999999A 0x3FD2492492492492 0x3FCC71C71C71C71C 0x3FC745D1745D1746
# 0x3FC3B13B13B13B14 0x3FC1111111111111 0x3FBE1E1E1E1E1E1E 0x3FBAF286BCA1AF28
# 0x3FB8618618618618 0x3FB642C8590B2164 0x3FB47AE147AE147B 0x3FB2F684BDA12F68
TWO_THIRDS_HI = 2.0 / 3.0  # 0x3FE5555555555555 = 0.6666666666666666
TWO_THIRDS_LO = _from_bits(0x3C85555555555555)  # 2/3 - TWO_THIRDS_HI = 3.700743415417188e-17
TWO_POW_64 = 18446744073709551616.0  # 2**64 = 0x43F0000000000000: scales subnormal log inputs up

# pi/2 in four parts for Cody-Waite trig reduction. PIO2_1..PIO2_3 are pi/2 (then
# the remainders) *truncated* to 31 significant bits, so k * PIO2_i is exact for
# |k| < 2**22; PIO2_4 is the next remainder rounded to float64. Together they
# are pi/2 to within 7e-46.
PIO2_1 = _from_bits(0x3FF921FB54400000)  # 1.5707963267341256
PIO2_2 = _from_bits(0x3DD0B4611A400000)  # 6.07710050359346e-11
PIO2_3 = _from_bits(0x3BE13198A2C00000)  # 2.9127320548227e-20
PIO2_4 = _from_bits(0x39F01B839A25204A)  # 1.2706558760139879e-29
TWO_OVER_PI = _from_bits(0x3FE45F306DC9C883)  # 2/pi = 0.6366197723675814
# pi/2 as a double-double, for sinpi/cospi (whose reduction is exact).
PIO2_HI = _from_bits(0x3FF921FB54442D18)  # 1.5707963267948966
PIO2_LO = _from_bits(0x3C91A62633145C07)  # 6.123233995736766e-17
# |x| beyond this would need |k| >= 2**22 and lose the exact products k * PIO2_i.
TRIG_MAX_ABS = 4194304.0  # 2**22 = 0x4150000000000000
# sinpi/cospi: |x| up to 2**50 keeps 2x and round(2x) exact small integers.
TRIGPI_MAX_ABS = 1125899906842624.0  # 2**50 = 0x4310000000000000

# Taylor coefficients for the trig kernels on |r| <= pi/4 (+ a little):
# sin r = r + r**3 * (-1/3! + z/5! - ... + z**8/19!),  z = r*r   (next term < 2**-70)
# cos r = 1 - z/2 + z**2 * (1/4! - z/6! + ... + z**8/20!)         (next term < 2**-67)
SIN_COEFFS = tuple((-1.0) ** n / float(_factorial(2 * n + 1)) for n in range(1, 10))  # -1/3! .. +1/19!
# SIN_COEFFS as float64 bit patterns, in order:
# 0xBFC5555555555555 0x3F81111111111111 0xBF2A01A01A01A01A 0x3EC71DE3A556C734
# 0xBE5AE64567F544E4 0x3DE6124613A86D09 0xBD6AE7F3E733B81F 0x3CE952C77030AD4A
# 0xBC62F49B46814157
COS_COEFFS = tuple((-1.0) ** n / float(_factorial(2 * n)) for n in range(2, 11))  # 1/4! .. 1/20!
# COS_COEFFS as float64 bit patterns, in order:
# 0x3FA5555555555555 0xBF56C16C16C16C17 0x3EFA01A01A01A01A 0xBE927E4FB7789F5C
# 0x3E21EED8EFF8D898 0xBDA93974A8C07C9D 0x3D2AE7F3E733B81F 0xBCA6827863B97D97
# 0x3C1E542BA4020225

SPLIT_FACTOR = 134217729.0  # 2**27 + 1 (Veltkamp) = 0x41A0000002000000
MANTISSA_MASK64 = np.uint64(0x000FFFFFFFFFFFFF)
ONE_EXPONENT_FIELD64 = np.uint64(0x3FF0000000000000)  # bits of 1.0
HALF_EXPONENT_FIELD64 = np.uint64(0x3FE0000000000000)  # bits of 0.5
LOW_27_BITS_CLEAR = np.uint64(0xFFFFFFFFF8000000)  # keeps sign, exponent, 25 stored bits


# ---------------------------------------------------------------------------
# Scalars in, scalars out.


def _args(*xs):
    """Flat float64 arrays of the broadcast inputs, and how to shape the answer."""
    scalar = all(np.ndim(x) == 0 for x in xs)
    arrs = np.broadcast_arrays(*[np.asarray(x, dtype=F64) for x in xs])
    shape = arrs[0].shape
    return [np.array(a, dtype=F64).reshape(-1) for a in arrs], (shape, scalar)


def _ret(y: np.ndarray, how):
    shape, scalar = how
    y = np.asarray(y, dtype=F64).reshape(shape)
    return float(y) if scalar else y


# ---------------------------------------------------------------------------
# Error-free transformations.


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a, b):
    s = a + b
    return s, b - (s - a)


def _split(a):
    t = SPLIT_FACTOR * a
    hi = t - (t - a)
    return hi, a - hi


def _two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _dd_add(ah, al, bh, bl):
    s, e = _two_sum(ah, bh)
    return _fast_two_sum(s, e + (al + bl))


def _dd_mul(ah, al, bh, bl):
    p, e = _two_prod(ah, bh)
    return _fast_two_sum(p, e + (ah * bl + al * bh))


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=F64).view(np.uint64)


def _clear_low_27_bits(x: np.ndarray) -> np.ndarray:
    """x with its 27 low mantissa bits cleared: at most 26 significant bits (exact)."""
    return (_bits(x) & LOW_27_BITS_CLEAR).view(F64)


def _pow2(k: np.ndarray) -> np.ndarray:
    """2.0**k for integer arrays -1022 <= k <= 1023 (exact, from the exponent field)."""
    return ((k.astype(np.int64) + 1023).astype(np.uint64) << np.uint64(52)).view(F64)


# ---------------------------------------------------------------------------
# exp


def _exp_dd(x_hi: np.ndarray, x_lo: np.ndarray) -> np.ndarray:
    """float64 ``e**(x_hi + x_lo)`` of a double-double argument (``|x_lo| <= ulp(x_hi)``).

    ``pow`` (the product ``y * log x`` as a double-double) and ``spec.erf`` (``-a*a`` as
    the exact ``two_prod``) call it; ``exp(x)`` is ``_exp_dd(x, 0)``. Order of operations
    (each line one rounded float64 op unless "exact"; the constants are this module's)::

        nan = x_hi is NaN
        xc = min(max(x_hi, EXP_ARG_MIN), EXP_ARG_MAX)   # -746, 710; 0 if nan
        xl = 0 if (x_hi > EXP_ARG_MAX or x_hi < EXP_ARG_MIN or nan) else x_lo
        kf = (xc * INV_LN2 + ROUND_MAGIC) - ROUND_MAGIC # nearest integer k, ties to even
        hi = xc - kf * LN2_HI                           # exact
        lo = kf * LN2_LO - xl                           # the low part enters here, once
        r  = hi - lo;  r_err = (hi - r) - lo
        p  = 1/14!;  p = 1/n! + r * p  for n = 13 down to 3    # EXP_INV_FACTORIALS
        c3 = ((r * r) * r) * p
        r_hi = r with its 27 low mantissa bits cleared;  r_lo = r - r_hi   # exact
        h2_hi = 0.5 * (r_hi * r_hi)                     # exact
        h2_lo = (r_hi * r_lo) + 0.5 * (r_lo * r_lo)
        y1 = 1 + r;      e1 = (1 - y1) + r              # Fast2Sum, exact
        y2 = y1 + h2_hi; e2 = (y1 - y2) + h2_hi         # Fast2Sum, exact
        y  = y2 + ((e1 + e2) + ((h2_lo + c3) + r_err * y1))
        k1 = k + 64 if k < -1000, k - 64 if k > 1000, else k
        result = (y * 2**k1) * 2**(k - k1)              # 2**j from the exponent field, exact
        result = NaN if nan

    So ``+inf`` gives ``+inf`` and ``-inf`` gives ``+0`` (through the clamp), an argument
    above about 709.78 overflows to ``+inf``, and one below about -745.13 underflows
    through IEEE subnormals (not flushed) to 0.
    """
    nan = np.isnan(x_hi)
    out_of_range = (x_hi > EXP_ARG_MAX) | (x_hi < EXP_ARG_MIN) | nan
    xh = np.where(nan, 0.0, np.minimum(np.maximum(x_hi, EXP_ARG_MIN), EXP_ARG_MAX))
    xl = np.where(out_of_range, 0.0, x_lo)

    kf = (xh * INV_LN2 + ROUND_MAGIC) - ROUND_MAGIC
    hi = xh - kf * LN2_HI  # exact
    lo = kf * LN2_LO - xl
    r = hi - lo
    r_err = (hi - r) - lo

    p = EXP_INV_FACTORIALS[-1]
    for c in EXP_INV_FACTORIALS[-2::-1]:
        p = c + r * p
    c3 = ((r * r) * r) * p

    r_hi = _clear_low_27_bits(r)
    r_lo = r - r_hi
    h2_hi = 0.5 * (r_hi * r_hi)
    h2_lo = (r_hi * r_lo) + 0.5 * (r_lo * r_lo)

    y1 = 1.0 + r
    e1 = (1.0 - y1) + r
    y2 = y1 + h2_hi
    e2 = (y1 - y2) + h2_hi
    tail = (e1 + e2) + ((h2_lo + c3) + r_err * y1)
    y = y2 + tail

    k = kf.astype(np.int64)
    k1 = np.where(k < -1000, k + 64, np.where(k > 1000, k - 64, k))
    result = (y * _pow2(k1)) * _pow2(k - k1)
    return np.where(nan, np.nan, result)


def exp(x):
    """float64 ``e**x`` from ``+ - * /`` (Python float or float64 array).

    ``exp(+-inf) = +inf, +0``; NaN -> NaN; overflow -> +inf; underflow gives IEEE
    subnormals (not flushed) and then 0.

    Order of operations (each line one rounded float64 op unless "exact")::

        xc = min(max(x, -746), 710)                 # saturating bounds
        kf = (xc * INV_LN2 + ROUND_MAGIC) - ROUND_MAGIC    # nearest integer k
        hi = xc - kf * LN2_HI                        # exact
        lo = kf * LN2_LO
        r  = hi - lo;  r_err = (hi - r) - lo         # |r| <= 0.3466 (+tiny)
        p  = 1/14!;  p = 1/n! + r * p  for n = 13 down to 3
        c3 = ((r * r) * r) * p
        r_hi = r with 27 low mantissa bits cleared;  r_lo = r - r_hi      # exact
        h2_hi = 0.5 * (r_hi * r_hi)                  # exact
        h2_lo = (r_hi * r_lo) + 0.5 * (r_lo * r_lo)
        y1 = 1 + r;     e1 = (1 - y1) + r            # Fast2Sum, exact
        y2 = y1 + h2_hi; e2 = (y1 - y2) + h2_hi      # Fast2Sum, exact
        y  = y2 + ((e1 + e2) + ((h2_lo + c3) + r_err * y1))
        result = (y * 2**k1) * 2**(k - k1)           # k1 = k+64 if k < -1000, k-64 if
                                                     # k > 1000, else k: exact while normal

    This is the float32 spec's ``transcendental.exp`` in float64 with more terms;
    it is ``_exp_dd(x, 0)`` (the same steps with a zero low part).
    """
    (x,), how = _args(x)
    with np.errstate(all="ignore"):
        return _ret(_exp_dd(x, np.zeros_like(x)), how)


# ---------------------------------------------------------------------------
# log


def _log_dd(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ln(x) as a double-double (hi, lo) for positive finite x; other lanes garbage.

    Relative error about 2**-70 (so ``pow`` can multiply it by a large y).
    """
    ok = (x > 0) & np.isfinite(x)
    xc = np.where(ok, x, 1.0)
    sub = xc < 2.2250738585072014e-308  # subnormal: scale by 2**64 (exact)
    xc = np.where(sub, xc * TWO_POW_64, xc)
    u = _bits(xc)
    e = (u >> np.uint64(52)).astype(np.int64) - 1023 - np.where(sub, 64, 0)
    mb = u & MANTISSA_MASK64
    upper = mb >= LOG_SQRT2_MANTISSA
    m = (mb | np.where(upper, HALF_EXPONENT_FIELD64, ONE_EXPONENT_FIELD64)).view(F64)
    ef = (e + upper).astype(F64)
    f = m - 1.0  # exact

    # s = f / (2 + f) as a double-double.
    d_hi, d_lo = _fast_two_sum(2.0, f)
    s_hi = f / d_hi
    p, pe = _two_prod(s_hi, d_hi)
    s_lo = (((f - p) - pe) - s_hi * d_lo) / d_hi
    s_hi, s_lo = _fast_two_sum(s_hi, s_lo)

    # log(1+f) = 2s + s*z*Q(z), z = s*s, Q = 2/3 + 2/5 z + ... + 2/27 z**12.
    z_hi, z_lo = _dd_mul(s_hi, s_lo, s_hi, s_lo)
    q_rest = LOG_ATANH_COEFFS[-1]
    for c in LOG_ATANH_COEFFS[-2::-1]:
        q_rest = c + z_hi * q_rest
    q_hi, q_lo = _two_sum(TWO_THIRDS_HI, z_hi * q_rest)
    q_lo = q_lo + TWO_THIRDS_LO
    v_hi, v_lo = _dd_mul(z_hi, z_lo, q_hi, q_lo)
    w_hi, w_lo = _dd_mul(s_hi, s_lo, v_hi, v_lo)
    l_hi, l_lo = _dd_add(2.0 * s_hi, 2.0 * s_lo, w_hi, w_lo)

    # + e * ln2 (e * LN2_HI exact).
    return _dd_add(ef * LN2_HI, ef * LN2_LO, l_hi, l_lo)


def log(x):
    """float64 natural logarithm from ``+ - * /`` (Python float or float64 array).

    ``log(+-0) = -inf``; ``log(x < 0) = NaN``; ``log(+inf) = +inf``; ``log(1) = +0``;
    NaN -> NaN. Subnormal inputs are valid (scaled by 2**64 first).

    Order of operations (each line one rounded float64 op unless "exact"; ``dd``
    marks a double-double step built from the error-free transformations)::

        (subnormal x: x = x * 2**64 exact, and e -= 64 below)
        e = exponent(x); mb = 52 stored bits of x     # exact bit operations
        m = 1.mb (in [1, 2)); if m >= sqrt(2): m = m/2, e = e + 1   # exact
        f = m - 1                                     # exact
        d = 2 + f as (d_hi, d_lo)                     # Fast2Sum
        s_hi = f / d_hi
        s_lo = (((f - p) - pe) - s_hi * d_lo) / d_hi  # (p, pe) = two_prod(s_hi, d_hi)
        (s_hi, s_lo) = Fast2Sum(s_hi, s_lo)           # s = f/(2+f) to ~2**-104
        z  = s * s                                    # dd
        q_rest = 2/27; q_rest = 2/(2n+1) + z_hi * q_rest for n = 12 down to 2
        q  = TwoSum(2/3, z_hi * q_rest), lo += TWO_THIRDS_LO
        w  = s * (z * q)                              # dd, dd
        l  = 2s + w                                   # dd add
        result = (e * LN2_HI, e * LN2_LO) + l         # dd add; e * LN2_HI exact
        return hi part (= hi + lo rounded)

    The identity: m = (1 + s)/(1 - s), so ln m = 2 atanh(s) = 2s + 2s**3/3 + ...
    """
    (x,), how = _args(x)
    with np.errstate(all="ignore"):
        hi, _ = _log_dd(x)
        y = np.where(x == 0, -np.inf, hi)
        y = np.where(x == np.inf, np.inf, y)
        y = np.where(np.isnan(x) | (x < 0), np.nan, y)
    return _ret(y, how)


# ---------------------------------------------------------------------------
# pow


def pow(x, y):  # noqa: A001 - the op is called pow
    """float64 ``x**y`` for ``x >= 0`` from ``+ - * /`` (numbers or broadcast arrays).

    Computed as ``exp(y * log(x))`` with the logarithm and the product carried as
    double-doubles, so the result stays within 1 ulp even when ``|y * ln x|`` is
    in the hundreds (``0.999**100000``).

    Order of operations::

        (L_hi, L_lo) = log(x) as a double-double     # see log / _log_dd
        (p_hi, p_err) = two_prod(y, L_hi)             # exact
        (p_hi, p_lo) = Fast2Sum(p_hi, p_err + y * L_lo)
        result = _exp_dd(p_hi, p_lo)                   # exp of the double-double (its own
                                                       # docstring: lo = kf * LN2_LO - p_lo)

    Special cases, in this order of precedence: ``y == 0`` -> 1 (even for NaN x);
    ``x == 1`` -> 1 (even for NaN y); NaN x or y -> NaN; ``x < 0`` -> NaN (negative
    bases are not supported); ``x == 0``: 0 for y > 0, +inf for y < 0;
    ``x == +inf``: +inf for y > 0, 0 for y < 0; ``y == +-inf``: 0 or +inf by
    whether |x| < 1; a product ``|y * ln x| > 1000`` saturates to +inf or 0.
    """
    (x, y), how = _args(x, y)
    with np.errstate(all="ignore"):
        l_hi, l_lo = _log_dd(x)
        regular = (x > 0) & np.isfinite(x) & np.isfinite(y)
        rough = np.where(regular, y * l_hi, 0.0)
        saturated = np.abs(rough) > 1000.0
        yc = np.where(regular & ~saturated, y, 0.0)  # keeps _split's inputs small
        lh = np.where(regular & ~saturated, l_hi, 0.0)
        ll = np.where(regular & ~saturated, l_lo, 0.0)
        p_hi, p_err = _two_prod(yc, lh)
        p_hi, p_lo = _fast_two_sum(p_hi, p_err + yc * ll)
        r = _exp_dd(p_hi, p_lo)
        r = np.where(saturated, np.where(rough > 0, np.inf, 0.0), r)

        # Special cases, lowest precedence first.
        big = x > 1.0
        r = np.where(np.isinf(y), np.where((y > 0) == big, np.inf, 0.0), r)
        r = np.where(x == np.inf, np.where(y > 0, np.inf, 0.0), r)
        r = np.where(x == 0, np.where(y > 0, 0.0, np.inf), r)
        r = np.where(x < 0, np.nan, r)
        r = np.where(np.isnan(x) | np.isnan(y), np.nan, r)
        r = np.where(x == 1.0, 1.0, r)
        r = np.where(y == 0, 1.0, r)
    return _ret(r, how)


# ---------------------------------------------------------------------------
# sin and cos


def _sin_kernel(r_hi, r_lo):
    """sin(r_hi + r_lo) for |r_hi| <= pi/4 + tiny, |r_lo| <= ulp(r_hi)."""
    z = r_hi * r_hi
    p = SIN_COEFFS[-1]
    for c in SIN_COEFFS[-2::-1]:
        p = c + z * p
    return r_hi + (((z * r_hi) * p) + r_lo * (1.0 - 0.5 * z))


def _cos_kernel(r_hi, r_lo):
    """cos(r_hi + r_lo) for |r_hi| <= pi/4 + tiny, |r_lo| <= ulp(r_hi)."""
    z = r_hi * r_hi
    p = COS_COEFFS[-1]
    for c in COS_COEFFS[-2::-1]:
        p = c + z * p
    a = _clear_low_27_bits(r_hi)
    b = r_hi - a
    hz_hi = 0.5 * (a * a)  # exact
    hz_lo = (a * b) + 0.5 * (b * b)
    w = 1.0 - hz_hi
    e = (1.0 - w) - hz_hi  # exact (Fast2Sum)
    return w + (((e - hz_lo) + (z * z) * p) - r_lo * r_hi)


def _quadrant_select(q, s, c, want_sin):
    """sin or cos of (r + q*pi/2) from s = sin r, c = cos r and q mod 4 (exact)."""
    q = q & 3
    if want_sin:  # q: 0 -> s, 1 -> c, 2 -> -s, 3 -> -c
        v = np.where((q & 1) == 1, c, s)
        return np.where(q >= 2, -v, v)
    # cos: 0 -> c, 1 -> -s, 2 -> -c, 3 -> s
    v = np.where((q & 1) == 1, s, c)
    return np.where((q == 1) | (q == 2), -v, v)


def _reduce_pio2(x: np.ndarray, name: str):
    """(q, r_hi, r_lo): x = q*pi/2 + (r_hi + r_lo), |r_hi| <= pi/4 + tiny."""
    finite = np.isfinite(x)
    if np.any(np.abs(x[finite]) > TRIG_MAX_ABS):
        worst = float(np.max(np.abs(x[finite])))
        raise ValueError(
            f"hostmath.{name}: |x| = {worst!r} is beyond the supported {TRIG_MAX_ABS!r} (2**22); "
            "reduce the angle first (e.g. use sinpi/cospi on a fraction of a turn)"
        )
    xc = np.where(finite, x, 0.0)
    kf = (xc * TWO_OVER_PI + ROUND_MAGIC) - ROUND_MAGIC
    a = xc - kf * PIO2_1  # exact
    s1, e1 = _two_sum(a, -(kf * PIO2_2))  # kf * PIO2_2 exact
    s2, e2 = _two_sum(s1, -(kf * PIO2_3))  # kf * PIO2_3 exact
    r_hi, r_lo = _fast_two_sum(s2, (e1 + e2) - kf * PIO2_4)
    return kf.astype(np.int64), r_hi, r_lo


_TRIG_DOC = """
    Order of operations (each line one rounded float64 op unless "exact")::

        (|x| > 2**22 raises ValueError; +-inf and NaN give NaN)
        kf = (x * TWO_OVER_PI + ROUND_MAGIC) - ROUND_MAGIC   # nearest integer k
        a  = x - kf * PIO2_1                        # exact (product and difference)
        (s1, e1) = TwoSum(a, -(kf * PIO2_2))        # kf * PIO2_2 exact
        (s2, e2) = TwoSum(s1, -(kf * PIO2_3))       # kf * PIO2_3 exact
        (r_hi, r_lo) = Fast2Sum(s2, (e1 + e2) - kf * PIO2_4)  # r = x - k*pi/2, |r| <= pi/4
        z  = r_hi * r_hi
        sin r: p = 1/19!; p = c + z * p over SIN_COEFFS downwards (c = -1/3!, +1/5!, ...)
               S = r_hi + (((z * r_hi) * p) + r_lo * (1 - 0.5 * z))
        cos r: p = 1/20!; p = c + z * p over COS_COEFFS downwards (c = 1/4!, -1/6!, ...)
               a = r_hi with 27 low mantissa bits cleared; b = r_hi - a         # exact
               hz_hi = 0.5 * (a * a) (exact); hz_lo = (a * b) + 0.5 * (b * b)
               w = 1 - hz_hi; e = (1 - w) - hz_hi                            # exact
               C = w + (((e - hz_lo) + (z * z) * p) - r_lo * r_hi)
        quadrant q = k mod 4 (exact) picks +-S or +-C.
"""


def _trig(x, reduce, name: str, want_sin: bool):
    """sin or cos of the reduced x: ``reduce(x, name)`` gives (q, r_hi, r_lo), then both
    kernels, the quadrant's pick and ``+ 0.0``; a sine keeps the sign of a zero argument;
    +-inf and NaN give NaN. Shared by ``sin``/``cos`` and ``sinpi``/``cospi``."""
    (x,), how = _args(x)
    with np.errstate(all="ignore"):
        q, r_hi, r_lo = reduce(x, name)
        y = _quadrant_select(q, _sin_kernel(r_hi, r_lo), _cos_kernel(r_hi, r_lo), want_sin=want_sin) + 0.0
        if want_sin:
            y = np.where(x == 0, x, y)  # keep the sign of a zero argument
        y = np.where(np.isfinite(x), y, np.nan)
    return _ret(y, how)


def sin(x):
    """float64 sine from ``+ - * /`` for |x| <= 2**22 (Python float or float64 array).

    Three 31-bit parts of pi/2 (exact products with k) and a rounded fourth part,
    summed with error-free transformations, keep the reduced argument accurate
    to ~2**-120 absolute, enough for every float64 up to 2**22 (RoPE angles reach
    ~1e5). Quadrant q = 0 -> S, 1 -> C, 2 -> -S, 3 -> -C, then ``+ 0.0`` (turns a
    -0 result into +0). ``sin(+-0) = +-0``; +-inf, NaN -> NaN.
    """
    return _trig(x, _reduce_pio2, "sin", want_sin=True)


def cos(x):
    """float64 cosine from ``+ - * /`` for |x| <= 2**22 (Python float or float64 array).

    Same reduction and kernels as ``sin``; quadrant q = 0 -> C, 1 -> -S, 2 -> -C,
    3 -> S, then ``+ 0.0``. ``cos(+-0) = 1``; +-inf, NaN -> NaN.
    """
    return _trig(x, _reduce_pio2, "cos", want_sin=False)


sin.__doc__ += _TRIG_DOC
cos.__doc__ += _TRIG_DOC


def _reduce_half_turns(x: np.ndarray, name: str):
    """(q, r_hi, r_lo) with pi*x = q*pi/2 + (r_hi + r_lo); the reduction is exact."""
    finite = np.isfinite(x)
    if np.any(np.abs(x[finite]) > TRIGPI_MAX_ABS):
        raise ValueError(f"hostmath.{name}: |x| beyond {TRIGPI_MAX_ABS!r} (2**50) is not supported")
    xc = np.where(finite, x, 0.0)
    t = 2.0 * xc  # exact
    kf = (t + ROUND_MAGIC) - ROUND_MAGIC
    u = t - kf  # exact, |u| <= 1/2
    p, pe = _two_prod(u, PIO2_HI)
    r_hi, r_lo = _fast_two_sum(p, pe + u * PIO2_LO)
    return kf.astype(np.int64), r_hi, r_lo


def sinpi(x):
    """float64 ``sin(pi * x)`` without rounding pi*x first (Python float or array).

    Order of operations: ``t = 2x`` and ``k = round(t)`` (exact), ``u = t - k`` (exact,
    |u| <= 1/2), ``(r_hi, r_lo) = two_prod(u, PIO2_HI)`` then Fast2Sum with
    ``+ u * PIO2_LO``, then the ``sin`` kernels, quadrant k mod 4 and ``+ 0.0`` as in
    ``sin``. Exact +0 at nonzero integers, ``sinpi(+-0) = +-0``; |x| <= 2**50;
    +-inf/NaN -> NaN.
    """
    return _trig(x, _reduce_half_turns, "sinpi", want_sin=True)


def cospi(x):
    """float64 ``cos(pi * x)`` without rounding pi*x first (Python float or array).

    The cosine learning-rate schedule's natural form: ``cospi(progress)`` is
    exactly 1 at 0, exactly +0 at 1/2 and exactly -1 at 1. Same reduction as
    ``sinpi``; the ``cos`` kernels, quadrant k mod 4 and ``+ 0.0``. |x| <= 2**50;
    +-inf/NaN -> NaN.
    """
    return _trig(x, _reduce_half_turns, "cospi", want_sin=False)
