"""Every parser of a file a stranger can hand us, fuzzed (Hypothesis): the documented refusal or nothing.

The files: the data manifest (``Manifest.load``, ``rundir.open_run_data``), the run
recipe (``recipe.load_recipe``, which ``train --resume`` and the audit use),
trajectory lines (``trajectory.read_trajectory`` with ``Strictness.AUDIT``, as ``audit verify``
reads, and ``Strictness.LIVE``, as ``train --resume`` reads), the commitment, the run target, certificates
(``audit.certificate``), audit plans (``audit.plan``), safetensors headers and offsets
(``fsio.parse_safetensors`` / ``read_safetensors``), checkpoint sidecars and state
(``checkpoint.load_checkpoint``), export bundles (``use.export_verify.verify_export``), the
tokenizer read from the manifest (``use.run.open_tokenizer``), validation lines of
metrics.jsonl (``use.evaluate.recorded_validations``), op traces (``audit.trace_diff.diff_files``,
``read_trace``) and op files (``audit.trace_diff.replay_op_file``, ``conformance --replay-op``);
and ``audit verify`` over the whole damaged run.

Inputs are genuine files of a real honest run (``honest_run``), mutated: truncated,
bytes flipped or inserted, JSON values replaced by hostile ones (huge and negative
integers, ``NaN``/``Infinity``/``1e999``, 5000-digit numbers, deep nesting, paths
with ``..`` or absolute, wrong types), keys deleted or duplicated; safetensors
headers with huge, negative and overlapping offsets and wrong dtypes; plus plain
random bytes. Each must give the module's documented error (a ``ValueError``
subclass whose message is one line naming the file), or be accepted, and nothing
else: any other exception fails the test (Hypothesis shrinks it), as does a reader
still running after ``HANG_SECONDS`` (a watchdog for loops sized by a number in the
file) or writing any file, and the pure parsers must stay within a memory bound
(``tracemalloc``). The suite profile runs about 1,100 examples in all (about 20 s); the
``deep`` profile (``--hypothesis-profile=deep``) runs 25 times as many.

Crashes these searches found are kept as plain regression tests at the end.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import shutil
import signal
import struct
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockstep.audit import certificate as cert_mod
from lockstep.audit import plan as plan_mod
from lockstep.audit.verify import verify_run
from lockstep.conformance.search import SUITE_EXAMPLES
from lockstep.fsio import FileFormatError, json_bytes, parse_json
from lockstep.fsio.safetensors import SafetensorsError, parse_safetensors, read_safetensors
from lockstep.formats import checkpoint as ckpt
from lockstep.formats.manifest import DataError, Manifest
from lockstep.formats.rundir import DataLocationError, RunFileError, open_run_data, read_target
from lockstep.formats.recipe import load_recipe
from lockstep.formats.trajectory import COMMITMENT_KEYS, Strictness, read_commitment, read_trajectory
from lockstep.use.run import UseError

# the deep profile (10,000 examples) multiplies every budget here by 25; the suite's gives 1
SCALE = max(1, settings.default.max_examples // SUITE_EXAMPLES // 10)
FUZZ = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def budget(n: int) -> settings:
    return settings(max_examples=n * SCALE, **FUZZ)


# ---------------------------------------------------------------------------
# Hostile JSON: values, serialization with duplicate keys and raw tokens
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """JSON text put in verbatim (tokens ``json.dumps`` never writes: NaN, 1e999, deep nesting)."""

    text: str


@dataclass(frozen=True)
class Dup:
    """An object written with its pairs as given, so a key can appear twice."""

    pairs: tuple


def dumps(x) -> str:
    if isinstance(x, Raw):
        return x.text
    if isinstance(x, (Dup, dict)):
        pairs = x.pairs if isinstance(x, Dup) else x.items()
        return "{" + ",".join(json.dumps(str(k)) + ":" + dumps(v) for k, v in pairs) + "}"
    if isinstance(x, list):
        return "[" + ",".join(dumps(v) for v in x) + "]"
    return json.dumps(x)  # floats nan/inf come out as NaN/Infinity tokens


# Tokens a strict reader refuses wherever they are (so one of them spoils the whole document) ...
HOSTILE_TOKENS = [
    Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e999"), Raw("-1e999"), Raw("1" * 5000),
    Raw("[" * 100_000 + "]" * 100_000), Raw('{"a":' * 3000 + "1" + "}" * 3000),
]
# ... and valid JSON values in the wrong place, which only the checks after parsing can refuse
HOSTILE = [
    2**63, 2**64, -1, -(2**63), 0, 10**30, 10**18, 1e308, -0.0, 0.5, True, False, None,
    "", "..", "../../../../etc/passwd", "/etc/passwd", "a/../../b", "x\x00y", "C:\\x", "\u202egnp.", "step-00000002",
    "0" * 64, [], {}, [1, 2], [0, 2**62], [-8, 8], {"a": 1}, ["..", "/etc/passwd"],
]
HOSTILE_INTS = [-1, 0, 2**31, 2**32 + 1, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, 10**12, 10**18, 10**30, -(2**63)]
hostile_values = st.one_of(
    st.sampled_from(HOSTILE), st.sampled_from(HOSTILE), st.sampled_from(HOSTILE_TOKENS), st.integers(),
    st.floats(allow_nan=False), st.floats(), st.text(max_size=12), st.lists(st.integers(-3, 2**40), max_size=4),
).map(copy.deepcopy)  # a later edit must never change the shared HOSTILE list


def _paths(x, prefix=()):
    """Every place in a parsed JSON document (as key/index paths), the root first."""
    yield prefix
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x[:8]):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value):
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


def _replace_all(doc, old, new):
    if type(doc) is type(old) and doc == old:
        return new
    if isinstance(doc, dict):
        return {k: _replace_all(v, old, new) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_replace_all(v, old, new) for v in doc]
    return doc


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutated_json(draw, doc) -> bytes:
    """The genuine document with 1 to 3 of: a value replaced (at one place, or everywhere it occurs), a key
    deleted or duplicated, a number nudged, a value wrapped in a list or an object."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        paths = list(_paths(doc))
        numbers = [p for p in paths if type(_get(doc, p)) is int]  # counts, steps, offsets: half the edits
        if numbers and draw(st.booleans()):
            path = draw(st.sampled_from(numbers))
        else:  # a depth first, then a place at it: the few top-level keys are edited as often as deep leaves
            depth = draw(st.sampled_from(sorted({len(p) for p in paths})))
            path = draw(st.sampled_from([p for p in paths if len(p) == depth]))
        here = _get(doc, path)
        if type(here) is int and draw(st.booleans()):  # a number the reader may size or loop by
            new = draw(st.one_of(st.sampled_from(HOSTILE_INTS), st.sampled_from([here - 1, here + 1, -here, 2 * here])))
            doc = _replace_all(doc, here, new) if draw(st.booleans()) else _set(doc, path, new)
            continue
        op = draw(st.sampled_from(["replace", "replace", "everywhere", "delete", "duplicate", "wrap"]))
        if op == "everywhere" and not isinstance(here, (dict, list)):  # every equal value at once: claims stay consistent
            doc = _replace_all(doc, here, draw(hostile_values))
        elif op == "delete" and path and isinstance(_get(doc, path[:-1]), (dict, list)):
            del _get(doc, path[:-1])[path[-1]]
        elif op == "duplicate" and isinstance(here, dict) and here:
            key = draw(st.sampled_from(sorted(here)))
            doc = _set(doc, path, Dup(tuple(here.items()) + ((key, draw(hostile_values)),)))
            break  # a Dup is a leaf: no more edits inside it
        elif op == "wrap":
            doc = _set(doc, path, [here] if draw(st.booleans()) else {"x": here})
        else:
            doc = _set(doc, path, draw(hostile_values))
    return dumps(doc).encode("utf-8", "surrogatepass")


