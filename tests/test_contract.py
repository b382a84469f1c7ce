"""The backend contract (lockstep/contract/__init__.py) against the spec, every backend and the registry.

A backend is picked up by name from ``KNOWN_BACKENDS``: when one lands (opencl,
cuda, metal), its op table is checked here with no change to this file; one that
cannot run on this machine is skipped with its one-line reason.
"""

import inspect
import sys
import types

import numpy as np
import pytest

from lockstep import spec
from lockstep.backends import KNOWN_BACKENDS, BackendUnavailable, get_backend
from lockstep.contract import CONTRACT, OP_NAMES, Kind, check_ops, result_problem, value_problem
from lockstep.conformance.registry import all_records


def test_contract_is_the_spec_declarations_and_every_op_has_kinds():
    assert OP_NAMES == spec.OPS
    assert len(OP_NAMES) == len(set(OP_NAMES)) == len(spec.OP_TABLE)
    for name, c in CONTRACT.items():
        assert c.params, name
        assert all(isinstance(p.kind, Kind) for p in c.params), name
        assert c.returns and all(isinstance(k, Kind) for k in c.returns), name
        assert c.summary, f"{name}: the contract says what the op is"
    # a few that the kernel authors will look up
    assert [p.name for p in CONTRACT["attention_backward"].params] == ["do", "q", "k", "v", "o", "m", "l", "window"]
    assert CONTRACT["attention_backward"].params[-1].default is None
    assert [(p.name, p.kind) for p in CONTRACT["decode_attention"].params] == [
        ("q", Kind.F32), ("k", Kind.F32), ("v", Kind.F32), ("n", Kind.HOST_INT), ("window", Kind.WINDOW)]
    assert CONTRACT["rmsnorm_backward"].returns == (Kind.F32, Kind.F32_OR_NONE)
    assert CONTRACT["cross_entropy_forward"].returns == (Kind.F32_SCALAR, Kind.F32)
    assert CONTRACT["int8_matmul"].returns == (Kind.INT32,) and not CONTRACT["int8_matmul"].returns_tuple


def test_spec_op_table_is_the_contract():
    assert spec.OPS == OP_NAMES
    assert check_ops({op: getattr(spec, op) for op in spec.OPS}) == []
    for op in OP_NAMES:
        assert inspect.signature(getattr(spec, op)).parameters.keys() == CONTRACT[op].signature().parameters.keys()


@pytest.mark.parametrize("name", KNOWN_BACKENDS)
def test_every_backend_implements_exactly_the_contract(name):
    try:
        be = get_backend(name)
    except BackendUnavailable as e:
        assert "\n" not in str(e)
        pytest.skip(f"{name}: {e}")
    assert check_ops(be.ops) == []
    assert tuple(be.ops) == OP_NAMES or set(be.ops) == set(OP_NAMES)
    assert callable(be.asarray) and callable(be.to_numpy)


def test_numba_table_is_derived_from_the_contract():
    pytest.importorskip("numba")
    from lockstep.backends import numba_cpu

    assert tuple(numba_cpu.OPS) == OP_NAMES
    for op, fn in numba_cpu.OPS.items():
        # same module name as the spec's (spec.reduce.column_sum -> numba_cpu.reduce.column_sum)
        assert fn.__module__.rsplit(".", 1)[1] == getattr(spec, op).__module__.rsplit(".", 1)[1], op


def test_check_ops_names_what_differs():
    ops = {op: getattr(spec, op) for op in OP_NAMES}
    del ops["sub"]
    ops["extra_op"] = spec.add
    ops["lane_tree_sum"] = lambda x, axis=0: x  # wrong default
    ops["rmsnorm_forward"] = lambda x, gain, epsilon: x  # wrong name
    problems = check_ops(ops)
    assert "sub: missing" in problems
    assert "extra_op: not an op of the contract" in problems
    assert any(p.startswith("lane_tree_sum: signature") for p in problems)
    assert any(p.startswith("rmsnorm_forward: signature") for p in problems)
    assert len(problems) == 4


