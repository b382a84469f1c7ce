"""Ingest of the formats corpora ship in, at scale, and its refusals (``lockstep.formats.documents``,
``lockstep.formats.ingest``).

* one corpus written as .txt files, .jsonl, .jsonl.gz, .jsonl.zst (two frames), .parquet (several
  row groups) and a folder mixing them ingests to the same bytes, shards and manifest, on one
  worker and on two;
* an ingest interrupted after a shard is written (the ``on_shard`` event) and continued with
  ``resume=True`` gives the bytes of one never interrupted; a resume of another plan is refused
  and keeps the partial folder;
* bad input is one line naming the file and nothing is left behind: a Parquet file without the
  text column, a truncated .zst or .gz, invalid UTF-8, a lone surrogate, an empty document, a
  file that changes while it is read or after it was listed;
* the ``open-1b`` data recipe builds in one command and its manifest records it; an edited
  weight is refused on load;
* the tokenizing window reads at most ``window`` batches ahead (memory bounded by the batches
  in flight, not the corpus).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from lockstep.formats import documents
from lockstep.formats.data_recipes import OPEN_1B
from lockstep.formats.ingest import STATE_NAME, _IngestProgress, _token_batches, ingest
from lockstep.formats.manifest import DataError, Manifest, recipe_weight

pa = pytest.importorskip("pyarrow", reason="Parquet ingest needs pyarrow (pip install 'lockstep[data]')")
pq = pytest.importorskip("pyarrow.parquet", reason="Parquet ingest needs pyarrow (pip install 'lockstep[data]')")
zstandard = pytest.importorskip("zstandard", reason=".jsonl.zst ingest needs zstandard (pip install 'lockstep[data]')")

DOCS = [f"doc {i}: " + "héllo wörld ∑ " * (i % 7 + 1) + ("x = 1\n" * (i % 3)) for i in range(60)]


def _jsonl(docs) -> bytes:
    return "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)).encode()


def _zst(data: bytes) -> bytes:
    c = zstandard.ZstdCompressor()
    half = len(data) // 2
    cut = data.rfind(b"\n", 0, half) + 1
    return c.compress(data[:cut]) + c.compress(data[cut:])  # two frames, split at a line


def _parquet(path: Path, docs, column="text") -> None:
    table = pa.table({"id": list(range(len(docs))), column: docs})
    pq.write_table(table, path, row_group_size=9)


def _write(folder: Path, fmt: str, docs) -> None:
    folder.mkdir(parents=True)
    if fmt == "txt":
        for i, d in enumerate(docs):
            (folder / f"d{i:04d}.txt").write_text(d, encoding="utf-8")
    elif fmt == "jsonl":
        (folder / "c.jsonl").write_bytes(_jsonl(docs))
    elif fmt == "jsonl.gz":
        (folder / "c.jsonl.gz").write_bytes(gzip.compress(_jsonl(docs)))
    elif fmt == "jsonl.zst":
        (folder / "c.jsonl.zst").write_bytes(_zst(_jsonl(docs)))
    elif fmt == "parquet":
        _parquet(folder / "c.parquet", docs)
    else:  # mixed: five parts, one per format, in the order their names sort
        parts = np.array_split(np.arange(len(docs)), 5)
        take = [[docs[i] for i in p] for p in parts]
        (folder / "p0.jsonl").write_bytes(_jsonl(take[0]))
        (folder / "p1.JSONL.GZ").write_bytes(gzip.compress(_jsonl(take[1])))
        (folder / "p2.jsonl.zst").write_bytes(_zst(_jsonl(take[2])))
        _parquet(folder / "p3.parquet", take[3])
        (folder / "p4").mkdir()
        for i, d in enumerate(take[4]):
            (folder / "p4" / f"{i:03d}.txt").write_text(d, encoding="utf-8")


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(documents, "BATCH_BYTES", 300)  # many batches per file (read in this process)
    monkeypatch.setattr(documents, "BATCH_ROWS", 7)


def test_every_format_ingests_to_the_same_bytes(tmp_path, small_batches):
    trees = {}
    for fmt in ("jsonl", "txt", "jsonl.gz", "jsonl.zst", "parquet", "mixed"):
        _write(tmp_path / "in" / fmt, fmt, DOCS)
        ingest(tmp_path / fmt, [("web", tmp_path / "in" / fmt, 1)], shard_tokens=700, workers=1,
               validation_documents=2)
        trees[fmt] = _tree(tmp_path / fmt)
    ingest(tmp_path / "two", [("web", tmp_path / "in" / "mixed", 1)], shard_tokens=700, workers=2,
           validation_documents=2)
    trees["mixed, two workers"] = _tree(tmp_path / "two")
    first = trees["jsonl"]
    assert len([k for k in first if k.endswith(".tokens.npy")]) > 3
    for fmt, tree in trees.items():
        assert tree == first, fmt
    m = Manifest.load(tmp_path / "jsonl")
    assert [m.document_tokens(0, i).tobytes() for i in range(3)] == [d.encode() for d in DOCS[:3]]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial folder left


class _Stop(BaseException):
    """Stands for Ctrl-C or a killed process at an observed event."""


def _stop_after(n_shards: int, source: str | None = None):
    def hook(name, shards):
        if shards >= n_shards and (source is None or name == source):
            raise _Stop
    return hook


@pytest.mark.parametrize("workers, source, n", [(1, "a", 1), (2, "a", 3), (1, "b", 2)])
def test_resume_gives_the_same_bytes(tmp_path, small_batches, workers, source, n):
    _write(tmp_path / "in" / "a", "mixed", DOCS)
    _write(tmp_path / "in" / "b", "jsonl.zst", DOCS[::-1])
    inputs = [("a", tmp_path / "in" / "a", 2), ("b", tmp_path / "in" / "b", 1)]
    ingest(tmp_path / "whole", inputs, shard_tokens=500, workers=1)
    with pytest.raises(_Stop):
        ingest(tmp_path / "out", inputs, shard_tokens=500, workers=workers, on_shard=_stop_after(n, source))
    partial = tmp_path / ".out.partial"
    assert not (tmp_path / "out").exists() and (partial / STATE_NAME).is_file()
    (partial / "a" / ".00099.tokens.npy.tmp-cut").write_bytes(b"half a write")  # a write cut short
    with pytest.raises(DataError, match="run the same command with resume to continue it") as refused:
        ingest(tmp_path / "out", inputs, shard_tokens=500, workers=1)
    assert refused.value.settings == ("resume",)  # the command line words it as --resume
    with pytest.raises(DataError, match="other inputs or options"):
        ingest(tmp_path / "out", inputs, shard_tokens=501, workers=1, resume=True)
    assert (partial / STATE_NAME).is_file()  # a refused resume keeps the work so far
    seen = []
    ingest(tmp_path / "out", inputs, shard_tokens=500, workers=workers, resume=True,
           on_shard=lambda name, k: seen.append((name, k)))
    assert seen[0] != ("a", 1)  # it continued, not started again
    assert _tree(tmp_path / "out") == _tree(tmp_path / "whole")
    assert not partial.exists()


def test_resume_refuses_an_altered_shard(tmp_path, small_batches):
    _write(tmp_path / "in", "jsonl", DOCS)
    inputs = [("a", tmp_path / "in", 1)]
    with pytest.raises(_Stop):
        ingest(tmp_path / "out", inputs, shard_tokens=500, workers=1, on_shard=_stop_after(2))
    shard = tmp_path / ".out.partial" / "a" / "00000.tokens.npy"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")
    with pytest.raises(DataError, match="altered"):
        ingest(tmp_path / "out", inputs, shard_tokens=500, workers=1, resume=True)


def _refused(tmp_path, inputs, match, **kw):
    with pytest.raises(DataError, match=match) as e:
        ingest(tmp_path / "out", inputs, workers=kw.pop("workers", 1), **kw)
    msg = str(e.value)
    assert "\n" not in msg
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.partial").exists()
    return msg


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    _parquet(d / "nocol.parquet", DOCS, column="body")
    assert "no column 'text'" in _refused(tmp_path, [("a", d / "nocol.parquet", 1)], "nocol.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), d / "ints.parquet")
    _refused(tmp_path, [("a", d / "ints.parquet", 1)], "not text")
    _parquet(d / "nulls.parquet", ["a", None])
    _refused(tmp_path, [("a", d / "nulls.parquet", 1)], "row 1: column 'text' is null")
    (d / "cut.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl(DOCS))[:-9])
    _refused(tmp_path, [("a", d / "cut.jsonl.zst", 1)], "cut.jsonl.zst: the Zstandard stream ends inside a frame")
    (d / "junk.jsonl.zst").write_bytes(b"not zstd at all")
    _refused(tmp_path, [("a", d / "junk.jsonl.zst", 1)], "not a valid Zstandard stream")
    (d / "cut.jsonl.gz").write_bytes(gzip.compress(_jsonl(DOCS))[:-12])
    _refused(tmp_path, [("a", d / "cut.jsonl.gz", 1)], "cut.jsonl.gz: the gzip stream ends early")
    (d / "latin1.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    _refused(tmp_path, [("a", d / "latin1.jsonl", 1)], r"latin1.jsonl:2: not UTF-8 \(byte 0xE9")
    (d / "latin1.txt").write_bytes(b"caf\xe9")
    _refused(tmp_path, [("a", d / "latin1.txt", 1)], "latin1.txt: not UTF-8 text")
    (d / "surrogate.jsonl").write_text('{"text": "a\\ud800b"}\n')
    _refused(tmp_path, [("a", d / "surrogate.jsonl", 1)], "surrogate.jsonl:1: the text holds a lone surrogate")
    (d / "empty.jsonl").write_text('{"text": "x"}\n{"text": ""}\n')
    _refused(tmp_path, [("a", d / "empty.jsonl", 1)], "empty.jsonl:2: an empty document.*pass skip_empty")
    _parquet(d / "empty.parquet", ["x", "y", ""])
    _refused(tmp_path, [("a", d / "empty.parquet", 1)], "empty.parquet: row 2: an empty document")
    # the same through a worker process: the worker's error is the one line
    _refused(tmp_path, [("a", d / "empty.jsonl", 1)], "empty.jsonl:2: an empty document", workers=2)
    path = ingest(tmp_path / "skipped", [("a", d / "empty.jsonl", 1)], workers=1, skip_empty=True)
    assert Manifest.load(path).sources[0].documents == 1


def test_a_file_that_changes_is_refused(tmp_path, small_batches):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.jsonl").write_bytes(_jsonl(DOCS))
    (d / "b.jsonl").write_bytes(_jsonl(DOCS))

    def grow(path):
        def hook(name, shards):
            with open(path, "ab") as f:
                f.write(_jsonl(["more"]))
        return hook

    # a.jsonl grows while it is read (after its first shard): refused when its reading ends
    _refused(tmp_path, [("s", d, 1)], "a.jsonl: changed while it was read", shard_tokens=300,
             on_shard=grow(d / "a.jsonl"))
    (d / "a.jsonl").write_bytes(_jsonl(DOCS))
    # b.jsonl changes after it was listed, before it is opened
    _refused(tmp_path, [("s", d, 1)], "b.jsonl: changed since it was listed", shard_tokens=300,
             on_shard=grow(d / "b.jsonl"))


def _recipe_copies(root: Path) -> list[tuple[str, Path, int]]:
    inputs = []
    for k, s in enumerate(OPEN_1B.sources):
        docs = [f"{s.name} {i} " + "abc " * (k * 5 + i % 4 + 1) for i in range(12)]
        folder = root / s.name
        folder.mkdir(parents=True)
        if s.text_field == "text":
            (folder / "x.jsonl.zst").write_bytes(_zst(_jsonl(docs)))
        else:
            _parquet(folder / "x.parquet", docs, column=s.text_field)
        inputs.append((s.name, folder, 1))
    return inputs


def test_the_open_1b_recipe_builds_and_is_recorded(tmp_path, capsys):
    from lockstep.cli import main

    assert main(["data", "recipe", "open-1b"]) == 0
    shown = capsys.readouterr().out
    assert all(f"\n  {s.name}=" in shown for s in OPEN_1B.sources) and "60.0% of the tokens" in shown

    inputs = _recipe_copies(tmp_path / "copies")
    args = ["data", "ingest", "--out", str(tmp_path / "mix"), "--recipe", "open-1b", "--workers", "1"]
    assert main(args + [f"{n}={p}" for n, p, _ in inputs[::-1]]) == 0
    raw = json.loads((tmp_path / "mix" / "manifest.json").read_text())
    assert raw["version"] == 3 and raw["recipe"] == OPEN_1B.record()
    m = Manifest.load(tmp_path / "mix")
    assert [s.name for s in m.sources] == [s.name for s in OPEN_1B.sources]
    for s, r in zip(raw["sources"], OPEN_1B.sources):
        assert s["weight"] == recipe_weight(r.share, s["documents"], s["tokens"])
    # expected token shares from the weights (documents x mean tokens + separator) stand as the recipe's
    mass = [s["weight"] * (s["tokens"] + s["documents"]) / s["documents"] for s in raw["sources"]]
    for x, r in zip(mass, OPEN_1B.sources):
        assert abs(x / sum(mass) - r.share / 550) < 1e-4  # one unit in weights of about 10**5
    raw["sources"][0]["weight"] += 1
    (tmp_path / "mix" / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(DataError, match="not the recipe's"):
        Manifest.load(tmp_path / "mix")
    assert main(args[:3] + [str(tmp_path / "m2")] + args[4:] + [f"{n}={p}" for n, p, _ in inputs[:3]]) == 1
    assert main(args[:3] + [str(tmp_path / "m3")] + args[4:] + ["--weight", "dclm=2"]
                + [f"{n}={p}" for n, p, _ in inputs]) == 1


def test_the_window_reads_a_bounded_number_of_batches_ahead():
    from multiprocessing.pool import ThreadPool

    from lockstep.formats import ingest as ing
    from lockstep.formats.tokenizer import ByteTokenizer

    pulled = []

    def raw():
        for i in range(20):
            pulled.append(i)
            yield documents.RawBatch(0, "w", "lines", i, [json.dumps({"text": f"d{i}"}).encode()], "text", i, 3)

    ing._WORKER.update(tok=ByteTokenizer(), skip_empty=False)
    with ThreadPool(2) as pool:
        out = []
        for tb in _token_batches(raw(), None, False, pool, window=4):
            out.append(tb.flat.tobytes())
            assert len(pulled) <= len(out) + 4
    assert out == [f"d{i}".encode() for i in range(20)]


def test_progress_line_has_documents_tokens_rate_and_estimate():
    lines, now = [], [0.0]
    p = _IngestProgress(lines.append, total_bytes=1000, done_bytes=0, clock=lambda: now[0])
    p.text_bytes = 4_000_000
    now[0] = 2.0
    p("web", "1/4", 12345, 4_500_000, 250)
    assert lines == ["ingest: web: 1/4 files, 12.3K documents, 4.5M tokens, 2.0 MB/s of text, "
                     "25% of the input read, about 6s left"]
    p("web", "1/4", 1, 1, 300)  # within the interval: nothing
    assert len(lines) == 1
