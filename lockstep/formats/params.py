"""The parameters of a recipe's model: names, shapes, initialisation, weight decay, in canonical order.

This is the layout of a run's state (checkpoint tensors ``param/NAME``, ``adam_m/NAME``,
``adam_v/NAME``) and of the global gradient norm's order; ``lockstep.train.model``
computes with it, ``checkpoint`` and the audit check files against it.

**The parameters** (``param_specs``), all float32, in canonical order: the order of
the global gradient norm's sum (the state root and a micro-batch's gradient vector,
``train.step.GradLayout``, order tensors by their names' UTF-8 bytes instead).
Symbols: ``V`` vocab_size, ``D`` d_model, ``L`` n_layers, ``H`` n_heads, ``G``
n_kv_heads, ``Dh`` head_dim, ``F`` ffn_dim; ``NN`` is the layer index ``i = 0 .. L-1``
in decimal, zero-padded to at least two digits (``f"{i:02d}"``: 00, 01, ..., 99, 100).
A matrix is (in, out): a linear is ``x @ W``::

    name                        shape              init    std                  decay
    embed                       (V, D)             normal  init_std             no
    embed_norm.gain             (D,)               ones    -                    no
    layers.NN.attn_norm.gain    (D,)               ones    -                    no
    layers.NN.attn.wqkv         (D, (H+2*G)*Dh)    normal  init_std             yes
    layers.NN.attn.wo           (H*Dh, D)          normal  init_std/sqrt(2*L)   yes
    layers.NN.ffn_norm.gain     (D,)               ones    -                    no
    layers.NN.ffn.w_gate_up     (D, 2*F)           normal  init_std             yes
    layers.NN.ffn.w_down        (F, D)             normal  init_std/sqrt(2*L)   yes
    final_norm.gain             (D,)               ones    -                    no
    lm_head                     (D, V)             normal  init_std             yes

The six ``layers.NN.`` rows repeat for NN = 00, 01, ..., L-1, in that order, between
``embed_norm.gain`` and ``final_norm.gain``. ``attn.wqkv``'s columns are the queries
``[0, H*Dh)`` (head ``h`` at ``h*Dh``), the keys ``[H*Dh, (H+G)*Dh)``, then the values;
``ffn.w_gate_up``'s are the gate ``[0, F)``, then the up projection ``[F, 2F)``. "decay":
AdamW's weight decay applies (the embedding and the gains have none). docs/formats.md
lists the same table with the open-1b shapes (tests/test_spec_text.py checks both
against ``param_specs``).

**Initial values** (``lockstep.train.model.init_params``, for the recipe's ``seed``):
``ones`` is float32 1.0 everywhere. For a ``normal`` parameter of ``n`` elements::

    std64 = init_std                         # float64, as the recipe holds it
    std64 = init_std / sqrt(2.0 * L)         # attn.wo and ffn.w_down instead: on the host in
                                             # float64, IEEE sqrt (correctly rounded) of the
                                             # exact 2*L, then one IEEE division
    std32 = float32(std64)                   # rounded once, to nearest even
    z     = spec.rng.truncated_normal(PhiloxStream(seed, "init", NAME), 0, n, bound=2.0)
    W     = fp.mul(z, std32), reshaped (C order) to the shape

``NAME`` is the parameter's full name (``"layers.03.attn.wo"``), so every parameter has
its own stream and adding one changes no other. The bound 2.0 is the standard normal's
(``truncated_normal_constants(2.0)``: the mass ``float32(erf(2 * SQRT1_2))``), so every
value lies within ``+-2 * std32``. Open-1B (init_std 0.02, L = 24): std32 is
``float32(0.02) = 0x3CA3D70A`` and, for the output projections, ``float32(0.02 / sqrt(48))
= float32(0.002886751345948129) = 0x3B3D2FA7``. ``ParamSpec.std`` holds std64.
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
    std: float = 0.0   # float64 std of a "normal" parameter (init rounds it to float32 once)
    decay: bool = True  # AdamW weight decay applies


def param_specs(cfg: ModelConfig) -> list[ParamSpec]:
    """All parameters in canonical order (the order of the global gradient norm)."""
    d, dh, f, v = cfg.d_model, cfg.head_dim, cfg.ffn_dim, cfg.vocab_size
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * dh
    out_std = cfg.init_std / float(np.sqrt(2.0 * cfg.n_layers))  # float64 (IEEE sqrt); init rounds it to float32
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
