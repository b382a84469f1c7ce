"""``lockstep audit verify RUN``: check a run directory without replaying any step.

The checks, in order (each failure is one ``Finding``; all are collected):

1. **Layout.** ``recipe.json``, ``trajectory.jsonl`` and ``commitment.json`` exist;
   nothing at the top level or under ``checkpoints/`` is a symlink that leaves the
   run directory; every ``step-NNNNNNNN`` folder is complete (its ``COMPLETE`` marker
   matches its sidecar). Leftover ``.tmp-*`` folders and unknown files are warnings.
2. **Recipe.** Strict JSON, known keys only (``ModelConfig.from_dict``), and its
   SHA-256 (``trainer.recipe_digest``) gives ``H_0 = genesis(recipe)``.
3. **Data.** ``rundir.open_run_data``: the recipe's data folder, which must be inside
   the run (a folder elsewhere, as ``train --data DIR`` records it, is read only when
   the auditor names it with ``--data DIR``); the manifest's digest must be the
   recipe's before any shard is read, then every shard's SHA-256 is checked.
4. **Trajectory and chain.** Strict JSON lines, steps 1..N in order, hex digests;
   the chain is recomputed from ``H_0``: ``H_t = chain_hash(t, H_{t-1}, state_root_t,
   batch_digest_t)`` must equal each record's ``chain_hash`` (a broken link is
   reported and the next link is checked from the published value, so each broken
   link is reported once). Each record's ``tokens`` and ``lr`` bits are recomputed
   from the schedule, and its float bits must agree with its decimal values.
5. **Batches** (optional, on by default): every ``batch_digest`` is rebuilt from the
   data stream, so a trajectory cannot name a batch the data does not produce.
6. **Checkpoints.** Each is loaded by ``checkpoint.load_checkpoint`` (marker, file
   digest, every tensor's digest, the state root recomputed from the tensors); its
   state root must be the trajectory's at that step and its sidecar's chain hash,
   recipe digest, token count and data-stream record must be the run's. On a
   failure the tensors whose digests differ from the sidecar are named.
7. **Commitment.** ``commitment.json`` holds the last chain hash (recomputed), the
   last step, ``H_0`` and the recipe digest.

The helpers here (``load_run_recipe``, ``read_trajectory_strict``, ``open_data``) are
shared with ``replay``: they read only through ``safe_join`` and strict JSON.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lockstep.fsio import FileFormatError, UnsafePath, parse_json, read_json, read_safetensors, safe_join
from lockstep.spec import SPEC_VERSION, hashing
from lockstep.train import checkpoint as ckpt
from lockstep.train.config import ModelConfig, TrainConfig
from lockstep.train.data import GlobalStream, Manifest, batch_digest
from lockstep.train.rundir import TARGET_FILE, DataLocationError, open_run_data, run_data_folder
from lockstep.train.trainer import (COMMITMENT_FILE, DATA_DIR, METRICS_FILE, RECIPE_FILE, RECIPE_FORMAT,
                                    TRAJECTORY_FILE, genesis, recipe_configs, recipe_digest)

HEX64 = re.compile(r"[0-9a-f]{64}")
BITS_RE = re.compile(r"0x[0-9A-F]{8}")
MAX_TRAJECTORY_BYTES = 1 << 30  # a billion bytes is ~3M steps; refuse anything larger
KNOWN_TOP_LEVEL = {RECIPE_FILE, TRAJECTORY_FILE, METRICS_FILE, COMMITMENT_FILE, DATA_DIR, ckpt.CHECKPOINTS_DIR,
                   "loss.png", TARGET_FILE}
RECORD_HEX_KEYS = ("state_root", "batch_digest", "chain_hash")
RECORD_FLOAT_KEYS = ("lr", "loss", "grad_norm")


class RunFileError(ValueError):
    """A file of the run cannot be used; the message names it and says what to do."""


@dataclass
class Finding:
    """One problem: which check, which file, which step and tensor, what is wrong and what to do."""

    check: str  # layout, recipe, data, trajectory, chain, batch, checkpoint, commitment, path
    path: str
    message: str
    step: int | None = None
    tensor: str | None = None
    severity: str = "error"  # "error" makes the run invalid; "warning" does not

    def __str__(self) -> str:
        where = self.path
        if self.step is not None:
            where += f", step {self.step}"
        if self.tensor is not None:
            where += f", tensor {self.tensor!r}"
        return f"{self.severity} [{self.check}] {where}: {self.message}"

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Report:
    """The outcome of ``verify_run``: ``ok`` when no finding is an error."""

    run_dir: Path
    findings: list[Finding] = field(default_factory=list)
    steps: int = 0
    preset: str | None = None
    genesis: str | None = None
    recipe_sha256: str | None = None
    chain_hash: str | None = None  # the recomputed H_N (None when the chain is broken)
    checkpoints_verified: list[int] = field(default_factory=list)
    shards_verified: int = 0
    batches_checked: int = 0
    passed: list[str] = field(default_factory=list)  # one line per check that passed

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity != "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, check: str, path, message: str, *, step: int | None = None, tensor: str | None = None,
            severity: str = "error") -> None:
        self.findings.append(Finding(check, str(path), message, step, tensor, severity))

    def format(self) -> str:
        lines = [f"run {self.run_dir}: {self.steps} step(s), preset {self.preset}"]
        lines += [f"  ok  {p}" for p in self.passed]
        for f in self.findings:
            lines.append(f"  {f}")
        n_err = len(self.errors)
        lines.append("VALID" if self.ok else f"INVALID: {n_err} error(s)")
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Shared readers (verify and replay)
# ---------------------------------------------------------------------------


def run_path(run_dir: Path, rel: str) -> Path:
    """``run_dir / rel`` through ``safe_join``; ``RunFileError`` if it would leave the run."""
    try:
        return safe_join(run_dir, rel)
    except UnsafePath as exc:
        raise RunFileError(f"{run_dir}: {exc}; a run directory must not point outside itself: "
                           "remove the link or copy the file into the run") from None


def load_run_recipe(run_dir: Path) -> dict:
    """``recipe.json``, strictly parsed and structurally checked (``RunFileError`` otherwise)."""
    path = run_path(run_dir, RECIPE_FILE)
    if not path.is_file():
        raise RunFileError(f"{path}: missing; this is not a lockstep run directory (or it was not copied whole)")
    try:
        recipe = read_json(path, "recipe")
    except (FileFormatError, OSError) as exc:
        raise RunFileError(f"{exc}; restore recipe.json from the run's publisher") from None
    if not isinstance(recipe, dict) or recipe.get("format") != RECIPE_FORMAT:
        raise RunFileError(f"{path}: not a lockstep recipe (format must be {RECIPE_FORMAT!r})")
    for key in ("model", "train", "data", "seed", "micro_batch", "spec_version"):
        if key not in recipe:
            raise RunFileError(f"{path}: key {key!r} missing")
    data = recipe["data"]
    if not (isinstance(data, dict) and isinstance(data.get("folder"), str)
            and isinstance(data.get("manifest_sha256"), str) and HEX64.fullmatch(data["manifest_sha256"])):
        raise RunFileError(f"{path}: 'data' must hold a folder and a 64-digit manifest_sha256")
    if type(recipe["seed"]) is not int or not 0 <= recipe["seed"] < 2**64:
        raise RunFileError(f"{path}: seed must be an integer in [0, 2**64), got {recipe['seed']!r}")
    if not isinstance(recipe["spec_version"], str):
        raise RunFileError(f"{path}: spec_version must be a string")
    try:
        cfg, tcfg = recipe_configs(recipe)
    except (TypeError, ValueError) as exc:
        raise RunFileError(f"{path}: bad model/train settings: {exc}") from None
    if recipe["micro_batch"] != tcfg.micro_batch:
        raise RunFileError(f"{path}: micro_batch {recipe['micro_batch']!r} differs from train.micro_batch "
                           f"{tcfg.micro_batch}")
    return recipe


def configs(recipe: dict) -> tuple[ModelConfig, TrainConfig]:
    return recipe_configs(recipe)


def data_location(run_dir: Path, recipe: dict, override: str | os.PathLike | None = None) -> tuple[Path, str | None]:
    """Where the run's data is (``rundir.run_data_folder``: ``--data DIR``, else the recipe's folder, which
    must be inside the run) and a warning (none today); ``RunFileError`` when it is outside the run."""
    try:
        return run_data_folder(run_dir, recipe, override), None
    except DataLocationError as exc:
        raise RunFileError(str(exc)) from None


def step_plans(tcfg: TrainConfig, seq_len: int, last_step: int):
    """``plan_step(tcfg, seq_len, t)`` for t = 1 .. last_step, built incrementally (O(N), not O(N^2)).

    The same definition as ``schedule.step_windows``: each step takes
    ``sequences_per_step(tcfg, tokens_before)`` windows after the previous step's.
    """
    from lockstep.train.schedule import sequences_per_step
    from lockstep.train.step import StepPlan

    first = tokens = 0
    for t in range(1, last_step + 1):
        n = sequences_per_step(tcfg, tokens)
        yield StepPlan(t, first, n, tokens, seq_len)
        first += n
        tokens += n * seq_len


def open_data(run_dir: Path, recipe: dict, override: str | os.PathLike | None = None) -> Manifest:
    """The run's data (``rundir.open_run_data``: manifest digest checked against the recipe, then every shard)."""
    try:
        return open_run_data(run_dir, recipe, override)
    except DataLocationError as exc:
        raise RunFileError(str(exc)) from None


