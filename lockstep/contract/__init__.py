"""The backend contract: the ops every lockstep backend implements, typed.

A backend is a table of the spec's ops (``lockstep.spec.OP_TABLE``) plus two array movers,
``asarray`` and ``to_numpy``. Each op is declared once, by its spec function: its parameters
(names, order, defaults) are the ones every backend uses, each annotated with its *kind*
(``lockstep.spec.kinds``: what an argument may be, what a result is), and its mark
``@op(rule)`` names its shape rule (``lockstep.spec.shapes``). ``CONTRACT`` reads those
declarations into a table, in the order of ``spec.OP_TABLE``. The conformance runner checks
every backend's signatures and output kinds against it, and ``check_call`` applies the kinds
and the shape rule to a call's host arguments before any backend runs.

A host array given as an ``F32`` argument is read exactly as if it had been passed through the
backend's ``asarray`` first (the trainer hands ops host arrays: AdamW's parameters and moments,
accumulated gradients); host values are read as float32 under the rule below.

What a backend may assume about its inputs (and what it must do)
-----------------------------------------------------------------

The spec reads every float32 *input* of every op under one rule (``spec.fp``): a subnormal
input is a zero of its sign (DAZ, as Apple GPUs read them) and every NaN input is the
canonical NaN. Backends implement the rule once,
in ``asarray``:

1. ``asarray(host)`` returns a device array whose float32 values are canonical
   (subnormals flushed to signed zeros, NaNs made ``0x7FC00000``; other dtypes --
   int8, int32, int64, uint32 -- are moved exactly). Every op output is canonical
   too. So **an op may assume that its device-array arguments are canonical** and
   needs no input flush in its kernels.
2. Host NumPy arrays and host scalars given to an op are not known to be canonical:
   the op reads them through ``asarray`` (arrays) or the same rule (scalars).
3. Files from outside (checkpoints, inputs) are *read under the rule* on every
   backend, not refused: their tensors reach the ops through ``asarray`` or as host
   arrays (point 2), so a subnormal in a checkpoint is a zero of its sign on every
   backend, and the replayed step's bits do not depend on the backend. (The
   checkpoint's own digest covers its raw bytes, as written.)

Other rules every backend keeps: ops never modify their arguments; ``to_numpy``
returns a host NumPy array that the caller owns (same dtype, shape and bits); the
spec raises ``ValueError``/``TypeError`` for bad shapes, dtypes and ids, and so do
backends (the message may differ).

When a backend cannot run
-------------------------

``make_backend()`` (or importing the backend's module) raises ``BackendUnavailable``
with **one line** that says what is missing and what to do, for example::

    no OpenCL device: install lockstep[opencl] (PoCL runs on any CPU) or set LOCKSTEP_OPENCL_DEVICE
    backend 'cuda' needs the Python package 'cupy': pip install 'lockstep[cuda]'

The command line prints it as ``lockstep <command>: <message>`` and exits 1.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any

import numpy as np

from lockstep import spec
from lockstep.errors import LockstepError
from lockstep.spec.kinds import Kind, op_mark
from lockstep.spec.shapes import Shape, elements

__all__ = ["BackendUnavailable", "Kind", "Param", "OpContract", "CONTRACT", "OP_NAMES", "op_contract", "signature_problem",
           "check_ops", "value_problem", "result_problem", "check_call", "call_size", "move_arguments"]


class BackendUnavailable(LockstepError, RuntimeError):
    """The backend cannot run here (its package, its compiler or its hardware is missing).

    The message is one line: what is missing, then what to do (see the module
    docstring). A multi-line message is a programming error.
    """

    def __init__(self, message: str):
        if "\n" in message or not message.strip():
            raise ValueError(f"BackendUnavailable needs a one-line message, got {message!r}")
        super().__init__(message)


@dataclass(frozen=True)
class Param:
    """One parameter of an op: its name, kind and default (``inspect.Parameter.empty`` if none)."""

    name: str
    kind: Kind
    default: Any = inspect.Parameter.empty


@dataclass(frozen=True)
class OpContract:
    """One op of the contract: parameters in order, the kinds it returns, the summary line of its spec
    docstring, and its shape rule (``spec.shapes``: the result shapes from the arguments; ``pairs``:
    attention's scored pairs)."""

    name: str
    params: tuple[Param, ...]
    returns: tuple[Kind, ...]  # one entry for a single result, several for a tuple
    returns_tuple: bool
    summary: str
    shapes: Any = None
    pairs: Any = None

    def signature(self) -> inspect.Signature:
        """The signature every implementation has (names, order, defaults; no ``self``)."""
        return inspect.Signature([
            inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default) for p in self.params
        ])


