"""The training loop: one process, or R ranks under ``mpiexec``; a run directory; resume.

The run directory's files, their names and their one reader and writer are
``lockstep.formats.rundir``.

The loop, per step t: plan the global batch (``step.plan_step``), compute this
rank's micro-batches as whole subtrees of the spec's tree (``collectives.rank_micro_batches``,
``step.subtree_sums``), combine the ranks' subtree sums as the tree says
(``collectives.tree_allreduce``), clip + AdamW (``step.apply_update``), compare
state roots across ranks, extend the chain, record, checkpoint every K steps.
Nothing published depends on the number of ranks: the recipe does not record it,
a run resumes on any number, and only ``metrics.jsonl`` says how many trained each step.

Before the loop every argument is checked on every rank and nothing is written
until all agree (``collectives.on_all_ranks``). A resume starts from the last
complete checkpoint, or from the initial state (recipe and seed) when there is
none, and runs to the recorded target unless given another. The first SIGINT or
SIGTERM ends the run after the current step with a checkpoint (``stop``), the
ranks agreeing on the step; the second stops it at once. A file the loop cannot write
(a full disk) raises ``RunWriteError``: which file, and the checkpoint the run resumes from.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lockstep.backends import MemoryProfile
from lockstep.errors import LockstepError, Setting
from lockstep.fsio import check_regular_or_absent, printable
from lockstep.launch import mpi_world
from lockstep.fsio.progress import PhaseProgress

from lockstep.formats import checkpoint as ckpt
from lockstep.formats.config import ConfigError, ModelConfig, TrainConfig, checkpoint_every as default_checkpoint_every
from lockstep.formats.manifest import Manifest
from lockstep.formats.tokenizer import BYTE_TOKENIZER_VOCAB_SIZE
from lockstep.formats.stream import GlobalStream, batch_digest
from .model import init_params
from lockstep.formats.rundir import (DATA_DIR, METRICS_FILE, RECIPE_FILE, TARGET_FILE, TRAJECTORY_FILE, read_target, write_target)
from lockstep.formats.recipe import genesis, make_recipe, recipe_digest, write_recipe
from lockstep.formats.run import Run
from lockstep.formats.trajectory import Strictness, read_trajectory, step_record, write_commitment, write_trajectory
from lockstep.formats.trajectory import append_record
from .malloc import keep_freed_memory
from .execution import Execution
from .memory import Plan, choose_execution
from lockstep.formats.schedule import plan_step
from .step import GradLayout, step_over_ranks
from .storage import step_storage, transfer_phase
from lockstep.formats.state import AdamWState, state_tensors
from .stop import StopRequest


class RecipeMismatch(LockstepError, RuntimeError):
    """A resume was asked with settings that differ from the run's recipe."""


class RunExists(LockstepError, FileExistsError):
    """A new run was asked in a directory that already holds one."""


class RunWriteError(LockstepError, RuntimeError):
    """A file of the run could not be written during the loop (a full disk, a quota, an I/O error).

    Nothing published is lost: every file is written atomically (a checkpoint that was not finished
    leaves no folder), so the run resumes from ``resume_step``, its last complete checkpoint (0: its
    initial state), and trains the steps after it again, to the same bits. ``what`` names the file
    that was not written, ``step`` the step being recorded; the message says all of it in the
    library's terms (the CLI adds the command that resumes).
    """

    def __init__(self, run_dir: Path, what: str, step: int, resume_step: int, world_size: int, cause: OSError):
        self.run_dir, self.what, self.step, self.resume_step = Path(run_dir), what, step, resume_step
        self.world_size = world_size
        reason = cause.strerror or str(cause) or type(cause).__name__
        start = f"checkpoint {resume_step}" if resume_step else "its initial state (it has no checkpoint yet)"
        again = ("" if step <= resume_step else f"; step {step} is trained again, to the same bits"
                 if step == resume_step + 1 else f"; steps {resume_step + 1}..{step} are trained again, to the same bits")
        room = ("once there is room on its file system" if cause.errno in _NO_ROOM else "once that is fixed")
        super().__init__(f"{run_dir}: {what} was not written ({reason}); nothing published is lost (every file "
                         f"is written atomically): {room}, the run resumes from {start}{again}")


