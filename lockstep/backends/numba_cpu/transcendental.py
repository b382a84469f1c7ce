"""``exp``, ``log``, ``sigmoid``, ``silu``: ``lockstep.spec.transcendental`` op for op.

Each scalar function below is the "Order of operations" block of the spec's
docstring, one line per rounded float32 operation (``fadd``/``fsub``/``fmul``/``fdiv``
round then flush), in the same order, with the same constants (imported from the
spec). The array ops are ``fp.elementwise`` kernels around them.

The hot paths call ``exp_entered_fast``: the same roundings without the flush tests
that never change a result, which ``check_exp_fast`` verifies on all 2**32 inputs.
"""

from __future__ import annotations

import numpy as np

# The spec's constants themselves: the spec is the definition, so a change there is a
# change here (and the kernel cache folder is keyed by the spec's sources too).
from lockstep.spec.fp import EXPONENT_MASK, MANTISSA_MASK, SIGN_BIT, SMALLEST_NORMAL
from lockstep.spec.transcendental import (EXP_ARG_MAX, EXP_ARG_MIN, EXP_C3, EXP_C4, EXP_C5, EXP_C6, EXP_C7, EXP_C8,
                                          HALF, HALF_EXPONENT_FIELD, HIGH_12_BITS_MASK, INV_LN2, LN2_HI, LN2_LO,
                                          LOG_L3, LOG_L5, LOG_L7, LOG_L9, LOG_L11, LOG_SQRT2_MANTISSA, NEG_INF,
                                          NEG_ZERO, ONE, ONE_EXPONENT_FIELD, POS_INF, ROUND_MAGIC, TWO)

from .fp import ABS_MASK, CANONICAL_NAN_BITS, bits, contiguous_f32, elementwise, fadd, fdiv, fl, fmul, from_bits, fsub
from .tasks import inlined, kernel, parallel_kernel, scalar

POS_INF_BITS = POS_INF.view(np.uint32)
NEG_INF_BITS = NEG_INF.view(np.uint32)
SMALLEST_NORMAL_BITS = SMALLEST_NORMAL.view(np.uint32)


@scalar
def pow2(k):
    """2**k for an integer -126 <= k <= 127 (exact bits)."""
    return from_bits(np.uint32((k + 127) << 23))


@inlined
def ldexp_exact(y, k):
    """``spec.fp.ldexp_exact`` for one value: three rounded, flushed products by powers of two."""
    k = min(max(k, -300), 300)
    k1 = min(max(k, -126), 127)
    k2 = min(max(k - k1, -126), 127)
    k3 = k - k1 - k2
    r = fmul(y, pow2(k1))
    r = fmul(r, pow2(k2))
    return fmul(r, pow2(k3))


@inlined
def exp_argument(x):
    """The argument exp reduces: 0 for a NaN (whose result ``exp_result`` replaces), then
    ``fp.minimum(fp.maximum(x, -104), 89)``: the bounds are nonzero, so the total order is
    the ordinary one here."""
    xc = np.float32(0.0) if x != x else x
    if xc < EXP_ARG_MIN:
        xc = EXP_ARG_MIN
    if xc > EXP_ARG_MAX:
        xc = EXP_ARG_MAX
    return xc


@inlined
def exp_result(y, kf, x):
    """``y * 2**kf`` (``ldexp_exact``), or the canonical NaN where exp's argument x is NaN."""
    result = ldexp_exact(y, np.int32(kf))
    if x != x:
        return from_bits(CANONICAL_NAN_BITS)
    return result


@inlined
def exp_entered(x):
    """spec ``exp`` of one value already entered (flushed); NaN in -> canonical NaN out."""
    xc = exp_argument(x)
    kf = fsub(fadd(fmul(xc, INV_LN2), ROUND_MAGIC), ROUND_MAGIC)
    hi = fsub(xc, fmul(kf, LN2_HI))
    lo = fmul(kf, LN2_LO)
    r = fsub(hi, lo)
    r_err = fsub(fsub(hi, r), lo)
    p = EXP_C8
    p = fadd(EXP_C7, fmul(r, p))
    p = fadd(EXP_C6, fmul(r, p))
    p = fadd(EXP_C5, fmul(r, p))
    p = fadd(EXP_C4, fmul(r, p))
    p = fadd(EXP_C3, fmul(r, p))
    c3 = fmul(fmul(fmul(r, r), r), p)
    r_hi = from_bits(bits(r) & HIGH_12_BITS_MASK)
    r_lo = fsub(r, r_hi)
    h2_hi = fmul(HALF, fmul(r_hi, r_hi))
    h2_lo = fadd(fmul(r_hi, r_lo), fmul(HALF, fmul(r_lo, r_lo)))
    y1 = fadd(ONE, r)
    e1 = fadd(fsub(ONE, y1), r)
    y2 = fadd(y1, h2_hi)
    e2 = fadd(fsub(y1, y2), h2_hi)
    tail = fadd(fadd(e1, e2), fadd(fadd(h2_lo, c3), fmul(r_err, y1)))
    y = fadd(y2, tail)
    return exp_result(y, kf, x)


