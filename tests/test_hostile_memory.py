"""Attack class 5 (issue 19, Medium 5): tiny inputs that ask for huge allocations.

A 1.5 kB certificate or a 400-byte plan saying ``last_step = 10**10``, or a
checkpoint folder named with a 20-digit step, must be refused or handled in memory
bounded by what the run itself holds (or a stated maximum), never allocate until
killed. Each command runs in a child with a 3 GiB address-space limit.
"""

from __future__ import annotations

import hashlib
import json

from forge import lockstep_limited
from lockstep.audit.certificate import make_certificate, write_certificate
from lockstep.audit import plan as plan_mod
from lockstep.audit.replay import replay_step

HUGE = 10**10


def test_certificate_with_a_huge_last_step_is_merged_sparsely(honest_run, tmp_path):
    cert = make_certificate(replay_step(honest_run, 1, "spec"), auditor="a")
    cert["run"]["last_step"] = HUGE
    write_certificate(tmp_path / "c.json", cert)
    assert (tmp_path / "c.json").stat().st_size < 4000
    r = lockstep_limited("audit", "merge", tmp_path / "c.json", "--png", tmp_path / "c.png")
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"coverage 1/{HUGE} step(s); missing 2-{HUGE}" in r.stdout
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_empty_certificate_with_a_step_count_no_float_holds_is_refused_not_a_plot_crash(honest_run, tmp_path,
                                                                                            capsys):
    """Issue 23, item 17: an empty, consistent, unsigned certificate saying ``last_step = 10**400`` made
    ``audit merge --png`` raise OverflowError (int to float). Step numbers beyond 2**53 are refused at load."""
    from lockstep.audit import certificate as cert_mod
    from lockstep.cli import main

    cert = make_certificate(replay_step(honest_run, 1, "spec"), auditor="a")
    cert["targets"], cert["steps"] = [], []
    cert["run"]["last_step"] = 10**400
    assert cert_mod.consistency_problems(cert) == []  # nothing else is wrong with it
    write_certificate(tmp_path / "c.json", cert)
    assert main(["audit", "merge", str(tmp_path / "c.json"), "--png", str(tmp_path / "c.png")]) == 2
    out = capsys.readouterr().out
    assert "rejected" in out and f"at most {2**53}" in out
    MAX_STEP_NUMBER = cert_mod.MAX_STEP_NUMBER
    cert["run"]["last_step"] = MAX_STEP_NUMBER  # the largest step count a certificate may name still plots
    write_certificate(tmp_path / "c.json", cert)
    assert main(["audit", "merge", str(tmp_path / "c.json"), "--png", str(tmp_path / "c.png")]) == 2
    assert f"coverage 0/{MAX_STEP_NUMBER} step(s); missing 1-{MAX_STEP_NUMBER}" in capsys.readouterr().out
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_plan_with_a_huge_last_step_is_refused(tmp_path):
    commitment = {"chain_hash": hashlib.sha256(b"x").hexdigest(), "last_step": HUGE}
    (tmp_path / "commitment.json").write_text(json.dumps(commitment))
    key, beacon = hashlib.sha256(b"key").hexdigest(), hashlib.sha256(b"beacon").hexdigest()
    r = lockstep_limited("audit", "plan", tmp_path / "commitment.json", "--pub", key, "--beacon", beacon)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"at most {plan_mod.MAX_PLAN_STEPS}" in r.stderr

    plan = {"format": "lockstep.audit-plan", "version": plan_mod.PLAN_VERSION, "commitment": commitment["chain_hash"],
            "last_step": HUGE, "redundancy": 1, "purpose": "lockstep.audit.plan", "beacon": beacon,
            "auditors": [{"index": 0, "name": "a", "public_key": key, "steps": [1]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    assert len((tmp_path / "plan.json").read_bytes()) < 500
    (tmp_path / "c.json").write_text("{}")
    r = lockstep_limited("audit", "merge", tmp_path / "c.json", "--plan", tmp_path / "plan.json", "--beacon", beacon,
                         "--pub", key, "--redundancy", "1")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"at most {plan_mod.MAX_PLAN_STEPS}" in r.stderr


def test_checkpoint_named_with_a_20_digit_step(copy_run):
    run = copy_run()
    folder = run / "checkpoints" / ("step-1" + "0" * 19)
    folder.mkdir()
    (folder / "sidecar.json").write_bytes(b"{}")
    (folder / "COMPLETE").write_text(hashlib.sha256(b"{}").hexdigest())
    r = lockstep_limited("audit", "verify", run)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "step-10000000000000000000" in r.stdout and "INVALID" in r.stdout
    r = lockstep_limited("audit", "replay", run, "--step", "4", "--backend", "spec", "--quiet")
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr, r.stderr[-2000:]
