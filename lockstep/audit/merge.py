"""``lockstep audit merge CERT...``: what a set of certificates says about a run, together.

For each certificate: its structure, its internal consistency (a "match" must list
equal hashes, and its steps must be what one replay of its targets produces:
``certificate.replay_shape_problems``, so a step no replay of the targets reached is
never counted) and its signature (if signed; with ``--pub`` only certificates signed
by the given keys count). Rejected certificates are listed and count for nothing.
Certificates for another commitment than the first (or the plan's) are rejected too.

Then, per step of the run:

* **coverage**: the distinct auditors (signing key, else ``auditor`` name, else the
  file) whose certificates replayed the step, and their outcomes;
* **authentication**: only with ``--pub`` (``trusted_keys``) is every counted
  certificate signed by a key someone vouched for. Without it the names and keys are
  self-declared (anyone can make three keys), so the merge reports coverage as
  claimed and its verdict says UNAUTHENTICATED: never a complete audit by distinct
  auditors;
* **disagreements**: two certificates for the same step with different replayed state
  roots or chain hashes, or different outcomes (one of them is wrong, or the run's
  state is not a function of its recipe);
* **mismatches**: steps whose replay did not reproduce the published hashes (the run
  fails its audit there);
* **run problems**: what certificates report as making the run invalid or damaged
  (a broken chain, a checkpoint that contradicts the run or is damaged); any one
  makes the merge inconsistent;
* **missing**: steps no certificate covers; with ``--plan``, steps covered by fewer
  distinct auditors than the plan's redundancy, and planned (auditor, step) pairs
  that no certificate of that auditor delivered. A planned auditor is its public key:
  only a certificate signed by that key (and, with ``--pub``, trusted) delivers its
  steps, whatever name a certificate gives itself. ``audit merge --plan`` also takes
  beacon value, the auditors' whole key set and the redundancy from its user and
  refuses a plan drawn with any other (``plan.accept_plan``).

``merge_certificates`` returns a ``MergeReport``; ``format`` prints the table and
``plot_coverage`` writes a PNG (matplotlib) of coverage over the steps.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.fsio import atomic_write_bytes, printable

from .certificate import CertificateError, auditor_id, consistency_problems, load_certificate, signature_problem
from .plan import InvalidPlan, key_set_problems


@dataclass
class StepCoverage:
    step: int
    auditors: dict[str, str] = field(default_factory=dict)  # auditor -> "match" / "mismatch"
    roots: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)  # auditor -> (root, chain)

    @property
    def count(self) -> int:
        return len(self.auditors)

    @property
    def disagreement(self) -> bool:
        return len(set(self.auditors.values())) > 1 or len(set(self.roots.values())) > 1

    @property
    def status(self) -> str:
        if not self.auditors:
            return "missing"
        if self.disagreement:
            return "DISAGREE"
        return "match" if set(self.auditors.values()) == {"match"} else "MISMATCH"


@dataclass
class MergeReport:
    commitment: str | None
    last_step: int
    steps: dict[int, StepCoverage]
    accepted: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (certificate, why)
    redundancy: int | None = None
    undelivered: list[tuple[str, int]] = field(default_factory=list)  # (planned auditor, step)
    authenticated: bool = False  # every counted certificate is signed by a key given with --pub
    run_problems: list[tuple[str, str]] = field(default_factory=list)  # (certificate, what makes the run invalid)

    @property
    def missing_ranges(self) -> list[tuple[int, int]]:
        """The steps of 1..last_step no accepted certificate covers, as inclusive ``(first, last)`` ranges.

        ``steps`` holds only covered steps, so this costs the number of covered steps,
        whatever ``last_step`` a certificate or plan names.
        """
        out, nxt = [], 1
        for s in sorted(self.steps):
            if s > nxt:
                out.append((nxt, s - 1))
            nxt = s + 1
        if nxt <= self.last_step:
            out.append((nxt, self.last_step))
        return out

    @property
    def missing_count(self) -> int:
        return sum(b - a + 1 for a, b in self.missing_ranges)

    @property
    def under_covered(self) -> list[int]:
        k = self.redundancy or 1
        return [s for s, c in self.steps.items() if 0 < c.count < k]

    @property
    def disagreements(self) -> list[int]:
        return [s for s, c in self.steps.items() if c.disagreement]

    @property
    def mismatches(self) -> list[int]:
        return [s for s, c in self.steps.items() if not c.disagreement and c.status == "MISMATCH"]

    @property
    def consistent(self) -> bool:
        """Every step covered k times, no disagreement, mismatch, rejection or undelivered assignment."""
        return not (self.missing_ranges or self.under_covered or self.disagreements or self.mismatches
                    or self.rejected or self.undelivered or self.run_problems)

    @property
    def ok(self) -> bool:
        """A complete audit by distinct auditors: consistent, and every auditor's identity verified."""
        return self.consistent and self.authenticated

    def format(self, max_rows: int = 60) -> str:
        k = self.redundancy
        lines = [f"commitment {self.commitment or '(none)'}: steps 1..{self.last_step}, "
                 f"{len(self.accepted)} certificate(s) accepted, {len(self.rejected)} rejected"
                 + (f", planned redundancy {k}" if k else "")]
        for name, why in self.rejected:
            lines.append(f"  rejected {name}: {why}")
        for name, why in self.run_problems[:20]:
            lines.append(f"  RUN INVALID OR DAMAGED according to {name}: {why}")
        lines.append(f"  {'step':>8}  {'auditors':>8}  status    detail")
        rows = []
        for s, c in self.steps.items():
            interesting = c.status != "match" or (k is not None and c.count < k)
            rows.append((s, c, interesting))
        shown = [r for r in rows if r[2]] if len(rows) > max_rows else rows
        for s, c, _ in shown[:max_rows]:
            detail = ""
            if c.disagreement:
                detail = "; ".join(f"{a[:24]}: {o} root {(c.roots[a][0] or '-')[:12]}" for a, o in c.auditors.items())
            elif c.status == "MISMATCH":
                detail = "replay did not reproduce the published hashes"
            elif k is not None and c.count < k:
                detail = f"covered {c.count} of {k} times"
            lines.append(f"  {s:>8}  {c.count:>8}  {c.status:<8}  {detail}")
        if len(shown) < len(rows):
            lines.append(f"  ... {len(rows) - len(shown)} fully covered matching step(s) not shown")
        if len(shown) > max_rows:
            lines.append(f"  ... {len(shown) - max_rows} more")
        gaps = self.missing_ranges
        for a, b in gaps[:max_rows]:
            lines.append(f"  {a if a == b else f'{a}-{b}':>8}  {0:>8}  missing")
        if len(gaps) > max_rows:
            lines.append(f"  ... {len(gaps) - max_rows} more missing range(s)")
        for a, s in self.undelivered[:20]:
            lines.append(f"  planned but not delivered: {a} step {s}")
        if len(self.undelivered) > 20:
            lines.append(f"  ... {len(self.undelivered) - 20} more undelivered")
        covered = self.last_step - self.missing_count
        lines.append(f"coverage {covered}/{self.last_step} step(s); missing {_format_ranges(self.missing_ranges)}; "
                     f"disagreements {_ranges(self.disagreements)}; mismatches {_ranges(self.mismatches)}")
        if not self.authenticated:
            lines.append(("coverage as claimed, " if self.consistent else "INCOMPLETE OR INCONSISTENT, and ")
                         + "UNAUTHENTICATED: no --pub, so who made each certificate is not verified and "
                           "self-named or self-signed certificates cannot count as distinct auditors; pass the "
                           "auditors' public keys with --pub")
        else:
            lines.append("COMPLETE AND CONSISTENT" if self.ok else "INCOMPLETE OR INCONSISTENT")
        return "\n".join(printable(line) for line in lines)  # untrusted names cannot add lines