@st.composite
def mutated_bytes(draw, raw: bytes) -> bytes:
    """The genuine bytes truncated, with bytes flipped, inserted or deleted, or spliced with themselves."""
    raw = bytearray(raw)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "splice"]))
        n = len(raw)
        at = draw(st.integers(0, n))
        if op == "truncate":
            del raw[at:]
        elif op == "flip" and n:
            raw[min(at, n - 1)] ^= draw(st.integers(1, 255))
        elif op == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del raw[at : at + draw(st.integers(1, 64))]
        elif n:
            start = draw(st.integers(0, n - 1))
            raw[at:at] = raw[start : start + draw(st.integers(1, 256))]
    return bytes(raw)


def mutations(raw: bytes, doc=None) -> st.SearchStrategy[bytes]:
    """Mutated versions of a genuine file (JSON-level ones when ``doc`` is its parsed content), or random bytes."""
    parts = [mutated_bytes(raw), st.binary(max_size=256)]
    if doc is not None:
        parts = [mutated_json(doc), mutated_json(doc)] + parts
    return st.one_of(parts)


# ---------------------------------------------------------------------------
# The checks every test makes
# ---------------------------------------------------------------------------


# A watchdog, not a timing assertion: a reader takes milliseconds on these small files, so an example still
# running after HANG_SECONDS is in a loop sized by a number in the file (a hang), whatever the machine's speed.
HANG_SECONDS = 10


class Hang(Exception):
    pass


