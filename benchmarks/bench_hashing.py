"""Hashing throughput: state_root (Merkle, threaded) against one raw SHA-256 over the same bytes.

    python benchmarks/bench_hashing.py [--mib 384] [--repeats 5]

The state is a dict of float32 tensors shaped like a model's (a few big matrices and
many small vectors) totalling --mib MiB. Reports medians of --repeats runs and the ratio
(state_root time / raw hashlib time): below 1 means the Merkle tree's parallel leaves
beat a single sequential SHA-256 stream.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

import numpy as np

from lockstep.spec import hashing


def make_state(mib: int) -> dict[str, np.ndarray]:
    total = mib * (1 << 20) // 4
    state, left, i = {}, total, 0
    rng = np.random.default_rng(0)  # benchmark data only
    while left > 0:
        n = min(left, 16 << 20)  # 64 MiB tensors
        state[f"w{i:03d}"] = rng.standard_normal(n, dtype=np.float32)
        left -= n
        i += 1
    for j in range(200):
        state[f"gain{j:03d}"] = np.ones(2048, np.float32)
    return state


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=384)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    state = make_state(args.mib)
    nbytes = sum(v.nbytes for v in state.values())
    flat = np.concatenate([v.reshape(-1) for v in state.values()])
    t_root, t_raw = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        hashing.state_root(state)
        t_root.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hashlib.sha256(memoryview(flat)).digest()
        t_raw.append(time.perf_counter() - t0)
    mr, mw = statistics.median(t_root), statistics.median(t_raw)
    gib = nbytes / 2**30
    print(f"state: {len(state)} tensors, {nbytes / 2**20:.0f} MiB; threads: {os.cpu_count()}; chunk {hashing.CHUNK_BYTES >> 10} KiB")
    print(f"| what | median s | GiB/s |")
    print(f"|---|---|---|")
    print(f"| state_root (Merkle, threaded) | {mr:.3f} | {gib / mr:.2f} |")
    print(f"| hashlib.sha256, one buffer | {mw:.3f} | {gib / mw:.2f} |")
    print(f"ratio state_root / raw = {mr / mw:.2f}")


if __name__ == "__main__":
    main()
