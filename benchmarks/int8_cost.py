"""The cost of int8 training: two runs of the same recipe, int8 W8A8 on and off, compared.

Train the two runs first (the same preset, seed, data and token budget), e.g.::

    NUMBA_NUM_THREADS=1 lockstep train --preset small --backend numba --tokens 1048576 \\
        --eval-every 32 --out runs/int8
    NUMBA_NUM_THREADS=1 lockstep train --preset small --backend numba --tokens 1048576 \\
        --eval-every 32 --no-quantize --out runs/float

then::

    python benchmarks/int8_cost.py runs/int8 runs/float --png benchmarks/int8_cost.png

It checks that the runs saw the same batches (equal batch digests, step by step), prints
the validation losses at every evaluation and their gap, the final training loss (the
last step's, and the mean of the last 16 steps, since one step's batch is noisy), and
draws both runs' training and validation curves in one PNG. Everything is read from
the runs' trajectory.jsonl and metrics.jsonl; nothing is recomputed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lockstep.formats.recipe import load_recipe  # noqa: E402
from lockstep.formats.trajectory import Strictness, read_trajectory
from lockstep.use.evaluate import recorded_validations  # noqa: E402
from lockstep.use.plots import run_curves  # noqa: E402

TAIL = 16  # steps averaged for the final training loss


def summary(run: Path) -> dict:
    return {"recipe": load_recipe(run), "traj": read_trajectory(run, Strictness.LIVE), "val": recorded_validations(run)}


def at_step(s: dict, steps: int) -> None:
    """The final figures at step ``steps`` (the last step both runs reached)."""
    tail = [r["loss"] for r in s["traj"][steps - TAIL : steps]]
    s["last"], s["tail_mean"] = s["traj"][steps - 1], sum(tail) / len(tail)


def plot_comparison(int8_run: Path, float_run: Path, out: Path, title: str) -> Path | None:
    """Top: both runs' training loss (thin) and validation loss (markers), log scale. Bottom:
    int8 minus float32, validation loss and the training loss averaged over TAIL steps."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    curves = {"int8 W8A8": run_curves(int8_run), "float32": run_curves(float_run)}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, height_ratios=(2, 1))
    for i, (label, (tt, tl, vt, vl)) in enumerate(curves.items()):
        top.plot(tt, tl, lw=0.7, alpha=0.55, color=f"C{i}", label=f"{label}: training (one batch per step)")
        top.plot(vt, vl, "o-", ms=4, color=f"C{i}", label=f"{label}: validation (held-out documents)")
    top.set_yscale("log")
    top.set_ylabel("loss (nats / token)")
    top.set_title(title)
    top.grid(alpha=0.3, which="both")
    top.legend(fontsize=8)
    (ta, la, va, vla), (tb, lb, vb, vlb) = curves.values()
    n = min(len(la), len(lb))
    diff = [la[k] - lb[k] for k in range(n)]
    smooth = [sum(diff[k - TAIL + 1 : k + 1]) / TAIL for k in range(TAIL - 1, n)]
    bottom.plot(ta[TAIL - 1 : n], smooth, lw=1, color="C2", label=f"training loss, mean of {TAIL} steps")
    common = sorted(set(va) & set(vb))
    bottom.plot(common, [vla[va.index(t)] - vlb[vb.index(t)] for t in common], "o-", ms=4, color="C3",
                label="validation loss")
    bottom.axhline(0.0, color="k", lw=0.8)
    bottom.set_xlabel("training tokens")
    bottom.set_ylabel("int8 - float32 (nats)")
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("int8_run", type=Path)
    ap.add_argument("float_run", type=Path)
    ap.add_argument("--png", type=Path, default=Path("benchmarks/int8_cost.png"))
    args = ap.parse_args(argv)
    a, b = summary(args.int8_run), summary(args.float_run)
    ma, mb = a["recipe"]["model"], b["recipe"]["model"]
    if not ma["quantize"] or mb["quantize"]:
        print("give the int8 run first and the float run second", file=sys.stderr)
        return 1
    same_recipe = ({**ma, "quantize": None} == {**mb, "quantize": None} and a["recipe"]["train"] == b["recipe"]["train"]
                   and a["recipe"]["seed"] == b["recipe"]["seed"]
                   and a["recipe"]["data"]["manifest_sha256"] == b["recipe"]["data"]["manifest_sha256"])
    steps = min(len(a["traj"]), len(b["traj"]))
    same_batches = all(x["batch_digest"] == y["batch_digest"] for x, y in zip(a["traj"][:steps], b["traj"][:steps]))
    print(f"recipes equal but for quantize: {same_recipe}; batches equal over {steps} steps: {same_batches}")
    at_step(a, steps)
    at_step(b, steps)
    print(f"steps: int8 {len(a['traj'])}, float {len(b['traj'])}; compared at step {steps} "
          f"({a['last']['tokens']:,} tokens)")
    print()
    print("| step | tokens | val int8 (nats/token) | val float | gap int8 - float | val int8 (bits/byte) | val float |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for s in sorted(set(a["val"]) & set(b["val"])):
        va, vb = a["val"][s], b["val"][s]
        print(f"| {s} | {va['tokens']:,} | {va['nats_per_token']:.4f} | {vb['nats_per_token']:.4f} | "
              f"{va['nats_per_token'] - vb['nats_per_token']:+.4f} | {va['bits_per_byte']:.4f} | "
              f"{vb['bits_per_byte']:.4f} |")
    print()
    print(f"| final | int8 | float | gap |")
    print("|---|---:|---:|---:|")
    print(f"| training loss, step {a['last']['step']} (one batch) | {a['last']['loss']:.4f} | {b['last']['loss']:.4f} | "
          f"{a['last']['loss'] - b['last']['loss']:+.4f} |")
    print(f"| training loss, mean of the last {TAIL} steps | {a['tail_mean']:.4f} | {b['tail_mean']:.4f} | "
          f"{a['tail_mean'] - b['tail_mean']:+.4f} |")
    last = max(set(a["val"]) & set(b["val"]), default=None)
    if last is not None:
        va, vb = a["val"][last], b["val"][last]
        print(f"| validation loss, step {last} (nats/token) | {va['nats_per_token']:.4f} | {vb['nats_per_token']:.4f} | "
              f"{va['nats_per_token'] - vb['nats_per_token']:+.4f} |")
        for src in sorted(va["sources"]):
            x, y = va["sources"][src]["nats_per_token"], vb["sources"][src]["nats_per_token"]
            print(f"| validation loss, step {last}, {src} | {x:.4f} | {y:.4f} | {x - y:+.4f} |")
    png = plot_comparison(args.int8_run, args.float_run, args.png,
                          f"{ma['name']}: int8 W8A8 vs float32 linears, same data, seed and batches")
    print()
    print(f"plot: {png}" if png else "plot: matplotlib is not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
