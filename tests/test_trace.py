"""Op traces, their diff and the referee (``lockstep audit trace/diff``, ``conformance --replay-op``).

Step 3 of the shared honest run (``conftest.honest_run``: tiny, 6 windows a step in
micro-batches of 2, so M = 3 micro-batches; checkpoint 2 is its start, so nothing is
replayed before it). Micro-batch indices are 0-based: "micro-batch 2" is the third.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lockstep.audit.trace import TraceError, record_bytes, trace_step, write_trace
from lockstep.audit.trace_diff import diff_files, read_op_file, read_trace, referee
from lockstep.backends import Backend, BackendUnavailable, get_backend
from lockstep.cli import main

STEP = 3
ROOT = Path(__file__).resolve().parents[1]


def _cli(*args) -> int:
    return main([str(a) for a in args])


def _write(t, path: Path) -> Path:
    write_trace(path, t.header, t.records)
    return path


def fast() -> str:
    """numba where it is installed (its traces are the spec's, record for record: tested below), else the spec."""
    try:
        get_backend("numba")
        return "numba"
    except BackendUnavailable:  # pragma: no cover - the test extra installs numba
        return "spec"


@pytest.fixture(scope="module")
def clean(honest_run, tmp_path_factory):
    """The clean trace of step 3 (object and file), on numba where it is installed (its traces are
    the spec's record for record: ``test_traces_of_every_backend_are_identical_record_for_record``)."""
    t = trace_step(honest_run, STEP, fast())
    return t, _write(t, tmp_path_factory.mktemp("trace") / "spec.jsonl")


@pytest.fixture(scope="module")
def clean_mb2(honest_run, tmp_path_factory):
    """The spec's trace of micro-batch 2 of step 3 alone (``--micro-batch 2``), as a file."""
    return _write(trace_step(honest_run, STEP, "spec", micro_batch=2), tmp_path_factory.mktemp("trace") / "mb2.jsonl")


class FlipOne:
    """A backend (numba, else the spec), but call number ``call`` of ``op`` (counted over the traced
    calls) has bit 0 of element ``element`` of output 0 flipped."""

    def __init__(self, op: str, call: int, element: int):
        self.op, self.call, self.element, self.seen = op, call, element, 0

    def backend(self) -> Backend:
        spec = get_backend(fast())

        def wrapped(*args, **kwargs):
            out = spec.ops[self.op](*args, **kwargs)
            self.seen += 1
            if self.seen - 1 == self.call:
                many = isinstance(out, tuple)
                first = np.array(out[0] if many else out, dtype=np.float32)
                first.reshape(-1).view(np.uint32)[self.element] ^= 1
                out = (first, *out[1:]) if many else first
            return out

        return Backend("flipped", {**spec.ops, self.op: wrapped}, spec.asarray, spec.to_numpy,
                       f"{spec.name} with one bit flipped", capabilities=spec.capabilities)


def test_traced_steps_match_the_published_state_and_name_every_call(clean, honest_run):
    t, _ = clean
    assert t.header["matches_published_state_root"] is True  # traced: the untraced training's bits
    assert t.header["micro_batches"] == 3
    dirs = {r["dir"] for r in t.records}
    assert dirs == {"forward", "backward", "tree", "optim"}
    assert sum(r["dir"] == "tree" for r in t.records) == 2  # M = 3: (v0 + v1) + v2
    rms = [r for r in t.records if r["op"] == "rmsnorm_backward" and r["mb"] == 2]
    # model.py: final norm, then layer 1 (ffn_norm, q, k, attn_norm), layer 0, embed_norm
    assert [(r["layer"], r["module"]) for r in rms[:2]] == [(None, "final_norm"), (1, "ffn_norm")]
    assert read_trace(clean[1]).root == t.root


def test_diff_names_exactly_the_flipped_call_and_the_referee_sides_with_the_clean_trace(clean_mb2, honest_run,
                                                                                        tmp_path, capsys):
    # only micro-batch 2 runs (--micro-batch 2); its rmsnorm_backward calls are the final norm's, then
    # layer 1's ffn_norm (model.py's backward order): call 1 is layer 1, ffn_norm
    flip = FlipOne("rmsnorm_backward", 1, 17)
    bad = _write(trace_step(honest_run, STEP, flip.backend(), micro_batch=2), tmp_path / "bad.jsonl")
    capsys.readouterr()
    assert _cli("audit", "diff", clean_mb2, bad) == 2
    text = capsys.readouterr().out
    assert "micro-batch 2, layer 1, module ffn_norm: rmsnorm_backward (backward, call 0;" in text
    assert "output 0 (<f4 (2, 32, 32)) differs in 1 of 2048 elements (first at flat index 17" in text
    op_file = tmp_path / "call.safetensors"
    assert _cli("audit", "diff", clean_mb2, bad, "--referee", "--run", honest_run, "--backend", "spec",
                "--op-file", op_file) == 2
    text = capsys.readouterr().out
    assert "the spec agrees with A (spec)" in text
    assert "1 elements differ from the spec's; first at flat index 17" in text
    assert read_op_file(op_file).verdict == "A"
    # the same verdict in a fresh process; numba computes the spec's bits for the call
    res = subprocess.run([sys.executable, "-m", "lockstep.cli", "conformance", "--replay-op", str(op_file)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "the spec's outputs have the digests the file claims for A (spec)" in res.stdout
    assert "the file's verdict (A) agrees with the spec recomputed here" in res.stdout
    assert "output 0 as the file stores it for B (flipped): 1 elements differ from the spec's; first at flat index 17" \
        in res.stdout
    from lockstep.audit.trace_diff import replay_op_file

    text, ok = replay_op_file(op_file, "numba")
    assert ok and "backend numba, recomputed here: the spec's bits" in text
    # the file's own claim is checked: a verdict edited to B disagrees with the spec
    from lockstep.fsio.safetensors import read_safetensors, write_safetensors

    tensors, meta = read_safetensors(op_file)
    write_safetensors(tmp_path / "edited.safetensors", tensors, {**meta, "verdict": "B"})
    assert _cli("conformance", "--replay-op", tmp_path / "edited.safetensors") == 2


def test_an_optimizer_call_with_scalar_inputs_is_refereed_and_replayed(clean, honest_run, tmp_path):
    from lockstep.audit.trace_diff import replay_op_file

    flip = FlipOne("adamw_update", 3, 100)  # the 4th parameter in param_specs order
    bad = _write(trace_step(honest_run, STEP, flip.backend()), tmp_path / "bad.jsonl")
    a, b, d = diff_files(clean[1], bad)
    assert d.kind == "outputs" and d.record_a["dir"] == "optim" and d.record_a["op"] == "adamw_update"
    assert "differs in 1 of" in d.text and "first at flat index 100" in d.text
    v = referee(a, b, d, honest_run, fast(), op_file=tmp_path / "adamw.safetensors")
    assert v.agrees_with == "A"
    text, ok = replay_op_file(v.op_file)
    assert ok and "the file's verdict (A) agrees with the spec recomputed here" in text


def test_different_data_for_one_micro_batch_is_named_at_its_first_call(clean, honest_run, tmp_path, monkeypatch, capsys):
    from lockstep.formats.stream import GlobalStream

    real = GlobalStream.windows

    def other_data(self, first, n):
        w = np.array(real(self, first, n))
        w[2:4] = (w[2:4] + 1) % 256  # micro-batch 1 (windows 2 and 3 of the step) reads other tokens
        return w

    monkeypatch.setattr(GlobalStream, "windows", other_data)
    other = _write(trace_step(honest_run, STEP, fast()), tmp_path / "other.jsonl")
    monkeypatch.undo()
    _, _, d = diff_files(clean[1], other)
    assert d.kind == "inputs" and d.record_a["mb"] == 1 and d.record_a["op"] == "embedding_forward"
    assert "this is micro-batch 1's first call; input ids" in d.text
    assert "the data (token ids of the step's windows)" in d.text
    assert _cli("audit", "diff", clean[1], other) == 2
    capsys.readouterr()
    with pytest.raises(TraceError, match="inputs agree"):
        referee(read_trace(clean[1]), read_trace(other), d, honest_run, "spec")


def test_same_traces_exit_0_and_micro_batch_traces(clean, clean_mb2, honest_run, tmp_path, capsys):
    assert _cli("audit", "diff", clean[1], clean[1]) == 0
    assert "the traces are the same" in capsys.readouterr().out
    mb2 = read_trace(clean_mb2)
    assert mb2.records and {r["mb"] for r in mb2.records} == {2}
    mine = [r for r in clean[0].records if r["mb"] == 2]
    strip = lambda r: {k: v for k, v in json.loads(record_bytes(r)).items() if k != "seq"}  # noqa: E731
    assert [strip(r) for r in mb2.records] == [strip(r) for r in mine]
    assert _cli("audit", "trace", honest_run, "--step", STEP, "--micro-batch", 3, "--backend", "spec",
                "--out", tmp_path / "x.jsonl") == 1


@pytest.mark.parametrize("name", ["spec", "numba", "opencl"])
def test_traces_of_every_backend_are_identical_record_for_record(clean, honest_run, name):
    if name == clean[0].header["backend"]:
        pytest.skip(f"the clean trace is {name}'s")
    try:
        be = get_backend(name)
    except BackendUnavailable as e:  # pragma: no cover - CI installs numba and pyopencl[pocl]
        pytest.skip(f"{name} backend unavailable: {e}")
    t = trace_step(honest_run, STEP, be)
    assert t.header["matches_published_state_root"] is True
    assert len(t.records) == len(clean[0].records)
    for got, want in zip(t.records, clean[0].records):
        assert got == want
    assert t.root == clean[0].root


# ---------------------------------------------------------------- untrusted trace and op files


def _mutations(text: str) -> list[tuple[str, str]]:
    lines = text.splitlines(keepends=True)
    rec = json.loads(lines[5])
    values = next(o for o in rec["outputs"] if "values" in o)
    forged = dict(rec, outputs=[dict(o, values=values["values"][:-8] + "AAAAAAA=") if o is values else o
                                for o in rec["outputs"]])
    reseq = dict(rec, seq=99)
    return [
        ("truncated", "".join(lines[:-1])),
        ("empty", ""),
        ("not JSON", "hello\n"),
        ("a record edited", "".join(lines[:5] + [lines[5].replace('"index":0', '"index":1', 1)] + lines[6:])),
        ("values edited", "".join(lines[:5] + [json.dumps(forged) + "\n"] + lines[6:])),
        ("out of order", "".join(lines[:5] + [json.dumps(reseq) + "\n"] + lines[6:])),
        ("extra key", "".join(lines[:5] + [json.dumps(dict(rec, code="x")) + "\n"] + lines[6:])),
        ("after root", text + lines[-1]),
        ("a NaN", text.replace('"index":0', '"index":NaN', 1)),
        ("wrong header", text.replace('"lockstep_trace": 1', '"lockstep_trace": 2', 1)),
        ("huge shape", text.replace('"shape":[', '"shape":[1099511627776,', 1)),
    ]


def test_malformed_traces_are_refused_with_one_line(clean_mb2, tmp_path, capsys):
    text = clean_mb2.read_text()
    for label, bad in _mutations(text):
        p = tmp_path / "bad.jsonl"
        p.write_text(bad)
        with pytest.raises(TraceError) as e:
            read_trace(p)
        assert "\n" not in str(e.value), label
        assert _cli("audit", "diff", p, clean_mb2) == 1, label
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("lockstep audit:"), (label, err)
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(TraceError, match="not a regular file|Is a directory"):
        read_trace(tmp_path / "dir.jsonl")
    big = tmp_path / "long.jsonl"
    big.write_bytes(text.splitlines(keepends=True)[0].encode() + b"[" * (33 << 20) + b"\n")
    with pytest.raises(TraceError, match="longer than"):
        read_trace(big)


def test_random_damage_to_a_trace_never_passes_unnoticed(clean, tmp_path):
    from hypothesis import given, settings, strategies as st

    data = clean[1].read_bytes()
    lines = data.split(b"\n")
    fixed = write_trace(tmp_path / "small.jsonl", json.loads(lines[0]), [json.loads(lines[1]), json.loads(lines[2])])
    small = (tmp_path / "small.jsonl").read_bytes()
    assert read_trace(tmp_path / "small.jsonl").root == fixed

    record = json.loads(lines[1])
    hostile = st.sampled_from([None, -1, 2**70, "x", [], {}, [[[[]]]], 1.5, True, "0" * 64, [2**45]])

    @settings(max_examples=30)
    @given(st.sampled_from(sorted(record)), hostile, st.sampled_from(["record", "input", "output"]), st.integers(0, 9))
    def check_values(key, value, where, pick):
        r = copy.deepcopy(record)
        if where == "record":
            r[key] = value
        else:
            e = r["inputs" if where == "input" else "outputs"][0]
            e[sorted(e)[pick % len(e)]] = value
        p = tmp_path / "values.jsonl"
        head = json.loads(lines[0])
        try:
            write_trace(p, head, [r, json.loads(lines[2])])  # a root that fits: only the schema can refuse it
        except (TypeError, AttributeError, KeyError):  # no root can be made of it: any root line then
            p.write_bytes(b"\n".join([lines[0], json.dumps(r).encode(), lines[2], lines[-2], b""]))
        try:
            read_trace(p)
        except TraceError as e:
            assert "\n" not in str(e)

    check_values()

    @settings(max_examples=40)
    @given(st.integers(0, len(small) - 1), st.integers(1, 255))
    def check(at, xor):
        p = tmp_path / "fuzz.jsonl"
        p.write_bytes(small[:at] + bytes([small[at] ^ xor]) + small[at + 1:])
        try:
            t = read_trace(p)
        except TraceError as e:
            assert "\n" not in str(e)
        else:  # only a change that reads as the same records can pass (a header field, a space), never a digest
            assert [record_bytes(r) for r in t.records] == [record_bytes(json.loads(x)) for x in lines[1:3]]
            assert [o["values"].tobytes() for r in t.records for o in r["outputs"] if "values" in o] == \
                [base64.b64decode(o["values"]) for x in lines[1:3] for o in json.loads(x)["outputs"] if "values" in o]

    check()


def test_malformed_op_files_are_refused(clean_mb2, honest_run, tmp_path):
    from lockstep.fsio.safetensors import read_safetensors, write_safetensors

    flip = FlipOne("swiglu_backward", 0, 3)  # micro-batch 2, layer 1, ffn
    bad = _write(trace_step(honest_run, STEP, flip.backend(), micro_batch=2), tmp_path / "bad.jsonl")
    a, b, d = diff_files(clean_mb2, bad)
    good = tmp_path / "op.safetensors"
    referee(a, b, d, honest_run, "spec", op_file=good)
    tensors, meta = read_safetensors(good)
    first_input = next(k for k in tensors if k.startswith("input."))
    cases = {
        "unknown op": ({}, {"op": "system"}),
        "no marker": ({}, {"lockstep_op_replay": "0"}),
        "args not JSON": ({}, {"args": "[{"}),
        "args reordered": ({}, {"args": json.dumps(list(reversed(json.loads(meta["args"]))))}),
        "an input edited": ({first_input: np.array(tensors[first_input]) + np.float32(1)}, {}),
        "an output edited": ({"output.a": np.array(tensors["output.a"]) * np.float32(2)}, {}),
        "an extra tensor": ({"extra": np.zeros(3, np.float32)}, {}),
        "bad verdict": ({}, {"verdict": "C"}),
        "bad output index": ({}, {"output": "7"}),
        "a huge int": ({}, {"args": meta["args"].replace('{"tensor": "input.dh"}', '{"int": 1' + '0' * 40 + '}')}),
        "a huge float": ({}, {"args": meta["args"].replace('{"tensor": "input.dh"}', '{"float": 1e308}')}),
        "a wrong type": ({}, {"args": meta["args"].replace('{"tensor": "input.dh"}', '{"none": true}')}),
    }
    for label, (tchange, mchange) in cases.items():
        p = tmp_path / "edited.safetensors"
        write_safetensors(p, {**tensors, **tchange}, {**meta, **mchange})
        with pytest.raises(TraceError) as e:
            read_op_file(p)
        assert "\n" not in str(e.value), label
        assert _cli("conformance", "--replay-op", p) == 1, label
    raw = good.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError):
        read_op_file(tmp_path / "cut.safetensors")


def test_a_device_report_holds_the_dispute_of_a_step_that_differs(clean, honest_run, tmp_path, monkeypatch):
    """``conformance --report``'s dispute of a differing training step: both traces, the diff and the verdict.

    The backend under test flips one bit in micro-batch 0 (layer 1's ffn_norm backward). Its
    ``lockstep`` commands run in this process (the report runs them as child processes); the spec's
    trace of the step is the module's, already made.
    """
    import shutil

    import lockstep.backends as backends
    from lockstep.conformance.report import dispute, to_markdown

    real = backends.get_backend
    monkeypatch.setattr(backends, "get_backend",
                        lambda name: FlipOne("rmsnorm_backward", 1, 5).backend() if name == "flipped" else real(name))

    def run_cli(args):
        if args[:2] == ["audit", "trace"] and args[args.index("--backend") + 1] == "spec":
            shutil.copyfile(clean[1], args[args.index("--out") + 1])
            return 0, "copied"
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = main(args)
        return rc, buf.getvalue()

    d = dispute("flipped", honest_run, STEP, tmp_path, tmp_path / "op.safetensors", run_cli=run_cli)
    text = " ".join(d["text"])
    assert d["diff_exit"] == 2
    assert "micro-batch 0, layer 1, module ffn_norm: rmsnorm_backward (backward, call 0;" in text
    assert "the spec agrees with A (" in text and "first at flat index 5" in text
    assert read_op_file(d["op_file"]).verdict == "A"
    report = {"backend": "flipped", "verdict": "DIFFERS", "created": "-", "self_test": {"status": "passed"},
              "environment": {"lockstep": "-", "SPEC_VERSION": "-", "platform": "-", "machine": "-", "python": "-",
                              "numpy": "-"},
              "training": {"passed": False, "runs": [{"label": "tiny-int8", "args": [], "equal": False,
                                                      "backend": {}, "spec": {}, "differs": [], "dispute": d}]}}
    assert "the spec agrees with A (" in to_markdown(report)


def test_capabilities_that_compute_are_traced_or_dropped():
    """``add_into`` is traced (as ``add``); a capability the trace does not know is dropped (every
    capability gives the plain ops' bits, so the traced backend computes the same without it)."""
    from lockstep.audit.trace import Tracer, traced_backend
    from lockstep.contract.capabilities import Capabilities

    spec = get_backend("spec")
    written = []
    caps = Capabilities(add_into=lambda a, b, out: written.append(1) or np.add(a, b, out=out),
                        tensor_leaves=lambda name, x: [], weights_unchanged=spec.capabilities.weights_unchanged)
    tracer = Tracer()
    tb = traced_backend(Backend("x", dict(spec.ops), capabilities=caps), tracer)
    assert tb.capabilities.tensor_leaves is None and tb.capabilities.weights_unchanged is caps.weights_unchanged
    a, b = np.ones(3, np.float32), np.full(3, 2.0, np.float32)
    tb.capabilities.add_into(a, b, a)
    assert written and a.tolist() == [3.0, 3.0, 3.0]
    [r] = tracer.records
    assert r["op"] == "add" and [e["name"] for e in r["inputs"]] == ["a", "b"]
    assert r["inputs"][0]["sha256"] != r["outputs"][0]["sha256"]  # a hashed before add_into wrote into it


def _records_of(path: Path) -> tuple[dict, list[dict]]:
    lines = path.read_text().splitlines()
    return json.loads(lines[0]), [json.loads(x) for x in lines[1:-1]]


def test_a_shape_whose_element_count_overflows_int64_is_refused(clean_mb2, tmp_path, capsys):
    """Issue 34, item 3: [2**32, 2**32] passed the schema (each dim below 2**40); its element count wrapped to
    0 in int64, the empty values matched it, and ``audit diff`` ended in reshape's ValueError traceback.
    Sizes are Python integers now, and no traced array has more than ``MAX_ELEMENTS``."""
    header, records = _records_of(clean_mb2)
    out = next(o for o in records[0]["outputs"] if "values" in o)
    out["shape"], out["values"] = [2**32, 2**32], ""
    p = tmp_path / "overflow.jsonl"
    write_trace(p, header, records)  # a root that fits: only the schema can refuse it
    with pytest.raises(TraceError, match=r"shape \[4294967296, 4294967296\] has 18446744073709551616 elements"):
        read_trace(p)
    capsys.readouterr()
    assert _cli("audit", "diff", clean_mb2, p) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "overflow.jsonl:2" in err, err


def test_a_diff_streams_its_traces_in_memory_bounded_by_records_not_bytes(clean_mb2, tmp_path):
    """Issue 34, item 3: a trace was held whole as Python objects, 5-6 times its size. ``diff_files`` reads
    both traces record by record: what it keeps is 32 bytes per record of each (the root's leaves) and 24
    per output of A before the first difference (``_Outputs``), plus one line of each in flight; here the
    traces hold 40 copies of micro-batch 2's records (every output's values kept), and the diff's peak
    allocation (tracemalloc) stays within that bound and below a tenth of one trace's size."""
    import tracemalloc

    header, records = _records_of(clean_mb2)
    many = [dict(r, seq=i * len(records) + r["seq"]) for i in range(40) for r in records]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_trace(a, header, many)
    many[-1] = copy.deepcopy(many[-1])
    many[-1]["outputs"][0]["sha256"] = "0" * 64  # the last record differs: every record before it is compared
    many[-1]["outputs"][0].pop("values", None)
    write_trace(b, header, many)
    size = a.stat().st_size
    longest = max(len(x) for x in a.read_bytes().split(b"\n"))
    outputs = sum(len(r["outputs"]) for r in many)
    del many, records
    tracemalloc.start()
    try:
        _, _, d = diff_files(a, b)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert d.kind == "outputs" and d.seq == 40 * (len(_records_of(clean_mb2)[1])) - 1
    # one line of each in flight, parsed: its text, its decoded values (3/4 of the text) and the JSON objects
    bound = 2 * 32 * d.seq + 24 * outputs + 2 * 4 * longest + (1 << 20)
    assert peak <= bound and peak < size // 10, (peak, bound, size)
