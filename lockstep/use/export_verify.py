"""``lockstep audit verify-export EXPORT [RUN]``: an export checked alone, and against the run it came from.

Every file of the export is read once into private memory, within a bound the
recipe sets, and hashed, parsed and checked from that one buffer (``_read_once``).
Alone: the files are the proof's, the tensors are the proof's digests, ``config.json``
is the one the recipe gives. Against the run: the proof's chain facts are the run's
verified trajectory, its checkpoint's tensors are the export's, and the tokenizer is
the one the run's data manifest names. The layout of an export is ``lockstep.use.export``.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lockstep.formats import checkpoint as ckpt
from lockstep.formats.checkpoint import MAX_HEADER_BYTES
from lockstep.formats.config import ModelConfig
from lockstep.formats.params import param_specs
from lockstep.formats.recipe import genesis, recipe_configs, recipe_digest, recipe_value_problems
from lockstep.formats.run import Run
from lockstep.formats.rundir import HEX64, MAX_RECIPE_BYTES, RECIPE_FORMAT, RunFileError
from lockstep.formats.tokenizer import ByteTokenizer, HFTokenizer, HF_TOKENIZER_FILE
from lockstep.formats.trajectory import Strictness, read_commitment
from lockstep.fsio import FileFormatError, UnsafePath, json_bytes, open_regular, parse_json, printable
from lockstep.fsio.safetensors import parse_safetensors
from lockstep.spec import hashing

from . import export_hf
from .export import (CONFIG_FILE, EXPORT_VERSION, INT8_SUFFIX, LINK_FIELDS, MAX_CONFIG_BYTES, MAX_PROOF_BYTES,
                     MAX_TOKENIZER_BYTES, MODEL_FILE, PROOF_FILE, PROOF_FORMAT, RECIPE_FILE, SCALE_SUFFIX,
                     export_config, int8_codes, quantized_names)
from .run import UseError, run_manifest


# ---------------------------------------------------------------- verification

@dataclass
class ExportReport:
    folder: Path
    run: Path | None
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, bool(ok), detail))
        return ok

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)

    def format(self) -> str:
        """The report, one check a line; every line escaped (``fsio.printable``): names and values come from
        the export's own files, and none of them can start a line, move the cursor or colour the terminal."""
        lines = [f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else "") for name, ok, detail in self.checks]
        verdict = "VALID" if self.ok else "INVALID"
        against = f" against {self.run}" if self.run else " (alone; name the run directory to check the chain)"
        return "\n".join(printable(line) for line in lines + [f"{self.folder}: {verdict}{against}"])


def _read_once(folder: Path, name: str, what: str, max_bytes: int) -> bytearray:
    """The bytes of ``folder/name`` in private memory, read once: a regular file reached without symlinks, of at
    most ``max_bytes`` (a larger one is refused unread). Its digest, its parse and every check use this buffer,
    never a second read that the storage could answer differently."""
    with open_regular(folder, name, what, max_bytes) as f:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        got = f.readinto(buf)
        extra = f.read(1)
    if got != size or extra:
        raise FileFormatError(f"{what} {folder / name} changed size while being read")
    return buf


def model_bytes_bound(cfg) -> int:
    """The size of an export's ``model.safetensors`` of model ``cfg``, at most: a header of at most the
    checkpoint header bound, every float32 parameter, and the int8 codes and float32 scales of the int8 layers."""
    specs = {s.name: s.shape for s in param_specs(cfg)}
    data = sum(4 * math.prod(shape) for shape in specs.values())
    data += sum(math.prod(specs[n]) + 4 * specs[n][-1] for n in quantized_names(cfg))
    return 8 + MAX_HEADER_BYTES + data


EXPORT_JSON = {PROOF_FILE: ("export proof", MAX_PROOF_BYTES), CONFIG_FILE: ("export config", MAX_CONFIG_BYTES),
               RECIPE_FILE: ("export recipe", None)}


