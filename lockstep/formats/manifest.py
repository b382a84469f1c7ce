"""A data folder: its manifest, its token shards, and their verification (``Manifest.load``).

The global stream that reads a data folder is ``stream``; writing one is ``ingest``.

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

Version 1 is version 2 without ``validation_documents`` (read as 0); lockstep writes 2, and 3
for a data folder built from a data recipe (``data_recipes``): version 2 with an optional
``"recipe"`` object that records it::

     "recipe": {"name": "open-1b", "version": 1,
                "token_shares": {"dclm": 330, ...}},            (one positive integer per source)

and then every source's weight is the document weight that gives its token share,
``recipe_weight(share, documents, tokens)`` (below), an integer: checked on load.

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
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path, PurePosixPath

import numpy as np

from lockstep.errors import LockstepError
from lockstep.fsio import FileFormatError, UnsafePath, open_regular, parse_json, read_regular, safe_join

from .tokenizer import ByteTokenizer, HFTokenizer, tokenizer_from_identity

MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20  # about 200,000 shard entries
DEFAULT_RESIDENT_BYTES = 4 << 30  # verified token shards kept in memory; the rest are read (and hashed) again
MANIFEST_FORMAT = "lockstep.data-manifest"
MANIFEST_VERSION = 2  # the version lockstep writes
MANIFEST_RECIPE_VERSION = 3  # the version it writes for a data folder built from a data recipe
MANIFEST_VERSIONS = (1, 2, 3)  # the versions it reads (1: no validation_documents; 3: a "recipe" record)
RECIPE_WEIGHT_SCALE = 10**6  # a recipe's document weights: integers of about this many units per share

WEIGHT_DECIMALS = 6  # weights are read to 10**-6
WEIGHT_SCALE = 10**WEIGHT_DECIMALS
MIX_TOTAL_LIMIT = 2**32  # W < 2**32 keeps u * W inside 64-bit halves (see stream.mix_sources)

SOURCE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # also a folder name


class DataError(LockstepError, ValueError):
    """Bad data input; the message names the file and says what to do."""


class ManifestMismatch(DataError):
    """A manifest is not the one expected (by digest); checked before it is parsed or any shard is read."""

    def __init__(self, path: Path, got: str, want: str):
        self.path, self.got, self.want = path, got, want
        super().__init__(f"{path}: manifest SHA-256 {got} is not the expected {want}; this is not the data the run "
                         "was trained on: use the run's data folder")


# ---------------------------------------------------------------------------------
# A byte-exact .npy writer
# ---------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------
# Weights: exact decimals, reduced integer units
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


def recipe_weight(share: int, documents: int, tokens: int) -> int:
    """The document weight that gives a source ``share`` of the stream's tokens (integers, exact).

    The stream mixes *documents* by weight (``stream``), and a document of source s adds its
    tokens and one separator, ``(tokens + documents) / documents`` tokens on average. So the
    weight ``share * 10**6 * documents // (tokens + documents)`` (at least 1) makes the sources'
    expected token counts stand as their shares, to a relative error of at most one unit in the
    weight. ``documents`` and ``tokens`` are the manifest's counts of the source.
    """
    return max(1, share * RECIPE_WEIGHT_SCALE * documents // (tokens + documents))


def _check_recipe(path: Path, recipe, sources: list[dict]) -> None:
    """A manifest's ``recipe`` record: its shape, and that every weight follows from the shares (``recipe_weight``)."""
    where = f"{path}: recipe"
    expect_keys(recipe, ("name", "version", "token_shares"), (), where)
    if not isinstance(recipe["name"], str) or not SOURCE_NAME_RE.match(recipe["name"]):
        raise DataError(f"{where}.name: expected a recipe name, got {recipe['name']!r}")
    expect_int(recipe["version"], f"{where}.version", 1, 2**31)
    shares = recipe["token_shares"]
    names = [s["name"] for s in sources]
    if not isinstance(shares, dict) or sorted(shares) != sorted(names):
        raise DataError(f"{where}.token_shares: expected one share for each source ({', '.join(names)})")
    for s in sources:
        share = expect_int(shares[s["name"]], f"{where}.token_shares.{s['name']}", 1, 2**20)
        want = recipe_weight(share, s["documents"], s["tokens"])
        if s["weight"] != want:
            raise DataError(f"{path}: source {s['name']!r}: weight {s['weight']} is not the recipe's {want} "
                            f"(token share {share} of {s['tokens']} tokens in {s['documents']} documents); "
                            "the manifest was edited: rebuild it")


