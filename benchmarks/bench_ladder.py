"""The size ladder: parameters, the modelled peak of each memory plan, and (for the sizes that run here
in minutes) the measured peak RSS, seconds per micro-batch and GFLOP/s (6 x parameters per token) on
numba with 1 and 2 threads; then which micro-batch sizes of the large models fit an H200 (141 GB) and an
80 GB H100, with and without activation recomputation.

    python benchmarks/bench_ladder.py                       # the tables, nothing run
    python benchmarks/bench_ladder.py --measure tiny small  # + measured rows (one process per row)
    python benchmarks/bench_ladder.py --measure medium --threads 2 --micro-batches 1
    python benchmarks/bench_ladder.py --measure 400m --micro-batches 2 --recompute --head-rows 1024

Each measured row is one fresh process: init, one warm-up micro-batch (one window of at most 128
tokens: every kernel loaded from the cache, in seconds even at 400m), then one step of
``--micro-batches`` micro-batches (the tree and the update as the trainer runs them) timed; its
``VmHWM`` (the high-water mark of its own address space, Linux) is the peak (``ru_maxrss`` would
carry the parent's resident size at fork across exec). The plans' predictions come from
``lockstep.train.memory``; ``--recompute`` and ``--head-rows`` run the measured rows with that
``Execution`` (the same bits; needed where the in-memory plan is larger than this machine: 400m).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

from lockstep.formats.config import ModelConfig, preset, train_preset
from lockstep.formats.params import param_count
from lockstep.train import memory
from lockstep.train.execution import Execution

GB = 10**9
GiB = 2**30


def ladder() -> dict[str, tuple[ModelConfig, object]]:
    """name -> (ModelConfig, TrainConfig). medium and 400m are ModelConfigs (no preset of that size here)."""
    med = ModelConfig(name="medium", vocab_size=32768, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4,
                      head_dim=64, ffn_dim=2048, seq_len=1024, sliding_window=512)
    big = ModelConfig(name="400m", vocab_size=32768, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=4,
                      head_dim=64, ffn_dim=2816, seq_len=2048, sliding_window=512)
    return {
        "tiny": (preset("tiny"), train_preset("tiny")),
        "small": (preset("small"), train_preset("small")),
        "medium": (med, train_preset("small", batch_ramp=((0, 64),), micro_batch=4)),
        "400m": (big, train_preset("open-1b", batch_ramp=((0, 256),), micro_batch=4)),
        "open-1b": (preset("open-1b"), train_preset("open-1b")),
    }


PLANS = [("in memory", Execution()), ("recompute", Execution(recompute=True)),
         ("recompute + head rows 1024", Execution(recompute=True, head_rows=1024)),
         ("in memory + scratch", Execution(scratch="scratch")),
         ("recompute + head rows + scratch", Execution(recompute=True, head_rows=1024, scratch="scratch"))]


def _modelled(cfg, tcfg, ex) -> int:
    """The modelled peak of one step executed as ``ex``."""
    return memory.step_memory(cfg, tcfg, ex).total


CHILD = r"""
import dataclasses, json, sys, time
import numpy as np
from lockstep.backends import get_backend
from lockstep.formats.config import ModelConfig, TrainConfig
from lockstep.formats.schedule import plan_step
from lockstep.train.malloc import keep_freed_memory
from lockstep.train.model import init_params
from lockstep.formats.state import AdamWState

def resident_moments(params):  # zero moments written: resident, as a later step's are (np.zeros pages are not)
    return AdamWState(0, {k: np.full_like(p, 0.0) for k, p in params.items()},
                      {k: np.full_like(p, 0.0) for k, p in params.items()})
from lockstep.train.execution import Execution
from lockstep.train.step import GradLayout, apply_update, micro_batch_value, subtree_sums
from lockstep.train.storage import VectorPool
spec = json.loads(sys.argv[1])
ex = Execution(**spec["execution"])
keep_freed_memory()
cfg, tcfg = ModelConfig.from_dict(spec["model"]), TrainConfig.from_dict(spec["train"])
be = get_backend("numba")
t0 = time.perf_counter()
params = init_params(cfg, 1, be)  # drawn by the backend (the spec's bits), as the trainer does
t_init = time.perf_counter() - t0
opt = resident_moments(params)  # resident through the micro-batches, as from the second step on
plan = plan_step(tcfg, cfg.seq_len, 1)
windows = np.random.default_rng(0).integers(0, 257, size=(plan.n_windows, cfg.seq_len + 1)).astype(np.int32)
layout = GradLayout.of(cfg)
pool = VectorPool(layout.size)
short = dataclasses.replace(cfg, seq_len=min(cfg.seq_len, 128))  # the same kernels, loaded in seconds
warm = micro_batch_value(params, windows[:1, : short.seq_len + 1], short, short.seq_len, be, layout, out=pool.take(),
                         execution=ex)
