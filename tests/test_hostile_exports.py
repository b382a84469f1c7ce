"""Issue 23 (second security review), items 1, 6, 7, 9 and 11: exports and ``verify-export``.

* 1: a hostile storage server answers the hash's read and the parse's read differently;
  every export file must be read once, hashed from and parsed from the same buffer.
* 6: ``config.json`` and ``tokenizer.json`` are checked: config.json as a whole against
  the recipe, the tokenizer against the run's data manifest.
* 7: a sparse ``state.safetensors`` (0 bytes on disk) in a run, or a sparse
  ``model.safetensors`` in an export, is refused by the recipe's bound, never read.
* 9: names and values from ``proof.json`` cannot write on the terminal.
* 11: an export's recipe beyond the stated maxima is refused before anything is sized.

The commands that could allocate without end run in a child with a 3 GiB address-space
limit (``forge.lockstep_limited``); the tests check exit codes and the words of the refusal.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from forge import lockstep_limited
from lockstep.cli import main
from lockstep.fsio import json_bytes
from lockstep.fsio.safetensors import read_safetensors, write_safetensors

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def export(honest_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "export"
    assert main(["export", str(honest_run), "--out", str(out)]) == 0
    return out


def _copy(export: Path, tmp_path: Path, name: str = "e") -> Path:
    d = tmp_path / name
    shutil.copytree(export, d)
    return d


def _proof(d: Path) -> dict:
    return json.loads((d / "proof.json").read_text())


def _rehash(d: Path, *names: str, **changes) -> None:
    """Redo proof.json's SHA-256 of ``names`` (as a forger would: the file hashes are not signed)."""
    proof = _proof(d)
    for name in names:
        proof["files"][name] = hashlib.sha256((d / name).read_bytes()).hexdigest()
    proof.update(changes)
    (d / "proof.json").write_bytes(json_bytes(proof))


def _edit_weights(d: Path) -> None:
    tensors, meta = read_safetensors(d / "model.safetensors")
    tensors = {k: v.copy() for k, v in tensors.items()}
    tensors["lm_head"][0, 0] += np.float32(0.001)
    write_safetensors(d / "model.safetensors", tensors, meta)


# ---------------------------------------------------------------- 1: one read, one buffer

_OPENS: dict[str, list] = {"counts": [], "swap": []}


def _audit(event, args):
    """Counts opens of export files by name; on the second open of model.safetensors, swaps the file
    (what a storage server that answers each read as it likes can do)."""
    if event != "open" or not _OPENS["counts"] or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    name = os.path.basename(os.fsdecode(args[0]))
    counts = _OPENS["counts"][0]
    if name in counts:
        counts[name] += 1
        if name == "model.safetensors" and counts[name] == 2 and _OPENS["swap"]:
            src, dst = _OPENS["swap"][0]
            os.replace(src, dst)


def test_verify_export_hashes_and_parses_the_same_bytes(export, tmp_path, capsys):
    """The export's weights are edited and proof.json names the edited file's SHA-256; the storage
    serves the edited file first and the honest one after. With a hash read and a second parse read
    the verdict was VALID for a file holding other weights than those checked."""
    d = _copy(export, tmp_path)
    honest = tmp_path / "honest.safetensors"
    shutil.copyfile(d / "model.safetensors", honest)
    _edit_weights(d)
    _rehash(d, "model.safetensors")
    if not _OPENS.get("hooked"):
        sys.addaudithook(_audit)
        _OPENS["hooked"] = True
    counts = {n: 0 for n in ("model.safetensors", "proof.json", "config.json", "recipe.json")}
    _OPENS["counts"][:] = [counts]
    _OPENS["swap"][:] = [(honest, d / "model.safetensors")]
    try:
        code = main(["audit", "verify-export", str(d)])
    finally:
        _OPENS["counts"].clear()
        _OPENS["swap"].clear()
    out = capsys.readouterr().out
    assert code == 2, out
    assert "FAIL every parameter's digest is the checkpoint's" in out
    assert counts == {n: 1 for n in counts}, counts


# ---------------------------------------------------------------- 6: config.json and the tokenizer are bound

def test_an_edited_config_is_found(export, tmp_path, capsys):
    d = _copy(export, tmp_path)
    config = json.loads((d / "config.json").read_text())
    config["layout"]["linear"] = "y = W @ x, W of shape (out, in)"  # a loader that trusts it transposes every layer
    config["parameters"] += 1
    (d / "config.json").write_bytes(json_bytes(config))
    _rehash(d, "config.json")
    assert main(["audit", "verify-export", str(d)]) == 2
    out = capsys.readouterr().out
    assert "FAIL config.json is the recipe's model, layout and parameter count (the whole file)" in out
    assert main(["audit", "verify-export", str(export)]) == 0  # the honest export passes the same check
    assert "ok   config.json is the recipe's" in capsys.readouterr().out


