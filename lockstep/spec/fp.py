"""The float32 rules every lockstep number obeys.

Contract (DESIGN.md, "the four locks"):

* Arithmetic is IEEE-754 binary32, round-to-nearest-even. Each of ``+ - * / sqrt``
  is rounded separately; ``a*b + c`` is always two roundings (never an FMA).
  NumPy's float32 ufuncs on arrays round each element correctly whatever SIMD
  path they take, so they are safe building blocks for these five operations
  *and nothing else*.
* Round, then flush: every result ``r`` with ``0 < |r| < 2**-126`` becomes a zero
  of ``r``'s sign. Floats entering the spec are flushed the same way (``f32``).
* Every NaN result is the canonical quiet NaN ``0x7FC00000``.
* ``max``/``min`` use the total order ``-0.0 < +0.0``; a NaN operand gives the
  canonical NaN.

Every op in ``lockstep.spec`` is built from the helpers here, so reading this
file tells you what every published bit is made of.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
CANONICAL_NAN_BITS = np.uint32(0x7FC00000)
SIGN_BIT = np.uint32(0x80000000)
EXPONENT_MASK = np.uint32(0x7F800000)
MANTISSA_MASK = np.uint32(0x007FFFFF)
SMALLEST_NORMAL = np.float32(2.0**-126)  # 0x00800000
LARGEST_FINITE = np.float32(np.finfo(np.float32).max)  # 0x7F7FFFFF


def bits(x) -> np.ndarray:
    """The uint32 bit patterns of a float32 array (a view, no copy when possible; shape kept)."""
    a = np.asarray(x, dtype=F32)
    return (a if a.flags.c_contiguous else a.copy()).view(np.uint32)


def from_bits(u) -> np.ndarray:
    """The float32 values of uint32 bit patterns (shape kept)."""
    a = np.asarray(u, dtype=np.uint32)
    return (a if a.flags.c_contiguous else a.copy()).view(F32)


def canon(x: np.ndarray) -> np.ndarray:
    """Round-then-flush and canonical NaN, applied to an already rounded float32 array.

    * exponent field 0 (zero or subnormal) -> zero with the same sign bit;
    * any NaN -> 0x7FC00000.
    """
    u = bits(np.asarray(x, dtype=F32))
    exp_field = u & EXPONENT_MASK
    u = np.where(exp_field == 0, u & SIGN_BIT, u)
    is_nan = (exp_field == EXPONENT_MASK) & ((u & MANTISSA_MASK) != 0)
    return np.where(is_nan, CANONICAL_NAN_BITS, u).astype(np.uint32, copy=False).view(F32)


def f32(x) -> np.ndarray:
    """Bring a value into the spec: cast to float32 (round to nearest), flush, canonical NaN.

    Integer inputs are converted exactly when representable; float64 inputs are
    rounded once to float32. The result is a fresh C-contiguous array.
    """
    return canon(np.array(x, dtype=F32, copy=True))


def _f32_operands(*xs):
    out = []
    for x in xs:
        if isinstance(x, np.ndarray) and x.dtype == F32:
            out.append(x)
        else:
            out.append(np.asarray(x, dtype=F32))
    return out


def add(a, b) -> np.ndarray:
    """``a + b``, one rounding, then flush and canonical NaN."""
    a, b = _f32_operands(a, b)
    with np.errstate(all="ignore"):
        return canon(np.add(a, b, dtype=F32))


def sub(a, b) -> np.ndarray:
    """``a - b``, one rounding, then flush and canonical NaN."""
    a, b = _f32_operands(a, b)
    with np.errstate(all="ignore"):
        return canon(np.subtract(a, b, dtype=F32))


def mul(a, b) -> np.ndarray:
    """``a * b``, one rounding, then flush and canonical NaN."""
    a, b = _f32_operands(a, b)
    with np.errstate(all="ignore"):
        return canon(np.multiply(a, b, dtype=F32))


def div(a, b) -> np.ndarray:
    """``a / b``, one rounding (IEEE division), then flush and canonical NaN."""
    a, b = _f32_operands(a, b)
    with np.errstate(all="ignore"):
        return canon(np.divide(a, b, dtype=F32))


def sqrt(a) -> np.ndarray:
    """IEEE square root, one rounding; ``sqrt(-0.0) = -0.0``; negative -> canonical NaN."""
    (a,) = _f32_operands(a)
    with np.errstate(all="ignore"):
        return canon(np.sqrt(a, dtype=F32))


def neg(a) -> np.ndarray:
    """Exact sign flip (``-x``); a NaN stays canonical."""
    (a,) = _f32_operands(a)
    return canon(np.negative(a))


def abs(a) -> np.ndarray:  # noqa: A001 - the op is called abs in every backend
    """Exact ``|x|`` (clears the sign bit); a NaN stays canonical."""
    (a,) = _f32_operands(a)
    return canon(np.abs(a))


def _total_key(x: np.ndarray) -> np.ndarray:
    """A signed int64 key whose order is the float total order (-0.0 < +0.0)."""
    u = bits(x).astype(np.int64)
    return np.where(u & 0x80000000, -(u & 0x7FFFFFFF) - 1, u)


def maximum(a, b) -> np.ndarray:
    """Elementwise max in the total order ``-0.0 < +0.0``; a NaN operand -> canonical NaN."""
    a, b = _f32_operands(a, b)
    a, b = np.broadcast_arrays(canon(a), canon(b))
    r = np.where(_total_key(a) >= _total_key(b), a, b)
    r = np.where(np.isnan(a) | np.isnan(b), from_bits(CANONICAL_NAN_BITS), r)
    return canon(r)


def minimum(a, b) -> np.ndarray:
    """Elementwise min in the total order ``-0.0 < +0.0``; a NaN operand -> canonical NaN."""
    a, b = _f32_operands(a, b)
    a, b = np.broadcast_arrays(canon(a), canon(b))
    r = np.where(_total_key(a) <= _total_key(b), a, b)
    r = np.where(np.isnan(a) | np.isnan(b), from_bits(CANONICAL_NAN_BITS), r)
    return canon(r)


def where(cond, a, b) -> np.ndarray:
    """Exact selection (no arithmetic)."""
    a, b = _f32_operands(a, b)
    return canon(np.where(cond, a, b))


def ldexp_exact(x, k) -> np.ndarray:
    """``x * 2**k`` for integer arrays k, computed as products by exact powers of two.

    The scale is applied as up to three factors ``2**k1 * 2**k2 * 2**k3`` (each a
    normal power of two, k1 first, each product rounded and flushed as usual).
    While intermediate products stay normal they are exact, so the result is the
    correctly rounded ``x * 2**k`` followed by the flush rule.
    """
    (x,) = _f32_operands(x)
    k = np.asarray(k, dtype=np.int32)
    k = np.clip(k, -300, 300)
    k1 = np.clip(k, -126, 127)
    k2 = np.clip(k - k1, -126, 127)
    k3 = k - k1 - k2
    r = x
    for kk in (k1, k2, k3):
        scale = from_bits(((kk.astype(np.int64) + 127) << 23).astype(np.uint32))
        r = mul(r, scale)
    return r
