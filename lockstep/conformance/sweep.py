"""Conformance level 3: every float32 bit pattern through every unary op, as digests.

The unary ops are derived from the contract (``lockstep.contract.CONTRACT``): each op
with exactly one parameter, of the elementwise kind ``F32_OPERAND``, returning one
``F32`` array (today ``sqrt``, ``neg``, ``abs``, ``exp``, ``log``, ``sigmoid``, ``silu``;
``unary_ops()``). A new op of that shape joins the sweep without a change here.

The digest (``format 1``) is streamable and can be localised:

* the 2**32 patterns are cut into ``BLOCKS = 256`` blocks of ``2**BLOCK_BITS = 2**24``
  consecutive patterns; block ``b`` holds the inputs ``u = b * 2**24 .. (b+1) * 2**24 - 1``
  read as float32 (through the backend's ``asarray``, so subnormals are zeros and NaNs
  canonical, as the contract says);
* a block's digest is SHA-256 over the op's outputs for those inputs, in ascending
  ``u``, each output as its 4 bytes little-endian (the ``<f4`` bytes), fed chunk by
  chunk (``CHUNK = 2**18`` patterns at a time, which keeps NumPy in cache);
* an op's root digest is SHA-256 over its 256 block digests (32 raw bytes each) in
  block order.

A backend that disagrees with the spec's golden digest in a block has that block
recomputed on the spec and compared element by element, so the report names the
input patterns whose outputs differ (``localise``).

The spec's digests are committed in ``golden/spec_v<SPEC_VERSION>_sweeps.txt``,
written by ``tools/sweep_golden.py`` (resumable; about an hour of one core per
transcendental op). Its format, plain text::

    # comment lines start with '#'
    format 1
    spec_version <SPEC_VERSION>
    block_bits 24
    <op> block <b> <SHA-256 hex of block b>
    <op> root <SHA-256 hex of the 256 block digests>

An op without all 256 block lines has no root line; the level-3 runner compares the
blocks it has, says how many lack a digest, one line per op, and does not pass it
(``NO-GOLDEN``; ``FAIL`` if a compared block differs).
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from lockstep import spec
from lockstep.contract import CONTRACT, Kind
from lockstep.errors import LockstepError, Setting

from .table import print_results

FORMAT = 1
BLOCK_BITS = 24
BLOCKS = 1 << (32 - BLOCK_BITS)
CHUNK = 1 << 18
MAX_GOLDEN_BYTES = 1 << 20  # 7 ops x 257 lines of ~90 bytes is ~160 KB

_HEX64 = re.compile(r"[0-9a-f]{64}")


def unary_ops() -> list[str]:
    """The contract's ops of one elementwise float32 input and one float32 output, in contract order."""
    return [name for name, c in CONTRACT.items()
            if len(c.params) == 1 and c.params[0].kind is Kind.F32_OPERAND
            and c.returns == (Kind.F32,) and not c.returns_tuple]


def golden_path(spec_version: str = spec.SPEC_VERSION) -> Path:
    return Path(__file__).parent / "golden" / f"spec_v{spec_version}_sweeps.txt"


def patterns(first: int, count: int) -> np.ndarray:
    """The uint32 patterns ``first .. first + count - 1``."""
    if not (0 <= first and count >= 0 and first + count <= 1 << 32):
        raise ValueError(f"pattern range [{first:#x}, {first + count:#x}) is outside the 2**32 float32 patterns")
    u = np.arange(count, dtype=np.uint32)
    u += np.uint32(first & 0xFFFFFFFF)  # no pattern wraps: first + count <= 2**32
    return u


def spec_apply(op: str) -> Callable[[np.ndarray], np.ndarray]:
    """The spec's op on a host float32 array (the spec reads its inputs under the contract's rule)."""
    return getattr(spec, op)


def backend_apply(backend, op: str) -> Callable[[np.ndarray], np.ndarray]:
    """``op`` on ``backend``: host float32 in (through ``asarray``), host array out (``to_numpy``)."""
    fn = getattr(backend, op)
    return lambda x: backend.to_numpy(fn(backend.asarray(x)))


