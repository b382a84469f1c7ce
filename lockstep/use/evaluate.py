"""Validation loss: the model on the manifest's held-out windows, the same bits on every backend.

The held-out windows are ``lockstep.formats.stream.validation_windows`` (each source's
validation documents, never in the training stream). The evaluation, per source in
manifest order:

1. Its windows in batches of ``eval_batch`` (the run's micro-batch; the last batch may
   be short). A batch's logits are the training forward (``model.logits_forward``),
   int8 W8A8 when the recipe quantizes: an int8 layer's activation scale is taken over
   the whole batch, as in training, so the batch size is part of the definition.
2. A batch's loss sum is ``cross_entropy_forward(logits, targets, z_loss=0)[0]``: the
   lane-tree sum of the per-token cross-entropy ``lse - logit[target]`` (no z-loss).
3. The source's sum: ``acc = batch_0``, then ``acc = add(acc, batch_i)`` ascending.

The total is the sources' sums added the same way, in manifest order. All of these are
backend ops (float32, the spec's orders). Reported: the float32 loss sums (and their
bits), ``nats_per_token = float(sum) / targets`` and ``bits_per_byte = float(sum) /
(bytes * ln 2)``, computed once on the host in float64 (IEEE division and
multiplication, correctly rounded everywhere). ``bytes`` counts the bytes of text the
targets stand for: one per byte token (the separator counts none); for other
tokenizers, the UTF-8 length of each window's targets decoded (separators removed).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from lockstep.errors import Setting
from lockstep.formats.config import ConfigError, ModelConfig
from lockstep.formats.manifest import Manifest
from lockstep.formats.stream import ValidationSplit, validation_windows
from lockstep.formats.tokenizer import BYTE_VOCAB, ByteTokenizer
from lockstep.formats.trajectory import float_record
from lockstep.fsio import append_line, check_regular_or_absent, printable, read_regular, safe_join
from lockstep.spec import SPEC_VERSION
from lockstep.train.model import device_params, forward

from .run import UseError
from .tokenizing import guarded

VALIDATION_FORMAT = "lockstep.validation"
VALIDATION_VERSION = 1
LN2 = float.fromhex("0x1.62e42fefa39efp-1")  # ln 2 rounded to float64 (the literal, not a libm call)
# lockstep train evaluates every this many steps (and at the last step) unless --eval-every says otherwise
DEFAULT_EVAL_EVERY = {"tiny": 0, "small": 50, "open-1b": 1000}


def eval_interval(eval_every: int | None, cfg: ModelConfig) -> int:
    """The evaluation interval in steps: ``eval_every``, or the preset's default when None; 0: never."""
    if eval_every is None:
        return DEFAULT_EVAL_EVERY.get(cfg.name, 0)
    if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 0:
        raise ConfigError.naming(Setting("eval_every"), f" must be a non-negative integer, got {eval_every!r}")
    return eval_every


@dataclass
class SourceLoss:
    source: str
    windows: int
    targets: int
    bytes: int
    loss_sum: np.float32

    def record(self) -> dict:
        return {"windows": self.windows, "targets": self.targets, "bytes": self.bytes,
                "loss_sum": float(self.loss_sum), "loss_sum_bits": float_record(self.loss_sum)["bits"],
                "nats_per_token": nats_per_token(self.loss_sum, self.targets),
                "bits_per_byte": bits_per_byte(self.loss_sum, self.bytes)}


def nats_per_token(loss_sum: np.float32, targets: int) -> float:
    return float(loss_sum) / targets if targets else float("nan")


def bits_per_byte(loss_sum: np.float32, n_bytes: int) -> float:
    return float(loss_sum) / (n_bytes * LN2) if n_bytes else float("nan")


