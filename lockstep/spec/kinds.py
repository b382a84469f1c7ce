"""What an op takes and returns, and the mark that makes a spec function an op.

An op is declared once, where it is defined: a function of a spec module marked ``@op(rule)``,
each parameter annotated with its *kind* (below), its result too, and ``rule`` its shape rule
(``spec.shapes``: the result shapes from the arguments). ``spec.OP_TABLE`` collects the marked
functions; the backend contract (``lockstep.contract.CONTRACT``), every backend's table, the
kernel files and the conformance records are derived from it. The mark only sets an attribute:
the function is the same function, and calling it is the definition.

Kinds of arguments (what an op may be given)
--------------------------------------------

* ``F32``: a float32 array: a device array of the backend (made by its ``asarray``
  or returned by one of its ops) **or a host NumPy float32 array**. A backend reads a
  host array exactly as if it had been passed through its ``asarray`` first (the
  trainer hands ops host arrays: AdamW's parameters and moments, accumulated
  gradients). Device arrays may be non-contiguous views: the trainer reshapes,
  transposes (``.T``, ``.transpose``) and slices (``x[..., a:b]``) op outputs and passes
  the views back to ops.
* ``F32_OPERAND``: an elementwise operand: an ``F32`` array or a float32 scalar;
  the operands of a binary op broadcast as in NumPy.
* ``F32_OR_NONE``: an ``F32`` array or ``None`` (RMSNorm without a gain).
* ``F32_SEQUENCE``: a list or tuple of ``F32`` arrays (possibly empty).
* ``F32_SCALAR``: one float32 number: ``np.float32``, a Python float, or a 0-d
  NumPy or device array (an op's 0-d output, like a norm).
* ``F32_SCALAR_SEQUENCE``: a list or tuple of ``F32_SCALAR`` (possibly empty).
* ``HOST_FLOAT``: a Python float (eps, z-loss weight, max norm): rounded once to
  float32 by the op.
* ``HOST_INT``: a Python int (an axis, a vocabulary size, a round count).
* ``WINDOW``: a Python int (sliding attention window) or ``None`` (fully causal).
* ``FLAG``: a Python bool.
* ``IDS``: token ids: a host NumPy integer array, or an integer device array made
  by ``asarray``. Out-of-range ids raise ``ValueError`` before anything runs
  (``spec.checks.check_ids``, ``spec.checks.check_targets``).
* ``INT8`` / ``UINT32``: an int8 / uint32 array, device or host.

Kinds of results (what an op returns)
-------------------------------------

* ``F32``: a float32 array (``F32_SCALAR``: of shape ``()``; ``F32_OR_NONE``: or
  ``None``); ``INT32``, ``INT64``, ``UINT32``: integer arrays. An op with several
  results returns a tuple of exactly the kinds listed, in order (``tuple[F32, F32]``).
* Every float32 element of every result is canonical: no subnormal, every NaN
  ``0x7FC00000`` (``spec.fp``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Sequence, Union

import numpy as np


class Kind(enum.Enum):
    """What an op argument or result may be (the module docstring)."""

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


# The annotations of the ops. ``Annotated`` keeps the kind at run time; the first argument is what a
# static type checker sees.
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


@dataclass(frozen=True)
class OpMark:
    """What ``@op`` records on a spec function: its shape rule and, for attention, the (query, key)
    pairs it scores (both take the op's arguments by the op's parameter names; ``spec.shapes``)."""

    shapes: Callable
    pairs: Callable | None = None


def op(shapes: Callable, pairs: Callable | None = None):
    """Mark a spec function as an op, with its shape rule (``spec.shapes``) and, for attention, the
    rule that counts the (query, key) pairs it scores. Returns the function itself."""
    def mark(fn):
        fn.__lockstep_op__ = OpMark(shapes, pairs)
        return fn
    return mark


def op_mark(fn) -> OpMark | None:
    """The ``@op`` mark of a function (None when it is not an op)."""
    mark = getattr(fn, "__lockstep_op__", None)
    return mark if isinstance(mark, OpMark) else None
