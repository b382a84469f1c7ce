"""Model sizes and FLOP counts shared by the benchmarks (no PyTorch needed).

``MODEL_100M`` is the ~100M-parameter model of the tax measurement (issue 11);
``step_flops`` counts a training step's model FLOPs the same way for lockstep and PyTorch.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lockstep.formats.config import ModelConfig, preset  # noqa: E402

# ~100M parameters in the Open-1B recipe's proportions (GQA 3:1, FFN ~2.7 d, window 512):
# 12 layers x 6.3M + embedding and LM head 2 x 12.6M = 101M.
MODEL_100M = ModelConfig(name="100m", vocab_size=16_384, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4,
                         head_dim=64, ffn_dim=2048, seq_len=1024, sliding_window=512)

# Dense bf16 tensor-core peak of an H100/H200 SXM (NVIDIA datasheet, without sparsity), FLOP/s.
H200_BF16_PEAK = 989.4e12


def model_config(name: str, quantize: bool | None = None) -> ModelConfig:
    """A lockstep preset or ``100m``; ``quantize`` overrides the preset's."""
    cfg = MODEL_100M if name == "100m" else preset(name)
    return dataclasses.replace(cfg, quantize=quantize) if quantize is not None else cfg


def step_flops(cfg: ModelConfig, batch: int) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward), attention counted exactly.

    Forward: 2 FLOPs per multiply-add of every linear layer and the LM head, plus the
    score and P.V contractions over the allowed (query, key) pairs only.
    """
    d, dh, t = cfg.d_model, cfg.head_dim, cfg.seq_len
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * dh
    per_layer = d * qkv + cfg.n_heads * dh * d + d * 2 * cfg.ffn_dim + cfg.ffn_dim * d
    tokens = batch * t
    fwd = 2.0 * tokens * (cfg.n_layers * per_layer + d * cfg.vocab_size)
    for layer in range(cfg.n_layers):
        w = cfg.window(layer)
        pairs = sum(min(i + 1, w) if w else i + 1 for i in range(t))
        fwd += 2.0 * 2.0 * batch * cfg.n_heads * pairs * dh
    return 3.0 * fwd
