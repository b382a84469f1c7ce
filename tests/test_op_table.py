"""Every list of ops is the one ``lockstep.spec.OP_TABLE`` declares.

The table declares each op once: its name and the spec module that defines it. Everything else
is derived from it or checked here against it: ``spec.OPS`` and the spec functions' modules, the
contract's order and ``BackendOps``'s methods, the Numba table and its modules, the GPU kernel
files and the module of each ``KernelOps`` method, the conformance records (their modules and
order), the golden files' lines, and the table in ``docs/layout.md``. Each check can fail: the
last tests plant a disagreement and see it reported.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

from lockstep import contract, spec
from lockstep.conformance import golden, ops, registry
from lockstep.conformance.record import Case, OpRecord

ROOT = Path(__file__).resolve().parents[1]


def _op_table_tool():
    path = ROOT / "tools" / "op_table.py"
    mod_spec = importlib.util.spec_from_file_location("op_table_tool", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def test_the_table_names_each_op_once_in_a_module_that_defines_it():
    assert spec.OPS == tuple(op.name for op in spec.OP_TABLE)
    assert len(set(spec.OPS)) == len(spec.OPS)
    assert set(spec.OP_MODULE.values()) == set(spec.OP_MODULES)
    for op in spec.OP_TABLE:
        fn = getattr(spec, op.name)
        assert fn.__module__ == f"lockstep.spec.{op.module}", (op, fn.__module__)
        assert getattr(spec, op.module).__dict__[op.name] is fn, op


def test_the_contract_is_in_table_order():
    assert contract.OP_NAMES == spec.OPS
    methods = tuple(n for n in vars(contract.BackendOps) if not n.startswith("_"))
    assert methods == spec.OPS, "BackendOps's methods are not in the order of spec.OP_TABLE"


def test_the_numba_table_is_the_op_table():
    pytest.importorskip("numba")
    from lockstep.backends import numba_cpu

    assert tuple(numba_cpu.OPS) == spec.OPS
    assert set(numba_cpu._MODULES) == set(spec.OP_MODULES)
    for op in spec.OP_TABLE:
        assert numba_cpu.OPS[op.name].__module__ == f"lockstep.backends.numba_cpu.{op.module}", op


def test_the_kernel_files_and_kernel_ops_are_the_op_table():
    from lockstep.backends import kernels
    from lockstep.backends.kernels.backend import KernelOps

    assert kernels.KERNEL_FILES == tuple(f"{m}.kc" for m in spec.OP_MODULES) + ("hashing.kc",)
    for op in spec.OP_TABLE:
        owner = next(cls for cls in KernelOps.__mro__ if op.name in vars(cls))  # the class whose method runs
        assert owner.__module__ == f"lockstep.backends.kernels.{op.module}", (
            f"{op.name}: KernelOps.{op.name} comes from {owner.__module__}.{owner.__name__}, the table puts it in "
            f"lockstep/backends/kernels/{op.module}.py")


def test_the_conformance_records_are_the_op_table():
    assert registry.records_problems() == []
    assert set(ops.MODULES) == set(spec.OP_MODULES)
    assert tuple(r.name for r in registry.all_records()) == spec.OPS


def test_the_golden_files_lines_follow_the_op_table():
    order: list[str] = []
    for op, _label in golden.load_golden():
        if not order or order[-1] != op:
            order.append(op)
    assert tuple(order) == spec.OPS
    text = golden.inputs_path().read_text(encoding="utf-8")
    rows = [line.split(" ", 1)[0] for line in text.splitlines()
            if line and not line.startswith("#") and len(line.split(" ", 3)) > 3]
    assert tuple(dict.fromkeys(rows)) == spec.OPS


def test_the_docs_table_is_the_op_table():
    tool = _op_table_tool()
    assert tool.missing_files() == []
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    assert tool.with_table(text) == text, "docs/layout.md's op table is stale: run python3 tools/op_table.py --write"


# ---------------------------------------------------------------- the checks see a disagreement

def test_a_record_in_the_wrong_module_a_missing_one_and_an_unknown_one_are_reported():
    modules = dict(ops.MODULES)
    fp_records = [r for r in ops.fp.RECORDS if r.name != "abs"]
    modules["fp"] = types.SimpleNamespace(RECORDS=tuple(fp_records))
    modules["norm"] = types.SimpleNamespace(RECORDS=ops.norm.RECORDS + (
        OpRecord("sqrt", lambda seed, level: [Case("x", ())]),
        OpRecord("layer_scale", lambda seed, level: []),
        OpRecord("rmsnorm_forward", lambda seed, level: [], tolerance=1),
    ))
    problems = registry.records_problems(modules)
    assert "abs: no conformance record in conformance/ops/fp.py" in problems
    assert "conformance/ops/norm.py: record 'sqrt' belongs in conformance/ops/fp.py" in problems
    assert "conformance/ops/norm.py: record 'sqrt' given twice" in problems
    assert "conformance/ops/norm.py: record 'layer_scale' is not an op of spec.OP_TABLE" in problems
    assert "conformance/ops/norm.py: record 'rmsnorm_forward' given twice" in problems
    assert "conformance/ops/norm.py: record 'rmsnorm_forward': tolerance must be 0 (bit-exact)" in problems
    assert len(problems) == 6, problems


def test_a_contract_without_a_declared_op_or_with_an_undeclared_one_is_refused(monkeypatch):
    class Missing(contract.BackendOps.__bases__[0]):  # a Protocol with every method but one, and one more
        pass

    for name, fn in vars(contract.BackendOps).items():
        if not name.startswith("_") and callable(fn) and name != "scale":
            setattr(Missing, name, fn)
    Missing.layer_scale = contract.BackendOps.scale
    monkeypatch.setattr(contract, "BackendOps", Missing)
    with pytest.raises(ImportError, match="no method for scale; not in the table: layer_scale"):
        contract._build_contract()


def test_a_stale_docs_table_is_reported(tmp_path):
    tool = _op_table_tool()
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    stale = text.replace(" decode_attention ", " ", 1)
    assert stale != text and tool.with_table(stale) == text
    with pytest.raises(ValueError, match="markers are missing"):
        tool.with_table(text.replace(tool.END, ""))


def test_an_op_declared_in_a_module_that_does_not_define_it_is_seen(monkeypatch):
    bad = tuple(spec.Op(op.name, "norm") if op.name == "column_sum" else op for op in spec.OP_TABLE)
    monkeypatch.setattr(spec, "OP_TABLE", bad)
    with pytest.raises(AssertionError):
        test_the_table_names_each_op_once_in_a_module_that_defines_it()
    with pytest.raises(AssertionError, match="column_sum: KernelOps.column_sum comes from .*reduce"):
        test_the_kernel_files_and_kernel_ops_are_the_op_table()
