"""Stopping a run on SIGINT (Ctrl-C) or SIGTERM (a scheduler) without losing or damaging anything.

The first signal only sets a flag (and says so on stderr): the step under way
finishes, the trainer writes a checkpoint at it and exits ``128 + signal`` with a
line saying how to resume. Under ``mpiexec`` the ranks take the largest of their
flags once per step (an integer ``MPI_Allreduce``), so all of them stop after the
same step even when the signal reached only some. A second signal raises
``KeyboardInterrupt`` at once: every file write is atomic (a checkpoint folder is
renamed into place only when complete; a torn trajectory line past the last
checkpoint is dropped on resume), so stopping anywhere loses at most the steps
since the last checkpoint and damages nothing.
"""

from __future__ import annotations

import os
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A context that turns the first SIGINT/SIGTERM into a flag and the second into ``KeyboardInterrupt``.

    ``step`` is the step under way (set by the loop, quoted in the notice);
    ``signum`` the first signal received, 0 while none. Handlers are installed only
    in the main thread (Python delivers signals there), only when ``install``, and
    restored on exit.
    """

    def __init__(self, install: bool = True, announce: bool = True):
        self.install = install
        self.announce = announce
        self.signum = 0
        self.step = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        if self.install and threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        return False

    def _handle(self, signum, frame) -> None:
        if self.signum:
            raise KeyboardInterrupt
        self.signum = signum
        if self.announce:
            name = signal.Signals(signum).name
            # os.write, not print: a handler may run in the middle of a print to stderr
            os.write(2, (f"\nlockstep: {name}: finishing step {self.step}, then writing a checkpoint and "
                         "stopping (Ctrl-C again stops at once; the run then resumes from its last "
                         "checkpoint)\n").encode())


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by ``signum``: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signum)
