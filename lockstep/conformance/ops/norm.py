"""Conformance of ``spec.norm``: rmsnorm_forward, rmsnorm_backward (with and without a gain).

An all-zero row (rstd of eps alone); the search adds gains of another width (refused,
never broadcast), eps 0 and any double, and an rstd that the forward did not make.
"""

from __future__ import annotations

import numpy as np

from lockstep import spec

from .. import inputs as gen
from ..draws import canonical_host, f32_array, host_float, mismatched, row_length, shape_with_last, st
from ..record import Case, OpRecord

EPS = 1e-6


def _forward_cases(seed, level):
    out = []
    for (b, t, d, *_rest) in gen.model_dims(level):
        x = gen.random_uniform(seed, ("rms", d), (b, t, d), -3, 3)
        out.append(Case(f"gain-D{d}", (x, gen.random_uniform(seed, ("rms-g", d), (d,), 0.5, 1.5), EPS)))
        out.append(Case(f"nogain-D{d}", (x, None, EPS)))
    out.append(Case("zero-row", (np.zeros((2, 33), np.float32), np.ones(33, np.float32), EPS)))
    return out


def _backward_cases(seed, level):
    out = []
    for (b, t, d, *_rest) in gen.model_dims(level):
        x = gen.random_uniform(seed, ("rmsb", d), (b, t, d), -3, 3)
        g = gen.random_uniform(seed, ("rmsb-g", d), (d,), 0.5, 1.5)
        _, rstd = spec.rmsnorm_forward(x, g, EPS)
        dy = gen.random_uniform(seed, ("rmsb-dy", d), (b, t, d))
        out.append(Case(f"gain-D{d}", (dy, x, g, rstd)))
        out.append(Case(f"nogain-D{d}", (dy, x, None, spec.rmsnorm_forward(x, None, EPS)[1])))
    return out


# ---------------------------------------------------------------- search

def _gain(draw, d: int):
    return None if draw(st.booleans()) else draw(f32_array((mismatched(draw, d),)))


def _draw_forward(draw, op):
    d = draw(row_length(0, 130))
    x = draw(f32_array(draw(shape_with_last(d, max_elements=2048))))
    return (x, _gain(draw, d), draw(host_float((1e-6, 1e-5, 0.0)))), {}


def _draw_backward(draw, op):
    d = draw(row_length(0, 130))
    shape = draw(shape_with_last(d, max_elements=2048))
    x, dy, gain = draw(f32_array(shape)), draw(f32_array(shape)), _gain(draw, d)
    if draw(st.booleans()):  # rstd as the forward makes it
        rstd = spec.rmsnorm_forward(canonical_host(x), None, 1e-6)[1]
    else:
        rstd = draw(f32_array(shape[:-2] + (mismatched(draw, shape[-2]),) if len(shape) > 1 else ()))
    return (dy, x, gain, rstd), {}


# ---------------------------------------------------------------- regressions found by the search
# The spec and numba broadcast a size-1 operand where the contract means one value per column,
# row or element; opencl refused (tools/conformance_search deep profile, seed 0): now refused alike.

def _forward_refusals():
    return [Case("search-gain-broadcast", (gen.f32_zeros(0), gen.f32_zeros(1), 1e-6)),
            Case("search-gain-broadcast-rows", (gen.f32_zeros(2, 3), np.ones(1, np.float32), 1e-6))]


def _backward_refusals():
    return [Case("search-gain-broadcast", (gen.f32_zeros(0), gen.f32_zeros(0), gen.f32_zeros(1), gen.f32_zeros()))]


RECORDS = (
    OpRecord("rmsnorm_forward", _forward_cases, draw=_draw_forward, refusals=_forward_refusals),
    OpRecord("rmsnorm_backward", _backward_cases, draw=_draw_backward, search_cost=2, refusals=_backward_refusals),
)
