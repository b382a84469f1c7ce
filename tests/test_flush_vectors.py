"""The conformance inputs separate the spec's round-then-flush from hardware flush rules.

docs/numerical-contract.md ("Round, then flush") names four vectors whose exact result lies just below
2**-126 and rounds up to it: the spec gives 0x00800000, a flush-before-rounding
(Apple-style) multiplier or divider gives 0, x86 FTZ gives 0 on the first. They must
be in the boundary pairs that every backend's mul and div run on, and a backend that
flushes before rounding must fail conformance on them.
"""

import numpy as np
import pytest

from lockstep import spec
from lockstep.backends import Backend, get_backend
from lockstep.conformance import inputs as gen
from lockstep.contract.vectors import FLUSH_VECTORS, SMALLEST_NORMAL
from lockstep.conformance.registry import get_record
from lockstep.conformance.runner import run_conformance

VECTORS = [(v.op, v.a, v.b) for v in FLUSH_VECTORS]  # (op, a, b): spec result SMALLEST_NORMAL


def _bits(x):
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)


def test_boundary_table_holds_the_new_values():
    patterns = {b for b, _ in gen.BOUNDARY_F32}
    assert {0x01000000, *(x for v in FLUSH_VECTORS for x in (v.a, v.b))} <= patterns  # every operand of V1-V4
    assert len(patterns) == len(gen.BOUNDARY_F32) == gen.boundary_values().size


@pytest.mark.parametrize("op,a,b", VECTORS, ids=[f"{op}-{a:08X}-{b:08X}" for op, a, b in VECTORS])
@pytest.mark.parametrize("level", [1, 2])
def test_every_vector_is_a_conformance_pair_and_gives_the_smallest_normal(op, a, b, level):
    case = next(c for c in get_record(op).cases(0, level) if c.label == "boundary-pairs")
    ca, cb = (_bits(x) for x in case.args)
    where = np.nonzero((ca == a) & (cb == b))[0]
    assert where.size == 1, f"{op}: the pair 0x{a:08X}, 0x{b:08X} is not in the boundary pairs"
    out = _bits(getattr(spec, op)(*case.args))
    assert out[where[0]] == SMALLEST_NORMAL
    # the commuted product is there too
    if op == "mul":
        assert np.count_nonzero((ca == b) & (cb == a)) == 1


def _flush_before_rounding(op):
    """An emulated multiplier/divider that flushes when the exact result is below 2**-126 (Apple-style)."""
    def fn(a, b):
        a64 = spec.fp.f32(a).astype(np.float64)
        b64 = spec.fp.f32(b).astype(np.float64)
        with np.errstate(all="ignore"):
            exact = a64 * b64 if op == "mul" else a64 / b64  # products exact in float64
        r = getattr(spec, op)(a, b)
        tiny = (np.abs(exact) < 2.0**-126) & (exact != 0)
        return np.where(tiny, np.copysign(np.float32(0.0), exact).astype(np.float32), r)
    return fn


def test_a_flush_before_rounding_backend_fails_on_exactly_these_vectors():
    ops = {op: getattr(spec, op) for op in spec.OPS}
    ops["mul"] = _flush_before_rounding("mul")
    ops["div"] = _flush_before_rounding("div")
    res = {r.op: r for r in run_conformance(Backend("ftz-before-rounding", ops), ops=["mul", "div"],
                                            max_errors=100, progress=False)}
    assert res["mul"].status == "FAIL" and res["div"].status == "FAIL"
    text = "\n".join(res["mul"].messages + res["div"].messages)
    for op, a, b in VECTORS:
        assert f"0x{a:08X}" in text and f"0x{b:08X}" in text, (op, hex(a), hex(b))


def test_numba_gives_the_spec_on_the_vectors():
    pytest.importorskip("numba")
    nb = get_backend("numba")
    for op, a, b in VECTORS:
        x = spec.fp.from_bits(np.array([a], np.uint32)).copy()
        y = spec.fp.from_bits(np.array([b], np.uint32)).copy()
        assert _bits(getattr(nb, op)(nb.asarray(x), nb.asarray(y)))[0] == SMALLEST_NORMAL, (op, hex(a), hex(b))
