"""float32 normal and truncated-normal samples from Philox streams, spec math only.

Value i of a sample is a pure function of (stream key, i): it reads stream word i
only, turns it into an odd multiple of 2**-24 in (0, 1) (exact), and applies a
fixed float32 inverse normal CDF. No rejection sampling, so a sample never
depends on how many values came before it or how they were batched, and every
backend (CPU, CUDA, Metal) reproduces it bit for bit.

The inverse CDF is Acklam's rational approximation (Peter J. Acklam, "An
algorithm for computing the inverse normal cumulative distribution function",
2003; relative error 1.15e-9 in exact arithmetic), evaluated here in float32
with ``fp`` operations and the spec ``log``. It works on the *centred*
probability ``q = p - 1/2``, computed exactly from the uniform, which makes every
sampler exactly antisymmetric: the value for ``q`` is minus the value for ``-q``,
bit for bit (so the sample mean has no rounding bias).

The float32 evaluation is within 1e-6 relative of the exact quantile (checked
in tests/test_rng.py against ``statistics.NormalDist``); the distribution is
discretized to the 2**23 values of the uniform, whose extreme quantiles are
+-5.2947 (``u = 2**-24``).
"""

from __future__ import annotations

import numpy as np

from . import erf, fp
from .philox import PhiloxStream, uniform_open_from_uint32
from .transcendental import log

F32 = np.float32


def _const(pattern: int) -> np.float32:
    return fp.from_bits(np.array([pattern], dtype=np.uint32))[0]


# Central region, |q| <= ACKLAM_CENTRAL_MAX. Acklam writes it as
#   z = q * A(r) / B(r),  r = q*q,  A, B polynomials of degree 5 (B(0) = 1),
# whose alternating coefficients (up to 276 in size) cancel to ~0.009 near the
# region's edge: evaluated in float32 that form is off by up to 2e-4. The same
# two polynomials, re-expanded exactly (200-bit arithmetic) in
#   t = 1/4 - r = (1/2 - |q|) * (1/2 + |q|)
# have only positive coefficients, so float32 Horner has no cancellation (max
# relative error 4e-7). ACKLAM_A[i] / ACKLAM_B[i] multiply t**(5-i); the comment
# gives the exact re-expanded value that was rounded to float32.
#   z = q * (((((A0 t + A1) t + A2) t + A3) t + A4) t + A5) / (((((B0 t + B1) t + B2) t + B3) t + B4) t + B5)
ACKLAM_A = tuple(
    _const(b)
    for b in (
        0x421EC98E,  # 39.696830286653757    (= -a1)
        0x432B5337,  # 171.3250605662033
        0x429F95FB,  # 79.792930951606786
        0x41010434,  # 8.0635262089480244
        0x3E413E9D,  # 0.18871540632296283
        0x3A3A004B,  # 0.00070953803684899869
    )
)
ACKLAM_B = tuple(
    _const(b)
    for b in (
        0x4259E786,  # 54.476098798224058    (= -b1)
        0x42BAFB3F,  # 93.49071336026082
        0x41E14920,  # 28.16070475073575
        0x40070833,  # 2.1098753773475911
        0x3D1D83DD,  # 0.038455833779857174
        0x38E788EF,  # 0.00011040444440565955
    )
)
# Acklam's published central coefficients, from which the above are derived:
#   a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
#        1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
#   b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
#        6.680131188771972e+01, -1.328068155288572e+01, 1)
# with A(r) = ((((a1 r + a2) r + a3) r + a4) r + a5) r + a6 and B likewise.
ACKLAM_PUBLISHED_A = (
    -3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
    1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00,
)
ACKLAM_PUBLISHED_B = (
    -5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
    6.680131188771972e01, -1.328068155288572e01, 1.0,
)
# Lower tail, p = 1/2 - |q| < 0.02425, s = sqrt(-2 log p):
#   z = (((((C1 s + C2) s + C3) s + C4) s + C5) s + C6) / ((((D1 s + D2) s + D3) s + D4) s + 1)
ACKLAM_C = tuple(
    _const(b)
    for b in (
        0xBBFF186D,  # c1 = -7.784894002430293e-03
        0xBEA51126,  # c2 = -3.223964580411365e-01
        0xC019A606,  # c3 = -2.400758277161838e+00
        0xC0232ED1,  # c4 = -2.549732539343734e+00
        0x408BFD40,  # c5 =  4.374664141464968e+00
        0x403C0AE1,  # c6 =  2.938163982698783e+00
    )
)
ACKLAM_D = tuple(
    _const(b)
    for b in (
        0x3BFF16C3,  # d1 = 7.784695709041462e-03
        0x3EA51A69,  # d2 = 3.224671290700398e-01
        0x401C7D14,  # d3 = 2.445134137142996e+00
        0x4070483B,  # d4 = 3.754408661907416e+00
    )
)
# Acklam's region boundary p_low = 0.02425, as |q| = 1/2 - p_low = 0.47575.
ACKLAM_CENTRAL_MAX = _const(0x3EF39581)  # 0.47575 (float32 0.47574999928...)

