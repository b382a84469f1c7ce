"""Golden vectors: hex digests of the spec's output for every conformance case.

The file ``golden/spec_v<SPEC_VERSION>.txt`` is plain text any language can read::

    # comment lines start with '#'
    format 1
    spec_version <SPEC_VERSION>
    seed 0
    level 1
    <op> <case label> <SHA-256 hex of the outputs>

The digest of a case is SHA-256 over the canonical bytes (``hashing.canonical_bytes``)
of each output array, named ``out0``, ``out1``, ... in order. Regenerate it, after a
deliberate spec change and a ``SPEC_VERSION`` bump, with::

    python -m lockstep.conformance.golden --write
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from lockstep import spec
from lockstep.fsio import atomic_write_text
from lockstep.spec.hashing import canonical_bytes

from .registry import all_records, as_outputs

GOLDEN_FORMAT = 1
GOLDEN_SEED = 0
GOLDEN_LEVEL = 1
GOLDEN_DIR = Path(__file__).parent / "golden"


def golden_path(spec_version: str = spec.SPEC_VERSION) -> Path:
    return GOLDEN_DIR / f"spec_v{spec_version}.txt"


def outputs_digest(result) -> str:
    h = hashlib.sha256()
    for i, arr in enumerate(as_outputs(result)):
        h.update(canonical_bytes(f"out{i}", arr))
    return h.hexdigest()


def compute_golden(progress=None) -> dict[tuple[str, str], str]:
    """Digest of the spec's output for every (op, case) at the golden seed and level."""
    table = {}
    for rec in all_records():
        fn = getattr(spec, rec.name)
        for case in rec.cases(GOLDEN_SEED, GOLDEN_LEVEL):
            table[(rec.name, case.label)] = outputs_digest(fn(*case.args, **case.kwargs))
        if progress:
            progress(rec.name)
    return table


def format_golden(table: dict[tuple[str, str], str]) -> str:
    lines = [
        "# lockstep conformance golden vectors: SHA-256 of the spec's outputs per case.",
        "# Written by `python -m lockstep.conformance.golden --write`; do not edit by hand.",
        f"format {GOLDEN_FORMAT}",
        f"spec_version {spec.SPEC_VERSION}",
        f"seed {GOLDEN_SEED}",
        f"level {GOLDEN_LEVEL}",
    ]
    lines += [f"{op} {label} {digest}" for (op, label), digest in table.items()]
    return "\n".join(lines) + "\n"


def parse_golden(text: str, source: str = "golden file") -> dict[tuple[str, str], str]:
    header: dict[str, str] = {}
    table: dict[tuple[str, str], str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) == 2:
            header[parts[0]] = parts[1]
        elif len(parts) == 3 and len(parts[2]) == 64:
            table[(parts[0], parts[1])] = parts[2]
        else:
            raise ValueError(f"{source}:{lineno}: cannot parse {raw!r}")
    if header.get("format") != str(GOLDEN_FORMAT):
        raise ValueError(f"{source}: unsupported golden format {header.get('format')!r} (expected {GOLDEN_FORMAT})")
    if header.get("spec_version") != spec.SPEC_VERSION:
        raise ValueError(f"{source}: written for SPEC_VERSION {header.get('spec_version')!r}, this is {spec.SPEC_VERSION!r}")
    return table


def load_golden() -> dict[tuple[str, str], str]:
    path = golden_path()
    if not path.exists():
        raise FileNotFoundError(
            f"no golden vectors for SPEC_VERSION {spec.SPEC_VERSION} at {path}; "
            "run `python -m lockstep.conformance.golden --write`"
        )
    return parse_golden(path.read_text(encoding="utf-8"), str(path))


def write_golden(path: Path | None = None) -> Path:
    path = path or golden_path()
    text = format_golden(compute_golden(progress=lambda op: print(f"  {op}", file=sys.stderr)))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Write or check the spec's golden vectors.")
    p.add_argument("--write", action="store_true", help="regenerate the golden file for this SPEC_VERSION")
    args = p.parse_args(argv)
    if args.write:
        print(f"wrote {write_golden()}")
        return 0
    expected = load_golden()
    got = compute_golden()
    bad = [k for k in expected if got.get(k) != expected[k]]
    missing = [k for k in got if k not in expected]
    for k in bad:
        print(f"MISMATCH {k[0]} {k[1]}: expected {expected[k]}, got {got.get(k)}")
    for k in missing:
        print(f"NOT IN GOLDEN FILE {k[0]} {k[1]}")
    print("golden vectors " + ("match" if not bad and not missing else "DIFFER"))
    return 0 if not bad and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