_NO_ROOM = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}


@contextlib.contextmanager
def _writing(run_dir: Path, what: str, step: int, resume_step: int, world_size: int):
    """Around a write of the loop: an ``OSError`` (not a closed pipe: that is the terminal's) becomes
    ``RunWriteError`` saying what was not written and where the run resumes."""
    try:
        yield
    except ConnectionError:  # BrokenPipeError among them: a reader of the output went away, no file failed
        raise
    except OSError as exc:
        raise RunWriteError(run_dir, what, step, resume_step, world_size, exc) from exc


# ---------------------------------------------------------------- MPI

# ---------------------------------------------------------------- progress

class Progress:
    def __init__(self, total_steps: int, enabled: bool):
        self.total = total_steps
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def update(self, step: int, loss: float, tok_s: float) -> None:
        if not self.enabled:
            return
        width = 24
        done = int(width * step / max(self.total, 1))
        bar = "#" * done + "-" * (width - done)
        line = printable(f"[{bar}] step {step}/{self.total}  loss {loss:.4f}  {tok_s:,.0f} tok/s  "
                         f"{time.perf_counter() - self.t0:,.0f}s")
        if self.tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)


# ---------------------------------------------------------------- the run

@dataclass
class RunSummary:
    run_dir: Path
    last_step: int          # the last step trained (the target, unless stopped early)
    chain_hash: str
    loss: float
    rank: int = 0
    target: int = 0         # the step the run is to reach (target.json)
    stopped_by: int = 0     # the signal that stopped the run before its target; 0 if none
    world_size: int = 1


@dataclass(frozen=True)
class RunHooks:
    """Work the trainer hands to the layers above it, which it does not import.

    The CLI wires lockstep's own (``lockstep.use.hooks.run_hooks``: the validation loss
    and ``loss.png``); without hooks a run trains and publishes the same bits and
    writes neither. None of them decides a published bit.

    * ``validate(run_dir, step, tokens, params, cfg, manifest, backend, eval_batch, say)``:
      after the checkpoint of an evaluation step, on rank 0 (metrics.jsonl);
    * ``eval_interval(eval_every, cfg) -> int``: the interval in steps (0: never),
      ``eval_every`` None meaning the preset's default;
    * ``plot(run_dir, trajectory) -> Path | None``: when the run reaches its target;
    * ``setting(name) -> str``: how the run's lines name a setting (``steps``, ``micro_batch``):
      the front end's word for it (the CLI's flag); None: the keyword itself.
    """

    validate: Callable[..., object] | None = None
    eval_interval: Callable[[int | None, ModelConfig], int] | None = None
    plot: Callable[[Path, list[dict]], Path | None] | None = None
    setting: Callable[[str], str] | None = None

    def word(self, name: str) -> str:
        """How the run's lines name the setting ``name`` (``setting``, else the keyword)."""
        return name if self.setting is None else self.setting(name)

    def interval(self, eval_every: int | None, cfg: ModelConfig) -> int:
        if self.eval_interval is not None:
            return self.eval_interval(eval_every, cfg)
        if eval_every in (None, 0):
            return 0
        raise ValueError(f"eval_every {eval_every!r} needs a validation hook (lockstep.use.hooks.run_hooks())")


@dataclass
class _Start:
    """Everything the loop needs, checked on every rank before anything is written."""
    recipe: dict
    cfg: ModelConfig
    tcfg: TrainConfig
    params: dict
    opt: AdamWState
    start_step: int
    prev_chain: str
    stream: GlobalStream
    last_step: int
    kept_trajectory: list[dict] | None  # resume, rank 0: the records up to start_step, to rewrite
    plan: Plan | None = None            # how the steps hold memory (memory.choose_execution)


