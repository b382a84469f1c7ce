"""Where a step keeps its vectors and its state: one storage for a run, chosen once (``step_storage``).

The step (``train.step``) is one algorithm; it never asks where its arrays live. It asks its
``StepStorage``, which is one of two kinds, chosen once from the backend and the memory plan:

* ``HostStorage``: the step's vectors (micro-batch values, the tree's sums) in host memory, and the
  state (parameters, AdamW moments) as NumPy arrays. With a scratch folder in the plan
  (``scratch.ScratchSpace``) the vectors and the moments are memory-mapped files there, whose pages
  leave RAM once written or while they wait (``park``, ``release_part``); the tree's adds then run
  in pieces (``piecewise``), and the new moments are written to their files as they are made
  (``scratch.MomentFiles``).
* ``DeviceStorage``: on a backend that keeps a step's state in its own memory (its
  ``device_vectors`` capability: the GPU backends), the vectors and the state stay there
  (``DeviceVectorPool``); the tree's adds, clipping and AdamW run there, and the state root comes
  from the device's leaf digests where it offers ``tensor_leaves``. A scratch folder plays no part:
  the state is not in host memory.

Each gives the step the same interface: ``pool`` (``take``, ``give``, ``park``, ``release_part``,
``write``, ``piecewise``) for the step's vectors, ``host_pool`` for the exchange's vectors (MPI
moves host memory), ``adopt`` for the state a run starts from, and ``update(step)``, the update's
regime (where its operands are read, where its results go, how the state root is taken), and
``release`` for the pages of state kept in files once a checkpoint has read them. Every
kind gives the same bits: only copies differ, never an operation.
"""

from __future__ import annotations

import contextlib

import numpy as np

from lockstep.backends.state_hash import device_state_root
from lockstep.formats.state import AdamWState, state_tensors
from lockstep.spec import hashing

from .scratch import MomentFiles, ScratchSpace


class VectorPool:
    """Float32 vectors of one length in host memory, handed out again once given back.

    A run keeps one, so micro-batch values, tree sums and the exchange's result reuse the
    same memory step after step (11.6 MiB vectors on ``small``): no allocation, and no fresh
    pages to fault in, wherever the allocator would hand them back to the system. A vector
    given back must be dead: nothing reads it again. Bits never depend on the pool (every
    element of a vector taken is written before it is read).

    ``scratch`` (a ``scratch.ScratchSpace``): the vectors are memory-mapped files there
    instead of RAM, and ``park`` hands the pages of vectors that only wait (the tree's sums
    waiting for a sibling) back to the system.
    """

    def __init__(self, length: int, *, scratch: ScratchSpace | None = None):
        self.length = int(length)
        self.scratch = scratch
        self._free: list[np.ndarray] = []
        self.allocated = 0  # vectors made so far (tests and benchmarks)

    def take(self) -> np.ndarray:
        if self._free:
            return self._free.pop()
        self.allocated += 1
        if self.scratch is not None:
            return self.scratch.array(self.length)
        return np.empty(self.length, dtype=np.float32)

    def park(self, *vectors: np.ndarray) -> None:
        """Vectors that wait (their values kept): with a scratch space their pages leave RAM; else nothing."""
        if self.scratch is not None:
            self.scratch.release(*vectors)

    def release_part(self, view: np.ndarray) -> None:
        """A finished slice of one of this pool's vectors: with a scratch space its whole pages leave RAM; else nothing."""
        if self.scratch is not None:
            self.scratch.release(view)

    @property
    def piecewise(self) -> bool:
        """Whether the tree's adds on these vectors run in pieces (``in_place_add``): on scratch files."""
        return self.scratch is not None

    def write(self, part: np.ndarray, value, backend) -> None:
        """``part[...] = value`` (a slice of one of these vectors; ``value`` a backend array, copied to the
        host), then ``release_part(part)``: the bits copied, nothing computed."""
        part[...] = np.asarray(backend.to_numpy(value), dtype=np.float32).reshape(part.shape)
        self.release_part(part)

    def _ours(self, v) -> bool:
        if v.dtype != np.float32 or v.shape != (self.length,) or not v.flags.c_contiguous:
            return False
        return v.base is None or (self.scratch is not None and self.scratch.owns(v))

    def give(self, *vectors: np.ndarray) -> None:
        held = {id(v) for v in self._free}
        for v in vectors:
            if not self._ours(v):
                continue  # not one of ours (a view, a backend's own array): left to the garbage collector
            if id(v) not in held:
                self._free.append(v)
                held.add(id(v))


