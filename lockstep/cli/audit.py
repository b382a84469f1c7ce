"""``lockstep audit``: verify a run, replay its steps, sign certificates, plan and merge a collective audit.

    lockstep audit verify RUN [--data DIR] [--no-batches] [--plot PNG]
    lockstep audit replay RUN --step t[,t2,a-b] [--backend B] [--from-earlier] [--out CERT] [--key PEM]
                          [--auditor NAME] [--data DIR]
    lockstep audit replay RUN --plan PLAN --beacon HEX --pub PEM ... --redundancy k --key PEM
                          (replay the steps the plan gives your key)
    lockstep audit check CERT... [--pub PEM] [--run RUN [--recompute] [--backend B] [--from-earlier] [--data DIR]]
    lockstep audit plan RUN --beacon HEX --pub PEM --pub PEM ... [--redundancy k] [--names a,b,...]
                        [--beacon-source TEXT] [--out PLAN]
    lockstep audit merge CERT... [--plan PLAN --beacon HEX --redundancy k] [--pub PEM ...] [--png OUT]
    lockstep audit keygen --out PREFIX                      (PREFIX.key and PREFIX.pub, Ed25519)
    lockstep audit verify-export DIR [RUN]                  (an export's weights against its proof and run)
    lockstep audit trace RUN --step t [--micro-batch j] --backend B --out TRACE.jsonl
    lockstep audit diff TRACE_A TRACE_B [--referee --run RUN --backend B [--op-file FILE]]

A trace records every backend op call of one step (address and input/output digests);
``diff`` names the first call whose inputs agree and outputs differ (or the input that
already differs, and where it came from); ``--referee`` computes that one call on the
spec and writes it to a safetensors file ``lockstep conformance --replay-op`` re-checks.

A plan is drawn from the run's commitment and a public beacon value (a drand or NIST
round) that the auditors name after the commitment is published; its auditors are
their public keys. Whoever reads a plan (replay, merge) names the beacon value, the
auditors' whole key set and the redundancy again (--beacon, --pub for every auditor,
--redundancy), as the auditors published them before the beacon round: the plan's own
copy is not evidence, and a plan drawn over any other key set or redundancy is refused.

Every string that comes from a file (names, messages quoting them) is printed through
``fsio.printable``: control characters are escaped, so nothing a file says can add a
line, move the cursor or colour the output.

Exit codes: 0 valid / match / consistent; 2 invalid / mismatch / inconsistent (every
finding listed); 1 the command could not run (a missing file, a bad argument, a
backend that is not installed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lockstep.audit.accept import check_certificate_file, trusted_keys
from lockstep.audit.certificate import (CertificateError, generate_keypair, load_private_key, make_certificate,
                                        public_key_hex, sign_certificate, write_certificate)
from lockstep.audit.merge import merge_certificates, plot_coverage
from lockstep.audit.plan import InvalidPlan, PlanError, accept_plan, format_plan, plan_audit, planned_auditor
from lockstep.audit.replay import ReplayError, replay_steps
from lockstep.audit.trace import DEFAULT_KEEP_VALUES, TraceError, trace_step, write_trace
from lockstep.audit.trace_diff import diff_files, referee
from lockstep.audit.verify import verify_run
from lockstep.backends import BACKEND_ALIASES, BackendUnavailable, FASTEST_FIRST, KNOWN_BACKENDS
from lockstep.formats.rundir import RunFileError
from lockstep.formats.trajectory import Strictness, read_commitment, read_trajectory
from lockstep.fsio import atomic_write_bytes, atomic_write_json, printable
from lockstep.launch import launcher_rank
from lockstep.use.plots import loss_curve_png

from .common import EXIT_BAD, EXIT_OK, MAX_MEMORY_HELP, fail, gib, plain_help, said
from .use import add_verify_export_parser

MAX_REPLAY_STEPS = 10_000_000  # the steps one --step list may name (a run has at most a few million)


def _steps_arg(text: str) -> list[int]:
    """``3``, ``3,7``, ``2-5`` or a mix: the steps to replay."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        a, dash, b = part.partition("-")
        try:
            lo, hi = int(a), int(b) if dash else int(a)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad step list {text!r}: use 3, 3,7 or 2-5") from None
        if lo < 1 or hi < lo or hi - lo > 1_000_000 or len(out) + hi - lo + 1 > MAX_REPLAY_STEPS:
            raise argparse.ArgumentTypeError(f"bad step range {part!r} (at most {MAX_REPLAY_STEPS} steps in all)")
        out.extend(range(lo, hi + 1))
    if not out:
        raise argparse.ArgumentTypeError("no step given")
    return out


