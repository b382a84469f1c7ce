"""``lockstep audit diff TRACE_A TRACE_B [--referee --run RUN --backend B]`` and ``conformance --replay-op FILE``.

``diff_traces`` walks two traces (``lockstep.audit.trace``) record by record and stops at
the first record where anything differs. Since every earlier record agrees, that
record is either

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
schema-checked, kept values checked against their digests, the root recomputed.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.contract import CONTRACT, Kind
from lockstep.fsio import FileFormatError, NotRegularFile, iter_lines, open_named_file, parse_json

from .trace import DIRECTIONS, NONE_DIGEST, TRACE_FORMAT, Capture, TraceError, trace_root, trace_step, value_digest

MAX_TRACE_BYTES = 8 << 30
MAX_TRACE_LINE = 32 << 20
MAX_RECORDS = 10_000_000
MAX_OP_FILE_BYTES = 1 << 30
MAX_OP_INT = 1 << 17  # an int argument of a replayed op (a vocabulary, an axis): Open-1B's vocabulary is 128,256
ADDRESS = ("mb", "layer", "module", "op", "dir", "index")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.\[\]/-]{1,200}$")
_OP = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_DTYPES = {"<f4": np.float32, "<f8": np.float64, "<i4": np.int32, "<i8": np.int64, "|i1": np.int8,
           "<u4": np.uint32, "|u1": np.uint8, "|b1": np.bool_, "<u8": np.uint64, "<i2": np.int16}
_SCALAR_KINDS = {"F32_SCALAR", "F32_SCALAR_SEQUENCE", "HOST_FLOAT", "HOST_INT", "WINDOW", "FLAG"}


@dataclass
class Trace:
    path: Path
    header: dict
    records: list
    root: str


# ---------------------------------------------------------------------------
# reading a trace (untrusted)
# ---------------------------------------------------------------------------


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
    count = int(np.prod(e["shape"], dtype=np.int64)) if e["shape"] else 1
    if len(e["values"]) > 4 * ((count * dt.itemsize + 2) // 3) + 4:
        raise TraceError(f"{where}: values longer than shape {e['shape']} needs")
    try:
        raw = base64.b64decode(e["values"], validate=True)
    except (binascii.Error, ValueError):
        raise TraceError(f"{where}: values are not base64") from None
    if len(raw) != count * dt.itemsize:
        raise TraceError(f"{where}: values hold {len(raw)} bytes, shape {e['shape']} of {e['dtype']} needs "
                         f"{count * dt.itemsize}")
    arr = np.frombuffer(raw, dtype=dt).reshape(e["shape"])
    if value_digest(arr)[0] != e["sha256"]:
        raise TraceError(f"{where}: the kept values do not have the recorded sha256 (the trace was altered)")
    return arr


def _check_record(r, i: int, where: str) -> None:
    keys = {"seq", *ADDRESS, "inputs", "outputs"}
    if not isinstance(r, dict) or set(r) != keys:
        raise TraceError(f"{where}: a record has exactly the keys {', '.join(sorted(keys))}")
    if r["seq"] != i or type(r["seq"]) is not int:
        raise TraceError(f"{where}: record number {r['seq']!r} where {i} was due (records are in order)")
    for k in ("mb", "layer"):
        if r[k] is not None and (type(r[k]) is not int or not 0 <= r[k] < 1 << 40):
            raise TraceError(f"{where}: {k} must be a non-negative integer or null")
    if r["module"] is not None and (not isinstance(r["module"], str) or not _NAME.match(r["module"])):
        raise TraceError(f"{where}: bad module")
    if not isinstance(r["op"], str) or not _OP.match(r["op"]):
        raise TraceError(f"{where}: bad op name")
    if r["dir"] not in DIRECTIONS:
        raise TraceError(f"{where}: direction must be one of {', '.join(DIRECTIONS)}")
    if type(r["index"]) is not int or not 0 <= r["index"] < 1 << 40:
        raise TraceError(f"{where}: index must be a non-negative integer")
    for side in ("inputs", "outputs"):
        if not isinstance(r[side], list) or len(r[side]) > 4096:
            raise TraceError(f"{where}: {side} must be a list")
        for e in r[side]:
            _check_entry(e, where, side == "outputs")


def read_trace(path) -> Trace:
    """Read and check a trace file; ``TraceError`` (one line, naming the file) when it is not one."""
    path = Path(path)
    what = "trace"
    try:
        f = open_named_file(path, what, MAX_TRACE_BYTES)
    except (NotRegularFile, FileFormatError) as exc:
        raise TraceError(str(exc)) from None
    except FileNotFoundError:
        raise TraceError(f"trace not found: {path}") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    header, records, end = None, [], None
    with f:
        try:
            for n, body, _ in iter_lines(f, str(path), MAX_TRACE_LINE):
                where = f"{path}:{n}"
                if end is not None:
                    raise TraceError(f"{where}: a line after the root line")
                obj = parse_json(body, "trace line", where)
                if header is None:
                    if not isinstance(obj, dict) or obj.get("lockstep_trace") != TRACE_FORMAT:
                        raise TraceError(f"{where}: not a lockstep trace (format {TRACE_FORMAT} header expected)")
                    _check_header(obj, where)
                    header = obj
                elif isinstance(obj, dict) and "root" in obj:
                    end = obj
                    if set(obj) != {"root", "records"} or obj["records"] != len(records):
                        raise TraceError(f"{where}: the root line must give the root and the record count "
                                         f"({len(records)})")
                else:
                    if len(records) >= MAX_RECORDS:
                        raise TraceError(f"{where}: more than {MAX_RECORDS} records")
                    _check_record(obj, len(records), where)
                    records.append(obj)
        except FileFormatError as exc:
            raise TraceError(str(exc)) from None
    if header is None:
        raise TraceError(f"{path}: empty; not a lockstep trace")
    if end is None:
        raise TraceError(f"{path}: no root line at its end (truncated?)")
    root = trace_root(records)
    if end["root"] != root:
        raise TraceError(f"{path}: the root line says {str(end['root'])[:16]}..., the records give {root[:16]}... "
                         "(the trace was altered)")
    return Trace(path, header, records, root)


def _check_header(h: dict, where: str) -> None:
    if type(h.get("step")) is not int or h["step"] < 1:
        raise TraceError(f"{where}: the header's step must be a positive integer")
    if h.get("micro_batch") is not None and (type(h["micro_batch"]) is not int or h["micro_batch"] < 0):
        raise TraceError(f"{where}: the header's micro_batch must be a non-negative integer or null")
    for k in ("backend", "spec_version"):
        if not isinstance(h.get(k), str) or len(h[k]) > 200:
            raise TraceError(f"{where}: the header's {k} must be a string")


# ---------------------------------------------------------------------------
# the diff
# ---------------------------------------------------------------------------


def address_text(r: dict) -> str:
    where = "the tree" if r["dir"] == "tree" else "the optimizer" if r["dir"] == "optim" else f"micro-batch {r['mb']}"
    parts = [where] + ([f"layer {r['layer']}"] if r["layer"] is not None else []) \
        + ([f"module {r['module']}"] if r["module"] is not None else [])
    return f"{', '.join(parts)}: {r['op']} ({r['dir']}, call {r['index']}; record {r['seq']})"


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a).reshape(-1)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def element_difference(x: np.ndarray, y: np.ndarray) -> tuple[int, int | None, str, str]:
    """``(count, first flat index, hex of x there, hex of y there)`` of the elements whose bits differ."""
    bx, by = _bits(x), _bits(y)
    if bx.shape != by.shape:
        return max(bx.size, by.size), None, "", ""
    where = np.flatnonzero(bx != by)
    if not where.size:
        return 0, None, "", ""
    i = int(where[0])
    width = 2 * x.dtype.itemsize
    return int(where.size), i, f"0x{int(bx[i]):0{width}X}", f"0x{int(by[i]):0{width}X}"


@dataclass
class Difference:
    kind: str              # "same", "inputs", "outputs", "calls", "length"
    text: str
    seq: int | None = None
    record_a: dict | None = None
    record_b: dict | None = None
    output: int | None = None


def _source(e: dict, trace: Trace, seq: int) -> str:
    if "param" in e:
        return f"the weights (parameter {e['param']})"
    kind = e.get("kind")
    if kind == "IDS":
        return "the data (token ids of the step's windows)"
    if kind in _SCALAR_KINDS:
        return "a scalar from outside the traced ops"
    made = next((r["seq"] for r in reversed(trace.records[:seq]) for o in r["outputs"] if o["sha256"] == e["sha256"]),
                None)
    if made is not None:
        return f"in {trace.path.name} it is the output of record {made}"
    return "an array from outside the traced ops (host code between op calls)"


def diff_traces(a: Trace, b: Trace) -> Difference:
    """The first record where the traces differ (module docstring), as one paragraph."""
    if a.root == b.root and len(a.records) == len(b.records):
        return Difference("same", f"the traces are the same: {len(a.records)} records, root {a.root}")
    for ra, rb in zip(a.records, b.records):
        if any(ra[k] != rb[k] for k in ADDRESS):
            return Difference("calls", f"the traces part at record {ra['seq']}: A calls {address_text(ra)}, "
                                       f"B calls {address_text(rb)} (the steps ran other ops)", ra["seq"], ra, rb)
        ia = [(e["name"], e["sha256"], e["dtype"], e["shape"]) for e in ra["inputs"]]
        ib = [(e["name"], e["sha256"], e["dtype"], e["shape"]) for e in rb["inputs"]]
        if ia != ib:
            bad = [(ea, eb) for ea, eb in zip(ra["inputs"], rb["inputs"]) if ea["sha256"] != eb["sha256"]]
            why = "; ".join(f"input {ea['name']} ({ea['dtype']} {tuple(ea['shape'])}): in A {_source(ea, a, ra['seq'])}"
                            f", in B {_source(eb, b, rb['seq'])}" for ea, eb in bad[:4]) or "their input lists differ"
            first = all(r["mb"] != ra["mb"] for r in a.records[: ra["seq"]]) if ra["mb"] is not None else False
            lead = f"this is micro-batch {ra['mb']}'s first call; " if first else ""
            return Difference("inputs", f"the inputs already differ at {address_text(ra)}, and no earlier output "
                                        f"differs: {lead}{why}", ra["seq"], ra, rb)
        for k, (oa, ob) in enumerate(zip(ra["outputs"], rb["outputs"])):
            if (oa["sha256"], oa["dtype"], oa["shape"]) == (ob["sha256"], ob["dtype"], ob["shape"]):
                continue
            count = int(np.prod(oa["shape"], dtype=np.int64)) if oa["shape"] else 1
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
    n = min(len(a.records), len(b.records))
    longer = "A" if len(a.records) > n else "B"
    return Difference("length", f"the first {n} records agree; trace {'B' if longer == 'A' else 'A'} ends there and "
                                f"{longer} goes on (a trace cut short, or of --micro-batch)", n)


def diff_files(path_a, path_b) -> tuple[Trace, Trace, Difference]:
    a, b = read_trace(path_a), read_trace(path_b)
    d = diff_traces(a, b)
    notes = [f"{k}: A {a.header.get(k)!r}, B {b.header.get(k)!r}" for k in ("step", "micro_batch", "recipe_sha256")
             if a.header.get(k) != b.header.get(k)]
    if notes and d.kind != "same":
        d.text += " (the traces are of different steps or runs: " + "; ".join(notes) + ")"
    return a, b, d


# ---------------------------------------------------------------------------
# the referee and its op file
# ---------------------------------------------------------------------------


@dataclass
class Verdict:
    agrees_with: str       # "A", "B" or "neither"
    text: str
    op_file: Path | None = None


def _spec_outputs(op: str, host_inputs: list) -> list:
    from lockstep.backends import spec_backend

    args = [v for _, _, v in host_inputs]
    out = spec_backend().ops[op](*args)
    return [None if r is None else np.asarray(r) for r in (out if isinstance(out, tuple) else (out,))]


def referee(a: Trace, b: Trace, d: Difference, run_dir, backend, data=None, op_file=None, log=None) -> Verdict:
    """Re-execute the disputed call's step on ``backend`` (capturing its inputs), compute the op on the spec,
    and say which trace the spec agrees with; write the call to ``op_file`` (default beside trace A)."""
    if d.kind != "outputs":
        raise TraceError("--referee needs a call whose inputs agree and outputs differ; " + d.text)
    ra, rb = d.record_a, d.record_b
    if a.header["step"] != b.header["step"]:
        raise TraceError("--referee needs two traces of one step")
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
    spec_out = _spec_outputs(ra["op"], cap.inputs)
    spec_d = [value_digest(o)[0] for o in spec_out]
    da, db = [o["sha256"] for o in ra["outputs"]], [o["sha256"] for o in rb["outputs"]]
    agrees = "A" if spec_d == da else "B" if spec_d == db else "neither"
    k = d.output if d.output is not None else 0
    mine = {dg: v for dg, v in zip([value_digest(o)[0] for o in cap.outputs], cap.outputs)}

    def values(side_rec) -> np.ndarray | None:
        o = side_rec["outputs"][k]
        v = o.get("values")
        return v if v is not None else mine.get(o["sha256"])

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
    write_op_file(op_file, ra, cap.inputs, va, vb, k, agrees, a, b)
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


def write_op_file(path, record, host_inputs, va, vb, k, agrees, a: Trace, b: Trace) -> None:
    from lockstep.fsio.safetensors import write_safetensors

    tensors: dict = {}
    args = [{"name": n, "value": _arg_entry(n, kind, v, tensors)} for n, kind, v in host_inputs]
    for side, v in (("a", va), ("b", vb)):
        if v is not None:
            tensors[f"output.{side}"] = np.array(v, copy=True, order="C")
    meta = {"lockstep_op_replay": "1", "op": record["op"],
            "address": json.dumps({kk: record[kk] for kk in ADDRESS}, sort_keys=True),
            "args": json.dumps(args, sort_keys=True), "output": str(k),
            "outputs_sha256": json.dumps({"a": [o["sha256"] for o in record["outputs"]],
                                          "b": [o["sha256"] for o in b.records[record["seq"]]["outputs"]]}),
            "inputs_sha256": json.dumps([e["sha256"] for e in record["inputs"]]),
            "verdict": agrees, "backend_a": a.header["backend"], "backend_b": b.header["backend"],
            "root_a": a.root, "root_b": b.root, "step": str(a.header["step"])}
    write_safetensors(path, tensors, meta)


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


def read_op_file(path) -> dict:
    """Read and check an op file: the op, its arguments (rebuilt), the digests, and the stored outputs."""
    from lockstep.fsio.safetensors import SafetensorsError, read_safetensors

    path = Path(path)
    try:
        tensors, meta = read_safetensors(path, max_bytes=MAX_OP_FILE_BYTES, max_header=1 << 20)
    except FileNotFoundError:
        raise TraceError(f"op file not found: {path}") from None
    except (SafetensorsError, OSError) as exc:
        raise TraceError(str(exc)) from None
    if meta.get("lockstep_op_replay") != "1":
        _bad(path, "no lockstep_op_replay marker")
    op = meta.get("op")
    if op not in CONTRACT:
        _bad(path, f"op {str(op)[:40]!r} is not an op of the contract")
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
    outs = _meta_json(path, meta, "outputs_sha256")
    if (not isinstance(outs, dict) or set(outs) != {"a", "b"}
            or not all(isinstance(v, list) and all(isinstance(s, str) and _HEX64.match(s) for s in v)
                       for v in outs.values())):
        _bad(path, "outputs_sha256 must give the outputs' digests of A and B")
    k = meta.get("output", "")
    if not k.isdigit() or int(k) >= min(len(outs["a"]), len(outs["b"])):
        _bad(path, "output must name one of the op's outputs")
    k = int(k)
    stored = {}
    for side in ("a", "b"):
        name = f"output.{side}"
        if name in tensors:
            used.add(name)
            if value_digest(np.asarray(tensors[name]))[0] != outs[side][k]:
                _bad(path, f"{name} does not have the recorded digest")
            stored[side] = np.asarray(tensors[name])
    if set(tensors) - used:
        _bad(path, f"tensor {sorted(set(tensors) - used)[0][:40]!r} is not an argument or output")
    verdict = meta.get("verdict")
    if verdict not in ("A", "B", "neither"):
        _bad(path, "verdict must be A, B or neither")
    return {"op": op, "args": values, "names": names, "outputs_sha256": outs, "output": k, "stored": stored,
            "verdict": verdict, "meta": meta}


def replay_op_file(path, backend_name: str | None = None) -> tuple[str, bool]:
    """Re-check an op file: the spec on its inputs, which stored output it agrees with (the file's verdict
    reproduced or not), and with ``backend_name`` that backend's bits against the spec's. ``(text, ok)``."""
    from lockstep.backends import get_backend
    from lockstep.contract import move_arguments

    f = read_op_file(path)
    op, k = f["op"], f["output"]
    try:
        spec_out = _spec_outputs(op, [(None, None, v) for v in f["args"]])
    except (ValueError, TypeError, IndexError) as exc:
        raise TraceError(f"{path}: the spec refuses the file's inputs for {op}: "
                         f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None
    spec_d = [value_digest(o)[0] for o in spec_out]
    agrees = "A" if spec_d == f["outputs_sha256"]["a"] else "B" if spec_d == f["outputs_sha256"]["b"] else "neither"
    meta = f["meta"]
    same = agrees == f["verdict"]
    lines = [f"{op}: the spec agrees with {agrees if agrees == 'neither' else agrees + ' (' + meta.get('backend_' + agrees.lower(), '?')[:40] + ')'}"
             f"; the file's verdict ({f['verdict']}) is {'reproduced' if same else 'NOT reproduced'}"]
    ok = same
    for side, stored in sorted(f["stored"].items()):
        if k < len(spec_out) and spec_out[k] is not None and value_digest(stored)[0] != spec_d[k]:
            n, at, xs, xv = element_difference(spec_out[k], stored)
            if at is not None:
                lines.append(f"output {k} of {side.upper()}: {n} elements differ from the spec's; first at flat "
                             f"index {at}: spec {xs}, {side.upper()} {xv}")
    if backend_name is not None:
        be = get_backend(backend_name)
        args, kwargs = move_arguments(op, tuple(f["args"]), {}, be.asarray)
        out = be.ops[op](*args, **kwargs)
        got = [None if r is None else np.asarray(be.to_numpy(r)) for r in (out if isinstance(out, tuple) else (out,))]
        if [value_digest(o)[0] for o in got] == spec_d:
            lines.append(f"backend {be.name}: the spec's bits")
        else:
            ok = False
            i = next(j for j, (x, y) in enumerate(zip(got, spec_out)) if value_digest(x)[0] != value_digest(y)[0])
            n, at, xs, xb = element_difference(spec_out[i], got[i]) if got[i] is not None and spec_out[i] is not None \
                else (0, None, "", "")
            lines.append(f"backend {be.name}: other bits than the spec in output {i}"
                         + (f" ({n} elements; first at flat index {at}: spec {xs}, {be.name} {xb})" if at is not None else ""))
    return "\n".join(lines), ok
