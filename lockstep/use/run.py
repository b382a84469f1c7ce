"""Opening a trained run for use: the recipe, a verified checkpoint, the data and tokenizer.

A run directory may come from a stranger. ``open_model`` reads the recipe through
``safe_join`` and strict JSON, loads the checkpoint with every digest checked
(``checkpoint.load_checkpoint``: marker, file, each tensor, the state root), then
holds it to the run's checkpoint rule (``formats.run.Run.checkpoint_problems``: this
recipe, a step the trajectory covers, that record's state root, chain hash and token
count, the recipe's state layout; a checkpoint beyond the trajectory's last step is
refused, and never the default) and requires the chain recomputed from ``H_0`` to hold
up to it. Anything else is a
``UseError`` naming the file and what to do: a damaged or refused checkpoint never
becomes text, a loss or an export.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.errors import LockstepError, Setting, parts_of
from lockstep.formats import checkpoint as ckpt
from lockstep.formats.config import ModelConfig, TrainConfig
from lockstep.formats.manifest import DataError, MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest
from lockstep.formats.run import Run
from lockstep.formats.rundir import open_run_data
from lockstep.formats.state import split_state
from lockstep.formats.tokenizer import TokenizerError, tokenizer_from_identity
from lockstep.formats.trajectory import Strictness
from lockstep.fsio import FileFormatError, NotRegularFile, UnsafePath, parse_json, read_regular, safe_join
from lockstep.spec import SPEC_VERSION


class UseError(LockstepError, ValueError):
    """A run, checkpoint, export or argument that cannot be used; the message says why and what to do."""


@dataclass
class RunModel:
    """The parameters of one verified checkpoint of a run, with the run's settings."""

    run_dir: Path
    recipe: dict
    cfg: ModelConfig
    tcfg: TrainConfig
    step: int
    params: dict[str, np.ndarray]
    sidecar: dict
    checkpoint: Path
    trajectory_record: dict  # the trajectory's record of this step (a checkpoint it does not cover is refused)

    @property
    def tokens(self) -> int:
        """Training tokens consumed when this checkpoint was taken."""
        return int(self.sidecar.get("tokens", 0))

    @property
    def spec_version(self) -> str:
        return str(self.recipe.get("spec_version"))

    def spec_note(self) -> str | None:
        """A line to show when the run was made under another SPEC_VERSION (bits may differ)."""
        if self.spec_version == SPEC_VERSION:
            return None
        return (f"note: {self.run_dir} was trained under SPEC_VERSION {self.spec_version}, this lockstep computes "
                f"SPEC_VERSION {SPEC_VERSION}; values can differ in the last bits from the run's own")


