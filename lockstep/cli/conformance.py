"""``lockstep version`` and ``lockstep conformance``: what this install is, and whether a backend
computes the spec's bits here."""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from lockstep import backends
from lockstep.audit.trace import TraceError
from lockstep.audit.trace_diff import replay_op_file
from lockstep.backends import BackendUnavailable
from lockstep.conformance import sweep
from lockstep.conformance.report import build_report, exit_status, write_report
from lockstep.fsio import printable
from lockstep.spec import SPEC_VERSION

from .common import said


def _cpu_features() -> tuple[list[str], list[str], list[str]]:
    """(baseline, found, not found) SIMD features NumPy dispatches on."""
    try:
        from numpy._core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__, __cpu_features__
    except ImportError:  # pragma: no cover - older layouts
        return [], [], []
    found = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
    missing = [f for f in __cpu_dispatch__ if not __cpu_features__.get(f)]
    return list(__cpu_baseline__), found, missing


def cmd_version(args) -> int:
    import numpy as np

    import lockstep
    base, found, missing = _cpu_features()
    print(f"lockstep {lockstep.__version__}")
    print(f"SPEC_VERSION {SPEC_VERSION}")
    print(f"numpy {np.__version__}")
    print(f"python {platform.python_version()} on {platform.system()} {platform.machine()}")
    print(f"numpy CPU baseline: {' '.join(base) or '-'}")
    print(f"numpy CPU dispatch found: {' '.join(found) or '-'}")
    print(f"numpy CPU dispatch not found: {' '.join(missing) or '-'}")
    return 0


def cmd_conformance(args) -> int:
    # here, not at the top: the runner imports every op's conformance record and their Hypothesis
    # strategies, which add about 0.12 s to the start of every other command
    from lockstep.conformance.runner import all_passed, print_table, run_conformance

    if args.replay_op:
        return replay_op(args)
    if args.blocks and args.level != 3:
        print("lockstep conformance: --blocks is for --level 3 (the exhaustive unary sweeps)", file=sys.stderr)
        return 1
    if args.report and args.level == 3:
        print("lockstep conformance: --report runs levels 1 and 2; run --level 3 on its own", file=sys.stderr)
        return 1
    if args.report:
        return conformance_report(args)
    try:
        backend = backends.get_backend(args.backend)
    except (BackendUnavailable, ValueError) as e:
        print(f"lockstep conformance: {said(e)}", file=sys.stderr)
        return 1
    ops = args.ops.split(",") if args.ops else None
    if args.level == 3:
        return conformance_sweeps(backend, ops, args)
    try:
        results = run_conformance(backend, level=args.level, seed=args.seed, max_errors=args.max_errors, ops=ops)
    except ValueError as e:
        print(f"lockstep conformance: {said(e)}", file=sys.stderr)
        return 1
    print_table(results, backend, args.level, args.seed)
    return 0 if all_passed(results) else 2


def replay_op(args) -> int:
    """``--replay-op FILE [--backend B]``: one disputed op call (``lockstep audit diff --referee``) on the spec,
    and on B when it is named; exit 0 when the file's verdict is reproduced (and B gives the spec's bits)."""
    backend = None if args.backend in ("", "spec") else args.backend
    try:
        text, ok = replay_op_file(args.replay_op, backend)
    except (TraceError, BackendUnavailable, ValueError) as e:
        print(printable(f"lockstep conformance: {said(e)}"), file=sys.stderr)
        return 1
    for line in text.splitlines():
        print(printable(line))
    return 0 if ok else 2


def conformance_sweeps(backend, ops, args) -> int:
    """``--level 3``: every float32 pattern through every unary op, digests against the spec's golden ones.

    Exit 0 when every op passes, 2 when one differs or errs, 3 when none differs but
    some op has no golden digest yet (named, one line per op)."""
    try:
        blocks = sweep.parse_block_range(args.blocks)
        results = sweep.run_sweeps(backend, ops=ops, blocks=blocks, max_errors=args.max_errors)
    except ValueError as e:
        print(f"lockstep conformance: {said(e)}", file=sys.stderr)
        return 1
    sweep.print_sweeps(results, backend, list(blocks))
    statuses = {r.status for r in results}
    if statuses <= {"PASS"}:
        return 0
    return 3 if statuses <= {"PASS", "NO-GOLDEN"} else 2


def conformance_report(args) -> int:
    """``--report FILE``: conformance, tiny training steps and the flush probe, written to FILE."""
    path = Path(args.report)
    if args.ops:
        print("lockstep conformance: --report runs every op; drop --ops", file=sys.stderr)
        return 1
    if not path.parent.is_dir():
        print(f"lockstep conformance: cannot write the report {path}: {path.parent} is not a folder", file=sys.stderr)
        return 1
    report = build_report(args.backend, level=args.level, seed=args.seed, evidence=path.with_suffix(""))
    write_report(report, path)
    print(f"{report['verdict']}")
    print(f"report written to {path}: attach it to an issue")
    return exit_status(report)



def add_parser(subparsers) -> None:
    """Add ``version`` and ``conformance`` to the ``lockstep`` parser."""
    v = subparsers.add_parser("version", help="package, SPEC_VERSION, NumPy and the CPU features NumPy dispatches on")
    v.set_defaults(func=cmd_version)

    c = subparsers.add_parser("conformance", help="compare a backend with the spec, byte for byte")
    c.add_argument("--replay-op", metavar="FILE", default="",
                   help="re-check one op call saved by lockstep audit diff --referee (a safetensors file) on the spec, and "
                        "on --backend when it is not spec")
    c.add_argument("--backend", default="spec", help="spec, numba, opencl, cuda or metal (default: spec)")
    c.add_argument("--level", type=int, choices=(1, 2, 3), default=1,
                   help="1: boundary values and small random sets; 2: larger; 3: every float32 pattern through every "
                        "unary op, as digests against the spec's golden ones (seconds on a GPU, hours on 2 CPU cores)")
    c.add_argument("--seed", type=int, default=0, help="seed of the random inputs (the golden cases always use seed 0)")
    c.add_argument("--max-errors", type=int, default=10, help="mismatching elements to print in all")
    c.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    c.add_argument("--blocks", default="", metavar="A:B",
                   help="level 3 only: sweep blocks A..B-1 of the 256 blocks of 2**24 patterns (block b holds the "
                        "patterns b*2**24 ..), or one block A (default: all)")
    c.add_argument("--report", metavar="FILE", default="",
                   help="also train tiny steps against the spec and run the flush probe, and write everything to "
                        "FILE (Markdown, with the JSON at its end) to attach to an issue")
    c.set_defaults(func=cmd_conformance)
