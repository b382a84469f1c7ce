"""Known-answer vectors for what the op cases do not cover: constants, Philox, streams, hashing.

``golden/spec_v<SPEC_VERSION>_vectors.txt`` lets a port in another language check,
from text alone, the constants the spec docstrings quote, the Philox block function,
the derivation of every keyed stream (``philox.PhiloxStream``), the samplers built on
them, and the hashing layouts (``hashing``: canonical header, Merkle digest, array
digest, state root, genesis and chain). Written with the op golden files by
``python -m lockstep.conformance.golden --write``. Plain text, one vector a line,
whitespace-separated ``key=value`` tokens after the line's kind; hex is lower case
for bytes and digests, upper case for 32-bit words and float32 bit patterns::

    # comment lines start with '#'
    format 1
    spec_version <SPEC_VERSION>
    constant <module>.<NAME> f32|u32|u64 <hex>      # f32: the bit pattern
    philox rounds=R counter=C0,C1,C2,C3 key=K0,K1 out=O0,O1,O2,O3
    stream seed=S purpose=P,... message=<hex> digest=<hex> key=K0,K1 nonce=N0,N1
           uint32=W0,W1,... uniform=F0,... normal=F0,... truncated_normal=F0,...
    tensor name=<UTF-8 hex> dtype=<str> shape=D0,D1,... data=<hex> header=<hex>
           leaves=<hex>,... digest=<hex> array_digest=<hex>
    state root=<hex> tensors=<name hex>,...     # the tensor lines of those names
    genesis recipe_digest=<hex> manifest_digest=<hex> spec_version=<text> h0=<hex>
    chain step=T prev=<hex> state_root=<hex> batch_digest=<hex> tokens=N
          loss_bits=<8 hex> grad_norm_bits=<8 hex> lr_bits=<8 hex> h=<hex>

(each vector is on one line in the file). A purpose element is ``int:<decimal>``,
``str:<text>`` (no comma or space in these vectors) or ``bytes:<hex>``; an empty
purpose is ``purpose=-``. ``shape=-`` is a 0-d tensor (ndim 0), ``shape=0,3`` a
tensor with no elements. ``data=pattern:<n>`` stands for n bytes with byte i equal
to ``i mod 251`` (a tensor of several Merkle chunks); otherwise ``data`` is the
little-endian element bytes in hex. The stream samplers are read from value 0:
``uniform`` is ``PhiloxStream.uniform``, ``normal`` is ``rng.normal`` and
``truncated_normal`` is ``rng.truncated_normal`` with bound 2, float32 bit patterns.
"""

from __future__ import annotations

import numpy as np

from lockstep import spec
from lockstep.spec import hashing, philox, rng, transcendental

VECTORS_FORMAT = 1
STREAM_VALUES = 12  # uint32 values per stream line (three Philox blocks)
SAMPLE_VALUES = 6

# The constants the spec docstrings quote, by module (tests/test_spec_text.py checks both ways).
CONSTANT_MODULES = {"philox": philox, "transcendental": transcendental, "rng": rng}
CONSTANTS = {
    "philox": ("PHILOX_M4x32_0", "PHILOX_M4x32_1", "PHILOX_W32_0", "PHILOX_W32_1"),
    "transcendental": ("INV_LN2", "LN2_HI", "LN2_LO", "ROUND_MAGIC", "EXP_ARG_MAX", "EXP_ARG_MIN",
                       "EXP_C3", "EXP_C4", "EXP_C5", "EXP_C6", "EXP_C7", "EXP_C8",
                       "LOG_L3", "LOG_L5", "LOG_L7", "LOG_L9", "LOG_L11", "LOG_SQRT2_MANTISSA",
                       "HALF", "ONE", "TWO"),
    "rng": ("ACKLAM_A", "ACKLAM_B", "ACKLAM_C", "ACKLAM_D", "ACKLAM_CENTRAL_MAX", "HALF", "ONE", "MINUS_TWO"),
}

# (counter, key, rounds) for the bare block function.
PHILOX_CASES = (
    ((0, 0, 0, 0), (0, 0), 10),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, 10),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0), 10),
    ((1, 2, 3, 4), (5, 6), 1),
    ((1, 2, 3, 4), (5, 6), 16),
)
# (seed, *purpose) of the streams: the trainer's kinds of purpose (parameter init by name,
# the data order), edge seeds, an empty purpose, bytes and non-ASCII text.
STREAM_CASES = (
    (0,),
    (7, "init", 2),
    (0, "init", "tok_embedding"),
    (1234, "init", "layers.0.attn.wqkv"),
    (2**64 - 1, "data", "shards"),
    (42, "data", "documents", 3),
    (5, b"\x00\xff", "gr\u00fc\u00dfe"),
)