def _check_record(rec: Any, lineno: int, path: Path) -> None:
    where = f"{path}:{lineno}"
    if not isinstance(rec, dict):
        raise RunFileError(f"{where}: a trajectory record must be a JSON object")
    step = rec.get("step")
    if type(step) is not int or step < 1:
        raise RunFileError(f"{where}: 'step' must be an integer >= 1, got {step!r}")
    if type(rec.get("tokens")) is not int:
        raise RunFileError(f"{where} (step {step}): 'tokens' must be an integer")
    for key in RECORD_HEX_KEYS:
        v = rec.get(key)
        if not isinstance(v, str) or not HEX64.fullmatch(v):
            raise RunFileError(f"{where} (step {step}): {key!r} must be 64 lowercase hex digits, got {v!r}")
    for key in RECORD_FLOAT_KEYS:
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RunFileError(f"{where} (step {step}): {key!r} must be a number")
        bits = rec.get(f"{key}_bits")
        if bits is not None and not (isinstance(bits, str) and BITS_RE.fullmatch(bits)):
            raise RunFileError(f"{where} (step {step}): '{key}_bits' must look like 0x3F800000, got {bits!r}")


def read_trajectory_strict(run_dir: Path) -> list[dict]:
    """Every record of ``trajectory.jsonl``: strict JSON, steps 1..N in order, digests as hex.

    Unlike the trainer's reader nothing is tolerated: a torn last line, a duplicate
    key, a gap or a repeated step raises ``RunFileError`` naming the line.
    """
    path = run_path(run_dir, TRAJECTORY_FILE)
    if not path.is_file():
        raise RunFileError(f"{path}: missing; the run has no published trajectory")
    if path.stat().st_size > MAX_TRAJECTORY_BYTES:
        raise RunFileError(f"{path}: larger than {MAX_TRAJECTORY_BYTES} bytes; refusing it")
    data = path.read_bytes()
    lines = data.split(b"\n")
    records: list[dict] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = parse_json(line, "trajectory record", f"{path}:{i + 1}")
        except FileFormatError as exc:
            torn = i == len(lines) - 1 and not data.endswith(b"\n")
            hint = (" (a torn last line: the run crashed mid-append; `lockstep train --resume` repairs it)"
                    if torn else "")
            raise RunFileError(f"{exc}{hint}") from None
        _check_record(rec, i + 1, path)
        want = len(records) + 1
        if rec["step"] != want:
            raise RunFileError(f"{path}:{i + 1}: step {rec['step']} where step {want} was expected "
                               "(records must run 1, 2, 3 ... with no gap or repeat)")
        records.append(rec)
    return records