def _read_export(folder: Path) -> tuple[dict[str, bytearray], dict, dict, dict]:
    """The bytes of proof.json, config.json, recipe.json (each read once) and their strict JSON."""
    raw, out = {}, []
    for name, (what, cap) in EXPORT_JSON.items():
        try:
            raw[name] = _read_once(folder, name, what, cap or MAX_RECIPE_BYTES)
            obj = parse_json(raw[name], what, str(folder / name))
        except (FileNotFoundError, FileFormatError, UnsafePath, OSError) as exc:
            raise UseError(f"{folder} is not a readable lockstep export: {exc}") from None
        if not isinstance(obj, dict):
            raise UseError(f"{folder / name}: must hold a JSON object")
        out.append(obj)
    proof, config, recipe = out
    if proof.get("format") != PROOF_FORMAT or proof.get("version") != EXPORT_VERSION:
        raise UseError(f"{folder / PROOF_FILE}: not a {PROOF_FORMAT} version {EXPORT_VERSION}")
    for key in ("step", "tensor_digests", "files", "state_root", "chain_hash", "recipe_sha256", "genesis"):
        if key not in proof:
            raise UseError(f"{folder / PROOF_FILE}: key {key!r} missing")
    if not all(isinstance(proof[k], dict) and all(isinstance(v, str) for v in proof[k].values())
               for k in ("tensor_digests", "files")):
        raise UseError(f"{folder / PROOF_FILE}: tensor_digests and files must be objects of strings")
    if type(proof["step"]) is not int or proof["step"] < 1:
        raise UseError(f"{folder / PROOF_FILE}: step must be an integer >= 1, got {proof['step']!r}")
    return raw, proof, config, recipe


def recipe_problem(recipe: dict) -> str | None:
    """Why a recipe from an export cannot be used (None when it can): the checks of ``recipe.load_recipe``,
    its stated maxima (``recipe_value_problems``) among them, before anything is sized by its numbers."""
    if recipe.get("format") != RECIPE_FORMAT:
        return f"not a lockstep recipe (format must be {RECIPE_FORMAT!r})"
    missing = [k for k in ("model", "train", "data", "seed", "micro_batch", "spec_version") if k not in recipe]
    if missing:
        return f"key {missing[0]!r} missing"
    data = recipe["data"]
    if not (isinstance(data, dict) and isinstance(data.get("folder"), str)
            and isinstance(data.get("manifest_sha256"), str) and HEX64.fullmatch(data["manifest_sha256"])):
        return "'data' must hold a folder and a 64-digit manifest_sha256"
    if not isinstance(recipe["spec_version"], str):
        return "spec_version must be a string"
    bad = recipe_value_problems(recipe)
    if bad:
        return "; ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")
    try:
        recipe_configs(recipe)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        return f"bad model/train settings: {exc}"
    return None


def _tokenizer_problem(identity, tokenizer_file: bytearray | None) -> str | None:
    """Why config.json's tokenizer is not the one this export holds (None when it is)."""
    if not isinstance(identity, dict):
        return "config.json names no tokenizer object"
    if identity.get("kind") == ByteTokenizer.kind:
        if identity != ByteTokenizer().identity():
            return f"a byte tokenizer is {ByteTokenizer().identity()}"
        return f"a byte tokenizer needs no {HF_TOKENIZER_FILE}, but the export has one" if tokenizer_file else None
    if identity.get("kind") == HFTokenizer.kind:
        if tokenizer_file is None:
            return f"config.json names a {HFTokenizer.kind} tokenizer, but the export has no readable {HF_TOKENIZER_FILE}"
        got = hashlib.sha256(tokenizer_file).hexdigest()
        if identity.get("file") != HF_TOKENIZER_FILE or identity.get("sha256") != got:
            return f"{HF_TOKENIZER_FILE} has SHA-256 {got}, config.json says {identity.get('sha256')!r}"
        return None
    return f"unknown tokenizer kind {identity.get('kind')!r}"


def _layout_files(layout: str, identity, cfg, tokenizer_file: bytearray | None) -> dict[str, bytes]:
    """The files besides the weights and the recipe that an export of ``layout`` holds, as this lockstep writes
    them, by name (lockstep's layout: none are rebuilt here, its config.json is compared as JSON)."""
    if layout != export_hf.LAYOUT:
        return {}
    tok = bytes(tokenizer_file) if isinstance(identity, dict) and identity.get("kind") == HFTokenizer.kind \
        and tokenizer_file is not None else None
    try:
        return export_hf.hf_files(cfg, identity, tok)
    except (KeyError, TypeError, ValueError, RecursionError):  # an identity without its fields: nothing matches
        return {}


