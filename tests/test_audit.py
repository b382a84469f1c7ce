"""The audit: replays of 1-4 rank runs on one process (no world size needed), and every kind of tampering named in the issue.

One shared corpus and one 4-step single-rank run (checkpoints at 2 and 4) are made
once; each tampering test works on its own copy. Runs of 2, 3 and 4 ranks come
from ``mpiexec`` (oversubscribed on 2 cores) and have 3 steps (checkpoints at 2, 3).
"""

import hashlib
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from forge import read_traj as _traj
from forge import rewrite_sidecar as _forge_sidecar
from forge import write_traj as _write_traj
from have_mpi import NO_MPI, have_mpi

from lockstep.audit.certificate import (consistency_problems, generate_keypair, make_certificate,
                                        recheck_certificate, sign_certificate, signature_problem,
                                        write_certificate)
from lockstep.audit.merge import merge_certificates, plot_coverage
from lockstep.audit.plan import check_plan, coverage, plan_audit
from lockstep.audit.replay import ReplayError, replay_step, replay_steps
from lockstep.audit.verify import verify_run
from lockstep.cli import main as lockstep_main
from lockstep.fsio import json_bytes
from lockstep.fsio.safetensors import read_safetensors
from lockstep.spec import hashing
from lockstep.formats import checkpoint as ckpt
from lockstep.formats.config import preset, train_preset

TINY = ["--preset", "tiny", "--backend", "spec", "--batch", "6", "--micro-batch", "2", "--quiet"]


def _cryptography():
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return False
    return True


needs_crypto = pytest.mark.skipif(not _cryptography(), reason="signing needs the cryptography package")


@pytest.fixture(scope="module")
def run1(tmp_path_factory, corpus):
    """A 4-step single-rank tiny run, checkpoints at steps 2 and 4 (trained in this process)."""
    import dataclasses

    from lockstep.train.trainer import train

    out = tmp_path_factory.mktemp("audit-run1") / "run"
    tcfg = dataclasses.replace(train_preset("tiny"), micro_batch=2, batch_ramp=((0, 6),))
    train(out, cfg=preset("tiny"), tcfg=tcfg, steps=4, checkpoint_every=2, progress=False,
          log=lambda *a, **k: None)  # the default corpus, inside the run: an auditor needs no --data
    return out


_MPI_RUNS: dict[int, Path] = {}


@pytest.fixture(scope="module")
def mpi_run(tmp_path_factory, corpus):
    def make(world: int) -> Path:
        if world not in _MPI_RUNS:
            out = tmp_path_factory.mktemp(f"audit-run{world}") / "run"
            env = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1")
            r = subprocess.run(["mpiexec", "-n", str(world), sys.executable, "-m", "lockstep.cli", "train", *TINY,
                                "--steps", "3", "--checkpoint-every", "2", "--out", str(out)],
                               capture_output=True, text=True, timeout=600, env=env)
            assert r.returncode == 0, r.stderr[-3000:]
            _MPI_RUNS[world] = out
        return _MPI_RUNS[world]

    return make


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst, symlinks=True)
    return dst


def _cli(*args) -> int:
    return lockstep_main(["audit", *map(str, args)])


def _forge_chain(run: Path, recs: list[dict], from_step: int) -> list[dict]:
    """Recompute every chain hash from ``from_step`` on, and the commitment, as a careful forger would."""
    from lockstep.formats.recipe import genesis, load_recipe

    h = genesis(load_recipe(run)) if from_step == 1 else recs[from_step - 2]["chain_hash"]
    for r in recs[from_step - 1:]:
        h = r["chain_hash"] = hashing.record_chain_hash(h, r)
    _write_traj(run, recs)
    com = json.loads((run / "commitment.json").read_text())
    com["chain_hash"] = h
    (run / "commitment.json").write_bytes(json_bytes(com))
    return recs