def open_model(run_dir: str | os.PathLike, step: int | None = None) -> RunModel:
    """The parameters of checkpoint ``step`` (default: the latest complete one the trajectory covers), verified.

    A checkpoint is used only when it obeys the run's checkpoint rule
    (``Run.checkpoint_problems``: made with this recipe, its step in the trajectory, its
    state root, chain hash and token count that record's, the recipe's state layout) and
    the chain recomputed from ``H_0`` holds up to it (``Run.chain_holds_to``): a
    checkpoint beyond the trajectory's last step is covered by no chain link and is
    refused (and never chosen by default).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UseError(f"{run_dir} is not a run directory (no such folder)")
    run = Run.open(run_dir, Strictness.LIVE)  # every file read once, through its one reader
    if "recipe" in run.errors:
        raise UseError(f"{run_dir / 'recipe.json'}: cannot be used: {run.errors['recipe']}")
    recipe, cfg, tcfg = run.recipe, run.cfg, run.tcfg
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
        raise UseError.naming(Setting("step"), f" must be a positive integer, got {step!r}")
    if "checkpoints" in run.errors:
        raise UseError(f"refused: {run.errors['checkpoints']}")
    if "trajectory" in run.errors:
        raise UseError(f"{run_dir}: trajectory.jsonl cannot be read ({run.errors['trajectory']}); run "
                       f"`lockstep audit verify {run_dir}`")
    have = sorted(run.complete)
    if step is not None and step not in have:
        raise UseError(f"{run_dir} has no complete checkpoint of step {step} (complete ones: "
                       f"{', '.join(map(str, have[-10:])) or 'none'})")
    if not have:
        raise UseError(f"{run_dir} has no complete checkpoint yet (train it, or wait for its first checkpoint)")
    n = run.last_step
    covered = [s for s in have if s <= n]
    if step is not None and step > n or not covered:
        others = f" (checkpoints it covers: {', '.join(map(str, covered[-10:]))})" if covered else ""
        raise UseError(f"refused: checkpoint {step or have[-1]} of {run_dir} is beyond trajectory.jsonl, which ends at "
                       f"step {n}: no chain link covers it{others}; run `lockstep audit verify {run_dir}`")
    step = step if step is not None else covered[-1]
    try:
        c = run.load_checkpoint(step)  # every digest checked; a state larger than the recipe's is refused unread
    except ckpt.CheckpointError as exc:
        raise UseError(f"refused: {exc}") from None
    problems = run.checkpoint_problems(c)
    if problems:
        p = problems[0]
        if p.of_record:
            why = (f"disagrees with trajectory.jsonl at step {c.step} ({p.message})")
        elif p.what == "recipe":
            why = f"was made with another recipe than {run_dir / 'recipe.json'} ({p.message})"
        else:
            why = f"does not hold the recipe's model: {p.message}"
        raise UseError(f"refused: checkpoint {c.step} ({c.path}) {why}; run `lockstep audit verify {run_dir}`")
    if not run.chain_holds_to(c.step):
        raise UseError(f"refused: the chain of {run_dir / 'trajectory.jsonl'} is broken at step {run.chain_breaks[0]}, "
                       f"so it does not vouch for checkpoint {c.step}; run `lockstep audit verify {run_dir}`")
    params, _ = split_state(c.tensors)
    return RunModel(run_dir, recipe, cfg, tcfg, c.step, params, c.sidecar, c.path, run.record(c.step))


def run_manifest(run_dir: str | os.PathLike, recipe: dict, data: str | os.PathLike | None = None) -> tuple[Path, dict]:
    """``(path, manifest)``: the run's data manifest, read once, checked, without reading a shard.

    The manifest is the one in ``data`` (``--data DIR``) or in the recipe's data folder,
    which must be inside the run (a recipe from elsewhere never makes lockstep read a
    path it names); its SHA-256 must be the recipe's, and every field is checked as
    ``Manifest.load`` checks it (a tokenizer file must be inside the data folder).
    """
    import hashlib


    run_dir = Path(run_dir)
    want = recipe["data"]["manifest_sha256"]
    hint = f"pass --data DIR, the run's data folder (its manifest.json has SHA-256 {want})"
    try:
        folder = Path(data) if data is not None else safe_join(run_dir, recipe["data"]["folder"])
        path = folder / MANIFEST_NAME if folder.is_dir() else folder
        # a regular file of at most MAX_MANIFEST_BYTES, reached without symlinks: never a FIFO that blocks
        raw = read_regular(path.parent, path.name, "data manifest", MAX_MANIFEST_BYTES)
    except NotRegularFile as exc:
        raise UseError(f"{exc}; {hint}") from None
    except UnsafePath:
        raise UseError(f"the run's data folder {recipe['data']['folder']!r} is outside {run_dir}; {hint}") from None
    except FileFormatError as exc:
        raise UseError(f"{exc}; {hint}") from None
    except OSError as exc:
        raise UseError(f"the run's data manifest cannot be read ({exc.strerror or exc}: {exc.filename}); {hint}") from None
    if hashlib.sha256(raw).hexdigest() != want:
        raise UseError(f"{path}: not the manifest the run was trained on (SHA-256 differs); {hint}")
    try:
        manifest = parse_json(raw, "data manifest", str(path), exact_decimals=True)
        Manifest._check_structure(path, manifest)
    except (DataError, FileFormatError) as exc:
        raise UseError(f"{path}: {exc}") from None
    return path, manifest


def open_tokenizer(run_dir: str | os.PathLike, recipe: dict, data: str | os.PathLike | None = None):
    """The run's tokenizer, from its data manifest alone (``run_manifest``: no shard is read).

    A Hugging Face tokenizer file is checked against the manifest's digest of it.
    Returns ``(tokenizer, identity)``.
    """
    path, manifest = run_manifest(run_dir, recipe, data)
    identity = manifest["tokenizer"]
    try:
        return tokenizer_from_identity(identity, path.parent), identity
    except TokenizerError as exc:
        raise UseError.naming(f"{path}: the run's tokenizer cannot be used: ", *parts_of(exc)) from None


def open_data(run_dir: str | os.PathLike, recipe: dict, data: str | os.PathLike | None = None) -> Manifest:
    """The run's data folder, verified against the recipe's manifest digest (``--data DIR`` overrides)."""
    try:
        return open_run_data(Path(run_dir), recipe, data)
    except (DataError, UnsafePath, FileNotFoundError, ValueError) as exc:
        raise UseError(f"the run's data cannot be used: {exc}") from None
