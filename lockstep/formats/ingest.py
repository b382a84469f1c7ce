"""Writing data folders: ``DataWriter`` (all or nothing) and ``ingest`` (.txt/.jsonl documents
through a tokenizer into shards and a manifest; the format is ``manifest``'s).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from lockstep.fsio import atomic_write_bytes, fsync_dir

from .manifest import (MANIFEST_FORMAT, MANIFEST_NAME, MANIFEST_VERSION, SOURCE_NAME_RE, DataError, npy_bytes,
                       reduced_units, weight_units)
from .tokenizer import HF_TOKENIZER_FILE, ByteTokenizer, HFTokenizer, TokenizerError

DEFAULT_SHARD_TOKENS = 1 << 24  # documents are grouped into shards of at most this many tokens
FILE_MODE, DIR_MODE = 0o644, 0o755  # written data is readable by all, like a normal file


def _smallest_uint(max_id: int) -> np.dtype:
    for dt in (np.uint8, np.uint16, np.uint32):
        if max_id <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise DataError(f"token id {max_id} does not fit in uint32")


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
        atomic_write_bytes(self.owner.staging / f"{stem}.tokens.npy", tb, mode=FILE_MODE)
        atomic_write_bytes(self.owner.staging / f"{stem}.offsets.npy", ob, mode=FILE_MODE)
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
            # the bytes the tokenizer was built from and hashed, never a second read of its file
            atomic_write_bytes(self.staging / HF_TOKENIZER_FILE, self.tokenizer.data, mode=FILE_MODE)
        atomic_write_bytes(self.staging / MANIFEST_NAME, raw, mode=FILE_MODE)
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