@dataclass(frozen=True)
class RunSettings:
    """What a run is asked to be (``train``'s settings; see ``train`` for each).

    A new run: ``cfg``, ``tcfg``, ``data``, ``seed`` and a target (``steps`` or ``tokens``);
    a resume (``resume=True``) takes the recipe's, ``data`` and the target optional. How it
    runs: ``backend_name``, ``checkpoint_every``, ``eval_every``, and its memory plan
    (``max_memory``, ``scratch``, ``execution``), none of which changes a bit.
    """

    cfg: ModelConfig | None = None
    tcfg: TrainConfig | None = None
    data: str | Path | None = None
    seed: int = 42
    steps: int | None = None
    tokens: int | None = None
    backend_name: str = "spec"
    checkpoint_every: int | None = None
    resume: bool = False
    eval_every: int | None = 0
    max_memory: float | None = None
    scratch: str | Path | None = None
    execution: Execution | None = None


def train(run_dir: str | Path, settings: RunSettings | None = None, *, progress: bool = True, log=print,
          check_recipe=None, handle_signals: bool = True, hooks: RunHooks | None = None, **asked) -> RunSummary:
    """Train (or resume) the run in ``run_dir`` as ``settings`` say (a ``RunSettings``, or its fields
    given as keywords: ``train(out, cfg=..., tcfg=..., steps=4)``); see the module docstring.

    A new run needs ``cfg``, ``tcfg``, ``seed``, ``steps`` or ``tokens``, and ``data``
    (None or ``"default"``: the embedded corpus, built inside the run; else a data
    folder). A resume (``resume=True``) takes all of that from the run; ``data`` is
    then the data folder the user gives (default: the recipe's folder, which must be inside
    the run), ``steps``/``tokens`` move the target (default: the recorded one), and
    ``check_recipe(recipe)`` may refuse settings the run cannot honour.

    ``checkpoint_every`` K: a checkpoint every K steps, at the last step and when
    stopped; None: the default for the run's model name (``config.checkpoint_every``:
    100 for open-1b, 50 otherwise).

    Every argument is checked, on every rank, before anything is written; an error
    found then is raised on all ranks together (``AgreedError`` under mpiexec). With
    ``handle_signals`` the first SIGINT/SIGTERM stops the run after the current step
    with a checkpoint (``RunSummary.stopped_by``), the second at once.

    ``eval_every`` K > 0: every K steps and at the last, rank 0 saves a checkpoint and
    calls ``hooks.validate`` (the CLI's records the validation loss in metrics.jsonl);
    None: ``hooks.eval_interval``'s default for the preset; 0: never. ``hooks``
    (``RunHooks``) also draws the loss curve at the end; without hooks nothing but the
    run's own files is written.

    Memory: ``memory.choose_execution`` picks the cheapest plan whose modelled peak fits
    ``max_memory`` GiB (default: this machine's memory), the state's files in ``scratch``
    (default: the run directory) when only that fits, and says it in one line; when none
    fits the run is refused before the model is built or anything is written.
    ``execution`` fixes the plan instead (it is only checked against the budget). No
    plan changes a bit.
    """
    from .collectives import abort_on_exception, on_all_ranks

    if settings is None:
        settings = RunSettings(**asked)
    elif asked:
        raise TypeError(f"train takes its settings as a RunSettings or as keywords, not both ({', '.join(asked)})")
    s = settings
    comm, rank, world = mpi_world()
    keep_freed_memory()  # the steps reuse their memory instead of faulting in fresh pages (malloc module)
    run_dir = Path(run_dir)
    is_root = rank == 0
    say = log if is_root else (lambda *a, **k: None)

    ctx = abort_on_exception(comm) if comm is not None else _null_ctx()
    with ctx:
        be = on_all_ranks(comm, lambda: _checked_backend(s.backend_name, s.checkpoint_every))
        memory = _MemoryAsk(s.max_memory, None if s.scratch is None else str(s.scratch), s.execution, be.memory,
                            str(run_dir))
        if s.resume:
            st = on_all_ranks(comm, lambda: _resume_start(run_dir, s, is_root, check_recipe, memory, be, progress))
        else:
            st = _new_run_start(comm, run_dir, s, is_root, say, memory, be, progress)
        # every argument is checked: now write (rank 0), and make sure it worked everywhere
        on_all_ranks(comm, lambda: _write_start(run_dir, st, s.resume) if is_root else None)
        if s.resume:
            say(f"resuming {run_dir} from " + (f"step {st.start_step}" if st.start_step else
                                                "its initial state (no checkpoint yet)"))
        with StopRequest(install=handle_signals, announce=is_root) as stop:
            every = default_checkpoint_every(st.cfg.name) if s.checkpoint_every is None else s.checkpoint_every
            hooks = hooks or RunHooks()
            loop = _Loop(comm, rank, world, run_dir, be, every, progress, say, stop,
                         hooks.interval(s.eval_every, st.cfg), hooks)
            return _run_loop(loop, st)


