"""Audit certificates: what an auditor publishes after a replay, optionally signed (Ed25519).

A certificate is a JSON object::

    {"format": "lockstep.audit-certificate", "version": 2,
     "run": {"commitment": H_N, "last_step": N, "genesis": H_0, "recipe_sha256": ..., "preset": "tiny"},
     "targets": [t, ...],                 the steps asked for
     "steps": [{"step": s, "start": c, "match": true, "replayed": {...}, "published": {...},
                "differs": [...], "tensor_diffs": [...], "note": ..., "world_size": R}, ...],
                                          every replayed step (targets and the steps before them);
                                          world_size: the ranks that trained it, as the run's
                                          metrics.jsonl says (a fact no hash binds; absent if unsaid)
     "outcome": "match" | "mismatch",
     "backend": "spec", "backend_description": ..., "spec_version": ..., "lockstep_version": ...,
     "machine": {"cpu": ..., "cores": ..., "gpu": ..., "os": ..., "python": ..., "numpy": ...},
     "milliseconds": 1234, "created_utc": "2026-01-01T00:00:00Z", "auditor": "name" (optional),
     "notes": [...] (optional), "problems": [...] (optional: what makes the run invalid; outcome "mismatch"),
     "signature": {"algorithm": "ed25519", "public_key": HEX32, "value": HEX64} (optional)}

The ``steps`` are what one replay of the ``targets`` produces
(``replay_shape_problems``): each step once, ascending, ``0 <= start < step``, the
entries with one start consecutive from ``start + 1`` and ending at a target or a
mismatch; claims of any other shape are refused, so nothing counts a step no replay
of the targets reached.

Numbers are integers only (times in milliseconds), so the canonical bytes are the
same in every language; step numbers (``run.last_step``, ``steps``, ``targets``) are at
most ``MAX_STEP_NUMBER`` = 2**53 in magnitude. **Canonical bytes** (what is signed)::

    b"lockstep.audit-certificate.v2\\0" || JSON of the certificate without "signature",
    keys sorted, separators "," and ":", ASCII only (\\uXXXX escapes), no NaN

A signature proves who made the claim and that it was not edited since; only a
recomputation (``recheck_certificate``) proves the claim itself. Keys are PEM files
(PKCS#8 private, SubjectPublicKeyInfo public), handled by the ``cryptography`` package.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

import lockstep
from lockstep.errors import LockstepError, Setting
from lockstep.formats.run import Run
from lockstep.formats.rundir import RunFileError
from lockstep.formats.trajectory import Strictness
from lockstep.fsio import FileFormatError, atomic_write_bytes, json_bytes, read_json, read_named_file
from lockstep.spec import SPEC_VERSION

from . import replay
from .replay import ReplayError

CERT_FORMAT = "lockstep.audit-certificate"
CERT_VERSION = 2
SIGNING_DOMAIN = b"lockstep.audit-certificate.v2\x00"
MAX_KEY_BYTES = 64 << 10
# Step numbers a certificate may name (run.last_step, steps, targets): every one is then exactly a float64, so
# `audit merge --png` can draw it (10**400 cannot be converted); a run's trajectory caps real ones far below.
MAX_STEP_NUMBER = 2**53
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CertificateError(LockstepError, ValueError):
    """A certificate or key is malformed, or signing/checking cannot be done."""


# ---------------------------------------------------------------------------
# Machine facts
# ---------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", "rb") as f:
            for line in f.read(1 << 20).decode("utf-8", "replace").splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    if platform.system() == "Darwin" and shutil.which("sysctl"):
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def _gpus() -> list[str]:
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10)
            if out.returncode == 0:
                return [line.strip() for line in out.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return ["Apple GPU (Apple silicon)"]
    return []


def machine_facts() -> dict:
    """CPU model and cores, GPUs (via nvidia-smi where present), OS, Python, NumPy (and numba)."""
    facts = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "gpu": _gpus(),
        "os": platform.platform(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    try:
        import numba

        facts["numba"] = numba.__version__
    except ImportError:
        pass
    return facts


# ---------------------------------------------------------------------------
# Building, canonical bytes, reading
# ---------------------------------------------------------------------------


def make_certificate(result, auditor: str | None = None) -> dict:
    """The (unsigned) certificate of a ``replay.ReplayResult``."""
    cert = {
        "format": CERT_FORMAT,
        "version": CERT_VERSION,
        "run": {"commitment": result.commitment, "last_step": result.last_step, "genesis": result.genesis,
                "recipe_sha256": result.recipe_sha256, "preset": result.preset},
        "targets": list(result.targets),
        "steps": [c.to_dict() for c in result.checks],
        "outcome": result.outcome,
        "backend": result.backend,
        "backend_description": result.backend_description,
        "spec_version": SPEC_VERSION,
        "lockstep_version": lockstep.__version__,
        "machine": machine_facts(),
        "milliseconds": int(round(result.seconds * 1000)),
        "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    notes = list(result.notes) + [f"damaged, replayed from an earlier state: {d}" for d in result.skipped_damaged]
    if notes:
        cert["notes"] = notes
    problems = list(result.problems) + [f"damaged: {d}" for d in result.damaged]
    if problems:
        cert["problems"] = problems
    if auditor:
        cert["auditor"] = str(auditor)
    return cert


def canonical_bytes(cert: dict) -> bytes:
    """The bytes a signature covers (module docstring): the certificate without ``signature``."""
    body = {k: v for k, v in cert.items() if k != "signature"}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except ValueError as exc:
        raise CertificateError(f"certificate cannot be encoded canonically: {exc}") from None
    return SIGNING_DOMAIN + text.encode("ascii")


def write_certificate(path: str | os.PathLike, cert: dict) -> None:
    atomic_write_bytes(path, json_bytes(cert))


def _scalar_map(x) -> bool:
    """A JSON object of strings, numbers, booleans or nulls: what a step's hashes and counts are (a list or
    an object there cannot be compared or counted by ``audit merge``)."""
    return isinstance(x, dict) and all(v is None or isinstance(v, (str, int, float)) for v in x.values())


def _check_structure(cert, where: str) -> None:
    if not isinstance(cert, dict) or cert.get("format") != CERT_FORMAT:
        raise CertificateError(f"{where}: not a lockstep audit certificate (format {CERT_FORMAT!r})")
    if cert.get("version") != CERT_VERSION:
        raise CertificateError(f"{where}: certificate version {cert.get('version')!r} is not {CERT_VERSION}; "
                               "upgrade lockstep")
    run = cert.get("run")
    if not isinstance(run, dict) or not (isinstance(run.get("commitment"), str) and _HEX64.fullmatch(run["commitment"])):
        raise CertificateError(f"{where}: run.commitment must be 64 lowercase hex digits")
    if type(run.get("last_step")) is not int or abs(run["last_step"]) > MAX_STEP_NUMBER:
        raise CertificateError(f"{where}: run.last_step must be an integer of at most {MAX_STEP_NUMBER} (2**53)")
    steps = cert.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) and type(s.get("step")) is int
                                              and abs(s["step"]) <= MAX_STEP_NUMBER
                                              and _scalar_map(s.get("replayed")) and _scalar_map(s.get("published"))
                                              and isinstance(s.get("match"), bool) for s in steps):
        raise CertificateError(f"{where}: 'steps' must be a list of {{step, match, replayed, published}} objects "
                               f"(replayed and published map names to hashes or numbers; steps at most "
                               f"{MAX_STEP_NUMBER})")
    if not isinstance(cert.get("targets"), list) or not all(type(t) is int and abs(t) <= MAX_STEP_NUMBER
                                                            for t in cert["targets"]):
        raise CertificateError(f"{where}: 'targets' must be a list of integers of at most {MAX_STEP_NUMBER}")
    extra = cert.get("problems", [])
    if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
        raise CertificateError(f"{where}: 'problems' must be a list of strings")
    if cert.get("outcome") not in ("match", "mismatch"):
        raise CertificateError(f"{where}: outcome must be 'match' or 'mismatch'")
    sig = cert.get("signature")
    if sig is not None and not (isinstance(sig, dict) and sig.get("algorithm") == "ed25519"
                                and isinstance(sig.get("public_key"), str) and isinstance(sig.get("value"), str)):
        raise CertificateError(f"{where}: signature must be {{algorithm: ed25519, public_key, value}}")


def load_certificate(path: str | os.PathLike) -> dict:
    """Read a certificate (strict JSON, checked shape); ``CertificateError`` names the file."""
    try:
        cert = read_json(path, "audit certificate", max_bytes=256 << 20)
    except (FileFormatError, OSError) as exc:
        raise CertificateError(str(exc)) from None
    _check_structure(cert, str(path))
    return cert


def replay_shape_problems(cert: dict) -> list[str]:
    """Step entries that no replay of the certificate's targets can have produced.

    A replay of targets t_1 < t_2 < ... (``replay.replay_steps``) starts each target
    from a checkpoint c < t (or the initial state, c = 0) and replays c+1, ..., t, or
    goes on from the previous target's state; it stops a target's replay at its first
    mismatch. So each step appears once, ``0 <= start < step <= the last target``,
    the entries with one start are consecutive from start + 1, and a run of them ends
    at a target or at a mismatch. Anything else is a claim without a replay behind it.
    """
    problems = []
    targets = sorted(set(cert["targets"]))
    last_target = targets[-1] if targets else 0
    steps = [s["step"] for s in cert["steps"]]
    seen: set[int] = set()
    for s in cert["steps"]:
        step, start = s["step"], s.get("start")
        if step in seen:
            problems.append(f"step {step}: claimed twice")
        seen.add(step)
        if type(start) is not int or not 0 <= start < step:
            problems.append(f"step {step}: start {start!r} is not a checkpoint before it (0 <= start < {step})")
        elif step > last_target:
            problems.append(f"step {step}: beyond the certificate's last target {last_target}; a replay of its "
                            "targets never reaches it")
    if problems:
        return problems
    by_step = {s["step"]: s for s in cert["steps"]}
    first_missing = _first_missing_after_start(cert["steps"])  # never a loop over the claimed step numbers
    for s in cert["steps"]:
        step, start = s["step"], s["start"]
        if first_missing[start] < step:
            problems.append(f"step {step}: replayed from {'checkpoint ' + str(start) if start else 'the initial state'}"
                            f" without step {first_missing[start]} before it")
        nxt = by_step.get(step + 1)
        continues = nxt is not None and nxt["start"] == start
        if not continues and step not in targets and s["match"]:
            problems.append(f"step {step}: neither a target nor followed by step {step + 1}; a replay stops only at "
                            "a target or a mismatch")
    if steps != sorted(steps):
        problems.append("the steps are not in ascending order")
    return problems


def _first_missing_after_start(steps: list[dict]) -> dict[int, int]:
    """For each ``start``, the first step after it that no entry with that start claims.

    Sorting the claimed steps costs O(n log n) in the number of entries, however large
    the step numbers a certificate states (a loop from start to step would not end).
    """
    by_start: dict[int, list[int]] = {}
    for s in steps:
        by_start.setdefault(s["start"], []).append(s["step"])
    out = {}
    for start, claimed in by_start.items():
        expected = start + 1
        for u in sorted(claimed):
            if u != expected:
                break
            expected += 1
        out[start] = expected
    return out


def consistency_problems(cert: dict) -> list[str]:
    """Claims inside one certificate that contradict each other (no replay needed)."""
    problems = replay_shape_problems(cert)
    all_match = True
    for s in cert["steps"]:
        rep, pub = s["replayed"], s["published"]
        differ = sorted(k for k in rep if k in pub and rep[k] != pub[k])
        if s["match"] and (differ or not rep.get("state_root") or rep.get("state_root") != pub.get("state_root")
                           or rep.get("chain_hash") != pub.get("chain_hash")):
            problems.append(f"step {s['step']}: claims a match but its replayed and published hashes differ "
                            f"({differ or ['state_root/chain_hash']})")
        if not s["match"] and not differ and rep.get("state_root") == pub.get("state_root"):
            problems.append(f"step {s['step']}: claims a mismatch but lists equal hashes")
        all_match &= bool(s["match"])
    covered = {s["step"] for s in cert["steps"]}
    missing = [t for t in cert["targets"] if t not in covered]
    if cert["outcome"] == "match" and cert.get("problems"):
        problems.append("outcome 'match' but the certificate lists problems that make the run invalid")
    if cert["outcome"] == "match" and (not all_match or missing):
        problems.append("outcome 'match' but " + ("a step mismatched" if not all_match else f"targets {missing} "
                                                                                              "were not replayed"))
    if cert["outcome"] == "mismatch" and all_match and not missing and not cert.get("problems"):
        problems.append("outcome 'mismatch' but every step matched")
    last = {s["step"]: s for s in cert["steps"]}.get(cert["run"]["last_step"])
    if last is not None and last["published"].get("chain_hash") != cert["run"]["commitment"]:
        problems.append(f"the published chain hash of the last step {cert['run']['last_step']} is not the "
                        "run's commitment")
    return problems


# ---------------------------------------------------------------------------
# Keys and signatures (Ed25519 via the cryptography package)
# ---------------------------------------------------------------------------


def _crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise CertificateError.naming("signing needs the 'cryptography' package: pip install 'lockstep[io]' (or "
                                      "leave out ", Setting("key_path"), " / ", Setting("trusted_keys"), ")") from None
    return serialization, ed25519


def _read_key_file(path: str | os.PathLike) -> bytes:
    path = Path(path)
    try:
        return read_named_file(path, "key file", MAX_KEY_BYTES)
    except FileNotFoundError:
        raise CertificateError(f"key file not found: {path}") from None
    except (OSError, ValueError) as exc:
        raise CertificateError(f"{path}: cannot read the key ({exc})") from None


def generate_keypair(prefix: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``PREFIX.key`` (PKCS#8 PEM, mode 0600) and ``PREFIX.pub`` (PEM); refuse to overwrite."""
    serialization, ed25519 = _crypto()
    priv_path, pub_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    for p in (priv_path, pub_path):
        if p.exists():
            raise CertificateError(f"{p} exists; choose another --out prefix (keys are never overwritten)")
    key = ed25519.Ed25519PrivateKey.generate()
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    atomic_write_bytes(priv_path, priv, mode=0o600, overwrite=False)
    atomic_write_bytes(pub_path, pub, overwrite=False)
    return priv_path, pub_path


