"""The run directory's format: its file names, and the one writer and one reader of each file.

This module holds the names, the errors and the data, target and metrics files; the
recipe and ``H_0`` are ``lockstep.formats.recipe``, the trajectory, its chain and the
commitment ``lockstep.formats.trajectory``. A consumer does not combine them itself: it
opens the run once with ``lockstep.formats.run.Run.open``, which reads each file through
its one reader and holds the one checkpoint rule.

Run directory::

    recipe.json          everything that defines the run; H_0 binds its genesis fields (all
                         but lockstep_version, model.name and data.folder, which change no
                         bit: ``genesis_recipe``); unknown keys are refused
                         (``recipe``: ``make_recipe``, ``load_recipe``, ``genesis``)
    target.json          the step the run is to reach; not part of the chain
    data/                the embedded default corpus (manifest + shards), when used
    trajectory.jsonl     one record per step: step, tokens, lr, loss, grad_norm,
                         state_root, batch_digest, chain_hash (+ exact float bits); H_t binds
                         the tokens and the bits of loss, grad norm and lr (``trajectory``:
                         ``step_record``, ``read_trajectory``)
    metrics.jsonl        wall-clock facts (tokens/s, backend), the loss again and validation
                         losses (``--eval-every``): not part of the chain, not evidence
                         (``audit verify`` compares its losses with the trajectory's and warns)
    checkpoints/         step-NNNNNNNN/ folders (``lockstep.formats.checkpoint``)
    commitment.json      the last chain hash, written when the run ends (by the trainer's loop;
                         read by ``trajectory.read_commitment``)
    loss.png             training and validation loss over tokens (if matplotlib is installed):
                         not evidence (``audit verify --plot PNG`` redraws it from a verified run)

**Reading.** A run directory may come from a stranger, so every reader here reads it
as ``audit verify`` does, for the trainer's resume, ``audit verify``, ``audit replay``
and ``lockstep sample|eval|export`` alike: a regular file inside the run reached
without following a symlink (``fsio.open_regular``), within a size cap, strict JSON,
every value of the right type and within the stated maxima. A file that cannot be used
raises ``RunFileError`` (a ``ValueError``) naming the file and what to do. The
trajectory has one reader, ``read_trajectory(run_dir, strictness)``; the strictness is
always explicit (``Strictness``): an audit tolerates nothing, a run being trained or
used has no steps before its first record and drops a torn last line (a crash
mid-append, which ``train --resume`` repairs).

**Data.** ``recipe.json`` names the data folder and binds the SHA-256 of its manifest.
The recipe never makes lockstep read a path its publisher chose: the folder must be
relative and inside the run directory (``safe_join``: no ``..``, no absolute path, no
symlink out of the run, the manifest included). A run trained on a folder elsewhere
(``train --data DIR`` records that folder's absolute path) is opened only when the
user names the folder with ``--data DIR``. Either way the manifest's digest is
compared with the recipe's before any shard is read (``open_run_data``).

**Ranks.** How many ranks trained a step changes none of its bits (``spec.tree``), so
neither the recipe nor the chain records it; ``metrics.jsonl`` does, per step, as a
fact about the run that nothing checks (``recorded_world_sizes``, which audit
certificates quote).

**Target.** ``target.json`` records the last step the run is to reach, so that
``train --resume RUN`` without ``--steps`` continues to it; ``--steps``/``--tokens``
on a resume move it. It is written before ``recipe.json`` (a run directory with a
recipe always has a target) and is not part of the chain.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from lockstep.errors import LockstepError, Setting
from lockstep.fsio import (FileFormatError, UnsafePath, atomic_write_json, iter_lines, open_regular, read_json,
                           read_json_regular, safe_join)

from .checkpoint import CHECKPOINTS_DIR
from .manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, DataError, Manifest, ManifestMismatch

RECIPE_FILE = "recipe.json"
TARGET_FILE = "target.json"
TRAJECTORY_FILE = "trajectory.jsonl"
METRICS_FILE = "metrics.jsonl"
MAX_METRICS_LINE = 4096  # a metrics record is ~200 bytes
COMMITMENT_FILE = "commitment.json"
LOSS_PLOT_FILE = "loss.png"
DATA_DIR = "data"
KNOWN_FILES = {RECIPE_FILE, TRAJECTORY_FILE, METRICS_FILE, COMMITMENT_FILE, LOSS_PLOT_FILE, TARGET_FILE}
KNOWN_DIRS = {DATA_DIR, CHECKPOINTS_DIR}

RECIPE_FORMAT = "lockstep.recipe"
RECIPE_VERSION = 1
TARGET_FORMAT = "lockstep.target"
COMMITMENT_FORMAT = "lockstep.commitment"

MAX_RECIPE_BYTES = 1 << 20  # a recipe is about 2 kB
MAX_TRAJECTORY_BYTES = 1 << 30  # a billion bytes is ~1.5M steps; refuse anything larger
MAX_RECORD_BYTES = 4096  # one trajectory record is about 700 bytes
MAX_COMMITMENT_BYTES = 64 << 10

HEX64 = re.compile(r"[0-9a-f]{64}")
BITS_RE = re.compile(r"0x[0-9A-F]{8}")
RECORD_HEX_KEYS = ("state_root", "batch_digest", "chain_hash")
RECORD_FLOAT_KEYS = ("lr", "loss", "grad_norm")
MAX_TOKENS = 2**64 - 1  # the chain hashes a record's token count as 8 bytes


class RunFileError(LockstepError, ValueError):
    """A file of the run cannot be used; the message names it and says what to do."""


class DataLocationError(RunFileError):
    """The run's data cannot be used: outside the run, missing, or not the data the recipe binds."""


