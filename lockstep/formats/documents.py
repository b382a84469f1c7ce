"""Documents from the files corpora ship in, and their token ids: what ``ingest`` reads.

Formats, by name (case-insensitive):

``.txt``        the whole file is one document (UTF-8 text)
``.jsonl``      one JSON object per line; its string field ``text_field`` is a document (blank
                lines are skipped)
``.jsonl.gz``   the same, gzip-compressed (read as a stream)
``.jsonl.zst``  the same, Zstandard-compressed (one or more frames, read as a stream; the optional
                ``zstandard`` package)
``.parquet``    one document per row: the string column named ``text_field`` (the optional
                ``pyarrow`` package; read a row group's batch at a time)

A document is the same text whatever file it came from, so a corpus converted between these
formats gives the same documents in the same order: inside a folder, files are taken in the
order of their relative POSIX path with the format's suffix cut off (``a/b.jsonl.zst`` sorts as
``a/b.``), ties by suffix; rows and lines in file order.

Every document must be valid Unicode text (UTF-8 in the file; no lone surrogate from a JSON
``\\ud800`` escape) and, unless empty documents are skipped, hold at least one token. Anything
else is a ``DataError`` of one line naming the file, the line or row, and what to do: a missing
column, a column that is not text, a compressed stream that ends early, invalid UTF-8, an empty
document, and a file that changes while it is read (its size, modification time or identity
differ between the plan, the open and the end of reading).

Reading yields ``RawBatch``es (a few MB of lines, rows or one text, with the file position they
reach); ``tokenize_batch`` turns one into token ids. It is a pure function of the batch and the
tokenizer, so batches may be tokenized in worker processes and put back in order: the result
does not depend on how many there are.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from lockstep.errors import Setting

from .manifest import DataError

FORMATS = {".jsonl.zst": "jsonl.zst", ".jsonl.gz": "jsonl.gz", ".jsonl": "jsonl", ".txt": "txt",
           ".parquet": "parquet"}  # suffix -> format; the longest suffix that matches wins
BATCH_BYTES = 4 << 20  # lines or rows of about this much text to a batch
BATCH_ROWS = 4096  # Parquet rows read at a time
READ_BYTES = 1 << 16  # compressed bytes fed to the decompressor at a time (its output stays a few MB)


def document_suffix(path: Path) -> str | None:
    """The format suffix of a file name (``.jsonl.zst`` ...), or None for a file of no document format."""
    name = path.name.lower()
    for suffix in FORMATS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return suffix
    return None


@dataclass(frozen=True)
class InputFile:
    """A document file as planned: its path, its name inside the input, and the size and time it had."""

    path: Path
    rel: str
    fmt: str
    size: int
    mtime_ns: int

    def record(self) -> dict:
        return {"path": self.rel, "format": self.fmt, "size": self.size, "mtime_ns": self.mtime_ns}


def _sort_key(rel: str) -> tuple[str, str]:
    suffix = document_suffix(Path(rel)) or ""
    return rel[: len(rel) - len(suffix)] + ".", suffix.lower()


def input_files(path: Path) -> list[InputFile]:
    """The document files of an input: the file itself, or every file of a document format under a folder
    (hidden names skipped), in the order of the module docstring, each with its size and modification time."""
    path = Path(path)
    if path.is_file():
        if document_suffix(path) is None:
            raise DataError(f"{path}: not a document file ({', '.join(FORMATS)}); give a folder of those, "
                            "or such a file")
        found = [(path, path.name)]
    elif path.is_dir():
        found = []
        for root, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for f in files:
                p = Path(root) / f
                if not f.startswith(".") and document_suffix(p) is not None:
                    found.append((p, p.relative_to(path).as_posix()))
        found.sort(key=lambda pr: _sort_key(pr[1]))
    else:
        raise DataError(f"{path}: no such file or folder; check the input path")
    out = []
    for p, rel in found:
        try:
            st = os.stat(p)
        except OSError as exc:
            raise DataError(f"{p}: cannot be read ({exc.strerror or exc})") from None
        if not stat.S_ISREG(st.st_mode):
            raise DataError(f"{p}: not a regular file; give regular files (a FIFO or device is never read)")
        out.append(InputFile(p, rel, FORMATS[document_suffix(p)], st.st_size, st.st_mtime_ns))
    return out


@dataclass
class RawBatch:
    """Documents of one file not yet parsed: ``kind`` "lines" (JSON lines, bytes), "text" (one .txt file's
    bytes) or "arrow" (a Parquet column's chunk); ``first`` is the item number (line or row, from 0) of
    ``items[0]``; ``position`` the file's bytes read once this batch is done (a share of the file for
    Parquet)."""

    file_index: int
    where: str
    kind: str
    first: int
    items: object
    text_field: str
    position: int
    text_bytes: int = 0


@dataclass
class TokenBatch:
    """A batch's documents as token ids: document k is ``flat[offsets[k]:offsets[k+1]]``, item ``items[k]``."""

    file_index: int
    flat: np.ndarray
    offsets: np.ndarray
    items: np.ndarray
    skipped: int
    text_bytes: int
    position: int
    documents: int = field(init=False)

    def __post_init__(self):
        self.documents = int(self.items.shape[0])


