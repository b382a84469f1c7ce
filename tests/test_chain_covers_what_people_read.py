"""Issue 14, "The chain must cover what people read": the loss curve is evidence only through the chain.

Editing ``loss`` and ``loss_bits`` of one trajectory record consistently (or the
gradient norm) gave ``audit verify`` VALID: ``H_t`` bound only the state root and
the batch. Since SPEC_VERSION 2 it binds the tokens and the exact bits of loss,
gradient norm and learning rate, so such an edit breaks the chain at that step.
``metrics.jsonl`` and ``loss.png`` are derived and not evidence: verify says so,
compares the metrics' losses with the trajectory and redraws the curve on request.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from forge import read_traj, write_traj
from lockstep.audit.replay import replay_step
from lockstep.audit.verify import verify_run
from lockstep.cli import main
from lockstep.spec import SPEC_VERSION


def _bits(x: float) -> str:
    return f"0x{int(np.asarray(np.float32(x)).view(np.uint32)):08X}"


@pytest.mark.parametrize("key, value", [("loss", 1.5), ("grad_norm", 0.25)])
def test_an_edited_loss_or_grad_norm_breaks_the_chain_at_its_step(copy_run, capsys, key, value):
    run = copy_run()
    recs = read_traj(run)
    recs[1][key], recs[1][f"{key}_bits"] = value, _bits(value)  # consistent: the value rounds to its bits
    write_traj(run, recs)
    rep = verify_run(run, batches=False)
    assert [(f.check, f.step) for f in rep.errors] == [("chain", 2)], rep.format()
    assert main(["audit", "verify", str(run), "--no-batches"]) == 2
    assert "INVALID" in capsys.readouterr().out


def test_the_replay_names_the_edited_field(copy_run):
    run = copy_run()
    recs = read_traj(run)
    recs[2]["loss"], recs[2]["loss_bits"] = 1.5, _bits(1.5)
    write_traj(run, recs)
    res = replay_step(run, 3, "spec")
    c = res.check(3)
    assert "loss_bits" in c.differs and "state_root" not in c.differs
    assert "loss_bits" in c.note and "the state matches" in c.note


def test_spec_version_names_the_new_chain():
    from lockstep.spec import hashing

    # the chain link that binds tokens, loss, grad norm and lr came with SPEC_VERSION 2; later versions keep it
    assert int(SPEC_VERSION) >= 2 and hashing.CHAIN_DOMAIN == b"lockstep.chain.v2\x00"


def test_metrics_are_not_evidence_and_verify_says_where_they_differ(copy_run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = copy_run()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    m = json.loads(lines[2])
    m["loss"] = 0.5  # a nicer curve than the run had
    lines[2] = json.dumps(m)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    rep = verify_run(run, batches=False)
    assert rep.ok  # the chained trajectory is intact: metrics are not evidence ...
    warned = [f for f in rep.warnings if f.check == "metrics"]
    assert [f.step for f in warned] == [3] and "not evidence" in warned[0].message  # ... and verify says so
    assert main(["audit", "verify", str(run), "--no-batches", "--plot", str(tmp_path / "curve.png")]) == 0
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "loss curve from the verified trajectory" in out


def test_no_curve_is_drawn_from_a_broken_chain(copy_run, tmp_path):
    run = copy_run()
    recs = read_traj(run)
    recs[1]["loss"], recs[1]["loss_bits"] = 1.5, _bits(1.5)
    write_traj(run, recs)
    assert main(["audit", "verify", str(run), "--no-batches", "--plot", str(tmp_path / "curve.png")]) == 1
    assert not (tmp_path / "curve.png").exists()


def test_validation_lines_in_metrics_are_not_reported_as_damage(copy_run):
    """``--eval-every`` and ``lockstep eval`` append validation records to metrics.jsonl: an honest run
    with them verifies without a metrics warning (found on a fresh `lockstep train` run)."""
    from lockstep.use.evaluate import append_metrics

    run = copy_run()
    last = read_traj(run)[-1]
    append_metrics(run, {"step": last["step"], "tokens": last["tokens"],
                         "validation": {"format": "lockstep.validation", "loss_sum": 1.0}})
    rep = verify_run(run, batches=False)
    assert rep.ok
    assert [f for f in rep.warnings if f.check == "metrics"] == []
    append_metrics(run, {"step": last["step"] + 5, "validation": "not a record"})  # still flagged: not ours
    assert [f for f in verify_run(run, batches=False).warnings if f.check == "metrics"]