def _hf_tokenizer_problem(identity, tokenizer_file: bytearray | None) -> str | None:
    """Why an HF export's tokenizer.json is not config.json's tokenizer (None when it is)."""
    if isinstance(identity, dict) and identity.get("kind") == ByteTokenizer.kind:
        if identity != ByteTokenizer().identity():
            return f"a byte tokenizer is {ByteTokenizer().identity()}"
        if tokenizer_file is None or bytes(tokenizer_file) != export_hf.byte_tokenizer_json():
            return f"{HF_TOKENIZER_FILE} is not the byte tokenizer's (byte b -> id b) that lockstep writes"
        return None
    return _tokenizer_problem(identity, tokenizer_file)


def verify_export(folder: str | os.PathLike, run: str | os.PathLike | None = None,
                  data: str | os.PathLike | None = None) -> ExportReport:
    """Check an export alone and, with ``run``, against the run directory (module docstring).

    Every export file is read once into memory (``_read_once``), within a bound: the JSON files within
    small stated maxima, ``model.safetensors`` within ``model_bytes_bound`` of the recipe's model (checked
    against the recipe's stated maxima first); its SHA-256, its parse and its checks all use that buffer.
    ``data`` is the run's data folder (``--data DIR``) when it is not inside the run: its manifest names
    the run's tokenizer. An export of the Hugging Face layout (``export_hf``; proof.json's ``layout``) is
    checked the same way, its other files compared byte for byte with the ones this lockstep writes (the
    model code among them), and its tensors are first rebuilt into lockstep's (``export_hf.lockstep_tensors``).
    """
    folder = Path(folder)
    rep = ExportReport(folder, Path(run) if run is not None else None)
    raw, proof, config, recipe = _read_export(folder)
    step = proof["step"]
    layout = proof.get("layout", "lockstep")
    if layout not in ("lockstep", export_hf.LAYOUT):
        rep.add("the proof's layout", False, f"unknown layout {layout!r} (lockstep knows 'lockstep' and 'hf')")
        return rep
    hf = layout == export_hf.LAYOUT
    problem = recipe_problem(recipe)
    if problem:  # nothing is sized by a recipe beyond the stated maxima
        rep.add("the recipe's model settings", False, problem)
        return rep
    cfg = ModelConfig.from_dict(recipe["model"])
    unread: dict[str, str] = {}
    if hf:  # the tokenizer identity: under "lockstep" in an HF config.json
        meta = config.get("lockstep")
        identity = meta.get("tokenizer") if isinstance(meta, dict) else None
    else:
        identity = config.get("tokenizer")
    wanted = [(MODEL_FILE, "exported weights", model_bytes_bound(cfg))]
    if hf:
        wanted += [(HF_TOKENIZER_FILE, "exported tokenizer", MAX_TOKENIZER_BYTES)]
        wanted += [(name, "exported file", MAX_CONFIG_BYTES) for name in
                   (export_hf.GENERATION_FILE, export_hf.TOKENIZER_CONFIG_FILE, *export_hf.CODE_FILES)]
    elif HF_TOKENIZER_FILE in proof["files"] or (isinstance(identity, dict) and identity.get("kind") == HFTokenizer.kind):
        wanted.append((HF_TOKENIZER_FILE, "exported tokenizer", MAX_TOKENIZER_BYTES))
    for name, what, cap in wanted:
        try:
            raw[name] = _read_once(folder, name, what, cap)
        except FileNotFoundError:
            unread[name] = "missing"
        except (FileFormatError, UnsafePath, OSError) as exc:
            unread[name] = f"refused ({exc})"
    # 1. files: the proof lists exactly the export's files, each with the SHA-256 of the bytes read
    expected = {MODEL_FILE, CONFIG_FILE, RECIPE_FILE} | {name for name, _, _ in wanted}
    odd = sorted(set(proof["files"]) ^ expected)
    rep.add("proof.json lists the export's files", not odd, f"unexpected or missing: {odd[:5]}" if odd else "")
    for name, want in sorted(proof["files"].items()):
        buf = raw.get(name)
        got = hashlib.sha256(buf).hexdigest() if buf is not None and name in expected else unread.get(name, "not read")
        rep.add(f"file {name}", got == want, "" if got == want else f"sha256 {got}, proof says {want}")
    # 2. recipe, config and tokenizer
    rep.add("recipe.json is the proof's recipe", recipe_digest(recipe) == proof["recipe_sha256"])
    rep.add("genesis H_0 from the recipe", genesis(recipe) == proof["genesis"])
    rep.add("the proof's data manifest is the recipe's", proof.get("manifest_sha256") == recipe["data"]["manifest_sha256"])
    if hf:
        mine = _layout_files(layout, identity, cfg, raw.get(HF_TOKENIZER_FILE))
        for name in (CONFIG_FILE, export_hf.GENERATION_FILE, export_hf.TOKENIZER_CONFIG_FILE):
            rep.add(f"{name} is the one the recipe and the tokenizer give (the whole file)",
                    name in mine and raw.get(name) is not None and bytes(raw[name]) == mine[name],
                    unread.get(name, ""))
        shipped = export_hf.code_files()
        for name in export_hf.CODE_FILES:
            same = raw.get(name) is not None and bytes(raw[name]) == shipped[name]
            rep.add(f"{name} is the model code this lockstep ships (byte for byte)", same,
                    "" if same else unread.get(name, "") or "trust_remote_code runs it: do not load this export")
        why = _hf_tokenizer_problem(identity, raw.get(HF_TOKENIZER_FILE))
    else:
        try:  # compared as canonical JSON (sorted keys): the whole file, every field
            same_config = json_bytes(config) == json_bytes(export_config(cfg, identity))
        except (ValueError, TypeError, RecursionError):  # a config nested too deep to write back
            same_config = False
        rep.add("config.json is the recipe's model, layout and parameter count (the whole file)", same_config)
        why = _tokenizer_problem(identity, raw.get(HF_TOKENIZER_FILE))
    rep.add("config.json's tokenizer is the export's", why is None, why or "")
    # 3. tensors
    if MODEL_FILE not in raw:
        rep.add(MODEL_FILE, False, unread.get(MODEL_FILE, "not read"))
        return rep
    try:
        tensors, metadata = parse_safetensors(raw[MODEL_FILE], str(folder / MODEL_FILE), MAX_HEADER_BYTES)
    except FileFormatError as exc:
        rep.add(MODEL_FILE, False, str(exc))
        return rep
    if hf:
        layout_of = export_hf.hf_tensor_layout(cfg)
        wrong = sorted(n for n, (dt, shape) in layout_of.items()
                       if n not in tensors or tensors[n].dtype != dt or tuple(tensors[n].shape) != shape)
        rep.add("every tensor present under transformers' name, its dtype and (out, in) shape", not wrong,
                f"missing or wrong: {wrong[:5]}" if wrong else "")
        extra = sorted(set(tensors) - set(layout_of))
        rep.add("no other tensors", not extra, f"unexpected: {extra[:5]}" if extra else "")
        rep.add("safetensors metadata format 'pt' (transformers requires it)", metadata.get("format") == "pt")
        tensors = export_hf.lockstep_tensors(tensors, cfg)  # exact: transposes and joins, no arithmetic
    digests = proof["tensor_digests"]
    bad, missing = [], []
    for s in param_specs(cfg):
        x = tensors.get(s.name)
        if x is None or x.dtype != np.float32 or tuple(x.shape) != s.shape:
            missing.append(s.name)
        elif hashing.tensor_digest("param/" + s.name, x).hex() != digests.get("param/" + s.name):
            bad.append(s.name)
    rep.add("every parameter present, float32, its shape", not missing, f"missing or wrong: {missing[:5]}" if missing else "")
    rep.add("every parameter's digest is the checkpoint's", not bad, f"differ: {bad[:5]}" if bad else "")
    qbad = []
    for name in quantized_names(cfg):
        codes, scale = tensors.get(name + INT8_SUFFIX), tensors.get(name + SCALE_SUFFIX)
        if name in missing or codes is None or scale is None:
            qbad.append(name)
            continue
        want_codes, want_scale = int8_codes(tensors[name])
        if not (codes.dtype == np.int8 and np.array_equal(codes, want_codes)
                and scale.dtype == np.float32 and np.array_equal(scale.view(np.uint32), want_scale.view(np.uint32))):
            qbad.append(name)
    rep.add("int8 codes and scales are the forward's (spec.quant)", not qbad, f"differ: {qbad[:5]}" if qbad else "")
    if not hf:
        expected = {s.name for s in param_specs(cfg)} | {n + sfx for n in quantized_names(cfg) for sfx in (INT8_SUFFIX, SCALE_SUFFIX)}
        extra = sorted(set(tensors) - expected)
        rep.add("no other tensors", not extra, f"unexpected: {extra[:5]}" if extra else "")
    # 4. digests -> state root -> chain link
    try:
        root = hashing.state_root_from_digests(digests)
    except (ValueError, TypeError) as exc:
        root = f"invalid ({exc})"
    rep.add("state root from the tensor digests", root == proof["state_root"])
    if proof.get("previous_chain_hash") and proof.get("batch_digest"):
        try:
            link = hashing.chain_hash(step, proof["previous_chain_hash"], proof["state_root"], proof["batch_digest"],
                                      *(proof.get(k) for k in LINK_FIELDS))
        except (ValueError, TypeError) as exc:
            link = f"invalid ({exc})"
        rep.add(f"chain hash H_{step} from H_{step - 1}, the state root, the batch, the tokens and the bits of "
                "loss, grad norm and lr", link == proof["chain_hash"])
    if run is not None:
        _against_run(rep, Path(run), proof, identity, data)
    return rep