# ---------------------------------------------------------------- reading a file once, stably

class _StableFile:
    """A document file opened for reading, checked against its plan on open and at the end of reading."""

    def __init__(self, f: InputFile):
        self.plan = f
        try:
            self.fh = open(f.path, "rb")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise DataError(f"{f.path}: cannot be read ({exc.strerror or exc})") from None
        self.st = os.fstat(self.fh.fileno())
        if not stat.S_ISREG(self.st.st_mode):
            self.fh.close()
            raise DataError(f"{f.path}: not a regular file; give regular files")
        self._check(self.st, "since it was listed")

    def _check(self, st, when: str) -> None:
        if (st.st_size, st.st_mtime_ns) != (self.plan.size, self.plan.mtime_ns):
            raise DataError(f"{self.plan.path}: changed {when} (size {self.plan.size} -> {st.st_size} bytes or a "
                            "new modification time); ingest a copy that nothing writes to while it is read")

    def finish(self) -> None:
        """The file is the one opened, unchanged, and still under its name."""
        after = os.fstat(self.fh.fileno())
        self._check(after, "while it was read")
        try:
            now = os.stat(self.plan.path)
        except OSError:
            now = None
        if now is None or (now.st_ino, now.st_dev) != (self.st.st_ino, self.st.st_dev):
            raise DataError(f"{self.plan.path}: was replaced while it was read; ingest a copy that nothing "
                            "writes to while it is read")
        self._check(now, "while it was read")

    def close(self) -> None:
        self.fh.close()


def _zstd_chunks(fh, where: str) -> Iterator[bytes]:
    """The decompressed bytes of one or more Zstandard frames, as they come; a stream that ends inside a
    frame is refused (the library's stream reader would return the bytes so far without a word)."""
    try:
        import zstandard
    except ImportError:
        raise DataError(f"{where}: reading .jsonl.zst needs the optional 'zstandard' package "
                        "(pip install 'lockstep[data]')") from None
    d, in_frame = zstandard.ZstdDecompressor().decompressobj(), False
    while True:
        raw = fh.read(READ_BYTES)
        if not raw:
            break
        while raw:
            try:
                out = d.decompress(raw)
            except zstandard.ZstdError as exc:
                raise DataError(f"{where}: not a valid Zstandard stream ({exc}); check or re-download the file") \
                    from None
            if out:
                yield out
            if d.eof:  # a frame ended: the rest of the input starts the next one
                raw, d, in_frame = d.unused_data, zstandard.ZstdDecompressor().decompressobj(), False
            else:
                raw, in_frame = b"", True
    if in_frame:
        raise DataError(f"{where}: the Zstandard stream ends inside a frame (the file is truncated); "
                        "re-download or re-compress it")


