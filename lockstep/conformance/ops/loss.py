"""Conformance of ``spec.loss``: cross_entropy_forward, cross_entropy_backward (with z-loss),
cross_entropy_rows (the forward's per-token losses; the forward's cases, plus boundary logits).

The search adds z-loss 0 and any double, targets out of range or of a float dtype, and an
lse of another length (refused, never broadcast) or not the forward's.
"""

from __future__ import annotations

import numpy as np

from lockstep import spec

from .. import inputs as gen
from ..draws import canonical_host, dim, f32_array, f32_scalar, host_float, mismatched, row_length, st, token_ids
from ..record import Case, OpRecord


def _forward_cases(seed, level):
    out = []
    for (b, t, *_rest, v) in gen.model_dims(level):
        n = b * t
        out.append(Case(f"N{n}V{v}", (gen.random_uniform(seed, ("ce", v), (n, v), -8, 8),
                                      gen.random_ids(seed, ("ce-t", v), (n,), v), 1e-4)))
    return out


def _backward_cases(seed, level):
    out = []
    for (b, t, *_rest, v) in gen.model_dims(level):
        n = b * t
        logits = gen.random_uniform(seed, ("ceb", v), (n, v), -8, 8)
        tg = gen.random_ids(seed, ("ceb-t", v), (n,), v)
        _, lse = spec.cross_entropy_forward(logits, tg, 1e-4)
        out.append(Case(f"N{n}V{v}", (logits, tg, lse, 1e-4, np.float32(1.0 / (3 * n)))))
    return out


# ---------------------------------------------------------------- search

def _draw_forward(draw, op):
    n, v = draw(dim(20)), draw(row_length(1, 130))
    logits = draw(f32_array((n, v)))
    return (logits, draw(token_ids((n,), v)), draw(host_float((1e-4, 0.0)))), {}


def _draw_backward(draw, op):
    n, v = draw(dim(20)), draw(row_length(1, 130))
    logits = draw(f32_array((n, v)))
    targets = draw(token_ids((n,), v))
    z = draw(host_float((1e-4, 0.0)))
    if draw(st.booleans()) and targets.dtype.kind in "iu" and (targets.size == 0 or 0 <= targets.min() and targets.max() < v):
        lse = spec.cross_entropy_forward(canonical_host(logits), targets, z)[1]
    else:
        lse = draw(f32_array((mismatched(draw, n),)))
    return (logits, targets, lse, z, draw(f32_scalar())), {}


# ---------------------------------------------------------------- regressions found by the search

def _backward_refusals():
    # the spec and numba broadcast a size-1 lse; opencl refused (tools/conformance_search deep profile,
    # seed 0): now refused alike
    return [Case("search-lse-broadcast",
                 (gen.f32_zeros(0, 1), np.zeros(0, np.int64), gen.f32_zeros(1), 1e-4, np.float32(0)))]


def _rows_cases(seed, level):
    b = gen.boundary_values()
    logits = np.resize(b, (5, b.size)).astype(np.float32)
    return _forward_cases(seed, level) + [Case("boundary-logits", (logits, np.arange(5) % b.size, 1e-4)),
                                          Case("no-z-loss", (logits[:, :7].copy(), np.zeros(5, np.int64), 0.0))]


RECORDS = (
    OpRecord("cross_entropy_rows", _rows_cases, draw=_draw_forward, search_cost=2),
    OpRecord("cross_entropy_forward", _forward_cases, draw=_draw_forward, search_cost=2),
    OpRecord("cross_entropy_backward", _backward_cases, draw=_draw_backward, search_cost=2,
             refusals=_backward_refusals),
)
