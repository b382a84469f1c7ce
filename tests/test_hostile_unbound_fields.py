"""Issue 23 (second security review), items 4, 5, 10 and 15: what the chain does not bind, a reader must not use.

4. A trajectory record's decimal ``loss`` is not chained (its bits are): rewritten,
   it gave a replay MATCH, a "(verified chain)" curve of the forged values and a
   model card quoting them. ``read_trajectory`` now refuses a decimal that is not
   exactly its bits' value, so every reader (verify, replay, plan, export, sample)
   sees the run as invalid, and what is shown comes from the bits.
5. A checkpoint beyond the trajectory's last step is covered by no chain link:
   verify, replay (so the certificates merge counts) call the run invalid, and
   sample, eval and export refuse it and default to the latest covered one.
10. One edited number (``tokens`` of -1 or 2**64, an integer too large for a float as
    ``grad_norm`` or as a ``metrics.jsonl`` loss) crashed verify, replay and plan.
15. A re-forged checkpoint whose digests are consistent but whose ``param/embed`` has
    another shape passed verify, and the replay from it crashed.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from forge import read_traj, relink, write_traj
from lockstep.audit.certificate import make_certificate
from lockstep.audit.merge import merge_certificates
from lockstep.audit.plan import PlanError, plan_audit
from lockstep.audit.replay import ReplayError, replay_step, replay_steps
from lockstep.audit.verify import verify_run
from lockstep.cli import main
from lockstep.formats import checkpoint as ckpt
from lockstep.formats.rundir import RunFileError
from lockstep.formats.state import state_layout_problem
from lockstep.formats.trajectory import Strictness, read_trajectory


def _value_of(bits: str) -> float:
    return float(np.array([int(bits, 16)], dtype=np.uint32).view(np.float32)[0])


# ------------------------------------------------------------------ item 4: the decimal loss


def test_an_honest_trajectory_writes_each_decimal_as_its_bits_value(honest_run):
    from lockstep.formats.trajectory import bits_value

    recs = read_traj(honest_run)
    for r in recs:
        for key in ("loss", "grad_norm", "lr"):
            assert r[key] == _value_of(r[f"{key}_bits"]) == bits_value(r[f"{key}_bits"])
    assert read_trajectory(honest_run, Strictness.AUDIT) == recs


def _forge_decimals(run, change) -> None:
    """Rewrite every record's decimal ``loss``; bits, chain and commitment stay as published."""
    recs = read_traj(run)
    for r in recs:
        r["loss"] = change(r["loss"])
    write_traj(run, recs)


@pytest.mark.parametrize("change", [lambda x: x / 2,  # a nicer curve
                                    lambda x: float(np.nextafter(x, np.inf))])  # rounds to the same float32
def test_a_forged_decimal_loss_makes_the_run_invalid_in_verify_and_replay(copy_run, tmp_path, capsys, change):
    run = copy_run()
    _forge_decimals(run, change)
    rep = verify_run(run, batches=False)
    assert not rep.ok
    assert [(f.check, f.step) for f in rep.errors if f.check == "trajectory"] == [("trajectory", None)]
    assert "'loss'" in rep.errors[0].message and ":1 (step 1)" in rep.errors[0].message
    with pytest.raises(ReplayError, match="decimal was edited"):
        replay_step(run, 1, "spec")
    assert main(["audit", "replay", str(run), "--step", "1", "--backend", "spec"]) == 1
    out, err = capsys.readouterr()
    assert "MATCH" not in out and "decimal was edited" in err and "Traceback" not in err


def test_no_curve_is_drawn_from_forged_decimals(copy_run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = copy_run()
    _forge_decimals(run, lambda x: x / 2)
    png = tmp_path / "curve.png"
    assert main(["audit", "verify", str(run), "--no-batches", "--plot", str(png)]) == 1
    assert not png.exists()
    assert "no loss curve drawn" in capsys.readouterr().err


def test_no_curve_is_drawn_from_an_invalid_run_with_an_intact_chain(copy_run, tmp_path, capsys):
    """The chain holds, but the run is invalid (a forged checkpoint beyond it): no curve either."""
    pytest.importorskip("matplotlib")
    run = copy_run()
    _checkpoint_beyond_the_chain(run)
    png = tmp_path / "curve.png"
    assert main(["audit", "verify", str(run), "--no-batches", "--plot", str(png)]) == 1
    assert not png.exists()


def test_export_refuses_forged_decimals_and_its_model_card_quotes_the_bits(copy_run, tmp_path, capsys):
    run = copy_run()
    assert main(["export", str(run), "--out", str(tmp_path / "honest")]) == 0
    last = read_traj(run)[-1]
    card = (tmp_path / "honest" / "README.md").read_text()
    assert f"training loss at this step: {_value_of(last['loss_bits']):.4f}" in card
    _forge_decimals(run, lambda x: x / 2)
    capsys.readouterr()
    assert main(["audit", "verify-export", str(tmp_path / "honest"), str(run)]) == 2  # the run is not the export's
    assert "decimal was edited" in capsys.readouterr().out
    assert main(["export", str(run), "--out", str(tmp_path / "forged")]) == 1
    err = capsys.readouterr().err
    assert "decimal was edited" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "forged" / "README.md").exists()