ONE = _const(0x3F800000)
HALF = _const(0x3F000000)
MINUS_TWO = _const(0xC0000000)


def _horner(coeffs, t, last_one: bool) -> np.ndarray:
    """``(c0 t + c1) t + ... + cn``, then ``* t + 1`` if last_one; each step mul then add."""
    acc = fp.f32(np.broadcast_to(coeffs[0], t.shape))
    for c in coeffs[1:]:
        acc = fp.add(fp.mul(acc, t), c)
    if last_one:
        acc = fp.add(fp.mul(acc, t), ONE)
    return acc


def normal_from_centered(q) -> np.ndarray:
    """float32 ``Phi^-1(1/2 + q)`` for float32 ``q`` in (-1/2, 1/2), elementwise.

    Order of operations (each line one rounded float32 op unless "exact")::

        central (|q| <= 0.47575):
            t   = (1/2 - |q|) * (1/2 + |q|)    # 3 ops (|q| exact); = 1/4 - q*q
            num = (((((A0*t + A1)*t + A2)*t + A3)*t + A4)*t + A5) * q   # mul then add, 11 ops
            den = (((((B0*t + B1)*t + B2)*t + B3)*t + B4)*t + B5)       # 10 ops
            z   = num / den
        tail (|q| > 0.47575):
            p   = 1/2 - |q|                    # exact (Sterbenz), in (0, 0.02425)
            s   = sqrt(-2 * log(p))            # spec log; * -2 exact; IEEE sqrt
            num = ((((C1*s + C2)*s + C3)*s + C4)*s + C5)*s + C6
            den = ((((D1*s + D2)*s + D3)*s + D4)*s + 1)
            z   = num / den                    # the lower-tail value (negative)
            z   = -z if q > 0                  # exact
        NaN or |q| >= 1/2 -> canonical NaN

    Constants (float32 bit patterns). ``ACKLAM_A``/``ACKLAM_B`` are Acklam's central
    polynomials re-expanded exactly in ``t = 1/4 - q*q`` and rounded to nearest float32
    (all positive, so Horner has no cancellation); ``ACKLAM_C``/``ACKLAM_D`` are Acklam's
    published tail coefficients c1..c6, d1..d4 rounded to nearest float32::

        ACKLAM_A[0] = 0x421EC98E    ACKLAM_B[0] = 0x4259E786    # multiply t**5
        ACKLAM_A[1] = 0x432B5337    ACKLAM_B[1] = 0x42BAFB3F
        ACKLAM_A[2] = 0x429F95FB    ACKLAM_B[2] = 0x41E14920
        ACKLAM_A[3] = 0x41010434    ACKLAM_B[3] = 0x40070833
        ACKLAM_A[4] = 0x3E413E9D    ACKLAM_B[4] = 0x3D1D83DD
        ACKLAM_A[5] = 0x3A3A004B    ACKLAM_B[5] = 0x38E788EF    # constant terms
        ACKLAM_C[0] = 0xBBFF186D    ACKLAM_D[0] = 0x3BFF16C3    # C1, D1
        ACKLAM_C[1] = 0xBEA51126    ACKLAM_D[1] = 0x3EA51A69
        ACKLAM_C[2] = 0xC019A606    ACKLAM_D[2] = 0x401C7D14
        ACKLAM_C[3] = 0xC0232ED1    ACKLAM_D[3] = 0x4070483B    # C4, D4
        ACKLAM_C[4] = 0x408BFD40
        ACKLAM_C[5] = 0x403C0AE1                                # C6
        ACKLAM_CENTRAL_MAX = 0x3EF39581    # 0.47575 = 1/2 - p_low
        HALF = 0x3F000000    ONE = 0x3F800000    MINUS_TWO = 0xC0000000

    Both branches are odd in q exactly, so ``f(-q) = -f(q)`` bit for bit. Only the
    tail lanes (about 4.85% of a uniform sample) evaluate the tail branch; the
    result is elementwise, so that is the same as evaluating it everywhere.
    """
    shape = np.shape(q)
    q = fp.f32(q).reshape(-1)
    a = fp.abs(q)
    valid = a < HALF  # False for NaN
    q = fp.where(valid, q, F32(0.0))
    a = fp.abs(q)

    t = fp.mul(fp.sub(HALF, a), fp.add(HALF, a))
    num = fp.mul(_horner(ACKLAM_A, t, last_one=False), q)
    den = _horner(ACKLAM_B, t, last_one=False)
    z = fp.div(num, den)

    tail = a > ACKLAM_CENTRAL_MAX
    if tail.any():
        at, qt = a[tail], q[tail]
        p = fp.sub(HALF, at)
        s = fp.sqrt(fp.mul(MINUS_TWO, log(p)))
        zt = fp.div(_horner(ACKLAM_C, s, last_one=False), _horner(ACKLAM_D, s, last_one=True))
        z[tail] = fp.where(qt > 0, fp.neg(zt), zt)

    z = fp.where(valid, z, fp.from_bits(fp.CANONICAL_NAN_BITS))
    return z.reshape(shape)