def _format_ranges(ranges: list[tuple[int, int]]) -> str:
    if not ranges:
        return "none"
    out = [str(a) if a == b else f"{a}-{b}" for a, b in ranges[:20]]
    return ", ".join(out) + (" ..." if len(ranges) > 20 else "")


def _ranges(steps: list[int]) -> str:
    """``1-3, 7``: ascending steps as ranges."""
    ranges: list[tuple[int, int]] = []
    for s in sorted(steps):
        if ranges and s == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], s)
        else:
            ranges.append((s, s))
    return _format_ranges(ranges)


def merge_certificates(paths: list[str | os.PathLike], plan: dict | None = None,
                       trusted_keys: list[str] | None = None) -> MergeReport:
    """Merge certificate files (module docstring); ``plan`` from ``plan.accept_plan``; ``trusted_keys`` hex.

    With both a plan and trusted keys, the plan must be drawn over exactly those keys
    (``InvalidPlan`` otherwise): a plan over a subset would let its maker deliver more
    than his share.
    """
    if plan is not None and trusted_keys is not None:
        problems = key_set_problems(plan, trusted_keys)
        if problems:
            raise InvalidPlan("the plan is not valid for the keys you trust: " + problems[0])
    certs: list[tuple[str, dict]] = []
    rejected: list[tuple[str, str]] = []
    for p in paths:
        name = str(p)
        try:
            cert = load_certificate(p)
        except CertificateError as exc:
            rejected.append((name, str(exc)))
            continue
        why = signature_problem(cert, trusted_keys)
        if why is None:
            bad = consistency_problems(cert)
            why = "; ".join(bad) if bad else None
        if why is not None:
            rejected.append((name, why))
            continue
        certs.append((name, cert))

    commitment = plan["commitment"] if plan else (certs[0][1]["run"]["commitment"] if certs else None)
    last_step = plan["last_step"] if plan else max((c["run"]["last_step"] for _, c in certs), default=0)
    kept = []
    for name, cert in certs:
        if cert["run"]["commitment"] != commitment:
            rejected.append((name, f"for commitment {cert['run']['commitment'][:16]}..., not {commitment[:16]}..."))
        elif cert["run"]["last_step"] != last_step:
            rejected.append((name, f"says the run has {cert['run']['last_step']} steps, not {last_step}"))
        else:
            kept.append((name, cert))

    steps: dict[int, StepCoverage] = {}  # only covered steps: never one entry per step of last_step
    for name, cert in kept:
        who = auditor_id(cert, name)
        for s in cert["steps"]:
            if not 1 <= s["step"] <= last_step:
                continue
            cov = steps.setdefault(s["step"], StepCoverage(s["step"]))
            outcome = "match" if s["match"] else "mismatch"
            if who in cov.auditors and (cov.auditors[who] != outcome):
                outcome = "mismatch"  # one auditor, two answers: count the worse
            cov.auditors[who] = outcome
            cov.roots[who] = (s["replayed"].get("state_root"), s["replayed"].get("chain_hash"))

    report = MergeReport(commitment, last_step, dict(sorted(steps.items())), [n for n, _ in kept], rejected,
                         plan["redundancy"] if plan else None, authenticated=bool(trusted_keys),
                         run_problems=[(name, p) for name, cert in kept for p in cert.get("problems", [])])
    if plan:
        # a planned auditor is its public key: only certificates signed by that key deliver its steps (the
        # certificate's ``auditor`` name is self-declared, and one key may not deliver another's share)
        by_key: dict[str, set[int]] = {}
        for name, cert in kept:
            sig = cert.get("signature")
            if isinstance(sig, dict):
                by_key.setdefault(sig["public_key"], set()).update(s["step"] for s in cert["steps"])
        for a in plan["auditors"]:
            got = by_key.get(a["public_key"], set())
            who = f"{a.get('name') or a['index']} (key {a['public_key'][:16]}...)"
            report.undelivered += [(who, s) for s in a["steps"] if s not in got]
    return report


