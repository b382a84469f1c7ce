"""Attack class 2 (issue 19, High 2): a checkpoint that lies about where the data stream continues.

The trainer rewrites the ``stream_state`` of checkpoint 2 (and its COMPLETE marker)
and trains steps 3-4 on windows 7486.. instead of the recipe's 12..; every hash is
redone, so only the data position is wrong. Every audit path (replay, check
--recompute, merge) and resume must derive the position from the recipe, the
manifest and the step plan, and call the run invalid, without anyone running
``audit verify`` first.
"""

from __future__ import annotations

import pytest

from forge import read_traj, train_on_other_windows
from lockstep.audit.certificate import make_certificate, recheck_certificate, write_certificate
from lockstep.audit.merge import merge_certificates
from lockstep.audit.replay import ReplayResult, StepCheck, replay_step
from lockstep.audit.verify import verify_run
from lockstep.cli import main
from lockstep.formats import checkpoint as ckpt

FORGED_WINDOW = 7486  # the honest run's step 3 starts at window 12


@pytest.fixture(scope="module")
def forged_run(honest_run, tmp_path_factory):
    import shutil

    run = tmp_path_factory.mktemp("forged-stream") / "run"
    shutil.copytree(honest_run, run)
    train_on_other_windows(run, at_step=2, window=FORGED_WINDOW)
    return run


def _forgers_certificate(run, step=3):
    """What the trainer (or a colluding auditor) publishes: step 3 replayed from checkpoint 2, a match."""
    rec = read_traj(run)[step - 1]
    published = {k: rec[k] for k in ("state_root", "chain_hash", "batch_digest", "loss_bits", "grad_norm_bits",
                                     "lr_bits")}
    honest = replay_step(run, 1, "spec")  # only for the run's identity fields
    forged = ReplayResult(run_dir=run, targets=[step], checks=[StepCheck(step, 2, dict(published), published)],
                          backend="spec", backend_description="", preset="tiny",
                          commitment=honest.commitment, last_step=honest.last_step, genesis=honest.genesis,
                          recipe_sha256=honest.recipe_sha256, seconds=1.0)
    return make_certificate(forged, auditor="forger")


def test_the_forgery_is_consistent_but_verify_sees_the_data(forged_run):
    rep = verify_run(forged_run)
    assert any(f.check == "checkpoint" and f.step == 2 and "stream_state" in f.message for f in rep.errors)
    assert not any(f.check == "chain" for f in rep.errors)  # every hash was redone


def test_replay_derives_the_data_position_and_calls_the_run_invalid(forged_run, capsys):
    res = replay_step(forged_run, 3, "spec")
    assert not res.ok and res.outcome == "mismatch"
    assert any("step-00000002" in p and "stream_state" in p and "window 12" in p and "mix_counter" in p
               for p in res.problems)
    assert main(["audit", "replay", str(forged_run), "--step", "3", "--backend", "spec", "--quiet"]) == 2
    out = capsys.readouterr().out
    assert "RUN INVALID" in out.splitlines()[1] and "MATCH (" not in out


def test_check_recompute_refuses_a_certificate_for_other_data(forged_run, tmp_path, capsys):
    cert = _forgers_certificate(forged_run)
    assert recheck_certificate(cert, forged_run, "spec") != []
    write_certificate(tmp_path / "forger.json", cert)
    assert main(["audit", "check", str(tmp_path / "forger.json"), "--run", str(forged_run), "--recompute",
                 "--backend", "spec"]) == 2
    assert "REJECTED" in capsys.readouterr().out


def test_merge_counts_the_honest_replay_as_a_failure(forged_run, tmp_path):
    cert = make_certificate(replay_step(forged_run, 3, "spec"), auditor="honest")
    assert cert["outcome"] == "mismatch" and cert["problems"]
    write_certificate(tmp_path / "honest.json", cert)
    report = merge_certificates([tmp_path / "honest.json"])
    assert not report.ok and report.run_problems and (3 not in report.steps or report.steps[3].status != "match")


def test_resume_refuses_a_checkpoint_whose_stream_record_is_not_the_recipes(forged_run, tmp_path):
    import shutil

    from lockstep.train.trainer import train

    run = tmp_path / "run"
    shutil.copytree(forged_run, run)
    before = (run / "trajectory.jsonl").read_bytes()
    with pytest.raises(ckpt.CheckpointError, match=r"stream_state is not the recipe.s data position after step 4 "
                                                   r"\(window 24"):
        train(run, resume=True, steps=5, backend_name="spec", checkpoint_every=2, progress=False,
              log=lambda *a, **k: None)
    assert (run / "trajectory.jsonl").read_bytes() == before
