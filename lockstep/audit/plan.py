"""``lockstep audit plan``: who replays which step, drawn from the run's final commitment.

The trainer publishes the commitment H_N only when the run ends, and H_N depends
on every bit of every step, so it could not have known which auditor would check
which step. The assignment (all exact integer work):

* ``sigma = keyed_permutation(PhiloxStream(0, PURPOSE, H_N, "auditors"), A)``: the
  auditors in a random order;
* ``pi = keyed_permutation(PhiloxStream(0, PURPOSE, H_N, "steps"), N)``: the steps
  1..N in a random order (``pi[i] + 1``);
* copy c (0 <= c < k) of the i-th step in that order goes to auditor
  ``sigma[(i * k + c) mod A]``.

with ``PURPOSE = "lockstep.audit.plan"``, ``H_N`` as its 32 raw bytes, and
``keyed_permutation`` the spec's (``lockstep.spec.philox``, the data stream's too). The k copies of
a step sit at k consecutive positions mod A, so they go to k distinct auditors
(k <= A), and the positions 0 .. N*k - 1 spread evenly: every auditor gets
``floor(N*k/A)`` or ``ceil(N*k/A)`` steps. Anyone can redraw the plan from the
commitment (``check_plan`` does), so a plan file cannot be forged either.
"""

from __future__ import annotations

import os
from pathlib import Path

from lockstep.fsio import FileFormatError, printable, read_json
from lockstep.spec.philox import PhiloxStream, keyed_permutation

PURPOSE = "lockstep.audit.plan"
PLAN_FORMAT = "lockstep.audit-plan"
PLAN_VERSION = 1
# Stated maxima, checked before anything is allocated (a run of 4T tokens at 3M tokens per step has
# 1.3M steps): the permutation of the steps costs about 24 bytes per step, the plan about 40 per assignment.
MAX_PLAN_STEPS = 10_000_000
MAX_PLAN_ASSIGNMENTS = 30_000_000  # steps x redundancy
MAX_AUDITORS = 100_000
MAX_PLAN_BYTES = 256 << 20


class PlanError(ValueError):
    """A plan cannot be made or read; the message says why and what to do."""