# ---------------------------------------------------------------------------
# Honest runs: verify passes, replays of random steps match on one process
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_replay_random_step_matches(world, run1, mpi_run, monkeypatch):
    if world > 1 and not have_mpi():
        pytest.skip(NO_MPI)
    run = run1 if world == 1 else mpi_run(world)
    rep = verify_run(run)
    assert rep.ok, rep.format()
    assert rep.checkpoints_verified

    from lockstep.spec import tree

    alive = []
    real_parts = tree.TreeFolder.parts
    monkeypatch.setattr(tree.TreeFolder, "parts", lambda self: alive.append((self.m, self.max_alive))
                        or real_parts(self))
    n = rep.steps
    step = random.Random(2024 + world).randint(1, n)
    res = replay_step(run, step, "spec")
    assert res.ok, res.format()
    assert step in res.targets and res.check(step).world_size == world  # as metrics.jsonl records it
    assert f"trained on {world} rank(s)" in res.format()
    assert res.check(step).replayed["chain_hash"] == _traj(run)[step - 1]["chain_hash"]
    # one process, no world size: never more sums alive than the tree's depth + 1 (M = 3 here)
    assert alive and all(m == 3 and most <= tree.depth(m) + 1 for m, most in alive)


def test_cli_verify_and_replay_exit_codes(run1, tmp_path, capsys):
    assert _cli("verify", run1) == 0
    assert "VALID" in capsys.readouterr().out
    assert _cli("verify", tmp_path / "nowhere") == 1
    assert _cli("replay", run1, "--step", "9", "--backend", "spec") == 1  # no such step: an error, not a mismatch
    assert "steps 1..4" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Tampering, one test each
# ---------------------------------------------------------------------------


