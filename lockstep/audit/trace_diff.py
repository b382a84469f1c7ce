"""``lockstep audit diff TRACE_A TRACE_B [--referee --run RUN --backend B]`` and ``conformance --replay-op FILE``.

``diff_files`` walks two traces (``lockstep.audit.trace``) record by record, side by side
(``TraceReader``: one record of each in memory, never the whole trace), and names the
first record where anything differs. Since every earlier record agrees, that record is
either

* a call whose inputs agree and whose outputs differ: **the disputed call**; or
* a call whose inputs already differ with no earlier differing output: the input came
  from outside the traced ops, and the diff says from where (the data: token ids; the
  weights: a parameter; a scalar: a host value; or an array computed on the host
  between ops).

``referee`` re-executes the step on one backend up to the disputed call (capturing its
inputs), computes that one op on the spec, says which trace the spec agrees with,
and writes the call as one safetensors file (``write_op_file``) that ``replay_op_file``
re-checks in any process, on the spec and optionally on a backend.

Traces and op files are untrusted: read with bounded lines and sizes, every field
schema-checked (sizes in Python integers: no traced array has more than ``MAX_ELEMENTS``),
kept values checked against their digests, the root recomputed. An op file's arguments
must be a call of the contract (``lockstep.contract.check_call``: the op's own shape rules,
no broadcast the trainer never makes), checked once before the spec or any backend runs,
and the call may compute at most ``MAX_OP_AMPLIFICATION`` times the elements the file
holds (plus ``MIN_OP_BUDGET``); its output digests, stored outputs, verdict and backend
names are only claims, and ``replay_op_file`` says so.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep import backends
from lockstep.backends import spec_backend
from lockstep.contract import CONTRACT, Kind, call_size, check_call, move_arguments
from lockstep.errors import Setting
from lockstep.fsio import FileFormatError, NotRegularFile, iter_lines, open_named_file, parse_json
from lockstep.fsio.safetensors import SafetensorsError, read_safetensors, write_safetensors

from .trace import (Capture, DIRECTIONS, NONE_DIGEST, TRACE_FORMAT, TraceError, record_digest, root_of_digests,
                    trace_step, value_digest)

MAX_TRACE_BYTES = 8 << 30
MAX_TRACE_LINE = 32 << 20
MAX_RECORDS = 10_000_000
MAX_ELEMENTS = 1 << 40  # elements of one traced array (4 TiB of float32): no step holds a larger one
MAX_STEP = 1 << 53
MAX_OP_FILE_BYTES = 1 << 30
MAX_OP_INT = 1 << 17  # an int argument of a replayed op (a vocabulary, an axis): Open-1B's vocabulary is 128,256
# What a replayed call may compute (``contract.call_size``: its results, and attention's scored pairs) from the
# elements an op file holds: a traced step's calls stay far below 64 times their inputs (Open-1B's largest:
# attention's pairs, 21 times q, k and v; its embedding gradient, 8 times dout), and any call within 2**20.
MAX_OP_AMPLIFICATION = 64
MIN_OP_BUDGET = 1 << 20
ADDRESS = ("mb", "layer", "module", "op", "dir", "index")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.\[\]/-]{1,200}$")
_OP = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_DTYPES = {"<f4": np.float32, "<f8": np.float64, "<i4": np.int32, "<i8": np.int64, "|i1": np.int8,
           "<u4": np.uint32, "|u1": np.uint8, "|b1": np.bool_, "<u8": np.uint64, "<i2": np.int16}
_SCALAR_KINDS = {"F32_SCALAR", "F32_SCALAR_SEQUENCE", "HOST_FLOAT", "HOST_INT", "WINDOW", "FLAG"}


@dataclass
class Trace:
    """A trace file that was read whole and checked: its header, root and record count. ``records`` holds
    the records only where ``read_trace`` was asked for them; ``diff_files`` streams and keeps none."""

    path: Path
    header: dict
    root: str
    count: int
    records: list | None = None


# ---------------------------------------------------------------------------
# reading a trace (untrusted)
# ---------------------------------------------------------------------------


def entry_elements(shape: list, where: str) -> int:
    """The element count of a trace entry's shape, in Python integers; TraceError beyond ``MAX_ELEMENTS``."""
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise TraceError(f"{where}: shape {shape[:8]}{'...' if len(shape) > 8 else ''} has {count} elements; no "
                         f"array of a step has more than {MAX_ELEMENTS}")
    return count