def _output_bytes(op: str, x: np.ndarray, y) -> np.ndarray:
    """The outputs as a contiguous little-endian float32 array (a buffer of their bytes, not copied when it already is)."""
    y = np.asarray(y)
    if y.dtype != np.float32 or y.shape != x.shape:
        raise ValueError(f"{op}: expected a float32 array of shape {list(x.shape)}, got {y.dtype}{list(y.shape)}")
    return np.ascontiguousarray(y, dtype="<f4")


def block_outputs(apply, op: str, block: int, block_bits: int = BLOCK_BITS, chunk: int = CHUNK) -> Iterable[np.ndarray]:
    """The output bytes of block ``block`` (of ``2**block_bits`` patterns), chunk by chunk, ascending."""
    size = 1 << block_bits
    first = block * size
    for start in range(first, first + size, chunk):
        x = patterns(start, min(chunk, first + size - start)).view(np.float32)
        yield _output_bytes(op, x, apply(x))


def block_digest(apply, op: str, block: int, block_bits: int = BLOCK_BITS, chunk: int = CHUNK) -> str:
    """SHA-256 hex of block ``block``'s outputs (see the module docstring)."""
    h = hashlib.sha256()
    for data in block_outputs(apply, op, block, block_bits, chunk):
        h.update(data)
    return h.hexdigest()


def root_digest(block_digests: list[str]) -> str:
    """SHA-256 hex over the block digests (raw bytes) in block order."""
    h = hashlib.sha256()
    for d in block_digests:
        h.update(bytes.fromhex(d))
    return h.hexdigest()


def localise(apply, op: str, block: int, block_bits: int = BLOCK_BITS, chunk: int = CHUNK,
             limit: int = 10) -> tuple[int, list[tuple[int, int, int]]]:
    """Recompute ``block`` on the spec and on ``apply``: (how many differ, the first ``limit`` as (pattern, spec, got))."""
    ref = spec_apply(op)
    size = 1 << block_bits
    first = block * size
    n_diff, shown = 0, []
    for start in range(first, first + size, chunk):
        x = patterns(start, min(chunk, first + size - start)).view(np.float32)
        want = _output_bytes(op, x, ref(x)).view("<u4")
        got = _output_bytes(op, x, apply(x)).view("<u4")
        idx = np.nonzero(want != got)[0]
        n_diff += int(idx.size)
        for i in idx[: max(limit - len(shown), 0)]:
            shown.append((start + int(i), int(want[i]), int(got[i])))
    return n_diff, shown


# ---- the golden file

def format_golden(table: dict[str, dict[int, str]]) -> str:
    """The golden file's text for ``{op: {block: digest}}`` (ops in contract order, blocks ascending)."""
    lines = ["# lockstep conformance level 3: SHA-256 of the spec's outputs over every float32 pattern.",
             "# Written by `python tools/sweep_golden.py`; do not edit by hand. Format: lockstep/conformance/sweep.py.",
             f"format {FORMAT}", f"spec_version {spec.SPEC_VERSION}", f"block_bits {BLOCK_BITS}"]
    order = [op for op in unary_ops() if op in table] + sorted(set(table) - set(unary_ops()))
    for op in order:
        blocks = table[op]
        for b in sorted(blocks):
            lines.append(f"{op} block {b} {blocks[b]}")
        if len(blocks) == BLOCKS:
            lines.append(f"{op} root {root_digest([blocks[b] for b in range(BLOCKS)])}")
    return "\n".join(lines) + "\n"


