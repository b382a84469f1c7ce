"""The ``lockstep`` command: ``version``, ``conformance``, ``data``, ``train``, ``audit``, ``sample``,
``eval``, ``export``."""

from __future__ import annotations

import argparse
import platform
import sys


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
    from lockstep.spec import SPEC_VERSION

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
    from lockstep.backends import BackendUnavailable, get_backend
    from lockstep.conformance.runner import all_passed, print_table, run_conformance

    if args.report:
        return conformance_report(args)
    try:
        backend = get_backend(args.backend)
    except (BackendUnavailable, ValueError) as e:
        print(f"lockstep conformance: {e}", file=sys.stderr)
        return 1
    ops = args.ops.split(",") if args.ops else None
    try:
        results = run_conformance(backend, level=args.level, seed=args.seed, max_errors=args.max_errors, ops=ops)
    except ValueError as e:
        print(f"lockstep conformance: {e}", file=sys.stderr)
        return 1
    print_table(results, backend, args.level, args.seed)
    return 0 if all_passed(results) else 2


def conformance_report(args) -> int:
    """``--report FILE``: conformance, tiny training steps and the flush probe, written to FILE."""
    from pathlib import Path

    from lockstep.conformance.report import build_report, exit_status, write_report

    path = Path(args.report)
    if args.ops:
        print("lockstep conformance: --report runs every op; drop --ops", file=sys.stderr)
        return 1
    if not path.parent.is_dir():
        print(f"lockstep conformance: cannot write the report {path}: {path.parent} is not a folder", file=sys.stderr)
        return 1
    report = build_report(args.backend, level=args.level, seed=args.seed)
    write_report(report, path)
    print(f"{report['verdict']}")
    print(f"report written to {path}: attach it to an issue")
    return exit_status(report)


def plain_help(docstring: str) -> str:
    """A module docstring as ``--help`` text: without reStructuredText's double backticks."""
    return docstring.replace("``", "")


class OneLineErrorParser(argparse.ArgumentParser):
    """A usage error is one line (``lockstep train: error: ...``), printed by rank 0 only under mpiexec."""

    def error(self, message: str):
        from lockstep.train.trainer import launcher_rank

        if launcher_rank() == 0:
            print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        self.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="lockstep", description="Bit-exact, auditable language-model training.")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("version", help="package, SPEC_VERSION, NumPy and the CPU features NumPy dispatches on")
    v.set_defaults(func=cmd_version)

    c = sub.add_parser("conformance", help="compare a backend with the spec, byte for byte")
    c.add_argument("--backend", default="spec", help="spec, numba, opencl, cuda or metal (default: spec)")
    c.add_argument("--level", type=int, choices=(1, 2), default=1, help="1: boundary values and small random sets; 2: larger")
    c.add_argument("--seed", type=int, default=0, help="seed of the random inputs (the golden cases always use seed 0)")
    c.add_argument("--max-errors", type=int, default=10, help="mismatching elements to print in all")
    c.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    c.add_argument("--report", metavar="FILE", default="",
                   help="also train tiny steps against the spec and run the flush probe, and write everything to "
                        "FILE (Markdown, with the JSON at its end) to attach to an issue")
    c.set_defaults(func=cmd_conformance)

    try:
        from lockstep.data_cli import add_data_parser, run_data
    except ImportError:
        pass
    else:
        add_data_parser(sub).set_defaults(func=run_data)
    try:
        from lockstep.train_cli import add_train_parser
    except ImportError:
        pass
    else:
        add_train_parser(sub)
    try:
        from lockstep.audit_cli import add_audit_parser
    except ImportError:
        pass
    else:
        add_audit_parser(sub)
    try:
        from lockstep.use_cli import add_use_parsers
    except ImportError:
        pass
    else:
        add_use_parsers(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        # argparse exits 2 on a usage error; lockstep reserves 2 for "invalid / mismatch"
        return 1 if e.code == 2 else int(e.code or 0)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
