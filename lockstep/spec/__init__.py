"""lockstep.spec: the definition of every number lockstep publishes.

Slow, plain NumPy, written to be read. Arithmetic contract (see ``fp``):
IEEE float32, each ``+ - * / sqrt`` rounded separately (never an FMA), results
with ``0 < |r| < 2**-126`` flushed to a zero of their sign after rounding,
every NaN the canonical ``0x7FC00000``, one written order for every float sum
(``reduce``; ``tree`` for the sum of a step's micro-batches, whatever the number of
ranks), transcendentals built from those five operations
(``transcendental``), random numbers from Philox4x32-10 only (``philox``).
No BLAS, libm, ``np.sum``/``np.dot``/``np.matmul`` on floats or ``np.random`` (the rule, not a call)
decides a bit. Integer GEMMs are exact and may use anything.

The module is itself a backend: ``OP_TABLE`` below declares every op once (its name and
the spec module that defines it), and every other list of ops is derived from it: ``OPS``
here, the order of the backend contract (``lockstep.contract``), the Numba backend's table,
the GPU kernel files, the conformance records and the golden files' lines
(``docs/adding-an-op.md``; ``tests/test_op_table.py`` fails when one of them disagrees).
The conformance suite compares ``getattr(backend, op)`` with ``getattr(spec, op)`` byte for byte.
"""

from dataclasses import dataclass

from . import attention, embedding, fp, layout, loss, norm, optim, philox, quant, reduce, rope, swiglu, transcendental
from .fp import f32
from .philox import PhiloxStream

# Bump whenever what any op computes changes, or the hashes that publish it (``hashing``: the
# state root, the chain); regenerate the golden vectors with
# ``python -m lockstep.conformance.golden --write`` in the same commit (CHANGELOG.md keeps the history).
# A new op that changes no other bit only adds its lines to the golden files: regenerate, no bump.
SPEC_VERSION = "4"

# The spec modules that define ops, in the order every layer reads its files of the same name
# (``backends/kernels/<module>.kc`` are concatenated in this order: a file may use what an earlier
# one defines). Each has ``backends/numba_cpu/<module>.py``, ``backends/kernels/<module>.kc`` and
# ``<module>.py``, ``conformance/ops/<module>.py`` and ``tests/test_<module>.py``.
OP_MODULES: tuple[str, ...] = ("layout", "fp", "transcendental", "reduce", "philox", "embedding", "norm", "rope",
                               "attention", "swiglu", "quant", "loss", "optim")


@dataclass(frozen=True)
class Op:
    """One op: its name (the same in every layer) and the spec module that defines it."""

    name: str
    module: str  # one of OP_MODULES: the op is ``lockstep/spec/<module>.py``'s function ``name``


def _ops(module: str, names: str) -> tuple[Op, ...]:
    return tuple(Op(name, module) for name in names.split())


# The op table: every op once, in the order of the golden files' lines (``lockstep.conformance.golden``),
# which is the order of ``OPS``, of the contract and of every backend's table. A new op goes at the end.
OP_TABLE: tuple[Op, ...] = (
    *_ops("fp", "add sub mul div maximum minimum sqrt neg abs"),
    *_ops("transcendental", "exp log sigmoid silu"),
    *_ops("reduce", "lane_tree_sum matmul int8_matmul max argmax"),
    *_ops("philox", "philox4x32"),
    *_ops("layout", "concat_last"),
    *_ops("reduce", "column_sum"),
    *_ops("embedding", "embedding_forward embedding_backward"),
    *_ops("norm", "rmsnorm_forward rmsnorm_backward"),
    *_ops("rope", "rope_forward rope_backward"),
    *_ops("attention", "attention_forward attention_backward"),
    *_ops("swiglu", "swiglu_forward swiglu_backward"),
    *_ops("quant", "int8_linear_forward int8_linear_backward"),
    *_ops("loss", "cross_entropy_forward cross_entropy_backward"),
    *_ops("optim", "sum_of_squares global_norm clip_coefficient scale adamw_update"),
    *_ops("attention", "decode_attention"),
    *_ops("reduce", "matmul_accumulate"),
    *_ops("loss", "cross_entropy_rows"),
    *_ops("attention", "attention_forward_int8 attention_backward_int8"),
)

OPS: tuple[str, ...] = tuple(op.name for op in OP_TABLE)
OP_MODULE: dict[str, str] = {op.name: op.module for op in OP_TABLE}

_MODULES = {m.__name__.rsplit(".", 1)[1]: m for m in (attention, embedding, fp, layout, loss, norm, optim, philox,
                                                      quant, reduce, rope, swiglu, transcendental)}
if tuple(sorted(_MODULES)) != tuple(sorted(OP_MODULES)) or len(set(OPS)) != len(OPS):
    raise ImportError("lockstep.spec: OP_MODULES, the imported op modules and OP_TABLE disagree")
# every op, as ``spec.<op>``: the function of its module (``spec.column_sum`` is ``spec.reduce.column_sum``)
globals().update({op.name: getattr(_MODULES[op.module], op.name) for op in OP_TABLE})

__all__ = ["SPEC_VERSION", "OPS", "OP_TABLE", "OP_MODULES", "OP_MODULE", "Op", "PhiloxStream", "f32", *OPS]
