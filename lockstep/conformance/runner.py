"""The conformance runner: a backend's bytes against the spec's, op by op, case by case.

For each registered op and each case, the spec's output and the backend's output are
compared as raw bytes (dtype, shape and every bit). The first mismatches are printed
in hex with their inputs, up to ``max_errors``. The spec's own outputs are checked
against the committed golden vectors first (at the golden seed and level), so a
machine whose NumPy misbehaves is caught even when the spec is the backend under test.

Errors are compared too: each op's refusal cases (its record's ``refusals``, in
``ops/<spec module>.py``: bad inputs the spec refuses with ValueError or TypeError
through ``spec.checks``) must raise the spec's exception type on the backend, not
another type and not a result.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from lockstep import spec
from lockstep.backends import Backend
from lockstep.contract import move_arguments, result_problem, signature_problem

from . import golden
from .registry import Case, OpRecord, all_records, as_outputs, describe_inputs
from .table import print_results


@dataclass
class OpResult:
    op: str
    status: str = "PASS"  # PASS, FAIL, MISSING, ERROR
    cases: int = 0
    refusals: int = 0  # bad-input cases on which the backend raised the spec's exception type
    elements: int = 0
    golden: str = "-"  # match, DIFFER, absent, -
    seconds: float = 0.0
    messages: list[str] = field(default_factory=list)


def _to_device(backend: Backend, op: str, case: Case) -> tuple[tuple, dict]:
    """A case's arguments for the backend: every host array through ``backend.asarray``, by the contract's kinds."""
    return move_arguments(op, case.args, case.kwargs, backend.asarray)


def _to_host(backend: Backend, result):
    """An op's result on the host: every device array through ``backend.to_numpy`` (None stays None)."""
    if isinstance(result, (tuple, list)):
        return tuple(None if r is None else backend.to_numpy(r) for r in result)
    return None if result is None else backend.to_numpy(result)


def _first_mismatches(want: np.ndarray, got: np.ndarray, case: Case, limit: int) -> list[str]:
    if want.dtype != got.dtype or want.shape != got.shape:
        return [f"  {case.label}: expected {want.dtype}{list(want.shape)}, got {got.dtype}{list(got.shape)}"]
    w = np.ascontiguousarray(want).reshape(-1)
    g = np.ascontiguousarray(got).reshape(-1)
    wb = w.view(np.uint8).reshape(w.size, -1) if w.size else w.view(np.uint8).reshape(0, 1)
    gb = g.view(np.uint8).reshape(g.size, -1) if g.size else g.view(np.uint8).reshape(0, 1)
    diff = np.nonzero((wb != gb).any(axis=1))[0]
    lines = [f"  {case.label}: {diff.size} of {w.size} elements differ"]
    for flat in diff[:limit]:
        idx = np.unravel_index(int(flat), want.shape) if want.ndim else ()
        if w.dtype == np.float32:
            wv = f"0x{int(w[flat].view(np.uint32)):08X} ({float(w[flat])!r})"
            gv = f"0x{int(g[flat].view(np.uint32)):08X} ({float(g[flat])!r})"
        else:
            wv, gv = repr(w[flat].item()), repr(g[flat].item())
        lines.append(f"    at {tuple(int(i) for i in idx)}: spec {wv}, backend {gv}; inputs {describe_inputs(case.args, _input_index(case, idx))}")
    return lines


def _input_index(case: Case, idx: tuple):
    """Best-effort index into the inputs for elementwise ops (same-shaped inputs)."""
    shapes = {np.asarray(a).shape for a in case.args if isinstance(a, np.ndarray)}
    if len(shapes) == 1 and len(next(iter(shapes))) == len(idx):
        return tuple(idx)
    return None


def _refusal_problem(backend: Backend, op: str, fn, args: tuple, kwargs: dict) -> str | None:
    """Why the backend does not refuse this bad input as the spec does (None when it does)."""
    try:
        getattr(spec, op)(*args, **kwargs)
        return "the spec answers this refusal case (the record's refusals are out of date)"
    except (ValueError, TypeError) as e:
        want = e
    try:
        dev_args, dev_kwargs = move_arguments(op, args, kwargs, backend.asarray)
        fn(*dev_args, **dev_kwargs)
    except Exception as got:  # noqa: BLE001 - the exception's type is what is compared
        if type(got) is type(want):
            return None
        return f"raised {type(got).__name__} ({got}); the spec raises {type(want).__name__} ({want})"
    return f"returned a result; the spec raises {type(want).__name__} ({want})"


def _check_refusals(backend: Backend, rec: OpRecord, fn, res: OpResult) -> None:
    """Run the op's refusal cases: the backend must raise the spec's exception type for each."""
    for case in rec.refusals():
        problem = _refusal_problem(backend, rec.name, fn, case.args, case.kwargs)
        if problem:
            res.status = "FAIL" if res.status == "PASS" else res.status
            res.messages.append(f"  {case.label} (a refusal): {problem}")
        else:
            res.refusals += 1