pool.give(warm)
m = len(plan.micro_batches(tcfg.micro_batch))
t0 = time.perf_counter()
[(_, _, s)] = subtree_sums(params, windows, plan, 0, m, cfg, tcfg, be, pool, execution=ex)
t_mb = (time.perf_counter() - t0) / m
t0 = time.perf_counter()
apply_update(params, opt, s, plan, cfg, tcfg, be)
t_up = time.perf_counter() - t0
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"peak": hwm * 1024, "init_s": t_init,
                  "micro_batch_s": t_mb, "update_s": t_up, "m": m}))
"""


def measure(cfg, tcfg, threads: int, ex: Execution) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    spec = {"model": cfg.to_dict(), "train": tcfg.to_dict(),
            "execution": {"recompute": ex.recompute, "head_rows": ex.head_rows}}
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", nargs="*", default=[], help="rows to run (tiny, small, medium, 400m, open-1b)")
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2], help="NUMBA_NUM_THREADS values (default 1 2)")
    ap.add_argument("--micro-batches", type=int, help="measured rows: the step's micro-batches (default: the "
                                                      "recipe's batch, at most 2 here)")
    ap.add_argument("--recompute", action="store_true", help="measured rows: activation recomputation")
    ap.add_argument("--head-rows", type=int, help="measured rows: the LM head and loss in chunks of this many rows")
    args = ap.parse_args()
    measured_ex = Execution(recompute=args.recompute, head_rows=args.head_rows)
    rows = ladder()
    print("| size | parameters | " + " | ".join(label for label, _ in PLANS) + " |")
    print("|---|---:|" + "---:|" * len(PLANS))
    for name, (cfg, tcfg) in rows.items():
        cells = []
        for _, ex in PLANS:
            cells.append(f"{_modelled(cfg, tcfg, ex) / GiB:,.2f} GiB")
        print(f"| {name} | {param_count(cfg) / 1e6:,.1f}M | " + " | ".join(cells) + " |")

    if args.measure:
        plan = ("in memory" + (", recompute" if measured_ex.recompute else "")
                + (f", head rows {measured_ex.head_rows}" if measured_ex.head_rows else ""))
        print(f"\n| size | threads | micro-batch | M | measured peak RSS | modelled ({plan}) | model/measured | "
              "s per micro-batch | GFLOP/s (6N per token) | init s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.measure:
        cfg, tcfg = rows[name]
        n = args.micro_batches or min(2, -(-max(b for _, b in tcfg.batch_ramp) // tcfg.micro_batch))
        tcfg = dataclasses.replace(tcfg, batch_ramp=((0, n * tcfg.micro_batch),))
        want = memory.step_memory(cfg, tcfg, measured_ex).total
        for threads in args.threads:
            r = measure(cfg, tcfg, threads, measured_ex)
            flops = 6 * param_count(cfg) * tcfg.micro_batch * cfg.seq_len / r["micro_batch_s"]
            print(f"| {name} | {threads} | {tcfg.micro_batch} | {r['m']} | {r['peak'] / GiB:,.3f} GiB | "
                  f"{want / GiB:,.3f} GiB | {want / r['peak']:.2f} | {r['micro_batch_s']:.3f} | {flops / 1e9:,.3g} | "
                  f"{r['init_s']:.1f} |", flush=True)

    print("\nDevice memory of one step (shared kernels; the whole state on the device; the recipe's largest "
          "batch), GB = 10^9 bytes:")
    print("| size | device | batch | micro-batch sizes that fit, in memory | with recompute (modelled) |")
    print("|---|---|---:|---|---|")
    for name in ("400m", "open-1b"):
        cfg, tcfg = rows[name]
        batch = max(n for _, n in tcfg.batch_ramp)
        for dev, cap in (("H200 141 GB", 141 * GB), ("H100 80 GB", 80 * GB)):
            show = {}
            for label, ex in (("plain", Execution()), ("recompute", Execution(recompute=True))):
                need = {b: memory.device_memory(cfg, b, ex, batch) for b in (1, 2, 4, 8, 16, 32)}
                fit = [b for b, n in need.items() if n <= cap]
                show[label] = (", ".join(map(str, fit)) or "none") + f" (at 1: {need[1] / GB:,.0f} GB)"
            print(f"| {name} | {dev} | {batch} | {show['plain']} | {show['recompute']} |")


if __name__ == "__main__":
    main()
