"""Conformance of ``spec.swiglu``: swiglu_forward, swiglu_backward (gate and up fused in one tensor).

The search adds F = 0, odd fused widths and a dh of another width (refused).
"""

from __future__ import annotations

from .. import inputs as gen
from ..draws import f32_array, mismatched, row_length, shape_with_last
from ..record import Case, OpRecord


def _forward_cases(seed, level):
    return [Case(f"F{f}", (gen.random_uniform(seed, ("swi", f), (b, t, 2 * f), -6, 6),))
            for (b, t, _d, _h, _g, _dh, f, _v) in gen.model_dims(level)]


def _backward_cases(seed, level):
    return [Case(f"F{f}", (gen.random_uniform(seed, ("swib-dh", f), (b, t, f)),
                           gen.random_uniform(seed, ("swib", f), (b, t, 2 * f), -6, 6)))
            for (b, t, _d, _h, _g, _dh, f, _v) in gen.model_dims(level)]


# ---------------------------------------------------------------- search

def _draw_forward(draw, op):
    f = draw(row_length(0, 70))
    width = mismatched(draw, 2 * f)  # an odd fused width: refused
    return (draw(f32_array(draw(shape_with_last(width, max_elements=2048)))),), {}


def _draw_backward(draw, op):
    f = draw(row_length(0, 70))
    shape = draw(shape_with_last(mismatched(draw, 2 * f), max_elements=2048))
    return (draw(f32_array(shape[:-1] + (mismatched(draw, f),))), draw(f32_array(shape))), {}


# ---------------------------------------------------------------- regressions found by the search
# numba: swiglu with F = 0 raised "cannot reshape array of size 0" (suite search, fixed in the props branch);
# opencl answered an odd width, which the spec now refuses (conformance_search --seed 21 --examples 300)

def _forward_regressions():
    return [Case("search-F0", (gen.f32_zeros(0),)), Case("search-F0-rows", (gen.f32_zeros(3, 0),))]


def _backward_regressions():
    return [Case("search-F0", (gen.f32_zeros(0), gen.f32_zeros(0)))]


def _forward_refusals():
    return [Case("search-odd-width", (gen.f32_zeros(1),))]


def _backward_refusals():
    return [
        # spec returned a (4,) result for F = 1 with a (2,) dh; numba raised (suite search)
        Case("search-dh-too-wide", (gen.f32_zeros(2), gen.f32_zeros(2))),
        Case("search-odd-width", (gen.f32_zeros(0), gen.f32_zeros(1))),
    ]


RECORDS = (
    OpRecord("swiglu_forward", _forward_cases, draw=_draw_forward, regressions=_forward_regressions,
             refusals=_forward_refusals),
    OpRecord("swiglu_backward", _backward_cases, draw=_draw_backward, regressions=_backward_regressions,
             refusals=_backward_refusals),
)