def load_private_key(path: str | os.PathLike):
    serialization, ed25519 = _crypto()
    data = _read_key_file(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise CertificateError(f"{path}: a {type(key).__name__}, not an Ed25519 key; make one with "
                               "`lockstep audit keygen --out PREFIX`")
    return key


def public_key_hex(path_or_hex: str | os.PathLike) -> str:
    """The raw 32-byte public key (hex) of a PEM public-key file, a PEM private-key file, or 64 hex digits."""
    s = os.fspath(path_or_hex)
    if isinstance(s, str) and _HEX64.fullmatch(s.lower()) and not Path(s).exists():
        return s.lower()  # no package needed to name a key
    serialization, ed25519 = _crypto()
    data = _read_key_file(s)
    try:
        if b"PRIVATE KEY" in data:
            key = load_private_key(s).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"{s}: not a PEM public key ({exc})") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise CertificateError(f"{s}: a {type(key).__name__}, not an Ed25519 public key")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def sign_certificate(cert: dict, key_path: str | os.PathLike) -> dict:
    """A copy of ``cert`` with an Ed25519 ``signature`` over its canonical bytes."""
    serialization, _ = _crypto()
    key = load_private_key(key_path)
    out = {k: v for k, v in cert.items() if k != "signature"}
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    out["signature"] = {"algorithm": "ed25519", "public_key": pub, "value": key.sign(canonical_bytes(out)).hex()}
    return out


