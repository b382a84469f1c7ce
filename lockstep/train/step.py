"""One training step, as pieces shared by the trainer (any number of ranks) and the audit (one process).

Step t (1-based):

1. ``plan_step`` (``formats.schedule``): the global batch is windows ``first .. first+n-1`` of the stream
   (``schedule.step_windows``, batch ramp included); ``tokens_before`` drives the
   learning rate. ``StepPlan.micro_batches`` cuts it into ``M`` micro-batches of
   ``micro_batch`` consecutive windows, the last possibly short
   (``spec.tree.micro_batch_bounds``): the cut never depends on the world size.
2. ``micro_batch_value``: micro-batch ``j``'s loss and gradients as contributions to the
   batch mean (``n_global = n * seq_len`` target tokens), as one float32 vector
   (``GradLayout``: the loss, then every parameter's gradient in sorted-name order).
3. The step's sum is the spec's tree over the ``M`` vectors (``spec.tree``).
   ``subtree_sums`` computes a range of micro-batches in ascending order, streamed
   through ``spec.tree.TreeFolder`` (at most ``ceil(log2 M) + 1`` vectors alive), and
   returns the range's maximal subtrees. A rank computes its range
   (``collectives.rank_micro_batches``) and the ranks combine their subtree sums with
   ``collectives.tree_allreduce``; one process computes all of them in one range
   (``tree_step``: what the audit replays, with no world size).
4. ``apply_update``: clipping and AdamW (``optim.optimizer_step``), then the state
   root of parameters, moments and step, and the chain hash.

Where the backend offers ``device_vectors`` (the GPU backends), the step's state stays in
device memory: parameters and moments are backend arrays between steps (``to_device``
once), micro-batch vectors and the tree's sums come from a ``DeviceVectorPool``, the
gradients are copied into them on the device (``GradLayout.writer``), and the
tree's adds, the norm, clipping and AdamW run there. The host sees the loss and norm
scalars, the state root's inputs (leaf digests where the backend offers
``tensor_leaves``, else the state's bytes), the exchange's vectors when R > 1 and the
checkpoint's tensors. ``transfer_phase`` names what each copy is for (the
``transfers`` capability counts them). The bits are the same either way.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np

from lockstep.backends.state_hash import device_state_root
from lockstep.formats.config import ModelConfig, TrainConfig
from lockstep.formats.params import param_specs
from lockstep.formats.schedule import StepPlan, learning_rate
from lockstep.spec import hashing, tree

from .execution import IN_MEMORY, Execution
from .model import loss_and_grads
from .optim import NonFiniteError, optimizer_step
from lockstep.formats.state import AdamWState, state_tensors


@dataclass(frozen=True)
class GradLayout:
    """Where the loss and each gradient sit in a micro-batch's vector: the loss at 0, then
    the parameters in sorted-name order, each flattened in C order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, cfg: ModelConfig) -> "GradLayout":
        specs = sorted(param_specs(cfg), key=lambda s: s.name)
        return cls(tuple(s.name for s in specs), tuple(tuple(s.shape) for s in specs))

    @property
    def size(self) -> int:
        return 1 + sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes)

    @functools.cached_property
    def offsets(self) -> dict[str, tuple[int, int, tuple[int, ...]]]:
        """``{name: (start, length, shape)}``: where each gradient sits in the vector (computed once)."""
        out, at = {}, 1
        for name, shape in zip(self.names, self.shapes):
            n = int(np.prod(shape, dtype=np.int64))
            out[name] = (at, n, shape)
            at += n
        return out

    def writer(self, out, backend, release=None):
        """``(put(name, gradient), finish(loss))``: ``loss_and_grads``'s ``grad_sink`` that writes each
        gradient into its place in ``out`` as soon as the backward has finished it, so the micro-batch
        never holds its gradients and its vector at once (only copies: the bits are the backend's).

        ``out`` is a host vector, or a device vector where the backend offers ``device_vectors``.
        ``release(view)``, if given (a scratch vector's pages), is called on each host slice once
        written. ``finish(loss)`` writes the loss and checks that every gradient came, once."""
        if tuple(out.shape) != (self.size,):
            raise ValueError(f"a step's gradient vector has {self.size} float32 elements, got shape {out.shape}")
        be, where = backend, self.offsets
        vectors = None if isinstance(out, np.ndarray) else be.capabilities.device_vectors
        if isinstance(out, np.ndarray) and out.dtype != np.float32:
            raise ValueError(f"a step's gradient vector is float32, got {out.dtype}")
        seen: set[str] = set()

        def put(name: str, g) -> None:
            if name not in where or name in seen:
                raise ValueError(f"gradient {name!r} is not a parameter of the model, or came twice")
            at, n, shape = where[name]
            if tuple(g.shape) != shape:
                raise ValueError(f"gradient {name!r} has shape {tuple(g.shape)}, the model's parameter {shape}")
            seen.add(name)
            if vectors is not None:
                vectors.copy_into(out[at : at + n], g.reshape(-1))
                return
            part = out[at : at + n]
            part[...] = np.asarray(be.to_numpy(g), dtype=np.float32).reshape(-1)
            if release is not None:
                release(part)

        def finish(loss) -> None:
            missing = sorted(set(where) - seen)
            if missing:
                raise ValueError(f"the backward gave no gradient for {', '.join(missing[:3])}")
            if vectors is not None:
                vectors.copy_into(out[0:1], loss.reshape(1))
            else:
                out[0] = np.asarray(be.to_numpy(loss), dtype=np.float32).reshape(-1)[0]

        return put, finish

    def unflatten(self, flat: np.ndarray) -> tuple[np.float32, dict[str, np.ndarray]]:
        """``(loss, {name: gradient})``; the gradients are views of ``flat``."""
        if flat.shape != (self.size,):
            raise ValueError(f"a step's gradient vector has {self.size} elements, got shape {flat.shape}")
        grads = {name: flat[at : at + n].reshape(shape) for name, (at, n, shape) in self.offsets.items()}
        return np.float32(np.asarray(flat[0:1]).reshape(-1)[0]), grads


