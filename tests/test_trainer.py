"""The training runtime: one trajectory for any number of ranks, elastic resume, kill -9 and resume, recipe
binding, non-finite stops."""

import dataclasses
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
from have_mpi import NO_MPI, have_mpi, needs_mpi
from killpoint import Paused

from lockstep.backends import get_backend
from lockstep.formats import checkpoint as ckpt
from lockstep.formats.config import preset, train_preset
from lockstep.formats.manifest import Manifest
from lockstep.formats.stream import GlobalStream
from lockstep.train.model import init_params
from lockstep.train.optim import NonFiniteError
from lockstep.formats.state import AdamWState
from lockstep.formats.recipe import genesis, load_recipe, make_recipe, recipe_configs
from lockstep.formats.trajectory import Strictness, read_trajectory
from lockstep.formats.schedule import plan_step
from lockstep.train.step import tree_step
from lockstep.train.trainer import RecipeMismatch, train

LOCKSTEP = [sys.executable, "-m", "lockstep.cli"]
TINY_ARGS = ["--preset", "tiny", "--backend", "spec", "--batch", "6", "--micro-batch", "2", "--quiet"]


def _run(args, timeout=600, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{args}\nstdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-4000:]}"
    return r


def _mpiexec(world: int) -> list[str]:
    return ["mpiexec", "-n", str(world)]


# oversubscribed ranks: yield instead of spinning while waiting (changes timing, never bits)
MPI_ENV = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1")
# the batch ramp changes M within the run: 6 windows (M = 3) for steps 1-2, then 10 (M = 5)
RAMP_ARGS = ["--preset", "tiny", "--backend", "spec", "--batch-ramp", "0:6,384:10", "--micro-batch", "2", "--quiet",
             "--checkpoint-every", "2"]
RAMP_STEPS = 6


def _one_process_roots(run_dir: Path, steps: int) -> list[str]:
    """State roots of the run's steps computed on one process with the spec's tree (``tree_step``)."""
    recipe = load_recipe(run_dir)
    cfg, tcfg = recipe_configs(recipe)
    stream = GlobalStream(Manifest.load(recipe["data"]["folder"]), recipe["seed"], cfg.seq_len)
    be = get_backend("spec")
    params = init_params(cfg, recipe["seed"])
    opt = AdamWState.zeros(params)
    roots = []
    for t in range(1, steps + 1):
        plan = plan_step(tcfg, cfg.seq_len, t)
        res = tree_step(params, opt, stream.windows(plan.first_window, plan.n_windows), plan, cfg, tcfg, be)
        params, opt = res.params, res.opt
        roots.append(res.state_root)
    return roots


@pytest.fixture(scope="module")
def ramp_runs(tmp_path_factory, corpus):
    """The same recipe trained with mpiexec -n 1, 2, 3, 4 (``RAMP_STEPS`` steps, checkpoints every 2)."""
    if not have_mpi():
        pytest.skip(NO_MPI)
    runs = {}
    for world in (1, 2, 3, 4):
        out = tmp_path_factory.mktemp(f"ramp-r{world}") / "run"
        _run([*_mpiexec(world), *LOCKSTEP, "train", *RAMP_ARGS, "--steps", str(RAMP_STEPS), "--data", str(corpus),
              "--out", str(out)], env=MPI_ENV)
        runs[world] = out
    return runs


