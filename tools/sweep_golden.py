"""Write the spec's level-3 sweep digests: every float32 pattern through every unary op.

Usage::

    python tools/sweep_golden.py                       # every unary op, all 256 blocks, 2 workers
    nice -n 10 python tools/sweep_golden.py --workers 2 --ops neg,abs,sqrt,exp
    python tools/sweep_golden.py --throughput          # spec elements/s per op on one 2**24 block

It writes ``lockstep/conformance/golden/spec_v<SPEC_VERSION>_sweeps.txt`` (format and
digest in ``lockstep/conformance/sweep.py``), rewriting it atomically after every
finished block, so it is resumable: run it again and it computes only the blocks the
file lacks. Progress and an estimate of the time left go to stderr. Only the spec
decides these digests; ``lockstep conformance --level 3`` compares backends with them.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import sys
import time
from pathlib import Path

from lockstep.cli.common import said
from lockstep.conformance import sweep
from lockstep.fsio import atomic_write_text


def _block(task: tuple[str, int]) -> tuple[str, int, str, float]:
    op, b = task
    t0 = time.perf_counter()
    return op, b, sweep.block_digest(sweep.spec_apply(op), op, b), time.perf_counter() - t0


def _left(tasks: list[tuple[str, int]], seconds: dict[str, list[float]], workers: int) -> str:
    """The time left: each op's mean block time so far; an op not begun counts as the slowest seen ("at least")."""
    slowest = max(sum(v) / len(v) for v in seconds.values())
    unseen = any(op not in seconds for op, _ in tasks)
    left = sum(sum(seconds[op]) / len(seconds[op]) if op in seconds else slowest for op, _ in tasks) / workers
    return f"{'at least ' if unseen else ''}about {left / 60:.1f} min left"


def _throughput(ops: list[str], block: int) -> int:
    """Time one block per op on the spec (one process) and project the full sweep."""
    total = 0.0
    for op in ops:
        _, _, _, s = _block((op, block))
        total += s * sweep.BLOCKS
        print(f"{op:8s} block {block}: {s:7.2f} s, {(1 << sweep.BLOCK_BITS) / s / 1e6:6.2f} M/s; "
              f"all 2**32 on one core: {s * sweep.BLOCKS / 60:7.1f} min", flush=True)
    print(f"all {len(ops)} ops on one core: {total / 3600:.2f} h", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="", help="comma-separated unary ops (default: all, cheapest first)")
    p.add_argument("--workers", type=int, default=2, help="processes (default 2; 1: this process only)")
    p.add_argument("--out", default="", help="output file (default: the committed golden file)")
    p.add_argument("--blocks", default="", help="block range A:B (default: all 256)")
    p.add_argument("--throughput", action="store_true", help="time one block per op on the spec and stop")
    p.add_argument("--block", type=lambda s: int(s, 0), default=0x3F,
                   help="the block --throughput times (default 0x3F: inputs 0.5 .. 2)")
    a = p.parse_args(argv)
    known = sweep.unary_ops()
    # Cheapest first: the exact ops take a minute or two, the transcendentals about an hour each per core.
    cheap_first = sorted(known, key=lambda op: (op not in ("neg", "abs", "sqrt"), known.index(op)))
    ops = a.ops.split(",") if a.ops else cheap_first
    bad = [op for op in ops if op not in known]
    if bad:
        print(f"sweep_golden: not unary op(s) {', '.join(bad)}; known: {', '.join(known)}", file=sys.stderr)
        return 1
    if a.throughput:
        return _throughput(ops, a.block)
    try:
        blocks = sweep.parse_block_range(a.blocks)
    except ValueError as e:
        print(f"sweep_golden: {said(e)}", file=sys.stderr)
        return 1
    out = Path(a.out) if a.out else sweep.golden_path()
    table = sweep.load_golden(out)
    tasks = [(op, b) for op in ops for b in blocks if b not in table.get(op, {})]
    print(f"sweep_golden: {len(tasks)} blocks to compute ({sum(len(v) for v in table.values())} already in {out})",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    seconds: dict[str, list[float]] = {}
    workers = max(1, a.workers)
    # One worker computes in this process (no pool); more spread the blocks over processes.
    with (mp.Pool(workers) if workers > 1 else contextlib.nullcontext()) as pool:
        for i, (op, b, digest, s) in enumerate((pool.imap if pool else map)(_block, tasks), 1):
            table.setdefault(op, {})[b] = digest
            atomic_write_text(out, sweep.format_golden(table))
            seconds.setdefault(op, []).append(s)
            print(f"[{i}/{len(tasks)}] {op} block {b}: {s:.1f} s; {(time.perf_counter() - t0) / 60:.1f} min so far, "
                  f"{_left(tasks[i:], seconds, workers)}", file=sys.stderr, flush=True)
    print(f"sweep_golden: done, {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