def test_registry_covers_the_contract_and_every_case_binds_with_the_right_kinds():
    records = all_records()
    assert [r.name for r in records] == [r.name for r in records if r.name in CONTRACT]
    assert {r.name for r in records} == set(OP_NAMES)
    for rec in records:
        sig = CONTRACT[rec.name].signature()
        kinds = {p.name: p.kind for p in CONTRACT[rec.name].params}
        assert rec.arity == len(kinds)
        for case in rec.cases(0, 1):
            bound = sig.bind(*case.args, **case.kwargs)
            for pname, value in bound.arguments.items():
                problem = value_problem(kinds[pname], value)
                assert problem is None, f"{rec.name} {case.label} {pname}: {problem}"


def test_spec_results_are_of_the_contract_kinds():
    for rec in all_records():
        for case in rec.cases(0, 1):
            result = getattr(spec, rec.name)(*case.args, **case.kwargs)
            assert result_problem(rec.name, result) is None, (rec.name, case.label, result_problem(rec.name, result))


def test_result_problem_catches_wrong_results():
    f = np.zeros(3, np.float32)
    assert result_problem("add", f) is None
    assert "float32" in result_problem("add", f.astype(np.float64))
    assert "tuple of 3" in result_problem("attention_forward", (f, f))
    assert result_problem("rmsnorm_backward", (f, None)) is None
    assert "None" in result_problem("rmsnorm_forward", (f, None))
    assert "scalar" in result_problem("sum_of_squares", f)
    assert "int32" in result_problem("int8_matmul", np.zeros((2, 2), np.int64))


def test_the_runner_reports_a_wrong_signature():
    from lockstep.backends import Backend
    from lockstep.conformance.runner import run_conformance

    ops = {op: getattr(spec, op) for op in OP_NAMES}
    ops["lane_tree_sum"] = lambda x, axis=0: spec.lane_tree_sum(x, axis)
    res = {r.op: r for r in run_conformance(Backend("odd", ops), ops=["lane_tree_sum", "add"], progress=False)}
    assert res["lane_tree_sum"].status == "ERROR" and res["add"].status == "PASS"
    assert "differs from the contract" in res["lane_tree_sum"].messages[0]


# ---------------------------------------------------------------- BackendUnavailable: one line

def test_backend_unavailable_is_one_line():
    with pytest.raises(ValueError):
        BackendUnavailable("two\nlines")
    assert str(BackendUnavailable("no OpenCL device: install lockstep[opencl]")) == "no OpenCL device: install lockstep[opencl]"


def test_opencl_is_a_known_backend_with_its_module():
    from lockstep.backends import BACKEND_MODULES

    assert BACKEND_MODULES["opencl"] == "lockstep.backends.opencl"
    assert BACKEND_MODULES["cuda"] == "lockstep.backends.cupy_cuda"
    assert {"spec", "numba", "opencl", "cuda", "metal"} <= set(KNOWN_BACKENDS)


@pytest.mark.parametrize("name", ["opencl", "cuda", "cupy", "metal"])
def test_absent_backend_module_says_one_line(name, monkeypatch):
    from lockstep.backends import BACKEND_ALIASES, BACKEND_MODULES

    module = BACKEND_MODULES[BACKEND_ALIASES.get(name, name)]
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if the module were not there
    with pytest.raises(BackendUnavailable) as e:
        get_backend(name)
    assert "\n" not in str(e.value) and module in str(e.value)


@pytest.mark.parametrize("name", ["opencl", "cuda"])
def test_backend_without_its_package_says_what_to_install(name, monkeypatch):
    """A backend module whose dependency is missing: the message names the package and the extra."""
    from lockstep.backends import BACKEND_MODULES

    fake = types.ModuleType(BACKEND_MODULES[name])

    def make_backend():
        raise AssertionError("not reached")

    fake.make_backend = make_backend
    real_import = __import__("importlib").import_module

    def import_module(mod, *a, **k):
        if mod == BACKEND_MODULES[name]:
            raise ModuleNotFoundError("No module named 'pyopencl'", name="pyopencl")
        return real_import(mod, *a, **k)

    monkeypatch.setattr("lockstep.backends.importlib.import_module", import_module)
    with pytest.raises(BackendUnavailable) as e:
        get_backend(name)
    msg = str(e.value)
    assert "\n" not in msg and "'pyopencl'" in msg and f"lockstep[{name}]" in msg


