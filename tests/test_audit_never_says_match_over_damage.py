"""Issue 14, "The audit never says MATCH over damage".

With one flipped byte in a checkpoint, ``audit replay`` silently restarted from step 0
and printed MATCH; with the final checkpoint corrupted it printed MATCH without a
word. A replay that meets a damaged or missing checkpoint says so in its first lines
and its verdict and exits 2, unless ``--from-earlier`` asks it to replay from an
earlier state; a checkpoint at a replayed step is compared with the replayed state;
error hints speak to a command-line user; the default backend is the fastest one
that passes conformance, and the replay says what it will do before doing it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct

import numpy as np
import pytest

from forge import read_traj
from lockstep.audit.replay import replay_step
from lockstep.cli import main
from lockstep.formats import checkpoint as ckpt


def _flip_byte(run, step: int) -> str:
    """Flip one bit in the first parameter tensor of checkpoint ``step``; returns its name."""
    state = run / "checkpoints" / ckpt.step_dirname(step) / "state.safetensors"
    raw = bytearray(state.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    name = sorted(k for k in header if k.startswith("param/"))[0]
    raw[8 + n + header[name]["data_offsets"][0] + 2] ^= 0x04
    state.write_bytes(bytes(raw))
    return name


def _replay(capsys, run, *args):
    code = main(["audit", "replay", str(run), *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.splitlines()


def test_damaged_start_checkpoint_is_said_first_and_stops_the_replay(copy_run, capsys):
    run = copy_run()
    tensor = _flip_byte(run, 2)
    code, out, err = _replay(capsys, run, "--step", "3", "--backend", "spec")
    assert code == 2
    assert out[1].startswith("  DAMAGED: checkpoint step-00000002") and tensor in out[1]
    assert out[-1].startswith("MISMATCH") and "damaged" in out[-1]
    assert any("--from-earlier" in line and "3 steps" in line for line in out)
    assert not any(line.lstrip().startswith("step ") for line in out)  # nothing replayed behind the user's back
    assert err[0].startswith("DAMAGED OR INVALID: checkpoint step-00000002")


def test_from_earlier_replays_from_the_initial_state_and_still_says_why(copy_run, capsys):
    run = copy_run()
    _flip_byte(run, 2)
    code, out, err = _replay(capsys, run, "--step", "3", "--backend", "spec", "--from-earlier")
    assert code == 0
    assert out[1].startswith("  DAMAGED, replayed from an earlier state (--from-earlier): checkpoint step-00000002")
    assert out[-1].startswith("MATCH from an earlier state")
    plan = next(i for i, line in enumerate(err) if line.startswith("replaying 3 step(s), 1..3, from the initial state"))
    steps = [i for i, line in enumerate(err) if line.lstrip().startswith("step ")]
    assert steps and plan < steps[0]  # said before it starts
    assert "about" in err[steps[0]] and "left" in err[steps[0]] and "(1/3)" in err[steps[0]]


@pytest.mark.parametrize("from_earlier", [False, True])
def test_damaged_final_checkpoint_is_never_a_match(copy_run, capsys, from_earlier):
    run = copy_run()
    _flip_byte(run, 4)
    code, out, _ = _replay(capsys, run, "--step", "4", "--backend", "spec", *(["--from-earlier"] if from_earlier else []))
    assert code == 2
    assert out[1].startswith("  DAMAGED: checkpoint step-00000004, at replayed step 4")
    assert out[-1].startswith("MISMATCH")


def test_missing_final_checkpoint_is_said(copy_run, capsys):
    run = copy_run()
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    code, out, _ = _replay(capsys, run, "--step", "4", "--backend", "spec")
    assert code == 2 and "no checkpoint of the last step 4" in out[1]


def test_checkpoint_at_the_replayed_step_is_compared_with_the_replay(copy_run):
    run = copy_run()
    c4 = ckpt.load_checkpoint(run, 4)
    tensors = {k: np.array(v) for k, v in c4.tensors.items()}
    name = sorted(k for k in tensors if k.startswith("param/"))[-1]
    tensors[name].reshape(-1)[3] = np.float32(0.5)  # the published weights differ; the trajectory does not
    extra = {k: v for k, v in c4.sidecar.items() if k not in ckpt.RESERVED_KEYS}
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    ckpt.save_checkpoint(run, 4, tensors, extra)
    assert read_traj(run)[3]["state_root"] != ckpt.load_checkpoint(run, 4).sidecar["state_root"]
    res = replay_step(run, 4, "spec")
    assert not res.ok
    c = res.check(4)
    assert "checkpoint_state_root" in c.differs and "state_root" not in c.differs
    assert [d.name for d in c.tensor_diffs] == [name] and c.tensor_diffs[0].first_element == 3


def test_checkpoint_errors_speak_to_a_command_line_user(copy_run):
    run = copy_run()
    _flip_byte(run, 2)
    with pytest.raises(ckpt.CheckpointError) as exc:
        ckpt.load_checkpoint(run, 2)
    text = str(exc.value)
    assert "lockstep audit replay" in text and "--from-earlier" in text and "lockstep train --resume" in text
    assert "latest_checkpoint(" not in text and "before_step" not in text


@pytest.mark.parametrize("passes, chosen", [(True, "numba"), (False, "spec")])
def test_default_backend_is_the_fastest_that_passes_conformance(honest_run, capsys, monkeypatch, passes, chosen):
    import lockstep.backends as backends
    import lockstep.conformance.runner as runner

    def fake_get_backend(name):
        if name == "numba":  # a stand-in: the spec's ops under the name of a faster backend
            return dataclasses.replace(backends.spec_backend(), name="numba", description="stand-in")
        raise backends.BackendUnavailable(f"backend {name!r} is not installed here")

    monkeypatch.setattr(backends, "FASTEST_FIRST", ("cuda", "numba"))
    monkeypatch.setattr(backends, "get_backend", fake_get_backend)
    monkeypatch.setattr(runner, "run_conformance", lambda be, **k: [runner.OpResult("add", "PASS" if passes else "FAIL")])
    code, out, err = _replay(capsys, honest_run, "--step", "1")
    assert code == 0
    assert f"backend {chosen}" in out[0]
    line = next(line for line in out if line.startswith("  backend: "))
    assert line.startswith(f"  backend: {chosen}")
    assert "cuda: backend 'cuda' is not installed here" in line or passes
    assert passes or "numba: failed conformance on add" in line
    assert any(e.startswith("checking backend numba against the spec") for e in err)
