"""Issue 34, items 2, 4 and 7: op files (``conformance --replay-op FILE``) built by hand, as an attacker would.

An op file names one call of the contract and its arguments; everything in it comes from
outside. These files are small and well formed (every digest right), and each asks for
something no traced step does: operands that broadcast into each other (``(n, 1)`` against
``(1, n)``, a Philox counter against a key), a call whose output is far larger than what the
file holds, an embedding table that is not ``(V, D)``. Each must be refused in one line,
exit 1, before the spec or any backend runs; the children run with a 3 GiB address-space
limit (``forge.lockstep_limited``), so an allocation the size of the attack would end in a
``MemoryError`` traceback instead. A file whose claims are made up is re-checked without
calling its claims recomputed (item 7).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forge import lockstep_limited
from lockstep.audit.trace import TraceError, value_digest
from lockstep.audit.trace_diff import read_op_file, replay_op_file
from lockstep.backends import BackendUnavailable, get_backend
from lockstep.contract import CONTRACT
from lockstep.fsio.safetensors import write_safetensors

F32 = np.float32


def op_file(path: Path, op: str, args: list, *, outputs: dict | None = None, verdict: str = "A",
            backends: tuple[str, str] = ("spec", "numba"), stored: dict | None = None) -> Path:
    """An op file (docs/formats.md, "Op file") of ``op`` on ``args`` (values in the contract's parameter
    order), every digest right; ``outputs`` the claimed output digests of A and B (placeholders by default)."""
    names = [p.name for p in CONTRACT[op].params]
    assert len(args) == len(names)
    tensors, entries, digests = {}, [], []
    for name, v in zip(names, args):
        if isinstance(v, np.ndarray):
            tensors[f"input.{name}"] = v
            entries.append({"name": name, "value": {"tensor": f"input.{name}"}})
        elif v is None:
            entries.append({"name": name, "value": {"none": True}})
        elif isinstance(v, bool):
            entries.append({"name": name, "value": {"bool": v}})
        elif isinstance(v, int):
            entries.append({"name": name, "value": {"int": v}})
        else:
            entries.append({"name": name, "value": {"float": v}})
        digests.append(value_digest(v)[0])
    n_out = len(CONTRACT[op].returns)
    outputs = outputs or {"a": ["0" * 64] * n_out, "b": ["1" * 64] * n_out}
    for side, v in (stored or {}).items():
        tensors[f"output.{side}"] = v
    meta = {"lockstep_op_replay": "1", "op": op,
            "address": json.dumps({"mb": 0, "layer": None, "module": None, "op": op, "dir": "forward", "index": 0}),
            "args": json.dumps(entries), "output": "0", "outputs_sha256": json.dumps(outputs),
            "inputs_sha256": json.dumps(digests), "verdict": verdict, "backend_a": backends[0],
            "backend_b": backends[1], "root_a": "a" * 64, "root_b": "b" * 64, "step": "3"}
    write_safetensors(path, tensors, meta)
    return path


def refused(path: Path, *extra: str, words: str) -> None:
    """``conformance --replay-op path`` in a memory-limited child: one line naming the file, exit 1."""
    r = lockstep_limited("conformance", "--replay-op", path, *extra)
    assert r.returncode == 1, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert str(path) in r.stderr and words in r.stderr, r.stderr


N = 1 << 16  # (N, 1) against (1, N): 2**32 elements, 16 GiB of float32 from a 512 KiB file


@pytest.mark.parametrize("op", ["add", "mul", "maximum"])
def test_elementwise_operands_that_broadcast_into_each_other_are_refused_before_any_allocation(tmp_path, op):
    p = op_file(tmp_path / f"{op}.safetensors", op, [np.ones((N, 1), F32), np.ones((1, N), F32)])
    assert p.stat().st_size < 600_000
    refused(p, words=f"broadcast to ({N}, {N})")


def test_a_philox_counter_broadcast_against_its_key_is_refused(tmp_path):
    n = 1 << 14  # 2**28 counters of 16 bytes: 4 GiB from a 384 KiB file
    p = op_file(tmp_path / "philox.safetensors", "philox4x32",
                [np.zeros((1, n, 4), np.uint32), np.zeros((n, 1, 2), np.uint32), 10])
    refused(p, words="philox4x32")


@pytest.mark.parametrize("op, args", [
    ("matmul", [np.ones((N, 1), F32), np.ones((1, N), F32)]),  # an outer product: a contraction with K = 1
    ("embedding_backward", [np.ones((3, 4096), F32), np.zeros((3,), np.int64), 1 << 17]),  # 2 GiB of gradient
    ("attention_forward", [np.ones((1, 1, 1 << 15, 1), F32)] * 3 + [None]),  # 2**30 scored pairs
])
def test_a_call_of_the_contract_far_larger_than_its_file_is_refused(tmp_path, op, args):
    p = op_file(tmp_path / f"{op}.safetensors", op, [a.copy() if isinstance(a, np.ndarray) else a for a in args])
    refused(p, words="computes")


def test_an_embedding_table_that_is_not_2d_is_refused_before_the_spec_or_numba(tmp_path):
    """Item 4: the spec answered table (1,), ids (3, 0) and numba raised IndexError, outside any ``try``."""
    p = op_file(tmp_path / "embedding.safetensors", "embedding_forward",
                [np.ones((1,), F32), np.zeros((3, 0), np.int64)])
    with pytest.raises(TraceError, match=r"no call of embedding_forward .*needs a table \(V, D\)"):
        read_op_file(p)
    try:
        get_backend("numba")
    except BackendUnavailable:  # pragma: no cover - the test extra installs numba
        refused(p, words="needs a table")
    else:
        refused(p, "--backend", "numba", words="needs a table")


def test_a_backend_that_fails_on_a_call_is_a_finding_not_a_traceback(tmp_path, monkeypatch):
    """Item 4: the backend's call is guarded as the spec's is: a backend raising on a call the spec answers
    is reported in the re-check's text (exit 2), never a traceback."""
    import lockstep.backends as backends_mod
    from lockstep.backends import Backend

    x = np.arange(6, dtype=F32).reshape(2, 3)
    want = [value_digest(get_backend("spec").ops["add"](x, x))[0]]
    p = op_file(tmp_path / "add.safetensors", "add", [x, x.copy()], outputs={"a": want, "b": ["1" * 64]})
    spec = get_backend("spec")

    def broken(a, b):
        raise IndexError("tuple index out of range")

    fake = Backend("broken", {**spec.ops, "add": broken}, spec.asarray, spec.to_numpy, "raises on add",
                   capabilities=spec.capabilities)
    monkeypatch.setattr(backends_mod, "get_backend", lambda name: fake)
    text, ok = replay_op_file(p, "broken")
    assert not ok
    assert "backend broken, recomputed here: raised IndexError (tuple index out of range)" in text