def _check_entry(e, where: str, output: bool) -> None:
    allowed = {"name", "sha256", "dtype", "shape"} | ({"values"} if output else {"kind", "param"})
    if not isinstance(e, dict) or not {"name", "sha256", "dtype", "shape"} <= set(e) or not set(e) <= allowed:
        raise TraceError(f"{where}: an {'output' if output else 'input'} must have name, sha256, dtype, shape")
    if not isinstance(e["name"], str) or not _NAME.match(e["name"]):
        raise TraceError(f"{where}: bad name {str(e['name'])[:40]!r}")
    if not isinstance(e["sha256"], str) or not _HEX64.match(e["sha256"]):
        raise TraceError(f"{where}: sha256 must be 64 lowercase hex digits")
    if not isinstance(e["dtype"], str) or (e["dtype"] != "none" and e["dtype"] not in _DTYPES):
        raise TraceError(f"{where}: dtype {str(e['dtype'])[:20]!r} is not one a trace holds")
    shape = e["shape"]
    if (not isinstance(shape, list) or len(shape) > 64
            or not all(type(s) is int and 0 <= s < 1 << 40 for s in shape)):
        raise TraceError(f"{where}: shape must be a list of at most 64 non-negative integers")
    entry_elements(shape, where)
    if e["dtype"] == "none" and (shape or e["sha256"] != NONE_DIGEST):
        raise TraceError(f"{where}: a None value has shape [] and the none digest")
    if "kind" in e and (not isinstance(e["kind"], str) or e["kind"] not in Kind.__members__):
        raise TraceError(f"{where}: kind {str(e['kind'])[:20]!r} is not a contract kind")
    if "param" in e and (not isinstance(e["param"], str) or not _NAME.match(e["param"])):
        raise TraceError(f"{where}: bad parameter name")
    if "values" in e:
        e["values"] = _decode_values(e, where)


