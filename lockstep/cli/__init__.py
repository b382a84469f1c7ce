"""The ``lockstep`` command: ``version``, ``conformance``, ``data``, ``train``, ``audit``, ``sample``,
``eval``, ``export``.

One convention: each module of this package owns a group of commands and has
``add_parser(subparsers)``, which adds them with their handler as ``func``; a handler
takes the parsed arguments and returns the exit status (0 done / valid, 1 could not
run, 2 invalid / mismatch). The modules are imported whole, so a broken one fails
``lockstep`` with its traceback instead of dropping its commands from ``--help``. A
command that needs an optional package imports it when it runs; if it is not
installed the command says which package and extra, in one line, and exits 1.
"""

from __future__ import annotations

import sys

from . import audit, conformance, data, train, use
from .common import EXIT_ERROR, OneLineErrorParser, missing_optional_package

COMMAND_MODULES = (conformance, data, train, audit, use)


def build_parser() -> OneLineErrorParser:
    p = OneLineErrorParser(prog="lockstep", description="Bit-exact, auditable language-model training.")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.add_parser(sub)
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
    except ModuleNotFoundError as exc:
        message = missing_optional_package(exc)
        if message is None:
            raise
        print(f"lockstep {args.command}: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
