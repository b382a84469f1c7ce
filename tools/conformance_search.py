"""The deep conformance search: Hypothesis's ``deep`` profile over every op of the backend contract.

Usage (from the repository root)::

    python3 -m tools.conformance_search                       # 10,000 examples per op, seed 0
    python3 -m tools.conformance_search --examples 500 --ops add,mul,attention_backward
    python3 -m tools.conformance_search --seed 7 --json deep.json

For each op (``lockstep.contract.OP_NAMES``) it draws ``--examples`` calls
with the op's strategy (its record's ``draw``, ``lockstep/conformance/ops/<spec module>.py``;
run by ``lockstep.conformance.search``) and runs each on the spec and
on every backend ``get_backend`` can build here (the spec's own ``asarray`` path
included), requiring the spec's bytes or the spec's exception type. Examples are
counted as the search runs them: ``examples`` (calls run before any disagreement),
``refused`` (of those, calls the spec refuses with ValueError/TypeError, which every
backend must refuse the same way) and ``disagreements`` (0 or 1 per op: Hypothesis
stops at the first and shrinks it; the shrunk call is printed and kept in the JSON).

The search explores from ``--seed`` (so a run is reproducible from its seed) and keeps
Hypothesis's example database in ``--database`` (default ``.hypothesis/deep``, ignored
by git and absent from CI's clean clone), so a disagreement found once is tried
first on the next run. Add every shrunk disagreement to its op's record
(``lockstep/conformance/ops/<spec module>.py``: ``regressions`` for a call the spec
answers, ``refusals`` for one it refuses).

Progress (one line per op, with the time taken) goes to stderr; the table to stdout.
Exit status 1 when any op disagrees.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import lockstep from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import given, seed, settings  # noqa: E402
from hypothesis.errors import HypothesisException  # noqa: E402

from lockstep.contract import OP_NAMES  # noqa: E402
from lockstep.conformance import search  # noqa: E402


@dataclass
class OpReport:
    op: str
    backends: list[str]
    examples: int = 0
    refused: int = 0
    disagreements: int = 0
    seconds: float = 0.0
    failure: str = ""


@dataclass
class _Counter:
    examples: int = 0
    refused: int = 0
    failed: bool = False
    messages: list[str] = field(default_factory=list)


def search_op(op: str, backends, examples: int, run_seed: int) -> OpReport:
    """Run the deep search of one op; the counts and, if any, the shrunk disagreement."""
    count = _Counter()

    @seed(run_seed)
    @settings(settings.get_profile(search.DEEP_PROFILE), max_examples=examples)
    @given(call=search.strategy_for(op))
    def run(call):
        problems, refused = search.check_call_counted(call, backends)
        if not count.failed:
            count.examples += 1
            count.refused += refused
        if problems:
            count.failed = True
            raise AssertionError(f"{op} disagrees:\n  " + "\n  ".join(problems) + f"\n  call: {call!r}")

    report = OpReport(op, [b.name for b in backends])
    t0 = time.perf_counter()
    try:
        run()
    except (AssertionError, HypothesisException, Exception) as e:  # noqa: BLE001 - every failure is a finding
        report.disagreements = 1
        report.failure = f"{type(e).__name__}: {e}"
    report.seconds = time.perf_counter() - t0
    report.examples, report.refused = count.examples, count.refused
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tools.conformance_search", description=__doc__.split("\n")[0])
    p.add_argument("--examples", type=int, default=search.DEEP_EXAMPLES, help="examples per op (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default %(default)s)")
    p.add_argument("--ops", default="", help="comma-separated ops (default: every op of the contract)")
    p.add_argument("--database", default=search.DEFAULT_DEEP_DATABASE, help="example database folder (default %(default)s)")
    p.add_argument("--json", default="", help="write the reports here as JSON")
    args = p.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o] or list(OP_NAMES)
    unknown = [o for o in ops if o not in OP_NAMES]
    if unknown:
        print(f"conformance_search: unknown op(s) {', '.join(unknown)}; known: {', '.join(OP_NAMES)}", file=sys.stderr)
        return 1
    # drawn inputs overflow float32 casts on purpose; NumPy's RuntimeWarnings there are not findings
    warnings.simplefilter("ignore", RuntimeWarning)
    search.register_profiles(deep_database=args.database)
    backends, missing = search.installed_backends()
    print(f"backends: {', '.join(b.name for b in backends)}", file=sys.stderr)
    for name, why in missing.items():
        print(f"skipped backend {name}: {why}", file=sys.stderr)
    reports, t_start = [], time.perf_counter()
    for i, op in enumerate(ops):
        r = search_op(op, backends, args.examples, args.seed)
        reports.append(r)
        print(f"[{i + 1}/{len(ops)}] {op}: {r.examples} examples ({r.refused} refused by the spec), "
              f"{r.disagreements} disagreements, {r.seconds:.0f} s (total {time.perf_counter() - t_start:.0f} s)",
              file=sys.stderr, flush=True)
        if args.json:  # after every op, so a long run that is stopped keeps what it did
            write_json(Path(args.json), reports, args, backends, missing)
    print_table(reports, args, backends)
    return 1 if any(r.disagreements for r in reports) else 0


def write_json(path: Path, reports: list[OpReport], args, backends, missing: dict) -> None:
    doc = {"seed": args.seed, "examples_per_op": args.examples, "backends": [b.name for b in backends],
           "skipped_backends": missing, "machine": platform.platform(), "cpus": os.cpu_count(),
           "reports": [asdict(r) for r in reports]}
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def print_table(reports: list[OpReport], args, backends) -> None:
    print(f"conformance search: seed {args.seed}, {args.examples} examples per op, backends {', '.join(b.name for b in backends)}")
    print(f"{'op':<24} {'examples':>8} {'refused':>8} {'disagree':>8} {'seconds':>8}")
    for r in reports:
        print(f"{r.op:<24} {r.examples:>8} {r.refused:>8} {r.disagreements:>8} {r.seconds:>8.0f}")
    total = sum(r.examples for r in reports)
    print(f"{'total':<24} {total:>8} {sum(r.refused for r in reports):>8} {sum(r.disagreements for r in reports):>8} "
          f"{sum(r.seconds for r in reports):>8.0f}")
    for r in reports:
        if r.failure:
            print(f"\n{r.op}: {r.failure}")


if __name__ == "__main__":
    sys.exit(main())
