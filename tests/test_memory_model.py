"""The memory model and the planner: predictions within 25% of a measured peak RSS, the plan chosen
for a budget, and a refusal before anything is allocated or written."""

import json
import os
import subprocess
import sys

import pytest

from lockstep.formats.config import preset, train_preset
from lockstep.formats.params import param_count
from lockstep.formats.rundir import RunFileError
from lockstep.train import trainer
from lockstep.train.execution import Execution
from lockstep.backends import KERNELS_MEMORY
from lockstep.cli.common import said
from lockstep.train.memory import GiB, choose_execution, plans, step_memory

# One step of a recipe in a fresh process, as the trainer runs it; prints its own peak RSS (KiB): VmHWM,
# the high-water mark of the process's own address space. (Not ru_maxrss: Linux carries the parent's
# resident size at fork across exec into the child's ru_maxrss, so a child of a large pytest process
# would report the parent's size; RUSAGE_CHILDREN has the same flaw.)
CHILD = """
import json, sys
import numpy as np
from lockstep.backends import get_backend
from lockstep.formats.config import ModelConfig, TrainConfig
from lockstep.formats.schedule import plan_step
from lockstep.train.malloc import keep_freed_memory
from lockstep.train.model import init_params
from lockstep.formats.state import AdamWState

def resident_moments(params):  # zero moments written: resident, as a later step's are (np.zeros pages are not)
    return AdamWState(0, {k: np.full_like(p, 0.0) for k, p in params.items()},
                      {k: np.full_like(p, 0.0) for k, p in params.items()})
from lockstep.train.step import GradLayout, apply_update, subtree_sums
from lockstep.train.storage import step_storage
spec = json.loads(sys.argv[1])
keep_freed_memory()
cfg, tcfg = ModelConfig.from_dict(spec["model"]), TrainConfig.from_dict(spec["train"])
be = get_backend("numba")
params = init_params(cfg, 1, backend=be)  # the backend draws them: no NumPy temporaries of a tensor's size
plan = plan_step(tcfg, cfg.seq_len, 1)
windows = np.random.default_rng(0).integers(0, 257, size=(plan.n_windows, cfg.seq_len + 1)).astype(np.int32)
storage = step_storage(be, GradLayout.of(cfg).size, spec.get("scratch"))  # out of core, as the trainer does it
params, opt = storage.adopt(params, resident_moments(params))
[(_, _, s)] = subtree_sums(params, windows, plan, 0, len(plan.micro_batches(tcfg.micro_batch)), cfg, tcfg, be,
                           storage.pool)
apply_update(params, opt, s, plan, cfg, tcfg, be, storage=storage)
storage.close()
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""

SIZES = {
    # the baseline dominates: the process itself
    "tiny": (preset("tiny"), train_preset("tiny", batch_ramp=((0, 4),), micro_batch=2)),
    # the weights, moments and sums of 3M parameters, and the activations of 4 x 256 tokens
    "small, 2 layers": (preset("small", n_layers=2), train_preset("small", batch_ramp=((0, 8),), micro_batch=4)),
    # the logits and their gradient (8 x 256 tokens x 4096) are the largest term
    "vocab 4096": (preset("small", n_layers=2, vocab_size=4096, d_model=128, ffn_dim=344, n_heads=2, n_kv_heads=1),
                   train_preset("small", batch_ramp=((0, 8),), micro_batch=8)),
}


# Vectors of 17M floats (vocab 65,536): the state is most of the step, so out of core it must shrink
# (the weights, one micro-batch and one tensor's worth of everything else) for the model to agree.
BIG_VOCAB = (preset("small", n_layers=1, vocab_size=65536, d_model=128, ffn_dim=344, n_heads=2, n_kv_heads=1,
                    seq_len=64),
             train_preset("small", batch_ramp=((0, 4),), micro_batch=1))
SIZES["vocab 65,536, in memory"] = BIG_VOCAB
SIZES["vocab 65,536, state in scratch"] = BIG_VOCAB


def _measured_peak(cfg, tcfg, scratch=None) -> int:
    spec = {"model": cfg.to_dict(), "train": tcfg.to_dict(), "scratch": None if scratch is None else str(scratch)}
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return int(r.stdout.split()[-1]) * 1024  # VmHWM is in kB


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="the peak is read from /proc (Linux)")
@pytest.mark.parametrize("name", list(SIZES))
def test_the_model_is_within_25_percent_of_the_measured_peak(name, tmp_path):
    """Each size's step runs in a child (memory, not time: the peak does not depend on the machine's speed)."""
    cfg, tcfg = SIZES[name]
    scratch = tmp_path if "scratch" in name else None
    measured = _measured_peak(cfg, tcfg, scratch)
    predicted = step_memory(cfg, tcfg, Execution(scratch=None if scratch is None else str(scratch))).total
    assert abs(predicted - measured) <= 0.25 * measured, (name, predicted / 2**20, measured / 2**20)
    assert scratch is None or os.listdir(scratch) == []  # the child's private folder is gone with it


def test_terms_follow_the_options():
    cfg, tcfg = preset("small"), train_preset("small")
    ram, disk = step_memory(cfg, tcfg), step_memory(cfg, tcfg, Execution(scratch="/scratch"))
    assert disk.total < ram.total and disk.terms["waiting sums"] == 0 and disk.terms.get("moments", 0) < ram.terms["moments"]
    big = step_memory(preset("open-1b"), train_preset("open-1b"))
    assert big.terms["weights"] == 4 * param_count(preset("open-1b"))
    assert step_memory(cfg, tcfg, memory=KERNELS_MEMORY).terms["attention"] > ram.terms["attention"]  # T x T scores


def test_the_planner_takes_the_cheapest_plan_that_fits(tmp_path):
    """The plans in the planner's order (in memory; recompute; recompute with head rows; each again with
    the state in scratch): for a budget of each plan's own modelled need, the first plan in that order
    that fits is taken; open-1b's smallest plan is the one with every option; below it, a refusal."""
    cfg, tcfg = preset("open-1b"), train_preset("open-1b")
    options = plans(str(tmp_path))
    needs = [step_memory(cfg, tcfg, ex).total for _, ex in options]
    assert [label for label, _ in options][0] == "in memory" and options[-1][1].recompute
    assert options[-1][1].head_rows and options[-1][1].scratch == str(tmp_path)
    assert min(needs) == needs[-1] < needs[0]
    for need in needs:
        plan = choose_execution(cfg, tcfg, "train it", max_memory=need / GiB, scratch=str(tmp_path))
        first = next(i for i, n in enumerate(needs) if n <= need)
        assert plan.execution == options[first][1] and plan.line("train").startswith(
            f"memory plan to train: {options[first][0]}")
    with pytest.raises(RunFileError, match=r"even in its smallest plan.*budget \(max_memory\)") as refused:
        choose_execution(cfg, tcfg, "train it", max_memory=needs[-1] / GiB / 2, scratch=str(tmp_path))
    assert refused.value.settings == ("max_memory",) and "budget (--max-memory)" in said(refused.value)


def test_a_budget_no_plan_fits_is_refused_before_init_and_before_any_file(tmp_path, monkeypatch):
    def no_init(*a, **k):
        raise AssertionError("the model was built before the refusal")

    monkeypatch.setattr(trainer, "init_params", no_init)
    out = tmp_path / "run"
    with pytest.raises(RunFileError, match="needs about .* GiB to train it even in its smallest plan"):
        trainer.train(out, cfg=preset("tiny"), tcfg=train_preset("tiny"), steps=1, backend_name="spec",
                      max_memory=0.01, progress=False, log=lambda *a: None)
    assert not out.exists() and os.listdir(tmp_path) == []


def test_the_cli_refuses_in_one_line_and_leaves_no_run_directory(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "lockstep.cli", "train", "--preset", "tiny", "--backend", "spec",
                        "--steps", "1", "--max-memory", "0.01", "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "smallest plan" in r.stderr, r.stderr
    assert not out.exists()
    r = subprocess.run([sys.executable, "-m", "lockstep.cli", "train", "--max-memory", "-3"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "positive number of GiB" in r.stderr
