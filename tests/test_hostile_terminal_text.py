"""Attack class 8 (issue 19, Low 8): names that write on the auditor's terminal.

A file named ``"x\\nVALID"`` or carrying ``\\r`` / ANSI escapes made ``audit verify``
print a fake "VALID" line over an invalid run. Every untrusted string is escaped
before it is printed, in every audit command: no control character reaches stdout
or stderr, and the only verdict line is the real one.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import pytest

from lockstep.audit.certificate import make_certificate, write_certificate
from lockstep.audit.replay import replay_step
from lockstep.cli import main

EVIL = ["zz\nVALID", "zz\rVALID   \x1b[2K", "\x1b[32mVALID\x1b[0m\x1b[8m", "a\u2028VALID", "b\u202eDILAV"]
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _clean(text: str) -> None:
    assert not CONTROL.search(text), repr(CONTROL.search(text).group())


def test_verify_prints_no_fake_verdict(copy_run, capsys):
    run = copy_run()
    (run / "commitment.json").unlink()  # the run is invalid
    for name in EVIL:
        (run / name).write_bytes(b"")
        (run / "checkpoints" / name).mkdir()
    assert main(["audit", "verify", str(run), "--no-batches"]) == 2
    out = capsys.readouterr().out
    _clean(out)
    verdicts = [line for line in out.splitlines() if not line.startswith(("run ", "  "))]
    assert verdicts == ["INVALID: 1 error(s)"]
    assert "zz\\x0aVALID" in out and "\\x1b[32mVALID" in out


def test_merge_plan_and_check_escape_what_certificates_and_names_say(honest_run, tmp_path, capsys):
    cert = make_certificate(replay_step(honest_run, 1, "spec"), auditor="a\nCOMPLETE AND CONSISTENT\x1b[8m")
    write_certificate(tmp_path / "c.json", cert)
    bad = copy.deepcopy(cert)
    bad["signature"] = {"algorithm": "ed25519", "public_key": "\x1b[2J" * 8, "value": "00"}
    (tmp_path / "evil\nok.json").write_text(json.dumps(bad))
    assert main(["audit", "merge", str(tmp_path / "c.json"), str(tmp_path / "evil\nok.json")]) == 2
    assert main(["audit", "check", str(tmp_path / "c.json"), str(tmp_path / "evil\nok.json")]) == 2
    keys = ["--pub", "ab" * 32, "--pub", "cd" * 32]
    assert main(["audit", "plan", str(honest_run), *keys, "--beacon", "ef" * 32, "--names", "x\x1b[31m,y\nz",
                 "--beacon-source", "drand\x1b[2J round\n7"]) == 0
    captured = capsys.readouterr()
    _clean(captured.out)
    _clean(captured.err)
    assert "COMPLETE AND CONSISTENT" not in [line.strip() for line in captured.out.splitlines()]


@pytest.mark.parametrize("name", EVIL)
def test_printable_escapes_each_control(name):
    from lockstep.fsio import printable

    shown = printable(name)
    _clean(shown)
    assert "VALID" in shown or "DILAV" in shown


# ---------------------------------------------------------------- train --resume (issue 34, item 5)

SCREEN = "\x1b[2J\x1b[H\rresumed OK\x1b[8m\u202e"  # clears the screen, shows a fake verdict, hides the rest


def _hostile_run(copy_run) -> Path:
    """A run an auditor accepts (``audit verify``: VALID) whose folder name, model name and data folder name
    clear the screen: the name and the data folder are outside H_0, and the sidecars and the commitment
    name the edited recipe, as a publisher who wrote them would have made them."""
    from forge import rewrite_sidecar
    from lockstep.fsio import json_bytes

    plain = copy_run()
    run = plain.with_name("run" + SCREEN)
    plain.rename(run)
    folder = "data" + SCREEN
    (run / "data").rename(run / folder)
    recipe = json.loads((run / "recipe.json").read_text())
    recipe["model"]["name"] = "tiny" + SCREEN
    recipe["data"]["folder"] = folder
    (run / "recipe.json").write_bytes(json_bytes(recipe))
    digest = hashlib.sha256(json_bytes(recipe)).hexdigest()
    for step in (2, 4):
        rewrite_sidecar(run, step, recipe_sha256=digest)
    commitment = json.loads((run / "commitment.json").read_text())
    commitment["recipe_sha256"] = digest
    (run / "commitment.json").write_bytes(json_bytes(commitment))
    return run


def _train_says(capfd, *argv, code: int) -> str:
    """``lockstep train ARGV``'s exit status must be ``code``; returns everything it wrote, checked clean."""
    assert main(["train", *map(str, argv)]) == code
    captured = capfd.readouterr()  # the file descriptors: os.write(2, ...) of the stop notice included
    _clean(captured.out)
    _clean(captured.err)
    assert "resumed OK" not in [line.strip() for line in (captured.out + captured.err).splitlines()]
    return captured.out + captured.err


