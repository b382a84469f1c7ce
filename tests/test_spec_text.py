"""The spec's text is enough: hashing binds shapes, and a second, plain-Python implementation
written from the docstrings alone (no lockstep code) reproduces the golden vectors file:
Philox, the keyed streams' derivation, the hashing layouts. The constants quoted in the
docstrings, the vectors file and the code agree."""

from __future__ import annotations

import hashlib
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from lockstep.conformance import golden, vectors
from lockstep.spec import hashing, philox, rng, transcendental


# ---------------------------------------------------------------- shapes are bound

SAME_ELEMENT_SHAPES = [(), (1,), (1, 1), (1, 1, 1)]
EMPTY_SHAPES = [(0,), (0, 3), (3, 0), (0, 0), (0, 1, 3)]


@pytest.mark.parametrize("shapes", [SAME_ELEMENT_SHAPES, EMPTY_SHAPES])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int8])
def test_tensors_differing_only_in_shape_never_share_a_digest(shapes, dtype):
    arrays = [np.full(s, 3, dtype=dtype) for s in shapes]
    for fn in (lambda x: hashing.canonical_bytes("t", x), lambda x: hashing.tensor_digest("t", x),
               hashing.array_digest, lambda x: hashing.state_root({"t": x, "u": np.zeros(2, np.float32)})):
        got = [fn(x) for x in arrays]
        assert len(set(got)) == len(arrays), [x.shape for x in arrays]


def test_zero_d_header_has_ndim_zero_and_no_shape_words():
    x = np.array(np.float32(1.5))
    cb = hashing.canonical_bytes("x", x)
    assert cb == hashing.tensor_header("x", x) + struct.pack("<f", 1.5)
    assert cb.endswith(struct.pack("<I", 0) + struct.pack("<f", 1.5))
    # a non-contiguous or big-endian array keeps its shape too
    y = np.arange(6, dtype=">f4").reshape(2, 3).T
    assert hashing.canonical_bytes("y", y) == hashing.canonical_bytes("y", np.ascontiguousarray(y, dtype="<f4"))


# ---------------------------------------------------------------- constants: docstrings, vectors file, code

DOCSTRINGS = {
    "philox": philox.philox4x32.__doc__,
    "transcendental": transcendental.exp.__doc__ + transcendental.log.__doc__,
    "rng": rng.normal_from_centered.__doc__,
}
QUOTED = re.compile(r"(?<![A-Za-z0-9_])([A-Z][A-Za-z0-9_]*(?:\[\d+\])?)\s*=\s*0x([0-9A-Fa-f]+)\b")


def _vectors():
    return vectors.parse_vectors(golden.vectors_path().read_text(encoding="utf-8"), str(golden.vectors_path()))


def _golden_constants() -> dict[str, tuple[str, int]]:
    return {f[0]: (f[1], int(f[2], 16)) for k, f in _vectors() if k == "constant"}


def _code_value(mod, label: str) -> int:
    name, _, index = label.partition("[")
    v = getattr(mod, name)
    if index:
        v = v[int(index[:-1])]
    return int(np.asarray(v).view(np.uint32)) if isinstance(v, np.float32) else int(v)


def test_docstrings_vectors_file_and_code_quote_the_same_constants():
    in_file = _golden_constants()
    quoted = {}
    for mod_name, doc in DOCSTRINGS.items():
        for name, value in QUOTED.findall(doc):
            key = f"{mod_name}.{name}"
            assert quoted.setdefault(key, int(value, 16)) == int(value, 16), f"{key} quoted twice, differently"
    assert set(quoted) == set(in_file), (sorted(set(quoted) ^ set(in_file)))
    for key, value in quoted.items():
        assert in_file[key][1] == value, f"{key}: docstring {value:#x}, vectors file {in_file[key][1]:#x}"
        mod_name, _, label = key.partition(".")
        assert _code_value(vectors.CONSTANT_MODULES[mod_name], label) == value, key


def test_weyl_increments_are_truncated_fractions():
    from decimal import Decimal, getcontext

    getcontext().prec = 60
    golden_ratio = (1 + Decimal(5).sqrt()) / 2
    for real, w in ((golden_ratio, philox.PHILOX_W32_0), (Decimal(3).sqrt() - 1, philox.PHILOX_W32_1)):
        frac = real - int(real)
        assert int(frac * 2**32) == int(w)  # truncated
    assert int(((Decimal(3).sqrt() - 1) * 2**32).to_integral_value()) == 0xBB67AE86  # nearest would differ


