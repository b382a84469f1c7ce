"""The run directory's format: its file names, and the one writer and one reader of each file.

Run directory::

    recipe.json          everything that defines the run; H_0 binds its genesis fields (all
                         but lockstep_version, model.name and data.folder, which change no
                         bit: ``genesis_recipe``); unknown keys are refused
                         (``make_recipe``, ``write_recipe``, ``load_recipe``, ``genesis``)
    target.json          the step the run is to reach; not part of the chain
    data/                the embedded default corpus (manifest + shards), when used
    trajectory.jsonl     one record per step: step, tokens, lr, loss, grad_norm,
                         state_root, batch_digest, chain_hash (+ exact float bits); H_t binds
                         the tokens and the bits of loss, grad norm and lr (``step_record``,
                         ``read_trajectory``)
    metrics.jsonl        wall-clock facts (tokens/s, backend), the loss again and validation
                         losses (``--eval-every``): not part of the chain, not evidence
                         (``audit verify`` compares its losses with the trajectory's and warns)
    checkpoints/         step-NNNNNNNN/ folders (``lockstep.formats.checkpoint``)
    commitment.json      the last chain hash, written when the run ends (by the trainer's loop;
                         read by ``read_commitment``)
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

import dataclasses
import enum
import hashlib
import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

import lockstep
from lockstep.fsio import (FileFormatError, UnsafePath, append_line, atomic_write_bytes, atomic_write_json,
                           iter_lines, json_bytes, open_regular, parse_json, read_json, read_json_regular, safe_join)
from lockstep.spec import SPEC_VERSION, fp, hashing

from .checkpoint import CHECKPOINTS_DIR
from .config import ModelConfig, TrainConfig
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


class RunFileError(ValueError):
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


# ---------------------------------------------------------------- recipe


def make_recipe(cfg: ModelConfig, tcfg: TrainConfig, manifest: Manifest, data_folder: str, seed: int) -> dict:
    """Everything that defines the run's bits (not the number of ranks: it changes none)."""
    return {
        "format": RECIPE_FORMAT,
        "version": RECIPE_VERSION,
        "model": cfg.to_dict(),
        "train": tcfg.to_dict(),
        "data": {"manifest_sha256": manifest.sha256, "folder": data_folder},
        "seed": int(seed),
        "micro_batch": int(tcfg.micro_batch),
        "spec_version": SPEC_VERSION,
        "lockstep_version": lockstep.__version__,
    }


def write_recipe(run_dir: Path, recipe: dict) -> None:
    """``recipe.json``, atomically (indented, keys sorted)."""
    atomic_write_bytes(Path(run_dir) / RECIPE_FILE, json.dumps(recipe, indent=2, sort_keys=True).encode() + b"\n")


def recipe_digest(recipe: dict) -> str:
    """SHA-256 of the whole recipe's canonical JSON (``fsio.json_bytes``: sorted keys, 2-space
    indent, UTF-8, final newline); for a recipe ``write_recipe`` wrote, the file's own bytes.
    Checkpoint sidecars record it (``recipe_sha256``) to bind a checkpoint to its run; H_0
    binds ``genesis_recipe_digest`` instead."""
    return hashlib.sha256(json_bytes(recipe)).hexdigest()


# The top-level keys a recipe may have, and those of its "data" object; ``load_recipe``
# refuses any other, so no extra key can be added to the file (it would be inert for H_0
# anyway, but a recipe says what it means).
RECIPE_KEYS = frozenset({"format", "version", "model", "train", "data", "seed", "micro_batch", "spec_version",
                         "lockstep_version"})
RECIPE_DATA_KEYS = frozenset({"folder", "manifest_sha256"})
# Recipe fields that change no trained bit, so H_0 leaves them out: which lockstep release
# wrote the recipe, the preset's label, and where the data folder lies (the manifest's
# digest binds the data itself).
NON_BIT_FIELDS = ("lockstep_version", "model.name", "data.folder")


# Float settings that reach every op only as a float32 (``np.float32(v)`` or the backend's
# HOST_FLOAT -> float32 operand, read canonically): every float64 of one float32 rounding
# interval trains the same bits, so H_0 binds the float32 value. The others (peak_lr,
# min_lr_ratio, beta1, beta2, init_std, rope_theta) enter float64 host math first, so
# their float64 value is what counts. A new use of one of these five as a float64 must
# move it to the second list.
FLOAT32_SETTINGS = {"model": ("norm_eps", "z_loss"), "train": ("eps", "weight_decay", "grad_clip")}


