"""The data pipeline: shards, manifest, the global stream, the default corpus, bad input.

The stream is checked against ``reference_buffer``, an independent, plainly slow
rewrite of the definition in ``lockstep/formats/stream.py``'s docstring (Python integers
and ``sorted``), on shards of consecutive integers so that a skipped or repeated token
shows as a wrong number.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from lockstep.cli.data import add_parser as add_data_parser, run_data
from lockstep.spec.philox import PhiloxStream
from lockstep.formats.corpus import VALIDATION_TOKENS, build_default_corpus
from lockstep.formats.ingest import ingest
from lockstep.formats.manifest import DataError, Manifest, npy_bytes
from lockstep.formats.stream import GlobalStream, batch_digest, validation_windows
from lockstep.formats.tokenizer import hf_tokenizers_available

# ---------------------------------------------------------------------------------
# A hand-written data folder of consecutive integers
# ---------------------------------------------------------------------------------

# source name -> (weight, doc lengths per shard). "gamma" is tiny: it runs through
# many epochs while the others run through one or two.
INTEGER_SOURCES = {
    "alpha": (3, [[1 + (i * 7) % 9 for i in range(400)], [2 + i % 5 for i in range(300)], [1, 30, 2]]),
    "beta": (2, [[1 + (i * 5) % 11 for i in range(500)], [3] * 250]),
    "gamma": (1, [[2, 1, 4]]),
}


def integer_docs() -> dict[str, list[list[list[int]]]]:
    """Token lists per source, shard, document: ids 0, 1, 2, ... in manifest order."""
    nxt, out = 0, {}
    for name, (_, shards) in INTEGER_SOURCES.items():
        out[name] = []
        for lengths in shards:
            docs = []
            for n in lengths:
                docs.append(list(range(nxt, nxt + n)))
                nxt += n
            out[name].append(docs)
    return out


def write_integer_folder(folder: Path, mutate=None) -> tuple[Path, int]:
    """Write the integer corpus by hand (independent of DataWriter); returns (manifest, eod)."""
    folder.mkdir(parents=True)
    docs = integer_docs()
    eod = sum(len(d) for sh in docs.values() for s in sh for d in s)
    tok_file = folder / "tokenizer.json"
    tok_file.write_bytes(b"{}")  # only its digest is checked; the stream never tokenizes
    manifest = {
        "format": "lockstep.data-manifest",
        "version": 1,
        "tokenizer": {
            "kind": "hf-tokenizers", "file": "tokenizer.json", "sha256": hashlib.sha256(b"{}").hexdigest(),
            "vocab_size": eod + 1, "eod_id": eod, "eod_token": None,
        },
        "sources": [],
    }
    for name, (weight, _) in INTEGER_SOURCES.items():
        (folder / name).mkdir()
        shards = []
        for k, sdocs in enumerate(docs[name]):
            flat = np.array([t for d in sdocs for t in d], dtype=np.uint32)
            off = np.concatenate([[0], np.cumsum([len(d) for d in sdocs])]).astype(np.int64)
            tb, ob = npy_bytes(flat), npy_bytes(off)
            (folder / name / f"{k}.tok.npy").write_bytes(tb)
            (folder / name / f"{k}.off.npy").write_bytes(ob)
            shards.append({
                "tokens_file": f"{name}/{k}.tok.npy", "tokens_sha256": hashlib.sha256(tb).hexdigest(),
                "offsets_file": f"{name}/{k}.off.npy", "offsets_sha256": hashlib.sha256(ob).hexdigest(),
                "documents": len(sdocs), "tokens": int(off[-1]),
            })
        manifest["sources"].append({
            "name": name, "weight": weight, "documents": sum(s["documents"] for s in shards),
            "tokens": sum(s["tokens"] for s in shards), "shards": shards,
        })
    if mutate:
        mutate(manifest, folder)
    path = folder / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1))
    return path, eod


def reference_permutation(stream: PhiloxStream, n: int) -> list[int]:
    v = stream.uint32(0, 2 * n).tolist()
    return sorted(range(n), key=lambda i: ((v[2 * i] << 32) | v[2 * i + 1], i))


def reference_epoch(seed: int, name: str, shards: list, epoch: int) -> list[list[int]]:
    name_sha = hashlib.sha256(name.encode()).digest()
    order = []
    for k in reference_permutation(PhiloxStream(seed, "lockstep.data.shard-order", name_sha, epoch), len(shards)):
        perm = reference_permutation(PhiloxStream(seed, "lockstep.data.doc-order", name_sha, epoch, k), len(shards[k]))
        order += [shards[k][i] for i in perm]
    return order


def reference_buffer(seed: int, n_docs: int) -> tuple[list[int], list[tuple[str, int]]]:
    """The first n_docs documents of the stream, joined; and (source, epoch) of each."""
    docs = integer_docs()
    names = list(INTEGER_SOURCES)
    weights = [INTEGER_SOURCES[n][0] for n in names]  # gcd 1 already
    cum = [sum(weights[: i + 1]) for i in range(len(weights))]
    v = PhiloxStream(seed, "lockstep.data.mix").uint32(0, 2 * n_docs).tolist()
    counts = dict.fromkeys(names, 0)
    epochs: dict = {}
    buf, meta = [], []
    for g in range(n_docs):
        t = (((v[2 * g] << 32) | v[2 * g + 1]) * cum[-1]) >> 64
        name = names[next(i for i in range(len(cum)) if t < cum[i])]
        n_src = sum(len(s) for s in docs[name])
        e, j = divmod(counts[name], n_src)
        counts[name] += 1
        if (name, e) not in epochs:
            epochs[name, e] = reference_epoch(seed, name, docs[name], e)
        buf += epochs[name, e][j] + [-1]
        meta.append((name, e))
    return buf, meta


@pytest.fixture(scope="module")
def integer_folder(tmp_path_factory):
    path, eod = write_integer_folder(tmp_path_factory.mktemp("ints") / "data")
    return Manifest.load(path), eod


@pytest.fixture(scope="module")
def default_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("default") / "corpus"
    build_default_corpus(out)
    return out


def _flat(stream: GlobalStream, n_windows: int) -> np.ndarray:
    return stream.windows(0, n_windows).reshape(-1)


# ---------------------------------------------------------------------------------
# The stream
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7])
def test_stream_matches_reference_definition(integer_folder, seed):
    manifest, eod = integer_folder
    ref, meta = reference_buffer(seed, 2600)  # crosses planning chunks and several epochs
    ref = np.array([eod if t == -1 else t for t in ref])
    stream = GlobalStream(manifest, seed, seq_len=37)
    n = len(ref) // 38
    assert np.array_equal(_flat(stream, n), ref[: n * 38])


def test_every_token_once_per_epoch(integer_folder):
    manifest, eod = integer_folder
    stream = GlobalStream(manifest, 3, seq_len=63)
    flat = _flat(stream, 400)  # about 2 epochs of alpha, 1 of beta, 170 of gamma
    cut = np.flatnonzero(flat == eod)
    docs = np.split(flat[: cut[-1]], cut[:-1] + 1)
    docs = [d[d != eod] for d in docs]
    all_docs = integer_docs()
    first_id = {}
    for name, shards in all_docs.items():
        for s in shards:
            for d in s:
                first_id[d[0]] = (name, len(d))
    per_source: dict[str, list[np.ndarray]] = {n: [] for n in all_docs}
    for d in docs:
        name, length = first_id[int(d[0])]
        assert np.array_equal(d, np.arange(d[0], d[0] + length)), "a document was cut or reordered inside"
        per_source[name].append(d)
    for name, got in per_source.items():
        n_src = sum(len(s) for s in all_docs[name])
        ids = sorted(t for s in all_docs[name] for d in s for t in d)
        full_epochs = len(got) // n_src
        assert full_epochs >= 1
        for e in range(full_epochs):
            tokens = np.sort(np.concatenate(got[e * n_src : (e + 1) * n_src]))
            assert np.array_equal(tokens, ids), f"{name} epoch {e}: a token is missing or repeated"
    assert len(per_source["gamma"]) // 3 > 20  # the tiny source wrapped around many times


@pytest.mark.parametrize("stride", [1, 2, 3, 5, 8])
def test_any_windows_from_a_fresh_stream_equal_the_sequential_ones(default_folder, stride):
    """Random access (``windows_at``): a process may fetch any set of windows, in any order."""
    manifest = Manifest.load(default_folder)
    single = GlobalStream(manifest, 11, 64)
    batch = 24
    for first in (0, 24, 5 * 24, 1000 * 24 + 3):
        want = single.windows(first, batch)
        got = np.full_like(want, -1)
        for offset in range(stride):
            idx = np.arange(first + offset, first + batch, stride, dtype=np.int64)[::-1]
            got[idx - first] = GlobalStream(manifest, 11, 64).windows_at(idx)
        assert np.array_equal(got, want)


def test_resume_records_in_process(integer_folder):
    manifest, _ = integer_folder
    stream = GlobalStream(manifest, 5, seq_len=16)
    want = stream.windows(0, 3000)
    for m in [0, 1, 2, 17, 255, 256, 1023, 1024, 1500, 2047, 2500, 2990]:
        state = json.loads(json.dumps(stream.state_at(m)))
        resumed = GlobalStream.from_state(manifest, 5, 16, state)
        assert np.array_equal(resumed.windows(m, 10), want[m : m + 10]), m
        assert resumed.state_at(m) == state
    assert np.array_equal(resumed.windows(0, 5), want[:5])  # going back works too


def test_reaching_a_window_reads_no_tokens(integer_folder, monkeypatch):
    manifest, _ = integer_folder
    stream = GlobalStream(manifest, 5, seq_len=16)
    monkeypatch.setattr(manifest, "document_tokens", lambda *a: pytest.fail("a token was read"))
    state = stream.state_at(10_000)
    assert state["mix_counter"] > 2000 and state["sources"][2]["epoch"] > 100


def test_resume_record_is_checked(integer_folder):
    manifest, _ = integer_folder
    state = GlobalStream(manifest, 5, seq_len=16).state_at(321)
    for bad in (
        {"seed": 6},
        {"mix_counter": state["mix_counter"] + 1},
        {"partial_document": dict(state["partial_document"], tokens_done=10**6)},
        {"manifest_sha256": "0" * 64},
        {"sources": state["sources"][::-1]},
    ):
        with pytest.raises(DataError):
            GlobalStream.from_state(manifest, 5, 16, {**state, **bad})
    with pytest.raises(DataError):
        GlobalStream.from_state(manifest, 5, 17, state)


SUBPROCESS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from lockstep.formats.manifest import Manifest
    from lockstep.formats.stream import GlobalStream, batch_digest
    folder, state_file = sys.argv[1], sys.argv[2]
    manifest = Manifest.load(folder)
    state = json.load(open(state_file))
    fresh = GlobalStream(manifest, 9, 31)
    resumed = GlobalStream.from_state(manifest, 9, 31, state)
    print(json.dumps([batch_digest(fresh.windows(0, 300)), batch_digest(resumed.windows(state["window"], 200))]))
    """
)