def plot_coverage(report: MergeReport, path: str | os.PathLike) -> Path:
    """A PNG of coverage over the steps: bars per step, coloured by status; the plan's k as a line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("the coverage PNG needs matplotlib: pip install 'lockstep[io]'") from None
    colours = {"match": "#2e7d32", "MISMATCH": "#c62828", "DISAGREE": "#ff8f00", "missing": "#9e9e9e"}
    xs = list(report.steps)  # covered steps only; missing ones are drawn as grey spans
    counts = [report.steps[s].count for s in xs]
    cols = [colours[report.steps[s].status] for s in xs]
    fig, ax = plt.subplots(figsize=(max(6, min(16, len(xs) / 20)), 3.5))
    for a, b in report.missing_ranges[:1000]:
        ax.axvspan(a - 0.5, b + 0.5, color=colours["missing"], alpha=0.35, linewidth=0)
    ax.bar(xs, counts, color=cols, width=0.9 if len(xs) <= 100 else 1.0, linewidth=0)
    if report.redundancy:
        ax.axhline(report.redundancy, color="black", linestyle="--", linewidth=1, label=f"planned k={report.redundancy}")
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=s.lower()) for s, c in colours.items()]
    if report.redundancy:
        handles.append(ax.get_lines()[0])
    from matplotlib.ticker import MaxNLocator

    top = max(counts + [report.redundancy or 1])
    ax.set_ylim(0, top + 1)
    ax.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, frameon=False)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("distinct auditors")
    ax.set_title(f"audit coverage of run {(report.commitment or '?')[:16]}...: "
                 f"{report.last_step - report.missing_count}/{report.last_step} steps covered")
    ax.set_xlim(0.5, max(report.last_step, 1) + 0.5)
    fig.tight_layout()
    buf = io.BytesIO()  # rendered in memory, then written by the atomic writer (no fixed temporary name)
    fig.savefig(buf, format="png")
    plt.close(fig)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path