def _split_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    pending = b""
    for chunk in chunks:
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        yield from lines
    if pending:
        yield pending


def _lines(sf: _StableFile, fmt: str) -> Iterator[bytes]:
    where = str(sf.plan.path)
    if fmt == "jsonl":
        yield from sf.fh
    elif fmt == "jsonl.gz":
        import gzip
        import zlib

        try:
            yield from gzip.GzipFile(fileobj=sf.fh, mode="rb")
        except EOFError:
            raise DataError(f"{where}: the gzip stream ends early (the file is truncated); re-download or "
                            "re-compress it") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise DataError(f"{where}: not a valid gzip stream ({exc}); check or re-download the file") from None
    else:
        yield from _split_lines(_zstd_chunks(sf.fh, where))


def read_batches(f: InputFile, file_index: int, text_field: str, start: int = 0) -> Iterator[RawBatch]:
    """The raw batches of one file, from item ``start`` on (a resumed ingest starts inside a file)."""
    sf = _StableFile(f)
    where = str(f.path)
    try:
        if f.fmt == "txt":
            if start == 0:
                data = sf.fh.read()
                yield RawBatch(file_index, where, "text", 0, [data], text_field, f.size, len(data))
        elif f.fmt == "parquet":
            yield from _parquet_batches(sf, file_index, text_field, start)
        else:
            items, size, first, n = [], 0, start, 0
            for n, line in enumerate(_lines(sf, f.fmt)):
                if n < start:
                    continue
                items.append(line)
                size += len(line)
                if size >= BATCH_BYTES:
                    yield RawBatch(file_index, where, "lines", first, items, text_field, sf.fh.tell(), size)
                    items, size, first = [], 0, n + 1
            if items:
                yield RawBatch(file_index, where, "lines", first, items, text_field, sf.fh.tell(), size)
        sf.finish()
    finally:
        sf.close()


def _parquet_batches(sf: _StableFile, file_index: int, text_field: str, start: int) -> Iterator[RawBatch]:
    where = str(sf.plan.path)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{where}: reading Parquet needs the optional 'pyarrow' package "
                        "(pip install 'lockstep[data]')") from None
    try:
        pf = pq.ParquetFile(sf.fh)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"{where}: not a readable Parquet file ({exc}); check or re-download it") from None
    schema = pf.schema_arrow
    if text_field not in schema.names:
        raise DataError.naming(f"{where}: no column {text_field!r} (columns: {', '.join(schema.names[:20])}); "
                               "name the text column with ", Setting("text_field"), " NAME")
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(kind))):
        raise DataError.naming(f"{where}: column {text_field!r} holds {kind}, not text; name the text column with ",
                               Setting("text_field"), " NAME")
    rows = max(1, pf.metadata.num_rows)
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[text_field], use_threads=True):
            col = batch.column(0)
            if getattr(pa.types, "is_string_view", lambda t: False)(col.type):
                col = col.cast(pa.large_string())
            n, first = len(col), row
            row += n
            if row <= start:
                continue
            if first < start:
                col, first = col.slice(start - first), start
            yield RawBatch(file_index, where, "arrow", first, col, text_field, sf.plan.size * row // rows,
                           int(col.nbytes))
    except pa.ArrowException as exc:
        raise DataError(f"{where}: the Parquet file cannot be read to its end ({exc}); check or re-download it") \
            from None


# ---------------------------------------------------------------- parsing and tokenizing a batch

