"""``concat_last`` (``lockstep.spec.layout``): exact data movement, canonicalized like ``spec.fp.f32``."""

from __future__ import annotations

import numpy as np

from .reduce import canon_inplace


def concat_last(arrays) -> np.ndarray:
    """Concatenate float32 arrays along the last axis; every element flushed, NaNs canonical."""
    out = np.concatenate([np.asarray(a, dtype=np.float32) for a in arrays], axis=-1)
    out = np.ascontiguousarray(out)
    if out.size:
        canon_inplace(out.reshape(-1))
    return out
