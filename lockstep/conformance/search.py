"""Conformance by search: Hypothesis draws whole calls of every op of the backend contract.

The fixed conformance cases (``registry``) feed boundary tables and seeded random
arrays. The search draws instead: each op's record (``ops/<spec module>.py``) names
a strategy that draws whole calls -- shapes, values, layouts, ``None`` where the
contract allows it, and now and then an input the spec refuses -- from the generic
strategies of ``draws``; ``check_call`` runs one call on the spec and on every
backend, requiring the spec's bytes or the spec's exception type. Hypothesis shrinks
a disagreement to a small call that a kernel author can read.

Besides what ``draws`` describes, the op strategies draw contractions that do not
contract, odd SwiGLU widths and RoPE head dimensions, ``Dh = 0``, int8 ops given
another dtype, Philox rounds outside 1..16, an empty axis of ``max``, an axis out of
range (every backend must raise the spec's exception type), products and quotients
whose exact value lies in the flush-rule window ``[2**-126 - 2**-150, 2**-126)``
(``ops.fp.flush_window_pairs``) and sums with a half-ulp partner. Arrays go to a
backend through its ``asarray`` (views taken on the device array, which the contract
allows) or, now and then, as host NumPy arrays (the contract's rule 2).

An op whose record names no strategy (a new op of the contract) is still searched:
its first conformance case gives the shapes and kinds, and new values are drawn into
them (``fallback_strategy``). ``tests/test_conformance_search.py`` names the ops that
rely on the fallback.

Two Hypothesis profiles (``register_profiles``): ``lockstep-suite``, used by the test
suite (few examples per op, derandomized, no example database: a run is a function
of the commit), and ``deep`` (10,000 examples per op, a seed, and the example database
in a folder CI never keeps), run by ``python3 -m tools.conformance_search``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.database import DirectoryBasedExampleDatabase
except ImportError as e:  # pragma: no cover - hypothesis is in the test extra
    raise ImportError("lockstep.conformance.search needs hypothesis: pip install 'lockstep[test]'") from e

from lockstep import spec
from lockstep.backends import KNOWN_BACKENDS, Backend, BackendUnavailable, get_backend
from lockstep.contract import CONTRACT, OP_NAMES, Kind, move_arguments, result_problem
from lockstep.contract import check_call as contract_shapes
from lockstep.spec.shapes import EnlargingBroadcast
from lockstep.spec import fp

from .draws import (Viewed, describe_value, f32_array, f32_scalar, int8_array, sometimes, token_ids,
                    uint32_array)
from .registry import all_records, get_record

# ---------------------------------------------------------------- profiles

SUITE_PROFILE = "lockstep-suite"
DEEP_PROFILE = "deep"
DEEP_EXAMPLES = 10_000
# Examples per op in the test suite, before dividing by the op's cost (its record's ``search_cost``).
SUITE_EXAMPLES = 40
DEFAULT_DEEP_DATABASE = ".hypothesis/deep"  # relative to the working directory; in .gitignore


def register_profiles(deep_database: str | None = None) -> None:
    """Register the ``lockstep-suite`` and ``deep`` Hypothesis profiles.

    Neither has a deadline or the ``too_slow`` health check: both measure wall-clock
    time, and on a shared machine they would fail a correct test (TEAM rule: no test
    depends on machine speed). The suite keeps no example database and derandomizes,
    so CI runs the same examples for the same commit; the deep profile explores from a
    seed and keeps its database in ``deep_database`` (default ``.hypothesis/deep``,
    ignored by git, absent from a clean clone).
    """
    common = dict(
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
        print_blob=True,
    )
    settings.register_profile(SUITE_PROFILE, max_examples=SUITE_EXAMPLES, derandomize=True, database=None, **common)
    db = DirectoryBasedExampleDatabase(deep_database or DEFAULT_DEEP_DATABASE)
    settings.register_profile(DEEP_PROFILE, max_examples=DEEP_EXAMPLES, derandomize=False, database=db, **common)


def suite_examples(op: str) -> int:
    """Examples of ``op`` in a pytest run: the loaded profile's ``max_examples`` over the op's
    ``search_cost`` (its record): 40 // cost under ``lockstep-suite``; ``pytest
    --hypothesis-profile=deep`` gives 10,000 // cost."""
    return max(8, settings.default.max_examples // get_record(op).search_cost)


# ---------------------------------------------------------------- one call

@dataclass
class Call:
    """One drawn call of an op: positional and keyword arguments (values may be ``Viewed``)."""

    op: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    host_inputs: bool = False  # give the backend host arrays (no asarray)

    def spec_args(self) -> tuple[tuple, dict]:
        """The arguments as the spec gets them: views of fresh host copies."""
        return _map_args(self.args, self.kwargs, lambda v: v.view(v.base.copy()) if isinstance(v, Viewed) else _copy(v))

    def backend_args(self, backend: Backend) -> tuple[tuple, dict]:
        """The arguments as ``backend`` gets them: through its ``asarray`` by the contract's kinds,
        views taken on the device; or, on the host-input path, host arrays and host views."""
        def to_device(v):
            if not isinstance(v, Viewed):
                return _copy(v)
            if self.host_inputs:
                return v.view(v.base.copy())
            device = backend.asarray(v.base.copy())
            try:
                return v.view(device)
            except (TypeError, ValueError, NotImplementedError, IndexError):
                return backend.asarray(np.ascontiguousarray(v.value))  # the array type has no such view
        args, kwargs = _map_args(self.args, self.kwargs, to_device)
        if self.host_inputs:
            return args, kwargs
        return move_arguments(self.op, args, kwargs, backend.asarray)

    def __repr__(self) -> str:
        parts = [describe_value(a) for a in self.args] + [f"{k}={describe_value(v)}" for k, v in self.kwargs.items()]
        path = "host inputs" if self.host_inputs else "asarray"
        return f"{self.op}({', '.join(parts)}) [{path}]"


def _copy(v):
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, (list, tuple)):
        return type(v)(_copy(x) for x in v)
    return v


