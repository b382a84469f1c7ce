"""Checkpoints: one folder per saved step, written atomically, verified before use.

Layout inside a run directory::

    checkpoints/step-00000120/state.safetensors   every tensor (parameters, AdamW moments, step)
    checkpoints/step-00000120/sidecar.json        the caller's record + step, state_root,
                                                  tensor_digests, file_sha256, format: 1
    checkpoints/step-00000120/COMPLETE            sha256 (hex) of sidecar.json, written last

A save writes all three files into ``checkpoints/.tmp-step-00000120-PID-RANDOM/``,
fsyncs them and the folder, then renames the folder into place (and fsyncs
``checkpoints/``). A crash at any moment leaves either no ``step-*`` folder or a
complete one; leftover ``.tmp-*`` folders are ignored, reported by
``incomplete_checkpoints`` and removed by ``remove_temporary_checkpoints``.

A load trusts nothing: the marker must match the sidecar, the file its sha256,
every tensor its digest (``lockstep.spec.hashing.tensor_digest``) and all of
them the state root, before any tensor is returned. ``CheckpointError`` names
the folder, the file, the tensor and what to do.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import secrets
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lockstep.errors import LockstepError
from lockstep.fsio import FileFormatError, UnsafePath, atomic_write_bytes, atomic_writer, fsync_dir, json_bytes, open_regular, parse_json, read_regular, safe_join
from lockstep.fsio.safetensors import parse_safetensors, safetensors_header, write_safetensors_to
from lockstep.spec.hashing import state_root_from_digests, tensor_digests

FORMAT = 1
CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "state.safetensors"
SIDECAR_FILE = "sidecar.json"
COMPLETE_FILE = "COMPLETE"
TEMP_PREFIX = ".tmp-"
STEP_DIR_RE = re.compile(r"step-(\d{8,20})")  # looks like a step folder; step_of_dirname says if it is one
RESERVED_KEYS = ("step", "state_root", "tensor_digests", "file_sha256", "format")
MAX_SIDECAR_BYTES = 4 << 20  # a sidecar is a few kB per hundred tensors
MAX_MARKER_BYTES = 256  # 64 hex digits and a newline
DEFAULT_MAX_STATE_BYTES = 1 << 40  # a stated maximum; callers that know the model pass state_bytes_bound(cfg)
MAX_HEADER_BYTES = 1 << 20  # a checkpoint's safetensors header: about 110 bytes per tensor (Open-1B: ~75 kB)
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(LockstepError, RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or inconsistent."""


@dataclass
class Checkpoint:
    step: int
    tensors: dict[str, np.ndarray]
    sidecar: dict[str, Any]
    path: Path = field(default=Path("."))


def step_dirname(step: int) -> str:
    """``step-00000120``: the folder name of a checkpoint (zero-padded to 8 digits)."""
    return f"step-{int(step):08d}"


MAX_STEP = 2**63 - 1


def step_of_dirname(name: str) -> int | None:
    """The step of a checkpoint folder name, or None unless ``name`` is exactly ``step_dirname(step)``.

    ``step-000000002`` or ``step-00000000000000000002`` look like step 2 but are not
    its folder: one step has one name, so two folders can never both claim it.
    """
    m = STEP_DIR_RE.fullmatch(name)
    if m is None:
        return None
    step = int(m.group(1))
    return step if step <= MAX_STEP and step_dirname(step) == name else None


def _anchor(folder: Path) -> tuple[Path, str]:
    """Where reads of ``folder``'s files start, and the path from there to ``folder``.

    The run directory when ``folder`` is in its ``checkpoints/``, else the folder's
    parent: every read walks down from there without following a link, so neither
    ``checkpoints/`` nor the step folder can be swapped for a symlink between the
    check and the read.
    """
    if folder.parent.name == CHECKPOINTS_DIR:
        return folder.parent.parent, f"{CHECKPOINTS_DIR}/{folder.name}"
    return folder.parent, folder.name


class _HashingFile:
    """A write-only file wrapper that SHA-256s everything written through it."""

    def __init__(self, f, on_write=None):
        self.f, self.sha = f, hashlib.sha256()
        self.on_write = on_write  # called with each write's byte count (progress)

    def write(self, b) -> int:
        self.sha.update(b)
        n = self.f.write(b)
        if self.on_write is not None:
            self.on_write(memoryview(b).nbytes)
        return n


# ---------------------------------------------------------------------------
# Save
# ---------------------------------------------------------------------------


