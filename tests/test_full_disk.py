"""A full disk while the trainer writes (issue 34): nothing is lost, and the last words say what to do.

Measured before: ``small`` on a 60 MB file system ended in a bare ``OSError: [Errno 28] No
space left on device``. Now the trainer raises ``RunWriteError`` in its own terms (which
file was not written, the checkpoint the run resumes from, the steps trained again) and
``lockstep train`` adds the command that resumes it: one line, exit 1. The run loses
nothing: the unfinished checkpoint leaves no folder, the last complete one stays, and the
run resumed elsewhere ends with the uninterrupted run's trajectory, hash for hash.

The disk fills up two ways: ``ENOSPC`` injected where the bytes are written (the atomic
writer's file, the trajectory's appender: a torn line), in this process; and a real
tmpfs too small for a second checkpoint, where this machine lets the test mount one
(root with mount permission on Linux; skipped with the reason elsewhere).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lockstep import fsio
from lockstep.cli import main
from lockstep.formats import checkpoint as ckpt
from lockstep.formats import trajectory

TINY = ["--preset", "tiny", "--backend", "spec", "--batch", "6", "--micro-batch", "2", "--quiet"]
STEPS = 4  # checkpoints at 2 and 4


def _train(out: Path, corpus: Path) -> list[str]:
    return ["train", *TINY, "--steps", str(STEPS), "--checkpoint-every", "2", "--data", str(corpus), "--out", str(out)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus) -> Path:
    out = tmp_path_factory.mktemp("full-disk") / "uninterrupted"
    assert main(_train(out, corpus)) == 0
    return out


def _no_space() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FillsUp:
    """A file that takes ``room`` bytes, then fails as a full disk does (a short write, then ENOSPC)."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, b) -> int:
        n = memoryview(b).nbytes
        if n > self.room:
            self.f.write(memoryview(b)[: self.room])
            self.room = 0
            raise _no_space()
        self.room -= n
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)


def _fill_atomic_writer(monkeypatch, *needles: str, room: int = 100_000) -> None:
    """The atomic writer's temporary file for a path holding every needle runs out of room after ``room`` bytes."""
    create = fsio._create_exclusive

    def create_filling(path, mode):
        f = create(path, mode)
        return _FillsUp(f, room) if all(n in str(path) for n in needles) else f

    monkeypatch.setattr(fsio, "_create_exclusive", create_filling)


def _fill_trajectory_append(monkeypatch, step: int) -> None:
    """The trajectory's appender writes half of step ``step``'s line (a torn line), then finds the disk full."""
    append = trajectory.append_line

    def append_filling(path, data):
        if path.name == "trajectory.jsonl" and json.loads(data)["step"] == step:
            with open(path, "ab") as f:
                f.write(data[: len(data) // 2])
            raise _no_space()
        return append(path, data)

    monkeypatch.setattr(trajectory, "append_line", append_filling)


def _last_words(err: str) -> str:
    assert "Traceback" not in err and "OSError" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _resumes_elsewhere_to_the_reference(run: Path, somewhere: Path, corpus: Path, reference: Path, capsys) -> None:
    """Nothing was lost: the run, copied elsewhere, resumes (the command it was told) to the uninterrupted run."""
    assert not ckpt.incomplete_checkpoints(run)  # the unfinished checkpoint left no folder behind
    shutil.copytree(run, somewhere)
    assert main(["train", "--resume", str(somewhere), "--data", str(corpus), "--backend", "spec", "--quiet",
                 "--checkpoint-every", "2"]) == 0
    capsys.readouterr()
    assert (somewhere / "trajectory.jsonl").read_bytes() == (reference / "trajectory.jsonl").read_bytes()
    chain = json.loads((reference / "commitment.json").read_text())["chain_hash"]
    assert json.loads((somewhere / "commitment.json").read_text())["chain_hash"] == chain
    assert [s for s, _ in ckpt.list_checkpoints(somewhere)] == [2, 4]


# (where the disk fills up, what was not written, the checkpoints left, where the run resumes and what is redone)
CASES = {
    "checkpoint": (lambda mp: _fill_atomic_writer(mp, "step-00000004", "state.safetensors"),
                   "checkpoint 4 was not written (No space left on device)", [2],
                   "resumes from checkpoint 2; steps 3..4 are trained again, to the same bits"),
    "record": (lambda mp: _fill_trajectory_append(mp, 3), "the record of step 3 was not written", [2],
               "resumes from checkpoint 2; step 3 is trained again, to the same bits"),
    "commitment": (lambda mp: _fill_atomic_writer(mp, "commitment.json", room=10),
                   "commitment.json was not written", [2, 4], "resumes from checkpoint 4"),
}


@pytest.mark.parametrize("where", sorted(CASES))
def test_a_full_disk_is_said_in_one_line_and_loses_nothing(tmp_path, corpus, reference, monkeypatch, capsys, where):
    fill, unwritten, left, resumes = CASES[where]
    run = tmp_path / "run"
    with monkeypatch.context() as mp:
        fill(mp)
        assert main(_train(run, corpus)) == 1
    said = _last_words(capsys.readouterr().err)
    assert said.startswith(f"lockstep train: {run}: {unwritten}"), said
    assert "nothing published is lost" in said and "once there is room on its file system" in said
    assert resumes in said, said
    assert said.endswith(f"; resume with: lockstep train --resume {run} --data {corpus}"), said
    assert [s for s, _ in ckpt.list_checkpoints(run)] == left
    _resumes_elsewhere_to_the_reference(run, tmp_path / "elsewhere", corpus, reference, capsys)


@pytest.fixture
def small_tmpfs(tmp_path) -> Path:
    """A tmpfs with room for one tiny checkpoint and a half (640 KiB; a checkpoint is about 440 kB)."""
    if not sys.platform.startswith("linux") or shutil.which("mount") is None:
        pytest.skip("a real small file system needs Linux's mount (the injected ENOSPC tests run everywhere)")
    where = tmp_path / "tmpfs"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=640k,mode=0755", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root with mount permission needed): {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_a_real_full_file_system_at_the_second_checkpoint(small_tmpfs, tmp_path, corpus, reference, capsys):
    run = small_tmpfs / "run"
    assert main(_train(run, corpus)) == 1
    said = _last_words(capsys.readouterr().err)
    assert "checkpoint 4 was not written (No space left on device)" in said, said
    assert "resumes from checkpoint 2; steps 3..4 are trained again" in said, said
    assert said.endswith(f"; resume with: lockstep train --resume {run} --data {corpus}"), said
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [2]
    _resumes_elsewhere_to_the_reference(run, tmp_path / "elsewhere", corpus, reference, capsys)
