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
from lockstep import contract as interface
from lockstep.contract import CONTRACT, OP_NAMES, Kind, check_ops, result_problem, value_problem
from lockstep.conformance.registry import all_records


def test_contract_is_the_protocol_and_every_op_has_kinds():
    assert OP_NAMES == tuple(n for n in vars(interface.BackendOps) if not n.startswith("_"))
    assert len(OP_NAMES) == len(set(OP_NAMES)) == 45
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
        # same module name as the spec's (spec.norm.column_sum -> numba_cpu.norm.column_sum)
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
