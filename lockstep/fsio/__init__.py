"""Files that may come from strangers, and files that must survive a crash.

* Every write in lockstep goes through this module. Whole files are written by
  ``atomic_writer``: the bytes go to a fresh temporary name in the target's folder
  (``.NAME.tmp-PID-RANDOM``, 64 random bits, created with ``O_CREAT | O_EXCL |
  O_NOFOLLOW``, so a planted file or symlink under any name is never written
  through), the file is fsynced, ``os.replace`` puts it in place (replacing a symlink
  there, never following it), and the folder is fsynced: a reader (or a crash) sees
  the old file or the new one, never half of one. Line logs (the trajectory, the
  metrics) grow through ``append_line``, which refuses symlinks, FIFOs and devices.
* Files inside a root (a run directory, a checkpoint folder) are read through
  ``open_regular`` / ``read_regular``: the path is walked one component at a time
  from the root with ``O_NOFOLLOW`` (no symlink anywhere, so nothing checked can be
  swapped before it is opened), the file is opened without blocking and must be a
  regular file (not a FIFO, a device or a folder) no larger than a stated cap.
  ``iter_lines`` reads a line log with a cap per line, never the whole file at once.
* ``safe_join`` refuses absolute paths, ``..`` and symlinks that lead out of a root.
* JSON is read strictly (no duplicate keys, no NaN/Infinity, no number that
  overflows to infinity, bounded nesting), with errors that name the file.
* Tensors are stored as safetensors: ``lockstep.fsio.safetensors`` reads and writes
  them without the ``safetensors`` package, and never with pickle.
* ``printable`` escapes control characters in untrusted text before it is printed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import errno
import secrets
import stat
import unicodedata
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from lockstep.errors import LockstepError


MAX_JSON_BYTES = 64 << 20  # a run's JSON files are small; refuse to parse anything huge
class UnsafePath(LockstepError, ValueError):
    """A path from untrusted input would leave its root directory."""


class NotRegularFile(UnsafePath):
    """A path names a symlink, a FIFO, a device or a folder where a regular file must be."""


class FileFormatError(LockstepError, ValueError):
    """A file is malformed; the message names the file and the problem."""


# ---------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory so a rename inside it is durable (no-op where unsupported)."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_name(path: str | os.PathLike) -> Path:
    """A fresh temporary name beside ``path``: ``.NAME.tmp-PID-RANDOM`` (64 random bits)."""
    p = Path(path)
    return p.with_name(f".{p.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}")


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _create_exclusive(path: Path, mode: int) -> IO[bytes]:
    """Create ``path`` for writing; fails if anything (a file, a symlink, dangling or not) is there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    return os.fdopen(fd, "wb")


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: int = 0o644, overwrite: bool = True) -> Iterator[IO[bytes]]:
    """Open a binary file that appears at ``path`` only if the body finishes.

    Exclusive-create of a fresh temporary name in the same folder, fsync,
    ``os.replace`` (or, with ``overwrite=False``, a hard link that fails if ``path``
    exists), fsync of the folder. On an exception the temp file is removed and
    ``path`` is untouched. ``mode`` is the new file's permission bits (before umask).
    """
    path = Path(path)
    tmp = temp_name(path)
    f = _create_exclusive(tmp, mode)
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        if overwrite:
            os.replace(tmp, path)  # a symlink at ``path`` is replaced, never followed
        else:
            os.link(tmp, path, follow_symlinks=False)  # FileExistsError if anything is there
            os.unlink(tmp)
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes | bytearray | memoryview, mode: int = 0o644,
                       overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (see ``atomic_writer``)."""
    with atomic_writer(path, mode, overwrite) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def json_bytes(obj: Any) -> bytes:
    r"""The canonical JSON of lockstep files, as UTF-8 bytes (the bytes the digests hash).

    Python's ``json.dumps(obj, indent=2, sort_keys=True, allow_nan=False,
    ensure_ascii=False)`` plus ``"\n"``, encoded as UTF-8:

    * layout: each element of a non-empty object or array on its own line, indented 2
      spaces a level; separators ``","`` at the end of a line (no trailing space) and
      ``": "`` between a key and its value; empty ``{}`` and ``[]`` on one line; one
      final ``\n``.
    * keys sorted by code point (Python's ``str`` order, the same as UTF-8 byte order);
      int keys are written as strings, and mixing int and str keys is a TypeError.
    * strings: non-ASCII characters are *not* escaped (written as UTF-8, U+2028 too);
      ``"`` and ``\`` are escaped, and the control characters U+0000..U+001F as
      ``\n \r \t \b \f`` or ``\u00XX`` (lowercase hex). A lone surrogate cannot be
      encoded: UnicodeEncodeError.
    * numbers: an ``int`` in decimal; a ``float`` as Python's ``repr`` (the shortest
      decimal that reads back to the same float64: ``2.0``, ``0.1``, ``1e-08``,
      ``1e+16``, ``-0.0``), so a float and an equal int differ (``2.0`` vs ``2``); NaN
      and +-inf are refused (ValueError). NumPy integer, bool and float32 scalars are
      refused (TypeError; a ``numpy.float64`` is a ``float`` and is written as one):
      callers convert to ``int``/``float`` first.
    * ``true``, ``false``, ``null``; a tuple is written as an array.

    A float32 setting (``recipe.FLOAT32_SETTINGS``) is written by ``genesis_recipe`` as
    the float64 of the float32 the ops read, so its ``repr``: ``norm_eps`` 1e-6 is
    ``9.999999974752427e-07``, ``eps`` 1e-8 is ``9.99999993922529e-09``.
    """
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n").encode("utf-8")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as canonical JSON (``json_bytes``) to ``path`` atomically."""
    atomic_write_bytes(path, json_bytes(obj))


