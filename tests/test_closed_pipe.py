"""A reader that closes the pipe early (``lockstep audit verify RUN | head -1``): no traceback, exit 141.

Every command shares one handler (``lockstep.cli.main``): when stdout's (or stderr's)
reader has gone, the command stops quietly, as a Unix tool killed by SIGPIPE does, and
exits ``EXIT_PIPE_CLOSED`` (141 = 128 + SIGPIPE), never 0: a script with ``pipefail``
cannot take a cut-off verdict for a whole one.

The pipe is real and the child is waited on, never timed: the test reads the first line
byte by byte, closes its end, and waits for the process. The child's output is larger
than the pipe can hold (shrunk to one page where Linux allows it), so it must write
again after the close, and meet the closed pipe.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from lockstep.cli.common import EXIT_PIPE_CLOSED

HANG_GUARD_S = 600  # only turns a hang into a failure; no outcome depends on it
DEFAULT_PIPE_BYTES = 1 << 16  # Linux's and macOS's pipe capacity unless it is set


def _pipe() -> tuple[int, int, int]:
    """``(read fd, write fd, capacity)``: a pipe as small as this system lets it be made."""
    r, w = os.pipe()
    try:
        import fcntl

        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
        return r, w, fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
    except (ImportError, AttributeError, OSError):
        return r, w, DEFAULT_PIPE_BYTES


def lockstep_into_closed_pipe(tmp_path: Path, *args, output_bytes: int) -> tuple[int, str, str]:
    """Run ``lockstep ARGS`` with stdout into a pipe whose reader closes after the first line.

    ``output_bytes``: how much the command prints in all (the caller measured it), which must
    exceed what the pipe holds. Returns (exit status, the first line, stderr).
    """
    r, w, capacity = _pipe()
    assert output_bytes > 2 * capacity, f"the command's {output_bytes} bytes fit the {capacity}-byte pipe"
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "lockstep", *map(str, args)], stdout=w, stderr=err)
    os.close(w)
    first = b""
    try:
        while not first.endswith(b"\n"):
            byte = os.read(r, 1)
            assert byte, f"the command ended before its first line: {err_path.read_text()[-2000:]}"
            first += byte
    finally:
        os.close(r)  # the reader goes away, as head does after its line
        rc = proc.wait(timeout=HANG_GUARD_S)
    return rc, first.decode(), err_path.read_text()


def _output_bytes(*args) -> int:
    r = subprocess.run([sys.executable, "-m", "lockstep", *map(str, args)], capture_output=True,
                       timeout=HANG_GUARD_S)
    return len(r.stdout)


def test_verify_into_a_closed_pipe_stops_quietly(copy_run, tmp_path):
    run = copy_run()
    for i in range(1500):  # each is one warning line: about 127 kB of report
        (run / f"stray-{i:04d}").write_bytes(b"")
    args = ("audit", "verify", run, "--no-batches")
    rc, first, err = lockstep_into_closed_pipe(tmp_path, *args, output_bytes=_output_bytes(*args))
    assert first.startswith(f"run {run}: 4 step(s)")
    assert "Traceback" not in err and "Error" not in err, err
    assert err == ""
    assert rc == EXIT_PIPE_CLOSED == 141


def test_plan_into_a_closed_pipe_stops_quietly(tmp_path):
    commitment = tmp_path / "commitment.json"
    commitment.write_text(json.dumps({"chain_hash": hashlib.sha256(b"a run").hexdigest(), "last_step": 20000}))
    keys = [x for i in range(600) for x in ("--pub", hashlib.sha256(str(i).encode()).hexdigest())]
    args = ("audit", "plan", commitment, *keys, "--beacon", "ef" * 32)  # one line per auditor: about 110 kB
    rc, first, err = lockstep_into_closed_pipe(tmp_path, *args, output_bytes=_output_bytes(*args))
    assert first.startswith("audit plan for commitment")
    assert err == "", err
    assert rc == EXIT_PIPE_CLOSED


def test_a_closed_pipe_is_handled_once_in_main():
    """No command catches BrokenPipeError itself: main's handler covers them all."""
    cli = Path(__file__).resolve().parent.parent / "lockstep" / "cli"
    catching = [p.name for p in sorted(cli.glob("*.py")) if "except BrokenPipeError" in p.read_text()]
    assert catching == ["__init__.py"]
