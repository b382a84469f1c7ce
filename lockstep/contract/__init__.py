"""The backend contract: the ops every lockstep backend implements, typed.

A backend is a table of the spec's op names (``lockstep.spec.OPS``, which is
``OP_NAMES`` below) plus two array movers, ``asarray`` and ``to_numpy``. The class
``BackendOps`` is the contract, written once: every method is an op, its parameters
carry the names, order and defaults every backend uses, and each annotation names
an argument or return *kind* (``Kind``). ``CONTRACT`` is the same information as a
table, derived from ``BackendOps``; the spec's op list, the Numba backend's table and
the conformance registry are derived from it or checked against it
(``tests/test_contract.py``, with ``inspect.signature``), and the conformance runner
checks every backend's signatures and output kinds against it.

Kinds of arguments (what an op may be given)
--------------------------------------------

* ``F32``: a float32 array: a device array of this backend (made by its ``asarray``
  or returned by one of its ops) **or a host NumPy float32 array**. A backend reads a
  host array exactly as if it had been passed through its ``asarray`` first (the
  trainer hands ops host arrays: AdamW's parameters and moments, accumulated
  gradients). Shapes are the spec op's (its docstring). Device arrays may be
  non-contiguous views: the trainer reshapes, transposes (``.T``, ``.transpose``) and
  slices (``x[..., a:b]``) op outputs and passes the views back to ops.
* ``F32_OPERAND``: an elementwise operand: an ``F32`` array or a float32 scalar;
  the operands of a binary op broadcast as in NumPy.
* ``F32_OR_NONE``: an ``F32`` array or ``None`` (RMSNorm without a gain).
* ``F32_SEQUENCE``: a list or tuple of ``F32`` arrays (possibly empty).
* ``F32_SCALAR``: one float32 number: ``np.float32``, a Python float, or a 0-d
  NumPy or device array (an op's 0-d output, like a norm). Host values are read as
  float32 under the rule below.
* ``F32_SCALAR_SEQUENCE``: a list or tuple of ``F32_SCALAR`` (possibly empty).
* ``HOST_FLOAT``: a Python float (eps, z-loss weight, max norm): rounded once to
  float32 by the op, then read under the rule below.
* ``HOST_INT``: a Python int (an axis, a vocabulary size, a round count).
* ``WINDOW``: a Python int (sliding attention window) or ``None`` (fully causal).
* ``FLAG``: a Python bool.
* ``IDS``: token ids: a host NumPy integer array, or an integer device array made
  by ``asarray``. Out-of-range ids raise ``ValueError`` before anything runs, as in
  the spec (``spec.checks.check_ids``, ``spec.checks.check_targets``).
* ``INT8`` / ``UINT32``: an int8 / uint32 array, device or host.

Kinds of results (what an op returns)
-------------------------------------

* ``F32``: a float32 device array (``F32_SCALAR``: of shape ``()``; ``F32_OR_NONE``:
  or ``None``); ``INT32``, ``INT64``, ``UINT32``: integer device arrays. An op with
  several results returns a tuple of exactly the kinds listed, in order.
* Every float32 element of every result is **canonical**: no subnormal (they flush
  to zeros of their sign) and every NaN is ``0x7FC00000``.

What a backend may assume about its inputs (and what it must do)
-----------------------------------------------------------------

The spec reads every float32 *input* of every op under one rule (SPEC_VERSION 2,
``spec.fp``): a subnormal input is a zero of its sign (DAZ, as Apple GPUs read
them) and every NaN input is the canonical NaN. Backends implement the rule once,
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

import enum
import inspect
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Protocol, Sequence, Union

import numpy as np

from lockstep.errors import LockstepError

from . import shapes as S
from .shapes import Shape, elements, shapes


class BackendUnavailable(LockstepError, RuntimeError):
    """The backend cannot run here (its package, its compiler or its hardware is missing).

    The message is one line: what is missing, then what to do (see the module
    docstring). A multi-line message is a programming error.
    """

    def __init__(self, message: str):
        if "\n" in message or not message.strip():
            raise ValueError(f"BackendUnavailable needs a one-line message, got {message!r}")
        super().__init__(message)


class Kind(enum.Enum):
    """What an op argument or result may be (see the module docstring)."""

    F32 = "float32 array (device, or host NumPy read through asarray)"
    F32_OPERAND = "float32 array or float32 scalar (broadcasts)"
    F32_OR_NONE = "float32 array or None"
    F32_SEQUENCE = "list/tuple of float32 arrays"
    F32_SCALAR = "float32 scalar (np.float32, Python float, 0-d array)"
    F32_SCALAR_SEQUENCE = "list/tuple of float32 scalars"
    HOST_FLOAT = "Python float"
    HOST_INT = "Python int"
    WINDOW = "Python int or None"
    FLAG = "Python bool"
    IDS = "integer array of token ids (host NumPy or device)"
    INT8 = "int8 array"
    INT32 = "int32 array"
    INT64 = "int64 array"
    UINT32 = "uint32 array"


# The annotations of ``BackendOps``. ``Annotated`` keeps the kind at run time;
# the first argument says what a static type checker sees.
DeviceArray = Any  # a backend's own array type (a NumPy array for spec and numba)
F32 = Annotated[Any, Kind.F32]
F32Operand = Annotated[Any, Kind.F32_OPERAND]
F32OrNone = Annotated[Any, Kind.F32_OR_NONE]
F32Sequence = Annotated[Sequence[Any], Kind.F32_SEQUENCE]
F32Scalar = Annotated[Union[float, np.float32, Any], Kind.F32_SCALAR]
F32ScalarSequence = Annotated[Sequence[Any], Kind.F32_SCALAR_SEQUENCE]
HostFloat = Annotated[float, Kind.HOST_FLOAT]
HostInt = Annotated[int, Kind.HOST_INT]
Window = Annotated[Union[int, None], Kind.WINDOW]
Flag = Annotated[bool, Kind.FLAG]
Ids = Annotated[Any, Kind.IDS]
Int8 = Annotated[Any, Kind.INT8]
Int32 = Annotated[Any, Kind.INT32]
Int64 = Annotated[Any, Kind.INT64]
UInt32 = Annotated[Any, Kind.UINT32]


class BackendOps(Protocol):
    """The ops of every backend, in the spec's order. Docstrings: the spec op's summary.

    Shapes use the spec's legends: B batch, T positions, D model width, H query
    heads, G KV heads, Dh head dim, F feed-forward width, V vocabulary, N rows,
    K contracted length. The spec function of the same name defines every bit.
    """

    # ---- spec.fp: elementwise, one rounding, round-then-flush, canonical NaN
    @shapes(S.binary)
    def add(self, a: F32Operand, b: F32Operand) -> F32:
        """``a + b``."""
    @shapes(S.binary)
    def sub(self, a: F32Operand, b: F32Operand) -> F32:
        """``a - b``."""
    @shapes(S.binary)
    def mul(self, a: F32Operand, b: F32Operand) -> F32:
        """``a * b``."""
    @shapes(S.binary)
    def div(self, a: F32Operand, b: F32Operand) -> F32:
        """``a / b``."""
    @shapes(S.unary)
    def sqrt(self, a: F32Operand) -> F32:
        """IEEE square root."""
    @shapes(S.unary)
    def neg(self, a: F32Operand) -> F32:
        """``-a`` (exact)."""
    @shapes(S.unary)
    def abs(self, a: F32Operand) -> F32:
        """``|a|`` (exact)."""
    @shapes(S.binary)
    def maximum(self, a: F32Operand, b: F32Operand) -> F32:
        """Total-order max (-0.0 < +0.0)."""
    @shapes(S.binary)
    def minimum(self, a: F32Operand, b: F32Operand) -> F32:
        """Total-order min."""

    # ---- spec.transcendental
    @shapes(S.transcendental)
    def exp(self, x: F32Operand) -> F32:
        """The spec's exp."""
    @shapes(S.transcendental)
    def log(self, x: F32Operand) -> F32:
        """The spec's log."""
    @shapes(S.transcendental)
    def sigmoid(self, x: F32Operand) -> F32:
        """``1 / (1 + exp(-x))``."""
    @shapes(S.transcendental)
    def silu(self, x: F32Operand) -> F32:
        """``x * sigmoid(x)``."""

    # ---- spec.reduce
    @shapes(S.lane_tree_sum)
    def lane_tree_sum(self, x: F32, axis: HostInt = -1) -> F32:
        """Lane-tree(32) sum along ``axis``."""
    @shapes(S.matmul)
    def matmul(self, a: F32, b: F32) -> F32:
        """(..., M, K) x (..., K, N): ascending-k float32 contraction."""
    @shapes(S.int8_matmul)
    def int8_matmul(self, a: Int8, b: Int8) -> Int32:
        """(..., M, K) x (..., K, N) int8 -> int32, exact."""
    @shapes(S.max_)
    def max(self, x: F32, axis: HostInt = -1) -> F32:
        """Total-order max along ``axis``."""
    @shapes(S.argmax)
    def argmax(self, x: F32, axis: HostInt = -1) -> Int64:
        """First index of the total-order max along ``axis``."""

    # ---- spec.philox
    @shapes(S.philox4x32)
    def philox4x32(self, counter: UInt32, key: UInt32, rounds: HostInt = 10) -> UInt32:
        """Philox4x32-R: (..., 4), (..., 2) -> (..., 4)."""

    # ---- model ops
    @shapes(S.concat_last)
    def concat_last(self, arrays: F32Sequence) -> F32:
        """Concatenate along the last axis (exact)."""
    @shapes(S.column_sum)
    def column_sum(self, x: F32) -> F32:
        """(..., D) -> (D,): ascending over the leading rows."""
    @shapes(S.embedding_forward)
    def embedding_forward(self, table: F32, ids: Ids) -> F32:
        """(V, D), (B, T) -> (B, T, D)."""
    @shapes(S.embedding_backward)
    def embedding_backward(self, dout: F32, ids: Ids, vocab_size: HostInt) -> F32:
        """(B, T, D), (B, T) -> (V, D)."""
    @shapes(S.rmsnorm_forward)
    def rmsnorm_forward(self, x: F32, gain: F32OrNone, eps: HostFloat) -> tuple[F32, F32]:
        """``(y, rstd)``."""
    @shapes(S.rmsnorm_backward)
    def rmsnorm_backward(self, dy: F32, x: F32, gain: F32OrNone, rstd: F32) -> tuple[F32, F32OrNone]:
        """``(dx, dgain)``; dgain is None without a gain."""
    @shapes(S.rope_forward)
    def rope_forward(self, x: F32, cos: F32, sin: F32) -> F32:
        """(..., T, Dh) rotated by the (T, Dh/2) tables."""
    @shapes(S.rope_backward)
    def rope_backward(self, dy: F32, cos: F32, sin: F32) -> F32:
        """The transpose rotation."""
    @shapes(S.attention_forward, S.attention_pairs)
    def attention_forward(self, q: F32, k: F32, v: F32, window: Window = None) -> tuple[F32, F32, F32]:
        """(B, H, T, Dh), (B, G, T, Dh), (B, G, T, Dh) -> ``(o, m, l)``."""
    @shapes(S.attention_backward, S.attention_backward_pairs)
    def attention_backward(self, do: F32, q: F32, k: F32, v: F32, o: F32, m: F32, l: F32,
                           window: Window = None) -> tuple[F32, F32, F32]:
        """``(dq, dk, dv)``."""
    @shapes(S.decode_attention, S.decode_pairs)
    def decode_attention(self, q: F32, k: F32, v: F32, n: HostInt, window: Window = None) -> F32:
        """(H, Dh), (G, C, Dh), (G, C, Dh), n -> o (H, Dh): the last query over cache positions 0 .. n-1."""
    @shapes(S.swiglu_forward)
    def swiglu_forward(self, gu: F32) -> F32:
        """(..., 2F) -> (..., F)."""
    @shapes(S.swiglu_backward)
    def swiglu_backward(self, dh: F32, gu: F32) -> F32:
        """(..., F), (..., 2F) -> (..., 2F)."""
    @shapes(S.int8_linear_forward)
    def int8_linear_forward(self, x: F32, w: F32) -> F32:
        """W8A8: (..., K), (K, N) -> (..., N)."""
    @shapes(S.int8_linear_backward)
    def int8_linear_backward(self, dy: F32, x: F32, w: F32, hadamard: Flag = True) -> tuple[F32, F32]:
        """``(dx, dw)``."""
    @shapes(S.cross_entropy_forward)
    def cross_entropy_forward(self, logits: F32, targets: Ids, z_loss: HostFloat) -> tuple[F32Scalar, F32]:
        """(N, V), (N,) -> ``(loss_sum, lse)``."""
    @shapes(S.cross_entropy_backward)
    def cross_entropy_backward(self, logits: F32, targets: Ids, lse: F32, z_loss: HostFloat,
                               inv_n: F32Scalar) -> F32:
        """(N, V) gradient of ``inv_n * loss_sum``."""
    @shapes(S.sum_of_squares)
    def sum_of_squares(self, g: F32) -> F32Scalar:
        """Blocked lane-tree sum of ``g * g`` over the flattened tensor."""
    @shapes(S.global_norm)
    def global_norm(self, sums_of_squares: F32ScalarSequence) -> F32Scalar:
        """``sqrt`` of the ascending sum of the per-tensor sums."""
    @shapes(S.clip_coefficient)
    def clip_coefficient(self, norm: F32Scalar, max_norm: HostFloat = 1.0) -> F32Scalar:
        """``min(1, max_norm / (norm + 1e-6))``."""
    @shapes(S.scale)
    def scale(self, g: F32, coef: F32Scalar) -> F32:
        """``g * coef``."""
    @shapes(S.adamw_update)
    def adamw_update(self, p: F32, g: F32, m: F32, v: F32, lr: F32Scalar, beta1: F32Scalar, beta2: F32Scalar,
                     one_minus_beta1: F32Scalar, one_minus_beta2: F32Scalar, eps: F32Scalar,
                     weight_decay: F32Scalar, bc1: F32Scalar, bc2: F32Scalar) -> tuple[F32, F32, F32]:
        """One AdamW step: ``(p, m, v)``."""

    # ---- added after the first 42 (issue 26): a micro-batch's step in row chunks, the same bits
    @shapes(S.matmul_accumulate)
    def matmul_accumulate(self, acc: F32, a: F32, b: F32) -> F32:
        """(M, N), (M, K), (K, N): ``matmul``'s ascending-k contraction continued from acc."""
    @shapes(S.cross_entropy_rows)
    def cross_entropy_rows(self, logits: F32, targets: Ids, z_loss: HostFloat) -> tuple[F32, F32]:
        """(N, V), (N,) -> ``(losses, lse)``: per-token losses; their lane tree is ``cross_entropy_forward``'s sum."""

    # ---- added with SPEC_VERSION 4 (issue 36): attention in the int8 recipe
    def attention_forward_int8(self, q: F32, k: F32, v: F32, window: Window = None) -> tuple[F32, F32, F32]:
        """``attention_forward`` with P.V an int8 contraction: ``(o, m, l)``."""
    def attention_backward_int8(self, do: F32, q: F32, k: F32, v: F32, o: F32, m: F32, l: F32,
                                window: Window = None) -> tuple[F32, F32, F32]:
        """``(dq, dk, dv)`` of ``attention_forward_int8``; dq in 64-bit fixed point."""


