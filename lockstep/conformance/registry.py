"""One conformance record per op of the backend contract: its name, input generator, tolerance (always 0).

A record's ``cases(seed, level)`` returns named input tuples. Level 1 is boundary
values plus a few thousand seeded random values and small shapes (seconds); level 2
adds larger random sets and shapes (a minute or two on the spec).

Other modules add records with ``register`` (the model ops do, in
``lockstep.conformance.model_ops``); ``all_records()`` returns them in registration order.
Every record names an op of the contract (``lockstep.contract``), and
every case's arguments bind to that op's signature with values of the contract's
kinds (``tests/test_contract.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from lockstep.contract import CONTRACT

from . import inputs as gen


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
    record = replace(record, cases=_with_search_regressions(record.name, record.cases))
    _REGISTRY[record.name] = record
    return record


def _with_search_regressions(op: str, cases: Callable[[int, int], list[Case]]) -> Callable[[int, int], list[Case]]:
    """The record's cases plus the conformance search's regressions of this op
    (``inputs.search_regressions``), at every seed and level."""
    def all_cases(seed: int, level: int) -> list[Case]:
        found = [Case(label, args, kwargs) for label, args, kwargs in gen.search_regressions().get(op, [])]
        return cases(seed, level) + found
    return all_cases


def all_records() -> list[OpRecord]:
    _load_extensions()
    return list(_REGISTRY.values())


def get_record(name: str) -> OpRecord:
    _load_extensions()
    return _REGISTRY[name]


def _load_extensions() -> None:
    """Import the modules that register records for ops beyond the arithmetic core."""
    import importlib

    for mod in ("lockstep.conformance.model_ops",):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


# ---------------------------------------------------------------- elementwise ops

def _random_count(level: int) -> int:
    return 4096 if level <= 1 else 262144


def _unary_cases(op: str, lo_exp: int = -40, hi_exp: int = 40) -> Callable[[int, int], list[Case]]:
    def cases(seed: int, level: int) -> list[Case]:
        n = _random_count(level)
        return [
            Case("boundary", (gen.boundary_values(),)),
            Case("random-bits", (gen.random_bits(seed, (op, "bits"), n),)),
            Case("random-normal", (gen.random_normal_range(seed, (op, "normal"), (n,), lo_exp, hi_exp),)),
            Case("random-unit", (gen.random_uniform(seed, (op, "unit"), (n,), -4.0, 4.0),)),
        ]

    return cases


def _binary_cases(op: str) -> Callable[[int, int], list[Case]]:
    def cases(seed: int, level: int) -> list[Case]:
        n = _random_count(level)
        a, b = gen.boundary_pairs()
        ta, tb = gen.rounding_ties()
        out = [
            Case("boundary-pairs", (a, b)),
            Case("rounding-ties", (ta, tb)),
            Case("random-bits", (gen.random_bits(seed, (op, "a"), n), gen.random_bits(seed, (op, "b"), n))),
            Case("random-normal", (gen.random_normal_range(seed, (op, "na"), (n,), -70, 70),
                                   gen.random_normal_range(seed, (op, "nb"), (n,), -70, 70))),
            Case("near-subnormal", (gen.random_normal_range(seed, (op, "sa"), (n,), -126, -100),
                                    gen.random_normal_range(seed, (op, "sb"), (n,), -40, 1))),
            Case("broadcast", (gen.random_uniform(seed, (op, "ba"), (7, 1)), gen.random_uniform(seed, (op, "bb"), (1, 5)))),
        ]
        return out

    return cases


for _op in ("add", "sub", "mul", "div", "maximum", "minimum"):
    register(OpRecord(_op, _binary_cases(_op), doc="elementwise, one rounding, round-then-flush"))
for _op in ("sqrt", "neg", "abs"):
    register(OpRecord(_op, _unary_cases(_op), doc="elementwise, one rounding, round-then-flush"))
register(OpRecord("exp", _unary_cases("exp", -8, 8), doc="spec exp from + - * / and bit manipulation"))
register(OpRecord("log", _unary_cases("log", -126, 127), doc="spec log from + - * / and bit manipulation"))
register(OpRecord("sigmoid", _unary_cases("sigmoid", -8, 8), doc="1 / (1 + exp(-x))"))
register(OpRecord("silu", _unary_cases("silu", -8, 8), doc="x * sigmoid(x)"))


# ---------------------------------------------------------------- reductions

def _row_lengths(level: int) -> list[int]:
    lengths = [0, 1, 2, 31, 32, 33, 63, 64, 65, 100, 1000]
    return lengths + ([4096, 5000] if level >= 2 else [])


def _lane_tree_cases(seed: int, level: int) -> list[Case]:
    out = []
    for n in _row_lengths(level):
        out.append(Case(f"rows-{n}", (gen.random_uniform(seed, ("lts", n), (3, n), -2.0, 2.0),)))
    out.append(Case("axis0", (gen.random_uniform(seed, ("lts", "axis0"), (70, 4)),), {"axis": 0}))
    out.append(Case("wide-range", (gen.random_normal_range(seed, ("lts", "wide"), (5, 257), -30, 30),)))
    out.append(Case("cancellation", (np.array([[1e8, 1.0, -1e8] + [0.5] * 61], dtype=np.float32),)))
    out.append(Case("specials", (gen.boundary_values().reshape(1, -1),)))
    return out


def _matmul_cases(seed: int, level: int) -> list[Case]:
    shapes = [(1, 1, 1), (3, 5, 4), (8, 33, 7), (16, 64, 16)]
    if level >= 2:
        shapes += [(64, 256, 48), (33, 1000, 17)]
    out = [
        Case(f"{m}x{k}x{n}", (gen.random_uniform(seed, ("mm", m, k, n, "a"), (m, k)),
                              gen.random_uniform(seed, ("mm", m, k, n, "b"), (k, n))))
        for m, k, n in shapes
    ]
    out.append(Case("batched", (gen.random_uniform(seed, ("mm", "ba"), (2, 3, 4, 6)),
                                gen.random_uniform(seed, ("mm", "bb"), (3, 6, 5)))))
    out.append(Case("wide-range", (gen.random_normal_range(seed, ("mm", "wa"), (6, 40), -60, 60),
                                   gen.random_normal_range(seed, ("mm", "wb"), (40, 6), -60, 60))))
    out.append(Case("specials", (gen.boundary_matrix(), gen.boundary_matrix().T.copy())))
    return out


def _int8_matmul_cases(seed: int, level: int) -> list[Case]:
    shapes = [(1, 1, 1), (4, 7, 3), (16, 1040, 8), (8, 4096, 4)]
    if level >= 2:
        shapes += [(64, 2048, 64)]
    out = [
        Case(f"{m}x{k}x{n}", (gen.random_int8(seed, ("i8", m, k, n, "a"), (m, k), symmetric=False),
                              gen.random_int8(seed, ("i8", m, k, n, "b"), (k, n), symmetric=False)))
        for m, k, n in shapes
    ]
    extreme = np.full((2, 4096), -128, dtype=np.int8)
    out.append(Case("extremes", (extreme, np.full((4096, 2), -128, dtype=np.int8))))
    return out


def _max_cases(seed: int, level: int) -> list[Case]:
    out = [Case(f"rows-{n}", (gen.random_uniform(seed, ("max", n), (4, n)),)) for n in (1, 2, 33, 300)]
    signed_zeros = np.array([[0.0, -0.0, -0.0], [-0.0, -0.0, -0.0], [-0.0, 0.0, -1.0]], dtype=np.float32)
    out.append(Case("signed-zeros", (signed_zeros,)))
    out.append(Case("specials", (gen.boundary_matrix(),)))
    out.append(Case("axis0", (gen.random_uniform(seed, ("max", "axis0"), (9, 5)),), {"axis": 0}))
    return out


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


register(OpRecord("lane_tree_sum", _lane_tree_cases, doc="lane-tree(32) row sum"))
register(OpRecord("matmul", _matmul_cases, doc="ascending-k float32 contraction"))
register(OpRecord("int8_matmul", _int8_matmul_cases, doc="exact int8 GEMM in int32"))
register(OpRecord("max", _max_cases, doc="total-order max"))
register(OpRecord("argmax", _max_cases, doc="first index of the total-order max"))
register(OpRecord("philox4x32", _philox_cases, doc="Philox4x32-R"))


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