@pytest.mark.mpi
@needs_mpi
def test_any_number_of_ranks_gives_the_same_trajectory(ramp_runs):
    want = (ramp_runs[1] / "trajectory.jsonl").read_bytes()
    for world, out in ramp_runs.items():
        assert (out / "trajectory.jsonl").read_bytes() == want, f"{world} ranks: another trajectory"
        assert "world_size" not in load_recipe(out)
        sizes = [json.loads(x)["world_size"] for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert sizes == [world] * RAMP_STEPS
    traj = read_trajectory(ramp_runs[1], Strictness.LIVE)
    assert [r["tokens"] for r in traj] == [192, 384, 704, 1024, 1344, 1664]  # M = 3, 3, 5, 5, 5, 5
    assert [r["state_root"] for r in traj] == _one_process_roots(ramp_runs[1], RAMP_STEPS)


@pytest.mark.mpi
@pytest.mark.slow
@needs_mpi
def test_small_on_any_number_of_ranks_gives_the_same_trajectory(tmp_path, corpus):
    """``small`` on the Numba backend, two steps whose batch grows from 2 to 3 micro-batches, on 1 to 4
    ranks. No validation loss (small's default evaluates at the end: most of a run's time, and no part
    of the trajectory); one Numba thread per rank, as ranks that share two cores should run."""
    args = ["--preset", "small", "--backend", "numba", "--batch-ramp", "0:2,512:3", "--micro-batch", "1",
            "--steps", "2", "--quiet", "--eval-every", "0", "--data", str(corpus)]
    trajectories = {}
    for world in (1, 2, 3, 4):
        out = tmp_path / f"small-r{world}"
        _run([*_mpiexec(world), *LOCKSTEP, "train", *args, "--out", str(out)], env=dict(MPI_ENV, NUMBA_NUM_THREADS="1"))
        trajectories[world] = (out / "trajectory.jsonl").read_bytes()
    assert len(trajectories[1].splitlines()) == 2
    assert all(t == trajectories[1] for t in trajectories.values()), "the world size changed a trajectory"


def _launch_killed(argv: list[str], world: int, nth_update: int) -> None:
    """``lockstep argv`` on ``world`` ranks; rank 0 SIGKILLs itself before its ``nth_update``-th update
    (``step.apply_update``), and hydra then ends the other ranks."""
    proc = killpoint.launch("lockstep.train.step:apply_update", "before", nth_update, "", argv,
                            launcher=_mpiexec(world), env=MPI_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=killpoint.HANG_GUARD_S)
    assert proc.returncode != 0, f"not killed:\n{err.decode()[-3000:]}"


@pytest.mark.mpi
@needs_mpi
def test_elastic_resume_on_another_number_of_ranks_ends_with_the_same_chain(tmp_path, corpus, ramp_runs):
    """Started on 4 ranks and killed in step 3; resumed on 2 (killed again in step 5, then resumed on 3),
    on 3 and on 1: every ending is the uninterrupted 4-rank run, file for file."""
    ref = ramp_runs[4]
    want = (ref / "trajectory.jsonl").read_bytes()
    chain = json.loads((ref / "commitment.json").read_text())["chain_hash"]

    killed = tmp_path / "killed-on-4"
    _launch_killed(["train", *RAMP_ARGS, "--steps", str(RAMP_STEPS), "--data", str(corpus), "--out", str(killed)],
                   world=4, nth_update=3)
    assert [r["step"] for r in read_trajectory(killed, Strictness.LIVE)] == [1, 2]
    assert [s for s, _ in ckpt.list_checkpoints(killed)] == [2]

    resume = ["train", "--resume", None, "--data", str(corpus), "--backend", "spec", "--quiet", "--checkpoint-every", "2"]
    ends = {}
    for name, hops in (("2 then 3", [2, 3]), ("3", [3]), ("1", [1])):
        run = tmp_path / name.replace(" ", "-")
        shutil.copytree(killed, run)
        argv = [str(run) if a is None else a for a in resume]
        for world in hops[:-1]:  # killed before the update of step 5 (the third of this resume)
            _launch_killed(argv, world, nth_update=3)
            assert [r["step"] for r in read_trajectory(run, Strictness.LIVE)] == [1, 2, 3, 4]
        _run([*_mpiexec(hops[-1]), *LOCKSTEP, *argv], env=MPI_ENV)
        ends[name] = run
    for name, run in ends.items():
        assert (run / "trajectory.jsonl").read_bytes() == want, f"resumed on {name} rank(s): another trajectory"
        assert json.loads((run / "commitment.json").read_text())["chain_hash"] == chain, name
    sizes = [json.loads(x)["world_size"] for x in (ends["2 then 3"] / "metrics.jsonl").read_text().splitlines()]
    assert sizes == [4, 4, 2, 2, 3, 3]  # steps 1-2 on 4 ranks, 3-4 on 2 (killed in 5), 5-6 on 3


def _train_cmd(out, corpus, steps):
    return [*LOCKSTEP, "train", *TINY_ARGS, "--steps", str(steps), "--checkpoint-every", "2",
            "--data", str(corpus), "--out", str(out)]


# (what is wrapped, when, the Nth matching call, substring of its first argument, where the kill lands);
# each kill interrupts the run the previous ones left behind
KILLS = [
    ("os:replace", "before", 1, "recipe.json", "start-up: recipe.json not yet in place"),
    ("os:replace", "after", 1, "recipe.json", "start-up: recipe.json written, no step yet"),
    ("lockstep.train.step:apply_update", "before", 2, "", "mid-step 2: gradients summed, no update"),
    ("os:replace", "before", 1, "sidecar.json", "mid-checkpoint-write: state file written, no sidecar"),
    ("os:rename", "before", 1, "step-00000004", "mid-checkpoint-write: checkpoint 4 complete, not renamed"),
    ("os:rename", "after", 1, "step-00000004", "checkpoint 4 renamed, its folder not yet fsynced"),
    # from outside: the child pauses as step 5 begins; once the trajectory holds step 4 (the
    # observed event) the test sends SIGKILL, which lands while step 5 is under way
    ("lockstep.train.step:apply_update", "pause", 1, "", "mid-step 5, killed from outside"),
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
    base = make_recipe(cfg, tcfg, m, "data", 42)
    h = genesis(base)
    assert genesis(make_recipe(cfg, tcfg, m, "data", 43)) != h
    assert genesis(make_recipe(cfg, dataclasses.replace(tcfg, micro_batch=2), m, "data", 42)) != h  # the tree's shape
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
    assert genesis(make_recipe(cfg, tcfg, Manifest.load(copy), "data", 42)) != h


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

    def poisoned(params, windows, cfg, backend, n_global=None, **how):
        loss, grads = real(params, windows, cfg, backend, n_global=n_global, **how)
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


def test_recorded_world_sizes_take_the_last_record_of_a_step_and_skip_bad_lines(tmp_path):
    from lockstep.formats.rundir import recorded_world_sizes

    lines = [json.dumps({"step": 1, "world_size": 4}), "{torn", json.dumps({"step": 2, "world_size": 4}),
             json.dumps({"step": 2, "world_size": 2}),  # step 2 again, after a resume on 2 ranks
             json.dumps({"step": 3, "world_size": "4"}), json.dumps({"step": [3], "world_size": 3}), "[]"]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert recorded_world_sizes(tmp_path, [1, 2, 3, 9]) == {1: 4, 2: 2}
    assert recorded_world_sizes(tmp_path / "elsewhere", [1]) == {}
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "metrics.jsonl").mkdir()
    assert recorded_world_sizes(tmp_path, [1]) == {}