def read_commitment(run_dir: Path) -> dict:
    """``commitment.json`` (strict JSON, checked shape)."""
    path = run_path(run_dir, COMMITMENT_FILE)
    if not path.is_file():
        raise RunFileError(f"{path}: missing; the run did not finish, or its commitment was not published")
    try:
        c = read_json(path, "commitment")
    except (FileFormatError, OSError) as exc:
        raise RunFileError(str(exc)) from None
    if not isinstance(c, dict) or c.get("format") != "lockstep.commitment":
        raise RunFileError(f"{path}: not a lockstep commitment (format 'lockstep.commitment')")
    if not (isinstance(c.get("chain_hash"), str) and HEX64.fullmatch(c["chain_hash"])):
        raise RunFileError(f"{path}: 'chain_hash' must be 64 lowercase hex digits")
    if type(c.get("last_step")) is not int:
        raise RunFileError(f"{path}: 'last_step' must be an integer")
    return c


def float_bits(x) -> str:
    """``0x3F800000``: the bits of ``x`` rounded to float32 (as the trajectory writes them)."""
    return f"0x{int(np.asarray(np.float32(x)).view(np.uint32)):08X}"


def checkpoint_tensor_diffs(folder: Path) -> list[str]:
    """Names of the tensors of a checkpoint whose digests differ from its sidecar (diagnosis only).

    Reads the safetensors file with the validating reader (never pickle); returns []
    when the file cannot even be parsed or the sidecar has no digests.
    """
    try:
        side = read_json(safe_join(folder, ckpt.SIDECAR_FILE), "checkpoint sidecar")
        want = side.get("tensor_digests") if isinstance(side, dict) else None
        tensors, _ = read_safetensors(safe_join(folder, ckpt.STATE_FILE))
    except (OSError, ValueError):
        return []
    if not isinstance(want, dict):
        return []
    got = hashing.tensor_digests(tensors)
    names = sorted(set(want) | set(got))
    return [n for n in names if want.get(n) != got.get(n)]


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------


