"""Every list of ops is the one the spec's ``@op`` marks declare (``lockstep.spec.OP_TABLE``).

Each op is declared once, by its spec function: marked ``@op(rule)`` in the spec module that
defines it, its parameters and result annotated with their kinds. Everything else is derived
from that or checked here against it: ``spec.OPS`` and the spec functions' modules, the contract
(its order, kinds, rules), the Numba table and its modules, the GPU kernel files and the module
of each ``KernelOps`` method, the conformance records (their modules), the golden files' lines
(every op, in the order they were first written), and the table in ``docs/layout.md``. Each check
can fail: the last tests plant a disagreement and see it reported.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

from lockstep import contract, spec
from lockstep.conformance import golden, ops, registry
from lockstep.conformance.record import Case, OpRecord
from lockstep.spec import shapes as S
from lockstep.spec.kinds import F32, F32Scalar
from lockstep.spec.kinds import op as mark_op

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


def test_the_table_is_every_marked_function_of_the_op_modules_in_file_order():
    for module in spec.OP_MODULES:
        mod = getattr(spec, module)
        marked = [n for n, fn in vars(mod).items() if callable(fn) and getattr(fn, "__lockstep_op__", None) is not None
                  and fn.__module__ == mod.__name__]
        lines = [getattr(mod, n).__code__.co_firstlineno for n in marked]
        assert tuple(op.name for op in spec.OP_TABLE if op.module == module) == tuple(
            n for _, n in sorted(zip(lines, marked))), module


def test_the_contract_is_the_table_read_from_the_spec_functions():
    assert contract.OP_NAMES == spec.OPS
    for op in spec.OPS:
        assert contract.CONTRACT[op] == contract.op_contract(op, getattr(spec, op))


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


def test_the_golden_files_lines_are_every_op_in_one_order():
    order: list[str] = []
    for op, _label in golden.load_golden():
        if not order or order[-1] != op:
            order.append(op)
    assert sorted(order) == sorted(spec.OPS) and len(order) == len(spec.OPS), "an op's lines are missing or split"
    assert tuple(order) == golden.line_order()
    text = golden.inputs_path().read_text(encoding="utf-8")
    rows = [line.split(" ", 1)[0] for line in text.splitlines()
            if line and not line.startswith("#") and len(line.split(" ", 3)) > 3]
    assert tuple(dict.fromkeys(rows)) == golden.line_order()


def test_a_new_op_goes_after_every_line_of_the_golden_files_and_a_missing_file_takes_the_table_order(
        monkeypatch, tmp_path):
    first = golden.line_order()
    shorter = [line for line in golden.golden_path().read_text(encoding="utf-8").splitlines()
               if not line.startswith("column_sum ")]
    (tmp_path / golden.golden_path().name).write_text("\n".join(shorter) + "\n", encoding="utf-8")
    monkeypatch.setattr(golden, "GOLDEN_DIR", tmp_path)
    monkeypatch.setattr(golden, "golden_path", lambda spec_version=spec.SPEC_VERSION: tmp_path / f"spec_v{spec_version}.txt")
    assert golden.line_order() == tuple(op for op in first if op != "column_sum") + ("column_sum",)
    (tmp_path / golden.golden_path().name).unlink()
    (tmp_path / "spec_v3.txt").write_text("\n".join(shorter) + "\n", encoding="utf-8")
    assert golden.line_order()[-1] == "column_sum", "the newest earlier version's order is kept"
    (tmp_path / "spec_v3.txt").unlink()
    assert golden.line_order() == spec.OPS


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


def test_an_op_without_its_mark_or_a_kind_is_refused_and_a_marked_function_joins_the_table():
    def layer_scale(g: F32, coef: F32Scalar) -> F32:
        """``g * coef``."""

    with pytest.raises(TypeError, match="layer_scale: the function is not marked @op"):
        contract.op_contract("layer_scale", layer_scale)
    marked = mark_op(S.scale)(layer_scale)
    assert contract.op_contract("layer_scale", marked).params == contract.CONTRACT["scale"].params

    def no_kind(g: F32, coef) -> F32:
        """``g * coef``."""
    with pytest.raises(TypeError, match="no_kind: parameter coef is annotated None, which names no kind"):
        contract.op_contract("no_kind", mark_op(S.scale)(no_kind))

    namespace = {**vars(spec.optim), "layer_scale": marked}
    marked.__module__ = spec.optim.__name__
    assert [o.name for o in spec.declared_ops("optim", namespace)][-1] == "layer_scale"


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
