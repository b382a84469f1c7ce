"""What every ``lockstep`` command shares: exit codes, the one place that prints (``say``, ``note``,
``fail``: every line escaped), the one-line usage error, argument types, the default backend, and the
message for an optional package that is not installed."""

from __future__ import annotations

import argparse
import contextvars
import os
import sys
import traceback

from lockstep import backends
from lockstep.backends import BackendUnavailable
from lockstep.fsio import printable
from lockstep.launch import launcher_rank

EXIT_OK, EXIT_ERROR, EXIT_BAD = 0, 1, 2  # done / valid; could not run; invalid / mismatch
# stdout's or stderr's reader went away (``| head``): 128 + SIGPIPE, what a shell reports for a Unix tool
# that SIGPIPE ended (a constant: Windows has no SIGPIPE)
EXIT_PIPE_CLOSED = 141

# optional packages some commands import on use, and the extra of pyproject.toml that brings each
OPTIONAL_PACKAGES = {
    "matplotlib": "io", "safetensors": "io", "cryptography": "io", "mpi4py": "mpi", "numba": "numba",
    "pyopencl": "opencl", "cupy": "cuda", "tokenizers": "test", "hypothesis": "test",
}


def plain_help(docstring: str) -> str:
    """A module docstring as ``--help`` text: without reStructuredText's double backticks."""
    return docstring.replace("``", "")


class OneLineErrorParser(argparse.ArgumentParser):
    """A usage error is one line (``lockstep train: error: ...``), printed by rank 0 only under mpiexec."""

    def error(self, message: str):
        if launcher_rank() == 0:
            note(f"{self.prog}: error: {message} (see {self.prog} --help)")
        self.exit(2)


def say(message: str) -> None:
    """One line on stdout: a result, or a line the library reports through its ``log``/``say`` callback.

    Escaped (``fsio.printable``): the library's lines quote what a run's publisher chose (a model
    name, a data folder, a path), and a control character must not reach the terminal.
    """
    print(printable(message), flush=True)


def note(message: str) -> None:
    """One line on stderr (a progress line, a warning, an error), escaped as ``say`` escapes."""
    print(printable(message), file=sys.stderr, flush=True)


# ``lockstep --debug`` (or LOCKSTEP_DEBUG=1): the command being run prints the traceback of the error it
# reports. Set by ``lockstep.cli.main`` for the length of one command; nothing else sets it.
DEBUG: contextvars.ContextVar[bool] = contextvars.ContextVar("lockstep_debug", default=False)


def debug_requested(flag: bool) -> bool:
    """``--debug`` given, or ``LOCKSTEP_DEBUG`` set to anything but empty or 0."""
    return flag or os.environ.get("LOCKSTEP_DEBUG", "") not in ("", "0")


# the command line's name for each library setting whose flag is not ``--`` and the keyword with dashes
FLAG_OF_SETTING = {"run_dir": "--out", "out_dir": "--out", "tokenizer_file": "--tokenizer", "sets": "--set",
                   "key_path": "--key", "trusted_keys": "--pub", "keys": "--pub"}


def flag_of(setting: str) -> str:
    """The flag that gives the library setting ``setting``: ``max_memory`` -> ``--max-memory``, ``run_dir`` -> ``--out``."""
    return FLAG_OF_SETTING.get(setting, "--" + setting.replace("_", "-"))


def said(exc: BaseException) -> str:
    """An error's one line in the command line's words: the settings a ``LockstepError`` names
    (``LockstepError.worded``) as the flags that give them; any other error's own text."""
    worded = getattr(exc, "worded", None)
    return worded(flag_of) if callable(worded) else str(exc)


def fail(command: str, message: str) -> int:
    """``lockstep COMMAND: MESSAGE`` on stderr (escaped: messages quote files), and ``EXIT_ERROR``.

    Called while an exception is handled, with ``--debug``, its traceback is printed first (escaped).
    """
    if DEBUG.get() and sys.exc_info()[0] is not None:
        for line in traceback.format_exc().splitlines():  # escaped too: the messages quote files
            note(line)
    note(f"lockstep {command}: {message}")
    return EXIT_ERROR


def missing_optional_package(exc: ModuleNotFoundError) -> str | None:
    """The one-line message for an optional package that is not installed; None for any other import error
    (a missing lockstep module or a broken install is a bug, and must surface with its traceback)."""
    top = (exc.name or "").partition(".")[0]
    extra = OPTIONAL_PACKAGES.get(top)
    if extra is None:
        return None
    return f"this needs the optional package {top!r}, which is not installed: pip install 'lockstep[{extra}]'"


def integer_arg(text: str) -> int:
    """An integer argument (``ArgumentTypeError``, shown as one usage line, for anything else)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    value = integer_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def gib(text: str) -> float:
    """``--max-memory``: a positive number of GiB (2**30 bytes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of GiB, got {text!r}") from None
    if not 0 < value < 2**40:
        raise argparse.ArgumentTypeError(f"must be a positive number of GiB, got {text}")
    return value


MAX_MEMORY_HELP = ("the memory budget in GiB (default: this machine's memory): the cheapest plan whose modelled "
                   "peak fits is chosen and printed in one line, and a budget no plan fits is refused before "
                   "anything is allocated")


def non_negative_int(text: str) -> int:
    value = integer_arg(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def default_backend() -> str:
    """numba, or ``BackendUnavailable`` saying why not: never a silent switch to the ~60x slower spec."""
    try:
        backends.get_backend("numba")
    except BackendUnavailable as exc:
        raise BackendUnavailable(f"{said(exc)}; or pass --backend spec to run on the pure-NumPy spec "
                                 "(the same bits, about 60x slower)") from None
    except Exception as exc:  # noqa: BLE001 - a broken install must be reported, not papered over
        raise BackendUnavailable(f"the numba backend does not load here ({type(exc).__name__}: {exc}); "
                                 "repair it (`lockstep conformance --backend numba`), or pass --backend spec "
                                 "(the same bits, about 60x slower)") from None
    return "numba"
