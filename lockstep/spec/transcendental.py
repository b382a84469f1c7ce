"""float32 ``exp``, ``log``, ``sigmoid`` and ``silu``, defined from ``+ - * /`` only.

Why this file exists (lock 4 of ``docs/numerical-contract.md``; ``np.exp``/libm are named here, never called): they give different bits
on different CPUs and SIMD levels, and GPUs have their own. lockstep therefore
*defines* each transcendental as a fixed sequence of the operations in ``fp``:

* float32 ``+ - * /``, each rounded to nearest-even separately, then flushed
  (``0 < |r| < 2**-126`` becomes a zero of r's sign) -- never an FMA;
* exact bit manipulation of float32 patterns and exact small-integer arithmetic;
* comparisons and selection.

No float64, no libm, no lookup tables. The same sequence is ported, op for op,
to the C header of the CUDA/Metal kernels and to Numba, and those ports must
give the same bits. Reading order for a port: the "Order of operations" block in
each function's docstring *is* the definition; the code below it is that block in
NumPy.

Accuracy (measured over all 2**32 inputs by ``tools/sweep_transcendental.py``,
results in ``benchmarks/RESULTS.md``): wherever the correctly rounded result is
a normal float32, ``exp`` is within 0.5303 ulp of the exact result and ``log``
within 0.6592 ulp, and they are correctly rounded for 99.987% and 99.976% of
those inputs. They are not correctly rounded everywhere; they are
*reproducible* everywhere.

Notation in the docstrings: every line is one rounded, flushed float32 operation
unless marked "exact"; ``bits(v)`` is the uint32 pattern of v; hex numbers are
float32 bit patterns of the named constants below.

Two error-free transformations carry the accuracy (both are exact in
round-to-nearest binary floating point, without an FMA):

* Fast2Sum: if ``|a| >= |b|`` then with ``s = a + b`` the rounding error of s is
  exactly ``(a - s) + b``;
* 12-bit splitting: clearing the 12 low mantissa bits of v leaves ``v_hi`` with at
  most 12 significant bits, and ``v_lo = v - v_hi`` (exact) has at most 12 more,
  so ``v_hi*v_hi`` and ``v_hi*v_lo`` are exact float32 products.
"""

from __future__ import annotations

import numpy as np

from . import fp
from . import shapes as S
from .kinds import F32, F32Operand, op



def _const(pattern: int) -> np.float32:
    """The float32 scalar with bit pattern ``pattern``."""
    return fp.from_bits(np.array([pattern], dtype=np.uint32))[0]


# ---------------------------------------------------------------------------
# Constants. Each is the float32 with the given bit pattern; the comment says
# which real number it stands for (rounded to nearest unless stated).

ONE = _const(0x3F800000)  # 1.0
TWO = _const(0x40000000)  # 2.0
HALF = _const(0x3F000000)  # 0.5
POS_INF = _const(0x7F800000)
NEG_INF = _const(0xFF800000)
NEG_ZERO = _const(0x80000000)
CANONICAL_NAN = _const(0x7FC00000)

# ln 2 split for Cody-Waite reduction. LN2_HI = round(ln2 * 2**16) / 2**16
# = 45426 / 65536 = 0.693145751953125: 16 significant bits (the last one 0), so
# k * LN2_HI is exact for every integer |k| <= 150 (150 * 45426 < 2**24).
# LN2_LO = ln2 - LN2_HI rounded to float32 (1.4286068e-06).
LN2_HI = _const(0x3F317200)
LN2_LO = _const(0x35BFBE8E)
INV_LN2 = _const(0x3FB8AA3B)  # 1/ln2 = 1.44269502...
# 1.5 * 2**23: adding then subtracting it rounds a float32 |v| < 2**22 to the
# nearest integer (ties to even), because the sum has ulp 1.
ROUND_MAGIC = _const(0x4B400000)  # 12582912.0

# exp's argument is clamped to [EXP_ARG_MIN, EXP_ARG_MAX] first. Both bounds lie
# beyond where the result saturates (exp(89) > 2**128 overflows to +inf;
# exp(-104) < 2**-149 flushes to +0), and keep |k| <= 150 as LN2_HI needs.
EXP_ARG_MAX = _const(0x42B20000)  # 89.0
EXP_ARG_MIN = _const(0xC2D00000)  # -104.0

