"""Conformance by search: every op of the backend contract, on every installed backend, against the spec.

Hypothesis draws whole calls (``lockstep.conformance.search``): float32 bit patterns
weighted toward subnormals, signed zeros, NaN payloads, infinities, ties and values
near ``2**-126``; shapes with empty, odd and >32 rows; views; ``None`` where the
contract allows it; and input the spec refuses. Every backend that ``get_backend``
can build gives the spec's bytes or raises the spec's exception type. A new op of the
contract or a new backend is picked up here with no change to this file.

The suite profile runs ``suite_examples(op)`` examples per op (derandomized); the
deep search is ``python3 -m tools.conformance_search`` (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings

from lockstep import spec
from lockstep.backends import KNOWN_BACKENDS, Backend
from lockstep.contract import OP_NAMES
from lockstep.conformance import search
from lockstep.conformance.registry import search_refusal_regressions
from lockstep.spec import fp

BACKENDS, UNAVAILABLE = search.installed_backends()

# Drawn inputs overflow float32 casts and divide by zero on purpose (huge doubles as
# host floats, infinities): NumPy's RuntimeWarnings there are expected, not findings.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.mark.parametrize("name", KNOWN_BACKENDS)
def test_backend_is_searched_or_says_why_not(name):
    """Each known backend takes part in the search, or is skipped with its one-line reason."""
    if name in UNAVAILABLE:
        pytest.skip(f"{name}: {UNAVAILABLE[name]}")
    assert name in [b.name for b in BACKENDS]


def _search_test(op: str):
    @settings(max_examples=search.suite_examples(op))
    @given(call=search.strategy_for(op))
    def run(call):
        search.check_or_raise(call, BACKENDS)

    return run


@pytest.mark.parametrize("op", OP_NAMES)
def test_op_matches_spec_on_every_backend(op):
    _search_test(op)()


def test_strategies_name_ops_of_the_contract():
    assert set(search.OP_STRATEGIES) <= set(OP_NAMES)
    missing = [op for op in OP_NAMES if op not in search.OP_STRATEGIES]
    if missing:  # still searched, through the fallback below; a strategy of their own searches better
        warnings.warn(f"ops searched only by the fallback strategy: {', '.join(missing)}", stacklevel=1)


@pytest.mark.parametrize("op", ["add", "embedding_backward", "rmsnorm_forward", "global_norm", "adamw_update"])
def test_fallback_strategy_searches_an_op_without_a_strategy(op):
    """A new op of the contract is searched before anyone writes its strategy: new values, by the
    contract's kinds, in the shapes of the op's first conformance case (here on ops of every kind:
    elementwise, ids, None, a scalar sequence, scalars)."""
    @settings(max_examples=4)
    @given(call=search.fallback_strategy(op))
    def run(call):
        search.check_or_raise(call, BACKENDS)

    run()


def _off_by_one_bit(fn):
    def wrong(*args, **kwargs):
        r = np.array(fn(*args, **kwargs), copy=True)
        if r.size and r.dtype == np.float32:
            flat = r.reshape(-1).view(np.uint32)
            u = flat[-1]
            if (u & 0x7F800000) not in (0, 0x7F800000):  # keep the result canonical: flip a mantissa bit of a normal
                flat[-1] = u ^ 1
        return r
    return wrong


def _ftz_before_rounding_mul(a, b):
    """Multiplication as flush-before-rounding hardware does it: a result whose exact value is
    below 2**-126 becomes zero even when it rounds up to 2**-126 (docs/gpu-kernels.md, Apple GPUs)."""
    a, b = np.broadcast_arrays(fp.f32(a), fp.f32(b))
    exact = a.astype(np.float64) * b.astype(np.float64)  # exact: 24-bit x 24-bit fits in 53 bits
    r = spec.mul(a, b)
    tiny = (np.abs(exact) < 2.0**-126) & (exact != 0)
    return np.where(tiny, np.copysign(np.float32(0.0), exact).astype(np.float32), r)


@pytest.mark.parametrize("defect", ["one-bit", "ftz-before-rounding", "raises-other-type"])
def test_search_finds_a_planted_defect(defect):
    """The search is not a test that cannot fail: it finds a one-bit error in lane_tree_sum,
    the flush-before-rounding rule in mul, and a wrong exception type for bad ids."""
    ops = dict(search.installed_backends()[0][0].ops)
    op = {"one-bit": "lane_tree_sum", "ftz-before-rounding": "mul", "raises-other-type": "embedding_forward"}[defect]
    if defect == "one-bit":
        ops[op] = _off_by_one_bit(spec.lane_tree_sum)
    elif defect == "ftz-before-rounding":
        ops[op] = _ftz_before_rounding_mul
    else:
        def embedding_forward(table, ids):
            if np.asarray(ids).dtype.kind == "f" or np.any(np.asarray(ids) < 0) or np.any(np.asarray(ids) >= np.shape(table)[0]):
                raise IndexError("token id out of range")
            return spec.embedding_forward(table, ids)
        ops[op] = embedding_forward
    planted = Backend("planted", ops, asarray=fp.canonical)

    @settings(max_examples=500, print_blob=False)
    @given(call=search.strategy_for(op))
    def run(call):
        search.check_or_raise(call, [planted])

    with pytest.raises(AssertionError, match="planted: "):
        run()


@pytest.mark.parametrize("op,label,args,kwargs", search_refusal_regressions(),
                         ids=[f"{op}-{label}" for op, label, _, _ in search_refusal_regressions()])
def test_refused_regressions_are_refused_alike(op, label, args, kwargs):
    """Bad inputs on which a backend once disagreed (each op's record, lockstep/conformance/ops/): the spec refuses
    each with ValueError/TypeError, and every backend raises the same type."""
    with pytest.raises((ValueError, TypeError)):
        getattr(spec, op)(*args, **kwargs)
    search.check_or_raise(search.Call(op, args, kwargs), BACKENDS)
    search.check_or_raise(search.Call(op, args, kwargs, host_inputs=True), BACKENDS)