def _tensor_offset(path: Path, name: str) -> int:
    """Byte offset in a safetensors file of the first data byte of tensor ``name``."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return 8 + n + json.loads(raw[8 : 8 + n])[name]["data_offsets"][0]


def test_flipped_bit_in_checkpoint(run1, tmp_path, capsys):
    run = _copy(run1, tmp_path)
    state = run / "checkpoints" / "step-00000002" / "state.safetensors"
    name = "adam_v/" + sorted(k[len("param/"):] for k in read_safetensors(state)[0] if k.startswith("param/"))[0]
    with open(state, "r+b") as f:
        f.seek(_tensor_offset(state, name) + 5)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))

    rep = verify_run(run, batches=False)
    assert not rep.ok
    bad = [f for f in rep.errors if f.check == "checkpoint"]
    assert len(bad) == 1 and bad[0].step == 2 and bad[0].tensor == name and "state.safetensors" in bad[0].path
    assert _cli("verify", run, "--no-batches") == 2
    assert name in capsys.readouterr().out

    # the replay refuses the corrupt checkpoint and says so; only when asked does it start earlier
    res = replay_step(run, 3, "spec")
    assert not res.ok and res.checks == []
    assert any("step-00000002" in d and name in d for d in res.damaged)
    res = replay_step(run, 3, "spec", from_earlier=True)
    assert res.ok, res.format()
    assert res.checks[0].start == 0 and any("step-00000002" in d and name in d for d in res.skipped_damaged)


def test_trajectory_edit_with_chain_recomputed(run1, tmp_path):
    # (a) step 3 (no checkpoint) gets another state root; every later hash, the commitment and the
    #     sidecar of checkpoint 4 are recomputed: the chain verifies, only a replay can tell.
    run = _copy(run1, tmp_path)
    recs = _traj(run)
    recs[2]["state_root"] = hashlib.sha256(b"forged").hexdigest()
    recs = _forge_chain(run, recs, 3)
    _forge_sidecar(run, 4, chain_hash=recs[3]["chain_hash"])
    rep = verify_run(run, batches=False)
    assert rep.ok, rep.format()  # self-consistent forgery
    res = replay_step(run, 3, "spec")
    assert not res.ok
    c = res.check(3)
    assert c.differs == ["state_root", "chain_hash"] and c.published["state_root"] == recs[2]["state_root"]
    assert "no checkpoint of step 3" in c.note
    assert _cli("replay", run, "--step", "4", "--quiet", "--backend", "spec") == 2  # from checkpoint 2: stops at step 3

    # (b) the same edit at a checkpointed step (4), the sidecar left alone: verify already sees it,
    #     and the replay shows the checkpoint agrees with the replay, not with the trajectory.
    run_b = _copy(run1, tmp_path / "b")
    recs = _traj(run_b)
    recs[3]["state_root"] = hashlib.sha256(b"forged").hexdigest()
    _forge_chain(run_b, recs, 4)
    rep = verify_run(run_b, batches=False)
    msgs = [(f.check, f.step) for f in rep.errors]
    assert ("checkpoint", 4) in msgs and not any(f.check == "chain" for f in rep.errors)
    res = replay_step(run_b, 4, "spec")
    assert res.check(4).differs == ["state_root", "chain_hash"]
    assert "equals the checkpoint of step 4" in res.check(4).note

    # (c) checkpoint 4 and the trajectory forged together (one weight changed, every digest redone):
    #     the replay names the tensor, its first differing chunk and element.
    run_c = _copy(run1, tmp_path / "c")
    c4 = ckpt.load_checkpoint(run_c, 4)
    tensors = {k: np.array(v) for k, v in c4.tensors.items()}
    target = sorted(k for k in tensors if k.startswith("param/"))[-1]
    tensors[target].reshape(-1)[7] = np.float32(0.125)
    side = {k: v for k, v in c4.sidecar.items() if k not in ckpt.RESERVED_KEYS}
    shutil.rmtree(run_c / "checkpoints" / "step-00000004")
    ckpt.save_checkpoint(run_c, 4, tensors, side)
    recs = _traj(run_c)
    recs[3]["state_root"] = hashing.state_root(tensors)
    recs = _forge_chain(run_c, recs, 4)
    _forge_sidecar(run_c, 4, chain_hash=recs[3]["chain_hash"])
    assert verify_run(run_c, batches=False).ok
    res = replay_step(run_c, 4, "spec")
    diffs = res.check(4).tensor_diffs
    assert [d.name for d in diffs] == [target]
    assert diffs[0].first_chunk == 0 and diffs[0].first_element == 7 and diffs[0].published_value == "0x3E000000"


def test_swapped_data_shard(run1, corpus, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(corpus, data)
    a, b = data / "math" / "00000.tokens.npy", data / "math" / "00001.tokens.npy"
    tmp = data / "swap.tmp"
    os.replace(a, tmp), os.replace(b, a), os.replace(tmp, b)

    rep = verify_run(run1, data=data)
    bad = [f for f in rep.errors if f.check == "data"]
    # two shards of different lengths swapped: refused on the declared length, before either is hashed
    assert len(bad) == 1 and "00000.tokens.npy" in bad[0].message and "the file was altered" in bad[0].message
    with pytest.raises(ReplayError, match="00000.tokens.npy"):
        replay_step(run1, 1, "spec", data=data)
    assert _cli("replay", run1, "--step", "1", "--data", data, "--backend", "spec") == 1
    capsys.readouterr()

    # a data folder that verifies in itself (shards listed in another order) is not the run's data
    data2 = tmp_path / "data2"
    shutil.copytree(corpus, data2)
    man = json.loads((data2 / "manifest.json").read_text())
    sh = man["sources"][0]["shards"]
    sh[0], sh[1] = sh[1], sh[0]
    (data2 / "manifest.json").write_text(json.dumps(man))
    rep = verify_run(run1, data=data2)
    assert any(f.check == "data" and "not the recipe's" in f.message for f in rep.errors), rep.format()


@needs_crypto
def test_certificate_claiming_unreproduced_hash(run1, tmp_path, capsys):
    # a run whose step 3 was forged (chain recomputed); the honest replay says mismatch
    run = _copy(run1, tmp_path)
    recs = _traj(run)
    recs[2]["state_root"] = hashlib.sha256(b"forged").hexdigest()
    recs = _forge_chain(run, recs, 3)
    _forge_sidecar(run, 4, chain_hash=recs[3]["chain_hash"])
    honest_key, _ = generate_keypair(tmp_path / "honest")
    liar_key, liar_pub = generate_keypair(tmp_path / "liar")
    res = replay_step(run, 3, "spec")
    cert = sign_certificate(make_certificate(res, auditor="honest"), honest_key)
    assert cert["outcome"] == "mismatch" and signature_problem(cert) is None

    # 1. the signed certificate edited to claim the published hash: the signature catches it
    forged = json.loads(json.dumps(cert))
    forged["steps"][0]["replayed"] = dict(forged["steps"][0]["published"])
    forged["steps"][0].update(match=True, differs=[])
    forged["outcome"] = "match"
    assert consistency_problems(forged) == []
    assert "does not match" in signature_problem(forged)
    write_certificate(tmp_path / "forged.json", forged)
    assert _cli("check", tmp_path / "forged.json") == 2
    assert "REJECTED" in capsys.readouterr().out

    # 2. a colluding auditor signs the same claim with its own key: valid signature, but a
    #    recomputation does not reproduce the claimed hash
    lie = sign_certificate(forged, liar_key)
    assert signature_problem(lie) is None
    problems = recheck_certificate(lie, run, "spec")
    assert any("did not reproduce" in p and "state_root" in p for p in problems)
    write_certificate(tmp_path / "lie.json", lie)
    assert _cli("check", tmp_path / "lie.json", "--pub", liar_pub) == 0  # signed, consistent ...
    assert _cli("check", tmp_path / "lie.json", "--run", run, "--recompute", "--backend", "spec") == 2  # ... and false
    assert "did not reproduce" in capsys.readouterr().out

    # 3. a certificate claiming a match while listing different hashes contradicts itself
    inconsistent = json.loads(json.dumps(cert))
    inconsistent["outcome"] = "match"
    inconsistent["steps"][0]["match"] = True
    assert consistency_problems(inconsistent)


class _CreatesFile:
    """A pickle payload: unpickling it creates ``path`` (so we can tell if anything unpickled it)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickle_instead_of_tensors_is_refused(run1, corpus, tmp_path):
    payload = pickle.dumps(_CreatesFile(tmp_path / "probe"))
    pickle.loads(payload).close()  # the payload is live: loading it does create the file
    assert (tmp_path / "probe").exists()

    marker = tmp_path / "PWNED"
    run = _copy(run1, tmp_path)
    state = run / "checkpoints" / "step-00000002" / "state.safetensors"
    state.write_bytes(pickle.dumps(_CreatesFile(marker)))
    data = tmp_path / "data"
    shutil.copytree(corpus, data)
    np.save(data / "math" / "00000.tokens.npy", np.array([_CreatesFile(marker)], dtype=object), allow_pickle=True)

    rep = verify_run(run, data=data)
    assert any(f.check == "checkpoint" and f.step == 2 and f.path.endswith("state.safetensors") for f in rep.errors)
    assert any(f.check == "data" and "00000.tokens.npy" in f.message for f in rep.errors)
    with pytest.raises(ckpt.CheckpointError, match="state.safetensors"):
        ckpt.load_checkpoint(run, 2)
    with pytest.raises(ReplayError, match="00000.tokens.npy"):
        replay_step(run, 3, "spec", data=data)
    assert not marker.exists()


