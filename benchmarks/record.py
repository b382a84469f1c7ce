"""Writing measurements down: Markdown tables, and sections appended to ``benchmarks/RESULTS.md``.

Imported by the benchmark scripts, which run as ``python benchmarks/<script>.py`` (so
this folder is on ``sys.path``).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def median_seconds(fn, repeats: int, warm_up: bool = False) -> float:
    """The median wall time of ``repeats`` calls of ``fn()`` (after one untimed call when ``warm_up``)."""
    if warm_up:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def markdown_table(columns: list[tuple[str, str]], rows: list[list[str]]) -> str:
    """A Markdown table: ``columns`` are (title, "left" or "right") pairs, each row one cell per column."""
    rule = {"left": "---", "right": "---:"}
    lines = ["| " + " | ".join(title for title, _ in columns) + " |",
             "|" + "|".join(rule[align] for _, align in columns) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def append_results(section: str) -> None:
    """One append at the end of RESULTS.md (created with its title if absent)."""
    head = "" if RESULTS.exists() else "# Benchmark results\n"
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(head + section)