def run_conformance(backend: Backend, level: int = 1, seed: int = 0, max_errors: int = 10,
                    ops: list[str] | None = None, out=None, progress: bool = True) -> list[OpResult]:
    """Run every record (or those named in ``ops``) and return one ``OpResult`` per op."""
    out = out or sys.stdout
    try:
        gold = golden.load_golden()
    except FileNotFoundError as e:
        print(f"warning: {e}", file=out)
        gold = {}
    records = [r for r in all_records() if ops is None or r.name in ops]
    if ops:
        unknown = sorted(set(ops) - {r.name for r in records})
        if unknown:
            raise ValueError(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(r.name for r in all_records())}")
    results = []
    errors_left = max_errors
    for i, rec in enumerate(records):
        res = OpResult(rec.name)
        t0 = time.perf_counter()
        if progress:
            print(f"[{i + 1}/{len(records)}] {rec.name} ...", file=sys.stderr, flush=True)
        if not backend.implements(rec.name):
            res.status = "MISSING"
            results.append(res)
            continue
        ref = getattr(spec, rec.name)
        fn = getattr(backend, rec.name)
        wrong_signature = signature_problem(rec.name, fn)
        if wrong_signature:
            res.status = "ERROR"
            res.messages.append(f"  {wrong_signature} (lockstep/contract/__init__.py)")
            res.seconds = time.perf_counter() - t0
            results.append(res)
            continue
        golden_ok = None
        # The golden cases are the level-1 cases at the golden seed.
        golden_cases = rec.cases(golden.GOLDEN_SEED, golden.GOLDEN_LEVEL)
        cases = rec.cases(seed, level)
        if seed != golden.GOLDEN_SEED or level != golden.GOLDEN_LEVEL:
            cases = golden_cases + [Case(f"{c.label}@seed{seed}L{level}", c.args, c.kwargs) for c in cases]
        n_golden = len(golden_cases)
        for j, case in enumerate(cases):
            try:
                want = ref(*case.args, **case.kwargs)
                if j < n_golden and gold:
                    key = (rec.name, case.label)
                    if key not in gold:
                        golden_ok = False if golden_ok is False else None
                        res.messages.append(f"  {case.label}: not in the golden file")
                    elif golden.outputs_digest(want) != gold[key]:
                        golden_ok = False
                        res.messages.append(f"  {case.label}: the SPEC's output differs from the golden vector on this machine")
                    elif golden_ok is None:
                        golden_ok = True
                args, kwargs = _to_device(backend, rec.name, case)
                got = _to_host(backend, fn(*args, **kwargs))
                wants = as_outputs(want)
                gots = as_outputs(got)
                wrong_kind = result_problem(rec.name, got)
                if wrong_kind:
                    res.status = "FAIL"
                    res.messages.append(f"  {case.label}: {wrong_kind} (the contract: lockstep/contract/__init__.py)")
                    continue
            except Exception as e:  # noqa: BLE001 - a crashing backend is a reported result
                res.status = "ERROR"
                res.messages.append(f"  {case.label}: {type(e).__name__}: {e}")
                continue
            res.cases += 1
            if len(wants) != len(gots):
                res.status = "FAIL"
                res.messages.append(f"  {case.label}: expected {len(wants)} outputs, got {len(gots)}")
                continue
            for k, (w, g) in enumerate(zip(wants, gots)):
                res.elements += w.size
                if w.dtype != g.dtype or w.shape != g.shape or w.tobytes() != np.ascontiguousarray(g).tobytes():
                    res.status = "FAIL"
                    lines = _first_mismatches(w, g, Case(f"{case.label}[out{k}]", case.args), max(errors_left, 0))
                    errors_left -= len(lines) - 1
                    res.messages.extend(lines)
        _check_refusals(backend, rec, fn, res)
        if golden_ok is False:
            res.status = "FAIL"
            res.golden = "DIFFER"
        elif golden_ok:
            res.golden = "match"
        elif not gold:
            res.golden = "absent"
        res.seconds = time.perf_counter() - t0
        results.append(res)
    return results


def print_table(results: list[OpResult], backend: Backend, level: int, seed: int, out=None) -> None:
    out = out or sys.stdout
    counts = print_results(
        out, f"lockstep conformance: backend={backend.name} level={level} seed={seed} SPEC_VERSION={spec.SPEC_VERSION}",
        results, [("cases", 5, lambda r: r.cases), ("refused", 7, lambda r: r.refusals),
                  ("elements", 9, lambda r: r.elements), ("golden", 7, lambda r: r.golden),
                  ("time", 7, lambda r: f"{r.seconds:.2f}s")], ("PASS", "FAIL", "MISSING", "ERROR"))
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['MISSING']} missing, {counts['ERROR']} errors", file=out)


def all_passed(results: list[OpResult]) -> bool:
    return all(r.status == "PASS" for r in results)