def _checked_backend(backend_name: str, checkpoint_every: int | None):
    from lockstep.backends import get_backend

    if checkpoint_every is not None and (type(checkpoint_every) is not int or checkpoint_every < 1):
        raise ConfigError(f"checkpoint_every must be a positive integer, got {checkpoint_every!r}")
    return get_backend(backend_name)


def initial_params(cfg: ModelConfig, seed: int, be, show: bool) -> dict:
    """``init_params`` through the backend (its ``truncated_normal`` capability, if any), with
    progress lines on stderr when it takes more than a few seconds and ``show``."""
    with PhaseProgress("initializing parameters", 1, "parameters", enabled=show) as bar:
        return init_params(cfg, seed, be, bar.update)


@dataclass(frozen=True)
class _MemoryAsk:
    max_memory: float | None
    scratch: str | None      # the folder the user named, or None: the run directory
    given: Execution | None
    memory: MemoryProfile    # what the backend declares it holds (``Backend.memory``)
    run_dir: str

    def plan(self, cfg: ModelConfig, tcfg: TrainConfig, what: str) -> Plan:
        """The plan (``memory.choose_execution``); a named scratch folder is checked now, before anything is written."""
        if self.scratch is not None:
            if os.path.islink(self.scratch) or not os.path.isdir(self.scratch):
                raise ConfigError.naming(Setting("scratch"),
                                         f" {self.scratch}: not an existing folder (a symbolic link is refused)")
        return choose_execution(cfg, tcfg, what, max_memory=self.max_memory, memory=self.memory,
                                scratch=self.scratch or self.run_dir, given=self.given)


