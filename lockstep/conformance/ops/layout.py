"""Conformance of ``spec.layout``: concat_last (exact data movement).

The search adds empty lists (refused), empty pieces and leading dims that do not match.
"""

from __future__ import annotations

from .. import inputs as gen
from ..draws import dim, f32_array, mismatched, rarely, row_length, st
from ..record import Case, OpRecord


def _concat_cases(seed, level):
    return [Case("three", ([gen.random_uniform(seed, ("cat", i), (2, 3, 4 + i)) for i in range(3)],))]


def _draw_concat(draw, op):
    lead = draw(st.lists(dim(4), max_size=2))
    widths = draw(st.lists(row_length(0, 40), min_size=0 if rarely(draw) else 1, max_size=4))  # empty: refused
    arrays = [draw(f32_array(tuple(lead[:-1]) + (mismatched(draw, lead[-1]), w) if lead else (w,))) for w in widths]
    return ((tuple if draw(st.booleans()) else list)(arrays),), {}


RECORDS = (
    OpRecord("concat_last", _concat_cases, draw=_draw_concat),
)
