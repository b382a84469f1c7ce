"""``lockstep audit replay RUN --step t``: recompute step t and compare it with what the run published.

For a target step t:

1. **Start.** The newest checkpoint before t that verifies (``checkpoint.load_checkpoint``:
   marker, file digest, every tensor digest, the state root) *and* agrees with the
   trajectory (its state root and chain hash are the published ones at its step, its
   recipe digest is the recipe's). A checkpoint that fails is skipped, and said; with
   none left the replay starts from step 0, ``init_params(cfg, seed)`` and ``H_0``.
2. **Data.** The run's data folder (or ``--data DIR``), every shard verified by
   ``Manifest.load``; the stream positioned by the checkpoint's resume record.
3. **Each step s = start+1 .. t** (``step.tree_step``): the global batch of step s,
   its micro-batches one after another (one micro-batch's activations alive at a
   time), added as the spec's tree says (``spec.tree.TreeFolder``: at most
   ceil(log2 M) + 1 gradient sums alive), clipping, AdamW, the state root; then
   ``H_s = chain_hash(s, H_{s-1}, root_s, batch_digest_s)``. The tree does not
   depend on how many ranks trained the run, so the replay needs no world size: it
   matches runs made with any number, and with a number that changed on a resume.
   The state root, chain hash, batch digest and the float bits of loss, gradient
   norm and learning rate are compared with the trajectory's record of step s.
4. **On a mismatch** the replay of that target stops. When a checkpoint of step s
   exists, the replayed tensors are compared with its tensors: every tensor whose
   digest differs is named with its first differing Merkle chunk (1 MiB) and first
   differing element. Without one, only the state root is published, and said.

Several targets share work: a target after another continues from the replayed
state when no newer checkpoint lies between them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lockstep.fsio import UnsafePath, read_json, safe_join
from lockstep.spec import SPEC_VERSION, hashing
from lockstep.train import checkpoint as ckpt
from lockstep.train.data import DataError, GlobalStream, batch_digest
from lockstep.train.rundir import recorded_world_sizes
from lockstep.train.trainer import genesis, recipe_digest

from .verify import (RunFileError, configs, float_bits, load_run_recipe, open_data, read_commitment,
                     read_trajectory_strict)

COMPARED = ("state_root", "chain_hash", "batch_digest", "loss_bits", "grad_norm_bits", "lr_bits")


class ReplayError(RuntimeError):
    """The replay cannot run (unreadable recipe, missing data, wrong SPEC_VERSION, bad step ...)."""


@dataclass
class TensorDiff:
    """One tensor whose replayed digest differs from the published one."""

    name: str
    replayed_digest: str | None
    published_digest: str | None
    against: str  # what "published" is: a checkpoint's tensors, or only its sidecar's digests
    first_chunk: int | None = None  # index of the first differing 1 MiB Merkle leaf
    chunks: int | None = None
    first_element: int | None = None  # flat C-order index of the first differing element
    replayed_value: str | None = None  # that element, as hex bits
    published_value: str | None = None
    note: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def __str__(self) -> str:
        s = f"tensor {self.name!r}: replayed {_short(self.replayed_digest)} vs {self.against} {_short(self.published_digest)}"
        if self.first_chunk is not None:
            s += f"; first differing chunk {self.first_chunk} of {self.chunks}"
        if self.first_element is not None:
            s += f", element {self.first_element}: {self.replayed_value} vs {self.published_value}"
        if self.note:
            s += f" ({self.note})"
        return s


@dataclass
class StepCheck:
    """The replay of one step, compared with its trajectory record."""

    step: int
    start: int  # the checkpoint step this replay began from (0: the initial state)
    replayed: dict[str, str]
    published: dict[str, str]
    differs: list[str] = field(default_factory=list)  # keys of COMPARED whose values differ
    tensor_diffs: list[TensorDiff] = field(default_factory=list)
    note: str | None = None
    seconds: float = 0.0
    world_size: int | None = None  # ranks that trained the step, as metrics.jsonl says (not in the chain)

    @property
    def match(self) -> bool:
        return not self.differs

    def to_dict(self) -> dict:
        d = {"step": self.step, "start": self.start, "match": self.match, "replayed": dict(self.replayed),
             "published": dict(self.published), "differs": list(self.differs)}
        if self.tensor_diffs:
            d["tensor_diffs"] = [t.to_dict() for t in self.tensor_diffs]
        if self.note:
            d["note"] = self.note
        if self.world_size is not None:
            d["world_size"] = self.world_size
        return d


@dataclass
class ReplayResult:
    run_dir: Path
    targets: list[int]
    checks: list[StepCheck]
    backend: str
    backend_description: str
    preset: str
    commitment: str  # the run's last chain hash (commitment.json, else the trajectory's)
    last_step: int
    genesis: str
    recipe_sha256: str
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def replayed_targets(self) -> list[int]:
        return [c.step for c in self.checks if c.step in self.targets]

    @property
    def ok(self) -> bool:
        return all(c.match for c in self.checks) and sorted(self.replayed_targets) == sorted(self.targets)

    @property
    def outcome(self) -> str:
        return "match" if self.ok else "mismatch"

    def check(self, step: int) -> StepCheck | None:
        for c in self.checks:
            if c.step == step:
                return c
        return None

    def format(self) -> str:
        lines = [f"run {self.run_dir}: {self.preset}, {self.last_step} steps, "
                 f"commitment {self.commitment[:16]}...; backend {self.backend}"]
        lines += [f"  note: {n}" for n in self.notes]
        for c in self.checks:
            tag = "target" if c.step in self.targets else "on the way"
            ranks = f", trained on {c.world_size} rank(s)" if c.world_size is not None else ""
            head = (f"  step {c.step} ({tag}{ranks}, from {'checkpoint ' + str(c.start) if c.start else 'the initial state'},"
                    f" {c.seconds:.2f}s): ")
            if c.match:
                lines.append(head + f"MATCH  state root {c.replayed['state_root'][:16]}...  "
                                    f"chain {c.replayed['chain_hash'][:16]}...")
                continue
            lines.append(head + "MISMATCH")
            for k in c.differs:
                lines.append(f"      {k}: replayed {c.replayed.get(k)}  published {c.published.get(k)}")
            for t in c.tensor_diffs:
                lines.append(f"      {t}")
            if c.note:
                lines.append(f"      {c.note}")
        missing = [t for t in self.targets if t not in self.replayed_targets]
        if missing:
            lines.append(f"  not replayed (an earlier step of their replay mismatched): steps {missing}")
        lines.append(f"{self.outcome.upper()} ({self.seconds:.1f}s)")
        return "\n".join(lines)


def _short(h: str | None) -> str:
    return f"{h[:16]}..." if h else "(none)"


# ---------------------------------------------------------------------------
# Tensor comparison
# ---------------------------------------------------------------------------


def _bits_hex(x: np.ndarray, i: int) -> str:
    v = x.reshape(-1)[i : i + 1]
    return "0x" + v.astype(v.dtype.newbyteorder("<")).tobytes()[::-1].hex().upper()


def diff_tensors(replayed: dict[str, np.ndarray], published: dict[str, np.ndarray], against: str) -> list[TensorDiff]:
    """Every tensor whose digest differs, with its first differing chunk and element."""
    rd, pd = hashing.tensor_digests(replayed), hashing.tensor_digests(published)
    out = []
    for name in sorted(set(rd) | set(pd)):
        if rd.get(name) == pd.get(name):
            continue
        d = TensorDiff(name, rd.get(name), pd.get(name), against)
        if name not in replayed or name not in published:
            d.note = "missing from the " + ("checkpoint" if name in replayed else "replayed state")
        else:
            a, b = np.asarray(replayed[name]), np.asarray(published[name])
            if a.dtype != b.dtype or a.shape != b.shape:
                d.note = f"dtype/shape {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
            else:
                ca, cb = hashing.chunk_digests(name, a), hashing.chunk_digests(name, b)
                d.chunks = len(ca)
                d.first_chunk = next((i for i, (x, y) in enumerate(zip(ca, cb)) if x != y), None)
                ua = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                ub = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
                nz = np.flatnonzero(ua != ub)
                if nz.size:
                    i = int(nz[0]) // a.dtype.itemsize
                    d.first_element = i
                    d.replayed_value, d.published_value = _bits_hex(a, i), _bits_hex(b, i)
        out.append(d)
    return out


def _diagnose(run_dir: Path, step: int, replayed: dict[str, np.ndarray], replayed_root: str) -> tuple[list[TensorDiff], str]:
    """Compare a mismatching replayed state with the checkpoint of the same step, if there is one."""
    try:
        found = dict(ckpt.list_checkpoints(run_dir))
    except UnsafePath:
        found = {}
    if step not in found:
        return [], (f"the run has no checkpoint of step {step}, so only its state root is published: which "
                    "tensors differ cannot be told (replay a step that has a checkpoint to localise it)")
    folder = found[step]
    try:
        c = ckpt.load_checkpoint(folder)
    except ckpt.CheckpointError as exc:
        try:
            side = read_json(safe_join(folder, ckpt.SIDECAR_FILE), "checkpoint sidecar")
            want = side.get("tensor_digests") if isinstance(side, dict) else None
        except (OSError, ValueError):
            want = None
        if not isinstance(want, dict):
            return [], f"the checkpoint of step {step} failed verification ({exc}); no tensor digests to compare"
        got = hashing.tensor_digests(replayed)
        diffs = [TensorDiff(n, got.get(n), want.get(n), f"{folder.name}/{ckpt.SIDECAR_FILE} digest")
                 for n in sorted(set(got) | set(want)) if got.get(n) != want.get(n)]
        return diffs, f"the checkpoint of step {step} failed verification ({exc}); compared with its sidecar's digests"
    diffs = diff_tensors(replayed, c.tensors, f"checkpoint {folder.name}")
    if not diffs:
        return [], (f"the replayed state equals the checkpoint of step {step} tensor for tensor (root {replayed_root}); "
                    "the trajectory's record of this step is what was altered")
    return diffs, f"compared with the tensors of checkpoint {folder.name}"


# ---------------------------------------------------------------------------
# The replay
# ---------------------------------------------------------------------------


@dataclass
class _State:
    step: int
    params: dict
    opt: object
    chain: str
    start: int  # the checkpoint step this state descends from


class _Replayer:
    def __init__(self, run_dir: Path, backend_name: str, data, log):
        from lockstep.backends import BackendUnavailable, get_backend

        self.run_dir = run_dir
        self.log = log or (lambda msg: None)
        self.notes: list[str] = []
        try:
            self.recipe = load_run_recipe(run_dir)
            self.traj = read_trajectory_strict(run_dir)
        except RunFileError as exc:
            raise ReplayError(str(exc)) from None
        if self.recipe["spec_version"] != SPEC_VERSION:
            raise ReplayError(f"{run_dir / 'recipe.json'}: the run was made with SPEC_VERSION "
                              f"{self.recipe['spec_version']!r}, this lockstep implements {SPEC_VERSION!r}; "
                              "install the lockstep release of that SPEC_VERSION to replay it")
        self.cfg, self.tcfg = configs(self.recipe)
        self.h0 = genesis(self.recipe)
        self.digest = recipe_digest(self.recipe)
        try:
            self.manifest = open_data(run_dir, self.recipe, data)
        except RunFileError as exc:
            raise ReplayError(str(exc)) from None
        try:
            self.be = get_backend(backend_name)
        except BackendUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - a backend that fails to load is an error, not a crash
            raise ReplayError(f"backend {backend_name!r} could not be loaded ({type(exc).__name__}: {exc}); "
                              "check it with `lockstep conformance --backend NAME`, or replay with --backend spec")

        self.stream: GlobalStream | None = None
        self.rejected: dict[int, str] = {}
        try:
            self.commitment = read_commitment(run_dir)["chain_hash"]
            if self.traj and self.commitment != self.traj[-1]["chain_hash"]:
                self.notes.append(f"commitment.json ({self.commitment}) is not the trajectory's last chain hash "
                                  f"({self.traj[-1]['chain_hash']}); `lockstep audit verify` reports it")
        except RunFileError as exc:
            self.commitment = self.traj[-1]["chain_hash"] if self.traj else self.h0
            self.notes.append(f"{exc}; the trajectory's last chain hash stands in for the commitment")

    # -- the starting state -------------------------------------------------------------

    def _checkpoint_problem(self, step: int, c: ckpt.Checkpoint) -> str | None:
        if step > len(self.traj):
            return f"it is beyond the trajectory's last step {len(self.traj)}"
        rec = self.traj[step - 1]
        if c.sidecar["state_root"] != rec["state_root"]:
            return f"its state root {c.sidecar['state_root']} is not the trajectory's {rec['state_root']}"
        if c.sidecar.get("chain_hash") != rec["chain_hash"]:
            return f"its chain hash {c.sidecar.get('chain_hash')} is not the trajectory's {rec['chain_hash']}"
        if c.sidecar.get("recipe_sha256") != self.digest:
            return f"its recipe digest {c.sidecar.get('recipe_sha256')} is not recipe.json's {self.digest}"
        return None

    def _published_chain_ok(self, upto: int) -> None:
        h = self.h0
        for rec in self.traj[:upto]:
            if hashing.chain_hash(rec["step"], h, rec["state_root"], rec["batch_digest"]) != rec["chain_hash"]:
                note = (f"the published chain is broken at step {rec['step']} (before the replay's start); "
                        "`lockstep audit verify` reports it")
                if note not in self.notes:
                    self.notes.append(note)
                return
            h = rec["chain_hash"]

    def start_state(self, target: int) -> _State:
        from lockstep.train.model import init_params
        from lockstep.train.optim import AdamWState
        from lockstep.train.step import split_state

        try:
            found = ckpt.list_checkpoints(self.run_dir)
        except UnsafePath as exc:
            self.notes.append(f"checkpoints/ not used: {exc}")
            found = []
        for step, folder in reversed(found):
            if step >= target or step in self.rejected:
                continue
            try:
                c = ckpt.load_checkpoint(folder)
                why = self._checkpoint_problem(step, c)
                if why is None:
                    params, opt = split_state(c.tensors)
                    if opt.step != step:
                        why = f"its 'step' tensor holds {opt.step}"
            except (ckpt.CheckpointError, ValueError, OSError) as exc:
                why = str(exc)
            if why is not None:
                self.rejected[step] = why
                self.notes.append(f"checkpoint {folder.name} skipped: {why}")
                continue
            self._published_chain_ok(step)
            if self.stream is None:
                try:
                    self.stream = GlobalStream.from_state(self.manifest, self.recipe["seed"], self.cfg.seq_len,
                                                          c.sidecar.get("stream_state"))
                except (DataError, TypeError, KeyError, ValueError) as exc:
                    self.notes.append(f"{folder / ckpt.SIDECAR_FILE}: stream_state not used ({exc}); "
                                      "the data stream is rebuilt from its start")
            self.log(f"starting from checkpoint {folder.name} (verified)")
            return _State(step, params, opt, c.sidecar["chain_hash"], step)
        self.log("starting from the initial state (step 0, H_0)")
        params = init_params(self.cfg, self.recipe["seed"])
        return _State(0, params, AdamWState.zeros(params), self.h0, 0)

    # -- one step ----------------------------------------------------------------------

    def step(self, st: _State) -> tuple[StepCheck, _State | None]:
        from lockstep.train.optim import NonFiniteError
        from lockstep.train.step import plan_step, state_tensors, tree_step

        s = st.step + 1
        t0 = time.perf_counter()
        if self.stream is None:
            self.stream = GlobalStream(self.manifest, self.recipe["seed"], self.cfg.seq_len)
        plan = plan_step(self.tcfg, self.cfg.seq_len, s)
        windows = self.stream.windows(plan.first_window, plan.n_windows)
        bd = batch_digest(windows)
        rec = self.traj[s - 1]
        published = {k: rec[k] for k in COMPARED if k in rec}
        try:
            res = tree_step(st.params, st.opt, windows, plan, self.cfg, self.tcfg, self.be)
        except NonFiniteError as exc:
            check = StepCheck(s, st.start, {"batch_digest": bd}, published, ["state_root", "chain_hash"],
                              note=f"the replay stopped: {exc} (the run published finite values)",
                              seconds=time.perf_counter() - t0)
            return check, None
        chain = hashing.chain_hash(s, st.chain, res.state_root, bd)
        replayed = {"state_root": res.state_root, "chain_hash": chain, "batch_digest": bd,
                    "loss_bits": float_bits(res.loss), "grad_norm_bits": float_bits(res.grad_norm),
                    "lr_bits": float_bits(res.lr)}
        replayed = {k: v for k, v in replayed.items() if k in published or k in ("state_root", "chain_hash")}
        differs = [k for k in COMPARED if k in replayed and replayed[k] != published.get(k)]
        check = StepCheck(s, st.start, replayed, published, differs, seconds=time.perf_counter() - t0)
        if not differs:
            return check, _State(s, res.params, res.opt, chain, st.start)
        if "batch_digest" in differs:
            check.note = (f"the data gives windows {plan.first_window}..{plan.first_window + plan.n_windows - 1} "
                          "another digest than the trajectory's: the published step did not train on the recipe's data")
        if "state_root" in differs:
            check.tensor_diffs, why = _diagnose(self.run_dir, s, state_tensors(res.params, res.opt), res.state_root)
            check.note = why if check.note is None else f"{check.note}; {why}"
        elif "chain_hash" in differs and "batch_digest" not in differs:
            check.note = ("the state root matches but the chain hash does not: the published chain hash (or the "
                          "previous one) was altered")
        elif set(differs) <= {"loss_bits", "grad_norm_bits", "lr_bits"}:
            check.note = "the state matches; the trajectory's published loss / gradient norm / learning rate do not"
        return check, None


def replay_steps(run_dir: str | os.PathLike, steps, backend_name: str = "spec", data: str | os.PathLike | None = None,
                 log=None) -> ReplayResult:
    """Replay the given steps of the run in ``run_dir`` (module docstring) and compare each with the trajectory.

    Raises ``ReplayError`` when the replay cannot run at all, and
    ``lockstep.backends.BackendUnavailable`` for a backend that cannot run here.
    """
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReplayError(f"{run_dir}: not a directory; give the path of a run directory")
    rp = _Replayer(run_dir, backend_name, data, log)
    n = len(rp.traj)
    try:
        targets = sorted({int(s) for s in steps})
    except (TypeError, ValueError):
        raise ReplayError(f"steps must be integers, got {steps!r}") from None
    if not targets:
        raise ReplayError("no step to replay")
    bad = [t for t in targets if not 1 <= t <= n]
    if bad:
        raise ReplayError(f"{run_dir}: the run has steps 1..{n}; cannot replay step(s) {bad}")
    checks: list[StepCheck] = []
    state: _State | None = None
    for t in targets:
        if state is None or state.step >= t or _newer_checkpoint(rp, state.step, t):
            state = rp.start_state(t)
        while state is not None and state.step < t:
            rp.log(f"replaying step {state.step + 1} (backend {rp.be.name})")
            check, state = rp.step(state)
            checks.append(check)
    trained_on = recorded_world_sizes(run_dir, [c.step for c in checks])
    for c in checks:
        c.world_size = trained_on.get(c.step)
    return ReplayResult(run_dir=run_dir, targets=targets, checks=checks, backend=rp.be.name,
                        backend_description=rp.be.description, preset=rp.cfg.name,
                        commitment=rp.commitment, last_step=n, genesis=rp.h0, recipe_sha256=rp.digest,
                        seconds=time.perf_counter() - t0, notes=rp.notes)


def _newer_checkpoint(rp: _Replayer, have: int, target: int) -> bool:
    """True when a usable checkpoint lies strictly between the replayed state and the target."""
    try:
        found = ckpt.list_checkpoints(rp.run_dir)
    except UnsafePath:
        return False
    return any(have < s < target and s not in rp.rejected for s, _ in found)


def replay_step(run_dir: str | os.PathLike, step: int, backend_name: str = "spec",
                data: str | os.PathLike | None = None, log=None) -> ReplayResult:
    """Replay step ``step`` (and the steps between its starting checkpoint and it); see ``replay_steps``."""
    return replay_steps(run_dir, [step], backend_name, data, log)


__all__ = ["ReplayError", "ReplayResult", "StepCheck", "TensorDiff", "diff_tensors", "replay_step", "replay_steps"]