@contextlib.contextmanager
def watchdog(seconds: float = HANG_SECONDS):
    def fire(signum, frame):
        raise Hang(f"still running after {seconds} s: a hang on this input")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def refused_cleanly(call, errors, names: str):
    """``call()``'s result, or None when it raised one of ``errors`` with a one-line message naming ``names``.

    Any other exception (or a hang, ``watchdog``) propagates: the test fails and Hypothesis shrinks the input.
    """
    try:
        with watchdog():
            return call()
    except errors as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "\r" not in msg, f"{type(exc).__name__} message is not one line: {msg!r}"
        assert names in msg, f"{type(exc).__name__} does not name {names}: {msg!r}"
        return None


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and mtime: a reader that writes anything changes it."""
    out = {}
    for p in sorted(root.rglob("*")):
        st_ = p.lstat()
        out[str(p.relative_to(root))] = (st_.st_size, st_.st_mtime_ns)
    return out


class Planted:
    """Put mutated bytes into a file of the workspace for one example; restore it (and check nothing else
    under the workspace changed) afterwards."""

    def __init__(self, ws: Path):
        self.ws = ws

    def __call__(self, path: Path, data: bytes, marker: bool = False):
        self.path, self.data, self.marker = path, data, marker
        return self

    def __enter__(self):
        self.original = self.path.read_bytes()
        self.marker_path = self.path.parent / ckpt.COMPLETE_FILE
        self.original_marker = self.marker_path.read_bytes() if self.marker else None
        self.before = tree(self.ws)
        self.path.write_bytes(self.data)
        if self.marker:  # the COMPLETE marker is only a checksum: redo it so the parser is reached
            self.marker_path.write_bytes((hashlib.sha256(self.data).hexdigest() + "\n").encode())
        self.planted = tree(self.ws)
        return self.path

    def __exit__(self, *exc):
        after = tree(self.ws)
        self.path.write_bytes(self.original)
        if self.marker:
            self.marker_path.write_bytes(self.original_marker)
        if exc[0] is None:
            assert after == self.planted, f"a reader wrote under {self.ws}: {set(after) ^ set(self.planted)}"
        return False


def within_memory(call, limit: int):
    """``call()``, asserting its peak Python/NumPy allocation (tracemalloc) stays under ``limit`` bytes."""
    tracemalloc.start()
    try:
        return call()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak <= limit, f"peak allocation {peak} bytes for an input of this size (limit {limit})"


# ---------------------------------------------------------------------------
# The genuine files: one honest run, its certificate, plan and export
# ---------------------------------------------------------------------------


@dataclass
class Workspace:
    root: Path  # everything a reader may see; nothing under it may change
    run: Path
    export: Path
    cert: Path
    plan: Path
    plant: Planted

    @property
    def checkpoint(self) -> Path:
        return self.run / ckpt.CHECKPOINTS_DIR / ckpt.step_dirname(2)


@pytest.fixture(scope="module")
def ws(honest_run, tmp_path_factory) -> Workspace:
    from lockstep.cli import main

    root = tmp_path_factory.mktemp("untrusted")
    run = root / "run"
    shutil.copytree(honest_run, run, symlinks=True)
    cert, plan, export = root / "cert.json", root / "plan.json", root / "export"
    # step 3, replayed from checkpoint 2: a certificate whose numbers (3, from 2) occur nowhere else in it
    assert main(["audit", "replay", str(run), "--step", "3", "--backend", "spec", "--quiet", "--out", str(cert)]) == 0
    doc = json.loads(cert.read_bytes())  # the same inputs on every machine: no timing or machine facts
    doc["milliseconds"], doc["machine"] = 1000, {"cpu": "test"}
    cert.write_bytes(json_bytes(doc))
    keys = [a for i in range(3) for a in ("--pub", hashlib.sha256(b"key %d" % i).hexdigest())]
    assert main(["audit", "plan", str(run), *keys, "--beacon", hashlib.sha256(b"beacon").hexdigest(),
                 "--redundancy", "2", "--out", str(plan)]) == 0
    assert main(["export", str(run), "--out", str(export)]) == 0
    return Workspace(root, run, export, cert, plan, Planted(root))


def genuine(path: Path) -> tuple[bytes, object]:
    raw = path.read_bytes()
    return raw, json.loads(raw)


def damaged(ws: Workspace, data, path: Path, marker: bool = False) -> Planted:
    """The file at ``path`` replaced, for one example, by a drawn mutation of its genuine bytes
    (a ``.json`` file also mutated as JSON); ``.data`` is what was planted."""
    raw = path.read_bytes()
    return ws.plant(path, data.draw(mutations(raw, json.loads(raw) if path.suffix == ".json" else None)), marker=marker)


def assert_messages(problems) -> None:
    """A checker's answer: a list of messages (strings), never anything else."""
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)


# Strategies are built from the genuine files, which exist only once the fixture ran: ``st.data()`` draws them.


# ---------------------------------------------------------------------------
# Pure parsers: strict JSON and safetensors
# ---------------------------------------------------------------------------


@budget(60)
@given(data=st.data())
def test_parse_json_refuses_hostile_json_in_one_line(ws, data):
    raw, doc = genuine(ws.run / "recipe.json")
    blob = data.draw(mutations(raw, doc))
    refused_cleanly(lambda: within_memory(lambda: parse_json(blob, "recipe", "R.json"), 64 * len(blob) + (8 << 20)),
                    FileFormatError, "R.json")


def _header_doc(raw: bytes) -> tuple[int, dict]:
    (n,) = struct.unpack("<Q", raw[:8])
    return n, json.loads(raw[8 : 8 + n])


OFFSET_EDITS = ["huge", "negative", "overlap", "swap", "past_end", "dtype", "shape", "prefix"]


@st.composite
def hostile_safetensors(draw, raw: bytes) -> bytes:
    """A genuine safetensors file with its header edited where it is most dangerous."""
    n, header = _header_doc(raw)
    body = raw[8 + n :]
    names = sorted(k for k in header if k != "__metadata__")
    name = draw(st.sampled_from(names))
    entry = header[name]
    b, e = entry["data_offsets"]
    edit = draw(st.sampled_from(OFFSET_EDITS))
    if edit == "huge":
        entry["data_offsets"] = [b, draw(st.sampled_from([2**63, 2**64 + 8, 10**30, e + 2**40]))]
    elif edit == "negative":
        entry["data_offsets"] = [draw(st.sampled_from([-1, -8, -(2**63)])), e]
    elif edit == "overlap":
        other = header[draw(st.sampled_from(names))]
        entry["data_offsets"] = list(other["data_offsets"])
        entry["shape"], entry["dtype"] = list(other["shape"]), other["dtype"]
    elif edit == "swap":
        entry["data_offsets"] = [e, b]
    elif edit == "past_end":
        entry["data_offsets"] = [b + len(body), e + len(body)]
    elif edit == "dtype":
        entry["dtype"] = draw(st.sampled_from(["F16", "BF16", "BOOL", "I64", "U8", "f32", "", "O", "<f4", 5, None]))
    elif edit == "shape":
        entry["shape"] = draw(st.sampled_from([[-1], [2**62, 2**62], [1] * 65, [0, 2**63], "3", [1.5], [], [True]]))
    text = json.dumps(header).encode()
    if edit == "prefix":
        length = draw(st.sampled_from([0, 1, len(text) - 1, len(text) + 1, 2**63, 2**64 - 1, len(raw)]))
        return struct.pack("<Q", length) + text + body
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + body


