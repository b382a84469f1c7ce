"""A lockstep model in PyTorch for Hugging Face ``transformers``: the model lockstep trained, in its semantics.

``lockstep export --format hf`` copies this file into the export; ``AutoModelForCausalLM.
from_pretrained(EXPORT, trust_remote_code=True)`` loads it. It computes what lockstep's
model computes (``lockstep.train.model``, the spec's ops), op for op:

* the token embedding, then an RMSNorm with a gain (``model.embed_norm``) before the first
  block; ``y = (x * rstd) * gain``, ``rstd = 1 / sqrt(mean(x * x) + eps)``;
* per block, pre-norm: ``x = x + o_proj(attention(rmsnorm(x)))``, then
  ``x = x + down_proj(silu(gate_proj(h)) * up_proj(h))`` with ``h = rmsnorm(x)``
  (lockstep's fused gate/up GEMM is ``gate_proj`` and ``up_proj``: the columns of one
  product, so the same numbers);
* attention: GQA (query head h reads key/value head ``h // (H / G)``), QK-norm (an RMSNorm
  over the head dimension, without a gain) and then RoPE on half-split pairs (pair i is
  elements i and i + Dh/2, frequency ``theta ** (-2 i / Dh)``, tables built in float64 and
  rounded to float32), scores times ``1 / sqrt(Dh)`` (float32), softmax over the allowed
  keys: key j <= query i and, in a local layer, ``i - j < attention_window``;
  ``full_attention_layers`` are fully causal;
* the final RMSNorm and the untied LM head, float32.

int8 W8A8 (``config.quantize``), lockstep's forward exactly: per output channel the weight
scale ``sw = 2 * mean(|w|) / sqrt(127)`` and the codes ``clip(round_half_even(w / sw),
-127, 127)``, stored in the export as ``weight_scale`` and ``weight_int8`` (the very codes
and scales lockstep computed with, so no weight code can differ); per tensor the activation
scale ``sx = max|x| / 127`` over the whole input tensor (every token of the batch, as in
lockstep's training and evaluation) and the codes likewise; a scale below the smallest
normal float32 (an all-zero tensor) becomes 1, NaN codes 0. The integer product is computed
exactly (``integer_matmul``), then ``y = (acc * sx) * sw``, each product rounded once in
float32: given the same input, an int8 layer gives lockstep's output bit for bit.
With ``quantize`` attention's P.V is int8 too, as in ``spec.attention_forward_int8``: the
probabilities quantized with the fixed scale ``1/127`` (round half to even, codes 0 .. 127),
V per (batch, KV head, channel) with ``max_j |v| / 127`` over the sequence's positions, the
integer contraction exactly and one rescale ``acc * (scale_p * scale_v)``; a cached decode
step's P.V is float32, as in ``lockstep sample``.

Semantics, not bits: the float32 sums (norms, softmax, the LM head's contractions) and
``exp``, ``silu``, ``cos``/``sin`` are PyTorch's, in PyTorch's order, not the spec's fixed
orders and functions, so values differ from lockstep's in the last bits, and through them,
rarely, an activation code by one step. lockstep's own commands (``lockstep sample``,
``lockstep eval``) give the bits every backend agrees on.

Generation: a KV cache of every position (never a sliding one: keys are indexed by
absolute position). A decoded token's int8 activation scale is its own, as in
``lockstep sample``. lockstep puts its end-of-document token (``config.eod_token_id``)
before every document, so a prompt is ``[eod_token_id] + tokens``; the model was trained on
``max_position_embeddings`` positions and nothing past them.

Fine-tuning (``model.train()``): the int8 layers run straight-through fake quantization
from the current float32 ``weight`` (the codes recomputed each forward); after training
call ``model.requantize()`` so the stored codes and scales follow the new weights.
"""

import math
import struct

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_lockstep import LockstepConfig

try:  # transformers' initializers skip tensors already loaded from the checkpoint
    from transformers import initialization as init
except ImportError:  # pragma: no cover - older transformers
    from torch.nn import init

QMAX = 127.0  # symmetric int8: codes in [-127, 127]
SMALLEST_NORMAL = 2.0 ** -126  # a scale below this (lockstep flushes it to 0) becomes 1
EXACT_K = 1024  # a float32 sum of at most 1040 products of codes (<= 127 * 127 each) stays an exact integer