# ---------------------------------------------------------------------------
# Regular files inside a root: reads without symlinks, FIFOs or devices; appends
# ---------------------------------------------------------------------------


def file_kind(mode: int) -> str:
    """What an ``st_mode`` is, in words: "a symlink", "a FIFO (named pipe)", "a character device" ..."""
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _not_regular(what: str, shown, mode: int) -> NotRegularFile:
    return NotRegularFile(f"{what} {shown} is {file_kind(mode)}, not a regular file; lockstep reads and writes only "
                          "regular files inside the run: replace it with the file itself (or remove it)")


def _rel_parts(root, relpath) -> list[str]:
    """The components of an untrusted relative path (``UnsafePath`` for absolute, ``..``, NUL ...)."""
    rel = os.fspath(relpath)
    shown = repr(rel)
    if not rel:
        raise UnsafePath(f"empty path inside {root}")
    if "\x00" in rel:
        raise UnsafePath(f"path {shown} contains a NUL byte")
    if "\\" in rel:
        raise UnsafePath(f"path {shown} contains a backslash; use '/' separators")
    if rel.startswith("/") or (len(rel) >= 2 and rel[1] == ":"):
        raise UnsafePath(f"path {shown} is absolute; it must be relative to {root}")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UnsafePath(f"path {shown} contains '..'; it must stay inside {root}")
    return parts