def _check_layout(run_dir: Path, rep: Report) -> None:
    for entry in sorted(run_dir.iterdir()):
        name = entry.name
        if entry.is_symlink():
            try:
                safe_join(run_dir, name)
            except UnsafePath as exc:
                rep.add("path", entry, f"{exc}; a run directory must hold its own files: replace the link "
                                       "with the file it names, or refuse the run")
                continue
        if name not in KNOWN_TOP_LEVEL:
            rep.add("layout", entry, "unexpected entry (ignored by the audit)", severity="warning")
    for name in (RECIPE_FILE, TRAJECTORY_FILE, COMMITMENT_FILE):
        p = run_dir / name
        if not p.exists() and not p.is_symlink():
            rep.add("layout", p, "missing" + ("; the run did not finish or was published without it"
                                             if name == COMMITMENT_FILE else ""))
    ckdir = run_dir / ckpt.CHECKPOINTS_DIR
    if not ckdir.exists():
        return
    try:
        safe_join(run_dir, ckpt.CHECKPOINTS_DIR)
    except UnsafePath as exc:
        rep.add("path", ckdir, f"{exc}; the checkpoints folder must be inside the run")
        return
    for p, why in ckpt.incomplete_checkpoints(run_dir):
        if p.is_symlink():
            try:
                safe_join(ckdir, p.name)
                msg = "a symlink, not a checkpoint folder; checkpoints must be real folders"
            except UnsafePath:
                msg = (f"a symlink that leaves the run directory (to {os.path.realpath(p)}); "
                       "it was not followed: remove it")
            rep.add("path", p, msg)
        elif p.name.startswith(ckpt.TEMP_PREFIX):
            rep.add("layout", p, f"{why}; ignored", severity="warning")
        elif ckpt.STEP_DIR_RE.fullmatch(p.name):
            rep.add("checkpoint", p, f"incomplete or altered checkpoint: {why}; a save never leaves one "
                                     "(it renames a finished folder into place): treat it as tampered",
                    step=int(ckpt.STEP_DIR_RE.fullmatch(p.name).group(1)))
        else:
            rep.add("layout", p, f"{why}; ignored", severity="warning")