# Taylor coefficients of exp(r) = 1 + r + r**2/2 + r**3 * (1/3! + r/4! + ... + r**5/8!),
# each 1/n! rounded to float32. On |r| <= 0.3466 the omitted terms are < 2**-31.
EXP_C3 = _const(0x3E2AAAAB)  # 1/3! = 0.16666667
EXP_C4 = _const(0x3D2AAAAB)  # 1/4! = 0.041666668
EXP_C5 = _const(0x3C088889)  # 1/5! = 0.0083333338
EXP_C6 = _const(0x3AB60B61)  # 1/6! = 0.0013888889
EXP_C7 = _const(0x39500D01)  # 1/7! = 1.9841270e-04
EXP_C8 = _const(0x37D00D01)  # 1/8! = 2.4801588e-05

# log reduces the significand m to [sqrt(2)/2, sqrt(2)): a significand whose 23
# stored bits are >= LOG_SQRT2_MANTISSA (i.e. m >= 0x3FB504F4, the first float32
# above sqrt(2) = 1.41421356...) is halved and the exponent bumped.
LOG_SQRT2_MANTISSA = np.uint32(0x3504F4)

# Taylor coefficients of log(1+f) = 2*atanh(s), s = f/(2+f):
# 2*atanh(s) = 2s + s * (2/3 z + 2/5 z**2 + ... + 2/11 z**5), z = s*s.
# With |s| <= 0.1716 (z <= 0.0295) the omitted terms are < 2**-35.
LOG_L3 = _const(0x3F2AAAAB)  # 2/3  = 0.66666669
LOG_L5 = _const(0x3ECCCCCD)  # 2/5  = 0.40000001
LOG_L7 = _const(0x3E924925)  # 2/7  = 0.28571430
LOG_L9 = _const(0x3E638E39)  # 2/9  = 0.22222222
LOG_L11 = _const(0x3E3A2E8C)  # 2/11 = 0.18181819

EXPONENT_SHIFT = np.uint32(23)
EXPONENT_BIAS = 127
ONE_EXPONENT_FIELD = np.uint32(0x3F800000)  # bits of 1.0: significand m in [1, 2)
HALF_EXPONENT_FIELD = np.uint32(0x3F000000)  # bits of 0.5: significand m in [0.5, 1)
HIGH_12_BITS_MASK = np.uint32(0xFFFFF000)  # keeps sign, exponent, 11 stored bits


# ---------------------------------------------------------------------------
# Shared pieces.