def _texts_of_lines(b: RawBatch) -> tuple[list[str], list[int]]:
    texts, items = [], []
    for k, line in enumerate(b.items):
        if not line.strip():
            continue
        n = b.first + k
        where = f"{b.where}:{n + 1}"
        try:
            obj = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DataError(f"{where}: not UTF-8 (byte 0x{line[exc.start]:02X} at offset {exc.start} of the "
                            "line); fix the line or re-encode the file as UTF-8") from None
        except (json.JSONDecodeError, RecursionError) as exc:
            raise DataError(f"{where}: malformed JSON line ({exc}); fix or remove the line") from None
        if not isinstance(obj, dict) or not isinstance(obj.get(b.text_field), str):
            raise DataError.naming(f"{where}: expected an object with a string field {b.text_field!r}; "
                                   "fix the line or pass ", Setting("text_field"), " NAME")
        texts.append(obj[b.text_field])
        items.append(n)
    return texts, items


def _texts_of_arrow(b: RawBatch) -> tuple[list[str], list[int]]:
    import pyarrow as pa

    col = b.items
    if col.null_count:
        k = next(i for i, v in enumerate(col.is_null().to_pylist()) if v)
        raise DataError(f"{b.where}: row {b.first + k}: column {b.text_field!r} is null, not a text; "
                        "drop the row or fill it")
    try:
        col.validate(full=True)
    except pa.ArrowInvalid:
        for k in range(len(col)):
            try:
                col.slice(k, 1).validate(full=True)
            except pa.ArrowInvalid:
                raise DataError(f"{b.where}: row {b.first + k}: column {b.text_field!r} is not UTF-8; fix the "
                                "row or re-encode the file") from None
    return col.to_pylist(), list(range(b.first, b.first + len(col)))


def tokenize_batch(b: RawBatch, tokenizer, skip_empty: bool) -> TokenBatch:
    """The token ids of a batch's documents (module docstring): parsed, checked, tokenized in item order."""
    if b.kind == "text":
        data = b.items[0]
        try:
            texts = [data.decode("utf-8")]
        except UnicodeDecodeError as exc:
            raise DataError(f"{b.where}: not UTF-8 text (byte 0x{data[exc.start]:02X} at offset {exc.start}); "
                            "re-encode the file as UTF-8") from None
        items = [0]
    elif b.kind == "lines":
        texts, items = _texts_of_lines(b)
    else:
        texts, items = _texts_of_arrow(b)
    encoded = []
    for k, text in enumerate(texts):
        try:
            encoded.append(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise DataError(f"{_where(b, items[k])}: the text holds a lone surrogate "
                            f"(U+{ord(text[exc.start]):04X} at character {exc.start}), not Unicode; fix it") from None
    from .tokenizer import ByteTokenizer

    if isinstance(tokenizer, ByteTokenizer):
        ids = [np.frombuffer(e, dtype=np.uint8) for e in encoded]
    else:
        try:
            ids = tokenizer.encode_batch(texts)
        except BaseException as exc:  # the library raises plain Exception, or panics (a BaseException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise DataError(f"{b.where}: the tokenizer failed on a document of items {items[0]}.. "
                            f"({type(exc).__name__}: {str(exc)[:200]}); check the tokenizer file") from None
    keep, kept_items, skipped = [], [], 0
    for k, x in enumerate(ids):
        if x.size == 0:
            if not skip_empty:
                why = "no text" if not texts[k] else "text the tokenizer turns into no tokens"
                raise DataError.naming(f"{_where(b, items[k])}: an empty document ({why}); remove it, or pass ",
                                       Setting("skip_empty"), " to skip empty documents")
            skipped += 1
            continue
        keep.append(x)
        kept_items.append(items[k])
    offsets = np.zeros(len(keep) + 1, dtype=np.int64)
    if keep:
        np.cumsum([x.size for x in keep], out=offsets[1:])
    flat = np.concatenate(keep) if keep else np.zeros(0, dtype=np.uint32)
    return TokenBatch(b.file_index, flat, offsets, np.asarray(kept_items, dtype=np.int64), skipped,
                      b.text_bytes, b.position)


def _where(b: RawBatch, item: int) -> str:
    return {"lines": f"{b.where}:{item + 1}", "arrow": f"{b.where}: row {item}"}.get(b.kind, b.where)
