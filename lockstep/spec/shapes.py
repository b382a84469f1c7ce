"""The shapes of every op's call: what a caller may pass, and the shapes of what the op returns.

Each op names its rule in its mark (``@op(rule)``, ``spec.kinds``): ``rule`` takes the op's
arguments by the op's parameter names and returns the shapes of its results (``None`` for a
``None`` result), computed from the arguments' shapes and integer values alone -- never a
float32 value, never by running the op. It raises what the op raises for a bad call
(``ValueError`` for shapes and ranges, ``TypeError`` for dtypes): the validity checks are the
ops' own (``spec.checks``), which the spec and every backend call too, so the rule and the ops
cannot drift apart.

Two rules hold beyond what the ops' checks refuse: what lockstep's own callers (the trainer, the
audit, generation) pass, and so what a traced step can hold:

* **No broadcast enlarges every operand.** Elementwise operands (``F32_OPERAND``),
  ``matmul``'s leading dims and ``philox4x32``'s key broadcast *into* an operand: the
  result has the shape of one operand (a scalar, a row or a column stretched over the
  other). NumPy's mutual broadcasting -- ``(n, 1)`` against ``(1, n)`` making ``n x n`` --
  is no call of the contract: the ops compute it (conformance tests one case), but
  ``lockstep.contract.check_call`` refuses it.
* **Kinds.** Every argument is of its parameter's kind (``lockstep.contract.value_problem``):
  a float32 array where ``F32`` is named, a 0-d array or a float for ``F32_SCALAR``.

``check_call`` (in ``lockstep.contract``) applies both and the op's rule to host values, before
any backend runs; ``call_size`` counts the elements a call computes.
"""

from __future__ import annotations

import math

import numpy as np

from lockstep.errors import LockstepError

from . import checks

Shape = tuple[int, ...]
AxisError = getattr(np, "exceptions", np).AxisError  # what the spec raises for an axis out of range


class EnlargingBroadcast(LockstepError, ValueError):
    """A call whose operands broadcast to a shape larger than every one of them: the ops compute it
    (NumPy's rule), but no call of the contract makes one (module docstring)."""


def elements(shape: Shape | None) -> int:
    """The number of elements of ``shape`` as a Python integer (never wraps); 0 for None."""
    return 0 if shape is None else math.prod(int(s) for s in shape)


def _shape(x) -> Shape:
    return tuple(int(s) for s in np.shape(x))


def into_one(*operand_shapes: Shape, what: str) -> Shape:
    """The broadcast of ``operand_shapes`` when it is one of them; ValueError otherwise (the operands do
    not broadcast, or broadcasting would make the result larger than every operand)."""
    try:
        out = tuple(int(s) for s in np.broadcast_shapes(*operand_shapes))
    except ValueError:
        raise ValueError(f"{what}: shapes {', '.join(map(str, operand_shapes))} do not broadcast") from None
    if out not in operand_shapes:
        raise EnlargingBroadcast(f"{what}: shapes {', '.join(map(str, operand_shapes))} broadcast to {out}, larger than "
                         "every operand (a call broadcasts an operand into another, never both)")
    return out


def _axis(x, axis, op: str, nonempty: bool) -> Shape:
    shape = _shape(x)
    if not shape:
        raise AxisError(f"{op} needs an array with at least one axis, got a 0-d array")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis must be an int, got {type(axis).__name__}")
    if not -len(shape) <= axis < len(shape):
        raise AxisError(f"{op}: axis {axis} is out of range for shape {shape}")
    axis = int(axis) % len(shape)
    if nonempty and shape[axis] == 0:
        raise ValueError(f"{op} of an empty axis")
    return shape[:axis] + shape[axis + 1:]


# ---------------------------------------------------------------- elementwise, reductions, contractions

def unary(a) -> tuple[Shape]:
    return (_shape(a),)


def transcendental(x) -> tuple[Shape]:
    return (_shape(x),)


def binary(a, b) -> tuple[Shape]:
    return (into_one(_shape(a), _shape(b), what="elementwise operands"),)


def lane_tree_sum(x, axis) -> tuple[Shape]:
    return (_axis(x, axis, "lane_tree_sum", nonempty=False),)


def max_(x, axis) -> tuple[Shape]:
    return (_axis(x, axis, "max", nonempty=True),)


def argmax(x, axis) -> tuple[Shape]:
    return (_axis(x, axis, "argmax", nonempty=True),)


def _contraction(a, b, what: str) -> tuple[Shape]:
    sa, sb = _shape(a), _shape(b)
    lead = into_one(sa[:-2], sb[:-2], what=f"{what} leading dims")
    return (lead + (sa[-2], sb[-1]),)


def matmul(a, b) -> tuple[Shape]:
    checks.check_matmul_shapes(a, b)
    return _contraction(a, b, "matmul")


def int8_matmul(a, b) -> tuple[Shape]:
    checks.check_int8_matmul(a, b)
    return _contraction(a, b, "int8_matmul")


def matmul_accumulate(acc, a, b) -> tuple[Shape]:
    checks.check_matmul_accumulate_shapes(acc, a, b)
    return (_shape(acc),)


