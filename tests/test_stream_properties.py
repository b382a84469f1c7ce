"""Properties of the global data stream, searched with Hypothesis over random data folders.

For random manifests (1-4 sources, weights from 10**-6 to 1000, 1-3 shards per source,
shards without documents, empty documents and documents longer than a window), seeds,
sequence lengths, world sizes and resume points:

* the micro-batches all ranks compute, each rank reading the step's batch from its own
  stream at the step's first window, put together, are the single-rank stream read
  straight through (ranks take whole micro-batches, ``collectives.rank_micro_batches``);
* a stream resumed from ``state_at(m)`` (through JSON, in a new object, on any number
  of ranks) gives the windows of reading straight through, and the same records;
* within an epoch of a source no token is skipped or repeated, and no document is cut
  or reordered inside.

Every token id in a folder is distinct (documents hold consecutive integers, as in
llm.c's data-loader test), so a skipped or repeated token shows as a wrong number.
The source of each document is recomputed here from the definition (step 1 of the
stream, ``lockstep/formats/stream.py``) with Python integers, independent of the code.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import Phase, given, note, settings
from hypothesis import strategies as st

from lockstep.spec.philox import PhiloxStream
from lockstep.spec.tree import micro_batch_bounds
from lockstep.train.collectives import rank_micro_batches
from lockstep.formats.manifest import Manifest, npy_bytes
from lockstep.formats.stream import PLAN_CHUNK, GlobalStream

# Weights as JSON numbers: integers, decimals with up to 6 places, and extremes.
WEIGHTS = (1, 2, 3, 7, 1000, 0.5, 0.25, 1.5, 2.125, 0.000001)


@dataclass(frozen=True)
class Folder:
    """A drawn data folder: per source its weight and, per shard, its document lengths."""

    sources: tuple[tuple[str, float | int, tuple[tuple[int, ...], ...]], ...]

    def documents(self) -> dict[str, list[list[int]]]:
        """Token ids per source, document by document (shards in order): 0, 1, 2, ... overall."""
        nxt, out = 0, {}
        for name, _, shards in self.sources:
            out[name] = []
            for lengths in shards:
                for n in lengths:
                    out[name].append(list(range(nxt, nxt + n)))
                    nxt += n
        return out

    @property
    def total_tokens(self) -> int:
        return sum(n for _, _, shards in self.sources for lengths in shards for n in lengths)


@st.composite
def folders(draw, seq_len: int) -> Folder:
    long_doc = st.integers(seq_len + 1, 3 * (seq_len + 1))  # longer than a window
    length = st.one_of(st.just(0), st.integers(1, 6), long_doc)
    shard = st.lists(length, min_size=0, max_size=8).map(tuple)
    n_sources = draw(st.integers(1, 4))
    sources = []
    for i in range(n_sources):
        shards = draw(st.lists(shard, min_size=1, max_size=3).filter(lambda s: sum(map(len, s)) > 0))
        sources.append((f"src{i}", draw(st.sampled_from(WEIGHTS)), tuple(shards)))
    return Folder(tuple(sources))


def write_folder(folder: Folder, root: Path) -> Manifest:
    """Write ``folder`` as a data folder by hand (independent of DataWriter) and load it."""
    docs = folder.documents()
    eod = folder.total_tokens
    (root / "tokenizer.json").write_bytes(b"{}")  # only its digest is checked; the stream never tokenizes
    manifest = {
        "format": "lockstep.data-manifest", "version": 1,
        "tokenizer": {"kind": "hf-tokenizers", "file": "tokenizer.json", "sha256": hashlib.sha256(b"{}").hexdigest(),
                      "vocab_size": eod + 1, "eod_id": eod, "eod_token": None},
        "sources": [],
    }
    for name, weight, shards in folder.sources:
        (root / name).mkdir()
        entries, first = [], 0
        for k, lengths in enumerate(shards):
            sdocs = docs[name][first:first + len(lengths)]
            first += len(lengths)
            flat = np.array([t for d in sdocs for t in d], dtype=np.uint32)
            off = np.concatenate([[0], np.cumsum([len(d) for d in sdocs], dtype=np.int64)]).astype(np.int64)
            tb, ob = npy_bytes(flat), npy_bytes(off)
            (root / name / f"{k}.tok.npy").write_bytes(tb)
            (root / name / f"{k}.off.npy").write_bytes(ob)
            entries.append({"tokens_file": f"{name}/{k}.tok.npy", "tokens_sha256": hashlib.sha256(tb).hexdigest(),
                            "offsets_file": f"{name}/{k}.off.npy", "offsets_sha256": hashlib.sha256(ob).hexdigest(),
                            "documents": len(sdocs), "tokens": int(off[-1])})
        manifest["sources"].append({"name": name, "weight": weight, "documents": sum(e["documents"] for e in entries),
                                    "tokens": sum(e["tokens"] for e in entries), "shards": entries})
    (root / "manifest.json").write_text(json.dumps(manifest))
    return Manifest.load(root)


@st.composite
def streams(draw):
    """(folder, seed, seq_len): seeds at the ends of [0, 2**64) and between."""
    seq_len = draw(st.one_of(st.sampled_from((1, 2, 7, 16)), st.integers(1, 24)))
    seed = draw(st.one_of(st.sampled_from((0, 1, 2**64 - 1)), st.integers(0, 2**64 - 1)))
    return draw(folders(seq_len)), seed, seq_len


def first_window_of_chunk(stream: GlobalStream, chunk: int) -> int:
    """The window in which document ``chunk * PLAN_CHUNK`` (the first of a planning chunk) starts
    or lies: found by bisection over ``state_at(m)["mix_counter"]``, which reads no tokens."""
    target = chunk * PLAN_CHUNK
    hi = 1
    while stream.state_at(hi)["mix_counter"] < target:
        hi *= 2
    lo = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if stream.state_at(mid)["mix_counter"] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


@st.composite
def window_positions(draw, stream: GlobalStream) -> int:
    """A window index: among the first few, anywhere in the first 300, or within two windows
    of the first planning-chunk boundary (PLAN_CHUNK documents in)."""
    where = draw(st.sampled_from(("start", "anywhere", "chunk-boundary")))
    if where == "start":
        return draw(st.integers(0, 5))
    if where == "anywhere":
        return draw(st.integers(0, 300))
    return max(0, first_window_of_chunk(stream, 1) + draw(st.integers(-2, 2)))


RANKS = dict(stream=streams(), world_size=st.integers(1, 8), micro_batch=st.integers(1, 8),
             count=st.integers(1, 40), data=st.data())


@given(**RANKS)
def test_all_ranks_together_read_the_single_rank_stream(stream, world_size, micro_batch, count, data):
    check_ranks_read_the_single_rank_stream(stream, world_size, micro_batch, count, data)


def check_ranks_read_the_single_rank_stream(stream, world_size, micro_batch, count, data):
    folder, seed, seq_len = stream
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_folder(folder, Path(tmp))
        single = GlobalStream(manifest, seed, seq_len)
        first = data.draw(window_positions(single), label="first window")
        want = single.windows(0, first + count)[first:]  # read straight through from the start
        bounds = micro_batch_bounds(count, micro_batch)
        got = np.full_like(want, -1)
        seen = np.zeros(count, dtype=int)
        for rank in range(world_size):
            rank_stream = GlobalStream(manifest, seed, seq_len)  # a rank holds only its own stream
            batch = rank_stream.windows(first, count)  # positioned by the step plan, not by what it read before
            lo, hi = rank_micro_batches(len(bounds), world_size, rank)
            for start, stop in bounds[lo:hi]:
                seen[start:stop] += 1
                got[start:stop] = batch[start:stop]
    assert np.all(seen == 1), "every window belongs to exactly one rank's micro-batches"
    assert np.array_equal(got, want)


RESUME = dict(stream=streams(), count=st.integers(1, 30), world_size=st.integers(1, 4), data=st.data())


@given(**RESUME)
def test_resumed_stream_reads_what_reading_straight_through_reads(stream, count, world_size, data):
    check_resume_reads_straight_through(stream, count, world_size, data)


def check_resume_reads_straight_through(stream, count, world_size, data):
    folder, seed, seq_len = stream
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_folder(folder, Path(tmp))
        resume_at = data.draw(window_positions(GlobalStream(manifest, seed, seq_len)), label="resume at window")
        straight = GlobalStream(manifest, seed, seq_len)
        want = straight.windows(0, resume_at + count)[resume_at:]
        record = straight.state_at(resume_at)
        assert GlobalStream(manifest, seed, seq_len).state_at(resume_at) == record, "the record does not depend on what was read"
        state = json.loads(json.dumps(record))
        resumed = GlobalStream.from_state(manifest, seed, seq_len, state)
        assert np.array_equal(resumed.windows(resume_at, count), want)
        assert resumed.state_at(resume_at + count - 1) == straight.state_at(resume_at + count - 1)
        # and on any number of ranks: each rank resumes from the same record and reads the step's batch
        for rank in range(world_size):
            rank_stream = GlobalStream.from_state(manifest, seed, seq_len, json.loads(json.dumps(record)))
            assert np.array_equal(rank_stream.windows(resume_at, count), want), f"rank {rank} of {world_size}"


def mix_sources_by_definition(folder: Folder, seed: int, n_docs: int) -> list[int]:
    """The source of documents 0 .. n_docs-1, from the definition with Python integers:
    reduced weight units, ``u = mix[2g] * 2**32 + mix[2g+1]``, ``t = floor(u * W / 2**64)``."""
    units = [int(Decimal(repr(w)) * 10**6) for _, w, _ in folder.sources]
    g = math.gcd(*units)
    cumulative = list(np.cumsum([u // g for u in units]).tolist())
    total = cumulative[-1]
    v = PhiloxStream(seed, "lockstep.data.mix").uint32(0, 2 * n_docs).tolist()
    out = []
    for i in range(n_docs):
        t = (((v[2 * i] << 32) | v[2 * i + 1]) * total) >> 64
        out.append(next(s for s, c in enumerate(cumulative) if t < c))
    return out


def _documents_read(stream: GlobalStream, n_docs: int, eod: int) -> list[np.ndarray]:
    """The first n_docs documents of the stream (the flat buffer cut at the separators)."""
    windows = 8
    while True:
        flat = stream.windows(0, windows).reshape(-1)
        cuts = np.flatnonzero(flat == eod)
        if cuts.size >= n_docs:
            starts = np.concatenate([[0], cuts + 1])
            return [flat[starts[i]:cuts[i]] for i in range(n_docs)]
        windows *= 2


EPOCHS = dict(stream=streams(), epochs=st.integers(1, 3))


@given(**EPOCHS)
def test_every_token_of_a_source_once_per_epoch(stream, epochs):
    check_every_token_once_per_epoch(stream, epochs)


def check_every_token_once_per_epoch(stream, epochs):
    folder, seed, seq_len = stream
    docs = folder.documents()
    names = [name for name, _, _ in folder.sources]
    eod = folder.total_tokens
    # Read until every source finished `epochs` epochs, or 3000 documents (a source with a
    # tiny weight may not finish one; its partial epoch is checked for repeats only).
    sources = mix_sources_by_definition(folder, seed, 3000)
    need = {s: epochs * len(docs[name]) for s, name in enumerate(names)}
    count, n_docs = dict.fromkeys(range(len(names)), 0), len(sources)
    for g, s in enumerate(sources):
        count[s] += 1
        if all(count[k] >= need[k] for k in need):
            n_docs = g + 1
            break
    note(f"{n_docs} documents read")
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_folder(folder, Path(tmp))
        read = _documents_read(GlobalStream(manifest, seed, seq_len), n_docs, eod)
    by_first_token = {d[0]: (name, i) for name in names for i, d in enumerate(docs[name]) if d}
    per_source: dict[str, list[int | None]] = {name: [] for name in names}  # doc index, None for an empty one
    for g, tokens in enumerate(read):
        name = names[sources[g]]
        if tokens.size == 0:
            per_source[name].append(None)
            continue
        src, index = by_first_token.get(int(tokens[0]), (None, None))
        assert src == name, f"document {g} should come from {name} (the mix), got tokens of {src}"
        assert tokens.tolist() == docs[name][index], f"document {g} ({name} #{index}) was cut or reordered inside"
        per_source[name].append(index)
    for name in names:
        n = len(docs[name])
        empty = sum(1 for d in docs[name] if not d)
        seq = per_source[name]
        for e in range(0, len(seq), n):
            epoch = seq[e:e + n]
            indices = [i for i in epoch if i is not None]
            assert len(indices) == len(set(indices)), f"{name}: a document repeats within epoch {e // n}"
            if len(epoch) == n:
                assert sorted(indices) == [i for i, d in enumerate(docs[name]) if d], f"{name}: epoch {e // n} skips a document"
                assert epoch.count(None) == empty


# ---------------------------------------------------------------------------------
# The properties fail when the stream is wrong (planted defects)
# ---------------------------------------------------------------------------------


def _forget_partial_document(monkeypatch):
    """Resume at the start of the document window m begins in, forgetting its tokens already read."""
    original = GlobalStream.from_state.__func__

    def from_state(cls, manifest, seed, seq_len, state):
        state = json.loads(json.dumps(state))
        state["partial_document"]["tokens_done"] = 0
        return original(cls, manifest, seed, seq_len, state)

    monkeypatch.setattr(GlobalStream, "from_state", classmethod(from_state))
    return check_resume_reads_straight_through, RESUME


def _random_access_off_by_one(monkeypatch):
    """A stream that, read at a window other than 0, starts one window early (a rank that
    positions its own stream for a step would read its neighbour's window)."""
    original = GlobalStream.windows

    def windows(self, first_window, count):
        return original(self, first_window - 1 if first_window > 0 else 0, count)

    monkeypatch.setattr(GlobalStream, "windows", windows)
    return check_ranks_read_the_single_rank_stream, RANKS


def _epoch_repeats_a_document(monkeypatch):
    """An epoch order whose last position shows the document of its first position again
    (so one document is read twice and another never)."""
    import lockstep.formats.stream as stream_mod

    documents, small = stream_mod._EpochOrder.documents, GlobalStream._small_source_orders

    def documents_repeating(self, j):
        out = documents(self, j)
        last = j == self.src.documents - 1
        if self.src.documents >= 2 and last.any():
            out[last] = documents(self, np.zeros(1, dtype=np.int64))[0]
        return out

    def small_repeating(self, si, epochs):
        out = small(self, si, epochs)
        if out.shape[1] >= 2:
            out[:, -1] = out[:, 0]
        return out

    monkeypatch.setattr(stream_mod._EpochOrder, "documents", documents_repeating)
    monkeypatch.setattr(GlobalStream, "_small_source_orders", small_repeating)
    return check_every_token_once_per_epoch, EPOCHS


def _assertion_errors(e: BaseException) -> list[AssertionError]:
    if isinstance(e, BaseExceptionGroup):
        return [a for x in e.exceptions for a in _assertion_errors(x)]
    return [e] if isinstance(e, AssertionError) else []


@pytest.mark.parametrize("plant", [_forget_partial_document, _random_access_off_by_one, _epoch_repeats_a_document],
                         ids=["resume-forgets-partial-document", "random-access-off-by-one", "epoch-repeats-a-document"])
def test_properties_catch_a_planted_defect(monkeypatch, plant):
    """Each property fails on a stream with a plausible defect (found without shrinking, to stay quick)."""
    check, strategies = plant(monkeypatch)
    search = settings(max_examples=50, phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False)(given(**strategies)(check))
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the property's AssertionError, checked below
        search()
    assert _assertion_errors(caught.value), f"the defect crashed the stream instead of failing a property: {caught.value!r}"