def test_paths_that_leave_the_run_directory(run1, tmp_path):
    # a recipe whose data folder climbs out of the run
    run = _copy(run1, tmp_path)
    recipe = json.loads((run / "recipe.json").read_text())
    recipe["data"]["folder"] = "../../x"
    (run / "recipe.json").write_text(json.dumps(recipe))
    rep = verify_run(run, batches=False)
    assert any(f.check == "path" and "'..'" in f.message for f in rep.errors), rep.format()
    with pytest.raises(ReplayError, match=r"\.\."):
        replay_step(run, 1, "spec")

    # a checkpoint folder that is a symlink to a folder outside the run
    run2 = _copy(run1, tmp_path / "two")
    outside = tmp_path / "outside-step-2"
    shutil.move(run2 / "checkpoints" / "step-00000002", outside)
    os.symlink(outside, run2 / "checkpoints" / "step-00000002")
    rep = verify_run(run2, batches=False)
    bad = [f for f in rep.errors if f.check == "path"]
    assert len(bad) == 1 and "step-00000002" in bad[0].path and "leaves the run directory" in bad[0].message
    assert 2 not in [s for s, _ in ckpt.list_checkpoints(run2)]
    res = replay_steps(run2, [3], "spec")  # not followed, and said: no start for step 3
    assert not res.ok and any("step-00000002" in d and "symlink" in d for d in res.damaged)
    res = replay_steps(run2, [3], "spec", from_earlier=True)  # asked: from the initial state
    assert res.ok and res.checks[0].start == 0