def _or_list(names) -> str:
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


# every name get_backend knows (lockstep.backends), and what auto tries (FASTEST_FIRST, then the spec)
REPLAY_BACKEND_HELP = (f"{_or_list(['auto', *KNOWN_BACKENDS])} (aliases: "
                       f"{', '.join(f'{a} = {b}' for a, b in sorted(BACKEND_ALIASES.items()))}); default auto: the "
                       f"first of {', '.join(FASTEST_FIRST)} that is installed and passes conformance here, else spec")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``audit`` and its sub-commands to the ``lockstep`` parser."""
    p = subparsers.add_parser("audit", help="verify a run, replay steps, plan and merge a collective audit",
                              description=plain_help(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="audit_command",
                           metavar="{verify,replay,check,plan,merge,keygen,verify-export,trace,diff}")
    sub.required = True

    v = sub.add_parser("verify", help="check a run directory without replaying (structure, recipe, chain, "
                                      "checkpoints, data, commitment)")
    v.add_argument("run", type=Path, help="the run directory")
    v.add_argument("--data", type=Path, help="use this data folder instead of the recipe's")
    v.add_argument("--no-batches", action="store_true", help="do not rebuild the batch digests from the data")
    v.add_argument("--json", action="store_true", help="print the findings as JSON")
    v.add_argument("--plot", type=Path, metavar="PNG", help="redraw the loss curve from the verified trajectory "
                                                            "(loss.png and metrics.jsonl are not evidence)")

    r = sub.add_parser("replay", help="replay steps on this machine and compare with the published hashes")
    r.add_argument("run", type=Path, help="the run directory")
    r.add_argument("--step", type=_steps_arg, help="the step(s): 3, 3,7 or 2-5")
    r.add_argument("--plan", type=Path, help="replay the steps a plan gives the public key of --key (needs "
                                             "--beacon, --pub for every auditor and --redundancy)")
    r.add_argument("--beacon", help="with --plan: the beacon value (hex) the auditors named; the plan must be "
                                    "drawn with it")
    r.add_argument("--pub", action="append", default=None, help="with --plan: an auditor's public key (PEM or hex), "
                                                                "one per auditor of the published key set; the "
                                                                "plan must be drawn over exactly these keys")
    r.add_argument("--redundancy", type=int, help="with --plan: the redundancy the auditors published; the plan "
                                                  "must be drawn with it")
    r.add_argument("--backend", default="auto", help=REPLAY_BACKEND_HELP)
    r.add_argument("--from-earlier", action="store_true",
                   help="when a checkpoint a replay starts from is damaged, replay from an earlier one (or the "
                        "initial state) instead of stopping; the damage is still reported")
    r.add_argument("--data", type=Path, help="use this data folder instead of the recipe's")
    r.add_argument("--out", type=Path, help="write the certificate (JSON) here")
    r.add_argument("--key", type=Path, help="sign the certificate with this Ed25519 private key (PEM)")
    r.add_argument("--auditor", help="your name in the certificate (and in the plan)")
    r.add_argument("--max-memory", type=gib, metavar="GIB", help=MAX_MEMORY_HELP)
    r.add_argument("--scratch", type=Path, metavar="DIR", help="an existing folder for the out-of-core plan's files "
                                                               "(the AdamW moments and the tree's gradient sums, "
                                                               "memory-mapped; private, removed at the end)")
    r.add_argument("--quiet", action="store_true", help="no progress lines")

    c = sub.add_parser("check", help="check certificates: signatures, consistency, against a run, or recomputed")
    c.add_argument("certs", nargs="+", type=Path, help="certificate files")
    c.add_argument("--pub", action="append", default=[], help="trusted public key (PEM file or 64 hex digits); "
                                                              "repeatable; then unsigned certificates fail")
    c.add_argument("--run", type=Path, help="the run directory: check the quoted published hashes")
    c.add_argument("--recompute", action="store_true", help="with --run: replay the targets and compare")
    c.add_argument("--backend", default="auto", help="backend for --recompute: " + REPLAY_BACKEND_HELP)
    c.add_argument("--from-earlier", action="store_true", help="with --recompute: as audit replay --from-earlier")
    c.add_argument("--data", type=Path, help="data folder for --recompute")

    pl = sub.add_parser("plan", help="assign steps to auditors, drawn from the commitment and a public beacon")
    pl.add_argument("run", type=Path, help="the run directory (or its commitment.json)")
    pl.add_argument("--beacon", help="the randomness (hex, 32 to 64 bytes) of a public beacon round (drand, NIST) "
                                     "that the auditors named after the commitment was published; required")
    pl.add_argument("--beacon-source", help="a note naming that round (e.g. 'drand quicknet round 1234'); "
                                            "recorded in the plan, not drawn from")
    pl.add_argument("--pub", action="append", default=[], help="an auditor's public key (PEM or 64 hex digits); "
                                                               "one per auditor, repeatable; required")
    pl.add_argument("--auditors", type=int, help="number of auditors (optional: must be the number of --pub)")
    pl.add_argument("--redundancy", type=int, default=1, help="distinct auditors per step (default 1)")
    pl.add_argument("--names", help="comma-separated auditor names, in the order of --pub (default auditor-0, ...; "
                                    "labels only: merge matches certificates to the plan by key)")
    pl.add_argument("--out", type=Path, help="write the plan (JSON) here")

    m = sub.add_parser("merge", help="coverage, disagreements and missing steps of a set of certificates")
    m.add_argument("certs", nargs="+", type=Path, help="certificate files")
    m.add_argument("--plan", type=Path, help="the audit plan: checks redundancy and delivery (needs --beacon, "
                                             "--pub for every auditor and --redundancy)")
    m.add_argument("--beacon", help="with --plan: the beacon value (hex) the auditors named; the plan must be "
                                    "drawn with it")
    m.add_argument("--redundancy", type=int, help="with --plan: the redundancy the auditors published; the plan "
                                                  "must be drawn with it")
    m.add_argument("--pub", action="append", default=None, help="trusted public key (PEM or hex); repeatable; "
                                                                "with --plan, the auditors' whole key set: the "
                                                                "plan must be drawn over exactly these keys")
    m.add_argument("--png", type=Path, help="write a PNG of coverage over the steps")

    k = sub.add_parser("keygen", help="make an Ed25519 key pair for signing certificates")
    k.add_argument("--out", required=True, help="PREFIX: writes PREFIX.key (private, 0600) and PREFIX.pub")

    tr = sub.add_parser("trace", help="record every backend op call of one step (addresses and digests)")
    tr.add_argument("run", type=Path, help="the run directory")
    tr.add_argument("--step", type=int, required=True, help="the step to trace")
    tr.add_argument("--micro-batch", type=int, help="trace only this micro-batch (0-based) of the step")
    tr.add_argument("--backend", required=True, help="spec, numba, opencl, cuda or metal")
    tr.add_argument("--out", type=Path, required=True, help="the trace file (JSON lines) to write")
    tr.add_argument("--keep-values", type=int, default=None, metavar="N",
                    help="keep the values of outputs of at most N elements (default 65536; 0: digests only)")
    tr.add_argument("--data", type=Path, help="use this data folder instead of the recipe's")

    d = sub.add_parser("diff", help="the first op call at which two traces of a step part")
    d.add_argument("trace_a", type=Path)
    d.add_argument("trace_b", type=Path)
    d.add_argument("--referee", action="store_true", help="compute the disputed call on the spec (needs --run "
                                                          "and --backend)")
    d.add_argument("--run", type=Path, help="with --referee: the run directory the traces are of")
    d.add_argument("--backend", help="with --referee: the backend that re-executes the step to the call")
    d.add_argument("--op-file", type=Path, help="with --referee: where to write the call (safetensors; default "
                                                "beside TRACE_A)")
    d.add_argument("--data", type=Path, help="with --referee: use this data folder instead of the recipe's")

    p.set_defaults(func=run_audit)
    add_verify_export_parser(sub)  # sets its own func (lockstep.cli.use)
    return p


def _err(msg: str) -> int:
    return fail("audit", msg)


def run_audit(args) -> int:
    """Run ``lockstep audit <command>``; returns the exit code."""


    handlers = {"verify": _verify, "replay": _replay, "check": _check, "plan": _plan, "merge": _merge,
                "keygen": _keygen, "trace": _trace, "diff": _diff}
    try:
        return handlers[args.audit_command](args)
    except (ReplayError, PlanError, CertificateError, BackendUnavailable, FileNotFoundError, TraceError) as exc:
        return _err(said(exc))


def _verify(args) -> int:
    rep = verify_run(args.run, data=args.data, batches=not args.no_batches)
    if args.json:
        print(json.dumps({"run": str(rep.run_dir), "valid": rep.ok, "steps": rep.steps,
                          "chain_hash": rep.chain_hash, "genesis": rep.genesis,
                          "findings": [f.to_dict() for f in rep.findings]}, indent=2, sort_keys=True))
    else:
        print(rep.format())
    if args.plot is not None:
        if rep.chain_hash is None or not rep.ok:
            return _err(f"no loss curve drawn: {args.run} is invalid (see above); a curve is drawn only from a "
                        "valid run")
        png = loss_curve_png(read_trajectory(args.run, Strictness.AUDIT),
                             f"{args.run.name}: training loss (verified chain)")
        if png is None:
            return _err("--plot needs matplotlib: pip install 'lockstep[io]'")
        atomic_write_bytes(args.plot, png)
        print(printable(f"loss curve from the verified trajectory: {args.plot}"))
    return EXIT_OK if rep.ok else EXIT_BAD


def _replay(args) -> int:
    if args.plan is not None:
        steps = _planned_steps(args)
        if isinstance(steps, int):
            return steps
        if not steps:
            print(printable(f"the plan gives {args.key} no step"))
            return EXIT_OK
    elif args.step is None:
        return _err("give --step t (or --plan PLAN --beacon HEX --key PEM)")
    else:
        steps = args.step
    if args.key is not None:
        load_private_key(args.key)  # fail before hours of replay, not after
    log = None if args.quiet else (lambda msg: print(printable(msg), file=sys.stderr, flush=True))
    result = replay_steps(args.run, steps, args.backend, data=args.data, log=log, from_earlier=args.from_earlier,
                          max_memory=args.max_memory, scratch=args.scratch)
    if launcher_rank() != 0:  # under mpiexec: rank 0 prints the one verdict and writes the certificate
        return EXIT_OK if result.ok else EXIT_BAD
    print(result.format())
    if args.out is not None or args.key is not None:
        cert = make_certificate(result, auditor=args.auditor)
        if args.key is not None:
            cert = sign_certificate(cert, args.key)
        out = args.out or Path(f"certificate-{result.commitment[:12]}-steps-{steps[0]}-{steps[-1]}.json")
        write_certificate(out, cert)
        print(printable(f"certificate: {out}" + (" (signed)" if "signature" in cert else "")))
    return EXIT_OK if result.ok else EXIT_BAD


def _planned_steps(args) -> list[int] | int:
    """The steps the plan gives the key of ``--key``, after checking the plan against the beacon, the
    auditors' key set and the redundancy the user names, and the run's commitment; an exit code when it
    cannot be used."""
    missing = _plan_arguments_missing(args)
    if missing:
        return _err(missing)
    if args.key is None:
        return _err("--plan needs --key PEM: a plan names its auditors by public key, and only a certificate "
                    "signed by your key delivers your steps")
    try:
        plan = accept_plan(args.plan, args.beacon, trusted_keys(args.pub), args.redundancy)
        try:
            run = read_commitment(args.run)
        except RunFileError as exc:
            return _err(said(exc))
        if (run.get("chain_hash"), run.get("last_step")) != (plan["commitment"], plan["last_step"]):
            return _err(f"{args.plan}: the plan is for commitment {plan['commitment'][:16]}... ({plan['last_step']} "
                        f"steps), not this run's {str(run.get('chain_hash'))[:16]}... ({run.get('last_step')} steps)")
        mine = planned_auditor(plan, public_key_hex(args.key), args.auditor)
        if not args.auditor and mine.get("name"):
            args.auditor = mine["name"]  # the certificate carries the plan's label (merge goes by the key)
        return list(mine["steps"])
    except InvalidPlan as exc:
        return _err(said(exc))
    except PlanError as exc:
        return _err(f"{args.plan}: {said(exc)}")


def _plan_arguments_missing(args) -> str | None:
    """What ``--plan`` needs beside it and was not given (merge and replay read a plan alike)."""
    if not args.beacon:
        return ("--plan needs --beacon HEX: the beacon value the auditors named (the plan's own copy is not "
                "evidence)")
    if not args.pub:
        return ("--plan needs --pub for every auditor of the key set the auditors published before the beacon "
                "round: a plan drawn over a subset of the keys gives its maker more steps")
    if args.redundancy is None:
        return ("--plan needs --redundancy k, the redundancy the auditors published with their keys: a plan drawn "
                "with another one gives its maker another share of the steps")
    return None


def _check(args) -> int:
    trusted = trusted_keys(args.pub)
    def log(msg: str) -> None:
        print(printable(msg), file=sys.stderr, flush=True)

    bad = 0
    for path in args.certs:
        verdict = check_certificate_file(path, trusted, args.run, args.recompute, args.backend, args.data, log=log,
                                         from_earlier=args.from_earlier)
        if verdict.cert is None:
            print(printable(f"{path}: REJECTED: {verdict.problems[0]}"))
        elif verdict.problems:
            print(printable(f"{path}: {verdict.summary()}: REJECTED"))
            for pr in verdict.problems:
                print(printable(f"  {pr}"))
        else:
            print(printable(f"{path}: {verdict.summary()}: ok" + (" (recomputed)" if verdict.recomputed else "")))
        bad += not verdict.accepted
    return EXIT_BAD if bad else EXIT_OK


def _plan(args) -> int:

    if not args.beacon:
        return _err("a plan needs --beacon HEX: the value of a public beacon round (drand, NIST) that the auditors "
                    "named after the commitment was published; a plan drawn from the commitment alone can be "
                    "ground by the trainer")
    if not args.pub:
        return _err("a plan needs the auditors' public keys: --pub PEM (or 64 hex digits), one per auditor")
    if args.auditors is not None and args.auditors != len(args.pub):
        return _err(f"--auditors {args.auditors} but {len(args.pub)} --pub key(s)")
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    plan = plan_audit(args.run, trusted_keys(args.pub), args.beacon, args.redundancy, names, args.beacon_source)
    print(format_plan(plan))
    if args.out is not None:
        atomic_write_json(args.out, plan)
        print(printable(f"plan: {args.out}"))
    return EXIT_OK


def _merge(args) -> int:
    plan = None
    if args.plan is not None:
        missing = _plan_arguments_missing(args)
        if missing:
            return _err(missing)
        try:
            plan = accept_plan(args.plan, args.beacon, trusted_keys(args.pub), args.redundancy)
        except InvalidPlan as exc:  # a plan, but not the one you named: the audit it describes fails
            print(printable(said(exc)))
            return EXIT_BAD
    report = merge_certificates(args.certs, plan, trusted_keys(args.pub))
    print(report.format())
    if args.png is not None:
        try:
            print(printable(f"coverage plot: {plot_coverage(report, args.png)}"))
        except RuntimeError as exc:
            return _err(said(exc))
    return EXIT_OK if report.ok else EXIT_BAD


def _keygen(args) -> int:
    priv, pub = generate_keypair(args.out)
    print(printable(f"private key: {priv} (keep it secret)"))
    print(printable(f"public key:  {pub} ({public_key_hex(pub)})"))
    return EXIT_OK


def _trace(args) -> int:
    keep = DEFAULT_KEEP_VALUES if args.keep_values is None else args.keep_values
    if keep < 0 or args.step < 1 or (args.micro_batch is not None and args.micro_batch < 0):
        return _err("--step is 1 or more, --micro-batch and --keep-values 0 or more")
    t = trace_step(args.run, args.step, args.backend, micro_batch=args.micro_batch, data=args.data, keep_values=keep)
    write_trace(args.out, t.header, t.records)
    published = ("" if "state_root" not in t.header else
                 f"; the step's state root {'matches' if t.header['matches_published_state_root'] else 'DIFFERS from'} "
                 "the published one")
    print(printable(f"trace of step {args.step} on {t.header['backend']}: {len(t.records)} op calls, root {t.root}"
                    f"{published}; written to {args.out}"))
    return EXIT_OK


def _diff(args) -> int:
    a, b, d = diff_files(args.trace_a, args.trace_b)
    print(printable(d.text))
    if args.referee:
        if args.run is None or not args.backend:
            return _err("--referee needs --run RUN and --backend B (the step is re-executed to the disputed call)")
        if d.kind == "same":
            return EXIT_OK
        v = referee(a, b, d, args.run, args.backend, data=args.data, op_file=args.op_file)
        print(printable(v.text))
    return EXIT_OK if d.kind == "same" else EXIT_BAD