def _check_data(run_dir: Path, recipe: dict, data, rep: Report, cfg: ModelConfig) -> Manifest | None:
    try:
        path, warning = data_location(run_dir, recipe, data)
    except RunFileError as exc:
        rep.add("path", run_dir / RECIPE_FILE, f"data folder {recipe['data']['folder']!r}: {exc}")
        return None
    if warning:
        rep.add("data", path, warning, severity="warning")
    try:
        manifest = open_data(run_dir, recipe, data)
    except RunFileError as exc:
        rep.add("data", path, str(exc))
        return None
    if manifest.vocab_size > cfg.vocab_size:
        rep.add("data", manifest.path, f"the data has {manifest.vocab_size} token ids but the model only "
                                       f"{cfg.vocab_size}")
    rep.shards_verified = sum(len(s.shards) for s in manifest.sources)
    rep.passed.append(f"data        manifest {manifest.sha256[:16]}..., {rep.shards_verified} shard(s) "
                      "verified by SHA-256")
    return manifest


def _check_chain(run_dir: Path, recipe: dict, traj: list[dict], rep: Report, tcfg: TrainConfig,
                 cfg: ModelConfig) -> None:
    from lockstep.train.schedule import learning_rate

    path = run_dir / TRAJECTORY_FILE
    h = rep.genesis
    intact = True
    for rec, plan in zip(traj, step_plans(tcfg, cfg.seq_len, len(traj))):
        t = rec["step"]
        want = hashing.chain_hash(t, h, rec["state_root"], rec["batch_digest"])
        if want != rec["chain_hash"]:
            intact = False
            rep.add("chain", path, f"chain_hash {rec['chain_hash']} is not H_{t} = chain_hash({t}, H_{t - 1}, "
                                   f"state_root, batch_digest) = {want}; the record or an earlier one was "
                                   "edited", step=t)
        h = rec["chain_hash"]
        if rec["tokens"] != plan.tokens_after:
            rep.add("trajectory", path, f"tokens {rec['tokens']} but the recipe's batch schedule gives "
                                        f"{plan.tokens_after} after step {t}", step=t)
        lr_bits = float_bits(learning_rate(tcfg, plan.tokens_after))
        if rec.get("lr_bits", lr_bits) != lr_bits or float_bits(rec["lr"]) != lr_bits:
            rep.add("trajectory", path, f"learning rate {rec['lr']!r} ({rec.get('lr_bits')}) is not the "
                                        f"schedule's {lr_bits} at {plan.tokens_after} tokens", step=t)
        for key in ("loss", "grad_norm"):
            bits = rec.get(f"{key}_bits")
            if bits is not None and float_bits(rec[key]) != bits:
                rep.add("trajectory", path, f"{key} {rec[key]!r} does not round to its recorded bits {bits}",
                        step=t)
    rep.chain_hash = h if intact else None
    if intact and traj:
        rep.passed.append(f"chain       recomputed from H_0 {rep.genesis[:16]}... to H_{len(traj)} {h[:16]}...")


def _check_batches(manifest: Manifest, recipe: dict, traj: list[dict], rep: Report, tcfg: TrainConfig,
                   cfg: ModelConfig, stream: GlobalStream) -> None:
    bad = 0
    for rec, plan in zip(traj, step_plans(tcfg, cfg.seq_len, len(traj))):
        got = batch_digest(stream.windows(plan.first_window, plan.n_windows))
        if got != rec["batch_digest"]:
            bad += 1
            rep.add("batch", rep.run_dir / TRAJECTORY_FILE,
                    f"batch_digest {rec['batch_digest']} but the data gives windows {plan.first_window}.."
                    f"{plan.first_window + plan.n_windows - 1} with digest {got}; the record does not describe "
                    "the recipe's data", step=rec["step"])
        rep.batches_checked += 1
    if not bad and traj:
        rep.passed.append(f"batches     {len(traj)} batch digest(s) rebuilt from the data stream")