# ---------------------------------------------------------------------------
# Plan and merge
# ---------------------------------------------------------------------------


def test_acceptance_rule_without_the_command_line(run1, tmp_path):
    from lockstep.audit.accept import check_certificate_file, trusted_keys

    cert = make_certificate(replay_step(run1, 1, "spec"), auditor="a")
    write_certificate(tmp_path / "cert.json", cert)
    verdict = check_certificate_file(tmp_path / "cert.json", run_dir=run1)
    assert verdict.accepted and not verdict.recomputed, verdict.problems
    assert verdict.summary() == "outcome match, steps [1], unsigned"
    recomputed = check_certificate_file(tmp_path / "cert.json", run_dir=run1, recompute=True, backend_name="spec")
    assert recomputed.accepted and recomputed.recomputed, recomputed.problems
    # a file that is not a certificate is a verdict with one problem, not an exception
    (tmp_path / "junk.json").write_text("{")
    junk = check_certificate_file(tmp_path / "junk.json")
    assert junk.cert is None and len(junk.problems) == 1 and not junk.accepted
    # the same certificate against a run whose step 1 was forged (chain redone): it quotes other values
    run = _copy(run1, tmp_path)
    recs = _traj(run)
    recs[0]["loss_bits"], recs[0]["loss"] = "0x3F800000", 1.0
    _forge_chain(run, recs, 1)
    other = check_certificate_file(tmp_path / "cert.json", run_dir=run)
    assert any("quotes published" in p and "loss_bits" in p for p in other.problems), other.problems
    if _cryptography():  # with trusted keys, an unsigned certificate is refused
        _, pub = generate_keypair(tmp_path / "trusted")
        unsigned = check_certificate_file(tmp_path / "cert.json", trusted_keys([str(pub)]))
        assert unsigned.problems == ["unsigned, but signatures by trusted keys are required"]
    assert trusted_keys([]) is None and trusted_keys(None) is None


BEACON = hashlib.sha256(b"a beacon round published after the commitment").hexdigest()


def _keys(n: int) -> list[str]:
    """``n`` distinct public keys (hex) to name auditors by; a plan never needs their private halves."""
    return [hashlib.sha256(b"auditor key %d" % i).hexdigest() for i in range(n)]


def test_auditor_steps_from_a_plan():
    from lockstep.audit.accept import auditor_steps
    from lockstep.audit.plan import PlanError

    keys = _keys(3)
    plan = plan_audit({"chain_hash": hashlib.sha256(b"a run").hexdigest(), "last_step": 40}, keys, BEACON, 1,
                      ["ann", "bo", "cy"])
    bo = next(a for a in plan["auditors"] if a["name"] == "bo")
    assert bo["public_key"] == keys[1]  # names stay with their keys, whatever order the keys are drawn in
    assert auditor_steps(plan, public_key=keys[1]) == bo["steps"] and bo["steps"]
    assert auditor_steps(plan, "bo") == bo["steps"]
    assert auditor_steps(plan, "2") == plan["auditors"][2]["steps"]  # by index
    assert auditor_steps(plan, "bo", keys[1]) == bo["steps"]
    with pytest.raises(PlanError, match="no auditor named 'dee'"):
        auditor_steps(plan, "dee")
    with pytest.raises(PlanError, match="not to 'ann'"):  # a key cannot take another auditor's name
        auditor_steps(plan, "ann", keys[1])
    with pytest.raises(PlanError, match="no auditor with public key"):
        auditor_steps(plan, "bo", _keys(4)[3])