def _commitment_of(source, where: str | None = None) -> tuple[str, int]:
    """``(H_N, N)`` from a run directory, a commitment.json, or a dict ``{chain_hash, last_step}``."""
    from lockstep.formats.rundir import HEX64

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
    the published chain, recomputed from ``H_0`` link by link, so no plan is drawn for a broken chain."""
    from lockstep.spec import hashing
    from lockstep.formats.rundir import RunFileError, Strictness, genesis, load_recipe, read_commitment, read_trajectory

    try:
        c = read_commitment(run_dir)
        traj = read_trajectory(run_dir, Strictness.AUDIT)
        h = genesis(load_recipe(run_dir))
    except RunFileError as exc:
        raise PlanError(str(exc)) from None
    for rec in traj:
        if hashing.record_chain_hash(h, rec) != rec["chain_hash"]:
            raise PlanError(f"{run_dir}: the published chain is broken at step {rec['step']}; the run is invalid, "
                            "so no audit plan is drawn for it (`lockstep audit verify` lists why)")
        h = rec["chain_hash"]
    if not traj or h != c["chain_hash"] or len(traj) != c["last_step"]:
        raise PlanError(f"{run_dir}: commitment.json is not H_{len(traj)} of the trajectory; the run is invalid, "
                        "so no audit plan is drawn for it")
    return c


def draw_assignment(commitment: str, last_step: int, auditors: int, redundancy: int) -> list[list[int]]:
    """``steps[a]``: the ascending steps auditor ``a`` replays (module docstring)."""
    if type(auditors) is not int or auditors < 1:
        raise PlanError(f"--auditors must be >= 1, got {auditors!r}")
    if type(redundancy) is not int or redundancy < 1:
        raise PlanError(f"--redundancy must be >= 1, got {redundancy!r}")
    if redundancy > auditors:
        raise PlanError(f"redundancy {redundancy} needs at least {redundancy} distinct auditors, got {auditors}")
    if auditors > MAX_AUDITORS:
        raise PlanError(f"--auditors {auditors} is more than the {MAX_AUDITORS} a plan handles")
    if not 1 <= last_step <= MAX_PLAN_STEPS or last_step * redundancy > MAX_PLAN_ASSIGNMENTS:
        raise PlanError(f"{last_step} steps x redundancy {redundancy} is beyond what a plan handles (at most "
                        f"{MAX_PLAN_STEPS} steps and {MAX_PLAN_ASSIGNMENTS} assignments)")
    key = bytes.fromhex(commitment)
    sigma = keyed_permutation(PhiloxStream(0, PURPOSE, key, "auditors"), auditors).tolist()
    pi = keyed_permutation(PhiloxStream(0, PURPOSE, key, "steps"), last_step).tolist()
    steps: list[list[int]] = [[] for _ in range(auditors)]
    for i, s in enumerate(pi):
        for c in range(redundancy):
            steps[sigma[(i * redundancy + c) % auditors]].append(s + 1)
    return [sorted(x) for x in steps]


def plan_audit(source, auditors: int, redundancy: int = 1, names: list[str] | None = None) -> dict:
    """The audit plan of a run: ``source`` is a run directory, a commitment.json, or a commitment dict."""
    commitment, last_step = _commitment_of(source)
    if names is not None and len(names) != auditors:
        raise PlanError(f"{len(names)} auditor names for {auditors} auditors")
    steps = draw_assignment(commitment, last_step, auditors, redundancy)
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "commitment": commitment,
        "last_step": last_step,
        "redundancy": redundancy,
        "purpose": PURPOSE,
        "auditors": [{"index": a, "name": names[a] if names else f"auditor-{a}", "steps": s}
                     for a, s in enumerate(steps)],
    }


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
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT or plan.get("version") != PLAN_VERSION:
        raise PlanError(f"{path}: not a lockstep audit plan ({PLAN_FORMAT} v{PLAN_VERSION})")
    _commitment_of({"chain_hash": plan.get("commitment"), "last_step": plan.get("last_step")}, where=str(path))
    auditors = plan.get("auditors")
    if not (isinstance(auditors, list) and all(isinstance(a, dict) and type(a.get("index")) is int
                                               and isinstance(a.get("name", ""), str)
                                               and isinstance(a.get("steps"), list)
                                               and all(type(s) is int for s in a["steps"]) for a in auditors)):
        raise PlanError(f"{path}: 'auditors' must be a list of {{index, name, steps}} (an integer, a string and "
                        "a list of integers)")
    k = plan.get("redundancy")
    if type(k) is not int or not 1 <= k <= len(auditors) or plan["last_step"] * k > MAX_PLAN_ASSIGNMENTS:
        raise PlanError(f"{path}: 'redundancy' must be an integer from 1 to the number of auditors "
                        f"({len(auditors)}), with steps x redundancy at most {MAX_PLAN_ASSIGNMENTS}")
    return plan


def check_plan(plan: dict) -> list[str]:
    """Problems of a plan: a step covered other than k times, by repeated auditors, or not the redrawn plan."""
    problems = []
    k = plan["redundancy"]
    for s, who in coverage(plan).items():
        if not 1 <= s <= plan["last_step"]:
            problems.append(f"step {s} is outside the run's steps 1..{plan['last_step']}")
        elif len(who) != k:
            problems.append(f"step {s} is assigned {len(who)} time(s), not {k}")
        elif len(set(who)) != len(who):
            problems.append(f"step {s} is assigned twice to one auditor")
    try:
        redrawn = draw_assignment(plan["commitment"], plan["last_step"], len(plan["auditors"]), k)
    except PlanError as exc:
        return problems + [str(exc)]
    if [sorted(a["steps"]) for a in sorted(plan["auditors"], key=lambda a: a["index"])] != redrawn:
        problems.append("the assignment is not the one drawn from the commitment (the plan was edited)")
    return problems


def format_plan(plan: dict, max_steps: int = 20) -> str:
    lines = [f"audit plan for commitment {plan['commitment'][:16]}...: steps 1..{plan['last_step']}, "
             f"{len(plan['auditors'])} auditor(s), each step {plan['redundancy']} time(s)"]
    for a in plan["auditors"]:
        shown = ", ".join(map(str, a["steps"][:max_steps])) + (" ..." if len(a["steps"]) > max_steps else "")
        lines.append(f"  {a['index']:>4}  {a.get('name', '')}: {len(a['steps'])} step(s): {shown}")
    return "\n".join(printable(line) for line in lines)  # untrusted names cannot add lines