# ------------------------------------------------------------------ item 5: a checkpoint beyond the chain


def _checkpoint_beyond_the_chain(run) -> int:
    """A forged, internally consistent checkpoint of step N+1 beside an N-step trajectory; returns N+1."""
    n = len(read_traj(run))
    c = ckpt.load_checkpoint(run, n)
    tensors = {k: v.copy() for k, v in c.tensors.items()}
    tensors["param/embed"][0, 0] += np.float32(1.0)  # the forger's weights
    tensors["step"] = np.array([n + 1], dtype=np.int64)
    keep = {k: v for k, v in c.sidecar.items()
            if k not in ("step", "state_root", "tensor_digests", "file_sha256", "format")}
    ckpt.save_checkpoint(run, n + 1, tensors, keep)
    return n + 1


def test_a_checkpoint_beyond_the_chain_makes_verify_and_replay_say_invalid(copy_run):
    run = copy_run()
    beyond = _checkpoint_beyond_the_chain(run)
    rep = verify_run(run, batches=False)
    assert [(f.check, f.step) for f in rep.errors] == [("checkpoint", beyond)], rep.format()
    res = replay_steps(run, range(1, beyond), "spec")
    assert all(c.match for c in res.checks)  # every published step replays ...
    assert not res.ok and res.outcome == "mismatch"  # ... but the run is invalid
    assert any(ckpt.step_dirname(beyond) in p and "beyond the trajectory" in p for p in res.problems)
    assert "RUN INVALID" in res.format() and res.format().splitlines()[-1].startswith("MISMATCH")


def test_merge_does_not_count_a_replay_of_a_run_with_a_checkpoint_beyond_it(copy_run, tmp_path):
    from lockstep.audit.certificate import write_certificate

    run = copy_run()
    beyond = _checkpoint_beyond_the_chain(run)
    cert = make_certificate(replay_steps(run, range(1, beyond), "spec"), auditor="a")
    assert cert["outcome"] == "mismatch" and any("beyond the trajectory" in p for p in cert["problems"])
    write_certificate(tmp_path / "a.json", cert)
    merged = merge_certificates([tmp_path / "a.json"])
    assert not merged.missing_ranges  # every step is covered ...
    assert not merged.consistent and merged.run_problems  # ... and the run is still not vouched for


