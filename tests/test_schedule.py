"""Schedules are pure functions of tokens consumed; the batch ramp's closed form equals stepping."""

import math

import numpy as np
import pytest

from lockstep.formats.config import TrainConfig, train_preset
from lockstep.formats.schedule import learning_rate, learning_rate_f64, sequences_per_step, step_windows


@pytest.mark.parametrize("tcfg", [train_preset("small"), train_preset("open-1b"),
                                  TrainConfig(batch_ramp=((0, 3), (100, 5), (101, 2), (1000, 7)))])
@pytest.mark.parametrize("seq_len", [1, 7, 256])
def test_step_windows_equals_stepping_one_step_at_a_time(tcfg, seq_len):
    first = tokens = 0
    for t in range(1, 300):
        s = sequences_per_step(tcfg, tokens)
        assert step_windows(tcfg, seq_len, t) == (first, s, tokens)
        first += s
        tokens += s * seq_len


def test_open_1b_ramp_in_tokens_per_step():
    tc = train_preset("open-1b")
    assert sequences_per_step(tc, 0) * 4096 == 3_145_728  # 3.1M tokens per step
    assert sequences_per_step(tc, 4_000_000_000) * 4096 == 4_718_592  # 4.7M from 4B tokens
    assert sequences_per_step(tc, 360_000_000_000) * 4096 == 9_437_184  # 9.4M from 360B


def test_learning_rate_shape():
    tc = TrainConfig(peak_lr=1e-3, min_lr_ratio=0.1, warmup_tokens=1000, total_tokens=11000)
    assert learning_rate_f64(tc, 0) == 0.0
    assert learning_rate_f64(tc, 500) == pytest.approx(5e-4, rel=1e-15)
    assert learning_rate_f64(tc, 1000) == pytest.approx(1e-3, rel=1e-15)
    # halfway through the cosine: min + (peak - min) / 2; tolerance: hostmath cos is within a few ulp
    assert learning_rate_f64(tc, 6000) == pytest.approx(5.5e-4, rel=1e-12)
    assert learning_rate_f64(tc, 11000) == pytest.approx(1e-4, rel=1e-12)
    assert learning_rate_f64(tc, 10**9) == pytest.approx(1e-4, rel=1e-12)
    for tok in range(0, 12000, 250):
        ref = (1e-3 * tok / 1000 if tok < 1000 else
               1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi * min((tok - 1000) / 10000, 1.0))))
        assert learning_rate_f64(tc, tok) == pytest.approx(ref, rel=1e-12, abs=1e-18)
    assert learning_rate(tc, 6000).dtype == np.float32
