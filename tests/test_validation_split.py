"""Held-out validation documents: the training stream never yields them.

The proof has three parts: the definition (an independent rewrite of the stream with
held-out documents, compared token for token), the tokens themselves (a corpus of
consecutive integers, so every token names its document: no token of a held-out
document appears in several epochs of the stream, and every training document appears
once per epoch), and the default corpus (the documents of the stream's first three
epochs of every source, by id, are all training documents).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from lockstep.spec.philox import PhiloxStream
from lockstep.train.corpus import VALIDATION_TOKENS, build_default_corpus
from lockstep.train.data import DataError, GlobalStream, Manifest, ingest, validation_windows
from test_data import INTEGER_SOURCES, integer_docs, write_integer_folder

# alpha: its last 40 documents are the whole 3-document last shard and 37 of shard 1;
# beta: 10 of its last shard; gamma (3 documents): 1.
HELD = {"alpha": 40, "beta": 10, "gamma": 1}


def _hold_out(manifest: dict, folder) -> None:
    manifest["version"] = 2
    for s in manifest["sources"]:
        s["validation_documents"] = HELD[s["name"]]


@pytest.fixture(scope="module")
def held_folder(tmp_path_factory):
    path, eod = write_integer_folder(tmp_path_factory.mktemp("held") / "data", _hold_out)
    return Manifest.load(path), eod


def _ordered_docs() -> dict[str, list[list[int]]]:
    """Every document of each source, ids 0 .. D-1 (shard by shard)."""
    return {name: [d for shard in shards for d in shard] for name, shards in integer_docs().items()}


def _reference_buffer(seed: int, n_docs: int) -> list[int]:
    """The stream with held-out documents, rewritten plainly from the docstring."""
    docs = integer_docs()
    names = list(INTEGER_SOURCES)
    cum = np.cumsum([INTEGER_SOURCES[n][0] for n in names]).tolist()
    v = PhiloxStream(seed, "lockstep.data.mix").uint32(0, 2 * n_docs).tolist()

    def perm(stream, n):
        u = stream.uint32(0, 2 * n).tolist()
        return sorted(range(n), key=lambda i: ((u[2 * i] << 32) | u[2 * i + 1], i))

    def epoch(name, e):
        shards = docs[name]
        n_train = sum(len(s) for s in shards) - HELD[name]
        sha = hashlib.sha256(name.encode()).digest()
        out = []
        bases = [sum(len(s) for s in shards[:k]) for k in range(len(shards))]
        for k in perm(PhiloxStream(seed, "lockstep.data.shard-order", sha, e), len(shards)):
            t_k = max(0, min(len(shards[k]), n_train - bases[k]))
            out += [shards[k][i] for i in perm(PhiloxStream(seed, "lockstep.data.doc-order", sha, e, k), t_k)]
        return out

    counts = dict.fromkeys(names, 0)
    cache: dict = {}
    buf = []
    for g in range(n_docs):
        t = (((v[2 * g] << 32) | v[2 * g + 1]) * cum[-1]) >> 64
        name = names[next(i for i in range(len(cum)) if t < cum[i])]
        n_train = sum(len(s) for s in docs[name]) - HELD[name]
        e, j = divmod(counts[name], n_train)
        counts[name] += 1
        if (name, e) not in cache:
            cache[name, e] = epoch(name, e)
        buf += cache[name, e][j] + [-1]
    return buf


@pytest.mark.parametrize("seed", [0, 7])
def test_stream_with_held_out_documents_matches_reference(held_folder, seed):
    manifest, eod = held_folder
    ref = np.array([eod if t == -1 else t for t in _reference_buffer(seed, 2600)])
    n = len(ref) // 38
    assert np.array_equal(GlobalStream(manifest, seed, 37).windows(0, n).reshape(-1), ref[: n * 38])


def test_no_held_out_token_in_several_epochs(held_folder):
    manifest, eod = held_folder
    flat = GlobalStream(manifest, 3, seq_len=63).windows(0, 500).reshape(-1)
    docs = _ordered_docs()
    held_tokens = {t for name, ds in docs.items() for d in ds[len(ds) - HELD[name]:] for t in d}
    seen = set(flat.tolist()) - {eod}
    assert held_tokens and not (held_tokens & seen), "a validation document reached the training stream"
    # every training document, once per epoch: split the stream into documents by their first token
    cut = np.flatnonzero(flat == eod)
    pieces = [p[p != eod] for p in np.split(flat[: cut[-1]], cut[:-1] + 1)]
    owner = {d[0]: (name, i) for name, ds in docs.items() for i, d in enumerate(ds)}
    per_source: dict[str, list[int]] = {n: [] for n in docs}
    for p in pieces:  # the stream starts at the beginning of a document; the last piece is cut at an eod
        name, i = owner[int(p[0])]
        assert p.tolist() == docs[name][i]
        per_source[name].append(i)
    for name, got in per_source.items():
        n_train = len(docs[name]) - HELD[name]
        assert len(got) >= n_train, f"{name}: not even one epoch read; read more windows"
        for e in range(len(got) // n_train):
            assert sorted(got[e * n_train : (e + 1) * n_train]) == list(range(n_train)), (name, e)


def test_resume_record_counts_training_documents(held_folder):
    manifest, _ = held_folder
    stream = GlobalStream(manifest, 5, seq_len=16)
    want = stream.windows(0, 2005)
    for m in (0, 333, 1999):
        state = json.loads(json.dumps(stream.state_at(m)))
        for s, src in zip(state["sources"], manifest.sources):
            assert s["epoch"] == s["documents_consumed"] // src.training_documents
        assert np.array_equal(GlobalStream.from_state(manifest, 5, 16, state).windows(m, 5), want[m : m + 5])


def test_validation_windows_are_the_last_documents_joined(held_folder):
    manifest, eod = held_folder
    docs = _ordered_docs()
    splits = validation_windows(manifest, 9)
    assert [s.source for s in splits] == ["alpha", "beta", "gamma"]
    for split in splits:
        held = docs[split.source][len(docs[split.source]) - HELD[split.source]:]
        buf = [t for d in held for t in d + [eod]]
        n = len(buf) // 10
        assert split.documents == HELD[split.source] and split.tokens == len(buf)
        assert split.windows.dtype == np.int32 and split.windows.reshape(-1).tolist() == buf[: n * 10]
        assert split.targets == n * 9


def test_version_1_and_no_held_out_give_the_same_stream(tmp_path):
    def v2_zero(m, folder):
        m["version"] = 2
        for s in m["sources"]:
            s["validation_documents"] = 0

    a = Manifest.load(write_integer_folder(tmp_path / "v1")[0])
    b = Manifest.load(write_integer_folder(tmp_path / "v2", v2_zero)[0])
    assert np.array_equal(GlobalStream(a, 2, 21).windows(0, 700), GlobalStream(b, 2, 21).windows(0, 700))
    assert validation_windows(a, 21) == []


@pytest.mark.parametrize("bad, message", [
    ({"version": 1, "validation_documents": 1}, "unknown key"),
    ({"validation_documents": 3}, "leaves no training documents"),
    ({"validation_documents": -1}, "expected an integer"),
    ({"validation_documents": True}, "expected an integer"),
    ({"version": 3}, "version"),
])
def test_bad_held_out_counts_are_refused(tmp_path, bad, message):
    def mutate(m, folder):
        m["version"] = bad.get("version", 2)
        for s in m["sources"]:
            if "validation_documents" in bad and s["name"] == "gamma":
                s["validation_documents"] = bad["validation_documents"]
            elif m["version"] == 2:
                s["validation_documents"] = 0

    path, _ = write_integer_folder(tmp_path / "d", mutate)
    with pytest.raises(DataError, match=message):
        Manifest.load(path)


def test_default_corpus_holds_out_a_slice_of_each_source(tmp_path):
    build_default_corpus(tmp_path / "c")
    manifest = Manifest.load(tmp_path / "c")
    for si, src in enumerate(manifest.sources):
        lengths = [manifest.document_tokens(si, d).shape[0] for d in range(src.training_documents, src.documents)]
        assert sum(lengths) >= VALIDATION_TOKENS > sum(lengths[1:]), src.name  # the fewest last documents
    # the documents of the stream's first three epochs of every source are training documents
    stream = GlobalStream(manifest, 0, 256)
    n_docs = 3 * 3 * max(s.training_documents for s in manifest.sources) + 3000  # equal weights: 1/3 each
    src, doc = stream.document_ids(0, n_docs)
    for si, s in enumerate(manifest.sources):
        mine = doc[src == si]
        assert mine.size >= 3 * s.training_documents, s.name
        assert int(mine.max()) < s.training_documents, f"{s.name}: a validation document is in the stream"
        assert sorted(mine[: s.training_documents].tolist()) == list(range(s.training_documents))
    # and document_ids is what windows() reads: the first window starts with document 0's tokens
    first = manifest.document_tokens(int(src[0]), int(doc[0]))
    assert np.array_equal(stream.windows(0, 1)[0, : min(first.shape[0], 257)], first[:257])


def test_ingest_holds_out_the_last_documents(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(10)))
    path = ingest(tmp_path / "out", [("a", src, 1)], validation_documents=3)
    m = Manifest.load(path)
    assert m.sources[0].validation_documents == 3 and m.sources[0].training_documents == 7
    assert json.loads(path.read_text())["version"] == 2
    text = m.tokenizer().decode(validation_windows(m, 5)[0].windows.reshape(-1))
    assert text.startswith("doc 7\ndoc 8")
    with pytest.raises(DataError, match="cannot hold out 10"):
        ingest(tmp_path / "out2", [("a", src, 1)], validation_documents=10)
    assert not (tmp_path / "out2").exists()