def test_rounds_must_be_1_to_16():
    c, k = np.zeros(4, np.uint32), np.zeros(2, np.uint32)
    philox.philox4x32(c, k, 1), philox.philox4x32(c, k, 16)
    for r in (0, 17):
        with pytest.raises(ValueError, match="1..16"):
            philox.philox4x32(c, k, r)


# ---------------------------------------------------------------- the vectors file is the generator's

def test_vectors_file_is_what_the_generator_writes():
    assert golden.vectors_path().read_text(encoding="utf-8") == vectors.format_vectors(vectors.compute_vectors())


# ---------------------------------------------------------------- a second implementation, from the text only

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85  # as the philox4x32 docstring quotes them
MASK = 0xFFFFFFFF


def text_philox(counter, key, rounds=10):
    """philox4x32 as its docstring writes it, in Python integers."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
    return c0, c1, c2, c3


def text_enc(part) -> bytes:
    if isinstance(part, int):
        return b"i" + struct.pack("<Q", part)
    b = part.encode("utf-8") if isinstance(part, str) else part
    return (b"s" if isinstance(part, str) else b"b") + struct.pack("<Q", len(b)) + b


def text_stream(seed, purpose, count):
    d = hashlib.sha256(b"lockstep.philox-stream.v1\x00" + b"".join(text_enc(p) for p in (seed, *purpose))).digest()
    k0, k1, n0, n1 = struct.unpack("<4I", d[:16])
    out = []
    for i in range(count):
        b = i // 4
        out.append(text_philox((b & MASK, b >> 32, n0, n1), (k0, k1))[i % 4])
    return d, (k0, k1), (n0, n1), out


def _hexwords(token):
    return [int(w, 16) for w in token.split(",")]


def test_a_port_from_the_text_reproduces_philox_and_streams():
    lines = _vectors()
    philox_lines = [f for k, f in lines if k == "philox"]
    stream_lines = [f for k, f in lines if k == "stream"]
    assert len(philox_lines) >= 3 and len(stream_lines) >= 5
    for f in philox_lines:
        assert list(text_philox(_hexwords(f["counter"]), _hexwords(f["key"]), int(f["rounds"]))) == _hexwords(f["out"])
    for f in stream_lines:
        purpose = vectors.parse_purpose(f["purpose"])
        words = _hexwords(f["uint32"])
        d, key, nonce, got = text_stream(int(f["seed"]), purpose, len(words))
        assert bytes.fromhex(f["message"]) == b"lockstep.philox-stream.v1\x00" + b"".join(
            text_enc(p) for p in (int(f["seed"]), *purpose))
        assert d.hex() == f["digest"] and list(key) == _hexwords(f["key"]) and list(nonce) == _hexwords(f["nonce"])
        assert got == words
        # the samplers read value i from word i: uniform is (w >> 8) * 2**-24, exactly
        uni = [int(np.float32((w >> 8) * 2.0**-24).view(np.uint32)) for w in words[: len(f["uniform"].split(","))]]
        assert uni == _hexwords(f["uniform"])
        # and the library agrees with the normal samples recorded (they need the spec's log: not re-derived here)
        s = philox.PhiloxStream(int(f["seed"]), *purpose)
        n = len(f["normal"].split(","))
        assert rng.normal(s, 0, n).view(np.uint32).tolist() == _hexwords(f["normal"])
        assert rng.truncated_normal(s, 0, n, 2.0).view(np.uint32).tolist() == _hexwords(f["truncated_normal"])


def text_header(name: bytes, dtype: str, shape: tuple[int, ...]) -> bytes:
    return (b"lockstep.tensor.v1\x00" + struct.pack("<I", len(name)) + name + struct.pack("<I", len(dtype))
            + dtype.encode() + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", s) for s in shape))


def text_merkle(data: bytes) -> tuple[list[bytes], bytes]:
    chunk = 1 << 20
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] or [b""]
    level = leaves = [hashlib.sha256(b"\x00" + struct.pack("<Q", i) + c).digest() for i, c in enumerate(pieces)]
    while len(level) > 1:
        nxt = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        level = nxt + ([level[-1]] if len(level) % 2 else [])
    return leaves, level[0]


def test_a_port_from_the_text_reproduces_the_hashing_layouts():
    lines = _vectors()
    digests = {}
    tensors = [f for k, f in lines if k == "tensor"]
    assert {f["shape"] for f in tensors} >= {"-", "1", "1,1", "0", "0,3"}
    for f in tensors:
        name = bytes.fromhex(f["name"])
        shape = () if f["shape"] == "-" else tuple(int(d) for d in f["shape"].split(","))
        data = vectors.pattern_bytes(int(f["data"][8:])) if f["data"].startswith("pattern:") else bytes.fromhex(f["data"])
        header = text_header(name, f["dtype"], shape)
        leaves, root = text_merkle(data)
        digest = hashlib.sha256(header + struct.pack("<Q", len(data)) + root).hexdigest()
        assert header.hex() == f["header"]
        assert ",".join(x.hex() for x in leaves) == f["leaves"]
        assert digest == f["digest"]
        # plain SHA-256 of the header under the empty name and the data: no Merkle tree
        assert hashlib.sha256(text_header(b"", f["dtype"], shape) + data).hexdigest() == f["array_digest"]
        digests.setdefault(name, set()).add(digest)
    (state,) = [f for k, f in lines if k == "state"]
    names = sorted(bytes.fromhex(n) for n in state["tensors"].split(","))
    h = hashlib.sha256(b"lockstep.state.v1\x00" + struct.pack("<I", len(names)))
    for n in names:
        (d,) = digests[n]  # each state tensor's name is on one tensor line
        h.update(struct.pack("<I", len(n)) + n + bytes.fromhex(d))
    assert h.hexdigest() == state["root"]
    (gen,) = [f for k, f in lines if k == "genesis"]
    sv = gen["spec_version"].encode()
    assert hashlib.sha256(b"lockstep.genesis.v1\x00" + bytes.fromhex(gen["recipe_digest"])
                          + bytes.fromhex(gen["manifest_digest"]) + struct.pack("<I", len(sv)) + sv).hexdigest() == gen["h0"]
    prev = gen["h0"]
    for f in [f for k, f in lines if k == "chain"]:
        assert f["prev"] == prev
        body = (b"lockstep.chain.v2\x00" + struct.pack("<Q", int(f["step"])) + bytes.fromhex(prev)
                + bytes.fromhex(f["state_root"]) + bytes.fromhex(f["batch_digest"]) + struct.pack("<Q", int(f["tokens"]))
                + struct.pack("<III", *(int(f[k], 16) for k in ("loss_bits", "grad_norm_bits", "lr_bits"))))
        assert hashlib.sha256(body).hexdigest() == f["h"]
        prev = f["h"]


def test_the_kernel_header_quotes_the_same_constants():
    """``ls_fp.h`` (the GPU kernels and the host C build) re-derives exp/log and Philox: same constants."""
    from pathlib import Path

    header = (Path(philox.__file__).parents[1] / "backends" / "kernels" / "ls_fp.h").read_text()
    defined = {m.group(1): int(m.group(2), 16)
               for m in re.finditer(r"#define LS_([A-Z0-9_]+) (?:ls_float\()?0x([0-9A-Fa-f]+)u", header)}
    in_file = _golden_constants()
    shared = [k for k in in_file if k.startswith("transcendental.") and k.partition(".")[2] in defined]
    assert len(shared) >= 18
    for key in shared:
        assert defined[key.partition(".")[2]] == in_file[key][1], key
    for key in ("philox.PHILOX_M4x32_0", "philox.PHILOX_M4x32_1", "philox.PHILOX_W32_0", "philox.PHILOX_W32_1"):
        assert f"0x{in_file[key][1]:08X}u" in header, key


def test_the_stream_docstring_writes_out_the_domain_and_the_encoding():
    doc = philox.PhiloxStream.__doc__
    quoted = re.search(r'b"(lockstep\.philox-stream\.v\d+)\\x00"', doc)
    assert quoted and quoted.group(1).encode() + b"\x00" == philox.STREAM_DOMAIN
    assert f"the {len(philox.STREAM_DOMAIN)} bytes" in doc
    example = re.search(r"``STREAM_DOMAIN \|\| ([0-9a-f |]+)``", doc).group(1)
    assert bytes.fromhex(example.replace("|", "")) == vectors.stream_message(7, "init", 2)[len(philox.STREAM_DOMAIN):]


# ---------------------------------------------------------------- the parameter table: docstring, docs, code

def _table_rows(text: str) -> list[list[str]]:
    """The rows of the parameter table that follows the ``name  shape  init  std  decay`` heading."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:5] == ["name", "shape", "init", "std", "decay"])
    rows = []
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        m = re.fullmatch(r"\s*(\S+)\s+(\(.*?\))\s+(\S+)\s+(\S+)\s+(\S+)\s*", ln)
        assert m, ln
        rows.append(list(m.groups()))
    return rows