def test_resume_in_new_process_and_hash_seed_independence(integer_folder, tmp_path):
    """Restore a record in fresh interpreters whose str hashing differs (PYTHONHASHSEED)."""
    manifest, _ = integer_folder
    stream = GlobalStream(manifest, 9, 31)
    stream.windows(0, 150)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(stream.state_at(150)))
    want = [batch_digest(stream.windows(0, 300)), batch_digest(stream.windows(150, 200))]
    for hash_seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run(
            [sys.executable, "-c", SUBPROCESS_SCRIPT, str(manifest.folder), str(state_file)],
            env=env, capture_output=True, text=True, timeout=600,  # a hang guard only
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == want


def test_weights_are_exact_ratios(tmp_path):
    def with_weights(ws):
        def mutate(m, folder):
            for s, w in zip(m["sources"], ws):
                s["weight"] = w
        return mutate

    def text(ws, name):
        path, _ = write_integer_folder(tmp_path / name, with_weights(ws))
        return path

    a = GlobalStream(Manifest.load(text([3, 2, 1], "a")), 1, 15).windows(0, 500)
    raw = text([0.3, 0.2, 0.1], "b").read_text().replace("0.3,", "0.300000,")
    (tmp_path / "b" / "manifest.json").write_text(raw)
    b = GlobalStream(Manifest.load(tmp_path / "b"), 1, 15).windows(0, 500)
    c = GlobalStream(Manifest.load(text([30, 20, 10], "c")), 1, 15).windows(0, 500)
    assert np.array_equal(a, b) and np.array_equal(a, c)
    # the mix follows the weights: 3 : 2 : 1 over many documents
    m = Manifest.load(text([3, 2, 1], "d"))
    state = GlobalStream(m, 1, 15).state_at(20_000)
    counts = [s["documents_consumed"] for s in state["sources"]]
    shares = [c / sum(counts) for c in counts]
    assert abs(shares[0] - 1 / 2) < 0.02 and abs(shares[1] - 1 / 3) < 0.02 and abs(shares[2] - 1 / 6) < 0.02


def test_batch_digest_is_canonical():
    w = np.arange(12).reshape(3, 4)
    assert batch_digest(w) == batch_digest(w.astype(np.uint16)) == batch_digest(w.astype(np.int32))
    assert batch_digest(w) != batch_digest(w.reshape(4, 3))
    assert batch_digest(w) != batch_digest(w[::-1])


# ---------------------------------------------------------------------------------
# The default corpus
# ---------------------------------------------------------------------------------

# Regression pins, computed once with this code: if a generator, the shard layout or
# the stream changes, these change (bump CORPUS_VERSION / the formats with intent).
# Recompute with:
#   python3 -c "from lockstep.formats.corpus import build_default_corpus as b; from lockstep.formats.stream import
#   GlobalStream, batch_digest as d; from lockstep.formats.manifest import Manifest; b('/tmp/c'); m = Manifest.load('/tmp/c'); s = GlobalStream(m, 0, 256);
#   print(m.sha256, d(s.windows(0, 16)), d(s.windows(4000, 16)))"
# Manifest version 2 (validation documents held out) changed the manifest, and the stream
# from where it first enters a shard holding validation documents (after window 15).
DEFAULT_MANIFEST_SHA256 = "1fac6397edb56a3fb2b8e4a0a48499159fa330bf01a73ea79aa59db994f37ced"
DEFAULT_FIRST_WINDOWS_DIGEST = "55e722cecd521a9185e9cb276debe4103dc72fcd95052ef0b3e0263653c213be"  # seed 0, seq_len 256, windows 0..15
DEFAULT_LATER_WINDOWS_DIGEST = "48d2a20d466de904d49988016f839b14045ada21f371a3ea00b13faf04488da6"  # windows 4000..4015


def test_default_corpus_is_pinned(default_folder):
    manifest = Manifest.load(default_folder)
    assert manifest.sha256 == DEFAULT_MANIFEST_SHA256
    windows = GlobalStream(manifest, 0, 256).windows(0, 16)
    assert batch_digest(windows) == DEFAULT_FIRST_WINDOWS_DIGEST
    assert batch_digest(GlobalStream(manifest, 0, 256).windows(4000, 16)) == DEFAULT_LATER_WINDOWS_DIGEST
    assert [s.name for s in manifest.sources] == ["math", "code", "text"]
    total = sum(s.tokens for s in manifest.sources)
    assert 2_000_000 < total < 4_000_000
    text = manifest.tokenizer().decode(windows[0])
    assert text.isascii() and len(text) > 200


# ---------------------------------------------------------------------------------
# Ingest and the CLI
# ---------------------------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="lockstep")
    add_data_parser(parser.add_subparsers(dest="command"))
    return run_data(parser.parse_args(argv))


def test_ingest_txt_and_jsonl(tmp_path, capsys):
    (tmp_path / "web" / "sub").mkdir(parents=True)
    (tmp_path / "web" / "b.txt").write_bytes("héllo\n".encode())
    (tmp_path / "web" / "sub" / "a.txt").write_bytes(b"second")
    (tmp_path / "web" / "empty.txt").write_bytes(b"")
    (tmp_path / "code.jsonl").write_text('{"text": "x = 1"}\n\n{"text": "y", "id": 2}\n')
    out = tmp_path / "out"
    assert _cli(["data", "ingest", "--out", str(out), str(tmp_path / "web"), f"prog={tmp_path / 'code.jsonl'}",
                 "--weight", "prog=0.5", "--skip-empty"]) == 0
    m = Manifest.load(out)
    assert [(s.name, s.documents, s.tokens) for s in m.sources] == [("web", 2, 13), ("prog", 2, 6)]
    assert m.sources[1].weight == Decimal("0.5")
    docs = {bytes(m.document_tokens(0, i).tolist()) for i in range(2)}
    assert docs == {"héllo\n".encode(), b"second"}
    flat = GlobalStream(m, 0, 7).windows(0, 10).reshape(-1)
    assert set(flat.tolist()) <= set(range(257)) and 256 in flat
    assert "web: weight 1, 2 documents" in capsys.readouterr().out


@pytest.mark.skipif(not hf_tokenizers_available(), reason="the optional 'tokenizers' package is not installed")
def test_ingest_with_hf_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the cat sat on the mat"] * 5, trainers.BpeTrainer(vocab_size=40, special_tokens=["[UNK]", "<eod>"]))
    tok.save(str(tmp_path / "tok.json"))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("the cat sat")
    path = ingest(tmp_path / "out", [("a", tmp_path / "in", 1)], tokenizer_file=tmp_path / "tok.json", eod_token="<eod>")
    m = Manifest.load(path)
    assert m.tokenizer_identity["sha256"] == hashlib.sha256((tmp_path / "tok.json").read_bytes()).hexdigest()
    assert m.eod_id == tok.token_to_id("<eod>")
    w = GlobalStream(m, 0, 3).windows(0, 2)
    assert m.tokenizer().decode(w[0][w[0] != m.eod_id]).replace(" ", "").startswith("thecat")


def test_failed_ingest_leaves_nothing(tmp_path, capsys):
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "a.txt").write_text("fine")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": broken\n')
    rc = _cli(["data", "ingest", "--out", str(tmp_path / "out"), str(tmp_path / "good"), str(tmp_path / "bad.jsonl")])
    err = capsys.readouterr().err
    assert rc == 1 and "bad.jsonl:2" in err and "malformed JSON" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good"]  # no out, no staging
    (tmp_path / "empty").mkdir()
    assert _cli(["data", "ingest", "--out", str(tmp_path / "out"), str(tmp_path / "empty")]) == 1
    assert "no documents" in capsys.readouterr().err
    for w in ("0", "-2", "x"):
        assert _cli(["data", "ingest", "--out", str(tmp_path / "o"), str(tmp_path / "good"), "--weight", f"good={w}"]) == 1
        assert "weight" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "empty", "good"]


