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
    leaves_of = backend.capabilities.tensor_leaves
    out = {}
    for name, x in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be strings, got a {type(name).__name__}")
        if _on_host(x):
            out[name] = hashing.tensor_digest(name, np.asarray(x))
        elif leaves_of is None:
            out[name] = hashing.tensor_digest(name, np.asarray(backend.to_numpy(x)))
        else:
            out[name] = hashing.tensor_digest_from_leaves(name, x.dtype, x.shape, leaves_of(name, x))
    return out


def device_state_root(backend, tensors: dict) -> str:
    """``spec.hashing.state_root(tensors)`` (lowercase hex), with device tensors hashed on their device.

    Contract:

    * ``tensors`` maps each name to a host NumPy array (or scalar) or to an array of ``backend``
      (what its ops return, ``backend.asarray`` made, or a view of one). The result equals
      ``spec.hashing.state_root({n: backend.to_numpy(x) ...})`` byte for byte: the same names,
      dtypes, shapes (a 0-d array stays 0-d) and element bits.
    * A backend array is hashed through ``backend.capabilities.tensor_leaves``: only its leaf
      digests (32 bytes per MiB of data) cross to the host; the host computes the header, the
      Merkle root, the tensor digest and the state root (a few SHA-256 calls per tensor). A
      non-contiguous view is made contiguous on the device first.
    * A host array, or any array of a backend without ``tensor_leaves`` (numba, whose device is
      the host; the spec), is hashed on the host (``spec.hashing.tensor_digest``): the same root.
    * Nothing is modified; the tensors must not change while this runs. Errors: ``TypeError`` for
      a name that is not a string; the capability's one-line errors (a device that disagrees with
      ``hashlib`` on its first use refuses with ``RuntimeError``).
    """
    return hashing.state_root_from_digests(device_tensor_digests(backend, tensors))
