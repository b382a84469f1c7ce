"""``lockstep export``: a checkpoint's weights for others, with the proof that ties them to the run.

An export folder::

    model.safetensors   float32 parameters under their lockstep names (below), and for
                        every int8 W8A8 layer NAME also NAME.int8 (int8 codes, the
                        weights' shape) and NAME.scale (float32 per output channel):
                        what the model computed with
    config.json         the model config, the tokenizer, the layout of the names
    recipe.json         the run's recipe, as canonical JSON: its SHA-256 is recipe_sha256
    tokenizer.json      (Hugging Face tokenizers only) the run's tokenizer file
    proof.json          step, state root, chain hashes, every tensor digest of the
                        checkpoint's state, the files' SHA-256
    README.md           the model card: what it is, how it was trained, how to verify it

Names and layout: ``embed`` (V, D) (row = token), ``embed_norm.gain`` (D,),
``layers.NN.attn_norm.gain``, ``layers.NN.attn.wqkv`` (D, (H + 2G) Dh) (queries, then
keys, then values, head-major), ``layers.NN.attn.wo`` (H Dh, D),
``layers.NN.ffn_norm.gain``, ``layers.NN.ffn.w_gate_up`` (D, 2F) (gate, then up),
``layers.NN.ffn.w_down`` (F, D), ``final_norm.gain`` (D,), ``lm_head`` (D, V). A
linear layer computes ``y = x @ W`` (inputs along the first axis; PyTorch's
``nn.Linear.weight`` is the transpose).

Why the export can be trusted: each exported float32 tensor NAME is bit for bit the
checkpoint's ``param/NAME``, and its lockstep digest (``hashing.tensor_digest("param/"
+ NAME, x)``) is the one in the checkpoint's sidecar; those digests, with the AdamW
moments' and the step's, fold into the state root that the trajectory publishes at
that step, which the chain hash commits to (``H_t = chain_hash(t, H_{t-1}, root,
batch, tokens, loss bits, grad-norm bits, lr bits)``), up to the run's final commitment. ``verify_export`` checks every link it
can: alone (the export's own consistency: ``config.json`` is rebuilt from the recipe and
compared whole, ``tokenizer.json`` has the SHA-256 config.json names), and against the
run directory (the trajectory's chain recomputed from the recipe's genesis, the
commitment, the checkpoint's sidecar, and the tokenizer: config.json's is the one the
run's data manifest names, whose digest the recipe, and so the genesis, binds).
``proof.json``'s file digests are not signed: they only say which bytes were checked.
Every file is read once into memory, within a bound, and hashed, parsed and checked from
that buffer (``verify_export``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from lockstep.errors import Setting
from lockstep.formats.params import param_count, param_specs
from lockstep.formats.recipe import genesis
from lockstep.formats.rundir import RunFileError
from lockstep.formats.tokenizer import HFTokenizer, HF_TOKENIZER_FILE
from lockstep.formats.trajectory import Strictness, read_commitment, read_trajectory, record_value
from lockstep.fsio import atomic_write_bytes, atomic_writer, fsync_dir, json_bytes
from lockstep.fsio.safetensors import write_safetensors_to
from lockstep.spec.quant import quantize, weight_scale

from .run import RunModel, UseError

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
RECIPE_FILE = "recipe.json"
PROOF_FILE = "proof.json"
CARD_FILE = "README.md"
PROOF_FORMAT = "lockstep.export-proof"
CONFIG_FORMAT = "lockstep.export-config"
EXPORT_VERSION = 1
INT8_SUFFIX, SCALE_SUFFIX = ".int8", ".scale"
MAX_PROOF_BYTES = 4 << 20  # about 100 bytes per tensor digest (Open-1B: ~30 kB)
MAX_CONFIG_BYTES = 1 << 20  # a config is a few kB
MAX_TOKENIZER_BYTES = 64 << 20  # a tokenizer.json of a 128k vocabulary is ~10 MB
QUANTIZED = ("attn.wqkv", "attn.wo", "ffn.w_gate_up", "ffn.w_down")  # the int8 W8A8 layers of a block


def quantized_names(cfg) -> list[str]:
    """The parameters that run as int8 W8A8 layers (none when the recipe does not quantize)."""
    if not cfg.quantize:
        return []
    return [s.name for s in param_specs(cfg) if s.name.split(".", 2)[-1] in QUANTIZED]


def int8_codes(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The forward's int8 codes and per-output-channel scales of a weight (``spec.quant``)."""
    scale = weight_scale(w)
    return quantize(w, scale[None, :]), scale


