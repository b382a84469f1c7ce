"""``lockstep audit trace RUN --step t``: every backend op call of one step, in order, with digests.

The trace comes from wrapping the backend object (``traced_backend``): the model and
step code do not change. Every op call (forward, backward, the tree's adds, the
gradient norm, clipping and AdamW) becomes one record with

* a stable **address**: micro-batch (``null`` for the tree and the optimizer), layer,
  module, op, direction (``forward``, ``backward``, ``tree``, ``optim``) and the call
  index among the calls of the same (micro-batch, layer, module, op, direction);
* the SHA-256 (``spec.hashing.array_digest``: canonical bytes under the empty name) of
  each input and each output, scalars included, with dtype and shape.

Layer and module come from what the trace can observe, never from the model's code:
the parameters are registered by name (host arrays, and every ``asarray`` of one), so
an op that reads a parameter (or a transposed view of it) is at that parameter's
layer and module (``layers.01.attn.wqkv``: layer 1, module ``attn``); an op that reads
none inherits the latest within its micro-batch (``rmsnorm_forward`` of the QK-norm
is in ``attn``). Direction inside a micro-batch: an op whose name ends in
``_forward``/``_backward`` sets it, others inherit it. In the optimizer, gradients are
named by where they lie in the summed vector (``GradLayout``). None of this depends on
the op list (``lockstep.contract.CONTRACT`` gives names and kinds), so ops added later
are traced too.

Outputs with at most ``keep_values`` elements also keep their bytes (base64 of the
little-endian C-order data), so ``audit diff`` can count the differing elements and
the referee can show both values. The file format is in docs/formats.md ("Op trace").
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lockstep import backends
from lockstep.backends import Backend
from lockstep.contract import CONTRACT, Kind
from lockstep.errors import LockstepError, Setting
from lockstep.formats.run import Run
from lockstep.formats.schedule import plan_step
from lockstep.formats.state import AdamWState
from lockstep.formats.trajectory import Strictness
from lockstep.fsio import atomic_writer
from lockstep.spec import SPEC_VERSION
from lockstep.spec.hashing import array_digest
from lockstep.train.optim import NonFiniteError
from lockstep.train.step import GradLayout, step_over_ranks, subtree_sums

from .replay import _Replayer

TRACE_FORMAT = 1
TRACE_DOMAIN = b"lockstep.trace.v1\x00"
NONE_DIGEST = hashlib.sha256(b"lockstep.trace.none\x00").hexdigest()
DEFAULT_KEEP_VALUES = 1 << 16  # elements: every output of a tiny or small step's micro-batch ops
DIRECTIONS = ("forward", "backward", "tree", "optim")
_LAYER_NAME = re.compile(r"^layers\.(\d{1,6})\.(.+)$")
# capabilities that compute no published value: passed through; add_into is traced as ``add``; any other
# capability is dropped (every capability gives the plain ops' bits, so a backend without it is the same;
# a device-resident step's capabilities among them: a traced step runs on host arrays between ops)
_PASS_THROUGH = ("weights_unchanged", "watch_compilation", "kernel_runtime")
_TRACED_AS = {"add_into": "add"}


class TraceError(LockstepError, ValueError):
    """A trace cannot be made or read; the message is one line."""


class _Captured(Exception):
    """Raised inside the step once the call asked for has been captured (the rest is not run)."""


def host_value(be, x) -> Any:
    """A host NumPy value of an op argument or result (device arrays through ``be.to_numpy``)."""
    if x is None or isinstance(x, (bool, int, float, np.ndarray, np.generic)):
        return x
    return np.asarray(be.to_numpy(x))


def value_digest(x) -> tuple[str, str, list[int]]:
    """``(sha256 hex, dtype, shape)`` of one host value: arrays by ``array_digest``; a Python float as
    float64, an int as int64, a bool as bool (0-d); ``None`` by ``NONE_DIGEST``."""
    if x is None:
        return NONE_DIGEST, "none", []
    if isinstance(x, bool):
        a = np.asarray(x, dtype=np.bool_)
    elif isinstance(x, int):
        a = np.asarray(x, dtype=np.int64)
    elif isinstance(x, float):
        a = np.asarray(x, dtype=np.float64)
    else:
        a = np.asarray(x)
    return array_digest(a), a.dtype.newbyteorder("<").str if a.dtype.byteorder not in ("|",) else a.dtype.str, \
        [int(s) for s in a.shape]


def storage_key(x) -> tuple | None:
    """Where an array's elements start and how many bytes they span, so a view that starts where its base
    does (``.T``) has its base's key: a NumPy array by its data pointer, a shared-kernel ``DeviceArray`` by
    its buffer object and offset, a CuPy array by its device pointer. None for anything else."""
    try:
        if isinstance(x, np.ndarray):
            return ("host", x.__array_interface__["data"][0], x.nbytes, x.dtype.str) if x.size else None
        if hasattr(x, "buffer") and hasattr(x, "offset"):
            return ("buffer", id(x.buffer), int(x.offset), int(x.size), str(x.dtype))
        ptr = getattr(getattr(x, "data", None), "ptr", None)
        if isinstance(ptr, int):
            return ("device", ptr, int(x.nbytes), str(x.dtype))
    except (AttributeError, TypeError, ValueError):
        return None
    return None


def parse_param_name(name: str) -> tuple[int | None, str]:
    """``(layer, module)`` of a parameter name: ``layers.01.attn.wqkv`` -> ``(1, "attn")``, ``final_norm.gain``
    -> ``(None, "final_norm")``, ``lm_head`` -> ``(None, "lm_head")``."""
    m = _LAYER_NAME.match(name)
    layer, rest = (int(m.group(1)), m.group(2)) if m else (None, name)
    return layer, rest.rsplit(".", 1)[0] if "." in rest else rest


@dataclass
class Capture:
    """What the referee asks for: the call at ``address``; filled with its host inputs and outputs."""

    address: dict
    inputs: list | None = None    # [(name, kind or None, host value)], sequences as lists
    outputs: list | None = None   # [host value]
    digests: dict | None = None   # the record the capture made


@dataclass
class Tracer:
    """Records op calls with their addresses (see the module docstring)."""

    keep_values: int = DEFAULT_KEEP_VALUES
    only_micro_batch: int | None = None
    capture: Capture | None = None
    records: list = field(default_factory=list)
    micro_batch: int | None = None
    direction: str = "forward"
    layer: int | None = None
    module: str | None = None
    recording: bool = True
    _counts: dict = field(default_factory=dict)
    _host_names: dict = field(default_factory=dict)    # (data pointer, nbytes, dtype) -> name
    _device_names: dict = field(default_factory=dict)  # id -> (name, obj): cleared per micro-batch
    _keep: list = field(default_factory=list)

    # -- context set by the step's driver ------------------------------------------------

    def name_host(self, name: str, arr: np.ndarray) -> None:
        """Register a host array (a parameter, or a gradient view of the summed vector) under ``name``."""
        key = storage_key(arr)
        if key is not None:
            self._host_names[key] = name
            self._keep.append(arr)

    def begin(self, micro_batch: int | None, direction: str) -> None:
        self.micro_batch, self.direction, self.layer, self.module = micro_batch, direction, None, None
        self._device_names.clear()
        self.recording = self.only_micro_batch is None or micro_batch == self.only_micro_batch

    # -- naming --------------------------------------------------------------------------

    def name_of(self, x) -> str | None:
        for _ in range(4):
            if x is None:
                return None
            hit = self._device_names.get(("id", id(x)))
            if hit is not None and hit[1] is x:
                return hit[0]
            key = storage_key(x)
            if key is not None:
                hit = self._host_names.get(key) or self._device_names.get(key)
                if hit is not None:
                    return hit if isinstance(hit, str) else hit[0]
            x = getattr(x, "base", None)
        return None

    def moved(self, host, device) -> None:
        """``asarray(host)`` gave ``device``: a parameter keeps its name on the device (by object, and by
        storage, so its views such as ``.T`` are named too)."""
        name = self.name_of(host) if isinstance(host, np.ndarray) else None
        if name is not None:
            self._device_names[("id", id(device))] = (name, device)
            key = storage_key(device)
            if key is not None:
                self._device_names[key] = (name, device)

    # -- one call ------------------------------------------------------------------------

    def _address(self, op: str, named: str | None) -> dict:
        if self.direction in ("forward", "backward"):
            if op.endswith("_forward"):
                self.direction = "forward"
            elif op.endswith("_backward"):
                self.direction = "backward"
            if named is not None:
                self.layer, self.module = parse_param_name(named)
            layer, module = self.layer, self.module
        else:
            layer, module = parse_param_name(named) if named is not None else (None, None)
        key = (self.micro_batch, layer, module, op, self.direction)
        index = self._counts.get(key, 0)
        self._counts[key] = index + 1
        return {"mb": self.micro_batch, "layer": layer, "module": module, "op": op, "dir": self.direction,
                "index": index}

    def call(self, be, op: str, fn, args: tuple, kwargs: dict):
        if not self.recording:
            return fn(*args, **kwargs)
        items = _named_arguments(op, args, kwargs)
        host_in = [(name, kind, _host_tree(be, v)) for name, kind, v in items]
        named = next((n for _, _, v in items for n in [_first_name(self, v)] if n is not None), None)
        params = [n for _, _, v in items for n in [_first_name(self, v)]]
        inputs = []
        for (name, kind, hv), param in zip(host_in, params):
            for sub, value in _flatten(name, hv):
                digest, dtype, shape = value_digest(value)
                entry = {"name": sub, "sha256": digest, "dtype": dtype, "shape": shape}
                if kind is not None:
                    entry["kind"] = kind.name
                if param is not None:
                    entry["param"] = param
                inputs.append(entry)
        out = fn(*args, **kwargs)
        return self._record(be, op, named, inputs, host_in, out, out)

    def _record(self, be, op, named, inputs, host_in, out, returned):
        results = out if isinstance(out, tuple) else (out,)
        host_out = [host_value(be, r) for r in results]
        outputs = []
        for i, hv in enumerate(host_out):
            digest, dtype, shape = value_digest(hv)
            entry = {"name": str(i), "sha256": digest, "dtype": dtype, "shape": shape}
            if isinstance(hv, np.ndarray) and dtype != "none" and hv.size <= self.keep_values:
                entry["values"] = base64.b64encode(np.ascontiguousarray(hv).astype(hv.dtype.newbyteorder("<"))
                                                   .tobytes()).decode("ascii")
            outputs.append(entry)
        record = {"seq": len(self.records), **self._address(op, named), "inputs": inputs, "outputs": outputs}
        self.records.append(record)
        cap = self.capture
        if cap is not None and all(record[k] == cap.address[k] for k in ("mb", "layer", "module", "op", "dir",
                                                                          "index")):
            cap.inputs, cap.outputs, cap.digests = host_in, host_out, record
            raise _Captured()
        return returned

    def call_add_into(self, be, fn, a, b, out):
        """``add_into(a, b, out)`` traced as the op ``add`` (the same bits): inputs hashed before it writes."""
        if not self.recording:
            return fn(a, b, out)
        host_in = [("a", Kind.F32_OPERAND, host_value(be, a)), ("b", Kind.F32_OPERAND, host_value(be, b))]
        inputs = [{"name": n, "sha256": d[0], "dtype": d[1], "shape": d[2], "kind": k.name}
                  for n, k, v in host_in for d in [value_digest(v)]]
        result = fn(a, b, out)
        return self._record(be, "add", None, inputs, host_in, out, result)


def _named_arguments(op: str, args: tuple, kwargs: dict) -> list[tuple[str, Kind | None, Any]]:
    contract = CONTRACT.get(op)
    if contract is None:  # an op beyond the contract: positional names, no kinds
        return [(f"arg{i}", None, v) for i, v in enumerate(args)] + [(k, None, v) for k, v in sorted(kwargs.items())]
    bound = contract.signature().bind(*args, **kwargs)
    bound.apply_defaults()
    kinds = {p.name: p.kind for p in contract.params}
    return [(name, kinds[name], value) for name, value in bound.arguments.items()]


def _host_tree(be, v):
    if isinstance(v, (list, tuple)):
        return [host_value(be, x) for x in v]
    return host_value(be, v)


def _flatten(name: str, hv):
    if isinstance(hv, list):
        return [(f"{name}[{i}]", x) for i, x in enumerate(hv)]
    return [(name, hv)]


def _first_name(tracer: Tracer, v) -> str | None:
    if isinstance(v, (list, tuple)) or v is None or isinstance(v, (bool, int, float)):
        return None
    return tracer.name_of(v)


def traced_backend(be, tracer: Tracer):
    """``be`` with every op (and ``add_into``) recorded by ``tracer``; the same bits as ``be``."""
    def wrap(op, fn):
        def traced(*args, **kwargs):
            return tracer.call(be, op, fn, args, kwargs)
        traced.__name__ = op
        return traced

    def asarray(x):
        y = be.asarray(x)
        tracer.moved(x, y)
        return y

    caps = be.capabilities
    changes = {}
    for f in dataclasses.fields(caps):
        value = getattr(caps, f.name)
        if value is None or f.name in _PASS_THROUGH:
            continue
        if f.name == "add_into":
            changes[f.name] = (lambda fn: lambda a, b, out: tracer.call_add_into(be, fn, a, b, out))(value)
        else:
            changes[f.name] = None
    return Backend(name=be.name, ops={op: wrap(op, fn) for op, fn in be.ops.items()}, asarray=asarray,
                   to_numpy=be.to_numpy, description=be.description, info=dict(be.info),
                   capabilities=dataclasses.replace(caps, **changes), memory=be.memory)


# ---------------------------------------------------------------------------
# the root digest and the file
# ---------------------------------------------------------------------------


def record_bytes(record: dict) -> bytes:
    """The canonical JSON of a record without its kept values (what the root binds; values are checked
    against their digests instead)."""
    import json

    bare = {**record, "outputs": [{k: v for k, v in o.items() if k != "values"} for o in record["outputs"]]}
    return json.dumps(bare, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def record_digest(record: dict) -> bytes:
    """``SHA-256(record_bytes(record))``, a record's leaf of the root."""
    return hashlib.sha256(record_bytes(record)).digest()


