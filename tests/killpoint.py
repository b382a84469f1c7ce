"""Stop a `lockstep` child process at an observed event, never after a delay.

``launch`` runs ``python -c CHILD target when nth match fifo_dir lockstep-args...``: the
child wraps one real function (``"os:replace"``, ``"lockstep.train.step:apply_update"``)
and, at the Nth call whose first argument contains ``match``,

* ``before`` / ``after``: SIGKILLs itself before or after the call;
* ``pause``: writes its pid to the FIFO ``fifo_dir/paused`` and blocks until the test
  writes to ``fifo_dir/go`` (``Paused.release``), so the test can look at the run
  directory and send signals while the child is known to be at that point.

Under ``mpiexec`` only rank 0 acts; the other ranks run the real function unchanged.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import importlib, os, select, signal, sys
target, when, nth, match, fifo_dir, *argv = sys.argv[1:]
module_name, attr = target.split(":")
owner = importlib.import_module(module_name)
real = getattr(owner, attr)
rank0 = all(os.environ.get(k, "0") == "0" for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))
calls = 0

def pause():
    go = os.open(os.path.join(fifo_dir, "go"), os.O_RDONLY | os.O_NONBLOCK)  # open before saying so
    with open(os.path.join(fifo_dir, "paused"), "w") as f:
        f.write(f"{os.getpid()}\n")
    select.select([go], [], [])  # a signal handler that returns lets it go on waiting
    os.read(go, 100)
    os.close(go)

def wrapped(*args, **kwargs):
    global calls
    matches = rank0 and match in str(args[0] if args else "")
    calls += matches
    hit = matches and calls == int(nth)
    if hit and when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    if hit and when == "pause":
        pause()
    result = real(*args, **kwargs)
    if hit and when == "after":
        os.kill(os.getpid(), signal.SIGKILL)
    return result

setattr(owner, attr, wrapped)
from lockstep.cli import main
sys.exit(main(argv))
"""

HANG_GUARD_S = 600  # only turns a hang into a failure; no test outcome depends on it


def child_command(target: str, when: str, nth: int, match: str, argv: list[str], fifo_dir: str | Path = "-") -> list[str]:
    return [sys.executable, "-c", CHILD, target, when, str(nth), match, str(fifo_dir), *map(str, argv)]


def launch(target: str, when: str, nth: int, match: str, argv: list[str], fifo_dir: str | Path = "-",
           launcher: list[str] | None = None, **popen) -> subprocess.Popen:
    """Popen of ``[launcher...] python -c CHILD ...`` (see the module docstring)."""
    return subprocess.Popen([*(launcher or []), *child_command(target, when, nth, match, argv, fifo_dir)], **popen)


class Paused:
    """The two FIFOs of a pause; ``wait`` returns the paused child's pid."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        os.mkfifo(self.folder / "paused")
        os.mkfifo(self.folder / "go")
        # opened now (non-blocking) so the child's open for writing never waits; our own writer end
        # keeps select() from reporting end-of-file before the child has opened it
        self._paused_fd = os.open(self.folder / "paused", os.O_RDONLY | os.O_NONBLOCK)
        self._keep_open = os.open(self.folder / "paused", os.O_WRONLY | os.O_NONBLOCK)

    def wait(self, proc: subprocess.Popen) -> int:
        """Block until the child reports its pause; fail if it exits first."""
        text = b""
        for _ in range(HANG_GUARD_S):
            if text.endswith(b"\n"):
                return int(text)
            ready, _, _ = select.select([self._paused_fd], [], [], 1.0)  # 1 s: how often to ask whether it died
            if ready:
                text += os.read(self._paused_fd, 100)
            else:
                assert proc.poll() is None, f"the child exited ({proc.returncode}) before it paused"
        raise AssertionError("the child neither paused nor exited")

    def release(self) -> None:
        fd = os.open(self.folder / "go", os.O_WRONLY)  # the child opened it for reading before pausing
        os.write(fd, b"go\n")
        os.close(fd)

    def close(self) -> None:
        os.close(self._paused_fd)
        os.close(self._keep_open)


def read_until(stream, needle: str) -> str:
    """Read a child's output pipe until ``needle`` appears; return everything read.

    Reads the file descriptor itself (``select`` cannot see what a buffered reader
    already holds), so the caller's later ``stream.read()`` starts right after it.
    """
    fd, seen = stream.fileno(), b""
    while needle.encode() not in seen:
        ready, _, _ = select.select([fd], [], [], HANG_GUARD_S)
        assert ready, f"no {needle!r} from the child"
        chunk = os.read(fd, 65536)
        assert chunk, f"the child closed its output before saying {needle!r}:\n{seen.decode()[-3000:]}"
        seen += chunk
    return seen.decode()
