"""What a replay found: per-step checks, the result of a replay, and how a mismatch is explained.

``lockstep.audit.replay`` computes; this module holds what it reports. On a mismatch,
``_diagnose`` compares the replayed state with the run's checkpoint of that step (if
there is one) tensor by tensor: each differing tensor is named with its first
differing Merkle chunk and its first differing element (``diff_tensors``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lockstep.errors import LockstepError
from lockstep.formats import checkpoint as ckpt
from lockstep.fsio import UnsafePath, printable, read_json_regular
from lockstep.spec import hashing

COMPARED = ("state_root", "chain_hash", "batch_digest", "tokens", "loss_bits", "grad_norm_bits", "lr_bits")


class ReplayError(LockstepError, RuntimeError):
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
    problems: list[str] = field(default_factory=list)  # the run is invalid: never a MATCH
    damaged: list[str] = field(default_factory=list)  # damaged or missing checkpoints met: never a MATCH
    skipped_damaged: list[str] = field(default_factory=list)  # damaged starts passed over with --from-earlier
    backend_choice: str | None = None  # why this backend, when it was chosen automatically

    @property
    def replayed_targets(self) -> list[int]:
        return [c.step for c in self.checks if c.step in self.targets]

    @property
    def ok(self) -> bool:
        return (not self.problems and not self.damaged and all(c.match for c in self.checks)
                and sorted(self.replayed_targets) == sorted(self.targets))

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
        lines += [f"  RUN INVALID: {p}" for p in self.problems]
        lines += [f"  DAMAGED: {d}" for d in self.damaged]
        lines += [f"  DAMAGED, replayed from an earlier state (--from-earlier): {d}" for d in self.skipped_damaged]
        if self.backend_choice:
            lines.append(f"  backend: {self.backend_choice}")
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
            lines.append(f"  not replayed (a checkpoint on the way is damaged or contradicts the run, or an earlier "
                         f"step of their replay mismatched): steps {missing}")
        lines.append(self._verdict())
        return "\n".join(printable(line) for line in lines)  # untrusted names cannot add lines


    def _verdict(self) -> str:
        took = f"({self.seconds:.1f}s)"
        if self.problems:
            return (f"MISMATCH: the run is invalid ({len(self.problems)} problem(s) listed at the top), whatever the "
                    f"replayed steps gave {took}")
        if self.damaged:
            return (f"MISMATCH: {len(self.damaged)} damaged or missing checkpoint(s), listed at the top; "
                    f"the replay cannot vouch for what they hold {took}")
        if self.ok and self.skipped_damaged:
            return (f"MATCH from an earlier state: {len(self.skipped_damaged)} damaged checkpoint(s) passed over "
                    f"(listed at the top) {took}")
        return f"{self.outcome.upper()} {took}"


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


def _diagnose(run_dir: Path, step: int, replayed: dict[str, np.ndarray], replayed_root: str,
              max_bytes: int) -> tuple[list[TensorDiff], str]:
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
        c = ckpt.load_checkpoint(folder, max_bytes=max_bytes)
    except ckpt.CheckpointError as exc:
        try:
            side = read_json_regular(folder, ckpt.SIDECAR_FILE, "checkpoint sidecar", ckpt.MAX_SIDECAR_BYTES)
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
