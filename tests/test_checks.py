"""``spec.checks``: the input checks every backend shares refuse what they say, with the type they say."""

import ast
from pathlib import Path

import numpy as np
import pytest

from lockstep.spec import checks

ROOT = Path(__file__).resolve().parents[1]
f32 = np.float32


@pytest.mark.parametrize("call,error", [
    (lambda: checks.check_ids(np.array([0.0]), 3), TypeError),
    (lambda: checks.check_ids(np.array([-1]), 3), ValueError),
    (lambda: checks.check_ids(np.array([3]), 3), ValueError),
    (lambda: checks.check_targets(np.array([0, 1]), 3, 2), ValueError),
    (lambda: checks.check_targets(np.array([2]), 1, 2), ValueError),
    (lambda: checks.gradient_rows(np.zeros((2, 3), f32), 3), ValueError),
    (lambda: checks.check_attention_shapes(np.zeros((1, 3, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))),
     ValueError),
    (lambda: checks.check_attention_shapes(np.zeros((1, 1, 2, 0)), np.zeros((1, 1, 2, 0)), np.zeros((1, 1, 2, 0))),
     ValueError),
    (lambda: checks.check_rope_shapes(np.zeros((2, 3)), np.zeros((2, 1)), np.zeros((2, 1))), ValueError),
    (lambda: checks.check_rope_shapes(np.zeros((2, 4)), np.zeros((3, 2)), np.zeros((3, 2))), ValueError),
    (lambda: checks.check_swiglu_shapes(np.zeros((2, 3))), ValueError),
    (lambda: checks.check_swiglu_shapes(np.zeros((2, 4)), np.zeros((2, 3))), ValueError),
    (lambda: checks.check_linear_shapes(np.zeros((2, 3)), np.zeros((4, 5))), ValueError),
    (lambda: checks.check_linear_shapes(np.zeros((2, 3)), np.zeros((3, 5)), np.zeros((2, 4))), ValueError),
    (lambda: checks.check_matmul_shapes(np.zeros((2, 3)), np.zeros((2, 3))), ValueError),
    (lambda: checks.check_int8_operands(np.zeros((2, 3), np.int16), np.zeros((3, 2), np.int8)), TypeError),
    (lambda: checks.check_int8_operands(np.zeros((2, 3), np.int8), np.zeros((2, 2), np.int8)), ValueError),
    (lambda: checks.check_int8_operands(np.zeros((1, checks.INT8_MATMUL_MAX_K + 1), np.int8),
                                        np.zeros((checks.INT8_MATMUL_MAX_K + 1, 1), np.int8)), ValueError),
])
def test_each_check_refuses_with_its_type(call, error):
    with pytest.raises(error):
        call()


def test_good_inputs_pass_and_come_back_as_int64():
    assert checks.check_ids(np.array([[0, 2]], np.int32), 3).dtype == np.int64
    assert checks.check_targets(np.array([[1], [0]]), 2, 2).tolist() == [1, 0]
    assert checks.gradient_rows(np.zeros((2, 3, 0), f32), 6).shape == (6, 0)
    checks.check_attention_shapes(np.zeros((1, 4, 2, 8)), np.zeros((1, 2, 2, 8)), np.zeros((1, 2, 2, 8)))
    checks.check_rope_shapes(np.zeros((5, 2, 4)), np.zeros((2, 2)), np.zeros((1, 2)))
    checks.check_int8_operands(np.zeros((2, 0), np.int8), np.zeros((0, 1), np.int8))


def test_backends_import_the_checks_from_the_public_module_only():
    """No backend imports a private name of a spec module (the checks used to be ``_check_ids``, ``_targets``)."""
    private = []
    for path in sorted((ROOT / "lockstep" / "backends").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lockstep.spec"):
                private += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_")]
    assert private == []
