"""A run directory, opened once: its recipe, verified trajectory, commitment, checkpoint index and data.

Every reader of a run (``train --resume``, ``audit verify``, ``audit replay``, ``audit
trace``, ``audit check``, ``lockstep sample|eval|export``) opens it with ``Run.open(path,
strictness)`` and asks the one object, and hands that object on (``Run.of`` takes either);
none of them re-reads a file or re-decides what it means:

* ``recipe``, ``cfg``, ``tcfg``, ``genesis`` (``H_0``), ``recipe_sha256``;
* ``trajectory``: every record, read with the caller's ``Strictness``;
* ``chain_breaks``: every step whose ``chain_hash`` is not ``H_t`` recomputed from the
  previous published link and the record (computed once, one SHA-256 a step); a
  checkpoint is vouched for only when no break lies at or before its step
  (``chain_holds_to``);
* ``commitment`` and ``commitment_problems`` (``trajectory.read_commitment``,
  ``trajectory.commitment_problems``);
* the checkpoint index: ``complete`` (``{step: folder}``), ``damaged_folders``
  (``{step: why}``: a step folder that is not complete), ``beyond`` (checkpoint folders
  after the trajectory's last step: no chain link covers them);
* ``checkpoint_problems(c, stream)``: **the one rule for "this checkpoint belongs to this
  run"** (below); ``sound_start(before, stream)``: the newest checkpoint before a step
  that loads and obeys the rule, or the initial state;
* ``spec_version_problem()``: the one SPEC_VERSION gate (a step can only be recomputed by a
  lockstep that implements the run's SPEC_VERSION);
* ``open_data(override)``: the run's data, verified (``rundir.open_run_data``).

A part that cannot be read (a missing or malformed recipe or trajectory) is recorded in
``errors`` instead of raised, so that ``audit verify`` can report it with the rest;
``require(...)`` raises the first recorded error of the parts a caller needs.

**The rule.** A checkpoint of step ``s`` belongs to the run when it verified on load
(``checkpoint.load_checkpoint``: marker, file digest, every tensor digest, the state root),
and: ``s`` is a step of the trajectory; its state root, chain hash and token count are the
trajectory's record of ``s``; its recipe digest is the recipe's; its tensors are the
recipe's state (``state.state_layout_problem``) and its ``step`` tensor holds ``s``; and,
given the data stream, its ``stream_state`` is the data position the batch schedule gives
after ``s`` (``checkpoint.stream_state_problem``). Whether the published chain vouches for
it (``chain_holds_to(s)``) is asked apart, since a broken link is a finding of its own.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.fsio import UnsafePath
from lockstep.spec import SPEC_VERSION, hashing

from . import checkpoint as ckpt
from .config import ModelConfig, TrainConfig
from .manifest import Manifest
from .recipe import genesis, load_recipe, recipe_configs, recipe_digest
from .rundir import RunFileError, open_run_data
from .state import AdamWState, split_state, state_layout_problem
from .trajectory import Strictness, commitment_problems, read_commitment, read_trajectory


class SpecVersionMismatch(RunFileError):
    """The run was made under another SPEC_VERSION than this lockstep implements."""


@dataclass(frozen=True)
class CheckpointProblem:
    """One way a checkpoint does not belong to its run: which file says it, what, and which tensor."""

    file: str  # "state" (state.safetensors), "sidecar" (sidecar.json) or "folder"
    message: str
    tensor: str | None = None
    what: str = "record"  # record (state root, chain hash, tokens), beyond, recipe, layout, step or stream

    @property
    def of_record(self) -> bool:
        """A value of the sidecar that is not the trajectory's record of the step."""
        return self.what == "record"

    def __str__(self) -> str:
        return self.message


@dataclass
class Start:
    """Where a recomputation of steps begins (``Run.sound_start``).

    ``step`` 0 is the initial state, which the recipe and seed define (``params`` is then
    None: the caller draws it with its backend). ``unsound`` lists, newest first, the
    checkpoints passed over on the way, as ``(step, kind, why)`` with ``kind`` "damaged"
    (it does not load) or "contradicts" (it loads but breaks the rule); ``stopped`` is the
    one the search stopped at instead of passing over it (``skip_unsound=False``), and then
    nothing else is set.
    """

    step: int = 0
    chain: str | None = None
    params: dict | None = None
    opt: AdamWState | None = None
    checkpoint: ckpt.Checkpoint | None = None
    unsound: list[tuple[int, str, str]] = field(default_factory=list)
    stopped: tuple[int, str, str] | None = None
    stopped_problems: list[CheckpointProblem] = field(default_factory=list)  # why ``stopped`` contradicts the run


