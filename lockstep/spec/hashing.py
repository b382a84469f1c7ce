"""Canonical tensor bytes, Merkle tensor digests, the state root and the step chain.

Everything here is SHA-256 over bytes whose layout is written down below, so any
language can recompute it. Multi-byte integers are little-endian.

* Canonical header of a tensor::

      b"lockstep.tensor.v1\\0" || u32 len(name) || name (UTF-8)
      || u32 len(dtype) || dtype (NumPy ``str``, little-endian form, e.g. ``<f4``)
      || u32 ndim || u64 shape[0] || ... || u64 shape[ndim-1]

  followed by the data: the C-order elements, little-endian. The shape is the
  array's own: a 0-d array (a NumPy scalar array) has ``ndim 0`` and no shape words,
  so it never shares bytes with the shape-(1,) or (1, 1) array of the same element.
* Merkle digest of the data: split it into chunks of ``CHUNK_BYTES`` (1 MiB; the
  last may be shorter; an empty tensor has one empty chunk). Leaf i is
  ``SHA-256(0x00 || u64 i || chunk_i)``; a parent is ``SHA-256(0x01 || left || right)``;
  a level with an odd count carries its last node up unchanged.
* Tensor digest: ``SHA-256(header || u64 data_length || merkle_root)``. The header is in no
  leaf, so the leaves can be hashed where the data lives and the digest finished from them
  (``tensor_digest_from_leaves``; ``lockstep.backends.state_hash`` does it for device arrays).
* State root: ``SHA-256(b"lockstep.state.v1\\0" || u32 n || (u32 len(name) || name ||
  tensor_digest) for each tensor in ascending order of UTF-8 name bytes)``.
* Chain: ``H_t = SHA-256(b"lockstep.chain.v2\\0" || u64 t || H_{t-1} || state_root_t ||
  batch_digest_t || u64 tokens_t || u32 loss_bits_t || u32 grad_norm_bits_t ||
  u32 lr_bits_t)``, where ``tokens_t`` is the tokens consumed after step t and the
  three ``*_bits`` are the float32 bit patterns of the step's loss, gradient norm
  (before clipping) and learning rate: exactly what the trajectory record publishes,
  so an edited loss curve breaks the chain. ``H_0 = SHA-256(b"lockstep.genesis.v1\\0"
  || recipe_digest || manifest_digest || u32 len(SPEC_VERSION) || SPEC_VERSION)``
  (``genesis_hash``: what each of the three is).
* Array digest (``array_digest``): a *plain* ``SHA-256(header || data)`` of the
  canonical bytes under the empty name, not the Merkle tensor digest. (The
  trajectory's batch digests are not array digests: ``lockstep.formats.stream.batch_digest``
  writes its own layout, ``SHA-256(b"lockstep.batch-digest.v1\\0" || b"int32" || u64 ndim
  || u64 shape[...] || int32 values)``.)

Leaves are hashed on a thread pool (hashlib releases the GIL on large buffers), so
digests of big states use every core; the result does not depend on the thread count.
"""

from __future__ import annotations

import hashlib
import math
import os
import string
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np

CHUNK_BYTES = 1 << 20
TENSOR_DOMAIN = b"lockstep.tensor.v1\x00"
STATE_DOMAIN = b"lockstep.state.v1\x00"
CHAIN_DOMAIN = b"lockstep.chain.v2\x00"  # the link that binds tokens, loss, grad norm and lr
GENESIS_DOMAIN = b"lockstep.genesis.v1\x00"
LEAF_TAG = b"\x00"
NODE_TAG = b"\x01"

_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="lockstep-hash")
    return _POOL


def _le_contiguous(x: np.ndarray) -> np.ndarray:
    """The array as C-contiguous little-endian, its shape kept (a view when it already is).

    Not ``np.ascontiguousarray``: that returns a 0-d array as shape ``(1,)``, and the
    header must say ``ndim 0``.
    """
    x = np.asarray(x)
    if x.dtype.byteorder == ">" or (x.dtype.byteorder == "=" and not np.little_endian):
        x = x.astype(x.dtype.newbyteorder("<"))
    return x if x.flags.c_contiguous else x.copy(order="C")


def dtype_name(dtype) -> str:
    """The canonical dtype string: NumPy's ``str`` of the little-endian form (``<f4``, ``|i1``)."""
    dt = np.dtype(dtype)
    if dt.hasobject or dt.fields is not None:
        raise TypeError(f"only plain numeric dtypes can be hashed, got {dt}")
    return dt.newbyteorder("<").str if dt.byteorder not in ("|",) else dt.str


def tensor_header(name: str, x: np.ndarray) -> bytes:
    """The canonical header bytes of tensor ``name`` (see the module docstring)."""
    return header_of(name, x.dtype, x.shape)


