"""Text from a trained model: a KV cache, and sampling from Philox keyed by the seed.

Every number goes through backend ops in the spec's orders, so a prompt, a checkpoint
and a seed give the same tokens on every backend.

The model, as trained
---------------------
*Prefill*: the context (at most ``seq_len`` tokens) runs through the training forward
(``model.block_forward`` with the training attention) as one sequence; its logits are
``model.logits_forward``'s, bit for bit, and each layer's keys (after QK-norm and
RoPE) and values are kept in the cache. *Decode*: each new token runs the same block
ops on one position, with ``cached_attention`` in place of the training attention.
With float32 linears a decoded position's logits equal the training forward's at that
position bit for bit. With int8 W8A8 (``quantize``) an activation scale is taken per
tensor, as in training: in the prefill over the context, in a decode step over the one
new position (a per-token scale, as any int8 server with dynamic scales computes it);
the prefill's attention is the training one (int8 P.V with ``quantize``), a decode step's
P.V is ``decode_attention``'s float32 contraction in either case.

The context holds at most ``seq_len`` tokens, the length the model was trained on:
when it is full, it keeps its last ``seq_len // 2`` tokens, which are prefilled again
at positions ``0 ..`` (so generation can run past ``seq_len``).

``cached_attention`` is the backend's ``decode_attention`` (``spec.attention.decode_attention``,
which defines its order): the last query over the cached keys ``0 .. n-1``, the last row of
``spec.attention_forward`` with the keys outside the window absent.

Sampling
--------
Generated token number ``i`` (0, 1, ...) is chosen from the logits ``z`` (V values;
only ids below the tokenizer's vocabulary size, and with ``top_k`` only the k largest
logits, ties to the lower id, are candidates):

* temperature 0: ``argmax`` (the first maximum);
* otherwise the Gumbel-max trick, which draws from ``softmax(z / T)`` exactly::

      u[v] = uniform_open(PhiloxStream(seed, "lockstep.sample")[i*V + v])   # in (0, 1), exact
      g[v] = -log(-log(u[v]))                                                # spec log
      token = argmax over candidates v of (z[v] / T + g[v])

  with ``T`` rounded once to float32. No softmax, cumulative sum or float sum is
  needed, so nothing but the spec's ``div``, ``log``, ``neg``, ``add`` and the exact
  ``argmax`` decides the token.
"""

from __future__ import annotations

import contextlib

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from lockstep.errors import LockstepError, Setting
from lockstep.formats.config import ModelConfig
from lockstep.formats.params import param_specs
from lockstep.spec.philox import PhiloxStream, uniform_open_from_uint32
from lockstep.train.memory import budget_words, memory_budget
from lockstep.train.model import _rope, block_forward, device_params, embed_forward, head_forward, training_attention

SAMPLE_PURPOSE = "lockstep.sample"


class SamplingError(LockstepError, ValueError):
    """Bad sampling settings or a model output that cannot be sampled from."""


# ---------------------------------------------------------------- attention over the cache

def cached_attention(be, qr, k_cache: np.ndarray, v_cache: np.ndarray, n: int, window: int | None):
    """The last query's attention over keys ``0 .. n-1`` of the cache: ``be.decode_attention``.

    qr: (1, H, 1, Dh); k_cache, v_cache: (G, capacity, Dh), positions ``0 .. n-1`` filled.
    Returns ``(o (1, H, 1, Dh), None, None)``: the shape ``block_forward``'s ``attend`` returns.
    """
    h, dh = qr.shape[1], qr.shape[3]
    o = be.decode_attention(qr.reshape(h, dh), k_cache, v_cache, n, window)
    return o.reshape(1, h, 1, dh), None, None


# ---------------------------------------------------------------- the model with a cache

