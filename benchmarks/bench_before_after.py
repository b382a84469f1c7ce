"""The Numba `small` step of two lockstep trees side by side: this one and an older one.

    git archive <commit> | tar -x -C /tmp/before
    python benchmarks/bench_before_after.py --before /tmp/before [--threads 1 2] [--rounds 5] [--steps-per-round 2]
                                            [--int8-off]

Each tree's lockstep int8 step (``bench_tax.py``'s ``lockstep-int8`` worker: one micro-batch of
8 x 256 tokens, forward + backward + clipping + AdamW; with ``--int8-off`` the ``lockstep-fp32``
worker, every linear a fixed-order float32 contraction) runs in its own warm worker process,
importing that tree's ``lockstep``; rounds alternate between the two (who goes first alternates
too), and the table gives medians of wall and process CPU time and the speed-up after/before.
The older tree's first step compiles its kernels into its own Numba cache.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_tax import ROOT, Worker  # noqa: E402


def measure(before: Path, threads: int, rounds: int, per_round: int, variant: str = "lockstep-int8") -> dict:
    workers = {"before": Worker(variant, threads, root=before), "after": Worker(variant, threads)}
    times = {k: {"wall": [], "cpu": []} for k in workers}
    loads = []
    try:
        for r in range(rounds):
            order = list(workers.items()) if r % 2 == 0 else list(workers.items())[::-1]
            for name, w in order:
                res = w.ask(f"step {per_round} {2 + r * per_round}", "TIMES")
                times[name]["wall"] += res["wall"]
                times[name]["cpu"] += res["cpu"]
                loads.append(res["load"])
    finally:
        for w in workers.values():
            w.close()
    med = {k: {m: statistics.median(v[m]) for m in ("wall", "cpu")} for k, v in times.items()}
    return {"threads": threads, "medians": med, "load_min": min(loads), "load_max": max(loads)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="folder of the older lockstep tree (it must contain lockstep/)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps-per-round", type=int, default=2)
    ap.add_argument("--int8-off", action="store_true", help="time the int8-off step (fixed-order float32 linears)")
    args = ap.parse_args(argv)
    variant = "lockstep-fp32" if args.int8_off else "lockstep-int8"
    before = Path(args.before).resolve()
    if not (before / "lockstep" / "__init__.py").is_file():
        print(f"error: {before} has no lockstep/ package (extract a commit there with git archive)", file=sys.stderr)
        return 1
    print(f"before: {before}; after: {ROOT}; {variant}; load average {os.getloadavg()[0]:.1f}")
    print("| threads | before: wall s / CPU s | after: wall s / CPU s | speed-up (wall / CPU) | load (min-max) |")
    print("|---:|---|---|---|---|")
    for t in args.threads:
        r = measure(before, t, args.rounds, args.steps_per_round, variant)
        b, a = r["medians"]["before"], r["medians"]["after"]
        print(f"| {t} | {b['wall']:.3f} / {b['cpu']:.3f} | {a['wall']:.3f} / {a['cpu']:.3f} | "
              f"{b['wall'] / a['wall']:.2f}x / {b['cpu'] / a['cpu']:.2f}x | {r['load_min']:.1f}-{r['load_max']:.1f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