def _expand(rows, cfg, shape_of):
    """The table's rows for ``cfg``: ``layers.NN.`` rows once per layer, in the table's order."""
    layer_rows = [r for r in rows if r[0].startswith("layers.NN.")]
    head = [r for r in rows[: rows.index(layer_rows[0])]]
    tail = [r for r in rows[rows.index(layer_rows[-1]) + 1:]]
    assert rows == head + layer_rows + tail  # the layer rows are contiguous
    out = []
    for name, shape, init, std, decay in head + [
            [r[0].replace("NN", f"{i:02d}"), *r[1:]] for i in range(cfg.n_layers) for r in layer_rows] + tail:
        std_value = {"-": 0.0, "init_std": cfg.init_std,
                     "init_std/sqrt(2*L)": cfg.init_std / math.sqrt(2 * cfg.n_layers)}[std]
        out.append((name, shape_of(shape), init, std_value, {"yes": True, "no": False}[decay]))
    return out


def _spec_rows(cfg):
    from lockstep.formats.params import param_specs

    return [(s.name, tuple(s.shape), s.init, s.std, s.decay) for s in param_specs(cfg)]


@pytest.mark.parametrize("name,overrides", [("tiny", {}), ("small", {}), ("open-1b", {}),
                                            ("tiny", {"n_layers": 101, "init_std": 0.05})])
