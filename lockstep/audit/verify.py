"""``lockstep audit verify RUN``: check a run directory without replaying any step.

The checks, in order (each failure is one ``Finding``; all are collected):

1. **Layout.** ``recipe.json``, ``trajectory.jsonl`` and ``commitment.json`` exist;
   nothing at the top level or under ``checkpoints/`` is a symlink that leaves the
   run directory; every ``step-NNNNNNNN`` folder is complete (its ``COMPLETE`` marker
   matches its sidecar). Leftover ``.tmp-*`` folders and unknown files are warnings.
2. **Recipe.** Strict JSON, known keys only (``ModelConfig.from_dict``), and its
   SHA-256 (``recipe.recipe_digest``) gives ``H_0 = genesis(recipe)``.
3. **Data.** ``rundir.open_run_data``: the recipe's data folder, which must be inside
   the run (a folder elsewhere, as ``train --data DIR`` records it, is read only when
   the auditor names it with ``--data DIR``); the manifest's digest must be the
   recipe's before any shard is read, then every shard's SHA-256 is checked.
4. **Trajectory and chain.** Strict JSON lines, steps 1..N in order, hex digests;
   the chain is recomputed from ``H_0``: ``H_t = chain_hash(t, H_{t-1}, state_root_t,
   batch_digest_t, tokens_t, loss_bits_t, grad_norm_bits_t, lr_bits_t)`` must equal
   each record's ``chain_hash`` (so the loss curve people read is covered) (a broken link is
   reported and the next link is checked from the published value, so each broken
   link is reported once). Each record's ``tokens`` and ``lr`` bits are recomputed
   from the schedule; ``read_trajectory`` refuses a record whose decimal loss,
   gradient norm or learning rate is not exactly the value of its chained bits.
5. **Batches** (optional, on by default): every ``batch_digest`` is rebuilt from the
   data stream, so a trajectory cannot name a batch the data does not produce.
6. **Checkpoints.** Each is loaded by ``checkpoint.load_checkpoint`` (marker, file
   digest, every tensor's digest, the state root recomputed from the tensors) and held
   to the run's checkpoint rule (``formats.run.Run.checkpoint_problems``, the one
   ``train --resume``, ``replay`` and ``lockstep sample|eval|export`` apply): not beyond
   the trajectory's last step, its state root, chain hash and token count the
   trajectory's at that step, the recipe's digest, the recipe's training state (name,
   shape, dtype), its data-stream record the schedule's. On a failure to load, the
   tensors whose digests differ from the sidecar are named.
7. **Commitment.** ``commitment.json`` (read as strictly as the recipe: its keys only, each
   of its type) holds the last chain hash (recomputed), the last step, ``H_0``, the recipe
   digest and the recipe's SPEC_VERSION.
8. **Derived files.** ``metrics.jsonl`` and ``loss.png`` are not evidence (the chain
   does not cover them): the metrics' losses are compared with the trajectory's and
   a difference is a warning; ``lockstep audit verify RUN --plot PNG`` redraws the
   loss curve from the verified trajectory.

The run is opened once (``formats.run.Run.open`` with ``Strictness.AUDIT``), as
``train --resume`` and ``replay`` open it: one reader of each file, one chain
recomputation, one checkpoint rule.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lockstep.formats import checkpoint as ckpt
from lockstep.formats.config import ModelConfig, TrainConfig
from lockstep.formats.manifest import Manifest
from lockstep.formats.run import Run
from lockstep.formats.rundir import (COMMITMENT_FILE, KNOWN_DIRS, KNOWN_FILES, MAX_RECORD_BYTES, MAX_TRAJECTORY_BYTES,
                                     METRICS_FILE, RECIPE_FILE, RunFileError, TRAJECTORY_FILE, open_run_data,
                                     run_data_folder)
from lockstep.formats.schedule import StepPlan, learning_rate, sequences_per_step
from lockstep.formats.stream import GlobalStream, batch_digest
from lockstep.formats.trajectory import Strictness
from lockstep.fsio import (FileFormatError, UnsafePath, file_kind as fsio_kind, json_lines, printable,
                           read_json_regular, safe_join)
from lockstep.fsio.safetensors import read_safetensors
from lockstep.spec import hashing

KNOWN_TOP_LEVEL = KNOWN_FILES | KNOWN_DIRS


@dataclass
class Finding:
    """One problem: which check, which file, which step and tensor, what is wrong and what to do."""

    check: str  # layout, recipe, data, trajectory, chain, batch, checkpoint, commitment, metrics, path
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
        return "\n".join(printable(line) for line in lines)  # untrusted names cannot add lines


# ---------------------------------------------------------------------------
# Shared readers (verify and replay)
# ---------------------------------------------------------------------------


def step_plans(tcfg: TrainConfig, seq_len: int, last_step: int):
    """``plan_step(tcfg, seq_len, t)`` for t = 1 .. last_step, built incrementally (O(N), not O(N^2)).

    The same definition as ``schedule.step_windows``: each step takes
    ``sequences_per_step(tcfg, tokens_before)`` windows after the previous step's.
    """
    first = tokens = 0
    for t in range(1, last_step + 1):
        n = sequences_per_step(tcfg, tokens)
        yield StepPlan(t, first, n, tokens, seq_len)
        first += n
        tokens += n * seq_len


def float_bits(x) -> str:
    """``0x3F800000``: the bits of ``x`` rounded to float32 (as the trajectory writes them)."""
    return f"0x{int(np.asarray(np.float32(x)).view(np.uint32)):08X}"


def _rounds_to(x, bits: str) -> bool:
    """``float_bits(x) == bits``, and False for an integer too large for a float (no OverflowError)."""
    try:
        with np.errstate(over="ignore"):  # a value beyond float32 rounds to infinity: not the bits of a loss
            return float_bits(x) == bits
    except OverflowError:
        return False


def checkpoint_tensor_diffs(folder: Path, max_bytes: int | None = None) -> list[str]:
    """Names of the tensors of a checkpoint whose digests differ from its sidecar (diagnosis only).

    Reads the safetensors file with the validating reader (never pickle); returns []
    when the file cannot even be parsed or the sidecar has no digests.
    """
    try:
        side = read_json_regular(folder, ckpt.SIDECAR_FILE, "checkpoint sidecar", ckpt.MAX_SIDECAR_BYTES)
        want = side.get("tensor_digests") if isinstance(side, dict) else None
        tensors, _ = read_safetensors(folder / ckpt.STATE_FILE, max_bytes, ckpt.MAX_HEADER_BYTES)
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
        mode = entry.lstat().st_mode
        if stat.S_ISLNK(mode):
            try:
                safe_join(run_dir, name)
                where = "inside the run"
            except UnsafePath:
                where = f"out of the run, to {os.path.realpath(entry)}"
            rep.add("path", entry, f"a symlink ({where}); a run directory must hold its own files, and lockstep "
                                   "follows no symlink in it: replace the link with what it names, or refuse the run")
            continue
        if name in KNOWN_DIRS and not stat.S_ISDIR(mode) or name in KNOWN_FILES and not stat.S_ISREG(mode):
            rep.add("path", entry, f"{fsio_kind(mode)}, where the run keeps a "
                                   f"{'folder' if name in KNOWN_DIRS else 'regular file'}; it is not read")
            continue
        if name not in KNOWN_TOP_LEVEL:
            rep.add("layout", entry, "unexpected entry (ignored by the audit)", severity="warning")
    for name in (RECIPE_FILE, TRAJECTORY_FILE, COMMITMENT_FILE):
        p = run_dir / name
        if not p.exists() and not p.is_symlink():
            rep.add("layout", p, "missing" + ("; the run did not finish or was published without it"
                                             if name == COMMITMENT_FILE else ""))
    ckdir = run_dir / ckpt.CHECKPOINTS_DIR
    if not ckdir.is_dir() or ckdir.is_symlink():
        return  # absent, or reported above
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
        elif ckpt.step_of_dirname(p.name) is not None:
            rep.add("checkpoint", p, f"incomplete or altered checkpoint: {why}; a save never leaves one "
                                     "(it renames a finished folder into place): treat it as tampered",
                    step=ckpt.step_of_dirname(p.name))
        elif ckpt.STEP_DIR_RE.fullmatch(p.name):
            rep.add("checkpoint", p, f"{why}; a save never makes one: treat it as tampered (it is not read)")
        else:
            rep.add("layout", p, f"{why}; ignored", severity="warning")


def _check_data(run_dir: Path, recipe: dict, data, rep: Report, cfg: ModelConfig) -> Manifest | None:
    try:
        path = run_data_folder(run_dir, recipe, data)
    except RunFileError as exc:
        rep.add("path", run_dir / RECIPE_FILE, f"data folder {recipe['data']['folder']!r}: {exc}")
        return None
    try:
        manifest = open_run_data(run_dir, recipe, data)
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


def _check_chain(run: Run, rep: Report) -> None:
    """The published chain recomputed from ``H_0`` (``Run.chain_breaks``: each broken link once), and each
    record's tokens and learning rate recomputed from the schedule."""
    path, traj, tcfg = run.path / TRAJECTORY_FILE, run.trajectory, run.tcfg
    breaks = set(run.chain_breaks)
    for rec, plan in zip(traj, step_plans(tcfg, run.cfg.seq_len, len(traj))):
        t = rec["step"]
        if t in breaks:
            before = run.record(t - 1)["chain_hash"] if t > 1 else run.genesis
            want = hashing.record_chain_hash(before, rec)
            rep.add("chain", path, f"chain_hash {rec['chain_hash']} is not H_{t} = chain_hash({t}, H_{t - 1}, "
                                   f"state_root, batch_digest, tokens, loss_bits, grad_norm_bits, lr_bits) = {want}; "
                                   "this record (its loss, gradient norm, learning rate, tokens or hashes) or an "
                                   "earlier one was edited", step=t)
        if rec["tokens"] != plan.tokens_after:
            rep.add("trajectory", path, f"tokens {rec['tokens']} but the recipe's batch schedule gives "
                                        f"{plan.tokens_after} after step {t}", step=t)
        lr_bits = float_bits(learning_rate(tcfg, plan.tokens_after))
        if rec["lr_bits"] != lr_bits:  # (read_trajectory: every decimal is exactly its bits' value)
            rep.add("trajectory", path, f"learning rate {rec['lr']!r} ({rec['lr_bits']}) is not the "
                                        f"schedule's {lr_bits} at {plan.tokens_after} tokens", step=t)
    h = traj[-1]["chain_hash"] if traj else run.genesis
    rep.chain_hash = None if breaks else h
    if not breaks and traj:
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