def export_tensors(params: dict, cfg) -> dict[str, np.ndarray]:
    out = {name: np.ascontiguousarray(params[name], dtype=np.float32) for name in (s.name for s in param_specs(cfg))}
    for name in quantized_names(cfg):
        codes, scale = int8_codes(out[name])
        out[name + INT8_SUFFIX], out[name + SCALE_SUFFIX] = codes, scale
    return out


# what a chain link binds besides H_{t-1}, the state root and the batch (``hashing.chain_hash``)
LINK_FIELDS = ("tokens", "loss_bits", "grad_norm_bits", "lr_bits")


def _chain_facts(model: RunModel) -> dict:
    """The step's chain links from the trajectory, when the run has them."""
    traj = read_trajectory(model.run_dir, Strictness.LIVE)
    by_step = {r.get("step"): r for r in traj if isinstance(r, dict)}
    rec = by_step.get(model.step)
    if rec is None:
        return {}
    prev = genesis(model.recipe) if model.step == 1 else by_step.get(model.step - 1, {}).get("chain_hash")
    return {"batch_digest": rec.get("batch_digest"), "previous_chain_hash": prev,
            "training_loss": record_value(rec, "loss"),  # from the chained bits, never the decimal
            **{k: rec.get(k) for k in LINK_FIELDS}}


def _commitment(model: RunModel) -> dict | None:
    try:
        c = read_commitment(model.run_dir)
    except RunFileError:
        return None
    return {"last_step": c["last_step"], "chain_hash": c["chain_hash"]}


class _HashingWriter:
    """A binary file that hashes every byte written to it: the digest is of the bytes written, never of a
    second read of the file."""

    def __init__(self, f):
        self.f, self.h = f, hashlib.sha256()

    def write(self, data) -> int:
        self.h.update(data)
        return self.f.write(data)


def _write_file(path: Path, data: bytes) -> str:
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def make_export(model: RunModel, tokenizer, identity: dict, out: str | os.PathLike) -> Path:
    """Write the export of ``model`` (a verified checkpoint) to the new folder ``out`` in lockstep's layout
    (module docstring), all or nothing (``write_export``). The tokenizer file is read once from the data
    folder, checked against the manifest's digest and written from that same buffer."""
    files = {CONFIG_FILE: json_bytes(export_config(model.cfg, identity))}
    if isinstance(tokenizer, HFTokenizer):  # the file whose digest the manifest names
        files[HF_TOKENIZER_FILE] = tokenizer_bytes(tokenizer, identity)
    metadata = {"format": "lockstep.export", "step": str(model.step), "spec_version": model.spec_version}
    return write_export(model, out, export_tensors(model.params, model.cfg), metadata, files, {},
                        lambda proof: model_card(model, proof, identity))


