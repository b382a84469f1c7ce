"""Stock PyTorch version of lockstep's model: the baseline of the reproducibility tax.

    python3 benchmarks/torch_baseline.py check [--preset tiny]
    python3 benchmarks/torch_baseline.py bench --model small|100m [--device cuda] [--dtype float32|bf16]
                                              [--batch 8] [--steps 5] [--json out.json]

The same architecture as ``lockstep/train/model.py`` with ``quantize`` off (the model
docstring): untied embedding and LM head, RMSNorm on the embedding output, pre-norm
blocks, GQA with QK-norm (no gain) and half-split RoPE (lockstep's own float32 tables),
sliding-window attention except every 5th layer and the last, SwiGLU with one fused
gate/up weight, cross-entropy + z-loss, AdamW. Parameters have lockstep's names and
shapes (weights (K, N), ``y = x @ w``), so ``load_lockstep_params`` takes lockstep's
``init_params`` as they are. Written with plain PyTorch ops (``scaled_dot_product_attention``,
``torch.optim.AdamW``): what a PyTorch user would run, on CPU or CUDA.

``check`` compares this model's loss and gradients with lockstep's (``spec`` backend,
``quantize=False``) from the same parameters and batch, on the CPU in float32; ``bench``
times a training step (forward, backward, AdamW) and prints tokens/s and MFU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lockstep.spec.rope import rope_tables  # noqa: E402
from lockstep.formats.config import ModelConfig  # noqa: E402

from model_flops import H200_BF16_PEAK, MODEL_100M, model_config, step_flops  # noqa: E402,F401


class LockstepRecipeModel(torch.nn.Module):
    """lockstep's model in PyTorch (quantize off); parameter names are lockstep's."""

    def __init__(self, cfg: ModelConfig, device="cpu"):
        super().__init__()
        self.cfg = cfg
        from lockstep.formats.params import param_specs

        self.names = [s.name for s in param_specs(cfg)]
        self.params = torch.nn.ParameterDict({
            n.replace(".", "/"): torch.nn.Parameter(torch.zeros(s.shape, dtype=torch.float32, device=device))
            for n, s in zip(self.names, param_specs(cfg))})
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("cos", torch.from_numpy(np.asarray(cos)).to(device), persistent=False)
        self.register_buffer("sin", torch.from_numpy(np.asarray(sin)).to(device), persistent=False)
        t = cfg.seq_len
        i = torch.arange(t, device=device)[:, None]
        j = torch.arange(t, device=device)[None, :]
        self.register_buffer("window_mask", (j <= i) & ((i - j) < cfg.sliding_window), persistent=False)

    def p(self, name: str) -> torch.Tensor:
        return self.params[name.replace(".", "/")]

    def load_lockstep_params(self, params: dict) -> None:
        with torch.no_grad():
            for n in self.names:
                self.p(n).copy_(torch.from_numpy(np.ascontiguousarray(params[n], dtype=np.float32)))

    def grads_numpy(self) -> dict[str, np.ndarray]:
        return {n: self.p(n).grad.detach().float().cpu().numpy() for n in self.names}

    def _rmsnorm(self, x, gain):
        rstd = torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + self.cfg.norm_eps)
        y = x * rstd
        return y if gain is None else y * gain

    def _rope(self, x):
        half = x.shape[-1] // 2
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _attention(self, q, k, v, window):
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)  # query head h reads KV head h // rep, as lockstep
        v = v.repeat_interleave(rep, dim=1)
        scale = 1.0 / math.sqrt(q.shape[-1])
        if window is None or window >= q.shape[2]:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.window_mask, scale=scale)

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Mean loss over the batch's target tokens (lse - logit[target] + z * lse**2)."""
        cfg = self.cfg
        inputs, targets = windows[:, :-1], windows[:, 1:].reshape(-1)
        b, t = inputs.shape
        h, g, dh, f = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
        x = self._rmsnorm(F.embedding(inputs, self.p("embed")), self.p("embed_norm.gain"))
        for layer in range(cfg.n_layers):
            pre = f"layers.{layer:02d}."
            a = self._rmsnorm(x, self.p(pre + "attn_norm.gain"))
            qkv = a @ self.p(pre + "attn.wqkv")
            q = qkv[..., : h * dh].reshape(b, t, h, dh).transpose(1, 2)
            k = qkv[..., h * dh : (h + g) * dh].reshape(b, t, g, dh).transpose(1, 2)
            v = qkv[..., (h + g) * dh :].reshape(b, t, g, dh).transpose(1, 2)
            q = self._rope(self._rmsnorm(q, None))
            k = self._rope(self._rmsnorm(k, None))
            o = self._attention(q, k, v, cfg.window(layer)).transpose(1, 2).reshape(b, t, h * dh)
            x = x + o @ self.p(pre + "attn.wo")
            gu = self._rmsnorm(x, self.p(pre + "ffn_norm.gain")) @ self.p(pre + "ffn.w_gate_up")
            x = x + (F.silu(gu[..., :f]) * gu[..., f:]) @ self.p(pre + "ffn.w_down")
        logits = (self._rmsnorm(x, self.p("final_norm.gain")) @ self.p("lm_head")).reshape(b * t, -1).float()
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, targets[:, None])[:, 0]
        return (lse - picked + cfg.z_loss * lse * lse).mean()


