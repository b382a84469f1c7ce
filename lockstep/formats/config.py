"""Model and training configuration: the Open-1B recipe, scaled by preset.

``preset(name)`` returns a ``ModelConfig``; ``ModelConfig.from_dict`` rejects
unknown keys, so a typo in a recipe is an error, not a silent default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lockstep.errors import LockstepError


class ConfigError(LockstepError, ValueError):
    """A model or train setting that lockstep cannot train with (an unknown key or preset, a value out of range)."""


def _refuse_unknown_keys(cls, d: dict, what: str) -> None:
    """``ValueError`` naming the keys of ``d`` that are not fields of the config dataclass ``cls``."""
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ConfigError(f"unknown {what} config key(s): {', '.join(unknown)}")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "custom"
    vocab_size: int = 264            # byte tokenizer (257 ids) padded to a multiple of 8
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4                 # query heads
    n_kv_heads: int = 2              # GQA: query heads share KV heads
    head_dim: int = 64
    ffn_dim: int = 688               # SwiGLU hidden width
    seq_len: int = 256
    sliding_window: int = 128        # local layers attend to the last W positions
    full_attention_every: int = 5    # every 5th layer (and the last) is fully causal
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-6
    z_loss: float = 1e-4
    init_std: float = 0.02           # truncated normal (+-2 std); output projections / sqrt(2 L)
    quantize: bool = True            # int8 W8A8 attention/FFN linears; False: float32 contractions
    hadamard: bool = True            # Walsh-Hadamard rotation in the int8 backward GEMMs

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        for k in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "seq_len"):
            if int(getattr(self, k)) <= 0:
                raise ConfigError(f"{k} must be positive, got {getattr(self, k)}")

    def is_full_attention(self, layer: int) -> bool:
        """Layer ``layer`` (0-based) is fully causal if it is every 5th or the last."""
        return (layer + 1) % self.full_attention_every == 0 or layer == self.n_layers - 1

    def window(self, layer: int) -> int | None:
        return None if self.is_full_attention(layer) else self.sliding_window

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        _refuse_unknown_keys(cls, d, "model")
        return cls(**d)


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer and schedule. Token counts drive the schedule, not step counts."""

    peak_lr: float = 3e-3
    min_lr_ratio: float = 0.1            # cosine decays to 10% of peak
    warmup_tokens: int = 65_536
    total_tokens: int = 8_388_608        # token budget of the cosine
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # Global-batch ramp: (from_tokens, sequences per step), ascending from 0.
    batch_ramp: tuple[tuple[int, int], ...] = ((0, 16),)
    micro_batch: int = 8                 # sequences per micro-batch (cut from the step's batch, whatever the world size)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["batch_ramp"] = [list(x) for x in self.batch_ramp]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        _refuse_unknown_keys(cls, d, "train")
        d = dict(d)
        if "batch_ramp" in d:
            d["batch_ramp"] = tuple(tuple(int(v) for v in x) for x in d["batch_ramp"])
        return cls(**d)


PRESETS: dict[str, ModelConfig] = {
    # For tests: a spec training step well under a second.
    "tiny": ModelConfig(name="tiny", vocab_size=264, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                        head_dim=8, ffn_dim=64, seq_len=32, sliding_window=16),
    # CPU demo: a few million parameters, byte vocabulary, sequence length 256.
    "small": ModelConfig(name="small", vocab_size=264, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2,
                         head_dim=64, ffn_dim=688, seq_len=256, sliding_window=128),
    # CPU work at the ~100M scale (102M parameters): Open-1B's shapes scaled down, so what it
    # measures carries over: head_dim 128 with 4 query heads per KV head (8 over 2), SwiGLU
    # width 2.75 x d_model (2816, Open-1B's 5632/2048), a window of 1/8 of the context (Open-1B
    # 512/4096), 9 layers of which 2 are fully causal (the 5th and the last). The byte
    # vocabulary (264 ids: the default corpus's byte tokenizer, 257, padded to a multiple of 8),
    # so it trains on the embedded corpus with no tokenizer; a BPE data folder needs
    # --set model.vocab_size=V. seq_len 1024 (a quarter of Open-1B) keeps one micro-batch of
    # 2 sequences near 20 s on two cores; nearly all parameters are in the blocks, as at scale.
    "medium": ModelConfig(name="medium", vocab_size=264, d_model=1024, n_layers=9, n_heads=8, n_kv_heads=2,
                          head_dim=128, ffn_dim=2816, seq_len=1024, sliding_window=128),
    # From the paper: 24 layers, d_model 2048, 16 query heads over 4 KV heads of 128, FFN 5632,
    # sequences of 4,096 tokens, windows of 512 with every 5th and the last layer fully causal,
    # RoPE theta 500,000, z-loss 1e-4 (the field defaults), int8 W8A8 with the Hadamard backward.
    # lockstep's own: the vocabulary (128,256 ids, a BPE data folder of that size; with it the
    # parameter count is the paper's 1,607,569,408), init_std 0.02 with the output projections at
    # 0.02 / sqrt(48) (``params.param_specs``) and norm_eps 1e-6 (the field defaults).
    "open-1b": ModelConfig(name="open-1b", vocab_size=128_256, d_model=2048, n_layers=24, n_heads=16,
                           n_kv_heads=4, head_dim=128, ffn_dim=5632, seq_len=4096, sliding_window=512),
}

