"""The float32 rules of ``lockstep.spec.fp`` as Numba scalar helpers, and the elementwise ops.

Every kernel in this backend is built from the helpers here:

* ``bits``/``from_bits``: exact reinterpretation float32 <-> uint32 (an LLVM bitcast).
* ``fl(r)``: round-then-flush, a bit test on the already rounded float32 result:
  exponent field 0 (zero or subnormal) -> a zero of r's sign.
* ``cn(r)``: ``fl`` plus the canonical NaN ``0x7FC00000``; applied to every value a
  kernel stores into an op's output. Intermediate NaNs need no canonicalizing: a
  NaN's payload never changes a later ``+ - * / sqrt`` result's NaN-ness, and the
  output is canonicalized anyway.
* ``fadd``, ``fsub``, ``fmul``, ``fdiv``: one IEEE operation, then ``fl``.
* Inputs are read canonically (the spec's rule: a subnormal input is a zero of
  its sign): ``asarray`` canonicalizes (``canonical``: one scan, no copy when nothing
  changes), and the kernels still ``fl`` every value they load from an argument
  (a bit test in a register, free next to the load), so a host array that never
  went through ``asarray`` is read under the same rule.

Compilation rules (docs/numerical-contract.md, lock 2): ``njit`` without ``fastmath`` (so LLVM never
contracts ``a*b + c`` into an FMA), ``error_model="numpy"`` (IEEE division by zero,
no Python exception), every constant a ``np.float32`` so no intermediate is promoted
to float64, ``cache=True``: the decorators and the task skeleton are in ``tasks``.
"""

from __future__ import annotations

from types import FunctionType

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from lockstep.spec.fp import CANONICAL_NAN_BITS, EXPONENT_MASK, MANTISSA_MASK, SIGN_BIT

from .tasks import TaskKernel, block_bounds, contiguous, element_blocks, kernel, parallel_kernel, scalar

F32 = np.float32
# The float32 bit fields are the spec's (``spec.fp``), imported, not copied.
ABS_MASK = np.uint32(~SIGN_BIT & np.uint32(0xFFFFFFFF))
NEG_ZERO_BITS = SIGN_BIT  # -0.0 is the sign bit alone
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
# A contraction whose every nonzero product has magnitude >= 2**-103 never flushes
# (see ``safe_products``).
SAFE_PRODUCT = 2.0**-103


@intrinsic
def bits(typingctx, x):
    """The uint32 pattern of a float32 (exact)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def from_bits(typingctx, u):
    """The float32 whose pattern is the low 32 bits of integer u (exact)."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if u.bitwidth > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif u.bitwidth < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(u), codegen


@scalar
def fl(r):
    """Round-then-flush: a zero or subnormal result becomes a zero of its sign."""
    u = bits(r)
    if (u & EXPONENT_MASK) == 0:
        return from_bits(u & SIGN_BIT)
    return r


@scalar
def cn(r):
    """``fl`` and the canonical NaN: what every stored output element goes through."""
    u = bits(r)
    e = u & EXPONENT_MASK
    if e == 0:
        return from_bits(u & SIGN_BIT)
    if e == EXPONENT_MASK and (u & MANTISSA_MASK) != 0:
        return from_bits(CANONICAL_NAN_BITS)
    return r


@scalar
def fadd(a, b):
    return fl(a + b)


@scalar
def fsub(a, b):
    return fl(a - b)


@scalar
def fmul(a, b):
    return fl(a * b)


@scalar
def fdiv(a, b):
    return fl(a / b)


@scalar
def total_key(x):
    """An int64 whose order is the float total order (-0.0 < +0.0), as ``spec.fp._total_key``."""
    u = np.int64(bits(x))
    if u & 0x80000000:
        return -(u & 0x7FFFFFFF) - 1
    return u


@scalar
def max_total(a, b):
    """``spec.fp.maximum`` of two canonical values: total order, any NaN -> canonical NaN."""
    if a != a or b != b:
        return from_bits(CANONICAL_NAN_BITS)
    return a if total_key(a) >= total_key(b) else b