@budget(120)
@given(data=st.data())
def test_parse_safetensors_refuses_hostile_headers_and_offsets(ws, data):
    raw = (ws.checkpoint / ckpt.STATE_FILE).read_bytes()
    n, header = _header_doc(raw)
    blob = data.draw(st.one_of(hostile_safetensors(raw), hostile_safetensors(raw),
                               mutations(raw[: 8 + n] + raw[8 + n : 8 + n + 64]), st.binary(max_size=64)))
    got = refused_cleanly(lambda: within_memory(lambda: parse_safetensors(blob, "S.safetensors"),
                                                64 * len(blob) + (8 << 20)), SafetensorsError, "S.safetensors")
    if got is not None:  # accepted: then the tensors tile the data exactly
        tensors, _ = got
        assert sum(t.nbytes for t in tensors.values()) == len(blob) - 8 - struct.unpack("<Q", blob[:8])[0]


@budget(40)
@given(data=st.data())
def test_read_safetensors_refuses_a_damaged_file(ws, data):
    path = ws.export / "model.safetensors"
    raw = path.read_bytes()
    blob = data.draw(st.one_of(hostile_safetensors(raw), mutated_bytes(raw)))
    with ws.plant(path, blob):
        refused_cleanly(lambda: read_safetensors(path), SafetensorsError, str(path))


# ---------------------------------------------------------------------------
# The run's own files: recipe, trajectory, commitment, target, manifest
# ---------------------------------------------------------------------------


@budget(40)
@given(data=st.data())
def test_recipe_reader_refuses_a_damaged_recipe(ws, data):
    path = ws.run / "recipe.json"
    with damaged(ws, data, path):
        refused_cleanly(lambda: load_recipe(ws.run), RunFileError, str(path))


@st.composite
def damaged_trajectory(draw, raw: bytes) -> bytes:
    lines = raw.split(b"\n")[:-1]
    i = draw(st.integers(0, len(lines) - 1))
    how = draw(st.sampled_from(["json", "json", "bytes", "blank", "torn", "repeat"]))
    if how == "json":
        lines[i] = draw(mutated_json(json.loads(lines[i]))).replace(b"\n", b" ")
    elif how == "bytes":
        lines[i] = draw(mutated_bytes(lines[i]))
    elif how == "blank":
        lines.insert(i, draw(st.sampled_from([b"", b" ", b"\r", b"{}", b"null"])))
    elif how == "repeat":
        lines.insert(i, lines[draw(st.integers(0, len(lines) - 1))])
    out = b"\n".join(lines) + b"\n"
    if how == "torn":
        out = out[: draw(st.integers(0, len(out) - 1))]
    return out


@budget(60)
@given(data=st.data())
def test_trajectory_readers_refuse_damaged_lines(ws, data):
    path = ws.run / "trajectory.jsonl"
    raw = path.read_bytes()
    with ws.plant(path, data.draw(st.one_of(damaged_trajectory(raw), mutated_bytes(raw)))):
        strict = refused_cleanly(lambda: read_trajectory(ws.run, Strictness.AUDIT), RunFileError, str(path))
        resume = refused_cleanly(lambda: read_trajectory(ws.run, Strictness.LIVE), RunFileError, str(path))
    if strict is not None:  # what the strict reader takes, the tolerant one takes unchanged
        assert resume == strict


@budget(30)
@given(data=st.data())
def test_commitment_reader_refuses_a_damaged_commitment(ws, data):
    path = ws.run / "commitment.json"
    with damaged(ws, data, path):
        got = refused_cleanly(lambda: read_commitment(ws.run), RunFileError, str(path))
        refused_cleanly(lambda: plan_mod._commitment_of(path), plan_mod.PlanError, str(path))
    if got is not None:  # accepted: exactly the keys the trainer writes, each of its type (issue 34, item 8)
        assert set(got) == COMMITMENT_KEYS, got
        assert type(got["version"]) is int and type(got["last_step"]) is int, got
        assert all(type(got[k]) is str for k in COMMITMENT_KEYS - {"version", "last_step"}), got


@budget(20)
@given(data=st.data())
def test_target_reader_refuses_a_damaged_target(ws, data):
    path = ws.run / "target.json"
    with damaged(ws, data, path):
        refused_cleanly(lambda: read_target(ws.run), ValueError, "target.json")


def test_train_resume_over_a_damaged_target_says_one_line_and_steps_sets_it_again(honest_run, tmp_path, capsys):
    """A resume reads ``target.json`` first: damaged, it is one line on the command line (the file, and
    ``--steps N`` to set the target again), no traceback, and nothing written; with ``--steps N`` the
    run resumes and the new target replaces the damaged one."""
    from lockstep.cli import main

    run = tmp_path / "run"
    shutil.copytree(honest_run, run, symlinks=True)
    (run / "target.json").write_bytes(b'{"format": "not a target"}')
    before = sorted((p.relative_to(run), p.read_bytes()) for p in run.rglob("*") if p.is_file())
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--backend", "spec", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "target.json" in err and "give --steps N to set the run's target again" in err, err
    assert sorted((p.relative_to(run), p.read_bytes()) for p in run.rglob("*") if p.is_file()) == before
    last = len((run / "trajectory.jsonl").read_text().splitlines())
    assert main(["train", "--resume", str(run), "--steps", str(last + 1), "--backend", "spec", "--quiet"]) == 0
    assert read_target(run) == last + 1, "the target given replaces the damaged one"


def _damaged_manifest(ws, data) -> tuple[Path, bytes, dict]:
    """A mutated manifest, and the run's recipe naming its digest (so the parser is reached)."""
    path = ws.run / "data" / "manifest.json"
    raw, doc = genuine(path)
    blob = data.draw(mutations(raw, doc))
    recipe = json.loads((ws.run / "recipe.json").read_bytes())
    recipe["data"]["manifest_sha256"] = hashlib.sha256(blob).hexdigest()
    return path, blob, recipe


