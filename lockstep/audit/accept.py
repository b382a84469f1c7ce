"""What an auditor accepts: the rule ``lockstep audit check`` applies to a certificate, and the
steps an audit plan gives one auditor.

A certificate is accepted when it loads (format, structure, integer-only JSON), its
signature is valid and, with trusted keys given, made by one of them (an unsigned
certificate is then refused), its claims are consistent with one replay of its targets,
and, given the run, it quotes the run's published values; with ``recompute`` every
claimed step is replayed here and must give the claimed hashes and verdicts. Every
problem found is listed; nothing is printed here (the command line formats the verdict).
An auditor's steps in a plan are found by their public key (``auditor_steps``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.formats.run import Run
from lockstep.formats.rundir import RunFileError
from lockstep.formats.trajectory import Strictness

from .certificate import (consistency_problems, load_certificate, public_key_hex, recheck_certificate, run_problems,
                          signature_problem)
from .plan import planned_auditor


@dataclass
class CertificateVerdict:
    """The outcome of ``check_certificate_file``: ``accepted`` when no problem was found."""

    path: Path
    cert: dict | None  # None when the file could not be loaded as a certificate
    problems: list[str] = field(default_factory=list)
    recomputed: bool = False

    @property
    def accepted(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """``outcome match, steps [3, 4], signed by 1a2b...`` (the certificate's own words; print it escaped)."""
        if self.cert is None:
            return "not a certificate"
        signer = self.cert.get("signature", {}).get("public_key", "")
        return (f"outcome {self.cert['outcome']}, steps {[s['step'] for s in self.cert['steps']]}"
                + (f", signed by {signer[:16]}..." if signer else ", unsigned"))


def trusted_keys(keys: list[str] | None) -> list[str] | None:
    """Public keys (PEM files or 64 hex digits) as hex; None when none is given (signatures then optional)."""
    return [public_key_hex(k) for k in keys] if keys else None


def check_certificate_file(path: str | os.PathLike, trusted: list[str] | None = None,
                           run_dir: str | os.PathLike | None = None, recompute: bool = False,
                           backend_name: str = "auto", data: str | os.PathLike | None = None, log=None,
                           from_earlier: bool = False) -> CertificateVerdict:
    """Load the certificate at ``path`` and apply the acceptance rule (module docstring).

    ``trusted``: hex public keys (``trusted_keys``); ``run_dir``: check the quoted
    published values against this run; ``recompute`` (with ``run_dir``): replay the
    claimed steps on ``backend_name`` and compare. A file that does not load is a
    verdict with its one problem, never an exception.
    """
    path = Path(path)
    try:
        cert = load_certificate(path)
    except Exception as exc:  # noqa: BLE001 - an unreadable file is a refusal to report, not a crash
        return CertificateVerdict(path, None, [str(exc)])
    problems = []
    sig = signature_problem(cert, trusted)
    if sig:
        problems.append(sig)
    problems += consistency_problems(cert)
    recomputed = False
    if run_dir is not None:
        try:
            run = Run.open(run_dir, Strictness.AUDIT)  # once: the checks below read this one opened run
        except RunFileError as exc:
            problems.append(str(exc))
        else:
            problems += run_problems(cert, run)
            if recompute:
                problems += recheck_certificate(cert, run, backend_name, data, log=log, from_earlier=from_earlier)
                recomputed = True
    return CertificateVerdict(path, cert, problems, recomputed)


def auditor_steps(plan: dict, auditor: str | None = None, public_key: str | None = None) -> list[int]:
    """The steps ``plan`` (as ``plan.load_plan`` returns it) gives one auditor: the one with ``public_key``
    (hex; how ``audit merge`` matches certificates to the plan), else the one named ``auditor`` (or by index).

    ``PlanError`` when the plan has no such auditor, or gives the key to another name than
    ``auditor``; an auditor given no step gets [].
    """
    return list(planned_auditor(plan, public_key, auditor)["steps"])
