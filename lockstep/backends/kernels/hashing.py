"""Host side of ``hashing.kc`` (``lockstep/spec/hashing.py``): a tensor's Merkle leaves, hashed on the device.

``tensor_leaves(name, x)`` is ``spec.hashing.leaf_digests`` of the data of the device array ``x``
(its C-order elements, little-endian): ``ls_sha256_leaves_kernel``, one work-item per chunk of
``CHUNK_BYTES``, in groups of ``LEAF_LOCAL``; only the 32-byte leaves are downloaded (and a table
of 24 bytes per tensor uploaded). A tensor's header is not part of any leaf (the spec hashes it
into the tensor digest, above the Merkle root), so ``name`` does not change the leaves; it is
taken so the capability names the tensor, and is checked to be a string.
``tensors_leaves(tensors)`` does the same for a dict of tensors with one launch per device buffer
they live in: tensors that are C-ordered views of one buffer (an arena: a flat parameter or
moment vector and its views) are hashed in place, all their chunks in parallel.
``sha256_bytes(x)`` is plain SHA-256 of a device array's bytes, on one work-item
(``ls_sha256_bytes_kernel``; short strings and the FIPS 180-4 vectors).

Parallelism is across chunks only (SHA-256 of one chunk is sequential): a launch takes about
the time of its longest chunk on one work-item, however many chunks run beside it, so a
launch per tensor would pay that time once per tensor. On a GPU the state should live in few
buffers (or arenas) and be hashed with ``tensors_leaves``; separately allocated tensors cost a
launch each. A work-item hashes one 1 MiB chunk at a time, so a tensor of a few chunks is a launch of a
few work-items: acceptable beside the large ones.

The kernel reads the buffer as 32-bit words in the device's byte order; every device these
kernels run on is little-endian. The first call on a runtime checks the kernel against
``hashlib`` on a few lengths and chunk sizes (host test data, not a tensor's) and refuses
with one line if any leaf differs, so a device that disagrees never publishes a root.
"""

from __future__ import annotations

import contextlib

import numpy as np

from lockstep.spec import hashing as spec_hashing

from .layout import DeviceArray, LayoutOps, ParamBlock, c_strides, ceil_div

LEAF_LOCAL = 32  # work-items per group; the work-items are independent (one chunk each)
_U32_LIMIT = 2**32