def _settings(values: dict, cls, section: str) -> dict:
    """A model/train section written out in full: every field (defaults filled in), floats as
    floats, the ``FLOAT32_SETTINGS`` as the float32 the ops read (``fp.f32``: rounded, a
    subnormal read as a zero of its sign)."""
    cfg = cls.from_dict(values)
    out = cfg.to_dict()
    for f in dataclasses.fields(cls):
        if isinstance(f.default, float):
            out[f.name] = float(out[f.name])
        if f.name in FLOAT32_SETTINGS[section]:
            out[f.name] = float(fp.f32(out[f.name])[()])
    return out


def genesis_recipe(recipe: dict) -> dict:
    """The fields of a recipe that ``H_0`` binds: the recipe without ``NON_BIT_FIELDS``, with
    every model and train setting written out in full (defaults filled in, an integer given
    for a float setting as the float, a ``FLOAT32_SETTINGS`` value as its float32). Recipes
    that differ only in how they spell the same settings, or in fields that change no bit,
    have the same genesis fields, so no such edit can give a run another ``H_0``."""
    model = _settings(recipe["model"], ModelConfig, "model")
    del model["name"]
    return {
        "format": recipe["format"],
        "version": recipe.get("version", RECIPE_VERSION),
        "model": model,
        "train": _settings(recipe["train"], TrainConfig, "train"),
        "data": {"manifest_sha256": recipe["data"]["manifest_sha256"]},
        "seed": recipe["seed"],
        "micro_batch": recipe["micro_batch"],
        "spec_version": recipe["spec_version"],
    }


def genesis_recipe_digest(recipe: dict) -> str:
    """SHA-256 of ``genesis_recipe(recipe)``'s canonical JSON (``fsio.json_bytes``): H_0's recipe digest."""
    return hashlib.sha256(json_bytes(genesis_recipe(recipe))).hexdigest()


def genesis(recipe: dict) -> str:
    """``H_0 = hashing.genesis_hash(genesis_recipe_digest(recipe), data.manifest_sha256, spec_version)``.

    It binds the recipe's genesis fields (``genesis_recipe``: everything but
    ``lockstep_version``, ``model.name`` and ``data.folder``, settings in full), the data
    manifest's SHA-256 and the SPEC_VERSION; see ``lockstep.spec.hashing.genesis_hash``
    for the bytes.
    """
    return hashing.genesis_hash(genesis_recipe_digest(recipe), recipe["data"]["manifest_sha256"],
                                recipe["spec_version"])


def recipe_configs(recipe: dict) -> tuple[ModelConfig, TrainConfig]:
    return ModelConfig.from_dict(recipe["model"]), TrainConfig.from_dict(recipe["train"])


# Stated maxima for the numbers in a recipe, checked before anything is sized by them. Open-1B is
# far inside every one (vocab 128,256, d_model 2048, 24 layers, seq_len 4096, 2304 sequences per step).
RECIPE_INT_LIMITS = {
    "vocab_size": 1 << 24, "d_model": 1 << 16, "n_layers": 1 << 10, "n_heads": 1 << 10, "n_kv_heads": 1 << 10,
    "head_dim": 1 << 12, "ffn_dim": 1 << 20, "seq_len": 1 << 20, "sliding_window": 1 << 20,
    "full_attention_every": 1 << 10, "warmup_tokens": 1 << 62, "total_tokens": 1 << 62, "micro_batch": 1 << 20,
}
MAX_BATCH_SEQUENCES = 1 << 20
MAX_BATCH_BYTES = 1 << 32  # one step's windows as int32 (Open-1B: 38 MB)
MAX_FLOAT_MAGNITUDE = 1e30