def _new_run_start(comm, run_dir: Path, s: RunSettings, is_root: bool, say, memory: _MemoryAsk, be,
                   progress: bool) -> _Start:
    from .collectives import on_all_ranks

    cfg, tcfg, data, seed, steps, tokens = s.cfg, s.tcfg, s.data, s.seed, s.steps, s.tokens
    if cfg is None or tcfg is None:
        raise ConfigError("train needs a model and a train config for a new run")
    default_data = data in (None, "default")

    def check() -> tuple[int, Manifest | None]:
        if type(seed) is not int or not 0 <= seed < 2**64:
            raise ConfigError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if is_root and (run_dir / RECIPE_FILE).exists():
            raise RunExists.naming(f"{run_dir} already holds a run; use ", Setting("resume"),
                                   " to continue it or pick another ", Setting("run_dir"))
        last = _last_step(tcfg, cfg.seq_len, 0, steps, tokens, None)
        manifest = None if default_data else Manifest.load(data)
        if manifest is not None:
            _check_vocab(manifest, cfg)
        elif cfg.vocab_size < BYTE_TOKENIZER_VOCAB_SIZE:  # before the default corpus is built in the run
            raise ConfigError(f"the default corpus's byte tokenizer has {BYTE_TOKENIZER_VOCAB_SIZE} ids but the model "
                             f"only {cfg.vocab_size}; raise vocab_size")
        return last, manifest, memory.plan(cfg, tcfg, "train it")  # before anything is allocated or written

    last_step, manifest, plan = on_all_ranks(comm, check)
    if default_data:
        from lockstep.formats.corpus import default_corpus

        def build() -> None:
            if is_root:
                run_dir.mkdir(parents=True, exist_ok=True)
                default_corpus(run_dir / DATA_DIR, progress=lambda m: say(m))

        on_all_ranks(comm, build)
    folder = DATA_DIR if default_data else str(manifest.folder.resolve())

    def start() -> _Start:
        m = manifest
        if m is None:
            m = Manifest.load(run_dir / DATA_DIR)
            _check_vocab(m, cfg)
        recipe = make_recipe(cfg, tcfg, m, folder, seed)
        params = initial_params(cfg, seed, be, progress and is_root)
        return _Start(recipe, cfg, tcfg, params, AdamWState.zeros(params), 0, genesis(recipe),
                      GlobalStream(m, seed, cfg.seq_len), last_step, None, plan)

    return on_all_ranks(comm, start)


def _check_vocab(manifest: Manifest, cfg: ModelConfig) -> None:
    if manifest.vocab_size > cfg.vocab_size:
        raise ConfigError(f"the data's tokenizer has {manifest.vocab_size} ids but the model only "
                         f"{cfg.vocab_size}; raise vocab_size")


def _resume_start(run_dir: Path, s: RunSettings, is_root: bool, check_recipe, memory: _MemoryAsk, be,
                  progress: bool) -> _Start:
    """The state a resume continues from: the run's newest checkpoint, which must obey the run's checkpoint
    rule (``Run.checkpoint_problems``) with the published chain holding up to it, or the initial state."""
    data, steps, tokens, given_cfg, given_tcfg = s.data, s.steps, s.tokens, s.cfg, s.tcfg
    run = Run.open(run_dir, Strictness.LIVE).require("recipe")
    recipe = run.recipe
    check_regular_or_absent(run_dir, METRICS_FILE, "metrics log")  # appended to: refuse a link now
    run.require_spec_version()
    if check_recipe is not None:
        check_recipe(recipe)
    cfg, tcfg = run.cfg, run.tcfg
    if given_cfg is not None and given_cfg != cfg or given_tcfg is not None and given_tcfg != tcfg:
        raise RecipeMismatch(f"{run_dir}: the model/train settings given differ from recipe.json; "
                             "resume without changing them (or start a new run)")
    plan = memory.plan(cfg, tcfg, "resume it")  # before anything is allocated
    manifest = run.open_data(data)
    seed = recipe["seed"]
    # the data a step sees is a function of the recipe, the manifest and the step: the stream is
    # positioned from the step plan, and a checkpoint's record of it is only checked against that
    stream = GlobalStream(manifest, seed, cfg.seq_len)
    run.require("trajectory", "checkpoints")
    start = run.sound_start(None, stream)
    if start.stopped is not None:
        step, kind, why = start.stopped
        if any(p.what == "recipe" for p in start.stopped_problems):
            raise RecipeMismatch(f"{run_dir / RECIPE_FILE} does not match the recipe checkpoint {step} was made "
                                 "with (it was edited); restore it or start a new run")
        raise ckpt.CheckpointError(f"checkpoint {ckpt.step_dirname(step)} of {run_dir} "
                                   f"{'is damaged' if kind == 'damaged' else 'contradicts the run'}: {why}; it "
                                   "cannot be resumed from (lockstep audit verify reports it)")
    if not run.chain_holds_to(start.step):
        raise ckpt.CheckpointError(f"{run_dir / 'trajectory.jsonl'}: the published chain is broken at step "
                                   f"{run.chain_breaks[0]}, so it does not vouch for the state a resume continues "
                                   "from (lockstep audit verify reports it): it cannot be resumed")
    if start.step == 0:  # stopped before its first checkpoint: the recipe and seed define the state
        params = initial_params(cfg, seed, be, progress and is_root)
        opt = AdamWState.zeros(params)
    else:
        params, opt = start.params, start.opt
    kept = run.trajectory[:start.step] if is_root else None
    recorded = read_target(run_dir) if steps is None and tokens is None else None  # a new target replaces it
    last_step = _last_step(tcfg, cfg.seq_len, start.step, steps, tokens, recorded)
    return _Start(recipe, cfg, tcfg, params, opt, start.step, start.chain, stream, last_step, kept, plan)


