"""Sweep all 2**32 float32 inputs through the GPU kernels' exp and log (the host build of ls_fp.h).

Usage::

    python tools/sweep_header.py                         # exp and log, digests only (minutes)
    python tools/sweep_header.py --against spec --workers 2   # and compare every output with the spec (hours)
    python tools/sweep_header.py --func log --against numba   # compare with the Numba backend (fast)
    python tools/sweep_header.py --first 0x3F800000 --count 0x800000 --against spec   # one binade
    python tools/sweep_header.py --model ftz_before --fixup  # as on an Apple GPU: must print the same digests

For each function it prints the SHA-256 of the outputs of every input bit pattern in
``[first, first + count)``, in input order, as little-endian uint32 (inputs are read as every op
reads them: subnormals as zeros of their sign, NaNs canonical). A sweep of the same header on
a GPU (the CUDA or Metal backend's device check) must print the same digest; the digest of the
full range is the header's fingerprint. With ``--against`` every output is also compared with
the spec (or the Numba backend, itself proven equal to the spec), and mismatches are counted and
the first ones printed in hex. Exit status 1 on any mismatch.

``--model ftz_before`` / ``ftz_after`` sweeps the header built over a model of hardware that
flushes subnormals itself (tininess before / after rounding), and ``--fixup`` adds the Metal
backend's tiny-result fix-up (``prelude_host.h``): with it, the digests must be the IEEE
build's, which is how the Metal path's exp and log are checked on every input without a Mac.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's lockstep, not an installed one

CHUNK = 1 << 22
FULL = 1 << 32


def _reference(against: str, func: str):
    if against == "spec":
        from lockstep.spec import transcendental as T

        return getattr(T, func)
    from lockstep.backends import get_backend

    be = get_backend(against)
    return lambda x: np.asarray(be.to_numpy(getattr(be, func)(be.asarray(x))))


def compare_chunk(args) -> dict:
    """Header vs reference on patterns [first, first + count): mismatch count and the first few."""
    func, against, first, count, model, fixup = args
    from lockstep.backends.kernels import host

    h = host.load(model, fixup=fixup)
    got = (h.exp_range if func == "exp" else h.log_range)(first, count).view(np.uint32)
    x = np.arange(first, first + count, dtype=np.uint64).astype(np.uint32).view(np.float32)
    want = np.ascontiguousarray(_reference(against, func)(x), dtype=np.float32).view(np.uint32)
    bad = np.nonzero(got != want)[0]
    return {"first": first, "mismatches": int(bad.size),
            "examples": [(int(first + i), int(want[i]), int(got[i])) for i in bad[:5]]}


def sweep(func: str, first: int, count: int, against: str | None, workers: int, model: str | None = None,
          fixup: bool = False) -> dict:
    from lockstep.backends.kernels import host

    h = host.load(model, fixup=fixup)
    ranges = [(s, min(CHUNK, first + count - s)) for s in range(first, first + count, CHUNK)]
    digest = hashlib.sha256()
    mismatches, examples = 0, []
    t0 = time.time()
    pool = mp.Pool(workers) if against and workers > 1 else None
    jobs = (pool.imap(compare_chunk, [(func, against, s, c, model, fixup) for s, c in ranges]) if pool
            else (compare_chunk((func, against, s, c, model, fixup)) for s, c in ranges) if against else None)
    for i, (s, c) in enumerate(ranges):
        out = (h.exp_range if func == "exp" else h.log_range)(s, c)
        digest.update(out.view(np.uint32).astype("<u4").tobytes())
        if jobs is not None:
            r = next(jobs)
            mismatches += r["mismatches"]
            examples += r["examples"][: max(0, 10 - len(examples))]
        done = i + 1
        if done % 16 == 0 or done == len(ranges):
            el = time.time() - t0
            print(f"  {func}: {done}/{len(ranges)} chunks, {el:.0f}s, eta {el / done * (len(ranges) - done):.0f}s",
                  file=sys.stderr, flush=True)
    if pool:
        pool.close()
    return {"func": func, "first": first, "count": count, "model": model or "ieee", "fixup": fixup,
            "sha256": digest.hexdigest(), "against": against,
            "mismatches": mismatches if against else None,
            "examples": [f"x=0x{x:08X}: reference 0x{w:08X}, header 0x{g:08X}" for x, w, g in examples],
            "seconds": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--func", choices=("exp", "log", "both"), default="both")
    p.add_argument("--first", type=lambda s: int(s, 0), default=0)
    p.add_argument("--count", type=lambda s: int(s, 0), default=FULL)
    p.add_argument("--against", choices=("spec", "numba"), default=None, help="also compare every output")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--model", choices=("ftz_before", "ftz_after"), default=None,
                   help="build the header over a model of hardware that flushes subnormals (default: IEEE)")
    p.add_argument("--fixup", action="store_true", help="with the Metal backend's tiny-result fix-up")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    if not 0 <= a.first < FULL or not 0 < a.count <= FULL - a.first:
        print("sweep_header: --first/--count must lie within [0, 2**32)", file=sys.stderr)
        return 1
    results = []
    for func in (("exp", "log") if a.func == "both" else (a.func,)):
        r = sweep(func, a.first, a.count, a.against, a.workers, a.model, a.fixup)
        results.append(r)
        extra = f", {r['mismatches']} mismatches against {a.against}" if a.against else ""
        build = f" [{r['model']}{' + fixup' if a.fixup else ''}]" if a.model or a.fixup else ""
        print(f"{func}{build} [0x{a.first:08X}, +0x{a.count:X}): sha256 {r['sha256']}{extra} ({r['seconds']} s)")
        for e in r["examples"]:
            print(f"    {e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 1 if any(r["mismatches"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