@dataclass
class Validation:
    """One evaluation of one checkpoint's parameters."""

    step: int
    tokens: int  # training tokens consumed at that step
    eval_batch: int
    backend: str
    sources: list[SourceLoss]
    loss_sum: np.float32
    seconds: float = 0.0

    @property
    def targets(self) -> int:
        return sum(s.targets for s in self.sources)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.sources)

    @property
    def nats_per_token(self) -> float:
        return nats_per_token(self.loss_sum, self.targets)

    @property
    def bits_per_byte(self) -> float:
        return bits_per_byte(self.loss_sum, self.bytes)

    @property
    def bits(self) -> str:
        return float_record(self.loss_sum)["bits"]

    def record(self) -> dict:
        """The ``validation`` object of a metrics.jsonl line."""
        return {
            "format": VALIDATION_FORMAT, "version": VALIDATION_VERSION, "spec_version": SPEC_VERSION,
            "nats_per_token": self.nats_per_token, "bits_per_byte": self.bits_per_byte,
            "loss_sum": float(self.loss_sum), "loss_sum_bits": self.bits, "targets": self.targets,
            "bytes": self.bytes, "eval_batch": self.eval_batch, "backend": self.backend,
            "seconds": round(self.seconds, 3), "sources": {s.source: s.record() for s in self.sources},
        }

    def format(self) -> str:
        lines = [f"step {self.step} ({self.tokens:,} training tokens): validation loss {self.nats_per_token:.6f} "
                 f"nats/token, {self.bits_per_byte:.6f} bits/byte over {self.targets:,} tokens "
                 f"(loss sum {float(self.loss_sum):.9g}, bits {self.bits})"]
        for s in self.sources:
            lines.append(f"  {printable(s.source)}: {nats_per_token(s.loss_sum, s.targets):.6f} nats/token, "
                         f"{bits_per_byte(s.loss_sum, s.bytes):.6f} bits/byte ({s.windows} windows)")
        return "\n".join(lines)


def target_bytes(windows: np.ndarray, tokenizer) -> int:
    """Bytes of text the targets ``windows[:, 1:]`` stand for (module docstring)."""
    targets = windows[:, 1:]
    if isinstance(tokenizer, ByteTokenizer):
        return int(np.count_nonzero(targets < BYTE_VOCAB))  # exact: integer count
    total = 0
    for row in targets:
        ids = row[row != tokenizer.eod_id]
        total += len(tokenizer.decode(ids).encode("utf-8"))
    return total