# ---------------------------------------------------------------------------------
# Bad data folders
# ---------------------------------------------------------------------------------


def _set(path, value):
    def mutate(m, folder):
        obj = m
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return mutate


@pytest.mark.parametrize(
    "mutate, message",
    [
        (_set(["sources", 0, "shards", 0, "tokens_file"], "../../etc/passwd"), "leaves the manifest's folder"),
        (_set(["sources", 0, "shards", 0, "tokens_file"], "/etc/passwd"), "leaves the manifest's folder"),
        (_set(["sources", 1, "weight"], 0), "zero or negative"),
        (_set(["sources", 1, "weight"], -1.5), "zero or negative"),
        (_set(["sources", 1, "weight"], "1"), "not a number"),
        (_set(["sources", 2, "shards"], []), "shards hold 0 documents"),
        (lambda m, f: m["tokenizer"].update(vocab_size=100, eod_id=99), "outside the vocabulary"),
        (_set(["sources", 0, "shards", 0, "tokens_sha256"], "ab" * 32), "does not match"),
        (_set(["sources", 0, "colour"], "red"), "unknown key"),
        (_set(["sources", 1, "name"], "alpha"), "appears twice"),
    ],
)
def test_bad_manifest(tmp_path, mutate, message):
    path, _ = write_integer_folder(tmp_path / "d", mutate)
    with pytest.raises(DataError, match=message) as e:
        Manifest.load(path)
    assert str(tmp_path / "d") in str(e.value)


