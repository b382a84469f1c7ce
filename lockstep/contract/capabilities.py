"""Optional capabilities a backend may offer beyond the op table, typed.

An op computes a published value and is checked against the spec. A capability
changes *how* a backend computes, never *what*: every capability must give the same
bits as the plain ops, and the trainer, the audit and ``lockstep sample`` work
(more slowly) on a backend that offers none. Each field is ``None`` when the backend
does not offer it; callers test for ``None``, never for a backend's name.

``add_into(a, b, out)``
    ``out[:] = add(a, b)`` for 1-D float32 vectors of one length, written in place
    (``out`` may be ``a`` or ``b``). The micro-batch tree and the butterfly exchange
    sum their vectors with it instead of allocating a result per add.
``weights_unchanged(memo=None)``
    A context manager: inside it, each weight array's quantized forms (column
    scales, int8 codes, the rotated transpose) are made once per array object and
    reused, the caller promising not to modify a weight while inside. A step's
    micro-batches run in one block; a generating model passes its own ``memo`` dict
    for its life.
``watch_compilation(on_first)``
    A context manager around the first step of a process: calls ``on_first()`` when
    the backend starts compiling kernels (not on a cache hit) and yields an object
    with ``kernels`` (how many were compiled) and ``seconds``.
``kernel_runtime``
    The shared-kernel runtime of a GPU-dialect backend (OpenCL, CUDA, Metal): the
    flush probe and the conformance report read its build options and device from it.
``tensor_leaves(name, x)``
    The Merkle leaf digests (``spec.hashing.leaf_digests``) of the data of a backend
    array ``x`` (its C-order elements, little-endian: what ``tensor_digest`` splits into
    chunks; the header is not in any leaf, so ``name`` does not change them), computed
    where ``x`` lives: only the 32-byte leaves cross to the host, which builds the upper
    levels (``spec.hashing.tensor_digest_from_leaves``; the state root:
    ``lockstep.backends.state_hash.device_state_root``). Offered by the GPU-dialect
    backends (OpenCL, CUDA, Metal).
``tensors_leaves(tensors)``
    ``{name: tensor_leaves(name, x)}`` for a dict of backend arrays, in as few passes as
    the backend can (the GPU backends: one launch per device buffer, every chunk of every
    tensor in it at once). ``device_state_root`` uses it when offered.
``truncated_normal(seed, name, n, bound)``
    ``spec.rng.truncated_normal(PhiloxStream(seed, "init", name), 0, n, bound)`` as a
    host float32 array, drawn by the backend (parameter init at scale).
``device_vectors``
    Float32 vectors that live where the backend computes (a GPU's memory), for a training
    state that stays there: ``empty(n)`` a new 1-D vector (contents undefined, nothing
    copied from the host), ``copy_into(dst, src)`` ``dst[...] = src`` for two backend
    arrays of one shape (the bits copied, nothing computed; ``dst`` may be a slice
    ``vector[a:b]``). A backend whose arrays are host arrays offers none: the trainer
    then keeps its vectors on the host.
``transfers``
    The backend's count of bytes copied host->device and device->host: ``phase(name)`` (a
    context manager naming what the copies inside are for: data, step, hashing, exchange,
    checkpoint) and ``take()`` (``{phase: {"in": bytes, "out": bytes}}`` since the last
    ``take``). ``metrics.jsonl`` records them per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers beyond its ops; every field optional (see the module docstring)."""

    add_into: Callable[[Any, Any, Any], Any] | None = None
    weights_unchanged: Callable[..., ContextManager[None]] | None = None
    watch_compilation: Callable[[Callable[[], None]], ContextManager[Any]] | None = None
    kernel_runtime: Any = None
    tensor_leaves: Callable[[str, Any], list[bytes]] | None = None
    tensors_leaves: Callable[[dict], dict] | None = None
    truncated_normal: Callable[[int, str, int, float], Any] | None = None
    device_vectors: Any = None
    transfers: Any = None

    def offered(self) -> list[str]:
        """The names of the capabilities this backend offers, in field order."""
        return [name for name in self.__dataclass_fields__ if getattr(self, name) is not None]


NO_CAPABILITIES = Capabilities()
