"""Op trace cost: one step traced (``lockstep.audit.trace.traced_tree_step``) against the same step untraced
(``lockstep.train.step.tree_step``), in one process, on the same start state.

Trains a short run of the preset, loads the state after step 1, then times step 2 alternately
untraced and traced (``--repeats`` each; medians), with kept values (the default, outputs of at
most 65,536 elements) and with digests only (``--keep-values 0``). Writing the file is not timed
(``write_trace``; its size is printed). Both must give the same state root (checked).

    python benchmarks/bench_trace.py --preset tiny --backend numba --repeats 5
    python benchmarks/bench_trace.py --preset small --backend numba --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lockstep.audit.trace import DEFAULT_KEEP_VALUES, Tracer, traced_tree_step, write_trace  # noqa: E402
from lockstep.backends import get_backend  # noqa: E402
from lockstep.formats.checkpoint import load_checkpoint  # noqa: E402
from lockstep.formats.config import preset, train_preset  # noqa: E402
from lockstep.formats.schedule import plan_step  # noqa: E402
from lockstep.formats.stream import GlobalStream  # noqa: E402
from lockstep.formats.rundir import open_run_data  # noqa: E402
from lockstep.formats.recipe import load_recipe, recipe_configs  # noqa: E402
from lockstep.train.step import tree_step
from lockstep.formats.state import split_state  # noqa: E402
from lockstep.train.trainer import train  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    be = get_backend(args.backend)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        train(run, cfg=preset(args.preset), tcfg=train_preset(args.preset), data="default", steps=1,
              checkpoint_every=1, progress=False, log=lambda *a, **k: None, backend_name=args.backend, handle_signals=False)
        recipe = load_recipe(run)
        cfg, tcfg = recipe_configs(recipe)
        ck = load_checkpoint(run, 1)
        params, opt = split_state(ck.tensors)
        stream = GlobalStream(open_run_data(run, recipe, None), recipe["seed"], cfg.seq_len)
        plan = plan_step(tcfg, cfg.seq_len, 2)
        windows = stream.windows(plan.first_window, plan.n_windows)
        times = {"untraced": [], "traced, values kept": [], "traced, digests only": []}
        roots, sizes = set(), {}
        tree_step(params, opt, windows, plan, cfg, tcfg, be)  # warm-up (compilation, caches)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            roots.add(tree_step(params, opt, windows, plan, cfg, tcfg, be).state_root)
            times["untraced"].append(time.perf_counter() - t0)
            for label, keep in (("traced, values kept", DEFAULT_KEEP_VALUES), ("traced, digests only", 0)):
                tracer = Tracer(keep_values=keep)
                t0 = time.perf_counter()
                roots.add(traced_tree_step(params, opt, windows, plan, cfg, tcfg, be, tracer).state_root)
                times[label].append(time.perf_counter() - t0)
                out = Path(tmp) / f"{keep}.jsonl"
                write_trace(out, {"step": 2, "backend": be.name, "spec_version": "-"}, tracer.records)
                sizes[label] = (len(tracer.records), out.stat().st_size)
        assert len(roots) == 1, "a traced step gave other bits than the untraced one"
    base = statistics.median(times["untraced"])
    print(f"{args.preset} on {be.name}, step 2 ({plan.n_windows} windows, micro-batch {tcfg.micro_batch}), "
          f"medians of {args.repeats}:")
    print("| step | seconds | x untraced | records | trace file |")
    print("|---|---:|---:|---:|---:|")
    for label, ts in times.items():
        m = statistics.median(ts)
        rec, size = sizes.get(label, ("-", None))
        print(f"| {label} | {m:.3f} | {m / base:.2f} | {rec} | {'-' if size is None else f'{size / 1e6:.1f} MB'} |")


if __name__ == "__main__":
    main()