@budget(40)
@given(data=st.data())
def test_manifest_readers_refuse_a_damaged_manifest(ws, data):
    path, blob, recipe = _damaged_manifest(ws, data)
    with ws.plant(path, blob):
        refused_cleanly(lambda: Manifest.load(path), DataError, str(path))
        refused_cleanly(lambda: open_run_data(ws.run, recipe), DataLocationError, str(path))


@budget(100)
@given(data=st.data())
def test_tokenizer_reader_refuses_a_damaged_manifest(ws, data):
    """``lockstep sample``, ``eval`` and ``export`` read the tokenizer from the manifest alone (no shard)."""
    from lockstep.use.run import open_tokenizer

    path, blob, recipe = _damaged_manifest(ws, data)
    with ws.plant(path, blob):
        refused_cleanly(lambda: open_tokenizer(ws.run, recipe), UseError, str(path))


# A validation line as `lockstep eval RUN --record` appends it (from the honest run; the values do not matter
# here, only the shape: evaluating in the fixture would cost 40 s)
VALIDATION_LINE = {"step": 4, "tokens": 768, "validation": {
    "backend": "spec", "bits_per_byte": 7.810538470463456, "bytes": 48153, "eval_batch": 2,
    "format": "lockstep.validation", "loss_sum": 260693.25, "loss_sum_bits": "0x487E9550",
    "nats_per_token": 5.391571186300463, "seconds": 41.696, "spec_version": "2", "targets": 48352, "version": 1,
    "sources": {"math": {"bits_per_byte": 7.687018670464923, "bytes": 15934, "loss_sum": 84900.1015625,
                         "loss_sum_bits": "0x47A5D20D", "nats_per_token": 5.30625634765625, "targets": 16000,
                         "windows": 500}}}}


@budget(100)
@given(data=st.data())
def test_recorded_validations_skip_damaged_metrics_lines(ws, data):
    """metrics.jsonl is not evidence: a line of another shape is skipped; what is kept has the types that
    ``lockstep export``'s model card, ``eval`` and the loss plot format."""
    from lockstep.use.evaluate import recorded_validations

    path = ws.run / "metrics.jsonl"
    raw = path.read_bytes()
    line = json.dumps(VALIDATION_LINE).encode()
    blob = raw + data.draw(st.one_of(mutated_json(VALIDATION_LINE), mutated_bytes(line))).replace(b"\n", b" ") + b"\n"
    with ws.plant(path, blob), watchdog():
        got = recorded_validations(ws.run)
    for v in got.values():
        card = (f"{v['nats_per_token']:.4f} {v['bits_per_byte']:.4f} {v['loss_sum_bits']} {v['targets']:,}"
                f"{v.get('tokens')}")
        assert isinstance(card, str)


# ---------------------------------------------------------------------------
# Checkpoints: sidecar and state
# ---------------------------------------------------------------------------


def _load_and_check_stream(folder: Path):
    c = ckpt.load_checkpoint(folder)
    recipe = load_recipe(folder.parents[1])
    from lockstep.formats.stream import GlobalStream
    from lockstep.formats.recipe import recipe_configs

    cfg, tcfg = recipe_configs(recipe)
    stream = GlobalStream(Manifest.load(folder.parents[1] / "data"), recipe["seed"], cfg.seq_len)
    why = ckpt.stream_state_problem(c.sidecar, stream, tcfg, c.step)
    assert why is None or isinstance(why, str)
    return c


@budget(40)
@given(data=st.data())
def test_checkpoint_loader_refuses_a_damaged_sidecar(ws, data):
    path = ws.checkpoint / ckpt.SIDECAR_FILE
    with damaged(ws, data, path, marker=True):
        refused_cleanly(lambda: _load_and_check_stream(ws.checkpoint), ckpt.CheckpointError, str(ws.checkpoint))


@budget(30)
@given(data=st.data())
def test_checkpoint_loader_refuses_a_damaged_state_file(ws, data):
    path = ws.checkpoint / ckpt.STATE_FILE
    raw = path.read_bytes()
    with ws.plant(path, data.draw(st.one_of(hostile_safetensors(raw), mutated_bytes(raw)))):
        refused_cleanly(lambda: ckpt.load_checkpoint(ws.checkpoint), ckpt.CheckpointError, str(ws.checkpoint))


# ---------------------------------------------------------------------------
# audit verify over the whole damaged run: findings, never an exception
# ---------------------------------------------------------------------------

RUN_FILES = ["recipe.json", "trajectory.jsonl", "commitment.json", "target.json", "metrics.jsonl",
             "data/manifest.json", "checkpoints/step-00000002/sidecar.json", "checkpoints/step-00000004/sidecar.json",
             "checkpoints/step-00000002/state.safetensors", "checkpoints/step-00000004/COMPLETE"]


@budget(40)
@given(data=st.data())
def test_audit_verify_turns_any_damage_into_findings(ws, data):
    rel = data.draw(st.sampled_from(RUN_FILES))
    path = ws.run / rel
    planted = damaged(ws, data, path, marker=rel.endswith("sidecar.json"))
    with planted:
        with watchdog():
            rep = verify_run(ws.run, batches=False)
        text = rep.format()
    # damage is seen, unless nothing changed; metrics.jsonl and target.json are not evidence
    # (not in the chain: verify reads neither), so damage there is harmless
    assert rep.findings or rel in ("metrics.jsonl", "target.json") or planted.data == path.read_bytes()
    assert all("\n" not in line for line in text.splitlines())


# ---------------------------------------------------------------------------
# Certificates, plans, exports
# ---------------------------------------------------------------------------


