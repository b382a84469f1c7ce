"""``lockstep audit plan``: who replays which step, drawn from a public beacon fixed after the commitment.

A plan drawn from the commitment alone can be ground: the trainer controls H_N (a
field that changes no training bit, or a forged step re-linked, costs one SHA-256 per
step to redraw), so it can redraw until a forged step goes to a colluding auditor. The
plan is therefore keyed by a **public beacon value** (a drand or NIST randomness
beacon round) that the auditors name *after* the commitment is published, and that
nobody can predict before it is published:

* ``seed = SHA-256(SEED_DOMAIN || H_N || beacon)``, ``H_N`` as its 32 raw bytes and
  ``beacon`` as its raw bytes (32 to 64 of them);
* the auditors are identified by their Ed25519 public keys (32 bytes), in ascending
  order of their hex: auditor ``a`` is the ``a``-th key (a name is only a label);
* ``sigma = keyed_permutation(PhiloxStream(0, PURPOSE, seed, "auditors"), A)``: the
  auditors in a random order;
* ``pi = keyed_permutation(PhiloxStream(0, PURPOSE, seed, "steps"), N)``: the steps
  1..N in a random order (``pi[i] + 1``);
* copy c (0 <= c < k) of the i-th step in that order goes to auditor
  ``sigma[(i * k + c) mod A]``.

with ``PURPOSE = "lockstep.audit.plan"`` and ``keyed_permutation`` the spec's
(``lockstep.spec.philox``, the data stream's too). The k copies of a step sit at k
consecutive positions mod A, so they go to k distinct auditors (k <= A), and the
positions 0 .. N*k - 1 spread evenly: every auditor gets ``floor(N*k/A)`` or
``ceil(N*k/A)`` steps. Anyone can redraw the plan from the commitment, the beacon and
the keys (``check_plan`` does), so a plan file cannot be edited either.

A plan is also only as good as the key set and redundancy it was drawn for: a
colluder who draws a plan over a subset of the auditors (himself alone) gets every
step, and after the beacon is public he can grind over subsets and redundancies until
a forged step lands on him. So whoever *reads* a plan names the auditors' key set and
the redundancy again, as the auditors published them before the beacon round, and
``accept_plan`` refuses a plan drawn for any other set or redundancy. The same holds
for the beacon value: ``audit merge --plan`` and ``audit replay --plan`` take the
beacon, the keys and the redundancy from their user (``--beacon``, ``--pub``,
``--redundancy``), never from the plan file.

What this cannot check: that the beacon value is the named round's (compare it with
the beacon's own publication), that the round was named before its value was
published, and that the key set and redundancy the user names are the ones the
auditors fixed before it. Whoever can still choose any of them after the beacon is
known can grind the plan again.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from lockstep.errors import LockstepError, Setting
from lockstep.formats.run import Run
from lockstep.formats.rundir import HEX64, RunFileError
from lockstep.formats.trajectory import Strictness
from lockstep.fsio import FileFormatError, printable, read_json
from lockstep.spec.philox import PhiloxStream, keyed_permutation

PURPOSE = "lockstep.audit.plan"
PLAN_FORMAT = "lockstep.audit-plan"
PLAN_VERSION = 2  # 1: drawn from the commitment alone (grindable), auditors by name; no longer read
SEED_DOMAIN = b"lockstep.audit-plan.v2\x00"
BEACON_BYTES = (32, 64)  # a drand round's randomness is 32 bytes, a NIST beacon pulse's output 64
MAX_BEACON_SOURCE = 200  # characters of the optional note naming the beacon round
_BEACON_RE = re.compile(r"(?:[0-9a-f]{2}){32,64}")
_KEY_RE = re.compile(r"[0-9a-f]{64}")
# Stated maxima, checked before anything is allocated (a run of 4T tokens at 3M tokens per step has
# 1.3M steps): the permutation of the steps costs about 24 bytes per step, the plan about 40 per assignment.
MAX_PLAN_STEPS = 10_000_000
MAX_PLAN_ASSIGNMENTS = 30_000_000  # steps x redundancy
MAX_AUDITORS = 100_000
MAX_PLAN_BYTES = 256 << 20


class PlanError(LockstepError, ValueError):
    """A plan cannot be made or read; the message says why and what to do."""


class InvalidPlan(PlanError):
    """A readable plan that is not the one its reader names: edited, or drawn with another beacon, key set or
    redundancy. Using it would let its maker choose who checks which step."""


def _commitment_of(source, where: str | None = None) -> tuple[str, int]:
    """``(H_N, N)`` from a run directory, a commitment.json, or a dict ``{chain_hash, last_step}``."""
    if isinstance(source, dict):
        c = source
    else:
        p = Path(source)
        if p.is_dir():
            c = _intact_commitment(p)
        else:
            try:
                c = read_json(p, "commitment", max_bytes=64 << 10)
            except (FileFormatError, OSError) as exc:
                raise PlanError(str(exc)) from None
    if not isinstance(c, dict) or not isinstance(c.get("chain_hash"), str) or not HEX64.fullmatch(c["chain_hash"]):
        raise PlanError(f"{where or source}: no 64-digit chain_hash (the run's commitment)")
    if type(c.get("last_step")) is not int or c["last_step"] < 1:
        raise PlanError(f"{where or source}: last_step must be an integer >= 1")
    if c["last_step"] > MAX_PLAN_STEPS:
        raise PlanError(f"{where or source}: last_step {c['last_step']} is beyond what an audit plan handles (at most "
                        f"{MAX_PLAN_STEPS} steps); a real run's commitment names its own step count")
    return c["chain_hash"], c["last_step"]


def _intact_commitment(run_dir: Path) -> dict:
    """A run's commitment, checked here (not left to a separate ``audit verify``): it must be ``H_N`` of
    the published chain, recomputed from ``H_0`` link by link (``Run.chain_breaks``), so no plan is drawn
    for a broken chain."""
    try:
        run = Run.open(run_dir, Strictness.AUDIT).require("recipe", "trajectory")
        c = run.commitment
    except RunFileError as exc:
        raise PlanError(str(exc)) from None
    if run.chain_breaks:
        raise PlanError(f"{run_dir}: the published chain is broken at step {run.chain_breaks[0]}; the run is "
                        "invalid, so no audit plan is drawn for it (`lockstep audit verify` lists why)")
    traj = run.trajectory
    if not traj or traj[-1]["chain_hash"] != c["chain_hash"] or len(traj) != c["last_step"]:
        raise PlanError(f"{run_dir}: commitment.json is not H_{len(traj)} of the trajectory; the run is invalid, "
                        "so no audit plan is drawn for it")
    return c


def beacon_hex(text: str, where: str | Setting = Setting("beacon")) -> str:
    """A beacon value as lowercase hex (32 to 64 bytes); ``PlanError`` otherwise, naming ``where`` it came from."""
    b = text.strip().lower() if isinstance(text, str) else text
    if not isinstance(b, str) or not _BEACON_RE.fullmatch(b):
        raise PlanError.naming(where, f": the beacon must be {BEACON_BYTES[0]} to {BEACON_BYTES[1]} bytes in hex (an "
                               "even number of hex digits, 64 to 128): the randomness of a public beacon round "
                               "(drand, NIST) published after the commitment")
    return b


def plan_seed(commitment: str, beacon: str) -> bytes:
    """``SHA-256(SEED_DOMAIN || H_N || beacon)`` (module docstring)."""
    return hashlib.sha256(SEED_DOMAIN + bytes.fromhex(commitment) + bytes.fromhex(beacon)).digest()


def draw_assignment(commitment: str, beacon: str, last_step: int, auditors: int, redundancy: int) -> list[list[int]]:
    """``steps[a]``: the ascending steps auditor ``a`` (the ``a``-th key in ascending order) replays."""
    if type(auditors) is not int or auditors < 1:
        raise PlanError(f"a plan needs at least one auditor, got {auditors!r}")
    if type(redundancy) is not int or redundancy < 1:
        raise PlanError.naming(Setting("redundancy"), f" must be >= 1, got {redundancy!r}")
    if redundancy > auditors:
        raise PlanError(f"redundancy {redundancy} needs at least {redundancy} distinct auditors, got {auditors}")
    if auditors > MAX_AUDITORS:
        raise PlanError(f"{auditors} auditors is more than the {MAX_AUDITORS} a plan handles")
    if not 1 <= last_step <= MAX_PLAN_STEPS or last_step * redundancy > MAX_PLAN_ASSIGNMENTS:
        raise PlanError(f"{last_step} steps x redundancy {redundancy} is beyond what a plan handles (at most "
                        f"{MAX_PLAN_STEPS} steps and {MAX_PLAN_ASSIGNMENTS} assignments)")
    key = plan_seed(commitment, beacon)
    sigma = keyed_permutation(PhiloxStream(0, PURPOSE, key, "auditors"), auditors).tolist()
    pi = keyed_permutation(PhiloxStream(0, PURPOSE, key, "steps"), last_step).tolist()
    steps: list[list[int]] = [[] for _ in range(auditors)]
    for i, s in enumerate(pi):
        for c in range(redundancy):
            steps[sigma[(i * redundancy + c) % auditors]].append(s + 1)
    return [sorted(x) for x in steps]


def plan_audit(source, keys: list[str], beacon: str, redundancy: int = 1, names: list[str] | None = None,
               beacon_source: str | None = None) -> dict:
    """The audit plan of a run: ``source`` is a run directory, a commitment.json, or a commitment dict.

    ``keys``: the auditors' Ed25519 public keys (64 hex digits each, distinct); ``names``
    (optional) labels them, in the same order; ``beacon``: the beacon value (hex);
    ``beacon_source``: an optional note naming the beacon round (recorded, not drawn from).
    """
    commitment, last_step = _commitment_of(source)
    beacon = beacon_hex(beacon)
    if not keys:
        raise PlanError.naming("a plan needs the auditors' public keys (", Setting("keys"), ", one per auditor): merge "
                               "matches each planned step to the key that signed its certificate")
    keys = [k.lower() if isinstance(k, str) else k for k in keys]
    bad = [k for k in keys if not isinstance(k, str) or not _KEY_RE.fullmatch(k)]
    if bad:
        raise PlanError(f"an auditor's public key must be 64 hex digits, got {bad[0]!r}")
    if len(set(keys)) != len(keys):
        raise PlanError("the same public key is given twice: one auditor cannot hold two places in a plan")
    if names is not None and len(names) != len(keys):
        raise PlanError(f"{len(names)} auditor names for {len(keys)} public keys")
    if beacon_source is not None and (not isinstance(beacon_source, str) or len(beacon_source) > MAX_BEACON_SOURCE):
        raise PlanError.naming(Setting("beacon_source"), f" must be a note of at most {MAX_BEACON_SOURCE} characters")
    labels = dict(zip(keys, names)) if names is not None else {}
    ordered = sorted(keys)
    steps = draw_assignment(commitment, beacon, last_step, len(ordered), redundancy)
    plan = {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "commitment": commitment,
        "last_step": last_step,
        "redundancy": redundancy,
        "purpose": PURPOSE,
        "beacon": beacon,
        "auditors": [{"index": a, "name": labels.get(k, f"auditor-{a}"), "public_key": k, "steps": s}
                     for a, (k, s) in enumerate(zip(ordered, steps))],
    }
    if beacon_source:
        plan["beacon_source"] = beacon_source
    return plan


def coverage(plan: dict) -> dict[int, list[int]]:
    """``{step: [auditor indices]}`` of a plan."""
    out: dict[int, list[int]] = {s: [] for s in range(1, plan["last_step"] + 1)}
    for a in plan["auditors"]:
        for s in a["steps"]:
            out.setdefault(s, []).append(a["index"])
    return out


def load_plan(path: str | os.PathLike) -> dict:
    """Read a plan (strict JSON, at most ``MAX_PLAN_BYTES``) and check its shape and bounds."""
    try:
        plan = read_json(path, "audit plan", max_bytes=MAX_PLAN_BYTES)
    except (FileFormatError, OSError) as exc:
        raise PlanError(str(exc)) from None
    if isinstance(plan, dict) and plan.get("format") == PLAN_FORMAT and plan.get("version") == 1:
        raise PlanError(f"{path}: a version 1 plan, drawn from the commitment alone (which the trainer can grind); "
                        "draw a new one with `lockstep audit plan RUN --beacon HEX --pub KEY ...`")
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT or plan.get("version") != PLAN_VERSION:
        raise PlanError(f"{path}: not a lockstep audit plan ({PLAN_FORMAT} v{PLAN_VERSION})")
    _commitment_of({"chain_hash": plan.get("commitment"), "last_step": plan.get("last_step")}, where=str(path))
    if not isinstance(plan.get("beacon"), str) or not _BEACON_RE.fullmatch(plan["beacon"]):
        raise PlanError(f"{path}: 'beacon' must be {BEACON_BYTES[0]} to {BEACON_BYTES[1]} bytes in lowercase hex")
    src = plan.get("beacon_source", "")
    if not isinstance(src, str) or len(src) > MAX_BEACON_SOURCE:
        raise PlanError(f"{path}: 'beacon_source' must be a string of at most {MAX_BEACON_SOURCE} characters")
    auditors = plan.get("auditors")
    if not (isinstance(auditors, list) and all(isinstance(a, dict) and type(a.get("index")) is int
                                               and isinstance(a.get("name", ""), str)
                                               and isinstance(a.get("public_key"), str)
                                               and _KEY_RE.fullmatch(a["public_key"])
                                               and isinstance(a.get("steps"), list)
                                               and all(type(s) is int for s in a["steps"]) for a in auditors)):
        raise PlanError(f"{path}: 'auditors' must be a list of {{index, name, public_key, steps}} (an integer, a "
                        "string, 64 lowercase hex digits and a list of integers)")
    if len({a["public_key"] for a in auditors}) != len(auditors):
        raise PlanError(f"{path}: two auditors have the same public key")
    k = plan.get("redundancy")
    if type(k) is not int or not 1 <= k <= len(auditors) or plan["last_step"] * k > MAX_PLAN_ASSIGNMENTS:
        raise PlanError(f"{path}: 'redundancy' must be an integer from 1 to the number of auditors "
                        f"({len(auditors)}), with steps x redundancy at most {MAX_PLAN_ASSIGNMENTS}")
    return plan


def check_plan(plan: dict, beacon: str | None = None, keys: list[str] | None = None,
               redundancy: int | None = None) -> list[str]:
    """Problems of a plan: a step covered other than k times, by repeated auditors, auditors out of key
    order, not the plan redrawn from its commitment, beacon and keys; and, for what the user names,
    drawn with another ``beacon``, over another set of auditor ``keys`` (hex) or with another
    ``redundancy``."""
    problems = []
    if beacon is not None and beacon_hex(beacon) != plan["beacon"]:
        problems.append(f"drawn with beacon {plan['beacon'][:16]}..., not the {beacon_hex(beacon)[:16]}... you named "
                        "(a plan maker who chose the beacon could have ground the plan)")
    if keys is not None:
        problems += key_set_problems(plan, keys)
    if redundancy is not None and redundancy != plan["redundancy"]:
        problems.append(f"drawn with redundancy {plan['redundancy']}, not the {redundancy} you stated (a plan maker "
                        "who chose the redundancy could have ground the plan)")
    k = plan["redundancy"]
    for s, who in coverage(plan).items():
        if not 1 <= s <= plan["last_step"]:
            problems.append(f"step {s} is outside the run's steps 1..{plan['last_step']}")
        elif len(who) != k:
            problems.append(f"step {s} is assigned {len(who)} time(s), not {k}")
        elif len(set(who)) != len(who):
            problems.append(f"step {s} is assigned twice to one auditor")
    by_index = sorted(plan["auditors"], key=lambda a: a["index"])
    if [a["index"] for a in by_index] != list(range(len(by_index))):
        problems.append("the auditors' indices are not 0, 1, ..., A-1")
    if [a["public_key"] for a in by_index] != sorted(a["public_key"] for a in by_index):
        problems.append("the auditors are not in ascending order of their public keys (the order is not the "
                        "plan maker's to choose)")
    try:
        redrawn = draw_assignment(plan["commitment"], plan["beacon"], plan["last_step"], len(plan["auditors"]), k)
    except PlanError as exc:
        return problems + [str(exc)]
    if [sorted(a["steps"]) for a in by_index] != redrawn:
        problems.append("the assignment is not the one drawn from the commitment and the beacon (the plan was "
                        "edited)")
    return problems


def key_set_problems(plan: dict, keys: list[str]) -> list[str]:
    """How the plan's auditors differ from the key set the user names (hex public keys)."""
    named = {k.lower() for k in keys}
    planned = {a["public_key"] for a in plan["auditors"]}
    if named == planned:
        return []
    left_out, extra = sorted(named - planned), sorted(planned - named)

    def keys_of(ks: list[str]) -> str:
        return ", ".join(f"{k[:16]}..." for k in ks[:3]) + (f" and {len(ks) - 3} more" if len(ks) > 3 else "")

    parts = []
    if left_out:
        parts.append(f"leaves out {len(left_out)} of the {len(named)} auditor key(s) you named ({keys_of(left_out)})")
    if extra:
        parts.append(f"has {len(extra)} auditor key(s) you did not name ({keys_of(extra)})")
    return [f"drawn over {len(planned)} auditor(s), not the {len(named)} you named: it " + " and ".join(parts)
            + " (a plan over another key set gives its maker another share of the steps)"]


