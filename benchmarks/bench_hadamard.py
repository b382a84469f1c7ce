"""The Walsh-Hadamard rotation in the int8 backward: how much gradient error does it remove?

For one int8 W8A8 linear layer ``y = x @ w`` (M tokens, K in, N out), the spec's
straight-through backward ``lockstep.spec.quant.int8_linear_backward(dy, x, w,
hadamard)`` computes both GEMMs in int8:

    dx = dy @ wdq^T      contracted over N; scales per row of dy (token) and per column of wdq^T (input channel)
    dw = xdq^T @ dy      contracted over M; scales per row of xdq^T (input channel) and per column of dy (output channel)

where ``xdq``/``wdq`` are the dequantized operands of the forward. The reference
is the same straight-through gradient in float64 (``dy @ wdq^T``, ``xdq^T @ dy``
from those same dequantized operands), so the error measured is the backward's
quantization alone. Error = ||g - g_ref||_F / ||g_ref||_F, median over seeds.

A rotation along the *contracted* dimension only helps where one quantization
scale covers an outlier in that dimension, so the inputs come in several shapes
of outlier (a few entries 20-50x the rest):

    gaussian        no outliers
    x channels      a few input channels of x large (for every token)
    x tokens        a few tokens of x large (in every channel)
    x entries       a few single entries of x large ("massive activations")
    dy tokens       a few tokens of dy large
    dy channels     a few output channels of dy large

Inputs come from NumPy's generator (a benchmark, not a published number).

    python benchmarks/bench_hadamard.py [--seeds 5] [--record]

``--record`` appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse

import numpy as np
from record import append_results, markdown_table

from lockstep.spec.quant import dequantized_activation, dequantized_weight, int8_linear_backward

M, K, N = 512, 256, 256
N_OUTLIERS = 4              # outlier rows/columns per tensor
OUTLIER_GAIN = (20.0, 50.0)  # each outlier row/column scaled by a factor drawn from this range
W_STD = 0.02

SCENARIOS = ("gaussian", "x channels", "x tokens", "x entries", "dy tokens", "dy channels")


def make_inputs(scenario: str, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K))
    w = W_STD * rng.standard_normal((K, N))
    dy = rng.standard_normal((M, N)) / M

    def boost(a, axis):
        idx = rng.choice(a.shape[axis], N_OUTLIERS, replace=False)
        gain = rng.uniform(*OUTLIER_GAIN, N_OUTLIERS)
        if axis == 0:
            a[idx, :] *= gain[:, None]
        else:
            a[:, idx] *= gain[None, :]

    if scenario == "x channels":
        boost(x, 1)
    elif scenario == "x tokens":
        boost(x, 0)
    elif scenario == "x entries":
        rows = rng.choice(M, N_OUTLIERS, replace=False)
        cols = rng.choice(K, N_OUTLIERS, replace=False)
        x[rows, cols] *= rng.uniform(*OUTLIER_GAIN, N_OUTLIERS)
    elif scenario == "dy tokens":
        boost(dy, 0)
    elif scenario == "dy channels":
        boost(dy, 1)
    elif scenario != "gaussian":
        raise ValueError(f"unknown scenario {scenario!r}")
    return x.astype(np.float32), w.astype(np.float32), dy.astype(np.float32)


def rel_err(g, ref) -> float:
    g = np.asarray(g, dtype=np.float64)
    return float(np.linalg.norm(g - ref) / np.linalg.norm(ref))


def measure(scenario: str, seed: int) -> dict[str, float]:
    x, w, dy = make_inputs(scenario, seed)
    xdq = dequantized_activation(x).astype(np.float64)
    wdq = dequantized_weight(w).astype(np.float64)
    dy64 = dy.astype(np.float64)
    dx_ref = dy64 @ wdq.T  # float64 straight-through reference
    dw_ref = xdq.T @ dy64
    out = {}
    for rot in (False, True):
        dx, dw = int8_linear_backward(dy, x, w, hadamard=rot)
        tag = "had" if rot else "plain"
        out[f"dx_{tag}"] = rel_err(dx, dx_ref)
        out[f"dw_{tag}"] = rel_err(dw, dw_ref)
    return out


def run(seeds: int) -> dict[str, dict[str, float]]:
    table = {}
    for sc in SCENARIOS:
        runs = [measure(sc, s) for s in range(seeds)]
        table[sc] = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    return table


def format_table(table) -> str:
    columns = [("outliers", "left")] + [(f"{g}, {how}", "right") for g in ("dx", "dw") for how in ("no rotation", "Hadamard")]
    return markdown_table(columns, [[sc] + [f"{100 * r[k]:.2f}%" for k in ("dx_plain", "dx_had", "dw_plain", "dw_had")]
                                    for sc, r in table.items()])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    table = run(args.seeds)
    text = format_table(table)
    print(f"int8 linear backward, M={M} K={K} N={N}, {N_OUTLIERS} outlier rows/columns x{OUTLIER_GAIN[0]:g}-{OUTLIER_GAIN[1]:g}, "
          f"relative Frobenius error vs float64 straight-through, median of {args.seeds} seeds")
    print(text)
    if args.record:
        append_results(section(table, args.seeds))
    return 0


def section(table, seeds: int) -> str:
    t = {k: {e: 100 * v for e, v in r.items()} for k, r in table.items()}
    return (
        "\n## Hadamard rotation in the int8 backward\n\n"
        f"One int8 W8A8 linear layer (M={M} tokens, K={K}, N={N}); relative Frobenius error of the spec's int8 "
        "straight-through gradients (`lockstep.spec.quant.int8_linear_backward`) against the same gradients in "
        "float64 (`dx = dy @ wdq^T`, `dw = xdq^T @ dy` from the forward's dequantized operands), median of "
        f"{seeds} seeds. Outliers: {N_OUTLIERS} rows/columns (or entries) scaled by "
        f"{OUTLIER_GAIN[0]:g}-{OUTLIER_GAIN[1]:g}x.\n\n"
        f"{format_table(table)}\n\n"
        "Compared with the paper (weight-gradient error 5% without the rotation, 1% with): where the outliers lie "
        "along a GEMM's contracted dimension, under one quantization scale, we see the same effect: tokens of x or "
        f"of dy that are large take dw from {t['x tokens']['dw_plain']:.1f}% / {t['dy tokens']['dw_plain']:.1f}% to "
        f"{t['x tokens']['dw_had']:.1f}% / {t['dy tokens']['dw_had']:.1f}% (dw contracts over tokens), and large "
        f"output channels of dy take dx from {t['dy channels']['dx_plain']:.1f}% to {t['dy channels']['dx_had']:.1f}% "
        "(dx contracts over output channels). With the outliers in a few *input channels* of x, the rotation does "
        f"not help (dw {t['x channels']['dw_plain']:.2f}% -> {t['x channels']['dw_had']:.2f}%, dx unchanged): in this "
        "backward each row of `xdq^T` (one input channel) has its own scale, so a large channel only coarsens "
        "itself, and dx does not involve x at all; rotating along the tokens then mixes values that were already "
        "well scaled. The floor of ~1% is int8 rounding of Gaussian-like operands with absmax scales "
        "(step ~ 3 sigma / 127 on each side). Isolated large entries of x (a few (token, channel) pairs) "
        f"give {t['x entries']['dw_plain']:.2f}% -> {t['x entries']['dw_had']:.2f}% for dw.\n\n"
        f"Command: `python benchmarks/bench_hadamard.py --seeds {seeds} --record`\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
