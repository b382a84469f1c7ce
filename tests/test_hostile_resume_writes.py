"""Attack class 1 (issue 19, High 1): a run directory that makes `train --resume` write or hang.

A stranger's run is resumed here. Planted symlinks must not make lockstep write
outside the run; FIFOs and devices must be refused, not read; every write in the
package goes through ``lockstep.fsio``'s one atomic, exclusive-create writer (or its
checked appender). The decoys are files this test owns; each check compares bytes.
"""

from __future__ import annotations

import os
import re
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lockstep.fsio import NotRegularFile, append_line, atomic_write_bytes, read_regular

LOCKSTEP = [sys.executable, "-m", "lockstep.cli"]
DECOY = b"decoy: must never change\n"
PACKAGE = Path(__file__).resolve().parents[1] / "lockstep"


def _decoy(tmp_path: Path, name: str = "decoy.txt") -> Path:
    p = tmp_path / name
    p.write_bytes(DECOY)
    return p


def _resume_in_process(run: Path, steps: int = 5):
    from lockstep.train.trainer import train
    from lockstep.use.hooks import run_hooks

    return train(run, resume=True, steps=steps, backend_name="spec", checkpoint_every=2, progress=False,
                 log=lambda *a, **k: None, hooks=run_hooks())  # with the CLI's hooks: the loss plot is written


def _limit_memory():
    # a guard for the machine, not part of what is tested: reading a device must not take it down
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def _resume_cli(run: Path, steps: int = 5) -> subprocess.CompletedProcess:
    """``lockstep train --resume``; the timeout only stops a hang from hanging the suite."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return subprocess.run([*LOCKSTEP, "train", "--resume", str(run), "--steps", str(steps), "--backend", "spec",
                           "--quiet", "--checkpoint-every", "2"], capture_output=True, text=True, timeout=300,
                          env=env, preexec_fn=_limit_memory)


def test_planted_temp_symlink_for_the_loss_plot_is_not_followed(copy_run, tmp_path):
    pytest.importorskip("matplotlib")
    run = copy_run()
    decoy = _decoy(tmp_path)
    os.symlink(decoy, run / ".loss.png.tmp")
    _resume_in_process(run)
    assert decoy.read_bytes() == DECOY
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    run2 = copy_run()
    target = tmp_path / "created-by-lockstep.png"
    os.symlink(target, run2 / ".loss.png.tmp")  # dangling: it would create the file
    _resume_in_process(run2)
    assert not target.exists()


@pytest.mark.parametrize("dangling", [False, True])
def test_metrics_symlink_is_refused_before_any_step(copy_run, tmp_path, dangling):
    run = copy_run()
    target = tmp_path / "created.jsonl" if dangling else _decoy(tmp_path)
    (run / "metrics.jsonl").unlink()
    os.symlink(target, run / "metrics.jsonl")
    trajectory = (run / "trajectory.jsonl").read_bytes()
    with pytest.raises(NotRegularFile, match="metrics.jsonl.*symlink"):
        _resume_in_process(run)
    assert (run / "trajectory.jsonl").read_bytes() == trajectory  # refused before anything was trained
    if dangling:
        assert not target.exists()
    else:
        assert target.read_bytes() == DECOY


@pytest.mark.parametrize("name", ["recipe.json", "trajectory.jsonl", "metrics.jsonl"])
def test_fifo_is_refused_not_waited_on(copy_run, name):
    run = copy_run()
    (run / name).unlink()
    os.mkfifo(run / name)
    r = _resume_cli(run)
    assert r.returncode == 1, r.stderr[-2000:]
    assert name in r.stderr and "FIFO" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="making a character device needs root")
def test_character_device_as_trajectory_is_refused(copy_run):
    run = copy_run()
    (run / "trajectory.jsonl").unlink()
    os.mknod(run / "trajectory.jsonl", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # what /dev/zero is
    r = _resume_cli(run)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "trajectory.jsonl" in r.stderr and "character device" in r.stderr


def test_merge_png_has_no_fixed_temporary_name(honest_run, tmp_path):
    pytest.importorskip("matplotlib")
    from lockstep.audit.certificate import make_certificate, write_certificate
    from lockstep.audit.replay import replay_step
    from lockstep.cli import main

    write_certificate(tmp_path / "c.json", make_certificate(replay_step(honest_run, 1, "spec"), auditor="a"))
    decoy = _decoy(tmp_path)
    os.symlink(decoy, tmp_path / ".cov.png.tmp")
    main(["audit", "merge", str(tmp_path / "c.json"), "--png", str(tmp_path / "cov.png")])
    assert decoy.read_bytes() == DECOY
    assert (tmp_path / "cov.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fsio_reader_and_appender_refuse_what_is_not_a_regular_file(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "ok").write_bytes(b"12345")
    assert read_regular(root, "ok", "test file", max_bytes=5) == b"12345"
    with pytest.raises(ValueError, match="larger than 4 bytes"):
        read_regular(root, "ok", "test file", max_bytes=4)
    decoy = _decoy(tmp_path)
    os.symlink(decoy, root / "link")
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    os.symlink(root / "dir", root / "dirlink")
    (root / "dir" / "f").write_bytes(b"x")
    for name, why in [("link", "symlink"), ("fifo", "FIFO"), ("dir", "directory"), ("dirlink/f", "symlink")]:
        with pytest.raises(NotRegularFile, match=why):
            read_regular(root, name, "test file", max_bytes=100)
        if "/" not in name:  # appends go to a file directly inside the run
            with pytest.raises(NotRegularFile, match=why):
                append_line(root / name, b"x\n")
    assert decoy.read_bytes() == DECOY and (root / "dir" / "f").read_bytes() == b"x"
    append_line(root / "new.jsonl", b"a\n")
    append_line(root / "new.jsonl", b"b\n")
    assert (root / "new.jsonl").read_bytes() == b"a\nb\n"


def test_atomic_writer_replaces_a_planted_symlink_instead_of_writing_through_it(tmp_path):
    decoy = _decoy(tmp_path)
    os.symlink(decoy, tmp_path / "out.json")
    atomic_write_bytes(tmp_path / "out.json", b"{}\n")
    assert decoy.read_bytes() == DECOY
    assert not (tmp_path / "out.json").is_symlink() and (tmp_path / "out.json").read_bytes() == b"{}\n"


# Calls that write a file, outside lockstep/fsio/ (``savefig(buf`` renders into memory; ``mkdtemp`` folders are
# random and exclusive). Every write in the package goes
# through fsio (atomic, exclusive-create, unpredictable temporary names, or the checked
# appender), so a new fixed temporary name cannot slip in unnoticed.
_WRITE_CALLS = re.compile(r"""\.write_bytes\(|\.write_text\(|\.savefig\((?!buf\b)|np\.save\(|mkstemp|"""
                          r"""\bopen\([^)]*["'][rwax]*[wax][b+t]*["']|fdopen\(|O_CREAT|os\.replace\(""")


def test_every_write_in_the_package_goes_through_fsio():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "fsio" and path.parent.parent == PACKAGE:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _WRITE_CALLS.search(code):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{i}: {line.strip()}")
    assert offenders == []