def write_export(model: RunModel, out: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict,
                 files: dict[str, bytes], proof_extra: dict, card) -> Path:
    """Write an export of ``model`` to the new folder ``out``, all or nothing: ``model.safetensors`` of
    ``tensors`` (with ``metadata``), ``recipe.json``, the other ``files`` (name -> bytes), ``proof.json``
    (with ``proof_extra``'s keys) and the model card ``card(proof)``.

    Each file's SHA-256 in ``proof.json`` is of the bytes written (hashed as they are written). The files
    are written into a hidden staging folder beside ``out``, which is renamed into place when complete.
    """
    out = Path(out).absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UseError.naming(f"{out} already exists and is not an empty folder; choose a new ", Setting("out"))
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        os.chmod(staging, 0o755)  # mkdtemp makes 0700; an export is meant to be shared
        digests = {}
        with atomic_writer(staging / MODEL_FILE) as f:
            w = _HashingWriter(f)
            write_safetensors_to(w, tensors, metadata)
        digests[MODEL_FILE] = w.h.hexdigest()
        recipe_bytes = json_bytes(model.recipe)
        for name, data in {**files, RECIPE_FILE: recipe_bytes}.items():
            digests[name] = _write_file(staging / name, data)
        proof = {
            "format": PROOF_FORMAT, "version": EXPORT_VERSION,
            "step": model.step, "tokens": model.tokens, "spec_version": model.spec_version,
            "recipe_sha256": hashlib.sha256(recipe_bytes).hexdigest(),
            "manifest_sha256": model.recipe["data"]["manifest_sha256"],
            "genesis": genesis(model.recipe),
            "state_root": model.sidecar["state_root"], "chain_hash": model.sidecar["chain_hash"],
            **{k: v for k, v in _chain_facts(model).items() if k != "training_loss"},
            "commitment": _commitment(model),
            "tensor_digests": dict(sorted(model.sidecar["tensor_digests"].items())),
            "int8_layers": quantized_names(model.cfg),
            "files": dict(sorted(digests.items())),
            **proof_extra,
        }
        atomic_write_bytes(staging / PROOF_FILE, json_bytes(proof))
        atomic_write_bytes(staging / CARD_FILE, card(proof).encode("utf-8"))
        fsync_dir(staging)
        if out.exists():
            out.rmdir()  # empty (checked above); fails loudly if someone filled it meanwhile
        os.rename(staging, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def tokenizer_bytes(tokenizer: HFTokenizer, identity: dict) -> bytes:
    """The run's tokenizer file: the very bytes the tokenizer was built from and hashed (``HFTokenizer.data``,
    read once), which must have the manifest's SHA-256."""
    data = tokenizer.data
    if hashlib.sha256(data).hexdigest() != identity.get("sha256"):
        raise UseError(f"{tokenizer.path} is not the tokenizer the data manifest names (SHA-256 differs); "
                       "restore it and export again")
    return data


def export_config(cfg, tokenizer: dict) -> dict:
    """``config.json`` of an export of model ``cfg`` with the tokenizer ``tokenizer`` (the data manifest's
    identity): everything in it but the tokenizer follows from the recipe, so ``verify-export`` rebuilds
    it from the recipe and compares the whole."""
    return {
        "format": CONFIG_FORMAT, "version": EXPORT_VERSION,
        "model": cfg.to_dict(),
        "parameters": param_count(cfg),
        "tokenizer": tokenizer,
        "layout": {
            "linear": "y = x @ W, W of shape (in, out)",
            "attn.wqkv": "columns: H query heads, then G key heads, then G value heads, each head_dim wide",
            "ffn.w_gate_up": "columns: the F gate units, then the F up units; h = silu(gate) * up",
            "int8": "NAME.int8 (int8, W's shape) and NAME.scale (float32, out): W ~ NAME.int8 * NAME.scale; "
                    "activations quantized per tensor by max|x| / 127 at run time",
            "attention": "GQA, QK-norm without gain, RoPE theta rope_theta on half-split pairs; sliding window "
                         "sliding_window except every full_attention_every-th layer and the last",
        },
        "layers_with_full_attention": [i for i in range(cfg.n_layers) if cfg.is_full_attention(i)],
        "int8_layers": quantized_names(cfg),
    }


LOCKSTEP_NAMES = "see `config.json` (`layout`); a linear layer computes `y = x @ W`"
LOCKSTEP_LOADING = """## Loading

`model.safetensors` is a plain safetensors file (float32, int8): any safetensors reader
loads it; `lockstep.fsio.safetensors.read_safetensors` does without extra packages. To run the model
exactly as trained, use lockstep (`lockstep sample`, `lockstep eval`).
"""


def model_card(model: RunModel, proof: dict, tokenizer: dict, names: str = LOCKSTEP_NAMES,
               loading: str = LOCKSTEP_LOADING, front_matter: str = "") -> str:
    """The export's README.md; ``names``, ``loading`` and ``front_matter`` are what a layout says of itself."""
    cfg, t = model.cfg, model.tcfg
    run = model.run_dir.name
    # metrics.jsonl is not evidence (nothing binds it to the chain): the card states no validation loss it did not compute
    val = (f"- validation loss: `lockstep eval RUN_DIR --step {model.step}` computes it, the same bits on every "
           "backend\n")
    train_loss = _chain_facts(model).get("training_loss")
    quant = ("int8 W8A8 in every attention and feed-forward linear layer (weights per output channel, "
             "`2 mean|w| / sqrt(127)`; activations per tensor, `max|x| / 127`); the export holds the float32 "
             "weights and, for those layers, the int8 codes and scales the model computed with"
             if cfg.quantize else "float32 in every layer (the run did not quantize)")
    return front_matter + f"""# {run}, step {model.step}

A {cfg.name} decoder-only language model ({param_count(cfg):,} parameters) trained with
lockstep as an auditable run: every training step is published as a hash of the whole
training state, chained from the recipe to the final commitment, and can be replayed bit
for bit on other hardware.

## Model

- {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} query heads over {cfg.n_kv_heads} KV heads of
  {cfg.head_dim}, SwiGLU width {cfg.ffn_dim}, vocabulary {cfg.vocab_size}, context {cfg.seq_len}
- RMSNorm (eps {cfg.norm_eps}) on the embedding and before each block half; QK-norm without gain;
  RoPE theta {cfg.rope_theta:g}; sliding window {cfg.sliding_window} except layers
  {[i for i in range(cfg.n_layers) if cfg.is_full_attention(i)]} (fully causal); untied LM head; no biases
- {quant}
- tokenizer: `{tokenizer.get("kind")}` (end-of-document id {tokenizer.get("eod_id")}; a document starts after it)
- names and layout: {names}

## Training

- {proof["tokens"]:,} tokens in {model.step} steps; peak learning rate {t.peak_lr:g}, AdamW
  ({t.beta1}, {t.beta2}), weight decay {t.weight_decay}, z-loss {cfg.z_loss:g}
- data manifest SHA-256 `{proof["manifest_sha256"]}`; recipe SHA-256 `{proof["recipe_sha256"]}`
  (`recipe.json` here, whose SHA-256 is that value); SPEC_VERSION {proof["spec_version"]}
- training loss at this step: {f"{train_loss:.4f}" if isinstance(train_loss, (int, float)) else "not in the trajectory"}
{val}
## Proof

- state root at step {model.step}: `{proof["state_root"]}`
- chain hash at step {model.step}: `{proof["chain_hash"]}`
- run commitment: {f"`{proof['commitment']['chain_hash']}` (last step {proof['commitment']['last_step']})"
                   if proof.get("commitment") else "none published when exported"}

`proof.json` lists every tensor digest of the training state at this step (parameters,
AdamW moments, step counter), which fold into that state root. To check this export:

```sh
lockstep audit verify-export THIS_FOLDER             # the export alone: files, tensors, digests, state root
lockstep audit verify-export THIS_FOLDER RUN_DIR     # and against the run: the chain from the recipe's
                                                     # genesis through this step to the commitment, the
                                                     # tokenizer against the run's data manifest
lockstep audit replay RUN_DIR --step {model.step}          # replay the step that made these weights
```

{loading}"""
