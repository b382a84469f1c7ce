"""A straightforward, non-reproducible float32 NumPy/BLAS implementation of lockstep's model.

The yardstick of the reproducibility tax (``bench_numba.py``): the same
architecture as ``lockstep.train.model`` (RMSNorm on the embedding, pre-norm
blocks, GQA with QK-norm without gain and RoPE, fused SwiGLU, sliding-window
layers, z-loss, untied head) with quantization off, written the way one would
write it without caring about bits: ``np.matmul`` (BLAS, any order, FMA),
``np.exp``/``np.log``, ``np.sum``, dense masked attention, in-place updates.
Forward, hand-written backward, global-norm clipping and AdamW.

It is checked against the spec (``quantize=False``) by ``check_against_spec``:
losses and gradients agree to float32 rounding noise, which is all one can ask
of it, and that is what the benchmark runs before timing anything.

Legend: B sequences, T positions, D model width, H query heads, G KV heads,
R = H / G, Dh head dim, F FFN width, V vocabulary, N = B*T.
"""

from __future__ import annotations

import numpy as np

from lockstep.formats.config import ModelConfig, TrainConfig
from lockstep.formats.params import param_specs
from lockstep.train.model import _merge_heads as merge_heads  # reshapes only: no arithmetic to differ in
from lockstep.train.model import _rope as rope_tables  # the same float32 tables as the real model
from lockstep.train.model import _split_heads as split_heads

F32 = np.float32


def rms_forward(x, gain, eps):
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps))
    y = x * rstd
    return (y * gain if gain is not None else y), rstd


def rms_backward(dy, x, gain, rstd):
    xhat = x * rstd
    gy = dy * gain if gain is not None else dy
    m = np.mean(gy * xhat, axis=-1, keepdims=True)
    dx = rstd * (gy - xhat * m)
    dgain = np.sum((dy * xhat).reshape(-1, x.shape[-1]), axis=0) if gain is not None else None
    return dx, dgain


def rope(x, cos, sin, sign):
    p = x.shape[-1] // 2
    x1, x2 = x[..., :p], x[..., p:]
    if sign > 0:
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return np.concatenate([x1 * cos + x2 * sin, x2 * cos - x1 * sin], axis=-1)


def mask_bias(t: int, window: int | None) -> np.ndarray:
    i = np.arange(t)[:, None]
    j = np.arange(t)[None, :]
    allowed = j <= i
    if window is not None and window > 0:
        allowed &= (i - j) < window
    return np.where(allowed, F32(0.0), F32(-np.inf)).astype(F32)