# ---------------------------------------------------------------------------------
# The manifest
# ---------------------------------------------------------------------------------


def expect_keys(obj, keys_required: tuple, keys_optional: tuple, where: str) -> None:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in keys_required if k not in obj]
    if missing:
        raise DataError(f"{where}: missing key(s) {', '.join(missing)}")
    unknown = sorted(set(obj) - set(keys_required) - set(keys_optional))
    if unknown:
        raise DataError(f"{where}: unknown key(s) {', '.join(unknown)}; remove them (a typo?)")


def expect_int(v, where: str, lo: int = 0, hi: int = 2**63) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < hi:
        raise DataError(f"{where}: expected an integer in [{lo}, {hi}), got {v!r}")
    return v


def expect_hex(v, where: str) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"[0-9a-f]{64}", v):
        raise DataError(f"{where}: expected a SHA-256 as 64 lowercase hex digits, got {v!r}")
    return v


def member_path(folder: Path, rel, manifest_path: Path) -> Path:
    """``folder / rel`` for a path the manifest names: ``fsio.safe_join`` (relative, no ``..``, no
    symlink out of the folder), refusals as ``DataError`` naming the manifest."""
    if not isinstance(rel, str):
        raise DataError(f"{manifest_path}: a file path {rel!r} is not a string")
    try:
        return safe_join(folder, rel)
    except UnsafePath as exc:
        raise DataError(f"{manifest_path}: path {rel!r} leaves the manifest's folder ({exc}); paths must be "
                        f"relative and inside {folder}: fix the manifest or re-ingest") from None


@contextlib.contextmanager
def _data_file(folder: Path, rel: str, manifest_path: Path, what: str):
    """``fsio.open_regular(folder, rel)`` with its refusals as ``DataError`` naming the manifest."""
    path = member_path(folder, rel, manifest_path)
    try:
        with open_regular(folder, rel, what) as f:
            yield f
    except FileNotFoundError:
        raise DataError(
            f"{path}: file missing (named by {manifest_path}); restore it, or rebuild the data folder "
            "with `lockstep data ingest` / `lockstep data default`"
        ) from None
    except (UnsafePath, FileFormatError) as e:
        raise DataError(f"{e}; keep every {what} a regular file inside the data folder") from None


def _check_digest(folder: Path, rel: str, expected: str, manifest_path: Path) -> None:
    """The SHA-256 of ``folder/rel`` (a regular file reached without symlinks) must be ``expected``."""
    path = member_path(folder, rel, manifest_path)
    with _data_file(folder, rel, manifest_path, "data file") as f:
        h = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != expected:
        raise DataError(
            f"{path}: SHA-256 {h.hexdigest()} does not match {expected} in {manifest_path}; the file was altered "
            "or truncated: restore it or rebuild the data folder"
        )


NPY_MAX_HEADER = 1 << 16  # lockstep writes headers of 64-128 bytes (``npy_bytes``); format 1.0 caps them at 64 KiB