def normal(stream: PhiloxStream, start: int, count: int) -> np.ndarray:
    """Standard normal float32 values ``start .. start+count-1`` of ``stream``.

    Order of operations for value i::

        w = stream.uint32(i)                        # Philox word i
        u = (2 * (w >> 9) + 1) * 2**-24             # uniform_open_from_uint32, exact, in (0, 1)
        q = u - 1/2                                 # exact (u is a multiple of 2**-24)
        z = normal_from_centered(q)                 # Acklam, float32

    Values lie in [-5.2947, 5.2947]; value i depends on (stream key, i) only.
    """
    u = uniform_open_from_uint32(stream.uint32(start, count))
    q = fp.sub(u, HALF)
    return normal_from_centered(q)


def truncated_normal_constants(bound: float) -> tuple[np.float32, np.float32]:
    """(mass, bound32) for ``truncated_normal``: float32 of ``Phi(b) - Phi(-b)``, and of b.

    Host computation (float64, ``spec.erf``): ``mass = erf(b * SQRT1_2)`` rounded
    once to float32; ``bound32 = float32(b)``.
    """
    b = float(bound)
    if not (b > 0.0 and b < float("inf")):
        raise ValueError(f"truncated_normal bound must be a positive finite number, got {bound!r}")
    mass = fp.f32(erf.erf(b * erf.SQRT1_2)).reshape(-1)[0]
    return mass, fp.f32(b).reshape(-1)[0]


def truncated_normal(stream: PhiloxStream, start: int, count: int, bound: float = 2.0) -> np.ndarray:
    """Standard normal float32 values truncated to ``[-bound, bound]``, no rejection.

    The uniform is mapped into the central probability mass of the interval,
    then inverted. Order of operations for value i::

        (mass, b32) = truncated_normal_constants(bound)   # host, once: float32(erf(b/sqrt 2)), float32(b)
        w = stream.uint32(i)
        u = (2 * (w >> 9) + 1) * 2**-24                    # exact, in (0, 1)
        t = u - 1/2                                        # exact
        q = t * mass                                       # one rounding; |q| < mass/2
        z = normal_from_centered(q)
        z = min(max(z, -b32), b32)                         # absorbs last-bit overshoot

    The clamp only acts on values within a few float32 ulps of +-bound (the
    rounding of ``mass`` and the approximation); values stay exactly
    antisymmetric. Value i depends on (stream key, i, bound) only.
    """
    mass, b32 = truncated_normal_constants(bound)
    u = uniform_open_from_uint32(stream.uint32(start, count))
    q = fp.mul(fp.sub(u, HALF), mass)
    z = normal_from_centered(q)
    return fp.minimum(fp.maximum(z, fp.neg(b32)), b32)
