"""The training data: token shards, their manifest, and the one global stream of windows.

The stream is a pure function of ``(manifest, seed, seq_len)`` and does not depend on
how many ranks read it, so one machine can rebuild exactly what any rank of a cluster
saw. Every random choice comes from ``PhiloxStream`` and is made with integer
arithmetic; names are hashed with SHA-256 (never Python's ``hash()``).

On disk (a data folder)
-----------------------
``manifest.json`` (UTF-8 JSON, read with duplicate keys, NaN and unknown keys refused)::

    {"format": "lockstep.data-manifest", "version": 2,
     "description": "...",                                   (optional)
     "tokenizer": {"kind": "bytes", "vocab_size": 257, "eod_id": 256},
     "sources": [{"name": "math", "weight": 1, "documents": D, "tokens": T,
                  "validation_documents": V,
                  "shards": [{"tokens_file": "math/00000.tokens.npy", "tokens_sha256": HEX,
                              "offsets_file": "math/00000.offsets.npy", "offsets_sha256": HEX,
                              "documents": d, "tokens": t}, ...]}, ...]}

Version 1 is version 2 without ``validation_documents`` (read as 0); lockstep writes 2.

A shard is two ``.npy`` files (format 1.0, read with ``allow_pickle=False``): the
flat token ids of its documents (1-D ``uint8``, ``uint16`` or ``uint32``, the smallest
holding every id of the shard) and the document offsets (1-D little-endian
``int64``, ``d + 1`` entries, ``offsets[0] = 0``, non-decreasing, last = ``t``);
document ``i`` is ``tokens[offsets[i]:offsets[i+1]]``. Shards hold documents only;
the separator is added by the stream. Paths are relative, inside the folder.
The manifest's identity is the SHA-256 of its bytes (``Manifest.sha256``).

Held-out (validation) documents
-------------------------------
Document ids of a source run shard by shard in manifest order (``0 .. D-1``). The
last ``V = validation_documents`` of them (ids ``D-V .. D-1``, ``0 <= V < D``) are the
source's *validation documents*: the training stream below never yields them, and
``validation_windows`` cuts them into the held-out windows that ``lockstep eval``
measures. The others are the source's *training documents*, ``N_s = D - V``; shard
``k`` holds ``t_k`` of them, its first ``t_k`` documents (``t_k = d_k`` except in
the shards at the end of the source).

Weights
-------
A weight is a JSON number > 0 with at most 6 digits after the decimal point, read
exactly as a decimal (never through a binary float). Its *units* are ``weight *
10**6``, an integer; all units are then divided by their greatest common divisor
(so weights 70, 20, 10 mix exactly like 7, 2, 1). The total ``W`` of the reduced
units must be below ``2**32``.

The stream (the definition)
---------------------------
Sources ``s = 0 .. S-1`` in manifest order, with reduced units ``w_s``, cumulative
``C_s = w_0 + ... + w_s``, ``W = C_{S-1}``, ``N_s`` training documents, and
``name_sha_s = SHA-256(UTF-8 name)`` (32 raw bytes).

1. Mix. ``mix = PhiloxStream(seed, "lockstep.data.mix")``. Document ``g`` (g = 0, 1,
   ...) of the stream comes from the source ``s`` with ``C_{s-1} <= t < C_s``, where
   ``u = mix[2g] * 2**32 + mix[2g+1]`` (a 64-bit integer) and
   ``t = floor(u * W / 2**64)``.
2. Per source. If ``c`` documents of source ``s`` came before document ``g``, it
   takes the source's document number ``c``: epoch ``e = c // N_s``, position
   ``j = c % N_s`` in that epoch's order. A source that runs out simply goes on with
   its next epoch, each epoch in a new order.
3. Epoch order of source ``s``: shards in the order ``keyed_permutation(
   PhiloxStream(seed, "lockstep.data.shard-order", name_sha_s, e), n_shards)``; the
   training documents of shard ``k`` (``k`` = its index in the manifest list) in the
   order ``keyed_permutation(PhiloxStream(seed, "lockstep.data.doc-order", name_sha_s,
   e, k), t_k)``; the epoch order is these document lists concatenated. (With no
   validation documents ``t_k = d_k``: the stream of a version-1 manifest.)
   ``keyed_permutation(stream, n)`` sorts ``0 .. n-1`` by the 64-bit key
   ``stream[2i] * 2**32 + stream[2i+1]`` ascending, ties by index.
4. Documents are joined in stream order, each followed by the tokenizer's ``eod_id``,
   into one flat buffer ``B``. Window ``m`` is ``B[m*(L+1) : (m+1)*(L+1)]`` with
   ``L = seq_len``: consecutive, non-overlapping, cut from the front.
5. Ranks. Rank ``r`` of ``R`` takes the windows ``m`` with ``m % R == r``; nothing in
   steps 1-4 depends on ``R``.

Resume record (``GlobalStream.state_at(m)``, plain JSON)::

    {"format": "lockstep.data-stream-state", "version": 1,
     "manifest_sha256": HEX, "seed": seed, "seq_len": L,
     "window": m, "token": m*(L+1),
     "mix_counter": g,            # documents wholly or partly in windows < m
     "sources": [{"name": ..., "documents_consumed": c_s, "epoch": c_s // N_s,
                  "position_in_epoch": c_s % N_s}, ...],   # manifest order, sum c_s = g
     "partial_document": {"source": name, "document": index in source,
                          "tokens_done": k}}

Document ``g`` is the one window ``m`` starts in; its first ``k`` tokens (0 <= k <=
its length; the separator is the last token) went to earlier windows. That is the
whole partial-window buffer: windows are cut from a flat buffer, so nothing else
carries over. The record names no rank.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Callable, Iterable, Iterator

import numpy as np

from lockstep.fsio import FileFormatError, UnsafePath, atomic_write_bytes, fsync_dir, open_regular, read_regular
from lockstep.spec.philox import PhiloxStream, philox4x32

from .tokenizer import (
    HF_TOKENIZER_FILE,
    ByteTokenizer,
    HFTokenizer,
    TokenizerError,
    file_sha256,
    tokenizer_from_identity,
)

MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20  # about 200,000 shard entries
MANIFEST_FORMAT = "lockstep.data-manifest"
MANIFEST_VERSION = 2  # the version lockstep writes
MANIFEST_VERSIONS = (1, 2)  # the versions it reads (1: no validation_documents)
STATE_FORMAT = "lockstep.data-stream-state"
STATE_VERSION = 1

MIX_PURPOSE = "lockstep.data.mix"
SHARD_ORDER_PURPOSE = "lockstep.data.shard-order"
DOC_ORDER_PURPOSE = "lockstep.data.doc-order"

WEIGHT_DECIMALS = 6  # weights are read to 10**-6
WEIGHT_SCALE = 10**WEIGHT_DECIMALS
MIX_TOTAL_LIMIT = 2**32  # W < 2**32 keeps u * W inside 64-bit halves (see mix_sources)

DEFAULT_SHARD_TOKENS = 1 << 24  # documents are grouped into shards of at most this many tokens
SOURCE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # also a folder name

BATCH_DIGEST_DOMAIN = b"lockstep.batch-digest.v1\x00"
FILE_MODE, DIR_MODE = 0o644, 0o755  # written data is readable by all, like a normal file

_U32 = np.uint64(32)


class DataError(ValueError):
    """Bad data input; the message names the file and says what to do."""


class ManifestMismatch(DataError):
    """A manifest is not the one expected (by digest); checked before it is parsed or any shard is read."""

    def __init__(self, path: Path, got: str, want: str):
        self.path, self.got, self.want = path, got, want
        super().__init__(f"{path}: manifest SHA-256 {got} is not the expected {want}; this is not the data the run "
                         "was trained on: use the run's data folder")


# ---------------------------------------------------------------------------------
# Files: atomic writes and a byte-exact .npy writer
# ---------------------------------------------------------------------------------


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with lockstep's one atomic writer (``fsio.atomic_write_bytes``)."""
    atomic_write_bytes(path, data, mode=FILE_MODE)