class HashingOps(LayoutOps):
    """Device-side hashing (not a spec op: the backend capabilities ``tensor_leaves`` and ``tensors_leaves``)."""

    _hash_checked = False

    def tensor_leaves(self, name: str, x, chunk_bytes: int = spec_hashing.CHUNK_BYTES) -> list[bytes]:
        """``spec.hashing.leaf_digests`` of the data of device array ``x``, computed on the device.

        ``chunk_bytes`` (a positive multiple of 4) is the spec's ``CHUNK_BYTES`` unless a test asks
        for small chunks. A non-contiguous view is first made contiguous on the device."""
        return self.tensors_leaves({name: x}, chunk_bytes)[name]

    def tensors_leaves(self, tensors: dict, chunk_bytes: int = spec_hashing.CHUNK_BYTES) -> dict[str, list[bytes]]:
        """``tensor_leaves`` of every tensor, by name: one launch per device buffer the tensors live in,
        every chunk of every tensor in it hashed in parallel (a state in one arena: one launch)."""
        chunk_bytes = int(chunk_bytes)
        if chunk_bytes <= 0 or chunk_bytes % 4 or chunk_bytes >= _U32_LIMIT:
            raise ValueError(f"tensor_leaves: chunk_bytes must be a positive multiple of 4 below 2**32, got {chunk_bytes}")
        by_buffer: dict[int, list] = {}
        for name, x in tensors.items():
            if not isinstance(name, str):
                raise TypeError(f"tensor_leaves: the tensor name must be a string, got a {type(name).__name__}")
            if not isinstance(x, DeviceArray) or x.runtime is not self.rt:
                raise TypeError(f"tensor_leaves({name!r}): expected a device array of this backend, got a {type(x).__name__}")
            base, start, nbytes = self._segment(x)
            by_buffer.setdefault(id(base.buffer), []).append((name, base, start, nbytes))
        self._check_hashing()
        out = {}
        for segments in by_buffer.values():
            out.update(self._launch_leaves(segments, chunk_bytes))
        return {name: out[name] for name in tensors}

    def sha256_bytes(self, x) -> bytes:
        """Plain SHA-256 of the bytes of device array ``x`` (C order), on one work-item."""
        if not isinstance(x, DeviceArray):
            raise TypeError(f"sha256_bytes: expected a device array of this backend, got a {type(x).__name__}")
        words, nbytes = self._words(x)
        if nbytes >= _U32_LIMIT:
            raise ValueError(f"sha256_bytes hashes at most 4 GiB on one work-item, got {nbytes} bytes")
        out = self.empty((8,), np.uint32)
        self._single("ls_sha256_bytes_kernel", out, words, np.uint32(nbytes))
        self._count("out", 32)
        return _digest_bytes(self.rt.download(out.buffer, np.uint32, 8))[0]

    # ------------------------------------------------------------------ internals

    def _launch_leaves(self, segments: list, chunk_bytes: int) -> dict[str, list[bytes]]:
        """One ``ls_sha256_leaves_kernel`` over the tensors (name, array, byte start, byte length) of one buffer."""
        table, counts, first = [], [], 0
        for _, _, start, nbytes in segments:
            count = max(1, ceil_div(nbytes, chunk_bytes))
            table.append([start & 0xFFFFFFFF, start >> 32, nbytes & 0xFFFFFFFF, nbytes >> 32, first, count])
            counts.append(count)
            first += count
        if first >= 2**28:
            raise ValueError(f"tensor_leaves: {first} chunks in one buffer is more than these kernels index")
        out = self.empty((first, 8), np.uint32)
        groups = min(ceil_div(first, LEAF_LOCAL), self.rt.elementwise_groups(first, LEAF_LOCAL))
        params = ParamBlock("ls_sha_leaf_params", n_segments=len(table), total_chunks=first, chunk_bytes=chunk_bytes)
        seg = self._upload(np.array(table, dtype=np.uint32))
        self.rt.launch("ls_sha256_leaves_kernel", (groups,), (LEAF_LOCAL,), (out, segments[0][1], seg, params))
        self._count("out", 32 * first)  # the leaves: all that crosses back
        leaves = _digest_bytes(self.rt.download(out.buffer, np.uint32, 8 * first))
        result, at = {}, 0
        for (name, _, _, _), count in zip(segments, counts):
            result[name] = leaves[at:at + count]
            at += count
        return result

    def _segment(self, x: DeviceArray) -> tuple[DeviceArray, int, int]:
        """Where x's bytes lie: (an array on that buffer, byte offset, byte length), the bytes C-order
        and the buffer holding whole 32-bit words over them. A C-ordered view (of an arena, say) is
        used in place; anything else is first copied on the device (``_words``)."""
        if x.strides == c_strides(x.shape) and x.itemsize % 4 == 0:
            return x, x.offset * x.itemsize, x.nbytes
        words, nbytes = self._words(x)
        return words, 0, nbytes

    def _words(self, x: DeviceArray) -> tuple[DeviceArray, int]:
        """A contiguous device array whose buffer holds x's bytes in a whole number of 32-bit words, and
        x's byte length. Only 1-byte elements can need the padding: they are copied, on the device, into
        a buffer rounded up to a word (the bytes past the data are never read as data)."""
        x = self.contiguous(x)
        nbytes = x.nbytes
        if nbytes % 4 == 0:
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
        log = getattr(self.rt, "transfers", None)
        with log.phase("setup") if log is not None else contextlib.nullcontext():
            self._check_hashing_once()
        self._hash_checked = True

    def _check_hashing_once(self) -> None:
        data = np.arange(1000, dtype=np.uint32).astype(np.uint8) * np.uint8(37)
        for n, chunk in ((0, 64), (3, 64), (55, 64), (128, 128), (999, 64), (1000, 1 << 20)):
            host = data[:n].view(np.int8)
            base, start, nbytes = self._segment(self.asarray(host))
            got = self._launch_leaves([("check", base, start, nbytes)], chunk)["check"]
            if got != spec_hashing.leaf_digests(host.tobytes(), chunk_bytes=chunk):
                raise RuntimeError(f"the {self.rt.name} SHA-256 kernel disagrees with hashlib on {n} bytes in chunks "
                                   f"of {chunk}; device-side state hashing is refused on this device")


def _digest_bytes(words: np.ndarray) -> list[bytes]:
    """Rows of 8 uint32 (SHA-256's output words) as 32-byte digests (each word big-endian)."""
    raw = np.asarray(words, dtype=np.uint32).astype(">u4").tobytes()
    return [raw[i:i + 32] for i in range(0, len(raw), 32)]
