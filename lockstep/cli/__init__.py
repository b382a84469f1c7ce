"""The ``lockstep`` command: ``version``, ``conformance``, ``data``, ``train``, ``audit``, ``sample``,
``eval``, ``export``.

One convention: each module of this package owns a group of commands and has
``add_parser(subparsers)``, which adds them with their handler as ``func``; a handler
takes the parsed arguments and returns the exit status (0 done / valid, 1 could not
run, 2 invalid / mismatch; ``train`` also 130/143 when a signal stopped it). Everything a
command prints goes through ``common.say``/``note``/``fail``, which escape it. A reader that
closes stdout or stderr early (``lockstep audit verify RUN | head -1``) is handled here, for
every command: the command stops quietly, as a Unix tool that SIGPIPE ends, and exits
``EXIT_PIPE_CLOSED`` (141), never 0. An error lockstep raises on purpose
(``lockstep.errors.LockstepError``) is one line and exit 1; any other exception is a bug
and ends with its traceback; ``lockstep --debug CMD`` (or ``LOCKSTEP_DEBUG=1``) prints the
traceback of a reported error too. The modules are imported whole, so a broken one fails
``lockstep`` with its traceback instead of dropping its commands from ``--help``. A
command that needs an optional package imports it when it runs; if it is not
installed the command says which package and extra, in one line, and exits 1.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

from . import audit, conformance, data, train, use
from lockstep.errors import LockstepError

from .common import (DEBUG, EXIT_PIPE_CLOSED, OneLineErrorParser, debug_requested, fail, missing_optional_package, note,
                     said)

COMMAND_MODULES = (conformance, data, train, audit, use)


def build_parser() -> OneLineErrorParser:
    p = OneLineErrorParser(prog="lockstep", description="Bit-exact, auditable language-model training.")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an error as well as its line (also: LOCKSTEP_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.add_parser(sub)
    return p


def main(argv=None) -> int:
    try:
        with _warnings_escaped():
            code = _run(argv)
        sys.stdout.flush()  # the buffered rest meets a closed pipe here, where it is handled, not at exit
        return code
    except BrokenPipeError:
        _silence_closed_streams()
        return EXIT_PIPE_CLOSED


@contextlib.contextmanager
def _warnings_escaped():
    """Python warnings (a library's, which may quote what it was given: a font's missing glyph) are
    printed as every other line is, escaped (``common.note``), while the command runs."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        for text in warnings.formatwarning(message, category, filename, lineno, line).splitlines():
            note(text)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def _run(argv) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        # argparse exits 2 on a usage error; lockstep reserves 2 for "invalid / mismatch"
        return 1 if e.code == 2 else int(e.code or 0)
    token = DEBUG.set(debug_requested(args.debug))
    try:
        return int(args.func(args) or 0)
    except LockstepError as exc:  # an error lockstep raises on purpose that the command did not report itself
        return fail(args.command, f"{type(exc).__name__}: {said(exc)}")
    except ModuleNotFoundError as exc:
        message = missing_optional_package(exc)
        if message is None:
            raise
        return fail(args.command, message)
    except KeyboardInterrupt:
        note("interrupted")
        return 130
    finally:
        DEBUG.reset(token)


def _silence_closed_streams() -> None:
    """Point stdout and stderr, where their reader has gone, at the null device: what they still
    buffer goes nowhere, and the interpreter's last flush cannot fail (and print) again."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the closed pipe (or a stream already closed)
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
