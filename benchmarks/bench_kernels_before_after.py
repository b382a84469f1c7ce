"""One GEMM-like kernel of two lockstep trees, call against call: this tree and an older one.

    git archive <commit> | tar -x -C /tmp/before
    python benchmarks/bench_kernels_before_after.py --before /tmp/before [--pairs 30] [--calls 2]
           [--kernel matmul|matmul_accumulate|int8] [--shape 2048 256 768]
    python benchmarks/bench_kernels_before_after.py --before /tmp/before --kernel "attention o = p v" --shape 16 1024 128

Each tree runs in its own warm worker process, importing that tree's ``lockstep``; the parent asks
them in turn (who goes first alternates), ``--calls`` calls each, then this tree's NumPy sgemm
(or, for an attention product, batched sgemm on the same operands) once more, and repeats that
``--pairs`` times. The speed of a cloud VM can change by 1.6x from one second to the next
(measured here: a register tile at 108 and 66 GFLOP/s in consecutive seconds, on identical data),
so the figure that means something is the ratio within each pair: the table gives the medians of
after/before and of after/sgemm over the pairs, with their quartiles.

Kernels (``--shape``: M K N, or for attention heads T Dh):

* ``matmul``, ``matmul_accumulate``: ``numba_cpu.reduce``'s fixed-order float32 contractions;
* ``int8``: ``int8gemm.matmul`` on this CPU's path (int8 operands in [-127, 127]);
* ``attention scores`` / ``attention o = p v`` / ``attention dk += ds^T q``: the attention
  products as ``bench_gemm_ceiling.py`` drives them (over every block of queries and all keys,
  each tree with its own drivers when it has a ``benchmarks/bench_gemm_ceiling.py``).

Every result is compared between the trees byte for byte before timing: a faster kernel that
changes a bit is a bug.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ATTENTION = {"attention scores": ("sgemm q k^T", "fixed-order scores"),
             "attention o = p v": ("sgemm p v", "fixed-order o = p v"),
             "attention dk += ds^T q": ("sgemm ds^T q", "fixed-order dk += ds^T q")}
KERNELS = ("matmul", "matmul_accumulate", "int8") + tuple(ATTENTION)


def _worker(kernel: str, shape: tuple[int, int, int]) -> None:
    """Serve ``run CALLS`` (the kernel, seconds a call), ``base`` (the sgemm it is measured against) and
    ``digest`` (of the kernel's result) on stdin/stdout."""
    import numpy as np

    rng = np.random.default_rng(0)
    if kernel in ATTENTION:
        sys.path.insert(0, os.environ.get("LOCKSTEP_BENCH_DIR", str(HERE)))
        import bench_gemm_ceiling

        base_name, name = ATTENTION[kernel]
        _, paths = bench_gemm_ceiling.attention_paths(rng, *shape)
        run, base = paths[name], paths[base_name]
        result = None  # the drivers checked their results against the spec
    else:
        from lockstep.backends.numba_cpu import int8gemm, reduce

        m, k, n = shape
        af = rng.standard_normal((m, k), dtype=np.float32)
        bf = rng.standard_normal((k, n), dtype=np.float32) * np.float32(0.05)
        acc = rng.standard_normal((m, n), dtype=np.float32)
        a8 = rng.integers(-127, 128, (m, k)).astype(np.int8)
        b8 = rng.integers(-127, 128, (k, n)).astype(np.int8)
        run = {"matmul": lambda: reduce.matmul(af, bf), "matmul_accumulate": lambda: reduce.matmul_accumulate(acc, af, bf),
               "int8": lambda: int8gemm.matmul(a8, b8)}[kernel]
        base = lambda: af @ bf  # noqa: E731
        result = run
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *arg = line.split()
        if cmd == "digest":
            print(hashlib.sha256(result().tobytes()).hexdigest() if result else "-", flush=True)
            continue
        fn = run if cmd == "run" else base
        calls = int(arg[0]) if arg else 1
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        print((time.perf_counter() - t) / calls, flush=True)


class _Tree:
    def __init__(self, root: Path | None, kernel: str, shape):
        env = dict(os.environ)
        if root is not None:
            env["PYTHONPATH"] = str(root)
            if (root / "benchmarks" / "bench_gemm_ceiling.py").exists():
                env["LOCKSTEP_BENCH_DIR"] = str(root / "benchmarks")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", kernel,
                                      *map(str, shape)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env, cwd="/" if root is not None else str(ROOT))
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"the worker of {root or ROOT} did not start (its kernel failed?)")

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="folder of the older lockstep tree (it must contain lockstep/)")
    ap.add_argument("--kernel", default="matmul", choices=KERNELS)
    ap.add_argument("--shape", type=int, nargs=3, default=[2048, 256, 768], metavar=("M", "K", "N"))
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.worker[0], tuple(int(x) for x in args.worker[1:]))
        return 0
    if not args.before or not (Path(args.before) / "lockstep").is_dir():
        ap.error("--before must name a folder holding an older lockstep/")
    shape = tuple(args.shape)
    trees = {"before": _Tree(Path(args.before).resolve(), args.kernel, shape), "after": _Tree(None, args.kernel, shape)}
    try:
        digests = {k: t.ask("digest") for k, t in trees.items()}
        if digests["before"] != digests["after"]:
            raise SystemExit(f"the trees' results differ: {digests}")
        secs = {"before": [], "after": [], "sgemm": []}
        for i in range(args.pairs):
            for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
                secs[name].append(float(trees[name].ask(f"run {args.calls}")))
            secs["sgemm"].append(float(trees["after"].ask("base 1")))
            print(f"  pair {i + 1}/{args.pairs}: before {secs['before'][-1] * 1e3:.2f} ms, after "
                  f"{secs['after'][-1] * 1e3:.2f} ms, sgemm {secs['sgemm'][-1] * 1e3:.2f} ms", file=sys.stderr, flush=True)
    finally:
        for t in trees.values():
            t.close()
    m, k, n = shape
    flops = 2 * m * k * k * n if args.kernel in ATTENTION else 2 * m * k * n

    def quartiles(xs):
        q = statistics.quantiles(xs, n=4)
        return f"{statistics.median(xs):.3f} ({q[0]:.3f}-{q[2]:.3f})"

    speedup = [b / a for b, a in zip(secs["before"], secs["after"])]
    vs_sgemm = [s / a for s, a in zip(secs["sgemm"], secs["after"])]
    before_sgemm = [s / b for s, b in zip(secs["sgemm"], secs["before"])]
    print(f"{args.kernel} {' x '.join(map(str, shape))}: before {flops / statistics.median(secs['before']) / 1e9:.1f}, "
          f"after {flops / statistics.median(secs['after']) / 1e9:.1f}, sgemm "
          f"{flops / statistics.median(secs['sgemm']) / 1e9:.1f} G(FL)OP/s (medians); speed-up after/before "
          f"{quartiles(speedup)}; before vs sgemm {quartiles(before_sgemm)}; after vs sgemm {quartiles(vs_sgemm)} "
          f"(medians over {args.pairs} pairs, quartiles in brackets; results identical)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
