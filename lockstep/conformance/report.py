"""A device report: what one machine's run of a backend says, in one file to attach to an issue.

    lockstep conformance --backend metal --level 2 --report metal-report.md
    tools/validate_metal.sh                      (the same, after checking what is installed)

Three checks, each against the spec computed here, on this machine:

1. **conformance** at the given level: every op, byte for byte, golden vectors included;
2. **training**: ``lockstep train --preset tiny --steps 2`` with int8 on and off, once with the
   backend and once with the spec; every step's state root, loss, gradient norm and chain hash
   must be equal (and equal the committed reference roots, where this is a checkout that has them).
   Where a step differs, that step of the spec's run is traced on both (``lockstep audit trace``)
   and the report holds their diff and the referee's verdict (``lockstep audit diff --referee``:
   the first op call whose inputs agree and outputs differ, which side the spec takes, the first
   differing element), and the disputed call is saved beside the report for ``--replay-op``;
3. **the flush probe** (``flush_probe.probe``): V1-V4 of docs/numerical-contract.md and random products and
   quotients near 2**-126, through the device's bare ``*`` and ``/`` (which tininess rule the
   hardware follows) and through the ops (which must equal the spec); and the ops' ``sqrt`` on
   every float32 in [1, 4) and ``/`` with extreme divisors.

The report is Markdown for people, with the whole result as JSON at its end for programs. If the
backend refuses to open because its self-test found other bits, the report says so and still runs
the checks on the device with the self-test skipped, so it shows every op that differs. If it
cannot open at all (no device, a compiler error), the report holds the reason and the full
compiler log. Exit status: 0 when everything equals the spec, 2 when something differs, 1 when
the backend could not run.
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPORT_FORMAT = 1
TRAINING_RUNS = (  # label, lockstep train arguments (the committed reference roots use the same labels)
    ("tiny-int8", ["--preset", "tiny", "--steps", "2"]),
    ("tiny-float", ["--preset", "tiny", "--steps", "2", "--no-quantize"]),
)
TRAJECTORY_FIELDS = ("state_root", "loss_bits", "grad_norm_bits", "chain_hash")
REFERENCE_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "device_check_reference.json"
MESSAGES_PER_OP = 20


def _say(text: str) -> None:
    print(f"[report] {text}", file=sys.stderr, flush=True)


def environment() -> dict:
    import lockstep
    from lockstep.spec import SPEC_VERSION

    env = {"lockstep": lockstep.__version__, "SPEC_VERSION": SPEC_VERSION, "python": platform.python_version(),
           "platform": platform.platform(), "machine": platform.machine(), "numpy": np.__version__}
    if sys.platform == "darwin":
        env["macos"] = platform.mac_ver()[0]
        try:
            import objc

            env["pyobjc"] = objc.__version__
        except ImportError:
            env["pyobjc"] = "not installed"
    return env


def open_backend(name: str):
    """(backend or None, {"status": ..., "detail": ...}). A backend whose self-test fails is opened
    again without it, when its module allows that, so the checks can show what differs."""
    import importlib

    from lockstep.backends import BACKEND_ALIASES, BACKEND_MODULES, BackendUnavailable, get_backend

    try:
        return get_backend(name), {"status": "passed"}
    except BackendUnavailable as e:
        detail = {"status": "unavailable", "reason": str(e)}
        if e.__cause__ is not None:
            detail["cause"] = str(e.__cause__)[:20000]  # e.g. the Metal compiler's whole log
        key = BACKEND_ALIASES.get(name, name)
        if "self-test" not in str(e) or key not in BACKEND_MODULES:
            return None, detail
        make = importlib.import_module(BACKEND_MODULES[key]).make_backend
        if "self_test" not in inspect.signature(make).parameters:
            return None, detail
        return make(self_test=False), {"status": "FAILED (the checks below ran with the self-test skipped)",
                                       "reason": str(e)}


def conformance_section(backend, level: int, seed: int) -> dict:
    from lockstep.conformance.runner import print_table, run_conformance

    results = run_conformance(backend, level=level, seed=seed, max_errors=30)
    print_table(results, backend, level, seed)
    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "MISSING", "ERROR")}
    return {"level": level, "seed": seed, "counts": counts, "passed": counts["PASS"] == len(results),
            "ops": [{"op": r.op, "status": r.status, "cases": r.cases, "refusals": r.refusals, "elements": r.elements, "golden": r.golden,
                     "seconds": round(r.seconds, 2), "messages": r.messages[:MESSAGES_PER_OP]} for r in results]}


def _train(backend_name: str, args: list[str], out: Path) -> dict:
    """One ``lockstep train`` in a child process: its trajectory records, or why it failed."""
    cmd = [sys.executable, "-m", "lockstep.cli", "train", *args, "--backend", backend_name, "--out", str(out), "--quiet"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=os.getcwd())
    seconds = round(time.perf_counter() - t0, 1)
    if res.returncode != 0:
        return {"error": f"exit status {res.returncode}: " + " | ".join(res.stderr.strip().splitlines()[-5:]),
                "seconds": seconds}
    records = [json.loads(line) for line in (out / "trajectory.jsonl").read_text().splitlines() if line.strip()]
    return {"steps": [{k: r.get(k) for k in ("step", *TRAJECTORY_FIELDS)} for r in records], "seconds": seconds}


def _reference_roots() -> dict:
    from lockstep.spec import SPEC_VERSION

    try:
        ref = json.loads(REFERENCE_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v["state_roots"] for k, v in ref.get("runs", {}).items()} if ref.get("SPEC_VERSION") == SPEC_VERSION else {}


def _cli(args: list[str]) -> tuple[int, str]:
    """``lockstep ARGS`` in a child process (this layer does not import the audit): exit status and output."""
    res = subprocess.run([sys.executable, "-m", "lockstep.cli", *args], capture_output=True, text=True, cwd=os.getcwd())
    return res.returncode, (res.stdout + res.stderr).strip()


def dispute(backend_name: str, spec_run: Path, step: int, work: Path, op_file: Path, run_cli=_cli) -> dict:
    """Where step ``step`` of the spec's run parts on ``backend_name``: both traces of it
    (``lockstep audit trace``), their diff, and the referee's verdict (``audit diff --referee``,
    re-executed on the spec), with the disputed call written to ``op_file``."""
    traces = {}
    for side in (backend_name, "spec"):
        traces[side] = work / f"trace-step{step}-{side}.jsonl"
        rc, text = run_cli(["audit", "trace", str(spec_run), "--step", str(step), "--backend", side,
                            "--out", str(traces[side])])
        if rc != 0:
            return {"step": step, "error": f"tracing on {side} failed: {text.splitlines()[-1] if text else rc}"}
    rc, text = run_cli(["audit", "diff", str(traces["spec"]), str(traces[backend_name]), "--referee",
                        "--run", str(spec_run), "--backend", "spec", "--op-file", str(op_file)])
    out = {"step": step, "trace_a": "spec", "trace_b": backend_name, "diff_exit": rc, "text": text.splitlines()}
    if op_file.is_file():
        out["op_file"] = str(op_file)
    return out


def training_section(backend_name: str, runs=TRAINING_RUNS, evidence: Path | None = None) -> dict:
    """Each tiny run on the backend and on the spec; where one differs, the dispute of its first differing
    step (``dispute``), its op file written beside ``evidence`` (the report's path without suffix)."""
    reference = _reference_roots()
    out = {"runs": [], "passed": True}
    with tempfile.TemporaryDirectory(prefix="lockstep-report-") as tmp:
        for label, args in runs:
            _say(f"training {label} ({' '.join(args)}) on {backend_name} and on the spec")
            got = _train(backend_name, args, Path(tmp) / f"{label}-{backend_name}")
            want = _train("spec", args, Path(tmp) / f"{label}-spec")
            run = {"label": label, "args": args, "backend": got, "spec": want}
            if "error" in got or "error" in want:
                run["equal"] = False
            else:
                run["equal"] = got["steps"] == want["steps"]
                run["differs"] = [f"step {g['step']} {k}: spec {w[k]}, {backend_name} {g[k]}"
                                  for g, w in zip(got["steps"], want["steps"]) for k in TRAJECTORY_FIELDS if g[k] != w[k]]
                bad = [g["step"] for g, w in zip(got["steps"], want["steps"]) if g != w]
                if bad:
                    _say(f"{label} differs at step {bad[0]}: tracing it on {backend_name} and on the spec")
                    op_file = (Path(f"{evidence}-{label}-step{bad[0]}.op.safetensors") if evidence is not None
                               else Path(tmp) / f"{label}.op.safetensors")
                    run["dispute"] = dispute(backend_name, Path(tmp) / f"{label}-spec", bad[0], Path(tmp), op_file)
                    if evidence is None:
                        run["dispute"].pop("op_file", None)
                if label in reference:
                    spec_roots = [s["state_root"] for s in want["steps"]]
                    run["committed_reference_roots_equal_the_spec"] = spec_roots == reference[label][: len(spec_roots)]
            out["passed"] &= run["equal"]
            out["runs"].append(run)
    return out


def build_report(backend_name: str, level: int = 2, seed: int = 0, probe_pairs: int = 10**6,
                 runs=TRAINING_RUNS, sqrt_count: int = 1 << 24, evidence: Path | None = None) -> dict:
    """Run every check on ``backend_name`` and return the report (a JSON-able dict)."""
    from lockstep.conformance import flush_probe

    report = {"lockstep_report": REPORT_FORMAT, "backend": backend_name,
              "created": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"), "environment": environment()}
    _say(f"opening backend {backend_name!r} (its first use compiles the kernels and runs the self-test)")
    backend, report["self_test"] = open_backend(backend_name)
    if backend is None:
        report["verdict"] = f"UNAVAILABLE: {report['self_test']['reason']}"
        return report
    report["description"] = backend.description
    report["info"] = {k: v for k, v in backend.info.items() if isinstance(v, (str, int, float, bool, list))}
    report["capabilities"] = backend.capabilities.offered()
    _say(f"conformance level {level}")
    report["conformance"] = conformance_section(backend, level, seed)
    report["training"] = training_section(backend_name, runs, evidence)
    if backend.capabilities.kernel_runtime is not None:
        _say(f"flush probe: V1-V4, {probe_pairs} random products and quotients near 2**-126, sqrt on {sqrt_count} inputs")
        try:
            report["flush_probe"] = flush_probe.probe(backend, n=probe_pairs, sqrt_count=sqrt_count)
        except Exception as e:  # noqa: BLE001 - a crashing probe is a reported result
            report["flush_probe"] = {"error": f"{type(e).__name__}: {e}", "ops_equal_spec": False}
    else:
        report["flush_probe"] = {"skipped": f"backend {backend_name!r} does not run the shared GPU kernels"}
    passed = (report["conformance"]["passed"] and report["training"]["passed"]
              and report["flush_probe"].get("ops_equal_spec", "skipped" in report["flush_probe"])
              and report["self_test"]["status"] == "passed")
    report["verdict"] = "PASS: every check equals the spec" if passed else "DIFFERS: see the sections below"
    return report


def exit_status(report: dict) -> int:
    if report["verdict"].startswith("PASS"):
        return 0
    return 1 if report["verdict"].startswith("UNAVAILABLE") else 2


def to_markdown(report: dict) -> str:
    """The report for people (Markdown), with the complete JSON at its end."""
    env = report["environment"]
    lines = [f"# lockstep device report: backend `{report['backend']}`", "",
             f"**{report['verdict']}**", "",
             f"- created {report['created']}; lockstep {env['lockstep']}, SPEC_VERSION {env['SPEC_VERSION']}",
             f"- {env['platform']} ({env['machine']})" + (f", macOS {env['macos']}, PyObjC {env['pyobjc']}" if "macos" in env else ""),
             f"- Python {env['python']}, NumPy {env['numpy']}",
             f"- opening the backend (compile, self-test): {report['self_test']['status']}"
             + (f": {report['self_test']['reason']}" if report['self_test'].get('reason') else "")]
    if "description" in report:
        lines.append(f"- device: {report['description']}")
    if "cause" in report["self_test"]:
        lines += ["", "## Why the backend could not run", "", "```", report["self_test"]["cause"], "```"]
    if "conformance" in report:
        c = report["conformance"]
        lines += ["", f"## Conformance, level {c['level']}", "",
                  f"{c['counts']['PASS']} passed, {c['counts']['FAIL']} failed, {c['counts']['MISSING']} missing, "
                  f"{c['counts']['ERROR']} errors", ""]
        bad = [o for o in c["ops"] if o["status"] != "PASS"]
        for o in bad:
            lines += [f"- `{o['op']}`: {o['status']} (golden {o['golden']})"] + [f"  - `{m.strip()}`" for m in o["messages"]]
    if "training" in report:
        lines += ["", "## Training steps against the spec", ""]
        for run in report["training"]["runs"]:
            state = "equal" if run["equal"] else "DIFFER"
            lines.append(f"- {run['label']} (`lockstep train {' '.join(run['args'])}`): {state}")
            for side in ("backend", "spec"):
                if "error" in run[side]:
                    lines.append(f"  - {side} run failed: {run[side]['error']}")
            if run["equal"]:
                roots = ", ".join(f"step {st['step']} `{st['state_root'][:16]}`" for st in run["spec"]["steps"])
                lines.append(f"  - state roots (both): {roots}")
            for d in run.get("differs", [])[:12]:
                lines.append(f"  - {d}")
            if "dispute" in run:
                dis = run["dispute"]
                lines.append(f"  - step {dis['step']} traced on {report['backend']} and on the spec "
                             "(`lockstep audit trace`, `lockstep audit diff --referee`):")
                lines += [f"    - {t}" for t in ([dis["error"]] if "error" in dis else dis["text"][:8])]
            if run.get("committed_reference_roots_equal_the_spec") is False:
                lines.append("  - note: the spec's roots here differ from the committed reference roots")
    if "flush_probe" in report:
        p = report["flush_probe"]
        lines += ["", "## Flush probe", ""]
        if "skipped" in p:
            lines.append(f"not run: {p['skipped']}")
        elif "error" in p:
            lines.append(f"probe failed: {p['error']}")
        else:
            lines += [p["verdict"], "", "| vector | spec | bare hardware | ops | bare result matches |", "|---|---|---|---|---|"]
            for label, v in p["vectors"].items():
                lines.append(f"| {label} | {v['spec']} | {v['bare']} | {v['ops']} | {', '.join(v['bare_matches']) or 'no model'} |")
            lines += ["", "| random pairs | pairs | in band | bare: rule | bare vs spec / before / after | ops vs spec |",
                      "|---|---:|---:|---|---|---:|"]
            for op, r in p["random"].items():
                lines.append(f"| {op} | {r['pairs']} | {r['in_band']} | {r['rule']} | "
                             f"{r['bare_vs_spec_mismatches']} / {r['bare_vs_tininess_before_rounding_mismatches']} / "
                             f"{r['bare_vs_tininess_after_rounding_mismatches']} | {r['ops_vs_spec_mismatches']} |")
            rounding = p.get("rounding", {})
            if rounding:
                sq, dv = rounding["sqrt"], rounding["div_extreme_divisors"]
                lines += ["", f"- sqrt on every float32 in {sq['inputs']} ({sq['count']}): {sq['mismatches']} differ from the spec",
                          f"- `/` with divisors beyond 2**100 and below 2**-100 ({dv['pairs']} pairs): "
                          f"{dv['mismatches']} differ from the spec"]
                lines += [f"  - {e}" for e in sq["examples"] + dv["examples"]]
            for op, r in p["random"].items():
                lines += [f"  - {e}" for e in r["ops_examples"]]
    lines += ["", "<details><summary>the whole report as JSON</summary>", "", "```json",
              json.dumps(report, indent=1, default=str), "```", "", "</details>", ""]
    return "\n".join(lines)


def write_report(report: dict, path: Path) -> None:
    """Write the Markdown report atomically (a half-written report is never left behind)."""
    from lockstep.backends.kernels import write_atomic

    write_atomic(Path(path), to_markdown(report).encode("utf-8"))