def npy_bytes(a: np.ndarray) -> bytes:
    """The exact bytes of a 1-D array in .npy format 1.0, written here so that they do
    not depend on the NumPy version: magic, version 1.0, header length (uint16 LE), the
    header dict padded with spaces and a newline to a multiple of 64 bytes, then the
    little-endian data."""
    a = np.ascontiguousarray(a)
    if a.ndim != 1 or a.dtype.kind not in "ui":
        raise ValueError(f"npy_bytes writes 1-D integer arrays, got {a.dtype} {a.shape}")
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (a.dtype.str, a.shape[0])
    header += " " * ((-(10 + len(header) + 1)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1") + a.tobytes()


def _smallest_uint(max_id: int) -> np.dtype:
    for dt in (np.uint8, np.uint16, np.uint32):
        if max_id <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise DataError(f"token id {max_id} does not fit in uint32")


# ---------------------------------------------------------------------------------
# Weights, permutations and the mix: the integer arithmetic of the stream
# ---------------------------------------------------------------------------------


def weight_units(weight, where: str) -> int:
    """``weight * 10**6`` as an exact integer (see the module docstring)."""
    if isinstance(weight, bool) or not isinstance(weight, (int, Decimal)):
        raise DataError(f"{where}: weight {weight!r} is not a number; give a positive number like 1 or 0.25")
    d = Decimal(weight)
    if not d.is_finite() or d <= 0:
        raise DataError(f"{where}: weight {d:f} is zero or negative; every source needs a weight > 0")
    if d >= MIX_TOTAL_LIMIT:
        raise DataError(f"{where}: weight {d:f} is too large; keep weights below 2**32 (only ratios matter)")
    units = d.scaleb(WEIGHT_DECIMALS)
    if units != units.to_integral_value():
        raise DataError(f"{where}: weight {d:f} has more than {WEIGHT_DECIMALS} digits after the point; round it")
    return int(units)


def reduced_units(units: list[int], where: str) -> list[int]:
    """Units divided by their gcd; the total must stay below 2**32."""
    g = 0
    for u in units:
        g = math.gcd(g, u)
    red = [u // g for u in units]
    if sum(red) >= MIX_TOTAL_LIMIT:
        raise DataError(
            f"{where}: the weights' ratios need a total of {sum(red)} units, over 2**32; use simpler ratios"
        )
    return red


def keyed_permutation(stream: PhiloxStream, n: int) -> np.ndarray:
    """``0 .. n-1`` sorted by the 64-bit key ``stream[2i] * 2**32 + stream[2i+1]``,
    ascending, ties by index (a stable sort): int64 (n,)."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    u = stream.uint32(0, 2 * n).astype(np.uint64)
    keys = (u[0::2] << _U32) | u[1::2]
    return np.argsort(keys, kind="stable").astype(np.int64)


def stream_values(streams: list[PhiloxStream], count: int) -> np.ndarray:
    """Values ``0 .. count-1`` of several streams at once: uint32 (len(streams), count).

    Row i equals ``streams[i].uint32(0, count)``; one broadcast ``philox4x32`` call
    over the streams' keys, with the counter layout of ``PhiloxStream.blocks``."""
    n_blocks = (count + 3) // 4
    b = np.arange(n_blocks, dtype=np.uint64)
    ctr = np.empty((len(streams), n_blocks, 4), dtype=np.uint32)
    ctr[:, :, 0] = (b & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    ctr[:, :, 1] = (b >> _U32).astype(np.uint32)
    ctr[:, :, 2] = np.array([s.nonce[0] for s in streams], dtype=np.uint32)[:, None]
    ctr[:, :, 3] = np.array([s.nonce[1] for s in streams], dtype=np.uint32)[:, None]
    keys = np.stack([s.key for s in streams]).astype(np.uint32)[:, None, :]
    return philox4x32(ctr, keys).reshape(len(streams), -1)[:, :count]


def keyed_permutations(streams: list[PhiloxStream], n: int) -> np.ndarray:
    """``keyed_permutation`` of each stream: int64 (len(streams), n)."""
    if n == 0:
        return np.zeros((len(streams), 0), dtype=np.int64)
    u = stream_values(streams, 2 * n).astype(np.uint64)
    keys = (u[:, 0::2] << _U32) | u[:, 1::2]
    return np.argsort(keys, axis=1, kind="stable").astype(np.int64)


def mix_sources(mix: PhiloxStream, cumulative: np.ndarray, first_doc: int, count: int) -> np.ndarray:
    """Source index of documents ``first_doc .. first_doc+count-1``: int64 (count,).

    ``u = mix[2g] * 2**32 + mix[2g+1]``, ``t = floor(u * W / 2**64)`` computed exactly in
    64-bit halves: ``t = (hi*W + ((lo*W) >> 32)) >> 32`` (with W < 2**32 nothing
    overflows, and flooring in two steps equals flooring once). The source is the
    number of cumulative totals ``C_s <= t``.
    """
    u = mix.uint32(2 * first_doc, 2 * count).astype(np.uint64)
    total = cumulative[-1]
    t = (u[0::2] * total + ((u[1::2] * total) >> _U32)) >> _U32
    return np.searchsorted(cumulative, t, side="right").astype(np.int64)


# ---------------------------------------------------------------------------------
# The manifest
# ---------------------------------------------------------------------------------


def _strict_json(path: Path, text: str | bytes):
    def pairs(items):
        out = {}
        for k, v in items:
            if k in out:
                raise DataError(f"{path}: duplicate key {k!r}; each key may appear once")
            out[k] = v
        return out

    def constant(name):
        raise DataError(f"{path}: {name} is not allowed; numbers must be finite")

    try:
        return json.loads(text, parse_float=Decimal, parse_constant=constant, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path}: malformed JSON at line {e.lineno} column {e.colno} ({e.msg}); "
            "fix the file or rebuild it with `lockstep data ingest` / `lockstep data default`"
        ) from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text; a manifest is a UTF-8 JSON file") from None
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply; a manifest is a few levels deep: rebuild it") from None
    except DataError:
        raise
    except ValueError as e:  # an integer of more than 4300 digits (Python's int-parsing limit)
        raise DataError(f"{path}: malformed JSON ({e}); a manifest's numbers are short: rebuild it") from None


def _expect(obj, keys_required: tuple, keys_optional: tuple, where: str) -> None:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in keys_required if k not in obj]
    if missing:
        raise DataError(f"{where}: missing key(s) {', '.join(missing)}")
    unknown = sorted(set(obj) - set(keys_required) - set(keys_optional))
    if unknown:
        raise DataError(f"{where}: unknown key(s) {', '.join(unknown)}; remove them (a typo?)")


def _expect_int(v, where: str, lo: int = 0, hi: int = 2**63) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < hi:
        raise DataError(f"{where}: expected an integer in [{lo}, {hi}), got {v!r}")
    return v


def _expect_hex(v, where: str) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"[0-9a-f]{64}", v):
        raise DataError(f"{where}: expected a SHA-256 as 64 lowercase hex digits, got {v!r}")
    return v


def safe_child(folder: Path, rel, manifest_path: Path) -> Path:
    """``folder / rel`` for a relative path that stays inside ``folder`` (symlinks too)."""
    if not isinstance(rel, str) or not rel:
        raise DataError(f"{manifest_path}: a file path {rel!r} is not a non-empty string")
    pp = PurePosixPath(rel)
    if pp.is_absolute() or PureWindowsPath(rel).drive or "\\" in rel or ".." in pp.parts:
        raise DataError(
            f"{manifest_path}: path {rel!r} leaves the manifest's folder; "
            f"paths must be relative and inside {folder}: fix the manifest or re-ingest"
        )
    full = folder / pp
    try:
        inside = full.resolve().is_relative_to(folder.resolve())
    except OSError:
        inside = False
    if not inside:
        raise DataError(
            f"{manifest_path}: path {rel!r} resolves outside {folder} (a symlink?); "
            "keep every shard inside the manifest's folder"
        )
    return full


def _check_digest(path: Path, expected: str, manifest_path: Path) -> None:
    if not path.is_file():
        raise DataError(
            f"{path}: file missing (named by {manifest_path}); restore it, or rebuild the data folder "
            "with `lockstep data ingest` / `lockstep data default`"
        )
    actual = file_sha256(path)
    if actual != expected:
        raise DataError(
            f"{path}: SHA-256 {actual} does not match {expected} in {manifest_path}; the file was altered "
            "or truncated: restore it or rebuild the data folder"
        )


def _npy_layout(f, path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data offset)`` from the ``.npy`` header of the open file ``f``.

    Read before any array is made: the declared shape and dtype must account for
    exactly the bytes after the header, so a header declaring a huge shape is refused
    without anything being allocated. Object arrays (pickles) are refused.
    """
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise DataError(f"{path}: unsupported .npy version {version}; rebuild the data folder")
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"{path}: not a readable .npy file ({e}); rebuild the data folder") from None
    if dtype.hasobject:
        raise DataError(f"{path}: an object array (lockstep never unpickles); rebuild the data folder")
    if len(shape) != 1 or fortran and len(shape) > 1:
        raise DataError(f"{path}: a shard array is 1-D, this one has shape {shape}; rebuild the data folder")
    offset = f.tell()
    need = math.prod(shape) * dtype.itemsize
    have = os.fstat(f.fileno()).st_size - offset
    if need != have:
        raise DataError(f"{path}: its .npy header declares shape {shape} of {dtype} ({need} bytes) but the file holds "
                        f"{have}; rebuild the data folder")
    return shape, dtype, offset


def _load_shard_file(folder: Path, rel: str, expected_sha256: str, manifest_path: Path, mmap: bool) -> np.ndarray:
    """A shard's ``.npy`` array, from the very bytes whose SHA-256 was checked.

    The file is opened once, walking down from ``folder`` without following a link
    (``fsio.open_regular``: a regular file, never a FIFO or device); it is hashed, and
    only if the digest is the manifest's is its header read and its array made (mapped
    from the same open file when ``mmap``), so nothing can be swapped in between.
    """
    path = safe_child(folder, rel, manifest_path)
    try:
        with open_regular(folder, rel, "shard file") as f:
            h = hashlib.sha256()
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            if h.hexdigest() != expected_sha256:
                raise DataError(
                    f"{path}: SHA-256 {h.hexdigest()} does not match {expected_sha256} in {manifest_path}; the file was "
                    "altered or truncated: restore it or rebuild the data folder"
                )
            f.seek(0)
            shape, dtype, offset = _npy_layout(f, path)
            if mmap and shape[0]:
                return np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape)
            f.seek(offset)
            return np.frombuffer(f.read(shape[0] * dtype.itemsize), dtype=dtype).reshape(shape)
    except FileNotFoundError:
        raise DataError(
            f"{path}: file missing (named by {manifest_path}); restore it, or rebuild the data folder "
            "with `lockstep data ingest` / `lockstep data default`"
        ) from None
    except (UnsafePath, FileFormatError) as e:
        raise DataError(f"{e}; keep every shard a regular file inside the data folder") from None


@dataclass(frozen=True)
class Shard:
    tokens_file: str  # relative to the manifest's folder
    tokens_sha256: str
    offsets_file: str
    offsets_sha256: str
    documents: int
    tokens: int


@dataclass(frozen=True)
class Source:
    name: str
    weight: int | Decimal  # as written in the manifest
    units: int  # the reduced integer weight used by the mix
    name_sha256: bytes  # SHA-256 of the UTF-8 name: keys the source's permutations
    documents: int
    tokens: int
    shards: tuple[Shard, ...]
    validation_documents: int = 0  # the last ones by id: held out of the training stream

    @property
    def training_documents(self) -> int:
        """``N_s``: the documents the training stream draws from (ids ``0 .. N_s - 1``)."""
        return self.documents - self.validation_documents


class Manifest:
    """A verified data folder: sources, shards and tokenizer identity.

    ``Manifest.load`` checks the structure, every path, every file's SHA-256, the
    offsets, and that every token id is below ``vocab_size``, before anything is used.
    """

    def __init__(self, path: Path, raw: bytes, data: dict, sources: list[Source]):
        self.path = path
        self.folder = path.parent
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.description = data.get("description")
        self.tokenizer_identity: dict = data["tokenizer"]
        self.vocab_size: int = data["tokenizer"]["vocab_size"]
        self.eod_id: int = data["tokenizer"]["eod_id"]
        self.sources: tuple[Source, ...] = tuple(sources)
        self._offsets: dict[tuple[int, int], np.ndarray] = {}
        self._tokens: dict[tuple[int, int], np.ndarray] = {}
        self._bases: dict[int, np.ndarray] = {}

    # -- loading ---------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, expected_sha256: str | None = None) -> "Manifest":
        """Load and verify ``path`` (a manifest.json, or the folder holding one).

        The manifest must be a regular file of at most ``MAX_MANIFEST_BYTES``. With
        ``expected_sha256`` (a run's recipe names it), its digest is compared before
        anything is parsed or any shard is read (``ManifestMismatch``).
        """
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_NAME
        try:
            raw = read_regular(path.parent, path.name, "data manifest", MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            raise DataError(
                f"{path}: no manifest here; build a data folder with `lockstep data ingest --out DIR ...` "
                "or `lockstep data default --out DIR`"
            ) from None
        except (UnsafePath, FileFormatError, OSError) as exc:
            raise DataError(f"{exc}") from None
        got = hashlib.sha256(raw).hexdigest()
        if expected_sha256 is not None and got != expected_sha256:
            raise ManifestMismatch(path, got, expected_sha256)
        data = _strict_json(path, raw)
        m = cls(path, raw, data, cls._check_structure(path, data))
        m._verify_files()
        return m

    @staticmethod
    def _check_structure(path: Path, data) -> list[Source]:
        """Check every field; returns the sources with their reduced weight units."""
        _expect(data, ("format", "version", "tokenizer", "sources"), ("description",), str(path))
        version = data["version"]
        if data["format"] != MANIFEST_FORMAT or isinstance(version, bool) or version not in MANIFEST_VERSIONS:
            raise DataError(
                f"{path}: format {data['format']!r} version {data['version']!r} is not "
                f"{MANIFEST_FORMAT!r} version {' or '.join(map(str, MANIFEST_VERSIONS))}; "
                "rebuild the folder with this lockstep"
            )
        held_key = ("validation_documents",) if version >= 2 else ()
        tok = data["tokenizer"]
        where = f"{path}: tokenizer"
        if isinstance(tok, dict) and tok.get("kind") == ByteTokenizer.kind:
            if tok != ByteTokenizer().identity():
                raise DataError(f"{where}: a bytes tokenizer is exactly {ByteTokenizer().identity()}, got {tok}")
        elif isinstance(tok, dict) and tok.get("kind") == HFTokenizer.kind:
            _expect(tok, ("kind", "file", "sha256", "vocab_size", "eod_id", "eod_token"), (), where)
            _expect_int(tok["vocab_size"], f"{where}.vocab_size", 1, 2**31)
            _expect_int(tok["eod_id"], f"{where}.eod_id", 0, tok["vocab_size"])
            _expect_hex(tok["sha256"], f"{where}.sha256")
            if tok["eod_token"] is not None and not isinstance(tok["eod_token"], str):
                raise DataError(f"{where}.eod_token: expected a string or null")
            _check_digest(safe_child(path.parent, tok["file"], path), tok["sha256"], path)
        else:
            raise DataError(f"{where}: unknown tokenizer {tok!r}; expected kind 'bytes' or 'hf-tokenizers'")

        sources = data["sources"]
        if not isinstance(sources, list) or not sources:
            raise DataError(f"{path}: 'sources' must be a non-empty list; add at least one source")
        names: list[str] = []
        units: list[int] = []
        files: set[str] = set()  # every shard file once: a repeated entry would be read (and hashed) again
        for i, s in enumerate(sources):
            where = f"{path}: sources[{i}]"
            _expect(s, ("name", "weight", "documents", "tokens", "shards") + held_key, (), where)
            name = s["name"]
            if not isinstance(name, str) or not SOURCE_NAME_RE.match(name):
                raise DataError(f"{where}: source name {name!r} must match {SOURCE_NAME_RE.pattern}")
            if name in names:
                raise DataError(f"{where}: source name {name!r} appears twice; names must be unique")
            names.append(name)
            where = f"{path}: source {name!r}"
            units.append(weight_units(s["weight"], where))
            docs = _expect_int(s["documents"], f"{where}.documents")
            toks = _expect_int(s["tokens"], f"{where}.tokens")
            if not isinstance(s["shards"], list):
                raise DataError(f"{where}.shards: expected a list")
            sd = st = 0
            for k, sh in enumerate(s["shards"]):
                w = f"{where} shard {k}"
                _expect(sh, ("tokens_file", "tokens_sha256", "offsets_file", "offsets_sha256", "documents", "tokens"), (), w)
                for key in ("tokens_file", "offsets_file"):
                    if not isinstance(sh[key], str):
                        continue  # refused with its path check
                    norm = str(PurePosixPath(sh[key]))
                    if norm in files:
                        raise DataError(f"{w}: file {sh[key]!r} is listed twice; each shard file may appear once")
                    files.add(norm)
                _expect_hex(sh["tokens_sha256"], f"{w}.tokens_sha256")
                _expect_hex(sh["offsets_sha256"], f"{w}.offsets_sha256")
                sd += _expect_int(sh["documents"], f"{w}.documents")
                st += _expect_int(sh["tokens"], f"{w}.tokens")
            if sd != docs or st != toks:
                raise DataError(
                    f"{where}: shards hold {sd} documents / {st} tokens but the source says {docs} / {toks}; "
                    "the manifest was edited: rebuild it"
                )
            if docs == 0:
                raise DataError(f"{where}: the source is empty (no documents); remove it or give it documents")
            held = _expect_int(s.get("validation_documents", 0), f"{where}.validation_documents")
            if held >= docs:
                raise DataError(
                    f"{where}: validation_documents {held} leaves no training documents (the source has {docs}); "
                    "hold out fewer documents"
                )
        red = reduced_units(units, str(path))
        return [
            Source(
                name=s["name"],
                weight=s["weight"],
                units=u,
                name_sha256=hashlib.sha256(s["name"].encode("utf-8")).digest(),
                documents=s["documents"],
                tokens=s["tokens"],
                validation_documents=s.get("validation_documents", 0),
                shards=tuple(Shard(**sh) for sh in s["shards"]),
            )
            for s, u in zip(sources, red)
        ]

    def _verify_files(self) -> None:
        for si, src in enumerate(self.sources):
            for k, sh in enumerate(src.shards):
                opath = safe_child(self.folder, sh.offsets_file, self.path)
                tpath = safe_child(self.folder, sh.tokens_file, self.path)
                off = _load_shard_file(self.folder, sh.offsets_file, sh.offsets_sha256, self.path, mmap=False)
                if off.ndim != 1 or off.dtype.kind != "i" or off.dtype.itemsize != 8 or off.shape[0] != sh.documents + 1:
                    raise DataError(f"{opath}: offsets must be int64 of {sh.documents + 1} entries; rebuild the shard")
                off = off.astype(np.int64)
                if off[0] != 0 or off[-1] != sh.tokens or np.any(np.diff(off) < 0):
                    raise DataError(f"{opath}: offsets must rise from 0 to {sh.tokens}; rebuild the shard")
                tok = _load_shard_file(self.folder, sh.tokens_file, sh.tokens_sha256, self.path, mmap=sh.tokens > 0)
                if tok.ndim != 1 or tok.dtype.kind != "u" or tok.dtype.itemsize not in (1, 2, 4) or tok.shape[0] != sh.tokens:
                    raise DataError(f"{tpath}: tokens must be 1-D uint8/16/32 of length {sh.tokens}; rebuild the shard")
                for a in range(0, sh.tokens, 1 << 24):
                    top = int(tok[a : a + (1 << 24)].max())
                    if top >= self.vocab_size:
                        raise DataError(
                            f"{tpath}: token id {top} is outside the vocabulary (size {self.vocab_size}); the shard "
                            "was made with another tokenizer: re-ingest with the tokenizer the manifest names"
                        )
                self._offsets[si, k] = off
                self._tokens[si, k] = tok

    # -- access ----------------------------------------------------------------------

    def source_index(self, name: str) -> int:
        for i, s in enumerate(self.sources):
            if s.name == name:
                return i
        raise KeyError(name)

    def shard_bases(self, si: int) -> np.ndarray:
        """First document id of each shard of source ``si``, then the total: int64
        (n_shards + 1,). Document ids run shard by shard in manifest order."""
        if si not in self._bases:
            counts = [sh.documents for sh in self.sources[si].shards]
            self._bases[si] = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        return self._bases[si]

    def shard_training_counts(self, si: int) -> np.ndarray:
        """``t_k``: how many training documents each shard of source ``si`` holds (its first
        ``t_k``): int64 (n_shards,)."""
        base = self.shard_bases(si)
        n_train = self.sources[si].training_documents
        return np.clip(n_train - base[:-1], 0, np.diff(base)).astype(np.int64)

    def document_lengths(self, si: int) -> np.ndarray:
        """Token count of every document of source ``si`` (without the separator): int64."""
        return np.concatenate([np.diff(self._offsets[si, k]) for k in range(len(self.sources[si].shards))])

    def document_tokens(self, si: int, doc: int) -> np.ndarray:
        """The tokens of document ``doc`` of source ``si`` (a view of the mapped shard)."""
        base = self.shard_bases(si)
        k = int(np.searchsorted(base, doc, side="right")) - 1
        off = self._offsets[si, k]
        local = doc - int(base[k])
        return self._tokens[si, k][int(off[local]) : int(off[local + 1])]

    def tokenizer(self):
        """The tokenizer the manifest names (``hf-tokenizers`` needs the package)."""
        return tokenizer_from_identity(self.tokenizer_identity, self.folder)


# ---------------------------------------------------------------------------------
# Writing a data folder
# ---------------------------------------------------------------------------------


def _json_weight(weight, where: str) -> int | float:
    """A weight as the JSON number the manifest stores (checked like the loader does)."""
    if isinstance(weight, (int, Decimal)) and not isinstance(weight, bool):
        d = Decimal(weight)
    else:
        try:
            d = Decimal(str(weight).strip())
        except InvalidOperation:
            raise DataError(f"{where}: weight {weight!r} is not a number; give a positive number like 1 or 0.25") from None
    weight_units(d, where)
    if d == d.to_integral_value():
        return int(d)
    f = float(d)
    if Decimal(repr(f)) != d:
        raise DataError(f"{where}: weight {weight} has too many significant digits; round it")
    return f


class _SourceWriter:
    def __init__(self, owner: "DataWriter", name: str, weight):
        self.owner, self.name, self.weight = owner, name, weight
        self.shards: list[dict] = []
        self._docs: list[np.ndarray] = []
        self._buffered = 0
        self.documents = 0
        self.tokens = 0
        self.validation_documents = 0  # hold out the last this many documents (set before commit)

    def add_document(self, ids) -> None:
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError("a document is a 1-D array of token ids")
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.owner.vocab_size):
            bad = int(ids.max()) if int(ids.max()) >= self.owner.vocab_size else int(ids.min())
            raise DataError(f"source {self.name!r}: token id {bad} is outside the vocabulary ({self.owner.vocab_size})")
        self._docs.append(ids)
        self._buffered += ids.size
        self.documents += 1
        self.tokens += ids.size
        if self._buffered >= self.owner.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if not self._docs:
            return
        lengths = np.array([d.size for d in self._docs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<i8")
        flat = np.concatenate([d.astype(np.int64) for d in self._docs]) if offsets[-1] else np.zeros(0, np.int64)
        flat = flat.astype(_smallest_uint(int(flat.max()) if flat.size else 0))
        k = len(self.shards)
        stem = f"{self.name}/{k:05d}"
        tb, ob = npy_bytes(flat), npy_bytes(offsets)
        write_bytes_atomic(self.owner.staging / f"{stem}.tokens.npy", tb)
        write_bytes_atomic(self.owner.staging / f"{stem}.offsets.npy", ob)
        self.shards.append(
            {
                "tokens_file": f"{stem}.tokens.npy",
                "tokens_sha256": hashlib.sha256(tb).hexdigest(),
                "offsets_file": f"{stem}.offsets.npy",
                "offsets_sha256": hashlib.sha256(ob).hexdigest(),
                "documents": len(self._docs),
                "tokens": int(offsets[-1]),
            }
        )
        self._docs, self._buffered = [], 0


class DataWriter:
    """Builds a data folder all or nothing.

    Everything is written into a hidden staging folder next to ``out_dir`` (each file
    itself atomically), the manifest last; ``commit`` then renames the staging folder to
    ``out_dir`` in one step. On any error (use it as a context manager) the staging
    folder is removed, so ``out_dir`` either does not exist or is complete.
    """

    def __init__(self, out_dir: str | Path, tokenizer, shard_tokens: int = DEFAULT_SHARD_TOKENS, description: str | None = None):
        self.out_dir = Path(out_dir).absolute()
        if self.out_dir.exists() and (not self.out_dir.is_dir() or any(self.out_dir.iterdir())):
            raise DataError(f"{self.out_dir}: already exists and is not an empty folder; choose a new --out or delete it")
        if shard_tokens < 1:
            raise DataError(f"shard size must be at least 1 token, got {shard_tokens}")
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.shard_tokens = int(shard_tokens)
        self.description = description
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.partial-", dir=self.out_dir.parent))
        os.chmod(self.staging, DIR_MODE)
        self.sources: list[_SourceWriter] = []
        self._done = False

    def __enter__(self) -> "DataWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._done:
            self.abort()

    def add_source(self, name: str, weight=1) -> _SourceWriter:
        if not isinstance(name, str) or not SOURCE_NAME_RE.match(name):
            raise DataError(
                f"source name {name!r} must match {SOURCE_NAME_RE.pattern} (letters, digits, '_', '.', '-')"
            )
        if any(s.name == name for s in self.sources):
            raise DataError(f"source name {name!r} given twice; names must be unique")
        sw = _SourceWriter(self, name, _json_weight(weight, f"source {name!r}"))
        (self.staging / name).mkdir()
        self.sources.append(sw)
        return sw

    def manifest_bytes(self) -> bytes:
        for s in self.sources:
            s.flush()
            if s.documents == 0:
                raise DataError(f"source {s.name!r} has no documents; check its input path (empty files are skipped)")
            if not 0 <= s.validation_documents < s.documents:
                raise DataError(
                    f"source {s.name!r}: cannot hold out {s.validation_documents} of its {s.documents} documents "
                    "for validation; hold out fewer (at least one document must stay for training)"
                )
        if not self.sources:
            raise DataError("no sources given; name at least one input folder or file")
        reduced_units([weight_units(Decimal(repr(s.weight)), s.name) for s in self.sources], "weights")
        doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION}
        if self.description:
            doc["description"] = self.description
        doc["tokenizer"] = self.tokenizer.identity()
        doc["sources"] = [
            {"name": s.name, "weight": s.weight, "documents": s.documents, "tokens": s.tokens,
             "validation_documents": s.validation_documents, "shards": s.shards}
            for s in self.sources
        ]
        return (json.dumps(doc, indent=1, ensure_ascii=True) + "\n").encode("ascii")

    def commit(self) -> Path:
        """Write the manifest and move the folder into place; returns the manifest path."""
        raw = self.manifest_bytes()
        if isinstance(self.tokenizer, HFTokenizer):
            data = self.tokenizer.path.read_bytes()
            if hashlib.sha256(data).hexdigest() != self.tokenizer.sha256:
                raise DataError(f"{self.tokenizer.path}: changed while ingesting; run the ingest again")
            write_bytes_atomic(self.staging / HF_TOKENIZER_FILE, data)
        write_bytes_atomic(self.staging / MANIFEST_NAME, raw)
        for d in [*(self.staging / s.name for s in self.sources), self.staging]:
            fsync_dir(d)
        if self.out_dir.exists():
            self.out_dir.rmdir()  # empty (checked at start); fails loudly if someone filled it meanwhile
        os.rename(self.staging, self.out_dir)
        fsync_dir(self.out_dir.parent)
        self._done = True
        return self.out_dir / MANIFEST_NAME

    def abort(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self._done = True


# ---------------------------------------------------------------------------------
# Ingest: .txt / .jsonl documents -> a data folder
# ---------------------------------------------------------------------------------

DOCUMENT_SUFFIXES = (".txt", ".jsonl")


def input_files(path: Path) -> list[Path]:
    """The document files of an input: the file itself, or every .txt/.jsonl under a
    folder (hidden names skipped), sorted by their relative POSIX path."""
    if path.is_file():
        if path.suffix.lower() not in DOCUMENT_SUFFIXES:
            raise DataError(f"{path}: not a .txt or .jsonl file; give a folder of those, or such a file")
        return [path]
    if not path.is_dir():
        raise DataError(f"{path}: no such file or folder; check the input path")
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for f in files:
            if not f.startswith(".") and Path(f).suffix.lower() in DOCUMENT_SUFFIXES:
                found.append(Path(root) / f)
    return sorted(found, key=lambda p: p.relative_to(path).as_posix())


def read_documents(path: Path, text_field: str = "text") -> Iterator[tuple[str, str | bytes]]:
    """(where, document) pairs of one file: a .txt file is one document (its raw bytes);
    a .jsonl file has one JSON object per line with a string field ``text_field``
    (blank lines skipped)."""
    if path.suffix.lower() == ".txt":
        yield str(path), path.read_bytes()
        return
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DataError(f"{where}: malformed JSON line ({e}); fix or remove the line") from None
            if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
                raise DataError(
                    f"{where}: expected an object with a string field {text_field!r}; "
                    "fix the line or pass --text-field NAME"
                )
            yield where, obj[text_field]


class _Progress:
    """Prints a line at most once a second (and when told to) via ``emit``."""

    def __init__(self, emit: Callable[[str], None] | None, every_s: float = 1.0):
        self.emit, self.every_s, self.last = emit, every_s, time.monotonic()

    def __call__(self, msg: Callable[[], str], force: bool = False) -> None:
        if self.emit is None:
            return
        now = time.monotonic()
        if force or now - self.last >= self.every_s:
            self.last = now
            self.emit(msg())


def ingest(
    out_dir: str | Path,
    inputs: Iterable[tuple[str, str | Path, object]],
    tokenizer_file: str | Path | None = None,
    eod_token: str | None = None,
    text_field: str = "text",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    progress: Callable[[str], None] | None = None,
    validation_documents: int = 0,
) -> Path:
    """Tokenize ``inputs`` ((name, path, weight) per source) into a new data folder.

    Returns the manifest path. Documents are read in sorted file order; empty
    documents are skipped. ``progress`` gets a status line about once a second.
    ``validation_documents``: each source holds out its last this many documents
    (in that order) for validation; the training stream never yields them.
    """
    if isinstance(validation_documents, bool) or not isinstance(validation_documents, int) or validation_documents < 0:
        raise DataError(f"--validation-documents must be a non-negative integer, got {validation_documents!r}")
    if tokenizer_file is None:
        if eod_token is not None:
            raise DataError("--eod-token applies only with --tokenizer; the byte tokenizer's separator is id 256")
        tok = ByteTokenizer()
    else:
        try:
            tok = HFTokenizer(tokenizer_file, eod_token=eod_token)
        except TokenizerError as e:
            raise DataError(str(e)) from None
    inputs = [(n, Path(p), w) for n, p, w in inputs]
    plan = [(n, input_files(p), w) for n, p, w in inputs]  # fail on a bad path before writing
    tick = _Progress(progress)
    with DataWriter(out_dir, tok, shard_tokens=shard_tokens) as writer:
        for name, files, weight in plan:
            sw = writer.add_source(name, weight)
            skipped = 0
            for i, f in enumerate(files):
                for where, text in read_documents(f, text_field):
                    try:
                        ids = tok.encode(text)
                    except UnicodeDecodeError:
                        raise DataError(f"{where}: not UTF-8 text; the tokenizer needs UTF-8 (or use the byte tokenizer)") from None
                    if ids.size == 0:
                        skipped += 1
                        continue
                    sw.add_document(ids)
                tick(lambda: f"ingest: {name}: {i + 1}/{len(files)} files, {sw.documents} documents, {sw.tokens} tokens")
            tick(
                lambda: f"ingest: {name}: {len(files)} files, {sw.documents} documents, {sw.tokens} tokens"
                + (f", {skipped} empty skipped" if skipped else ""),
                force=True,
            )
            if sw.documents == 0:
                where = dict((n, p) for n, p, _ in inputs)[name]
                raise DataError(f"{where}: source {name!r} has no documents; give it .txt/.jsonl files with text")
            sw.validation_documents = validation_documents
        return writer.commit()


# ---------------------------------------------------------------------------------
# The global stream
# ---------------------------------------------------------------------------------

PLAN_CHUNK = 1024  # documents planned at once; an implementation detail, not part of the stream
_EPOCH_CACHE = 16  # source epochs whose order is kept in memory
_SHARD_PERM_CACHE = 4  # shard document orders kept per epoch
_CHUNK_CACHE = 8  # planned chunks kept in memory


class _EpochOrder:
    """Step 3 for one (source, epoch), built lazily: the shard order at once, each
    shard's document order when a position inside it is first asked for. Memory is
    O(shards + documents of the shards in use), not O(documents of the source)."""

    def __init__(self, seed: int, src: Source, bases: np.ndarray, training: np.ndarray, epoch: int):
        self.seed, self.src, self.bases, self.training, self.epoch = seed, src, bases, training, epoch
        self.shard_order = keyed_permutation(
            PhiloxStream(seed, SHARD_ORDER_PURPOSE, src.name_sha256, epoch), len(src.shards)
        )
        counts = training[self.shard_order]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # epoch position of each block
        self._perms: OrderedDict[int, np.ndarray] = OrderedDict()

    def _shard_docs(self, k: int) -> np.ndarray:
        if k in self._perms:
            self._perms.move_to_end(k)
        else:
            stream = PhiloxStream(self.seed, DOC_ORDER_PURPOSE, self.src.name_sha256, self.epoch, k)
            self._perms[k] = self.bases[k] + keyed_permutation(stream, int(self.training[k]))
            while len(self._perms) > _SHARD_PERM_CACHE:
                self._perms.popitem(last=False)
        return self._perms[k]

    def documents(self, j: np.ndarray) -> np.ndarray:
        """Document ids at ascending epoch positions ``j``: int64."""
        out = np.empty(j.shape[0], dtype=np.int64)
        block = np.searchsorted(self.starts, j, side="right") - 1
        cuts = np.flatnonzero(np.diff(block)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), j.shape[0]]):
            p = int(block[a])
            out[a:b] = self._shard_docs(int(self.shard_order[p]))[j[a:b] - self.starts[p]]
        return out


@dataclass
class _Chunk:
    """Documents ``c*G .. c*G+G-1`` of the stream (G = PLAN_CHUNK)."""

    index: int
    token_start: int  # buffer position of the chunk's first document
    consumed: np.ndarray  # documents taken from each source before the chunk (S,)
    src: np.ndarray  # source of each document (G,)
    doc: np.ndarray  # document id within its source (G,)
    ends: np.ndarray  # buffer position just past each document's separator (G,)

    def doc_start(self, i: int) -> int:
        return self.token_start if i == 0 else int(self.ends[i - 1])


class GlobalStream:
    """Window ``m`` of the one global token stream of ``(manifest, seed, seq_len)``.

    The definition is in the module docstring. ``windows(start, count)`` returns int32
    ``(count, seq_len + 1)``.

    Cost. Reaching window ``m`` with no record is one pass over the lengths of the
    documents before it: per document two Philox values for the mix and a few integer
    operations (vectorised in chunks of ``PLAN_CHUNK`` documents), plus, per source
    epoch begun, a permutation of its shards and of each shard's documents as the
    stream enters them (O(documents of the shard)). No token is read or copied until
    a window is returned. From a resume record (``from_state``) it costs one chunk of
    that work. The stream remembers every chunk boundary it passed (one small record per
    ``PLAN_CHUNK`` documents), so reading windows in order costs O(1) planning per
    document. Memory: document lengths as int32 (4 bytes per document) plus the
    permutations of the shards in use.

    Only positions at or after a resume record's window rely on the record; the record is
    checked against the mix, the manifest digest, the seed and seq_len, but, like a
    checkpoint, it is trusted for the rest (the batch digests of the trajectory catch a
    forged one).
    """

    def __init__(self, manifest: Manifest, seed: int, seq_len: int):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or int(seq_len) < 1:
            raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
        self.manifest = manifest
        self.seed = int(seed)
        self.seq_len = int(seq_len)
        self.window_tokens = self.seq_len + 1
        self.eod_id = manifest.eod_id
        srcs = manifest.sources
        self._S = len(srcs)
        self._cum = np.cumsum([s.units for s in srcs]).astype(np.uint64)
        self._n_docs = [s.training_documents for s in srcs]
        self._training = [manifest.shard_training_counts(i) for i in range(self._S)]
        self._mix = PhiloxStream(self.seed, MIX_PURPOSE)
        # document lengths with the separator; int32 keeps this pass-over-lengths table small
        self._lengths = [(manifest.document_lengths(i) + 1).astype(np.int32) for i in range(self._S)]
        self._epochs: OrderedDict[tuple[int, int], _EpochOrder] = OrderedDict()
        self._chunks: OrderedDict[int, _Chunk] = OrderedDict()
        # Known chunk boundaries: chunk index -> (token_start, consumed per source).
        self._bounds: dict[int, tuple[int, np.ndarray]] = {0: (0, np.zeros(self._S, dtype=np.int64))}
        self._bound_keys: list[int] = [0]  # sorted; token starts rise with the chunk index
        self._bound_starts: list[int] = [0]

    # -- the definition, piece by piece -------------------------------------------------

    def epoch_order(self, si: int, epoch: int) -> np.ndarray:
        """All document ids of source ``si`` in the order of ``epoch`` (step 3): int64 (N_s,)."""
        order = self._epoch(si, epoch)
        return order.documents(np.arange(self._n_docs[si], dtype=np.int64))

    def _epoch(self, si: int, epoch: int) -> "_EpochOrder":
        key = (si, int(epoch))
        if key in self._epochs:
            self._epochs.move_to_end(key)
        else:
            self._epochs[key] = _EpochOrder(self.seed, self.manifest.sources[si], self.manifest.shard_bases(si),
                                            self._training[si], int(epoch))
            while len(self._epochs) > _EPOCH_CACHE:
                self._epochs.popitem(last=False)
        return self._epochs[key]

    def _small_source_orders(self, si: int, epochs: list[int]) -> np.ndarray:
        """Whole epoch orders of a source, for many epochs at once: (len(epochs), N_s).
        Used when one chunk runs through more than two epochs of a source, so the
        source has fewer documents than a chunk and this stays small."""
        src = self.manifest.sources[si]
        shard_order = keyed_permutations(
            [PhiloxStream(self.seed, SHARD_ORDER_PURPOSE, src.name_sha256, e) for e in epochs], len(src.shards)
        )
        base = self.manifest.shard_bases(si)
        training = self._training[si]
        doc_orders = [
            base[k]
            + keyed_permutations(
                [PhiloxStream(self.seed, DOC_ORDER_PURPOSE, src.name_sha256, e, k) for e in epochs], int(training[k])
            )
            for k in range(len(src.shards))
        ]
        out = np.empty((len(epochs), src.training_documents), dtype=np.int64)
        for row in range(len(epochs)):
            out[row] = np.concatenate([doc_orders[k][row] for k in shard_order[row].tolist()])
        return out

    def _plan(self, c: int, token_start: int, consumed: np.ndarray) -> _Chunk:
        G = PLAN_CHUNK
        src = mix_sources(self._mix, self._cum, c * G, G)
        doc = np.empty(G, dtype=np.int64)
        length = np.empty(G, dtype=np.int64)
        for s in range(self._S):
            idx = np.flatnonzero(src == s)
            if idx.size == 0:
                continue
            pos = int(consumed[s]) + np.arange(idx.size, dtype=np.int64)
            n = self._n_docs[s]
            ep, j = pos // n, pos % n
            e0, e1 = int(ep[0]), int(ep[-1])
            if e1 - e0 >= 2:
                doc[idx] = self._small_source_orders(s, list(range(e0, e1 + 1)))[ep - e0, j]
            else:
                for e in range(e0, e1 + 1):
                    sel = ep == e
                    doc[idx[sel]] = self._epoch(s, e).documents(j[sel])
            length[idx] = self._lengths[s][doc[idx]]
        ends = token_start + np.cumsum(length)
        return _Chunk(c, token_start, consumed.copy(), src, doc, ends)

    def _add_bound(self, c: int, token_start: int, consumed: np.ndarray) -> None:
        if c not in self._bounds:
            self._bounds[c] = (int(token_start), consumed.copy())
            at = bisect.bisect_left(self._bound_keys, c)
            self._bound_keys.insert(at, c)
            self._bound_starts.insert(at, int(token_start))

    def _chunk(self, c: int) -> _Chunk:
        if c in self._chunks:
            self._chunks.move_to_end(c)
            return self._chunks[c]
        if c not in self._bounds:
            prev = self._bound_keys[bisect.bisect_right(self._bound_keys, c) - 1]
            for cc in range(prev, c):
                self._chunk(cc)  # each planned chunk records the next boundary
        start, consumed = self._bounds[c]
        ch = self._plan(c, start, consumed)
        self._add_bound(c + 1, int(ch.ends[-1]), consumed + np.bincount(ch.src, minlength=self._S))
        self._chunks[c] = ch
        if len(self._chunks) > _CHUNK_CACHE:
            self._chunks.popitem(last=False)
        return ch

    def _locate(self, token: int) -> tuple[_Chunk, int]:
        """The chunk and index of the document holding buffer position ``token``."""
        c = self._bound_keys[bisect.bisect_right(self._bound_starts, token) - 1]
        while True:  # every document has at least its separator, so this ends
            ch = self._chunk(c)
            if token < ch.ends[-1]:
                return ch, int(np.searchsorted(ch.ends, token, side="right"))
            c += 1

    def _copy_tokens(self, token: int, out: np.ndarray) -> None:
        """Fill ``out`` with buffer positions ``token .. token+len(out)-1``."""
        ch, i = self._locate(token)
        offset = token - ch.doc_start(i)
        pos, n = 0, out.shape[0]
        while pos < n:
            s, d = int(ch.src[i]), int(ch.doc[i])
            toks = self.manifest.document_tokens(s, d)
            take = min(toks.shape[0] - offset, n - pos)
            if take > 0:
                out[pos : pos + take] = toks[offset : offset + take]
                pos += take
                offset += take
            if pos < n and offset == toks.shape[0]:
                out[pos] = self.eod_id
                pos += 1
            i, offset = i + 1, 0
            if i == PLAN_CHUNK:
                ch, i = self._chunk(ch.index + 1), 0

    # -- public API --------------------------------------------------------------------

    def windows(self, start: int, count: int) -> np.ndarray:
        """Windows ``start .. start+count-1``: int32 ``(count, seq_len + 1)``."""
        start, count = int(start), int(count)
        if start < 0 or count < 0:
            raise ValueError(f"windows needs start >= 0 and count >= 0, got {start}, {count}")
        out = np.empty(count * self.window_tokens, dtype=np.int32)
        if count:
            self._copy_tokens(start * self.window_tokens, out)
        return out.reshape(count, self.window_tokens)

    def document_ids(self, first_doc: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Which documents are stream documents ``first_doc .. first_doc+count-1`` (steps
        1-3): ``(source index, document id within the source)``, two int64 arrays."""
        first_doc, count = int(first_doc), int(count)
        if first_doc < 0 or count < 0:
            raise ValueError(f"document_ids needs first_doc >= 0 and count >= 0, got {first_doc}, {count}")
        src = np.empty(count, dtype=np.int64)
        doc = np.empty(count, dtype=np.int64)
        pos = 0
        while pos < count:
            c, i = divmod(first_doc + pos, PLAN_CHUNK)
            ch = self._chunk(c)
            take = min(PLAN_CHUNK - i, count - pos)
            src[pos : pos + take] = ch.src[i : i + take]
            doc[pos : pos + take] = ch.doc[i : i + take]
            pos += take
        return src, doc

    def windows_at(self, indices) -> np.ndarray:
        """The windows with the given indices, in the given order: int32 ``(n, seq_len + 1)``."""
        idx = [int(m) for m in np.asarray(indices).reshape(-1).tolist()]
        out = np.empty((len(idx), self.window_tokens), dtype=np.int32)
        for row, m in enumerate(idx):
            if m < 0:
                raise ValueError(f"window index must be >= 0, got {m}")
            self._copy_tokens(m * self.window_tokens, out[row])
        return out

    def rank_windows(self, first_window: int, count: int, rank: int, world_size: int) -> np.ndarray:
        """Rank ``rank``'s share of windows ``first_window .. first_window+count-1``:
        those with ``m % world_size == rank``, ascending (see ``rank_window_indices``)."""
        return self.windows_at(rank_window_indices(first_window, count, rank, world_size))

    def state_at(self, m: int) -> dict:
        """The JSON resume record for continuing at window ``m`` (module docstring)."""
        m = int(m)
        if m < 0:
            raise ValueError(f"window index must be >= 0, got {m}")
        token = m * self.window_tokens
        ch, i = self._locate(token)
        consumed = ch.consumed + np.bincount(ch.src[:i], minlength=self._S)
        s = int(ch.src[i])
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "manifest_sha256": self.manifest.sha256,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "window": m,
            "token": token,
            "mix_counter": ch.index * PLAN_CHUNK + i,
            "sources": [
                {
                    "name": src.name,
                    "documents_consumed": int(c),
                    "epoch": int(c) // src.training_documents,
                    "position_in_epoch": int(c) % src.training_documents,
                }
                for src, c in zip(self.manifest.sources, consumed.tolist())
            ],
            "partial_document": {
                "source": self.manifest.sources[s].name,
                "document": int(ch.doc[i]),
                "tokens_done": token - ch.doc_start(i),
            },
        }

    @classmethod
    def from_state(cls, manifest: Manifest, seed: int, seq_len: int, state: dict) -> "GlobalStream":
        """A stream positioned by a ``state_at`` record; its windows are the original's.

        The record is checked against the manifest digest, seed and seq_len, and for
        consistency with the mix (its counts must be the ones the mix produces).
        """
        st = cls(manifest, seed, seq_len)
        where = "data stream state"
        _expect(
            state,
            ("format", "version", "manifest_sha256", "seed", "seq_len", "window", "token", "mix_counter", "sources", "partial_document"),
            (),
            where,
        )
        if state["format"] != STATE_FORMAT or state["version"] != STATE_VERSION:
            raise DataError(f"{where}: not a {STATE_FORMAT} v{STATE_VERSION} record")
        if state["manifest_sha256"] != manifest.sha256:
            raise DataError(
                f"{where}: made for manifest {state['manifest_sha256']}, not {manifest.sha256} ({manifest.path}); "
                "resume with the data folder the run started with"
            )
        if state["seed"] != st.seed or state["seq_len"] != st.seq_len:
            raise DataError(
                f"{where}: made for seed {state['seed']} / seq_len {state['seq_len']}, "
                f"not {st.seed} / {st.seq_len}; resume with the run's own settings"
            )
        m = _expect_int(state["window"], f"{where}.window")
        token = _expect_int(state["token"], f"{where}.token")
        g = _expect_int(state["mix_counter"], f"{where}.mix_counter")
        if token != m * st.window_tokens:
            raise DataError(f"{where}: token {token} is not window {m} * {st.window_tokens}")
        srcs = state["sources"]
        if not isinstance(srcs, list) or [x.get("name") if isinstance(x, dict) else None for x in srcs] != [
            s.name for s in manifest.sources
        ]:
            raise DataError(f"{where}: sources do not match the manifest's, in order")
        consumed = []
        for x, src in zip(srcs, manifest.sources):
            _expect(x, ("name", "documents_consumed", "epoch", "position_in_epoch"), (), f"{where}.sources")
            c = _expect_int(x["documents_consumed"], f"{where}.sources[{src.name}].documents_consumed")
            if x["epoch"] != c // src.training_documents or x["position_in_epoch"] != c % src.training_documents:
                raise DataError(f"{where}: source {src.name!r} epoch/position disagree with its documents consumed")
            consumed.append(c)
        consumed_g = np.array(consumed, dtype=np.int64)
        if int(consumed_g.sum()) != g:
            raise DataError(f"{where}: documents consumed sum to {int(consumed_g.sum())}, not mix_counter {g}")
        part = state["partial_document"]
        _expect(part, ("source", "document", "tokens_done"), (), f"{where}.partial_document")
        done = _expect_int(part["tokens_done"], f"{where}.partial_document.tokens_done")

        # Rebuild the boundary of the chunk holding document g: the mix alone says which
        # sources the chunk's first i documents came from.
        c, i = divmod(g, PLAN_CHUNK)
        before = np.bincount(mix_sources(st._mix, st._cum, c * PLAN_CHUNK, i), minlength=st._S) if i else 0
        consumed_c = consumed_g - before
        if np.any(consumed_c < 0):
            raise DataError(f"{where}: documents consumed per source do not match the mix; the record was altered")
        ch = st._plan(c, 0, consumed_c)
        s = int(ch.src[i])
        length = int(ch.ends[i] - ch.doc_start(i))
        if part["source"] != manifest.sources[s].name or part["document"] != int(ch.doc[i]) or not done < length:
            raise DataError(f"{where}: the partial document does not match the stream; the record was altered")
        token_start = token - done - ch.doc_start(i)
        if token_start < 0:
            raise DataError(f"{where}: the token position is inconsistent with the documents consumed")
        st._add_bound(c, token_start, consumed_c)
        return st