def _decode_values(e: dict, where: str) -> np.ndarray:
    if not isinstance(e["values"], str) or e["dtype"] == "none":
        raise TraceError(f"{where}: values must be a base64 string of an array")
    dt = np.dtype(_DTYPES[e["dtype"]]).newbyteorder("<") if e["dtype"][0] != "|" else np.dtype(_DTYPES[e["dtype"]])
    need = entry_elements(e["shape"], where) * dt.itemsize
    if len(e["values"]) != 4 * ((need + 2) // 3):
        raise TraceError(f"{where}: values of {len(e['values'])} base64 characters; shape {e['shape']} of {e['dtype']} "
                         f"needs {4 * ((need + 2) // 3)}")
    try:
        raw = base64.b64decode(e["values"], validate=True)
    except (binascii.Error, ValueError):
        raise TraceError(f"{where}: values are not base64") from None
    if len(raw) != need:
        raise TraceError(f"{where}: values hold {len(raw)} bytes, shape {e['shape']} of {e['dtype']} needs {need}")
    arr = np.frombuffer(raw, dtype=dt).reshape(e["shape"])
    if value_digest(arr)[0] != e["sha256"]:
        raise TraceError(f"{where}: the kept values do not have the recorded sha256 (the trace was altered)")
    return arr


def _check_record(r, i: int, where: str) -> None:
    keys = {"seq", *ADDRESS, "inputs", "outputs"}
    if not isinstance(r, dict) or set(r) != keys:
        raise TraceError(f"{where}: a record has exactly the keys {', '.join(sorted(keys))}")
    if r["seq"] != i or type(r["seq"]) is not int:
        raise TraceError(f"{where}: record number {str(r['seq'])[:20]!r} where {i} was due (records are in order)")
    _check_address(r, where)
    for side in ("inputs", "outputs"):
        if not isinstance(r[side], list) or len(r[side]) > 4096:
            raise TraceError(f"{where}: {side} must be a list")
        for e in r[side]:
            _check_entry(e, where, side == "outputs")


def _check_address(r: dict, where: str) -> None:
    for k in ("mb", "layer"):
        if r[k] is not None and (type(r[k]) is not int or not 0 <= r[k] < 1 << 40):
            raise TraceError(f"{where}: {k} must be a non-negative integer or null")
    if r["module"] is not None and (not isinstance(r["module"], str) or not _NAME.match(r["module"])):
        raise TraceError(f"{where}: bad module")
    if not isinstance(r["op"], str) or not _OP.match(r["op"]):
        raise TraceError(f"{where}: bad op name")
    if not isinstance(r["dir"], str) or r["dir"] not in DIRECTIONS:
        raise TraceError(f"{where}: direction must be one of {', '.join(DIRECTIONS)}")
    if type(r["index"]) is not int or not 0 <= r["index"] < 1 << 40:
        raise TraceError(f"{where}: index must be a non-negative integer")


class TraceReader:
    """One pass over a trace file: ``header`` once opened, then the records one at a time, each checked
    (schema, kept values against their digests) as it is read; at the end the root line is checked against
    the root of the records read. Memory is one line and one record, whatever the file's size: nothing
    read earlier is kept. Every problem is a ``TraceError`` (one line naming the file)."""

    def __init__(self, path):
        self.path = Path(path)
        try:
            self._f = open_named_file(self.path, "trace", MAX_TRACE_BYTES)
        except (NotRegularFile, FileFormatError) as exc:
            raise TraceError(str(exc)) from None
        except FileNotFoundError:
            raise TraceError(f"trace not found: {self.path}") from None
        except OSError as exc:
            raise TraceError(f"cannot read trace {self.path}: {exc.strerror or exc}") from None
        self._lines = iter_lines(self._f, str(self.path), MAX_TRACE_LINE)
        self._digests = bytearray()  # 32 bytes a record: the root binds the record count before them
        self._read = 0
        self.count = 0
        self.root: str | None = None  # set once every record was read and the root line checked
        try:
            n, body = self._next_line()
        except BaseException:
            self._f.close()
            raise
        if body is None:
            self._f.close()
            raise TraceError(f"{self.path}: empty; not a lockstep trace")
        where = f"{self.path}:{n}"
        obj = self._parse(body, where)
        if not isinstance(obj, dict) or obj.get("lockstep_trace") != TRACE_FORMAT:
            self._f.close()
            raise TraceError(f"{where}: not a lockstep trace (format {TRACE_FORMAT} header expected)")
        _check_header(obj, where)
        self.header = obj

    def _next_line(self) -> tuple[int, bytes | None]:
        try:
            n, body, _ = next(self._lines)
        except StopIteration:
            return 0, None
        except FileFormatError as exc:
            raise TraceError(str(exc)) from None
        self._read += len(body) + 1
        if self._read > MAX_TRACE_BYTES + 1:
            raise TraceError(f"{self.path}: grew past {MAX_TRACE_BYTES} bytes while being read")
        return n, body

    def _parse(self, body: bytes, where: str):
        try:
            return parse_json(body, "trace line", where)
        except FileFormatError as exc:
            raise TraceError(str(exc)) from None

    def __iter__(self):
        with self._f:
            while True:
                n, body = self._next_line()
                if body is None:
                    raise TraceError(f"{self.path}: no root line at its end (truncated?)")
                where = f"{self.path}:{n}"
                obj = self._parse(body, where)
                if isinstance(obj, dict) and "root" in obj:
                    self._finish(obj, where)
                    return
                if self.count >= MAX_RECORDS:
                    raise TraceError(f"{where}: more than {MAX_RECORDS} records")
                _check_record(obj, self.count, where)
                self._digests += record_digest(obj)
                self.count += 1
                yield obj

    def _finish(self, end: dict, where: str) -> None:
        if set(end) != {"root", "records"} or end["records"] != self.count:
            raise TraceError(f"{where}: the root line must give the root and the record count ({self.count})")
        n, body = self._next_line()
        if body is not None:
            raise TraceError(f"{self.path}:{n}: a line after the root line")
        root = root_of_digests(bytes(self._digests))
        self._digests = bytearray()
        if end["root"] != root:
            raise TraceError(f"{self.path}: the root line says {str(end['root'])[:16]}..., the records give "
                             f"{root[:16]}... (the trace was altered)")
        self.root = root

    def summary(self, records: list | None = None) -> Trace:
        """The ``Trace`` of a reader that has been read to its end."""
        assert self.root is not None, "the trace was not read to its end"
        return Trace(self.path, self.header, self.root, self.count, records)


def read_trace(path) -> Trace:
    """Read and check a whole trace file, keeping every record (for a trace that fits in memory: tests and
    tools; ``diff_files`` streams instead). ``TraceError`` (one line, naming the file) when it is not one."""
    reader = TraceReader(path)
    records = list(reader)
    return reader.summary(records)


def _check_header(h: dict, where: str) -> None:
    if type(h.get("step")) is not int or not 1 <= h["step"] <= MAX_STEP:
        raise TraceError(f"{where}: the header's step must be a positive integer")
    if h.get("micro_batch") is not None and (type(h["micro_batch"]) is not int or not 0 <= h["micro_batch"] < 1 << 40):
        raise TraceError(f"{where}: the header's micro_batch must be a non-negative integer or null")
    for k in ("backend", "spec_version"):
        if not isinstance(h.get(k), str) or len(h[k]) > 200:
            raise TraceError(f"{where}: the header's {k} must be a string")


# ---------------------------------------------------------------------------
# the diff
# ---------------------------------------------------------------------------


def address_text(r: dict) -> str:
    """Where a call is, in words: micro-batch (or tree, optimizer), layer, module, op, direction, call index and,
    for a record, its number."""
    where = "the tree" if r["dir"] == "tree" else "the optimizer" if r["dir"] == "optim" else f"micro-batch {r['mb']}"
    parts = [where] + ([f"layer {r['layer']}"] if r["layer"] is not None else []) \
        + ([f"module {r['module']}"] if r["module"] is not None else [])
    seq = f"; record {r['seq']}" if "seq" in r else ""
    return f"{', '.join(parts)}: {r['op']} ({r['dir']}, call {r['index']}{seq})"


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a).reshape(-1)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def element_difference(x: np.ndarray, y: np.ndarray) -> tuple[int, int | None, str, str]:
    """``(count, first flat index, hex of x there, hex of y there)`` of the elements whose bits differ."""
    bx, by = _bits(x), _bits(y)
    if bx.shape != by.shape or bx.dtype != by.dtype:
        return max(bx.size, by.size), None, "", ""
    where = np.flatnonzero(bx != by)
    if not where.size:
        return 0, None, "", ""
    i = int(where[0])
    width = 2 * x.dtype.itemsize
    return int(where.size), i, f"0x{int(bx[i]):0{width}X}", f"0x{int(by[i]):0{width}X}"


@dataclass
class Difference:
    kind: str              # "same", "inputs", "outputs", "calls", "length", "labels"
    text: str
    seq: int | None = None
    record_a: dict | None = None
    record_b: dict | None = None
    output: int | None = None


