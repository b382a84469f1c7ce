"""Conformance of ``spec.philox``: philox4x32.

Random counters and keys, the all-zero and all-ones edges, and another round count;
the search adds broadcasting leading dims, wrong last dims and rounds outside 1..16.
"""

from __future__ import annotations

import numpy as np

from .. import inputs as gen
from ..draws import dim, rarely, squeeze_for_broadcast, st, uint32_array
from ..record import Case, OpRecord


def _philox_cases(seed: int, level: int) -> list[Case]:
    n = 1024 if level <= 1 else 65536
    ctr = gen.random_uint32(seed, ("philox", "ctr"), (n, 4))
    key = gen.random_uint32(seed, ("philox", "key"), (n, 2))
    edge_ctr = np.array([[0, 0, 0, 0], [0xFFFFFFFF] * 4], dtype=np.uint32)
    edge_key = np.array([[0, 0], [0xFFFFFFFF] * 2], dtype=np.uint32)
    return [
        Case("random", (ctr, key)),
        Case("edges", (edge_ctr, edge_key)),
        Case("rounds-7", (ctr[:64], key[:64]), {"rounds": 7}),
    ]


def _draw_philox(draw, op):
    lead = draw(st.lists(dim(4), max_size=2))
    ctr_last, key_last = (4, 2) if not rarely(draw) else draw(st.sampled_from(((3, 2), (4, 3), (4, 1))))
    ctr = draw(uint32_array(tuple(squeeze_for_broadcast(draw, tuple(lead))) + (ctr_last,)))
    key = draw(uint32_array(tuple(squeeze_for_broadcast(draw, tuple(lead))) + (key_last,)))
    rounds = draw(st.sampled_from((0, 17, -1))) if rarely(draw) else draw(st.one_of(st.just(10), st.integers(1, 16)))
    return (ctr, key), ({} if rounds == 10 and draw(st.booleans()) else {"rounds": rounds})


RECORDS = (
    OpRecord("philox4x32", _philox_cases, doc="Philox4x32-R", draw=_draw_philox),
)