def signature_problem(cert: dict, trusted: list[str] | None = None) -> str | None:
    """None when the signature is valid (and, if ``trusted`` hex keys are given, by one of them).

    An unsigned certificate is a problem only when ``trusted`` is given.
    """
    sig = cert.get("signature")
    if sig is None:
        return "unsigned, but signatures by trusted keys are required" if trusted else None
    _, ed25519 = _crypto()
    try:
        pub = bytes.fromhex(sig["public_key"])
        value = bytes.fromhex(sig["value"])
        key = ed25519.Ed25519PublicKey.from_public_bytes(pub)
    except ValueError as exc:
        return f"malformed signature ({exc})"
    if trusted is not None and sig["public_key"] not in trusted:
        return f"signed by {sig['public_key'][:16]}..., which is not among the trusted public keys"
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(value, canonical_bytes(cert))
    except InvalidSignature:
        return (f"the Ed25519 signature by {sig['public_key'][:16]}... does not match the certificate's contents: "
                "it was edited after signing, or signed by another key")
    return None


def auditor_id(cert: dict, fallback: str) -> str:
    """Who made a certificate: its signing key (hex) if signed, else its ``auditor`` name, else ``fallback``."""
    sig = cert.get("signature")
    if isinstance(sig, dict) and isinstance(sig.get("public_key"), str):
        return "ed25519:" + sig["public_key"]
    if isinstance(cert.get("auditor"), str) and cert["auditor"]:
        return cert["auditor"]
    return fallback