def _map_args(args, kwargs, fn):
    def one(v):
        if isinstance(v, (list, tuple)):
            return type(v)(one(x) for x in v)
        return fn(v)
    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}

# ---------------------------------------------------------------- per-op strategies

@st.composite
def _calls(draw, op: str, draw_arguments) -> Call:
    args, kwargs = draw_arguments(draw, op)
    return Call(op, tuple(args), dict(kwargs), host_inputs=sometimes(draw))


# op -> a function returning its strategy, for the ops whose record names one.
OP_STRATEGIES = {rec.name: functools.partial(_calls, rec.name, rec.draw) for rec in all_records() if rec.draw}


def strategy_for(op: str) -> st.SearchStrategy[Call]:
    """The search strategy of ``op``: its own, or the fallback built from its conformance record."""
    if op in OP_STRATEGIES:
        return OP_STRATEGIES[op]()
    return fallback_strategy(op)


# ---------------------------------------------------------------- fallback for a new op

@st.composite
def _fallback_calls(draw, op: str) -> Call:
    """New values in the shapes of the op's first conformance case, drawn by the contract's kinds."""
    case = get_record(op).cases(0, 1)[0]
    bound = CONTRACT[op].signature().bind(*case.args, **case.kwargs)
    params = {p.name: p for p in CONTRACT[op].params}
    new = {}
    for name, value in bound.arguments.items():
        new[name] = draw(_like(params[name].kind, value))
    positional = [p.name for p in CONTRACT[op].params][: len(case.args)]
    return Call(op, tuple(new[n] for n in positional), {n: v for n, v in new.items() if n not in positional},
                host_inputs=sometimes(draw))


@st.composite
def _like(draw, kind: Kind, value):
    """A new value of ``kind`` shaped like ``value`` (values the contract cannot redraw are kept)."""
    if isinstance(value, np.ndarray) and value.dtype == np.float32 and value.ndim:
        return draw(f32_array(value.shape))
    if kind in (Kind.F32_SCALAR,) or (kind is Kind.F32_OPERAND and np.ndim(value) == 0):
        return draw(f32_scalar())
    if kind is Kind.F32_SEQUENCE:
        return [draw(_like(Kind.F32, v)) for v in value]
    if kind is Kind.F32_SCALAR_SEQUENCE:
        return [draw(f32_scalar()) for _ in value]
    if kind is Kind.IDS:
        return draw(token_ids(np.shape(value), int(np.max(value, initial=0)) + 1, allow_invalid=False))
    if kind is Kind.INT8:
        return draw(int8_array(np.shape(value)))
    if kind is Kind.UINT32:
        return draw(uint32_array(np.shape(value)))
    if kind is Kind.FLAG:
        return draw(st.booleans())
    if kind is Kind.WINDOW:
        return draw(st.one_of(st.none(), st.integers(0, 40)))
    return value