def _certificate_checks(path: Path, run: Path, plan: Path):
    from lockstep.audit.merge import merge_certificates

    # audit merge first: it takes any file, loads what it can and rejects the rest (never raises on one)
    for report in (merge_certificates([path]), merge_certificates([path], plan_mod.load_plan(plan))):
        assert isinstance(report.format(), str)
    cert = cert_mod.load_certificate(path)
    for problems in (cert_mod.consistency_problems(cert), cert_mod.run_problems(cert, run)):
        assert_messages(problems)
    why = cert_mod.signature_problem(cert)
    assert why is None or isinstance(why, str)
    return cert


@budget(300)
@given(data=st.data())
def test_certificate_reader_refuses_a_damaged_certificate(ws, data):
    with damaged(ws, data, ws.cert):
        refused_cleanly(lambda: _certificate_checks(ws.cert, ws.run, ws.plan), cert_mod.CertificateError,
                        str(ws.cert))


def _plan_checks(path: Path, cert: Path):
    from lockstep.audit.merge import merge_certificates

    plan = plan_mod.load_plan(path)
    assert isinstance(merge_certificates([cert], plan).format(), str)
    assert_messages(plan_mod.check_plan(plan))
    assert isinstance(plan_mod.format_plan(plan), str)
    return plan


@budget(50)
@given(data=st.data())
def test_plan_reader_refuses_a_damaged_plan(ws, data):
    with damaged(ws, data, ws.plan):
        refused_cleanly(lambda: _plan_checks(ws.plan, ws.cert), plan_mod.PlanError, str(ws.plan))


EXPORT_FILES = ["proof.json", "config.json", "recipe.json", "model.safetensors"]


@budget(40)
@given(data=st.data())
def test_export_reader_refuses_a_damaged_export(ws, data):
    from lockstep.use.export_verify import verify_export

    rel = data.draw(st.sampled_from(EXPORT_FILES))
    path = ws.export / rel
    against = data.draw(st.sampled_from([None, ws.run]))
    with damaged(ws, data, path):
        rep = refused_cleanly(lambda: verify_export(ws.export, against), UseError, str(ws.export))
        if rep is not None:
            assert isinstance(rep.format(), str)


# ---------------------------------------------------------------------------
# Op traces and op files (``audit diff``, ``conformance --replay-op``)
# ---------------------------------------------------------------------------


@dataclass
class Dispute:
    trace: Path     # 12 records of step 3's micro-batch 2, some with kept values
    other: Path     # the same records: the trace a damaged one is diffed against
    op_file: Path   # a disputed rmsnorm_backward call, written by the referee


@pytest.fixture(scope="module")
def dispute(ws) -> Dispute:
    """A genuine trace and op file under the workspace (nothing under it may change while they are read)."""
    import numpy as np

    from lockstep.audit.trace import trace_step, write_trace
    from lockstep.audit.trace_diff import diff_files, referee
    from lockstep.backends import Backend, get_backend

    spec = get_backend("spec")

    def flipped(*args, **kwargs):
        dx, dgain = spec.ops["rmsnorm_backward"](*args, **kwargs)
        dx = np.array(dx, dtype=np.float32)
        dx.reshape(-1).view(np.uint32)[3] ^= 1
        return dx, dgain

    flip = Backend("flipped", {**spec.ops, "rmsnorm_backward": flipped}, spec.asarray, spec.to_numpy,
                   "the spec with one bit flipped", capabilities=spec.capabilities)
    folder = ws.root / "dispute"
    folder.mkdir()
    clean = trace_step(ws.run, 3, "spec", micro_batch=2)
    write_trace(folder / "trace.jsonl", clean.header, clean.records[:12])
    write_trace(folder / "other.jsonl", clean.header, clean.records[:12])
    write_trace(folder / "clean.jsonl", clean.header, clean.records)
    bad = trace_step(ws.run, 3, flip, micro_batch=2)
    write_trace(folder / "bad.jsonl", bad.header, bad.records)
    a, b, d = diff_files(folder / "clean.jsonl", folder / "bad.jsonl")
    referee(a, b, d, ws.run, "spec", op_file=folder / "op.safetensors")
    for name in ("clean.jsonl", "bad.jsonl"):
        (folder / name).unlink()
    return Dispute(folder / "trace.jsonl", folder / "other.jsonl", folder / "op.safetensors")


@st.composite
def damaged_trace(draw, raw: bytes) -> bytes:
    """A genuine trace with one line mutated as JSON (a record, the header or the root line), or as bytes."""
    lines = raw.split(b"\n")
    if draw(st.booleans()):
        return draw(mutations(raw))
    i = draw(st.integers(0, len(lines) - 2))
    lines[i] = draw(mutated_json(json.loads(lines[i])))
    return b"\n".join(lines)


@budget(60)
@given(data=st.data())
def test_trace_readers_refuse_a_damaged_trace(ws, dispute, data):
    """``audit diff`` on a damaged trace: a difference or one line naming the file, within 16 times the
    file's size plus 4 MiB of allocation (the diff holds a record of each trace, never the traces)."""
    from lockstep.audit.trace import TraceError
    from lockstep.audit.trace_diff import Difference, diff_files

    path = dispute.trace
    raw = path.read_bytes()
    with ws.plant(path, data.draw(st.one_of(damaged_trace(raw), damaged_trace(raw), mutations(raw)))):
        limit = 16 * path.stat().st_size + (4 << 20)
        for a, b in ((path, dispute.other), (dispute.other, path)):
            got = refused_cleanly(lambda: within_memory(lambda: diff_files(a, b), limit), TraceError, str(path))
            if got is not None:
                assert isinstance(got[2], Difference) and isinstance(got[2].text, str)


