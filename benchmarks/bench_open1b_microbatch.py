"""One Open-1B micro-batch, forward and backward, on this machine: time, peak RSS, and the projection.

The paper's model (1.6B parameters, 4,096-token windows) on the numba backend with the
bounded-memory execution (``Execution(recompute=True, head_rows=...)``: only each block's
input kept, the LM head and loss in row chunks). The parameters are drawn through the
backend's ``truncated_normal`` capability (the spec's bits, as a run's initial state); the
tokens are a fixed pseudo-random window (nothing here is published, only measured). The
micro-batch runs inside the backend's ``weights_unchanged`` block, as a step's micro-batches do,
so each linear's int8 forms are made once and kept (and counted).

It reports, as one JSON line: the init time, the micro-batch's wall time, the process's peak
resident memory (``VmHWM``), the memory model's prediction for the same micro-batch
(weights, the gradients the backend returns, the int8 weight forms and
``memory.activation_bytes``), GFLOP/s by the 6N-per-token count, and the projected time of a
full-step replay (M micro-batches of the recipe's size, each scaled from this one by its
tokens; the update and hashing are small next to it and are not included).

    NUMBA_NUM_THREADS=2 python benchmarks/bench_open1b_microbatch.py --seqs 1 --max-memory 20

``--max-memory`` is checked before anything is allocated: the modelled micro-batch must fit it.

``--scratch DIR`` runs the micro-batch as the out-of-core step does instead
(``step.micro_batch_value`` into a vector of a scratch folder's pool: each gradient copied into
its place as the backward finishes it and that slice's pages handed back), so the peak is the
full step's micro-batch phase: the weights, their int8 forms, the activations and one gradient
with its slice (modelled the same way, ``memory.step_memory``'s terms).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np

GiB = 2**30


def vm_hwm() -> int:
    """Peak resident bytes of this process so far (Linux ``/proc/self/status``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> int:
    from lockstep.backends import NUMBA_MEMORY, get_backend
    from lockstep.formats.config import preset, train_preset
    from lockstep.formats.params import param_count
    from lockstep.train import memory
    from lockstep.train.execution import Execution
    from lockstep.train.model import init_params, loss_and_grads
    from lockstep.train.scratch import ScratchSpace
    from lockstep.train.step import GradLayout, micro_batch_value
    from lockstep.train.storage import VectorPool

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="open-1b")
    ap.add_argument("--seqs", type=int, default=1, help="sequences in the micro-batch (default 1)")
    ap.add_argument("--head-rows", type=int, default=1024, help="LM head row chunk (default 1024)")
    ap.add_argument("--max-memory", type=float, default=20.0, help="GiB the modelled micro-batch must fit")
    ap.add_argument("--scratch", metavar="DIR", help="run it as the out-of-core step does, its vector in DIR")
    args = ap.parse_args()

    cfg, tcfg = preset(args.preset), train_preset(args.preset)
    execution = Execution(recompute=True, head_rows=args.head_rows)
    params_n, linear, largest = memory._counts(cfg)
    acts = memory.activation_bytes(cfg, args.seqs, execution, NUMBA_MEMORY)
    grads_bytes = 2 * 4 * largest if args.scratch else 4 * params_n  # one gradient and its slice, or all of them
    modelled = (NUMBA_MEMORY.baseline + 4 * params_n + grads_bytes + (2 * linear if cfg.quantize else 0)
                + sum(acts.values()))
    if modelled > args.max_memory * GiB:
        print(f"bench_open1b_microbatch: the micro-batch is modelled at {modelled / GiB:,.1f} GiB, over "
              f"--max-memory {args.max_memory} GiB", file=sys.stderr)
        return 2
    be = get_backend("numba")
    t0 = time.perf_counter()
    last = [0.0]

    def progress(done, total):
        now = time.perf_counter()
        if now - last[0] > 10:
            last[0] = now
            print(f"  init {done / total:.0%}", file=sys.stderr, flush=True)

    params = init_params(cfg, 0, be, progress)
    init_s = time.perf_counter() - t0
    rss_params = vm_hwm()
    print(f"init: {param_count(cfg):,} parameters in {init_s:.1f} s; peak RSS {rss_params / GiB:.2f} GiB",
          file=sys.stderr, flush=True)
    rng = np.random.default_rng(1)
    windows = rng.integers(0, cfg.vocab_size, (args.seqs, cfg.seq_len + 1), dtype=np.int64)
    tokens = args.seqs * cfg.seq_len
    space = None
    t0 = time.perf_counter()
    # as a step runs its micro-batches: each weight's int8 forms made once and kept (``2 * linear`` bytes)
    same_weights = be.capabilities.weights_unchanged or contextlib.nullcontext
    with same_weights():
        if args.scratch:
            space = ScratchSpace(args.scratch)
            layout = GradLayout.of(cfg)
            pool = VectorPool(layout.size, scratch=space)
            grads = micro_batch_value(params, windows, cfg, tokens, be, layout, out=pool.take(),
                                      execution=execution, pool=pool)
            loss = grads[0]
        else:
            loss, grads = loss_and_grads(params, windows, cfg, be, execution=execution)
    mb_s = time.perf_counter() - t0
    peak = vm_hwm()
    flops = 6 * param_count(cfg) * tokens
    per_step_tokens = max(n for _, n in tcfg.batch_ramp[:1]) * cfg.seq_len  # the first ramp stage's batch
    m = -(-tcfg.batch_ramp[0][1] // tcfg.micro_batch)
    print(json.dumps({
        "preset": cfg.name, "parameters": param_count(cfg), "seqs": args.seqs, "tokens": tokens,
        "threads": int(os.environ.get("NUMBA_NUM_THREADS", os.cpu_count() or 1)),
        "execution": {"recompute": execution.recompute, "head_rows": execution.head_rows,
                      "path": "step, out of core" if args.scratch else "loss_and_grads"},
        "init_s": round(init_s, 1), "micro_batch_s": round(mb_s, 1),
        "peak_rss_gib": round(peak / GiB, 2), "modelled_gib": round(modelled / GiB, 2),
        "model_over_measured": round(modelled / peak, 2),
        "gflop_s_6n": round(flops / mb_s / 1e9, 1), "loss_contribution": float(np.asarray(be.to_numpy(loss))),
        "projected_step_replay_h": round(mb_s * per_step_tokens / tokens / 3600, 1), "step_micro_batches": m,
    }), flush=True)
    del grads, loss
    if space is not None:
        pool = None
        space.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
