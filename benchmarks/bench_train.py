"""Training-step costs: the share of step time spent hashing, and tokens/s with 1 and 2 ranks.

    python benchmarks/bench_train.py [--preset small] [--backend numba] [--steps 4] [--ranks 1 2]

(a) Hash overhead, in one process: a real step (``rank_contribution`` + ``apply_update``,
    which includes the state root) is timed, and separately the hashing a step does:
    ``state_root`` over parameters + AdamW moments + step, the batch digest and the chain
    hash. Share = hashing / step, medians over ``--steps`` steps after one warm-up step.
(b) Throughput: ``lockstep train`` under ``mpiexec -n R`` for each R in ``--ranks``; tokens/s
    is the median of metrics.jsonl's per-step values after the first step (which includes
    compilation and start-up).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
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
from lockstep.train.data import GlobalStream, batch_digest
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
        hashing.chain_hash(t, "00" * 32, root, bd)
        h1 = time.perf_counter()
        if t > 1:  # the first step compiles kernels
            step_s.append(t1 - t0)
            hash_s.append(h1 - h0)
    s, h = statistics.median(step_s), statistics.median(hash_s)
    nbytes = sum(v.nbytes for v in state_tensors(params, opt).values())
    return {"step_s": s, "hash_s": h, "share": h / s, "state_mib": nbytes / 2**20,
            "tokens_per_step": plan.n_global}


def throughput(preset_name: str, backend: str, steps: int, ranks: int, corpus: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        env = dict(os.environ)
        if ranks > (os.cpu_count() or 1):
            env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
        cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "lockstep.cli", "train", "--preset", preset_name,
               "--backend", backend, "--steps", str(steps + 1), "--data", str(corpus), "--out", str(out), "--quiet",
               "--checkpoint-every", "1000"]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return statistics.median(r["tokens_per_s"] for r in recs[1:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ranks", type=int, nargs="*", default=[1, 2])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        default_corpus(corpus)
        hs = hash_share(args.preset, args.backend, args.steps, corpus)
        print(f"## {args.preset} on {args.backend}: hashing share of a training step")
        print(f"state {hs['state_mib']:.1f} MiB; step {hs['step_s']:.3f} s ({hs['tokens_per_step']} tokens); "
              f"hashing {hs['hash_s'] * 1000:.1f} ms; share {100 * hs['share']:.2f}%")
        print()
        print("| ranks | tokens/s (median) |")
        print("|---:|---:|")
        for r in args.ranks:
            print(f"| {r} | {throughput(args.preset, args.backend, args.steps, r, corpus):,.0f} |", flush=True)


if __name__ == "__main__":
    main()