def _check_checkpoints(run_dir: Path, recipe: dict, traj: list[dict], rep: Report, tcfg: TrainConfig,
                       cfg: ModelConfig, stream: GlobalStream | None) -> None:
    from lockstep.train.step import split_state

    try:
        found = ckpt.list_checkpoints(run_dir)
    except UnsafePath:
        return  # reported by the layout check
    plans = {}
    if cfg is not None and found:
        plans = {p.step: p for p in step_plans(tcfg, cfg.seq_len, max(s for s, _ in found))}
    digest = rep.recipe_sha256
    for step, folder in found:
        n_before = len(rep.errors)
        try:
            c = ckpt.load_checkpoint(folder)
        except (ckpt.CheckpointError, UnsafePath, OSError) as exc:
            names = checkpoint_tensor_diffs(folder)
            tensor = names[0] if names else None
            more = f" (tensors whose digests differ from the sidecar: {names[:10]})" if len(names) > 1 else ""
            rep.add("checkpoint", folder / ckpt.STATE_FILE,
                    f"failed verification: {exc}{more}. For the audit: this published checkpoint is corrupt or was "
                    "edited after it was saved; get an intact copy from the run's publisher (a replay skips it and "
                    "starts from an earlier checkpoint)", step=step, tensor=tensor)
            continue
        side = folder / ckpt.SIDECAR_FILE
        if traj is None:
            if len(rep.errors) == n_before:
                rep.checkpoints_verified.append(step)
            continue
        if step > len(traj):
            rep.add("checkpoint", folder, f"checkpoint of step {step} but the trajectory ends at step {len(traj)}",
                    step=step)
            continue
        rec = traj[step - 1]
        if c.sidecar["state_root"] != rec["state_root"]:
            rep.add("checkpoint", side, f"state root recomputed from the tensors is {c.sidecar['state_root']} but "
                                        f"the trajectory publishes {rec['state_root']}; the trajectory or the "
                                        "checkpoint was altered (replay this step to tell which)", step=step)
        if c.sidecar.get("chain_hash") != rec["chain_hash"]:
            rep.add("checkpoint", side, f"chain_hash {c.sidecar.get('chain_hash')} is not the trajectory's "
                                        f"{rec['chain_hash']}", step=step)
        if digest is not None and c.sidecar.get("recipe_sha256") != digest:
            rep.add("checkpoint", side, f"recipe_sha256 {c.sidecar.get('recipe_sha256')} is not the recipe's "
                                        f"{digest}; recipe.json was changed after the checkpoint", step=step)
        if c.sidecar.get("tokens") != rec["tokens"]:
            rep.add("checkpoint", side, f"tokens {c.sidecar.get('tokens')} is not the trajectory's {rec['tokens']}",
                    step=step)
        try:
            params, opt = split_state(c.tensors)
        except ValueError as exc:
            rep.add("checkpoint", folder / ckpt.STATE_FILE, str(exc), step=step)
            continue
        if opt.step != step:
            rep.add("checkpoint", folder / ckpt.STATE_FILE, f"the 'step' tensor holds {opt.step}", step=step,
                    tensor="step")
        if stream is not None and cfg is not None:
            plan = plans[step]
            want = stream.state_at(plan.first_window + plan.n_windows)
            if c.sidecar.get("stream_state") != want:
                rep.add("checkpoint", side, "stream_state is not the data stream's position after this step; "
                                            "a resume from it would read other data", step=step)
        if len(rep.errors) == n_before:
            rep.checkpoints_verified.append(step)
    if found and len(rep.checkpoints_verified) == len(found):
        rep.passed.append(f"checkpoints {len(found)} verified (steps {', '.join(map(str, rep.checkpoints_verified))})"
                          ": tensors, state roots" + (", chain hashes against the trajectory" if traj else ""))