def accept_plan(path: str | os.PathLike, beacon: str | None, keys: list[str] | None, redundancy: int | None) -> dict:
    """The plan at ``path``, read and checked against what its reader names: the beacon value, the auditors'
    whole key set (hex public keys) and the redundancy, as the auditors published them before the beacon
    round. ``InvalidPlan`` (one line, naming the first differences) if the plan differs from them,
    ``PlanError`` if something is missing or the file is not a plan."""
    if not beacon:
        raise PlanError("a plan is read with the beacon value the auditors named (the plan's own copy is not "
                        "evidence)")
    if not keys:
        raise PlanError("a plan is read with the auditors' whole key set, as they published it before the beacon "
                        "round (a plan over a subset of the keys gives its maker more steps)")
    if redundancy is None:
        raise PlanError("a plan is read with the redundancy the auditors published with their key set (a plan "
                        "drawn with another redundancy gives its maker another share of the steps)")
    if len({k.lower() for k in keys}) != len(keys):
        raise PlanError("the same public key is named twice: one auditor cannot hold two places in a plan")
    plan = load_plan(path)
    problems = check_plan(plan, beacon, keys, redundancy)
    if problems:
        raise InvalidPlan(f"{path}: not a valid plan: " + "; ".join(problems[:5]))
    return plan