def test_empty_source(tmp_path):
    def mutate(m, folder):
        s = m["sources"][2]
        s["shards"][0].update(documents=0, tokens=0)
        s.update(documents=0, tokens=0)

    path, _ = write_integer_folder(tmp_path / "d", mutate)
    with pytest.raises(DataError, match="empty"):
        Manifest.load(path)


def test_missing_or_altered_shard(tmp_path):
    path, _ = write_integer_folder(tmp_path / "d")
    shard = tmp_path / "d" / "beta" / "1.tok.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"1\.tok\.npy: SHA-256 .* does not match"):
        Manifest.load(path)
    shard.unlink()
    with pytest.raises(DataError, match=r"1\.tok\.npy: file missing"):
        Manifest.load(tmp_path / "d")


def test_symlink_out_of_folder(tmp_path):
    path, _ = write_integer_folder(tmp_path / "d")
    outside = tmp_path / "outside.npy"
    (tmp_path / "d" / "gamma" / "0.tok.npy").rename(outside)
    (tmp_path / "d" / "gamma" / "0.tok.npy").symlink_to(outside)
    with pytest.raises(DataError, match="leaves the manifest's folder .*through a symlink"):
        Manifest.load(path)


def test_malformed_json(tmp_path):
    path, _ = write_integer_folder(tmp_path / "d")
    path.write_text(path.read_text()[:-20])
    with pytest.raises(DataError, match=r"malformed data manifest .*manifest\.json: line \d+ column \d+"):
        Manifest.load(path)
    path.write_text('{"format": 1, "format": 2}')
    with pytest.raises(DataError, match="duplicate key"):
        Manifest.load(path)
    path.write_text('{"format": NaN}')
    with pytest.raises(DataError, match="NaN is not valid JSON"):
        Manifest.load(path)
    with pytest.raises(DataError, match="no manifest"):
        Manifest.load(tmp_path)


# ---------------------------------------------------------------------------------
# Held-out validation documents: the training stream never yields them
# ---------------------------------------------------------------------------------
# The proof has three parts: the definition (an independent rewrite of the stream with
# held-out documents, compared token for token), the tokens themselves (the integer
# corpus: every token names its document, so no token of a held-out document may appear
# in several epochs of the stream, and every training document appears once per epoch),
# and the default corpus (the documents of the stream's first three epochs of every
# source, by id, are all training documents).

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
