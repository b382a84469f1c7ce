"""``spec.rng.truncated_normal`` of a ``PhiloxStream``, drawn in compiled code: the ``truncated_normal`` capability.

Parameter init draws every weight from its own stream (``train.model.init_params``);
the spec's NumPy version runs at a few million values a second, minutes for Open-1B.
Here each task computes its share of Philox blocks (``philox`` module's round, exact
integer arithmetic) and turns each word into the truncated normal with the spec's
order of operations, one rounded-then-flushed float32 operation per line of
``spec.rng.normal_from_centered``'s docstring, with the spec's constants (imported,
not copied) and the spec ``log`` (``transcendental.log1``). Compiled without
``fastmath`` (``tasks``), so no ``a*b + c`` is contracted into an FMA. Value i depends
on (stream key, i, bound) only, so how the tasks split the counters changes no bit;
``tests/test_rng_backend.py`` compares the bits with the spec's.

Tasks run on the ``tasks.TaskKernel`` threads (the caller and its helpers: the backend's stand-in for
``prange``, for the reasons given there).
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.philox import PhiloxStream
from lockstep.spec.rng import (ACKLAM_A, ACKLAM_B, ACKLAM_C, ACKLAM_CENTRAL_MAX, ACKLAM_D, HALF, MINUS_TWO, ONE,
                               truncated_normal_constants)

from .fp import cn, fadd, fdiv, fl, fmul, fsub, max_total, min_total
from .philox import MASK32, SHIFT32, philox_block
from .tasks import BLOCK, inlined, parallel_kernel
from .transcendental import log1

A0, A1, A2, A3, A4, A5 = ACKLAM_A
B0, B1, B2, B3, B4, B5 = ACKLAM_B
C0, C1, C2, C3, C4, C5 = ACKLAM_C
D0, D1, D2, D3 = ACKLAM_D
TWO_POW_MINUS_24 = np.float32(2.0**-24)
ROUNDS = 10  # PhiloxStream's blocks: philox4x32 with DEFAULT_ROUNDS


@inlined
def horner5(x, c0, c1, c2, c3, c4, c5):
    """``((((c0 x + c1) x + c2) x + c3) x + c4) x + c5``, each product and sum rounded and flushed
    (``spec.rng._horner``); inlined, so each polynomial compiles as if written out."""
    r = fadd(fmul(c0, x), c1)
    r = fadd(fmul(r, x), c2)
    r = fadd(fmul(r, x), c3)
    r = fadd(fmul(r, x), c4)
    return fadd(fmul(r, x), c5)


@inlined
def central1(q):
    """The central branch of ``spec.rng.normal_from_centered`` for one float32 q with |q| < 1/2."""
    a = abs(q)
    t = fmul(fsub(HALF, a), fadd(HALF, a))
    num = fmul(horner5(t, A0, A1, A2, A3, A4, A5), q)
    den = horner5(t, B0, B1, B2, B3, B4, B5)
    return fdiv(num, den)


@inlined
def tail1(q):
    """The tail branch of ``spec.rng.normal_from_centered`` for one float32 q with 0.47575 < |q| < 1/2."""
    a = abs(q)
    p = fsub(HALF, a)
    s = fl(np.sqrt(fmul(MINUS_TWO, log1(p))))
    tn = horner5(s, C0, C1, C2, C3, C4, C5)
    td = D0
    td = fadd(fmul(td, s), D1)
    td = fadd(fmul(td, s), D2)
    td = fadd(fmul(td, s), D3)
    td = fadd(fmul(td, s), ONE)
    zt = fdiv(tn, td)
    return -zt if q > 0 else zt


@inlined
def centered1(w, mass):
    """q of ``spec.rng.truncated_normal`` for stream word w: ``(uniform_open(w) - 1/2) * mass``."""
    odd = np.uint32((w >> np.uint32(9)) * np.uint32(2) + np.uint32(1))
    u = np.float32(odd) * TWO_POW_MINUS_24  # exact: an odd integer < 2**24 times a power of two
    return fmul(fsub(u, HALF), mass)


@inlined
def clamp1(z, b32):
    """``min(max(z, -b32), b32)`` in the total order (``spec.fp.maximum``/``minimum``), stored canonically."""
    return cn(min_total(max_total(z, -b32), b32))


@inlined
def from_words(words, tail, lanes, mass, b32, out):
    """``out`` from ``words`` (one length; ``tail`` uint8 and ``lanes`` int64 scratch of at least that length).

    The central branch and clamp for every value, marking the lanes whose |q| > 0.47575
    (branch-free, so it vectorizes), then the tail branch for the marked lanes only
    (about 0.3% with bound 2). Elementwise, so the same as the spec's where-then-overwrite.
    ``|q| < 1/2`` always (``mass <= 1``), so the spec's NaN lane never occurs.
    """
    for i in range(out.size):
        q = centered1(words[i], mass)
        tail[i] = abs(q) > ACKLAM_CENTRAL_MAX
        out[i] = central1(q)
    for i in range(out.size):  # a loop of its own: fused with the one above, LLVM vectorizes neither
        out[i] = clamp1(out[i], b32)
    # the tail lanes' indices first: a loop ``if tail[i]: out[i] = tail(...)`` is vectorized by
    # LLVM as the tail branch on every lane under a mask, 40x the work
    nt = 0
    for i in range(out.size):
        lanes[nt] = i
        nt += tail[i]
    for j in range(nt):
        i = lanes[j]
        out[i] = clamp1(tail1(centered1(words[i], mass)), b32)


def _words_blocks(words, mass, b32, out) -> int:
    return -(-out.size // BLOCK)


@parallel_kernel(_words_blocks, weight=32)
def _from_words_kernel(t0, t1, words, mass, b32, out):
    tail = np.empty(BLOCK, dtype=np.uint8)
    lanes = np.empty(BLOCK, dtype=np.int64)
    for task in range(t0, t1):
        lo = task * BLOCK
        hi = min(out.size, lo + BLOCK)
        from_words(words[lo:hi], tail, lanes, mass, b32, out[lo:hi])


def _word_blocks(key, nonce, mass, b32, out) -> int:
    return -(-out.size // BLOCK)


@parallel_kernel(_word_blocks, weight=64)
def _truncated_normal_kernel(t0, t1, key, nonce, mass, b32, out):
    """out[i] = value i of the stream (key, nonce); task j: values [j*BLOCK, (j+1)*BLOCK) (BLOCK % 4 == 0).

    Per task: the Philox words into a scratch row (exact integers), then ``from_words``.
    """
    n = out.size
    k0_init = np.uint32(key[0])
    k1_init = np.uint32(key[1])
    n0 = np.uint32(nonce[0])
    n1 = np.uint32(nonce[1])
    words = np.empty(BLOCK, dtype=np.uint32)
    tail = np.empty(BLOCK, dtype=np.uint8)
    lanes = np.empty(BLOCK, dtype=np.int64)
    for task in range(t0, t1):
        lo = task * BLOCK
        hi = min(n, lo + BLOCK)
        first = lo // 4
        for blk in range(first, (hi + 3) // 4):
            b = np.uint64(blk)
            c0 = np.uint32(b & MASK32)
            c1 = np.uint32(b >> SHIFT32)
            c2 = n0
            c3 = n1
            c0, c1, c2, c3 = philox_block(c0, c1, c2, c3, k0_init, k1_init, ROUNDS)
            j = 4 * (blk - first)
            words[j] = c0
            words[j + 1] = c1
            words[j + 2] = c2
            words[j + 3] = c3
        from_words(words[: hi - lo], tail, lanes, mass, b32, out[lo:hi])


def truncated_normal_stream(stream: PhiloxStream, count: int, bound: float = 2.0) -> np.ndarray:
    """``spec.rng.truncated_normal(stream, 0, count, bound)``: float32 (count,), the same bits."""
    count = int(count)
    if count < 0:
        raise ValueError(f"stream range must be non-negative, got count={count}")
    mass, b32 = truncated_normal_constants(bound)
    out = np.empty(count, dtype=np.float32)
    if count:
        _truncated_normal_kernel(stream.key.astype(np.uint32), stream.nonce.astype(np.uint32), np.float32(mass),
                                 np.float32(b32), out)
    return out


def truncated_normal_from_words(words, bound: float = 2.0) -> np.ndarray:
    """The truncated normal of given stream words (uint32): what ``truncated_normal_stream`` computes
    from each word. A value depends on ``w >> 9`` only, so the 2**23 words ``k << 9`` give every value
    the sampler can return (tests/test_rng_backend.py checks them all against the spec)."""
    words = np.ascontiguousarray(words, dtype=np.uint32).reshape(-1)
    mass, b32 = truncated_normal_constants(bound)
    out = np.empty(words.size, dtype=np.float32)
    if words.size:
        _from_words_kernel(words, np.float32(mass), np.float32(b32), out)
    return out


def truncated_normal(seed: int, name: str, n: int, bound: float) -> np.ndarray:
    """The ``truncated_normal`` capability: ``spec.rng.truncated_normal(PhiloxStream(seed, "init", name), 0, n, bound)``."""
    return truncated_normal_stream(PhiloxStream(seed, "init", name), n, bound)
