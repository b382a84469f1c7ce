"""``lockstep export --format hf``: the same checkpoint as a folder Hugging Face ``transformers`` loads.

An export of this layout::

    config.json                 model_type "lockstep", architectures, auto_map, the model's settings
                                under transformers' names, and under "lockstep" the recipe's model,
                                the tokenizer identity and the int8 layers
    configuration_lockstep.py   the model code (``lockstep/use/hf_code``), byte for byte; it imports
    modeling_lockstep.py        torch and transformers only
    generation_config.json      greedy; bos/eos = the end-of-document token; the trained context
                                as max_length; ids the tokenizer cannot produce suppressed
    model.safetensors           float32 weights under transformers' names and (out, in) layouts,
                                and for every int8 W8A8 layer NAME.weight_int8 (int8) and
                                NAME.weight_scale (float32 per output channel)
    tokenizer.json              the run's tokenizer file (its bytes, the manifest's SHA-256), or for the
                                byte tokenizer one that maps byte b to id b (``byte_tokenizer_json``)
    tokenizer_config.json       names the end-of-document token
    recipe.json, proof.json     as in lockstep's layout (``export``); proof.json says "layout": "hf"
    README.md                   the model card

Loading needs no network and no lockstep::

    model = AutoModelForCausalLM.from_pretrained(EXPORT, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(EXPORT)

The names (``HF_PIECES``): lockstep's fused ``attn.wqkv`` (D, (H + 2G) Dh) is cut by columns into
``q_proj``, ``k_proj``, ``v_proj`` and ``ffn.w_gate_up`` (D, 2F) into ``gate_proj``, ``up_proj``;
each piece, like ``wo``, ``w_down`` and the LM head, is transposed to (out, in). Cutting and
transposing move bits and compute nothing, so every lockstep tensor is rebuilt exactly from the
export (``lockstep_tensors``), and ``verify-export`` checks the rebuilt tensors against the
proof's digests as it checks lockstep's layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.formats.params import param_count, param_specs
from lockstep.formats.tokenizer import BYTE_VOCAB, ByteTokenizer, HFTokenizer, HF_TOKENIZER_FILE
from lockstep.fsio import json_bytes

from .export import (INT8_SUFFIX, SCALE_SUFFIX, export_tensors, model_card, quantized_names, tokenizer_bytes,
                     write_export)
from .run import RunModel

LAYOUT = "hf"
HF_CONFIG_FORMAT = "lockstep.export-hf-config"
HF_CONFIG_VERSION = 1
GENERATION_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CODE_DIR = Path(__file__).resolve().parent / "hf_code"
CODE_FILES = ("configuration_lockstep.py", "modeling_lockstep.py")
ARCHITECTURE = "LockstepForCausalLM"
MODEL_TYPE = "lockstep"
CODES, SCALES = ".weight_int8", ".weight_scale"  # beside a quantized layer's ".weight"
BYTE_EOD_TOKEN = "<|endoftext|>"  # the byte tokenizer's separator, id 256, as a token string
ADDED_EOD_TOKEN = "<|lockstep_eod|>"  # a run whose separator is a new id past the tokenizer's vocabulary


@dataclass(frozen=True)
class Piece:
    """HF tensor ``hf`` is ``lockstep[:, cols[0]:cols[1]]`` (all columns when None), transposed when ``transpose``."""

    lockstep: str
    hf: str
    cols: tuple[int, int] | None = None
    transpose: bool = False


def hf_pieces(cfg) -> list[Piece]:
    """Every exported float32 tensor: where in which lockstep parameter it comes from (module docstring)."""
    h, g, dh, f = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    out = [Piece("embed", "model.embed_tokens.weight"), Piece("embed_norm.gain", "model.embed_norm.weight")]
    for i in range(cfg.n_layers):
        p, q = f"layers.{i:02d}.", f"model.layers.{i}."
        out += [
            Piece(p + "attn_norm.gain", q + "input_layernorm.weight"),
            Piece(p + "attn.wqkv", q + "self_attn.q_proj.weight", (0, h * dh), True),
            Piece(p + "attn.wqkv", q + "self_attn.k_proj.weight", (h * dh, (h + g) * dh), True),
            Piece(p + "attn.wqkv", q + "self_attn.v_proj.weight", ((h + g) * dh, (h + 2 * g) * dh), True),
            Piece(p + "attn.wo", q + "self_attn.o_proj.weight", None, True),
            Piece(p + "ffn_norm.gain", q + "post_attention_layernorm.weight"),
            Piece(p + "ffn.w_gate_up", q + "mlp.gate_proj.weight", (0, f), True),
            Piece(p + "ffn.w_gate_up", q + "mlp.up_proj.weight", (f, 2 * f), True),
            Piece(p + "ffn.w_down", q + "mlp.down_proj.weight", None, True),
        ]
    return out + [Piece("final_norm.gain", "model.norm.weight"), Piece("lm_head", "lm_head.weight", None, True)]


def _stem(hf_name: str) -> str:
    return hf_name[: -len(".weight")]


def _cut(x: np.ndarray, piece: Piece) -> np.ndarray:
    if piece.cols is not None:
        x = x[..., piece.cols[0]:piece.cols[1]]
    return np.ascontiguousarray(x.T if piece.transpose and x.ndim == 2 else x)


def hf_tensors(params: dict, cfg) -> dict[str, np.ndarray]:
    """The export's tensors by HF name: every float32 parameter, and the int8 codes and scales of the
    quantized layers (lockstep's ``export_tensors``, cut and transposed the same way)."""
    lt = export_tensors(params, cfg)
    quantized = set(quantized_names(cfg))
    out = {}
    for piece in hf_pieces(cfg):
        out[piece.hf] = _cut(lt[piece.lockstep], piece)
        if piece.lockstep in quantized:
            out[_stem(piece.hf) + CODES] = _cut(lt[piece.lockstep + INT8_SUFFIX], piece)
            out[_stem(piece.hf) + SCALES] = _cut(lt[piece.lockstep + SCALE_SUFFIX], piece)
    return out


def hf_tensor_layout(cfg) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Every tensor an HF export of ``cfg`` holds: its dtype and shape."""
    shapes = {s.name: s.shape for s in param_specs(cfg)}
    quantized = set(quantized_names(cfg))
    out = {}
    for piece in hf_pieces(cfg):
        shape = shapes[piece.lockstep]
        if piece.cols is not None:
            shape = shape[:-1] + (piece.cols[1] - piece.cols[0],)
        if piece.transpose and len(shape) == 2:
            shape = shape[::-1]
        out[piece.hf] = (np.dtype(np.float32), shape)
        if piece.lockstep in quantized:
            out[_stem(piece.hf) + CODES] = (np.dtype(np.int8), shape)
            out[_stem(piece.hf) + SCALES] = (np.dtype(np.float32), shape[:1])
    return out


def lockstep_tensors(tensors: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    """The lockstep-layout tensors (``export.export_tensors``' names) rebuilt from an HF export's tensors,
    exactly: each piece transposed back and the pieces of a parameter joined along its columns in order.
    Tensors missing or of another dtype or shape than ``hf_tensor_layout`` says are left out (the lockstep
    name goes missing), so the caller's checks report them."""
    layout = hf_tensor_layout(cfg)
    quantized = set(quantized_names(cfg))

    def ok(name):
        x = tensors.get(name)
        return x is not None and x.dtype == layout[name][0] and tuple(x.shape) == layout[name][1]

    groups: dict[str, list[Piece]] = {}
    for piece in hf_pieces(cfg):
        groups.setdefault(piece.lockstep, []).append(piece)
    out = {}
    for name, pieces in groups.items():
        variants = [("", ".weight")] + ([(INT8_SUFFIX, CODES), (SCALE_SUFFIX, SCALES)] if name in quantized else [])
        for suffix, hf_suffix in variants:
            names = [_stem(p.hf) + hf_suffix for p in pieces]
            if not all(ok(n) for n in names):
                continue
            parts = [tensors[n].T if p.transpose and tensors[n].ndim == 2 else tensors[n] for n, p in zip(names, pieces)]
            out[name + suffix] = np.ascontiguousarray(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1))
    return out


# ---------------------------------------------------------------- config and tokenizer files

def eod_token(identity: dict) -> str:
    """The end-of-document token's string in the export's tokenizer."""
    if identity.get("kind") == ByteTokenizer.kind:
        return BYTE_EOD_TOKEN
    return identity.get("eod_token") or ADDED_EOD_TOKEN


def hf_config(cfg, identity: dict) -> dict:
    """``config.json`` of an HF export: everything follows from the recipe's model and the tokenizer identity,
    so ``verify-export`` rebuilds it and compares the whole file."""
    eod = int(identity["eod_id"])
    return {
        "architectures": [ARCHITECTURE],
        "auto_map": {"AutoConfig": "configuration_lockstep.LockstepConfig",
                     "AutoModelForCausalLM": f"modeling_lockstep.{ARCHITECTURE}"},
        "model_type": MODEL_TYPE,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.seq_len, "attention_window": cfg.sliding_window,
        "full_attention_layers": [i for i in range(cfg.n_layers) if cfg.is_full_attention(i)],
        "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.norm_eps, "quantize": cfg.quantize,
        "eod_token_id": eod, "bos_token_id": eod, "eos_token_id": eod,
        "tokenizer_vocab_size": int(identity["vocab_size"]),
        "tie_word_embeddings": False, "use_cache": True, "dtype": "float32",
        "lockstep": {"format": HF_CONFIG_FORMAT, "version": HF_CONFIG_VERSION, "model": cfg.to_dict(),
                     "parameters": param_count(cfg), "tokenizer": identity, "int8_layers": quantized_names(cfg)},
    }


def generation_config(cfg, identity: dict) -> dict:
    """``generation_config.json``: greedy, stopping at the end of the document, within the trained context; the
    model's ids beyond the tokenizer's (padding of the vocabulary) are never chosen, as in ``lockstep sample``.

    No pad token: it would be the end-of-document token, which starts every prompt, and ``generate`` masks
    what it takes for padding when no attention mask is given (transformers pads with the eos token)."""
    eod = int(identity["eod_id"])
    out = {"bos_token_id": eod, "eos_token_id": eod, "do_sample": False,
           "max_length": cfg.seq_len}
    if cfg.vocab_size > int(identity["vocab_size"]):
        out["suppress_tokens"] = list(range(int(identity["vocab_size"]), cfg.vocab_size))
    return out


def tokenizer_config(cfg, identity: dict) -> dict:
    """``tokenizer_config.json``: the end-of-document token as bos/eos/pad, nothing added to a text.

    The byte tokenizer splits its separator's string like any text (``split_special_tokens``): lockstep's
    byte tokenizer never makes id 256 from text. A run whose separator is a new id past its tokenizer's
    vocabulary gets that id here as an added token (the run's tokenizer.json is kept byte for byte)."""
    token = eod_token(identity)
    out = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": token, "eos_token": token,
           "pad_token": token, "model_max_length": cfg.seq_len, "clean_up_tokenization_spaces": False,
           "add_bos_token": False, "add_eos_token": False}
    if identity.get("kind") == ByteTokenizer.kind:
        out["split_special_tokens"] = True
    elif identity.get("eod_token") is None:
        out["added_tokens_decoder"] = {str(int(identity["eod_id"])): {
            "content": ADDED_EOD_TOKEN, "lstrip": False, "rstrip": False, "normalized": False,
            "single_word": False, "special": True}}
    return out


