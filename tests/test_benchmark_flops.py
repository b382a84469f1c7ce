"""The FLOP count behind every MFU figure of the benchmarks (``benchmarks/model_flops.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import model_flops  # noqa: E402
from lockstep.formats.params import param_count


def test_step_flops_counts_only_allowed_attention_pairs():
    cfg = model_flops.model_config("tiny")
    # tiny: T=32, window 16 on layer 0, full causal on layer 1 (the last)
    full = 32 * 33 // 2
    windowed = sum(min(i + 1, 16) for i in range(32))
    d, dh = cfg.d_model, cfg.head_dim
    per_layer = d * (4 + 2 * 2) * dh + 4 * dh * d + d * 2 * cfg.ffn_dim + cfg.ffn_dim * d
    fwd = 2 * 32 * (2 * per_layer + d * cfg.vocab_size) + 4 * 4 * dh * (full + windowed)
    assert model_flops.step_flops(cfg, 1) == 3 * fwd


def test_the_100m_model_has_about_100m_parameters():
    assert 95e6 < param_count(model_flops.MODEL_100M) < 105e6
