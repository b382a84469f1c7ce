"""Two facts about a run directory that the hash chain does not hold: where the run's data is,
and the step the run was asked to reach.

**Data.** ``recipe.json`` names the data folder and binds the SHA-256 of its manifest.
A run directory may come from a stranger, so its recipe never makes lockstep read a
path its publisher chose: the folder must be relative and inside the run directory
(``safe_join``: no ``..``, no absolute path, no symlink out of the run, the manifest
included). A run trained on a folder elsewhere (``train --data DIR`` records that
folder's absolute path) is opened only when the user names the folder with
``--data DIR``. Either way the manifest's digest is compared with the recipe's before
any shard is read. ``open_run_data`` is the one function that ``train --resume``,
``audit verify``, ``audit replay`` and ``audit check --recompute`` use.

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
from pathlib import Path

from lockstep.fsio import (FileFormatError, UnsafePath, atomic_write_json, iter_lines, open_regular, read_json,
                           safe_join)

from .data import MANIFEST_NAME, DataError, Manifest, ManifestMismatch

TARGET_FILE = "target.json"
METRICS_FILE = "metrics.jsonl"
MAX_METRICS_LINE = 4096  # a metrics record is ~200 bytes
TARGET_FORMAT = "lockstep.target"
MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists shards: tens of bytes each


class DataLocationError(ValueError):
    """The run's data cannot be used: outside the run, missing, or not the data the recipe binds."""


def _shown(text: str) -> str:
    """An untrusted string, printable on one line (control characters escaped)."""
    return ascii(text)


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
    ``ValueError``) naming the folder, the digests and what to pass.
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


def read_target(run_dir: str | os.PathLike) -> int | None:
    """The last step recorded in ``target.json``; None when the run has none (made before targets were kept)."""
    try:
        path = safe_join(run_dir, TARGET_FILE)
    except UnsafePath as exc:
        raise ValueError(f"{TARGET_FILE}: {exc}") from None
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():
        raise ValueError(f"{path}: not a regular file; give --steps N to set the run's target again")
    try:
        record = read_json(path, "run target", max_bytes=4096)
    except FileFormatError as exc:
        raise ValueError(f"{exc}; give --steps N to set the run's target again") from None
    last = record.get("last_step") if isinstance(record, dict) else None
    if not isinstance(record, dict) or record.get("format") != TARGET_FORMAT or type(last) is not int or last < 1:
        raise ValueError(f"{path}: not a lockstep target (format {TARGET_FORMAT!r}, last_step >= 1); "
                         "give --steps N to set the run's target again")
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