def byte_to_unicode() -> dict[int, str]:
    """The byte-level alphabet of Hugging Face's ``ByteLevel`` pre-tokenizer (GPT-2's): the 188 printable bytes
    ``!``..``~``, ``¡``..``¬``, ``®``..``ÿ`` stand for themselves, the other 68 bytes for U+0100, U+0101, ...
    in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(BYTE_VOCAB):
        if b not in table:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def byte_tokenizer_json() -> bytes:
    """A ``tokenizer.json`` that is lockstep's byte tokenizer: text -> its UTF-8 bytes (byte level, no regular
    expression, no merges), byte b -> id b, id 256 the end-of-document token; decoding joins the bytes."""
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    vocab = {ch: b for b, ch in byte_to_unicode().items()}
    vocab[BYTE_EOD_TOKEN] = ByteTokenizer.eod_id
    return json_bytes({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": ByteTokenizer.eod_id, "content": BYTE_EOD_TOKEN, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": level, "post_processor": None, "decoder": level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    })


def code_files() -> dict[str, bytes]:
    """The model code every HF export carries, as this lockstep ships it."""
    return {name: (CODE_DIR / name).read_bytes() for name in CODE_FILES}


def hf_files(cfg, identity: dict, tokenizer_bytes: bytes | None) -> dict[str, bytes]:
    """Every file of an HF export but the weights, the recipe, the proof and the card, by name: what
    ``verify-export`` rebuilds and compares byte for byte (``tokenizer_bytes``: the run's tokenizer file,
    None for the byte tokenizer)."""
    files = {"config.json": json_bytes(hf_config(cfg, identity)),
             GENERATION_FILE: json_bytes(generation_config(cfg, identity)),
             TOKENIZER_CONFIG_FILE: json_bytes(tokenizer_config(cfg, identity)),
             HF_TOKENIZER_FILE: byte_tokenizer_json() if tokenizer_bytes is None else tokenizer_bytes}
    files.update(code_files())
    return files


def loading_section(cfg, identity: dict) -> str:
    """The model card's "Loading" section of an HF export."""
    return f"""## Loading

With `transformers` and `torch` (no network, no lockstep):

```python
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("THIS_FOLDER", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER")
ids = [model.config.eod_token_id] + tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
out = model.generate(torch.tensor([ids]), max_new_tokens=50, do_sample=False)
print(tokenizer.decode(out[0, len(ids):], skip_special_tokens=True))
```

A document starts after the end-of-document token (id {identity.get("eod_id")}, `{eod_token(identity)}`), as in
training, so a prompt does too. `modeling_lockstep.py` is the model lockstep trained in its semantics, not
its bits: int8 layers use the exported codes and scales and the same quantizer, attention's P.V is int8 as
in training (probabilities at the fixed scale 1/127, values per channel of each KV head), but the float32
sums and `exp` are PyTorch's, so logits differ from lockstep's in the last bits and a validation loss agrees with
`lockstep eval` to about 1e-5 relative, not exactly. Greedy generation gives lockstep's tokens
(`lockstep sample --temperature 0`) while no two logits are that close. For the bits every backend agrees
on, use lockstep (`lockstep sample`, `lockstep eval`). Weights use transformers' names and `(out, in)`
layout; `lockstep audit verify-export` rebuilds lockstep's tensors from them exactly and checks them.
"""


FRONT_MATTER = """---
library_name: transformers
pipeline_tag: text-generation
tags:
- lockstep
- auditable-training
---

"""
NAMES = ("transformers' (`model.layers.N.self_attn.q_proj.weight`, `(out, in)`; int8 layers add "
         "`weight_int8` and `weight_scale`); `config.json` holds the settings")


def make_hf_export(model: RunModel, tokenizer, identity: dict, out) -> Path:
    """Write the HF export of ``model`` (a verified checkpoint) to the new folder ``out``, all or nothing
    (``export.write_export``: the same proof as lockstep's layout, with ``"layout": "hf"``)."""
    tok = tokenizer_bytes(tokenizer, identity) if isinstance(tokenizer, HFTokenizer) else None
    metadata = {"format": "pt", "lockstep.format": "lockstep.export-hf", "lockstep.step": str(model.step),
                "lockstep.spec_version": model.spec_version}
    return write_export(model, out, hf_tensors(model.params, model.cfg), metadata,
                        hf_files(model.cfg, identity, tok), {"layout": LAYOUT},
                        lambda proof: model_card(model, proof, identity, names=NAMES,
                                                 loading=loading_section(model.cfg, identity),
                                                 front_matter=FRONT_MATTER))