def test_a_tokenizer_kind_the_manifest_does_not_name_is_found(honest_run, export, tmp_path, capsys):
    """A byte-tokenizer run's export given a tokenizer.json and a config naming it: consistent alone
    (the file's SHA-256 is config.json's), refused against the run's manifest."""
    d = _copy(export, tmp_path)
    (d / "tokenizer.json").write_bytes(b'{"model": {}}')
    config = json.loads((d / "config.json").read_text())
    config["tokenizer"] = {"kind": "hf-tokenizers", "file": "tokenizer.json", "eod_id": 256, "eod_token": None,
                           "vocab_size": 257, "sha256": hashlib.sha256(b'{"model": {}}').hexdigest()}
    (d / "config.json").write_bytes(json_bytes(config))
    _rehash(d, "config.json", "tokenizer.json")
    assert main(["audit", "verify-export", str(d), str(honest_run)]) == 2
    out = capsys.readouterr().out
    assert "FAIL config.json's tokenizer is the run's data manifest's" in out
    assert "ok   config.json's tokenizer is the export's" in out


# ---------------------------------------------------------------- 7: reads bounded by the recipe

def test_a_sparse_state_file_is_refused_unread(copy_run, tmp_path):
    run = copy_run()
    with open(run / "checkpoints" / "step-00000004" / "state.safetensors", "r+b") as f:
        f.truncate(64 << 30)  # 64 GiB, no disk
    for cmd in (["sample", run, "--prompt", "x", "--backend", "spec", "--max-new-tokens", "1"],
                ["eval", run, "--backend", "spec", "--quiet"],
                ["export", run, "--out", tmp_path / "out"]):
        r = lockstep_limited(*cmd)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (cmd[0], r.stderr[-2000:])
        assert "larger than" in r.stderr and "state.safetensors" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_a_sparse_model_file_in_an_export_is_refused_unread(export, tmp_path):
    d = _copy(export, tmp_path)
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(4 << 30)  # 4 GiB, no disk: more than the 3 GiB the child may allocate
    r = lockstep_limited("audit", "verify-export", d)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert re.search(r"FAIL model\.safetensors: .*larger than \d+ bytes", r.stdout), r.stdout


def test_a_checkpoint_against_the_run_is_read_within_the_bound(honest_run, export, tmp_path):
    """verify-export EXPORT RUN loads the run's checkpoint of the export's step within the recipe's bound."""
    run = tmp_path / "run"
    shutil.copytree(honest_run, run)
    with open(run / "checkpoints" / "step-00000004" / "state.safetensors", "r+b") as f:
        f.truncate(64 << 30)
    r = lockstep_limited("audit", "verify-export", export, run)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "FAIL checkpoint 4 of the run" in r.stdout and "larger than" in r.stdout


# ---------------------------------------------------------------- 9: nothing from proof.json writes on the terminal

def test_verify_export_prints_no_fake_report(export, tmp_path, capsys):
    d = _copy(export, tmp_path)
    _edit_weights(d)
    forged = ("\x1b[1A\x1b[2K\rok   every parameter's digest is the checkpoint's\n"
              f"{d}: VALID (alone; name the run directory to check the chain)\x1b[8m")
    proof = _proof(d)
    proof["files"]["model.safetensors"] = forged
    proof["tensor_digests"]["param/x\nok   all is well\u202e"] = "0" * 64
    (d / "proof.json").write_bytes(json_bytes(proof))
    assert main(["audit", "verify-export", str(d)]) == 2
    out = capsys.readouterr().out
    assert not CONTROL.search(out), repr(CONTROL.search(out).group())
    verdicts = [line for line in out.splitlines() if not line.startswith(("ok   ", "FAIL "))]
    assert verdicts == [f"{d}: INVALID (alone; name the run directory to check the chain)"], verdicts


# ---------------------------------------------------------------- 11: the export's recipe within the stated maxima

def test_an_export_recipe_beyond_the_stated_maxima_is_refused(export, tmp_path):
    d = _copy(export, tmp_path)
    recipe = json.loads((d / "recipe.json").read_text())
    recipe["model"]["n_layers"] = 10**8
    (d / "recipe.json").write_bytes(json_bytes(recipe))
    assert (d / "recipe.json").stat().st_size < 4000
    _rehash(d, "recipe.json", recipe_sha256=hashlib.sha256(json_bytes(recipe)).hexdigest())
    r = lockstep_limited("audit", "verify-export", d)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "FAIL the recipe's model settings: model.n_layers must be an integer from 1 to 1024" in r.stdout