TRAIN_PRESETS: dict[str, TrainConfig] = {
    "tiny": TrainConfig(peak_lr=1e-2, warmup_tokens=2_048, total_tokens=1_000_000,
                        batch_ramp=((0, 8),), micro_batch=4),
    # small: M = 4 micro-batches of 4 sequences a step, 8 from 1,048,576 tokens, so up to 4
    # (then 8) ranks all have work (a step's micro-batches never depend on the world size).
    "small": TrainConfig(peak_lr=3e-3, warmup_tokens=131_072, total_tokens=8_388_608,
                         batch_ramp=((0, 16), (1_048_576, 32)), micro_batch=4),
    # medium: 16 sequences of 1024 (16K tokens) a step in M = 8 micro-batches of 2 (so up to 8
    # ranks have work); a learning rate between small's and Open-1B's; a cosine over 100M tokens.
    "medium": TrainConfig(peak_lr=1e-3, warmup_tokens=1_048_576, total_tokens=104_857_600,
                          batch_ramp=((0, 16),), micro_batch=2),
    # Open-1B. From the paper: peak learning rate 4.5e-4; a linear warm-up over 667 steps of 768
    # sequences of 4,096 tokens (3,145,728 tokens a step), i.e. warmup_tokens = 667 * 3,145,728 =
    # 2,098,200,576 (the paper's "about 2.1B"): step t uses the learning rate at the tokens
    # consumed once it is done (``schedule.learning_rate``), so step 1 trains at peak / 667 and
    # step 667 at the peak; one cosine to 10% of the peak at its 400B-token budget (a 400B-token
    # run, ``--tokens 400000000000``, is 80,957 steps on this ramp); AdamW (0.9, 0.95, 1e-8),
    # weight decay 0.1 and clipping at 1.0 (the field defaults); micro-batches of 4 sequences;
    # a checkpoint every 100 steps (``CHECKPOINT_EVERY``). lockstep's own: the batch ramp's later
    # stages, 4.7M tokens a step (1,152 sequences) from 4B tokens and 9.4M (2,304) from 360B.
    "open-1b": TrainConfig(peak_lr=4.5e-4, warmup_tokens=667 * 768 * 4096, total_tokens=400_000_000_000,
                           batch_ramp=((0, 768), (4_000_000_000, 1152), (360_000_000_000, 2304)),
                           micro_batch=4),
}

# Steps between checkpoints when none is given (``lockstep train --checkpoint-every``), by the
# model's name (a preset's, in a run's recipe): the paper's 100 for open-1b, else 50. Checkpoints
# change no published bit; they are where an audit can start a replay.
DEFAULT_CHECKPOINT_EVERY = 50
CHECKPOINT_EVERY: dict[str, int] = {"open-1b": 100}


def preset(name: str, **overrides) -> ModelConfig:
    """The named model preset (tiny, small, medium, open-1b), with optional field overrides."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides) if overrides else PRESETS[name]


def train_preset(name: str, **overrides) -> TrainConfig:
    """The named train preset (tiny, small, medium, open-1b), with optional field overrides."""
    if name not in TRAIN_PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(TRAIN_PRESETS)}")
    return dataclasses.replace(TRAIN_PRESETS[name], **overrides) if overrides else TRAIN_PRESETS[name]


def checkpoint_every(name: str) -> int:
    """The default checkpoint interval in steps for a model named ``name`` (``CHECKPOINT_EVERY``)."""
    return CHECKPOINT_EVERY.get(name, DEFAULT_CHECKPOINT_EVERY)
