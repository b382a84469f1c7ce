"""Time of conformance level 3 (the exhaustive unary sweeps) per op and backend, projected from a slice.

Usage::

    NUMBA_NUM_THREADS=1 python benchmarks/bench_sweep.py --backend numba
    NUMBA_NUM_THREADS=2 python benchmarks/bench_sweep.py --backend numba
    python benchmarks/bench_sweep.py --backend opencl --bits 22
    python benchmarks/bench_sweep.py --backend spec --bits 20 --repeats 1

For each unary op it sweeps the patterns of one slice of ``2**bits`` patterns (the
first of block ``--block``, default 0x3F: inputs 0.5 .. 2) exactly as
``lockstep conformance --level 3`` does (inputs through ``asarray``, outputs back
with ``to_numpy``, SHA-256 over the bytes) and reports the median of ``--repeats``
runs, the elements per second and the projected time of all 2**32 patterns
(``2**(32 - bits)`` slices). The first call of each op runs once untimed (compilation).
A last row times the harness alone (making the patterns and SHA-256, no op): the floor
of every backend on this host, which bounds a GPU's sweep apart from its transfers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from lockstep.backends import get_backend
from lockstep.conformance import sweep


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="numba")
    p.add_argument("--bits", type=int, default=24, help="slice of 2**bits patterns (default 24: one block)")
    p.add_argument("--block", type=lambda s: int(s, 0), default=0x3F, help="the 2**24 block the slice starts (default 0x3F)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ops", default="")
    a = p.parse_args(argv)
    if not 12 <= a.bits <= sweep.BLOCK_BITS:
        print(f"bench_sweep: --bits must be in 12..{sweep.BLOCK_BITS}", file=sys.stderr)
        return 1
    backend = get_backend(a.backend)
    ops = a.ops.split(",") if a.ops else sweep.unary_ops()
    # the slice is block (block << (24 - bits)) of 2**bits patterns
    b = a.block << (sweep.BLOCK_BITS - a.bits)
    print(f"backend {backend.name}: {backend.description}; slice 2**{a.bits} patterns from {b << a.bits:#010x}; "
          f"median of {a.repeats}")
    print(f"{'op':8s} {'slice s':>9s} {'M/s':>8s} {'all 2**32':>12s}")
    total = 0.0
    for op in ops:
        apply = sweep.backend_apply(backend, op)
        sweep.block_digest(apply, op, 0, 12)  # compile / warm up
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            sweep.block_digest(apply, op, b, a.bits)
            times.append(time.perf_counter() - t0)
        s = statistics.median(times)
        full = s * (1 << (32 - a.bits))
        total += full
        print(f"{op:8s} {s:9.3f} {(1 << a.bits) / s / 1e6:8.2f} {full:10.0f} s", flush=True)
    print(f"{'all':8s} {'':9s} {'':8s} {total:10.0f} s ({total / 3600:.2f} h)")
    # The floor of any backend on this host: making the patterns and hashing 4 bytes a pattern, no op at all
    # (what a GPU's level 3 is bounded by, apart from the transfers).
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        sweep.block_digest(lambda x: x, "identity", b, a.bits)
        times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    print(f"{'harness':8s} {s:9.3f} {(1 << a.bits) / s / 1e6:8.2f} {s * (1 << (32 - a.bits)):10.0f} s "
          f"(patterns + SHA-256 only, per op)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