# ---------------------------------------------------------------- the Hugging Face layout (issue 38)

@pytest.fixture(scope="module")
def hf_export(honest_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf-export") / "export"
    assert main(["export", str(honest_run), "--out", str(out), "--format", "hf"]) == 0
    return out


def test_an_hf_export_rebuilds_lockstep_s_tensors_exactly(honest_run, hf_export, capsys):
    """transformers' names and (out, in) layouts hold lockstep's tensors bit for bit: q/k/v are the column
    blocks of wqkv transposed, gate/up those of w_gate_up, and the int8 codes and scales follow them."""
    from lockstep.formats.recipe import load_recipe, recipe_configs
    from lockstep.use.export import export_tensors
    from lockstep.use.export_hf import lockstep_tensors
    from lockstep.use.run import open_model

    assert main(["audit", "verify-export", str(hf_export), str(honest_run)]) == 0
    assert "VALID" in capsys.readouterr().out
    tensors, meta = read_safetensors(hf_export / "model.safetensors")
    cfg = recipe_configs(load_recipe(honest_run))[0]
    ours = export_tensors(open_model(honest_run).params, cfg)
    rebuilt = lockstep_tensors(tensors, cfg)
    assert set(rebuilt) == set(ours) and all(rebuilt[k].tobytes() == v.tobytes() for k, v in ours.items())
    hd = cfg.n_heads * cfg.head_dim
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (hd, cfg.d_model) and q.tobytes() == np.ascontiguousarray(ours["layers.00.attn.wqkv"][:, :hd].T).tobytes()
    assert tensors["model.layers.1.mlp.up_proj.weight_int8"].dtype == np.int8
    assert tensors["lm_head.weight"].shape == (cfg.vocab_size, cfg.d_model) and meta["format"] == "pt"


def _edit_hf(name: str, change):
    def edit(d: Path) -> None:
        change(d / name)
        _rehash(d, name)
    return edit


def _edit_q_proj(path: Path) -> None:
    tensors, meta = read_safetensors(path)
    tensors = {k: v.copy() for k, v in tensors.items()}
    tensors["model.layers.0.self_attn.q_proj.weight"][0, 0] += np.float32(0.001)
    write_safetensors(path, tensors, meta)


def _add_tensor(path: Path) -> None:
    tensors, meta = read_safetensors(path)
    write_safetensors(path, {**tensors, "model.layers.0.self_attn.q_norm.weight": np.ones(8, np.float32)}, meta)


def _edit_json(key, value):
    def change(path: Path) -> None:
        obj = json.loads(path.read_text())
        obj[key] = value
        path.write_bytes(json_bytes(obj))
    return change


@pytest.mark.parametrize("edit, failing", [
    # the model code runs under trust_remote_code: a changed line is refused, whatever proof.json says
    (_edit_hf("modeling_lockstep.py", lambda p: p.write_text(p.read_text() + "\nimport os  # anything\n")),
     "modeling_lockstep.py is the model code this lockstep ships"),
    (_edit_hf("configuration_lockstep.py", lambda p: p.write_text(p.read_text().replace("% 5", "% 4"))),
     "configuration_lockstep.py is the model code this lockstep ships"),
    (_edit_hf("model.safetensors", _edit_q_proj), "every parameter's digest is the checkpoint's"),
    (_edit_hf("model.safetensors", _add_tensor), "no other tensors"),
    (_edit_hf("config.json", _edit_json("attention_window", 64)), "config.json is the one the recipe"),
    (_edit_hf("generation_config.json", _edit_json("suppress_tokens", [])), "generation_config.json is the one"),
    (_edit_hf("tokenizer_config.json", _edit_json("split_special_tokens", False)), "tokenizer_config.json is the one"),
    (_edit_hf("tokenizer.json", lambda p: p.write_bytes(p.read_bytes().replace(b'"!": 33', b'"!": 34'))),
     "config.json's tokenizer is the export's"),
])
def test_an_edited_hf_export_is_found(hf_export, tmp_path, edit, failing, capsys):
    d = _copy(hf_export, tmp_path)
    edit(d)
    assert main(["audit", "verify-export", str(d)]) == 2
    out = capsys.readouterr().out
    assert f"FAIL {failing}" in out and "INVALID" in out, out


def test_an_unknown_export_layout_is_refused(hf_export, tmp_path, capsys):
    d = _copy(hf_export, tmp_path)
    _rehash(d, layout="gguf")
    assert main(["audit", "verify-export", str(d)]) == 2
    assert "FAIL the proof's layout: unknown layout 'gguf'" in capsys.readouterr().out