def attention_forward(q, k, v, bias, scale):
    """q (B,H,T,Dh), k/v (B,G,T,Dh): heads of a group batched as (B, G, R*T, Dh)."""
    b, h, t, dh = q.shape
    g = k.shape[1]
    qg = q.reshape(b, g, (h // g) * t, dh)
    s = np.matmul(qg, k.transpose(0, 1, 3, 2)) * scale            # (B, G, R*T, T)
    s = s.reshape(b, g, h // g, t, t) + bias
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    p = p.reshape(b, g, (h // g) * t, t)
    o = np.matmul(p, v)                                            # (B, G, R*T, Dh)
    return o.reshape(b, h, t, dh), p


def attention_backward(do, q, k, v, o, p, scale):
    b, h, t, dh = q.shape
    g = k.shape[1]
    dog = do.reshape(b, g, (h // g) * t, dh)
    qg = q.reshape(b, g, (h // g) * t, dh)
    dp = np.matmul(dog, v.transpose(0, 1, 3, 2))
    d = np.sum(dog * o.reshape(dog.shape), axis=-1, keepdims=True)
    ds = p * (dp - d) * scale
    dq = np.matmul(ds, k).reshape(b, h, t, dh)
    dk = np.matmul(ds.transpose(0, 1, 3, 2), qg)
    dv = np.matmul(p.transpose(0, 1, 3, 2), dog)
    return dq, dk, dv


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def loss_and_grads(params: dict, windows, cfg: ModelConfig, n_global: int | None = None):
    """Loss and gradients of one micro-batch, as ``lockstep.train.model.loss_and_grads`` (quantization off)."""
    windows = np.asarray(windows)
    inputs = windows[:, :-1]
    targets = windows[:, 1:].reshape(-1)
    bsz, t = inputs.shape
    n = bsz * t
    inv_n = F32(1.0 / (n if n_global is None else n_global))
    h, g, dh, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    cos, sin = rope_tables(t, dh, cfg.rope_theta)
    scale = F32(1.0 / np.sqrt(dh))
    eps = cfg.norm_eps
    P = params

    x0 = P["embed"][inputs]
    x, r0 = rms_forward(x0, P["embed_norm.gain"], eps)
    saved = []
    for i in range(cfg.n_layers):
        pre = f"layers.{i:02d}."
        bias = mask_bias(t, cfg.window(i))
        a, r1 = rms_forward(x, P[pre + "attn_norm.gain"], eps)
        qkv = a @ P[pre + "attn.wqkv"]
        q = split_heads(qkv[..., : h * dh], h, dh)
        k = split_heads(qkv[..., h * dh:(h + g) * dh], g, dh)
        v = np.ascontiguousarray(split_heads(qkv[..., (h + g) * dh:], g, dh))
        qn, rq = rms_forward(q, None, eps)
        kn, rk = rms_forward(k, None, eps)
        qr = rope(qn, cos, sin, 1)
        kr = rope(kn, cos, sin, 1)
        o, p = attention_forward(qr, kr, v, bias, scale)
        o2 = merge_heads(o)
        x_mid = x + o2 @ P[pre + "attn.wo"]
        f, r2 = rms_forward(x_mid, P[pre + "ffn_norm.gain"], eps)
        gu = f @ P[pre + "ffn.w_gate_up"]
        ff = cfg.ffn_dim
        sg = sigmoid(gu[..., :ff])
        silu = gu[..., :ff] * sg
        hh = silu * gu[..., ff:]
        x_out = x_mid + hh @ P[pre + "ffn.w_down"]
        saved.append((x, a, r1, q, k, v, rq, rk, qr, kr, o, p, o2, x_mid, f, r2, gu, sg, silu, hh))
        x = x_out
    xf, rf = rms_forward(x, P["final_norm.gain"], eps)
    xf2 = xf.reshape(n, d)
    logits = xf2 @ P["lm_head"]
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=-1, keepdims=True)
    lse = m + np.log(s)
    rows = np.arange(n)
    per_token = lse[:, 0] - logits[rows, targets] + F32(cfg.z_loss) * lse[:, 0] ** 2
    loss = F32(per_token.sum() * inv_n)

    grads = {}
    dlogits = (e / s) * (1.0 + F32(2.0 * cfg.z_loss) * lse)
    dlogits[rows, targets] -= 1.0
    dlogits *= inv_n
    grads["lm_head"] = xf2.T @ dlogits
    dxf = (dlogits @ P["lm_head"].T).reshape(bsz, t, d)
    dx, grads["final_norm.gain"] = rms_backward(dxf, x, P["final_norm.gain"], rf)
    for i in reversed(range(cfg.n_layers)):
        pre = f"layers.{i:02d}."
        (x_in, a, r1, q, k, v, rq, rk, qr, kr, o, p, o2, x_mid, f, r2, gu, sg, silu, hh) = saved[i]
        ff = cfg.ffn_dim
        dh2 = dx.reshape(n, d)
        grads[pre + "ffn.w_down"] = hh.reshape(n, ff).T @ dh2
        dhh = dx @ P[pre + "ffn.w_down"].T
        gate, up = gu[..., :ff], gu[..., ff:]
        dgu = np.concatenate([dhh * up * (sg * (1.0 + gate * (1.0 - sg))), dhh * silu], axis=-1)
        grads[pre + "ffn.w_gate_up"] = f.reshape(n, d).T @ dgu.reshape(n, 2 * ff)
        df = dgu @ P[pre + "ffn.w_gate_up"].T
        dxm, grads[pre + "ffn_norm.gain"] = rms_backward(df, x_mid, P[pre + "ffn_norm.gain"], r2)
        dx = dx + dxm
        grads[pre + "attn.wo"] = o2.reshape(n, h * dh).T @ dx.reshape(n, d)
        do = split_heads(dx @ P[pre + "attn.wo"].T, h, dh)
        dqr, dkr, dv = attention_backward(do, qr, kr, v, o, p, scale)
        dq, _ = rms_backward(rope(dqr, cos, sin, -1), q, None, rq)
        dk, _ = rms_backward(rope(dkr, cos, sin, -1), k, None, rk)
        dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
        grads[pre + "attn.wqkv"] = a.reshape(n, d).T @ dqkv.reshape(n, -1)
        da = dqkv @ P[pre + "attn.wqkv"].T
        dxi, grads[pre + "attn_norm.gain"] = rms_backward(da, x_in, P[pre + "attn_norm.gain"], r1)
        dx = dx + dxi
    dx0, grads["embed_norm.gain"] = rms_backward(dx, x0, P["embed_norm.gain"], r0)
    gemb = np.zeros_like(P["embed"])
    np.add.at(gemb, inputs.reshape(-1), dx0.reshape(n, d))
    grads["embed"] = gemb
    return loss, {k: v.astype(F32, copy=False) for k, v in grads.items()}


def optimizer_step(params: dict, grads: dict, state: dict, cfg: ModelConfig, tcfg: TrainConfig, lr: float):
    """Global-norm clipping and AdamW, in place. ``state``: {"step", "m", "v"}."""
    specs = param_specs(cfg)
    norm = float(np.sqrt(sum(float(np.vdot(grads[s.name], grads[s.name])) for s in specs)))
    coef = min(1.0, tcfg.grad_clip / (norm + 1e-6))
    t = state["step"] = state["step"] + 1
    b1, b2 = tcfg.beta1, tcfg.beta2
    bc1, bc2 = 1.0 - b1**t, 1.0 - b2**t
    for s in specs:
        p, g, m, v = params[s.name], grads[s.name], state["m"][s.name], state["v"][s.name]
        if coef < 1.0:
            g = g * F32(coef)
        m *= F32(b1)
        m += F32(1.0 - b1) * g
        v *= F32(b2)
        v += F32(1.0 - b2) * (g * g)
        u = (m / F32(bc1)) / (np.sqrt(v / F32(bc2)) + F32(tcfg.eps))
        if s.decay:
            u += F32(tcfg.weight_decay) * p
        p -= F32(lr) * u
    return norm


def zero_state(params: dict) -> dict:
    return {"step": 0, "m": {k: np.zeros_like(p) for k, p in params.items()},
            "v": {k: np.zeros_like(p) for k, p in params.items()}}


def check_against_spec(cfg: ModelConfig, windows, params: dict, backend) -> dict:
    """Loss and per-tensor gradient relative errors of this baseline against ``backend`` (quantize off)."""
    from lockstep.train.model import loss_and_grads as real_loss_and_grads

    if cfg.quantize:
        raise ValueError("the baseline has no quantization: compare with quantize=False")
    loss_ref, grads_ref = real_loss_and_grads(params, windows, cfg, backend)
    loss, grads = loss_and_grads({k: np.array(v) for k, v in params.items()}, windows, cfg)
    errs = {}
    for name, gr in grads_ref.items():
        gr = np.asarray(gr, dtype=np.float64)
        errs[name] = float(np.linalg.norm(grads[name] - gr) / max(np.linalg.norm(gr), 1e-30))
    return {"loss": float(loss), "loss_ref": float(np.asarray(loss_ref)), "max_grad_rel_err": max(errs.values()),
            "worst": max(errs, key=errs.get)}
