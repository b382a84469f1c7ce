"""The results table that ``lockstep conformance`` prints, for the suite and for the level-3 sweeps."""

from __future__ import annotations

from typing import Callable, Iterable


def print_results(out, title: str, results: list, columns: Iterable[tuple[str, int, Callable]],
                  statuses: Iterable[str]) -> dict[str, int]:
    """Print ``title``, one row per result (its op, each column right-aligned to its width, its status) and
    then every result's messages under its op; return how many results have each of ``statuses``.

    ``columns`` are ``(heading, width, cell)``, where ``cell(result)`` is the column's text.
    """
    columns = list(columns)
    print(title, file=out)
    w = max([len(r.op) for r in results] + [2])
    print("  ".join([f"{'op':<{w}}", *(f"{h:>{width}}" for h, width, _ in columns), "result"]), file=out)
    for r in results:
        print("  ".join([f"{r.op:<{w}}", *(f"{cell(r):>{width}}" for _, width, cell in columns), r.status]), file=out)
    for r in results:
        if r.messages:
            print(f"{r.op}:", file=out)
            for m in r.messages:
                print(m, file=out)
    return {s: sum(r.status == s for r in results) for s in statuses}