def test_the_params_docstring_table_is_param_specs(name, overrides):
    from lockstep.formats import params
    from lockstep.formats.config import preset

    cfg = preset(name, **overrides)
    sym = {"V": cfg.vocab_size, "D": cfg.d_model, "L": cfg.n_layers, "H": cfg.n_heads, "G": cfg.n_kv_heads,
           "Dh": cfg.head_dim, "F": cfg.ffn_dim}

    def shape_of(text):
        return tuple(eval(text, {"__builtins__": {}}, sym))  # "(D, 2*F)", "(D,)": tuples of the symbols

    assert _expand(_table_rows(params.__doc__), cfg, shape_of) == _spec_rows(cfg)


def test_the_docs_parameter_table_is_open_1bs_param_specs():
    from lockstep.formats.config import preset
    from lockstep.formats.params import param_count

    cfg = preset("open-1b")
    doc = (Path(hashing.__file__).parents[2] / "docs" / "formats.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Parameters"):doc.index("## Data folder")]
    rows = _expand(_table_rows(section), cfg, lambda t: tuple(int(v) for v in t.strip("(),").split(",") if v.strip()))
    assert rows == _spec_rows(cfg)
    assert f"{param_count(cfg):,} parameters" in section


def test_the_quoted_init_stds_are_the_float32_of_param_specs():
    from lockstep.formats import params
    from lockstep.formats.config import preset

    stds = sorted({s.std for s in params.param_specs(preset("open-1b")) if s.init == "normal"}, reverse=True)
    assert stds == [0.02, 0.02 / math.sqrt(48)]
    bits = [f"0x{int(np.float32(s).view(np.uint32)):08X}" for s in stds]
    doc = (Path(hashing.__file__).parents[2] / "docs" / "formats.md").read_text(encoding="utf-8")
    for text in (params.__doc__, doc):
        for b in bits:
            assert b in text
    assert f"float32({stds[1]!r}) = {bits[1]}" in params.__doc__


# ---------------------------------------------------------------- fsio.json_bytes does what its docstring says

def test_json_bytes_layout_escapes_and_numbers_are_as_documented():
    from lockstep.fsio import json_bytes

    obj = {"z": [1, 2.0, 0.1, 1e-8, 1e16, -0.0, True, None, {}, [], (3,)], "é": "é€\u2028\"\\\n\x01\x7f",
           "a": {"k": 1}, "7": "int key"}
    want = ('{\n'
            '  "7": "int key",\n'
            '  "a": {\n'
            '    "k": 1\n'
            '  },\n'
            '  "z": [\n'
            '    1,\n    2.0,\n    0.1,\n    1e-08,\n    1e+16,\n    -0.0,\n    true,\n    null,\n    {},\n    [],\n'
            '    [\n      3\n    ]\n'
            '  ],\n'
            '  "é": "é€\u2028\\"\\\\\\n\\u0001\x7f"\n'
            '}\n').encode("utf-8")
    assert json_bytes(obj) == want
    assert json_bytes({7: "int key"}) == b'{\n  "7": "int key"\n}\n'  # an int key is written as a string
    assert all(not line.endswith(b" ") for line in want.split(b"\n"))
    for bad, err in ((float("nan"), ValueError), (float("inf"), ValueError), (np.float32(1), TypeError),
                     (np.int64(1), TypeError), (np.bool_(True), TypeError), ("\udc80", UnicodeEncodeError),
                     ({1: 0, "a": 0}, TypeError)):
        with pytest.raises(err):
            json_bytes(bad)
    assert json_bytes(np.float64(1.5)) == b"1.5\n"


