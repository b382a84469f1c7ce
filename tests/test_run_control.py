"""Controlling a run from the command line: signals, resume targets, refused flags, the data folder.

Every interruption happens at an observed event (``killpoint``: the child pauses at a
named call until the test has sent its signal), and every resumed run is compared with
an uninterrupted one hash for hash.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import killpoint
import pytest
from have_mpi import needs_mpi
from killpoint import Paused, read_until

from lockstep.contract.capabilities import Capabilities
from lockstep.cli import main
from lockstep.formats import checkpoint as ckpt
from lockstep.formats.trajectory import Strictness, read_trajectory
from lockstep.train.trainer import train

LOCKSTEP = [sys.executable, "-m", "lockstep.cli"]
TINY = ["--preset", "tiny", "--backend", "spec", "--batch", "6", "--micro-batch", "2", "--quiet"]
APPLY_UPDATE = "lockstep.train.step:apply_update"  # called once per step, after the gradients are summed
MPI_ENV = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1")


def _run(args, launcher=(), env=None):
    r = subprocess.run([*launcher, *LOCKSTEP, *map(str, args)], capture_output=True, text=True,
                       timeout=killpoint.HANG_GUARD_S, env=env)
    assert r.returncode == 0, f"{args}\nstdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-4000:]}"
    return r


def _new_run(out, corpus, steps, *extra):
    return ["train", *TINY, "--steps", str(steps), "--data", str(corpus), "--out", str(out), *map(str, extra)]


def _resume(out, corpus, *extra):
    return ["train", "--resume", str(out), "--data", str(corpus), "--backend", "spec", "--quiet", *map(str, extra)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus):
    """An uninterrupted 6-step run: its trajectory is what every interrupted run must end with."""
    out = tmp_path_factory.mktemp("control-ref") / "run"
    _run(_new_run(out, corpus, 6))
    return read_trajectory(out, Strictness.LIVE)


def _same_as_reference(out, reference):
    assert read_trajectory(out, Strictness.LIVE) == reference  # every field, hash for hash, each step once
    assert json.loads((out / "commitment.json").read_text())["chain_hash"] == reference[-1]["chain_hash"]
    assert not ckpt.incomplete_checkpoints(out)


# ---------------------------------------------------------------------------
# SIGINT / SIGTERM
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_finishes_the_step_checkpoints_and_resume_reaches_the_target(tmp_path, corpus, reference, sig):
    out = tmp_path / "run"
    pause = Paused(tmp_path / "fifos")
    proc = killpoint.launch(APPLY_UPDATE, "pause", 3, "", _new_run(out, corpus, 6, "--checkpoint-every", 4),
                            pause.folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        os.kill(pause.wait(proc), sig)  # step 3 has its gradients; the signal comes before its update
        err = read_until(proc.stderr, "finishing step 3")
        pause.release()
        err += proc.stderr.read()
        assert proc.wait(timeout=killpoint.HANG_GUARD_S) == 128 + sig, err
    finally:
        pause.close()
        proc.kill()
        proc.wait()
    assert f"stopped by {signal.Signals(sig).name} after step 3 of 6" in err
    assert f"resume with: lockstep train --resume {out} --data {corpus}" in err
    assert [r["step"] for r in read_trajectory(out, Strictness.LIVE)] == [1, 2, 3]
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [3]  # not a multiple of 4: written for the stop
    assert not (out / "commitment.json").exists()  # the run has not reached its target

    _run(_resume(out, corpus))  # no --steps: the target the run was started with
    _same_as_reference(out, reference)


@pytest.mark.parametrize("target, nth, match, left", [
    (APPLY_UPDATE, 3, "", "step 3 under way"),
    ("os:rename", 1, "step-00000004", "checkpoint 4 complete in its temporary folder"),
])
def test_second_ctrl_c_stops_at_once_and_damages_nothing(tmp_path, corpus, reference, target, nth, match, left):
    out = tmp_path / "run"
    pause = Paused(tmp_path / "fifos")
    proc = killpoint.launch(target, "pause", nth, match, _new_run(out, corpus, 6, "--checkpoint-every", 2),
                            pause.folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        pid = pause.wait(proc)
        os.kill(pid, signal.SIGINT)
        err = read_until(proc.stderr, "finishing step")  # the first one was taken
        os.kill(pid, signal.SIGINT)  # the child is still paused: only "at once" lets it exit
        err += proc.stderr.read()
        assert proc.wait(timeout=killpoint.HANG_GUARD_S) == 130, err
    finally:
        pause.close()
        proc.kill()
        proc.wait()
    assert f"stopped at once; resume with: lockstep train --resume {out} --data {corpus}" in err, err
    assert "Traceback" not in err
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [2], left
    ckpt.load_checkpoint(out)  # every digest verified
    assert not ckpt.incomplete_checkpoints(out), "an interrupted save leaves no temporary folder behind"

    _run(_resume(out, corpus))
    _same_as_reference(out, reference)


@pytest.mark.mpi
@needs_mpi
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step(tmp_path, corpus):
    mpiexec = ["mpiexec", "-n", "2"]
    ref = tmp_path / "ref"
    _run(_new_run(ref, corpus, 4), launcher=mpiexec, env=MPI_ENV)

    out = tmp_path / "run"
    pause = Paused(tmp_path / "fifos")  # rank 0 pauses; rank 1 waits for it in the all-reduce
    proc = killpoint.launch(APPLY_UPDATE, "pause", 2, "", _new_run(out, corpus, 4, "--checkpoint-every", 4),
                            pause.folder, launcher=mpiexec, env=MPI_ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        os.kill(pause.wait(proc), signal.SIGINT)  # to rank 0 only
        err = read_until(proc.stderr, "finishing step 2")
        pause.release()
        err += proc.stderr.read()
        assert proc.wait(timeout=killpoint.HANG_GUARD_S) != 0
    finally:
        pause.close()
        proc.kill()
        proc.wait()
    assert err.count("stopped by SIGINT after step 2 of 4") == 1, err  # said once, by rank 0
    assert f"resume with: mpiexec -n 2 lockstep train --resume {out} --data {corpus}" in err
    assert "Traceback" not in err
    assert [r["step"] for r in read_trajectory(out, Strictness.LIVE)] == [1, 2]
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [2]

    _run(_resume(out, corpus), launcher=mpiexec, env=MPI_ENV)
    _same_as_reference(out, read_trajectory(ref, Strictness.LIVE))


# ---------------------------------------------------------------------------
# Resume targets
# ---------------------------------------------------------------------------


def test_resume_continues_to_the_recorded_target_and_steps_or_tokens_extend_it(tmp_path, corpus, reference, capsys):
    out = tmp_path / "run"
    _run(_new_run(out, corpus, 3))
    before = (out / "trajectory.jsonl").read_bytes()
    assert main(_resume(out, corpus)) == 0  # already at its target: nothing to do
    assert "already at its target step 3" in capsys.readouterr().out
    assert (out / "trajectory.jsonl").read_bytes() == before

    assert main(_resume(out, corpus, "--steps", 5)) == 0
    assert read_trajectory(out, Strictness.LIVE) == reference[:5]  # the target is not part of the run's definition
    assert main(_resume(out, corpus, "--tokens", reference[5]["tokens"])) == 0
    _same_as_reference(out, reference)

    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert main(_resume(out, corpus, "--steps", 4)) == 1
    err = capsys.readouterr().err
    assert "checkpoint at step 6" in err and len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_run_without_a_checkpoint_resumes_from_its_initial_state(tmp_path, corpus, reference):
    out = tmp_path / "run"
    proc = killpoint.launch(APPLY_UPDATE, "before", 3, "", _new_run(out, corpus, 6, "--checkpoint-every", 50),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.wait(timeout=killpoint.HANG_GUARD_S) == -signal.SIGKILL, proc.stderr.read()
    assert [r["step"] for r in read_trajectory(out, Strictness.LIVE)] == [1, 2] and not ckpt.list_checkpoints(out)
    r = _run(_resume(out, corpus))
    assert "from its initial state" in r.stdout
    _same_as_reference(out, reference)


@pytest.fixture
def run3(tmp_path, corpus):
    out = tmp_path / "run3"
    _run(_new_run(out, corpus, 3))
    return out


@pytest.mark.parametrize("flags, named", [
    (["--preset", "small"], "--preset"),
    (["--seed", "7"], "--seed"),
    (["--micro-batch", "3"], "--micro-batch"),
    (["--batch", "4"], "--batch"),
    (["--batch-ramp", "0:6,100:8"], "--batch-ramp"),
    (["--no-quantize"], "--no-quantize"),
    (["--out", "elsewhere"], "--out"),
])
def test_resume_refuses_flags_it_cannot_honour(run3, corpus, capsys, flags, named):
    before = {p.name: p.read_bytes() for p in run3.iterdir() if p.is_file()}
    assert main(_resume(run3, corpus, "--steps", 4, *flags)) == 1
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1, err
    assert {p.name: p.read_bytes() for p in run3.iterdir() if p.is_file()} == before


def test_resume_accepts_flags_equal_to_the_recipe(run3, corpus):
    assert main(_resume(run3, corpus, "--steps", 4, "--preset", "tiny", "--seed", 42, "--micro-batch", 2,
                        "--batch", 6, "--checkpoint-every", 1)) == 0
    assert [r["step"] for r in read_trajectory(run3, Strictness.LIVE)] == [1, 2, 3, 4]


# ---------------------------------------------------------------------------
# Bad flags: one line, exit 1, nothing written
# ---------------------------------------------------------------------------

BAD_FLAGS = [
    (["--steps", "0"], "--steps"),
    (["--steps", "-5"], "--steps"),
    (["--steps", "two"], "--steps"),
    (["--tokens", "0"], "--tokens"),
    (["--checkpoint-every", "0"], "--checkpoint-every"),
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**64)], "--seed"),
    (["--batch", "0"], "--batch"),
    (["--micro-batch", "0"], "--micro-batch"),
    (["--preset", "huge"], "--preset"),
    (["--backend", "abacus"], "--backend"),
    (["--data", "no/such/folder"], "no/such/folder"),
]


@pytest.mark.parametrize("flags, named", BAD_FLAGS)
def test_bad_flags_are_one_line_exit_1_and_write_nothing(tmp_path, capsys, flags, named):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "3", "--out", str(out), *flags]) == 1  # the last value of a flag wins
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and named in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("ramp, says", [
    ("5:8", "must start at 0"),
    ("0:8,0:9", "increase"),
    ("0:0", "SEQUENCES >= 1"),
    ("0-8", "FROM_TOKENS:SEQUENCES"),
    ("0:8,x:9", "FROM_TOKENS:SEQUENCES"),
])
def test_bad_batch_ramps_are_one_line_exit_1_and_write_nothing(tmp_path, capsys, ramp, says):
    out = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--backend", "spec", "--batch-ramp", ramp, "--steps", "2",
                 "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--batch-ramp" in err and says in err, err
    assert not out.exists()


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("flags", [["--steps", "0"], ["--data", "no/such/folder"]])
def test_bad_flags_under_mpiexec_are_said_once(tmp_path, flags):
    out = tmp_path / "run"
    r = subprocess.run(["mpiexec", "-n", "2", *LOCKSTEP, "train", *TINY, "--out", str(out), *flags],
                       capture_output=True, text=True, timeout=killpoint.HANG_GUARD_S, env=MPI_ENV)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("lockstep train") and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()


def test_train_never_falls_back_to_the_spec_backend_silently(tmp_path, capsys, monkeypatch):
    import lockstep.backends as backends

    real = backends.get_backend
    out = tmp_path / "run"
    for failure in (backends.BackendUnavailable("backend 'numba' needs the Python package 'numba'"),
                    ImportError("Numba needs NumPy 2.3 or less")):
        def broken(name, failure=failure):
            if name == "numba":
                raise failure
            return real(name)

        monkeypatch.setattr(backends, "get_backend", broken)
        assert main(["train", "--preset", "tiny", "--steps", "1", "--quiet", "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert "--backend spec" in err and "slower" in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()


# ---------------------------------------------------------------------------
# Kernel compilation is announced while it happens
# ---------------------------------------------------------------------------


def test_first_step_announces_kernel_compilation(tmp_path, corpus, monkeypatch):
    numba = pytest.importorskip("numba")
    import lockstep.backends as backends
    from lockstep.backends import Backend
    from lockstep.backends.numba_cpu import watch_compilation

    @numba.njit(cache=False)  # new in every test run, so step 1 compiles it
    def first_element(a):
        return a.ravel()[0]

    spec = backends.get_backend("spec")

    def add(a, b):
        first_element(a)
        return spec.add(a, b)

    fake = Backend("numba", ops={**spec.ops, "add": add}, capabilities=Capabilities(watch_compilation=watch_compilation))
    monkeypatch.setattr(backends, "get_backend", lambda name: fake)
    out = tmp_path / "run"
    said = []  # each message with the number of steps recorded when it was said

    def log(msg):
        said.append((msg, len(read_trajectory(out, Strictness.LIVE))))

    from lockstep.formats.config import preset, train_preset

    train(out, cfg=preset("tiny"), tcfg=train_preset("tiny", batch_ramp=((0, 6),), micro_batch=2), data=str(corpus),
          steps=2, backend_name="numba", progress=False, log=log)
    compiling = [n for msg, n in said if msg.startswith("compiling the numba kernels")]
    compiled = [msg for msg, _ in said if msg.startswith("compiled ")]
    assert compiling == [0]  # once, while step 1 ran
    assert len(compiled) == 1 and re.match(r"compiled [1-9]\d* kernels? in \d+\.\d s", compiled[0]), compiled


def test_a_kernel_that_fails_to_compile_names_the_way_out():
    numba = pytest.importorskip("numba")
    from lockstep.backends import BackendUnavailable
    from lockstep.backends.numba_cpu import watch_compilation

    @numba.njit(cache=False)
    def bad(a):
        return a.no_such_attribute

    with pytest.raises(BackendUnavailable, match="--backend spec"):
        with watch_compilation(lambda: None):
            bad(1.0)


# ---------------------------------------------------------------------------
# The data folder: inside the run, or named with --data
# ---------------------------------------------------------------------------


def test_resume_takes_data_from_a_moved_folder_and_refuses_other_data(tmp_path, corpus, capsys):
    data = tmp_path / "data"
    shutil.copytree(corpus, data)
    out = tmp_path / "run"
    _run(_new_run(out, data, 2))
    moved = tmp_path / "moved"
    os.rename(data, moved)

    assert main(["train", "--resume", str(out), "--backend", "spec", "--quiet", "--steps", "3"]) == 1
    err = capsys.readouterr().err
    assert "outside the run directory" in err and "--data" in err and len(err.strip().splitlines()) == 1, err

    other = tmp_path / "other"
    shutil.copytree(moved, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["description"] = "another data set"
    (other / "manifest.json").write_text(json.dumps(manifest))
    assert main(["train", "--resume", str(out), "--data", str(other), "--backend", "spec", "--quiet",
                 "--steps", "3"]) == 1
    err = capsys.readouterr().err
    assert "not the recipe's" in err and "--data" in err, err

    assert main(["train", "--resume", str(out), "--data", str(moved), "--backend", "spec", "--quiet",
                 "--steps", "3"]) == 0
    assert [r["step"] for r in read_trajectory(out, Strictness.LIVE)] == [1, 2, 3]


def test_resume_does_not_follow_a_manifest_symlinked_out_of_the_run(tmp_path, capsys):
    from lockstep.formats.config import preset, train_preset

    out = tmp_path / "run"
    train(out, cfg=preset("tiny"), tcfg=train_preset("tiny", batch_ramp=((0, 4),), micro_batch=4), steps=2,
          backend_name="spec", checkpoint_every=2, progress=False, log=lambda *a: None)  # default corpus: run/data
    outside = tmp_path / "outside-manifest.json"
    shutil.copy(out / "data" / "manifest.json", outside)  # the same bytes: only the location is wrong
    (out / "data" / "manifest.json").unlink()
    os.symlink(outside, out / "data" / "manifest.json")
    assert main(["train", "--resume", str(out), "--backend", "spec", "--quiet", "--steps", "3"]) == 1
    err = capsys.readouterr().err
    assert "outside" in err and "--data" in err, err
    assert [r["step"] for r in read_trajectory(out, Strictness.LIVE)] == [1, 2]


def _verify_text(run, capsys, *extra) -> tuple[int, str]:
    code = main(["audit", "verify", str(run), "--no-batches", *map(str, extra)])
    return code, capsys.readouterr().out


def test_audit_reads_data_outside_the_run_only_from_data(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    _run(_new_run(out, corpus, 2))  # the recipe records the absolute path of the corpus
    code, text = _verify_text(out, capsys)
    assert code == 2 and "outside the run directory" in text and "--data" in text, text
    code, text = _verify_text(out, capsys, "--data", corpus)
    assert code == 0, text
    assert main(["audit", "replay", str(out), "--step", "2", "--quiet"]) == 1
    assert "--data" in capsys.readouterr().err
    assert main(["audit", "replay", str(out), "--step", "2", "--quiet", "--data", str(corpus)]) == 0


def test_a_recipe_naming_a_path_elsewhere_learns_nothing_about_it(tmp_path, corpus, capsys):
    """A hostile recipe names a path on the auditor's machine: whether it exists must not show."""
    out = tmp_path / "run"
    _run(_new_run(out, corpus, 2))
    decoy = tmp_path / "decoy"
    recipe = json.loads((out / "recipe.json").read_text())
    recipe["data"]["folder"] = str(decoy)
    (out / "recipe.json").write_text(json.dumps(recipe))
    reports = []
    for exists in (False, True):
        if exists:
            shutil.copytree(corpus, decoy)
        code, text = _verify_text(out, capsys)
        reports.append((code, [line for line in text.splitlines() if "data" in line]))
        assert main(["audit", "replay", str(out), "--step", "1", "--quiet"]) == 1
        reports.append(capsys.readouterr().err)
    assert reports[0] == reports[2] and reports[1] == reports[3]
    assert any("outside the run directory" in line for line in reports[0][1])