class _Outputs:
    """Which record last produced each output digest, for the records before the first difference (where
    the two traces agree, so one index serves both): 24 bytes an output (a 16-byte digest prefix and the
    record number), in flat arrays, never a Python object per entry."""

    def __init__(self):
        self._keys, self._seqs = array("Q"), array("Q")

    def add(self, record: dict) -> None:
        for o in record["outputs"]:
            raw = bytes.fromhex(o["sha256"])
            self._keys.extend(struct.unpack("<QQ", raw[:16]))
            self._seqs.append(record["seq"])

    def latest(self, digest: str) -> int | None:
        if not self._seqs:
            return None
        keys = np.frombuffer(self._keys, dtype=np.uint64).reshape(-1, 2)
        want = np.array(struct.unpack("<QQ", bytes.fromhex(digest)[:16]), dtype=np.uint64)
        hits = np.flatnonzero((keys == want).all(axis=1))
        return int(self._seqs[int(hits[-1])]) if hits.size else None

    def nbytes(self) -> int:
        return self._keys.itemsize * len(self._keys) + self._seqs.itemsize * len(self._seqs)


def _source(e: dict, made: _Outputs, name: str) -> str:
    if "param" in e:
        return f"the weights (parameter {e['param']})"
    kind = e.get("kind")
    if kind == "IDS":
        return "the data (token ids of the step's windows)"
    if kind in _SCALAR_KINDS:
        return "a scalar from outside the traced ops"
    seq = made.latest(e["sha256"])
    if seq is not None:
        return f"in {name} it is the output of record {seq}"
    return "an array from outside the traced ops (host code between op calls)"


def _compare(ra: dict, rb: dict, made: _Outputs, micro_batches: set, names: tuple[str, str]) -> Difference | None:
    """How record ``ra`` of A differs from ``rb`` of B (None when their addresses and digests agree)."""
    if any(ra[k] != rb[k] for k in ADDRESS):
        return Difference("calls", f"the traces part at record {ra['seq']}: A calls {address_text(ra)}, "
                                   f"B calls {address_text(rb)} (the steps ran other ops)", ra["seq"], ra, rb)
    ia = [(e["name"], e["sha256"], e["dtype"], e["shape"]) for e in ra["inputs"]]
    ib = [(e["name"], e["sha256"], e["dtype"], e["shape"]) for e in rb["inputs"]]
    if ia != ib:
        bad = [(ea, eb) for ea, eb in zip(ra["inputs"], rb["inputs"]) if ea["sha256"] != eb["sha256"]]
        why = "; ".join(f"input {ea['name']} ({ea['dtype']} {tuple(ea['shape'])}): in A {_source(ea, made, names[0])}"
                        f", in B {_source(eb, made, names[1])}" for ea, eb in bad[:4]) or "their input lists differ"
        lead = f"this is micro-batch {ra['mb']}'s first call; " if ra["mb"] is not None and ra["mb"] not in micro_batches \
            else ""
        return Difference("inputs", f"the inputs already differ at {address_text(ra)}, and no earlier output "
                                    f"differs: {lead}{why}", ra["seq"], ra, rb)
    for k, (oa, ob) in enumerate(zip(ra["outputs"], rb["outputs"])):
        if (oa["sha256"], oa["dtype"], oa["shape"]) == (ob["sha256"], ob["dtype"], ob["shape"]):
            continue
        count = math.prod(oa["shape"])
        if "values" in oa and "values" in ob:
            n, i, xa, xb = element_difference(oa["values"], ob["values"])
            detail = (f"differs in {n} of {count} elements (first at flat index {i}: A {xa}, B {xb})"
                      if i is not None else f"differs (A {oa['dtype']} {tuple(oa['shape'])}, "
                                            f"B {ob['dtype']} {tuple(ob['shape'])})")
        else:
            detail = f"differs ({count} elements; the traces kept no values to count the differing ones)"
        text = (f"first difference at {address_text(ra)}: the inputs agree, output {k} ({oa['dtype']} "
                f"{tuple(oa['shape'])}) {detail}")
        return Difference("outputs", text, ra["seq"], ra, rb, k)
    if len(ra["outputs"]) != len(rb["outputs"]):
        return Difference("outputs", f"first difference at {address_text(ra)}: the inputs agree, the number "
                                     "of outputs differs", ra["seq"], ra, rb, None)
    return None


