"""Ingest throughput (``lockstep data ingest``): MB of text per second per core, byte tokenizer and BPE.

Generates a corpus of ``--gb`` GB of JSON lines (words drawn from a fixed Zipf-like vocabulary,
documents of 200 B to 20 KB; a fixed seed), trains a BPE ``tokenizer.json`` offline with the
``tokenizers`` trainer on its first ``--bpe-train-mb`` MB, then ingests with each tokenizer and
worker count in a fresh process (``python -m lockstep data ingest``), timing the wall clock
and reading the peak resident memory of the parent and of its largest worker
(``getrusage``). The outputs are deleted after each run. ``--bpe-gb`` ingests only a prefix of
the corpus with BPE (it is several times slower). Each configuration runs ``--repeats`` times;
the median is reported. Prints a Markdown table and the projection for 400B tokens on one
machine of ``--project-cores`` cores from the per-core rate.

    python benchmarks/bench_ingest.py --gb 1 --bpe-gb 0.064 --workers 1 2 --dir /tmp/ingest-bench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

FILE_MB = 64  # the corpus is files of about this size


def generate(folder: Path, gb: float, seed: int = 38) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)  # benchmark data only: decides no published bit
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", dtype=np.uint8)
    words = []
    for n in range(20000):
        k = int(rng.integers(2, 11))
        words.append(bytes(letters[np.minimum(rng.geometric(0.18, k) - 1, 25)]).decode())
    words += ["ünïcode", "naïve", "∑", "λx", "x = 1;", "def f(x):", "{", "}", "1.5e3", "http://a.b/c"]
    p = 1.0 / np.arange(1, len(words) + 1) ** 1.05
    p /= p.sum()
    files, total, i = [], int(gb * 1e9), 0
    while total > 0:
        path = folder / f"part{i:04d}.jsonl"
        want = min(total, FILE_MB * 10**6)
        with open(path, "w", encoding="utf-8") as f:
            written = 0
            while written < want:
                ids = rng.choice(len(words), size=200_000, p=p)
                cuts = np.cumsum(rng.integers(30, 3000, size=200))
                for doc in np.split(ids, cuts[cuts < ids.size]):
                    line = json.dumps({"text": " ".join(words[w] for w in doc)}, ensure_ascii=False) + "\n"
                    f.write(line)
                    written += len(line.encode())
                    if written >= want:
                        break
        files.append(path)
        total -= written
        i += 1
    return files


def train_bpe(files: list[Path], out: Path, mb: float, vocab: int = 32000) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def sample():
        left = int(mb * 1e6)
        for path in files:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    yield json.loads(line)["text"]
                    left -= len(line)
                    if left <= 0:
                        return

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sample(), trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|eod|>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out))
    return out


RUNNER = r"""
import json, resource, sys, time
from lockstep.formats.ingest import ingest
a = json.loads(sys.argv[1])
t0 = time.perf_counter()
path = ingest(a["out"], [("c", a["inp"], 1)], tokenizer_file=a["tok"], eod_token=a["eod"], workers=a["workers"])
dt = time.perf_counter() - t0
rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # before anything reads the folder back
rss_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
m = json.loads(open(path).read())
print(json.dumps({"s": dt, "tokens": sum(s["tokens"] for s in m["sources"]),
                  "docs": sum(s["documents"] for s in m["sources"]), "rss_self_kb": rss_self, "rss_child_kb": rss_child}))
"""


BASELINE = r"""
import json, resource, sys, time
from pathlib import Path
a = json.loads(sys.argv[1])
if a["tok"]:
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(a["tok"])
    enc = lambda texts: t.encode_batch(texts, add_special_tokens=False)
else:
    enc = lambda texts: [x.encode("utf-8") for x in texts]
t0, n = time.perf_counter(), 0
for f in sorted(Path(a["inp"]).glob("*.jsonl")):
    with open(f, "rb") as fh:
        texts, size = [], 0
        for line in fh:
            texts.append(json.loads(line)["text"]); size += len(line); n += len(line)
            if size >= 4 << 20:
                enc(texts); texts, size = [], 0
        enc(texts)
