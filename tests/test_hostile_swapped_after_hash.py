"""Data swapped after it was hashed (security review 2, item 1, and items 8 and 16).

The attack: a publisher who controls the storage during an audit (shared or network
storage, a FUSE server) serves the honest bytes to the hash and other bytes to the
stream. Before the fix the shard loader hashed each token shard and then mapped the
same file with a shared mapping, and read each offsets file a second time after
hashing it; a run trained on a forged corpus, re-pointed at the honest one, then
verified VALID and replayed MATCH.

What must hold: every byte the stream uses comes from the very buffer that was hashed.
Two attackers model the storage: one rewrites a shard in place after the load (the
shared-mapping hole), one answers every read from the N-th on with forged bytes (the
second-read hole), for every N. Either the load is refused or the stream is the
honest stream, byte for byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lockstep.formats import manifest as manifest_module
from lockstep.formats.ingest import DataWriter
from lockstep.formats.manifest import DataError, Manifest, npy_bytes
from lockstep.formats.stream import GlobalStream, batch_digest
from lockstep.formats.tokenizer import ByteTokenizer, hf_tokenizers_available

SOURCES = {
    "prose": [b"the cat sat on the mat. " * (i + 1) for i in range(9)],
    "sums": [f"{i} + {i + 1} = {2 * i + 1}; ".encode() * (i % 4 + 1) for i in range(12)],
}


def make_folder(out: Path, shard_tokens: int = 96, sources: dict | None = None) -> Path:
    tok = ByteTokenizer()
    with DataWriter(out, tok, shard_tokens=shard_tokens) as w:
        for name, docs in (sources or SOURCES).items():
            sw = w.add_source(name, 1)
            for d in docs:
                sw.add_document(tok.encode(d))
        w.commit()
    return out


def all_documents(m: Manifest) -> list[bytes]:
    return [m.document_tokens(si, d).tobytes() for si, s in enumerate(m.sources) for d in range(s.documents)]


def stream_digest(m: Manifest) -> str:
    return batch_digest(GlobalStream(m, 5, 16).windows(0, 24))


def forged_copy(path: Path) -> bytes:
    """The same .npy file (same header, same length) with different, still well-formed contents."""
    arr = np.load(path, allow_pickle=False)
    if path.name.endswith(".offsets.npy"):
        fake = arr.copy()
        if len(fake) > 2 and fake[2] > fake[1] + 1:
            fake[1] += 1  # move a document boundary: still rising from 0 to the total
        return npy_bytes(fake)
    fake = arr.copy()
    a, b = ord("t"), ord("a")  # two byte values swapped, as in the measured attack
    fake[arr == a], fake[arr == b] = b, a
    return npy_bytes(fake)


def test_forged_files_differ_from_the_honest_ones(tmp_path):
    """The attack below is real: the forged bytes change the stream when they are used."""
    folder = make_folder(tmp_path / "data")
    honest = stream_digest(Manifest.load(folder))
    forged_folder = make_folder(tmp_path / "forged")
    for p in sorted(forged_folder.rglob("*.npy")):
        p.write_bytes(forged_copy(p))
    doc = json.loads((forged_folder / "manifest.json").read_text())
    for s in doc["sources"]:
        for sh in s["shards"]:
            for kind in ("tokens", "offsets"):
                sh[f"{kind}_sha256"] = hashlib.sha256((forged_folder / sh[f"{kind}_file"]).read_bytes()).hexdigest()
    (forged_folder / "manifest.json").write_text(json.dumps(doc))
    assert stream_digest(Manifest.load(forged_folder)) != honest


def test_shard_rewritten_in_place_after_the_load_never_reaches_the_stream(tmp_path):
    folder = make_folder(tmp_path / "data")
    m = Manifest.load(folder)
    honest_docs, honest_stream = all_documents(m), stream_digest(m)
    m = Manifest.load(folder)
    for p in sorted(folder.rglob("*.tokens.npy")):  # same inode, same size: what a shared mapping would show
        forged = forged_copy(p)
        with open(p, "r+b") as f:
            f.write(forged)
    assert all_documents(m) == honest_docs
    assert stream_digest(m) == honest_stream


def test_a_shard_read_again_after_it_left_memory_is_hashed_again(tmp_path):
    folder = make_folder(tmp_path / "data")
    m = Manifest.load(folder, resident_bytes=0)  # nothing stays: every use reads and hashes again
    honest = all_documents(m)
    assert all_documents(m) == honest and m.shard_reads > sum(len(s.shards) for s in m.sources)
    p = sorted(folder.rglob("*.tokens.npy"))[0]
    p.write_bytes(forged_copy(p))
    with pytest.raises(DataError, match="does not match"):
        all_documents(m)


class TwoFacedFile:
    """An open file whose storage answers read calls from ``switch_at`` on with ``forged`` bytes.

    Models a network or FUSE file system that gives the hash one answer and a second
    read another. ``fileno`` is the real file's, so ``fstat`` sees the true size.
    """

    def __init__(self, real, honest: bytes, forged: bytes, switch_at: int):
        assert len(honest) == len(forged)
        self.real, self.honest, self.forged, self.switch_at = real, honest, forged, switch_at
        self.pos = 0
        self.calls = 0

    def _source(self) -> bytes:
        self.calls += 1
        return self.forged if self.calls > self.switch_at else self.honest

    def read(self, n: int = -1) -> bytes:
        src = self._source()
        end = len(src) if n is None or n < 0 else min(len(src), self.pos + n)
        out, self.pos = src[self.pos:end], max(self.pos, end)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def readline(self, n: int = -1) -> bytes:
        src = self._source()
        end = src.find(b"\n", self.pos)
        end = len(src) if end < 0 else end + 1
        if n is not None and n >= 0:
            end = min(end, self.pos + n)
        out, self.pos = src[self.pos:end], end
        return out

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else (self.pos + pos if whence == 1 else len(self.honest) + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def fileno(self) -> int:
        return self.real.fileno()


@pytest.mark.parametrize("switch_at", range(0, 12))
def test_storage_that_answers_a_later_read_differently_cannot_change_the_stream(tmp_path, monkeypatch, switch_at):
    folder = make_folder(tmp_path / "data")
    clean = Manifest.load(folder)
    honest_docs, honest_stream = all_documents(clean), stream_digest(clean)
    forged = {p.relative_to(folder).as_posix(): forged_copy(p) for p in folder.rglob("*.npy")}
    assert any(forged[k] != (folder / k).read_bytes() for k in forged)
    real_open = manifest_module.open_regular

    @contextlib.contextmanager
    def two_faced_open(root, rel, what="file", max_bytes=None):
        with real_open(root, rel, what, max_bytes) as f:
            if rel in forged:
                yield TwoFacedFile(f, (Path(root) / rel).read_bytes(), forged[rel], switch_at)
            else:
                yield f

    monkeypatch.setattr(manifest_module, "open_regular", two_faced_open)
    try:
        m = Manifest.load(folder)
    except DataError as exc:
        assert "does not match" in str(exc) or "declares" in str(exc)
        return
    assert all_documents(m) == honest_docs
    assert stream_digest(m) == honest_stream


def test_honest_storage_loads_through_the_two_faced_wrapper(tmp_path, monkeypatch):
    """The wrapper itself is faithful when it never switches: the test above is not refusing everything."""
    folder = make_folder(tmp_path / "data")
    honest = stream_digest(Manifest.load(folder))
    real_open = manifest_module.open_regular

    @contextlib.contextmanager
    def faithful(root, rel, what="file", max_bytes=None):
        with real_open(root, rel, what, max_bytes) as f:
            data = (Path(root) / rel).read_bytes()
            yield TwoFacedFile(f, data, data, 0)

    monkeypatch.setattr(manifest_module, "open_regular", faithful)
    assert stream_digest(Manifest.load(folder)) == honest


def test_more_shards_than_open_files_allowed(tmp_path):
    """Item 8: the loader holds no file open after it read a shard (1,100 shards under a limit of 256 files)."""
    folder = make_folder(tmp_path / "data", shard_tokens=1,  # one document a shard
                         sources={"tiny": [f"d{i}".encode() for i in range(1100)]})
    n_files = len(list(folder.rglob("*.npy")))
    assert n_files > 1100
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from lockstep.formats.manifest import Manifest
        from lockstep.formats.stream import GlobalStream
        m = Manifest.load({str(folder)!r})
        GlobalStream(m, 1, 8).windows(0, 50)
        print("loaded", sum(len(s.shards) for s in m.sources))
    """)
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 256:
        pytest.skip("this machine's hard limit on open files is below 256")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(Path(manifest_module.__file__).parents[2])})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["loaded", str(n_files // 2)]


def test_a_sparse_shard_is_refused_before_it_is_hashed(tmp_path, monkeypatch):
    """Item 16: a shard whose size disagrees with the manifest is refused without hashing it."""
    folder = make_folder(tmp_path / "data")
    p = sorted(folder.rglob("*.tokens.npy"))[0]
    with open(p, "r+b") as f:
        f.truncate(8 << 30)  # 8 GiB, no disk used
    hashed = []
    real = manifest_module.hashlib.sha256

    def counting_sha256(*args):
        hashed.append(sum(len(a) for a in args))
        return real(*args)

    monkeypatch.setattr(manifest_module.hashlib, "sha256", counting_sha256)
    with pytest.raises(DataError, match="declares|holds"):
        Manifest.load(folder)
    assert max(hashed, default=0) < 1 << 20  # the manifest itself and small shards, never the 8 GiB


@pytest.mark.skipif(not hf_tokenizers_available(), reason="the optional 'tokenizers' package is not installed")
def test_tokenizer_is_built_from_the_bytes_that_were_hashed(tmp_path, monkeypatch):
    """The tokenizer named by a manifest is read once; the file is never opened again to build it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from lockstep.formats.tokenizer import tokenizer_from_identity

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the cat sat on the mat"] * 5, trainers.BpeTrainer(vocab_size=40, special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    data = (tmp_path / "tokenizer.json").read_bytes()
    identity = {"kind": "hf-tokenizers", "file": "tokenizer.json", "sha256": hashlib.sha256(data).hexdigest(),
                "vocab_size": tok.get_vocab_size() + 1, "eod_id": tok.get_vocab_size(), "eod_token": None}

    def second_read(*a, **k):
        raise AssertionError("the tokenizer file was read a second time, after it was hashed")

    monkeypatch.setattr(Tokenizer, "from_file", staticmethod(second_read))
    loaded = tokenizer_from_identity(identity, tmp_path)
    assert hashlib.sha256(loaded.data).hexdigest() == identity["sha256"]
    ids = loaded.encode("the cat")
    (tmp_path / "tokenizer.json").write_bytes(data.replace(b'"cat"', b'"dog"'))  # changed afterwards: no effect
    assert loaded.decode(ids).replace(" ", "") == "thecat"