class DeviceVectorPool:
    """``VectorPool`` for vectors in a backend's memory (its ``device_vectors`` capability): the
    same interface, so a step's micro-batch vectors and tree sums stay on the device and are
    reused step after step. It keeps every vector it made (at most ``ceil(log2 M) + 2`` are
    ever out at once) and takes back only those."""

    piecewise = False

    def __init__(self, length: int, vectors):
        self.length = int(length)
        self._vectors = vectors
        self._free: list = []
        self._made: dict[int, object] = {}
        self.allocated = 0

    def take(self):
        if self._free:
            return self._free.pop()
        v = self._vectors.empty(self.length)
        self._made[id(v)] = v
        self.allocated += 1
        return v

    def give(self, *vectors) -> None:
        held = {id(v) for v in self._free}
        for v in vectors:
            if self._made.get(id(v)) is v and id(v) not in held:
                self._free.append(v)
                held.add(id(v))

    def park(self, *vectors) -> None:
        """Nothing to do: device vectors are not paged out (``VectorPool.park`` releases scratch pages)."""

    release_part = park

    def write(self, part, value, backend) -> None:
        """``part[...] = value`` for a slice of one of these vectors and a backend array (``copy_into``)."""
        self._vectors.copy_into(part, value)


def transfer_phase(backend, name: str):
    """A context naming the phase of the host<->device copies inside it (data, step, hashing,
    exchange, checkpoint) for a backend that counts them (``transfers``); else nothing."""
    log = backend.capabilities.transfers
    return contextlib.nullcontext() if log is None else log.phase(name)


ADD_PIECE = 2**24  # elements per piece of a tree add on scratch vectors (64 MiB of each operand)


def in_place_add(backend, pool):
    """The tree's ``add`` for vectors from ``pool``: ``left + right`` written into ``left``
    (the backend's ``add_into`` extra where it has one, else its ``add`` and a copy), and
    ``right`` given back to the pool. The same bits as ``backend.add``.

    On a pool's scratch vectors (``piecewise``) the add runs in pieces of ``ADD_PIECE``
    elements, each piece's pages of both operands released once written (the add is element
    by element: the pieces give the same bits), so the two vectors are never in RAM at once."""
    be = backend
    add_into = be.capabilities.add_into
    pieces = pool.piecewise

    def add_part(left, right) -> None:
        if add_into is not None:
            add_into(left, right, left)
        else:
            np.copyto(left, np.asarray(be.to_numpy(be.add(left, right)), dtype=np.float32).reshape(-1))

    def add(left, right):
        if not pieces:
            add_part(left, right)
        else:
            for lo in range(0, left.shape[0], ADD_PIECE):
                a, b = left[lo : lo + ADD_PIECE], right[lo : lo + ADD_PIECE]
                add_part(a, b)
                pool.release_part(a)
                pool.release_part(b)
        pool.give(right)
        return left

    return add


# ---------------------------------------------------------------- the update's regime

class _HostUpdate:
    """An update in host memory: the state as NumPy arrays, its root from their bytes."""

    place = release = None  # optimizer_step's: new moments in fresh arrays, nothing released

    def __init__(self, backend):
        self.be = backend

    def operand(self, summed):
        """The tree's sum as the update reads it."""
        return summed

    def host_state(self, params: dict, opt: AdamWState) -> tuple[dict, AdamWState]:
        to = self.be.to_numpy
        return ({k: to(v) for k, v in params.items()},
                AdamWState(opt.step, {k: to(v) for k, v in opt.m.items()}, {k: to(v) for k, v in opt.v.items()}))

    def results(self, params: dict, opt: AdamWState) -> tuple[dict, AdamWState, str]:
        """The new state where it stays between steps, and its state root."""
        params, opt = self.host_state(params, opt)
        return params, opt, hashing.state_root(state_tensors(params, opt))


