"""The training state as published tensors: parameters, AdamW moments and the step counter.

A run's state after step ``t`` is exactly these tensors (what a checkpoint holds, what
the state root hashes, in this naming):

* ``param/NAME``, ``adam_m/NAME``, ``adam_v/NAME`` for every parameter ``NAME`` of
  ``params.param_specs(cfg)``: float32, of the parameter's shape;
* ``step``: int64 of shape ``(1,)``, holding ``t``.

``state_tensors`` builds the mapping from a state, ``split_state`` takes it apart, and
``state_layout_problem`` says whether a mapping read from a file is this layout for a
given model (checked after a checkpoint's digests, before any tensor is used).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .config import ModelConfig
from .params import param_specs

PREFIXES = ("param/", "adam_m/", "adam_v/")
STEP_TENSOR = "step"


@dataclass
class AdamWState:
    """AdamW's state: the number of updates applied, and the first and second moments by parameter name."""

    step: int = 0
    m: dict = field(default_factory=dict)
    v: dict = field(default_factory=dict)

    @classmethod
    def zeros(cls, params: dict) -> "AdamWState":
        return cls(0, {k: np.zeros_like(p) for k, p in params.items()}, {k: np.zeros_like(p) for k, p in params.items()})


def state_tensors(params: dict, opt: AdamWState, host: bool = True) -> dict[str, np.ndarray]:
    """The published state: parameters, AdamW moments and the step counter (host arrays; with
    ``host=False`` the arrays are left where they are, the step counter a host array)."""
    put = np.asarray if host else (lambda v: v)
    out = {f"param/{k}": put(v) for k, v in params.items()}
    out.update({f"adam_m/{k}": put(v) for k, v in opt.m.items()})
    out.update({f"adam_v/{k}": put(v) for k, v in opt.v.items()})
    out[STEP_TENSOR] = np.array([opt.step], dtype=np.int64)
    return out


def split_state(tensors: Mapping[str, np.ndarray]) -> tuple[dict, AdamWState]:
    """The inverse of ``state_tensors``: ``(params, AdamWState)``. ``ValueError`` when the names are not a state's."""
    params = {k[len("param/"):]: v for k, v in tensors.items() if k.startswith("param/")}
    m = {k[len("adam_m/"):]: v for k, v in tensors.items() if k.startswith("adam_m/")}
    v = {k[len("adam_v/"):]: v for k, v in tensors.items() if k.startswith("adam_v/")}
    if STEP_TENSOR not in tensors or set(params) != set(m) or set(params) != set(v):
        raise ValueError("checkpoint tensors are not a lockstep training state (param/, adam_m/, adam_v/, step)")
    return params, AdamWState(int(np.asarray(tensors[STEP_TENSOR]).reshape(-1)[0]), m, v)


def state_layout_problem(tensors: Mapping[str, np.ndarray], cfg: ModelConfig) -> tuple[str, str] | None:
    """``(tensor, why)`` for the first tensor that is not the state of model ``cfg`` (module docstring); else None.

    A re-forged checkpoint with consistent digests but another layout is refused by name.
    """
    want = {STEP_TENSOR: ((1,), np.dtype(np.int64))}
    for spec in param_specs(cfg):
        for prefix in PREFIXES:
            want[prefix + spec.name] = (tuple(spec.shape), np.dtype(np.float32))
    missing = [n for n in want if n not in tensors]
    if missing:
        return missing[0], (f"missing ({len(missing)} tensor(s) of the recipe's model are not in the checkpoint)")
    extra = sorted(n for n in tensors if n not in want)
    if extra:
        return extra[0], f"not a tensor of the recipe's model ({len(extra)} such)"
    for name, (shape, dtype) in want.items():
        t = tensors[name]
        if tuple(t.shape) != shape or t.dtype != dtype:
            return name, (f"{t.dtype}{list(t.shape)} where the recipe's model has {dtype}{list(shape)}; the checkpoint "
                          "is not a state of this recipe (re-forged, or from another run)")
    return None
