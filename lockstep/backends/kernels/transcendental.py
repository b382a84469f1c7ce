"""Host side of ``transcendental.kc`` (``lockstep/spec/transcendental.py``): exp, log, sigmoid, silu.

Each is one grid-stride kernel applying ``ls_exp``/``ls_log``/``ls_sigmoid``/``ls_silu`` of ``ls_fp.h``
(the spec's sequence of ``+ - * /`` and exact bit operations, line for line) per element.
"""

from __future__ import annotations

from .fp import FpOps, unary_op

KERNELS = {"exp": "ls_exp_kernel", "log": "ls_log_kernel", "sigmoid": "ls_sigmoid_kernel", "silu": "ls_silu_kernel"}


class TranscendentalOps(FpOps):
    """The ops of ``spec.transcendental`` (set from ``KERNELS``)."""


for _op, _kernel in KERNELS.items():
    setattr(TranscendentalOps, _op, unary_op("transcendental", _op, _kernel))