def _open_parent(root, parts: list[str], what: str) -> int:
    """An fd of the folder holding ``root/parts``, walked without following any symlink."""
    fd = os.open(os.fspath(root), os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    here = Path(root)
    try:
        for part in parts[:-1]:
            here = here / part
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise FileNotFoundError(f"{what} not found: {here} does not exist") from None
            if not stat.S_ISDIR(st.st_mode):
                raise NotRegularFile(f"{here} (on the way to {what}) is {file_kind(st.st_mode)}, not a folder; "
                                     "lockstep follows no symlink inside a run: replace it with the folder itself")
            try:
                nfd = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as exc:  # swapped after the check: O_NOFOLLOW / O_DIRECTORY refuse it
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise NotRegularFile(f"{here} (on the way to {what}) became a symlink or a file while being "
                                     "opened; lockstep follows no symlink inside a run") from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def open_regular(root: str | os.PathLike, relpath: str | os.PathLike, what: str = "file",
                 max_bytes: int | None = None) -> Iterator[IO[bytes]]:
    """Open ``root/relpath`` for reading: a regular file reached without symlinks, at most ``max_bytes``.

    Each folder on the way is opened relative to the previous one with
    ``O_NOFOLLOW``, and the file itself without blocking, so a symlink, a FIFO or a
    device is refused (``NotRegularFile``) and nothing can be swapped between the
    check and the read. A larger file is ``FileFormatError``; a missing one
    ``FileNotFoundError``. Messages name the file and ``what`` it was meant to be.
    """
    parts = _rel_parts(root, relpath)
    if not parts:
        raise UnsafePath(f"{what}: the path {os.fspath(relpath)!r} names the root {root} itself")
    shown = Path(root).joinpath(*parts)
    if os.open not in os.supports_dir_fd:  # pragma: no cover - Windows: check by path (a race remains)
        for i in range(1, len(parts) + 1):
            st = os.lstat(Path(root).joinpath(*parts[:i]))
            if (i < len(parts) and not stat.S_ISDIR(st.st_mode)) or (i == len(parts) and not stat.S_ISREG(st.st_mode)):
                raise _not_regular(what, Path(root).joinpath(*parts[:i]), st.st_mode)
        fd = os.open(shown, os.O_RDONLY)
    else:
        dfd = _open_parent(root, parts, what)
        try:
            try:
                st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                raise FileNotFoundError(f"{what} not found: {shown}") from None
            if not stat.S_ISREG(st.st_mode):
                raise _not_regular(what, shown, st.st_mode)  # refused before open: a device is never opened
            try:
                fd = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=dfd)
            except OSError as exc:  # swapped for a symlink after the check: O_NOFOLLOW refuses it
                if exc.errno != errno.ELOOP:
                    raise
                raise NotRegularFile(f"{what} {shown} became a symlink while being opened; lockstep reads only "
                                     "regular files inside the run") from None
        finally:
            os.close(dfd)
    f = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the check and the open
            raise _not_regular(what, shown, st.st_mode)
        if max_bytes is not None and st.st_size > max_bytes:
            raise FileFormatError(f"{what} {shown} is larger than {max_bytes} bytes ({st.st_size}); "
                                  "no lockstep run writes one that large: refusing to read it")
        yield f
    finally:
        f.close()