def parse_golden(text: str, source: str = "sweep golden file") -> dict[str, dict[int, str]]:
    """``{op: {block: digest}}`` from the golden file's text; ValueError (one line) on anything malformed."""
    header: dict[str, str] = {}
    table: dict[str, dict[int, str]] = {}
    roots: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        where = f"{source} line {n}"
        if len(parts) == 2 and parts[0] in ("format", "spec_version", "block_bits"):
            if parts[0] in header:
                raise ValueError(f"{where}: {parts[0]} given twice")
            header[parts[0]] = parts[1]
            continue
        if len(header) != 3:
            raise ValueError(f"{where}: digest line before the header (format, spec_version, block_bits)")
        if len(parts) == 4 and parts[1] == "block":
            op, _, b, digest = parts
            if not b.isdigit() or not 0 <= int(b) < BLOCKS:
                raise ValueError(f"{where}: block {b!r} is not in 0..{BLOCKS - 1}")
            if not _HEX64.fullmatch(digest):
                raise ValueError(f"{where}: {digest!r} is not a SHA-256 hex digest")
            if int(b) in table.setdefault(op, {}):
                raise ValueError(f"{where}: {op} block {b} given twice")
            table[op][int(b)] = digest
        elif len(parts) == 3 and parts[1] == "root":
            if parts[0] in roots or not _HEX64.fullmatch(parts[2]):
                raise ValueError(f"{where}: bad or repeated root line for {parts[0]}")
            roots[parts[0]] = parts[2]
        else:
            raise ValueError(f"{where}: expected '<op> block <b> <sha256>' or '<op> root <sha256>'")
    if header.get("format") != str(FORMAT):
        raise ValueError(f"{source}: format {header.get('format')!r}, this lockstep reads format {FORMAT}")
    if header.get("spec_version") != str(spec.SPEC_VERSION):
        raise ValueError(f"{source}: spec_version {header.get('spec_version')!r}, this lockstep is {spec.SPEC_VERSION}")
    if header.get("block_bits") != str(BLOCK_BITS):
        raise ValueError(f"{source}: block_bits {header.get('block_bits')!r}, expected {BLOCK_BITS}")
    for op in set(table) | set(roots):
        if op not in unary_ops():
            raise ValueError(f"{source}: {op!r} is not a unary op of the contract")
        complete = len(table.get(op, {})) == BLOCKS
        if complete != (op in roots):
            raise ValueError(f"{source}: {op} has {len(table.get(op, {}))} blocks and {'a' if op in roots else 'no'} root line")
        if complete and root_digest([table[op][b] for b in range(BLOCKS)]) != roots[op]:
            raise ValueError(f"{source}: {op}'s root line does not match its block lines")
    return table


def load_golden(path: Path | None = None) -> dict[str, dict[int, str]]:
    """The committed golden sweep digests (``{}`` when the file is absent)."""
    path = Path(path) if path is not None else golden_path()
    if not path.exists():
        return {}
    with open(path, "rb") as f:
        data = f.read(MAX_GOLDEN_BYTES + 1)
    if len(data) > MAX_GOLDEN_BYTES:
        raise ValueError(f"{path}: larger than {MAX_GOLDEN_BYTES} bytes")
    return parse_golden(data.decode("ascii", errors="strict"), str(path))


# ---- the level-3 runner

@dataclass
class SweepResult:
    op: str
    status: str = "PASS"  # PASS, FAIL, NO-GOLDEN, MISSING, ERROR
    blocks: int = 0  # blocks compared
    elements: int = 0
    seconds: float = 0.0
    messages: list[str] = field(default_factory=list)


class BlockRangeError(LockstepError, ValueError):
    """A block range (``blocks``) that names no blocks of the sweep."""


def parse_block_range(text: str) -> range:
    """``A:B`` (blocks A..B-1), ``A`` (one block) or empty (all blocks); ``BlockRangeError`` (one line) otherwise."""
    if not text:
        return range(BLOCKS)
    try:
        lo, _, hi = text.partition(":")
        r = range(int(lo, 0), int(hi, 0) if hi else int(lo, 0) + 1)
    except ValueError:
        raise BlockRangeError.naming(Setting("blocks"), f" {text!r}: expected A:B or A (block numbers "
                                     f"0..{BLOCKS - 1})") from None
    if not (0 <= r.start < r.stop <= BLOCKS):
        raise BlockRangeError.naming(Setting("blocks"), f" {text!r}: the range must lie in 0:{BLOCKS} and not be "
                                     "empty")
    return r