class _FileUpdate(_HostUpdate):
    """An update whose moments are a scratch folder's files (``scratch.MomentFiles``): the new moments are
    written to their files as they are made, a scratch step sum's pages released tensor by tensor as read,
    and each moment's pages released once hashed (``state_root``'s bits), so neither is ever all in RAM."""

    def __init__(self, backend, moments: MomentFiles, step: int):
        super().__init__(backend)
        self.moments = moments
        self.place = moments.place(step)
        self.release = moments.space.release

    def results(self, params: dict, opt: AdamWState) -> tuple[dict, AdamWState, str]:
        params, opt = self.host_state(params, opt)
        digests = {}
        for name, x in state_tensors(params, opt).items():
            digests[name] = hashing.tensor_digest(name, x)
            if not name.startswith("param/"):
                self.moments.space.release(x)
        return params, opt, hashing.state_root_from_digests(digests)


class _DeviceUpdate(_HostUpdate):
    """An update on the device: a host sum (the exchange's) is uploaded, the results stay there, and the
    state root comes from the device's leaf digests (``tensor_leaves``), else from the state's bytes copied
    to the host (the "hashing" phase)."""

    def __init__(self, backend):
        super().__init__(backend)
        self.leaves = backend.capabilities.tensor_leaves is not None

    def operand(self, summed):
        if isinstance(summed, np.ndarray):
            with transfer_phase(self.be, "exchange"):
                return self.be.asarray(summed)
        return summed

    def results(self, params: dict, opt: AdamWState) -> tuple[dict, AdamWState, str]:
        with transfer_phase(self.be, "hashing"):
            root = (device_state_root(self.be, state_tensors(params, opt, host=False)) if self.leaves
                    else hashing.state_root(state_tensors(params, opt)))
        return params, opt, root


# ---------------------------------------------------------------- the storage

class HostStorage:
    """A step's vectors and state in host memory, or in the files of ``space`` (a ``ScratchSpace``)."""

    def __init__(self, backend, length: int, space: ScratchSpace | None = None):
        self.be = backend
        self.space = space
        self.pool = VectorPool(length, scratch=space)
        self.host_pool = self.pool
        self.moments = MomentFiles(space) if space is not None else None

    def adopt(self, params: dict, opt: AdamWState) -> tuple[dict, AdamWState]:
        """The state a run starts from, where this storage keeps it (the moments copied into their files)."""
        return params, (opt if self.moments is None else self.moments.adopt(opt))

    def update(self, step: int):
        """The regime of the update that makes ``step``'s state."""
        return _HostUpdate(self.be) if self.moments is None else _FileUpdate(self.be, self.moments, step)

    def release(self) -> None:
        """Hand back the RAM pages of the state kept in files (a checkpoint read them); else nothing."""
        if self.moments is not None:
            self.moments.release()

    def close(self) -> None:
        if self.space is not None:
            self.space.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


class DeviceStorage(HostStorage):
    """A step's vectors and state in a backend's own memory (its ``device_vectors``); the exchange's
    vectors in host memory."""

    def __init__(self, backend, length: int):
        self.be = backend
        self.space = None
        self.pool = DeviceVectorPool(length, backend.capabilities.device_vectors)
        self.host_pool = VectorPool(length)
        self.moments = None

    def adopt(self, params: dict, opt: AdamWState) -> tuple[dict, AdamWState]:
        """Parameters and moments as backend arrays, uploaded once (arrays already there stay as they
        are). Uploading canonical float32 changes no bit."""
        be = self.be
        with transfer_phase(be, "checkpoint"):
            up = lambda d: {k: be.asarray(v) for k, v in d.items()}  # noqa: E731
            return up(params), AdamWState(opt.step, up(opt.m), up(opt.v))

    def update(self, step: int):
        return _DeviceUpdate(self.be)


def step_storage(backend, length: int, scratch: str | None = None) -> HostStorage:
    """The storage of a run's steps (vectors of ``length`` float32), chosen once: the backend's device
    where it keeps a step's state there (``device_vectors``), else host memory, in a private folder
    of ``scratch`` (``Execution.scratch``: the plan put the state out of core) when given. Close it
    (or use it as a context manager) to remove the folder."""
    if backend.capabilities.device_vectors is not None:
        return DeviceStorage(backend, length)
    return HostStorage(backend, length, ScratchSpace(scratch) if scratch is not None else None)
