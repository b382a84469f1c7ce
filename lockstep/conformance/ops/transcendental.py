"""Conformance of ``spec.transcendental``: exp, log, sigmoid, silu.

The elementwise cases and strategy of ``ops.fp``, with random normals in each op's
useful range (exp and the sigmoids over/underflow beyond +-88).
"""

from __future__ import annotations

from ..record import OpRecord
from .fp import draw_unary, unary_cases


RECORDS = (
    OpRecord("exp", unary_cases("exp", -8, 8), doc="spec exp from + - * / and bit manipulation", draw=draw_unary),
    OpRecord("log", unary_cases("log", -126, 127), doc="spec log from + - * / and bit manipulation", draw=draw_unary),
    OpRecord("sigmoid", unary_cases("sigmoid", -8, 8), doc="1 / (1 + exp(-x))", draw=draw_unary),
    OpRecord("silu", unary_cases("silu", -8, 8), doc="x * sigmoid(x)", draw=draw_unary),
)