class CachedModel:
    """A model's parameters on a backend, with a KV cache of ``seq_len`` positions.

    The parameters must not be modified while the model is used: a backend may keep
    their quantized forms across calls (the numba backend's ``weights_unchanged`` extra:
    each weight is quantized once, not once per generated token; the same bits).
    """

    def __init__(self, params: dict, cfg: ModelConfig, backend):
        self.cfg, self.be = cfg, backend
        self.P = device_params(params, backend)
        keep = backend.capabilities.weights_unchanged
        self._weight_forms: dict = {}
        self._same_weights = (lambda: keep(self._weight_forms)) if keep is not None else contextlib.nullcontext
        cos, sin = _rope(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
        self.cos, self.sin = backend.asarray(cos), backend.asarray(sin)
        shape = (cfg.n_kv_heads, cfg.seq_len, cfg.head_dim)
        self.k = [np.zeros(shape, dtype=np.float32) for _ in range(cfg.n_layers)]
        self.v = [np.zeros(shape, dtype=np.float32) for _ in range(cfg.n_layers)]
        self.length = 0  # positions filled

    def _store(self, layer: int, at: int, kr, v) -> None:
        kr = np.asarray(self.be.to_numpy(kr))[0]  # (G, T, Dh)
        v = np.asarray(self.be.to_numpy(v))[0]
        self.k[layer][:, at : at + kr.shape[1]] = kr
        self.v[layer][:, at : at + v.shape[1]] = v

    def prefill(self, ids) -> np.ndarray:
        """Run the context ``ids`` (1 .. seq_len tokens) from position 0: logits (T, V) on the host."""
        be, cfg = self.be, self.cfg
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        t = ids.shape[1]
        if not 1 <= t <= cfg.seq_len:
            raise ValueError(f"a context holds 1 .. {cfg.seq_len} tokens, got {t}")

        training = training_attention(be, cfg)

        def attend(layer, qr, kr, v, window):
            self._store(layer, 0, kr, v)
            return training(layer, qr, kr, v, window)

        with self._same_weights():
            _, x, _ = embed_forward(be, cfg, self.P, ids)
            for layer in range(cfg.n_layers):
                x, _ = block_forward(be, cfg, self.P, layer, x, self.cos[:t], self.sin[:t], attend)
            logits = head_forward(be, cfg, self.P, x)[3]
        self.length = t
        return np.asarray(be.to_numpy(logits))

    def decode(self, token: int) -> np.ndarray:
        """Append ``token`` at the next position: its logits (V,) on the host."""
        be, cfg = self.be, self.cfg
        pos = self.length
        if pos >= cfg.seq_len:
            raise ValueError(f"the cache is full ({cfg.seq_len} positions); prefill a shorter context")

        def attend(layer, qr, kr, v, window):
            self._store(layer, pos, kr, v)
            return cached_attention(be, qr, self.k[layer], self.v[layer], pos + 1, window)

        with self._same_weights():
            _, x, _ = embed_forward(be, cfg, self.P, np.array([[int(token)]], dtype=np.int64))
            for layer in range(cfg.n_layers):
                x, _ = block_forward(be, cfg, self.P, layer, x, self.cos[pos : pos + 1], self.sin[pos : pos + 1],
                                     attend)
            logits = head_forward(be, cfg, self.P, x)[3]
        self.length = pos + 1
        return np.asarray(be.to_numpy(logits)).reshape(-1)


def sample_memory_estimate(cfg: ModelConfig, prompt_tokens: int, max_new_tokens: int) -> int:
    """Bytes generating ``max_new_tokens`` after a prompt of ``prompt_tokens`` needs, roughly (an order of magnitude).

    The parameters three times (the host's, the backend's, the int8 forms), the KV cache of
    ``seq_len`` positions (float32 keys and values per layer), the RoPE tables of ``seq_len``
    positions (built on the host in float64: ``spec.rope.rope_tables`` keeps about 134 bytes
    of temporaries per position and pair at its peak; 160 are counted), and the largest
    prefill: the context (the end-of-document token and the prompt, or half the sequence
    length when generation fills the cache) through the training forward: about 16
    d_model + 4 ffn_dim values per token and layer, the attention scores (heads x T^2,
    twice) and 3 x vocab logits per token, float32.
    """
    params = sum(int(np.prod(s.shape)) for s in param_specs(cfg))
    kv = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.seq_len * cfg.head_dim * 4
    rope = 160 * cfg.seq_len * (cfg.head_dim // 2)
    t = min(cfg.seq_len, prompt_tokens + 1)
    if prompt_tokens + 1 + max_new_tokens > cfg.seq_len:
        t = max(t, cfg.seq_len // 2)
    acts = 4 * (t * (16 * cfg.d_model + 4 * cfg.ffn_dim) + 2 * cfg.n_heads * t * t + 3 * t * cfg.vocab_size)
    return 3 * 4 * params + kv + rope + acts


def require_sample_memory(cfg: ModelConfig, prompt_tokens: int, max_new_tokens: int, *,
                          max_memory: float | None = None) -> None:
    """``SamplingError`` when ``sample_memory_estimate`` is beyond ``max_memory`` GiB (default: this machine's
    memory, or the address-space limit): refused before anything is allocated, as replay refuses a recipe too
    large to replay."""
    need, have = sample_memory_estimate(cfg, prompt_tokens, max_new_tokens), memory_budget(max_memory)
    if have is not None and need > have:
        raise SamplingError.naming(f"the recipe's model ({cfg.n_layers} layers, d_model {cfg.d_model}, seq_len "
                                   f"{cfg.seq_len}, vocab {cfg.vocab_size}) needs about {need / 2**30:,.1f} GiB to "
                                   "sample from; ", *budget_words(have, max_memory), ": use a machine with more memory")


# ---------------------------------------------------------------- sampling

@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.8
    top_k: int | None = None     # None or 0: every candidate
    seed: int = 0

    def check(self) -> "Sampling":
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not np.isfinite(t) or t < 0:
            raise SamplingError.naming(Setting("temperature"), f" must be a finite number >= 0, got {t!r}")
        if t > 0 and not np.float32(t) > 0:
            raise SamplingError.naming(Setting("temperature"), f" {t!r} rounds to 0 in float32; use 0 for greedy "
                                       "decoding")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0):
            raise SamplingError.naming(Setting("top_k"), f" must be a non-negative integer, got {self.top_k!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
            raise SamplingError.naming(Setting("seed"), f" must be an integer in [0, 2**64), got {self.seed!r}")
        return self


def total_order_key(x: np.ndarray) -> np.ndarray:
    """int64 keys that sort float32 values in the total order -0.0 < +0.0 (exact, no float math)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    return np.where(u >= 0x80000000, 0x7FFFFFFF - u, u)


def candidates(logits: np.ndarray, n_ids: int, top_k: int | None) -> np.ndarray:
    """Boolean (V,): the ids that may be chosen (ids < n_ids; with top_k the k largest logits,
    ties to the lower id)."""
    allowed = np.zeros(logits.shape[0], dtype=bool)
    allowed[:n_ids] = True
    if top_k:
        ids = np.arange(n_ids)
        order = np.lexsort((ids, -total_order_key(logits[:n_ids])))  # exact: integer keys, then ids
        allowed[:] = False
        allowed[order[:top_k]] = True
    return allowed


def gumbel_noise(be, seed: int, index: int, vocab: int):
    """``-log(-log(u))`` for generated token ``index`` (module docstring), V values."""
    u = uniform_open_from_uint32(PhiloxStream(seed, SAMPLE_PURPOSE).uint32(index * vocab, vocab))
    return be.neg(be.log(be.neg(be.log(u))))


def choose(be, logits: np.ndarray, index: int, n_ids: int, s: Sampling) -> int:
    """Generated token number ``index`` from its logits (V,) (module docstring)."""
    logits = np.asarray(logits, dtype=np.float32).reshape(-1)
    if np.isnan(logits).any():  # exact test, no arithmetic
        raise SamplingError(f"the model's logits for generated token {index} contain NaN; the checkpoint is unusable")
    allowed = candidates(logits, n_ids, s.top_k)
    if s.temperature == 0:
        score = logits
    else:
        z = be.div(logits, np.float32(s.temperature))
        score = np.asarray(be.to_numpy(be.add(z, gumbel_noise(be, s.seed, index, logits.shape[0]))))
    masked = np.where(allowed, score, np.float32(-np.inf)).astype(np.float32)
    return int(np.asarray(be.to_numpy(be.argmax(masked))).reshape(-1)[0])


def generate(model: CachedModel, prompt_ids: list[int], max_new_tokens: int, n_ids: int, sampling: Sampling,
             stop_id: int | None = None) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` tokens after ``prompt_ids`` (1 .. seq_len tokens); stop after
    yielding ``stop_id`` (the end of a document) when given."""
    sampling.check()
    cfg = model.cfg
    context = [int(t) for t in prompt_ids]
    if not 1 <= len(context) <= cfg.seq_len:
        raise SamplingError(f"the prompt must be 1 .. {cfg.seq_len} tokens here, got {len(context)}")
    logits = model.prefill(context)[-1]
    for i in range(max_new_tokens):
        token = choose(model.be, logits, i, n_ids, sampling)
        yield token
        if stop_id is not None and token == stop_id or i == max_new_tokens - 1:
            return
        context.append(token)
        if model.length == cfg.seq_len:  # full: keep the last half, prefill it again
            context = context[-(cfg.seq_len // 2):]
            logits = model.prefill(context)[-1]
        else:
            logits = model.decode(token)
