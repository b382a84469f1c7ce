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

The module is itself a backend. Each op is declared once, where it is defined: a function of
one of the modules in ``OP_MODULES`` marked ``@op(rule)`` (``kinds``), its parameters and result
annotated with their kinds. ``OP_TABLE`` below collects them; every other list of ops is derived
from it: ``OPS`` here, the backend contract (``lockstep.contract``), the Numba backend's table,
the GPU kernel files and the conformance records (``docs/adding-an-op.md``;
``tests/test_op_table.py`` fails when one of them disagrees).
The conformance suite compares ``getattr(backend, op)`` with ``getattr(spec, op)`` byte for byte.
"""

from dataclasses import dataclass

from . import attention, embedding, fp, layout, loss, norm, optim, philox, quant, reduce, rope, swiglu, transcendental
from .fp import f32
from .kinds import op_mark
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


_MODULES = {m.__name__.rsplit(".", 1)[1]: m for m in (attention, embedding, fp, layout, loss, norm, optim, philox,
                                                      quant, reduce, rope, swiglu, transcendental)}
if tuple(sorted(_MODULES)) != tuple(sorted(OP_MODULES)):
    raise ImportError("lockstep.spec: OP_MODULES and the imported op modules disagree")


def declared_ops(module: str, namespace: dict | None = None) -> tuple[Op, ...]:
    """The ops ``lockstep/spec/<module>.py`` defines: its functions marked ``@op``, in the order of
    the file (a function it imports from another module is that module's)."""
    namespace = vars(_MODULES[module]) if namespace is None else namespace
    marked = [fn for fn in namespace.values() if callable(fn) and op_mark(fn) is not None
              and getattr(fn, "__module__", None) == f"{__name__}.{module}"]
    return tuple(Op(fn.__name__, module) for fn in sorted(marked, key=lambda fn: fn.__code__.co_firstlineno))


# The op table: every op once, module by module in the order of ``OP_MODULES``, each module's in
# the order of its file. The order is the contract's and every backend table's; the golden files
# keep the order their lines were first written in (``lockstep.conformance.golden``).
OP_TABLE: tuple[Op, ...] = tuple(op for module in OP_MODULES for op in declared_ops(module))

OPS: tuple[str, ...] = tuple(op.name for op in OP_TABLE)
OP_MODULE: dict[str, str] = {op.name: op.module for op in OP_TABLE}
if len(set(OPS)) != len(OPS):
    raise ImportError("lockstep.spec: two op modules define an op of the same name")
# every op, as ``spec.<op>``: the function of its module (``spec.column_sum`` is ``spec.reduce.column_sum``)
globals().update({op.name: getattr(_MODULES[op.module], op.name) for op in OP_TABLE})

__all__ = ["SPEC_VERSION", "OPS", "OP_TABLE", "OP_MODULES", "OP_MODULE", "Op", "PhiloxStream", "f32", *OPS]
