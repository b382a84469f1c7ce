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

The step's vectors have one interface wherever they live (``take``, ``give``, ``park``,
``release_part``, ``write``, ``piecewise``): ``VectorPool`` in host memory or, with a
scratch folder, in memory-mapped files whose pages leave RAM once written or waiting;
``DeviceVectorPool`` in device memory. ``vector_pool`` chooses one for a run; the tree,
the gradient writer and the exchange only call the interface. The update's state lives
in one of three regimes (``update_regime``: host memory, the moments' scratch files, the
device), chosen once per update, so ``apply_update`` is one sequence of calls.
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

    def writer(self, out, backend, pool=None):
        """``(put(name, gradient), finish(loss))``: ``loss_and_grads``'s ``grad_sink`` that writes each
        gradient into its place in ``out`` as soon as the backward has finished it, so the micro-batch
        never holds its gradients and its vector at once (only copies: the bits are the backend's).

        ``pool`` is where ``out`` came from (``vector_pool``); it does each write (``write``: into host
        memory, a scratch file's pages released once written, or device memory). None: ``out``'s own
        kind (a host vector, or a device vector where the backend offers ``device_vectors``).
        ``finish(loss)`` writes the loss and checks that every gradient came, once."""
        if tuple(out.shape) != (self.size,):
            raise ValueError(f"a step's gradient vector has {self.size} float32 elements, got shape {out.shape}")
        be, where = backend, self.offsets
        if isinstance(out, np.ndarray) and out.dtype != np.float32:
            raise ValueError(f"a step's gradient vector is float32, got {out.dtype}")
        if pool is None:
            pool = VectorPool(self.size) if isinstance(out, np.ndarray) else vector_pool(be, self.size)
        seen: set[str] = set()

        def put(name: str, g) -> None:
            if name not in where or name in seen:
                raise ValueError(f"gradient {name!r} is not a parameter of the model, or came twice")
            at, n, shape = where[name]
            if tuple(g.shape) != shape:
                raise ValueError(f"gradient {name!r} has shape {tuple(g.shape)}, the model's parameter {shape}")
            seen.add(name)
            pool.write(out[at : at + n], g.reshape(-1), be)

        def finish(loss) -> None:
            missing = sorted(set(where) - seen)
            if missing:
                raise ValueError(f"the backward gave no gradient for {', '.join(missing[:3])}")
            pool.write(out[0:1], loss.reshape(1), be)

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
    piecewise = False

    def write(self, part, value, backend) -> None:
        """``part[...] = value`` for a slice of one of these vectors and a backend array (``copy_into``)."""
        self._vectors.copy_into(part, value)


def vector_pool(backend, length: int, scratch=None):
    """The pool a run's step vectors come from, chosen once for the run: files in ``scratch`` (a
    ``scratch.ScratchSpace``: the plan put the state out of core), else device memory where the
    backend offers ``device_vectors``, else host memory (``VectorPool``)."""
    if scratch is not None:
        return VectorPool(length, scratch=scratch)
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
    pieces = pool.piecewise

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
                      execution: Execution = IN_MEMORY, pool=None) -> np.ndarray:
    """One micro-batch's loss and gradients (contributions to the mean over ``n_global`` tokens),
    flattened (into ``out`` when given, a vector from ``pool``; else a new one from ``pool``, or from
    ``vector_pool``). ``execution``: how it holds memory (``train.execution``), never a bit.

    Each gradient is copied into its place in the vector as soon as the backward has
    finished it (``GradLayout.writer``, through the pool: a scratch vector's written slices
    leave RAM), so the micro-batch's gradients and its vector are never all alive at once."""
    be = backend
    if pool is None:  # the vector's own kind: a host vector given, else where the backend keeps them
        pool = VectorPool(layout.size) if isinstance(out, np.ndarray) else vector_pool(be, layout.size)
    if out is None:
        out = pool.take()
    elif isinstance(pool, VectorPool) and not isinstance(out, np.ndarray):
        raise TypeError(f"a host pool's vector is a NumPy vector, got {type(out).__name__}")
    put, finish = layout.writer(out, be, pool)
    with transfer_phase(be, "data"):  # what the forward and backward upload: token ids, their tables, rope, 1/n
        loss_d, _ = loss_and_grads(params, windows, cfg, be, n_global=n_global, execution=execution, grad_sink=put)
    loss = np.asarray(be.to_numpy(loss_d), dtype=np.float32).reshape(-1)[0]
    if not np.isfinite(loss):
        raise NonFiniteError(f"non-finite loss{where}: {loss}")
    finish(loss_d)
    return out


class StepWatch:
    """What observes a step's phases (the audit's op trace, ``audit.trace``): each method is called as
    its phase begins and computes nothing, so a watched step is the same step, with the same bits.
    This base observes nothing; a watcher overrides what it needs."""

    def micro_batch(self, j: int) -> None:
        """Micro-batch ``j``'s forward and backward begin (``micro_batch_value``)."""

    def tree(self) -> None:
        """The tree's adds that micro-batch's value completes begin (``TreeFolder.push_leaf``)."""

    def update(self, summed, opt: AdamWState) -> None:
        """The update of the tree's sum ``summed`` and the moments ``opt`` begins (``apply_update``)."""


_NO_WATCH = StepWatch()