def fallback_strategy(op: str) -> st.SearchStrategy[Call]:
    return _fallback_calls(op)


# ---------------------------------------------------------------- the check

def installed_backends() -> tuple[list[Backend], dict[str, str]]:
    """Every backend ``get_backend`` can build here (the spec included, through its ``asarray``),
    and the one-line reason for each that it cannot."""
    return _installed_backends()


@functools.lru_cache(maxsize=1)
def _installed_backends():
    ready, missing = [], {}
    for name in KNOWN_BACKENDS:
        try:
            ready.append(get_backend(name))
        except BackendUnavailable as e:
            missing[name] = str(e)
    return ready, missing


# Exceptions the spec may raise for bad input (the contract: ValueError/TypeError;
# NumPy's AxisError is both a ValueError and an IndexError).
SPEC_INPUT_ERRORS = (ValueError, TypeError)


@dataclass
class Outcome:
    """What one call gave: the results on the host, or the exception."""

    result: Any = None
    error: BaseException | None = None


def _run(fn, args, kwargs, to_host) -> Outcome:
    try:
        return Outcome(result=to_host(fn(*args, **kwargs)))
    except Exception as e:  # noqa: BLE001 - any exception is an outcome to compare
        return Outcome(error=e)


def _host_result(to_numpy):
    def convert(r):
        if isinstance(r, tuple):
            return tuple(None if x is None else to_numpy(x) for x in r)
        return None if r is None else to_numpy(r)
    return convert


def _spec_host(r):
    return r  # the spec's results already are host values