class Run:
    """A run directory opened once (module docstring). Make one with ``Run.open``."""

    def __init__(self, path: Path, strictness: Strictness):
        self.path = path
        self.strictness = strictness
        self.errors: dict[str, RunFileError] = {}
        self.recipe: dict | None = None
        self.cfg: ModelConfig | None = None
        self.tcfg: TrainConfig | None = None
        self.genesis: str | None = None
        self.recipe_sha256: str | None = None
        self.trajectory: list[dict] | None = None
        self.complete: dict[int, Path] = {}
        self.damaged_folders: dict[int, str] = {}
        self.beyond: list[int] = []

    @classmethod
    def open(cls, path: str | os.PathLike, strictness: Strictness) -> "Run":
        """Read the run at ``path``: recipe, trajectory and checkpoint index (each failure kept in ``errors``).

        ``RunFileError`` only when ``path`` is not a directory.
        """
        if not isinstance(strictness, Strictness):
            raise TypeError(f"strictness must be a Strictness, got {strictness!r}")
        path = Path(path)
        if not path.is_dir():
            raise RunFileError(f"{path}: not a directory; give the path of a run directory")
        run = cls(path, strictness)
        try:
            run.recipe = load_recipe(path)
            run.cfg, run.tcfg = recipe_configs(run.recipe)
            run.genesis = genesis(run.recipe)
            run.recipe_sha256 = recipe_digest(run.recipe)
        except RunFileError as exc:
            run.recipe = None
            run.errors["recipe"] = exc
        try:
            run.trajectory = read_trajectory(path, strictness)
        except RunFileError as exc:
            run.errors["trajectory"] = exc
        try:
            run.complete = dict(ckpt.list_checkpoints(path))
            for folder, why in ckpt.incomplete_checkpoints(path):
                step = ckpt.step_of_dirname(folder.name)
                if step is not None:
                    run.damaged_folders[step] = why
            if run.trajectory is not None:
                n = len(run.trajectory)
                run.beyond = sorted(s for s in set(run.complete) | set(run.damaged_folders) if s > n)
        except UnsafePath as exc:
            run.errors["checkpoints"] = RunFileError(f"checkpoints/ cannot be used: {exc}")
        return run

    @classmethod
    def of(cls, run: "Run | str | os.PathLike", strictness: Strictness) -> "Run":
        """``run`` itself when it is a run already opened with ``strictness``, else ``Run.open(run, strictness)``:
        a caller that opened the run passes it on, and nothing below reads its files again."""
        if isinstance(run, Run) and run.strictness is strictness:
            return run
        return cls.open(run.path if isinstance(run, Run) else run, strictness)

    # -- parts --------------------------------------------------------------------------

    def require(self, *parts: str) -> "Run":
        """``self``, or the first recorded error of ``parts`` ("recipe", "trajectory", "checkpoints") raised."""
        for part in parts:
            if part in self.errors:
                raise self.errors[part]
        return self

    @property
    def last_step(self) -> int:
        return len(self.trajectory or ())

    def record(self, step: int) -> dict:
        """The trajectory's record of ``step`` (1-based)."""
        return self.trajectory[step - 1]

    def spec_version_problem(self) -> str | None:
        """Why this lockstep cannot recompute the run's steps (its SPEC_VERSION is another), or None."""
        made = self.recipe["spec_version"]
        if made == SPEC_VERSION:
            return None
        return (f"{self.path / 'recipe.json'}: the run was made with SPEC_VERSION {made!r}, this lockstep "
                f"implements {SPEC_VERSION!r}; install the lockstep release of that SPEC_VERSION to recompute it")

    def require_spec_version(self) -> "Run":
        """``self``, or ``SpecVersionMismatch`` when the run's SPEC_VERSION is not this lockstep's."""
        why = self.spec_version_problem()
        if why is not None:
            raise SpecVersionMismatch(why)
        return self

    # -- the chain and the commitment ----------------------------------------------------

    @functools.cached_property
    def chain_breaks(self) -> list[int]:
        """Every step whose ``chain_hash`` is not ``H_t`` recomputed from the previous *published* link
        and the record (so each broken link is found once); ``H_0`` is the recipe's genesis."""
        self.require("recipe", "trajectory")
        out, h = [], self.genesis
        for rec in self.trajectory:
            if hashing.record_chain_hash(h, rec) != rec["chain_hash"]:
                out.append(rec["step"])
            h = rec["chain_hash"]
        return out

    def chain_holds_to(self, step: int) -> bool:
        """No broken link at or before ``step``: the published chain vouches for that step's record."""
        return not self.chain_breaks or self.chain_breaks[0] > step

    @functools.cached_property
    def commitment(self) -> dict:
        """``commitment.json`` (``trajectory.read_commitment``); ``RunFileError`` when it cannot be used."""
        return read_commitment(self.path)

    def commitment_problems(self) -> list[str]:
        """What in the (readable) commitment is not this run's (``trajectory.commitment_problems``)."""
        return commitment_problems(self.commitment, self.trajectory or [], self.recipe)

    # -- checkpoints ------------------------------------------------------------------------

    @property
    def checkpoint_steps(self) -> list[int]:
        """Every step with a checkpoint folder, complete or not (one that is not complete is damaged)."""
        return sorted(set(self.complete) | set(self.damaged_folders))

    @property
    def state_bound(self) -> int:
        """The largest state file the recipe's model can write (a larger one is refused unread)."""
        return ckpt.state_bytes_bound(self.cfg) if self.cfg is not None else ckpt.DEFAULT_MAX_STATE_BYTES

    def load_checkpoint(self, step: int) -> ckpt.Checkpoint:
        """Checkpoint ``step``, fully verified (``checkpoint.load_checkpoint``); ``CheckpointError`` otherwise,
        also for a step folder that is not complete."""
        if step in self.damaged_folders:
            raise ckpt.CheckpointError(f"checkpoint {ckpt.step_dirname(step)}: {self.damaged_folders[step]}")
        if step not in self.complete:
            raise ckpt.CheckpointError(f"{self.path} has no checkpoint of step {step}")
        try:
            return ckpt.load_checkpoint(self.complete[step], max_bytes=self.state_bound)
        except (ValueError, OSError) as exc:
            raise ckpt.CheckpointError(str(exc)) from None

    def checkpoint_problems(self, c: ckpt.Checkpoint, stream=None) -> list[CheckpointProblem]:
        """Every way the loaded checkpoint ``c`` breaks the rule of the module docstring ([] when it belongs).

        ``stream`` (the recipe's ``GlobalStream``), when given, adds the data-position check.
        A part of the run that could not be read (``errors``) leaves out the checks that need it.
        """
        step, side = c.step, c.sidecar
        out = []
        if self.trajectory is not None:
            if step > len(self.trajectory):
                return [CheckpointProblem("folder", f"checkpoint of step {step} but the trajectory ends at step "
                                                    f"{self.last_step}: no chain link covers it (a trainer saves a "
                                                    "step after its record): treat it as forged", what="beyond")]
            rec = self.record(step)
            if side["state_root"] != rec["state_root"]:
                out.append(CheckpointProblem("sidecar", f"its state root {side['state_root']} (recomputed from the "
                                                        f"tensors) is not the trajectory's {rec['state_root']}; the "
                                                        "trajectory or the checkpoint was altered (replay the step to "
                                                        "tell which)"))
            if side.get("chain_hash") != rec["chain_hash"]:
                out.append(CheckpointProblem("sidecar", f"its chain hash {side.get('chain_hash')} is not the "
                                                        f"trajectory's {rec['chain_hash']}"))
            if side.get("tokens") != rec["tokens"]:
                out.append(CheckpointProblem("sidecar", f"its token count {side.get('tokens')} is not the "
                                                        f"trajectory's {rec['tokens']}"))
        if self.recipe_sha256 is not None and side.get("recipe_sha256") != self.recipe_sha256:
            out.append(CheckpointProblem("sidecar", f"its recipe digest {side.get('recipe_sha256')} is not "
                                                    f"recipe.json's {self.recipe_sha256} (the recipe was changed "
                                                    "after the checkpoint, or it comes from another run)", what="recipe"))
        if self.cfg is not None:
            bad = state_layout_problem(c.tensors, self.cfg)
            if bad is not None:
                out.append(CheckpointProblem("state", f"tensor {bad[0]!r}: {bad[1]}", bad[0], "layout"))
            else:
                _, opt = split_state(c.tensors)
                if opt.step != step:
                    out.append(CheckpointProblem("state", f"its 'step' tensor holds {opt.step}", "step", "step"))
        if stream is not None and self.tcfg is not None:
            why = ckpt.stream_state_problem(side, stream, self.tcfg, step)
            if why is not None:
                out.append(CheckpointProblem("sidecar", why, what="stream"))
        return out

    def sound_start(self, before: int | None = None, stream=None, *, skip_unsound: bool = False) -> Start:
        """The newest checkpoint before step ``before`` (any, when None) that loads and obeys the rule, as a
        ``Start`` holding its state; with none, the initial state (step 0, ``H_0``).

        An unsound checkpoint on the way ends the search (``Start.stopped``) unless
        ``skip_unsound``: then it is passed over, listed in ``Start.unsound``, and the next
        older one is tried.
        """
        start = Start(0, self.genesis)
        for step in reversed([s for s in self.checkpoint_steps if before is None or s < before]):
            try:
                c = self.load_checkpoint(step)
            except ckpt.CheckpointError as exc:
                found = (step, "damaged", str(exc))
            else:
                problems = self.checkpoint_problems(c, stream)
                if not problems:
                    params, opt = split_state(c.tensors)
                    start.step, start.chain, start.params, start.opt, start.checkpoint = (
                        step, c.sidecar["chain_hash"], params, opt, c)
                    return start
                found = (step, "contradicts", problems[0].message)
            if not skip_unsound:
                start.stopped = found
                start.stopped_problems = problems if found[1] == "contradicts" else []
                return start
            start.unsound.append(found)
        return start

    # -- data -------------------------------------------------------------------------------

    def open_data(self, override: str | os.PathLike | None = None) -> Manifest:
        """The run's data, every shard verified (``rundir.open_run_data``; ``override`` is the user's folder)."""
        return open_run_data(self.path, self.require("recipe").recipe, override)
