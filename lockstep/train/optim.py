"""The optimizer step: global-norm clipping, then AdamW, through a backend.

Host scalars are computed in float64 and rounded once to float32:
``bc1 = 1 - beta1**t``, ``bc2 = 1 - beta2**t`` (``hostmath.pow``), ``1 - beta``.
"""

from __future__ import annotations


import numpy as np

from lockstep.errors import LockstepError
from lockstep.spec import hostmath

from lockstep.formats.config import ModelConfig, TrainConfig
from lockstep.formats.params import param_specs
from lockstep.formats.state import AdamWState


class NonFiniteError(LockstepError, FloatingPointError):
    """A loss or gradient was NaN or infinite: training stops before it enters the state."""


def host_scalars(tcfg: TrainConfig, t: int) -> dict:
    """Float32 scalars of AdamW step t (1-based), each computed in float64 and rounded once."""
    f = np.float32
    return {
        "beta1": f(tcfg.beta1), "beta2": f(tcfg.beta2),
        "one_minus_beta1": f(1.0 - float(tcfg.beta1)), "one_minus_beta2": f(1.0 - float(tcfg.beta2)),
        "eps": f(tcfg.eps),
        "bc1": f(1.0 - hostmath.pow(float(tcfg.beta1), float(t))),
        "bc2": f(1.0 - hostmath.pow(float(tcfg.beta2), float(t))),
    }


def optimizer_step(params: dict, grads: dict, state: AdamWState, cfg: ModelConfig, tcfg: TrainConfig,
                   lr: np.float32, backend, *, place=None, release=None):
    """Clip and apply AdamW. Returns ``(params, state, grad_norm)`` (new dicts; inputs untouched).

    ``place(kind, name, value)``, when given, receives each new moment (``kind`` "m" or
    "v") as soon as its tensor is updated and returns the array the new state holds
    instead (``scratch.MomentFiles``: a copy in a memory-mapped file); the bits are the
    backend's. ``release(gradient)``, when given, is called after each pass has read a
    gradient (its sum of squares, then its update): an out-of-core step sum hands that
    tensor's pages back (``scratch.ScratchSpace.release``), so the sum is never all in RAM.

    1. ``s_i = sum_of_squares(g_i)`` per tensor; ``norm = global_norm(s)`` over the
       tensors in canonical parameter order (``param_specs``).
    2. A non-finite norm raises ``NonFiniteError`` naming the first non-finite tensor.
    3. ``c = clip_coefficient(norm, grad_clip)``; if ``c < 1`` every gradient becomes ``g * c``.
    4. ``adamw_update`` per tensor, with weight decay only where the spec says.
    """
    be = backend
    specs = param_specs(cfg)
    done = release if release is not None else (lambda g: None)
    sums = []
    for s in specs:
        sums.append(be.sum_of_squares(grads[s.name]))
        done(grads[s.name])
    norm = be.global_norm(sums)
    if not np.isfinite(float(be.to_numpy(norm))):
        bad = next((s.name for s, v in zip(specs, sums) if not np.isfinite(float(be.to_numpy(v)))), "?")
        raise NonFiniteError(f"non-finite gradient norm at optimizer step {state.step + 1} (first bad tensor: {bad})")
    coef = be.clip_coefficient(norm, float(tcfg.grad_clip))
    clip = float(be.to_numpy(coef)) < 1.0
    t = state.step + 1
    hs = host_scalars(tcfg, t)
    lr = np.float32(lr)
    wd = np.float32(tcfg.weight_decay)
    new_p, new_m, new_v = {}, {}, {}
    for s in specs:
        g = be.scale(grads[s.name], coef) if clip else grads[s.name]
        new_p[s.name], new_m[s.name], new_v[s.name] = be.adamw_update(
            params[s.name], g, state.m[s.name], state.v[s.name], lr,
            hs["beta1"], hs["beta2"], hs["one_minus_beta1"], hs["one_minus_beta2"], hs["eps"],
            wd if s.decay else np.float32(0.0), hs["bc1"], hs["bc2"])
        done(grads[s.name])
        if place is not None:
            new_m[s.name] = place("m", s.name, be.to_numpy(new_m[s.name]))
            new_v[s.name] = place("v", s.name, be.to_numpy(new_v[s.name]))
    return new_p, AdamWState(t, new_m, new_v), norm