def _items(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def compare_results(want, got) -> str | None:
    """Why ``got`` is not byte-identical to ``want`` (None when it is)."""
    w_items, g_items = _items(want), _items(got)
    if len(w_items) != len(g_items):
        return f"{len(w_items)} results expected, got {len(g_items)}"
    for i, (w, g) in enumerate(zip(w_items, g_items)):
        if (w is None) != (g is None):
            return f"result {i}: spec gives {'None' if w is None else 'an array'}, backend {'None' if g is None else 'an array'}"
        if w is None:
            continue
        w, g = np.asarray(w), np.asarray(g)
        if w.dtype != g.dtype or w.shape != g.shape:
            return f"result {i}: spec {w.dtype}{list(w.shape)}, backend {g.dtype}{list(g.shape)}"
        wb, gb = np.ascontiguousarray(w).tobytes(), np.ascontiguousarray(g).tobytes()
        if wb != gb:
            return f"result {i}: {_first_difference(w, g)}"
    return None


def _first_difference(w: np.ndarray, g: np.ndarray) -> str:
    wf, gf = np.ascontiguousarray(w).reshape(-1), np.ascontiguousarray(g).reshape(-1)
    if w.dtype == np.float32:
        wu, gu = wf.view(np.uint32), gf.view(np.uint32)
    else:
        wu, gu = wf, gf
    diff = np.flatnonzero(wu != gu)
    at = int(diff[0])
    idx = tuple(int(i) for i in np.unravel_index(at, w.shape)) if w.ndim else ()
    fmt = (lambda x: f"0x{int(x):08X}") if w.dtype == np.float32 else repr
    return f"{diff.size} of {w.size} elements differ; first at {idx}: spec {fmt(wu[at])}, backend {fmt(gu[at])}"


def _input_snapshot(args, kwargs, to_numpy) -> list[bytes]:
    out = []
    for v in list(args) + list(kwargs.values()):
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if x is None or isinstance(x, (bool, int, float, str)):
                out.append(repr(x).encode())
            else:
                try:
                    out.append(np.ascontiguousarray(to_numpy(x)).tobytes())
                except Exception:  # noqa: BLE001 - not an array
                    out.append(repr(x).encode())
    return out


def check_call(call: Call, backends: list[Backend]) -> list[str]:
    """Run ``call`` on the spec and on every backend; every way they disagree, one line each.

    Checked: the spec's results have the contract's kinds and are canonical, or the spec
    raises ValueError/TypeError; each backend gives the spec's bytes (dtype, shape, bits)
    or raises the spec's exception type; no op changes its arguments.
    """
    return check_call_counted(call, backends)[0]


def check_call_counted(call: Call, backends: list[Backend]) -> tuple[list[str], bool]:
    """``check_call``, and whether the spec refused the call (raised ValueError/TypeError)."""
    problems = []
    s_args, s_kwargs = call.spec_args()
    before = _input_snapshot(s_args, s_kwargs, np.asarray)
    want = _run(getattr(spec, call.op), s_args, s_kwargs, _spec_host)
    if _input_snapshot(s_args, s_kwargs, np.asarray) != before:
        problems.append("spec: changed one of its arguments")
    problems += _spec_problems(call.op, want)
    problems += _contract_problems(call.op, s_args, s_kwargs, want)
    for backend in backends:
        problems += [f"{backend.name}: {p}" for p in _backend_problems(call, backend, want)]
    return problems, isinstance(want.error, SPEC_INPUT_ERRORS)


def _spec_problems(op: str, want: Outcome) -> list[str]:
    if want.error is not None:
        if not isinstance(want.error, SPEC_INPUT_ERRORS):
            return [f"spec: raised {type(want.error).__name__} ({want.error}); bad input must raise ValueError or TypeError"]
        return []
    problems = []
    kind_problem = result_problem(op, want.result)
    if kind_problem:
        problems.append(f"spec: {kind_problem}")
    for i, r in enumerate(_items(want.result)):
        if r is not None and np.asarray(r).dtype == np.float32 and not fp.is_canonical(r):
            problems.append(f"spec: result {i} is not canonical (a subnormal or a NaN other than 0x7FC00000)")
    return problems


def _contract_problems(op: str, args: tuple, kwargs: dict, want: Outcome) -> list[str]:
    """Where the contract's shape rule (``lockstep.contract.check_call``) disagrees with what the spec did: it must
    refuse what the spec refuses (with the spec's exception type) and give the shapes of what it answers;
    it may refuse more only by its broadcast rule (``spec.shapes.EnlargingBroadcast``)."""
    try:
        shapes = contract_shapes(op, args, kwargs)
    except EnlargingBroadcast:
        return []
    except (ValueError, TypeError) as e:
        if want.error is None:
            return [f"contract: refuses a call the spec answers: {type(e).__name__}: {e}"]
        if type(e) is not type(want.error):
            return [f"contract: raises {type(e).__name__} ({e}); the spec raises {type(want.error).__name__} ({want.error})"]
        return []
    if want.error is not None:
        return [f"contract: accepts a call the spec refuses ({type(want.error).__name__}: {want.error})"]
    got = tuple(None if r is None else tuple(np.shape(r)) for r in _items(want.result))
    return [] if got == shapes else [f"contract: gives result shapes {shapes}; the spec's are {got}"]


def _backend_problems(call: Call, backend: Backend, want: Outcome) -> list[str]:
    try:
        args, kwargs = call.backend_args(backend)
    except Exception as e:  # noqa: BLE001 - asarray refusing a valid host array is a finding
        return [f"asarray failed: {type(e).__name__}: {e}"]
    before = _input_snapshot(args, kwargs, backend.to_numpy)
    got = _run(backend.ops[call.op], args, kwargs, _host_result(backend.to_numpy))
    problems = []
    if _input_snapshot(args, kwargs, backend.to_numpy) != before:
        problems.append("changed one of its arguments")
    if want.error is not None or got.error is not None:
        if want.error is None:
            problems.append(f"raised {type(got.error).__name__}: {got.error}; the spec returns a result")
        elif got.error is None:
            problems.append(f"returned a result; the spec raises {type(want.error).__name__}: {want.error}")
        elif type(got.error) is not type(want.error):
            problems.append(f"raised {type(got.error).__name__} ({got.error}); the spec raises {type(want.error).__name__} ({want.error})")
        return problems
    kind_problem = result_problem(call.op, got.result)
    if kind_problem:
        problems.append(kind_problem)
    diff = compare_results(want.result, got.result)
    if diff:
        problems.append(diff)
    return problems


def check_or_raise(call: Call, backends: list[Backend]) -> None:
    """``check_call``, raising AssertionError with every disagreement and the call (for Hypothesis)."""
    problems = check_call(call, backends)
    if problems:
        raise AssertionError(f"{call.op} disagrees:\n  " + "\n  ".join(problems) + f"\n  call: {call!r}")


__all__ = [
    "Call", "Viewed", "OP_STRATEGIES", "OP_NAMES", "check_call", "check_call_counted", "check_or_raise",
    "compare_results", "f32_array", "fallback_strategy", "installed_backends", "register_profiles",
    "strategy_for", "suite_examples",
]
