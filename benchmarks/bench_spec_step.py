"""Seconds per training step in the spec (the pure-NumPy reference backend).

A step is what the trainer does per micro-batch and update: ``loss_and_grads``
on one micro-batch (the train preset's ``micro_batch`` sequences: tiny 4,
small 8) followed by ``optimizer_step`` (clipping + AdamW), with the recipe's
int8 layers on. Timed after one untimed warm-up step (the RoPE tables are
cached on first use). Wall time and this process's CPU time are both reported:
the machine may be shared, and CPU time is the steadier of the two.

    python benchmarks/bench_spec_step.py [--presets tiny small] [--repeats 3] [--record]

``--record`` appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
from record import append_results, markdown_table

from lockstep.backends import get_backend
from lockstep.formats.config import preset, train_preset
from lockstep.formats.params import param_count
from lockstep.train.model import init_params, loss_and_grads
from lockstep.train.optim import optimizer_step
from lockstep.formats.state import AdamWState
from lockstep.formats.schedule import learning_rate


def windows_for(cfg, batch: int, step: int) -> np.ndarray:
    """Deterministic token windows (integer arithmetic; content does not change the cost)."""
    b = np.arange(batch, dtype=np.int64)[:, None]
    t = np.arange(cfg.seq_len + 1, dtype=np.int64)[None, :]
    return ((b * 7919 + t * 31 + step * 104729) % cfg.vocab_size).astype(np.int64)


def time_steps(name: str, repeats: int, quantize: bool = True) -> dict:
    be = get_backend("spec")
    cfg = preset(name, quantize=quantize)
    tcfg = train_preset(name)
    batch = tcfg.micro_batch
    params = init_params(cfg, seed=0)
    state = AdamWState.zeros(params)
    walls, cpus = [], []
    for step in range(repeats + 1):  # step 0 is the warm-up
        w = windows_for(cfg, batch, step)
        t0, c0 = time.perf_counter(), time.process_time()
        loss, grads = loss_and_grads(params, w, cfg, be)
        params, state, _ = optimizer_step(params, grads, state, cfg, tcfg, learning_rate(tcfg, step * batch * cfg.seq_len), be)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if step:
            walls.append(wall)
            cpus.append(cpu)
        print(f"  {name} quantize={quantize} step {step}{' (warm-up)' if not step else ''}: "
              f"wall {wall:.2f} s, cpu {cpu:.2f} s, loss {float(loss):.4f}", flush=True)
    return {
        "preset": name, "quantize": quantize, "batch": batch, "tokens": batch * cfg.seq_len,
        "params": param_count(cfg), "runs": repeats,
        "wall": float(np.median(walls)), "cpu": float(np.median(cpus)),
    }


def format_table(rows) -> str:
    columns = [("preset", "left"), ("int8", "left"), ("params", "right"), ("micro-batch (seqs x len)", "left"),
               ("runs", "right"), ("wall s/step (median)", "right"), ("CPU s/step (median)", "right"),
               ("tokens/s (CPU)", "right")]
    return markdown_table(columns, [
        [r["preset"], "on" if r["quantize"] else "off", f"{r['params']:,}", f"{r['batch']} x {r['tokens'] // r['batch']}",
         str(r["runs"]), f"{r['wall']:.2f}", f"{r['cpu']:.2f}", f"{r['tokens'] / r['cpu']:.0f}"] for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--repeats", type=int, default=3, help="timed steps for tiny (median)")
    ap.add_argument("--small-repeats", type=int, default=1, help="timed steps for small")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    rows = []
    for name in args.presets:
        reps = args.small_repeats if name == "small" else args.repeats
        rows.append(time_steps(name, reps))
        if name == "tiny":
            rows.append(time_steps(name, reps, quantize=False))
    text = format_table(rows)
    load = os.getloadavg()
    host = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, NumPy {np.__version__}"
    print(text)
    print(f"host: {host}; load average at the end {load[0]:.1f}")
    if args.record:
        section = (
            "\n## Spec step time\n\n"
            "One training step in the spec backend: `loss_and_grads` on one micro-batch plus "
            "`optimizer_step` (global-norm clipping + AdamW), after one warm-up step.\n\n"
            f"{text}\n\n"
            f"Host: {host}; the machine was shared (load average {load[0]:.1f} at the end), so wall "
            "times are inflated; CPU time is this process's own.\n\n"
            f"Command: `python benchmarks/bench_spec_step.py --presets {' '.join(args.presets)} "
            f"--repeats {args.repeats} --small-repeats {args.small_repeats} --record`\n"
        )
        append_results(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