def _write_start(run_dir: Path, st: _Start, resume: bool) -> None:
    """Rank 0: the files a (re)started run begins with; the target first, the recipe last on a new run."""
    if resume:
        write_target(run_dir, st.last_step)
        write_trajectory(run_dir, st.kept_trajectory)
        ckpt.remove_temporary_checkpoints(run_dir)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_target(run_dir, st.last_step)
        write_recipe(run_dir, st.recipe)
        write_trajectory(run_dir, [])


@dataclass(frozen=True)
class _Loop:
    """How the loop runs, fixed before its first step: the ranks, the run, the backend, the
    checkpoint and validation intervals (``eval_every`` in steps, 0: never), the progress lines,
    the stop request and the hooks."""

    comm: object
    rank: int
    world: int
    run_dir: Path
    be: object
    checkpoint_every: int
    progress: bool
    say: Callable[..., object]
    stop: StopRequest
    eval_every: int
    hooks: RunHooks


def _run_loop(loop: _Loop, st: _Start) -> RunSummary:
    """Steps ``start_step + 1 .. last_step``; stops early, with a checkpoint, when a signal came.

    The steps' vectors and state live in one storage for the loop (``storage.step_storage``: host
    memory, a private folder in the plan's scratch folder, removed when the loop ends, or the device).
    """
    run_dir, be, world, say, hooks = loop.run_dir, loop.be, loop.world, loop.say, loop.hooks
    cfg, tcfg, last_step = st.cfg, st.tcfg, st.last_step
    say(f"run {run_dir}: preset {printable(cfg.name)}, backend {be.name}, {world} rank(s), steps {st.start_step + 1}..{last_step}"
        if last_step > st.start_step else f"run {run_dir} is already at its target step {last_step}; "
                                          f"give {hooks.word('steps')} N (or {hooks.word('tokens')}) to extend it")
    _say_idle_ranks(tcfg, cfg.seq_len, st.start_step + 1, last_step, world, say, hooks.word)
    if st.plan is not None and last_step > st.start_step:
        say(st.plan.line("train"))
    execution = st.plan.execution if st.plan is not None else Execution()
    with step_storage(be, GradLayout.of(cfg).size, execution.scratch) as storage:
        return _steps(loop, st, storage)


