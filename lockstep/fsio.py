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
* Tensors are stored as safetensors, read and written here without the
  ``safetensors`` package and never with pickle. The format: ``u64 LE N``, then
  N bytes of UTF-8 JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
  "__metadata__": {str: str}}``, then the raw little-endian C-order data;
  offsets are relative to the start of the data and tile it exactly.
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
import struct
import unicodedata
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

MAX_JSON_BYTES = 64 << 20  # a run's JSON files are small; refuse to parse anything huge
SAFETENSORS_MAX_HEADER = 100_000_000  # the same bound as the reference implementation
SAFETENSORS_MAX_NDIM = 64  # NumPy's limit
SAFETENSORS_ALIGN = 8  # the header is space-padded so the data starts 8-byte aligned

# safetensors dtype code -> little-endian NumPy dtype (the whitelist)
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I8": np.dtype("i1"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "U8": np.dtype("u1"),
    "U32": np.dtype("<u4"),
}
_DTYPE_CODES = {(dt.kind, dt.itemsize): code for code, dt in SAFETENSORS_DTYPES.items()}


class UnsafePath(ValueError):
    """A path from untrusted input would leave its root directory."""


class NotRegularFile(UnsafePath):
    """A path names a symlink, a FIFO, a device or a folder where a regular file must be."""


class FileFormatError(ValueError):
    """A file is malformed; the message names the file and the problem."""


class SafetensorsError(FileFormatError):
    """A safetensors file is malformed; the message names the file (and tensor)."""


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
    """The canonical JSON of lockstep files: sorted keys, 2-space indent, no NaN, final newline."""
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