def planned_auditor(plan: dict, public_key: str | None = None, name: str | None = None) -> dict:
    """The plan's entry for the auditor with ``public_key`` (hex), or else named ``name`` (or by index).

    With both, the entry found by the key must also carry that name or index. ``PlanError`` otherwise.
    """
    if public_key is not None:
        mine = [a for a in plan["auditors"] if a["public_key"] == public_key]
        if not mine:
            raise PlanError(f"the plan has no auditor with public key {public_key[:16]}...")
        if name is not None and name not in (mine[0].get("name"), str(mine[0]["index"])):
            raise PlanError(f"the plan gives public key {public_key[:16]}... to {mine[0].get('name')!r} "
                            f"(index {mine[0]['index']}), not to {name!r}")
        return mine[0]
    mine = [a for a in plan["auditors"] if a.get("name") == name or str(a["index"]) == name]
    if not mine:
        raise PlanError(f"the plan has no auditor named {name!r}")
    return mine[0]


def format_plan(plan: dict, max_steps: int = 20) -> str:
    lines = [f"audit plan for commitment {plan['commitment'][:16]}...: steps 1..{plan['last_step']}, "
             f"{len(plan['auditors'])} auditor(s), each step {plan['redundancy']} time(s)",
             f"  drawn with beacon {plan['beacon']}"
             + (f" ({plan['beacon_source']})" if plan.get("beacon_source") else "")]
    for a in plan["auditors"]:
        shown = ", ".join(map(str, a["steps"][:max_steps])) + (" ..." if len(a["steps"]) > max_steps else "")
        lines.append(f"  {a['index']:>4}  {a.get('name', '')} (key {a['public_key'][:16]}...): "
                     f"{len(a['steps'])} step(s): {shown}")
    return "\n".join(printable(line) for line in lines)  # untrusted names cannot add lines