@dataclass(frozen=True)
class Param:
    """One parameter of an op: its name, kind and default (``inspect.Parameter.empty`` if none)."""

    name: str
    kind: Kind
    default: Any = inspect.Parameter.empty


@dataclass(frozen=True)
class OpContract:
    """One op of the contract: parameters in order, the kinds it returns, and its shape rule
    (``contract.shapes``: the result shapes from the arguments; ``pairs``: attention's scored pairs)."""

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


def _kind_of(hint) -> Kind:
    for meta in getattr(hint, "__metadata__", ()):
        if isinstance(meta, Kind):
            return meta
    raise TypeError(f"contract annotation {hint!r} carries no Kind")


def _build_contract() -> dict[str, OpContract]:
    table = {}
    for name, fn in vars(BackendOps).items():
        if name.startswith("_") or not callable(fn):
            continue
        hints = typing.get_type_hints(fn, include_extras=True)
        sig = inspect.signature(fn)
        params = tuple(Param(p.name, _kind_of(hints[p.name]), p.default)
                       for p in list(sig.parameters.values())[1:])
        ret = hints["return"]
        if typing.get_origin(ret) is tuple:
            returns, is_tuple = tuple(_kind_of(h) for h in typing.get_args(ret)), True
        else:
            returns, is_tuple = (_kind_of(ret),), False
        table[name] = OpContract(name, params, returns, is_tuple, (fn.__doc__ or "").strip(),
                                 getattr(fn, "__lockstep_shapes__", None), getattr(fn, "__lockstep_pairs__", None))
    return table


CONTRACT: dict[str, OpContract] = _build_contract()
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
    ``contract.shapes``: the spec's own checks, and no broadcast that enlarges every operand).

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