def run_tokenizer_identity(run: Path, recipe: dict, data: str | os.PathLike | None) -> dict:
    """The tokenizer identity in the run's data manifest (``run.run_manifest``: read once, its SHA-256 the
    recipe's). No shard or tokenizer file is read."""
    return run_manifest(run, recipe, data)[1]["tokenizer"]


def _against_run(rep: ExportReport, run: Path, proof: dict, identity, data) -> None:
    """The chain from the run's recipe through the export's step to the run's commitment."""
    step = proof["step"]
    try:
        opened = Run.open(run, Strictness.AUDIT).require("recipe", "trajectory")
        recipe, traj = opened.recipe, opened.trajectory
    except RunFileError as exc:
        rep.add("the run directory", False, str(exc))
        return
    rep.add("the run's recipe is the export's", recipe_digest(recipe) == proof["recipe_sha256"])
    try:  # the tokenizer: config.json's (and so tokenizer.json, by its SHA-256) must be the run's data manifest's
        rep.add("config.json's tokenizer is the run's data manifest's", identity == run_tokenizer_identity(run, recipe, data))
    except UseError as exc:
        rep.add("the run's data manifest (its tokenizer)", False, str(exc))
    broken = opened.chain_breaks[0] if opened.chain_breaks else None
    rep.add("the run's chain, recomputed from the genesis", broken is None,
            f"breaks at step {broken}" if broken else f"{len(traj)} steps")
    rec = traj[step - 1] if 1 <= step <= len(traj) else None
    rep.add(f"step {step} in the run's trajectory: same state root and chain hash",
            rec is not None and rec["state_root"] == proof["state_root"] and rec["chain_hash"] == proof["chain_hash"],
            "" if rec is not None else f"the trajectory has {len(traj)} steps")
    try:
        c = read_commitment(run)
        rep.add("the run's commitment is its last chain hash", bool(traj) and c["chain_hash"] == traj[-1]["chain_hash"]
                and c["last_step"] == len(traj), f"last step {c['last_step']}")
        if proof.get("commitment"):
            rep.add("the export names the run's commitment", proof["commitment"] == {"last_step": c["last_step"],
                                                                                     "chain_hash": c["chain_hash"]})
    except RunFileError as exc:
        rep.add("the run's commitment", False, str(exc))
    try:
        found = dict(ckpt.list_checkpoints(run))
    except (UnsafePath, OSError):
        found = {}
    if step in found:
        try:
            c = ckpt.load_checkpoint(found[step], max_bytes=ckpt.state_bytes_bound(recipe_configs(recipe)[0]))
            same = c.sidecar.get("tensor_digests") == proof["tensor_digests"]
            rep.add(f"checkpoint {step} of the run (verified) has the export's tensor digests", same)
        except ckpt.CheckpointError as exc:
            rep.add(f"checkpoint {step} of the run", False, str(exc))
