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

Where a step's vectors and state live is its ``StepStorage`` (``train.storage``), chosen once
for a run: host memory, a scratch folder's files, or the device of a backend that keeps its
state there. The step only calls the storage's interface (its pool's ``take``, ``give``,
``park``, ``write``; ``update(step)``), so it is written once, and the bits are the same for
every storage.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np

from lockstep.formats.config import ModelConfig, TrainConfig
from lockstep.formats.params import param_specs
from lockstep.formats.schedule import StepPlan, learning_rate
from lockstep.formats.state import AdamWState
from lockstep.spec import tree

from .execution import IN_MEMORY, Execution
from .model import loss_and_grads
from .optim import NonFiniteError, optimizer_step
from .storage import HostStorage, VectorPool, in_place_add, step_storage, transfer_phase


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

        ``pool`` is where ``out`` came from (a ``train.storage`` pool); it does each write (``write``:
        into host memory, a scratch file's pages released once written, or device memory). None:
        ``out``'s own kind (``own_pool``).
        ``finish(loss)`` writes the loss and checks that every gradient came, once."""
        if tuple(out.shape) != (self.size,):
            raise ValueError(f"a step's gradient vector has {self.size} float32 elements, got shape {out.shape}")
        be, where = backend, self.offsets
        if isinstance(out, np.ndarray) and out.dtype != np.float32:
            raise ValueError(f"a step's gradient vector is float32, got {out.dtype}")
        pool = pool if pool is not None else own_pool(be, out, self.size)
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


def own_pool(backend, out, length: int):
    """The pool that writes into ``out`` when a caller named none: a host vector's (``VectorPool``),
    else the pool of the backend's own storage (device vectors where it keeps them)."""
    return VectorPool(length) if isinstance(out, np.ndarray) else step_storage(backend, length).pool


def micro_batch_value(params: dict, windows: np.ndarray, cfg: ModelConfig, n_global: int, backend,
                      layout: GradLayout, where: str = "", out: np.ndarray | None = None, *,
                      execution: Execution = IN_MEMORY, pool=None) -> np.ndarray:
    """One micro-batch's loss and gradients (contributions to the mean over ``n_global`` tokens),
    flattened (into ``out`` when given, a vector from ``pool``; else a new one from ``pool``, or from
    ``own_pool``). ``execution``: how it holds memory (``train.execution``), never a bit.

    Each gradient is copied into its place in the vector as soon as the backward has
    finished it (``GradLayout.writer``, through the pool: a scratch vector's written slices
    leave RAM), so the micro-batch's gradients and its vector are never all alive at once."""
    be = backend
    pool = pool if pool is not None else own_pool(be, out, layout.size)
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
                 tcfg: TrainConfig, backend, pool=None,
                 progress=None, *, execution: Execution = IN_MEMORY,
                 watch: StepWatch | None = None) -> list[tuple[int, int, np.ndarray]]:
    """The maximal subtrees of micro-batches ``lo .. hi-1`` and their sums: ``[(lo, hi, vector), ...]``.

    ``windows`` is the step's whole batch (``plan.n_windows`` rows). Micro-batches are
    computed in ascending order and added as the tree says as soon as two are siblings
    (the right sum added into the left one's memory), so one micro-batch's activations
    and at most ``ceil(log2 M) + 1`` vectors are alive. The vectors come from ``pool`` (a storage's
    pool; the backend's own storage's when none is given); the caller gives them back when done.
    ``progress(done, total)``, if given, is called after each micro-batch (counts within the range);
    ``watch`` (a ``StepWatch``) is told where each micro-batch and each push into the tree begins.
    """
    be = backend
    watch = watch if watch is not None else _NO_WATCH
    bounds = plan.micro_batches(tcfg.micro_batch)
    layout = GradLayout.of(cfg)
    pool = pool if pool is not None else step_storage(be, layout.size).pool
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


