"""Numba speed of the ops SPEC_VERSION 2 changed, before and after, in one run.

SPEC_VERSION 2 made masked attention terms absent (no -0.0 replay path) and gave
``sum_of_squares`` a blocked order. This times the Numba backend's
``attention_forward``/``attention_backward`` (the ``small`` shapes: B=8, H=4, G=2,
T=256, Dh=64; window 128 and fully causal) and ``sum_of_squares`` (the ``small``
fused gate/up weight, 256 x 1376, and larger flat tensors) in two source trees: the
current one and ``--before DIR`` (a checkout of the previous version, e.g.
``git worktree add /tmp/before <commit>``). Workers for the two trees alternate,
round after round (which goes first alternates), each in a fresh process with ``NUMBA_NUM_THREADS`` set, so a
change in machine load hits both; each worker reports the median of ``--repeats``
calls after a warm-up (which also compiles), and the table shows the median over
``--rounds`` rounds and the ratio after / before of wall time (and of CPU time, the
steadier measure on a shared machine). Output bits are compared between
the trees (attention: equal on these finite inputs; sum_of_squares: equal up to
one block of 4096 elements, different beyond: the order changed).

    python benchmarks/bench_spec_v2.py --before /tmp/before [--threads 1 2] [--rounds 3] [--repeats 5] [--record]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
SUMSQ_SIZES = [(256, 1376), (4096, 1024), (2048, 11264)]  # small w_gu; 4M; Open-1B FFN (23M)


def cases():
    """(label, op, args) built from seeded Philox streams (identical in both trees)."""
    import numpy as np

    from lockstep.conformance import inputs as gen
    from lockstep.spec.philox import PhiloxStream

    b, t, h, g, dh = 8, 256, 4, 2, 64

    def u(shape, lo, hi, tag):
        return gen.random_uniform(0, ("bench-v2", tag, *shape), shape, lo, hi)

    q, k, v = u((b, h, t, dh), -1, 1, "q"), u((b, g, t, dh), -1, 1, "k"), u((b, g, t, dh), -1, 1, "v")
    do = u((b, h, t, dh), -1e-3, 1e-3, "do")
    out = []
    for window in (128, None):
        from lockstep.backends import get_backend

        o, m, l = get_backend("numba").attention_forward(q, k, v, window)
        tag = f"W={window}" if window else "causal"
        out.append((f"attention_forward ({tag})", "attention_forward", (q, k, v, window)))
        out.append((f"attention_backward ({tag})", "attention_backward", (do, q, k, v, o, m, l, window)))
    for shape in SUMSQ_SIZES:
        n = shape[0] * shape[1]
        w = (PhiloxStream(0, "bench-v2", "sumsq", n).uniform(0, n) - np.float32(0.5)).astype(np.float32).reshape(shape)
        out.append((f"sum_of_squares {shape[0]}x{shape[1]} ({n / 1e6:.1f}M)", "sum_of_squares", (w,)))
    return out


def worker(repeats: int) -> dict:
    import numpy as np

    from lockstep.backends import get_backend

    nb = get_backend("numba")
    rows = []
    for label, op, args in cases():
        fn = getattr(nb, op)
        got = fn(*args)  # warm-up, compiles
        outs = got if isinstance(got, tuple) else (got,)
        digest = hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for o in outs)).hexdigest()[:16]
        walls, cpus = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            fn(*args)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        rows.append({"label": label, "wall": float(np.median(walls)), "cpu": float(np.median(cpus)), "digest": digest})
    return {"rows": rows, "load": os.getloadavg()[0]}


def run_worker(tree: Path, threads: int, repeats: int) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads), PYTHONPATH=str(tree))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--repeats", str(repeats)]
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"worker in {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def measure(trees: dict[str, Path], threads: list[int], rounds: int, repeats: int) -> dict:
    import numpy as np

    runs = {(name, t): [] for name in trees for t in threads}
    for r in range(rounds):
        for t in threads:
            order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]  # who goes first alternates
            for name, tree in order:
                print(f"  round {r + 1}/{rounds}: {name}, {t} thread(s) ...", file=sys.stderr, flush=True)
                runs[(name, t)].append(run_worker(tree, t, repeats))
    table = {}
    for (name, t), results in runs.items():
        labels = [row["label"] for row in results[0]["rows"]]
        table[(name, t)] = {lab: {"wall": float(np.median([res["rows"][i]["wall"] for res in results])),
                                  "cpu": float(np.median([res["rows"][i]["cpu"] for res in results])),
                                  "digest": results[0]["rows"][i]["digest"]} for i, lab in enumerate(labels)}
    loads = [res["load"] for results in runs.values() for res in results]
    return {"table": table, "load_min": min(loads), "load_max": max(loads)}


def format_table(m: dict, threads: list[int], names: list[str]) -> str:
    t = m["table"]
    labels = list(t[(names[-1], threads[0])])
    head = "| op (numba) | " + " | ".join(
        f"{n} ms ({th} thr)" for th in threads for n in names) + (" | " + " | ".join(
            f"after / before, wall (CPU) ({th} thr)" for th in threads) + " | same bits" if len(names) == 2 else "") + " |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for lab in labels:
        cells = [lab] + [f"{t[(n, th)][lab]['wall'] * 1e3:.2f}" for th in threads for n in names]
        if len(names) == 2:
            cells += [f"{t[(names[1], th)][lab]['wall'] / t[(names[0], th)][lab]['wall']:.2f}x "
                      f"({t[(names[1], th)][lab]['cpu'] / t[(names[0], th)][lab]['cpu']:.2f}x)" for th in threads]
            cells.append("yes" if t[(names[0], threads[0])][lab]["digest"] == t[(names[1], threads[0])][lab]["digest"]
                         else "no")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="source tree of the previous version (a git worktree or archive)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median over rounds)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per op per worker (median)")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args.repeats)))
        return 0
    trees = {}
    if args.before:
        trees["before"] = Path(args.before).resolve()
    trees["after"] = HERE.parent
    m = measure(trees, args.threads, args.rounds, args.repeats)
    names = list(trees)
    text = format_table(m, args.threads, names)
    print(text)
    if args.record:
        cmd = "python benchmarks/bench_spec_v2.py " + " ".join(a for a in (argv or sys.argv[1:]) if a != "--record")
        with open(RESULTS, "a", encoding="utf-8") as f:
            f.write(f"\n## SPEC_VERSION 2 changes, numba before/after ({time.strftime('%Y-%m-%d')})\n\n"
                    f"`{cmd}` on {platform.machine()} ({os.cpu_count()} CPUs, shared with other jobs; load average "
                    f"{m['load_min']:.1f}-{m['load_max']:.1f} during the run), medians of {args.rounds} alternating "
                    f"rounds x {args.repeats} calls.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
