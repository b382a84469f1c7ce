"""The float32 rules every lockstep number obeys.

Contract (the four locks of ``docs/numerical-contract.md``):

* Arithmetic is IEEE-754 binary32, round-to-nearest-even. Each of ``+ - * / sqrt``
  is rounded separately; ``a*b + c`` is always two roundings (never an FMA).
  NumPy's float32 ufuncs on arrays round each element correctly whatever SIMD
  path they take, so they are safe building blocks for these five operations
  *and nothing else*.
* Inputs are read canonically: every float32 operand of every op
  is read with a subnormal (``0 < |x| < 2**-126``, exponent field 0) as a zero of
  its sign ("denormals are zero", DAZ, as Apple GPUs read them), and any NaN as the
  canonical NaN ``0x7FC00000``. So ``add(2**-127, 2**-127)`` is ``+0.0`` and
  ``sqrt(-2**-140)`` is ``-0.0``. ``f32`` and ``_f32_operands`` apply the rule; every
  op here and in the other spec modules reads its inputs through one of them.
* Round, then flush: every result ``r`` with ``0 < |r| < 2**-126`` becomes a zero
  of ``r``'s sign. "Round" is IEEE rounding with gradual underflow (on the
  subnormal grid); "flush" is then a test of the rounded result's exponent field.
  Hardware flush-to-zero decides on the unrounded (or exponent-unbounded) result
  and differs exactly when the exact result lies in ``[2**-126 - 2**-150, 2**-126)``
  and rounds up to ``2**-126``: ``0x3F7FFFFF * 0x00800000`` is ``0x00800000`` here
  and 0 under x86 FTZ; ``0x3F7FFFFE * 0x00800001``, ``0x00FFFFFF / 2`` and
  ``0x00FFFFFF * 0.5`` are ``0x00800000`` here and 0 under flush-before-rounding
  (the conformance boundary table holds all four).
* Every NaN result is the canonical quiet NaN ``0x7FC00000``.
* ``max``/``min`` use the total order ``-0.0 < +0.0``; a NaN operand gives the
  canonical NaN.

So every input and every output of every op is *canonical*: no subnormal, no NaN
but ``0x7FC00000``. Backends may therefore canonicalize once, when an array
enters the device (``asarray``, see ``lockstep.contract``), and keep
no input flush in their kernels. Files from outside (checkpoints, inputs) are read
under the same rule on every backend, not refused: a subnormal in a checkpoint is
a zero of its sign wherever the step is replayed.

Every op in ``lockstep.spec`` is built from the helpers here, so reading this
file tells you what every published bit is made of.
"""

from __future__ import annotations

import numpy as np

from . import shapes as S
from .kinds import F32, F32Operand, op

CANONICAL_NAN_BITS = np.uint32(0x7FC00000)
SIGN_BIT = np.uint32(0x80000000)
EXPONENT_MASK = np.uint32(0x7F800000)
MANTISSA_MASK = np.uint32(0x007FFFFF)
SMALLEST_NORMAL = np.float32(2.0**-126)  # 0x00800000
LARGEST_FINITE = np.float32(np.finfo(np.float32).max)  # 0x7F7FFFFF


def bits(x) -> np.ndarray:
    """The uint32 bit patterns of a float32 array (a view, no copy when possible; shape kept).

    Subnormal inputs: kept as they are (a bit view reads no value; nothing is flushed).
    """
    a = np.asarray(x, dtype=np.float32)
    return (a if a.flags.c_contiguous else a.copy()).view(np.uint32)


def from_bits(u) -> np.ndarray:
    """The float32 values of uint32 bit patterns (shape kept).

    Subnormal inputs: a pattern with exponent field 0 stays a subnormal float32 here;
    the ops below read it as a zero of its sign when it enters them.
    """
    a = np.asarray(u, dtype=np.uint32)
    return (a if a.flags.c_contiguous else a.copy()).view(np.float32)


def canon(x: np.ndarray) -> np.ndarray:
    """Round-then-flush and canonical NaN, applied to an already rounded float32 array.

    * exponent field 0 (zero or subnormal) -> zero with the same sign bit;
    * any NaN -> 0x7FC00000.

    Subnormal inputs: become zeros of their sign (this is the flush; applied to an
    input it is the DAZ reading). Returns x itself when no element has exponent field
    0 or 255 (nothing to change): pass an array the caller owns.
    """
    a = np.asarray(x, dtype=np.float32)
    u = bits(a)
    exp_field = u & EXPONENT_MASK
    if a.size == 0 or (exp_field.min() != 0 and exp_field.max() != EXPONENT_MASK):
        return a  # every element normal: nothing to change
    zero_or_subnormal = exp_field == 0
    inf_or_nan = exp_field == EXPONENT_MASK
    u = np.where(zero_or_subnormal, u & SIGN_BIT, u)
    is_nan = inf_or_nan & ((u & MANTISSA_MASK) != 0)
    return np.where(is_nan, CANONICAL_NAN_BITS, u).astype(np.uint32, copy=False).view(np.float32)