def _steps(loop: _Loop, st: _Start, storage) -> RunSummary:
    """The loop's steps, their records and checkpoints; ``storage`` (``train.storage``) holds the steps'
    vectors and state."""
    from .collectives import check_state_agreement, max_over_ranks, rank_micro_batches

    comm, rank, world, run_dir, be = loop.comm, loop.rank, loop.world, loop.run_dir, loop.be
    checkpoint_every, eval_every, hooks = loop.checkpoint_every, loop.eval_every, loop.hooks
    say, stop, progress = loop.say, loop.stop, loop.progress
    is_root = rank == 0
    recipe, cfg, tcfg, params, opt, stream = st.recipe, st.cfg, st.tcfg, st.params, st.opt, st.stream
    prev_chain, last_step = st.prev_chain, st.last_step
    transfers = be.capabilities.transfers
    if transfers is not None:
        transfers.take()  # from here on: the steps' copies (opening the backend, its self-test, are not a step's)
    params, opt = storage.adopt(params, opt)  # where the steps keep it (a device's upload counts in step 1's record)
    bar = Progress(last_step, progress and is_root)
    summary_loss = float("nan")
    stopped_by = 0
    done = st.start_step
    saved = st.start_step  # the last complete checkpoint (0: the initial state): where a resume starts
    for t in range(st.start_step + 1, last_step + 1):
        stop.step = t
        t0 = time.perf_counter()
        with _compile_notice(be, say, first=t == st.start_step + 1):
            plan = plan_step(tcfg, cfg.seq_len, t)
            windows = stream.windows(plan.first_window, plan.n_windows)
            bdigest = batch_digest(windows)
            m = len(plan.micro_batches(tcfg.micro_batch))
            lo, hi = rank_micro_batches(m, world, rank)
            with PhaseProgress(f"step {t}", hi - lo, "micro-batches", enabled=progress and is_root) as mb_bar:
                res = step_over_ranks(params, opt, windows, plan, cfg, tcfg, be, comm if world > 1 else None,
                                      storage=storage, progress=mb_bar.update,
                                      execution=st.plan.execution if st.plan is not None else Execution())
        if comm is not None and world > 1:
            check_state_agreement(comm, res.state_root, t)
        params, opt = res.params, res.opt
        rec = step_record(t, plan, res, bdigest, prev_chain)
        prev_chain = rec["chain_hash"]
        dt = time.perf_counter() - t0
        summary_loss = float(res.loss)
        done = t
        stopped_by = max_over_ranks(comm, stop.signum) if comm is not None and world > 1 else stop.signum
        if is_root:
            evaluating = eval_every > 0 and (t % eval_every == 0 or t == last_step)
            saving = t % checkpoint_every == 0 or t == last_step or stopped_by or evaluating
            if saving:  # the state's tensors on the host (copied from a device backend), before the counts are taken
                with transfer_phase(be, "checkpoint"):
                    tensors = state_tensors(params, opt)
            metrics = {"step": t, "seconds": dt, "tokens_per_s": plan.n_global / dt,
                       "backend": be.name, "world_size": world, "loss": float(res.loss)}
            if transfers is not None:
                metrics["transfer_bytes"] = transfers.take()
            with _writing(run_dir, f"the record of step {t}", t, saved, world):
                append_record(run_dir / TRAJECTORY_FILE, rec)
                append_record(run_dir / METRICS_FILE, metrics)
            bar.update(t, float(res.loss), plan.n_global / dt)
            if saving:
                side = {"chain_hash": prev_chain, "stream_state": stream.state_at(plan.first_window + plan.n_windows),
                        "recipe_sha256": recipe_digest(recipe), "tokens": plan.tokens_after}
                with (_writing(run_dir, f"checkpoint {t}", t, saved, world),
                      PhaseProgress(f"checkpoint {t}", 1, "bytes hashed and written", enabled=progress) as ck_bar):
                    ckpt.save_checkpoint(run_dir, t, tensors, side, progress=ck_bar.update)
                del tensors
                saved = t
                storage.release()  # the pages of the state in files that the checkpoint read leave RAM again
            if evaluating:  # after the checkpoint, so `lockstep eval --step t` can reproduce it
                with _writing(run_dir, f"the validation record of step {t}", t, saved, world):
                    hooks.validate(run_dir, t, plan.tokens_after, params, cfg, stream.manifest, be, tcfg.micro_batch,
                                   say)
        if stopped_by:
            break
    bar.close()
    summary = RunSummary(run_dir, done, prev_chain, summary_loss, rank, last_step, 0, world)
    if stopped_by and done < last_step:
        summary.stopped_by = stopped_by
        return summary
    if is_root:
        with _writing(run_dir, "commitment.json", last_step, saved, world):
            write_commitment(run_dir, recipe, last_step, prev_chain)
        with _writing(run_dir, "loss.png", last_step, saved, world):
            png = hooks.plot(run_dir, read_trajectory(run_dir, Strictness.LIVE)) if hooks.plot else None
        say(f"done: {run_dir} step {last_step}, loss {summary_loss:.4f}, chain {prev_chain}"
            + (f", loss curve {png}" if png else ""))
    return summary


