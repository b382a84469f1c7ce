"""Exact data movement that the model needs from a backend (no arithmetic)."""

from __future__ import annotations

import numpy as np

from . import fp
from . import shapes as S
from .kinds import F32, F32Sequence, op


@op(S.concat_last)
def concat_last(arrays: F32Sequence) -> F32:
    """Concatenate float32 arrays along the last axis (exact)."""
    return np.concatenate([fp.f32(a) for a in arrays], axis=-1)
