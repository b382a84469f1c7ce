"""How much memory one step of a recipe needs, and the refusal before anything is allocated.

Used by ``train --resume`` and ``audit replay`` (and ``sample``/``eval``), which check a
recipe that came from someone else against this machine before they build the model.
"""

from __future__ import annotations

import math
import os

from lockstep.formats.config import ModelConfig, TrainConfig
from lockstep.formats.rundir import RunFileError


def memory_estimate(cfg: ModelConfig, tcfg: TrainConfig) -> int:
    """Bytes a replay (or a resume) of one step of this recipe needs, roughly (an order of magnitude).

    The state (parameters and two AdamW moments), the gradient sums the step's
    micro-batch tree keeps alive (``spec.tree.TreeFolder``: at most ``ceil(log2 M) + 1``
    for the ramp's largest ``M``, plus the micro-batch being computed) and the new
    state, all float32; plus one micro-batch's activations: per layer about
    16 d_model + 4 ffn_dim values per token and the attention scores
    (heads x seq_len^2, forward and backward), and the logits (3 x vocab per token).
    The number of ranks that trained the run plays no part.
    """
    from lockstep.spec.tree import depth
    from lockstep.formats.params import param_specs

    params = sum(math.prod(s.shape) for s in param_specs(cfg))
    most = max(n for _, n in tcfg.batch_ramp)
    levels = depth(-(-most // tcfg.micro_batch)) + 2
    state = 4 * params * (3 + levels + 3)
    tokens = tcfg.micro_batch * cfg.seq_len
    per_layer = tokens * (16 * cfg.d_model + 4 * cfg.ffn_dim) + 2 * tcfg.micro_batch * cfg.n_heads * cfg.seq_len ** 2
    acts = 4 * (cfg.n_layers * per_layer + 3 * tokens * cfg.vocab_size)
    return state + acts


def available_memory() -> int | None:
    """Physical memory of this machine (and the address-space limit, if lower), or None if unknown."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            phys = min(phys, soft)
    except (ImportError, ValueError, OSError):
        pass
    return phys


def require_memory(cfg: ModelConfig, tcfg: TrainConfig, what: str) -> None:
    """``RunFileError`` when ``memory_estimate`` is beyond this machine's memory: refuse before allocating."""
    need, have = memory_estimate(cfg, tcfg), available_memory()
    if have is not None and need > have:
        raise RunFileError(f"the recipe's model ({cfg.name}: d_model {cfg.d_model}, {cfg.n_layers} layers, seq_len "
                           f"{cfg.seq_len}, vocab {cfg.vocab_size}) needs about {need / 2**30:,.1f} GiB to {what}; "
                           f"this machine has {have / 2**30:,.1f} GiB: use a machine with more memory")
