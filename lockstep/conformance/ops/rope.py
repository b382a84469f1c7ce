"""Conformance of ``spec.rope``: rope_forward, rope_backward (the same cases for both).

Tables from ``spec.rope.rope_tables`` at theta 500,000; the search adds other thetas,
drawn tables, tables that broadcast over rows, T = 0, an x without a T axis and odd
head dims (refused).
"""

from __future__ import annotations

import numpy as np

from lockstep.spec.rope import rope_tables

from .. import inputs as gen
from ..draws import dim, f32_array, mismatched, rarely, st
from ..record import Case, OpRecord


def _rope_cases(seed, level):
    out = []
    for (b, t, d, h, g, dh, *_rest) in gen.model_dims(level):
        cos, sin = rope_tables(t, dh, 500_000.0)
        out.append(Case(f"T{t}Dh{dh}", (gen.random_uniform(seed, ("rope", t, dh), (b, h, t, dh)), cos, sin)))
    return out


# ---------------------------------------------------------------- search

def _tables(draw, t: int, half: int):
    if draw(st.booleans()):
        return rope_tables(t, 2 * half, draw(st.sampled_from((500_000.0, 10_000.0, 1.0))))
    return draw(f32_array((t, half))), draw(f32_array((t, half)))


def _draw_rope(draw, op):
    t, half = draw(dim(12)), draw(dim(10))
    lead = tuple(draw(st.lists(dim(3), max_size=2)))
    if rarely(draw):  # x without a T axis: refused
        return (draw(f32_array((2 * half,))), *_tables(draw, 1, half)), {}
    cos, sin = _tables(draw, mismatched(draw, t), half)
    width = 2 * half + 1 if rarely(draw) else 2 * half  # an odd head dim: a bad shape
    return (draw(f32_array(lead + (t, width))), cos, sin), {}


# ---------------------------------------------------------------- regressions found by the search

def _t0():
    # numba: rope with T = 0 raised "cannot reshape array of size 0" (props branch)
    return Case("search-T0", (gen.f32_zeros(2, 0, 4), gen.f32_zeros(0, 2), gen.f32_zeros(0, 2)))


def _forward_regressions():
    # opencl refused tables that broadcast to x's rows (the spec and numba accept them); found by
    # the suite's search after the props merge: rope_forward(float32[0, 2], float32[1, 1], float32[1, 1])
    return [_t0(),
            Case("search-T0-row-table", (gen.f32_zeros(0, 2), gen.f32_zeros(1, 1), gen.f32_zeros(1, 1))),
            Case("search-row-table", (np.arange(12, dtype=np.float32).reshape(3, 4) - 5,
                                      np.full((1, 2), 0.5, np.float32), np.full((1, 2), -0.25, np.float32)))]


def _forward_refusals():
    return [
        # spec broadcast x (T = 1) against (2, 0) tables; numba returned (1, 0) (conformance_search --seed 11)
        Case("search-table-rows", (gen.f32_zeros(1, 0), gen.f32_zeros(2, 0), gen.f32_zeros(2, 0))),
        # spec returned an empty result for an odd head dim; numba refused (suite search)
        Case("search-odd-head-dim", (gen.f32_zeros(0, 1), gen.f32_zeros(0, 0), gen.f32_zeros(0, 0))),
    ]


RECORDS = (
    OpRecord("rope_forward", _rope_cases, draw=_draw_rope, regressions=_forward_regressions,
             refusals=_forward_refusals),
    OpRecord("rope_backward", _rope_cases, draw=_draw_rope, regressions=lambda: [_t0()]),
)