def _npy_layout(head: bytes, size: int, path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data offset)`` from the ``.npy`` header at the start of ``head``.

    ``size`` is the whole file's size. The declared shape and dtype must account for
    exactly the bytes after the header, so a header declaring a huge shape is refused
    without anything being allocated. Object arrays (pickles) are refused.
    """
    f = io.BytesIO(head)
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
    have = size - offset
    if need != have:
        raise DataError(f"{path}: its .npy header declares shape {shape} of {dtype} ({need} bytes) but the file holds "
                        f"{have}; rebuild the data folder")
    return shape, dtype, offset


def _load_shard_file(folder: Path, rel: str, expected_sha256: str, manifest_path: Path, length: int,
                     itemsizes: tuple[int, ...]) -> np.ndarray:
    """A shard's ``.npy`` array (1-D, ``length`` entries), made from the very bytes whose SHA-256 was checked.

    The file is opened once, walking down from ``folder`` without following a link
    (``fsio.open_regular``: a regular file, never a FIFO or device). Its header is
    first read only to compare the declared length and item size with the manifest
    (``length``, ``itemsizes``) and the file's size, so a sparse or padded file is
    refused before it is hashed. Then the whole file is read once into private memory,
    that buffer is hashed, and only if its digest is the manifest's is the array made
    from it: the returned array is a read-only view of those bytes. Nothing is mapped
    and nothing is read a second time, so storage that changes the file afterwards,
    or answers a second read differently, cannot put other bytes in the stream than
    the ones that were hashed. The file is closed before this returns.
    """
    path = member_path(folder, rel, manifest_path)
    with _data_file(folder, rel, manifest_path, "shard file") as f:
        size = os.fstat(f.fileno()).st_size
        shape, dtype, _ = _npy_layout(f.read(NPY_MAX_HEADER), size, path)  # a size check only: trusts nothing
        if shape[0] != length or dtype.itemsize not in itemsizes:
            raise DataError(f"{path}: declares {shape[0]} entries of {dtype} but the manifest {manifest_path} "
                            f"expects {length} of {' or '.join(f'{b}-byte' for b in itemsizes)} integers; "
                            "the file was altered: restore it or rebuild the data folder")
        f.seek(0)
        buf = bytearray(size)
        got = f.readinto(buf)
        extra = f.read(1)
    if got != size or extra:
        raise DataError(f"{path}: changed size while being read; the storage is not stable: copy the data folder "
                        "to local disk and audit that copy")
    digest = hashlib.sha256(buf).hexdigest()
    if digest != expected_sha256:
        raise DataError(
            f"{path}: SHA-256 {digest} does not match {expected_sha256} in {manifest_path}; the file was "
            "altered or truncated: restore it or rebuild the data folder"
        )
    shape, dtype, offset = _npy_layout(bytes(buf[:NPY_MAX_HEADER]), size, path)  # now from the hashed bytes
    arr = np.frombuffer(buf, dtype=dtype, count=shape[0], offset=offset)
    arr.flags.writeable = False
    return arr


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

    Every token the stream reads comes from a buffer that was read into private
    memory and hashed (``_load_shard_file``), never from a mapping of a file that
    could change underneath. The offsets of every shard stay in memory; token shards
    stay in memory up to ``resident_bytes`` (least recently used ones leave first).
    A shard that is needed again after it left is read again and hashed again
    against the manifest, so its bytes are still exactly the verified ones, or the
    read is refused (``DataError``).
    """

    def __init__(self, path: Path, raw: bytes, data: dict, sources: list[Source],
                 resident_bytes: int = DEFAULT_RESIDENT_BYTES):
        self.path = path
        self.folder = path.parent
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.description = data.get("description")
        self.recipe: dict | None = data.get("recipe")  # the data recipe it was built from (version 3)
        self.tokenizer_identity: dict = data["tokenizer"]
        self.vocab_size: int = data["tokenizer"]["vocab_size"]
        self.eod_id: int = data["tokenizer"]["eod_id"]
        self.sources: tuple[Source, ...] = tuple(sources)
        self.resident_bytes = resident_bytes
        self.shard_reads = 0  # token shards read (and hashed) so far: the load's, then every re-read
        self._offsets: dict[tuple[int, int], np.ndarray] = {}
        self._tokens: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()  # least recently used first
        self._token_bytes = 0
        self._bases: dict[int, np.ndarray] = {}

    # -- loading ---------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, expected_sha256: str | None = None,
             resident_bytes: int = DEFAULT_RESIDENT_BYTES) -> "Manifest":
        """Load and verify ``path`` (a manifest.json, or the folder holding one).

        The manifest must be a regular file of at most ``MAX_MANIFEST_BYTES``. With
        ``expected_sha256`` (a run's recipe names it), its digest is compared before
        anything is parsed or any shard is read (``ManifestMismatch``). Up to
        ``resident_bytes`` of verified token shards stay in memory (see the class).
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
        try:  # weights are read as exact decimals, never through a binary float
            data = parse_json(raw, "data manifest", str(path), exact_decimals=True)
        except FileFormatError as exc:
            raise DataError(f"{exc}; fix the file or rebuild it with `lockstep data ingest` / "
                            "`lockstep data default`") from None
        m = cls(path, raw, data, cls._check_structure(path, data), resident_bytes)
        m._verify_files()
        return m

    @staticmethod
    def _check_structure(path: Path, data) -> list[Source]:
        """Check every field; returns the sources with their reduced weight units."""
        expect_keys(data, ("format", "version", "tokenizer", "sources"), ("description", "recipe"), str(path))
        version = data["version"]
        if data["format"] != MANIFEST_FORMAT or isinstance(version, bool) or version not in MANIFEST_VERSIONS:
            raise DataError(
                f"{path}: format {data['format']!r} version {data['version']!r} is not "
                f"{MANIFEST_FORMAT!r} version {' or '.join(map(str, MANIFEST_VERSIONS))}; "
                "rebuild the folder with this lockstep"
            )
        if ("recipe" in data) != (version >= MANIFEST_RECIPE_VERSION):
            raise DataError(f"{path}: a data recipe is recorded in version {MANIFEST_RECIPE_VERSION} and only there "
                            f"(this is version {version}); rebuild the folder with this lockstep")
        held_key = ("validation_documents",) if version >= 2 else ()
        tok = data["tokenizer"]
        where = f"{path}: tokenizer"
        if isinstance(tok, dict) and tok.get("kind") == ByteTokenizer.kind:
            if tok != ByteTokenizer().identity():
                raise DataError(f"{where}: a bytes tokenizer is exactly {ByteTokenizer().identity()}, got {tok}")
        elif isinstance(tok, dict) and tok.get("kind") == HFTokenizer.kind:
            expect_keys(tok, ("kind", "file", "sha256", "vocab_size", "eod_id", "eod_token"), (), where)
            expect_int(tok["vocab_size"], f"{where}.vocab_size", 1, 2**31)
            expect_int(tok["eod_id"], f"{where}.eod_id", 0, tok["vocab_size"])
            expect_hex(tok["sha256"], f"{where}.sha256")
            if tok["eod_token"] is not None and not isinstance(tok["eod_token"], str):
                raise DataError(f"{where}.eod_token: expected a string or null")
            _check_digest(path.parent, tok["file"], tok["sha256"], path)
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
            expect_keys(s, ("name", "weight", "documents", "tokens", "shards") + held_key, (), where)
            name = s["name"]
            if not isinstance(name, str) or not SOURCE_NAME_RE.match(name):
                raise DataError(f"{where}: source name {name!r} must match {SOURCE_NAME_RE.pattern}")
            if name in names:
                raise DataError(f"{where}: source name {name!r} appears twice; names must be unique")
            names.append(name)
            where = f"{path}: source {name!r}"
            units.append(weight_units(s["weight"], where))
            docs = expect_int(s["documents"], f"{where}.documents")
            toks = expect_int(s["tokens"], f"{where}.tokens")
            if not isinstance(s["shards"], list):
                raise DataError(f"{where}.shards: expected a list")
            sd = st = 0
            for k, sh in enumerate(s["shards"]):
                w = f"{where} shard {k}"
                expect_keys(sh, ("tokens_file", "tokens_sha256", "offsets_file", "offsets_sha256", "documents", "tokens"), (), w)
                for key in ("tokens_file", "offsets_file"):
                    if not isinstance(sh[key], str):
                        continue  # refused with its path check
                    norm = str(PurePosixPath(sh[key]))
                    if norm in files:
                        raise DataError(f"{w}: file {sh[key]!r} is listed twice; each shard file may appear once")
                    files.add(norm)
                expect_hex(sh["tokens_sha256"], f"{w}.tokens_sha256")
                expect_hex(sh["offsets_sha256"], f"{w}.offsets_sha256")
                sd += expect_int(sh["documents"], f"{w}.documents")
                st += expect_int(sh["tokens"], f"{w}.tokens")
            if sd != docs or st != toks:
                raise DataError(
                    f"{where}: shards hold {sd} documents / {st} tokens but the source says {docs} / {toks}; "
                    "the manifest was edited: rebuild it"
                )
            if docs == 0:
                raise DataError(f"{where}: the source is empty (no documents); remove it or give it documents")
            held = expect_int(s.get("validation_documents", 0), f"{where}.validation_documents")
            if held >= docs:
                raise DataError(
                    f"{where}: validation_documents {held} leaves no training documents (the source has {docs}); "
                    "hold out fewer documents"
                )
        red = reduced_units(units, str(path))
        if "recipe" in data:
            _check_recipe(path, data["recipe"], sources)
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
                opath = member_path(self.folder, sh.offsets_file, self.path)
                off = _load_shard_file(self.folder, sh.offsets_file, sh.offsets_sha256, self.path,
                                       sh.documents + 1, (8,))
                if off.dtype.kind != "i":
                    raise DataError(f"{opath}: offsets must be int64 of {sh.documents + 1} entries; rebuild the shard")
                off = off.astype(np.int64)
                if off[0] != 0 or off[-1] != sh.tokens or np.any(np.diff(off) < 0):
                    raise DataError(f"{opath}: offsets must rise from 0 to {sh.tokens}; rebuild the shard")
                self._offsets[si, k] = off
                self._keep_tokens((si, k), self._read_tokens(si, k))

    def _read_tokens(self, si: int, k: int, check_ids: bool = True) -> np.ndarray:
        """Token shard ``k`` of source ``si``, read once into memory, hashed, checked (ids below ``vocab_size``).

        A re-read (``check_ids=False``) skips the scan of the ids: its bytes have the digest of
        the ones scanned when the manifest was loaded, so they are those bytes."""
        sh = self.sources[si].shards[k]
        tpath = member_path(self.folder, sh.tokens_file, self.path)
        tok = _load_shard_file(self.folder, sh.tokens_file, sh.tokens_sha256, self.path, sh.tokens, (1, 2, 4))
        self.shard_reads += 1
        if tok.dtype.kind != "u":
            raise DataError(f"{tpath}: tokens must be 1-D uint8/16/32 of length {sh.tokens}; rebuild the shard")
        for a in range(0, sh.tokens if check_ids else 0, 1 << 24):
            top = int(tok[a : a + (1 << 24)].max())
            if top >= self.vocab_size:
                raise DataError(
                    f"{tpath}: token id {top} is outside the vocabulary (size {self.vocab_size}); the shard "
                    "was made with another tokenizer: re-ingest with the tokenizer the manifest names"
                )
        return tok

    def _keep_tokens(self, key: tuple[int, int], tok: np.ndarray) -> None:
        """Keep ``tok`` in memory as the most recently used shard, within ``resident_bytes``."""
        while self._tokens and self._token_bytes + tok.nbytes > self.resident_bytes:
            _, old = self._tokens.popitem(last=False)
            self._token_bytes -= old.nbytes
        if tok.nbytes <= self.resident_bytes:
            self._tokens[key] = tok
            self._token_bytes += tok.nbytes

    def shard_tokens(self, si: int, k: int) -> np.ndarray:
        """The verified tokens of shard ``k`` of source ``si`` (read-only): from memory, or read and hashed again."""
        tok = self._tokens.get((si, k))
        if tok is not None:
            self._tokens.move_to_end((si, k))
            return tok
        tok = self._read_tokens(si, k, check_ids=False)
        self._keep_tokens((si, k), tok)
        return tok

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
        """The tokens of document ``doc`` of source ``si`` (a read-only view of its verified shard)."""
        base = self.shard_bases(si)
        k = int(np.searchsorted(base, doc, side="right")) - 1
        off = self._offsets[si, k]
        local = doc - int(base[k])
        return self.shard_tokens(si, k)[int(off[local]) : int(off[local + 1])]

    def tokenizer(self):
        """The tokenizer the manifest names (``hf-tokenizers`` needs the package)."""
        return tokenizer_from_identity(self.tokenizer_identity, self.folder)