def f32(x) -> np.ndarray:
    """Bring a value into the spec: cast to float32 (round to nearest), then read it
    canonically (a subnormal is a zero of its sign, any NaN is ``0x7FC00000``).

    Integer inputs are converted exactly when representable (|i| <= 2**24 always is).
    A NumPy integer array (int64 included) that is not exactly representable is rounded
    once, straight from the exact integer, to the nearest float32 (ties to even): C's
    ``(float)i`` for an ``int64_t i``, NOT ``(float)(double)i``, which rounds twice and
    differs above 2**53 (``2**60 + 2**36 + 1`` gives ``2**60 + 2**37`` here, ``2**60``
    through a double). A bare Python ``int`` (or a list of them) is first made a float64
    by NumPy, so it *is* rounded twice: pass integers beyond 2**53 as an int64 array.
    float64 inputs are rounded once to float32. The result is a fresh C-contiguous array.

    Subnormal inputs: become zeros of their sign (DAZ), as do float64 values that round
    to a float32 subnormal.
    """
    return canon(np.array(x, dtype=np.float32, copy=True))


def is_canonical(x) -> bool:
    """True when a float32 array holds no subnormal and no NaN other than ``0x7FC00000``.

    Subnormal inputs: make the answer False (a zero of either sign is canonical).
    """
    u = bits(np.asarray(x, dtype=np.float32))
    exp_field = u & EXPONENT_MASK
    subnormal = (exp_field == 0) & ((u & ~SIGN_BIT) != 0)
    other_nan = (exp_field == EXPONENT_MASK) & ((u & MANTISSA_MASK) != 0) & (u != CANONICAL_NAN_BITS)
    return not bool((subnormal | other_nan).any())


def canonical(x):
    """A host array as a backend's ``asarray`` gives it: float32 read canonically, other dtypes as they are.

    Subnormal inputs: become zeros of their sign (DAZ), which is why a backend may
    keep no input flush in its kernels. Returns x itself (as an ndarray) when it needs
    no change, else a canonical copy.
    """
    a = np.asarray(x)
    if a.dtype != np.float32 or is_canonical(a):
        return a
    return canon(a)


def _read_operand(x) -> np.ndarray:
    """One operand, read as the spec reads every input: cast to float32; a subnormal input is
    a zero of its sign (DAZ). (A NaN operand needs no work here: every op below turns it into a
    NaN result or selects it, and the result's ``canon`` makes that ``0x7FC00000``.)"""
    a = x if isinstance(x, np.ndarray) and x.dtype == np.float32 else np.asarray(x, dtype=np.float32)
    u = bits(a)
    exp_field = u & EXPONENT_MASK
    if a.size == 0 or exp_field.min() != 0:  # no zero, no subnormal: nothing to read differently
        return a
    return np.where(exp_field == 0, u & SIGN_BIT, u).astype(np.uint32, copy=False).view(np.float32)


def _f32_operands(*xs):
    """The operands of an elementwise op, read canonically (``_read_operand``)."""
    return [_read_operand(x) for x in xs]


def _rounded(op, a, b) -> np.ndarray:
    """``op(a, b)`` of two float32 operands, one IEEE rounding, then flush and canonical NaN.

    What every binary op below shares: subnormal inputs are read as zeros of their sign
    before the operation (DAZ; a backend applies this once, in ``asarray``), and a NaN
    operand gives the canonical NaN.
    """
    a, b = _f32_operands(a, b)
    with np.errstate(all="ignore"):
        return canon(op(a, b, dtype=np.float32))


@op(S.binary)
def add(a: F32Operand, b: F32Operand) -> F32:
    """``a + b``, one rounding, then flush and canonical NaN. Subnormal inputs: as ``_rounded`` says."""
    return _rounded(np.add, a, b)


@op(S.binary)
def sub(a: F32Operand, b: F32Operand) -> F32:
    """``a - b``, one rounding, then flush and canonical NaN. Subnormal inputs: as ``_rounded`` says."""
    return _rounded(np.subtract, a, b)