def diff_files(path_a, path_b) -> tuple[Trace, Trace, Difference]:
    """Read both traces in one pass each, side by side, and name the first record where they differ
    (module docstring). Both files are read to their ends and checked whole (schema, kept values, roots)
    before anything is said. Memory is bounded by records, not bytes: 32 bytes per record of each trace
    (the root's leaves, ``TraceReader``), 24 bytes per output of A before the first difference
    (``_Outputs``), and one line of each in flight (at most ``MAX_TRACE_LINE`` of text and its parsed
    values), never the traces: at most about a quarter of the two files' sizes for traces of the
    smallest records (an entry is over 100 bytes of JSON), far less for traces that keep values."""
    a, b = TraceReader(path_a), TraceReader(path_b)
    ia, ib = iter(a), iter(b)
    names = (a.path.name, b.path.name)
    made, micro_batches = _Outputs(), set()
    d = None
    while True:  # both files to their ends: past the first difference the readers only check and hash
        ra, rb = next(ia, None), next(ib, None)
        if ra is None and rb is None:
            break
        if d is None and ra is not None and rb is not None:
            d = _compare(ra, rb, made, micro_batches, names)
            if d is None:
                made.add(ra)
                if ra["mb"] is not None:
                    micro_batches.add(ra["mb"])
    ta, tb = a.summary(), b.summary()
    if d is None:
        if ta.count != tb.count:
            n = min(ta.count, tb.count)
            longer = "A" if ta.count > n else "B"
            d = Difference("length", f"the first {n} records agree; trace {'B' if longer == 'A' else 'A'} ends there "
                                     f"and {longer} goes on (a trace cut short, or of --micro-batch)", n)
        elif ta.root == tb.root:
            d = Difference("same", f"the traces are the same: {ta.count} records, root {ta.root}")
        else:
            d = Difference("labels", f"every record's address and digests agree, but the roots differ ({ta.root[:16]}"
                                     f"..., {tb.root[:16]}...): the traces name inputs or outputs differently "
                                     "(their kind, parameter or output names)")
    notes = [f"{k}: A {ta.header.get(k)!r}, B {tb.header.get(k)!r}" for k in ("step", "micro_batch", "recipe_sha256")
             if ta.header.get(k) != tb.header.get(k)]
    if notes and d.kind != "same":
        d.text += " (the traces are of different steps or runs: " + "; ".join(notes) + ")"
    return ta, tb, d



# ---------------------------------------------------------------------------
# the referee and its op file
# ---------------------------------------------------------------------------


@dataclass
class Verdict:
    agrees_with: str       # "A", "B" or "neither"
    text: str
    op_file: Path | None = None


def _spec_outputs(op: str, args: list) -> list:
    """The spec's results of ``op`` on host arguments that ``check_call`` accepted."""
    out = spec_backend().ops[op](*args)
    return [None if r is None else np.asarray(r) for r in (out if isinstance(out, tuple) else (out,))]


def referee(a: Trace, b: Trace, d: Difference, run_dir, backend, data=None, op_file=None, log=None) -> Verdict:
    """Re-execute the disputed call's step on ``backend`` (capturing its inputs), compute the op on the spec,
    and say which trace the spec agrees with; write the call to ``op_file`` (default beside trace A)."""
    if d.kind != "outputs":
        raise TraceError.naming(Setting("referee"), " needs a call whose inputs agree and outputs differ; ", d.text)
    ra, rb = d.record_a, d.record_b
    if a.header["step"] != b.header["step"]:
        raise TraceError.naming(Setting("referee"), " needs two traces of one step")
    cap = Capture({k: ra[k] for k in ADDRESS})
    trace_step(run_dir, a.header["step"], backend, micro_batch=a.header.get("micro_batch"), data=data, capture=cap,
               keep_values=0, log=log)
    if cap.inputs is None:
        raise TraceError(f"the re-execution on {backend if isinstance(backend, str) else backend.name} never reached "
                         f"{address_text(ra)}")
    got = [e["sha256"] for e in cap.digests["inputs"]]
    if got != [e["sha256"] for e in ra["inputs"]]:
        raise TraceError(f"the re-execution gives {address_text(ra)} other inputs than the traces; the referee "
                         "cannot decide (replay the run on this backend first)")
    args = [v for _, _, v in cap.inputs]
    try:
        check_call(ra["op"], tuple(args))
    except (ValueError, TypeError) as exc:
        raise TraceError(f"the re-executed call {address_text(ra)} is no call of the contract: {exc}") from None
    spec_out = _spec_outputs(ra["op"], args)
    spec_d = [value_digest(o)[0] for o in spec_out]
    da, db = [o["sha256"] for o in ra["outputs"]], [o["sha256"] for o in rb["outputs"]]
    agrees = "A" if spec_d == da else "B" if spec_d == db else "neither"
    k = d.output if d.output is not None else 0
    # the disputed output's values, wherever they are known: kept in the trace, re-executed, or the spec's
    known = {value_digest(o)[0]: o for o in [*cap.outputs, *spec_out] if isinstance(o, np.ndarray)}

    def values(side_rec) -> np.ndarray | None:
        o = side_rec["outputs"][k]
        v = o.get("values")
        return v if v is not None else known.get(o["sha256"])

    va, vb, sk = values(ra), values(rb), spec_out[k]
    parts = [f"referee: at {address_text(ra)} the spec agrees with "
             + {"A": f"A ({a.header['backend']})", "B": f"B ({b.header['backend']})", "neither": "neither trace"}[agrees]]
    for side, v, hdr in (("A", va, a.header), ("B", vb, b.header)):
        if side == agrees or sk is None:
            continue
        if v is None:
            parts.append(f"{side} ({hdr['backend']}) kept no values of output {k}")
            continue
        n, i, xs, xv = element_difference(sk, v)
        if i is not None:
            parts.append(f"output {k}: {n} elements differ from the spec's; first at flat index {i}: spec {xs}, "
                         f"{side} ({hdr['backend']}) {xv}")
    op_file = Path(op_file) if op_file is not None else a.path.with_name(f"{a.path.stem}.op-{ra['seq']}.safetensors")
    write_op_file(op_file, ra, rb, cap.inputs, va, vb, k, agrees, a, b)
    parts.append(f"the call is in {op_file}: re-check it with `lockstep conformance --replay-op {op_file}`")
    return Verdict(agrees, "; ".join(parts), op_file)