@scalar
def min_total(a, b):
    """``spec.fp.minimum`` of two canonical values: total order, any NaN -> canonical NaN."""
    if a != a or b != b:
        return from_bits(CANONICAL_NAN_BITS)
    return a if total_key(a) <= total_key(b) else b


@scalar
def abs_bits(x):
    """``|x|`` as a uint32 pattern, with zeros mapped to 0xFFFFFFFF (for ``min_nonzero_abs``)."""
    u = np.uint32(bits(x) & ABS_MASK)
    return np.uint32(0xFFFFFFFF) if u == 0 else u


@kernel
def min_nonzero_abs(x):
    """Smallest nonzero |x| over a 1-D array, as float64 (+inf if all are zero).

    NaNs compare above every finite pattern, so a NaN never is the minimum unless
    every nonzero is NaN (and then the product test below fails: NaN >= t is False).
    """
    m = np.uint32(0xFFFFFFFF)
    for i in range(x.size):
        m = min(m, abs_bits(x[i]))
    if m == np.uint32(0xFFFFFFFF):
        return np.inf
    return np.float64(from_bits(m))


@scalar
def safe_products(min_a, min_b):
    """True when every nonzero product of the two operands' elements has |p| >= 2**-103.

    Then a contraction ``acc = acc + a*b`` starting from +0.0 never produces a
    subnormal, so its unflushed loop gives the flushed loop's bits: every product is
    a multiple of 2**-126 (a float32 >= 2**-103 has ulp >= 2**-126), so every exact
    partial sum is one too, and rounding a multiple of a power of two q that is
    >= q in magnitude gives a multiple of q again. A nonzero multiple of 2**-126
    is never subnormal. (Products of float32s are exact in float64.)
    """
    return min_a * min_b >= SAFE_PRODUCT


# ---------------------------------------------------------------- the elementwise template

def _unary_template(t0, t1, a, out):
    for blk in range(t0, t1):
        lo, hi = block_bounds(blk, out.size)
        a_b, out_b = a[lo:hi], out[lo:hi]
        for i in range(hi - lo):
            out_b[i] = cn(op(a_b[i]))  # noqa: F821 - ``op`` is bound by ``elementwise``


def _unary_then_canonical_template(t0, t1, a, out):
    for blk in range(t0, t1):
        lo, hi = block_bounds(blk, out.size)
        a_b, out_b = a[lo:hi], out[lo:hi]
        for i in range(hi - lo):
            out_b[i] = op(a_b[i])  # noqa: F821 - ``op`` is bound by ``elementwise``
        for i in range(hi - lo):
            out_b[i] = cn(out_b[i])


def _binary_template(t0, t1, a, b, out):
    for blk in range(t0, t1):
        lo, hi = block_bounds(blk, out.size)
        a_b, b_b, out_b = a[lo:hi], b[lo:hi], out[lo:hi]
        for i in range(hi - lo):
            out_b[i] = cn(op(a_b[i], b_b[i]))  # noqa: F821 - ``op`` is bound by ``elementwise``


def _scalar_template(t0, t1, a, s, out):
    for blk in range(t0, t1):
        lo, hi = block_bounds(blk, out.size)
        a_b, out_b = a[lo:hi], out[lo:hi]
        for i in range(hi - lo):
            out_b[i] = cn(op(a_b[i], s))  # noqa: F821 - ``op`` is bound by ``elementwise``


def _binary_into_left_template(t0, t1, a, b):
    for blk in range(t0, t1):
        lo, hi = block_bounds(blk, a.size)
        a_b, b_b = a[lo:hi], b[lo:hi]
        for i in range(hi - lo):
            a_b[i] = cn(op(a_b[i], b_b[i]))  # noqa: F821 - ``op`` is bound by ``elementwise``


# Arity "2 into a": the binary op written over its left operand. Why not ``_binary_template``
# with ``out`` = an operand: LLVM then finds the output overlapping an input and runs its
# scalar fallback loop (measured 14x slower for add on 3M elements).
_TEMPLATES = {1: _unary_template, 2: _binary_template, "scalar": _scalar_template,
              "1, then cn": _unary_then_canonical_template, "2 into a": _binary_into_left_template}


