"""Attack class 4 (issue 19, Medium 4): self-named, unsigned certificates posing as distinct auditors.

Three copies of one certificate under the names a, b and c (or signed with three
keys made for the occasion) must never make ``audit merge`` report a complete
audit by distinct auditors unless the auditors' public keys are given (``--pub``).
"""

from __future__ import annotations

import copy
import hashlib

import pytest

from lockstep.audit.certificate import make_certificate, sign_certificate, write_certificate
from lockstep.audit.merge import merge_certificates
from lockstep.audit.plan import plan_audit
from lockstep.audit.replay import replay_steps
from lockstep.cli import main
from lockstep.fsio import atomic_write_json


@pytest.fixture(scope="module")
def one_replay(honest_run):
    return make_certificate(replay_steps(honest_run, [1, 2, 3, 4], "spec"))


BEACON = hashlib.sha256(b"the beacon round the auditors named").hexdigest()


def _three(one_replay, tmp_path, sign=False):
    paths, pubs = [], []
    for name in "abc":
        cert = copy.deepcopy(one_replay)
        cert["auditor"] = name
        if sign:
            pytest.importorskip("cryptography")
            from lockstep.audit.certificate import generate_keypair

            key, pub = generate_keypair(tmp_path / name)
            cert = sign_certificate(cert, key)
            pubs.append(str(pub))
        else:
            pubs.append(hashlib.sha256(name.encode()).hexdigest())  # keys the plan names (nobody signs with them)
        write_certificate(tmp_path / f"{name}.json", cert)
        paths.append(tmp_path / f"{name}.json")
    return paths, pubs


def _plan(honest_run, tmp_path, pubs):
    from lockstep.audit.accept import trusted_keys

    atomic_write_json(tmp_path / "plan.json", plan_audit(honest_run, trusted_keys(pubs), BEACON, 3,
                                                         names=["a", "b", "c"]))
    return tmp_path / "plan.json"


def test_unsigned_self_named_certificates_are_not_a_complete_audit(honest_run, one_replay, tmp_path, capsys):
    paths, pubs = _three(one_replay, tmp_path)
    plan = _plan(honest_run, tmp_path, pubs)
    assert main(["audit", "merge", *map(str, paths)]) == 2
    out = capsys.readouterr().out
    assert "COMPLETE AND CONSISTENT" not in out and "UNAUTHENTICATED" in out.splitlines()[-1]
    # a plan is only read against the auditors' keys, so it cannot lend the self-named certificates weight
    assert main(["audit", "merge", *map(str, paths), "--plan", str(plan), "--beacon", BEACON, "--redundancy", "3"]) == 1
    assert "--pub for every auditor" in capsys.readouterr().err
    args = [a for pub in pubs for a in ("--pub", pub)]
    assert main(["audit", "merge", *map(str, paths), "--plan", str(plan), "--beacon", BEACON, "--redundancy", "3",
                 *args]) == 2
    out = capsys.readouterr().out
    assert "COMPLETE AND CONSISTENT" not in out and "unsigned" in out
    report = merge_certificates(paths)
    assert not report.ok and not report.authenticated
    assert report.steps[1].count == 3  # coverage is still reported, as claimed


def test_signatures_by_keys_nobody_vouched_for_are_not_enough(honest_run, one_replay, tmp_path, capsys):
    paths, pubs = _three(one_replay, tmp_path, sign=True)
    plan = _plan(honest_run, tmp_path, pubs)
    assert main(["audit", "merge", *map(str, paths)]) == 2
    assert "UNAUTHENTICATED" in capsys.readouterr().out
    # with the auditors' keys given, the same certificates are a complete audit by three auditors
    args = [a for pub in pubs for a in ("--pub", pub)]
    assert main(["audit", "merge", *map(str, paths), "--plan", str(plan), "--beacon", BEACON, "--redundancy", "3",
                 *args]) == 0
    out = capsys.readouterr().out
    assert "COMPLETE AND CONSISTENT" in out and "UNAUTHENTICATED" not in out