def _say_idle_ranks(tcfg: TrainConfig, seq_len: int, first: int, last: int, world: int, say,
                    word: Callable[[str], str] = str) -> None:
    """Ranks beyond a step's micro-batch count wait (the tree, not the world size, decides the work): say so."""
    if last < first:
        return
    m = len(plan_step(tcfg, seq_len, first).micro_batches(tcfg.micro_batch))
    if m < world:
        say(f"note: step {first} has {m} micro-batch(es) of {tcfg.micro_batch} sequences for {world} ranks, so "
            f"{world - m} rank(s) wait; a run with a smaller {word('micro_batch')} (a new recipe) keeps them busy")


@contextlib.contextmanager
def _compile_notice(be, say, first: bool):
    """Around the first step of a process: say when kernel compilation starts, and what it cost."""
    watch = be.capabilities.watch_compilation if first else None
    if watch is None:
        yield
        return

    def announce() -> None:
        say(f"compiling the {be.name} kernels for this machine (first use; cached for later runs) ...")
        sys.stdout.flush()

    with watch(announce) as compiled:
        yield
    if compiled.kernels:
        plural = "s" if compiled.kernels != 1 else ""
        say(f"compiled {compiled.kernels} kernel{plural} in {compiled.seconds:.1f} s (cached: later runs skip this)")


def _last_step(tcfg: TrainConfig, seq_len: int, start_step: int, steps: int | None, tokens: int | None,
               recorded: int | None) -> int:
    """The run's target step: ``steps``, or the step that reaches ``tokens``, or the recorded target."""
    if steps is not None and tokens is not None:
        raise ConfigError.naming("give ", Setting("steps"), " or ", Setting("tokens"), ", not both")
    if steps is not None:
        if type(steps) is not int or steps < 1:
            raise ConfigError.naming(Setting("steps"), f" must be a positive integer, got {steps!r}")
        last = steps
    elif tokens is not None:
        if type(tokens) is not int or tokens < 1:
            raise ConfigError.naming(Setting("tokens"), f" must be a positive integer, got {tokens!r}")
        last = _step_reaching(tcfg, seq_len, tokens)
    elif recorded is not None:
        return max(recorded, start_step)
    else:
        raise ConfigError.naming(f"this run has no recorded target ({TARGET_FILE}); give ", Setting("steps"), " N or ",
                                 Setting("tokens"), " T")
    if last < start_step:
        raise ConfigError.naming(f"the run already has a checkpoint at step {start_step}, beyond the target ",
                                 Setting("steps" if steps is not None else "tokens"),
                                 f" gives (step {last}); give a larger one")
    return last


def _step_reaching(tcfg: TrainConfig, seq_len: int, tokens: int) -> int:
    """The first step after which at least ``tokens`` tokens are consumed (tokens grow with the step)."""
    hi = 1
    while plan_step(tcfg, seq_len, hi).tokens_after < tokens:
        hi *= 2
    lo = hi // 2 + 1 if hi > 1 else 1
    while lo < hi:
        mid = (lo + hi) // 2
        if plan_step(tcfg, seq_len, mid).tokens_after < tokens:
            lo = mid + 1
        else:
            hi = mid
    return lo


class _null_ctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