def elementwise(op, arity, name: str, weight: int = 1) -> "TaskKernel":
    """The parallel kernel ``out[i] = cn(op(a[i]))`` (arity 1), ``cn(op(a[i], b[i]))`` (2) or
    ``cn(op(a[i], s))`` ("scalar": s one float32), in blocks of ``tasks.BLOCK`` elements per task.
    Arity ``"1, then cn"`` is arity 1 in two passes over each block, ``op`` then ``cn``: the
    same bits, and faster for the large inlined transcendentals (their code and the flush
    do not share registers).

    ``op`` is a Numba scalar function; the template is compiled once per op under ``name``.
    Why a fresh function object with ``op`` as a global rather than a closure: Numba's
    on-disk cache keys a closure by a pickle of its cell contents, and a dispatcher pickles
    differently in every process, so a closure would recompile on every start; its cache
    files are named by the qualified name, hence the distinct ``name`` per op.
    """
    template = _TEMPLATES[arity]
    fn = FunctionType(template.__code__, {**template.__globals__, "op": op}, name)
    fn.__qualname__ = name
    return TaskKernel(fn, element_blocks, weight)


# ---------------------------------------------------------------- array helpers

SCAN_CHUNK = 1 << 16  # elements per task of ``_scan``


def _scan_chunks(x, out) -> int:
    return out.shape[0]


@kernel
def _scan_part(x):
    """(any element not canonical, any inf or NaN, max |x| of the finite ones as bits) of a flat
    float32 array. Branch-free (flags accumulated as integers), so the loop vectorizes; every value
    is cast back to uint32, since Numba widens integer arithmetic to 64 bits, which halved the
    lanes (0.57 ns an element with AVX2 stood in before, 0.17 after)."""
    zero = np.uint32(0)
    exponent, magnitude, canonical_nan = np.uint32(EXPONENT_MASK), np.uint32(ABS_MASK), np.uint32(CANONICAL_NAN_BITS)
    bad = zero
    special_seen = zero
    mx = zero
    for i in range(x.size):
        u = bits(x[i])
        e = np.uint32(u & exponent)
        a = np.uint32(u & magnitude)
        subnormal = (e == zero) & (a != zero)
        odd_nan = (a > exponent) & (u != canonical_nan)
        bad = np.uint32(bad | np.uint32(subnormal | odd_nan))
        special = e == exponent  # inf or NaN
        special_seen = np.uint32(special_seen | np.uint32(special))
        mx = np.uint32(max(mx, zero if special else a))
    return bad, special_seen, mx


@parallel_kernel(_scan_chunks)
def _scan(t0, t1, x, out):
    """``out[c]`` = ``_scan_part`` of chunk c (``SCAN_CHUNK`` elements) of a flat float32 array.
    Or and max: any order, any split."""
    for c in range(t0, t1):
        out[c, 0], out[c, 1], out[c, 2] = _scan_part(x[c * SCAN_CHUNK:(c + 1) * SCAN_CHUNK])


def entered(x):
    """``spec.fp.f32(x)`` without a copy when x already is canonical C-contiguous float32.

    Returns ``(array, all_finite, max_abs)``; the array must be treated as read-only.
    """
    a = contiguous(np.asarray(x, dtype=np.float32))
    if a.size == 0:
        return a, True, 0.0
    noncanonical, finite, mx = scan(a.reshape(-1))
    if noncanonical:
        a = f32(a)
    return a, finite, mx