@op(S.binary)
def mul(a: F32Operand, b: F32Operand) -> F32:
    """``a * b``, one rounding, then flush and canonical NaN. Subnormal inputs: as ``_rounded`` says."""
    return _rounded(np.multiply, a, b)


@op(S.binary)
def div(a: F32Operand, b: F32Operand) -> F32:
    """``a / b``, one rounding, then flush and canonical NaN. Subnormal inputs: as ``_rounded`` says."""
    return _rounded(np.divide, a, b)


@op(S.unary)
def sqrt(a: F32Operand) -> F32:
    """IEEE square root, one rounding; ``sqrt(-0.0) = -0.0``; negative -> canonical NaN.

    Subnormal inputs: read as zeros of their sign first (DAZ), so a negative subnormal
    gives ``-0.0`` and a positive one ``+0.0``.
    """
    (a,) = _f32_operands(a)
    with np.errstate(all="ignore"):
        return canon(np.sqrt(a, dtype=np.float32))


@op(S.unary)
def neg(a: F32Operand) -> F32:
    """Exact sign flip (``-x``); a NaN stays canonical.

    Subnormal inputs: read as zeros of their sign first (DAZ), so ``neg(2**-140)`` is ``-0.0``.
    """
    (a,) = _f32_operands(a)
    return canon(np.negative(a))


@op(S.unary)
def abs(a: F32Operand) -> F32:  # noqa: A001 - the op is called abs in every backend
    """Exact ``|x|`` (clears the sign bit); a NaN stays canonical.

    Subnormal inputs: read as zeros of their sign first (DAZ), so ``abs(-2**-140)`` is ``+0.0``.
    """
    (a,) = _f32_operands(a)
    return canon(np.abs(a))


def _total_key(x: np.ndarray) -> np.ndarray:
    """A signed int64 key whose order is the float total order (-0.0 < +0.0)."""
    u = bits(x).astype(np.int64)
    return np.where(u & 0x80000000, -(u & 0x7FFFFFFF) - 1, u)


@op(S.binary)
def maximum(a: F32Operand, b: F32Operand) -> F32:
    """Elementwise max in the total order ``-0.0 < +0.0``; a NaN operand -> canonical NaN.

    Subnormal inputs: read as zeros of their sign first (DAZ), so ``maximum(2**-140, +0.0)``
    is ``+0.0`` and ``maximum(-2**-140, -0.0)`` is ``-0.0``.
    """
    a, b = np.broadcast_arrays(*_f32_operands(a, b))
    r = np.where(_total_key(a) >= _total_key(b), a, b)
    r = np.where(np.isnan(a) | np.isnan(b), from_bits(CANONICAL_NAN_BITS), r)
    return canon(r)


@op(S.binary)
def minimum(a: F32Operand, b: F32Operand) -> F32:
    """Elementwise min in the total order ``-0.0 < +0.0``; a NaN operand -> canonical NaN.

    Subnormal inputs: read as zeros of their sign first (DAZ), as in ``maximum``.
    """
    a, b = np.broadcast_arrays(*_f32_operands(a, b))
    r = np.where(_total_key(a) <= _total_key(b), a, b)
    r = np.where(np.isnan(a) | np.isnan(b), from_bits(CANONICAL_NAN_BITS), r)
    return canon(r)


def where(cond, a, b) -> np.ndarray:
    """Exact selection (no arithmetic): ``a`` where ``cond``, else ``b``.

    Subnormal inputs: read as zeros of their sign first (DAZ), so a selected subnormal
    comes out as a zero of its sign; a NaN comes out canonical.
    """
    a, b = _f32_operands(a, b)
    return canon(np.where(cond, a, b))


def ldexp_exact(x, k) -> np.ndarray:
    """``x * 2**k`` for integer arrays k, computed as products by exact powers of two.

    The 2**k scaling (the same words as ``transcendental.exp``'s order block)::

        k  = clip(k, -300, 300)                       # exact
        k1 = clip(k, -126, 127)                       # exact
        k2 = clip(k - k1, -126, 127)                  # exact
        k3 = k - k1 - k2                              # exact, in [-48, 46]
        r  = ((x * 2**k1) * 2**k2) * 2**k3            # 3 products, each rounded and flushed

    Each factor ``2**ki`` is a normal power of two. While the partial products stay
    normal they are exact, so the result is the correctly rounded ``x * 2**k``
    followed by the flush rule; +inf/-inf on overflow, a zero of x's sign below
    2**-126 (a factor of ``2**0 = 1`` changes nothing).

    Subnormal inputs: ``x`` is read as a zero of its sign first (DAZ), so the result
    is that zero for every k (a subnormal is never scaled up into the normal range).
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