def save_checkpoint(run_dir: str | os.PathLike, step: int, tensors: Mapping[str, np.ndarray],
                    sidecar: Mapping[str, Any] | None = None, progress=None) -> Path:
    """Save ``tensors`` as the checkpoint of ``step``; return its folder.

    ``progress(done, total)``, if given, is called as the tensors are hashed and written
    (byte counts: each tensor is hashed, then the file is written, ``total`` is both).

    ``sidecar`` is the caller's JSON record (chain hash, stream resume record ...);
    the keys ``step``, ``state_root``, ``tensor_digests``, ``file_sha256`` and
    ``format`` are added here and may not be given with other values. Saving a step
    that already has a complete checkpoint returns it when the state root is the
    same and raises ``CheckpointError`` otherwise.
    """
    step = int(step)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    tensors = dict(tensors)
    record = dict(sidecar or {})
    metadata = {"format": "lockstep.checkpoint", "format_version": str(FORMAT), "step": str(step)}
    safetensors_header(tensors, metadata)  # validates names and dtypes before any work
    run_dir = Path(run_dir)
    ckdir = run_dir / CHECKPOINTS_DIR
    ckdir.mkdir(parents=True, exist_ok=True)
    if _folder_problem(ckdir) is not None:  # refuse a checkpoints/ symlinked elsewhere
        raise UnsafePath(f"{ckdir} is {_folder_problem(ckdir)}; a run's checkpoints folder must be a real folder")
    final = ckdir / step_dirname(step)

    tmp = ckdir / f"{TEMP_PREFIX}{step_dirname(step)}-{os.getpid()}-{secrets.token_hex(8)}"
    tmp.mkdir()
    try:
        total = 2 * sum(int(np.asarray(x).nbytes) for x in tensors.values())
        done = [0]

        def advance(n: int) -> None:
            done[0] += n
            if progress is not None:
                progress(min(done[0], total), total)

        digests = {}
        for name, x in tensors.items():  # tensor_digests, one at a time for the progress
            digests.update(tensor_digests({name: x}))
            advance(int(np.asarray(x).nbytes))
        root = state_root_from_digests(digests)
        if final.exists() or final.is_symlink():
            if _marker_problem(final) is None:
                existing = _read_sidecar(final).get("state_root")
                if existing == root:
                    shutil.rmtree(tmp, ignore_errors=True)
                    return final
                raise CheckpointError(
                    f"checkpoint {final} already exists with state root {existing}, not {root}; "
                    f"the run diverged from its own checkpoint. Move the folder away to overwrite it.")
            _remove_tree(final, ckdir, "stale")  # an incomplete folder under the final name: replace it
        with atomic_writer(tmp / STATE_FILE) as f:
            hf = _HashingFile(f, advance)
            write_safetensors_to(hf, tensors, metadata)
        for key, value in (("step", step), ("state_root", root), ("tensor_digests", digests),
                           ("file_sha256", hf.sha.hexdigest()), ("format", FORMAT)):
            if key in record and record[key] != value:
                raise ValueError(f"sidecar key {key!r} is set by save_checkpoint; got {record[key]!r}")
            record[key] = value
        sidecar_bytes = json_bytes(record)
        atomic_write_bytes(tmp / SIDECAR_FILE, sidecar_bytes)
        atomic_write_bytes(tmp / COMPLETE_FILE, (hashlib.sha256(sidecar_bytes).hexdigest() + "\n").encode())
        fsync_dir(tmp)
        try:
            os.rename(tmp, final)
        except OSError as exc:
            raise CheckpointError(f"could not move the new checkpoint into {final}: {exc} "
                                  f"(another process saving the same step?)") from None
        fsync_dir(ckdir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def state_bytes_bound(cfg) -> int:
    """The largest ``state.safetensors`` a run of model ``cfg`` can write: its header bound, the parameters
    and the two AdamW moments (float32) and the step counter. A larger file is refused unread."""
    from .params import param_specs

    params = sum(math.prod(s.shape) for s in param_specs(cfg))
    return 8 + MAX_HEADER_BYTES + 3 * 4 * params + 8


def stream_state_problem(sidecar: Mapping[str, Any], stream, tcfg, step: int) -> str | None:
    """None when a checkpoint's ``stream_state`` is the data stream's position after ``step``; else why not.

    The position is derived, never read: ``plan_step`` gives the windows steps 1..step
    consumed under the recipe's batch schedule, and ``stream`` (a ``GlobalStream`` of
    the recipe's manifest, seed and sequence length, built from its start) gives the
    record for the next window. A checkpoint's record is only compared with it.
    """
    from .schedule import plan_step

    if step == 0:
        return None
    plan = plan_step(tcfg, stream.seq_len, step)
    want = stream.state_at(plan.first_window + plan.n_windows)
    got = sidecar.get("stream_state")
    if got == want:
        return None
    if not isinstance(got, dict):
        differ = "it is missing" if got is None else f"it is a {type(got).__name__}, not a record"
    else:
        keys = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        differ = f"it differs in {', '.join(map(repr, keys[:8]))}"
    return (f"its stream_state is not the recipe's data position after step {step} (window {want['window']}, "
            f"derived from the batch schedule and the data): {differ}; a resume or replay from it would "
            "train on other data")


def _remove_tree(path: Path, ckdir: Path, why: str) -> None:
    """Rename ``path`` to a temporary name (atomic), then delete it."""
    if path.is_symlink():
        path.unlink()
        return
    aside = ckdir / f"{TEMP_PREFIX}{why}-{path.name}-{os.getpid()}-{secrets.token_hex(8)}"
    os.rename(path, aside)
    fsync_dir(ckdir)
    shutil.rmtree(aside, ignore_errors=True)


# ---------------------------------------------------------------------------
# Listing
# ---------------------------------------------------------------------------


def _folder_problem(folder: Path) -> str | None:
    """None when ``folder`` is a real folder (not a symlink to one); else what it is."""
    try:
        mode = os.lstat(folder).st_mode
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(mode):
        return "a symlink, not a checkpoint folder"
    if not stat.S_ISDIR(mode):
        return "not a folder"
    return None


def _marked_sidecar(folder: Path) -> tuple[bytes | None, str | None]:
    """``(sidecar bytes, None)`` when ``folder``'s COMPLETE marker matches its sidecar, else ``(None, why)``.

    Both files are read as regular files inside the folder (no symlink, FIFO or
    device), with size caps, by ``fsio.read_regular``.
    """
    why = _folder_problem(folder)
    if why is not None:
        return None, why
    root, prefix = _anchor(folder)

    def read(name: str, what: str, cap: int, missing: str) -> tuple[bytes | None, str | None]:
        try:
            return read_regular(root, f"{prefix}/{name}", what, cap), None
        except FileNotFoundError:
            return None, missing
        except (UnsafePath, FileFormatError, OSError) as exc:
            return None, str(exc)

    want, why = read(COMPLETE_FILE, "checkpoint marker", MAX_MARKER_BYTES,
                     f"no {COMPLETE_FILE} marker (the save did not finish)")
    if why is not None:
        return None, why
    side, why = read(SIDECAR_FILE, "checkpoint sidecar", MAX_SIDECAR_BYTES, f"{COMPLETE_FILE} present but {SIDECAR_FILE} missing")
    if why is not None:
        return None, why
    want_hex = want.decode("ascii", "replace").strip()
    got = hashlib.sha256(side).hexdigest()
    if want_hex != got:
        return None, f"{COMPLETE_FILE} holds {want_hex[:16]}... but {SIDECAR_FILE} hashes to {got[:16]}..."
    return side, None


def _marker_problem(folder: Path) -> str | None:
    """None when ``folder`` is a real folder whose COMPLETE matches its sidecar; else why not."""
    return _marked_sidecar(folder)[1]


def _entries(run_dir: str | os.PathLike) -> list[Path]:
    ckdir = Path(run_dir) / CHECKPOINTS_DIR
    try:
        mode = os.lstat(ckdir).st_mode
    except FileNotFoundError:
        return []
    if stat.S_ISLNK(mode):
        raise UnsafePath(f"{ckdir} is a symlink; a run's checkpoints folder must be a real folder inside it")
    if not stat.S_ISDIR(mode):
        return []
    return sorted(ckdir.iterdir())


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``[(step, folder)]`` of the complete checkpoints of a run, ascending by step.

    Complete means a real ``step-NNNNNNNN`` folder whose ``COMPLETE`` marker matches
    its ``sidecar.json``; the tensors themselves are verified by ``load_checkpoint``.
    """
    out = []
    for p in _entries(run_dir):
        step = step_of_dirname(p.name)
        if step is not None and _marker_problem(p) is None:
            out.append((step, p))
    return sorted(out)


def incomplete_checkpoints(run_dir: str | os.PathLike) -> list[tuple[Path, str]]:
    """Everything under ``checkpoints/`` that ``list_checkpoints`` ignores, with the reason."""
    out = []
    for p in _entries(run_dir):
        if p.name.startswith(TEMP_PREFIX):
            out.append((p, "temporary folder of a save that did not finish (or is running now)"))
        elif step_of_dirname(p.name) is not None:
            why = _marker_problem(p)
            if why is not None:
                out.append((p, why))
        elif STEP_DIR_RE.fullmatch(p.name):
            out.append((p, f"an alias of {step_dirname(int(p.name[5:]))}: not a checkpoint folder name (a step's "
                           "folder is step-NNNNNNNN exactly, zero-padded to 8 digits)"))
        else:
            out.append((p, "not a checkpoint folder name (expected step-NNNNNNNN)"))
    return out


def remove_temporary_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Delete the ``.tmp-*`` folders of unfinished saves; call only while no save is running."""
    removed = []
    for p in _entries(run_dir):
        if p.name.startswith(TEMP_PREFIX) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def latest_checkpoint(run_dir: str | os.PathLike, before_step: int | None = None) -> tuple[int, Path] | None:
    """The complete checkpoint with the highest step (``< before_step`` if given), or None."""
    found = [(s, p) for s, p in list_checkpoints(run_dir) if before_step is None or s < before_step]
    return found[-1] if found else None


# ---------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------


def _parse_sidecar(data: bytes, path: Path) -> dict[str, Any]:
    try:
        record = parse_json(data, "checkpoint sidecar", str(path))
    except FileFormatError as exc:
        raise CheckpointError(str(exc)) from None
    if not isinstance(record, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return record


def _read_sidecar(folder: Path) -> dict[str, Any]:
    path = folder / SIDECAR_FILE
    root, prefix = _anchor(folder)
    try:
        data = read_regular(root, f"{prefix}/{SIDECAR_FILE}", "checkpoint sidecar", MAX_SIDECAR_BYTES)
    except (UnsafePath, FileFormatError, OSError) as exc:
        raise CheckpointError(str(exc)) from None
    return _parse_sidecar(data, path)


def _read_state(folder: Path, max_bytes: int, earlier: str) -> bytearray:
    """The bytes of ``state.safetensors``: a regular file in ``folder`` of at most ``max_bytes``, read once."""
    root, prefix = _anchor(folder)
    try:
        with open_regular(root, f"{prefix}/{STATE_FILE}", "checkpoint state", max_bytes) as f:
            size = os.fstat(f.fileno()).st_size
            buf = bytearray(size)
            got = f.readinto(buf)
            extra = f.read(1)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {folder} has no {STATE_FILE}; {earlier}") from None
    except (UnsafePath, FileFormatError, OSError) as exc:
        raise CheckpointError(f"{exc}; {earlier}") from None
    if got != size or extra:
        raise CheckpointError(f"{folder / STATE_FILE} changed size while being read; {earlier}")
    return buf


def _resolve(path_or_run_dir: str | os.PathLike, step: int | None) -> Path:
    p = Path(path_or_run_dir)
    if STEP_DIR_RE.fullmatch(p.name) and not (p / CHECKPOINTS_DIR).is_dir():
        folder_step = step_of_dirname(p.name)
        if folder_step is None:
            raise CheckpointError(f"{p}: not a checkpoint folder name (a step's folder is step-NNNNNNNN exactly, "
                                  "zero-padded to 8 digits)")
        if step is not None and folder_step != int(step):
            raise CheckpointError(f"{p} is the checkpoint of step {folder_step}, not of step {step}")
        if not p.is_dir():
            raise CheckpointError(f"checkpoint folder {p} does not exist")
        return p
    if not p.is_dir():
        raise CheckpointError(f"{p} is neither a run directory nor a checkpoint folder")
    if step is None:
        latest = latest_checkpoint(p)
        if latest is None:
            bad = "; ".join(f"{q.name}: {why}" for q, why in incomplete_checkpoints(p)) or "none at all"
            raise CheckpointError(f"no complete checkpoint under {p / CHECKPOINTS_DIR} (incomplete: {bad})")
        return latest[1]
    try:
        folder = safe_join(p, f"{CHECKPOINTS_DIR}/{step_dirname(step)}")
    except UnsafePath as exc:
        raise CheckpointError(str(exc)) from None
    if not folder.is_dir():
        have = [s for s, _ in list_checkpoints(p)]
        raise CheckpointError(f"run {p} has no checkpoint of step {step} (complete ones: {have[-10:]})")
    return folder


def load_checkpoint(path_or_run_dir: str | os.PathLike, step: int | None = None,
                    max_bytes: int = DEFAULT_MAX_STATE_BYTES) -> Checkpoint:
    """Load and fully verify a checkpoint.

    ``path_or_run_dir`` is a ``step-NNNNNNNN`` folder, or a run directory (then
    ``step`` picks the checkpoint, default the latest complete one). Every file is
    read as a regular file inside the folder (no symlink, FIFO or device), the state
    file once and only if it is at most ``max_bytes`` (``state_bytes_bound`` of the
    run's model is a tight bound). Raises ``CheckpointError`` unless the marker, the
    file digest, every tensor digest and the state root all match.
    """
    folder = _resolve(path_or_run_dir, step)
    step_of_folder = step_of_dirname(folder.name)
    earlier = (f"this checkpoint cannot be used: get an intact copy of {folder.name} from the run's publisher, or go "
               f"on from an earlier checkpoint (`lockstep audit replay RUN --step N --from-earlier`; for `lockstep "
               f"train --resume`, move {folder.name} out of checkpoints/)")
    side_bytes, why = _marked_sidecar(folder)
    if why is not None:
        raise CheckpointError(f"checkpoint {folder} is not complete: {why}; {earlier}")
    side = folder / SIDECAR_FILE
    record = _parse_sidecar(side_bytes, side)
    if record.get("format") != FORMAT:
        raise CheckpointError(f"{side}: format {record.get('format')!r} is not {FORMAT}; "
                              f"this lockstep cannot read it (upgrade lockstep?)")
    if record.get("step") != step_of_folder:
        raise CheckpointError(f"{side} says step {record.get('step')!r} but the folder is step {step_of_folder}")
    want_root, want_file, want_digests = record.get("state_root"), record.get("file_sha256"), record.get("tensor_digests")
    if not (isinstance(want_root, str) and _HEX64.fullmatch(want_root)
            and isinstance(want_file, str) and _HEX64.fullmatch(want_file)
            and isinstance(want_digests, dict)
            and all(isinstance(v, str) and _HEX64.fullmatch(v) for v in want_digests.values())):
        raise CheckpointError(f"{side}: state_root, file_sha256 and tensor_digests must be 64-digit hex digests")

    state_path = folder / STATE_FILE
    buf = _read_state(folder, max_bytes, earlier)
    file_sha = hashlib.sha256(buf).hexdigest()
    try:
        tensors, metadata = parse_safetensors(buf, str(state_path), MAX_HEADER_BYTES)
    except FileFormatError as exc:
        raise CheckpointError(f"{exc}; the checkpoint is corrupt: {earlier}") from None

    if sorted(tensors) != sorted(want_digests):
        missing = sorted(set(want_digests) - set(tensors))
        extra = sorted(set(tensors) - set(want_digests))
        raise CheckpointError(f"{state_path}: tensors differ from {SIDECAR_FILE} "
                              f"(missing {missing[:10]}, unexpected {extra[:10]}); {earlier}")
    got_digests = tensor_digests(tensors)
    bad = [n for n in sorted(want_digests) if got_digests[n] != want_digests[n]]
    if bad:
        raise CheckpointError(f"{state_path}: tensor {bad[0]!r} does not match its digest in {SIDECAR_FILE}"
                              f"{f' (nor do {len(bad) - 1} more: {bad[1:6]})' if len(bad) > 1 else ''}; "
                              f"the file is corrupt or was edited: {earlier}")
    if file_sha != want_file:
        raise CheckpointError(f"{state_path}: sha256 {file_sha} is not the {want_file} recorded in "
                              f"{SIDECAR_FILE} (the tensors match, the header or layout changed); {earlier}")
    if metadata.get("step") != str(step_of_folder):
        raise CheckpointError(f"{state_path}: metadata step {metadata.get('step')!r} is not {step_of_folder}")
    root = state_root_from_digests(got_digests)  # the digests were just recomputed from the tensors
    if root != want_root:
        raise CheckpointError(f"{side}: state root {want_root} does not match the tensors ({root}); {earlier}")
    return Checkpoint(step=step_of_folder, tensors=tensors, sidecar=record, path=folder)