def philox4x32(counter, key, rounds) -> tuple[Shape]:
    lead = checks.check_philox(counter, key, rounds)
    cs = _shape(counter)
    if tuple(lead) != cs[:-1]:
        raise EnlargingBroadcast(f"philox4x32: the key's leading dims {_shape(key)[:-1]} make the result {tuple(lead)}, "
                         f"larger than the counter's {cs[:-1]} (a call broadcasts the key into the counter)")
    return (cs,)


def concat_last(arrays) -> tuple[Shape]:
    got = [_shape(a) for a in arrays]
    if not got:
        raise ValueError("concat_last needs at least one array")
    if any(not s or s[:-1] != got[0][:-1] for s in got):
        raise ValueError(f"concat_last needs arrays (..., n_i) with one leading shape, got {got}")
    return (got[0][:-1] + (sum(s[-1] for s in got),),)


def column_sum(x) -> tuple[Shape]:
    shape = _shape(x)
    if not shape:
        raise ValueError("column_sum needs x (..., D), got a 0-d array")
    return (shape[-1:],)


# ---------------------------------------------------------------- the model's ops

def embedding_forward(table, ids) -> tuple[Shape]:
    checks.check_embedding_table(table)
    checks.check_ids(ids, _shape(table)[0])
    return (_shape(ids) + _shape(table)[1:],)


def embedding_backward(dout, ids, vocab_size) -> tuple[Shape]:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 0:
        raise ValueError(f"embedding_backward: vocab_size must be an int >= 0, got {vocab_size!r}")
    checks.check_ids(ids, int(vocab_size))
    _, d = checks.gradient_row_shape(_shape(dout), elements(_shape(ids)))
    return ((int(vocab_size), d),)


def rmsnorm_forward(x, gain, eps) -> tuple[Shape, Shape]:
    checks.check_norm_shapes(x, gain)
    return _shape(x), _shape(x)[:-1]


def rmsnorm_backward(dy, x, gain, rstd) -> tuple[Shape, Shape | None]:
    checks.check_norm_shapes(x, gain, dy, rstd)
    return _shape(x), (None if gain is None else _shape(gain))


def rope_forward(x, cos, sin) -> tuple[Shape]:
    checks.check_rope_shapes(x, cos, sin)
    return (_shape(x),)


def rope_backward(dy, cos, sin) -> tuple[Shape]:
    checks.check_rope_shapes(dy, cos, sin)
    return (_shape(dy),)


def attention_forward(q, k, v, window) -> tuple[Shape, Shape, Shape]:
    checks.check_attention_shapes(q, k, v)
    sq = _shape(q)
    return sq, sq[:3], sq[:3]


def attention_backward(do, q, k, v, o, m, l, window) -> tuple[Shape, Shape, Shape]:
    checks.check_attention_shapes(q, k, v, do, o, m, l)
    return _shape(q), _shape(k), _shape(v)


def attention_pairs(q, k, v, window) -> int:
    """Every (query, key) pair attention scores: B * H * T * T (the definition forms all of them)."""
    b, h, t, _ = _shape(q)
    return b * h * t * t


def attention_backward_pairs(do, q, k, v, o, m, l, window) -> int:
    return attention_pairs(q, k, v, window)


def decode_attention(q, k, v, n, window) -> tuple[Shape]:
    checks.check_decode_attention(q, k, v, n, window)
    return (_shape(q),)


def decode_pairs(q, k, v, n, window) -> int:
    """The last query of each head against cache positions 0 .. n-1: H * n."""
    return _shape(q)[0] * int(n)


def swiglu_forward(gu) -> tuple[Shape]:
    checks.check_swiglu_shapes(gu)
    s = _shape(gu)
    return (s[:-1] + (s[-1] // 2,),)


def swiglu_backward(dh, gu) -> tuple[Shape]:
    checks.check_swiglu_shapes(gu, dh)
    return (_shape(gu),)


def int8_linear_forward(x, w) -> tuple[Shape]:
    checks.check_linear_shapes(x, w)
    return (_shape(x)[:-1] + _shape(w)[1:],)


def int8_linear_backward(dy, x, w, hadamard) -> tuple[Shape, Shape]:
    checks.check_linear_shapes(x, w, dy)
    return _shape(x), _shape(w)


def _loss(logits, targets, lse=None) -> tuple[int, int]:
    checks.check_loss_shapes(logits, lse)
    n, v = _shape(logits)
    checks.check_targets(targets, n, v)
    return n, v


def cross_entropy_forward(logits, targets, z_loss) -> tuple[Shape, Shape]:
    n, _ = _loss(logits, targets)
    return (), (n,)


def cross_entropy_rows(logits, targets, z_loss) -> tuple[Shape, Shape]:
    n, _ = _loss(logits, targets)
    return (n,), (n,)


def cross_entropy_backward(logits, targets, lse, z_loss, inv_n) -> tuple[Shape]:
    _loss(logits, targets, lse)
    return (_shape(logits),)


# ---------------------------------------------------------------- the optimizer

def sum_of_squares(g) -> tuple[Shape]:
    return ((),)


def global_norm(sums_of_squares) -> tuple[Shape]:
    return ((),)


def clip_coefficient(norm, max_norm) -> tuple[Shape]:
    return ((),)


def scale(g, coef) -> tuple[Shape]:
    return (_shape(g),)


def adamw_update(p, g, m, v, lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, bc1,
                 bc2) -> tuple[Shape, Shape, Shape]:
    checks.check_adamw_shapes(p, g, m, v)
    return _shape(p), _shape(p), _shape(p)