POW2_MAGIC = np.float32(2.0**23 + 127)  # k + POW2_MAGIC holds k + 127 in its low mantissa bits (|k| < 2**22)


@inlined
def pow2_float(kf):
    """2**k for a float32 holding an integer -126 <= k <= 127 (exact bits): ``pow2`` without leaving
    float32 lanes (k + 2**23 + 127 is exact, and its mantissa's low bits are k + 127)."""
    return from_bits((bits(kf + POW2_MAGIC) & MANTISSA_MASK) << np.uint32(23))


@inlined
def exp_result_fast(y, kf, x):
    """``exp_result`` for exp's own k: ``kf`` = rint(xc / ln 2) with xc in [-104, 89], so -151 < k < 129.
    ``ldexp_exact``'s clamps to +-300 never bind, its second factor 2**(k - k1) has -25 < k - k1 < 2
    (no clamp), and its third is 2**0: a product by 1 of a flushed value, which changes nothing. So
    two rounded, flushed products, the same bits (``check_exp_fast`` compares every input)."""
    k1 = min(max(kf, np.float32(-126.0)), np.float32(127.0))
    result = fmul(fmul(y, pow2_float(k1)), pow2_float(kf - k1))
    if x != x:
        return from_bits(CANONICAL_NAN_BITS)
    return result


@inlined
def exp_entered_fast(x):
    """``exp_entered`` with the flush tests only where a result can be subnormal *and* matter.

    Every rounding is the same as in ``exp_entered``; only flush tests are left out:
    those of the reduction, the polynomial and the compensated sums. This is proved
    for every input, not argued: ``check_exp_fast`` runs both functions on all 2**32
    float32 patterns and finds no difference (run it again after any change to the
    spec's exp; it takes a few minutes on two cores). The tiny intermediates it skips
    flushing (for |r| below about 2**-40) only ever add to 1 + r in the last sums,
    where they are far below half an ulp. The scaling by 2**k keeps its flushes:
    those produce the subnormal results of exp(x) for x < -87.3.
    """
    xc = exp_argument(x)
    kf = ((xc * INV_LN2) + ROUND_MAGIC) - ROUND_MAGIC
    hi = xc - kf * LN2_HI
    lo = kf * LN2_LO
    r = hi - lo
    r_err = (hi - r) - lo
    p = EXP_C8
    p = EXP_C7 + r * p
    p = EXP_C6 + r * p
    p = EXP_C5 + r * p
    p = EXP_C4 + r * p
    p = EXP_C3 + r * p
    c3 = ((r * r) * r) * p
    r_hi = from_bits(bits(r) & HIGH_12_BITS_MASK)
    r_lo = r - r_hi
    h2_hi = HALF * (r_hi * r_hi)
    h2_lo = (r_hi * r_lo) + HALF * (r_lo * r_lo)
    y1 = ONE + r
    e1 = (ONE - y1) + r
    y2 = y1 + h2_hi
    e2 = (y1 - y2) + h2_hi
    tail = (e1 + e2) + ((h2_lo + c3) + r_err * y1)
    y = y2 + tail
    return exp_result_fast(y, kf, x)


def _chunks(first, count, stride, chunks, mismatches) -> int:
    return chunks


@parallel_kernel(_chunks, weight=64)
def _check_exp_fast_kernel(t0, t1, first, count, stride, chunks, mismatches):
    for c in range(t0, t1):
        bad = 0
        lo = c * count // chunks
        hi = (c + 1) * count // chunks
        for i in range(lo, hi):
            x = fl(from_bits(np.uint32((first + i * stride) & 0xFFFFFFFF)))
            bad += bits(exp_entered_fast(x)) != bits(exp_entered(x))
        mismatches[c] = bad


def check_exp_fast(stride: int = 1, first: int = 0, count: int | None = None) -> int:
    """How many of the patterns ``first, first + stride, ...`` (all 2**32 by default) give
    different bits in ``exp_entered_fast`` and ``exp_entered`` (0 is the claim).

    ``python -c "from lockstep.backends.numba_cpu.transcendental import check_exp_fast; print(check_exp_fast())"``
    """
    if count is None:
        count = ((1 << 32) - first + stride - 1) // stride
    chunks = 1024
    mismatches = np.zeros(chunks, dtype=np.int64)
    _check_exp_fast_kernel(np.int64(first), np.int64(count), np.int64(stride), chunks, mismatches)
    return int(mismatches.sum())


@inlined
def exp1(x):
    """spec ``exp`` of one raw float32 (entered here: flushed)."""
    return exp_entered_fast(fl(x))