def test_sample_eval_and_export_default_to_a_covered_checkpoint_and_refuse_one_beyond(copy_run, tmp_path, capsys):
    from lockstep.use.run import UseError, open_model

    run = copy_run()
    beyond = _checkpoint_beyond_the_chain(run)
    assert open_model(run).step == beyond - 1
    with pytest.raises(UseError, match="beyond trajectory.jsonl"):
        open_model(run, beyond)
    capsys.readouterr()
    for argv in (["sample", str(run), "--step", str(beyond), "--prompt", "x", "--max-new-tokens", "2"],
                 ["eval", str(run), "--step", str(beyond), "--backend", "spec"],
                 ["export", str(run), "--step", str(beyond), "--out", str(tmp_path / "e")]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "beyond trajectory.jsonl" in err and len(err.strip().splitlines()) == 1, err
    assert main(["export", str(run), "--out", str(tmp_path / "latest")]) == 0
    assert json.loads((tmp_path / "latest" / "proof.json").read_text())["step"] == beyond - 1


def test_only_checkpoints_beyond_the_trajectory_are_refused(copy_run):
    """With every checkpoint beyond a (cut) trajectory, nothing is used; with the trajectory whole, all are."""
    from lockstep.use.run import UseError, open_model

    run = copy_run()
    recs = read_traj(run)
    write_traj(run, recs[:1])  # checkpoints 2 and 4 are now beyond it
    with pytest.raises(UseError, match="checkpoint 4 of .* beyond trajectory.jsonl, which ends at step 1"):
        open_model(run)
    write_traj(run, recs)
    assert open_model(run).step == 4 and open_model(run, 2).step == 2


def test_a_broken_chain_does_not_vouch_for_a_checkpoint(copy_run):
    from lockstep.use.run import UseError, open_model

    run = copy_run()
    recs = read_traj(run)
    recs[0]["batch_digest"] = "0" * 64  # step 1's link no longer holds; checkpoints 2 and 4 still match
    write_traj(run, recs)
    with pytest.raises(UseError, match="broken at step 1"):
        open_model(run)


# ------------------------------------------------------------------ item 10: one edited number


def _edit_record(run, step: int, **changes) -> None:
    recs = read_traj(run)
    recs[step - 1].update(changes)
    write_traj(run, recs)


@pytest.mark.parametrize("changes", [{"tokens": -1}, {"tokens": 2**64}, {"tokens": 0},
                                     {"grad_norm": 10**400}, {"lr": 10**400}, {"loss": -(10**400)}])
def test_one_edited_number_is_a_clear_refusal_in_verify_replay_and_plan(copy_run, capsys, changes):
    run = copy_run()
    _edit_record(run, 2, **changes)
    key = next(iter(changes))
    rep = verify_run(run, batches=False)
    assert [(f.check, f.path.endswith("trajectory.jsonl")) for f in rep.errors] == [("trajectory", True)]
    assert f"(step 2): '{key}'" in rep.errors[0].message
    with pytest.raises(ReplayError, match=f"step 2.*'{key}'"):
        replay_step(run, 1, "spec")
    with pytest.raises(PlanError, match=f"'{key}'"):
        plan_audit(run, ["a" * 64, "b" * 64], "c" * 64)  # two auditors' keys, a beacon value
    for argv in (["audit", "verify", str(run), "--no-batches"],
                 ["audit", "replay", str(run), "--step", "1", "--backend", "spec"]):
        assert main(argv) in (1, 2), argv
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err and f"'{key}'" in out + err, argv


def test_an_integer_too_large_for_a_float_in_metrics_is_a_warning(copy_run):
    run = copy_run()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    m = json.loads(lines[1])
    m["loss"] = 10**400
    lines[1] = json.dumps(m)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    rep = verify_run(run, batches=False)
    assert rep.ok
    assert [(f.check, f.step) for f in rep.warnings] == [("metrics", m["step"])]


def test_bits_that_are_not_a_finite_float32_are_refused(copy_run):
    run = copy_run()
    _edit_record(run, 3, loss_bits="0x7FC00000")
    with pytest.raises(RunFileError, match="not a finite float32"):
        read_trajectory(run, Strictness.LIVE)


# ------------------------------------------------------------------ item 15: checkpoint tensor layout


def _reforge_with_other_embed(run, step: int) -> None:
    """Checkpoint ``step`` re-saved with ``param/embed`` one row short, and the trajectory re-linked to its root."""
    c = ckpt.load_checkpoint(run, step)
    tensors = {k: v.copy() for k, v in c.tensors.items()}
    tensors["param/embed"] = np.ascontiguousarray(tensors["param/embed"][:-1])
    keep = {k: v for k, v in c.sidecar.items()
            if k not in ("step", "state_root", "tensor_digests", "file_sha256", "format")}
    shutil.rmtree(c.path)
    ckpt.save_checkpoint(run, step, tensors, keep)
    recs = read_traj(run)
    recs[step - 1]["state_root"] = ckpt.load_checkpoint(run, step).sidecar["state_root"]
    relink(run, recs, step)


def test_a_checkpoint_of_another_shape_fails_verify_and_replay_says_why(copy_run, capsys):
    run = copy_run()
    _reforge_with_other_embed(run, 2)
    rep = verify_run(run, batches=False)
    bad = [f for f in rep.errors if f.check == "checkpoint"]
    assert [(f.step, f.tensor) for f in bad] == [(2, "param/embed")], rep.format()
    assert "float32[" in bad[0].message and "the recipe's model has float32[" in bad[0].message
    res = replay_step(run, 3, "spec")
    assert not res.ok and 3 not in res.replayed_targets
    assert any("step-00000002" in p and "'param/embed'" in p for p in res.problems), res.problems
    assert main(["audit", "replay", str(run), "--step", "3", "--backend", "spec"]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "param/embed" in out


def test_the_layout_check_names_a_missing_extra_or_retyped_tensor(honest_run):
    from lockstep.formats.config import preset

    cfg = preset("tiny")
    tensors = dict(ckpt.load_checkpoint(honest_run, 2).tensors)
    assert state_layout_problem(tensors, cfg) is None
    assert state_layout_problem({k: v for k, v in tensors.items() if k != "adam_v/lm_head"}, cfg)[0] == \
        "adam_v/lm_head"
    assert state_layout_problem({**tensors, "param/extra": tensors["step"]}, cfg)[0] == "param/extra"
    retyped = {**tensors, "adam_m/embed": tensors["adam_m/embed"].astype(np.float64)}
    assert state_layout_problem(retyped, cfg)[0] == "adam_m/embed"
    assert state_layout_problem({**tensors, "step": np.array([2], dtype=np.int32)}, cfg)[0] == "step"
