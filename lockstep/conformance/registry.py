"""One conformance record per op of the backend contract: its fixed cases, search strategy and regressions.

A record's ``cases(seed, level)`` returns named input tuples. Level 1 is boundary
values plus a few thousand seeded random values and small shapes (seconds); level 2
adds larger random sets and shapes (a minute or two on the spec). Level 3 is not made of
records' cases: it sweeps every float32 pattern through the unary ops
(``lockstep.conformance.sweep``). The conformance
search's regressions of the op (calls on which a backend once disagreed, as
Hypothesis shrank them) follow: ``regressions()``, calls the spec answers, are
appended to the cases at every seed and level; ``refusals()``, calls the spec
refuses, are run by the runner and ``tests/test_conformance_search.py``, which
require every backend to raise the spec's exception type. ``draw`` is the op's
search strategy (``lockstep.conformance.search``).

The records live in ``lockstep/conformance/ops/``, one module per spec module, named
like it (``ops/norm.py`` holds rmsnorm's, ``spec/norm.py`` defines it); each adds its
records with ``register``. Every record names an op of the contract
(``lockstep.contract``), and every case's arguments bind to that op's signature with
values of the contract's kinds (``tests/test_contract.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

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


_REGISTRY: dict[str, OpRecord] = {}


def register(record: OpRecord) -> OpRecord:
    if record.name not in CONTRACT:
        raise ValueError(f"conformance record {record.name!r} is not an op of the backend contract")
    if record.tolerance != 0:
        raise ValueError(f"conformance record {record.name!r}: tolerance must be 0 (bit-exact)")
    if record.name in _REGISTRY:
        raise ValueError(f"conformance record {record.name!r} registered twice")
    record = replace(record, cases=_with_regressions(record.cases, record.regressions))
    _REGISTRY[record.name] = record
    return record


def _with_regressions(cases: Callable[[int, int], list[Case]],
                      regressions: Callable[[], list[Case]]) -> Callable[[int, int], list[Case]]:
    """The record's cases plus its search regressions, at every seed and level."""
    def all_cases(seed: int, level: int) -> list[Case]:
        return cases(seed, level) + regressions()
    return all_cases


# The order of the records, and so of the golden files' lines (``golden``, format 1): the order
# in which the suite first registered them. A new op's record follows these, in registration order.
RECORD_ORDER = (
    "add", "sub", "mul", "div", "maximum", "minimum", "sqrt", "neg", "abs", "exp", "log", "sigmoid", "silu",
    "lane_tree_sum", "matmul", "int8_matmul", "max", "argmax", "philox4x32",
    "concat_last", "column_sum", "embedding_forward", "embedding_backward", "rmsnorm_forward", "rmsnorm_backward",
    "rope_forward", "rope_backward", "attention_forward", "attention_backward", "swiglu_forward", "swiglu_backward",
    "int8_linear_forward", "int8_linear_backward", "cross_entropy_forward", "cross_entropy_backward",
    "sum_of_squares", "global_norm", "clip_coefficient", "scale", "adamw_update",
    # the golden file's lines follow this order, so an op appended here appends its lines
    "decode_attention",
    "matmul_accumulate", "cross_entropy_rows",
)


def all_records() -> list[OpRecord]:
    """Every record, in ``RECORD_ORDER``."""
    _load_records()
    rank = {name: i for i, name in enumerate(RECORD_ORDER)}
    return sorted(_REGISTRY.values(), key=lambda r: rank.get(r.name, len(rank)))


def get_record(name: str) -> OpRecord:
    _load_records()
    return _REGISTRY[name]


def search_refusal_regressions() -> list[tuple[str, str, tuple, dict]]:
    """``(op, label, args, kwargs)`` for every record's refusal cases, in record order."""
    return [(rec.name, c.label, c.args, c.kwargs) for rec in all_records() for c in rec.refusals()]


def _load_records() -> None:
    """Import ``lockstep.conformance.ops``, whose modules register the records (here, not at the
    top: they import this module)."""
    from . import ops  # noqa: F401


def describe_inputs(args: tuple, index: tuple | int | None) -> str:
    """The inputs of one mismatching element, in hex where they are float32."""
    parts = []
    for i, a in enumerate(args):
        a = np.asarray(a)
        if index is not None and a.ndim and a.size > 1:
            try:
                v = a[index]
            except (IndexError, TypeError):
                v = None
        else:
            v = a if a.size <= 4 else None
        if v is None:
            parts.append(f"arg{i}: {a.dtype}{list(a.shape)}")
        elif np.asarray(v).dtype == np.float32 and np.asarray(v).ndim == 0:
            parts.append(f"arg{i}=0x{int(np.asarray(v).view(np.uint32)):08X} ({float(v)!r})")
        else:
            parts.append(f"arg{i}={np.asarray(v).tolist()!r}"[:120])
    return ", ".join(parts)


def as_outputs(result: Any) -> tuple[np.ndarray, ...]:
    """An op's result as a tuple of arrays (ops may return one array or several; None outputs,
    like the gain gradient of a gain-less RMSNorm, are dropped)."""
    if isinstance(result, (tuple, list)):
        return tuple(np.asarray(r) for r in result if r is not None)
    if isinstance(result, dict):
        return tuple(np.asarray(result[k]) for k in sorted(result))
    return (np.asarray(result),)