@inlined
def log1(x):
    """spec ``log`` of one raw float32 (the docstring's order, line by line)."""
    x = fl(x)
    u = bits(x)
    positive_normal = u >= SMALLEST_NORMAL_BITS and u < POS_INF_BITS
    xc = x if positive_normal else ONE
    uc = bits(xc)
    e = np.int32(uc >> 23) - 127
    mb = uc & MANTISSA_MASK
    if mb >= LOG_SQRT2_MANTISSA:
        m = from_bits(mb | HALF_EXPONENT_FIELD)
        e = e + 1
    else:
        m = from_bits(mb | ONE_EXPONENT_FIELD)
    ef = np.float32(e)
    f = fsub(m, ONE)
    s = fdiv(f, fadd(TWO, f))
    z = fmul(s, s)
    R = LOG_L11
    R = fadd(LOG_L9, fmul(z, R))
    R = fadd(LOG_L7, fmul(z, R))
    R = fadd(LOG_L5, fmul(z, R))
    R = fadd(LOG_L3, fmul(z, R))
    R = fmul(z, R)
    f_hi = from_bits(bits(f) & HIGH_12_BITS_MASK)
    f_lo = fsub(f, f_hi)
    hf_hi = fmul(HALF, fmul(f_hi, f_hi))
    hf_lo = fadd(fmul(f_hi, f_lo), fmul(HALF, fmul(f_lo, f_lo)))
    t = fmul(s, fadd(fadd(hf_hi, hf_lo), R))
    A = fmul(ef, LN2_HI)
    S1 = fadd(A, f)
    E1 = fadd(fsub(A, S1), f)
    S2 = fsub(S1, hf_hi)
    E2 = fsub(fsub(S1, S2), hf_hi)
    tail = fadd(fadd(fsub(t, hf_lo), fmul(ef, LN2_LO)), fadd(E1, E2))
    y = fadd(S2, tail)
    is_zero = (u & ABS_MASK) == 0
    nan_in = (u & EXPONENT_MASK) == EXPONENT_MASK and (u & MANTISSA_MASK) != 0
    if u == POS_INF_BITS:
        y = POS_INF
    if is_zero:
        y = NEG_INF
    if nan_in or ((u & SIGN_BIT) != 0 and not is_zero):
        y = from_bits(CANONICAL_NAN_BITS)
    return y


@inlined
def sigmoid1(x):
    """spec ``sigmoid``: ``1 / (1 + exp(-x))``, each step rounded and flushed."""
    x = fl(x)
    return fdiv(ONE, fadd(ONE, exp_entered_fast(fl(-x))))


@inlined
def silu_from_sigmoid(x, s):
    """spec ``silu`` of an entered x whose spec sigmoid is s: ``x * s``; -inf -> -0.0."""
    if bits(x) == NEG_INF_BITS:
        return NEG_ZERO
    return fmul(x, s)


@inlined
def silu1(x):
    x = fl(x)
    return silu_from_sigmoid(x, sigmoid1(x))


# ---------------------------------------------------------------- row helpers
# Every kernel that needs exp/sigmoid calls one of these on a contiguous run: the
# big scalar functions are inlined (and vectorized) here once, not in every caller,
# which keeps compile times down.

@kernel
def exp_diff_row(src, shift, dst):
    """``dst[j] = exp(f32(src[j]) - shift)``: one rounded subtraction, then the spec's exp."""
    for j in range(dst.size):
        dst[j] = exp_entered_fast(fl(fl(src[j]) - shift))


@kernel
def sigmoid_row(src, dst):
    """``dst[j] = sigmoid(src[j])`` (the spec's, entry flush included)."""
    for j in range(dst.size):
        dst[j] = sigmoid1(src[j])


@kernel
def log_value(x):
    """The spec's ``log`` of one value (not inlined: callers use it once per row)."""
    return log1(x)


_exp_kernel = elementwise(exp1, "1, then cn", "_exp_kernel", weight=8)
_log_kernel = elementwise(log1, "1, then cn", "_log_kernel", weight=8)
_sigmoid_kernel = elementwise(sigmoid1, "1, then cn", "_sigmoid_kernel", weight=8)
_silu_kernel = elementwise(silu1, "1, then cn", "_silu_kernel", weight=8)


def _apply(kern, x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float32)
    out = np.empty(a.shape, dtype=np.float32)
    kern(contiguous_f32(a).reshape(-1), out.reshape(-1))
    return out


def exp(x) -> np.ndarray:
    """``spec.transcendental.exp``."""
    return _apply(_exp_kernel, x)


def log(x) -> np.ndarray:
    """``spec.transcendental.log``."""
    return _apply(_log_kernel, x)


def sigmoid(x) -> np.ndarray:
    """``spec.transcendental.sigmoid``."""
    return _apply(_sigmoid_kernel, x)


def silu(x) -> np.ndarray:
    """``spec.transcendental.silu``."""
    return _apply(_silu_kernel, x)
