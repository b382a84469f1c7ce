"""Attack class: a collective audit plan the trainer or an auditor steers, or planned steps one auditor delivers
for another (issue 23, items 2, 3 and 18; issue 34, item 1).

* Grinding: the trainer controls the commitment H_N (re-linking a forged chain costs one
  SHA-256 a step), so a plan drawn from H_N alone could be redrawn until the forged step
  went to a colluding auditor. A plan now needs a public beacon value named after the
  commitment was published, and whoever reads a plan names that value again.
* Names: a trusted auditor signed, with their own key, a certificate claiming another
  planned auditor's name; merge counted it as that auditor's delivery. Planned auditors
  are now their public keys.
* ``audit replay --plan`` replayed a plan made for another run.
* Key subsets: merge redrew a plan from *its own* keys, so a colluder who drew a plan over
  himself alone (or with another redundancy, or over extra keys of his) got every step and
  merge said COMPLETE AND CONSISTENT. A plan is now read with the auditors' whole key set
  and redundancy, as the user names them, and refused for any other.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from lockstep.audit.accept import trusted_keys
from lockstep.audit.certificate import make_certificate, sign_certificate, write_certificate
from lockstep.audit.merge import merge_certificates
from lockstep.audit.plan import PlanError, check_plan, plan_audit
from lockstep.audit.replay import replay_steps
from lockstep.cli import main
from lockstep.fsio import atomic_write_json

BEACON = hashlib.sha256(b"the beacon round the auditors named, published after the commitment").hexdigest()
K1 = ["--redundancy", "1"]  # the redundancy the auditors published with their keys


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def auditors(tmp_path_factory):
    """Three auditors, A, B and C, with Ed25519 key pairs: ``{name: (private PEM, public PEM)}``."""
    pytest.importorskip("cryptography")
    from lockstep.audit.certificate import generate_keypair

    folder = tmp_path_factory.mktemp("keys")
    return {name: generate_keypair(folder / name) for name in "ABC"}


@pytest.fixture(scope="module")
def planned(honest_run, auditors, tmp_path_factory):
    """The plan of the honest run for A and B (redundancy 1) and, per auditor, a replay of its steps."""
    plan = plan_audit(honest_run, trusted_keys([str(auditors[n][1]) for n in "AB"]), BEACON, 1, names=["A", "B"])
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    atomic_write_json(path, plan)
    steps = {a["name"]: a["steps"] for a in plan["auditors"]}
    assert steps["A"] and steps["B"]  # 4 steps, 2 auditors: 2 each
    return path, plan, {n: replay_steps(honest_run, steps[n], "spec") for n in "AB"}


def _cert(tmp_path, result, name: str, key, file: str):
    write_certificate(tmp_path / file, sign_certificate(make_certificate(result, auditor=name), key))
    return str(tmp_path / file)


# ---------------------------------------------------------------------------------------------- item 2: grinding


def test_no_plan_is_drawn_without_a_beacon(honest_run, capsys):
    assert main(["audit", "plan", str(honest_run), "--auditors", "10"]) == 1
    assert "--beacon" in capsys.readouterr().err
    keys = [a for i in range(3) for a in ("--pub", _hex(f"key {i}"))]
    assert main(["audit", "plan", str(honest_run), *keys]) == 1
    err = capsys.readouterr().err
    assert "--beacon" in err and "ground" in err
    assert main(["audit", "plan", str(honest_run), "--beacon", BEACON]) == 1  # and no plan without the keys
    assert "--pub" in capsys.readouterr().err


def test_grinding_the_commitment_no_longer_chooses_who_checks_the_forged_step():
    """The measured attack (10 auditors, redundancy 1): the trainer redraws its commitment, one cheap
    re-link each, until the plan gives the forged step to the colluder. Against a beacon it knows while
    grinding that still works; against rounds published after the commitment the colluder gets the forged
    step about 1 time in 10, as anyone would."""
    keys = [_hex(f"auditor {i}") for i in range(10)]
    colluder, forged, steps = keys[3], 7, 40
    known = _hex("a beacon round published before the commitment")

    def colluder_checks(commitment: str, beacon: str) -> bool:
        plan = plan_audit({"chain_hash": commitment, "last_step": steps}, keys, beacon, 1)
        return forged in next(a["steps"] for a in plan["auditors"] if a["public_key"] == colluder)

    tries = [_hex(f"the forged chain, re-linked with variant {i}") for i in range(500)]
    ground = next(c for c in tries if colluder_checks(c, known))
    assert tries.index(ground) > 0  # it took grinding: the first commitment did not give the step away
    later = [_hex(f"beacon round {j}, published after the commitment") for j in range(100)]
    hits = sum(colluder_checks(ground, b) for b in later)
    assert hits <= 25, hits  # 10 expected by chance; a plan keyed by the commitment alone gives 100


def test_a_plan_drawn_with_another_beacon_is_refused_where_it_is_read(honest_run, planned, auditors, tmp_path,
                                                                       capsys):
    """A trainer who makes the plan itself can name a beacon of its choosing (grinding that instead): merge
    and replay take the beacon value from their user, and refuse the plan."""
    path, plan, results = planned
    certs = [_cert(tmp_path, results[n], n, auditors[n][0], f"{n}.json") for n in "AB"]
    pubs = [a for n in "AB" for a in ("--pub", str(auditors[n][1]))]
    assert main(["audit", "merge", *certs, "--plan", str(path), "--beacon", BEACON, *pubs, *K1]) == 0
    assert "COMPLETE AND CONSISTENT" in capsys.readouterr().out
    trainers = plan_audit(honest_run, [a["public_key"] for a in plan["auditors"]], _hex("the trainer's pick"), 1)
    atomic_write_json(tmp_path / "chosen.json", trainers)
    assert check_plan(trainers) == []  # a well-formed plan, redrawable from its own beacon
    assert main(["audit", "merge", *certs, "--plan", str(tmp_path / "chosen.json"), "--beacon", BEACON, *pubs,
                 *K1]) == 2
    out = capsys.readouterr().out
    assert "not a valid plan" in out and "you named" in out and "COMPLETE" not in out
    assert main(["audit", "merge", *certs, "--plan", str(path), *pubs, *K1]) == 1  # no beacon named: nothing to trust
    assert "--beacon" in capsys.readouterr().err


# -------------------------------------------------------------------------------- item 3: auditors are their keys


def test_one_trusted_key_cannot_deliver_another_planned_auditors_steps(planned, auditors, tmp_path, capsys):
    path, plan, results = planned
    a_steps = next(a["steps"] for a in plan["auditors"] if a["name"] == "A")
    b_steps = next(a["steps"] for a in plan["auditors"] if a["name"] == "B")
    pubs = [a for n in "AB" for a in ("--pub", str(auditors[n][1]))]
    mine = _cert(tmp_path, results["A"], "A", auditors["A"][0], "A.json")
    # the attack: A signs, with A's own key, a certificate that calls itself B, for B's steps
    forged = _cert(tmp_path, results["B"], "B", auditors["A"][0], "A-as-B.json")
    assert main(["audit", "merge", mine, forged, "--plan", str(path), "--beacon", BEACON, *pubs, *K1]) == 2
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "INCOMPLETE OR INCONSISTENT"
    assert "planned but not delivered: B (key" in out
    report = merge_certificates([mine, forged], plan, trusted_keys([str(auditors[n][1]) for n in "AB"]))
    assert sorted(s for _, s in report.undelivered) == b_steps and report.authenticated and not report.ok
    # B's own certificate delivers B's steps, whatever name it gives itself: the key decides
    b_as_a = _cert(tmp_path, results["B"], "A", auditors["B"][0], "B-as-A.json")
    assert main(["audit", "merge", mine, b_as_a, "--plan", str(path), "--beacon", BEACON, *pubs, *K1]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "COMPLETE AND CONSISTENT"
    # and B's key signing A's steps leaves A's share undelivered
    swapped = _cert(tmp_path, results["A"], "A", auditors["B"][0], "B-does-A.json")
    report = merge_certificates([swapped, b_as_a], plan, trusted_keys([str(auditors[n][1]) for n in "AB"]))
    assert sorted(s for _, s in report.undelivered) == a_steps


def test_a_plan_entry_cannot_be_moved_to_another_key(planned, tmp_path):
    _, plan, _ = planned
    doc = json.loads(json.dumps(plan))
    doc["auditors"][0]["public_key"], doc["auditors"][1]["public_key"] = (doc["auditors"][1]["public_key"],
                                                                          doc["auditors"][0]["public_key"])
    assert any("ascending order of their public keys" in p for p in check_plan(doc))
    doc = json.loads(json.dumps(plan))
    doc["auditors"][1]["public_key"] = doc["auditors"][0]["public_key"]
    atomic_write_json(tmp_path / "twice.json", doc)
    from lockstep.audit.plan import load_plan

    with pytest.raises(PlanError, match="same public key"):
        load_plan(tmp_path / "twice.json")


# ----------------------------------------------------------------- item 18: replay --plan is checked against the run


def test_replay_refuses_a_plan_for_another_run_or_beacon(honest_run, planned, auditors, tmp_path, capsys):
    path, plan, _ = planned
    keys = [a["public_key"] for a in plan["auditors"]]
    key_a = str(auditors["A"][0])
    pubs = [a for n in "AB" for a in ("--pub", str(auditors[n][1]))]
    base = ["audit", "replay", str(honest_run), "--backend", "spec", "--quiet", "--key", key_a, *pubs, *K1]

    other = plan_audit({"chain_hash": _hex("another run"), "last_step": plan["last_step"]}, keys, BEACON, 1)
    atomic_write_json(tmp_path / "other.json", other)
    assert main([*base, "--plan", str(tmp_path / "other.json"), "--beacon", BEACON]) == 1
    assert "not this run's" in capsys.readouterr().err

    edited = json.loads(json.dumps(plan))
    edited["auditors"][0]["steps"], edited["auditors"][1]["steps"] = (edited["auditors"][1]["steps"],
                                                                      edited["auditors"][0]["steps"])
    atomic_write_json(tmp_path / "edited.json", edited)
    assert main([*base, "--plan", str(tmp_path / "edited.json"), "--beacon", BEACON]) == 1
    assert "not a valid plan" in capsys.readouterr().err

    assert main([*base, "--plan", str(path), "--beacon", _hex("another round")]) == 1
    assert "you named" in capsys.readouterr().err
    assert main([*base, "--plan", str(path)]) == 1
    assert "--beacon" in capsys.readouterr().err
    no_key = [a for a in base if a not in ("--key", key_a)]
    assert main([*no_key, "--plan", str(path), "--beacon", BEACON, "--auditor", "A"]) == 1
    assert "--key" in capsys.readouterr().err
    assert main([*base, "--plan", str(path), "--beacon", BEACON, "--auditor", "B"]) == 1  # A's key, B's name
    assert "not to 'B'" in capsys.readouterr().err

    # the honest use: the steps the plan gives A's key, signed by it
    out = tmp_path / "a.json"
    assert main([*base, "--plan", str(path), "--beacon", BEACON, "--out", str(out)]) == 0
    cert = json.loads(out.read_text())
    assert cert["targets"] == next(a["steps"] for a in plan["auditors"] if a["name"] == "A")
    assert cert["signature"]["public_key"] == trusted_keys([str(auditors["A"][1])])[0]
    assert cert["auditor"] == "A"  # the plan's label, when no --auditor is given


# ------------------------------------------------------------- issue 34 item 1: a plan over a subset of the trusted keys


def _pubs(auditors, names: str) -> list[str]:
    return [a for n in names for a in ("--pub", str(auditors[n][1]))]


def test_a_colluder_cannot_draw_a_plan_over_himself_alone(honest_run, planned, auditors, tmp_path, capsys):
    """The measured attack: with three trusted auditors, A draws a plan whose only auditor is A, replays every
    step and signs it; merge with the three keys counted it as a complete audit."""
    _, _, results = planned
    keys = trusted_keys([str(auditors[n][1]) for n in "ABC"])
    key_a = keys[0]
    honest = plan_audit(honest_run, keys, BEACON, 1)
    solo = plan_audit(honest_run, [key_a], BEACON, 1)
    a_honest = next(a["steps"] for a in honest["auditors"] if a["public_key"] == key_a)
    assert solo["auditors"][0]["steps"] == [1, 2, 3, 4] and len(a_honest) < 4  # what the attack gains
    atomic_write_json(tmp_path / "solo.json", solo)
    # A's certificates for every step (two replays, both signed by A's key)
    certs = [_cert(tmp_path, results[n], "A", auditors["A"][0], f"A-{n}.json") for n in "AB"]
    cmd = ["audit", "merge", *certs, "--plan", str(tmp_path / "solo.json"), "--beacon", BEACON, *K1]
    assert main([*cmd, *_pubs(auditors, "ABC")]) == 2
    out = capsys.readouterr().out
    assert "COMPLETE" not in out and "not a valid plan" in out
    assert "drawn over 1 auditor(s), not the 3 you named" in out and "leaves out 2 of the 3" in out
    # the library refuses it as well, whoever calls it
    with pytest.raises(PlanError, match="leaves out 2 of the 3"):
        merge_certificates(certs, solo, keys)
    # merge over the one key A's plan names is no audit by three: it is what the user must not be led to type,
    # and it is refused unless the user names exactly that set
    assert main([*cmd, *_pubs(auditors, "AB")]) == 2
    assert "leaves out 1 of the 2" in capsys.readouterr().out


def test_a_plan_with_another_redundancy_or_extra_keys_is_refused(honest_run, auditors, tmp_path, capsys):
    """Grinding after the beacon: over redundancies, and over key sets with keys of the colluder's own."""
    keys = trusted_keys([str(auditors[n][1]) for n in "ABC"])
    extra = _hex("a key the colluder made after the beacon")
    atomic_write_json(tmp_path / "k1.json", plan_audit(honest_run, keys, BEACON, 1))
    atomic_write_json(tmp_path / "k2.json", plan_audit(honest_run, keys, BEACON, 2))
    atomic_write_json(tmp_path / "more.json", plan_audit(honest_run, keys + [extra], BEACON, 2))
    (tmp_path / "c.json").write_text("{}")
    base = ["audit", "merge", str(tmp_path / "c.json"), "--beacon", BEACON, *_pubs(auditors, "ABC")]
    assert main([*base, "--plan", str(tmp_path / "k1.json"), "--redundancy", "2"]) == 2
    assert "drawn with redundancy 1, not the 2 you stated" in capsys.readouterr().out
    assert main([*base, "--plan", str(tmp_path / "more.json"), "--redundancy", "2"]) == 2
    out = capsys.readouterr().out
    assert "drawn over 4 auditor(s), not the 3 you named" in out and "has 1 auditor key(s) you did not name" in out
    assert extra[:16] in out
    # the plan the auditors published for: accepted (the empty certificate is rejected, so not complete)
    assert main([*base, "--plan", str(tmp_path / "k2.json"), "--redundancy", "2"]) == 2
    out = capsys.readouterr().out
    assert "not a valid plan" not in out and "rejected" in out
    # a plan is never read without the key set and the redundancy
    assert main([*base, "--plan", str(tmp_path / "k2.json")]) == 1
    assert "--redundancy" in capsys.readouterr().err
    no_pub = [a for a in base if a != "--pub" and not a.endswith(".pub")]
    assert main([*no_pub, "--plan", str(tmp_path / "k2.json"), "--redundancy", "2"]) == 1
    assert "--pub for every auditor" in capsys.readouterr().err


def test_replay_refuses_a_plan_over_a_subset_of_the_keys(honest_run, auditors, tmp_path, capsys):
    keys = trusted_keys([str(auditors[n][1]) for n in "ABC"])
    atomic_write_json(tmp_path / "solo.json", plan_audit(honest_run, keys[:1], BEACON, 1))
    base = ["audit", "replay", str(honest_run), "--backend", "spec", "--quiet", "--key", str(auditors["A"][0]),
            "--beacon", BEACON, *K1]
    assert main([*base, "--plan", str(tmp_path / "solo.json"), *_pubs(auditors, "ABC")]) == 1
    err = capsys.readouterr().err
    assert "not a valid plan" in err and "leaves out 2 of the 3" in err
    assert main([*base, "--plan", str(tmp_path / "solo.json")]) == 1
    assert "--pub for every auditor" in capsys.readouterr().err