def _check_checkpoints(run: Run, rep: Report, stream: GlobalStream | None) -> None:
    """Every complete checkpoint loaded and held to the run's checkpoint rule (``Run.checkpoint_problems``)."""
    if "checkpoints" in run.errors:
        return  # reported by the layout check
    files = {"state": ckpt.STATE_FILE, "sidecar": ckpt.SIDECAR_FILE}
    for step, folder in sorted(run.complete.items()):
        try:
            c = run.load_checkpoint(step)
        except ckpt.CheckpointError as exc:
            names = checkpoint_tensor_diffs(folder, run.state_bound)
            tensor = names[0] if names else None
            more = f" (tensors whose digests differ from the sidecar: {names[:10]})" if len(names) > 1 else ""
            rep.add("checkpoint", folder / ckpt.STATE_FILE,
                    f"failed verification: {exc}{more}. For the audit: this published checkpoint is corrupt or was "
                    "edited after it was saved; get an intact copy from the run's publisher (a replay skips it and "
                    "starts from an earlier checkpoint)", step=step, tensor=tensor)
            continue
        problems = run.checkpoint_problems(c, stream)
        for p in problems:
            where = folder / files[p.file] if p.file in files else folder
            rep.add("checkpoint", where, p.message + ("; no replay can start from it" if p.file == "state" else ""),
                    step=step, tensor=p.tensor)
        if not problems:
            rep.checkpoints_verified.append(step)
    if run.complete and len(rep.checkpoints_verified) == len(run.complete):
        rep.passed.append(f"checkpoints {len(run.complete)} verified (steps "
                          f"{', '.join(map(str, rep.checkpoints_verified))}): tensors, state roots"
                          + (", chain hashes against the trajectory" if run.trajectory is not None else ""))


