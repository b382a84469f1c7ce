"""Golden vectors: hex digests of the spec's output for every conformance case.

The file ``golden/spec_v<SPEC_VERSION>.txt`` is plain text any language can read::

    # comment lines start with '#'
    format 1
    spec_version <SPEC_VERSION>
    seed 0
    level 1
    <op> <case label> <SHA-256 hex of the outputs>

The digest of a case is SHA-256 over the canonical bytes (``hashing.canonical_bytes``)
of each output array, named ``out0``, ``out1``, ... in order.

``golden/spec_v<SPEC_VERSION>_inputs.txt``, beside it, holds every case's inputs, so a
C, CUDA or Metal harness can run the cases without Python's input generators. Plain
text, one case a line, whitespace-separated tokens::

    # comment lines start with '#'
    format 1
    spec_version <SPEC_VERSION>
    seed 0
    level 1
    <op> <case label> <SHA-256 hex of the outputs> <argument> <argument> ...

The arguments are every parameter of the op in the contract's order
(``lockstep/contract/__init__.py``), defaults filled in, one token each:

* ``f32[2x3]:3F800000BF800000...``: an array: dtype (``f32``, ``i8``, ``i32``,
  ``i64``, ``u32``), shape (dimensions joined by ``x``; ``[]`` for 0-d; a 0 in the
  shape means no elements and nothing after the colon), then every element in C
  order as its bit pattern in hex, upper case, 2 digits per byte of the dtype, most
  significant first (two's complement for the signed dtypes). Byte order plays no part.
* ``f32:3F800000``: one float32 number (a ``F32_SCALAR``), its bit pattern.
* ``f64:3FF0000000000000``: a host float (``HOST_FLOAT``), its IEEE binary64 bit pattern.
* ``int:-1``: a host integer, in decimal. ``bool:0`` / ``bool:1``. ``none``: None.
* ``seq:3`` followed by 3 tokens: a list (``F32_SEQUENCE``, ``F32_SCALAR_SEQUENCE``).

The digest is the same as in the digests file (``tests/test_conformance.py`` runs
every line through the spec and compares).

``golden/spec_v<SPEC_VERSION>_vectors.txt`` holds the known answers that are not op
cases: the constants the spec docstrings quote, Philox blocks, the derivation of keyed
streams, and the hashing layouts (format in ``lockstep/conformance/vectors.py`` and in
the file's header). Regenerate all three, after a deliberate spec change and a
``SPEC_VERSION`` bump, with::

    python -m lockstep.conformance.golden --write
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

from lockstep import spec
from lockstep.contract import CONTRACT
from lockstep.fsio import atomic_write_text
from lockstep.spec.hashing import canonical_bytes

from .registry import all_records, as_outputs
from .vectors import compute_vectors, format_vectors

GOLDEN_FORMAT = 1
INPUTS_FORMAT = 1
GOLDEN_SEED = 0
GOLDEN_LEVEL = 1
GOLDEN_DIR = Path(__file__).parent / "golden"


def golden_path(spec_version: str = spec.SPEC_VERSION) -> Path:
    return GOLDEN_DIR / f"spec_v{spec_version}.txt"


def inputs_path(spec_version: str = spec.SPEC_VERSION) -> Path:
    return GOLDEN_DIR / f"spec_v{spec_version}_inputs.txt"


def vectors_path(spec_version: str = spec.SPEC_VERSION) -> Path:
    return GOLDEN_DIR / f"spec_v{spec_version}_vectors.txt"


def _ops_of_file(path: Path) -> list[str]:
    """The ops of a digests file, in the order of their lines (read as plain lines: any version)."""
    ops: list[str] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        parts = raw.split()
        if len(parts) == 3 and len(parts[2]) == 64 and not raw.startswith("#") and (not ops or ops[-1] != parts[0]):
            ops.append(parts[0])
    return ops


def line_order() -> tuple[str, ...]:
    """The order of the ops' lines in the golden files: the order of the newest digests file in
    ``GOLDEN_DIR`` (this SPEC_VERSION's, else the newest earlier one), then every op it lacks, in the
    order of ``spec.OP_TABLE``. So a regenerated file keeps every line where it was, after a new op or a
    version bump alike, and a new op's lines come last: the diff shows only what changed."""
    def version(p: Path):
        v = p.stem.removeprefix("spec_v")
        return (0, int(v), v) if v.isdigit() else (1, 0, v)

    files = [golden_path()] if golden_path().exists() else sorted(
        (p for p in GOLDEN_DIR.glob("spec_v*.txt") if "_" not in p.stem.removeprefix("spec_v")), key=version)[-1:]
    known = [op for op in (_ops_of_file(files[0]) if files else []) if op in spec.OP_MODULE]
    return tuple(dict.fromkeys(known + list(spec.OPS)))


def _records_in_line_order() -> list:
    by_name = {rec.name: rec for rec in all_records()}
    return [by_name[op] for op in line_order()]


def outputs_digest(result) -> str:
    h = hashlib.sha256()
    for i, arr in enumerate(as_outputs(result)):
        h.update(canonical_bytes(f"out{i}", arr))
    return h.hexdigest()


def compute_golden(progress=None) -> dict[tuple[str, str], str]:
    """Digest of the spec's output for every (op, case) at the golden seed and level."""
    table = {}
    for rec in _records_in_line_order():
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
    _check_header(header, "golden", GOLDEN_FORMAT, source)
    return table


def _check_header(header: dict[str, str], what: str, expected_format: int, source: str) -> None:
    """Refuse a file of another format or another SPEC_VERSION."""
    if header.get("format") != str(expected_format):
        raise ValueError(f"{source}: unsupported {what} format {header.get('format')!r} (expected {expected_format})")
    if header.get("spec_version") != spec.SPEC_VERSION:
        raise ValueError(f"{source}: written for SPEC_VERSION {header.get('spec_version')!r}, this is {spec.SPEC_VERSION!r}")


# ---------------------------------------------------------------- the inputs file

_DTYPE_CODES = {"f32": np.dtype(np.float32), "i8": np.dtype(np.int8), "i32": np.dtype(np.int32),
                "i64": np.dtype(np.int64), "u32": np.dtype(np.uint32)}
_CODE_OF = {dt: code for code, dt in _DTYPE_CODES.items()}
_UINT_OF_SIZE = {1: np.uint8, 4: np.uint32, 8: np.uint64}


def encode_argument(value, where: str = "argument") -> list[str]:
    """The tokens of one argument (the module docstring's grammar)."""
    if value is None:
        return ["none"]
    if isinstance(value, bool):
        return [f"bool:{int(value)}"]
    if isinstance(value, int):
        return [f"int:{value}"]
    if isinstance(value, float):
        return [f"f64:{int(np.float64(value).view(np.uint64)):016X}"]
    if isinstance(value, np.float32):
        return [f"f32:{int(value.view(np.uint32)):08X}"]
    if isinstance(value, (list, tuple)):
        return [f"seq:{len(value)}"] + [t for v in value for t in encode_argument(v, where)]
    if isinstance(value, np.ndarray) and value.dtype in _CODE_OF:
        words = np.ascontiguousarray(value).reshape(-1).view(_UINT_OF_SIZE[value.dtype.itemsize])
        width = 2 * value.dtype.itemsize
        digits = "".join(f"{int(w):0{width}X}" for w in words.tolist())
        return [f"{_CODE_OF[value.dtype]}[{'x'.join(str(d) for d in value.shape)}]:{digits}"]
    raise ValueError(f"{where}: cannot write a {type(value).__name__} {getattr(value, 'dtype', '')} to the inputs file")


def _decode_array(token: str, where: str) -> np.ndarray:
    head, _, digits = token.partition(":")
    code, _, dims = head.partition("[")
    if code not in _DTYPE_CODES or not dims.endswith("]"):
        raise ValueError(f"{where}: cannot read the array token {token[:40]!r}")
    dtype = _DTYPE_CODES[code]
    shape = tuple(int(d) for d in dims[:-1].split("x")) if dims[:-1] else ()
    width = 2 * dtype.itemsize
    count = int(np.prod(shape, dtype=np.int64))
    if len(digits) != count * width:
        raise ValueError(f"{where}: {code}{list(shape)} needs {count * width} hex digits, got {len(digits)}")
    words = [int(digits[i:i + width], 16) for i in range(0, len(digits), width)]
    return np.array(words, dtype=_UINT_OF_SIZE[dtype.itemsize]).view(dtype).reshape(shape)


def decode_arguments(tokens: list[str], where: str = "inputs") -> list:
    """The arguments written by ``encode_argument``, in order."""
    out: list = []
    pos = 0

    def one():
        nonlocal pos
        token = tokens[pos]
        pos += 1
        kind, _, rest = token.partition(":")
        if token == "none":
            return None
        if kind == "bool" and rest in ("0", "1"):
            return rest == "1"
        if kind == "int":
            return int(rest)
        if kind == "f64" and len(rest) == 16:
            return float(np.uint64(int(rest, 16)).view(np.float64))
        if kind == "f32" and len(rest) == 8:
            return np.uint32(int(rest, 16)).view(np.float32)
        if kind == "seq":
            return [one() for _ in range(int(rest))]
        return _decode_array(token, where)

    while pos < len(tokens):
        out.append(one())
    return out


def case_arguments(op: str, args: tuple, kwargs: dict) -> list:
    """Every parameter of the op in the contract's order, defaults filled in."""
    bound = CONTRACT[op].signature().bind(*args, **kwargs)
    bound.apply_defaults()
    return list(bound.arguments.values())


def compute_inputs(progress=None) -> list[tuple[str, str, str, list]]:
    """``(op, label, digest, arguments)`` for every case at the golden seed and level."""
    rows = []
    for rec in _records_in_line_order():
        fn = getattr(spec, rec.name)
        for case in rec.cases(GOLDEN_SEED, GOLDEN_LEVEL):
            arguments = case_arguments(rec.name, case.args, case.kwargs)
            rows.append((rec.name, case.label, outputs_digest(fn(*arguments)), arguments))
        if progress:
            progress(rec.name)
    return rows


def format_inputs(rows: list[tuple[str, str, str, list]]) -> str:
    doc = __doc__[__doc__.index("``golden/spec_v<SPEC_VERSION>_inputs.txt``, beside it"):__doc__.index("The digest is the same")].rstrip()
    lines = ["# lockstep conformance golden inputs: every case's arguments and the SHA-256 of the spec's outputs.",
             "# Written by `python -m lockstep.conformance.golden --write`; do not edit by hand.",
             "#"] + [f"# {line}".rstrip() for line in doc.splitlines()] + [
        f"format {INPUTS_FORMAT}",
        f"spec_version {spec.SPEC_VERSION}",
        f"seed {GOLDEN_SEED}",
        f"level {GOLDEN_LEVEL}",
    ]
    for op, label, digest, arguments in rows:
        tokens = [t for a in arguments for t in encode_argument(a, f"{op} {label}")]
        lines.append(" ".join([op, label, digest] + tokens))
    return "\n".join(lines) + "\n"


def parse_inputs(text: str, source: str = "inputs file") -> list[tuple[str, str, str, list]]:
    """``(op, label, digest, arguments)`` per case line; the header checked as in ``parse_golden``."""
    header: dict[str, str] = {}
    rows = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        parts = raw.split()
        if len(parts) == 2 and not rows:
            header[parts[0]] = parts[1]
        elif len(parts) >= 3 and len(parts[2]) == 64 and parts[0] in CONTRACT:
            rows.append((parts[0], parts[1], parts[2], decode_arguments(parts[3:], f"{source}:{lineno}")))
        else:
            raise ValueError(f"{source}:{lineno}: cannot parse {raw[:80]!r}")
    _check_header(header, "inputs", INPUTS_FORMAT, source)
    return rows


def load_golden() -> dict[tuple[str, str], str]:
    path = golden_path()
    if not path.exists():
        raise FileNotFoundError(
            f"no golden vectors for SPEC_VERSION {spec.SPEC_VERSION} at {path}; "
            "run `python -m lockstep.conformance.golden --write`"
        )
    return parse_golden(path.read_text(encoding="utf-8"), str(path))


def write_golden(path: Path | None = None, inputs: Path | None = None,
                 vectors: Path | None = None) -> tuple[Path, Path, Path]:
    """Write the digests file, the inputs file (one pass over the cases) and the vectors file."""
    path = path or golden_path()
    inputs = inputs or inputs_path()
    vectors = vectors or vectors_path()
    rows = compute_inputs(progress=lambda op: print(f"  {op}", file=sys.stderr))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, format_golden({(op, label): digest for op, label, digest, _ in rows}))
    atomic_write_text(inputs, format_inputs(rows))
    atomic_write_text(vectors, format_vectors(compute_vectors()))
    return path, inputs, vectors


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Write or check the spec's golden vectors.")
    p.add_argument("--write", action="store_true", help="regenerate the golden file for this SPEC_VERSION")
    args = p.parse_args(argv)
    if args.write:
        print("wrote " + " and ".join(str(p) for p in write_golden()))
        return 0
    expected = load_golden()
    got = compute_golden()
    bad = [k for k in expected if got.get(k) != expected[k]]
    missing = [k for k in got if k not in expected]
    for k in bad:
        print(f"MISMATCH {k[0]} {k[1]}: expected {expected[k]}, got {got.get(k)}")
    for k in missing:
        print(f"NOT IN GOLDEN FILE {k[0]} {k[1]}")
    vectors_same = (vectors_path().exists()
                    and vectors_path().read_text(encoding="utf-8") == format_vectors(compute_vectors()))
    if not vectors_same:
        print(f"VECTORS DIFFER {vectors_path()}")
    ok = not bad and not missing and vectors_same
    print("golden vectors " + ("match" if ok else "DIFFER"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
