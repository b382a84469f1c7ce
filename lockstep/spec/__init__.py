"""lockstep.spec: the definition of every number lockstep publishes.

Slow, plain NumPy, written to be read. Arithmetic contract (see ``fp``):
IEEE float32, each ``+ - * / sqrt`` rounded separately (never an FMA), results
with ``0 < |r| < 2**-126`` flushed to a zero of their sign after rounding,
every NaN the canonical ``0x7FC00000``, one written order for every float sum
(``reduce``; ``tree`` for the sum of a step's micro-batches, whatever the number of
ranks), transcendentals built from those five operations
(``transcendental``), random numbers from Philox4x32-10 only (``philox``).
No BLAS, libm, ``np.sum``/``np.dot``/``np.matmul`` on floats or ``np.random`` (the rule, not a call)
decides a bit. Integer GEMMs are exact and may use anything.

The module is itself a backend: ``OPS`` names the op table that every backend
(``lockstep.backends``) mirrors one to one, and the conformance suite compares
``getattr(backend, op)`` with ``getattr(spec, op)`` byte for byte.
"""

from .fp import abs, add, div, f32, maximum, minimum, mul, neg, sqrt, sub
from .philox import PhiloxStream, philox4x32
from .reduce import argmax, column_sum, int8_matmul, lane_tree_sum, matmul, matmul_accumulate, max
from .transcendental import exp, log, sigmoid, silu
from .attention import (attention_backward, attention_backward_int8, attention_forward, attention_forward_int8,
                        decode_attention)
from .embedding import embedding_backward, embedding_forward
from .layout import concat_last
from .loss import cross_entropy_backward, cross_entropy_forward, cross_entropy_rows
from .norm import rmsnorm_backward, rmsnorm_forward
from .optim import adamw_update, clip_coefficient, global_norm, scale, sum_of_squares
from .quant import int8_linear_backward, int8_linear_forward
from .rope import rope_backward, rope_forward
from .swiglu import swiglu_backward, swiglu_forward

# Bump whenever what any op computes changes, or the hashes that publish it (``hashing``: the
# state root, the chain); regenerate the golden vectors with
# ``python -m lockstep.conformance.golden --write`` in the same commit.
# 2: the chain link H_t binds the tokens and the bits of loss, grad norm and lr.
# 3: a 0-d tensor hashes with ndim 0 (it hashed as shape (1,)); H_0 binds the recipe's
#    genesis fields (no lockstep_version, model.name, data.folder; settings in full).
# 4: the int8 recipe (``quantize``) computes attention's P.V as an int8 contraction and its dQ
#    in 64-bit fixed point (``attention_forward_int8``, ``attention_backward_int8``).
SPEC_VERSION = "4"

# The op table: every backend implements these names, in this order, with the signatures
# that the backend contract (``lockstep.contract``, the layer above the spec) types;
# ``tests/test_contract.py`` checks that the two lists are the same.
OPS: tuple[str, ...] = (
    # elementwise arithmetic (fp)
    "add", "sub", "mul", "div", "sqrt", "neg", "abs", "maximum", "minimum",
    # transcendentals built from + - * / (transcendental)
    "exp", "log", "sigmoid", "silu",
    # reductions and contractions (reduce), random bits (philox), layout
    "lane_tree_sum", "matmul", "int8_matmul", "max", "argmax", "philox4x32", "concat_last", "column_sum",
    # the model's ops, forward and backward
    "embedding_forward", "embedding_backward", "rmsnorm_forward", "rmsnorm_backward",
    "rope_forward", "rope_backward", "attention_forward", "attention_backward",
    "decode_attention", "swiglu_forward", "swiglu_backward", "int8_linear_forward", "int8_linear_backward",
    "cross_entropy_forward", "cross_entropy_backward",
    # the optimizer (optim)
    "sum_of_squares", "global_norm", "clip_coefficient", "scale", "adamw_update",
    # a step's memory in row chunks (the same bits as the whole-tensor ops)
    "matmul_accumulate", "cross_entropy_rows",
    # added with SPEC_VERSION 4 (issue 36): attention in the int8 recipe
    "attention_forward_int8", "attention_backward_int8",
)

__all__ = ["SPEC_VERSION", "OPS", "PhiloxStream", "f32", *OPS]