# ---------------------------------------------------------------------------
# Checking a certificate against a run
# ---------------------------------------------------------------------------


def run_problems(cert: dict, run: Run | str | os.PathLike) -> list[str]:
    """Published values the certificate quotes that are not the run's (its trajectory and commitment);
    ``run`` is a run directory or a ``Run`` opened with ``Strictness.AUDIT``."""
    try:
        run = Run.of(run, Strictness.AUDIT)
    except RunFileError as exc:
        return [str(exc)]
    if "trajectory" in run.errors:
        return [str(run.errors["trajectory"])]
    traj = run.trajectory
    problems = []
    try:
        commitment = run.commitment["chain_hash"]
    except RunFileError:
        commitment = traj[-1]["chain_hash"] if traj else None
    if cert["run"]["commitment"] != commitment:
        problems.append(f"the certificate is for commitment {cert['run']['commitment'][:16]}..., the run's is "
                        f"{(commitment or '(none)')[:16]}...")
    for s in cert["steps"]:
        t = s["step"]
        if not 1 <= t <= len(traj):
            problems.append(f"step {t}: the run has steps 1..{len(traj)}")
            continue
        rec = traj[t - 1]
        wrong = sorted(k for k, v in s["published"].items() if k in rec and rec[k] != v)
        if wrong:
            problems.append(f"step {t}: quotes published {wrong} that are not the run's trajectory")
    return problems


