"""The parameters of a recipe's model: names, shapes, initialisation, weight decay, in canonical order.

This is the layout of a run's state (checkpoint tensors ``param/NAME``, ``adam_m/NAME``,
``adam_v/NAME``) and of the global gradient norm's order; ``lockstep.train.model``
computes with it, ``checkpoint`` and the audit check files against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    init: str          # "ones" or "normal"
    std: float = 0.0
    decay: bool = True  # AdamW weight decay applies


def param_specs(cfg: ModelConfig) -> list[ParamSpec]:
    """All parameters in canonical order (the order of the global gradient norm)."""
    d, dh, f, v = cfg.d_model, cfg.head_dim, cfg.ffn_dim, cfg.vocab_size
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * dh
    out_std = cfg.init_std / float(np.sqrt(2.0 * cfg.n_layers))  # host-side constant, rounded into init once
    specs = [
        ParamSpec("embed", (v, d), "normal", cfg.init_std, decay=False),
        ParamSpec("embed_norm.gain", (d,), "ones", decay=False),
    ]
    for i in range(cfg.n_layers):
        p = f"layers.{i:02d}."
        specs += [
            ParamSpec(p + "attn_norm.gain", (d,), "ones", decay=False),
            ParamSpec(p + "attn.wqkv", (d, qkv), "normal", cfg.init_std),
            ParamSpec(p + "attn.wo", (cfg.n_heads * dh, d), "normal", out_std),
            ParamSpec(p + "ffn_norm.gain", (d,), "ones", decay=False),
            ParamSpec(p + "ffn.w_gate_up", (d, 2 * f), "normal", cfg.init_std),
            ParamSpec(p + "ffn.w_down", (f, d), "normal", out_std),
        ]
    specs += [
        ParamSpec("final_norm.gain", (d,), "ones", decay=False),
        ParamSpec("lm_head", (d, v), "normal", cfg.init_std),
    ]
    return specs


def param_count(cfg: ModelConfig) -> int:
    return sum(int(np.prod(s.shape)) for s in param_specs(cfg))
