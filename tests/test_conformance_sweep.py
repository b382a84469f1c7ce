"""Conformance level 3, the exhaustive unary sweeps: the machinery on a few small blocks, the golden file.

The full sweep (2**32 patterns per op) is far too slow for CI; these tests run the same
code on blocks of 2**16 patterns and compare with digests of the spec's outputs that the
test computes itself (plain ``hashlib`` over ``spec.<op>``), not with the golden file.
"""

import hashlib
import io
from contextlib import redirect_stdout

import numpy as np
import pytest

from lockstep import spec
from lockstep.backends import Backend, get_backend
from lockstep.cli import main
from lockstep.conformance import sweep
from lockstep.contract import CONTRACT, Kind

SMALL = 16  # block_bits of the tests: blocks of 65536 patterns
# Blocks of 2**16 patterns (block b holds b << 16 ..): +0 and subnormals, 1 .. 1.004, exp's overflow (88.x)
# and underflow (-88.x) edges (sigmoid's and silu's too), negative NaNs.
BLOCKS = [0x0000, 0x3F80, 0x42B1, 0xC2B0, 0xFFC0]


def _spec_digest(op: str, block: int, block_bits: int) -> str:
    u = np.arange(block << block_bits, (block + 1) << block_bits, dtype=np.uint64).astype(np.uint32)
    y = getattr(spec, op)(u.view(np.float32))
    assert y.dtype == np.float32 and y.shape == u.shape
    return hashlib.sha256(y.astype("<f4").tobytes()).hexdigest()


def test_unary_ops_come_from_the_contract():
    ops = sweep.unary_ops()
    assert {"exp", "log", "sigmoid", "silu", "sqrt", "neg", "abs"} <= set(ops)
    for name, c in CONTRACT.items():
        if name not in ops:  # every other op takes more, or other kinds, or returns something else
            assert (len(c.params) != 1 or c.params[0].kind is not Kind.F32_OPERAND
                    or c.returns != (Kind.F32,) or c.returns_tuple), name


def test_numba_sweep_of_small_blocks_matches_the_spec():
    backend = get_backend("numba")
    expected = {op: {b: _spec_digest(op, b, SMALL) for b in BLOCKS} for op in sweep.unary_ops()}
    results = sweep.run_sweeps(backend, blocks=BLOCKS, expected=expected, block_bits=SMALL, chunk=1 << 14,
                               progress=False)
    assert [(r.op, r.status, r.blocks) for r in results] == [(op, "PASS", len(BLOCKS)) for op in sweep.unary_ops()]


def _one_wrong_bit(pattern: int) -> Backend:
    """The spec backend, except that ``exp`` flips the lowest bit of its output for one input pattern."""
    base = get_backend("spec")

    def exp(x):
        y = spec.exp(x).copy()
        y.view(np.uint32)[np.asarray(x).view(np.uint32) == pattern] ^= 1
        return y

    return Backend(name="one-wrong-bit", ops={**base.ops, "exp": exp}, asarray=base.asarray, to_numpy=base.to_numpy)


def test_a_wrong_bit_is_caught_and_localised_to_its_element():
    pattern = 0x3F80_1234
    blocks = [0x3F7F, 0x3F80, 0x3F81]
    expected = {"exp": {b: _spec_digest("exp", b, SMALL) for b in blocks}}
    (res,) = sweep.run_sweeps(_one_wrong_bit(pattern), ops=["exp"], blocks=blocks, expected=expected,
                              block_bits=SMALL, chunk=1 << 12, progress=False)
    assert res.status == "FAIL" and res.blocks == 3
    want = int(spec.exp(np.array([pattern], dtype=np.uint32).view(np.float32)).view(np.uint32)[0])
    text = "\n".join(res.messages)
    assert "block 16256 (patterns 0x3f800000..0x3f80ffff): 1 of 65536 outputs differ" in text, text
    assert f"input 0x3F801234: spec 0x{want:08X}, backend 0x{want ^ 1:08X}" in text, text
    assert len(res.messages) == 2  # the one block and the one element: the neighbours pass