def read_named_file(path: str | os.PathLike, what: str = "file", max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a file the user named (a certificate, a plan, a key): symlinks the user gave are followed,
    but it must be a regular file (never a FIFO or a device: opened without blocking, checked with fstat)
    of at most ``max_bytes``."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(what, path, st.st_mode)
        if st.st_size > max_bytes:
            raise FileFormatError(f"{what} {path} is larger than {max_bytes} bytes ({st.st_size}); refusing to read it")
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


def parse_json(data: bytes | str, what: str, where: str) -> Any:
    """Parse strict JSON; ``FileFormatError`` names ``what`` and ``where`` on failure."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
    except UnicodeDecodeError as exc:
        raise FileFormatError(f"malformed {what} {where}: not UTF-8 ({exc})") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants,
                          parse_float=_finite_float)
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


# ---------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------


def _dtype_code(name: str, x: np.ndarray) -> str:
    code = _DTYPE_CODES.get((x.dtype.kind, x.dtype.itemsize))
    if code is None:
        allowed = ", ".join(SAFETENSORS_DTYPES)
        raise TypeError(f"tensor {name!r}: dtype {x.dtype} cannot be stored (allowed: {allowed})")
    return code


def safetensors_header(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """The 8-byte length and the space-padded JSON header for ``tensors`` (sorted by name)."""
    header: dict[str, Any] = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"safetensors metadata must map str to str, got {k!r}: {type(v).__name__}")
        header["__metadata__"] = dict(metadata)
    for name in tensors:
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"invalid tensor name {name!r}")
    offset = 0
    for name in sorted(tensors, key=lambda n: n.encode("utf-8")):
        x = tensors[name]
        if not isinstance(x, np.ndarray):
            raise TypeError(f"tensor {name!r} is a {type(x).__name__}, expected a NumPy array")
        code = _dtype_code(name, x)
        header[name] = {"dtype": code, "shape": [int(s) for s in x.shape], "data_offsets": [offset, offset + x.nbytes]}
        offset += x.nbytes
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body += b" " * (-(8 + len(body)) % SAFETENSORS_ALIGN)
    return struct.pack("<Q", len(body)) + body


def _le_bytes(x: np.ndarray) -> memoryview:
    dt = SAFETENSORS_DTYPES[_DTYPE_CODES[(x.dtype.kind, x.dtype.itemsize)]]
    y = np.ascontiguousarray(x, dtype=dt)  # byte-swaps big-endian input; a view otherwise
    return memoryview(y.reshape(-1).view(np.uint8)) if y.size else memoryview(b"")


def write_safetensors_to(f: IO[bytes], tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
    """Write a safetensors file to an open binary file (tensors in sorted-name order)."""
    f.write(safetensors_header(tensors, metadata))
    for name in sorted(tensors, key=lambda n: n.encode("utf-8")):
        f.write(_le_bytes(tensors[name]))


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` (and str->str ``metadata``) to ``path`` atomically as safetensors."""
    with atomic_writer(path) as f:
        write_safetensors_to(f, tensors, metadata)


def parse_safetensors(data: bytes | bytearray | memoryview, where: str = "<bytes>",
                      max_header: int = SAFETENSORS_MAX_HEADER) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Validate and decode safetensors bytes; the arrays are views into ``data``.

    Checks: the length prefix and header bound, strict UTF-8 JSON object, every
    entry's keys, dtype (whitelist), shape (non-negative ints), offsets (integers,
    begin <= end, contiguous from 0 in offset order, so never overlapping),
    ``end - begin == prod(shape) * itemsize``, and that the data ends exactly at
    the file's end (no trailing bytes). ``where`` names the file in errors. A header
    longer than ``max_header`` bytes is refused before it is parsed (checkpoints pass
    a bound their real headers are far below).
    """
    mv = memoryview(data).cast("B")

    def fail(msg: str, tensor: str | None = None):
        t = f", tensor {tensor!r}" if tensor is not None else ""
        raise SafetensorsError(f"malformed safetensors file {where}{t}: {msg}")

    if len(mv) < 8:
        fail(f"{len(mv)} bytes is too short for the 8-byte header length")
    (n,) = struct.unpack("<Q", mv[:8])
    if n > max_header:
        fail(f"header length {n} exceeds the {max_header}-byte bound (a real file of this kind has a far "
             "smaller one); refusing to parse it")
    if 8 + n > len(mv):
        fail(f"header length {n} runs past the end of the {len(mv)}-byte file (truncated?)")
    try:
        header = parse_json(bytes(mv[8 : 8 + n]), "safetensors header of", where)
    except FileFormatError as exc:
        raise SafetensorsError(str(exc)) from None
    if not isinstance(header, dict):
        fail("the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        fail("__metadata__ must map strings to strings")
    data_start, data_len = 8 + n, len(mv) - 8 - n
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            fail("an entry must have exactly the keys dtype, shape, data_offsets", name)
        dtype = SAFETENSORS_DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
        if dtype is None:
            fail(f"dtype {info['dtype']!r} is not one of {', '.join(SAFETENSORS_DTYPES)}", name)
        shape, offs = info["shape"], info["data_offsets"]
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            fail(f"shape {shape!r} must be a list of non-negative integers", name)
        if len(shape) > SAFETENSORS_MAX_NDIM:
            fail(f"{len(shape)} dimensions; at most {SAFETENSORS_MAX_NDIM} are allowed", name)
        if math.prod(max(s, 1) for s in shape) * dtype.itemsize >= 1 << 62:
            fail(f"shape {shape!r} is too large for any array (even with a zero dimension)", name)
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)):
            fail(f"data_offsets {offs!r} must be two integers", name)
        begin, end = offs
        if not 0 <= begin <= end:
            fail(f"data_offsets {offs!r} must satisfy 0 <= begin <= end", name)
        if end > data_len:
            fail(f"data_offsets {offs!r} run past the {data_len} data bytes (truncated?)", name)
        count = math.prod(shape)
        if (end - begin) != count * dtype.itemsize:
            fail(f"data_offsets {offs!r} hold {end - begin} bytes but shape {shape} of {info['dtype']} "
                 f"needs {count * dtype.itemsize}", name)
        entries.append((begin, end, name, dtype, tuple(shape)))
    entries.sort(key=lambda e: (e[0], e[1]))
    pos = 0
    for begin, end, name, _, _ in entries:
        if begin != pos:
            fail(f"data_offsets start at {begin} but the previous tensor ends at {pos} "
                 f"({'overlap' if begin < pos else 'gap'})", name)
        pos = end
    if pos != data_len:
        fail(f"the tensors cover {pos} data bytes but the file has {data_len} (trailing or missing bytes)")
    tensors: dict[str, np.ndarray] = {}
    for begin, end, name, dtype, shape in entries:
        buf = mv[data_start + begin : data_start + end]
        tensors[name] = np.frombuffer(buf, dtype=dtype).reshape(shape) if end > begin else np.zeros(shape, dtype)
    return {k: tensors[k] for k in sorted(tensors, key=lambda n: n.encode("utf-8"))}, dict(metadata)


def read_safetensors(path: str | os.PathLike, max_bytes: int | None = None,
                     max_header: int = SAFETENSORS_MAX_HEADER) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read and validate a safetensors file: ``(tensors, metadata)``; never unpickles.

    The file must be a regular file (not a symlink, FIFO or device) of at most
    ``max_bytes``. The arrays are writable views into one buffer holding the file.
    Errors are ``SafetensorsError`` naming the file and, where it applies, the tensor.
    """
    path = Path(path)
    try:
        with open_regular(path.parent, path.name, "safetensors file", max_bytes) as f:
            size = os.fstat(f.fileno()).st_size
            buf = bytearray(size)
            got = f.readinto(buf)
            extra = f.read(1)
    except (UnsafePath, FileFormatError) as exc:
        raise SafetensorsError(str(exc)) from None
    if got != size or extra:
        raise SafetensorsError(f"safetensors file {path} changed size while being read")
    return parse_safetensors(buf, str(path), max_header)