def _arg_entry(name: str, kind, v, tensors: dict):
    if isinstance(v, list):
        return {"list": [_arg_entry(f"{name}[{i}]", None, x, tensors) for i, x in enumerate(v)]}
    if v is None:
        return {"none": True}
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": v}
    if isinstance(v, float):
        return {"float": v}
    tensors[f"input.{name}"] = np.array(v, copy=True, order="C")  # a 0-d scalar stays 0-d (its digest)
    return {"tensor": f"input.{name}"}


def write_op_file(path, ra: dict, rb: dict, host_inputs, va, vb, k, agrees, a: Trace, b: Trace) -> None:
    """The disputed call (records ``ra`` of A and ``rb`` of B) as an op file (docs/formats.md, "Op file")."""
    tensors: dict = {}
    args = [{"name": n, "value": _arg_entry(n, kind, v, tensors)} for n, kind, v in host_inputs]
    for side, v in (("a", va), ("b", vb)):
        if v is not None:
            tensors[f"output.{side}"] = np.array(v, copy=True, order="C")
    meta = {"lockstep_op_replay": "1", "op": ra["op"],
            "address": json.dumps({kk: ra[kk] for kk in ADDRESS}, sort_keys=True),
            "args": json.dumps(args, sort_keys=True), "output": str(k),
            "outputs_sha256": json.dumps({"a": [o["sha256"] for o in ra["outputs"]],
                                          "b": [o["sha256"] for o in rb["outputs"]]}),
            "inputs_sha256": json.dumps([e["sha256"] for e in ra["inputs"]]),
            "verdict": agrees, "backend_a": a.header["backend"], "backend_b": b.header["backend"],
            "root_a": a.root, "root_b": b.root, "step": str(a.header["step"])}
    write_safetensors(path, tensors, meta)


_OP_META = {"lockstep_op_replay", "op", "address", "args", "output", "outputs_sha256", "inputs_sha256", "verdict",
            "backend_a", "backend_b", "root_a", "root_b", "step"}


def _bad(path, msg: str):
    raise TraceError(f"{path}: not a lockstep op file: {msg}")


def _meta_json(path, meta: dict, key: str):
    if key not in meta:
        _bad(path, f"no {key!r} in its metadata")
    try:
        return parse_json(meta[key], f"op file {key}", str(path))
    except FileFormatError as exc:
        raise TraceError(str(exc)) from None


def _rebuild(path, entry, tensors: dict, used: set, depth: int = 0):
    if not isinstance(entry, dict) or len(entry) != 1 or depth > 2:
        _bad(path, "an argument must be one of tensor, float, int, bool, none, list")
    (tag, v), = entry.items()
    if tag == "tensor":
        if not isinstance(v, str) or v not in tensors:
            _bad(path, f"argument tensor {str(v)[:40]!r} is not in the file")
        if v in used:
            _bad(path, f"tensor {v[:40]!r} is given for two arguments")
        used.add(v)
        return np.array(tensors[v])
    if tag == "float" and isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e300:
        return float(v)
    if tag == "int" and type(v) is int and abs(v) <= MAX_OP_INT:
        return v
    if tag == "bool" and isinstance(v, bool):
        return v
    if tag == "none" and v is True:
        return None
    if tag == "list" and isinstance(v, list) and len(v) <= 4096:
        return [_rebuild(path, x, tensors, used, depth + 1) for x in v]
    _bad(path, f"bad argument {tag!r}")


@dataclass
class OpFile:
    """An op file that was read and checked (``read_op_file``). ``args`` and ``shapes`` are what lockstep
    checked itself (the arguments against their digests and the contract; the result shapes the contract
    gives them); everything else is only what the file claims: the sides' output digests and stored values,
    their verdict, backends, traces' roots, address and step."""

    path: Path
    op: str
    args: list
    names: list
    shapes: tuple            # the contract's result shapes for ``args``
    output: int              # the disputed output
    outputs_sha256: dict     # {"a": [...], "b": [...]}: claimed
    stored: dict             # {"a"|"b": array}: claimed values of the disputed output
    verdict: str             # claimed
    backends: dict           # {"a": name, "b": name}: claimed
    roots: dict              # {"a": hex, "b": hex}: claimed
    address: dict            # claimed
    step: int                # claimed
    held: int                # elements the file holds (its arrays and scalars)
    size: int                # elements the call computes (``contract.call_size``)


