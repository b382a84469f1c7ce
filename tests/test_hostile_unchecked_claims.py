"""Attack class 3 (issue 19, High 3): a certificate that claims steps its replay never covered.

An auditor replays step 3 (from checkpoint 2) and adds claims for steps 1, 2 and 4,
copying the published hashes. ``audit check --recompute`` must recompute every
claimed step or refuse the certificate, and ``merge`` must count only steps a replay
of the certificate's targets can have covered.
"""

from __future__ import annotations

import copy

import pytest

from forge import read_traj, relink
from lockstep.audit.certificate import (consistency_problems, make_certificate, recheck_certificate,
                                        write_certificate)
from lockstep.audit.merge import merge_certificates
from lockstep.audit.replay import replay_step
from lockstep.cli import main

COMPARED = ("state_root", "chain_hash", "batch_digest", "loss_bits", "grad_norm_bits", "lr_bits")


@pytest.fixture(scope="module")
def step3_certificate(honest_run):
    cert = make_certificate(replay_step(honest_run, 3, "spec"), auditor="a")
    assert [s["step"] for s in cert["steps"]] == [3] and cert["steps"][0]["start"] == 2
    return cert


@pytest.fixture(scope="module")
def forged_step4(honest_run, tmp_path_factory):
    """The honest run with step 4's published state root forged (chain, commitment, sidecar redone)."""
    import hashlib
    import shutil

    run = tmp_path_factory.mktemp("forged-step4") / "run"
    shutil.copytree(honest_run, run)
    recs = read_traj(run)
    recs[3]["state_root"] = hashlib.sha256(b"forged").hexdigest()
    relink(run, recs, 4)
    return run


def _claim(cert: dict, run, steps: list[int], start: int) -> dict:
    """``cert`` with extra step entries that copy the published record (no replay behind them)."""
    out = copy.deepcopy(cert)
    traj = read_traj(run)
    for s in steps:
        pub = {k: traj[s - 1][k] for k in COMPARED}
        out["steps"].append({"step": s, "start": start, "match": True, "replayed": dict(pub), "published": pub,
                             "differs": []})
    out["steps"].sort(key=lambda e: e["step"])
    return out


def test_check_recompute_refuses_claims_beyond_what_it_recomputed(forged_step4, tmp_path, capsys):
    # an honest replay of step 3, padded with a claim for the forged step 4 copied from the trajectory
    cert = make_certificate(replay_step(forged_step4, 3, "spec"), auditor="a")
    assert cert["outcome"] == "match"
    padded = _claim(cert, forged_step4, [4], start=2)
    problems = recheck_certificate(padded, forged_step4, "spec")
    assert any(p.startswith("step 4:") and "did not reproduce" in p for p in problems), problems
    write_certificate(tmp_path / "padded.json", padded)
    assert main(["audit", "check", str(tmp_path / "padded.json"), "--run", str(forged_step4), "--recompute",
                 "--backend", "spec"]) == 2
    out = capsys.readouterr().out
    assert "ok (recomputed)" not in out and "REJECTED" in out


def test_check_recompute_replays_every_claimed_step(honest_run, step3_certificate, monkeypatch):
    # a certificate that honestly replayed 1..3 from the initial state is recomputed step by step
    from lockstep.audit import replay as replay_mod

    asked = []
    real = replay_mod.replay_steps
    monkeypatch.setattr(replay_mod, "replay_steps", lambda run, steps, *a, **k: asked.append(sorted(steps))
                        or real(run, steps, *a, **k))
    full = make_certificate(replay_mod.replay_steps(honest_run, [1, 2, 3], "spec"), auditor="a")
    asked.clear()
    assert recheck_certificate(full, honest_run, "spec") == []
    assert asked == [[1, 2, 3]]
    # one claimed hash changed: the recomputation of that very step catches it
    bad = copy.deepcopy(full)
    bad["steps"][0]["replayed"]["state_root"] = "ab" * 32
    bad["steps"][0]["published"]["state_root"] = "ab" * 32
    assert any(p.startswith("step 1:") for p in recheck_certificate(bad, honest_run, "spec"))


def test_merge_does_not_count_steps_no_replay_of_the_targets_covers(forged_step4, tmp_path):
    cert = make_certificate(replay_step(forged_step4, 3, "spec"), auditor="a")
    padded = _claim(cert, forged_step4, [4], start=2)
    assert any("step 4" in p for p in consistency_problems(padded))
    write_certificate(tmp_path / "padded.json", padded)
    report = merge_certificates([tmp_path / "padded.json"])
    assert report.steps.get(4) is None or report.steps[4].count == 0
    assert report.rejected and not report.ok


@pytest.mark.parametrize("steps, start, why", [
    ([1, 2], 1, "start"),          # step 1 cannot start from checkpoint 1
    ([1], 0, "step 2"),            # a replay from the initial state to step 3 passes through step 2
])
def test_claims_that_do_not_form_a_replay_are_inconsistent(honest_run, step3_certificate, steps, start, why):
    padded = _claim(step3_certificate, honest_run, steps, start=start)
    assert any(why in p for p in consistency_problems(padded)), consistency_problems(padded)