def header_of(name: str, dtype, shape) -> bytes:
    """The canonical header of a tensor named ``name`` of ``dtype`` and ``shape`` (no data needed)."""
    nb = name.encode("utf-8")
    db = dtype_name(dtype).encode("ascii")
    shape = tuple(int(s) for s in shape)
    parts = [TENSOR_DOMAIN, struct.pack("<I", len(nb)), nb, struct.pack("<I", len(db)), db]
    parts.append(struct.pack("<I", len(shape)))
    parts.extend(struct.pack("<Q", s) for s in shape)
    return b"".join(parts)


def canonical_bytes(name: str, x: np.ndarray) -> bytes:
    """Header followed by the little-endian C-order data."""
    x = _le_contiguous(x)
    return tensor_header(name, x) + x.tobytes()


def _leaf(i: int, chunk: memoryview) -> bytes:
    h = hashlib.sha256(LEAF_TAG + struct.pack("<Q", i))
    h.update(chunk)
    return h.digest()


def leaf_digests(data: memoryview | bytes, chunk_bytes: int = CHUNK_BYTES) -> list[bytes]:
    """The Merkle leaves of a byte string: ``SHA-256(0x00 || u64 i || chunk_i)``."""
    mv = memoryview(data).cast("B")
    n = len(mv)
    if n == 0:
        return [_leaf(0, mv)]
    starts = range(0, n, chunk_bytes)
    if n <= 4 * chunk_bytes:
        return [_leaf(i, mv[s : s + chunk_bytes]) for i, s in enumerate(starts)]
    return list(_pool().map(lambda a: _leaf(a[0], mv[a[1] : a[1] + chunk_bytes]), enumerate(starts)))