def _split12(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(v_hi, v_lo)``: v_hi = v with the 12 low mantissa bits cleared (exact),
    v_lo = v - v_hi (exact). Each part has at most 12 significant bits."""
    v_hi = fp.from_bits(fp.bits(v) & HIGH_12_BITS_MASK)
    return v_hi, fp.sub(v, v_hi)


def _flat_f32(x) -> tuple[np.ndarray, tuple[int, ...]]:
    """x entered into the spec (``fp.f32``: rounded, flushed, canonical NaN), flattened."""
    shape = np.shape(x)
    return fp.f32(x).reshape(-1), shape


def _is_nan(x: np.ndarray) -> np.ndarray:
    u = fp.bits(x)
    return ((u & fp.EXPONENT_MASK) == fp.EXPONENT_MASK) & ((u & fp.MANTISSA_MASK) != 0)


# ---------------------------------------------------------------------------
# exp


@op(S.transcendental)
def exp(x: F32Operand) -> F32:
    """float32 ``e**x``, elementwise, for float32 arrays of any shape.

    Special values: ``exp(+-0) = 1``; ``exp(+inf) = +inf``; ``exp(-inf) = +0``;
    NaN -> canonical NaN; results that overflow are +inf; results below 2**-126
    become +0 (round, then flush). Error: <= 0.531 ulp where the result is normal
    (full sweep: 0.5303 ulp at x = -16.981974).

    Order of operations (each line one rounded float32 op unless "exact")::

        x  = f32(x)                                   # enter the spec (subnormal -> zero of its sign, canonical NaN)
        xc = min(max(x, -104.0), 89.0)                # clamp; NaN handled at the end
        # Cody-Waite reduction: x = k*ln2 + r, |r| <= 0.3466 (a little more after rounding)
        kf = (xc * INV_LN2 + ROUND_MAGIC) - ROUND_MAGIC   # 3 ops: integer k as float32
        hi = xc - kf * LN2_HI                         # 2 ops, both exact
        lo = kf * LN2_LO
        r  = hi - lo
        r_err = (hi - r) - lo                         # 2 ops: rounding error of r (Fast2Sum)
        # exp(r) = 1 + r + r*r/2 + r**3 * P(r), summed with compensation
        p  = EXP_C8
        p  = EXP_C7 + r * p                           # 2 ops each, Horner down to EXP_C3:
        p  = EXP_C6 + r * p
        p  = EXP_C5 + r * p
        p  = EXP_C4 + r * p
        p  = EXP_C3 + r * p
        c3 = ((r * r) * r) * p                        # 3 ops
        r_hi = r with its 12 low mantissa bits cleared    # exact (bits & 0xFFFFF000)
        r_lo = r - r_hi                               # exact
        h2_hi = 0.5 * (r_hi * r_hi)                   # exact
        h2_lo = (r_hi * r_lo) + 0.5 * (r_lo * r_lo)   # r_hi*r_lo exact; 4 ops
        y1 = 1 + r
        e1 = (1 - y1) + r                             # exact error of y1 (Fast2Sum)
        y2 = y1 + h2_hi
        e2 = (y1 - y2) + h2_hi                        # exact error of y2 (Fast2Sum)
        tail = (e1 + e2) + ((h2_lo + c3) + r_err * y1)
        y  = y2 + tail                                # ~ exp(hi - lo), in [0.70, 1.42]
        # scale by 2**k (k = int(kf), exact, in [-150, 128]): fp.ldexp_exact, i.e.
        #   k1 = clip(k, -126, 127); k2 = clip(k - k1, -126, 127); k3 = k - k1 - k2   # exact
        #   result = ((y * 2**k1) * 2**k2) * 2**k3    # 3 products, each rounded and flushed
        # (here k3 = 0: its product is by 1.0); exact while normal, +inf on
        # overflow, +0 below 2**-126
        result = ldexp_exact(y, k)
        result = NaN where x is NaN

    r_err * y1 is the first-order correction exp(r + r_err) ~ exp(r) * (1 + r_err);
    the compensated sums leave the last addition ``y2 + tail`` as the one rounding
    that matters, which is why the result is within 0.531 ulp.

    Constants (float32 bit patterns; ``EXP_Cn`` is 1/n! rounded to nearest float32,
    ``LN2_HI`` is ln 2 rounded to 16 significant bits, ``LN2_LO`` is ln 2 - LN2_HI
    rounded to nearest)::

        INV_LN2     = 0x3FB8AA3B    # 1/ln 2 = 1.4426950...
        LN2_HI      = 0x3F317200    # 45426 / 2**16 = 0.693145751953125
        LN2_LO      = 0x35BFBE8E    # 1.4286068e-06
        ROUND_MAGIC = 0x4B400000    # 1.5 * 2**23
        EXP_ARG_MAX = 0x42B20000    # 89.0
        EXP_ARG_MIN = 0xC2D00000    # -104.0
        EXP_C3      = 0x3E2AAAAB    # 1/3!
        EXP_C4      = 0x3D2AAAAB    # 1/4!
        EXP_C5      = 0x3C088889    # 1/5!
        EXP_C6      = 0x3AB60B61    # 1/6!
        EXP_C7      = 0x39500D01    # 1/7!
        EXP_C8      = 0x37D00D01    # 1/8!
        HALF        = 0x3F000000    # 0.5;  ONE = 0x3F800000 (1.0)
    """
    x, shape = _flat_f32(x)
    nan = _is_nan(x)
    xc = fp.minimum(fp.maximum(fp.where(nan, np.float32(0.0), x), EXP_ARG_MIN), EXP_ARG_MAX)

    # Cody-Waite reduction.
    kf = fp.sub(fp.add(fp.mul(xc, INV_LN2), ROUND_MAGIC), ROUND_MAGIC)
    hi = fp.sub(xc, fp.mul(kf, LN2_HI))  # exact: |k| <= 150, LN2_HI has 16 bits
    lo = fp.mul(kf, LN2_LO)
    r = fp.sub(hi, lo)
    r_err = fp.sub(fp.sub(hi, r), lo)

    # Polynomial part r**3 * P(r), Horner from the highest coefficient.
    p = EXP_C8
    for c in (EXP_C7, EXP_C6, EXP_C5, EXP_C4, EXP_C3):
        p = fp.add(c, fp.mul(r, p))
    c3 = fp.mul(fp.mul(fp.mul(r, r), r), p)

    # r*r/2 as an exact head plus a tiny tail.
    r_hi, r_lo = _split12(r)
    h2_hi = fp.mul(HALF, fp.mul(r_hi, r_hi))
    h2_lo = fp.add(fp.mul(r_hi, r_lo), fp.mul(HALF, fp.mul(r_lo, r_lo)))

    # 1 + r + h2_hi with both rounding errors kept, then everything small at once.
    y1 = fp.add(ONE, r)
    e1 = fp.add(fp.sub(ONE, y1), r)
    y2 = fp.add(y1, h2_hi)
    e2 = fp.add(fp.sub(y1, y2), h2_hi)
    tail = fp.add(fp.add(e1, e2), fp.add(fp.add(h2_lo, c3), fp.mul(r_err, y1)))
    y = fp.add(y2, tail)

    k = kf.astype(np.int32)  # exact: kf is an integer in [-150, 128]
    result = fp.ldexp_exact(y, k)
    result = fp.where(nan, CANONICAL_NAN, result)
    return result.reshape(shape)


# ---------------------------------------------------------------------------
# log


@op(S.transcendental)
def log(x: F32Operand) -> F32:
    """float32 natural logarithm, elementwise, for float32 arrays of any shape.

    Special values: inputs are flushed on entry, so subnormals are zeros;
    ``log(+-0) = -inf``; ``log(x < 0) = NaN``; ``log(+inf) = +inf``;
    ``log(1) = +0``; NaN -> canonical NaN (all NaNs are 0x7FC00000).
    Error: <= 0.66 ulp for every positive normal input (full sweep: 0.6592 ulp
    at x = 1.4057196).

    Order of operations (each line one rounded float32 op unless "exact")::

        x = f32(x)                                    # enter the spec (subnormal -> zero of its sign, canonical NaN)
        xc = x if 2**-126 <= x < +inf else 1.0        # specials are selected at the end
        # exponent/significand split, all exact integer and bit operations
        e  = (bits(xc) >> 23) - 127                   # unbiased exponent
        mb = bits(xc) & 0x007FFFFF                    # 23 stored significand bits
        if mb >= 0x3504F4:  m = from_bits(mb | 0x3F000000); e = e + 1   # m in [0.707, 1)
        else:               m = from_bits(mb | 0x3F800000)              # m in [1, 1.414)
        ef = float32(e)                               # exact, |e| <= 128
        f  = m - 1                                    # exact (Sterbenz)
        # log(1+f) = f - f*f/2 + t,  t = s * (f*f/2 + R),  s = f/(2+f)
        s  = f / (2 + f)                              # 2 ops
        z  = s * s
        R  = LOG_L11
        R  = LOG_L9 + z * R                           # 2 ops each, Horner down to LOG_L3:
        R  = LOG_L7 + z * R
        R  = LOG_L5 + z * R
        R  = LOG_L3 + z * R
        R  = z * R
        f_hi = f with its 12 low mantissa bits cleared    # exact (bits & 0xFFFFF000)
        f_lo = f - f_hi                               # exact
        hf_hi = 0.5 * (f_hi * f_hi)                   # exact
        hf_lo = (f_hi * f_lo) + 0.5 * (f_lo * f_lo)   # f_hi*f_lo exact; 4 ops
        t  = s * ((hf_hi + hf_lo) + R)                # 3 ops
        # e*ln2 + f - hf_hi with both rounding errors kept (Fast2Sum twice)
        A  = ef * LN2_HI                              # exact
        S1 = A + f
        E1 = (A - S1) + f                             # exact
        S2 = S1 - hf_hi
        E2 = (S1 - S2) - hf_hi                        # exact
        tail = ((t - hf_lo) + ef * LN2_LO) + (E1 + E2)    # 5 ops
        y  = S2 + tail
        y  = +inf where x == +inf; -inf where x is +-0; NaN where x < 0 or x is NaN

    The identity behind t: with s = f/(2+f), log(1+f) = 2*atanh(s) = 2s + s*R and
    2s = f - s*f, and f*f/2 - s*f = s*f*f/2, so log(1+f) = f - f*f/2 + s*(f*f/2 + R).
    The large terms (e*LN2_HI, f, f*f/2) are added exactly; only the small t, the
    low parts and the final addition are rounded.

    Constants (float32 bit patterns unless marked; ``LOG_Ln`` is 2/n rounded to nearest
    float32; ``LN2_HI``/``LN2_LO`` as in ``exp``)::

        LOG_L3             = 0x3F2AAAAB    # 2/3
        LOG_L5             = 0x3ECCCCCD    # 2/5
        LOG_L7             = 0x3E924925    # 2/7
        LOG_L9             = 0x3E638E39    # 2/9
        LOG_L11            = 0x3E3A2E8C    # 2/11
        LN2_HI             = 0x3F317200
        LN2_LO             = 0x35BFBE8E
        LOG_SQRT2_MANTISSA = 0x3504F4      # integer: stored significand bits of the first float32 above sqrt 2
        TWO                = 0x40000000    # 2.0
    """
    x, shape = _flat_f32(x)
    u = fp.bits(x)
    positive_normal = (u >= np.uint32(0x00800000)) & (u < np.uint32(0x7F800000))
    xc = fp.where(positive_normal, x, ONE)

    # Exponent and significand (exact integer/bit operations).
    uc = fp.bits(xc)
    e = (uc >> EXPONENT_SHIFT).astype(np.int32) - EXPONENT_BIAS
    mb = uc & fp.MANTISSA_MASK
    upper = mb >= LOG_SQRT2_MANTISSA
    m = fp.from_bits(mb | np.where(upper, HALF_EXPONENT_FIELD, ONE_EXPONENT_FIELD))
    e = e + upper.astype(np.int32)
    ef = e.astype(np.float32)  # exact: |e| <= 128
    f = fp.sub(m, ONE)

    s = fp.div(f, fp.add(TWO, f))
    z = fp.mul(s, s)
    R = LOG_L11
    for c in (LOG_L9, LOG_L7, LOG_L5, LOG_L3):
        R = fp.add(c, fp.mul(z, R))
    R = fp.mul(z, R)

    f_hi, f_lo = _split12(f)
    hf_hi = fp.mul(HALF, fp.mul(f_hi, f_hi))
    hf_lo = fp.add(fp.mul(f_hi, f_lo), fp.mul(HALF, fp.mul(f_lo, f_lo)))
    t = fp.mul(s, fp.add(fp.add(hf_hi, hf_lo), R))

    A = fp.mul(ef, LN2_HI)
    S1 = fp.add(A, f)
    E1 = fp.add(fp.sub(A, S1), f)
    S2 = fp.sub(S1, hf_hi)
    E2 = fp.sub(fp.sub(S1, S2), hf_hi)
    tail = fp.add(fp.add(fp.sub(t, hf_lo), fp.mul(ef, LN2_LO)), fp.add(E1, E2))
    y = fp.add(S2, tail)

    # Special values, selected (no arithmetic).
    is_zero = (u & ~fp.SIGN_BIT) == 0
    is_pos_inf = u == np.uint32(0x7F800000)
    is_nan_result = _is_nan(x) | (((u & fp.SIGN_BIT) != 0) & ~is_zero)
    y = fp.where(is_pos_inf, POS_INF, y)
    y = fp.where(is_zero, NEG_INF, y)
    y = fp.where(is_nan_result, CANONICAL_NAN, y)
    return y.reshape(shape)


# ---------------------------------------------------------------------------
# sigmoid and silu


@op(S.transcendental)
def sigmoid(x: F32Operand) -> F32:
    """float32 logistic function ``1 / (1 + exp(-x))``, elementwise.

    Order of operations::

        x = f32(x)
        n = -x                 # exact
        d = 1 + exp(n)         # spec exp, then one rounded add
        y = 1 / d              # one rounded division, then flush

    Saturation follows from the ops, with no special case: from x = 16.635532
    (0x41851592) up, exp(-x) <= 2**-24 and ``1 + exp(-x)`` rounds to 1, so y = 1
    exactly; from x = -87.33655 (0xC2AEAC50) down the quotient is below 2**-126
    and flushes to +0 (and from -88.72284 down exp(-x) = +inf, 1/inf = +0).
    ``sigmoid(+inf) = 1``, ``sigmoid(-inf) = +0``, NaN -> canonical NaN.
    Error: within 2.6 ulp where the result is normal. Relative to the result,
    exp contributes at most 0.531 * 2**-23, the rounding of ``1 + exp(-x)`` 2**-24,
    then the division rounds once more (0.5 ulp): 2.06 + 0.5 ulp at worst.
    Largest seen in tests: 2.2 ulp.
    """
    x, shape = _flat_f32(x)
    d = fp.add(ONE, exp(fp.neg(x)))
    return fp.div(ONE, d).reshape(shape)


@op(S.transcendental)
def silu(x: F32Operand) -> F32:
    """float32 SiLU (swish) ``x * sigmoid(x)``, elementwise.

    Order of operations::

        x = f32(x)
        y = x * sigmoid(x)     # sigmoid as above, then one rounded multiply
        y = -0.0 where x == -inf

    The one special case: ``-inf * sigmoid(-inf) = -inf * 0`` would be NaN, but the
    limit is 0 and every finite x <= -87.33655 already gives ``x * 0 = -0.0``, so
    ``silu(-inf) = -0.0``. ``silu(+inf) = +inf``; NaN -> canonical NaN.
    Error: within 3.6 ulp where the result is normal (sigmoid's relative error,
    at most 3.06 * 2**-24, plus the product's rounding).
    """
    x, shape = _flat_f32(x)
    y = fp.mul(x, sigmoid(x))
    y = fp.where(fp.bits(x) == np.uint32(0xFF800000), NEG_ZERO, y)
    return y.reshape(shape)