def f32(x: float) -> float:
    """x rounded to float32 (nearest, ties to even)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def attention_scale(head_dim: int) -> float:
    """``1 / sqrt(Dh)`` as lockstep computes it: a float32 square root, then a float32 division (float64 then
    float32 gives the correctly rounded float32 result of each: 53 >= 2 * 24 + 2 bits)."""
    return f32(1.0 / f32(math.sqrt(head_dim)))


def _cache_field(cls) -> str:
    """The name transformers gives the cache in an output (``cache`` from 5.x, ``past_key_values`` before)."""
    return "cache" if "cache" in getattr(cls, "__dataclass_fields__", {}) else "past_key_values"


def rms_norm(x, gain, eps: float):
    """``(x * rstd) * gain`` with ``rstd = 1 / sqrt(mean(x * x) + eps)`` over the last axis; without a gain
    (QK-norm) ``x * rstd``."""
    rstd = 1.0 / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    y = x * rstd
    return y * gain if gain is not None else y


def nonzero_scale(s):
    """A scale below the smallest normal float32 (0 after lockstep's flush) becomes 1."""
    return torch.where(s < SMALLEST_NORMAL, torch.ones_like(s), s)


def activation_scale(x):
    """``max|x| / 127`` over every element of x, one float32 division."""
    return nonzero_scale(x.abs().amax() / QMAX)


def weight_scale(w):
    """Per output channel of w (out, in): ``(2 * (sum_k |w[n, k]| / K)) / sqrt(127)``, float32."""
    sqrt_qmax = torch.sqrt(torch.tensor(QMAX, dtype=torch.float32, device=w.device))
    return nonzero_scale((2.0 * (w.abs().sum(-1) / w.shape[-1])) / sqrt_qmax)


def quantize(x, scale):
    """``clip(round_half_even(x / scale), -127, 127)`` as float32 integers; NaN gives 0."""
    q = torch.round(x / scale)
    return torch.where(torch.isnan(q), torch.zeros_like(q), q).clamp(-QMAX, QMAX)


def integer_matmul(a, b):
    """``a @ b.T`` for integer-valued float32 a (..., K) and b (N, K) with |values| <= 127, exactly.

    Up to ``EXACT_K`` products every partial sum is an integer below 2**24, so any order of a
    float32 GEMM is exact; a longer K is cut into such pieces whose sums are added in int64.
    The integer total is rounded once to float32 (to nearest, ties to even), as lockstep's
    int32 -> float32 conversion is.
    """
    k = a.shape[-1]
    if k <= EXACT_K:
        return F.linear(a, b)
    acc = None
    for k0 in range(0, k, EXACT_K):
        part = F.linear(a[..., k0:k0 + EXACT_K], b[:, k0:k0 + EXACT_K]).to(torch.int64)
        acc = part if acc is None else acc + part
    return acc.to(torch.float32)


P_SCALE = f32(1.0 / QMAX)  # the probabilities' fixed scale: they lie in [0, 1], codes 0 .. 127


def value_scale(v, key_mask=None):
    """Per (batch, KV head, channel) of v (B, G, T, Dh): ``max_j |v[j, d]| / 127`` over the T positions
    (padding keys of ``key_mask`` left out), a flushed scale becoming 1. (B, G, 1, Dh)."""
    a = v.abs()
    if key_mask is not None:
        a = a.masked_fill(~key_mask[:, None, :v.shape[2], None], 0.0)
    return nonzero_scale(a.amax(-2, keepdim=True) / QMAX)


def int8_pv(p, v, n_kv: int, key_mask=None):
    """P.V as lockstep's int8 recipe computes it (``attention_forward_int8``): ``pq = quantize(p, 1/127)``
    (codes 0 .. 127), ``vq = quantize(v, sv)`` with ``sv = value_scale(v)``, the integer contraction
    ``acc = pq @ vq`` exactly, then ``o = acc * (P_SCALE * sv)`` (one rounded product). p (B, H, T, n),
    v (B, H, n, Dh) with its G = ``n_kv`` KV heads repeated."""
    h = p.shape[1]
    vg = v[:, :: h // n_kv]                                                        # (B, G, n, Dh): each KV head once
    sv = value_scale(vg, key_mask).repeat_interleave(h // n_kv, dim=1)             # (B, H, 1, Dh)
    pq = quantize(p, P_SCALE)
    vq = quantize(v, sv)
    k = p.shape[-1]
    if k <= EXACT_K:  # every partial sum an integer below 2**24: exact in any order
        acc = pq @ vq
    else:
        acc = sum((pq[..., k0:k0 + EXACT_K] @ vq[..., k0:k0 + EXACT_K, :]).to(torch.int64)
                  for k0 in range(0, k, EXACT_K)).to(torch.float32)
    return acc * (P_SCALE * sv)


class LockstepLinear(nn.Linear):
    """A linear layer without bias, ``y = x @ weight.T``: float32, or int8 W8A8 (module docstring)."""

    def __init__(self, in_features: int, out_features: int, quantized: bool):
        super().__init__(in_features, out_features, bias=False)
        self.quantized = quantized
        if quantized:
            self.register_buffer("weight_int8", torch.zeros(out_features, in_features, dtype=torch.int8))
            self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32))

    def forward(self, x):
        x = x.float()
        if not self.quantized:
            return F.linear(x, self.weight.float())
        sx = activation_scale(x)
        xq = quantize(x, sx)
        if self.training and torch.is_grad_enabled():  # straight-through, from the current weights
            w = self.weight.float()
            sw = weight_scale(w)[:, None]
            xdq = x + (xq * sx - x).detach()
            wdq = w + (quantize(w, sw) * sw - w).detach()
            return F.linear(xdq, wdq)
        acc = integer_matmul(xq, self.weight_int8.float())
        return (acc * sx) * self.weight_scale.float()

    @torch.no_grad()
    def requantize(self) -> None:
        """Codes and scales from the current ``weight`` (PyTorch's sum for the mean, not lockstep's lane tree)."""
        if self.quantized:
            w = self.weight.float()
            sw = weight_scale(w)
            self.weight_scale.copy_(sw)
            self.weight_int8.copy_(quantize(w, sw[:, None]).to(torch.int8))


class LockstepRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x.float(), self.weight.float(), self.eps)