def _check_metrics(run_dir: Path, traj: list[dict], rep: Report) -> None:
    """``metrics.jsonl`` is not evidence (not chained); say so, and warn where its losses are not the trajectory's.

    The trainer writes each step's loss there too (a resumed run repeats the steps
    after its checkpoint, with the same bits); a different value means the file was
    edited, and only ``trajectory.jsonl`` counts.
    """
    path = run_dir / METRICS_FILE
    differ: list[int] = []
    try:
        for lineno, m, _ in json_lines(run_dir, METRICS_FILE, "metrics log", MAX_TRAJECTORY_BYTES, MAX_RECORD_BYTES):
            step = m.get("step") if isinstance(m, dict) else None
            loss = m.get("loss") if isinstance(m, dict) else None
            if isinstance(m, dict) and isinstance(m.get("validation"), dict) and type(step) is int \
                    and 0 <= step <= len(traj):
                continue  # a validation loss (``--eval-every``, ``lockstep eval``): checked by re-running eval
            if type(step) is not int or not 1 <= step <= len(traj) or isinstance(loss, bool) \
                    or not isinstance(loss, (int, float)):
                rep.add("metrics", path, f"line {lineno} is not a metrics record of a published step",
                        severity="warning")
                continue
            if not _rounds_to(loss, traj[step - 1]["loss_bits"]):
                differ.append(step)
    except FileNotFoundError:
        return
    except (UnsafePath, FileFormatError, OSError) as exc:
        rep.add("metrics", path, f"{exc}; it is not read", severity="warning")
        return
    for step in differ[:10]:
        rep.add("metrics", path, f"the loss here is not the trajectory's {traj[step - 1]['loss_bits']}: the file "
                                 "was edited (metrics.jsonl is not evidence; only trajectory.jsonl is chained)",
                step=step, severity="warning")
    if len(differ) > 10:
        rep.add("metrics", path, f"... and {len(differ) - 10} more steps whose loss differs", severity="warning")
    if not differ:
        rep.passed.append("metrics     losses agree with the trajectory (metrics.jsonl and loss.png are not "
                          "evidence: `--plot PNG` redraws the curve from the verified trajectory)")


