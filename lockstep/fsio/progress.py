"""Progress lines with an estimate for a long phase (parameter init, a slow step's micro-batches).

``PhaseProgress(label, total)`` is told how much is done (``update(done)``); it says
nothing during its first ``quiet_for`` seconds, so a fast phase prints nothing, then
writes at most one line every ``every`` seconds with the fraction done, the rate and
the time left at that rate, and a last line when the phase ends (``close``), if it
said anything. The clock and the writer are arguments, so a test drives it by events
(a fake clock), never by real time. It decides no published bit.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

from lockstep.fsio import printable


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    seconds = int(round(max(seconds, 0.0)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def amount(n: float) -> str:
    """``950``, ``12.3K``, ``4.5M``, ``1.60G``."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:.0f}"


def to_stderr(line: str) -> None:
    """The default writer: the line on stderr, escaped (``fsio.printable``), as every lockstep line is."""
    print(printable(line), file=sys.stderr, flush=True)


class PhaseProgress:
    """One phase's progress lines: ``label: 45% (720M/1.60G parameters), 31.2M/s, about 28s left``."""

    def __init__(self, label: str, total: float, unit: str, *, enabled: bool = True,
                 write: Callable[[str], None] = to_stderr, clock: Callable[[], float] = time.perf_counter,
                 quiet_for: float = 3.0, every: float = 5.0):
        self.label, self.total, self.unit = label, float(total), unit
        self.enabled = enabled
        self.write, self.clock = write, clock
        self.quiet_for, self.every = quiet_for, every
        self.t0 = clock()
        self.last_line: float | None = None  # clock at the last line written
        self.done = 0.0
        self.lines = 0

    def update(self, done: float, total: float | None = None) -> None:
        """``done`` of ``total`` units are finished (``total`` given here replaces the one given first)."""
        self.done = float(done)
        if total is not None:
            self.total = float(total)
        if not self.enabled:
            return
        now = self.clock()
        elapsed = now - self.t0
        if elapsed < self.quiet_for or (self.last_line is not None and now - self.last_line < self.every):
            return
        if self.done >= self.total:
            return  # close() says the end
        self.last_line = now
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = f", about {duration((self.total - self.done) / rate)} left" if rate > 0 else ""
        pct = 100.0 * self.done / self.total if self.total else 100.0
        self._say(f"{self.label}: {pct:.0f}% ({amount(self.done)}/{amount(self.total)} {self.unit}), "
                  f"{amount(rate)}/s{left}")

    def close(self) -> None:
        """The last line (``label: done, 1.60G parameters in 52s``), only if the phase said anything."""
        if self.enabled and self.lines:
            self._say(f"{self.label}: done, {amount(self.done)} {self.unit} in {duration(self.clock() - self.t0)}")

    def _say(self, line: str) -> None:
        self.lines += 1
        self.write(line)

    def __enter__(self) -> "PhaseProgress":
        return self

    def __exit__(self, *exc) -> bool:
        if exc[0] is None:
            self.close()
        return False