def root_of_digests(digests: bytes) -> str:
    """The root of the records whose ``record_digest`` values, in order, are ``digests`` (32 bytes each)."""
    h = hashlib.sha256(TRACE_DOMAIN + struct.pack("<Q", len(digests) // 32))
    h.update(digests)
    return h.hexdigest()


def trace_root(records: list[dict]) -> str:
    """``SHA-256(TRACE_DOMAIN || u64 n || SHA-256(record_bytes(r)) for each record in order)``."""
    return root_of_digests(b"".join(record_digest(r) for r in records))


def write_trace(path, header: dict, records: list[dict]) -> str:
    """Write the trace atomically: header line, one line per record, then ``{"root", "records"}``."""
    import json


    root = trace_root(records)
    with atomic_writer(Path(path)) as f:
        f.write(json.dumps({"lockstep_trace": TRACE_FORMAT, **header}, sort_keys=True).encode("ascii") + b"\n")
        for r in records:
            f.write(json.dumps(r, sort_keys=True, separators=(",", ":")).encode("ascii") + b"\n")
        f.write(json.dumps({"root": root, "records": len(records)}, sort_keys=True).encode("ascii") + b"\n")
    return root


# ---------------------------------------------------------------------------
# tracing one step of a run
# ---------------------------------------------------------------------------


@dataclass
class StepTrace:
    header: dict
    records: list
    root: str


class _TracedPhases:
    """The ``train.step.StepWatch`` of a traced step: each phase sets the tracer's context
    (micro-batch ``j`` forward, the tree, the optimizer) and the update names what it reads:
    the gradients by where they lie in the summed vector (``GradLayout``), and the moments."""

    def __init__(self, tracer: Tracer, layout):
        self.tracer, self.layout = tracer, layout

    def micro_batch(self, j: int) -> None:
        self.tracer.begin(j, "forward")

    def tree(self) -> None:
        self.tracer.begin(None, "tree")

    def update(self, summed, opt) -> None:
        tracer = self.tracer
        tracer.begin(None, "optim")
        _, grads = self.layout.unflatten(summed)
        for name, g in grads.items():
            tracer.name_host(name, g)
        for name, p in opt.m.items():
            tracer.name_host(f"adam_m/{name}", np.asarray(p))
        for name, p in opt.v.items():
            tracer.name_host(f"adam_v/{name}", np.asarray(p))


def traced_tree_step(params, opt, windows, plan, cfg, tcfg, be, tracer: Tracer):
    """``train.step.step_over_ranks`` (the step the trainer and the replay run) on one process, over
    ``traced_backend(be, tracer)`` and watched by the tracer: the same calls in the same order, the
    same bits. Micro-batch ``j``'s ops are traced in ``forward``/``backward``, the tree's adds its
    value completes in ``tree``, clipping and AdamW in ``optim``.

    The traced backend offers no device-resident capability, so the step runs on host arrays (a
    state left on the device is traced from host copies: the same bits). With
    ``tracer.only_micro_batch`` only that micro-batch is computed (the step's own ``subtree_sums``
    over it) and nothing after it (returns None).
    """

    def host(v):  # a state a device-resident step left on the device is traced from host copies (same bits)
        return v if isinstance(v, np.ndarray) else np.asarray(be.to_numpy(v))

    params = {k: host(v) for k, v in params.items()}
    opt = AdamWState(opt.step, {k: host(v) for k, v in opt.m.items()}, {k: host(v) for k, v in opt.v.items()})
    tb = traced_backend(be, tracer)
    for name, p in params.items():
        tracer.name_host(name, np.asarray(p))
    watch = _TracedPhases(tracer, GradLayout.of(cfg))
    only = tracer.only_micro_batch
    if only is not None:
        m = len(plan.micro_batches(tcfg.micro_batch))
        if not 0 <= only < m:
            raise TraceError(f"step {plan.step} has micro-batches 0..{m - 1}; there is no micro-batch {only}")
        subtree_sums(params, windows, plan, only, only + 1, cfg, tcfg, tb, watch=watch)
        return None
    return step_over_ranks(params, opt, windows, plan, cfg, tcfg, tb, None, watch=watch)


def trace_step(run_dir, step: int, backend, micro_batch: int | None = None, data=None,
               keep_values: int = DEFAULT_KEEP_VALUES, capture: Capture | None = None, log=None) -> StepTrace:
    """Trace step ``step`` of the run: its start state is replayed (checkpoint, then untraced steps, each
    compared with the trajectory), then step ``step`` runs traced. ``backend`` is a name or a ``Backend``.

    With ``capture`` the step stops at that call (``Capture`` is filled) and the trace holds the records
    up to it. Raises ``TraceError`` (or ``ReplayError``) with one line when it cannot run.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TraceError(f"{run_dir}: not a directory; give the path of a run directory")
    name = backend if isinstance(backend, str) else backend.name
    if name == "auto":
        raise TraceError.naming("give the backend by name (", Setting("backend"), " spec, numba, ...): a trace "
                                "names its backend")
    rp = _Replayer(Run.open(run_dir, Strictness.AUDIT), "spec", data, log)
    if not 1 <= step <= len(rp.traj):
        raise TraceError(f"{run_dir}: the run has steps 1..{len(rp.traj)}; cannot trace step {step}")
    try:
        rp.be = backends.get_backend(backend) if isinstance(backend, str) else backend
    except ValueError as exc:  # an unknown name (BackendUnavailable, a RuntimeError, goes to the caller)
        raise TraceError(str(exc)) from None
    state = rp.start_state(step)
    if state is None:
        raise TraceError(f"step {step} cannot be reached: " + "; ".join(rp.notes[-1:] or rp.damaged[-1:]))
    while state.step < step - 1:
        check, nxt = rp.step(state)
        if nxt is None:
            raise TraceError(f"step {check.step}, before the traced step, does not match the published run on "
                             f"backend {rp.be.name} ({', '.join(check.differs)}): trace step {check.step} instead")
        state = nxt
    plan = plan_step(rp.tcfg, rp.cfg.seq_len, step)
    windows = rp.stream.windows(plan.first_window, plan.n_windows)
    tracer = Tracer(keep_values=keep_values, only_micro_batch=micro_batch, capture=capture)
    header = {"step": step, "micro_batch": micro_batch, "backend": rp.be.name, "spec_version": SPEC_VERSION,
              "recipe_sha256": rp.digest, "commitment": rp.commitment, "keep_values": keep_values,
              "micro_batches": len(plan.micro_batches(rp.tcfg.micro_batch))}
    if rp.problems:  # the run is invalid (a broken chain, a forged checkpoint): the trace still shows the step
        header["run_problems"] = rp.problems[:5]
    try:
        res = traced_tree_step(state.params, state.opt, windows, plan, rp.cfg, rp.tcfg, rp.be, tracer)
    except _Captured:
        res = None
    except NonFiniteError as exc:
        raise TraceError(f"the traced step stopped after {len(tracer.records)} op calls: {exc}") from None
    if res is not None:
        rec = rp.traj[step - 1]
        header["state_root"] = res.state_root
        header["matches_published_state_root"] = res.state_root == rec["state_root"]
    return StepTrace(header, tracer.records, trace_root(tracer.records))
