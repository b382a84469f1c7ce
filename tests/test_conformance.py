"""The conformance suite: registry coverage, the runner, the golden vectors, the CLI."""

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lockstep import spec
from lockstep.backends import Backend, BackendUnavailable, get_backend
from lockstep.cli import main
from lockstep.conformance import golden
from lockstep.conformance.registry import all_records, search_refusal_regressions
from lockstep.conformance.runner import all_passed, print_table, run_conformance


def test_registry_covers_every_spec_op():
    names = [r.name for r in all_records()]
    assert len(names) == len(set(names))
    assert set(names) == set(spec.OPS)
    for op in spec.OPS:
        assert callable(getattr(spec, op)), op
    assert all(r.tolerance == 0 for r in all_records())


def test_records_and_runner_need_no_hypothesis():
    """Hypothesis is a test extra: the records (whose modules also hold the search strategies) and the
    runner load without it, with every record and its refusals; only the search refuses to load."""
    code = ("import sys; sys.modules['hypothesis'] = None\n"
            "from lockstep.conformance import registry, runner\n"
            "print(len(registry.all_records()), len(registry.search_refusal_regressions()))\n"
            "try:\n    import lockstep.conformance.search\nexcept ImportError as e:\n    print(e)\n")
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    counts, why = r.stdout.splitlines()
    assert counts == f"{len(all_records())} {len(search_refusal_regressions())}"
    assert "needs hypothesis" in why


def test_spec_backend_mirrors_op_table():
    be = get_backend("spec")
    assert set(be.ops) == set(spec.OPS)
    with pytest.raises(AttributeError):
        be.not_an_op
    with pytest.raises(ValueError):
        get_backend("nonsense")


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the metal backend may be available")
def test_unavailable_backend_says_what_to_install():
    with pytest.raises(BackendUnavailable):
        get_backend("metal")


def test_spec_passes_its_own_suite_and_golden_vectors():
    results = run_conformance(get_backend("spec"), level=1, seed=0, progress=False)
    assert all_passed(results), [(r.op, r.status, r.messages[:3]) for r in results if r.status != "PASS"]
    assert {r.golden for r in results} == {"match"}


def test_golden_file_is_what_the_generator_writes():
    assert golden.golden_path().read_text() == golden.format_golden(golden.compute_golden())


def test_runner_reports_wrong_and_missing_ops():
    sp = get_backend("spec")
    ops = dict(sp.ops)

    def bad_add(a, b):
        r = spec.add(a, b)
        r = np.array(r, copy=True)
        flat = r.reshape(-1).view(np.uint32)
        if flat.size:
            flat[0] ^= 1  # one bit wrong
        return r

    ops["add"] = bad_add
    del ops["sub"]
    wrong = Backend("wrong", ops)
    results = {r.op: r for r in run_conformance(wrong, ops=["add", "sub", "mul"], progress=False)}
    assert results["add"].status == "FAIL"
    assert any("0x" in m for m in results["add"].messages)
    assert results["sub"].status == "MISSING"
    assert results["mul"].status == "PASS"
    out = io.StringIO()
    print_table(list(results.values()), wrong, 1, 0, out=out)
    assert "1 passed, 1 failed, 1 missing" in out.getvalue()


def test_runner_compares_refusals():
    """The runner runs each op's refusal cases (their records' ``refusals``, conformance/ops/): a backend that raises
    another exception type than the spec, or answers, fails that op; the spec refuses alike."""
    sp = get_backend("spec")
    refusing_ops = sorted({op for op, _, _, _ in search_refusal_regressions()})
    results = {r.op: r for r in run_conformance(sp, ops=refusing_ops, progress=False)}
    assert all(r.status == "PASS" and r.refusals >= 1 for r in results.values()), results
    ops = dict(sp.ops)

    def swiglu_forward_raises_index_error(gu):
        if np.shape(gu)[-1] % 2:
            raise IndexError("odd width")
        return spec.swiglu_forward(gu)

    def rope_forward_answers(x, cos, sin):
        return spec.fp.f32(x)

    ops["swiglu_forward"] = swiglu_forward_raises_index_error
    ops["rope_forward"] = rope_forward_answers
    wrong = Backend("wrong-refusals", ops)
    results = {r.op: r for r in run_conformance(wrong, ops=["swiglu_forward", "rope_forward"], progress=False)}
    assert results["swiglu_forward"].status == "FAIL"
    assert any("search-odd-width (a refusal): raised IndexError" in m for m in results["swiglu_forward"].messages)
    assert results["rope_forward"].status == "FAIL"
    assert any("(a refusal): returned a result; the spec raises ValueError" in m for m in results["rope_forward"].messages)


def test_cli_conformance_and_version(capsys):
    assert main(["conformance", "--ops", "add,lane_tree_sum,exp", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "add" in out and "PASS" in out
    assert main(["version"]) == 0
    out = capsys.readouterr().out
    assert f"SPEC_VERSION {spec.SPEC_VERSION}" in out and "numpy" in out
    assert main(["conformance", "--ops", "nope"]) == 1


def test_golden_inputs_file_replays_to_the_recorded_digests():
    """Issue 13 item 7: the inputs file alone (no Python input generator) runs through the spec
    to the digests recorded in it, which are the digests file's, case for case."""
    rows = golden.parse_inputs(golden.inputs_path().read_text(encoding="utf-8"), str(golden.inputs_path()))
    digests = golden.load_golden()
    assert [(op, label) for op, label, _, _ in rows] == list(digests)
    for op, label, digest, arguments in rows:
        assert digest == digests[(op, label)], (op, label)
        assert golden.outputs_digest(getattr(spec, op)(*arguments)) == digest, (op, label)


def test_golden_inputs_file_is_what_the_generator_writes():
    assert golden.inputs_path().read_text(encoding="utf-8") == golden.format_inputs(golden.compute_inputs())


def test_golden_input_tokens_by_hand():
    """The token grammar (golden.py's docstring) on hand-derived cases, and back."""
    cases = [
        (np.array([1.0, -2.0], np.float32), "f32[2]:3F800000C0000000"),
        (np.array([[-1, 127]], np.int8), "i8[1x2]:FF7F"),
        (np.array([-1], np.int64), "i64[1]:FFFFFFFFFFFFFFFF"),
        (np.zeros((2, 0), np.float32), "f32[2x0]:"),
        (np.array(0.5, np.float32), "f32[]:3F000000"),
        (np.float32(-0.0), "f32:80000000"),
        (1.0, "f64:3FF0000000000000"),
        (-3, "int:-3"),
        (True, "bool:1"),
        (None, "none"),
    ]
    for value, token in cases:
        assert golden.encode_argument(value) == [token]
        (back,) = golden.decode_arguments([token])
        assert type(back) is type(value) or isinstance(value, np.ndarray)
        if isinstance(value, np.ndarray):
            assert back.dtype == value.dtype and back.shape == value.shape and back.tobytes() == value.tobytes()
        else:
            assert np.asarray(back).tobytes() == np.asarray(value).tobytes()
    seq = golden.encode_argument([np.float32(1.0), np.array([2.0], np.float32)])
    assert seq == ["seq:2", "f32:3F800000", "f32[1]:40000000"]
    assert golden.decode_arguments(seq + ["none"])[1] is None
    with pytest.raises(ValueError, match="needs 16 hex digits, got 8"):
        golden.decode_arguments(["f32[2]:3F800000"])
