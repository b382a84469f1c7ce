"""The conformance record of one op, and its cases: plain data, which ``conformance/ops/`` fills in.

A record's ``cases(seed, level)`` returns named input tuples. Level 1 is boundary values
plus a few thousand seeded random values and small shapes (seconds); level 2 adds larger
random sets and shapes (a minute or two on the spec). Level 3 is not made of records'
cases: it sweeps every float32 pattern through the unary ops (``lockstep.conformance.sweep``).
The conformance search's regressions of the op (calls on which a backend once disagreed, as
Hypothesis shrank them) follow: ``regressions()``, calls the spec answers, are appended to the
cases at every seed and level (by the registry); ``refusals()``, calls the spec refuses, are
run by the runner and ``tests/test_conformance_search.py``, which require every backend to
raise the spec's exception type. ``draw`` is the op's search strategy
(``lockstep.conformance.search``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from lockstep.contract import CONTRACT


@dataclass(frozen=True)
class Case:
    label: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OpRecord:
    name: str  # an op of the contract
    cases: Callable[[int, int], list[Case]]
    tolerance: int = 0  # ulps; always 0 in lockstep: bit-exactness is binary
    doc: str = ""
    # The search: ``draw(draw, op) -> (args, kwargs)`` draws one call (None: the search's fallback
    # draws new values into the shapes of the first case); examples in the suite are divided by
    # ``search_cost`` (the spec's relative time per example).
    draw: Callable | None = None
    search_cost: int = 1
    # Regressions found by the search: calls the spec answers (appended to ``cases``) and calls it refuses.
    regressions: Callable[[], list[Case]] = list
    refusals: Callable[[], list[Case]] = list

    @property
    def arity(self) -> int:
        """Parameters of the op (defaults included), from the contract."""
        return len(CONTRACT[self.name].params)