class VectorPool:
    """Float32 vectors of one length, handed out again once given back.

    The trainer keeps one for a run, so micro-batch values, tree sums and the exchange's
    result reuse the same memory step after step (11.6 MiB vectors on ``small``): no
    allocation, and no fresh pages to fault in, wherever the allocator would hand them
    back to the system. Where glibc's malloc is used, ``malloc.keep_freed_memory`` keeps
    freed memory for reuse too; the pool is what still helps where that setting does nothing (no glibc). A vector given back
    must be dead: nothing reads it again. Bits never depend on the pool (every element
    of a vector taken is written before it is read).

    ``scratch`` (a ``scratch.ScratchSpace``): the vectors are memory-mapped files there
    (``Execution.scratch``) instead of RAM, and ``park`` hands the pages of vectors that
    only wait (the tree's sums waiting for a sibling) back to the system.
    """

    def __init__(self, length: int, *, scratch=None):
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
    same ``take``/``give``, so a step's micro-batch vectors and tree sums stay on the device and
    are reused step after step. It keeps every vector it made (at most ``ceil(log2 M) + 2`` are
    ever out at once) and takes back only those."""

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


def vector_pool(backend, length: int):
    """The pool a run's step vectors come from: device memory where the backend offers
    ``device_vectors``, else host memory (``VectorPool``)."""
    vectors = backend.capabilities.device_vectors
    return VectorPool(length) if vectors is None else DeviceVectorPool(length, vectors)


def transfer_phase(backend, name: str):
    """A context naming the phase of the host<->device copies inside it (data, step, hashing,
    exchange, checkpoint) for a backend that counts them (``transfers``); else nothing."""
    log = backend.capabilities.transfers
    return contextlib.nullcontext() if log is None else log.phase(name)


def to_device(backend, params: dict, opt: AdamWState) -> tuple[dict, AdamWState]:
    """Parameters and moments as backend arrays, once, where the backend keeps a state on its device
    (``device_vectors``); unchanged otherwise. Uploading canonical float32 changes no bit."""
    if backend.capabilities.device_vectors is None:
        return params, opt
    be = backend
    with transfer_phase(be, "checkpoint"):
        up = lambda d: {k: be.asarray(v) for k, v in d.items()}  # noqa: E731
        return up(params), AdamWState(opt.step, up(opt.m), up(opt.v))


ADD_PIECE = 2**24  # elements per piece of a tree add on scratch vectors (64 MiB of each operand)


def in_place_add(backend, pool: VectorPool):
    """The tree's ``add`` for vectors from ``pool``: ``left + right`` written into ``left``
    (the backend's ``add_into`` extra where it has one, else its ``add`` and a copy), and
    ``right`` given back to the pool. The same bits as ``backend.add``.

    On a pool's scratch vectors the add runs in pieces of ``ADD_PIECE`` elements, each
    piece's pages of both operands released once written (the add is element by element:
    the pieces give the same bits), so the two vectors are never in RAM at once."""
    be = backend
    add_into = be.capabilities.add_into
    pieces = isinstance(pool, VectorPool) and pool.scratch is not None

    def add_part(left, right) -> None:
        if add_into is not None:
            add_into(left, right, left)
        else:
            np.copyto(left, np.asarray(be.to_numpy(be.add(left, right)), dtype=np.float32).reshape(-1))

    def add(left: np.ndarray, right: np.ndarray) -> np.ndarray:
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


def micro_batch_value(params: dict, windows: np.ndarray, cfg: ModelConfig, n_global: int, backend,
                      layout: GradLayout, where: str = "", out: np.ndarray | None = None, *,
                      execution: Execution = IN_MEMORY, release=None) -> np.ndarray:
    """One micro-batch's loss and gradients (contributions to the mean over ``n_global`` tokens),
    flattened (into ``out`` when given). ``execution``: how it holds memory (``train.execution``), never a bit.

    Each gradient is copied into its place in the vector as soon as the backward has
    finished it (``GradLayout.writer``), so the micro-batch's gradients and its vector are
    never all alive at once; ``release(view)`` (a scratch pool's ``release_part``) hands each
    written slice's pages back."""
    be = backend
    vectors = be.capabilities.device_vectors
    if out is None:
        out = vectors.empty(layout.size) if vectors is not None else np.empty(layout.size, dtype=np.float32)
    elif vectors is None and not isinstance(out, np.ndarray):
        raise TypeError(f"a host backend writes gradients into a NumPy vector, got {type(out).__name__}")
    put, finish = layout.writer(out, be, release=release)
    with transfer_phase(be, "data"):  # what the forward and backward upload: token ids, their tables, rope, 1/n
        loss_d, _ = loss_and_grads(params, windows, cfg, be, n_global=n_global, execution=execution, grad_sink=put)
    loss = np.asarray(be.to_numpy(loss_d), dtype=np.float32).reshape(-1)[0]
    if not np.isfinite(loss):
        raise NonFiniteError(f"non-finite loss{where}: {loss}")
    finish(loss_d)
    return out


def subtree_sums(params: dict, windows: np.ndarray, plan: StepPlan, lo: int, hi: int, cfg: ModelConfig,
                 tcfg: TrainConfig, backend, pool: VectorPool | None = None,
                 progress=None, *, execution: Execution = IN_MEMORY) -> list[tuple[int, int, np.ndarray]]:
    """The maximal subtrees of micro-batches ``lo .. hi-1`` and their sums: ``[(lo, hi, vector), ...]``.

    ``windows`` is the step's whole batch (``plan.n_windows`` rows). Micro-batches are
    computed in ascending order and added as the tree says as soon as two are siblings
    (the right sum added into the left one's memory), so one micro-batch's activations
    and at most ``ceil(log2 M) + 1`` vectors are alive. The vectors come from ``pool``
    (a fresh one when none is given); the caller gives them back when done.
    ``progress(done, total)``, if given, is called after each micro-batch (counts within the range).
    """
    be = backend
    bounds = plan.micro_batches(tcfg.micro_batch)
    layout = GradLayout.of(cfg)
    pool = pool if pool is not None else vector_pool(be, layout.size)
    folder = tree.TreeFolder(len(bounds), in_place_add(be, pool), start=lo)
    same_weights = be.capabilities.weights_unchanged or contextlib.nullcontext
    with same_weights():  # every micro-batch reads the same parameters: a backend may quantize them once
        for j in range(lo, hi):
            start, stop = bounds[j]
            where = (f" at step {plan.step}, micro-batch {j} (windows {plan.first_window + start}.."
                     f"{plan.first_window + stop - 1})")
            folder.push_leaf(micro_batch_value(params, windows[start:stop], cfg, plan.n_global, be, layout, where,
                                               out=pool.take(), execution=execution, release=pool.release_part))
            pool.park(*(v for _, _, v in folder.parts()))  # they wait for a sibling (or the caller)
            if progress is not None:
                progress(j - lo + 1, hi - lo)
    return folder.parts()


@dataclass
class StepResult:
    params: dict
    opt: AdamWState
    loss: np.float32
    grad_norm: np.float32
    lr: np.float32
    state_root: str


def apply_update(params: dict, opt: AdamWState, summed: np.ndarray, plan: StepPlan, cfg: ModelConfig,
                 tcfg: TrainConfig, backend, *, moments=None) -> StepResult:
    """Clip, AdamW, and the state root of the new state; ``summed`` is the tree's sum ``S[0, M)``.

    On a backend with ``device_vectors`` the update runs on the device and its results stay
    there (a host ``summed``, the exchange's, is uploaded first); the state root comes from the
    device's leaf digests where the backend offers ``tensor_leaves``, else from the state's
    bytes copied to the host (the "hashing" transfer phase).

    ``moments`` (a ``scratch.MomentFiles``, host backends): the new moments are written to its
    files as they are made, and their pages released again once hashed (the same bits, the
    same root); a ``summed`` of the same scratch space has each gradient's pages released once
    read, so neither the moments nor the step's sum are ever all in RAM.
    """
    be = backend
    on_device = be.capabilities.device_vectors is not None
    if on_device and isinstance(summed, np.ndarray):
        with transfer_phase(be, "exchange"):
            summed = be.asarray(summed)
    loss, grads = GradLayout.of(cfg).unflatten(summed)
    if not np.isfinite(loss):
        raise NonFiniteError(f"non-finite loss at step {plan.step}: {loss}")
    lr = learning_rate(tcfg, plan.tokens_after)  # tokens consumed once this step is done
    on_host_files = moments is not None and not on_device
    place = moments.place(opt.step + 1) if on_host_files else None
    release = moments.space.release if on_host_files else None  # a scratch step sum, tensor by tensor
    new_params, new_opt, norm = optimizer_step(params, grads, opt, cfg, tcfg, lr, be, place=place, release=release)
    if on_device:
        with transfer_phase(be, "hashing"):
            root = (hashing.state_root(state_tensors(new_params, new_opt)) if be.capabilities.tensor_leaves is None
                    else device_state_root(be, state_tensors(new_params, new_opt, host=False)))
        return StepResult(new_params, new_opt, loss, np.float32(np.asarray(be.to_numpy(norm)).reshape(-1)[0]), lr,
                          root)
    new_params = {k: be.to_numpy(v) for k, v in new_params.items()}
    new_opt = AdamWState(new_opt.step, {k: be.to_numpy(v) for k, v in new_opt.m.items()},
                         {k: be.to_numpy(v) for k, v in new_opt.v.items()})
    if not on_host_files:
        root = hashing.state_root(state_tensors(new_params, new_opt))
    else:  # tensor by tensor, each moment's pages released once hashed: state_root's bits
        digests = {}
        for name, x in state_tensors(new_params, new_opt).items():
            digests[name] = hashing.tensor_digest(name, x)
            if not name.startswith("param/"):
                moments.space.release(x)
        root = hashing.state_root_from_digests(digests)
    return StepResult(new_params, new_opt, loss, np.float32(np.asarray(be.to_numpy(norm)).reshape(-1)[0]), lr, root)


def step_over_ranks(params: dict, opt: AdamWState, windows: np.ndarray, plan: StepPlan, cfg: ModelConfig,
                    tcfg: TrainConfig, backend, comm=None, *, pool: VectorPool | None = None,
                    host_pool: VectorPool | None = None, moments=None, progress=None,
                    execution: Execution = IN_MEMORY) -> StepResult:
    """Step ``plan.step`` with its micro-batches split over the ranks of ``comm`` (None: this process alone).

    The one step algorithm, which training and replay both run: this rank's maximal
    subtrees of the micro-batch tree (``subtree_sums`` over ``rank_micro_batches``), the
    exchange that makes the tree's sum ``S[0, M)`` on every rank (``tree_allreduce``, on the
    host), then the update (``apply_update``). The bits do not depend on the number of
    ranks. ``pool``: the step's vectors (a fresh pool when None); ``host_pool``: the
    exchange's host vectors (``pool`` when it is a host pool); ``moments``, ``progress`` and
    ``execution`` as in ``subtree_sums`` and ``apply_update``.
    """
    from .collectives import rank_micro_batches, tree_allreduce

    be = backend
    world, rank = (1, 0) if comm is None else (comm.Get_size(), comm.Get_rank())
    layout = GradLayout.of(cfg)
    pool = pool if pool is not None else vector_pool(be, layout.size)
    m = len(plan.micro_batches(tcfg.micro_batch))
    lo, hi = rank_micro_batches(m, world, rank)
    parts = subtree_sums(params, windows, plan, lo, hi, cfg, tcfg, be, pool, progress=progress, execution=execution)
    if world > 1:
        if host_pool is None:
            host_pool = pool if isinstance(pool, VectorPool) else VectorPool(layout.size)
        with transfer_phase(be, "exchange"):  # MPI moves host memory: a device's subtree sums come over
            sent = parts if host_pool is pool else [(a, b, be.to_numpy(v)) for a, b, v in parts]
            summed = tree_allreduce(comm, sent, m, layout.size, be.add, out=host_pool.take(),
                                    add_into=be.capabilities.add_into)
        pool.give(*(v for _, _, v in parts))
    else:
        [(_, _, summed)] = parts
    res = apply_update(params, opt, summed, plan, cfg, tcfg, be, moments=moments)
    (host_pool if world > 1 else pool).give(summed)  # dead: the update's results are new arrays
    return res


def tree_step(params: dict, opt: AdamWState, windows: np.ndarray, plan: StepPlan, cfg: ModelConfig,
              tcfg: TrainConfig, backend, *, pool: VectorPool | None = None, moments=None,
              progress=None, execution: Execution = IN_MEMORY) -> StepResult:
    """Step ``plan.step`` on one process: the whole tree, then the update (``step_over_ranks`` with no ranks).

    ``windows`` is the step's batch (``plan.n_windows`` rows). Its bits are those of a
    run with any number of ranks, and of any ``execution``. ``pool``, ``moments`` and ``progress`` as in ``subtree_sums``
    and ``apply_update`` (``pool`` and ``moments``: a scratch folder's, for out-of-core state).
    """
    params, opt = to_device(backend, params, opt)  # once per step at most (device arrays stay as they are)
    return step_over_ranks(params, opt, windows, plan, cfg, tcfg, backend, None, pool=pool, moments=moments,
                           progress=progress, execution=execution)