def _kind_of(op: str, what: str, hint) -> Kind:
    for meta in getattr(hint, "__metadata__", ()):
        if isinstance(meta, Kind):
            return meta
    raise TypeError(f"spec op {op}: {what} is annotated {hint!r}, which names no kind (lockstep.spec.kinds)")


def op_contract(name: str, fn) -> OpContract:
    """The contract of one op, read from its spec function: the kinds its annotations name, its
    defaults, the first line of its docstring, and the rules of its ``@op`` mark. ``TypeError`` when
    the function is not marked, or a parameter or its result names no kind."""
    mark = op_mark(fn)
    if mark is None:
        raise TypeError(f"spec op {name}: the function is not marked @op (lockstep.spec.kinds)")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise TypeError(f"spec op {name}: an annotation names nothing importable ({exc})") from None
    sig = inspect.signature(fn)
    params = tuple(Param(p.name, _kind_of(name, f"parameter {p.name}", hints.get(p.name)), p.default)
                   for p in sig.parameters.values())
    ret = hints.get("return")
    if typing.get_origin(ret) is tuple:
        returns, is_tuple = tuple(_kind_of(name, "its result", h) for h in typing.get_args(ret)), True
    else:
        returns, is_tuple = (_kind_of(name, "its result", ret),), False
    summary = (fn.__doc__ or "").strip().split("\n\n", 1)[0]
    return OpContract(name, params, returns, is_tuple, " ".join(summary.split()), mark.shapes, mark.pairs)


CONTRACT: dict[str, OpContract] = {op: op_contract(op, getattr(spec, op)) for op in spec.OPS}
OP_NAMES: tuple[str, ...] = tuple(CONTRACT)


# ---------------------------------------------------------------- checks

def _comparable(sig: inspect.Signature) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def signature_problem(op: str, fn) -> str | None:
    """Why ``fn`` does not have the contract's signature for ``op`` (None when it does).

    Compared: parameter names, order, kinds (all positional-or-keyword) and
    defaults. Annotations are the contract's business, not the implementation's.
    """
    want = CONTRACT[op].signature()
    try:
        got = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        return f"{op}: no inspectable signature ({e})"
    if _comparable(got) != _comparable(want):
        return f"{op}: signature {op}{got} differs from the contract's {op}{want}"
    return None


def check_ops(ops: dict[str, Any]) -> list[str]:
    """Every way an op table differs from the contract: missing, extra, or wrong signature."""
    problems = [f"{op}: missing" for op in OP_NAMES if op not in ops]
    problems += [f"{op}: not an op of the contract" for op in ops if op not in CONTRACT]
    problems += [p for op in OP_NAMES if op in ops for p in [signature_problem(op, ops[op])] if p]
    return problems


_FLOAT_ARRAY_KINDS = (Kind.F32, Kind.F32_OPERAND, Kind.F32_OR_NONE, Kind.F32_SCALAR)
_DTYPES = {Kind.INT8: np.int8, Kind.INT32: np.int32, Kind.INT64: np.int64, Kind.UINT32: np.uint32}


def value_problem(kind: Kind, value: Any) -> str | None:
    """Why a host value is not of ``kind`` (None when it is). For host values (NumPy, Python).

    Used on the spec's side of conformance: every case's arguments and the spec's
    results must be of the kinds the contract names.
    """
    if kind is Kind.F32_OR_NONE and value is None:
        return None
    if kind in (Kind.F32_SEQUENCE, Kind.F32_SCALAR_SEQUENCE):
        if not isinstance(value, (list, tuple)):
            return f"expected a list or tuple, got {type(value).__name__}"
        inner = Kind.F32 if kind is Kind.F32_SEQUENCE else Kind.F32_SCALAR
        return next((f"item {i}: {p}" for i, v in enumerate(value) for p in [value_problem(inner, v)] if p), None)
    if kind is Kind.HOST_FLOAT:
        return None if isinstance(value, (float, int)) and not isinstance(value, bool) else f"expected a Python float, got {type(value).__name__}"
    if kind is Kind.HOST_INT:
        return None if isinstance(value, int) and not isinstance(value, bool) else f"expected a Python int, got {type(value).__name__}"
    if kind is Kind.WINDOW:
        return None if value is None or (isinstance(value, int) and not isinstance(value, bool)) else f"expected int or None, got {type(value).__name__}"
    if kind is Kind.FLAG:
        return None if isinstance(value, bool) else f"expected a bool, got {type(value).__name__}"
    if kind in (Kind.F32_SCALAR, Kind.F32_OPERAND) and isinstance(value, float):
        return None
    if not isinstance(value, (np.ndarray, np.generic)):
        return f"expected a NumPy array, got {type(value).__name__}"
    dtype = np.asarray(value).dtype
    if kind in _FLOAT_ARRAY_KINDS:
        if dtype != np.float32:
            return f"expected float32, got {dtype}"
        if kind is Kind.F32_SCALAR and np.ndim(value) != 0:
            return f"expected a scalar (shape ()), got shape {np.shape(value)}"
        if kind in (Kind.F32, Kind.F32_OR_NONE) and not isinstance(value, np.ndarray):
            return "expected an array, got a NumPy scalar"
        return None
    if kind is Kind.IDS:
        return None if np.issubdtype(dtype, np.integer) else f"expected integer ids, got {dtype}"
    want = _DTYPES[kind]
    return None if dtype == want else f"expected {np.dtype(want)}, got {dtype}"


