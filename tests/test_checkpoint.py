"""Atomic files, our safetensors reader/writer, and checkpoints that never half-exist.

This file is also the worker of the crash test: ``python test_checkpoint.py save-and-die RUN N``.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lockstep.fsio import FileFormatError, UnsafePath, atomic_write_json, atomic_write_text, read_json, safe_join
from lockstep.fsio.safetensors import SafetensorsError, read_safetensors, write_safetensors
from lockstep.spec.hashing import state_root
from lockstep.formats.checkpoint import (
    CheckpointError,
    incomplete_checkpoints,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    remove_temporary_checkpoints,
    save_checkpoint,
)


def _tensors(seed: int = 0) -> dict[str, np.ndarray]:
    g = np.arange(1000, dtype=np.float32) * np.float32(0.25) + np.float32(seed)  # exact values
    return {
        "model.w": g.reshape(10, 100),
        "model.b": g[:7].copy(),
        "adam.m.w": (g.reshape(10, 100) * np.float32(-0.5)).astype(np.float32),
        "step": np.array(seed, dtype=np.int64),
        "tokens": np.arange(5, dtype=np.int32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "bytes": np.arange(9, dtype=np.uint8).reshape(3, 3),
        "f64": np.linspace(0, 1, 4),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "u32": np.array([0, 2**32 - 1], dtype=np.uint32),
    }


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(
        a[k].dtype.newbyteorder("<") == b[k].dtype.newbyteorder("<") and a[k].shape == b[k].shape
        and a[k].tobytes() == np.ascontiguousarray(b[k], dtype=a[k].dtype).tobytes()
        for k in a
    )


# ---------------------------------------------------------------------------
# fsio
# ---------------------------------------------------------------------------


def test_atomic_writes_and_read_json(tmp_path):
    p = tmp_path / "a.json"
    atomic_write_json(p, {"b": 1, "a": [1, 2]})
    assert read_json(p, "test record") == {"a": [1, 2], "b": 1}
    atomic_write_text(p, '{"a": 1,}')
    with pytest.raises(FileFormatError, match=r"malformed test record .*a\.json.*line 1"):
        read_json(p, "test record")
    atomic_write_text(p, '{"a": 1, "a": 2}')
    with pytest.raises(FileFormatError, match="duplicate key 'a'"):
        read_json(p, "test record")
    atomic_write_text(p, '{"a": NaN}')
    with pytest.raises(FileFormatError, match="NaN"):
        read_json(p, "test record")
    with pytest.raises(FileNotFoundError, match="test record not found"):
        read_json(tmp_path / "missing.json", "test record")
    assert sorted(os.listdir(tmp_path)) == ["a.json"]  # no temporary files left behind
    with pytest.raises(TypeError):
        atomic_write_json(tmp_path / "b.json", {"x": object()})
    assert sorted(os.listdir(tmp_path)) == ["a.json"]


def test_safe_join(tmp_path):
    root = tmp_path / "run"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    assert safe_join(root, "sub/x.json") == root / "sub" / "x.json"
    assert safe_join(root, "./sub/./x") == root / "sub" / "x"
    for bad in ["/etc/passwd", "../x", "sub/../../x", "sub/..", "", "a\\b", "C:/x", "a\x00b"]:
        with pytest.raises(UnsafePath):
            safe_join(root, bad)
    os.symlink(tmp_path / "outside", root / "escape")
    os.symlink(root / "sub", root / "inside")
    with pytest.raises(UnsafePath, match="escape.*outside"):
        safe_join(root, "escape/file")
    assert safe_join(root, "inside/file") == root / "inside" / "file"


def test_safetensors_round_trip(tmp_path):
    t = _tensors(3)
    t["big_endian"] = np.arange(4, dtype=">f4")
    p = tmp_path / "x.safetensors"
    write_safetensors(p, t, {"k": "v"})
    got, meta = read_safetensors(p)
    assert meta == {"k": "v"} and _same(t, got)
    assert got["big_endian"].dtype == np.dtype("<f4")
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0  # data 8-byte aligned, like the reference writer
    with pytest.raises(TypeError, match="float16"):
        write_safetensors(tmp_path / "y.safetensors", {"h": np.zeros(2, np.float16)})
    assert not (tmp_path / "y.safetensors").exists()


def _write_raw(path: Path, header: dict, data: bytes) -> None:
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)


@pytest.mark.parametrize(
    "header,data,match",
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "run past"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 12, "trailing"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "needs 12"),
        ({"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8, "not one of"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, "overlap"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "gap"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", "non-negative"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, b"\0" * 8, "begin <= end"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}}, b"\0" * 4, "exactly the keys"),
        ({"__metadata__": {"a": 1}}, b"", "strings to strings"),
    ],
)
def test_safetensors_rejects_lies(tmp_path, header, data, match):
    p = tmp_path / "bad.safetensors"
    _write_raw(p, header, data)
    with pytest.raises(SafetensorsError, match=match) as exc:
        read_safetensors(p)
    assert "bad.safetensors" in str(exc.value)


def test_safetensors_rejects_bad_framing(tmp_path):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(SafetensorsError, match="too short"):
        read_safetensors(p)
    p.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(SafetensorsError, match="exceeds"):
        read_safetensors(p)
    p.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(SafetensorsError, match="truncated"):
        read_safetensors(p)
    p.write_bytes(struct.pack("<Q", 4) + b"[1] ")
    with pytest.raises(SafetensorsError, match="not a JSON object"):
        read_safetensors(p)
    p.write_bytes(struct.pack("<Q", 3) + b"{x}")
    with pytest.raises(SafetensorsError, match="malformed"):
        read_safetensors(p)


def test_safetensors_interoperates_with_the_reference_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    t = {k: v for k, v in _tensors(1).items()}
    ours = tmp_path / "ours.safetensors"
    write_safetensors(ours, t, {"m": "1"})
    assert _same(t, st.load_file(str(ours)))
    theirs = tmp_path / "theirs.safetensors"
    st.save_file(t, str(theirs), metadata={"m": "2"})
    got, meta = read_safetensors(theirs)
    assert meta == {"m": "2"} and _same(t, got)


# ---------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------


def test_checkpoint_round_trip(tmp_path):
    t = _tensors(5)
    path = save_checkpoint(tmp_path, 12, t, {"chain_hash": "ab" * 32, "stream": {"window": 96}})
    assert path == tmp_path / "checkpoints" / "step-00000012"
    assert sorted(os.listdir(path)) == ["COMPLETE", "sidecar.json", "state.safetensors"]
    ck = load_checkpoint(tmp_path)
    assert ck.step == 12 and _same(t, ck.tensors) and ck.path == path
    assert ck.sidecar["state_root"] == state_root(t) and ck.sidecar["format"] == 1
    assert ck.sidecar["stream"] == {"window": 96} and ck.sidecar["step"] == 12
    assert load_checkpoint(path).step == 12 and load_checkpoint(tmp_path, step=12).step == 12
    save_checkpoint(tmp_path, 20, _tensors(6))
    assert [s for s, _ in list_checkpoints(tmp_path)] == [12, 20]
    assert latest_checkpoint(tmp_path)[0] == 20
    assert latest_checkpoint(tmp_path, before_step=20)[0] == 12
    assert latest_checkpoint(tmp_path, before_step=12) is None
    assert save_checkpoint(tmp_path, 12, t) == path  # same state again: idempotent
    with pytest.raises(CheckpointError, match="already exists"):
        save_checkpoint(tmp_path, 12, _tensors(7))
    with pytest.raises(ValueError, match="set by save_checkpoint"):
        save_checkpoint(tmp_path, 13, t, {"step": 14})
    with pytest.raises(CheckpointError, match="no checkpoint of step 99"):
        load_checkpoint(tmp_path, step=99)
    assert incomplete_checkpoints(tmp_path) == []


def _flip_bit_in(path: Path, tensor: str) -> None:
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    begin, _ = json.loads(raw[8 : 8 + n])[tensor]["data_offsets"]
    raw[8 + n + begin + 3] ^= 0x10
    path.write_bytes(bytes(raw))


def test_flipped_bit_names_the_tensor(tmp_path):
    path = save_checkpoint(tmp_path, 1, _tensors())
    _flip_bit_in(path / "state.safetensors", "model.b")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]  # the marker is fine; the load checks data
    with pytest.raises(CheckpointError, match=r"state\.safetensors: tensor 'model\.b' does not match") as exc:
        load_checkpoint(tmp_path)
    assert "step-00000001" in str(exc.value) and "earlier" in str(exc.value)


def test_truncated_file(tmp_path):
    path = save_checkpoint(tmp_path, 1, _tensors())
    f = path / "state.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="state.safetensors.*truncated"):
        load_checkpoint(tmp_path)


def test_header_lying_about_offsets(tmp_path):
    path = save_checkpoint(tmp_path, 1, _tensors())
    f = path / "state.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header["model.b"]["data_offsets"][0] -= 4  # overlaps its neighbour, sizes no longer agree
    body = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])
    with pytest.raises(CheckpointError, match="tensor 'model.b'.*data_offsets"):
        load_checkpoint(tmp_path)


def test_sidecar_edits_are_caught(tmp_path):
    path = save_checkpoint(tmp_path, 1, _tensors())
    side = path / "sidecar.json"
    record = json.loads(side.read_text())
    record["state_root"] = "00" * 32
    side.write_text(json.dumps(record))
    assert list_checkpoints(tmp_path) == []  # COMPLETE no longer matches the sidecar
    with pytest.raises(CheckpointError, match="COMPLETE holds"):
        load_checkpoint(path)


def test_folder_without_complete_is_ignored(tmp_path):
    save_checkpoint(tmp_path, 1, _tensors(1))
    path = save_checkpoint(tmp_path, 2, _tensors(2))
    (path / "COMPLETE").unlink()
    (tmp_path / "checkpoints" / ".tmp-step-00000003-1-abcd").mkdir()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert load_checkpoint(tmp_path).step == 1
    reasons = {p.name: why for p, why in incomplete_checkpoints(tmp_path)}
    assert "no COMPLETE marker" in reasons["step-00000002"] and "did not finish" in reasons[".tmp-step-00000003-1-abcd"]
    with pytest.raises(CheckpointError, match="not complete: no COMPLETE"):
        load_checkpoint(tmp_path, step=2)
    assert [p.name for p in remove_temporary_checkpoints(tmp_path)] == [".tmp-step-00000003-1-abcd"]
    save_checkpoint(tmp_path, 2, _tensors(2))  # an incomplete folder under the final name is replaced
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]


def test_symlinked_state_file_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "run", 1, _tensors())
    outside = tmp_path / "elsewhere.safetensors"
    os.replace(path / "state.safetensors", outside)
    os.symlink(outside, path / "state.safetensors")
    with pytest.raises(CheckpointError, match="state.safetensors is a symlink, not a regular file"):
        load_checkpoint(path)


# The crash test: a child process saves checkpoint 1, then SIGKILLs itself at the Nth
# file-system call of the save of checkpoint 2 (every write, fsync, replace and rename the
# save makes, learned from the child itself, so the kills follow the code as it changes).
SAVE_CALLS = ("os:fsync", "os:replace", "os:rename", "lockstep.formats.checkpoint:_HashingFile.write")
REPO_ROOT = Path(__file__).resolve().parents[1]


def _crash_tensors(step: int) -> dict:
    w = np.arange(1 << 16, dtype=np.float32) + step  # several writes per state file
    return {"w": w, "m": w[::-1].copy(), "step": np.array(step)}


def _save_and_die(run_dir: str, kill_at: int) -> None:
    """Save checkpoint 1; during the save of checkpoint 2 record the calls (kill_at 0) or die at call kill_at."""
    import importlib

    save_checkpoint(run_dir, 1, _crash_tensors(1), {"chain_hash": "01" * 32})
    calls = []
    for target in SAVE_CALLS:
        module_name, path = target.split(":")
        owner = importlib.import_module(module_name)
        *outer, attr = path.split(".")
        for name in outer:
            owner = getattr(owner, name)
        real = getattr(owner, attr)

        def wrapped(*args, _real=real, _name=target, **kwargs):
            calls.append(_name)
            if len(calls) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return _real(*args, **kwargs)

        setattr(owner, attr, wrapped)
    save_checkpoint(run_dir, 2, _crash_tensors(2), {"chain_hash": "02" * 32})
    print(json.dumps(calls))


def _crash_child(run: Path, kill_at: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.abspath(__file__), "save-and-die", str(run), str(kill_at)],
                          capture_output=True, text=True, timeout=600,  # a guard against a hang only
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))


def test_sigkill_at_every_call_of_a_save_never_leaves_a_bad_checkpoint(tmp_path):
    counted = _crash_child(tmp_path / "count", 0)
    assert counted.returncode == 0, counted.stderr
    calls = json.loads(counted.stdout)
    assert {"os:rename", "lockstep.formats.checkpoint:_HashingFile.write"} <= set(calls), calls
    renamed_at = len(calls) - calls[::-1].index("os:rename")  # 1-based: the rename that publishes step 2
    for kill_at in range(1, len(calls) + 1):
        run = tmp_path / f"kill-{kill_at}"
        r = _crash_child(run, kill_at)
        where = f"killed at call {kill_at} of {len(calls)} ({calls[kill_at - 1]})"
        assert r.returncode == -signal.SIGKILL, f"{where}: not killed\n{r.stderr}"
        listed = [s for s, _ in list_checkpoints(run)]
        assert listed == ([1, 2] if kill_at > renamed_at else [1]), where
        for step, path in list_checkpoints(run):
            assert load_checkpoint(path).step == step, where
        temporary = [p for p, _ in incomplete_checkpoints(run) if p.name.startswith(".tmp-")]
        assert bool(temporary) == (kill_at <= renamed_at), where  # an unfinished save is a .tmp- folder
        remove_temporary_checkpoints(run)
        assert not incomplete_checkpoints(run), where
        save_checkpoint(run, 2, _crash_tensors(2), {"chain_hash": "02" * 32})  # the save can be redone
        assert load_checkpoint(run).step == 2, where


if __name__ == "__main__":
    if sys.argv[1] == "save-and-die":
        _save_and_die(sys.argv[2], int(sys.argv[3]))
