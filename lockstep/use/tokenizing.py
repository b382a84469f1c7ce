"""A run's Hugging Face tokenizer, guarded: a library panic is a one-line error, never a Rust backtrace.

A ``tokenizer.json`` comes with the run, from a stranger. The ``tokenizers`` library
runs its regular expressions (Oniguruma) and, when one backtracks past the engine's
retry limit, *panics*: Python sees ``pyo3_runtime.PanicException``, a
``BaseException`` that ``except Exception`` does not catch, after the Rust panic hook
has written its message (and, with ``RUST_BACKTRACE``, a backtrace) to file
descriptor 2. ``guarded`` wraps the tokenizer's ``encode``, ``decode`` and
``unrepresentable``: while the library runs, descriptor 2 goes to a private temporary
file; a panic or an error of the library becomes ``TokenizerFailed`` (a ``UseError``)
naming the tokenizer file, and what the library wrote is dropped; otherwise it is
passed on to stderr, escaped (``fsio.printable``). The byte tokenizer is pure Python
and is returned as it is.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from lockstep.formats.tokenizer import ByteTokenizer
from lockstep.fsio import printable

from .run import UseError


class TokenizerFailed(UseError):
    """The run's tokenizer failed (or panicked) on a text or on ids."""


def _is_library_failure(exc: BaseException) -> bool:
    """A panic of a Rust extension (pyo3's ``PanicException``) or an ordinary exception of the library."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        return False
    return type(exc).__name__ == "PanicException" or type(exc) is Exception  # the library raises plain Exception


@contextlib.contextmanager
def _stderr_held():
    """Descriptor 2 goes to a private temporary file for the duration; yields that file."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield tmp
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


class GuardedTokenizer:
    """A Hugging Face tokenizer whose library calls cannot end the process (module docstring)."""

    def __init__(self, tokenizer):
        self._inner = tokenizer

    def __getattr__(self, name):  # kind, vocab_size, eod_id, path, sha256, identity ...
        return getattr(self._inner, name)

    def _call(self, what: str, fn, *args):
        with _stderr_held() as held:
            try:
                result = fn(*args)
            except BaseException as exc:
                if not _is_library_failure(exc) or isinstance(exc, UseError):
                    raise
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                raise TokenizerFailed(
                    f"the run's tokenizer {getattr(self._inner, 'path', '')} failed while it {what} "
                    f"({type(exc).__name__}: {first}); the tokenizer file is damaged or hostile (a regular "
                    "expression that backtracks without end, for one): do not use this run's tokenizer") from None
            held.seek(0)
            said = held.read()
        if said:
            print(printable(said.decode("utf-8", errors="replace").rstrip("\n")), file=sys.stderr)
        return result

    def encode(self, text):
        return self._call("encoded text", self._inner.encode, text)

    def decode(self, ids) -> str:
        return self._call("decoded ids", self._inner.decode, ids)

    def unrepresentable(self, text: str):
        return self._call("encoded text", self._inner.unrepresentable, text)


def guarded(tokenizer):
    """``tokenizer`` with its library calls guarded; the byte tokenizer as it is (it calls no library)."""
    if tokenizer is None or isinstance(tokenizer, (ByteTokenizer, GuardedTokenizer)):
        return tokenizer
    return GuardedTokenizer(tokenizer)