def _words(a) -> str:
    return ",".join(f"{int(v):08X}" for v in np.asarray(a, dtype=np.uint32).reshape(-1))


def _f32_bits(a) -> str:
    return _words(np.asarray(a, dtype=np.float32).view(np.uint32))


def _purpose_token(p) -> str:
    if isinstance(p, (int, np.integer)):
        return f"int:{int(p)}"
    if isinstance(p, str):
        if "," in p or " " in p:
            raise ValueError(f"a vector purpose string may not hold a comma or a space: {p!r}")
        return f"str:{p}"
    return f"bytes:{bytes(p).hex()}"


def parse_purpose(token: str) -> tuple:
    if token == "-":
        return ()
    out = []
    for part in token.split(","):
        kind, _, rest = part.partition(":")
        out.append(int(rest) if kind == "int" else rest if kind == "str" else bytes.fromhex(rest))
    return tuple(out)


def stream_message(seed: int, *purpose) -> bytes:
    """The bytes SHA-256 hashes to key ``PhiloxStream(seed, *purpose)``."""
    return philox.STREAM_DOMAIN + b"".join(philox._encode_purpose(p) for p in (seed, *purpose))


def pattern_bytes(n: int) -> bytes:
    """``data=pattern:n``: byte i is ``i mod 251``."""
    return (bytes(range(251)) * (n // 251 + 1))[:n]


def _tensor_cases() -> list[tuple[str, np.ndarray]]:
    """Tensors that differ only in shape (0-d, (1,), (1, 1)), empty ones, several dtypes and names,
    and one of three Merkle chunks (an odd level)."""
    f = np.float32(1.5)
    big = np.frombuffer(pattern_bytes(2 * hashing.CHUNK_BYTES + 1000), dtype=np.uint8)
    return [
        ("x", np.array(f)),
        ("x", np.array([f])),
        ("x", np.array([[f]])),
        ("", np.array(f)),
        ("", np.array([f])),
        ("empty", np.zeros((0,), dtype=np.float32)),
        ("empty", np.zeros((0, 3), dtype=np.float32)),
        ("step", np.array([3], dtype=np.int64)),
        ("param/w", np.arange(6, dtype=np.float32).reshape(2, 3) - np.float32(2.5)),
        ("tokens", np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)),
        ("q", np.array([-127, 0, 127], dtype=np.int8)),
        ("gr\u00fc\u00dfe", np.array([0x7FC00000, 0x80000000], dtype=np.uint32).view(np.float32)),
        ("lr", np.array(np.float32(3e-4))),
        ("chunks", big),
    ]


STATE_TENSORS = ("lr", "param/w", "step")  # names of tensor lines (each name on one line only): one state


def compute_vectors() -> list[str]:
    lines = []
    for mod_name, names in CONSTANTS.items():
        mod = CONSTANT_MODULES[mod_name]
        for name in names:
            value = getattr(mod, name)
            items = [(f"{name}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, tuple) else [(name, value)]
            for label, v in items:
                if isinstance(v, np.float32):
                    lines.append(f"constant {mod_name}.{label} f32 {int(np.asarray(v).view(np.uint32)):08X}")
                else:
                    kind = "u64" if np.asarray(v).dtype == np.uint64 else "u32"
                    lines.append(f"constant {mod_name}.{label} {kind} {int(v):08X}")
    for counter, key, rounds in PHILOX_CASES:
        out = philox.philox4x32(np.array(counter, dtype=np.uint32), np.array(key, dtype=np.uint32), rounds)
        lines.append(f"philox rounds={rounds} counter={_words(counter)} key={_words(key)} out={_words(out)}")
    for seed, *purpose in STREAM_CASES:
        s = philox.PhiloxStream(seed, *purpose)
        msg = stream_message(seed, *purpose)
        ptoken = ",".join(_purpose_token(p) for p in purpose) or "-"
        lines.append(" ".join([
            "stream", f"seed={seed}", f"purpose={ptoken}", f"message={msg.hex()}",
            f"digest={hashing.hashlib.sha256(msg).hexdigest()}", f"key={_words(s.key)}", f"nonce={_words(s.nonce)}",
            f"uint32={_words(s.uint32(0, STREAM_VALUES))}", f"uniform={_f32_bits(s.uniform(0, SAMPLE_VALUES))}",
            f"normal={_f32_bits(rng.normal(s, 0, SAMPLE_VALUES))}",
            f"truncated_normal={_f32_bits(rng.truncated_normal(s, 0, SAMPLE_VALUES, 2.0))}"]))
    tensors = _tensor_cases()
    for name, x in tensors:
        raw = hashing._le_contiguous(x)
        data = memoryview(raw.reshape(-1).view(np.uint8)) if raw.size else memoryview(b"")
        dtoken = f"pattern:{x.nbytes}" if name == "chunks" else bytes(data).hex()
        shape = ",".join(str(d) for d in x.shape) or "-"
        leaves = ",".join(d.hex() for d in hashing.leaf_digests(data))
        lines.append(" ".join([
            "tensor", f"name={name.encode('utf-8').hex()}", f"dtype={hashing.dtype_name(x.dtype)}",
            f"shape={shape}", f"data={dtoken}", f"header={hashing.tensor_header(name, x).hex()}",
            f"leaves={leaves}", f"digest={hashing.tensor_digest(name, x).hex()}",
            f"array_digest={hashing.array_digest(x)}"]))
    state = {name: x for name, x in tensors if name in STATE_TENSORS}
    lines.append(f"state root={hashing.state_root(state)} "
                 f"tensors={','.join(n.encode('utf-8').hex() for n in STATE_TENSORS)}")
    rd, md = hashing.hashlib.sha256(b"recipe").hexdigest(), hashing.hashlib.sha256(b"manifest").hexdigest()
    h0 = hashing.genesis_hash(rd, md, spec.SPEC_VERSION)
    lines.append(f"genesis recipe_digest={rd} manifest_digest={md} spec_version={spec.SPEC_VERSION} h0={h0}")
    prev = h0
    for step, tokens, loss, gn, lr in ((1, 4096, 5.5, 1.25, 3e-4), (2, 8192, 5.25, 0.75, 6e-4)):
        # any 32 bytes stand for the batch digest here (the trainer's is ``stream.batch_digest``)
        root, batch = hashing.state_root(state), hashing.array_digest(np.array([[step]], dtype=np.int32))
        bits = [f"{hashing.float32_bits(v):08X}" for v in (loss, gn, lr)]
        h = hashing.chain_hash(step, prev, root, batch, tokens, *(f"0x{b}" for b in bits))
        lines.append(f"chain step={step} prev={prev} state_root={root} batch_digest={batch} tokens={tokens} "
                     f"loss_bits={bits[0]} grad_norm_bits={bits[1]} lr_bits={bits[2]} h={h}")
        prev = h
    return lines


def format_vectors(lines: list[str]) -> str:
    doc = __doc__[__doc__.index("Plain text"):].rstrip()
    head = ["# lockstep known-answer vectors: constants, Philox, keyed streams, hashing layouts.",
            "# Written by `python -m lockstep.conformance.golden --write`; do not edit by hand.", "#"]
    head += [f"# {line}".rstrip() for line in doc.splitlines()]
    head += [f"format {VECTORS_FORMAT}", f"spec_version {spec.SPEC_VERSION}"]
    return "\n".join(head + lines) + "\n"


def parse_vectors(text: str, source: str = "vectors file") -> list[tuple[str, dict | list]]:
    """``(kind, fields)`` per vector line: ``constant`` gives ``[name, kind, hex]``, others a dict."""
    header: dict[str, str] = {}
    out: list[tuple[str, dict | list]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        parts = raw.split()
        if parts[0] in ("format", "spec_version") and len(parts) == 2:
            header[parts[0]] = parts[1]
        elif parts[0] == "constant" and len(parts) == 4:
            out.append(("constant", parts[1:]))
        elif parts[0] in ("philox", "stream", "tensor", "state", "genesis", "chain"):
            fields = dict(p.split("=", 1) for p in parts[1:])
            out.append((parts[0], fields))
        else:
            raise ValueError(f"{source}:{lineno}: cannot parse {raw[:80]!r}")
    if header.get("format") != str(VECTORS_FORMAT):
        raise ValueError(f"{source}: unsupported vectors format {header.get('format')!r}")
    if header.get("spec_version") != spec.SPEC_VERSION:
        raise ValueError(f"{source}: written for SPEC_VERSION {header.get('spec_version')!r}, "
                         f"this is {spec.SPEC_VERSION!r}")
    return out