def result_problem(op: str, result: Any) -> str | None:
    """Why an op's result (already brought to the host) is not what the contract says."""
    c = CONTRACT[op]
    if c.returns_tuple:
        if not isinstance(result, tuple) or len(result) != len(c.returns):
            return f"{op}: expected a tuple of {len(c.returns)} results, got {type(result).__name__}"
        items = result
    else:
        items = (result,)
    for i, (kind, value) in enumerate(zip(c.returns, items)):
        problem = value_problem(kind, value)
        if problem is None and kind is not Kind.F32_OR_NONE and value is None:
            problem = "got None"
        if problem:
            return f"{op}: result {i}: {problem}"
    return None


def check_call(op: str, args: tuple = (), kwargs: dict | None = None) -> tuple[Shape | None, ...]:
    """The shapes of ``op``'s results for these host arguments, or the spec's exception for a call the
    contract refuses: ``TypeError`` for an argument of the wrong kind or dtype (``value_problem``) or
    arguments that do not bind, ``ValueError`` for shapes and ranges (the op's rule,
    ``spec.shapes``: the spec's own checks, and no broadcast that enlarges every operand).

    Reads shapes, dtypes and integers only (token ids included), never runs the op: a caller with
    arguments from outside (an op file) checks them here before any backend runs, so the spec and
    every backend see only calls of the contract.
    """
    c = CONTRACT[op]
    try:
        bound = c.signature().bind(*args, **(kwargs or {}))
    except TypeError as exc:
        raise TypeError(f"{op}: {exc}") from None
    bound.apply_defaults()
    for p in c.params:
        problem = value_problem(p.kind, bound.arguments[p.name])
        if problem:
            raise TypeError(f"{op}: argument {p.name}: {problem}")
    try:
        return tuple(c.shapes(**bound.arguments))
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        if not msg.startswith(op):
            exc.args = (f"{op}: {msg}",)
        raise


def call_size(op: str, args: tuple = (), kwargs: dict | None = None) -> int:
    """The elements a call computes: its results' (``check_call``), and for attention every
    (query, key) pair it scores. A Python integer (it never wraps); raises as ``check_call`` does."""
    out = sum(elements(s) for s in check_call(op, args, kwargs))
    c = CONTRACT[op]
    if c.pairs is not None:
        bound = c.signature().bind(*args, **(kwargs or {}))
        bound.apply_defaults()
        out += c.pairs(**bound.arguments)
    return out


def move_arguments(op: str, args: tuple, kwargs: dict, asarray) -> tuple[tuple, dict]:
    """The arguments of one call with every host array moved by ``asarray``, by kind.

    Arrays become device arrays; lists of arrays become lists of device arrays;
    scalars of ``F32_SCALAR_SEQUENCE`` become 0-d device arrays (as the trainer passes
    the outputs of ``sum_of_squares``); host scalars and Python values stay on the host.
    """
    bound = CONTRACT[op].signature().bind(*args, **kwargs)

    def move(kind: Kind, value):
        if kind in (Kind.F32_SEQUENCE, Kind.F32_SCALAR_SEQUENCE) and isinstance(value, (list, tuple)):
            return [asarray(np.asarray(v)) if isinstance(v, (np.ndarray, np.generic)) else v for v in value]
        if isinstance(value, np.ndarray):
            return asarray(value)
        return value

    params = {p.name: p for p in CONTRACT[op].params}
    moved = {name: move(params[name].kind, value) for name, value in bound.arguments.items()}
    positional = [p.name for p in CONTRACT[op].params][: len(args)]
    return tuple(moved[n] for n in positional), {n: v for n, v in moved.items() if n not in positional}
