"""Conformance of ``spec.quant``: int8_linear_forward, int8_linear_backward (W8A8, Hadamard-rotated backward).

An outlier that sets the activation scale, ties to even in x/scale, all-zero inputs,
the backward with and without the Hadamard rotation; the search adds widths with every
power-of-two factor up to the Hadamard block and operands that do not contract (refused).
"""

from __future__ import annotations

import numpy as np

from .. import inputs as gen
from ..draws import f32_array, mismatched, shape_with_last, st
from ..record import Case, OpRecord


def _forward_cases(seed, level):
    out = []
    for (b, t, d, _h, _g, _dh, f, _v) in gen.model_dims(level):
        x = gen.random_uniform(seed, ("i8f-x", d), (b, t, d), -3, 3)
        x[0, 0, 0] = 25.0  # an outlier sets the activation scale
        out.append(Case(f"D{d}F{f}", (x, gen.random_uniform(seed, ("i8f-w", d), (d, 2 * f), -0.1, 0.1))))
    ties = np.array([[0.5, 1.5, -2.5, 127.0]], dtype=np.float32)  # x/scale lands on .5: ties to even
    out.append(Case("ties", (ties, np.eye(4, dtype=np.float32))))
    out.append(Case("zeros", (np.zeros((3, 4), np.float32), np.zeros((4, 2), np.float32))))
    return out


def _backward_cases(seed, level):
    out = []
    for (b, t, d, _h, _g, _dh, f, _v) in gen.model_dims(level):
        x = gen.random_uniform(seed, ("i8b-x", d), (b, t, d), -3, 3)
        w = gen.random_uniform(seed, ("i8b-w", d), (d, f), -0.1, 0.1)
        dy = gen.random_uniform(seed, ("i8b-dy", d), (b, t, f), -0.01, 0.01)
        out.append(Case(f"hadamard-D{d}F{f}", (dy, x, w, True)))
        out.append(Case(f"plain-D{d}F{f}", (dy, x, w, False)))
    return out


# ---------------------------------------------------------------- search

# Widths with every power-of-two factor up to the Hadamard block limit (256).
HADAMARD_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)


def _draw_forward(draw, op):
    k, n = draw(st.sampled_from(HADAMARD_WIDTHS[:12])), draw(st.integers(1, 12))
    x = draw(f32_array(draw(shape_with_last(k, max_elements=1024, min_lead=1))))
    return (x, draw(f32_array((mismatched(draw, k), n)))), {}


def _draw_backward(draw, op):
    k, n = draw(st.sampled_from(HADAMARD_WIDTHS)), draw(st.sampled_from(HADAMARD_WIDTHS[:10]))
    m = draw(st.sampled_from(HADAMARD_WIDTHS[:11]))
    lead = (m,) if draw(st.booleans()) or m % 2 else (2, m // 2)
    profile = draw(st.sampled_from(("finite", "finite", "wild", "tiny")))
    dy, x = draw(f32_array(lead + (mismatched(draw, n),), profile)), draw(f32_array(lead + (k,), profile))
    w = draw(f32_array((mismatched(draw, k), n), profile))
    flag = draw(st.booleans())
    return ((dy, x, w, flag), {}) if draw(st.booleans()) else ((dy, x, w), {} if flag else {"hadamard": False})


# ---------------------------------------------------------------- regressions found by the search

def _backward_refusals():
    # numba answered with dy (1, 2) for w (1, 1); the spec refused (conformance_search --seed 11)
    return [Case("search-dy-width", (gen.f32_zeros(1, 2), gen.f32_zeros(1, 1), gen.f32_zeros(1, 1), False))]


RECORDS = (
    OpRecord("int8_linear_forward", _forward_cases, draw=_draw_forward, search_cost=2),
    OpRecord("int8_linear_backward", _backward_cases, draw=_draw_backward, search_cost=4,
             refusals=_backward_refusals),
)