def scan(flat: np.ndarray) -> tuple[bool, bool, float]:
    """(any element not canonical, all finite, max |x| of the finite) of a flat C-contiguous float32
    array, in one pass (``_scan``)."""
    parts = np.empty((-(-flat.size // SCAN_CHUNK), 3), dtype=np.uint32)
    _scan(flat, parts)
    mx = parts[:, 2].max(keepdims=True).view(np.float32)[0] if flat.size else 0.0
    return bool(parts[:, 0].any()), not parts[:, 1].any(), float(mx)


@scalar
def _identity(a):
    return a


_canon_into = elementwise(_identity, 1, "_canon_into")  # out[i] = cn(x[i])


def canonical(a: np.ndarray) -> np.ndarray:
    """A float32 array read canonically (``spec.fp.canonical``): a itself when a one-pass
    scan finds no subnormal and no non-canonical NaN, else a canonical copy (same shape)."""
    if a.size == 0:
        return a
    flat = contiguous(a).reshape(-1)
    noncanonical, _finite, _mx = scan(flat)
    return f32(flat).reshape(a.shape) if noncanonical else a


def f32(x) -> np.ndarray:
    """``spec.fp.f32``: a fresh C-contiguous float32 copy, flushed, NaNs canonical."""
    a = np.asarray(x, dtype=np.float32)
    out = np.empty(a.shape, dtype=np.float32)
    _canon_into(contiguous(a).reshape(-1), out.reshape(-1))
    return out


def contiguous_f32(x) -> np.ndarray:
    """A C-contiguous float32 view or copy (rounded from float64 when needed; not flushed: the
    kernels flush what they load). ``f32`` is the one that flushes."""
    return contiguous(np.asarray(x, dtype=np.float32))


def f32_scalar(x) -> np.float32:
    """A float32 scalar as ``np.asarray(x, dtype=float32)`` gives it (rounded, not flushed)."""
    a = np.asarray(x, dtype=np.float32)
    if a.size != 1:
        raise ValueError(f"expected a scalar, got shape {a.shape}")
    return np.float32(a.reshape(-1)[0])


@kernel
def _cn_value(x):
    return cn(x)


def canon_scalar(x) -> np.float32:
    """``spec.fp.f32`` of a scalar, as a ``np.float32``."""
    return np.float32(_cn_value(np.float32(x)))


# ---------------------------------------------------------------- elementwise ops
# One template loop (``elementwise``) around one scalar expression per op. The op's
# scalar function returns the rounded result; the template stores ``cn`` of it.
# Binary ops take two flat arrays of equal length; broadcasting happens in ``_binary``.

@scalar
def _add(a, b):
    return fl(a) + fl(b)


@scalar
def _sub(a, b):
    return fl(a) - fl(b)


@scalar
def _mul(a, b):
    return fl(a) * fl(b)


@scalar
def _div(a, b):
    return fl(a) / fl(b)


@scalar
def _max(a, b):
    return max_total(cn(a), cn(b))


@scalar
def _min(a, b):
    return min_total(cn(a), cn(b))


@scalar
def _sqrt(a):
    return np.sqrt(fl(a))


@scalar
def _neg(a):
    return -a


@scalar
def _abs(a):
    return from_bits(bits(a) & ABS_MASK)


_add_kernel = elementwise(_add, 2, "_add_kernel")
_add_into_a_kernel = elementwise(_add, "2 into a", "_add_into_a_kernel")
_sub_kernel = elementwise(_sub, 2, "_sub_kernel")
_mul_kernel = elementwise(_mul, 2, "_mul_kernel")
_div_kernel = elementwise(_div, 2, "_div_kernel")
_max_kernel = elementwise(_max, 2, "_max_kernel")
_min_kernel = elementwise(_min, 2, "_min_kernel")
_mul_scalar_kernel = elementwise(_mul, "scalar", "_mul_scalar_kernel")
_sqrt_kernel = elementwise(_sqrt, 1, "_sqrt_kernel")
_neg_kernel = elementwise(_neg, 1, "_neg_kernel")
_abs_kernel = elementwise(_abs, 1, "_abs_kernel")


def _flat_operands(a, b):
    """Both operands as flat contiguous float32 arrays of the broadcast size, and that shape."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if a.shape == b.shape:
        return contiguous_f32(a).reshape(-1), contiguous_f32(b).reshape(-1), a.shape
    shape = np.broadcast_shapes(a.shape, b.shape)
    return (np.ascontiguousarray(np.broadcast_to(a, shape)).reshape(-1),
            np.ascontiguousarray(np.broadcast_to(b, shape)).reshape(-1), shape)


def _binary(kern, a, b):
    fa, fb, shape = _flat_operands(a, b)
    out = np.empty(shape, dtype=np.float32)
    kern(fa, fb, out.reshape(-1))
    return out


def _unary(kern, a):
    a = np.asarray(a, dtype=np.float32)
    out = np.empty(a.shape, dtype=np.float32)
    kern(contiguous_f32(a).reshape(-1), out.reshape(-1))
    return out


def add(a, b) -> np.ndarray:
    """``spec.fp.add``: ``a + b`` of the canonically read operands, rounded, flushed, canonical NaN."""
    return _binary(_add_kernel, a, b)


def add_into(a, b, out) -> np.ndarray:
    """``out[:] = add(a, b)`` for 1-D C-contiguous float32 arrays of one length, without a
    fresh result array; ``out`` may be ``a`` or ``b`` (the same elements, through any view),
    and then one kernel writes the sum over it (each element is read before it is written);
    any other overlap is refused. The same bits as ``add``. Not a contract op:
    ``make_backend`` offers it as the capability ``add_into``, with which the trainer sums
    micro-batch vectors in place and the butterfly sums into its result."""
    for x in (a, b, out):
        if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 1 and x.flags.c_contiguous):
            raise TypeError("add_into takes 1-D C-contiguous float32 arrays")
    if not a.size == b.size == out.size:
        raise ValueError(f"add_into: lengths {a.size}, {b.size} and {out.size} differ")
    if not out.flags.writeable:
        raise ValueError("add_into: the output array is read-only")
    at = out.__array_interface__["data"][0]  # the three are contiguous and of one length
    if at == a.__array_interface__["data"][0]:
        _add_into_a_kernel(out, b)  # out is a, element for element
    elif at == b.__array_interface__["data"][0]:
        # b + a is a + b bit for bit: IEEE addition commutes, and the canonical reading of
        # the operands, the flush and the canonical NaN treat both operands alike
        _add_into_a_kernel(out, a)
    elif np.shares_memory(out, a) or np.shares_memory(out, b):
        raise ValueError("add_into: out overlaps an operand without being it element for element")
    else:
        _add_kernel(a, b, out)
    return out


def sub(a, b) -> np.ndarray:
    """``spec.fp.sub``."""
    return _binary(_sub_kernel, a, b)


def mul(a, b) -> np.ndarray:
    """``spec.fp.mul``; a scalar operand is not broadcast into memory."""
    a_arr = np.asarray(a, dtype=np.float32)
    b_arr = np.asarray(b, dtype=np.float32)
    if b_arr.size == 1 and b_arr.ndim <= a_arr.ndim:
        out = np.empty(a_arr.shape, dtype=np.float32)
        _mul_scalar_kernel(contiguous_f32(a_arr).reshape(-1), canon_scalar(b_arr.reshape(-1)[0]), out.reshape(-1))
        return out
    if a_arr.size == 1 and a_arr.ndim <= b_arr.ndim:
        out = np.empty(b_arr.shape, dtype=np.float32)
        # a*b == b*a bit for bit (IEEE multiplication is commutative, NaNs are canonicalized)
        _mul_scalar_kernel(contiguous_f32(b_arr).reshape(-1), canon_scalar(a_arr.reshape(-1)[0]), out.reshape(-1))
        return out
    return _binary(_mul_kernel, a_arr, b_arr)


def div(a, b) -> np.ndarray:
    """``spec.fp.div`` (IEEE division)."""
    return _binary(_div_kernel, a, b)


def maximum(a, b) -> np.ndarray:
    """``spec.fp.maximum``: inputs canonicalized, total order -0.0 < +0.0, NaN -> canonical NaN."""
    return _binary(_max_kernel, a, b)


def minimum(a, b) -> np.ndarray:
    """``spec.fp.minimum``."""
    return _binary(_min_kernel, a, b)


def sqrt(a) -> np.ndarray:
    """``spec.fp.sqrt`` (IEEE square root of the canonically read input, then flush)."""
    return _unary(_sqrt_kernel, a)


def neg(a) -> np.ndarray:
    """``spec.fp.neg``."""
    return _unary(_neg_kernel, a)


def abs(a) -> np.ndarray:  # noqa: A001 - the op is called abs in every backend
    """``spec.fp.abs``."""
    return _unary(_abs_kernel, a)
