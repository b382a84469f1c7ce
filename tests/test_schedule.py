"""Schedules are pure functions of tokens consumed; the batch ramp's closed form equals stepping; open-1b
trains with the paper's schedule and checkpoint interval."""

import math

import numpy as np
import pytest

from lockstep.formats.config import DEFAULT_CHECKPOINT_EVERY, TrainConfig, checkpoint_every, preset, train_preset
from lockstep.formats.params import param_count
from lockstep.formats.schedule import (learning_rate, learning_rate_f64, plan_step, sequences_per_step,
                                       step_windows)


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


def test_open_1b_trains_with_the_papers_schedule():
    """Peak 4.5e-4, warm-up over 667 steps of 768 x 4096 tokens, one cosine to 10% at 400B tokens,
    AdamW (0.9, 0.95, 1e-8), decay 0.1, clipping 1.0, micro-batches of 4: the paper's values."""
    tc = train_preset("open-1b")
    seq_len = 4096
    assert (tc.peak_lr, tc.min_lr_ratio, tc.total_tokens) == (4.5e-4, 0.1, 400_000_000_000)
    assert (tc.beta1, tc.beta2, tc.eps, tc.weight_decay, tc.grad_clip, tc.micro_batch) == (0.9, 0.95, 1e-8, 0.1, 1.0, 4)
    # the warm-up is exactly 667 steps of the first stage (768 sequences): step 667 ends at warmup_tokens
    assert tc.warmup_tokens == 2_098_200_576 == 667 * sequences_per_step(tc, 0) * seq_len
    p666, p667 = plan_step(tc, seq_len, 666), plan_step(tc, seq_len, 667)
    assert p667.tokens_after == tc.warmup_tokens and p667.n_windows == 768
    # step t trains at the learning rate of the tokens consumed once it is done: peak * t / 667 up to the peak
    assert learning_rate_f64(tc, p667.tokens_after) == tc.peak_lr
    assert learning_rate(tc, p667.tokens_after) == np.float32(tc.peak_lr)
    assert learning_rate_f64(tc, p666.tokens_after) < tc.peak_lr
    assert learning_rate_f64(tc, plan_step(tc, seq_len, 1).tokens_after) == tc.peak_lr * 3_145_728 / tc.warmup_tokens
    # after it, one cosine that reaches 10% of the peak at 400B tokens (and stays there)
    floor = tc.peak_lr * tc.min_lr_ratio
    assert learning_rate_f64(tc, 400_000_000_000) == floor
    assert learning_rate_f64(tc, 399_000_000_000) > floor
    assert learning_rate_f64(tc, tc.warmup_tokens + (tc.total_tokens - tc.warmup_tokens) // 2) == pytest.approx(
        (tc.peak_lr + floor) / 2, rel=1e-12)  # halfway: hostmath cos within a few ulp of 0
    # a 400B-token run (--tokens 400000000000) is 80,957 steps on this ramp, and its last step trains at 10%
    last = plan_step(tc, seq_len, 80_957)
    assert plan_step(tc, seq_len, 80_956).tokens_after < 400_000_000_000 <= last.tokens_after
    assert learning_rate_f64(tc, last.tokens_after) == floor
    assert learning_rate(tc, last.tokens_after) == np.float32(floor)


def test_open_1b_settings_of_locksteps_own_are_pinned():
    """The values the paper does not set (the ramp's later stages, the init std, the vocabulary)."""
    tc, cfg = train_preset("open-1b"), preset("open-1b")
    assert tc.batch_ramp == ((0, 768), (4_000_000_000, 1152), (360_000_000_000, 2304))
    assert (cfg.vocab_size, cfg.init_std, cfg.norm_eps) == (128_256, 0.02, 1e-6)
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.seq_len,
            cfg.sliding_window, cfg.full_attention_every) == (2048, 24, 16, 4, 128, 5632, 4096, 512, 5)
    assert (cfg.rope_theta, cfg.z_loss, cfg.quantize, cfg.hadamard) == (500_000.0, 1e-4, True, True)
    assert param_count(cfg) == 1_607_569_408


def test_checkpoint_interval_defaults_to_the_presets():
    assert checkpoint_every("open-1b") == 100  # the paper's
    assert [checkpoint_every(n) for n in ("tiny", "small", "medium", "custom")] == [DEFAULT_CHECKPOINT_EVERY] * 4


def test_train_without_the_flag_uses_the_presets_interval(tmp_path, corpus, monkeypatch):
    """``lockstep train`` with no --checkpoint-every asks ``config.checkpoint_every`` for the run's model."""
    from lockstep.cli import main
    from lockstep.formats import config

    monkeypatch.setitem(config.CHECKPOINT_EVERY, "tiny", 2)
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--backend", "spec", "--steps", "3", "--quiet", "--data", str(corpus),
                 "--out", str(run)]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000002", "step-00000003"]
