"""The spec learns: ``tiny`` trained on a learnable synthetic task drives the loss down.

Task: counting modulo the vocabulary. Window b of step s starts at
``((s * B + b) * 97) mod V`` and counts up by one, so every target is the input
token plus one (mod V); the starts walk over every residue (97 is prime to
V = 264). At init the model predicts near-uniformly: loss ~ ln 264 = 5.58 (plus
the z-loss). A model that has learned the rule predicts every target, so the
loss can go to ~0.

The recipe as trained: int8 W8A8 layers on (``quantize=True``), AdamW with
clipping through ``optimizer_step``, the tiny train preset's peak learning rate
and warm-up, the cosine over this run's tokens. One micro-batch of 4 windows per
step. The issue asks for "a few hundred steps"; 80 steps is what fits the suite's
budget, and the task is learned well before that: measured 5.58 at step 1, 0.50
at step 40, 0.076 at step 80.

It runs on the numba backend where numba is installed: numba computes the spec's
bits (the conformance suite and ``tests/test_numba_backend.py`` compare them byte
for byte, training steps included), so these are the spec's numbers, about 10x
sooner than the spec's own ~0.5 s per tiny step. Without numba it runs the spec.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from lockstep.backends import BackendUnavailable, get_backend
from lockstep.formats.config import preset, train_preset
from lockstep.train.model import init_params, loss_and_grads
from lockstep.train.optim import optimizer_step
from lockstep.formats.state import AdamWState
from lockstep.formats.schedule import learning_rate

STEPS = 80
BATCH = 4
START_STRIDE = 97  # prime to the vocabulary size, so starts cover every residue
FINAL_LOSS_MAX = 0.25  # mean of the last 10 steps; init is ~5.6, measured 0.078


def counting_windows(step: int, batch: int, seq_len: int, vocab: int) -> np.ndarray:
    """(batch, seq_len + 1) windows ``(start_b + t) mod vocab``: integer arithmetic only."""
    b = np.arange(batch, dtype=np.int64)[:, None]
    t = np.arange(seq_len + 1, dtype=np.int64)[None, :]
    start = ((step * batch + b) * START_STRIDE) % vocab
    return (start + t) % vocab


def test_tiny_learns_counting():
    try:
        be = get_backend("numba")
    except BackendUnavailable:  # numba not installed: the spec itself (slower, the same bits)
        be = get_backend("spec")
    cfg = preset("tiny")
    tokens_per_step = BATCH * cfg.seq_len
    tcfg = dataclasses.replace(train_preset("tiny"), total_tokens=STEPS * tokens_per_step)
    params = init_params(cfg, seed=0)
    state = AdamWState.zeros(params)
    losses, tokens, t0 = [], 0, time.perf_counter()
    for step in range(1, STEPS + 1):
        windows = counting_windows(step, BATCH, cfg.seq_len, cfg.vocab_size)
        loss, grads = loss_and_grads(params, windows, cfg, be)
        params, state, _ = optimizer_step(params, grads, state, cfg, tcfg, learning_rate(tcfg, tokens), be)
        tokens += tokens_per_step
        losses.append(float(loss))
    elapsed = time.perf_counter() - t0
    print(f"\ncounting mod {cfg.vocab_size}, batch {BATCH}, {STEPS} steps in {elapsed:.1f} s "
          f"(peak lr {tcfg.peak_lr:g}, warm-up {tcfg.warmup_tokens} tokens)")
    print("step  loss")
    for s in [1, *range(10, STEPS + 1, 10)]:
        print(f"{s:4d}  {losses[s - 1]:.4f}")
    final = float(np.mean(losses[-10:]))
    print(f"mean of the last 10: {final:.4f}")
    assert all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(cfg.vocab_size)) < 0.1, "init should predict near-uniformly"
    assert final < FINAL_LOSS_MAX, f"loss went from {losses[0]:.3f} only to {final:.3f} in {STEPS} steps"
