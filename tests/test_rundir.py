"""The run directory's format has one home (``lockstep.formats.rundir``): one trajectory reader with an
explicit strictness, shared by the trainer, resume, ``audit verify`` and replay; the audit reads a run
without the training loop's module."""

import hashlib
import json
import subprocess
import sys

import pytest

from lockstep.formats.rundir import TRAJECTORY_FILE, RunFileError
from lockstep.formats.trajectory import Strictness, read_trajectory, record_line, write_trajectory


def _record(step: int, prev: str) -> dict:
    from lockstep.spec import hashing

    rec = {"step": step, "tokens": 100 * step, "lr": 0.5, "loss": 2.0, "grad_norm": 1.0,
           "lr_bits": "0x3F000000", "loss_bits": "0x40000000", "grad_norm_bits": "0x3F800000",
           "state_root": hashlib.sha256(b"root %d" % step).hexdigest(),
           "batch_digest": hashlib.sha256(b"batch %d" % step).hexdigest()}
    rec["chain_hash"] = hashing.record_chain_hash(prev, rec)
    return rec


@pytest.fixture
def run(tmp_path):
    h = "00" * 32
    recs = []
    for step in (1, 2, 3):
        recs.append(_record(step, h))
        h = recs[-1]["chain_hash"]
    write_trajectory(tmp_path, recs)
    return tmp_path, recs


def test_written_records_read_back_under_both_strictnesses(run):
    run_dir, recs = run
    assert (run_dir / TRAJECTORY_FILE).read_bytes() == b"".join(record_line(r) for r in recs)
    assert read_trajectory(run_dir, Strictness.AUDIT) == recs
    assert read_trajectory(run_dir, Strictness.LIVE) == recs


def test_a_torn_last_line_is_dropped_live_and_refused_in_an_audit(run):
    run_dir, recs = run
    with open(run_dir / TRAJECTORY_FILE, "ab") as f:
        f.write(json.dumps(_record(4, recs[-1]["chain_hash"]), sort_keys=True).encode()[:50])  # a crash mid-append
    assert read_trajectory(run_dir, Strictness.LIVE) == recs
    with pytest.raises(RunFileError, match="torn last line"):
        read_trajectory(run_dir, Strictness.AUDIT)


def test_a_missing_trajectory_is_no_step_live_and_an_error_in_an_audit(tmp_path):
    assert read_trajectory(tmp_path, Strictness.LIVE) == []
    with pytest.raises(RunFileError, match="missing"):
        read_trajectory(tmp_path, Strictness.AUDIT)


def test_damage_inside_the_file_is_refused_under_both(run):
    run_dir, recs = run
    lines = (run_dir / TRAJECTORY_FILE).read_bytes().splitlines(keepends=True)
    (run_dir / TRAJECTORY_FILE).write_bytes(lines[0] + lines[2])  # step 2 missing
    for strictness in Strictness:
        with pytest.raises(RunFileError, match="step 3 where step 2 was expected"):
            read_trajectory(run_dir, strictness)


def test_the_strictness_is_always_named(run):
    run_dir, _ = run
    with pytest.raises(TypeError):
        read_trajectory(run_dir)  # noqa - no default: every caller says how strict it reads
    with pytest.raises(TypeError, match="Strictness"):
        read_trajectory(run_dir, True)


def test_the_audit_reads_a_run_without_the_training_loop():
    code = ("import sys\n"
            "import lockstep.audit.verify, lockstep.audit.replay, lockstep.audit.plan, lockstep.audit.certificate\n"
            "import lockstep.audit.accept, lockstep.audit.merge\n"
            "print('lockstep.train.trainer' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