def test_json_bytes_docstring_spells_float32_settings_as_genesis_writes_them():
    from lockstep.formats.config import ModelConfig, TrainConfig
    from lockstep.formats.recipe import _settings
    from lockstep.fsio import json_bytes

    doc = " ".join(json_bytes.__doc__.split())
    model = _settings(ModelConfig(norm_eps=1e-6).to_dict(), ModelConfig, "model")
    train = _settings(TrainConfig(eps=1e-8).to_dict(), TrainConfig, "train")
    for key, given, value in (("norm_eps", "1e-6", model["norm_eps"]), ("eps", "1e-8", train["eps"])):
        assert f"``{key}`` {given} is ``{value!r}``" in doc
        assert f'"{key}": {value!r}'.encode() in json_bytes({key: value})


# ---------------------------------------------------------------- the recipe's settings table: docstring, docs, code

def _settings_rows() -> list[list[str]]:
    """Every ModelConfig/TrainConfig field: name, type, default as recipe.json spells it, and as H_0 binds it."""
    import dataclasses
    import json

    from lockstep.formats.config import ModelConfig, TrainConfig
    from lockstep.formats.recipe import FLOAT32_SETTINGS, NON_BIT_FIELDS, _settings, genesis_recipe
    from lockstep.spec import SPEC_VERSION

    recipe = {"format": "lockstep.recipe", "model": {}, "train": {}, "data": {"manifest_sha256": "0" * 64},
              "seed": 0, "micro_batch": 8, "spec_version": SPEC_VERSION}
    bound = genesis_recipe(recipe)
    rows = []
    for section, cls in (("model", ModelConfig), ("train", TrainConfig)):
        written = cls().to_dict()
        assert _settings({}, cls, section).keys() == written.keys()  # every field written out
        for f in dataclasses.fields(cls):
            kind = {"int": "int", "float": "float", "bool": "bool", "str": "str",
                    "tuple[tuple[int, int], ...]": "[[int, int], ...]"}[f.type]
            if f.name in FLOAT32_SETTINGS[section]:
                assert kind == "float"
                kind = "float32"
            name = f"{section}.{f.name}"
            in_h0 = "left out" if name in NON_BIT_FIELDS else json.dumps(bound[section][f.name])
            assert (name in NON_BIT_FIELDS) == (f.name not in bound[section])
            rows.append([name, kind, json.dumps(written[f.name]), in_h0])
    return rows


def _settings_table(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["field", "type"])
    rows = []
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        rows.append(re.split(r"\s{2,}", ln.strip()))
    return rows


def test_the_genesis_recipe_settings_tables_are_the_dataclasses():
    from lockstep.formats import recipe

    doc = (Path(hashing.__file__).parents[2] / "docs" / "formats.md").read_text(encoding="utf-8")
    want = _settings_rows()
    assert _settings_table(recipe.genesis_recipe.__doc__) == want
    assert _settings_table(doc[doc.index("**Genesis fields.**"):]) == want


def test_the_readmes_open_1b_checkpoint_size_is_three_float32_copies():
    from lockstep.formats.checkpoint import MAX_HEADER_BYTES, state_bytes_bound
    from lockstep.formats.config import preset
    from lockstep.formats.params import param_count

    readme = " ".join((Path(hashing.__file__).parents[2] / "README.md").read_text(encoding="utf-8").split())
    cfg = preset("open-1b")
    n = param_count(cfg)
    state = 3 * 4 * n
    assert state_bytes_bound(cfg) == 8 + MAX_HEADER_BYTES + state + 8  # the state is those three copies and the step
    assert (f"an Open-1B checkpoint is about {state / 1e9:.1f} GB: the parameters and both AdamW moments, three "
            f"float32 copies of {n:,} values, {state:,} bytes") in readme
