"""The state root of tensors that live on a backend, with only leaf digests crossing to the host.

``device_state_root(backend, tensors)`` is ``spec.hashing.state_root`` of the same tensors, byte for
byte, computed without bringing a device tensor's data to the host: the backend's capability
``tensor_leaves`` hashes the Merkle leaves where the data lives, and the host builds the small
upper levels (``spec.hashing.tensor_digest_from_leaves``: the Merkle root, the tensor digest over
the header the host writes from the array's name, dtype and shape; then
``state_root_from_digests``).
"""

from __future__ import annotations

import numpy as np

from lockstep.spec import hashing


def _on_host(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic, int, float))


def device_tensor_digests(backend, tensors: dict) -> dict[str, bytes]:
    """The 32-byte ``spec.hashing.tensor_digest`` of every tensor, by name (see ``device_state_root``)."""
    caps = backend.capabilities
    on_device, out = {}, {}
    for name, x in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be strings, got a {type(name).__name__}")
        if _on_host(x):
            out[name] = hashing.tensor_digest(name, np.asarray(x))
        elif caps.tensors_leaves is None and caps.tensor_leaves is None:
            out[name] = hashing.tensor_digest(name, np.asarray(backend.to_numpy(x)))
        else:
            on_device[name] = x
    if on_device:
        if caps.tensors_leaves is not None:
            leaves = caps.tensors_leaves(on_device)
        else:
            leaves = {name: caps.tensor_leaves(name, x) for name, x in on_device.items()}
        for name, x in on_device.items():
            out[name] = hashing.tensor_digest_from_leaves(name, x.dtype, x.shape, leaves[name])
    return {name: out[name] for name in tensors}


def device_state_root(backend, tensors: dict) -> str:
    """``spec.hashing.state_root(tensors)`` (lowercase hex), with device tensors hashed on their device.

    Contract:

    * ``tensors`` maps each name to a host NumPy array (or scalar) or to an array of ``backend``
      (what its ops return, ``backend.asarray`` made, or a view of one). The result equals
      ``spec.hashing.state_root({n: backend.to_numpy(x) ...})`` byte for byte: the same names,
      dtypes, shapes (a 0-d array stays 0-d) and element bits.
    * The backend arrays are hashed through ``backend.capabilities.tensors_leaves`` (all at once:
      on a GPU backend one launch per device buffer they live in, so a state kept in a few
      buffers or arenas is hashed in a few launches), else ``tensor_leaves`` one by one: only
      their leaf digests (32 bytes per MiB of data) cross to the host; the host computes the
      headers, the Merkle roots, the tensor digests and the state root (a few SHA-256 calls per
      tensor). A view that is not C-ordered is made contiguous on the device first.
    * A host array, or any array of a backend without ``tensor_leaves`` (numba, whose device is
      the host; the spec), is hashed on the host (``spec.hashing.tensor_digest``): the same root.
    * Speed on a GPU: SHA-256 of a 1 MiB chunk is sequential on one work-item, and launches run
      in order, so the time is about one chunk's per device buffer. Keep a large state in few
      buffers (arenas: flat parameter and moment vectors whose tensors are views) so it is
      hashed in a few launches; a buffer per tensor pays one launch per tensor.
    * Transfers: per device buffer, a table of 24 bytes per tensor goes in and 32 bytes per MiB
      of data (at least one leaf per tensor) come out; the data never crosses.
    * Nothing is modified; the tensors must not change while this runs. Errors: ``TypeError`` for
      a name that is not a string; the capability's one-line errors (a device that disagrees with
      ``hashlib`` on its first use refuses with ``RuntimeError``).
    """
    return hashing.state_root_from_digests(device_tensor_digests(backend, tensors))