def test_plan_covers_every_step_k_times_with_distinct_auditors(run1):
    commitment = {"chain_hash": hashlib.sha256(b"some run").hexdigest(), "last_step": 101}
    for n_auditors, k in [(1, 1), (3, 2), (7, 3), (5, 5)]:
        plan = plan_audit(commitment, _keys(n_auditors), BEACON, k)
        assert check_plan(plan) == [] and check_plan(plan, BEACON.upper()) == []
        for step, who in coverage(plan).items():
            assert len(who) == k and len(set(who)) == k, step
        loads = [len(a["steps"]) for a in plan["auditors"]]
        assert max(loads) - min(loads) <= 1
        keys = [a["public_key"] for a in plan["auditors"]]
        assert keys == sorted(keys) == sorted(_keys(n_auditors))  # the order is the keys', not the plan maker's
    # deterministic, keyed by the commitment and the beacon, and a forged plan is caught
    plan = plan_audit(commitment, _keys(7), BEACON, 3)
    assert plan == plan_audit(commitment, list(reversed(_keys(7))), BEACON, 3)
    other = plan_audit({"chain_hash": hashlib.sha256(b"other").hexdigest(), "last_step": 101}, _keys(7), BEACON, 3)
    assert [a["steps"] for a in other["auditors"]] != [a["steps"] for a in plan["auditors"]]
    other = plan_audit(commitment, _keys(7), hashlib.sha256(b"another round").hexdigest(), 3)
    assert [a["steps"] for a in other["auditors"]] != [a["steps"] for a in plan["auditors"]]
    assert any("not the" in p and "you named" in p for p in check_plan(other, BEACON))
    swapped = json.loads(json.dumps(plan))
    swapped["auditors"][0]["steps"], swapped["auditors"][1]["steps"] = (swapped["auditors"][1]["steps"],
                                                                        swapped["auditors"][0]["steps"])
    assert any("not the one drawn" in p for p in check_plan(swapped))
    reordered = json.loads(json.dumps(plan))  # the same assignment, handed to other keys
    reordered["auditors"][0]["public_key"], reordered["auditors"][1]["public_key"] = (
        reordered["auditors"][1]["public_key"], reordered["auditors"][0]["public_key"])
    assert any("ascending order of their public keys" in p for p in check_plan(reordered))
    # from a run directory
    plan = plan_audit(run1, _keys(3), BEACON, 2)
    assert plan["commitment"] == _traj(run1)[-1]["chain_hash"] and check_plan(plan) == []
    with pytest.raises(ValueError, match="distinct auditors"):
        plan_audit(run1, _keys(2), BEACON, 3)
    with pytest.raises(ValueError, match="same public key is given twice"):
        plan_audit(run1, _keys(2) * 2, BEACON, 1)
    for bad in ("", "00" * 31, "0" * 65, "zz" * 32):
        with pytest.raises(ValueError, match="beacon must be"):
            plan_audit(run1, _keys(2), bad, 1)


@needs_crypto
def test_merge_reports_planted_disagreement(run1, tmp_path, capsys):
    k1, _ = generate_keypair(tmp_path / "a1")
    k2, _ = generate_keypair(tmp_path / "a2")
    res = replay_step(run1, 4, "spec")
    good = make_certificate(res, auditor="a1")
    write_certificate(tmp_path / "good.json", sign_certificate(good, k1))
    # a second auditor reports another state root for step 4 (a consistent, signed mismatch)
    bad = json.loads(json.dumps(good))
    bad["auditor"] = "a2"
    s4 = [s for s in bad["steps"] if s["step"] == 4][0]
    s4["replayed"]["state_root"] = hashlib.sha256(b"other bits").hexdigest()
    s4["match"], s4["differs"] = False, ["state_root"]
    bad["outcome"] = "mismatch"
    write_certificate(tmp_path / "bad.json", sign_certificate(bad, k2))

    report = merge_certificates([tmp_path / "good.json", tmp_path / "bad.json"])
    assert report.disagreements == [4]
    assert report.steps[3].status == "match" and report.steps[3].count == 2
    assert report.missing_ranges == [(1, 2)] and not report.ok
    png = plot_coverage(report, tmp_path / "coverage.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _cli("merge", tmp_path / "good.json", tmp_path / "bad.json", "--png", tmp_path / "c2.png") == 2
    out = capsys.readouterr().out
    assert "DISAGREE" in out and "missing 1-2" in out