def _field_problem(name: str, value: Any, default: Any) -> str | None:
    """Why ``value`` cannot stand for the config field ``name`` whose default is ``default`` (or None)."""
    if isinstance(default, bool):
        return None if type(value) is bool else f"{name} must be true or false, got {value!r}"
    if isinstance(default, int):
        hi = RECIPE_INT_LIMITS.get(name, 1 << 62)
        if type(value) is not int or not 1 <= value <= hi:
            return f"{name} must be an integer from 1 to {hi}, got {value!r}"
        return None
    if isinstance(default, float):
        if type(value) not in (int, float) or not math.isfinite(value) or abs(value) > MAX_FLOAT_MAGNITUDE:
            return f"{name} must be a finite number, got {value!r}"
        return None
    if isinstance(default, str):
        return None if isinstance(value, str) and len(value) <= 200 else f"{name} must be a short string"
    return None


def _ramp_problem(ramp: Any) -> str | None:
    if not isinstance(ramp, list) or not 1 <= len(ramp) <= 1000:
        return "batch_ramp must be a list of 1 to 1000 [from_tokens, sequences] pairs"
    for pair in ramp:
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(v) is int for v in pair)
                and 0 <= pair[0] < 1 << 62 and 1 <= pair[1] <= MAX_BATCH_SEQUENCES):
            return (f"batch_ramp entry {pair!r} must be [from_tokens >= 0, sequences from 1 to "
                    f"{MAX_BATCH_SEQUENCES}]")
    if ramp[0][0] != 0:
        return "batch_ramp must start at 0 tokens"
    return None


def recipe_value_problems(recipe: dict) -> list[str]:
    """Every model/train value of a recipe with the wrong type, a non-finite number, or beyond a stated maximum.

    Checked before a config is built or anything is sized by it: integers are JSON
    integers within ``RECIPE_INT_LIMITS``, floats finite, flags true/false, and one
    step's batch at most ``MAX_BATCH_BYTES`` of windows.
    """
    problems = []
    for section, cls in (("model", ModelConfig), ("train", TrainConfig)):
        values = recipe.get(section)
        if not isinstance(values, dict):
            problems.append(f"'{section}' must be a JSON object")
            continue
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(defaults))
        if unknown:
            problems.append(f"unknown {section} key(s) {', '.join(map(repr, unknown[:5]))}")
        for name, value in values.items():
            if name == "batch_ramp":
                why = _ramp_problem(value)
            elif name in defaults:
                why = _field_problem(name, value, defaults[name])
            else:
                continue
            if why:
                problems.append(f"{section}.{why}")
    if problems:
        return problems
    seq_len = recipe["model"].get("seq_len", ModelConfig.seq_len)
    biggest = max(n for _, n in recipe["train"].get("batch_ramp", [[0, 16]]))
    if biggest * (seq_len + 1) * 4 > MAX_BATCH_BYTES:
        problems.append(f"a step of {biggest} sequences of {seq_len + 1} tokens is "
                        f"{biggest * (seq_len + 1) * 4 / 2**30:.1f} GiB of windows; at most "
                        f"{MAX_BATCH_BYTES / 2**30:.0f} GiB is supported")
    return problems


def _read_run_json(run_dir: Path, name: str, what: str, max_bytes: int, missing: str, damaged_hint: str = ""):
    """A run file's strict JSON (a regular file inside ``run_dir``); ``RunFileError`` saying
    ``missing`` when it is absent, else the reader's reason followed by ``damaged_hint``."""
    try:
        return read_json_regular(run_dir, name, what, max_bytes)
    except FileNotFoundError:
        raise RunFileError(f"{run_dir / name}: {missing}") from None
    except (FileFormatError, UnsafePath, OSError) as exc:
        raise RunFileError(f"{exc}{damaged_hint}") from None


