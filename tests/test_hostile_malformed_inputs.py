"""Attack class 9 (issue 19, Low 9): malformed inputs that crashed with a traceback instead of a refusal.

A safetensors tensor with more than 64 dimensions or an oversized zero-size shape, a
deeply nested manifest, ``1e999`` or ill-typed values in a recipe, an ``.npy`` shard
declaring a huge shape: each gets a clean one-line refusal naming the file (verify:
a finding and exit 2; the other commands: exit 1), never a traceback.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct

import numpy as np
import pytest

from forge import lockstep_limited, rewrite_sidecar
from lockstep.audit.verify import verify_run
from lockstep.cli import main
from lockstep.fsio.safetensors import SafetensorsError, parse_safetensors
from lockstep.formats.manifest import DataError, Manifest


def _safetensors(entries: dict, data: bytes = b"") -> bytes:
    body = json.dumps(entries).encode()
    body += b" " * (-(8 + len(body)) % 8)
    return struct.pack("<Q", len(body)) + body + data


@pytest.mark.parametrize("shape, why", [
    ([1] * 65, "dimensions"),
    ([0, 2**62, 2**62], "too large"),
    ([2**40, 0, 2**40], "too large"),
])
def test_safetensors_shapes_numpy_cannot_make_are_refused(shape, why):
    raw = _safetensors({"t": {"dtype": "F32", "shape": shape, "data_offsets": [0, 4 if 0 not in shape else 0]}},
                       b"\0\0\0\0" if 0 not in shape else b"")
    with pytest.raises(SafetensorsError, match=why):
        parse_safetensors(raw, "x.safetensors")


def test_checkpoint_with_a_65_dimensional_tensor_is_a_finding(copy_run, capsys):
    run = copy_run()
    state = run / "checkpoints" / "step-00000002" / "state.safetensors"
    raw = state.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__" and header[k]["shape"] == [1])
    header[name]["shape"] = [1] * 65
    body = json.dumps(header).encode()
    body += b" " * (-(8 + len(body)) % 8)
    state.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])
    rewrite_sidecar(run, 2, file_sha256=hashlib.sha256(state.read_bytes()).hexdigest())
    assert main(["audit", "verify", str(run), "--no-batches"]) == 2
    out = capsys.readouterr().out
    assert "65 dimensions" in out and "step-00000002" in out


def _set_manifest(run, raw: bytes) -> None:
    """Replace the run's manifest, and the recipe's digest of it (as the run's publisher can)."""
    (run / "data" / "manifest.json").write_bytes(raw)
    recipe = json.loads((run / "recipe.json").read_text())
    recipe["data"]["manifest_sha256"] = hashlib.sha256(raw).hexdigest()
    (run / "recipe.json").write_text(json.dumps(recipe))


def test_deeply_nested_manifest_is_refused(copy_run, capsys):
    run = copy_run()
    _set_manifest(run, b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(DataError, match="manifest.json"):
        Manifest.load(run / "data")
    assert main(["audit", "verify", str(run), "--no-batches"]) == 2
    assert "manifest.json" in capsys.readouterr().out


def test_npy_shard_declaring_a_huge_shape_is_refused(copy_run):
    run = copy_run()
    man = json.loads((run / "data" / "manifest.json").read_text())
    shard = man["sources"][0]["shards"][0]
    buf = io.BytesIO()
    np.save(buf, np.zeros(4, dtype="<i8"), allow_pickle=False)
    raw = buf.getvalue()  # .npy 1.0: magic, version, u16 header length, header (space-padded dict)
    header_len = struct.unpack("<H", raw[8:10])[0]
    header = raw[10 : 10 + header_len].replace(b"(4,)", b"(1099511627776,)")
    header = header.rstrip(b"\n ").ljust(header_len - 1) + b"\n"
    assert len(header) == header_len
    raw = raw[:10] + header + raw[10 + header_len :]
    (run / "data" / shard["offsets_file"]).write_bytes(raw)
    shard["offsets_sha256"] = hashlib.sha256(raw).hexdigest()
    _set_manifest(run, json.dumps(man, indent=1).encode())
    for args in (["audit", "verify", run], ["audit", "replay", run, "--step", "1", "--backend", "spec"]):
        r = lockstep_limited(*args, memory=3 << 29)
        assert r.returncode in (1, 2) and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert "offsets.npy" in r.stdout + r.stderr and "1099511627776" in r.stdout + r.stderr


def _recipe(run, section: str, **values) -> None:
    recipe = json.loads((run / "recipe.json").read_text())
    recipe[section].update(values)
    (run / "recipe.json").write_text(json.dumps(recipe))


@pytest.mark.parametrize("section, values, field", [
    ("model", {"n_kv_heads": 0}, "n_kv_heads"),
    ("model", {"seq_len": 1.5}, "seq_len"),
    ("model", {"d_model": "256"}, "d_model"),
    ("model", {"quantize": "yes"}, "quantize"),
    ("train", {"peak_lr": "0.01"}, "peak_lr"),
    ("train", {"batch_ramp": [[0, "6"]]}, "batch_ramp"),
])
def test_ill_typed_recipe_values_are_refused(copy_run, capsys, section, values, field):
    run = copy_run()
    _recipe(run, section, **values)
    rep = verify_run(run, batches=False)
    assert any(f.check == "recipe" and field in f.message for f in rep.errors), rep.format()
    assert main(["audit", "replay", str(run), "--step", "1", "--backend", "spec"]) == 1
    assert field in capsys.readouterr().err


def test_1e999_in_a_recipe_is_not_infinity(copy_run, capsys):
    run = copy_run()
    text = (run / "recipe.json").read_text()
    (run / "recipe.json").write_text(text.replace('"peak_lr": ', '"peak_lr": 1e999, "x": ', 1))
    rep = verify_run(run, batches=False)
    assert any(f.check == "recipe" and "infinity" in f.message for f in rep.errors), rep.format()
    r = lockstep_limited("train", "--resume", run, "--steps", "5", "--backend", "spec", "--quiet")
    assert r.returncode == 1 and "infinity" in r.stderr and "Traceback" not in r.stderr


def _commitment(run, drop: tuple = (), **values) -> dict:
    path = run / "commitment.json"
    c = json.loads(path.read_text())
    c.update(values)
    for key in drop:
        del c[key]
    path.write_text(json.dumps(c))
    return c


# (edit, words the refusal says): every one of these said VALID, exit 0, before commitment.json was read strictly
COMMITMENT_EDITS = [
    ({"spec_version": "../../../etc/passwd", "x\x1b[2J": 1}, "unknown key"),
    ({"spec_version": "../../../etc/passwd"}, "spec_version"),
    ({"spec_version": 3}, "spec_version"),
    ({"spec_version": "2"}, "SPEC_VERSION '2'"),  # well formed, but not the recipe's
    ({"version": "1"}, "version"),
    ({"version": 2}, "version"),
    ({"version": True}, "version"),
    ({"last_step": True}, "last_step"),
    ({"genesis": None}, "genesis"),
    ({"recipe_sha256": "AB" * 32}, "recipe_sha256"),
    ({"drop": ("genesis",)}, "genesis"),
    ({"drop": ("version",)}, "version"),
]


@pytest.mark.parametrize("edit, says", COMMITMENT_EDITS)
def test_a_commitment_with_unknown_keys_or_wrong_types_is_refused(copy_run, capsys, edit, says):
    run = copy_run()
    edit = dict(edit)
    _commitment(run, edit.pop("drop", ()), **edit)
    assert main(["audit", "verify", str(run), "--no-batches"]) == 2
    out = capsys.readouterr().out
    assert "commitment.json" in out and says in out and "\x1b" not in out, out
    # replay counts a damaged commitment as an invalid run too (a missing one is only a run not finished)
    assert main(["audit", "replay", str(run), "--step", "1", "--backend", "spec"]) == 2
    assert says in capsys.readouterr().out