def test_an_op_without_golden_digests_is_named_and_not_passed():
    backend = get_backend("spec")
    expected = {"neg": {0: _spec_digest("neg", 0, SMALL), 1: _spec_digest("neg", 1, SMALL)},
                "abs": {0: _spec_digest("abs", 0, SMALL)}, "sqrt": {0: _spec_digest("neg", 0, SMALL)}}
    results = sweep.run_sweeps(backend, ops=["neg", "abs", "sqrt", "exp"], blocks=[0, 1], expected=expected,
                               block_bits=SMALL, progress=False)
    # neg: both blocks match; abs: block 0 matches, block 1 has no digest; sqrt: block 0 (+0 and the positive
    # subnormals: all +0 out) is given neg's digest (all -0): it differs; exp: no digest at all
    assert [(r.op, r.status, r.blocks) for r in results] == [
        ("neg", "PASS", 2), ("abs", "NO-GOLDEN", 1), ("sqrt", "FAIL", 1), ("exp", "NO-GOLDEN", 0)]
    assert "no golden digest for 1 of the 2 blocks (first: 1; the other 1 compared)" in results[1].messages[0]
    out = io.StringIO()
    sweep.print_sweeps(results, backend, [0, 1], out=out)
    assert "1 passed, 1 failed, 2 without a golden digest" in out.getvalue()


def test_golden_file_parses_covers_its_ops_and_agrees_with_the_spec_on_a_block():
    table = sweep.load_golden()
    assert table, "the committed sweep golden file is empty or absent"
    text = sweep.golden_path().read_text()
    assert set(table) <= set(sweep.unary_ops())
    for op, blocks in table.items():
        # parse_golden checked that an op has a root line exactly when it has all 256 blocks
        assert (f"{op} root " in text) == (len(blocks) == sweep.BLOCKS), op
        assert sweep.format_golden({op: blocks}).split("block_bits 24\n")[1] in text
    # One block per cheap op (neg, abs and sqrt are exact: a fraction of a second each on the spec; a block
    # of a transcendental takes the spec 10-40 s here, beyond this suite's budget; tools/sweep_golden.py's
    # own test below checks that the tool writes the spec's digests).
    checked = 0
    for op in ("neg", "abs", "sqrt"):
        if 0x7F in table.get(op, {}):
            assert sweep.block_digest(sweep.spec_apply(op), op, 0x7F) == table[op][0x7F], op
            checked += 1
    assert checked


@pytest.mark.parametrize("text, why", [
    (f"format 1\nspec_version {spec.SPEC_VERSION}\nblock_bits 24\nneg block 256 " + "0" * 64, "not in 0..255"),
    (f"format 1\nspec_version {spec.SPEC_VERSION}\nblock_bits 24\nneg block 0 xyz", "not a SHA-256"),
    (f"format 1\nspec_version {spec.SPEC_VERSION}\nblock_bits 24\nneg block 0 " + "0" * 64 + "\nneg block 0 " + "1" * 64, "twice"),
    (f"format 1\nspec_version {spec.SPEC_VERSION}\nblock_bits 24\nmatmul block 0 " + "0" * 64, "not a unary op"),
    (f"format 1\nspec_version {spec.SPEC_VERSION}\nblock_bits 24\nneg root " + "0" * 64, "0 blocks and a root"),
    (f"format 2\nspec_version {spec.SPEC_VERSION}\nblock_bits 24\n", "format"),
    ("neg block 0 " + "0" * 64, "before the header"),
])
def test_malformed_golden_files_are_refused_in_one_line(text, why):
    with pytest.raises(ValueError, match=why) as e:
        sweep.parse_golden(text)
    assert "\n" not in str(e.value)


def test_cli_level_3_on_one_block(capsys):
    assert main(["conformance", "--backend", "spec", "--level", "3", "--ops", "neg", "--blocks", "5"]) == 0
    out = capsys.readouterr().out
    assert "level=3 blocks=1 of 256" in out and "1 passed" in out
    assert main(["conformance", "--level", "3", "--blocks", "9:3"]) == 1
    assert main(["conformance", "--level", "2", "--blocks", "1"]) == 1
    assert main(["conformance", "--level", "3", "--ops", "matmul", "--blocks", "1"]) == 1


def test_the_golden_tool_resumes_and_writes_the_spec_digests(tmp_path):
    """tools/sweep_golden.py on two blocks of neg (a second of work), in two runs: the second computes only
    the block the file lacks; both digests are the spec's."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "sweep_golden.py"
    spec_ = importlib.util.spec_from_file_location("sweep_golden", path)
    tool = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(tool)
    out = tmp_path / "sweeps.txt"
    assert tool.main(["--ops", "neg", "--blocks", "0x7F", "--workers", "1", "--out", str(out)]) == 0
    first = out.read_text()
    assert tool.main(["--ops", "neg", "--blocks", "0x7E:0x80", "--workers", "1", "--out", str(out)]) == 0
    table = sweep.load_golden(out)
    assert sorted(table["neg"]) == [0x7E, 0x7F]
    assert first.splitlines()[-1] in out.read_text().splitlines()
    for b in (0x7E, 0x7F):
        assert table["neg"][b] == _spec_digest("neg", b, sweep.BLOCK_BITS)
