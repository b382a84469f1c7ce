"""``trajectory.jsonl`` and ``commitment.json``: one record per step, the hash chain through them, its last link.

Each record holds the step's state root, batch digest, tokens, the float32 bits of its
loss, gradient norm and learning rate (their decimals must be exactly those bits'
values), and its chain hash ``H_t``; the commitment publishes ``H_N``.
"""

from __future__ import annotations

import enum
import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from lockstep.fsio import (FileFormatError, UnsafePath, append_line, atomic_write_bytes, atomic_write_json,
                           iter_lines, open_regular, parse_json)
from lockstep.spec import SPEC_VERSION, hashing

from .checkpoint import MAX_STEP
from .recipe import genesis, recipe_digest
from .rundir import (BITS_RE, COMMITMENT_FILE, COMMITMENT_FORMAT, HEX64, MAX_COMMITMENT_BYTES, MAX_RECORD_BYTES,
                     MAX_TOKENS, MAX_TRAJECTORY_BYTES, RECORD_FLOAT_KEYS, RECORD_HEX_KEYS, TRAJECTORY_FILE, RunFileError,
                     _read_run_json, _shown)


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
        bits = rec.get(f"{key}_bits")  # the chain binds these bits: required
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




# ---------------------------------------------------------------- commitment


# The keys a commitment holds, every one always written; ``read_commitment`` refuses any other and any missing.
COMMITMENT_KEYS = frozenset({"format", "version", "last_step", "chain_hash", "genesis", "recipe_sha256",
                             "spec_version"})
COMMITMENT_VERSION = 1
SPEC_VERSION_RE = re.compile(r"[1-9][0-9]{0,8}")  # the form SPEC_VERSION takes: "1", "2", "3" ...


def write_commitment(run_dir: str | os.PathLike, recipe: dict, last_step: int, chain_hash: str) -> None:
    """``commitment.json``: the run's last step and chain hash ``H_last``, its genesis and recipe digest (atomic)."""
    atomic_write_json(Path(run_dir) / COMMITMENT_FILE, {
        "format": COMMITMENT_FORMAT, "version": COMMITMENT_VERSION, "last_step": int(last_step),
        "chain_hash": chain_hash, "genesis": genesis(recipe), "recipe_sha256": recipe_digest(recipe),
        "spec_version": SPEC_VERSION,
    })


def _quoted(v: Any) -> str:
    """A value from a file for a message: one short line (numbers shortened, strings escaped)."""
    return _short_number(v) if type(v) in (int, float) else _shown(v)[:80]


def read_commitment(run_dir: str | os.PathLike) -> dict:
    """``commitment.json``, as strictly as the recipe: strict JSON, exactly ``COMMITMENT_KEYS`` (no other,
    none missing), ``version`` the integer ``COMMITMENT_VERSION``, ``last_step`` an integer from 1 to
    2**63 - 1, ``chain_hash``, ``genesis`` and ``recipe_sha256`` 64 lowercase hex digits, ``spec_version``
    a SPEC_VERSION's decimal string (whether it is the recipe's is ``audit verify``'s check, which has the
    recipe); ``RunFileError`` naming the key otherwise."""
    run_dir = Path(run_dir)
    path = run_dir / COMMITMENT_FILE
    c = _read_run_json(run_dir, COMMITMENT_FILE, "commitment", MAX_COMMITMENT_BYTES,
                       "missing; the run did not finish, or its commitment was not published")
    if not isinstance(c, dict) or c.get("format") != COMMITMENT_FORMAT:
        raise RunFileError(f"{path}: not a lockstep commitment (format {COMMITMENT_FORMAT!r})")
    extra = sorted(set(c) - COMMITMENT_KEYS)
    if extra:
        raise RunFileError(f"{path}: unknown key(s) {', '.join(map(_shown, extra[:5]))}; a commitment holds only "
                           f"{', '.join(sorted(COMMITMENT_KEYS))}")
    missing = sorted(COMMITMENT_KEYS - set(c))
    if missing:
        raise RunFileError(f"{path}: key(s) {', '.join(map(repr, missing))} missing; every lockstep commitment "
                           "has them: the file was edited")
    if type(c["version"]) is not int or c["version"] != COMMITMENT_VERSION:
        raise RunFileError(f"{path}: version must be the integer {COMMITMENT_VERSION}, got {_quoted(c['version'])}")
    if type(c["last_step"]) is not int or not 1 <= c["last_step"] <= MAX_STEP:
        raise RunFileError(f"{path}: 'last_step' must be an integer from 1 to 2**63 - 1, got "
                           f"{_quoted(c['last_step'])}")
    for key in ("chain_hash", "genesis", "recipe_sha256"):
        if not (isinstance(c[key], str) and HEX64.fullmatch(c[key])):
            raise RunFileError(f"{path}: {key!r} must be 64 lowercase hex digits, got {_quoted(c[key])}")
    if not (isinstance(c["spec_version"], str) and SPEC_VERSION_RE.fullmatch(c["spec_version"])):
        raise RunFileError(f"{path}: 'spec_version' must be a SPEC_VERSION (a decimal number in a string, as "
                           f"{SPEC_VERSION!r}), got {_quoted(c['spec_version'])}")
    return c


def commitment_problems(c: dict, records: list[dict], recipe: dict | None) -> list[str]:
    """What in the commitment ``c`` (as ``read_commitment`` returns it) is not the run's: its chain hash and
    last step against the trajectory's last record, and (given the recipe) its genesis, recipe digest and
    SPEC_VERSION against the recipe's. Empty for a commitment the trainer wrote for this run."""
    problems = []
    last = records[-1]["chain_hash"] if records else None
    if c["chain_hash"] != last:
        problems.append(f"chain_hash {c['chain_hash']} is not the trajectory's last chain hash {last}")
    if c["last_step"] != len(records):
        problems.append(f"last_step {c['last_step']} but the trajectory has {len(records)} steps")
    if recipe is None:
        return problems
    if c["genesis"] != genesis(recipe):
        problems.append(f"genesis {c['genesis']} is not H_0 of the recipe {genesis(recipe)}")
    if c["recipe_sha256"] != recipe_digest(recipe):
        problems.append(f"recipe_sha256 {c['recipe_sha256']} is not the recipe's {recipe_digest(recipe)}")
    if c["spec_version"] != recipe["spec_version"]:
        problems.append(f"made with SPEC_VERSION {c['spec_version']!r}, but the recipe says "
                        f"{_shown(recipe['spec_version'])}; the trainer writes the recipe's: the file was edited")
    return problems
