"""Data folder load and stream speed: ``Manifest.load`` (every shard read into memory, hashed, checked)
and 4,096 windows of 256 tokens from the global stream, medians of 7, on the embedded default corpus.

    python3 benchmarks/bench_data_load.py [--root TREE] [--corpus DIR]

``--root`` measures another source tree of this layout (``git archive REV | tar -x -C TREE``).
For a tree from before issue 25 (``lockstep.train.corpus``, ``.manifest``, ``.stream``), copy
this script into it with those three imports pointed there; RESULTS.md says which.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the source tree to import")
    ap.add_argument("--corpus", default="runs/bench-data-load-corpus", help="the default corpus (built if missing)")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    sys.path.insert(0, args.root)
    from lockstep.formats.corpus import default_corpus
    from lockstep.formats.manifest import Manifest
    from lockstep.formats.stream import GlobalStream
    folder = Path(args.corpus)
    if not (folder / "manifest.json").exists():
        default_corpus(folder)
    loads, streams = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        m = Manifest.load(folder)
        loads.append(time.perf_counter() - t)
        t = time.perf_counter()
        GlobalStream(m, 1, 256).windows(0, 4096)
        streams.append(time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.root}: Manifest.load median {statistics.median(loads) * 1000:.1f} ms, "
          f"4096 windows median {statistics.median(streams) * 1000:.1f} ms, peak RSS {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