def read_regular(root: str | os.PathLike, relpath: str | os.PathLike, what: str = "file",
                 max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """All bytes of ``root/relpath`` (see ``open_regular``), at most ``max_bytes``."""
    with open_regular(root, relpath, what, max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileFormatError(f"{what} {Path(root) / relpath} grew past {max_bytes} bytes while being read")
    return data


def read_json_regular(root: str | os.PathLike, relpath: str | os.PathLike, what: str = "JSON file",
                      max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Strict JSON from ``root/relpath``, read through ``read_regular``."""
    return parse_json(read_regular(root, relpath, what, max_bytes), what, str(Path(root) / relpath))


def iter_lines(f: IO[bytes], where: str, max_line: int) -> Iterator[tuple[int, bytes, bool]]:
    """``(line number, line without its newline, whether a newline ended it)``, one line at a time.

    A line longer than ``max_line`` bytes raises ``FileFormatError`` as soon as it is
    seen, so memory stays one line however the file was made (a sparse file of zeros,
    a single huge line).
    """
    n = 0
    while True:
        line = f.readline(max_line + 2)
        if not line:
            return
        n += 1
        ended = line.endswith(b"\n")
        body = line[:-1] if ended else line
        if len(body) > max_line:
            raise FileFormatError(f"{where}:{n}: a line longer than {max_line} bytes; lockstep never writes one: "
                                  "the file is damaged or not what it claims to be")
        yield n, body, ended


def open_named_file(path: str | os.PathLike, what: str = "file", max_bytes: int = MAX_JSON_BYTES) -> IO[bytes]:
    """A file the user named (a certificate, a plan, a key, a trace), open for reading: symlinks the user
    gave are followed, but it must be a regular file (never a FIFO or a device: opened without
    blocking, checked with fstat) of at most ``max_bytes`` when opened. The caller bounds its reads."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    f = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(what, path, st.st_mode)
        if st.st_size > max_bytes:
            raise FileFormatError(f"{what} {path} is larger than {max_bytes} bytes ({st.st_size}); refusing to read it")
    except BaseException:
        f.close()
        raise
    return f


def create_exclusive_at(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """A new file ``name`` in the folder open as ``dir_fd``, created exclusively (never an existing
    file, never through a symbolic link) and open read-write: its descriptor (the caller closes it)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | _CLOEXEC
    return os.open(name, flags, mode, dir_fd=dir_fd)


def read_named_file(path: str | os.PathLike, what: str = "file", max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a file the user named (``open_named_file``'s rules), at most ``max_bytes``."""
    with open_named_file(path, what, max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileFormatError(f"{what} {path} grew past {max_bytes} bytes while being read")
    return data


def check_regular_or_absent(root: str | os.PathLike, relpath: str, what: str = "file") -> None:
    """Raise ``NotRegularFile`` unless ``root/relpath`` is absent or a regular file (reached without symlinks)."""
    try:
        with open_regular(root, relpath, what):
            pass
    except FileNotFoundError:
        pass


_REFUSED_OPEN = {errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EMLINK}


def append_line(path: str | os.PathLike, data: bytes) -> None:
    """Append ``data`` to the regular file ``path`` (created if absent), then fsync.

    A symlink (dangling or not), a FIFO, a device or a folder at ``path`` is refused
    with ``NotRegularFile``: the open neither follows links nor waits for a reader.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno not in _REFUSED_OPEN:
            raise
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            raise exc from None
        raise _not_regular(path.name, path, mode) from None
    with os.fdopen(fd, "wb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path.name, path, mode)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


_ESCAPED_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}


def printable(text: str) -> str:
    """``text`` with every control, format, separator and unassigned character escaped.

    Untrusted strings (file names, auditor names, messages quoting them) pass through
    this before they reach a terminal, so a name cannot start a new line, return the
    cursor or colour the output: a name ``"a\\nVALID"`` prints as ``a\\x0aVALID``.
    """
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in _ESCAPED_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


# ---------------------------------------------------------------------------
# Untrusted paths and JSON
# ---------------------------------------------------------------------------


def safe_join(root: str | os.PathLike, relpath: str | os.PathLike) -> Path:
    """``root / relpath``, refusing anything that could leave ``root``.

    Refused with ``UnsafePath``: empty paths, absolute paths (``/x``, ``C:\\x``),
    backslashes, NUL bytes, any ``..`` component, and paths whose real location
    (symlinks followed) is outside the real location of ``root``. Symlinks that
    stay inside the root are allowed. Returns the joined (unresolved) path.
    """
    parts = _rel_parts(root, relpath)
    shown = repr(os.fspath(relpath))
    root_p = Path(root)
    joined = root_p.joinpath(*parts) if parts else root_p
    real_root = os.path.realpath(root_p)
    real = os.path.realpath(joined)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise UnsafePath(f"path {shown} leads outside {root} (through a symlink, to {real})")
    return joined


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"the number {text[:40]} overflows to infinity; lockstep files hold finite numbers only")
    return x


def parse_json(data: bytes | str, what: str, where: str, exact_decimals: bool = False) -> Any:
    """Parse strict JSON; ``FileFormatError`` names ``what`` and ``where`` on failure.

    Strict: a duplicate key, NaN or Infinity, a number that overflows a float, text that
    is not UTF-8 and nesting beyond Python's recursion limit are refused. With
    ``exact_decimals`` numbers with a point or exponent are ``decimal.Decimal`` (exactly as
    written, never through a binary float: a data manifest's weights).
    """
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
    except UnicodeDecodeError as exc:
        raise FileFormatError(f"malformed {what} {where}: not UTF-8 ({exc})") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants,
                          parse_float=Decimal if exact_decimals else _finite_float)
    except json.JSONDecodeError as exc:
        raise FileFormatError(f"malformed {what} {where}: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise FileFormatError(f"malformed {what} {where}: {exc}") from None


def read_json(path: str | os.PathLike, what: str = "JSON file", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read strict JSON from ``path``; errors name the file and what it was meant to be."""
    path = Path(path)
    try:
        data = read_named_file(path, what, max_bytes)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except NotRegularFile as exc:
        raise FileFormatError(str(exc)) from None
    if len(data) > max_bytes:
        raise FileFormatError(f"{what} {path} is larger than {max_bytes} bytes; refusing to parse it")
    return parse_json(data, what, str(path))
