"""``lockstep audit replay RUN --step t``: recompute step t and compare it with what the run published.

For a target step t:

1. **Start.** The newest checkpoint before t that verifies (``checkpoint.load_checkpoint``:
   marker, file digest, every tensor digest, the state root) *and* obeys the run's
   checkpoint rule (``formats.run.Run.checkpoint_problems``: its state root, chain hash
   and tokens are the published ones at its step, its recipe digest is the recipe's,
   its tensors are the recipe's state by name, shape and dtype, its data position is
   the schedule's). A checkpoint that fails is said; with ``--from-earlier`` it is passed
   over, and with none left the replay starts from step 0, ``init_params(cfg, seed)``
   and ``H_0``. A checkpoint folder beyond the trajectory's last step makes the run
   invalid (``Run.beyond``): no chain link covers it.
2. **Data.** The run's data folder (or ``--data DIR``), every shard verified by
   ``Manifest.load``. The stream is built from its start and each step's windows
   come from the step plan (the recipe's batch schedule), never from a record a
   checkpoint carries: a checkpoint's ``stream_state`` is only compared with the
   derived position, and a difference makes the run invalid (``problems``). So does a
   published ``commitment.json`` that is refused (``trajectory.read_commitment``) or is not
   the run's (``trajectory.commitment_problems``); a missing one is only a run not finished.
3. **Each step s = start+1 .. t** (``step.step_over_ranks``, the trainer's step): the global batch of step s,
   its micro-batches one after another (one micro-batch's activations alive at a
   time), added as the spec's tree says (``spec.tree.TreeFolder``: at most
   ceil(log2 M) + 1 gradient sums alive), clipping, AdamW, the state root; then
   ``H_s = chain_hash(s, H_{s-1}, root_s, batch_digest_s, tokens_s, loss_bits_s,
   grad_norm_bits_s, lr_bits_s)``. The tree does not depend on how many ranks
   trained the run, so the replay needs no world size: it matches runs made with
   any number, and with a number that changed on a resume. The state root, chain
   hash, batch digest, token count and the float bits of loss, gradient norm and
   learning rate are compared with the trajectory's record of step s.
4. **On a mismatch** the replay of that target stops. When a checkpoint of step s
   exists, the replayed tensors are compared with its tensors: every tensor whose
   digest differs is named with its first differing Merkle chunk (1 MiB) and first
   differing element. Without one, only the state root is published, and said.

Several targets share work: a target after another continues from the replayed
state when no newer checkpoint lies between them.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from lockstep import backends
from lockstep.backends import BackendUnavailable, declared_memory
from lockstep.formats import checkpoint as ckpt
from lockstep.formats.run import Run
from lockstep.formats.rundir import COMMITMENT_FILE, RunFileError, recorded_world_sizes
from lockstep.formats.schedule import plan_step
from lockstep.formats.state import AdamWState, state_tensors
from lockstep.formats.stream import GlobalStream, batch_digest
from lockstep.formats.trajectory import Strictness
from lockstep.fsio.progress import PhaseProgress
from lockstep.launch import mpi_world
from lockstep.spec import hashing
from lockstep.train.collectives import abort_on_exception, check_state_agreement, rank_micro_batches
from lockstep.train.malloc import keep_freed_memory
from lockstep.train.memory import choose_execution
from lockstep.train.model import init_params
from lockstep.train.optim import NonFiniteError
from lockstep.train.step import GradLayout, step_over_ranks
from lockstep.train.storage import step_storage

from .replay_outcome import COMPARED, ReplayError, ReplayResult, StepCheck, TensorDiff, _diagnose, diff_tensors
from .verify import float_bits

# ---------------------------------------------------------------------------
# The replay
# ---------------------------------------------------------------------------


@dataclass
class _State:
    step: int
    params: dict
    opt: object
    chain: str
    start: int  # the checkpoint step this state descends from


class _Replayer:
    def __init__(self, run: Run, backend_name: str, data, log, from_earlier: bool = False,
                 max_memory: float | None = None, scratch=None, comm=None):
        self.run_dir = run_dir = run.path
        # under mpiexec every rank replays its share of each step's micro-batches; rank 0 speaks
        self.comm = comm if comm is not None and comm.Get_size() > 1 else None
        self.rank, self.world = (self.comm.Get_rank(), self.comm.Get_size()) if self.comm is not None else (0, 1)
        self.log = (log if self.rank == 0 else None) or (lambda msg: None)
        self.from_earlier = from_earlier
        self.notes: list[str] = []
        self.damaged: list[str] = []
        self.skipped_damaged: list[str] = []
        self.passed_over: set[int] = set()  # steps of damaged checkpoints skipped with --from-earlier
        self.backend_choice: str | None = None
        self.last_state: _State | None = None
        keep_freed_memory()  # the steps reuse their memory (lockstep.train.malloc)
        try:
            self.run = run.require("recipe", "trajectory").require_spec_version()
        except RunFileError as exc:
            raise ReplayError(str(exc)) from None
        run = self.run
        self.recipe, self.traj, self.cfg, self.tcfg = run.recipe, run.trajectory, run.cfg, run.tcfg
        try:
            # before anything is allocated (the backend is loaded later): the cheapest plan within the budget
            # for the memory the backend declares, or a one-line refusal
            self.plan = choose_execution(self.cfg, self.tcfg, "replay a step", max_memory=max_memory,
                                         memory=declared_memory(backend_name),
                                         scratch=None if scratch is None else str(scratch))
        except (RunFileError, ValueError) as exc:  # ValueError: an unknown backend name
            raise ReplayError.like(exc) from None
        self.storage = None  # the steps' storage, made by open_storage once the backend is loaded
        self.state_bound = run.state_bound  # a larger state file is refused unread
        self.h0, self.digest = run.genesis, run.recipe_sha256
        try:
            self.manifest = run.open_data(data)
        except RunFileError as exc:
            raise ReplayError(str(exc)) from None
        self.backend_name = backend_name  # loaded by load_backend, once the steps asked for are known to exist

        # The data a step sees is a pure function of the recipe, the manifest and the step: the stream
        # is built from its start and positioned by the step plan; a checkpoint's stream_state is only
        # compared with it (the run's checkpoint rule, ``Run.checkpoint_problems``).
        self.stream = GlobalStream(self.manifest, self.recipe["seed"], self.cfg.seq_len)
        self.problems: list[str] = []  # what makes the run invalid, whatever the replayed steps give
        if "checkpoints" in run.errors:
            self.problems.append(str(run.errors["checkpoints"]))
        for s in run.beyond:
            self.problems.append(f"checkpoint {ckpt.step_dirname(s)} is beyond the trajectory's last step "
                                 f"{len(self.traj)}: no chain link covers what it holds (a trainer saves a step "
                                 "after its record), so the run is invalid: treat it as forged")
        self.commitment = self.traj[-1]["chain_hash"] if self.traj else self.h0
        if not (run_dir / COMMITMENT_FILE).exists() and not (run_dir / COMMITMENT_FILE).is_symlink():
            self.notes.append(f"{run_dir / COMMITMENT_FILE}: missing (the run did not finish, or its commitment "
                              "was not published); the trajectory's last chain hash stands in for it")
        else:  # published: it must be the one the trainer wrote for this run, or the run is invalid
            try:
                for problem in run.commitment_problems():
                    self.problems.append(f"{run_dir / COMMITMENT_FILE}: {problem}")
                self.commitment = run.commitment["chain_hash"]
            except RunFileError as exc:
                self.problems.append(str(exc))
        if run.chain_breaks:
            # a replay starts from a checkpoint whose chain hash is the published H_c; that is only evidence
            # when the links before it hold, so a broken link anywhere makes the run invalid
            t = run.chain_breaks[0]
            self.problems.append(f"the published chain is broken at step {t}: its chain_hash is not H_{t} "
                                 f"recomputed from the record and H_{t - 1} (`lockstep audit verify` lists every "
                                 "broken link)")

    def processes_line(self, step: int) -> str:
        """How the micro-batches of ``step`` are split over the processes (``collectives.rank_micro_batches``)."""
        if self.world == 1:
            return "one process"
        m = len(plan_step(self.tcfg, self.cfg.seq_len, step).micro_batches(self.tcfg.micro_batch))
        spans = [rank_micro_batches(m, self.world, r) for r in range(self.world)]
        split = ", ".join(f"rank {r}: {lo}..{hi - 1}" if hi > lo else f"rank {r}: none" for r, (lo, hi) in enumerate(spans))
        return f"{self.world} processes (its {m} micro-batches split {split})"

    def open_storage(self) -> None:
        """Where the replayed steps keep their vectors and state (``train.storage``, as training does):
        host memory, the plan's scratch folder, or the backend's device."""
        if self.storage is not None:
            return
        try:
            self.storage = step_storage(self.be, GradLayout.of(self.cfg).size, self.plan.execution.scratch)
        except (ValueError, OSError) as exc:
            raise ReplayError(f"--scratch: {exc}") from None

    def close(self) -> None:
        if self.storage is not None:
            self.storage.close()
            self.storage = None

    def load_backend(self) -> None:
        if self.backend_name == "auto":
            # here, not at the top: choosing runs the conformance suite, whose records and Hypothesis
            # strategies add about 0.12 s to the start of every command that imports this module
            from lockstep.conformance.choose import choose_backend

            self.be, self.backend_choice = choose_backend(self.log)
            self.log(f"backend: {self.backend_choice}")
            return
        try:
            self.be = backends.get_backend(self.backend_name)
        except BackendUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - a backend that fails to load is an error, not a crash
            raise ReplayError(f"backend {self.backend_name!r} could not be loaded ({type(exc).__name__}: {exc}); "
                              "check it with `lockstep conformance --backend NAME`, or replay with --backend spec")

    # -- checkpoints -----------------------------------------------------------------

    def _load(self, step: int) -> tuple[ckpt.Checkpoint | None, str | None]:
        """``(checkpoint, None)`` when the folder of ``step`` verifies, else ``(None, what is damaged)``."""
        try:
            return self.run.load_checkpoint(step), None
        except ckpt.CheckpointError as exc:
            return None, str(exc)

    @staticmethod
    def _once(kind: list[str], msg: str) -> None:
        if msg not in kind:
            kind.append(msg)

    def start_state(self, target: int) -> _State | None:
        """The newest sound checkpoint before ``target`` (or step 0); None when the replay must not go on.

        ``Run.sound_start`` applies the run's checkpoint rule. A damaged checkpoint (or
        one that contradicts the run) at the natural start is reported at the top of the
        result. Without ``from_earlier`` the target is not replayed from an older state
        (that can be many more steps, and the user should know first); with it the next
        older checkpoint is tried.
        """
        start = self.run.sound_start(target, self.stream, skip_unsound=self.from_earlier)
        for step, kind, why in start.unsound + ([start.stopped] if start.stopped else []):
            name = ckpt.step_dirname(step)
            if kind == "contradicts":
                self._once(self.problems, f"checkpoint {name} contradicts the run: {why}")
            elif self.from_earlier:
                self._once(self.skipped_damaged, f"checkpoint {name}: {why}")
                self.passed_over.add(step)
            else:
                self._once(self.damaged, f"checkpoint {name}: {why}")
        if start.stopped is not None:
            step, kind, _ = start.stopped
            older = [s for s in self.run.checkpoint_steps if s < step]
            more = f"checkpoint {ckpt.step_dirname(older[-1])}" if older else "the initial state"
            self.notes.append(f"step {target} was not replayed: its start, checkpoint {ckpt.step_dirname(step)}, "
                              f"{'is damaged' if kind == 'damaged' else 'contradicts the run'}; `--from-earlier` "
                              f"replays it from {more} ({target - (older[-1] if older else 0)} steps)")
            return None
        if start.step:
            return _State(start.step, start.params, start.opt, start.chain, start.step)
        with PhaseProgress("initializing parameters", 1, "parameters", write=self.log) as bar:
            params = init_params(self.cfg, self.recipe["seed"], self.be, bar.update)
        return _State(0, params, AdamWState.zeros(params), self.h0, 0)

    def compare_with_checkpoint(self, check: StepCheck, s: int, res, chain: str, plan) -> None:
        """The replayed state of step ``s`` against the checkpoint saved at ``s``, when there is one.

        A damaged checkpoint there (or none at the run's last step, which the trainer
        always saves) is reported; a verified one must hold the replayed state root,
        chain hash, token count and the recipe's data position.
        """

        name = ckpt.step_dirname(s)
        if s not in self.run.complete and s not in self.run.damaged_folders:
            if s == len(self.traj):
                self._once(self.damaged, f"no checkpoint of the last step {s} ({name}): the run's final weights "
                                         "are not published (the trainer always saves the last step)")
            return
        if s in self.passed_over:
            return  # damaged, reported, and replayed past at the user's request (--from-earlier)
        c, damage = self._load(s)
        if damage is not None:
            self._once(self.damaged, f"checkpoint {name}, at replayed step {s}: {damage}")
            return
        for problem in self.run.checkpoint_problems(c, self.stream):
            if not problem.of_record:  # the record's values are compared with the replay's below
                self._once(self.problems, f"checkpoint {name} contradicts the run: {problem}")
        for key, replayed, published in (("checkpoint_state_root", res.state_root, c.sidecar["state_root"]),
                                         ("checkpoint_chain_hash", chain, c.sidecar.get("chain_hash")),
                                         ("checkpoint_tokens", plan.tokens_after, c.sidecar.get("tokens"))):
            check.replayed[key], check.published[key] = replayed, published
            if replayed != published:
                check.differs.append(key)
        if res.state_root != c.sidecar["state_root"]:
            check.tensor_diffs = diff_tensors(state_tensors(res.params, res.opt), c.tensors, f"checkpoint {name}")
            why = f"the checkpoint saved at step {s} holds another state than the replay (the trajectory matches)"
            check.note = why if check.note is None else f"{check.note}; {why}"

    # -- one step ----------------------------------------------------------------------

    def step(self, st: _State) -> tuple[StepCheck, _State | None]:
        s = st.step + 1
        t0 = time.perf_counter()
        plan = plan_step(self.tcfg, self.cfg.seq_len, s)
        windows = self.stream.windows(plan.first_window, plan.n_windows)
        bd = batch_digest(windows)
        rec = self.traj[s - 1]
        published = {k: rec[k] for k in COMPARED if k in rec}
        try:
            with PhaseProgress(f"  step {s}", 1, "micro-batches", write=self.log) as bar:
                params, opt = self.storage.adopt(st.params, st.opt)
                with abort_on_exception(self.comm) if self.comm is not None else contextlib.nullcontext():
                    res = step_over_ranks(params, opt, windows, plan, self.cfg, self.tcfg, self.be, self.comm,
                                          storage=self.storage, progress=bar.update,
                                          execution=self.plan.execution)
                    if self.comm is not None:
                        check_state_agreement(self.comm, res.state_root, s)
        except NonFiniteError as exc:
            check = StepCheck(s, st.start, {"batch_digest": bd}, published, ["state_root", "chain_hash"],
                              note=f"the replay stopped: {exc} (the run published finite values)",
                              seconds=time.perf_counter() - t0)
            return check, None
        replayed = {"state_root": res.state_root, "batch_digest": bd, "tokens": plan.tokens_after,
                    "loss_bits": float_bits(res.loss), "grad_norm_bits": float_bits(res.grad_norm),
                    "lr_bits": float_bits(res.lr)}
        chain = replayed["chain_hash"] = hashing.record_chain_hash(st.chain, {"step": s, **replayed})
        replayed = {k: v for k, v in replayed.items() if k in published or k in ("state_root", "chain_hash")}
        differs = [k for k in COMPARED if k in replayed and replayed[k] != published.get(k)]
        check = StepCheck(s, st.start, replayed, published, differs, seconds=time.perf_counter() - t0)
        if not differs:
            self.compare_with_checkpoint(check, s, res, chain, plan)
            check.seconds = time.perf_counter() - t0
            return check, (_State(s, res.params, res.opt, chain, st.start) if check.match else None)
        if "batch_digest" in differs:
            check.note = (f"the data gives windows {plan.first_window}..{plan.first_window + plan.n_windows - 1} "
                          "another digest than the trajectory's: the published step did not train on the recipe's data")
        if "state_root" in differs:
            check.tensor_diffs, why = _diagnose(self.run_dir, s, state_tensors(res.params, res.opt), res.state_root,
                                                self.state_bound)
            check.note = why if check.note is None else f"{check.note}; {why}"
        elif differs == ["chain_hash"]:
            check.note = ("the state root and every published value match but the chain hash does not: the "
                          "published chain hash (or the previous one) was altered")
        elif "batch_digest" not in differs:
            fields = [k for k in differs if k != "chain_hash"]
            check.note = (f"the state matches; the trajectory's published {', '.join(fields)} do not (the chain "
                          "hash covers them, so it differs too)")
        return check, None


def replay_steps(run: Run | str | os.PathLike, steps, backend_name: str = "spec",
                 data: str | os.PathLike | None = None, log=None, from_earlier: bool = False,
                 max_memory: float | None = None, scratch: str | os.PathLike | None = None) -> ReplayResult:
    """Replay the given steps of ``run`` (a run directory, or a ``Run`` a caller opened: module docstring)
    and compare each with the trajectory.

    ``backend_name="auto"`` picks the fastest installed backend that passes
    conformance here (``choose_backend``). A damaged checkpoint at a target's start
    stops that target unless ``from_earlier``. Before each run of steps ``log`` says
    how many steps it will replay and from where, then one progress line per step
    with an estimate of the time left. Raises ``ReplayError`` when the replay cannot
    run at all, and ``lockstep.backends.BackendUnavailable`` for a backend that
    cannot run here.

    Memory: the cheapest plan whose modelled peak fits ``max_memory`` GiB (default:
    this machine's memory; ``train.memory.choose_execution``), with the moments and the
    tree's sums in ``scratch`` when only that fits; none fitting is a ``ReplayError``
    before anything is allocated. The plan never changes a bit.
    """
    t0 = time.perf_counter()
    try:
        run = Run.of(run, Strictness.AUDIT)
    except RunFileError as exc:  # not a directory
        raise ReplayError(str(exc)) from None
    comm, _, _ = mpi_world()
    rp = _Replayer(run, backend_name, data, log, from_earlier, max_memory, scratch, comm)
    try:
        return _replay_targets(rp, steps, t0)
    finally:
        rp.close()


def _replay_targets(rp: "_Replayer", steps, t0: float) -> ReplayResult:
    n = len(rp.traj)
    try:
        targets = sorted({int(s) for s in steps})
    except (TypeError, ValueError):
        raise ReplayError(f"steps must be integers, got {steps!r}") from None
    if not targets:
        raise ReplayError("no step to replay")
    bad = [t for t in targets if not 1 <= t <= n]
    if bad:
        raise ReplayError(f"{rp.run_dir}: the run has steps 1..{n}; cannot replay step(s) {bad}")
    rp.load_backend()
    rp.open_storage()
    plan_said = False
    for p in rp.problems:
        rp.log(f"RUN INVALID: {p}")
    checks: list[StepCheck] = []
    state: _State | None = None
    for t in targets:
        if state is None or state.step >= t or _newer_checkpoint(rp, state.step, t):
            said = len(rp.damaged) + len(rp.skipped_damaged) + len(rp.problems)
            state = rp.start_state(t)
            for d in (rp.problems + rp.damaged + rp.skipped_damaged)[said:]:
                rp.log(f"DAMAGED OR INVALID: {d}")
            if state is None:
                continue
        if not plan_said:  # after what is damaged or invalid has been said, before the first step runs
            rp.log(rp.plan.line("replay"))
            plan_said = True
        _replay_run_of_steps(rp, state, t, checks)
        state = rp.last_state
    if rp.world > 1 and checks:
        rp.notes.append(f"replayed on {rp.world} processes (mpiexec), every step's micro-batches split over them "
                        "as training splits them; the bits do not depend on the number")
    trained_on = recorded_world_sizes(rp.run_dir, [c.step for c in checks])
    for c in checks:
        c.world_size = trained_on.get(c.step)
    return ReplayResult(run_dir=rp.run_dir, targets=targets, checks=checks, backend=rp.be.name,
                        backend_description=rp.be.description, preset=rp.cfg.name,
                        commitment=rp.commitment, last_step=n, genesis=rp.h0, recipe_sha256=rp.digest,
                        seconds=time.perf_counter() - t0, notes=rp.notes, problems=rp.problems,
                        damaged=rp.damaged, skipped_damaged=rp.skipped_damaged, backend_choice=rp.backend_choice)


def _replay_run_of_steps(rp: _Replayer, state: _State, target: int, checks: list[StepCheck]) -> None:
    """Steps state.step+1 .. target: said first, then a progress line with an estimate after each."""
    first, count = state.step + 1, target - state.step
    origin = (f"checkpoint {ckpt.step_dirname(state.start)}" if state.start and state.step == state.start else
              "the initial state" if state.step == 0 else f"the state replayed to step {state.step}")
    rp.log(f"replaying {count} step(s), {first}..{target}, from {origin} on {rp.processes_line(first)} (the spec's micro-batch "
           f"tree needs no world size), backend {rp.be.name}")
    t0 = time.perf_counter()
    done = 0
    while state is not None and state.step < target:
        check, state = rp.step(state)
        checks.append(check)
        done += 1
        per_step = (time.perf_counter() - t0) / done
        left = f", about {_duration(per_step * (count - done))} left" if done < count and state is not None else ""
        rp.log(f"  step {check.step} ({done}/{count}): {'match' if check.match else 'MISMATCH'}, "
               f"{check.seconds:.1f}s{left}")
    rp.last_state = state


def _newer_checkpoint(rp: _Replayer, have: int, target: int) -> bool:
    """True when a complete checkpoint lies strictly between the replayed state and the target."""
    return any(have < s < target for s in rp.run.complete)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def replay_step(run_dir: str | os.PathLike, step: int, backend_name: str = "spec",
                data: str | os.PathLike | None = None, log=None, from_earlier: bool = False) -> ReplayResult:
    """Replay step ``step`` (and the steps between its starting checkpoint and it); see ``replay_steps``."""
    return replay_steps(run_dir, [step], backend_name, data, log, from_earlier)


__all__ = ["ReplayError", "ReplayResult", "StepCheck", "TensorDiff", "diff_tensors", "replay_step", "replay_steps"]