def load_recipe(run_dir: str | os.PathLike) -> dict:
    """``recipe.json``, strictly parsed and structurally checked (``RunFileError`` otherwise)."""
    run_dir = Path(run_dir)
    path = run_dir / RECIPE_FILE
    recipe = _read_run_json(run_dir, RECIPE_FILE, "recipe", MAX_RECIPE_BYTES,
                            "missing; this is not a lockstep run directory (or it was not copied whole)",
                            "; restore recipe.json from the run's publisher")
    if not isinstance(recipe, dict) or recipe.get("format") != RECIPE_FORMAT:
        raise RunFileError(f"{path}: not a lockstep recipe (format must be {RECIPE_FORMAT!r})")
    for key in ("model", "train", "data", "seed", "micro_batch", "spec_version"):
        if key not in recipe:
            raise RunFileError(f"{path}: key {key!r} missing")
    extra = sorted(set(recipe) - RECIPE_KEYS)
    if extra:
        raise RunFileError(f"{path}: unknown key(s) {', '.join(map(_shown, extra[:5]))}; a recipe holds only "
                           f"{', '.join(sorted(RECIPE_KEYS))}")
    version = recipe.get("version", RECIPE_VERSION)
    if type(version) is not int or version != RECIPE_VERSION:
        raise RunFileError(f"{path}: recipe version must be {RECIPE_VERSION}, got {version!r}")
    if "lockstep_version" in recipe and not (isinstance(recipe["lockstep_version"], str)
                                             and len(recipe["lockstep_version"]) <= 200):
        raise RunFileError(f"{path}: lockstep_version must be a short string")
    data = recipe["data"]
    if not (isinstance(data, dict) and isinstance(data.get("folder"), str)
            and isinstance(data.get("manifest_sha256"), str) and HEX64.fullmatch(data["manifest_sha256"])):
        raise RunFileError(f"{path}: 'data' must hold a folder and a 64-digit manifest_sha256")
    if set(data) - RECIPE_DATA_KEYS:
        raise RunFileError(f"{path}: unknown 'data' key(s) "
                           f"{', '.join(map(_shown, sorted(set(data) - RECIPE_DATA_KEYS)[:5]))}")
    if type(recipe["seed"]) is not int or not 0 <= recipe["seed"] < 2**64:
        raise RunFileError(f"{path}: seed must be an integer in [0, 2**64), got {recipe['seed']!r}")
    if not isinstance(recipe["spec_version"], str):
        raise RunFileError(f"{path}: spec_version must be a string")
    bad = recipe_value_problems(recipe)
    if bad:
        raise RunFileError(f"{path}: " + "; ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""))
    try:
        cfg, tcfg = recipe_configs(recipe)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise RunFileError(f"{path}: bad model/train settings: {exc}") from None
    if recipe["micro_batch"] != tcfg.micro_batch:
        raise RunFileError(f"{path}: micro_batch {recipe['micro_batch']!r} differs from train.micro_batch "
                           f"{tcfg.micro_batch}")
    return recipe


# ---------------------------------------------------------------- trajectory


class Strictness(enum.Enum):
    """How ``read_trajectory`` treats a trajectory that is not (yet) whole; every caller names one."""

    AUDIT = "audit"  # a published run: the file must exist and every line be whole
    LIVE = "live"  # a run being trained, resumed or used: no file is no step yet, a torn last line is dropped


def float_record(x) -> dict:
    """A float32 for JSON: its value and its exact bits."""
    x = np.float32(x)
    return {"value": float(x), "bits": f"0x{int(np.asarray(x).view(np.uint32)):08X}"}


def step_record(t: int, plan, res, bdigest: str, prev_chain: str) -> dict:
    """The trajectory record of step ``t`` (``plan``: its ``StepPlan``, ``res``: its ``StepResult``),
    with its chain hash ``H_t`` computed from ``prev_chain`` = ``H_{t-1}``."""
    
    rec = {
        "step": t, "tokens": plan.tokens_after, "lr": float(res.lr), "loss": float(res.loss),
        "grad_norm": float(res.grad_norm), "state_root": res.state_root, "batch_digest": bdigest,
        "lr_bits": float_record(res.lr)["bits"], "loss_bits": float_record(res.loss)["bits"],
        "grad_norm_bits": float_record(res.grad_norm)["bits"],
    }
    rec["chain_hash"] = hashing.record_chain_hash(prev_chain, rec)
    return rec


def record_line(obj: dict) -> bytes:
    """One line of ``trajectory.jsonl`` or ``metrics.jsonl``: JSON with sorted keys and a newline."""
    return json.dumps(obj, sort_keys=True).encode() + b"\n"


def append_record(path: Path, obj: dict) -> None:
    """Append one record to a line log of the run (``fsio.append_line``: no symlink, FIFO or device)."""
    append_line(path, record_line(obj))


def write_trajectory(run_dir: Path, records: list[dict]) -> None:
    """``trajectory.jsonl`` holding exactly ``records`` (atomically: a new run's empty file, a resume's kept steps)."""
    atomic_write_bytes(Path(run_dir) / TRAJECTORY_FILE, b"".join(record_line(r) for r in records))


def bits_value(bits: str) -> float:
    """The value of the float32 with bits ``bits`` (``0x3F800000``, as a trajectory writes them), exactly."""
    return struct.unpack("<f", int(bits, 16).to_bytes(4, "little"))[0]


def record_value(rec: dict, key: str) -> float:
    """The loss, gradient norm or learning rate of a trajectory record, from its chained bits.

    What every reader shows: the bits are what ``H_t`` binds, and ``read_trajectory``
    refuses a record whose decimal is not their value.
    """
    return bits_value(rec[f"{key}_bits"])


def _same_number(decimal: int | float, value: float) -> bool:
    """``decimal`` is exactly ``value`` (sign of zero included); no conversion, so no overflow."""
    return decimal == value and (value != 0 or math.copysign(1.0, decimal) == math.copysign(1.0, value))


def _short_number(v: int | float) -> str:
    r = repr(v)
    return r if len(r) <= 40 else f"{r[:20]}...({len(r)} digits)"


def _check_record(rec: Any, lineno: int, path: Path) -> None:
    where = f"{path}:{lineno}"
    if not isinstance(rec, dict):
        raise RunFileError(f"{where}: a trajectory record must be a JSON object")
    step = rec.get("step")
    if type(step) is not int or step < 1:
        raise RunFileError(f"{where}: 'step' must be an integer >= 1, got {step!r}")
    tokens = rec.get("tokens")
    if type(tokens) is not int or not 1 <= tokens <= MAX_TOKENS:
        shown = _short_number(tokens) if type(tokens) is int else type(tokens).__name__
        raise RunFileError(f"{where} (step {step}): 'tokens' must be an integer from 1 to 2**64 - 1, got {shown}; "
                           "no trainer writes that: the record was edited")
    for key in RECORD_HEX_KEYS:
        v = rec.get(key)
        if not isinstance(v, str) or not HEX64.fullmatch(v):
            raise RunFileError(f"{where} (step {step}): {key!r} must be 64 lowercase hex digits, got {v!r}")
    for key in RECORD_FLOAT_KEYS:
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RunFileError(f"{where} (step {step}): {key!r} must be a number")
        bits = rec.get(f"{key}_bits")  # the chain binds these bits (SPEC_VERSION 2): required
        if not (isinstance(bits, str) and BITS_RE.fullmatch(bits)):
            raise RunFileError(f"{where} (step {step}): '{key}_bits' must look like 0x3F800000, got {bits!r}")
        value = bits_value(bits)
        if not math.isfinite(value):
            raise RunFileError(f"{where} (step {step}): '{key}_bits' {bits} is not a finite float32 (training stops "
                               "before it publishes one): the record was edited")
        if not _same_number(v, value):  # the decimal is shown (curves, model cards): it must be the bits' value
            raise RunFileError(f"{where} (step {step}): {key!r} is {_short_number(v)} but its chained bits {bits} "
                               f"are {value!r}; the trainer writes the bits' exact value, so the decimal was "
                               "edited: the run is invalid (get the publisher's trajectory)")


def read_trajectory(run_dir: str | os.PathLike, strictness: Strictness) -> list[dict]:
    """Every record of ``trajectory.jsonl``: strict JSON, steps 1..N in order, digests as hex,
    token counts from 1 to 2**64 - 1, and each of loss, gradient norm and learning rate
    a finite float32 whose decimal is exactly the value of its chained bits (so whatever
    a reader shows from a record is what ``H_t`` binds).

    The file must be a regular file inside the run (no symlink, FIFO or device) of at
    most ``MAX_TRAJECTORY_BYTES``; it is streamed one line at a time with a cap of
    ``MAX_RECORD_BYTES`` per line, so a blank, sparse or single-line file costs no
    memory. A blank line, a duplicate key, a gap or a repeated step raise
    ``RunFileError`` naming the line. ``Strictness.AUDIT`` tolerates nothing more;
    ``Strictness.LIVE`` returns [] when there is no file yet and drops a last line
    without its newline (a crash mid-append).
    """
    if not isinstance(strictness, Strictness):
        raise TypeError(f"strictness must be a Strictness, got {strictness!r}")
    run_dir = Path(run_dir)
    path = run_dir / TRAJECTORY_FILE
    live = strictness is Strictness.LIVE
    records: list[dict] = []
    try:
        with open_regular(run_dir, TRAJECTORY_FILE, "trajectory", MAX_TRAJECTORY_BYTES) as f:
            for lineno, line, ended in iter_lines(f, str(path), MAX_RECORD_BYTES):
                try:
                    rec = parse_json(line, "trajectory record", f"{path}:{lineno}")
                except FileFormatError as exc:
                    if not ended and live:
                        break
                    hint = (" (a torn last line: the run crashed mid-append; `lockstep train --resume` repairs it)"
                            if not ended else "")
                    raise RunFileError(f"{exc}{hint}") from None
                _check_record(rec, lineno, path)
                want = len(records) + 1
                if rec["step"] != want:
                    raise RunFileError(f"{path}:{lineno}: step {rec['step']} where step {want} was expected "
                                       "(records must run 1, 2, 3 ... with no gap or repeat)")
                records.append(rec)
    except FileNotFoundError:
        if live:
            return []
        raise RunFileError(f"{path}: missing; the run has no published trajectory") from None
    except (UnsafePath, FileFormatError) as exc:
        raise RunFileError(f"{exc}") from None
    except OSError as exc:
        raise RunFileError(f"{path}: cannot be read ({exc})") from None
    return records


def checkpoints_beyond(run_dir: str | os.PathLike, last_step: int) -> list[int]:
    """Steps after ``last_step`` (the trajectory's last) with a ``step-NNNNNNNN`` folder, complete or not.

    No chain link covers what such a checkpoint holds (the trainer appends a step's
    record before it saves the step's checkpoint), so a run with one is invalid for
    ``audit verify`` and ``audit replay`` (and so for the certificates merge counts),
    and ``lockstep sample|eval|export`` never use one. Raises ``UnsafePath`` when
    ``checkpoints/`` is a symlink.
    """
    from . import checkpoint as ckpt

    steps = {s for s, _ in ckpt.list_checkpoints(run_dir)}
    steps |= {ckpt.step_of_dirname(p.name) for p, _ in ckpt.incomplete_checkpoints(run_dir)} - {None}
    return sorted(s for s in steps if s > last_step)


def first_broken_link(recipe: dict, records: list[dict]) -> int | None:
    """The first step whose ``chain_hash`` is not ``H_t`` recomputed from ``H_0`` and the records; None if none."""
    h = genesis(recipe)
    for rec in records:
        if hashing.record_chain_hash(h, rec) != rec["chain_hash"]:
            return rec["step"]
        h = rec["chain_hash"]
    return None


# ---------------------------------------------------------------- commitment


def write_commitment(run_dir: str | os.PathLike, recipe: dict, last_step: int, chain_hash: str) -> None:
    """``commitment.json``: the run's last step and chain hash ``H_last``, its genesis and recipe digest (atomic)."""
    atomic_write_json(Path(run_dir) / COMMITMENT_FILE, {
        "format": COMMITMENT_FORMAT, "version": 1, "last_step": int(last_step), "chain_hash": chain_hash,
        "genesis": genesis(recipe), "recipe_sha256": recipe_digest(recipe), "spec_version": SPEC_VERSION,
    })


def read_commitment(run_dir: str | os.PathLike) -> dict:
    """``commitment.json`` (strict JSON, checked shape); ``RunFileError`` otherwise."""
    run_dir = Path(run_dir)
    path = run_dir / COMMITMENT_FILE
    c = _read_run_json(run_dir, COMMITMENT_FILE, "commitment", MAX_COMMITMENT_BYTES,
                       "missing; the run did not finish, or its commitment was not published")
    if not isinstance(c, dict) or c.get("format") != COMMITMENT_FORMAT:
        raise RunFileError(f"{path}: not a lockstep commitment (format {COMMITMENT_FORMAT!r})")
    if not (isinstance(c.get("chain_hash"), str) and HEX64.fullmatch(c["chain_hash"])):
        raise RunFileError(f"{path}: 'chain_hash' must be 64 lowercase hex digits")
    if type(c.get("last_step")) is not int:
        raise RunFileError(f"{path}: 'last_step' must be an integer")
    return c


# ---------------------------------------------------------------- data


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