def rank_window_indices(first_window: int, count: int, rank: int, world_size: int) -> np.ndarray:
    """Window indices ``m`` in ``first_window .. first_window+count-1`` with
    ``m % world_size == rank``, ascending: int64."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    first, count = int(first_window), int(count)
    r0 = first + ((rank - first) % world_size)
    return np.arange(r0, first + count, world_size, dtype=np.int64)


def batch_digest(windows) -> str:
    """Hex SHA-256 of the canonical bytes of an int array of windows::

        SHA-256(BATCH_DIGEST_DOMAIN || b"int32" || ndim (u64 LE) || each dim (u64 LE)
                || values as little-endian int32, row-major)

    The digest depends on the values and shape only, not on the array's int dtype.
    """
    a = np.asarray(windows)
    if a.dtype.kind not in "iu":
        raise TypeError(f"batch_digest takes an integer array, got {a.dtype}")
    if a.size and (int(a.min()) < -(2**31) or int(a.max()) >= 2**31):
        raise ValueError("batch_digest: values must fit in int32")
    h = hashlib.sha256(BATCH_DIGEST_DOMAIN)
    h.update(b"int32")
    h.update(a.ndim.to_bytes(8, "little"))
    for d in a.shape:
        h.update(int(d).to_bytes(8, "little"))
    h.update(np.ascontiguousarray(a, dtype="<i4").tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------
# The validation windows
# ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidationSplit:
    """The held-out windows of one source (``validation_windows``)."""

    source: str
    documents: int  # validation documents of the source
    tokens: int  # their tokens plus one separator each: the length of the source's buffer
    windows: np.ndarray  # int32 (n, seq_len + 1); n = tokens // (seq_len + 1)

    @property
    def targets(self) -> int:
        """Predicted tokens: ``seq_len`` per window."""
        return int(self.windows.shape[0] * (self.windows.shape[1] - 1))


def validation_windows(manifest: Manifest, seq_len: int) -> list[ValidationSplit]:
    """The held-out windows of every source with validation documents, in manifest order.

    Definition: for source ``s``, its validation documents (ids ``D-V .. D-1``) in id
    order, each followed by the tokenizer's ``eod_id``, are joined into one buffer;
    window ``m`` is ``buffer[m*(L+1) : (m+1)*(L+1)]`` (``L = seq_len``), as the training
    stream cuts its windows; the last ``len(buffer) mod (L+1)`` tokens, too few for a
    window, are not used. Nothing here is random, and the training stream never
    yields these documents (module docstring).
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or int(seq_len) < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    width = int(seq_len) + 1
    out = []
    for si, src in enumerate(manifest.sources):
        if src.validation_documents == 0:
            continue
        pieces = []
        for doc in range(src.training_documents, src.documents):
            pieces.append(manifest.document_tokens(si, doc).astype(np.int32))
            pieces.append(np.array([manifest.eod_id], dtype=np.int32))
        buf = np.concatenate(pieces)
        n = buf.shape[0] // width
        out.append(ValidationSplit(src.name, src.validation_documents, int(buf.shape[0]),
                                   np.ascontiguousarray(buf[: n * width].reshape(n, width))))
    return out