def test_a_made_up_op_file_is_not_said_to_be_reproduced(tmp_path):
    """Item 7: outputs, their digests and backend names are only the file's claims. A made-up file that
    gives B (named cuda) the spec's digests got "the spec agrees with B (cuda) ... the file's verdict (B) is
    reproduced", for outputs no cuda computed. The re-check says what it recomputed and what it only read."""
    x = np.linspace(-2, 2, 12, dtype=F32).reshape(3, 4)
    y = np.full((1, 4), 3, F32)
    spec_out = get_backend("spec").ops["mul"](x, y)
    forged = spec_out.copy()
    forged.reshape(-1).view(np.uint32)[5] ^= 1
    p = op_file(tmp_path / "forged.safetensors", "mul", [x, y], verdict="B", backends=("numba", "cuda"),
                outputs={"a": [value_digest(forged)[0]], "b": [value_digest(spec_out)[0]]},
                stored={"a": forged, "b": spec_out.copy()})
    text, ok = replay_op_file(p)
    assert ok  # the spec, recomputed here, gives the outputs the file's verdict names
    assert "reproduced" not in text
    assert "recomputed here: the spec's 1 output(s) from the file's 2 argument(s)" in text
    assert "the spec's outputs have the digests the file claims for B (cuda)" in text
    assert "not recomputed, only the file's claims: that A (numba) and B (cuda) computed the outputs" in text
    assert "output 0 as the file stores it for A (numba): 1 elements differ from the spec's; first at flat index 5" \
        in text
    try:
        get_backend("numba")
    except BackendUnavailable:  # pragma: no cover - the test extra installs numba
        return
    # with --backend numba the claim about numba is recomputed: numba gives the spec's bits, not A's
    text, ok = replay_op_file(p, "numba")
    assert "backend numba, recomputed here: the spec's bits" in text
    assert "the file claims A is numba's: numba computes here NOT the outputs it claims for A" in text
    r = lockstep_limited("conformance", "--replay-op", p, "--backend", "numba")
    assert r.returncode == 0 and "not recomputed, only the file's claims" in r.stdout, r.stdout + r.stderr
