"""A performance model of one lockstep training step on an H200: PREDICTIONS, not measurements.

    python3 benchmarks/perf_model.py            # the table (markdown), as recorded in RESULTS.md
    python3 benchmarks/perf_model.py --json     # the same numbers as JSON (device_check.sh reads them)

For each kernel family of a step, at the shapes of ``small``, ``medium`` (``model_flops.MODEL_100M``:
d_model 768, 12 layers, ~100M parameters; lockstep has no medium preset, so that shape stands in) and
``open-1b``: the bytes it moves through HBM and the FLOPs (or integer ops) it does, and a roofline
time ``max(bytes / HBM bandwidth, flops / ceiling)``. The ceilings are NVIDIA's datasheet figures
for the H200 SXM, not measured (``device_check.sh`` measures and prints measured next to predicted):

* HBM3e bandwidth 4.8 TB/s;
* float32 without tensor cores ~67 TFLOP/s (lockstep's float contractions are fixed-order FMA-free
  float32 kernels, so this is their ceiling);
* dense bf16 tensor cores ~990 TFLOP/s (PyTorch's bf16 step; MFU is quoted against it);
* dense int8 tensor cores ~1979 TOPS (lockstep's exact int8 GEMMs and the int8 recipe's P.V);
* int32 without tensor cores ~33.5 TOPS: half the float32 rate (64 INT32 lanes per SM beside 128
  FP32 ones), the ceiling of the int8 recipe's 64-bit fixed-point dQ;
* host link: PCIe Gen5 x16, ~64 GB/s each way (vendor figure; the transfers of a step).

Assumptions, each a simplification: every elementwise kernel reads its operands and writes its
result once (no cache reuse); a contraction reads each operand once per tile row/column pass
(counted as once: the roofline's best case); SHA-256 costs ~3,500 integer operations per 64-byte
block (64 rounds of ~55 32-bit operations), issued at the float32 rate; the step counts one
micro-batch of ``micro_batch`` sequences ``M`` times (M from the preset's first batch), the tree's
``M - 1`` adds, the optimizer once, and the state root once. The PyTorch bf16 baseline is the
step's model FLOPs at the bf16 ceiling (its best case), so the predicted tax is an upper bound
on what a well-tuned bf16 step would show against lockstep's predicted time.

Attention: per allowed (query, key) pair and head, each contraction over the head dim is ``2 Dh``
operations: the forward has two (``s = q k^T``, ``o = p v``), the backward five (``s`` again, ``dp``,
``dq``, ``dk``, ``dv``). Float32 attention runs them all at the float32 ceiling. The int8 recipe
(``quantize``, ``spec.attention.attention_forward_int8`` / ``attention_backward_int8``) runs
``o = p v`` on int8 tensor cores, adds ``P_QUANT_OPS`` float32 operations per pair to quantize p
(forward) and to rebuild the dequantized p (backward), and sums ``dq = ds k`` in 64-bit fixed
point at ``FIXED_POINT_INT32_OPS`` int32 operations per term; the other four contractions stay
float32. One attention kernel is fused, so its HBM bytes are counted once, on its float part.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import model_flops  # noqa: E402

from lockstep.formats.config import preset, train_preset  # noqa: E402
from lockstep.formats.params import param_specs  # noqa: E402

# H200 SXM vendor figures (datasheet), not measured here.
HBM_BYTES_S = 4.8e12
FP32_FLOP_S = 67e12
BF16_FLOP_S = 990e12
INT8_OP_S = 1979e12
INT32_OP_S = FP32_FLOP_S / 2
HOST_LINK_BYTES_S = 64e9
SHA256_OPS_PER_BLOCK = 3500
# int8 recipe attention, per pair: quantize p (multiply by 127, round, convert) in the forward;
# quantize and dequantize it again (one more product) in the backward.
P_QUANT_OPS = {"fwd": 3.0, "bwd": 4.0}
# One fixed-point term of dq = ds k on 32-bit integer lanes: the 24 x 24-bit mantissa product
# (a wide multiply, 2), the shift to the row's grid with round-half-even (a 64-bit funnel shift
# and the round, 5), the sign (a conditional 64-bit negate, 2), the int64 add (add with carry, 2),
# the shift count (1); the unpacking of ds and k is per row / per key, shared by the head dim.
FIXED_POINT_INT32_OPS = 12.0

MODELS = ("small", "medium", "open-1b")


def model_config(name: str):
    return model_flops.model_config("100m" if name == "medium" else name)


def train_config(name: str):
    return train_preset("small" if name == "medium" else name)


@dataclasses.dataclass
class Kernel:
    name: str
    phase: str           # kernels, update, hashing, transfers
    bytes: float         # HBM bytes (host link bytes for phase "transfers")
    flops: float         # float32 FLOPs, or int8 ops when ``int8``, or int32 ops when ``int32``
    int8: bool = False
    count: int = 1       # launches of this shape per step (bytes and flops are per launch)
    int32: bool = False

    def seconds(self) -> float:
        if self.phase == "transfers":
            return self.count * self.bytes / HOST_LINK_BYTES_S
        ceiling = INT8_OP_S if self.int8 else INT32_OP_S if self.int32 else FP32_FLOP_S
        return self.count * max(self.bytes / HBM_BYTES_S, self.flops / ceiling)


def n_params(cfg) -> int:
    total = 0
    for s in param_specs(cfg):
        n = 1
        for d in s.shape:
            n *= d
        total += n
    return total


def step_kernels(name: str) -> tuple[list[Kernel], dict]:
    """The kernels of one step of model ``name`` (per launch, with counts) and the step's shape."""
    cfg, tcfg = model_config(name), train_config(name)
    b, t, d, L, v = tcfg.micro_batch, cfg.seq_len, cfg.d_model, cfg.n_layers, cfg.vocab_size
    n_tok = b * t
    batch = tcfg.batch_ramp[0][1]
    m = -(-batch // b)
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    f = cfg.ffn_dim
    p = n_params(cfg)
    f4 = 4.0
    mm = []  # (name, M, K, N): y (M, N) = x (M, K) @ w (K, N), forward; backward = 2 more of the same size
    for lin, k_in, n_out in (("attn.wqkv", d, qkv), ("attn.wo", cfg.n_heads * cfg.head_dim, d),
                             ("ffn.w_gate_up", d, 2 * f), ("ffn.w_down", f, d)):
        mm.append((lin, n_tok, k_in, n_out))
    ks: list[Kernel] = []
    for lin, mr, k_in, n_out in mm:
        ops = 2.0 * mr * k_in * n_out
        by = mr * k_in + k_in * n_out + 4.0 * mr * n_out  # int8 operands, int32 result
        ks.append(Kernel(f"{lin} int8 GEMM (fwd + 2 bwd)", "kernels", by, ops, int8=cfg.quantize, count=3 * L * m))
        # quantize / dequantize / Hadamard around it: read float, write int8 and scales, read int32 back
        ks.append(Kernel(f"{lin} quantize + dequantize", "kernels", f4 * mr * k_in + mr * k_in + 2 * f4 * mr * n_out,
                         4.0 * mr * (k_in + n_out), count=3 * L * m))
    pairs = sum(min(i + 1, cfg.window(layer)) if cfg.window(layer) else i + 1
                for layer in range(L) for i in range(t)) / L
    head_pairs = b * cfg.n_heads * pairs           # (sequence, head, query, allowed key) per layer
    contraction = 2.0 * head_pairs * cfg.head_dim  # one contraction over the head dim of every pair
    att_bytes = f4 * b * t * (qkv + cfg.n_heads * cfg.head_dim)
    if cfg.quantize:
        ks.append(Kernel("attention fwd: q k^T, softmax, quantize p (fp32)", "kernels", att_bytes,
                         contraction + P_QUANT_OPS["fwd"] * head_pairs, count=L * m))
        ks.append(Kernel("attention fwd: p v (int8)", "kernels", 0.0, contraction, int8=True, count=L * m))
        ks.append(Kernel("attention bwd: s, dp, dk, dv, dequantized p (fp32)", "kernels", 2 * att_bytes,
                         4 * contraction + P_QUANT_OPS["bwd"] * head_pairs, count=L * m))
        ks.append(Kernel("attention bwd: dq in 64-bit fixed point (int32 ops)", "kernels", 0.0,
                         contraction / 2 * FIXED_POINT_INT32_OPS, int32=True, count=L * m))
    else:
        ks.append(Kernel("attention fwd (fp32 contractions)", "kernels", att_bytes, 2 * contraction, count=L * m))
        ks.append(Kernel("attention bwd (fp32 contractions)", "kernels", 2 * att_bytes, 5 * contraction, count=L * m))
    ks.append(Kernel("lm_head fwd + 2 bwd (fp32 contraction)", "kernels",
                     f4 * (n_tok * d + d * v + n_tok * v), 2.0 * n_tok * d * v, count=3 * m))
    ks.append(Kernel("cross-entropy fwd + bwd", "kernels", 3 * f4 * n_tok * v, 12.0 * n_tok * v, count=m))
    ew = f4 * n_tok * d * 3  # one elementwise pass over (N, d): two reads, one write
    ks.append(Kernel("norms, rope, swiglu, residual adds (fwd + bwd)", "kernels",
                     ew * 8 + 3 * f4 * n_tok * 2 * f * 2, 10.0 * n_tok * (8 * d + 2 * f), count=L * m))
    ks.append(Kernel("flatten gradients into the micro-batch vector", "kernels", 2 * f4 * p, 0.0, count=m))
    ks.append(Kernel("tree add (add_into)", "kernels", 3 * f4 * p, float(p), count=max(m - 1, 0)))
    ks.append(Kernel("sum of squares + norm + clip", "update", f4 * p, 2.0 * p))
    ks.append(Kernel("AdamW (reads p, g, m, v; writes p, m, v)", "update", 7 * f4 * p, 15.0 * p))
    state_bytes = 3 * f4 * p
    ks.append(Kernel("SHA-256 leaves of the state (device)", "hashing", state_bytes,
                     state_bytes / 64 * SHA256_OPS_PER_BLOCK))
    windows_bytes = 8.0 * batch * (t + 1)
    leaves = state_bytes / (1 << 20)
    ks.append(Kernel("host link: token ids in, scalars and leaf digests out", "transfers",
                     4 * windows_bytes + 32 * leaves + 4 * (m + 4), 0.0))
    shape = {"model": name, "params": p, "micro_batch": b, "M": m, "batch": batch, "seq_len": t,
             "quantize": cfg.quantize, "model_flops": model_flops.step_flops(cfg, batch)}
    return ks, shape


def predict(name: str) -> dict:
    ks, shape = step_kernels(name)
    phases: dict[str, float] = {}
    for k in ks:
        phases[k.phase] = phases.get(k.phase, 0.0) + k.seconds()
    step_s = sum(phases.values())
    torch_bf16_s = shape["model_flops"] / BF16_FLOP_S
    return {**shape, "kernels": [dict(dataclasses.asdict(k), seconds=k.seconds()) for k in ks], "phases_s": phases,
            "step_s": step_s, "mfu_vs_bf16_peak": shape["model_flops"] / step_s / BF16_FLOP_S,
            "torch_bf16_step_s": torch_bf16_s, "tax_vs_torch_bf16": step_s / torch_bf16_s,
            "prediction": True, "ceilings": "H200 SXM vendor figures (datasheet), not measured"}


def table(preds: list[dict]) -> str:
    lines = ["PREDICTION (H200 vendor ceilings, not measured): `python3 benchmarks/perf_model.py`", "",
             "| model | params | M x micro-batch | kernels s | update s | hashing s | transfers s | step s | MFU (bf16 peak) | tax vs PyTorch bf16 (at peak) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in preds:
        ph = p["phases_s"]
        lines.append(f"| {p['model']} | {p['params'] / 1e6:.1f}M | {p['M']} x {p['micro_batch']} | {ph['kernels']:.4g} | "
                     f"{ph['update']:.3g} | {ph['hashing']:.3g} | {ph['transfers']:.3g} | {p['step_s']:.4g} | "
                     f"{100 * p['mfu_vs_bf16_peak']:.1f}% | {p['tax_vs_torch_bf16']:.1f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Predicted H200 step times of lockstep (vendor ceilings)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="also list every kernel's bytes, flops and time")
    args = ap.parse_args(argv)
    preds = [predict(n) for n in MODELS]
    if args.json:
        print(json.dumps(preds, indent=2))
        return 0
    print(table(preds))
    if args.kernels:
        for p in preds:
            print(f"\n{p['model']}:")
            for k in p["kernels"]:
                print(f"  {k['name']:<52} x{k['count']:<5} {k['bytes'] / 1e6:10.2f} MB {k['flops'] / 1e9:10.2f} G"
                      f"{'op' if k['int8'] or k['int32'] else 'FLOP'}  {k['seconds'] * 1e3:9.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
