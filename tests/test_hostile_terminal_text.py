"""Attack class 8 (issue 19, Low 8): names that write on the auditor's terminal.

A file named ``"x\\nVALID"`` or carrying ``\\r`` / ANSI escapes made ``audit verify``
print a fake "VALID" line over an invalid run. Every untrusted string is escaped
before it is printed, in every audit command: no control character reaches stdout
or stderr, and the only verdict line is the real one.
"""

from __future__ import annotations

import copy
import json
import re

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