def _check_commitment(run_dir: Path, recipe: dict, traj: list[dict], rep: Report) -> None:
    path = run_dir / COMMITMENT_FILE
    if not path.exists() and not path.is_symlink():
        return  # reported by the layout check
    try:
        c = read_commitment(run_dir)
    except RunFileError as exc:
        rep.add("commitment", path, str(exc))
        return
    n_before = len(rep.errors)
    last = traj[-1]["chain_hash"] if traj else None
    if c["chain_hash"] != last:
        rep.add("commitment", path, f"chain_hash {c['chain_hash']} is not the trajectory's last chain hash {last}")
    elif rep.chain_hash is not None and c["chain_hash"] != rep.chain_hash:
        rep.add("commitment", path, f"chain_hash {c['chain_hash']} is not the recomputed H_N {rep.chain_hash}")
    if c["last_step"] != len(traj):
        rep.add("commitment", path, f"last_step {c['last_step']} but the trajectory has {len(traj)} steps")
    if rep.genesis is not None and c.get("genesis") not in (None, rep.genesis):
        rep.add("commitment", path, f"genesis {c.get('genesis')} is not H_0 of the recipe {rep.genesis}")
    if rep.recipe_sha256 is not None and c.get("recipe_sha256") not in (None, rep.recipe_sha256):
        rep.add("commitment", path, f"recipe_sha256 {c.get('recipe_sha256')} is not the recipe's {rep.recipe_sha256}")
    if len(rep.errors) == n_before:
        rep.passed.append(f"commitment  {c['chain_hash'][:16]}... = H_{len(traj)}")


def verify_run(run_dir: str | os.PathLike, data: str | os.PathLike | None = None, batches: bool = True) -> Report:
    """Check ``run_dir`` (module docstring); every problem becomes a ``Finding`` in the report.

    ``data`` replaces the recipe's data folder (an auditor's own copy); ``batches``
    rebuilds every batch digest from the data. Raises ``FileNotFoundError`` only when
    ``run_dir`` is not a directory.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: not a directory; give the path of a run directory")
    rep = Report(run_dir)
    _check_layout(run_dir, rep)

    try:
        recipe = load_run_recipe(run_dir)
    except RunFileError as exc:
        rep.add("recipe", run_dir / RECIPE_FILE, str(exc))
        recipe = None
    cfg = tcfg = None
    if recipe is not None:
        cfg, tcfg = configs(recipe)
        rep.preset = cfg.name
        rep.recipe_sha256 = recipe_digest(recipe)
        rep.genesis = genesis(recipe)
        rep.passed.append(f"recipe      sha256 {rep.recipe_sha256[:16]}..., H_0 {rep.genesis[:16]}...")
        if recipe["spec_version"] != SPEC_VERSION:
            rep.add("recipe", run_dir / RECIPE_FILE, f"made with SPEC_VERSION {recipe['spec_version']!r}, this "
                                                     f"lockstep has {SPEC_VERSION!r}: verify is unaffected, but a "
                                                     "replay needs a lockstep with the run's SPEC_VERSION",
                    severity="warning")

    try:
        traj = read_trajectory_strict(run_dir)
    except RunFileError as exc:
        rep.add("trajectory", run_dir / TRAJECTORY_FILE, str(exc))
        traj = None
    if traj is not None:
        rep.steps = len(traj)
        if not traj:
            rep.add("trajectory", run_dir / TRAJECTORY_FILE, "no records: the run published no step")

    manifest = _check_data(run_dir, recipe, data, rep, cfg) if recipe is not None else None
    stream = GlobalStream(manifest, recipe["seed"], cfg.seq_len) if manifest is not None else None
    if recipe is not None and traj is not None:
        _check_chain(run_dir, recipe, traj, rep, tcfg, cfg)
        if stream is not None and batches:
            _check_batches(manifest, recipe, traj, rep, tcfg, cfg, stream)
    _check_checkpoints(run_dir, recipe, traj, rep, tcfg, cfg, stream)
    if traj is not None:
        _check_commitment(run_dir, recipe, traj, rep)
    return rep