print(json.dumps({"s": time.perf_counter() - t0, "mb": n / 1e6}))
"""


def baseline(inp: Path, tok: Path | None) -> float:
    """MB/s of reading the JSON lines and tokenizing them in one thread, nothing written: the floor."""
    arg = json.dumps({"inp": str(inp), "tok": str(tok) if tok else None})
    r = subprocess.run([sys.executable, "-c", BASELINE, arg], check=True, capture_output=True, text=True,
                       env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return d["mb"] / d["s"]


def run_one(inp: Path, out: Path, tok: Path | None, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    arg = json.dumps({"out": str(out), "inp": str(inp), "tok": str(tok) if tok else None,
                      "eod": "<|eod|>" if tok else None, "workers": workers})
    r = subprocess.run([sys.executable, "-c", RUNNER, arg], check=True, capture_output=True, text=True,
                       env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))  # one thread per process: per core
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--bpe-gb", type=float, default=0.064)
    ap.add_argument("--bpe-train-mb", type=float, default=20.0)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--project-cores", type=int, default=64)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/lockstep-ingest-bench"))
    args = ap.parse_args()
    corpus = args.dir / "corpus"
    files = sorted(corpus.glob("*.jsonl")) if corpus.exists() else []
    if sum(f.stat().st_size for f in files) < args.gb * 1e9 * 0.999:
        shutil.rmtree(corpus, ignore_errors=True)
        t0 = time.perf_counter()
        files = generate(corpus, args.gb)
        print(f"generated {len(files)} files in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    size = sum(f.stat().st_size for f in files)
    bpe_in = args.dir / "bpe-corpus"
    shutil.rmtree(bpe_in, ignore_errors=True)
    bpe_in.mkdir()
    bpe_size = 0
    for f in files:
        if bpe_size >= args.bpe_gb * 1e9 * 0.999:
            break
        os.link(f, bpe_in / f.name)
        bpe_size += f.stat().st_size
    tok = args.dir / "tokenizer.json"
    if not tok.exists():
        t0 = time.perf_counter()
        train_bpe(files, tok, args.bpe_train_mb)
        print(f"trained BPE in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    rows, floors = [], []
    for name, inp, mb, tfile in (("bytes", corpus, size / 1e6, None), ("BPE 32k", bpe_in, bpe_size / 1e6, tok)):
        for w in args.workers:
            runs = [run_one(inp, args.dir / "out", tfile, w) for _ in range(args.repeats)]
            s = statistics.median(r["s"] for r in runs)
            r = runs[0]
            rows.append((name, w, mb, s, r["tokens"], r["docs"], r["rss_self_kb"] / 1024, r["rss_child_kb"] / 1024))
            print(f"{name} workers={w}: {mb:.0f} MB in {s:.1f} s", file=sys.stderr)
        floors.append((name, baseline(inp, tfile)))
    print(f"corpus: {size / 1e6:.0f} MB of JSON lines in {len(files)} files; BPE on the first {bpe_size / 1e6:.0f} MB; "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    print("| tokenizer | workers | input MB | wall s | MB/s | MB/s per worker | tokens | tokens/s | bytes/token "
          "| peak RSS parent MiB | peak RSS largest worker MiB | 400B tokens on "
          f"{args.project_cores} cores |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, w, mb, s, tokens, docs, rs, rc in rows:
        tps = tokens / s
        hours = 400e9 / (tps / w * args.project_cores) / 3600
        print(f"| {name} | {w} | {mb:,.0f} | {s:.1f} | {mb / s:.1f} | {mb / s / w:.1f} | {tokens:,} | {tps:,.0f} | "
              f"{mb * 1e6 / tokens:.2f} | {rs:.0f} | {rc:.0f} | {hours:,.1f} h |")
    print()
    for name, mbs in floors:
        print(f"- {name}: reading the JSON lines and tokenizing them in one thread with nothing written "
              f"(json.loads + the tokenizer alone): {mbs:.1f} MB/s")


if __name__ == "__main__":
    main()
