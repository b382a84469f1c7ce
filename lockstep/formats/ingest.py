"""Writing data folders: ``DataWriter`` (all or nothing) and ``ingest`` (document files of every
format ``documents`` reads, through a tokenizer on every core, into shards and a manifest; the
format is ``manifest``'s).

Ingest builds the folder in ``.NAME.partial`` next to ``--out`` and renames it into place when it is
complete. After every shard it records in that folder (``ingest-state.json``, atomically) the
shards so far and the document the next shard starts at, so an interrupted ingest (Ctrl-C, a
killed process, a full disk) continues with ``resume=True`` (``--resume``) from its last shard and
gives the same bytes as one that was never interrupted: a shard ends at the first document that
brings it to ``shard_tokens``, whatever came before. The plan (the input files with their sizes and
modification times, the tokenizer, the options) is recorded too, and a resume with a different
plan is refused. Bad input (a ``DataError``) removes the partial folder: nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import deque
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from lockstep.errors import Setting
from lockstep.fsio import atomic_write_bytes, fsync_dir, json_bytes, parse_json, read_named_file
from lockstep.fsio.progress import amount, duration

from .documents import input_files, read_batches, tokenize_batch

from .manifest import (MANIFEST_FORMAT, MANIFEST_NAME, MANIFEST_RECIPE_VERSION, MANIFEST_VERSION, SOURCE_NAME_RE,
                       DataError, npy_bytes, recipe_weight, reduced_units, weight_units)
from .tokenizer import HF_TOKENIZER_FILE, ByteTokenizer, HFTokenizer, TokenizerError, file_sha256

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
        self._max = 0  # the largest id buffered
        self.documents = 0
        self.tokens = 0
        self.validation_documents = 0  # hold out the last this many documents (set before commit)

    def add_document(self, ids) -> None:
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError("a document is a 1-D array of token ids")
        if ids.size:
            top, low = int(ids.max()), (0 if ids.dtype.kind == "u" else int(ids.min()))
            if low < 0 or top >= self.owner.vocab_size:
                bad = top if top >= self.owner.vocab_size else low
                raise DataError(f"source {self.name!r}: token id {bad} is outside the vocabulary ({self.owner.vocab_size})")
            self._max = max(self._max, top)
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
        dt = _smallest_uint(self._max)  # the smallest unsigned type of the shard's largest id
        flat = np.concatenate(self._docs, dtype=dt, casting="unsafe") if offsets[-1] else np.zeros(0, dt)
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
        self._docs, self._buffered, self._max = [], 0, 0


class DataWriter:
    """Builds a data folder all or nothing.

    Everything is written into a hidden staging folder next to ``out_dir`` (each file
    itself atomically), the manifest last; ``commit`` then renames the staging folder to
    ``out_dir`` in one step. On any error (use it as a context manager) the staging
    folder is removed, so ``out_dir`` either does not exist or is complete.
    """

    def __init__(self, out_dir: str | Path, tokenizer, shard_tokens: int = DEFAULT_SHARD_TOKENS, description: str | None = None,
                 recipe: dict | None = None, staging: Path | None = None):
        self.out_dir = Path(out_dir).absolute()
        if self.out_dir.exists() and (not self.out_dir.is_dir() or any(self.out_dir.iterdir())):
            raise DataError.naming(f"{self.out_dir}: already exists and is not an empty folder; choose a new ",
                                   Setting("out_dir"), " or delete it")
        if shard_tokens < 1:
            raise DataError(f"shard size must be at least 1 token, got {shard_tokens}")
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.shard_tokens = int(shard_tokens)
        self.description = description
        self.recipe = recipe  # a data recipe's record (``data_recipes``): weights follow from its token shares
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        if staging is None:
            staging = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.partial-", dir=self.out_dir.parent))
        self.staging = staging  # an existing empty folder, or a resumed ingest's (``ingest``)
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
        sw = _SourceWriter(self, name, 1 if self.recipe else _json_weight(weight, f"source {name!r}"))
        (self.staging / name).mkdir(exist_ok=True)
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
        if self.recipe:
            shares = self.recipe["token_shares"]
            for s in self.sources:
                s.weight = recipe_weight(shares[s.name], s.documents, s.tokens)
        reduced_units([weight_units(Decimal(repr(s.weight)), s.name) for s in self.sources], "weights")
        doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_RECIPE_VERSION if self.recipe else MANIFEST_VERSION}
        if self.description:
            doc["description"] = self.description
        if self.recipe:
            doc["recipe"] = self.recipe
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
# Ingest: document files -> a data folder, on every core, resumable
# ---------------------------------------------------------------------------------

STATE_NAME = "ingest-state.json"  # in the partial folder: the plan and the shards written so far
STATE_FORMAT = "lockstep.ingest-state"
STATE_VERSION = 1
SHARD_KEYS = ("tokens_file", "tokens_sha256", "offsets_file", "offsets_sha256", "documents", "tokens")
PROGRESS_EVERY_S = 2.0  # a progress line at most this often
WINDOW_PER_WORKER = 2  # raw batches in flight per worker: memory is this many batches, plus one shard


def _partial_folder(out_dir: Path) -> Path:
    return out_dir.parent / f".{out_dir.name}.partial"


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# Worker processes: each builds the tokenizer once from the bytes the parent hashed.
_WORKER: dict = {}


def _worker_init(tok_data: bytes | None, eod_token: str | None, skip_empty: bool) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends the pool
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process: the processes are the cores
    _WORKER["tok"] = ByteTokenizer() if tok_data is None else HFTokenizer(HF_TOKENIZER_FILE, eod_token=eod_token,
                                                                           data=tok_data)
    _WORKER["skip_empty"] = skip_empty


def _worker_tokenize(batch):
    return tokenize_batch(batch, _WORKER["tok"], _WORKER["skip_empty"])


def _token_batches(raw: Iterator, tok, skip_empty: bool, pool, window: int) -> Iterator:
    """``tokenize_batch`` of every raw batch, in order; with a pool, ``window`` batches at a time in its
    workers (bounded: a batch is read only when one of the window is taken back)."""
    if pool is None:
        for b in raw:
            yield tokenize_batch(b, tok, skip_empty)
        return
    pending: deque = deque()
    for b in raw:
        pending.append(pool.apply_async(_worker_tokenize, (b,)))
        if len(pending) >= window:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


class _IngestProgress:
    """``ingest: web: 3/10 files, 12.3K documents, 4.5M tokens, 38.2 MB/s, 41% of the input read, about 2m10s
    left`` at most every ``PROGRESS_EVERY_S`` seconds. The estimate is the input's bytes still to read
    (compressed bytes for compressed files) at the rate so far. It decides no published bit."""

    def __init__(self, emit, total_bytes: int, done_bytes: int, clock=time.monotonic):
        self.emit, self.clock = emit, clock
        self.total, self.start_done = max(1, total_bytes), done_bytes
        self.t0 = self.last = clock()
        self.text_bytes = 0

    def __call__(self, source: str, files: str, documents: int, tokens: int, done_bytes: int,
                 force: bool = False) -> None:
        if self.emit is None:
            return
        now = self.clock()
        if not force and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        elapsed = max(now - self.t0, 1e-9)
        read = done_bytes - self.start_done
        left = ""
        if 0 < read and done_bytes < self.total:
            left = f", about {duration(elapsed * (self.total - done_bytes) / read)} left"
        self.emit(f"ingest: {source}: {files} files, {amount(documents)} documents, {amount(tokens)} tokens, "
                  f"{self.text_bytes / elapsed / 1e6:.1f} MB/s of text, "
                  f"{100 * min(done_bytes, self.total) / self.total:.0f}% of the input read{left}")


def _state_bytes(plan: dict, position: list[int], writer: DataWriter) -> bytes:
    state = {"format": STATE_FORMAT, "version": STATE_VERSION, "plan": plan, "position": position,
             "sources": [{"name": s.name, "documents": s.documents, "tokens": s.tokens, "shards": s.shards}
                         for s in writer.sources]}
    return json_bytes(state)


def _load_state(partial: Path, plan: dict) -> tuple[list[int], list[dict]]:
    """The position and the sources' shards of an interrupted ingest, checked against the plan and the
    shard files (every digest); files of the partial folder that it does not list are removed."""
    where = partial / STATE_NAME
    try:
        state = parse_json(read_named_file(where, "ingest state"), "ingest state", str(where))
    except FileNotFoundError:
        state = None  # interrupted before its first shard: start again
    except (OSError, ValueError) as exc:
        raise DataError(f"{where}: {exc}; delete {partial} and ingest again") from None
    if state is None:
        return [0, 0, 0], []
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
        raise DataError(f"{where}: not an ingest state of this lockstep; delete {partial} and ingest again")
    if state.get("plan") != plan:
        raise DataError(f"{where}: the interrupted ingest had other inputs or options (a file changed, was added "
                        f"or removed, or an option differs); run the same command on the same files, or delete "
                        f"{partial} and ingest again")
    position, sources = state.get("position"), state.get("sources")
    names = [s["name"] for s in plan["sources"]]
    if (not isinstance(position, list) or len(position) != 3 or not all(type(x) is int and x >= 0 for x in position)
            or not isinstance(sources, list) or len(sources) > len(names)):
        raise DataError(f"{where}: a malformed ingest state; delete {partial} and ingest again")
    keep = {STATE_NAME}
    for i, s in enumerate(sources):
        shards = s.get("shards") if isinstance(s, dict) else None
        if (shards is None or s.get("name") != names[i] or not isinstance(shards, list)
                or not all(type(s.get(k)) is int and s[k] >= 0 for k in ("documents", "tokens"))):
            raise DataError(f"{where}: a malformed ingest state; delete {partial} and ingest again")
        for k, sh in enumerate(shards):
            stem = f"{names[i]}/{k:05d}"
            if not isinstance(sh, dict) or sorted(sh) != sorted(SHARD_KEYS) or (
                    sh["tokens_file"], sh["offsets_file"]) != (f"{stem}.tokens.npy", f"{stem}.offsets.npy") or not all(
                    type(sh[k]) is int and sh[k] >= 0 for k in ("documents", "tokens")):
                raise DataError(f"{where}: a malformed ingest state; delete {partial} and ingest again")
            for key in ("tokens", "offsets"):
                try:
                    got = file_sha256(partial / sh[f"{key}_file"])
                except OSError:
                    got = None
                if got != sh.get(f"{key}_sha256"):
                    raise DataError(f"{partial / sh[f'{key}_file']}: missing or altered since it was written; "
                                    f"delete {partial} and ingest again")
                keep.add(sh[f"{key}_file"])
    for root, dirs, files in os.walk(partial):
        for f in files:
            rel = (Path(root) / f).relative_to(partial).as_posix()
            if rel not in keep:
                os.unlink(Path(root) / f)  # a shard after the last recorded one, or a write cut short
    return position, sources


def ingest(
    out_dir: str | Path,
    inputs: Iterable[tuple[str, str | Path, object]],
    tokenizer_file: str | Path | None = None,
    eod_token: str | None = None,
    text_field: str = "text",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    progress: Callable[[str], None] | None = None,
    validation_documents: int = 0,
    *,
    recipe=None,
    workers: int | None = None,
    resume: bool = False,
    skip_empty: bool = False,
    on_shard: Callable[[str, int], None] | None = None,
) -> Path:
    """Tokenize ``inputs`` ((name, path, weight) per source) into a new data folder; returns the manifest path.

    Each path is a document file or a folder of them (``documents``: .txt, .jsonl, .jsonl.gz,
    .jsonl.zst, .parquet, mixed), read in its order; the text is ``text_field`` of a JSON line or
    Parquet row. An empty document is an error unless ``skip_empty``. ``recipe`` (a
    ``data_recipes.DataRecipe``): the sources are the recipe's, each with its text field, and
    the weights follow from its token shares; the manifest records it. ``workers``: processes
    that tokenize (default: every core; the bytes do not depend on it). ``resume``: continue an
    interrupted ingest of the same plan (module docstring). ``progress`` gets a status line
    every few seconds. ``validation_documents``: each source holds out its last this many
    documents (in that order) for validation; the training stream never yields them.
    ``on_shard(source, shards_so_far)`` is called after each shard and its state are written.
    """
    if isinstance(validation_documents, bool) or not isinstance(validation_documents, int) or validation_documents < 0:
        raise DataError.naming(Setting("validation_documents"),
                               f" must be a non-negative integer, got {validation_documents!r}")
    if tokenizer_file is None:
        if eod_token is not None:
            raise DataError.naming(Setting("eod_token"), " applies only with ", Setting("tokenizer_file"),
                                   "; the byte tokenizer's separator is id 256")
        tok = ByteTokenizer()
    else:
        try:
            tok = HFTokenizer(tokenizer_file, eod_token=eod_token)
        except TokenizerError as e:
            raise DataError.like(e) from None
    if shard_tokens < 1:
        raise DataError(f"shard size must be at least 1 token, got {shard_tokens}")
    inputs = [(n, Path(p), w) for n, p, w in inputs]
    fields = {n: text_field for n, _, _ in inputs}
    if recipe is not None:
        given, wanted = [n for n, _, _ in inputs], [s.name for s in recipe.sources]
        if sorted(given) != sorted(wanted):
            raise DataError(f"data recipe {recipe.name}: give one NAME=PATH for each of its sources "
                            f"({', '.join(wanted)}); got {', '.join(given) or 'none'}")
        order = {n: i for i, n in enumerate(wanted)}
        inputs.sort(key=lambda x: order[x[0]])
        fields = {s.name: s.text_field for s in recipe.sources}
    plan_files = [input_files(p) for _, p, _ in inputs]  # fail on a bad path before writing
    weights = [None if recipe is not None else _json_weight(w, f"source {n!r}") for n, _, w in inputs]
    plan = {
        "sources": [{"name": n, "weight": w, "text_field": fields[n], "files": [f.record() for f in files]}
                    for (n, _, _), w, files in zip(inputs, weights, plan_files)],
        "tokenizer": tok.identity(), "shard_tokens": int(shard_tokens),
        "validation_documents": validation_documents, "skip_empty": bool(skip_empty),
        "recipe": recipe.record() if recipe is not None else None,
    }
    out_dir = Path(out_dir).absolute()
    partial = _partial_folder(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise DataError.naming(f"{out_dir}: already exists and is not an empty folder; choose a new ", Setting("out_dir"),
                               " or delete it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if partial.exists() and not resume:
        raise DataError.naming(f"{partial}: an interrupted ingest of {out_dir.name} is there; run the same command "
                               "with ", Setting("resume"), f" to continue it, or delete {partial}")
    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        raise DataError(f"{partial}: not a folder; delete it and ingest again")
    if not partial.exists():
        partial.mkdir()
    position, done = _load_state(partial, plan)  # a refused resume keeps the partial folder
    try:
        writer = DataWriter(out_dir, tok, shard_tokens=shard_tokens, recipe=plan["recipe"], staging=partial)
        for (name, _, _), w, rec in zip(inputs, weights, done):
            sw = writer.add_source(name, w)
            sw.documents, sw.tokens = rec["documents"], rec["tokens"]
            sw.shards = [{k: sh[k] for k in SHARD_KEYS} for sh in rec["shards"]]  # the manifest's key order
        n_workers = default_workers() if workers is None else max(1, int(workers))
        pool = None
        if n_workers > 1:
            import multiprocessing

            tok_data = tok.data if isinstance(tok, HFTokenizer) else None
            pool = multiprocessing.get_context("spawn").Pool(n_workers, _worker_init,
                                                             (tok_data, eod_token, bool(skip_empty)))
        try:
            _ingest_sources(writer, inputs, weights, plan, plan_files, fields, position, tok, skip_empty, pool,
                            n_workers * WINDOW_PER_WORKER, progress, on_shard)
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
        for sw in writer.sources:
            sw.validation_documents = validation_documents
        os.unlink(partial / STATE_NAME)
        return writer.commit()
    except DataError:
        shutil.rmtree(partial, ignore_errors=True)  # bad input: nothing half-written
        raise


def _ingest_sources(writer, inputs, weights, plan, plan_files, fields, position, tok, skip_empty, pool, window,
                    progress, on_shard) -> None:
    total = sum(f.size for files in plan_files for f in files)
    s0, f0, item0 = position
    done_before = sum(f.size for files in plan_files[:s0] for f in files) + sum(
        f.size for f in plan_files[s0][:f0]) if s0 < len(plan_files) else total
    tick = _IngestProgress(progress, total, done_before)
    for si in range(s0, len(inputs)):
        name = inputs[si][0]
        files = plan_files[si]
        sw = writer.sources[si] if si < len(writer.sources) else writer.add_source(name, weights[si])
        start_file, start_item = (f0, item0) if si == s0 else (0, 0)
        raw = (b for fi in range(start_file, len(files))
               for b in read_batches(files[fi], fi, fields[name], start_item if fi == start_file else 0))
        base = sum(f.size for files_ in plan_files[:si] for f in files_)
        before_file = np.concatenate([[0], np.cumsum([f.size for f in files], dtype=np.int64)]).tolist()
        skipped = 0
        for tb in _token_batches(raw, tok, skip_empty, pool, window):
            skipped += tb.skipped
            tick.text_bytes += tb.text_bytes
            flat, offsets = tb.flat, tb.offsets
            for k in range(tb.documents):
                before = len(sw.shards)
                sw.add_document(flat[offsets[k]:offsets[k + 1]])
                if len(sw.shards) != before:  # a shard was written: record where the next one starts
                    after = [si, tb.file_index, int(tb.items[k]) + 1]
                    atomic_write_bytes(writer.staging / STATE_NAME, _state_bytes(plan, after, writer), mode=FILE_MODE)
                    if on_shard is not None:
                        on_shard(name, len(sw.shards))
            here = base + before_file[tb.file_index] + tb.position
            tick(name, f"{tb.file_index + 1}/{len(files)}", sw.documents, sw.tokens, here)
        sw.flush()
        if sw.documents == 0:
            raise DataError(f"{inputs[si][1]}: source {name!r} has no documents; give it document files with text")
        atomic_write_bytes(writer.staging / STATE_NAME, _state_bytes(plan, [si + 1, 0, 0], writer), mode=FILE_MODE)
        if on_shard is not None:
            on_shard(name, len(sw.shards))
        tick(name, f"{len(files)}/{len(files)}", sw.documents, sw.tokens,
             base + before_file[-1], force=True)
        if skipped and progress is not None:
            progress(f"ingest: {name}: {skipped} empty documents skipped")