def run_path(run_dir: Path, rel: str) -> Path:
    """``run_dir / rel`` through ``safe_join``; ``RunFileError`` if it would leave the run."""
    try:
        return safe_join(run_dir, rel)
    except UnsafePath as exc:
        raise RunFileError(f"{run_dir}: {exc}; a run directory must not point outside itself: "
                           "remove the link or copy the file into the run") from None


def _shown(text: str) -> str:
    """An untrusted string, printable on one line (control characters escaped)."""
    return ascii(text)

def _read_run_json(run_dir: Path, name: str, what: str, max_bytes: int, missing: str, damaged_hint: str = ""):
    """A run file's strict JSON (a regular file inside ``run_dir``); ``RunFileError`` saying
    ``missing`` when it is absent, else the reader's reason followed by ``damaged_hint``."""
    try:
        return read_json_regular(run_dir, name, what, max_bytes)
    except FileNotFoundError:
        raise RunFileError(f"{run_dir / name}: {missing}") from None
    except (FileFormatError, UnsafePath, OSError) as exc:
        raise RunFileError(f"{exc}{damaged_hint}") from None

def run_data_folder(run_dir: str | os.PathLike, recipe: dict, override: str | os.PathLike | None = None) -> Path:
    """The data folder (or manifest file) to open: ``override`` (``--data DIR``), else the recipe's.

    The recipe's folder must stay inside ``run_dir``; anything else raises
    ``DataLocationError`` without touching the path it names.
    """
    if override is not None:
        return Path(override)
    folder = recipe["data"]["folder"]
    want = recipe["data"]["manifest_sha256"]
    try:
        path = safe_join(run_dir, folder)
        safe_join(run_dir, f"{folder.rstrip('/')}/{MANIFEST_NAME}")  # nor a manifest symlinked out of the run
    except UnsafePath as exc:
        raise DataLocationError(
            f"recipe.json names the data folder {_shown(folder)}, outside the run directory ({exc}); lockstep "
            f"reads data outside a run only from a folder you name: pass --data DIR (the run's data folder; "
            f"its manifest must have the recipe's SHA-256 {want})") from None
    return path


def _manifest_file(path: Path) -> Path:
    return path / MANIFEST_NAME if path.is_dir() else path