# ---------------------------------------------------------------- check against lockstep

def check_against_lockstep(preset_name: str = "tiny", seed: int = 7, batch: int = 2) -> dict:
    """Loss and gradients of this model vs lockstep's spec (quantize off), same params and batch.

    Returns ``{"loss_rel": ..., "grad_rel": {name: ...}, "worst": ...}``: relative errors,
    each ``|a - b| / |b|`` (Frobenius norms) against lockstep.
    """
    from lockstep.backends import get_backend
    from lockstep.train.model import init_params, loss_and_grads

    cfg = model_config(preset_name, quantize=False)
    params = init_params(cfg, seed)
    rng = np.random.default_rng(seed)
    windows = rng.integers(0, cfg.vocab_size, size=(batch, cfg.seq_len + 1), dtype=np.int64)
    loss_ls, grads_ls = loss_and_grads(params, windows, cfg, get_backend("spec"))
    model = LockstepRecipeModel(cfg)
    model.load_lockstep_params(params)
    loss_t = model(torch.from_numpy(windows))
    loss_t.backward()
    grads_t = model.grads_numpy()
    ref_loss = float(np.asarray(loss_ls))
    out = {"loss_lockstep": ref_loss, "loss_torch": float(loss_t.detach()),
           "loss_rel": abs(float(loss_t.detach()) - ref_loss) / abs(ref_loss), "grad_rel": {}}
    for n in model.names:
        ref = np.asarray(grads_ls[n], dtype=np.float64)
        diff = np.linalg.norm(grads_t[n].astype(np.float64) - ref)
        out["grad_rel"][n] = float(diff / max(np.linalg.norm(ref), 1e-30))
    out["worst"] = max(out["grad_rel"].items(), key=lambda kv: kv[1])
    return out


# ---------------------------------------------------------------- timing

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_step(cfg: ModelConfig, batch: int, steps: int, device: str, dtype: str, seed: int = 0) -> dict:
    """Median time of a training step (forward, backward, AdamW) in stock PyTorch."""
    dev = torch.device(device)
    torch.manual_seed(seed)
    model = LockstepRecipeModel(cfg, device=dev)
    with torch.no_grad():
        for n in model.names:
            p = model.p(n)
            p.copy_(torch.ones_like(p) if n.endswith("gain") else torch.randn_like(p) * cfg.init_std)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    windows = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), generator=gen).to(dev)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=(dtype == "bf16"))
    times = []
    for i in range(steps + 2):  # two warm-up steps (allocator, kernel selection)
        _sync(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = model(windows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        _sync(dev)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    flops = step_flops(cfg, batch)
    return {"model": cfg.name, "device": str(dev), "dtype": dtype, "batch": batch, "seq_len": cfg.seq_len,
            "params": sum(p.numel() for p in model.parameters()), "steps_timed": len(times),
            "step_s": step_s, "tokens_per_s": batch * cfg.seq_len / step_s, "step_tflop": flops / 1e12,
            "mfu_vs_bf16_peak": flops / step_s / H200_BF16_PEAK, "loss": float(loss.detach())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="loss and gradients vs lockstep's spec on the CPU (float32)")
    c.add_argument("--preset", default="tiny")
    b = sub.add_parser("bench", help="time a training step")
    b.add_argument("--model", default="small", help="tiny, small, open-1b or 100m")
    b.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    b.add_argument("--dtype", choices=("float32", "bf16"), default="float32")
    b.add_argument("--batch", type=int, default=8)
    b.add_argument("--steps", type=int, default=5)
    b.add_argument("--json", default="", help="also write the result here")
    args = ap.parse_args(argv)
    if args.cmd == "check":
        res = check_against_lockstep(args.preset)
        print(f"loss: torch {res['loss_torch']:.7f} lockstep {res['loss_lockstep']:.7f} rel {res['loss_rel']:.2e}")
        print(f"worst gradient: {res['worst'][0]} rel {res['worst'][1]:.2e}")
        return 0
    if args.dtype == "float32" and args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # stock float32: no TF32 (PyTorch's default too)
    res = bench_step(model_config(args.model, quantize=False), args.batch, args.steps, args.device, args.dtype)
    print(json.dumps(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
