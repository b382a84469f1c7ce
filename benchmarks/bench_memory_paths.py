"""Peak memory and time of one micro-batch, in memory vs recomputed vs with the LM head in row chunks.

``lockstep.train.execution.Execution`` changes how much a micro-batch holds at once, never a
bit (``tests/test_execution.py`` checks the bits). This measures what it buys and costs: for
each model and each way, a fresh process warms numba up on ``tiny`` (so compilation is not
timed), loads random weights, then runs ``loss_and_grads`` on one micro-batch and reports
its wall time and its peak resident memory (``ru_maxrss`` of that process, from ``wait4``)
above the resident memory it had just before the micro-batch (weights loaded). Rounds
alternate the ways; the table gives medians.

    python benchmarks/bench_memory_paths.py --rounds 3 [--threads 2] [--record]

The weights are random draws from NumPy's generator: nothing here is published, only timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "small": dict(preset="small", micro_batch=4, overrides={}),
    # d_model 512 with a 32,768-token vocabulary and 1,024-token windows: the logits of one
    # 1-sequence micro-batch are 128 MiB, their gradient as much again
    "d512": dict(preset="small", micro_batch=1,
                 overrides=dict(name="d512", vocab_size=32_768, d_model=512, n_layers=4, n_heads=8, n_kv_heads=4,
                                head_dim=64, ffn_dim=1376, seq_len=1024, sliding_window=512)),
}
WAYS = {
    "in memory": dict(recompute=False, head_rows=None),
    "recompute": dict(recompute=True, head_rows=None),
    "head_rows 256": dict(recompute=False, head_rows=256),
    "recompute + head_rows 256": dict(recompute=True, head_rows=256),
}


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(model: str, way: str) -> None:
    import numpy as np

    from lockstep.backends import get_backend
    from lockstep.formats.config import preset
    from lockstep.formats.params import param_specs
    from lockstep.train.execution import Execution
    from lockstep.train.model import init_params, loss_and_grads

    m = MODELS[model]
    be = get_backend("numba")
    ex = Execution(**WAYS[way])
    tiny = preset("tiny")
    loss_and_grads(init_params(tiny, 0), np.zeros((2, tiny.seq_len + 1), np.int64), tiny, be, execution=ex)  # compile
    cfg = dataclasses.replace(preset(m["preset"]), **m["overrides"])
    rng = np.random.default_rng(0)  # benchmark weights: timed, never published
    params = {s.name: (np.ones(s.shape, np.float32) if s.init == "ones"
                       else (rng.standard_normal(s.shape, dtype=np.float32) * np.float32(0.02)))
              for s in param_specs(cfg)}
    windows = rng.integers(0, cfg.vocab_size, (m["micro_batch"], cfg.seq_len + 1)).astype(np.int64)
    n_params = sum(int(np.prod(s.shape)) for s in param_specs(cfg))
    base = _rss_mib()
    t0 = time.perf_counter()
    loss_and_grads(params, windows, cfg, be, execution=ex)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "base_mib": base, "params": n_params}), flush=True)


def measure(model: str, way: str, threads: int) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, __file__, "--child", model, way], stdout=subprocess.PIPE, env=env,
                            cwd=ROOT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak
    if status != 0:
        raise SystemExit(f"{model} / {way}: the child failed (status {status})")
    row = json.loads(out.strip().splitlines()[-1])
    row["peak_mib"] = usage.ru_maxrss / 1024
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--child", nargs=2, metavar=("MODEL", "WAY"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(*a.child)
        return
    lines = ["| model | parameters | tokens/micro-batch | way | s/micro-batch (median) | peak RSS MiB (median) | "
             "micro-batch's own MiB (peak - before) | vs in memory (own MiB) | vs in memory (s) |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for model in a.models:
        runs = {w: [] for w in WAYS}
        for r in range(a.rounds):
            for w in (list(WAYS) if r % 2 == 0 else list(reversed(WAYS))):
                runs[w].append(measure(model, w, a.threads))
                print(model, w, runs[w][-1], flush=True)
        cfg = MODELS[model]
        tokens = cfg["micro_batch"] * (cfg["overrides"].get("seq_len") or 256)
        med = {w: dict(s=statistics.median(x["seconds"] for x in v), peak=statistics.median(x["peak_mib"] for x in v),
                       own=statistics.median(x["peak_mib"] - x["base_mib"] for x in v), params=v[0]["params"])
               for w, v in runs.items()}
        b = med["in memory"]
        for w, v in med.items():
            lines.append(f"| {model} | {v['params']:,} | {tokens:,} | {w} | {v['s']:.2f} | {v['peak']:.0f} | "
                         f"{v['own']:.0f} | {v['own'] / b['own']:.2f}x | {v['s'] / b['s']:.2f}x |")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
