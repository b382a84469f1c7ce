"""State hashing on the device (``kernels/hashing.kc``) against the host, on one GPU-dialect backend.

    python benchmarks/bench_device_hashing.py [--backend opencl] [--mib 64] [--repeats 5] [--locals 32,8,1]

The state is float32 tensors shaped like a model's (``bench_hashing.make_state``: 64 MiB
tensors and 200 small gains) totalling --mib MiB, already on the device. Three ways to its
state root, medians of --repeats runs:

* device: ``device_state_root`` (leaves on the device, only digests downloaded), with a buffer
  per tensor (a launch each) and with the same tensors as views of one arena (one launch);
* download + host: ``to_numpy`` of every tensor, then ``spec.hashing.state_root`` (what a step
  that hashes on the host pays);
* host only: ``spec.hashing.state_root`` of host copies (hashlib on a thread pool; no transfer).

Also single tensors of 1, 4 and 16 MiB (the per-chunk parallelism: one work-item per 1 MiB
chunk), and the leaves kernel at other work-group sizes (``--locals``; the shipped size is
``kernels.hashing.LEAF_LOCAL``). Ratios are device time over host time in the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hashing import make_state  # noqa: E402

from lockstep.backends import get_backend  # noqa: E402
from lockstep.backends.kernels import hashing as kernel_hashing  # noqa: E402
from lockstep.backends.state_hash import device_state_root  # noqa: E402
from lockstep.spec import hashing  # noqa: E402
from record import median_seconds  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="opencl")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--locals", default="32,8,1", help="work-group sizes of the leaves kernel to compare")
    args = ap.parse_args()
    be = get_backend(args.backend)
    host = make_state(args.mib)
    dev = {k: be.asarray(v) for k, v in host.items()}
    want = hashing.state_root(host)
    assert device_state_root(be, dev) == want  # warm-up and the equality this measures under
    nbytes = sum(v.nbytes for v in host.values())
    gib = nbytes / 2**30
    flat = be.asarray(np.concatenate([v.reshape(-1) for v in host.values()]))
    arena, at = {}, 0
    for k, v in host.items():  # the same tensors as C-ordered views of one device buffer
        arena[k] = flat[at:at + v.size]
        at += v.size
    shaped = {k: v.reshape(-1) for k, v in host.items()}
    assert device_state_root(be, arena) == hashing.state_root(shaped)
    t_dev = median_seconds(lambda: device_state_root(be, dev), args.repeats)
    t_arena = median_seconds(lambda: device_state_root(be, arena), args.repeats)
    t_dl = median_seconds(lambda: hashing.state_root({k: be.to_numpy(v) for k, v in dev.items()}), args.repeats)
    t_host = median_seconds(lambda: hashing.state_root(host), args.repeats)
    print(f"backend: {be.description}")
    print(f"state: {len(host)} tensors, {nbytes / 2**20:.0f} MiB; host threads: {os.cpu_count()}; "
          f"leaves kernel: {kernel_hashing.LEAF_LOCAL} work-items per group; repeats {args.repeats}")
    print("| state root of the state on the device | median s | GiB/s | time / host only |")
    print("|---|---:|---:|---:|")
    for what, t in (("device leaves + host upper levels, a buffer per tensor", t_dev),
                    ("the same, the state in one arena (one launch)", t_arena), ("download + host state_root", t_dl),
                    ("host state_root of host copies", t_host)):
        print(f"| {what} | {t:.3f} | {gib / t:.3f} | {t / t_host:.2f} |")
    print()
    print("| one tensor | chunks | device s | host s | device / host |")
    print("|---|---:|---:|---:|---:|")
    rng = np.random.default_rng(1)  # benchmark data only
    for mib in (1, 4, 16):
        a = rng.standard_normal(mib << 18).astype(np.float32)
        d = be.asarray(a)
        td = median_seconds(lambda: be.capabilities.tensor_leaves("w", d), args.repeats)
        th = median_seconds(lambda: hashing.leaf_digests(memoryview(a).cast("B")), args.repeats)
        print(f"| {mib} MiB float32 | {mib} | {td:.4f} | {th:.4f} | {td / th:.2f} |")
    print()
    print("| leaves kernel work-group size | state leaves median s | GiB/s |")
    print("|---:|---:|---:|")
    shipped = kernel_hashing.LEAF_LOCAL
    try:
        for local in (int(s) for s in args.locals.split(",") if s):
            kernel_hashing.LEAF_LOCAL = local
            assert device_state_root(be, dev) == want
            t = median_seconds(lambda: device_state_root(be, dev), args.repeats)
            print(f"| {local}{' (shipped)' if local == shipped else ''} | {t:.3f} | {gib / t:.3f} |")
    finally:
        kernel_hashing.LEAF_LOCAL = shipped


if __name__ == "__main__":
    main()
