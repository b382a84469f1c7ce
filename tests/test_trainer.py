"""The training runtime: MPI runs vs TreeFold, kill -9 and resume, recipe binding, non-finite stops."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import killpoint
import numpy as np
import pytest
from killpoint import Paused

from lockstep.backends import get_backend
from lockstep.train import checkpoint as ckpt
from lockstep.train.config import preset, train_preset
from lockstep.train.manifest import Manifest
from lockstep.train.stream import GlobalStream
from lockstep.train.model import init_params
from lockstep.train.optim import AdamWState, NonFiniteError
from lockstep.train.step import emulate_step, plan_step
from lockstep.train.rundir import Strictness, genesis, load_recipe, make_recipe, read_trajectory, recipe_configs
from lockstep.train.trainer import RecipeMismatch, train

LOCKSTEP = [sys.executable, "-m", "lockstep.cli"]
TINY_ARGS = ["--preset", "tiny", "--backend", "spec", "--batch", "6", "--micro-batch", "2", "--quiet"]


def _have_mpi():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return shutil.which("mpiexec") is not None


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from lockstep.train.corpus import default_corpus

    folder = tmp_path_factory.mktemp("corpus") / "default"
    default_corpus(folder)
    return folder


def _run(args, timeout=600, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{args}\nstdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-4000:]}"
    return r


def _emulated_roots(run_dir: Path, world_size: int, steps: int) -> list[str]:
    recipe = load_recipe(run_dir)
    cfg, tcfg = recipe_configs(recipe)
    manifest = Manifest.load(recipe["data"]["folder"])
    stream = GlobalStream(manifest, recipe["seed"], cfg.seq_len)
    be = get_backend("spec")
    params = init_params(cfg, recipe["seed"])
    opt = AdamWState.zeros(params)
    roots = []
    for t in range(1, steps + 1):
        plan = plan_step(tcfg, cfg.seq_len, t)
        res = emulate_step(params, opt, stream.windows(plan.first_window, plan.n_windows), plan, cfg, tcfg, be, world_size)
        params, opt = res.params, res.opt
        roots.append(res.state_root)
    return roots


@pytest.mark.mpi
@pytest.mark.skipif(not _have_mpi(), reason="needs mpi4py and mpiexec (pip install 'lockstep[mpi]')")
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_mpi_run_matches_tree_fold_emulation(tmp_path, corpus, world):
    out = tmp_path / f"r{world}"
    # oversubscribed ranks: yield instead of spinning while waiting (changes timing, never bits)
    env = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1")
    _run(["mpiexec", "-n", str(world), *LOCKSTEP, "train", *TINY_ARGS, "--steps", "2", "--data", str(corpus),
          "--out", str(out)], env=env)
    traj = read_trajectory(out, Strictness.LIVE)
    assert [r["step"] for r in traj] == [1, 2]
    assert load_recipe(out)["world_size"] == world
    assert [r["state_root"] for r in traj] == _emulated_roots(out, world, 2)


def _train_cmd(out, corpus, steps):
    return [*LOCKSTEP, "train", *TINY_ARGS, "--steps", str(steps), "--checkpoint-every", "2",
            "--data", str(corpus), "--out", str(out)]


# (what is wrapped, when, the Nth matching call, substring of its first argument, where the kill lands);
# each kill interrupts the run the previous ones left behind
KILLS = [
    ("os:replace", "before", 1, "recipe.json", "start-up: recipe.json not yet in place"),
    ("os:replace", "after", 1, "recipe.json", "start-up: recipe.json written, no step yet"),
    ("lockstep.train.trainer:apply_update", "before", 2, "", "mid-step 2: gradients summed, no update"),
    ("os:replace", "before", 1, "sidecar.json", "mid-checkpoint-write: state file written, no sidecar"),
    ("os:rename", "before", 1, "step-00000004", "mid-checkpoint-write: checkpoint 4 complete, not renamed"),
    ("os:rename", "after", 1, "step-00000004", "checkpoint 4 renamed, its folder not yet fsynced"),
    # from outside: the child pauses as step 5 begins; once the trajectory holds step 4 (the
    # observed event) the test sends SIGKILL, which lands while step 5 is under way
    ("lockstep.train.trainer:apply_update", "pause", 1, "", "mid-step 5, killed from outside"),
    ("os:replace", "before", 1, "commitment.json", "all steps done, commitment.json not written"),
]


def _next_command(out, corpus, steps):
    """Resume the run once it has a recipe (from its last checkpoint, or its initial state without one);
    before that, start it again in the same folder."""
    if (out / "recipe.json").exists():
        return ["train", "--resume", str(out), "--data", str(corpus), "--backend", "spec", "--quiet",
                "--checkpoint-every", "2"]
    return _train_cmd(out, corpus, steps)[len(LOCKSTEP):]


def _kill_from_outside(target, nth, match, argv, trajectory_steps, out, tmp_path):
    pause = Paused(tmp_path / "fifos")
    proc = killpoint.launch(target, "pause", nth, match, argv, pause.folder, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        pid = pause.wait(proc)
        assert pid == proc.pid
        assert [r["step"] for r in read_trajectory(out, Strictness.LIVE)] == trajectory_steps
        proc.send_signal(signal.SIGKILL)
        return proc.wait(timeout=killpoint.HANG_GUARD_S), b""
    finally:
        pause.close()
        proc.kill()
        proc.wait()


def test_kill_9_and_resume_reproduces_the_trajectory(tmp_path, corpus):
    steps = 5
    ref = tmp_path / "ref"
    _run(_train_cmd(ref, corpus, steps))
    want = read_trajectory(ref, Strictness.LIVE)
    assert len(want) == steps

    out = tmp_path / "killed"
    for target, when, nth, match, where in KILLS:
        argv = _next_command(out, corpus, steps)
        if when == "pause":
            rc, err = _kill_from_outside(target, nth, match, argv, [1, 2, 3, 4], out, tmp_path)
        else:
            proc = killpoint.launch(target, when, nth, match, argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            _, err = proc.communicate(timeout=killpoint.HANG_GUARD_S)
            rc = proc.returncode
        assert rc == -signal.SIGKILL, f"{where}: not killed (exit {rc})\n{err.decode()[-3000:]}"
        if where.startswith("mid-checkpoint-write"):
            assert any(p.name.startswith(".tmp-") for p, _ in ckpt.incomplete_checkpoints(out)), where

    _run([*LOCKSTEP, *_next_command(out, corpus, steps)])
    assert not ckpt.incomplete_checkpoints(out)
    got = read_trajectory(out, Strictness.LIVE)
    assert got == want  # every field, hash for hash, each step once
    assert json.loads((out / "commitment.json").read_text())["chain_hash"] == want[-1]["chain_hash"]
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [2, 4, 5]


def test_genesis_binds_seed_data_and_recipe(tmp_path, corpus):
    m = Manifest.load(corpus)
    cfg, tcfg = preset("tiny"), train_preset("tiny")
    base = make_recipe(cfg, tcfg, m, "data", 42, 1)
    h = genesis(base)
    assert genesis(make_recipe(cfg, tcfg, m, "data", 43, 1)) != h
    assert genesis(make_recipe(cfg, tcfg, m, "data", 42, 2)) != h
    # a changed shard changes the manifest (it records every shard's SHA-256), hence H_0
    copy = tmp_path / "data2"
    shutil.copytree(corpus, copy)
    man = json.loads((copy / "manifest.json").read_text())
    shard = man["sources"][0]["shards"][0]
    tokens = np.load(copy / shard["tokens_file"], allow_pickle=False)
    tokens[0] = (int(tokens[0]) + 1) % 256
    np.save(copy / shard["tokens_file"], tokens, allow_pickle=False)
    import hashlib

    shard["tokens_sha256"] = hashlib.sha256((copy / shard["tokens_file"]).read_bytes()).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(man, indent=1))
    assert genesis(make_recipe(cfg, tcfg, Manifest.load(copy), "data", 42, 1)) != h


def test_changed_recipe_is_refused_on_resume(tmp_path, corpus):
    out = tmp_path / "run"
    train(out, cfg=preset("tiny"), tcfg=train_preset("tiny", batch_ramp=((0, 4),), micro_batch=4), data=str(corpus),
          steps=2, checkpoint_every=2, progress=False, log=lambda *a: None)
    recipe = json.loads((out / "recipe.json").read_text())
    recipe["train"]["peak_lr"] = 0.5
    (out / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(RecipeMismatch):
        train(out, resume=True, data=str(corpus), steps=3, progress=False, log=lambda *a: None)
    r = subprocess.run([*LOCKSTEP, "train", "--resume", str(out), "--data", str(corpus), "--steps", "3",
                        "--backend", "spec"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "RecipeMismatch" in r.stderr


def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(tmp_path, corpus, monkeypatch):
    import lockstep.train.step as step_mod

    real = step_mod.loss_and_grads
    calls = {"n": 0}

    def poisoned(params, windows, cfg, backend, n_global=None):
        loss, grads = real(params, windows, cfg, backend, n_global=n_global)
        calls["n"] += 1
        if calls["n"] == 3:  # the first micro-batch of step 3
            loss = np.float32(np.nan)
        return loss, grads

    monkeypatch.setattr(step_mod, "loss_and_grads", poisoned)
    out = tmp_path / "nan"
    with pytest.raises(NonFiniteError, match="step 3"):
        train(out, cfg=preset("tiny"), tcfg=train_preset("tiny", batch_ramp=((0, 4),), micro_batch=4),
              data=str(corpus), steps=5, checkpoint_every=2, progress=False, log=lambda *a: None)
    assert [r["step"] for r in read_trajectory(out, Strictness.LIVE)] == [1, 2]
    step, folder = ckpt.latest_checkpoint(out)
    assert step == 2
    ckpt.load_checkpoint(folder)  # verifies every digest