def run_sweeps(backend, ops: list[str] | None = None, blocks: Iterable[int] | None = None,
               expected: dict[str, dict[int, str]] | None = None, block_bits: int = BLOCK_BITS,
               chunk: int = CHUNK, max_errors: int = 10, progress: bool = True) -> list[SweepResult]:
    """Sweep ``blocks`` of every unary op (or those in ``ops``) on ``backend`` against ``expected``.

    ``expected`` is ``{op: {block: digest}}`` (default: the golden file, which needs
    ``block_bits == BLOCK_BITS``). An op is swept on the blocks that have an expected
    digest; one missing any block is reported ``NO-GOLDEN`` (when nothing differs),
    never ``PASS``. A block whose digest differs is localised against the spec.
    """
    known = unary_ops()
    ops = list(known) if ops is None else list(ops)
    unknown = [op for op in ops if op not in known]
    if unknown:
        raise ValueError(f"not unary op(s) {', '.join(unknown)}; level 3 sweeps {', '.join(known)}")
    blocks = list(range(1 << (32 - block_bits)) if blocks is None else blocks)
    if expected is None:
        if block_bits != BLOCK_BITS:
            raise ValueError(f"the golden sweep digests use block_bits {BLOCK_BITS}; pass expected digests for {block_bits}")
        expected = load_golden()
    todo = {op: [b for b in blocks if b in expected.get(op, {})] for op in ops if backend.implements(op)}
    total = sum(len(v) for v in todo.values()) << block_bits
    done, t_start = 0, time.perf_counter()
    results, errors_left = [], max_errors
    for op in ops:
        res = SweepResult(op)
        results.append(res)
        if not backend.implements(op):
            res.status = "MISSING"
            continue
        have = expected.get(op, {})
        apply = backend_apply(backend, op)
        t0 = time.perf_counter()
        for b in todo[op]:
            try:
                got = block_digest(apply, op, b, block_bits, chunk)
            except Exception as e:  # noqa: BLE001 - a crashing backend is a reported result
                res.status = "ERROR"
                res.messages.append(f"  block {b}: {type(e).__name__}: {e}")
                break
            res.blocks += 1
            res.elements += 1 << block_bits
            if got != have[b]:
                res.status = "FAIL"
                n, shown = localise(apply, op, b, block_bits, chunk, limit=max(errors_left, 0))
                errors_left -= len(shown)
                res.messages.append(f"  block {b} (patterns {b << block_bits:#010x}..{((b + 1) << block_bits) - 1:#010x}): "
                                    f"{n} of {1 << block_bits} outputs differ" + ("" if n else " (yet the digest differs: "
                                    "the backend is not deterministic, or the expected digest is not the spec's)"))
                res.messages.extend(f"    input 0x{u:08X}: spec 0x{w:08X}, backend 0x{g:08X}" for u, w, g in shown)
            done += 1 << block_bits
            if progress:
                el = time.perf_counter() - t_start
                eta = el / done * (total - done)
                print(f"\r{op} block {b}: {done / total:6.1%} of {total >> block_bits} block(s) of {len(todo)} op(s), "
                      f"{done / el / 1e6:.1f} M/s, about {eta:.0f} s left", end="", file=sys.stderr, flush=True)
        res.seconds = time.perf_counter() - t0
        missing = [b for b in blocks if b not in have]
        if missing:
            # Never a pass: the blocks that have digests were compared, the others could not be.
            res.status = "NO-GOLDEN" if res.status == "PASS" else res.status
            res.messages.append(f"  no golden digest for {len(missing)} of the {len(blocks)} blocks (first: {missing[0]}; "
                                f"the other {len(blocks) - len(missing)} compared); generate them with tools/sweep_golden.py")
    if progress and total:
        print(file=sys.stderr)
    return results


def print_sweeps(results: list[SweepResult], backend, blocks: list[int], out=None) -> None:
    out = out or sys.stdout
    span = "all" if len(blocks) == BLOCKS else f"{len(blocks)} of {BLOCKS}"
    counts = print_results(
        out, f"lockstep conformance: backend={backend.name} level=3 blocks={span} SPEC_VERSION={spec.SPEC_VERSION}",
        results, [("blocks", 6, lambda r: r.blocks), ("elements", 10, lambda r: r.elements),
                  ("time", 8, lambda r: f"{r.seconds:.1f}s")], ("PASS", "FAIL", "NO-GOLDEN", "MISSING", "ERROR"))
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['NO-GOLDEN']} without a golden digest, "
          f"{counts['MISSING']} missing, {counts['ERROR']} errors", file=out)
