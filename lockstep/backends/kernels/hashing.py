"""Host side of ``hashing.kc`` (``lockstep/spec/hashing.py``): a tensor's Merkle leaves, hashed on the device.

``tensor_leaves(name, x)`` is ``spec.hashing.leaf_digests`` of the data of the device array ``x``
(its C-order elements, little-endian): ``ls_sha256_leaves_kernel``, one work-item per chunk of
``CHUNK_BYTES``, in groups of ``LEAF_LOCAL``; only the 32-byte leaves are downloaded. A tensor's
header is not part of any leaf (the spec hashes it into the tensor digest, above the Merkle root),
so ``name`` does not change the leaves; it is taken so the capability's signature names the
tensor, and is checked to be a string. ``sha256_bytes(x)`` is plain SHA-256 of a device array's
bytes, on one work-item (``ls_sha256_bytes_kernel``; short strings and the FIPS 180-4 vectors).

Parallelism is across chunks only: a tensor of c chunks keeps c work-items busy, each hashing
1 MiB sequentially. That suits a state of many chunks on a GPU; a tensor of a few chunks is
latency-bound (a few milliseconds per chunk on a CPU core), which is acceptable for the small
tensors (norm gains, the step counter) beside the large ones.

The kernel reads the buffer as 32-bit words in the device's byte order; every device these
kernels run on is little-endian. The first call on a runtime checks the kernel against
``hashlib`` on a few lengths and chunk sizes (host test data, not a tensor's) and refuses
with one line if any leaf differs, so a device that disagrees never publishes a root.
"""

from __future__ import annotations

import numpy as np

from lockstep.spec import hashing as spec_hashing

from .layout import DeviceArray, LayoutOps, ParamBlock, ceil_div

LEAF_LOCAL = 32  # work-items per group; the work-items are independent (one chunk each)
_U32_LIMIT = 2**32


class HashingOps(LayoutOps):
    """Device-side hashing (not a spec op: the backend capability ``tensor_leaves``)."""

    _hash_checked = False

    def tensor_leaves(self, name: str, x, chunk_bytes: int = spec_hashing.CHUNK_BYTES) -> list[bytes]:
        """``spec.hashing.leaf_digests`` of the data of device array ``x``, computed on the device.

        ``chunk_bytes`` (a positive multiple of 4) is the spec's ``CHUNK_BYTES`` unless a test asks
        for small chunks. A non-contiguous view is first made contiguous on the device."""
        if not isinstance(name, str):
            raise TypeError(f"tensor_leaves: the tensor name must be a string, got a {type(name).__name__}")
        if not isinstance(x, DeviceArray):
            raise TypeError(f"tensor_leaves({name!r}): expected a device array of this backend, got a {type(x).__name__}")
        self._check_hashing()
        return self._leaves(x, chunk_bytes)

    def sha256_bytes(self, x) -> bytes:
        """Plain SHA-256 of the bytes of device array ``x`` (C order), on one work-item."""
        if not isinstance(x, DeviceArray):
            raise TypeError(f"sha256_bytes: expected a device array of this backend, got a {type(x).__name__}")
        words, nbytes = self._words(x)
        if nbytes >= _U32_LIMIT:
            raise ValueError(f"sha256_bytes hashes at most 4 GiB on one work-item, got {nbytes} bytes")
        out = self.empty((8,), np.uint32)
        self._single("ls_sha256_bytes_kernel", out, words, np.uint32(nbytes))
        return _digest_bytes(self.rt.download(out.buffer, np.uint32, 8))[0]

    # ------------------------------------------------------------------ internals

    def _leaves(self, x: DeviceArray, chunk_bytes: int) -> list[bytes]:
        chunk_bytes = int(chunk_bytes)
        if chunk_bytes <= 0 or chunk_bytes % 4 or chunk_bytes >= _U32_LIMIT:
            raise ValueError(f"tensor_leaves: chunk_bytes must be a positive multiple of 4 below 2**32, got {chunk_bytes}")
        words, nbytes = self._words(x)
        n_chunks = max(1, ceil_div(nbytes, chunk_bytes))
        if n_chunks >= 2**31:
            raise ValueError(f"tensor_leaves: {n_chunks} chunks is more than these kernels index")
        last = nbytes - (n_chunks - 1) * chunk_bytes
        out = self.empty((n_chunks, 8), np.uint32)
        groups = min(ceil_div(n_chunks, LEAF_LOCAL), self.rt.elementwise_groups(n_chunks, LEAF_LOCAL))
        params = ParamBlock("ls_sha_leaf_params", n_chunks=n_chunks, chunk_bytes=chunk_bytes, last_bytes=last)
        self.rt.launch("ls_sha256_leaves_kernel", (groups,), (LEAF_LOCAL,), (out, words, params))
        return _digest_bytes(self.rt.download(out.buffer, np.uint32, 8 * n_chunks))

    def _words(self, x: DeviceArray) -> tuple[DeviceArray, int]:
        """A contiguous device array whose buffer holds x's bytes in a whole number of 32-bit words, and
        x's byte length. Only 1-byte elements can need it: they are copied, on the device, into a
        buffer rounded up to a word (the bytes past the data are never read as data)."""
        x = self.contiguous(x)
        nbytes = x.nbytes
        if nbytes % 4 == 0 or nbytes == 0:
            return x, nbytes
        padded = self.empty((ceil_div(nbytes, 4) * 4,), x.dtype)
        self.copy_into(padded[:nbytes], x.reshape(-1))
        return padded, nbytes

    def _check_hashing(self) -> None:
        """Once per runtime: the leaves kernel against ``hashlib`` (through the spec) on host test data
        that covers the prefix block, the fast path at both alignments, padding across a block
        boundary and byte-padded lengths."""
        if self._hash_checked:
            return
        data = np.arange(1000, dtype=np.uint32).astype(np.uint8) * np.uint8(37)
        for n, chunk in ((0, 64), (3, 64), (55, 64), (128, 128), (999, 64), (1000, 1 << 20)):
            host = data[:n].view(np.int8)
            got = self._leaves(self.asarray(host), chunk)
            if got != spec_hashing.leaf_digests(host.tobytes(), chunk_bytes=chunk):
                raise RuntimeError(f"the {self.rt.name} SHA-256 kernel disagrees with hashlib on {n} bytes in chunks "
                                   f"of {chunk}; device-side state hashing is refused on this device")
        self._hash_checked = True


def _digest_bytes(words: np.ndarray) -> list[bytes]:
    """Rows of 8 uint32 (SHA-256's output words) as 32-byte digests (each word big-endian)."""
    raw = np.asarray(words, dtype=np.uint32).astype(">u4").tobytes()
    return [raw[i:i + 32] for i in range(0, len(raw), 32)]
