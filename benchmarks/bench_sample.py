"""Generation speed with the KV cache against recomputing the whole context for every token.

For each position p, one token's logits are computed two ways on the same backend:

* cached: ``CachedModel.decode`` (one position through every layer, attention over the
  p cached keys: O(p) attention work and constant work elsewhere);
* recomputed: the training forward on the whole context of p + 1 tokens
  (``model.logits_forward``, O(p) linear work and O(p^2) attention work), which is what
  generating without a cache costs.

Times are this process's CPU time (``time.process_time``), medians of ``--repeats``:
on a shared machine wall time measures the other jobs. Run with ``NUMBA_NUM_THREADS=1``
so CPU time is the work.

Before timing, the cached logits are checked against the recomputed ones: bit for bit
with float32 linears (``--no-quantize``); with int8 the decode scales activations per
token, so they are compared at the prefill only (see ``lockstep.use.generate``).

    python benchmarks/bench_sample.py --preset small --backend numba --positions 16 64 128 255
    python benchmarks/bench_sample.py --run runs/int8 ...     # a trained run's last checkpoint
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lockstep.backends import get_backend  # noqa: E402
from lockstep.formats.config import preset  # noqa: E402
from lockstep.train.model import init_params, logits_forward  # noqa: E402
from lockstep.use.generate import CachedModel  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--run", type=Path, help="use this run's latest checkpoint instead of initial parameters")
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--positions", type=int, nargs="+", default=[16, 64, 128, 255])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-quantize", action="store_true")
    args = ap.parse_args(argv)
    be = get_backend(args.backend)
    if args.run:
        from lockstep.use.run import open_model

        m = open_model(args.run)
        cfg, params = m.cfg, m.params
    else:
        cfg = preset(args.preset, quantize=not args.no_quantize)
        params = init_params(cfg, 0)
    ids = (np.arange(cfg.seq_len) * 7 + 3) % 256
    model = CachedModel(params, cfg, be)
    model.prefill(ids[:8])
    full = np.asarray(logits_forward(params, ids[None, :16], cfg, be))
    check = model.prefill(ids[:16])
    assert check.tobytes() == full.tobytes(), "prefill differs from the training forward"
    if not cfg.quantize:
        model.prefill(ids[:8])
        dec = np.stack([model.decode(int(t)) for t in ids[8:16]])
        assert dec.tobytes() == full[8:16].tobytes(), "decode differs from the training forward"
    print(f"preset {cfg.name}, int8 {cfg.quantize}, backend {be.name} ({be.description}); "
          f"checks passed; median of {args.repeats}")
    print("| position | cached decode CPU ms/token | recompute the context CPU ms/token | ratio |")
    print("|---:|---:|---:|---:|")
    for p in args.positions:
        cached, recomputed = [], []
        for _ in range(args.repeats):
            model.prefill(ids[:p])
            t0 = time.process_time()
            model.decode(int(ids[p]))
            cached.append(time.process_time() - t0)
            t0 = time.process_time()
            logits_forward(params, ids[None, : p + 1], cfg, be)
            recomputed.append(time.process_time() - t0)
        c, r = statistics.median(cached) * 1e3, statistics.median(recomputed) * 1e3
        print(f"| {p} | {c:.1f} | {r:.1f} | {r / c:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