def _check_claims(path, meta: dict, op: str) -> tuple[dict, dict, dict, int]:
    """The op file's claims about where the call comes from, each of its type (or a refusal)."""
    address = _meta_json(path, meta, "address")
    if not isinstance(address, dict) or set(address) != set(ADDRESS):
        _bad(path, f"address must have exactly {', '.join(ADDRESS)}")
    try:
        _check_address(address, f"{path}: address")
    except TraceError as exc:
        _bad(path, str(exc).split(": ", 2)[-1])
    if address["op"] != op:
        _bad(path, f"its address names op {address['op']!r}, its op is {op!r}")
    backends, roots = {}, {}
    for side in ("a", "b"):
        name, root = meta.get(f"backend_{side}"), meta.get(f"root_{side}")
        if not isinstance(name, str) or not 0 < len(name) <= 200:
            _bad(path, f"backend_{side} must name a backend")
        if not isinstance(root, str) or not _HEX64.match(root):
            _bad(path, f"root_{side} must be 64 lowercase hex digits (a trace root)")
        backends[side], roots[side] = name, root
    step = meta.get("step", "")
    if not (isinstance(step, str) and step.isascii() and step.isdigit() and len(step) <= 16
            and 1 <= int(step) <= MAX_STEP):
        _bad(path, "step must be a positive integer")
    return address, backends, roots, int(step)


def read_op_file(path) -> OpFile:
    """Read and check an op file: the op, its arguments (rebuilt, checked against their digests and against
    the contract: ``check_call``), the size of the call against what the file holds (``MAX_OP_AMPLIFICATION``),
    the claimed digests and stored outputs (of the call's shapes), and the claims' types. ``TraceError``
    (one line) for anything else."""
    path = Path(path)
    try:
        tensors, meta = read_safetensors(path, max_bytes=MAX_OP_FILE_BYTES, max_header=1 << 20)
    except FileNotFoundError:
        raise TraceError(f"op file not found: {path}") from None
    except (SafetensorsError, OSError) as exc:
        raise TraceError(str(exc)) from None
    if meta.get("lockstep_op_replay") != "1":
        _bad(path, "no lockstep_op_replay marker")
    unknown = sorted(set(meta) - _OP_META)
    if unknown:
        _bad(path, f"unknown metadata {unknown[0][:40]!r}")
    op = meta.get("op")
    if op not in CONTRACT:
        _bad(path, f"op {str(op)[:40]!r} is not an op of the contract")
    address, backends, roots, step = _check_claims(path, meta, op)
    args = _meta_json(path, meta, "args")
    names = [p.name for p in CONTRACT[op].params]
    if not isinstance(args, list) or [x.get("name") if isinstance(x, dict) else None for x in args] != names:
        _bad(path, f"the arguments must be {', '.join(names)}, in order")
    used: set = set()
    values = [_rebuild(path, x.get("value"), tensors, used) for x in args]
    digests = _meta_json(path, meta, "inputs_sha256")
    flat: list = []
    for n, v in zip(names, values):
        flat += [(f"{n}[{i}]", x) for i, x in enumerate(v)] if isinstance(v, list) else [(n, v)]
    if not isinstance(digests, list) or digests != [value_digest(x)[0] for _, x in flat]:
        _bad(path, "its inputs do not have the recorded digests")
    try:
        shapes = check_call(op, tuple(values))
    except (ValueError, TypeError) as exc:
        _bad(path, f"its inputs are no call of {op} ({str(exc)[:300]})")
    outs = _meta_json(path, meta, "outputs_sha256")
    if (not isinstance(outs, dict) or set(outs) != {"a", "b"}
            or not all(isinstance(v, list) and len(v) == len(shapes) and all(isinstance(s, str) and _HEX64.match(s)
                                                                              for s in v) for v in outs.values())):
        _bad(path, f"outputs_sha256 must give the digests of {op}'s {len(shapes)} output(s) for A and B")
    k = meta.get("output", "")
    if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 4 and int(k) < len(shapes)):
        _bad(path, "output must name one of the op's outputs")
    k = int(k)
    returns = CONTRACT[op].returns
    stored = {}
    for side in ("a", "b"):
        name = f"output.{side}"
        if name in tensors:
            used.add(name)
            v = np.asarray(tensors[name])
            want = np.dtype(_RESULT_DTYPES.get(returns[k], np.float32))
            if shapes[k] is None or v.shape != shapes[k] or v.dtype != want:
                _bad(path, f"{name} is {v.dtype} {v.shape}; {op} makes output {k} of these inputs "
                           f"{'None' if shapes[k] is None else f'{want} {shapes[k]}'}")
            if value_digest(v)[0] != outs[side][k]:
                _bad(path, f"{name} does not have the recorded digest")
            stored[side] = v
    if set(tensors) - used:
        _bad(path, f"tensor {sorted(set(tensors) - used)[0][:40]!r} is not an argument or output")
    verdict = meta.get("verdict")
    if verdict not in ("A", "B", "neither"):
        _bad(path, "verdict must be A, B or neither")
    held = sum(int(np.asarray(t).size) for t in tensors.values()) + sum(
        1 for _, x in flat if not isinstance(x, np.ndarray))
    size = call_size(op, tuple(values))
    if size > MAX_OP_AMPLIFICATION * held + MIN_OP_BUDGET:
        _bad(path, f"the call of {op} computes {size} elements from the {held} the file holds; a traced call "
                   f"computes at most {MAX_OP_AMPLIFICATION} times what it is given (plus {MIN_OP_BUDGET}), so this "
                   "is no call of a traced step (re-check the dispute with `lockstep audit diff --referee` on the run)")
    return OpFile(path, op, values, names, shapes, k, outs, stored, verdict, backends, roots, address, step, held, size)