def merkle_root(leaves: list[bytes]) -> bytes:
    """Fold leaves pairwise, left to right, level by level; an odd last node moves up as is."""
    level = list(leaves)
    while len(level) > 1:
        nxt = [hashlib.sha256(NODE_TAG + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def tensor_digest(name: str, x: np.ndarray) -> bytes:
    """32-byte digest of tensor ``name``: ``SHA-256(header || u64 nbytes || merkle_root)``."""
    x = _le_contiguous(x)
    data = memoryview(x.reshape(-1).view(np.uint8)) if x.size else memoryview(b"")
    root = merkle_root(leaf_digests(data))
    return hashlib.sha256(tensor_header(name, x) + struct.pack("<Q", x.nbytes) + root).digest()


def tensor_digest_from_leaves(name: str, dtype, shape, leaves: list[bytes]) -> bytes:
    """``tensor_digest`` from the tensor's Merkle leaves (``leaf_digests`` of its data, computed
    wherever the data lives): ``SHA-256(header || u64 nbytes || merkle_root(leaves))``.

    The leaf count must be the one the data's length implies (``max(1, ceil(nbytes / CHUNK_BYTES))``)
    and every leaf 32 bytes, else ``ValueError``: a wrong count would give another root silently."""
    dt = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"tensor {name!r}: negative dimension in shape {shape}")
    nbytes = math.prod(shape) * dt.itemsize
    leaves = list(leaves)
    want = max(1, -(-nbytes // CHUNK_BYTES))
    if len(leaves) != want:
        raise ValueError(f"tensor {name!r}: {len(leaves)} leaf digests for {nbytes} bytes of data (expected {want})")
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, (bytes, bytearray)) or len(leaf) != 32:
            raise ValueError(f"tensor {name!r}: leaf {i} is not a 32-byte digest")
    root = merkle_root([bytes(leaf) for leaf in leaves])
    return hashlib.sha256(header_of(name, dt, shape) + struct.pack("<Q", nbytes) + root).digest()


def state_root_from_digests(digests: dict[str, bytes | str]) -> str:
    """The state root (hex) from already computed tensor digests (raw or hex), by name."""
    names = sorted(digests, key=lambda n: n.encode("utf-8"))
    h = hashlib.sha256(STATE_DOMAIN + struct.pack("<I", len(names)))
    for name in names:
        nb = name.encode("utf-8")
        h.update(struct.pack("<I", len(nb)) + nb + _b32(digests[name], f"digest of {name!r}"))
    return h.hexdigest()


def state_root_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    """32-byte state root over all tensors, in ascending order of UTF-8 name bytes."""
    return bytes.fromhex(state_root_from_digests({n: tensor_digest(n, x) for n, x in tensors.items()}))


def state_root(tensors: dict[str, np.ndarray]) -> str:
    """The state root as lowercase hex."""
    return state_root_bytes(tensors).hex()


def tensor_digests(tensors: dict[str, np.ndarray]) -> dict[str, str]:
    """Hex digest of every tensor (used to name which tensor differs)."""
    return {name: tensor_digest(name, x).hex() for name, x in tensors.items()}


def chunk_digests(name: str, x: np.ndarray) -> list[str]:
    """Hex Merkle leaves of one tensor (used to name the first chunk that differs)."""
    x = _le_contiguous(x)
    data = memoryview(x.reshape(-1).view(np.uint8)) if x.size else memoryview(b"")
    return [d.hex() for d in leaf_digests(data)]


def _b32(h: str | bytes, what: str) -> bytes:
    if not isinstance(h, (str, bytes, bytearray, memoryview)):  # bytes(10**12) would allocate a terabyte
        raise TypeError(f"{what} must be 64 hex digits or 32 bytes, got a {type(h).__name__}")
    b = bytes.fromhex(h) if isinstance(h, str) else bytes(h)
    if len(b) != 32:
        raise ValueError(f"{what} must be 32 bytes (64 hex digits), got {len(b)} bytes")
    return b


def genesis_hash(recipe_digest: str | bytes, manifest_digest: str | bytes, spec_version: str) -> str:
    """``H_0`` (hex): ``SHA-256(b"lockstep.genesis.v1\\0" || recipe_digest || manifest_digest
    || u32 len(spec_version) || spec_version (UTF-8))``.

    * ``recipe_digest`` (32 bytes): SHA-256 of the canonical JSON (``fsio.json_bytes``:
      keys sorted, 2-space indent, UTF-8, a final newline) of the recipe's *genesis
      fields* (``lockstep.formats.recipe.genesis_recipe``): the recipe with every field
      that changes no trained bit taken out (``lockstep_version``, ``model.name``,
      ``data.folder``) and every model/train setting written out in full, defaults
      included, floats as floats, and the settings the ops read only as float32
      (``recipe.FLOAT32_SETTINGS``: ``norm_eps``, ``z_loss``, ``eps``, ``weight_decay``,
      ``grad_clip``) as that float32. So neither a cosmetic edit nor an equivalent spelling
      of a setting gives a new H_0 (a trainer could otherwise re-link
      the chain under many H_0 to pick an audit plan). It is not the digest of the
      recipe file's bytes (that one, ``recipe.recipe_digest``, binds checkpoints to
      their run).
    * ``manifest_digest`` (32 bytes): the data manifest's SHA-256, as the recipe's
      ``data.manifest_sha256`` records it (``lockstep.formats.manifest``).
    * ``spec_version``: the recipe's ``spec_version`` string.
    """
    if not isinstance(spec_version, str):
        raise TypeError(f"spec_version must be a string, got a {type(spec_version).__name__}")
    sv = spec_version.encode("utf-8")
    body = _b32(recipe_digest, "recipe digest") + _b32(manifest_digest, "manifest digest")
    return hashlib.sha256(GENESIS_DOMAIN + body + struct.pack("<I", len(sv)) + sv).hexdigest()


def float32_bits(x) -> int:
    """The bit pattern of a float32 (a NumPy float32, a Python float rounded once, or ``"0x3F800000"``)."""
    if isinstance(x, str):
        if len(x) != 10 or not x.startswith("0x") or not all(c in string.hexdigits for c in x[2:]):
            raise ValueError(f"float32 bits must look like 0x3F800000, got {x!r}")  # int() would take "0x-1234567"
        return int(x[2:], 16)
    try:
        return int(np.asarray(np.float32(x)).view(np.uint32))
    except OverflowError:  # a Python int beyond any float
        raise ValueError("an integer beyond the float32 range is not a float32 value") from None


def chain_hash(step: int, prev: str | bytes, state_root_hex: str | bytes, batch_digest: str | bytes, tokens: int,
               loss_bits, grad_norm_bits, lr_bits) -> str:
    """``H_t`` (hex): ``SHA-256(domain || u64 t || H_{t-1} || state_root_t || batch_digest_t || u64 tokens_t
    || u32 loss_bits || u32 grad_norm_bits || u32 lr_bits)``; bits as ``float32_bits`` accepts them."""
    if not 0 <= int(step) < 2**64:
        raise ValueError(f"step out of range: {step}")
    if type(tokens) is not int or not 0 <= tokens < 2**64:
        raise ValueError(f"tokens must be an integer in [0, 2**64), got {tokens!r}")
    body = _b32(prev, "previous chain hash") + _b32(state_root_hex, "state root") + _b32(batch_digest, "batch digest")
    floats = struct.pack("<III", float32_bits(loss_bits), float32_bits(grad_norm_bits), float32_bits(lr_bits))
    return hashlib.sha256(CHAIN_DOMAIN + struct.pack("<Q", int(step)) + body + struct.pack("<Q", tokens)
                          + floats).hexdigest()


def record_chain_hash(prev: str | bytes, record: dict) -> str:
    """``H_t`` of a trajectory record (``step``, ``state_root``, ``batch_digest``, ``tokens``, ``loss_bits``,
    ``grad_norm_bits``, ``lr_bits``), given ``H_{t-1}``."""
    return chain_hash(record["step"], prev, record["state_root"], record["batch_digest"], record["tokens"],
                      record["loss_bits"], record["grad_norm_bits"], record["lr_bits"])


def array_digest(x: np.ndarray) -> str:
    """SHA-256 hex of an array's canonical bytes under the empty name.

    A plain SHA-256 of ``tensor_header("", x) || data``: no Merkle tree, no chunks, no
    length word, so it differs from ``tensor_digest("", x)``. The shape is bound as the
    header writes it (0-d included).
    """
    return hashlib.sha256(canonical_bytes("", np.asarray(x))).hexdigest()