def open_run_data(run_dir: str | os.PathLike, recipe: dict, override: str | os.PathLike | None = None) -> Manifest:
    """The run's data, verified: the manifest's SHA-256 is the recipe's, then every shard's.

    ``override`` is the user's ``--data DIR``. Raises ``DataLocationError`` (a
    ``RunFileError``) naming the folder, the digests and what to pass.
    """
    path = run_data_folder(run_dir, recipe, override)
    want = recipe["data"]["manifest_sha256"]
    hint = (f"pass --data DIR with the folder the run was trained on (its manifest.json must have SHA-256 {want}, "
            "as recipe.json records)")
    manifest_path = _manifest_file(path)
    if not manifest_path.is_file():
        raise DataLocationError(f"{manifest_path}: no data manifest here; {hint}")
    size = manifest_path.stat().st_size
    if size > MAX_MANIFEST_BYTES:
        raise DataLocationError(f"{manifest_path}: {size} bytes, more than a manifest can be; {hint}")
    try:  # Manifest.load compares the digest of the bytes it read before parsing or hashing any shard
        manifest = Manifest.load(manifest_path, expected_sha256=want)
    except ManifestMismatch as exc:
        raise DataLocationError(f"{manifest_path}: SHA-256 {exc.got} is not the recipe's; this is not the run's "
                                f"data: {hint}") from None
    except DataError as exc:
        raise DataLocationError(str(exc)) from None
    return manifest


# ---------------------------------------------------------------- target


def read_target(run_dir: str | os.PathLike) -> int | None:
    """The last step recorded in ``target.json``; None when the run has none (made before targets were kept).
    ``RunFileError`` (one line, naming the file and the setting that sets the target again) when it is not
    a regular file or not a target."""
    again = ("; give ", Setting("steps"), " N to set the run's target again")
    try:
        path = safe_join(run_dir, TARGET_FILE)
    except UnsafePath as exc:
        raise RunFileError(f"{TARGET_FILE}: {exc}") from None
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():
        raise RunFileError.naming(f"{path}: not a regular file", *again)
    try:
        record = read_json(path, "run target", max_bytes=4096)
    except FileFormatError as exc:
        raise RunFileError.naming(str(exc), *again) from None
    last = record.get("last_step") if isinstance(record, dict) else None
    if not isinstance(record, dict) or record.get("format") != TARGET_FORMAT or type(last) is not int or last < 1:
        raise RunFileError.naming(f"{path}: not a lockstep target (format {TARGET_FORMAT!r}, last_step >= 1)", *again)
    return last


def write_target(run_dir: str | os.PathLike, last_step: int) -> None:
    """Record (atomically) that the run is to reach ``last_step``."""
    atomic_write_json(Path(run_dir) / TARGET_FILE, {"format": TARGET_FORMAT, "version": 1, "last_step": int(last_step)})


def recorded_world_sizes(run_dir: str | os.PathLike, steps) -> dict[int, int]:
    """``{step: ranks}`` for the given steps, as the run's ``metrics.jsonl`` records them.

    The file is the publisher's word, not checked by anything: a step it does not
    name (or names in a malformed line) is left out, and a missing or unsafe file
    gives ``{}``. A step trained twice (killed after it, resumed from a checkpoint
    before it) has two lines: the last counts. Read line by line, so a huge file
    costs time, not memory.
    """
    wanted, found = {int(s) for s in steps}, {}
    try:
        with open_regular(run_dir, METRICS_FILE, "metrics log") as f:  # a regular file, never a FIFO or link
            for _, line, _ in iter_lines(f, str(Path(run_dir) / METRICS_FILE), MAX_METRICS_LINE):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                step, ranks = (rec.get("step"), rec.get("world_size")) if isinstance(rec, dict) else (None, None)
                if type(step) is int and step in wanted and type(ranks) is int and ranks >= 1:
                    found[step] = ranks
    except (UnsafePath, FileFormatError, OSError):  # missing, unsafe, or a line no trainer writes: stop there
        pass
    return found