# ---------------------------------------------------------------------------
# Smaller things
# ---------------------------------------------------------------------------


def test_python_dash_m_lockstep_runs_the_command():
    r = subprocess.run([sys.executable, "-m", "lockstep", "version"], capture_output=True, text=True,
                       timeout=killpoint.HANG_GUARD_S)
    assert r.returncode == 0 and "SPEC_VERSION" in r.stdout, r.stderr


@pytest.mark.parametrize("command", [[], ["train"], ["data"], ["data", "ingest"], ["audit"], ["audit", "replay"],
                                     ["conformance"]])
def test_help_texts_are_plain_and_every_option_has_help(command, capsys):
    assert main([*command, "--help"]) == 0
    text = capsys.readouterr().out
    assert "``" not in text and "`" not in text
    lines = text.splitlines()
    for i, line in enumerate(lines):  # an option alone on its line must have its help on the next one
        stripped = line.strip()
        if line.startswith("  -") and len(stripped.split()) <= 2 and "," not in stripped:
            assert i + 1 < len(lines) and lines[i + 1].startswith(" " * 10), f"{command}: {line!r} has no help"
    if command == ["train"]:
        assert "seed of the initial weights" in text


def test_every_test_dependency_is_in_the_test_extra_and_all_includes_it():
    import ast
    import importlib.metadata
    import tomllib

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def names(requirements):
        return {r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in requirements}

    modules = set()
    for path in (root / "tests").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module.split(".")[0])
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                modules.add(node.args[0].value.split(".")[0])
    distributions = importlib.metadata.packages_distributions()
    local = {"lockstep"} | {p.stem for folder in ("tests", "benchmarks") for p in (root / folder).glob("*.py")}
    allowed = names(extras["all"]) | names(project["dependencies"])
    # hardware, benchmark and transformers extras (too large for `all`): their tests skip with a reason
    # where the package is absent
    optional = names(extras["cuda"]) | names(extras["cuda12"]) | names(extras["bench"]) | names(extras["hf"])
    missing = set()
    for m in modules - set(sys.stdlib_module_names) - local:
        dists = {d.lower() for d in distributions.get(m, [m])}
        provided_by_optional = any(o == m or o.startswith(m + "-") for o in optional)  # cupy: cupy-cuda13x
        if not dists & (allowed | optional) and not provided_by_optional:
            missing |= dists
    assert not missing, f"tests import {sorted(missing)} but the 'all' extra lacks them"
    assert names(extras["test"]) <= names(extras["all"])
    assert {"pytest", "hypothesis", "tokenizers", "mpmath"} <= names(extras["test"])


def test_readme_commands_write_only_into_ignored_folders():
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    blocks = readme.split("```")[1::2]
    commands = [line for block in blocks for line in block.splitlines() if "lockstep" in line]
    outs = []
    for line in commands:
        words = line.split("#")[0].split()
        outs += [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--out", "--png")]
    assert outs, "the README shows no command with --out"
    ignored = [line.strip().rstrip("/") for line in (root / ".gitignore").read_text().splitlines()]
    assert "runs" in ignored
    assert all(o.startswith("runs/") for o in outs), outs
