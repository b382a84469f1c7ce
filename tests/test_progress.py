"""Progress lines for long phases, tested by event (a fake clock, counted calls), never by time."""

from __future__ import annotations

import dataclasses

import numpy as np

from lockstep.backends import get_backend
from lockstep.formats import checkpoint as ckpt
from lockstep.formats.config import preset, train_preset
from lockstep.formats.schedule import plan_step
from lockstep.fsio.progress import PhaseProgress
from lockstep.train.model import init_params
from lockstep.formats.state import AdamWState
from lockstep.train.step import tree_step
from lockstep.formats.state import state_tensors


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_lines_by_event():
    clock, lines = FakeClock(), []
    bar = PhaseProgress("init", 1000, "parameters", write=lines.append, clock=clock, quiet_for=3, every=5)
    for done in range(0, 1001, 100):  # one update per simulated second
        bar.update(done)
        clock.now += 1
    bar.close()
    # quiet for 3 s, then a line at t=3 and t=8 (every 5 s), then the closing line
    assert len(lines) == 3, lines
    assert lines[0].startswith("init: 30% (300/1K parameters), 100/s, about 7s left")
    assert lines[1].startswith("init: 80%") and lines[2] == "init: done, 1K parameters in 11s"
    quiet = []
    fast = PhaseProgress("init", 10, "parameters", write=quiet.append, clock=FakeClock())
    for done in range(11):
        fast.update(done)
    fast.close()
    off = PhaseProgress("init", 10, "parameters", write=quiet.append, clock=clock, enabled=False, quiet_for=0)
    clock.now += 100
    off.update(5)
    off.close()
    assert quiet == []  # a phase that ends within quiet_for, or a disabled one, says nothing


def test_step_and_checkpoint_report_their_parts(tmp_path):
    cfg = preset("tiny")
    tcfg = dataclasses.replace(train_preset("tiny"), micro_batch=1, batch_ramp=((0, 2),))
    be = get_backend("spec")
    params = init_params(cfg, 5)
    plan = plan_step(tcfg, cfg.seq_len, 1)
    windows = (np.arange(plan.n_windows * (cfg.seq_len + 1)) % 200).reshape(plan.n_windows, -1).astype(np.int64)
    seen = []
    res = tree_step(params, AdamWState.zeros(params), windows, plan, cfg, tcfg, be,
                    progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]
    quiet = tree_step(params, AdamWState.zeros(params), windows, plan, cfg, tcfg, be)
    assert quiet.state_root == res.state_root  # progress changes no bit
    written = []
    state = state_tensors(res.params, res.opt)
    ckpt.save_checkpoint(tmp_path, 1, state, {"chain_hash": "0" * 64}, progress=lambda d, t: written.append((d, t)))
    total = 2 * sum(v.nbytes for v in state.values())
    assert written[-1] == (total, total) and all(t == total for _, t in written)
    assert [d for d, _ in written] == sorted(d for d, _ in written) and len(written) > len(state)