def _check_commitment(run: Run, rep: Report) -> None:
    path = run.path / COMMITMENT_FILE
    if not path.exists() and not path.is_symlink():
        return  # reported by the layout check
    try:
        problems = run.commitment_problems()
    except RunFileError as exc:
        rep.add("commitment", path, str(exc))
        return
    for problem in problems:
        rep.add("commitment", path, problem)
    c = run.commitment
    if not problems and rep.chain_hash is not None and c["chain_hash"] != rep.chain_hash:
        problems.append(f"chain_hash {c['chain_hash']} is not the recomputed H_N {rep.chain_hash}")
        rep.add("commitment", path, problems[-1])
    if not problems:
        rep.passed.append(f"commitment  {c['chain_hash'][:16]}... = H_{run.last_step}")


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

    run = Run.open(run_dir, Strictness.AUDIT)
    recipe, traj, cfg, tcfg = run.recipe, run.trajectory, run.cfg, run.tcfg
    if "recipe" in run.errors:
        rep.add("recipe", run_dir / RECIPE_FILE, str(run.errors["recipe"]))
    else:
        rep.preset, rep.recipe_sha256, rep.genesis = cfg.name, run.recipe_sha256, run.genesis
        rep.passed.append(f"recipe      sha256 {rep.recipe_sha256[:16]}..., H_0 {rep.genesis[:16]}...")
        if run.spec_version_problem() is not None:
            rep.add("recipe", run_dir / RECIPE_FILE, f"{run.spec_version_problem()} (verify is unaffected: it "
                                                     "recomputes no step)", severity="warning")
    if "trajectory" in run.errors:
        rep.add("trajectory", run_dir / TRAJECTORY_FILE, str(run.errors["trajectory"]))
    elif traj is not None:
        rep.steps = len(traj)
        if not traj:
            rep.add("trajectory", run_dir / TRAJECTORY_FILE, "no records: the run published no step")

    manifest = _check_data(run_dir, recipe, data, rep, cfg) if recipe is not None else None
    stream = GlobalStream(manifest, recipe["seed"], cfg.seq_len) if manifest is not None else None
    if recipe is not None and traj is not None:
        _check_chain(run, rep)
        if stream is not None and batches:
            _check_batches(manifest, recipe, traj, rep, tcfg, cfg, stream)
    _check_checkpoints(run, rep, stream)
    if traj is not None:
        _check_commitment(run, rep)
        _check_metrics(run_dir, traj, rep)
    return rep