def rope_tables(positions, head_dim: int, theta: float):
    """``(cos, sin)`` (B, 1, T, Dh/2) for positions (B, T): ``f_i = theta ** (-(2 i) / Dh)``, angle ``t * f_i``,
    in float64 on the CPU, each value rounded once to float32."""
    half = head_dim // 2
    i = torch.arange(half, dtype=torch.float64)
    freq = torch.pow(torch.tensor(float(theta), dtype=torch.float64), -(2.0 * i) / float(head_dim))
    angle = positions.detach().to("cpu", torch.float64)[..., None] * freq
    return (torch.cos(angle).float()[:, None].to(positions.device),
            torch.sin(angle).float()[:, None].to(positions.device))


def apply_rope(x, cos, sin):
    """``y1 = x1 cos - x2 sin``, ``y2 = x2 cos + x1 sin`` with ``x1, x2`` the halves of the last axis."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class LockstepAttention(nn.Module):
    def __init__(self, config: LockstepConfig, layer_idx: int):
        super().__init__()
        d, h, g, dh = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.layer_idx, self.h, self.g, self.dh, self.eps = layer_idx, h, g, dh, config.rms_norm_eps
        full = layer_idx in config.full_attention_layers or not config.attention_window  # a window of 0: none
        self.window = None if full else config.attention_window
        self.scale = attention_scale(dh)
        q = config.quantize
        self.quantized = q
        self.q_proj = LockstepLinear(d, h * dh, q)
        self.k_proj = LockstepLinear(d, g * dh, q)
        self.v_proj = LockstepLinear(d, g * dh, q)
        self.o_proj = LockstepLinear(h * dh, d, q)

    def forward(self, x, cos, sin, key_mask, cache):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.dh).transpose(1, 2)                 # (B, H, T, Dh)
        k = self.k_proj(x).view(b, t, self.g, self.dh).transpose(1, 2)                 # (B, G, T, Dh)
        v = self.v_proj(x).view(b, t, self.g, self.dh).transpose(1, 2)
        q = apply_rope(rms_norm(q, None, self.eps), cos, sin)
        k = apply_rope(rms_norm(k, None, self.eps), cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)                                   # every position so far
        n = k.shape[2]
        k = k.repeat_interleave(self.h // self.g, dim=1)                               # (B, H, n, Dh)
        v = v.repeat_interleave(self.h // self.g, dim=1)
        s = (q @ k.transpose(-1, -2)) * self.scale                                     # (B, H, T, n)
        i = torch.arange(n - t, n, device=x.device)[:, None]                           # the queries' positions
        j = torch.arange(n, device=x.device)[None, :]
        allowed = j <= i
        if self.window is not None:
            allowed = allowed & (i - j < self.window)
        allowed = allowed[None, None]
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, None, :n]
        s = s.masked_fill(~allowed, float("-inf"))
        m = s.amax(-1, keepdim=True)
        e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))     # masked keys: exp(-inf) = 0
        l = e.sum(-1, keepdim=True)
        p = e / torch.where(l > 0, l, torch.ones_like(l))
        if self.quantized and n == t:  # the training attention: int8 P.V (a decode step's P.V is float32)
            o = int8_pv(p, v, self.g, key_mask)
        else:
            o = p @ v
        o = o.transpose(1, 2).reshape(b, t, self.h * self.dh)
        return self.o_proj(o)


class LockstepMLP(nn.Module):
    def __init__(self, config: LockstepConfig):
        super().__init__()
        d, f, q = config.hidden_size, config.intermediate_size, config.quantize
        self.gate_proj = LockstepLinear(d, f, q)
        self.up_proj = LockstepLinear(d, f, q)
        self.down_proj = LockstepLinear(f, d, q)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LockstepDecoderLayer(nn.Module):
    def __init__(self, config: LockstepConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = LockstepRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LockstepAttention(config, layer_idx)
        self.post_attention_layernorm = LockstepRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LockstepMLP(config)

    def forward(self, x, cos, sin, key_mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, key_mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LockstepPreTrainedModel(PreTrainedModel):
    config_class = LockstepConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["LockstepDecoderLayer"]
    _supports_cache_class = True

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, LockstepRMSNorm):
            init.ones_(module.weight)


class LockstepModel(LockstepPreTrainedModel):
    def __init__(self, config: LockstepConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_norm = LockstepRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(LockstepDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LockstepRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        use_cache = use_cache if use_cache is not None else getattr(self.config, "use_cache", True)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        x = x.float()
        b, t = x.shape[:2]
        if use_cache and cache is None:
            cache = DynamicCache()
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = (torch.arange(t, device=x.device) + past)[None].expand(b, t)
        key_mask = None
        if attention_mask is not None:
            if attention_mask.dim() != 2:
                raise ValueError("this model takes a 2-D attention_mask (batch, keys) of 1 (attend) and 0 (padding)")
            key_mask = attention_mask.bool()
        cos, sin = rope_tables(position_ids, self.config.head_dim, self.config.rope_theta)
        x = self.embed_norm(x)
        for layer in self.layers:
            x = layer(x, cos, sin, key_mask, cache)
        x = self.norm(x)
        return BaseModelOutputWithPast(last_hidden_state=x,
                                       **{_cache_field(BaseModelOutputWithPast): cache if use_cache else None})


class LockstepForCausalLM(LockstepPreTrainedModel, GenerationMixin):
    def __init__(self, config: LockstepConfig):
        super().__init__(config)
        self.model = LockstepModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def requantize(self) -> None:
        """Every int8 layer's codes and scales from its current float32 weight (after fine-tuning)."""
        for module in self.modules():
            if isinstance(module, LockstepLinear):
                module.requantize()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        """Logits (B, T, V), float32; with ``labels`` also the mean cross-entropy of ``labels[:, 1:]`` given the
        logits of positions ``:-1`` (ignore index -100; no z-loss: lockstep's evaluation has none either)."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache if cache is not None else past_key_values, inputs_embeds=inputs_embeds,
                         use_cache=use_cache)
        field = _cache_field(type(out))
        h = out.last_hidden_state
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        logits = F.linear(h, self.lm_head.weight.float())
        loss = None
        if labels is not None:
            v = logits.shape[-1]
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, v), labels[:, 1:].reshape(-1).to(logits.device),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits,
                                      **{_cache_field(CausalLMOutputWithPast): getattr(out, field)})
