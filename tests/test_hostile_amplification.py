"""Attack class 6 (issue 19, Medium 6): inputs within the size limits that cost far more than their size.

Blank or sparse trajectories, a 99 MB safetensors header, a sparse checkpoint, a
manifest that is not the recipe's (or lists a shard twice, or is huge), a recipe
asking for an enormous model or batch. Each is refused before the expensive work:
lines are streamed with a cap, digests compared before parsing, headers and files
capped at what a real run has, and a recipe's memory estimated before allocating.
Commands that would allocate run in a child with an address-space limit (a guard
for the machine; the tests check exit codes and messages).
"""

from __future__ import annotations

import json
import os
import struct

import pytest

from forge import lockstep_limited, rewrite_sidecar
from lockstep.audit.verify import verify_run
from lockstep.formats import manifest as manifest_mod
from lockstep.formats.manifest import DataError, Manifest

LIMIT = 3 << 29  # 1.5 GiB: a verify or a tiny replay needs under 0.5 GiB here


def _sparse(path, size: int) -> None:
    path.unlink()
    with open(path, "wb") as f:
        f.truncate(size)


def test_trajectory_of_blank_lines_is_refused_at_the_first(copy_run):
    run = copy_run()
    with open(run / "trajectory.jsonl", "wb") as f:
        for _ in range(200):
            f.write(b"\n" * (1 << 20))  # 200 MiB of empty lines: 1.6 GB of line objects if split at once
    r = lockstep_limited("audit", "verify", run, memory=LIMIT)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "trajectory.jsonl:1" in r.stdout and "Traceback" not in r.stderr


@pytest.mark.parametrize("size, why", [(900 << 20, "a line longer than 4096 bytes"), (3 << 30, "larger than")])
def test_sparse_trajectory_is_not_read_whole_on_resume(copy_run, size, why):
    run = copy_run()
    _sparse(run / "trajectory.jsonl", size)
    r = lockstep_limited("train", "--resume", run, "--steps", "5", "--backend", "spec", "--quiet", memory=LIMIT)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "trajectory.jsonl" in r.stderr and why in r.stderr


def test_huge_safetensors_header_is_refused_unparsed(copy_run):
    run = copy_run()
    state = run / "checkpoints" / "step-00000002" / "state.safetensors"
    raw = state.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    # 1.5 million empty tensors: valid safetensors, a 99 MB header
    pad = b"".join(b',"z%07d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i for i in range(1_500_000))
    body = json.dumps(header, separators=(",", ":")).encode()[:-1] + pad + b"}"
    body += b" " * (-(8 + len(body)) % 8)
    assert 90e6 < len(body) < 100_000_000
    state.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])
    import hashlib

    rewrite_sidecar(run, 2, file_sha256=hashlib.sha256(state.read_bytes()).hexdigest())
    r = lockstep_limited("audit", "verify", run, "--no-batches", memory=LIMIT)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "state.safetensors is larger than" in r.stdout  # more than the tiny model's state can be
    from lockstep.formats import checkpoint as ckpt

    with pytest.raises(ckpt.CheckpointError, match="header length .* exceeds the 1048576-byte bound"):
        ckpt.load_checkpoint(state.parent)  # with no size bound, the header bound still holds


def test_sparse_checkpoint_is_refused_unread(copy_run):
    run = copy_run()
    _sparse(run / "checkpoints" / "step-00000002" / "state.safetensors", 8 << 30)
    r = lockstep_limited("audit", "verify", run, "--no-batches", memory=LIMIT)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "state.safetensors is larger than" in r.stdout


def test_manifest_digest_is_compared_before_any_shard_is_hashed(copy_run, monkeypatch):
    run = copy_run()
    man = json.loads((run / "data" / "manifest.json").read_text())
    man["description"] = "not the manifest the run was trained on"
    (run / "data" / "manifest.json").write_text(json.dumps(man))
    shards_read = []
    real = manifest_mod.Manifest._verify_files  # hashes and reads every shard
    monkeypatch.setattr(manifest_mod.Manifest, "_verify_files", lambda self: shards_read.append(self) or real(self))
    rep = verify_run(run)
    assert any(f.check == "data" and "not the recipe's" in f.message for f in rep.errors), rep.format()
    assert shards_read == []


def test_repeated_shard_entries_are_refused(copy_run):
    folder = copy_run() / "data"
    man = json.loads((folder / "manifest.json").read_text())
    src = man["sources"][0]
    src["shards"].append(dict(src["shards"][0]))
    src["documents"] += src["shards"][0]["documents"]
    src["tokens"] += src["shards"][0]["tokens"]
    (folder / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(DataError, match="listed twice"):
        Manifest.load(folder)


def test_oversized_manifest_is_refused_unparsed(copy_run):
    folder = copy_run() / "data"
    _sparse(folder / "manifest.json", 65 << 20)
    with pytest.raises(DataError, match="larger than"):
        Manifest.load(folder)


def _recipe_edit(run, **model):
    recipe = json.loads((run / "recipe.json").read_text())
    recipe["model"].update(model)
    (run / "recipe.json").write_text(json.dumps(recipe))


ENORMOUS = dict(d_model=8192, n_layers=64, n_heads=64, n_kv_heads=8, head_dim=128, ffn_dim=32768, vocab_size=131072)


@pytest.mark.parametrize("command", ["replay", "resume"])
def test_enormous_model_gets_an_estimate_and_a_refusal(copy_run, command):
    run = copy_run()
    _recipe_edit(run, **ENORMOUS)
    if command == "replay":
        r = lockstep_limited("audit", "replay", run, "--step", "3", "--backend", "spec", "--quiet", memory=LIMIT)
    else:
        r = lockstep_limited("train", "--resume", run, "--steps", "5", "--backend", "spec", "--quiet", memory=LIMIT)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "needs about" in r.stderr and "GiB" in r.stderr and "this machine has" in r.stderr


def test_enormous_batch_is_refused_before_windows_are_cut(copy_run):
    run = copy_run()
    recipe = json.loads((run / "recipe.json").read_text())
    recipe["model"]["seq_len"] = 1 << 20
    recipe["train"]["batch_ramp"] = [[0, 1 << 20]]
    (run / "recipe.json").write_text(json.dumps(recipe))
    r = lockstep_limited("audit", "verify", run, memory=LIMIT)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "GiB of windows" in r.stdout
    assert os.path.getsize(run / "recipe.json") < 4000
