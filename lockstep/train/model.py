"""The Open-1B model, written once against the backend contract (``lockstep.contract``).

Decoder-only; no biases; untied embedding and LM head; RMSNorm on the embedding
output; pre-norm RMSNorm blocks; GQA with QK-norm (no gain) and RoPE; SwiGLU with
a fused gate/up GEMM; sliding-window attention except every 5th layer and the
last; z-loss. Attention and feed-forward linears are int8 W8A8 when
``cfg.quantize`` (the default), float32 contractions otherwise; with ``cfg.quantize``
attention's P.V is an int8 contraction and its dQ 64-bit fixed point too
(``attention_forward_int8``, ``attention_backward_int8``), else the float ops.

Legend: B sequences in the micro-batch, T positions, D d_model, H query heads,
G KV heads, Dh head dim, F FFN width, V vocabulary, N = B*T tokens.

Every op goes through ``be`` (a ``lockstep.backends.Backend``), so every backend
runs this same code; only data movement (reshape, transpose, slicing) happens here.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from lockstep.spec import fp
from lockstep.spec.philox import PhiloxStream
from lockstep.spec.rope import rope_tables

from lockstep.formats.config import ModelConfig
from lockstep.formats.params import param_specs

from .execution import IN_MEMORY, Execution


def init_params(cfg: ModelConfig, seed: int, backend=None, progress=None) -> dict[str, np.ndarray]:
    """Parameters from Philox streams keyed by (seed, "init", parameter name) only.

    A matrix is ``fp.mul(truncated_normal(PhiloxStream(seed, "init", name), 0, n,
    bound=2.0), float32(std))``: one rounded product per element, the float64 std
    (``init_std``, or ``init_std / sqrt(2 * n_layers)`` for ``attn.wo`` and
    ``ffn.w_down``) rounded to float32 once; gains are ones. Every name, shape, std
    and the exact order of the std's float64 arithmetic: ``lockstep.formats.params``.
    Adding a parameter never changes another, since each has its own stream. Host
    (NumPy) arrays.

    The spec (``spec.rng.truncated_normal``, ``spec.fp.mul``) defines the values. A
    ``backend`` that offers the ``truncated_normal`` capability draws them itself
    (and multiplies by std with its own ``mul`` op): the same bits, much faster
    (Open-1B's 1.6B values). ``progress(done, total)``, if given, is called after
    each parameter with the element counts.
    """
    from lockstep.spec.rng import truncated_normal

    specs = param_specs(cfg)
    total = sum(int(np.prod(s.shape)) for s in specs)
    draw = backend.capabilities.truncated_normal if backend is not None else None
    params = {}
    done = 0
    for s in specs:
        n = int(np.prod(s.shape))
        if s.init == "ones":
            params[s.name] = np.ones(s.shape, dtype=np.float32)
        elif draw is not None:
            z = draw(seed, s.name, n, 2.0)
            params[s.name] = np.asarray(backend.to_numpy(backend.mul(backend.asarray(z), np.float32(s.std))),
                                        dtype=np.float32).reshape(s.shape)
        else:
            z = truncated_normal(PhiloxStream(seed, "init", s.name), 0, n, bound=2.0)
            params[s.name] = fp.mul(z, np.float32(s.std)).reshape(s.shape)
        done += n
        if progress is not None:
            progress(done, total)
    return params


@functools.lru_cache(maxsize=8)
def _rope(seq_len: int, head_dim: int, theta: float):
    return rope_tables(seq_len, head_dim, theta)


def _linear_forward(be, cfg, x, w):
    return be.int8_linear_forward(x, w) if cfg.quantize else be.matmul(x, w)


def _linear_backward(be, cfg, dy, x, w):
    if cfg.quantize:
        return be.int8_linear_backward(dy, x, w, cfg.hadamard)
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1])
    return be.matmul(dy, w.T), be.matmul(x2.T, dy2)


def _split_heads(x, n_heads, head_dim):
    """(B, T, n*Dh) -> (B, n, T, Dh)."""
    b, t, _ = x.shape
    return x.reshape(b, t, n_heads, head_dim).transpose(0, 2, 1, 3)


def _merge_heads(x):
    """(B, n, T, Dh) -> (B, T, n*Dh)."""
    b, n, t, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, n * dh)


class BlockSaved(NamedTuple):
    """What one block's forward keeps for its backward (shapes for inputs (B, T))."""

    x: Any       # (B, T, D) the block's input
    a_in: Any    # (B, T, D) attention input: rmsnorm(x) with the attn_norm gain
    r1: Any      # (B, T) that norm's reciprocal RMS
    q: Any       # (B, H, T, Dh) queries before QK-norm
    k: Any       # (B, G, T, Dh) keys before QK-norm
    v: Any       # (B, G, T, Dh) values
    rq: Any      # (B, H, T) the query norm's reciprocal RMS
    rk: Any      # (B, G, T) the key norm's reciprocal RMS
    qr: Any      # (B, H, T, Dh) normed, rotated queries
    kr: Any      # (B, G, T, Dh) normed, rotated keys
    o: Any       # (B, H, T, Dh) attention output
    m: Any       # (B, H, T) attention row maxima
    l: Any       # (B, H, T) attention row sums
    o2: Any      # (B, T, H Dh) heads merged
    x_mid: Any   # (B, T, D) after the attention residual
    f_in: Any    # (B, T, D) FFN input: rmsnorm(x_mid) with the ffn_norm gain
    r2: Any      # (B, T) that norm's reciprocal RMS
    gu: Any      # (B, T, 2F) the fused gate and up projection
    hh: Any      # (B, T, F) swiglu(gu)


class ForwardSaved(NamedTuple):
    """What the whole forward keeps for ``loss_and_grads``'s backward."""

    x0: Any                   # (B, T, D) embedding output
    r0: Any                   # (B, T) the embedding norm's reciprocal RMS
    blocks: list[BlockSaved]  # one per layer, in layer order
    x: Any                    # (B, T, D) the last block's output
    rf: Any                   # (B, T) the final norm's reciprocal RMS
    xf2: Any                  # (N, D) the final norm's output, flattened
    cos: Any                  # (T, Dh/2) RoPE rows of the positions
    sin: Any


def embed_forward(be, cfg: ModelConfig, P: dict, inputs):
    """Embedding and its RMSNorm: ``(x0, x, r0)``, x of shape (B, T, D)."""
    x0 = be.embedding_forward(P["embed"], inputs)                            # (B, T, D)
    x, r0 = be.rmsnorm_forward(x0, P["embed_norm.gain"], cfg.norm_eps)
    return x0, x, r0


def _attention_forward(be, cfg):
    """The attention op of the recipe: ``attention_forward_int8`` with ``cfg.quantize``, else ``attention_forward``."""
    return be.attention_forward_int8 if cfg.quantize else be.attention_forward


def _attention_backward(be, cfg):
    """The backward of ``_attention_forward``'s op."""
    return be.attention_backward_int8 if cfg.quantize else be.attention_backward


def training_attention(be, cfg: ModelConfig):
    """The ``attend`` of ``block_forward`` in training: causal attention over the T positions given
    (int8 P.V with ``cfg.quantize``)."""
    forward = _attention_forward(be, cfg)
    return lambda layer, qr, kr, v, window: forward(qr, kr, v, window)


def block_forward(be, cfg: ModelConfig, P: dict, layer: int, x, cos, sin, attend):
    """Block ``layer`` on x (B, T, D): ``(x_out, saved)``.

    ``cos``/``sin`` are the RoPE rows of the T positions; ``attend(layer, qr, kr, v,
    window)`` returns ``(o, m, l)``: ``training_attention`` in training, a cached
    attention when generating (``lockstep.use.generate``), so both run these ops.
    ``saved`` (``BlockSaved``) holds what the backward needs.
    """
    h, g, dh, eps = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.norm_eps
    p = f"layers.{layer:02d}."
    a_in, r1 = be.rmsnorm_forward(x, P[p + "attn_norm.gain"], eps)
    qkv = _linear_forward(be, cfg, a_in, P[p + "attn.wqkv"])                    # (B, T, (H+2G)Dh)
    q = _split_heads(qkv[..., : h * dh], h, dh)                               # (B, H, T, Dh)
    k = _split_heads(qkv[..., h * dh : (h + g) * dh], g, dh)                   # (B, G, T, Dh)
    v = _split_heads(qkv[..., (h + g) * dh :], g, dh)
    qn, rq = be.rmsnorm_forward(q, None, eps)                                  # QK-norm, no gain
    kn, rk = be.rmsnorm_forward(k, None, eps)
    qr = be.rope_forward(qn, cos, sin)
    kr = be.rope_forward(kn, cos, sin)
    o, m, l = attend(layer, qr, kr, v, cfg.window(layer))
    o2 = _merge_heads(o)                                                      # (B, T, H Dh)
    x_mid = be.add(x, _linear_forward(be, cfg, o2, P[p + "attn.wo"]))
    f_in, r2 = be.rmsnorm_forward(x_mid, P[p + "ffn_norm.gain"], eps)
    gu = _linear_forward(be, cfg, f_in, P[p + "ffn.w_gate_up"])                # (B, T, 2F)
    hh = be.swiglu_forward(gu)                                                # (B, T, F)
    x_out = be.add(x_mid, _linear_forward(be, cfg, hh, P[p + "ffn.w_down"]))
    return x_out, BlockSaved(x, a_in, r1, q, k, v, rq, rk, qr, kr, o, m, l, o2, x_mid, f_in, r2, gu, hh)


def head_forward(be, cfg: ModelConfig, P: dict, x):
    """Final RMSNorm and LM head: ``(xf, rf, xf2, logits)``, logits of shape (B*T, V)."""
    xf, rf = be.rmsnorm_forward(x, P["final_norm.gain"], cfg.norm_eps)
    xf2 = xf.reshape(-1, cfg.d_model)
    return xf, rf, xf2, be.matmul(xf2, P["lm_head"])                          # (N, V)


def device_params(params: dict, backend) -> dict:
    """The parameters moved onto the backend (``asarray``), by name."""
    return {k: backend.asarray(v) for k, v in params.items()}


def forward(P: dict, inputs, cfg: ModelConfig, backend):
    """The training forward of inputs (B, T) with device parameters ``P``:
    ``(logits (B*T, V), saved)``, ``saved`` (``ForwardSaved``) being what ``loss_and_grads`` needs for the backward."""
    be = backend
    t = inputs.shape[1]
    cos, sin = _rope(t, cfg.head_dim, cfg.rope_theta)  # host tables: a device backend uploads them once
    x0, x, r0 = embed_forward(be, cfg, P, inputs)
    blocks = []
    attend = training_attention(be, cfg)
    for i in range(cfg.n_layers):
        x, saved = block_forward(be, cfg, P, i, x, cos, sin, attend)
        blocks.append(saved)
    xf, rf, xf2, logits = head_forward(be, cfg, P, x)
    return logits, ForwardSaved(x0, r0, blocks, x, rf, xf2, cos, sin)


def logits_forward(params: dict, inputs, cfg: ModelConfig, backend):
    """Logits (B*T, V) of inputs (B, T): the training forward, no backward."""
    inputs = np.ascontiguousarray(np.asarray(inputs))
    if inputs.ndim != 2 or not 1 <= inputs.shape[1] <= cfg.seq_len:
        raise ValueError(f"inputs must be (B, T) with 1 <= T <= {cfg.seq_len}, got {inputs.shape}")
    return forward(device_params(params, backend), inputs, cfg, backend)[0]


def _head_loss_and_grads(be, cfg: ModelConfig, P: dict, x, targets, inv_n, head_rows: int | None, grads: dict):
    """Final norm, LM head and loss of the last block's output x (B, T, D), and their backward:
    ``(loss_sum, dx)``; sets ``grads["lm_head"]`` and ``grads["final_norm.gain"]``.

    ``head_rows``: the N = B*T rows run in chunks of that many tokens, so no (N, V) array
    exists. The same bits as the whole (``None``): logits, per-token losses, lse, dlogits and
    dxf are row by row; the loss sum is the lane tree of the N per-token losses in order
    (``spec.loss.cross_entropy_forward``'s definition); the LM head's weight gradient, a
    contraction over tokens, continues in ascending order from chunk to chunk
    (``matmul_accumulate``); the final norm's gain gradient is one column sum over all rows.
    """
    bsz, t, d = x.shape
    n = bsz * t
    xf, rf = be.rmsnorm_forward(x, P["final_norm.gain"], cfg.norm_eps)
    xf2 = xf.reshape(-1, d)
    w = P["lm_head"]
    if head_rows is None or head_rows >= n:
        logits = be.matmul(xf2, w)                                             # (N, V)
        loss_sum, lse = be.cross_entropy_forward(logits, targets, cfg.z_loss)
        dlogits = be.cross_entropy_backward(logits, targets, lse, cfg.z_loss, inv_n)
        del logits
        grads["lm_head"] = be.matmul(xf2.T, dlogits)
        dxf = be.matmul(dlogits, w.T)
    else:
        losses, dxf_t, g = [], [], None
        for r0 in range(0, n, head_rows):
            r1 = min(n, r0 + head_rows)
            rows, tc = xf2[r0:r1], targets[r0:r1]
            logits = be.matmul(rows, w)                                        # (rows, V)
            per_token, lse = be.cross_entropy_rows(logits, tc, cfg.z_loss)
            dlogits = be.cross_entropy_backward(logits, tc, lse, cfg.z_loss, inv_n)
            del logits
            g = be.matmul(rows.T, dlogits) if g is None else be.matmul_accumulate(g, rows.T, dlogits)
            dxf_t.append(be.matmul(dlogits, w.T).T)                            # (D, rows)
            losses.append(per_token)
            del dlogits
        grads["lm_head"] = g
        loss_sum = be.lane_tree_sum(be.concat_last(losses))
        dxf = be.concat_last(dxf_t).T                                          # (N, D)
    dx, grads["final_norm.gain"] = be.rmsnorm_backward(dxf.reshape(bsz, t, d), x, P["final_norm.gain"], rf)
    return loss_sum, dx


class _Gradients(dict):
    """The backward's gradients by name: kept (a dict), or each handed to ``sink(name, gradient)`` as
    soon as it is set and not kept (``loss_and_grads``'s ``grad_sink``)."""

    def __init__(self, sink=None):
        super().__init__()
        self._sink = sink

    def __setitem__(self, name, g):
        if self._sink is None:
            super().__setitem__(name, g)
        else:
            self._sink(name, g)


def loss_and_grads(params: dict, windows, cfg: ModelConfig, backend, n_global: int | None = None,
                   execution: Execution = IN_MEMORY, grad_sink=None):
    """Loss and gradients of one micro-batch: ``(loss, grads)``.

    ``windows`` is an int array (B, T+1): inputs ``[:, :-1]``, targets ``[:, 1:]``.
    Both the loss and the gradients are this micro-batch's *contribution* to the
    mean over ``n_global`` target tokens (default: this micro-batch's B*T): the
    loss is ``lane_tree_sum(per-token losses) * (1 / n_global)``, and the
    gradients are those of that number. Summing the contributions of a step's
    micro-batches with the spec's tree (``spec.tree``, on any number of ranks)
    gives the global batch's.

    ``execution`` (``train.execution``) chooses how much memory this holds, never a bit:
    ``recompute`` keeps only each block's input through the forward and recomputes the
    block (``block_forward``, the same ops on the same inputs) just before its backward;
    ``head_rows`` runs the final norm, LM head and loss in row chunks
    (``_head_loss_and_grads``). ``execution.scratch`` is not read here.

    ``grad_sink(name, gradient)``, if given, receives each parameter's gradient as soon as
    the backward has finished it (the LM head's first, the embedding's last), and the
    returned dict is empty: the caller (``step.micro_batch_value``) copies each into the
    micro-batch's vector, so the gradients are never all alive at once. The same ops on
    the same values either way.
    """
    be = backend
    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[1] != cfg.seq_len + 1:
        raise ValueError(f"windows must be (B, {cfg.seq_len + 1}), got {windows.shape}")
    inputs = np.ascontiguousarray(windows[:, :-1])
    targets = np.ascontiguousarray(windows[:, 1:]).reshape(-1)
    bsz, t = inputs.shape
    n = bsz * t
    inv_n = fp.div(np.float32(1.0), np.float32(n if n_global is None else n_global))[()]
    h, dh = cfg.n_heads, cfg.head_dim
    P = device_params(params, be)

    # ---- forward: every block's saved activations, or (recompute) only its input
    cos, sin = _rope(t, cfg.head_dim, cfg.rope_theta)  # host tables: a device backend uploads them once
    x0, x, r0 = embed_forward(be, cfg, P, inputs)
    attend = training_attention(be, cfg)
    kept = []                                   # BlockSaved per layer, or the block's input x
    for i in range(cfg.n_layers):
        x_in = x
        x, saved = block_forward(be, cfg, P, i, x, cos, sin, attend)
        kept.append(x_in if execution.recompute else saved)
        del saved

    # ---- head and loss, forward and backward
    grads = _Gradients(grad_sink)
    loss_sum, dx = _head_loss_and_grads(be, cfg, P, x, targets, inv_n, execution.head_rows, grads)
    loss = be.mul(loss_sum, inv_n)
    del x

    # ---- backward of the blocks
    for i in reversed(range(cfg.n_layers)):
        p = f"layers.{i:02d}."
        window = cfg.window(i)
        b = block_forward(be, cfg, P, i, kept[i], cos, sin, attend)[1] if execution.recompute else kept[i]
        kept[i] = None                                                        # dropped once differentiated
        dhh, grads[p + "ffn.w_down"] = _linear_backward(be, cfg, dx, b.hh, P[p + "ffn.w_down"])
        dgu = be.swiglu_backward(dhh, b.gu)
        df_in, grads[p + "ffn.w_gate_up"] = _linear_backward(be, cfg, dgu, b.f_in, P[p + "ffn.w_gate_up"])
        dxm, grads[p + "ffn_norm.gain"] = be.rmsnorm_backward(df_in, b.x_mid, P[p + "ffn_norm.gain"], b.r2)
        dx = be.add(dx, dxm)                                                  # residual first, then branch
        do2, grads[p + "attn.wo"] = _linear_backward(be, cfg, dx, b.o2, P[p + "attn.wo"])
        do = _split_heads(do2, h, dh)
        dqr, dkr, dv = _attention_backward(be, cfg)(do, b.qr, b.kr, b.v, b.o, b.m, b.l, window)
        dq, _ = be.rmsnorm_backward(be.rope_backward(dqr, cos, sin), b.q, None, b.rq)
        dk, _ = be.rmsnorm_backward(be.rope_backward(dkr, cos, sin), b.k, None, b.rk)
        dqkv = be.concat_last([_merge_heads(dq), _merge_heads(dk), _merge_heads(dv)])
        da_in, grads[p + "attn.wqkv"] = _linear_backward(be, cfg, dqkv, b.a_in, P[p + "attn.wqkv"])
        dxi, grads[p + "attn_norm.gain"] = be.rmsnorm_backward(da_in, b.x, P[p + "attn_norm.gain"], b.r1)
        dx = be.add(dx, dxi)
        del b
    dx0, grads["embed_norm.gain"] = be.rmsnorm_backward(dx, x0, P["embed_norm.gain"], r0)
    grads["embed"] = be.embedding_backward(dx0, inputs, cfg.vocab_size)
    return loss, dict(grads)
