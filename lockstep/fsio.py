"""Files that may come from strangers, and files that must survive a crash.

* Writes are atomic: the bytes go to a temporary name in the target's folder, the
  file is fsynced, ``os.replace`` puts it in place, and the folder is fsynced, so a
  reader (or a crash) sees the old file or the new one, never half of one.
* Paths inside a run directory go through ``safe_join``, which refuses absolute
  paths, ``..`` and symlinks that lead out of the root.
* JSON is read strictly (no duplicate keys, no NaN/Infinity), with errors that
  name the file.
* Tensors are stored as safetensors, read and written here without the
  ``safetensors`` package and never with pickle. The format: ``u64 LE N``, then
  N bytes of UTF-8 JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
  "__metadata__": {str: str}}``, then the raw little-endian C-order data;
  offsets are relative to the start of the data and tile it exactly.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

MAX_JSON_BYTES = 64 << 20  # a run's JSON files are small; refuse to parse anything huge
SAFETENSORS_MAX_HEADER = 100_000_000  # the same bound as the reference implementation
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
    """A fresh temporary name beside ``path``: ``.NAME.tmp-PID-RANDOM``."""
    p = Path(path)
    return p.with_name(f".{p.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """Open a binary file that appears at ``path`` only if the body finishes.

    Temp file in the same folder, fsync, ``os.replace``, fsync of the folder. On an
    exception the temp file is removed and ``path`` is untouched.
    """
    path = Path(path)
    tmp = temp_name(path)
    f = open(tmp, "xb")
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, path)
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` to ``path`` atomically (see ``atomic_writer``)."""
    with atomic_writer(path) as f:
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
# Untrusted paths and JSON
# ---------------------------------------------------------------------------


def safe_join(root: str | os.PathLike, relpath: str | os.PathLike) -> Path:
    """``root / relpath``, refusing anything that could leave ``root``.

    Refused with ``UnsafePath``: empty paths, absolute paths (``/x``, ``C:\\x``),
    backslashes, NUL bytes, any ``..`` component, and paths whose real location
    (symlinks followed) is outside the real location of ``root``. Symlinks that
    stay inside the root are allowed. Returns the joined (unresolved) path.
    """
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


def parse_json(data: bytes | str, what: str, where: str) -> Any:
    """Parse strict JSON; ``FileFormatError`` names ``what`` and ``where`` on failure."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
    except UnicodeDecodeError as exc:
        raise FileFormatError(f"malformed {what} {where}: not UTF-8 ({exc})") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise FileFormatError(f"malformed {what} {where}: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise FileFormatError(f"malformed {what} {where}: {exc}") from None


def read_json(path: str | os.PathLike, what: str = "JSON file", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read strict JSON from ``path``; errors name the file and what it was meant to be."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise FileFormatError(f"{what} {path} is a directory, expected a JSON file") from None
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


def parse_safetensors(data: bytes | bytearray | memoryview, where: str = "<bytes>") -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Validate and decode safetensors bytes; the arrays are views into ``data``.

    Checks: the length prefix and header bound, strict UTF-8 JSON object, every
    entry's keys, dtype (whitelist), shape (non-negative ints), offsets (integers,
    begin <= end, contiguous from 0 in offset order, so never overlapping),
    ``end - begin == prod(shape) * itemsize``, and that the data ends exactly at
    the file's end (no trailing bytes). ``where`` names the file in errors.
    """
    mv = memoryview(data).cast("B")

    def fail(msg: str, tensor: str | None = None):
        t = f", tensor {tensor!r}" if tensor is not None else ""
        raise SafetensorsError(f"malformed safetensors file {where}{t}: {msg}")

    if len(mv) < 8:
        fail(f"{len(mv)} bytes is too short for the 8-byte header length")
    (n,) = struct.unpack("<Q", mv[:8])
    if n > SAFETENSORS_MAX_HEADER:
        fail(f"header length {n} exceeds the {SAFETENSORS_MAX_HEADER}-byte bound")
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


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read and validate a safetensors file: ``(tensors, metadata)``; never unpickles.

    The arrays are writable views into one buffer holding the file. Errors are
    ``SafetensorsError`` naming the file and, where it applies, the tensor.
    """
    path = Path(path)
    size = os.path.getsize(path)
    buf = bytearray(size)
    with open(path, "rb") as f:
        got = f.readinto(buf)
        extra = f.read(1)
    if got != size or extra:
        raise SafetensorsError(f"safetensors file {path} changed size while being read")
    return parse_safetensors(buf, str(path))