def evaluate_splits(params: dict, cfg: ModelConfig, splits: list[ValidationSplit], tokenizer, backend,
                    eval_batch: int, progress: Callable[[int, int], None] | None = None) -> tuple[list[SourceLoss], np.float32]:
    """Per-source loss sums and the total, in the module docstring's order."""
    be = backend
    if isinstance(eval_batch, bool) or not isinstance(eval_batch, int) or eval_batch < 1:
        raise ValueError(f"eval_batch must be a positive integer, got {eval_batch!r}")
    P = device_params(params, be)
    n_batches = sum(-(-s.windows.shape[0] // eval_batch) for s in splits)
    done = 0
    out: list[SourceLoss] = []
    total = None
    for split in splits:
        acc = None
        for i in range(0, split.windows.shape[0], eval_batch):
            w = split.windows[i : i + eval_batch]
            inputs = np.ascontiguousarray(w[:, :-1])
            targets = np.ascontiguousarray(w[:, 1:]).reshape(-1)
            logits = forward(P, inputs, cfg, be)[0]
            batch_sum = be.cross_entropy_forward(logits, targets, 0.0)[0]
            acc = batch_sum if acc is None else be.add(acc, batch_sum)
            done += 1
            if progress is not None:
                progress(done, n_batches)
        if acc is None:  # a source whose held-out tokens fill no window
            continue
        s = np.float32(np.asarray(be.to_numpy(acc)).reshape(-1)[0])
        out.append(SourceLoss(split.source, int(split.windows.shape[0]), split.targets,
                              target_bytes(split.windows, tokenizer), s))
        total = acc if total is None else be.add(total, acc)
    if total is None:
        raise UseError("the held-out documents fill no window of the model's sequence length; "
                       "hold out more documents (lockstep data ingest --validation-documents N)")
    return out, np.float32(np.asarray(be.to_numpy(total)).reshape(-1)[0])


def evaluate(params: dict, cfg: ModelConfig, manifest: Manifest, backend, eval_batch: int, step: int = 0,
             tokens: int = 0, progress: Callable[[int, int], None] | None = None) -> Validation:
    """Validation loss of ``params`` on ``manifest``'s held-out windows (module docstring)."""
    splits = validation_windows(manifest, cfg.seq_len)
    if not splits:
        raise UseError(f"{manifest.path}: the data holds out no validation documents; build it with "
                       "`lockstep data ingest ... --validation-documents N` (the default corpus holds some out)")
    t0 = time.perf_counter()
    tokenizer = guarded(manifest.tokenizer())  # a panic of the tokenizer library is a one-line error
    sources, total = evaluate_splits(params, cfg, splits, tokenizer, backend, eval_batch, progress)
    return Validation(step, tokens, eval_batch, backend.name, sources, total, time.perf_counter() - t0)


# ---------------------------------------------------------------- metrics.jsonl

METRICS_FILE = "metrics.jsonl"
MAX_METRICS_BYTES = 1 << 30  # ~200 bytes a line: millions of steps; a larger file is not ours


def metrics_line(v: Validation) -> dict:
    return {"step": v.step, "tokens": v.tokens, "validation": v.record()}


def append_metrics(run_dir: Path, obj: dict) -> None:
    """Append one JSON line to metrics.jsonl (fsynced), as the trainer does."""
    check_regular_or_absent(run_dir, METRICS_FILE, "metrics log")  # no symlinked folder on the way
    append_line(safe_join(run_dir, METRICS_FILE), json.dumps(obj, sort_keys=True).encode() + b"\n")


def recorded_validations(run_dir: Path) -> dict[int, dict]:
    """The last ``validation`` record per step in metrics.jsonl (torn or foreign lines skipped)."""
    try:  # a regular file inside the run, size-capped: never a link, FIFO or device
        data = read_regular(run_dir, METRICS_FILE, "metrics log", MAX_METRICS_BYTES)
    except (OSError, ValueError):
        return {}
    out: dict[int, dict] = {}
    for line in data.split(b"\n"):
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError, RecursionError):  # ValueError: 5000 digits
            continue
        if isinstance(obj, dict) and type(obj.get("step")) is int and _validation_shape(obj.get("validation")):
            out[obj["step"]] = {"tokens": obj.get("tokens"), **obj["validation"]}
    return out


def _validation_shape(v) -> bool:
    """Whether a metrics line's ``validation`` has the types the model card, ``eval`` and the plot read (the
    metrics are not evidence, so a line of another shape is skipped, never trusted or crashed on)."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    return (isinstance(v, dict) and number(v.get("nats_per_token")) and number(v.get("bits_per_byte"))
            and isinstance(v.get("loss_sum_bits"), str) and type(v.get("targets")) is int)


_SAID_NOTHING_HELD_OUT: set[str] = set()  # runs already told, so the note is said once


def record_validation(run_dir: Path, step: int, tokens: int, params: dict, cfg: ModelConfig, manifest: Manifest,
                      backend, eval_batch: int, say=print) -> Validation | None:
    """The trainer's hook: evaluate, append to metrics.jsonl, say one line. None when the data
    holds out nothing (said once per run)."""
    splits = validation_windows(manifest, cfg.seq_len)
    if not any(split.windows.shape[0] for split in splits):
        if str(run_dir) not in _SAID_NOTHING_HELD_OUT:
            why = ("holds out no documents" if not splits else
                   f"holds out too few tokens for one window of {cfg.seq_len + 1}")
            say(f"no validation loss: {manifest.path} {why} (lockstep data ingest ... --validation-documents N)")
            _SAID_NOTHING_HELD_OUT.add(str(run_dir))
        return None
    v = evaluate(params, cfg, manifest, backend, eval_batch, step=step, tokens=tokens)
    append_metrics(run_dir, metrics_line(v))
    say(f"validation at step {step}: {v.nats_per_token:.4f} nats/token, {v.bits_per_byte:.4f} bits/byte "
        f"({v.seconds:.1f} s)")
    return v


def progress_printer(enabled: bool) -> Callable[[int, int], None] | None:
    """A one-line progress display on stderr for ``lockstep eval``."""
    if not enabled:
        return None
    tty = sys.stderr.isatty()
    t0 = time.perf_counter()

    def show(done: int, total: int) -> None:
        line = f"evaluating: batch {done}/{total}  {time.perf_counter() - t0:,.0f}s"
        if tty:
            print("\r" + line, end="" if done < total else "\n", file=sys.stderr, flush=True)
        elif done == total or done % max(1, total // 10) == 0:
            print(line, file=sys.stderr, flush=True)

    return show