def apply_update(params: dict, opt: AdamWState, summed, plan: StepPlan, cfg: ModelConfig,
                 tcfg: TrainConfig, backend, *, storage: HostStorage | None = None) -> StepResult:
    """Clip, AdamW, and the state root of the new state; ``summed`` is the tree's sum ``S[0, M)``.

    ``storage`` (``train.storage``; the backend's own when None) says where the update reads its
    operands and leaves its results (``storage.update``): host memory, the moments' scratch files,
    or the device. Every storage gives the same bits and the same root.
    """
    be = backend
    storage = storage if storage is not None else step_storage(be, GradLayout.of(cfg).size)
    regime = storage.update(opt.step + 1)
    loss, grads = GradLayout.of(cfg).unflatten(regime.operand(summed))
    if not np.isfinite(loss):
        raise NonFiniteError(f"non-finite loss at step {plan.step}: {loss}")
    lr = learning_rate(tcfg, plan.tokens_after)  # tokens consumed once this step is done
    new_params, new_opt, norm = optimizer_step(params, grads, opt, cfg, tcfg, lr, be, place=regime.place,
                                               release=regime.release)
    new_params, new_opt, root = regime.results(new_params, new_opt)
    return StepResult(new_params, new_opt, loss, np.float32(np.asarray(be.to_numpy(norm)).reshape(-1)[0]), lr, root)


def step_over_ranks(params: dict, opt: AdamWState, windows: np.ndarray, plan: StepPlan, cfg: ModelConfig,
                    tcfg: TrainConfig, backend, comm=None, *, storage: HostStorage | None = None, progress=None,
                    execution: Execution = IN_MEMORY, watch: StepWatch | None = None) -> StepResult:
    """Step ``plan.step`` with its micro-batches split over the ranks of ``comm`` (None: this process alone).

    The one step algorithm, which training and replay both run: this rank's maximal
    subtrees of the micro-batch tree (``subtree_sums`` over ``rank_micro_batches``), the
    exchange that makes the tree's sum ``S[0, M)`` on every rank (``tree_allreduce``, on the
    host), then the update (``apply_update``). The bits do not depend on the number of
    ranks. ``storage``: where the step's vectors and state live (``train.storage``; the
    backend's own when None: host memory, or its device); ``progress``, ``execution`` and
    ``watch`` (a ``StepWatch``: the audit's trace) as in ``subtree_sums``.
    """
    from .collectives import rank_micro_batches, tree_allreduce

    be = backend
    world, rank = (1, 0) if comm is None else (comm.Get_size(), comm.Get_rank())
    layout = GradLayout.of(cfg)
    storage = storage if storage is not None else step_storage(be, layout.size)
    pool, host_pool = storage.pool, storage.host_pool
    m = len(plan.micro_batches(tcfg.micro_batch))
    lo, hi = rank_micro_batches(m, world, rank)
    parts = subtree_sums(params, windows, plan, lo, hi, cfg, tcfg, be, pool, progress=progress, execution=execution,
                         watch=watch)
    if world > 1:
        with transfer_phase(be, "exchange"):  # MPI moves host memory: a device's subtree sums come over
            sent = parts if host_pool is pool else [(a, b, be.to_numpy(v)) for a, b, v in parts]
            summed = tree_allreduce(comm, sent, m, layout.size, be.add, out=host_pool.take(),
                                    add_into=be.capabilities.add_into)
        pool.give(*(v for _, _, v in parts))
    else:
        [(_, _, summed)] = parts
    if watch is not None:
        watch.update(summed, opt)
    res = apply_update(params, opt, summed, plan, cfg, tcfg, be, storage=storage)
    (host_pool if world > 1 else pool).give(summed)  # dead: the update's results are new arrays
    return res


def tree_step(params: dict, opt: AdamWState, windows: np.ndarray, plan: StepPlan, cfg: ModelConfig,
              tcfg: TrainConfig, backend, *, storage: HostStorage | None = None, progress=None,
              execution: Execution = IN_MEMORY) -> StepResult:
    """Step ``plan.step`` on one process from the state ``params``, ``opt``: the whole tree, then the
    update (``step_over_ranks`` with no ranks).

    ``windows`` is the step's batch (``plan.n_windows`` rows). Its bits are those of a
    run with any number of ranks, and of any ``execution`` and ``storage`` (the backend's own
    when None; the state is adopted into it first).
    """
    storage = storage if storage is not None else step_storage(backend, GradLayout.of(cfg).size)
    params, opt = storage.adopt(params, opt)
    return step_over_ranks(params, opt, windows, plan, cfg, tcfg, backend, None, storage=storage,
                           progress=progress, execution=execution)
