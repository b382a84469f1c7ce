"""Training-step costs: the share of step time spent hashing, and tokens/s with 1 and 2 ranks.

    python benchmarks/bench_train.py [--preset small] [--backend numba] [--steps 4] [--ranks 1 2]

(a) Hash overhead, in one process: a real step (``rank_contribution`` + ``apply_update``,
    which includes the state root) is timed, and separately the hashing a step does:
    ``state_root`` over parameters + AdamW moments + step, the batch digest and the chain
    hash. Share = hashing / step, medians over ``--steps`` steps after one warm-up step.
(b) Throughput: ``lockstep train`` under ``mpiexec -n R`` for each R in ``--ranks``; tokens/s
    is the median of metrics.jsonl's per-step values after the first step. The first step
    is reported apart, with the kernel compilation the trainer announces in it ("compiled N
    kernels in X s"): the first run gets an empty Numba cache (``NUMBA_CACHE_DIR`` set to a
    fresh folder), so it shows a cold compilation; later runs share that cache (warm).
    ``--only-throughput`` skips (a).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lockstep.backends import get_backend
from lockstep.spec import hashing
from lockstep.train.config import preset, train_preset
from lockstep.train.corpus import default_corpus
from lockstep.train.stream import GlobalStream, batch_digest
from lockstep.train.model import init_params
from lockstep.train.optim import AdamWState
from lockstep.train.step import apply_update, plan_step, rank_contribution, state_tensors


def hash_share(preset_name: str, backend: str, steps: int, corpus: Path) -> dict:
    cfg, tcfg = preset(preset_name), train_preset(preset_name)
    be = get_backend(backend)
    stream = GlobalStream(default_corpus(corpus), 42, cfg.seq_len)
    params = init_params(cfg, 42)
    opt = AdamWState.zeros(params)
    step_s, hash_s = [], []
    for t in range(1, steps + 2):
        plan = plan_step(tcfg, cfg.seq_len, t)
        t0 = time.perf_counter()
        windows = stream.windows(plan.first_window, plan.n_windows)
        summed = rank_contribution(params, windows, cfg, tcfg, plan.n_global, be, step=t)
        res = apply_update(params, opt, summed, plan, cfg, tcfg, be)
        t1 = time.perf_counter()
        params, opt = res.params, res.opt
        h0 = time.perf_counter()
        root = hashing.state_root(state_tensors(params, opt))
        bd = batch_digest(windows)
        hashing.chain_hash(t, "00" * 32, root, bd, plan.tokens_after, res.loss, res.grad_norm, res.lr)
        h1 = time.perf_counter()
        if t > 1:  # the first step compiles kernels
            step_s.append(t1 - t0)
            hash_s.append(h1 - h0)
    s, h = statistics.median(step_s), statistics.median(hash_s)
    nbytes = sum(v.nbytes for v in state_tensors(params, opt).values())
    return {"step_s": s, "hash_s": h, "share": h / s, "state_mib": nbytes / 2**20,
            "tokens_per_step": plan.n_global}


def throughput(preset_name: str, backend: str, steps: int, ranks: int, corpus: Path, cache_dir: Path) -> dict:
    """Run ``lockstep train`` on ``ranks`` ranks; tokens/s after the first step, and the first step's compilation."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        env = dict(os.environ)
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
        if ranks > (os.cpu_count() or 1):
            env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
        cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "lockstep.cli", "train", "--preset", preset_name,
               "--backend", backend, "--steps", str(steps + 1), "--data", str(corpus), "--out", str(out),
               "--checkpoint-every", "1000"]
        load0 = os.getloadavg()[0]
        proc = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        compiled = re.search(r"compiled (\d+) kernels? in ([0-9.]+) s", proc.stdout)
        return {"ranks": ranks, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in recs[1:]),
                "step_s": statistics.median(r["seconds"] for r in recs[1:]), "first_step_s": recs[0]["seconds"],
                "compiled_kernels": int(compiled.group(1)) if compiled else 0,
                "compile_s": float(compiled.group(2)) if compiled else 0.0,
                "load": (load0 + os.getloadavg()[0]) / 2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ranks", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--only-throughput", action="store_true", help="skip the hashing share")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        default_corpus(corpus)
        if not args.only_throughput:
            hs = hash_share(args.preset, args.backend, args.steps, corpus)
            print(f"## {args.preset} on {args.backend}: hashing share of a training step")
            print(f"state {hs['state_mib']:.1f} MiB; step {hs['step_s']:.3f} s ({hs['tokens_per_step']} tokens); "
                  f"hashing {hs['hash_s'] * 1000:.1f} ms; share {100 * hs['share']:.2f}%")
            print()
        cache = Path(tmp) / "numba-cache"  # empty: the first run compiles every kernel
        print("| ranks | tokens/s (median of steps 2+) | s/step | first step s | of which compilation "
              "| load average |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in args.ranks:
            res = throughput(args.preset, args.backend, args.steps, r, corpus, cache)
            comp = (f"{res['compile_s']:.1f} s ({res['compiled_kernels']} kernels, cold cache)"
                    if res["compiled_kernels"] else "0 (warm cache)")
            print(f"| {r} | {res['tokens_per_s']:,.0f} | {res['step_s']:.2f} | {res['first_step_s']:.1f} | {comp} "
                  f"| {res['load']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