@st.composite
def reshaped_op_file(draw, raw: bytes) -> bytes:
    """The genuine op file with one input replaced by an array of another shape or dtype, its digest
    recomputed: only the contract's shape rules can refuse it."""
    import numpy as np

    from lockstep.audit.trace import value_digest

    import io

    from lockstep.fsio.safetensors import write_safetensors_to

    tensors, meta = parse_safetensors(raw, "op.safetensors")
    tensors, meta = {k: np.array(v) for k, v in tensors.items()}, dict(meta)
    args = json.loads(meta["args"])
    names = [x["name"] for x in args]
    pick = draw(st.sampled_from([x for x in args if "tensor" in x["value"]]))
    dims = draw(st.one_of(st.lists(st.integers(0, 6), max_size=4),
                          st.sampled_from([[4096, 1], [1, 4096], [1 << 20], [2, 1, 32], [1, 2, 2, 1]])))
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float64, np.int64, np.uint32, np.int8]))
    tensors[pick["value"]["tensor"]] = np.ones(dims, dtype=dtype)
    flat = [tensors[x["value"]["tensor"]] if "tensor" in x["value"] else None for x in args]
    meta["inputs_sha256"] = json.dumps([value_digest(v)[0] for v in flat])
    assert names
    out = io.BytesIO()
    write_safetensors_to(out, tensors, meta)
    return out.getvalue()


@st.composite
def hostile_op_meta(draw, raw: bytes) -> bytes:
    """The genuine op file with one metadata string mutated (as JSON where it is JSON), deleted or added."""
    n, header = _header_doc(raw)
    meta = header["__metadata__"]
    key = draw(st.sampled_from(sorted(meta) + ["extra"]))
    edit = draw(st.sampled_from(["json", "json", "value", "delete"]))
    if edit == "delete":
        meta.pop(key, None)
    elif edit == "json" and key in meta and meta[key][:1] in ("[", "{"):
        meta[key] = draw(mutated_json(json.loads(meta[key]))).decode("utf-8", "surrogatepass")
    else:
        v = draw(hostile_values)
        meta[key] = v if isinstance(v, str) else dumps(v)
    text = json.dumps(header).encode("utf-8", "surrogatepass")
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + raw[8 + n:]


@budget(80)
@given(data=st.data())
def test_op_file_reader_refuses_a_damaged_op_file(ws, dispute, data):
    """``conformance --replay-op`` on a damaged op file: a re-check's text or one line naming the file, within
    64 MiB plus 64 times the file's size of allocation (a call computes at most 64 times the elements the
    file holds, plus 2**20)."""
    from lockstep.audit.trace import TraceError
    from lockstep.audit.trace_diff import replay_op_file

    path = dispute.op_file
    raw = path.read_bytes()
    blob = data.draw(st.one_of(reshaped_op_file(raw), reshaped_op_file(raw), hostile_op_meta(raw),
                               hostile_op_meta(raw), hostile_safetensors(raw), mutated_bytes(raw)))
    with ws.plant(path, blob):
        got = refused_cleanly(lambda: within_memory(lambda: replay_op_file(path), (64 << 20) + 64 * len(blob)),
                              (TraceError, SafetensorsError), str(path))
        if got is not None:
            text, ok = got
            assert isinstance(text, str) and isinstance(ok, bool)
            assert "recomputed here" in text and "only the file's claims" in text


# ---------------------------------------------------------------------------
# Regressions: crashes the searches above found (plain tests, one input each)
# ---------------------------------------------------------------------------


def test_manifest_with_a_5000_digit_number_is_a_data_error(ws):
    """Found by test_manifest_readers_refuse_a_damaged_manifest: Python refuses to parse an integer of more
    than 4300 digits with a bare ValueError, which leaked out of ``Manifest.load`` instead of a DataError."""
    path = ws.run / "data" / "manifest.json"
    with ws.plant(path, b"1" * 5000), pytest.raises(DataError, match="malformed data manifest .*manifest.json"):
        Manifest.load(path)


def test_certificate_claiming_step_10_to_the_12_is_checked_without_a_loop(ws, tmp_path):
    """Found by test_certificate_reader_refuses_a_damaged_certificate (with 3 replaced by 10**12 everywhere):
    ``replay_shape_problems`` looped over every step number from the start to the claimed step, so a
    certificate claiming step 10**12 hung ``audit check`` (and ``audit merge``) for ever."""
    doc = _replace_all(json.loads(ws.cert.read_bytes()), 3, 10**12)
    path = tmp_path / "cert.json"
    path.write_bytes(json_bytes(doc))
    cert = cert_mod.load_certificate(path)
    with watchdog():
        problems = cert_mod.consistency_problems(cert)
    assert any("without step 3 before it" in p for p in problems)


def test_export_proof_with_an_integer_digest_is_a_failed_check(ws):
    """Found by test_export_reader_refuses_a_damaged_export: a proof whose batch_digest is the integer 2**63
    reached ``bytes(2**63)`` in the hashing (OverflowError; 10**9 would have allocated a gigabyte)."""
    from lockstep.use.export_verify import verify_export

    path = ws.export / "proof.json"
    doc = json.loads(path.read_bytes())
    doc["batch_digest"] = 2**63
    with ws.plant(path, json_bytes(doc)):
        rep = verify_export(ws.export)
    assert not rep.ok and any(name.startswith("chain hash H_") and not ok for name, ok, _ in rep.checks)


@pytest.mark.parametrize("value", [10**12, 2**63, 3.0, None, ["ab"]])
def test_hashing_refuses_a_digest_that_is_not_hex_or_bytes(value):
    """The cause of the crash above: ``_b32`` called ``bytes(value)`` on whatever it was given."""
    from lockstep.spec import hashing

    with watchdog(), pytest.raises(TypeError, match="64 hex digits or 32 bytes"):
        hashing.genesis_hash(value, "0" * 64, "2")