def subtree_sums(params: dict, windows: np.ndarray, plan: StepPlan, lo: int, hi: int, cfg: ModelConfig,
                 tcfg: TrainConfig, backend, pool: VectorPool | None = None,
                 progress=None, *, execution: Execution = IN_MEMORY,
                 watch: StepWatch | None = None) -> list[tuple[int, int, np.ndarray]]:
    """The maximal subtrees of micro-batches ``lo .. hi-1`` and their sums: ``[(lo, hi, vector), ...]``.

    ``windows`` is the step's whole batch (``plan.n_windows`` rows). Micro-batches are
    computed in ascending order and added as the tree says as soon as two are siblings
    (the right sum added into the left one's memory), so one micro-batch's activations
    and at most ``ceil(log2 M) + 1`` vectors are alive. The vectors come from ``pool``
    (a fresh one when none is given); the caller gives them back when done.
    ``progress(done, total)``, if given, is called after each micro-batch (counts within the range);
    ``watch`` (a ``StepWatch``) is told where each micro-batch and each push into the tree begins.
    """
    be = backend
    watch = watch if watch is not None else _NO_WATCH
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
            watch.micro_batch(j)
            value = micro_batch_value(params, windows[start:stop], cfg, plan.n_global, be, layout, where,
                                      out=pool.take(), execution=execution, pool=pool)
            watch.tree()
            folder.push_leaf(value)
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


class _HostUpdate:
    """Where an update's results live, in host memory: the state as NumPy arrays, its root from their bytes.
    (``update_regime`` picks this, ``_FileUpdate`` or ``_DeviceUpdate``, once per update.)"""

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

    def __init__(self, backend, moments, step: int):
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
    """An update on a backend that keeps the state on its device (``device_vectors``): a host sum (the
    exchange's) is uploaded, the results stay there, and the state root comes from the device's leaf
    digests (``tensor_leaves``), else from the state's bytes copied to the host (the "hashing" phase)."""

    def __init__(self, backend, leaves: bool):
        super().__init__(backend)
        self.leaves = leaves

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


def update_regime(backend, moments, step: int):
    """How an update to ``step`` holds its state: on the device where the backend keeps one there
    (``device_vectors``), in ``moments``'s files (a ``scratch.MomentFiles``, host backends), else in host memory."""
    if backend.capabilities.device_vectors is not None:
        return _DeviceUpdate(backend, backend.capabilities.tensor_leaves is not None)
    return _HostUpdate(backend) if moments is None else _FileUpdate(backend, moments, step)


def apply_update(params: dict, opt: AdamWState, summed: np.ndarray, plan: StepPlan, cfg: ModelConfig,
                 tcfg: TrainConfig, backend, *, moments=None) -> StepResult:
    """Clip, AdamW, and the state root of the new state; ``summed`` is the tree's sum ``S[0, M)``.

    Where the state lives is ``update_regime``'s (chosen once): on a backend with
    ``device_vectors`` the update runs on the device and its results stay there; with
    ``moments`` (a ``scratch.MomentFiles``, host backends) the moments are files; else host
    memory. Every regime gives the same bits and the same root.
    """
    be = backend
    regime = update_regime(be, moments, opt.step + 1)
    loss, grads = GradLayout.of(cfg).unflatten(regime.operand(summed))
    if not np.isfinite(loss):
        raise NonFiniteError(f"non-finite loss at step {plan.step}: {loss}")
    lr = learning_rate(tcfg, plan.tokens_after)  # tokens consumed once this step is done
    new_params, new_opt, norm = optimizer_step(params, grads, opt, cfg, tcfg, lr, be, place=regime.place,
                                               release=regime.release)
    new_params, new_opt, root = regime.results(new_params, new_opt)
    return StepResult(new_params, new_opt, loss, np.float32(np.asarray(be.to_numpy(norm)).reshape(-1)[0]), lr, root)


def step_over_ranks(params: dict, opt: AdamWState, windows: np.ndarray, plan: StepPlan, cfg: ModelConfig,
                    tcfg: TrainConfig, backend, comm=None, *, pool: VectorPool | None = None,
                    host_pool: VectorPool | None = None, moments=None, progress=None,
                    execution: Execution = IN_MEMORY, watch: StepWatch | None = None) -> StepResult:
    """Step ``plan.step`` with its micro-batches split over the ranks of ``comm`` (None: this process alone).

    The one step algorithm, which training and replay both run: this rank's maximal
    subtrees of the micro-batch tree (``subtree_sums`` over ``rank_micro_batches``), the
    exchange that makes the tree's sum ``S[0, M)`` on every rank (``tree_allreduce``, on the
    host), then the update (``apply_update``). The bits do not depend on the number of
    ranks. ``pool``: the step's vectors (a fresh pool when None); ``host_pool``: the
    exchange's host vectors (``pool`` when it is a host pool); ``moments``, ``progress``,
    ``execution`` and ``watch`` (a ``StepWatch``: the audit's trace) as in ``subtree_sums`` and
    ``apply_update``.
    """
    from .collectives import rank_micro_batches, tree_allreduce

    be = backend
    world, rank = (1, 0) if comm is None else (comm.Get_size(), comm.Get_rank())
    layout = GradLayout.of(cfg)
    pool = pool if pool is not None else vector_pool(be, layout.size)
    m = len(plan.micro_batches(tcfg.micro_batch))
    lo, hi = rank_micro_batches(m, world, rank)
    parts = subtree_sums(params, windows, plan, lo, hi, cfg, tcfg, be, pool, progress=progress, execution=execution,
                         watch=watch)
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
    if watch is not None:
        watch.update(summed, opt)
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
