"""Every op's conformance record, in the order of ``spec.OP_TABLE``: its fixed cases, search strategy and regressions.

The records are plain data (``record.OpRecord``, ``record.Case``) in ``lockstep/conformance/ops/``,
one module per spec module and named like it (``ops/norm.py`` holds rmsnorm's, ``spec/norm.py``
defines it), each module's ``RECORDS``. This module reads them: every op of the table has exactly
one record, in the module named by its declaration, and no record names another op. A record's
cases here include its search regressions (``regressions()``, appended at every seed and level).
The order of the records is the order of the golden files' lines (``golden``, format 1).
Every case's arguments bind to the op's contract signature with values of the contract's kinds
(``tests/test_contract.py``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from lockstep import spec

from . import ops
from .record import Case, OpRecord

__all__ = ["Case", "OpRecord", "all_records", "get_record", "records_problems", "search_refusal_regressions",
           "describe_inputs", "as_outputs"]


def records_problems(modules: dict[str, Any] | None = None) -> list[str]:
    """Every way the records' modules differ from ``spec.OP_TABLE`` (an empty list when they agree):
    an op without a record in its module, a record of another op or in another module, a record twice,
    a tolerance other than 0."""
    modules = ops.MODULES if modules is None else modules
    problems = [f"conformance/ops/{m}.py: no such module" for m in spec.OP_MODULES if m not in modules]
    seen: dict[str, str] = {}
    for module, mod in modules.items():
        for rec in getattr(mod, "RECORDS", ()):
            where = f"conformance/ops/{module}.py"
            if rec.name not in spec.OP_MODULE:
                problems.append(f"{where}: record {rec.name!r} is not an op of spec.OP_TABLE")
            elif spec.OP_MODULE[rec.name] != module:
                problems.append(f"{where}: record {rec.name!r} belongs in conformance/ops/{spec.OP_MODULE[rec.name]}.py")
            if rec.name in seen:
                problems.append(f"{where}: record {rec.name!r} given twice")
            seen[rec.name] = module
            if rec.tolerance != 0:
                problems.append(f"{where}: record {rec.name!r}: tolerance must be 0 (bit-exact)")
    problems += [f"{op.name}: no conformance record in conformance/ops/{op.module}.py"
                 for op in spec.OP_TABLE if op.name not in seen]
    return problems


@lru_cache(maxsize=None)
def _records() -> dict[str, OpRecord]:
    problems = records_problems()
    if problems:
        raise ValueError("the conformance records and spec.OP_TABLE disagree: " + "; ".join(problems))
    by_name = {rec.name: rec for mod in ops.MODULES.values() for rec in mod.RECORDS}
    return {op: replace(by_name[op], cases=_with_regressions(by_name[op].cases, by_name[op].regressions))
            for op in spec.OPS}


def _with_regressions(cases: Callable[[int, int], list[Case]],
                      regressions: Callable[[], list[Case]]) -> Callable[[int, int], list[Case]]:
    """The record's cases plus its search regressions, at every seed and level."""
    def all_cases(seed: int, level: int) -> list[Case]:
        return cases(seed, level) + regressions()
    return all_cases


def all_records() -> list[OpRecord]:
    """Every record, in the order of ``spec.OP_TABLE``."""
    return list(_records().values())


def get_record(name: str) -> OpRecord:
    return _records()[name]


def search_refusal_regressions() -> list[tuple[str, str, tuple, dict]]:
    """``(op, label, args, kwargs)`` for every record's refusal cases, in record order."""
    return [(rec.name, c.label, c.args, c.kwargs) for rec in all_records() for c in rec.refusals()]


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