_RESULT_DTYPES = {Kind.F32: np.float32, Kind.F32_SCALAR: np.float32, Kind.F32_OR_NONE: np.float32,
                  Kind.INT32: np.int32, Kind.INT64: np.int64, Kind.UINT32: np.uint32}


def _side(f: OpFile, side: str) -> str:
    return f"{side.upper()} ({f.backends[side][:40]})"


def replay_op_file(path, backend_name: str | None = None) -> tuple[str, bool]:
    """Re-check an op file. Recomputed here: the spec's outputs from the file's inputs, and with
    ``backend_name`` that backend's; compared with the outputs the file *claims* for A and B. Printed as
    such: nothing the file only claims (which backend computed what, its stored values, its address) is said
    to be recomputed. ``(text, ok)``: ok when the spec, recomputed, gives the outputs the file's verdict
    names (and the backend gives the spec's bits)."""
    f = read_op_file(path)
    op, k = f.op, f.output
    try:
        spec_out = _spec_outputs(op, f.args)
    except (ValueError, TypeError, IndexError, ArithmeticError) as exc:  # the contract accepted them: a lockstep bug
        raise TraceError(f"{path}: the spec refuses inputs the contract accepts for {op} (a bug in lockstep: "
                         f"please report it): {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                         ) from None
    spec_d = [value_digest(o)[0] for o in spec_out]
    agrees = "A" if spec_d == f.outputs_sha256["a"] else "B" if spec_d == f.outputs_sha256["b"] else "neither"
    same = agrees == f.verdict
    a = f.address
    lines = [f"{op}: the file says it is the call at {address_text(a)} of step {f.step}, "
             f"A from trace {f.roots['a'][:16]}..., B from trace {f.roots['b'][:16]}...",
             f"recomputed here: the spec's {len(spec_out)} output(s) from the file's {len(f.names)} argument(s) "
             "(each input has its recorded digest, the call is one of the contract)",
             ("the spec's outputs have the digests the file claims for " + _side(f, agrees.lower()))
             if agrees != "neither" else "the spec's outputs have neither the digests the file claims for "
                                         f"{_side(f, 'a')} nor those for {_side(f, 'b')}",
             f"the file's verdict ({f.verdict}) {'agrees' if same else 'DISAGREES'} with the spec recomputed here"]
    ok = same
    for side, stored in sorted(f.stored.items()):
        if spec_out[k] is not None and value_digest(stored)[0] != spec_d[k]:
            n, at, xs, xv = element_difference(spec_out[k], stored)
            if at is not None:
                lines.append(f"output {k} as the file stores it for {_side(f, side)}: {n} elements differ from the "
                             f"spec's; first at flat index {at}: spec {xs}, {side.upper()} {xv}")
    lines.append(f"not recomputed, only the file's claims: that {_side(f, 'a')} and {_side(f, 'b')} computed the "
                 "outputs it gives them (digests and stored values), in the traces, at the address and step named; "
                 "`lockstep audit diff` on the two traces shows whether they hold these outputs")
    if backend_name is not None:
        be = backends.get_backend(backend_name)
        try:
            args, kwargs = move_arguments(op, tuple(f.args), {}, be.asarray)
            out = be.ops[op](*args, **kwargs)
            got = [None if r is None else np.asarray(be.to_numpy(r))
                   for r in (out if isinstance(out, tuple) else (out,))]
        except Exception as exc:  # noqa: BLE001 - a backend failing on a call the spec answers is a finding
            msg = str(exc).splitlines()[0][:200] if str(exc) else ""
            return "\n".join(lines + [f"backend {be.name}, recomputed here: raised {type(exc).__name__} ({msg}) on a "
                                      "call of the contract that the spec answers"]), False
        got_d = [value_digest(o)[0] for o in got]
        if got_d == spec_d:
            lines.append(f"backend {be.name}, recomputed here: the spec's bits")
        else:
            ok = False
            i = next((j for j, (x, y) in enumerate(zip(got_d, spec_d)) if x != y), min(len(got_d), len(spec_d)))
            n, at, xs, xb = (element_difference(spec_out[i], got[i])
                             if i < min(len(got), len(spec_out)) and got[i] is not None and spec_out[i] is not None
                             else (0, None, "", ""))
            lines.append(f"backend {be.name}, recomputed here: other bits than the spec in output {i}"
                         + (f" ({n} elements; first at flat index {at}: spec {xs}, {be.name} {xb})" if at is not None
                            else ""))
        for side in ("a", "b"):
            if f.backends[side] == be.name:
                lines.append(f"the file claims {side.upper()} is {be.name}'s: {be.name} computes here "
                             + ("the outputs it claims for " if got_d == f.outputs_sha256[side] else "NOT the outputs "
                                "it claims for ") + side.upper())
    return "\n".join(lines), ok
