"""Per-op speed of the Numba backend in two lockstep trees side by side: this one and an older one.

    git archive <commit> | tar -x -C /tmp/before
    python benchmarks/bench_numba_ops.py --before /tmp/before [--threads 1] [--rounds 7] [--calls 5]

Each tree runs in its own warm worker process (``NUMBA_NUM_THREADS`` set before Numba
loads) that imports that tree's ``lockstep``. A round times every op ``--calls`` times
in each worker (the median of the calls), alternating which worker goes first; the
table gives, per op, the median over the rounds of each tree's time and after/before.
Both workers first check that their outputs are byte-identical (each against its
tree's spec on a small input, and the two trees against each other on the timed
input, by a SHA-256 of the output bytes), so a faster op that changed a bit cannot
pass unnoticed. The older tree's first call compiles its kernels into its own cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the timed calls, built in the worker from a fixed seed (elementwise ops on 2**20 elements)
OPS = ["add", "sub", "mul", "mul_scalar", "div", "maximum", "minimum", "sqrt", "neg", "abs",
       "exp", "log", "sigmoid", "silu", "max", "matmul", "column_sum", "cross_entropy_forward",
       "attention_forward", "adamw_update"]
ELEMENTS = 1 << 20


def _worker(calls: int) -> None:
    import hashlib
    import time

    import numpy as np

    from lockstep import spec
    from lockstep.backends.numba_cpu import OPS as NB

    rng = np.random.default_rng(0)
    a = rng.standard_normal(ELEMENTS).astype(np.float32)
    b = rng.standard_normal(ELEMENTS).astype(np.float32)
    pos = np.abs(a) + np.float32(0.5)
    m256 = rng.standard_normal((256, 256)).astype(np.float32)
    logits = rng.standard_normal((512, 1024)).astype(np.float32)
    targets = rng.integers(0, 1024, 512)
    q = rng.standard_normal((1, 4, 256, 64)).astype(np.float32)
    kv = rng.standard_normal((1, 2, 256, 64)).astype(np.float32)
    s = [np.float32(x) for x in (1e-3, 0.9, 0.95, 0.1, 0.05, 1e-8, 0.1, 0.5, 0.5)]
    calls_by_op = {
        "add": lambda be: be["add"](a, b), "sub": lambda be: be["sub"](a, b), "mul": lambda be: be["mul"](a, b),
        "mul_scalar": lambda be: be["mul"](a, np.float32(3.0)), "div": lambda be: be["div"](a, b),
        "maximum": lambda be: be["maximum"](a, b), "minimum": lambda be: be["minimum"](a, b),
        "sqrt": lambda be: be["sqrt"](pos), "neg": lambda be: be["neg"](a), "abs": lambda be: be["abs"](a),
        "exp": lambda be: be["exp"](a), "log": lambda be: be["log"](pos), "sigmoid": lambda be: be["sigmoid"](a),
        "silu": lambda be: be["silu"](a), "max": lambda be: be["max"](a.reshape(1024, -1)),
        "matmul": lambda be: be["matmul"](m256, m256), "column_sum": lambda be: be["column_sum"](a.reshape(1024, -1)),
        "cross_entropy_forward": lambda be: be["cross_entropy_forward"](logits, targets, 1e-4),
        "attention_forward": lambda be: be["attention_forward"](q, kv, kv, None),
        "adamw_update": lambda be: be["adamw_update"](a, b, a, pos, *s),
    }

    def digest(r) -> str:
        h = hashlib.sha256()
        for x in (r if isinstance(r, tuple) else (r,)):
            h.update(np.ascontiguousarray(x).tobytes())
        return h.hexdigest()[:16]

    # against this tree's spec on the first 4096 elements (the spec is slow)
    for op, operands in (("add", (a[:4096], b[:4096])), ("maximum", (a[:4096], b[:4096])), ("exp", (a[:4096],)),
                         ("log", (pos[:4096],)), ("silu", (a[:4096],)), ("abs", (a[:4096],))):
        assert NB[op](*operands).tobytes() == getattr(spec, op)(*operands).tobytes(), op
    print(json.dumps({"ready": True, "digests": {op: digest(calls_by_op[op](NB)) for op in OPS}}), flush=True)
    for line in sys.stdin:
        times = {}
        for op in OPS:
            fn = calls_by_op[op]
            walls = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn(NB)
                walls.append(time.perf_counter() - t0)
            times[op] = statistics.median(walls)
        print(json.dumps({"times": times, "load": os.getloadavg()[0]}), flush=True)


class Worker:
    def __init__(self, root: Path, threads: int, calls: int):
        env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                   OPENBLAS_NUM_THREADS=str(threads), PYTHONPATH=str(root))
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", "--calls", str(calls)],
                                     cwd=str(root), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = json.loads(self.proc.stdout.readline())

    def round(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="root of the older tree (git archive <commit> | tar -x -C DIR)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.calls)
        return 0
    if args.before is None:
        ap.error("--before DIR is required")
    workers = {"before": Worker(args.before.resolve(), args.threads, args.calls),
               "after": Worker(ROOT, args.threads, args.calls)}
    differ = [op for op in OPS if workers["before"].hello["digests"][op] != workers["after"].hello["digests"][op]]
    if differ:
        print(f"outputs differ between the trees: {differ}", file=sys.stderr)
        return 1
    samples = {name: {op: [] for op in OPS} for name in workers}
    loads = []
    try:
        for r in range(args.rounds):
            order = list(workers) if r % 2 == 0 else list(workers)[::-1]
            for name in order:
                res = workers[name].round()
                loads.append(res["load"])
                for op, t in res["times"].items():
                    samples[name][op].append(t)
    finally:
        for w in workers.values():
            w.close()
    print(f"threads {args.threads}, {args.rounds} rounds x {args.calls} calls, load average {min(loads):.2f}-{max(loads):.2f}; "
          "outputs byte-identical between the trees")
    print(f"{'op':<22} {'before ms':>10} {'after ms':>10} {'after/before':>13}")
    for op in OPS:
        bt, at = statistics.median(samples["before"][op]), statistics.median(samples["after"][op])
        print(f"{op:<22} {bt * 1e3:>10.3f} {at * 1e3:>10.3f} {at / bt:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
