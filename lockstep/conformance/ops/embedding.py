"""Conformance of ``spec.embedding``: embedding_forward, embedding_backward.

Repeated ids in the backward cases (the scatter-add's order matters); the search
adds ids at 0 and ``vocab - 1`` in every integer dtype, ids out of range or of a float
dtype, and a vocabulary smaller than the ids.
"""

from __future__ import annotations

import numpy as np

from .. import inputs as gen
from ..draws import composite, dim, f32_array, mismatched, rarely, row_length, st, token_ids
from ..record import Case, OpRecord


def _forward_cases(seed, level):
    out = []
    for (b, t, d, *_rest, v) in gen.model_dims(level):
        out.append(Case(f"B{b}T{t}D{d}", (gen.random_uniform(seed, ("emb", d), (v, d)),
                                          gen.random_ids(seed, ("emb-ids", t), (b, t), v))))
    return out


def _backward_cases(seed, level):
    out = []
    for (b, t, d, *_rest, v) in gen.model_dims(level):
        ids = gen.random_ids(seed, ("embb-ids", t), (b, t), v)
        ids[0, :3] = 7  # repeated ids: the scatter-add order matters
        out.append(Case(f"B{b}T{t}D{d}", (gen.random_uniform(seed, ("embb", d), (b, t, d)), ids, v)))
    return out


# ---------------------------------------------------------------- search

@composite
def _bt(draw, max_t: int = 12):
    return draw(dim(3)), draw(dim(max_t))


def _draw_forward(draw, op):
    v, d = draw(st.integers(1, 40)), draw(row_length(0, 40))
    b, t = draw(_bt())
    return (draw(f32_array((v, d))), draw(token_ids((b, t), v))), {}


def _draw_backward(draw, op):
    v, d = draw(st.integers(1, 20)), draw(row_length(0, 40))
    b, t = draw(_bt(20))
    ids = draw(token_ids((b, mismatched(draw, t)), v))  # small vocabularies: ids repeat, the add order matters
    return (draw(f32_array((b, t, d))), ids, max(v - 1, 0) if rarely(draw) else v), {}


# ---------------------------------------------------------------- regressions found by the search

def _backward_regressions():
    return [Case("search-D0", (gen.f32_zeros(1, 1, 0), np.zeros((1, 1), dtype=np.int64), 1))]


def _backward_refusals():
    # spec raised IndexError; numba ValueError (suite search)
    return [Case("search-more-ids-than-rows", (gen.f32_zeros(1, 1, 1), np.zeros((1, 2), np.int64), 1))]


RECORDS = (
    OpRecord("embedding_forward", _forward_cases, draw=_draw_forward),
    OpRecord("embedding_backward", _backward_cases, draw=_draw_backward, search_cost=2,
             regressions=_backward_regressions, refusals=_backward_refusals),
)
