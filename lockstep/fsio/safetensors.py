"""safetensors files, read and written without the ``safetensors`` package and never with pickle.

The format: ``u64 LE N``, then N bytes of UTF-8 JSON ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {str: str}}``, then the raw
little-endian C-order data; offsets are relative to the start of the data and tile
it exactly. A file is read once, into memory, through ``lockstep.fsio.open_regular``,
and every tensor is a view of that one buffer.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from . import FileFormatError, UnsafePath, atomic_writer, open_regular, parse_json

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


class SafetensorsError(FileFormatError):
    """A safetensors file is malformed; the message names the file (and tensor)."""



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
