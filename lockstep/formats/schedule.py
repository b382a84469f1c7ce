"""Schedules as pure functions of tokens consumed (never of step counts).

The learning rate is computed on the host in float64 with the spec's host math
(``lockstep.spec.hostmath``: built from + - * / only, so every machine gets the
same float64), then rounded once to float32 before it reaches the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lockstep.spec import hostmath, tree

from .config import ConfigError, TrainConfig

PI = 3.141592653589793  # float64 nearest to pi (0x400921FB54442D18)


def learning_rate_f64(tcfg: TrainConfig, tokens: int) -> float:
    """Linear warm-up to the peak over ``warmup_tokens``, then one cosine to ``min_lr_ratio * peak``
    at ``total_tokens``, flat after that.

    ``warm-up: peak * tokens / warmup``;
    ``decay: min + (peak - min) * (0.5 * (1 + cos(pi * progress)))`` with
    ``progress = (tokens - warmup) / (total - warmup)`` clipped to [0, 1].
    """
    peak = float(tcfg.peak_lr)
    low = peak * float(tcfg.min_lr_ratio)
    warm = int(tcfg.warmup_tokens)
    if tokens < warm:
        return peak * float(tokens) / float(warm)
    span = max(int(tcfg.total_tokens) - warm, 1)
    progress = min(max(float(tokens - warm) / float(span), 0.0), 1.0)
    return low + (peak - low) * (0.5 * (1.0 + hostmath.cos(PI * progress)))


def learning_rate(tcfg: TrainConfig, tokens: int) -> np.float32:
    """``learning_rate_f64`` rounded once to float32 (what the optimizer uses)."""
    return np.float32(learning_rate_f64(tcfg, tokens))


def sequences_per_step(tcfg: TrainConfig, tokens: int) -> int:
    """Global batch (sequences) of the step that starts after ``tokens`` tokens: the last
    ramp stage whose ``from_tokens`` is <= tokens."""
    size = None
    for start, seqs in tcfg.batch_ramp:
        if tokens >= int(start):
            size = int(seqs)
    if size is None or size <= 0:
        raise ConfigError(f"batch ramp {tcfg.batch_ramp!r} gives no batch at {tokens} tokens (it must start at 0)")
    return size


def step_windows(tcfg: TrainConfig, seq_len: int, step: int) -> tuple[int, int, int]:
    """``(first_window, n_windows, tokens_before)`` of step ``step`` (1-based).

    Step 1 starts at window 0; each step takes ``sequences_per_step`` windows of
    ``seq_len`` target tokens, given the tokens consumed before it. Computed stage by
    stage of the batch ramp (integer arithmetic), so its cost does not grow with ``step``.
    """
    if step < 1:
        raise ValueError(f"steps count from 1, got {step}")
    stages = sorted((int(a), int(b)) for a, b in tcfg.batch_ramp)
    first, tokens, left = 0, 0, step - 1  # steps still to skip
    while True:
        size = sequences_per_step(tcfg, tokens)
        nxt = next((a for a, _ in stages if a > tokens), None)
        per_step = size * seq_len
        # steps of this size before the ramp changes: until tokens reach the next stage's start
        run = left if nxt is None else min(left, -(-(nxt - tokens) // per_step))
        first += run * size
        tokens += run * per_step
        left -= run
        if left == 0:
            return first, sequences_per_step(tcfg, tokens), tokens


@dataclass(frozen=True)
class StepPlan:
    step: int
    first_window: int
    n_windows: int
    tokens_before: int
    seq_len: int

    @property
    def tokens_after(self) -> int:
        return self.tokens_before + self.n_windows * self.seq_len

    @property
    def n_global(self) -> int:
        return self.n_windows * self.seq_len

    def micro_batches(self, micro_batch: int) -> list[tuple[int, int]]:
        """``(start, stop)`` offsets into the step's windows, one per micro-batch (``spec.tree``)."""
        return tree.micro_batch_bounds(self.n_windows, micro_batch)


def plan_step(tcfg: TrainConfig, seq_len: int, step: int) -> StepPlan:
    first, n, tokens = step_windows(tcfg, seq_len, step)
    return StepPlan(step, first, n, tokens, seq_len)