def test_train_resume_escapes_every_line_it_prints_from_a_hostile_run(copy_run, capfd, monkeypatch):
    run = _hostile_run(copy_run)
    assert main(["audit", "verify", str(run), "--no-batches"]) == 0  # VALID: nothing tells the auditor
    capfd.readouterr()
    shown = "\\x1b[2J\\x1b[H"  # each path below must have printed the hostile text, escaped
    # a step: "resuming", the run line, the plan line, the progress lines, "done", the summary (the
    # validation hook says its lines through the same callback; here it is off: it costs half a minute)
    said = _train_says(capfd, "--resume", run, "--steps", "5", "--backend", "spec", code=0)
    assert said.count(shown) >= 4 and "preset tiny" + shown in said
    # the library's errors: the memory model (it names the recipe's model), a flag against the recipe
    assert shown in _train_says(capfd, "--resume", run, "--max-memory", "0.0001", "--backend", "spec", code=1)
    assert shown in _train_says(capfd, "--resume", run, "--preset", "small", "--backend", "spec", code=1)
    recipe = json.loads((run / "recipe.json").read_text())
    recipe["spec_version"] = "3" + SCREEN  # bound by H_0, but a stranger's run may say anything
    (run / "recipe.json").write_text(json.dumps(recipe))
    assert shown in _train_says(capfd, "--resume", run, "--backend", "spec", code=1)

    # the CLI's own lines around the library: a stop by a signal, a second Ctrl-C, a full disk
    import signal

    from lockstep.train import trainer

    def stopped(run_dir, **kwargs):
        return trainer.RunSummary(Path(run_dir), 5, "0" * 64, 1.0, target=6, stopped_by=signal.SIGTERM)

    monkeypatch.setattr(trainer, "train", stopped)
    assert shown in _train_says(capfd, "--resume", run, "--backend", "spec", code=128 + signal.SIGTERM)

    def interrupted(run_dir, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train", interrupted)
    assert shown in _train_says(capfd, "--resume", run, "--backend", "spec", "--data", run / recipe["data"]["folder"],
                                code=130)

    def disk_full(run_dir, **kwargs):
        raise trainer.RunWriteError(Path(run_dir), "checkpoint 5", 5, 4, 1, OSError(28, "No space left on device"))

    monkeypatch.setattr(trainer, "train", disk_full)
    assert shown in _train_says(capfd, "--resume", run, "--backend", "spec", code=1)


def test_python_warnings_print_escaped(monkeypatch, capfd):
    """A library's warning may quote what it was given (matplotlib: a run name's glyph its font lacks):
    every command prints warnings as it prints everything else, escaped."""
    import warnings

    from lockstep.cli import conformance

    def warns(args) -> int:
        warnings.warn("Glyph 27 (\x1b[2J) missing from font(s) DejaVu Sans.", UserWarning)
        return 0

    monkeypatch.setattr(conformance, "cmd_version", warns)
    assert main(["version"]) == 0
    err = capfd.readouterr().err
    _clean(err)
    assert "Glyph 27 (\\x1b[2J)" in err