def test_cli_prints_one_line_for_an_unavailable_backend(monkeypatch, capsys):
    from lockstep.cli import main

    monkeypatch.setitem(sys.modules, "lockstep.backends.metal", None)
    assert main(["conformance", "--backend", "metal"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lockstep conformance: ")


def test_sum_of_squares_cases_separate_the_blocked_order_from_one_lane_tree():
    """The blocked cases give other bits than SPEC_VERSION 1's single lane tree (so they test the order),
    and tensors of at most one block give the same bits (the claim in the docstring)."""
    from lockstep.conformance.registry import get_record

    for case in get_record("sum_of_squares").cases(0, 1):
        x = spec.fp.f32(case.args[0]).reshape(-1)
        one_tree = spec.lane_tree_sum(spec.mul(x, x)).tobytes()
        blocked = spec.sum_of_squares(case.args[0]).tobytes()
        if x.size <= spec.optim.SUM_OF_SQUARES_BLOCK:
            assert blocked == one_tree, case.label
        else:
            assert blocked != one_tree, case.label


def test_capabilities_are_typed_and_info_is_only_facts():
    """What a backend offers beyond its ops is a typed ``Capabilities``; ``info`` holds no callables."""
    from lockstep.contract.capabilities import Capabilities

    for name in KNOWN_BACKENDS:
        try:
            be = get_backend(name)
        except BackendUnavailable:
            continue
        assert isinstance(be.capabilities, Capabilities), name
        assert not any(callable(v) for v in be.info.values()), (name, be.info)
        for cap in be.capabilities.offered():
            assert cap in Capabilities.__dataclass_fields__, (name, cap)
    numba = pytest.importorskip("numba") and get_backend("numba")
    assert numba.capabilities.offered() == ["add_into", "weights_unchanged", "watch_compilation", "truncated_normal"]
    assert get_backend("spec").capabilities.offered() == []


# ---------------------------------------------------------------- shape rules (``spec.shapes``, ``check_call``)

def _result_shapes(result) -> tuple:
    return tuple(None if r is None else tuple(np.shape(r)) for r in (result if isinstance(result, tuple) else (result,)))


def test_every_op_declares_a_shape_rule_over_its_own_parameters():
    for name, c in CONTRACT.items():
        assert c.shapes is not None, f"{name}: its @op mark names no shape rule"
        for fn in (c.shapes, c.pairs):
            if fn is not None:
                assert list(inspect.signature(fn).parameters) == [p.name for p in c.params], (name, fn.__name__)
    assert {n for n, c in CONTRACT.items() if c.pairs} == {"attention_forward", "attention_backward", "attention_forward_int8",
                                                                  "attention_backward_int8", "decode_attention"}


def test_check_call_gives_the_spec_result_shapes_of_every_conformance_case_and_refuses_its_refusals():
    """The rule is the spec's: on every case the spec answers, the shapes of what it returns; on every
    refusal case, the spec's exception type. The one kind of case beyond it: an elementwise golden case that
    broadcasts (7, 1) against (1, 5), which the ops compute and no call of the contract makes."""
    from lockstep.contract import check_call
    from lockstep.spec.shapes import EnlargingBroadcast

    beyond = []
    for rec in all_records():
        for case in rec.cases(0, 1) + rec.regressions():
            want = _result_shapes(getattr(spec, rec.name)(*case.args, **case.kwargs))
            try:
                assert check_call(rec.name, case.args, case.kwargs) == want, (rec.name, case.label)
            except EnlargingBroadcast:
                beyond.append((rec.name, case.label))
        for case in rec.refusals():
            with pytest.raises((ValueError, TypeError)) as spec_error:
                getattr(spec, rec.name)(*case.args, **case.kwargs)
            with pytest.raises(type(spec_error.value)):
                check_call(rec.name, case.args, case.kwargs)
    assert beyond == [(op, "broadcast") for op in ("add", "sub", "mul", "div", "maximum", "minimum")]


def test_check_call_refuses_broadcasts_that_enlarge_every_operand():
    from lockstep.contract import call_size, check_call
    from lockstep.spec.shapes import EnlargingBroadcast

    col, row = np.ones((9, 1), np.float32), np.ones((1, 9), np.float32)
    assert check_call("add", (np.ones((9, 9), np.float32), row)) == ((9, 9),)  # a row into a matrix: a call
    assert check_call("mul", (col, np.float32(2))) == ((9, 1),) and check_call("mul", (col, 2.0)) == ((9, 1),)
    with pytest.raises(EnlargingBroadcast, match=r"add: .*\(9, 1\), \(1, 9\) broadcast to \(9, 9\)"):
        check_call("add", (col, row))
    key = np.zeros((9, 1, 2), np.uint32)
    assert check_call("philox4x32", (np.zeros((9, 4, 4), np.uint32), key)) == ((9, 4, 4),)  # keys into counters
    with pytest.raises(EnlargingBroadcast, match="philox4x32"):
        check_call("philox4x32", (np.zeros((1, 9, 4), np.uint32), key))
    with pytest.raises(EnlargingBroadcast, match="matmul leading dims"):
        check_call("matmul", (np.ones((3, 1, 2, 2), np.float32), np.ones((1, 3, 2, 2), np.float32)))
    assert check_call("matmul", (col, row)) == ((9, 9),)  # an outer product is a contraction (K = 1) ...
    assert call_size("matmul", (col, row)) == 81  # ... whose size the op file's reader bounds
    q = np.ones((1, 2, 5, 4), np.float32)
    assert call_size("attention_forward", (q, q, q)) == 40 + 10 + 10 + 2 * 5 * 5  # o, m, l and the scored pairs
    with pytest.raises(TypeError, match="argument a: expected float32, got float64"):
        check_call("add", (np.ones(3), np.ones(3, np.float32)))
    with pytest.raises(ValueError, match="embedding_forward needs a table"):
        check_call("embedding_forward", (np.ones((1,), np.float32), np.zeros((3, 0), np.int64)))


@pytest.mark.parametrize("name", ["spec", "numba"])
def test_an_embedding_table_that_is_not_2d_is_refused_by_the_spec_and_every_backend(name):
    """Issue 34, item 4: the spec answered a table of shape (1,) (a 1-d array indexed by ids) where numba
    read ``table.shape[1]`` and raised IndexError. Both now refuse it with ValueError (``spec.checks``)."""
    try:
        be = get_backend(name)
    except BackendUnavailable as e:  # pragma: no cover - the test extra installs numba
        pytest.skip(str(e))
    for ids in (np.zeros((3, 0), np.int64), np.zeros((2,), np.int64)):
        with pytest.raises(ValueError, match=r"embedding_forward needs a table \(V, D\)"):
            be.ops["embedding_forward"](be.asarray(np.ones((1,), np.float32)), ids)


def test_every_call_of_a_training_step_is_a_call_of_the_contract(honest_run):
    """What the trainer does, the rules admit: every op call of a traced step (forward, backward, tree,
    optimizer) passes ``check_call`` with the shapes the op then returns, and computes at most 64 times the
    elements it is given (the bound ``--replay-op`` puts on op files: ``trace_diff.MAX_OP_AMPLIFICATION``)."""
    from lockstep.audit.trace import trace_step
    from lockstep.audit.trace_diff import MAX_OP_AMPLIFICATION
    from lockstep.backends import Backend
    from lockstep.contract import call_size, check_call

    inner = get_backend("spec")
    seen, worst = [], {}

    def checked(op, fn):
        def call(*args, **kwargs):
            shapes = check_call(op, args, kwargs)
            out = fn(*args, **kwargs)
            assert _result_shapes(out) == shapes, op
            held = sum(sum(np.size(x) for x in a) if isinstance(a, list) else np.size(a)
                       for a in (*args, *kwargs.values()))
            worst[op] = max(worst.get(op, 0), call_size(op, args, kwargs) / max(held, 1))
            seen.append(op)
            return out
        return call

    be = Backend("checked", {op: checked(op, fn) for op, fn in inner.ops.items()}, inner.asarray, inner.to_numpy,
                 "the spec, every call checked", capabilities=inner.capabilities)
    assert trace_step(honest_run, 3, be).header["matches_published_state_root"] is True
    assert {"embedding_backward", "attention_forward_int8", "adamw_update", "add", "global_norm"} <= set(seen)
    assert max(worst.values()) < MAX_OP_AMPLIFICATION / 8, worst
