"""Every GEMM path of the numba backend against this machine's float32 sgemm, on the same shapes, in one run.

    NUMBA_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 python benchmarks/bench_gemm_ceiling.py [--rounds 5] [--calls 3]

Per shape (the ``small`` model's linears at 8 x 256 tokens, and one open-1b-sized GEMM):

* ``sgemm``: NumPy's float32 matmul (BLAS, any order, FMA): the ceiling;
* ``int8 <path>``: ``int8gemm.matmul`` with each implementation this CPU offers (``vnni``,
  ``avx2``, ``blas``), int8 operands in [-127, 127], int32 results;
* ``fixed-order f32``: ``numba_cpu.reduce.matmul``, the spec's ascending-k order.

Rounds alternate the paths (the order rotates each round), so a change in machine load falls
on all of them; each round takes the median of ``--calls`` calls after a warm-up call, and the
table gives the median over rounds in G(FL)OP/s (2 M K N per GEMM) and the ratio to sgemm of the
same round. Before timing, every int8 path's result is compared byte for byte with the BLAS
path's, and the fixed-order matmul's with the spec's on a slice of rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import markdown_table, median_seconds  # noqa: E402

SHAPES = [(2048, 256, 768), (2048, 256, 688), (2048, 688, 256), (2048, 256, 256), (512, 2048, 2048)]


def main() -> int:
    from lockstep import spec
    from lockstep.backends.numba_cpu import int8gemm, reduce

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in SHAPES:
        a8 = rng.integers(-127, 128, (m, k)).astype(np.int8)
        b8 = rng.integers(-127, 128, (k, n)).astype(np.int8)
        af = rng.standard_normal((m, k), dtype=np.float32)
        bf = rng.standard_normal((k, n), dtype=np.float32) * np.float32(0.05)
        ref = int8gemm.matmul(a8, b8, impl="blas").tobytes()
        for impl in int8gemm.available():
            assert int8gemm.matmul(a8, b8, impl=impl).tobytes() == ref, impl
        assert reduce.matmul(af[:16], bf).tobytes() == spec.matmul(af[:16], bf).tobytes()
        paths = {"sgemm": lambda: af @ bf, "fixed-order f32": lambda: reduce.matmul(af, bf)}
        for impl in int8gemm.available():
            paths[f"int8 {impl}"] = lambda impl=impl: int8gemm.matmul(a8, b8, impl=impl)
        names = list(paths)
        rates = {p: [] for p in names}
        ratios = {p: [] for p in names}
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            got = {p: 2 * m * k * n / median_seconds(paths[p], args.calls, warm_up=True) / 1e9 for p in order}
            for p in names:
                rates[p].append(got[p])
                ratios[p].append(got[p] / got["sgemm"])
        for p in names:
            rows.append([f"{m} x {k} x {n}", p, f"{statistics.median(rates[p]):.1f}",
                         f"{statistics.median(ratios[p]):.2f}x"])
        print(f"{m} x {k} x {n}: " + ", ".join(f"{p} {statistics.median(rates[p]):.1f}" for p in names), flush=True)
    print()
    print(markdown_table([("M x K x N", "left"), ("path", "left"), ("G(FL)OP/s", "right"), ("vs sgemm (same round)", "right")],
                         rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
