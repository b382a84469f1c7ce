"""``formats.run.Run``: a run opened once, and the one rule for "this checkpoint belongs to this run".

Every consumer of a run (``audit verify``, ``audit replay``, ``lockstep sample|eval|export``
through ``open_model``, ``train --resume``) asks the same ``Run``; each forgery of a
checkpoint below is refused by all four, for the reason the rule names.
"""

from __future__ import annotations

import shutil

import pytest

from forge import read_traj, rewrite_sidecar
from lockstep.audit.replay import replay_step
from lockstep.audit.verify import verify_run
from lockstep.formats import checkpoint as ckpt
from lockstep.formats.run import Run, SpecVersionMismatch
from lockstep.formats.rundir import RunFileError
from lockstep.formats.trajectory import Strictness
from lockstep.train.trainer import RecipeMismatch, train
from lockstep.use.run import UseError, open_model


def test_an_honest_run_opens_whole(honest_run):
    run = Run.open(honest_run, Strictness.AUDIT)
    assert run.errors == {} and run.last_step == 4 and sorted(run.complete) == [2, 4]
    assert run.chain_breaks == [] and run.chain_holds_to(4) and run.commitment_problems() == []
    assert run.damaged_folders == {} and run.beyond == []
    for step in (2, 4):
        assert run.checkpoint_problems(run.load_checkpoint(step)) == []
    start = run.sound_start(4)
    assert start.step == 2 and start.chain == read_traj(honest_run)[1]["chain_hash"] and start.stopped is None
    assert start.opt.step == 2 and set(start.params) == {k[len("param/"):] for k in start.checkpoint.tensors
                                                         if k.startswith("param/")}
    assert run.sound_start(2).step == 0 and run.sound_start(2).chain == run.genesis


def test_a_part_that_cannot_be_read_is_kept_until_asked_for(copy_run):
    run_dir = copy_run()
    (run_dir / "trajectory.jsonl").write_text("not json\n")
    run = Run.open(run_dir, Strictness.AUDIT)
    assert set(run.errors) == {"trajectory"} and run.recipe is not None
    run.require("recipe")
    with pytest.raises(RunFileError, match="trajectory.jsonl"):
        run.require("recipe", "trajectory")
    with pytest.raises(RunFileError, match="not a directory"):
        Run.open(run_dir / "recipe.json", Strictness.AUDIT)
    with pytest.raises(TypeError):
        Run.open(run_dir, "audit")


def test_the_spec_version_gate_is_one(copy_run, monkeypatch):
    import lockstep.formats.run as run_mod

    run = Run.open(copy_run(), Strictness.AUDIT)
    assert run.spec_version_problem() is None
    monkeypatch.setattr(run_mod, "SPEC_VERSION", run.recipe["spec_version"] + "0")
    with pytest.raises(SpecVersionMismatch, match="SPEC_VERSION"):
        run.require_spec_version()


FORGERIES = {
    # name: (sidecar changes of checkpoint 2, the rule's ``what``)
    "another recipe": (lambda side: {"recipe_sha256": "0" * 64}, "recipe"),
    "another token count": (lambda side: {"tokens": side["tokens"] + 1}, "record"),
    "another chain hash": (lambda side: {"chain_hash": "ab" * 32}, "record"),
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_every_consumer_refuses_the_same_forged_checkpoint(copy_run, name):
    change, what = FORGERIES[name]
    run_dir = copy_run()
    shutil.rmtree(run_dir / "checkpoints" / ckpt.step_dirname(4))  # checkpoint 2 is every consumer's start
    side = Run.open(run_dir, Strictness.AUDIT).load_checkpoint(2).sidecar
    rewrite_sidecar(run_dir, 2, **change(side))

    run = Run.open(run_dir, Strictness.AUDIT)
    problems = run.checkpoint_problems(run.load_checkpoint(2))
    assert [p.what for p in problems] == [what], problems
    start = run.sound_start(3)
    assert start.step == 0 and start.stopped[:2] == (2, "contradicts") and start.stopped_problems == problems
    assert run.sound_start(3, skip_unsound=True).unsound[0][:2] == (2, "contradicts")

    rep = verify_run(run_dir)
    assert not rep.ok and any(f.check == "checkpoint" and f.step == 2 for f in rep.errors), rep.findings
    res = replay_step(run_dir, 3, "spec")
    assert not res.ok and 3 not in res.replayed_targets
    assert any("step-00000002 contradicts the run" in p for p in res.problems), res.problems
    with pytest.raises(UseError, match="refused: checkpoint 2"):
        open_model(run_dir, 2)
    with pytest.raises(RecipeMismatch if what == "recipe" else ckpt.CheckpointError):
        train(run_dir, resume=True, steps=4, progress=False, log=lambda *a, **k: None)
    assert [r["step"] for r in read_traj(run_dir)] == [1, 2, 3, 4]  # the refused resume wrote nothing


def test_a_broken_chain_before_a_sound_checkpoint_is_asked_apart(copy_run):
    run_dir = copy_run()
    recs = read_traj(run_dir)
    recs[0]["loss_bits"] = recs[1]["loss_bits"]  # an edited record: its own link breaks, the next ones hold
    recs[0]["loss"] = recs[1]["loss"]
    from forge import write_traj

    write_traj(run_dir, recs)
    run = Run.open(run_dir, Strictness.AUDIT)
    assert run.chain_breaks == [1] and not run.chain_holds_to(2) and not run.chain_holds_to(1)
    assert run.checkpoint_problems(run.load_checkpoint(2)) == []  # the checkpoint itself is the record's
    with pytest.raises(UseError, match="broken at step 1"):
        open_model(run_dir, 2)
    with pytest.raises(ckpt.CheckpointError, match="broken at step 1"):
        train(run_dir, resume=True, steps=4, progress=False, log=lambda *a, **k: None)