@pytest.mark.parametrize("bits", ["0x-1234567", "0x 1234567", "0x+1234567", "0x1_234567"])
def test_float32_bits_take_eight_hex_digits_only(bits):
    """Found reading the code behind the export crash: ``int(x[2:], 16)`` took "-1234567", and the negative
    number then failed in ``struct.pack`` with ``struct.error``, which no reader catches."""
    from lockstep.spec import hashing

    with pytest.raises(ValueError, match="0x3F800000"):
        hashing.float32_bits(bits)


def test_certificate_with_a_list_for_a_hash_is_refused_not_a_merge_crash(ws, tmp_path):
    """Found by test_certificate_reader_refuses_a_damaged_certificate once it ran ``audit merge`` too: a
    certificate whose replayed and published state_root were both the list [1, 2] (so it claimed a
    consistent match) crashed the merge with ``TypeError: unhashable type: 'list'``."""
    from lockstep.audit.merge import merge_certificates

    doc = json.loads(ws.cert.read_bytes())
    root = doc["steps"][0]["replayed"]["state_root"]
    path = tmp_path / "cert.json"
    path.write_bytes(json_bytes(_replace_all(doc, root, [1, 2])))
    with pytest.raises(cert_mod.CertificateError, match="cert.json: 'steps' must be"):
        cert_mod.load_certificate(path)
    report = merge_certificates([path])
    assert report.rejected and not report.accepted and isinstance(report.format(), str)


def test_tokenizer_of_a_manifest_with_a_list_for_its_tokenizer_is_a_use_error(ws):
    """Found by test_tokenizer_reader_refuses_a_damaged_manifest: ``lockstep sample/eval/export`` read the
    tokenizer from the manifest with a check of their own, and a tokenizer wrapped in a list crashed
    ``tokenizer_from_identity`` with AttributeError. The manifest is now checked as Manifest.load checks it."""
    from lockstep.use.run import open_tokenizer

    path = ws.run / "data" / "manifest.json"
    doc = json.loads(path.read_bytes())
    doc["tokenizer"] = [doc["tokenizer"]]
    blob = json_bytes(doc)
    recipe = json.loads((ws.run / "recipe.json").read_bytes())
    recipe["data"]["manifest_sha256"] = hashlib.sha256(blob).hexdigest()
    with ws.plant(path, blob), pytest.raises(UseError, match="unknown tokenizer"):
        open_tokenizer(ws.run, recipe)


def test_tokenizer_file_outside_the_data_folder_is_never_read(ws, tmp_path):
    """Found reading the code behind the crash above: the same reader took a Hugging Face tokenizer file
    "../../x" from the manifest, opened and hashed a file outside the run, and printed its SHA-256."""
    from lockstep.use.run import open_tokenizer

    outside = ws.root / "outside.json"
    outside.write_text("{}")
    try:
        path = ws.run / "data" / "manifest.json"
        doc = json.loads(path.read_bytes())
        doc["tokenizer"] = {"kind": "hf-tokenizers", "file": "../../outside.json", "sha256": "0" * 64,
                            "vocab_size": 300, "eod_id": 0, "eod_token": None}
        blob = json_bytes(doc)
        recipe = json.loads((ws.run / "recipe.json").read_bytes())
        recipe["data"]["manifest_sha256"] = hashlib.sha256(blob).hexdigest()
        with ws.plant(path, blob), pytest.raises(UseError, match="outside|'\\.\\.'") as info:
            open_tokenizer(ws.run, recipe)
        assert hashlib.sha256(b"{}").hexdigest() not in str(info.value)
    finally:
        outside.unlink()


def test_plan_with_a_list_for_an_auditor_name_is_refused_not_a_merge_crash(ws, tmp_path):
    """Found by the deep run of test_plan_reader_refuses_a_damaged_plan (the 902nd example): a plan whose
    auditor's name was [] loaded, and ``audit merge --plan`` crashed on it (``TypeError: unhashable``)."""
    doc = json.loads(ws.plan.read_bytes())
    doc["auditors"][2]["name"] = []
    path = tmp_path / "plan.json"
    path.write_bytes(json_bytes(doc))
    with pytest.raises(plan_mod.PlanError, match="plan.json: 'auditors' must be"):
        plan_mod.load_plan(path)


@pytest.mark.parametrize("line", [b"[" * 100_000 + b"]" * 100_000, b"1" * 5000,
                                  json.dumps({**VALIDATION_LINE, "validation": {
                                      **{k: v for k, v in VALIDATION_LINE["validation"].items()
                                         if k != "bits_per_byte"}, "cits_per_byte": 7.8}}).encode(),
                                  json.dumps({**VALIDATION_LINE, "validation": {
                                      **VALIDATION_LINE["validation"], "nats_per_token": "5.39"}}).encode()])
def test_metrics_lines_of_another_shape_are_skipped(ws, line):
    """Found by test_recorded_validations_skip_damaged_metrics_lines: a deeply nested line (RecursionError)
    or a 5000-digit number (ValueError) in metrics.jsonl crashed ``recorded_validations``, and a validation
    without bits_per_byte, or with a string for nats_per_token, crashed ``lockstep export``'s model card."""
    from lockstep.use.evaluate import recorded_validations

    path = ws.run / "metrics.jsonl"
    good = json.dumps(VALIDATION_LINE).encode()
    with ws.plant(path, path.read_bytes() + good + b"\n" + line + b"\n"):
        got = recorded_validations(ws.run)
    assert got[4]["nats_per_token"] == VALIDATION_LINE["validation"]["nats_per_token"]  # the good line, kept
