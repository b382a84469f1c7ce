"""Attack class 10 (issue 19, Low 10): damage the audit noted quietly, names with aliases, check-then-open races.

* A replay printed MATCH (with a note) when the published chain before its start
  checkpoint was broken: now the run is invalid, said first and in the verdict.
* ``step-000000002`` (9 digits) was a second checkpoint folder for step 2: only the
  canonical name ``step_dirname(step)`` is a checkpoint.
* Paths were checked (``safe_join``) and opened later: run files are now opened by
  walking from the run directory without following symlinks, so a swap between the
  check and the open is refused; a static check keeps path-based reads out of the
  audit, checkpoint and trainer modules.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest

from forge import read_traj, write_traj
from lockstep import fsio
from lockstep.audit.replay import replay_step
from lockstep.audit.verify import verify_run
from lockstep.cli import main
from lockstep.formats import checkpoint as ckpt

PACKAGE = Path(__file__).resolve().parents[1] / "lockstep"


def test_broken_chain_before_the_start_checkpoint_is_not_a_match(copy_run, capsys):
    run = copy_run()
    recs = read_traj(run)
    recs[0]["state_root"] = hashlib.sha256(b"edited").hexdigest()  # link 1 broken, nothing relinked
    write_traj(run, recs)
    res = replay_step(run, 3, "spec")
    assert res.checks and all(c.match for c in res.checks)  # step 3 itself replays fine from checkpoint 2
    assert not res.ok and any("chain" in p and "step 1" in p for p in res.problems)
    assert main(["audit", "replay", str(run), "--step", "3", "--backend", "spec", "--quiet"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert "RUN INVALID" in out[1] and "step 1" in out[1] and out[-1].startswith("MISMATCH")


def test_no_audit_plan_is_drawn_for_a_broken_chain(copy_run, capsys):
    run = copy_run()
    recs = read_traj(run)
    recs[0]["state_root"] = hashlib.sha256(b"edited").hexdigest()
    write_traj(run, recs)
    keys = [a for i in range(2) for a in ("--pub", hashlib.sha256(b"key %d" % i).hexdigest())]
    assert main(["audit", "plan", str(run), *keys, "--beacon", hashlib.sha256(b"beacon").hexdigest()]) == 1
    assert "chain is broken at step 1" in capsys.readouterr().err


def test_aliases_of_a_checkpoint_folder_name_are_not_checkpoints(copy_run):
    run = copy_run()
    shutil.copytree(run / "checkpoints" / "step-00000002", run / "checkpoints" / "step-000000002")
    shutil.copytree(run / "checkpoints" / "step-00000004", run / "checkpoints" / "step-00000000000000000004")
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [2, 4]
    assert [p.name for _, p in ckpt.list_checkpoints(run)] == ["step-00000002", "step-00000004"]
    rep = verify_run(run, batches=False)
    bad = sorted(Path(f.path).name for f in rep.errors if "alias" in f.message)
    assert bad == ["step-00000000000000000004", "step-000000002"], rep.format()
    with pytest.raises(ckpt.CheckpointError, match="not a checkpoint folder name"):
        ckpt.load_checkpoint(run / "checkpoints" / "step-000000002")
    assert ckpt.step_dirname(123456789) == "step-123456789"  # 9 digits is canonical from 10**8 on


def test_a_file_swapped_for_a_symlink_after_the_check_is_not_read(tmp_path, monkeypatch):
    root = tmp_path / "run"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f").write_bytes(b"inside")
    (tmp_path / "decoy").write_bytes(b"outside")
    real_stat = os.stat

    def stat_then_swap(path, *a, **k):
        st = real_stat(path, *a, **k)
        if path == "f":  # checked: a regular file; now an attacker swaps it
            os.replace(root / "sub" / "f", root / "sub" / "f.old")
            os.symlink(tmp_path / "decoy", root / "sub" / "f")
        return st

    monkeypatch.setattr(fsio.os, "stat", stat_then_swap)
    with pytest.raises(fsio.NotRegularFile, match="symlink"):
        fsio.read_regular(root, "sub/f", "test file")


def test_a_checkpoint_folder_swapped_for_a_symlink_mid_load_is_not_read(copy_run, monkeypatch):
    run = copy_run()
    folder = run / "checkpoints" / "step-00000002"
    decoy = run.parent / "decoy-step-2"
    shutil.copytree(folder, decoy)
    real = ckpt.read_regular

    def read_then_swap(root, rel, *a, **k):
        data = real(root, rel, *a, **k)
        if str(rel).endswith(ckpt.SIDECAR_FILE) and not folder.is_symlink():
            os.replace(folder, run / "checkpoints" / ".moved")
            os.symlink(decoy, folder)
        return data

    monkeypatch.setattr(ckpt, "read_regular", read_then_swap)
    with pytest.raises(ckpt.CheckpointError, match="symlink"):
        ckpt.load_checkpoint(run, 2)


# Reading a file by path after a separate check is the race; run files are read only through
# fsio.open_regular / read_regular (which walk from the run directory without following links).
# ``open(`` is the builtin only: not ``os.open`` (a descriptor, as fsio walks), ``Run.open`` or a ``def open``
_PATH_READS = re.compile(r"\.read_bytes\(|\.read_text\(|(?<![\w.])(?<!def )open\(|\bio\.open\(|np\.load\(|os\.path\.getsize\(|\bread_json\(")


@pytest.mark.parametrize("module", ["audit/verify.py", "audit/replay.py", "audit/replay_outcome.py", "formats/checkpoint.py",
                                    "formats/run.py", "train/trainer.py", "use/run.py"])
def test_run_files_are_never_read_by_path(module):
    lines = (PACKAGE / module).read_text().splitlines()
    offenders = [f"{module}:{i}: {line.strip()}" for i, line in enumerate(lines, 1)
                 if _PATH_READS.search(line.split("#", 1)[0])]
    assert offenders == []


@pytest.mark.parametrize("command", [["check"], ["merge"], ["merge", "PLAN"]])
def test_a_fifo_given_as_a_certificate_or_plan_is_refused_not_waited_on(tmp_path, command):
    from forge import lockstep_limited

    os.mkfifo(tmp_path / "fifo.json")
    args = ["audit", command[0], tmp_path / "fifo.json"]
    if command[1:]:
        (tmp_path / "c.json").write_text("{}")
        args = ["audit", "merge", tmp_path / "c.json", "--plan", tmp_path / "fifo.json", "--beacon", "00" * 32,
                "--pub", "11" * 32, "--redundancy", "1"]
    r = lockstep_limited(*args, timeout=120)
    assert r.returncode in (1, 2) and "FIFO" in r.stdout + r.stderr and "Traceback" not in r.stderr