def recheck_certificate(cert: dict, run: Run | str | os.PathLike, backend_name: str = "spec",
                        data: str | os.PathLike | None = None, log=None, from_earlier: bool = False) -> list[str]:
    """Replay here every step the certificate claims (and its targets) of ``run`` (a run directory, or a
    ``Run`` opened with ``Strictness.AUDIT``), and compare claim by claim.

    Every claimed step is recomputed: its replayed hashes and its match/mismatch
    verdict must be this replay's. A claimed step this replay did not reach (an
    earlier step mismatched) cannot be vouched for, and is a problem too, as is a
    claimed step outside the run. The certificate passes only when nothing differs.
    """
    claimed = sorted({s["step"] for s in cert["steps"]} | set(cert["targets"]))
    if not claimed:
        return ["the certificate claims no step"]
    try:
        result = replay.replay_steps(run, claimed, backend_name, data, log=log, from_earlier=from_earlier)
    except ReplayError as exc:
        return [f"cannot recompute the claimed steps {claimed[:10]}{' ...' if len(claimed) > 10 else ''}: {exc}"]
    problems = []
    mine = {c.step: c for c in result.checks}
    for s in cert["steps"]:
        c = mine.get(s["step"])
        if c is None:
            problems.append(f"step {s['step']}: claimed, but the recomputation here did not reach it (an earlier "
                            "step mismatched); the certificate vouches for a step nobody can confirm")
            continue
        for k in sorted(set(s["replayed"]) | {"state_root", "chain_hash"}):
            if s["replayed"].get(k) != c.replayed.get(k):
                problems.append(f"step {s['step']}: the certificate claims replayed {k} {s['replayed'].get(k)}, the "
                                f"recomputation here gives {c.replayed.get(k)}: the certificate claims a hash it "
                                "did not reproduce")
        if s["match"] != c.match:
            problems.append(f"step {s['step']}: the certificate says {'match' if s['match'] else 'mismatch'}, the "
                            f"recomputation here says {'match' if c.match else 'mismatch'}")
    found = result.problems + result.damaged
    if found and not cert.get("problems"):
        problems.append(f"the recomputation finds the run invalid or damaged and the certificate does not say so: "
                        f"{found[0]}")
    if cert["outcome"] != result.outcome:
        problems.append(f"the certificate's outcome is {cert['outcome']!r}, the recomputation's {result.outcome!r}")
    return problems
