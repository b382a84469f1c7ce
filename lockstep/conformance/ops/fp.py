"""Conformance of ``spec.fp``: add, sub, mul, div, maximum, minimum, sqrt, neg, abs.

Elementwise, one rounding, round-then-flush. The fixed cases are the boundary table and
every ordered pair of it, rounding ties, seeded random bit patterns and values near the
subnormal range; the search adds sums with a half-ulp partner and products and quotients
in the flush-rule window. ``transcendental`` reuses the unary cases and strategy.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from lockstep.spec.philox import PhiloxStream

from .. import inputs as gen
from ..draws import (LAYOUTS, MANT_MASK, SIGN, STREAM, as_f32, f32_array_bits, operand, result_shape,
                     squeeze_for_broadcast, st, with_layout)
from ..record import Case, OpRecord


def random_count(level: int) -> int:
    """Random values per elementwise case."""
    return 4096 if level <= 1 else 262144


def unary_cases(op: str, lo_exp: int = -40, hi_exp: int = 40) -> Callable[[int, int], list[Case]]:
    """Cases of an elementwise op of one argument; random normals with exponents in [lo_exp, hi_exp)."""
    def cases(seed: int, level: int) -> list[Case]:
        n = random_count(level)
        return [
            Case("boundary", (gen.boundary_values(),)),
            Case("random-bits", (gen.random_bits(seed, (op, "bits"), n),)),
            Case("random-normal", (gen.random_normal_range(seed, (op, "normal"), (n,), lo_exp, hi_exp),)),
            Case("random-unit", (gen.random_uniform(seed, (op, "unit"), (n,), -4.0, 4.0),)),
        ]

    return cases


def _binary_cases(op: str) -> Callable[[int, int], list[Case]]:
    def cases(seed: int, level: int) -> list[Case]:
        n = random_count(level)
        a, b = gen.boundary_pairs()
        ta, tb = gen.rounding_ties()
        out = [
            Case("boundary-pairs", (a, b)),
            Case("rounding-ties", (ta, tb)),
            Case("random-bits", (gen.random_bits(seed, (op, "a"), n), gen.random_bits(seed, (op, "b"), n))),
            Case("random-normal", (gen.random_normal_range(seed, (op, "na"), (n,), -70, 70),
                                   gen.random_normal_range(seed, (op, "nb"), (n,), -70, 70))),
            Case("near-subnormal", (gen.random_normal_range(seed, (op, "sa"), (n,), -126, -100),
                                    gen.random_normal_range(seed, (op, "sb"), (n,), -40, 1))),
            Case("broadcast", (gen.random_uniform(seed, (op, "ba"), (7, 1)), gen.random_uniform(seed, (op, "bb"), (1, 5)))),
        ]
        return out

    return cases


# ---------------------------------------------------------------- search

def draw_unary(draw, op):
    """One argument, an ``F32_OPERAND`` of any result shape."""
    return (operand(draw, draw(result_shape())),), {}


def _tie_partner(a_bits: np.ndarray, draw) -> np.ndarray:
    """b near half an ulp of a (exponent 24 below a's, few mantissa bits): a + b and a - b tie often."""
    shift = draw(st.sampled_from((23, 24, 25)))
    mant = draw(st.sampled_from((0, 1, 0x400000)))
    e = ((a_bits >> 23) & 0xFF).astype(np.int64) - shift
    b = np.where(e >= 1, (a_bits & SIGN) ^ (draw(st.sampled_from((0, SIGN)))) | (np.clip(e, 1, 254) << 23) | mant, 0)
    return (b & 0xFFFFFFFF).astype(np.uint32)


def flush_window_pairs(seed: int, n: int, op: str) -> tuple[np.ndarray, np.ndarray]:
    """n pairs (a, b) whose product (op "mul") or quotient (op "div") lies within a few
    ulps of ``2**-126``, as uint32 bit patterns (random signs).

    Round-then-flush gives ``2**-126`` and flush-before-rounding hardware gives 0
    exactly when the exact result lies in ``[2**-126 - 2**-150, 2**-126)`` (as for the
    flush-rule vectors of ``inputs.BOUNDARY_F32``).
    mul: b in [0.5, 1), a the float32 nearest ``2**-126 / b`` moved by -2..2 ulps
    (about 14% of pairs land in that window). div: a quotient of two float32 lands
    there only as ``(2 - 2**-23) * 2**(E-127) / 2**E`` (a's mantissa all ones, b the
    power of two of a's exponent field E, like ``0x00FFFFFF / 2``); the pairs are
    that and its neighbours (a's mantissa minus 0..2 ulps, b's plus 0..1 ulp).
    """
    u = PhiloxStream(seed, STREAM, "flush-window", op).uint32(0, 3 * n).reshape(3, n)
    u = u.astype(np.int64)
    if op == "mul":
        b = 0x3F000000 + u[0] % 0x00800000
        target = 2.0**-126 / b.astype(np.uint32).view(np.float32).astype(np.float64)
        a = target.astype(np.float32).view(np.uint32).astype(np.int64) + u[1] % 5 - 2
    else:
        e = 1 + u[0] % 127  # a's exponent field; b = 2**e is a normal float32 for e <= 127
        a = (e << 23) | (MANT_MASK - u[1] % 3)
        b = ((e + 127) << 23) | ((u[1] >> 8) % 2)
    a = a | ((u[2] & 1) << 31)
    b = b | ((u[2] & 2) << 30)
    return (a & 0xFFFFFFFF).astype(np.uint32), (b & 0xFFFFFFFF).astype(np.uint32)


def _draw_binary(draw, op):
    out_shape = draw(result_shape())
    mode = draw(st.sampled_from(("independent", "tie-partner", "flush-window")))
    if mode == "independent":
        sa, sb = squeeze_for_broadcast(draw, out_shape), squeeze_for_broadcast(draw, out_shape)
        if draw(st.booleans()):
            sa, sb = sb, sa
        return (operand(draw, sa), operand(draw, sb)), {}
    if mode == "tie-partner":
        a = draw(f32_array_bits(out_shape, "finite"))
        b = _tie_partner(a, draw)
    else:
        n = int(np.prod(out_shape, dtype=np.int64))
        a, b = flush_window_pairs(draw(st.integers(0, 2**32 - 1)), n, "div" if op == "div" else "mul")
        a, b = a.reshape(out_shape), b.reshape(out_shape)
    layout = draw(st.sampled_from(LAYOUTS))
    return (with_layout(as_f32(a), layout), with_layout(as_f32(b), layout)), {}


RECORDS = (
    *(OpRecord(op, _binary_cases(op), doc="elementwise, one rounding, round-then-flush", draw=_draw_binary)
      for op in ("add", "sub", "mul", "div", "maximum", "minimum")),
    *(OpRecord(op, unary_cases(op), doc="elementwise, one rounding, round-then-flush", draw=draw_unary)
      for op in ("sqrt", "neg", "abs")),
)
