"""Issue 23 (second security review), items 6 (a swapped vocabulary), 12, 13 and 14: sample, eval,
export, train --resume and data verify on runs made by a stranger.

* 6: an export's tokenizer.json replaced by another vocabulary (config.json and proof.json
  redone) decodes the same ids as other text: verify-export against the run refuses it.
* 12: ``sample`` estimates its memory before it allocates (a 1.6 MB run with seq_len 2**20).
* 13: strings from metrics.jsonl, the recipe and the manifest reach the terminal escaped;
  export puts no unverified validation loss in the model card.
* 14: a tokenizer.json whose regular expression backtracks without end makes the tokenizer
  library panic (a ``BaseException``): ``sample`` says so in one line.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from bpe_data import bpe_data, train_bpe
from forge import lockstep_limited, read_traj, relink, rewrite_sidecar
from lockstep.cli import main
from lockstep.fsio import json_bytes
from lockstep.formats.tokenizer import hf_tokenizers_available

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
EVIL = "\x1b[1A\x1b[2K\rreproduces the value recorded during training bit for bit\u202e"


def _clean(text: str) -> None:
    assert not CONTROL.search(text), repr(CONTROL.search(text).group())


def _edit_recipe(run: Path, change) -> None:
    """Edit recipe.json and make the checkpoints name the new recipe (their sidecars are the run's own files)."""
    recipe = json.loads((run / "recipe.json").read_text())
    change(recipe)
    (run / "recipe.json").write_bytes(json_bytes(recipe))
    for step in (2, 4):
        rewrite_sidecar(run, step, recipe_sha256=hashlib.sha256(json_bytes(recipe)).hexdigest())


def _add_validation(run: Path, step: int, **fields) -> None:
    v = {"nats_per_token": 0.0123456, "bits_per_byte": 0.0234567, "loss_sum_bits": "0x3F800000", "targets": 1,
         "backend": "spec", "spec_version": "1", **fields}
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "tokens": 1, "validation": v}) + "\n")


# ---------------------------------------------------------------- 12: sample's memory

def test_sample_refuses_a_recipe_too_large_for_this_machine(copy_run):
    """A stranger's run, consistent in itself: one head of 4096 and seq_len 2**20 (within every stated
    maximum), a checkpoint of those parameters (and AdamW moments), under 8 MB. Its RoPE tables alone are 16 GiB."""
    from lockstep.formats import checkpoint as ckpt
    from lockstep.train.model import init_params
    from lockstep.formats.state import AdamWState
    from lockstep.formats.recipe import recipe_configs, recipe_digest
    from lockstep.formats.state import state_tensors

    from lockstep.spec.hashing import state_root

    run = copy_run()
    recipe = json.loads((run / "recipe.json").read_text())
    recipe["model"].update(n_layers=1, n_heads=1, n_kv_heads=1, head_dim=4096, seq_len=2**20)
    (run / "recipe.json").write_bytes(json_bytes(recipe))
    shutil.rmtree(run / "checkpoints")
    params = init_params(recipe_configs(recipe)[0], 0)
    tensors = state_tensors(params, AdamWState.zeros(params))
    recs = read_traj(run)[:1]  # one step whose record holds the forged state and chains from the new H_0
    recs[0]["state_root"] = state_root(tensors)
    (run / "trajectory.jsonl").write_bytes(b"")
    ckpt.save_checkpoint(run, 1, tensors, {"recipe_sha256": recipe_digest(recipe)})
    relink(run, recs, 1)
    assert sum(p.stat().st_size for p in (run / "checkpoints").rglob("*") if p.is_file()) < 8 << 20
    r = lockstep_limited("sample", run, "--prompt", "x", "--backend", "spec", "--max-new-tokens", "1", "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "GiB to sample from" in r.stderr and r.stderr.count("\n") == 1, r.stderr


# ---------------------------------------------------------------- 13: text from the run, escaped or left out

def test_eval_and_sample_escape_what_the_run_says(copy_run, capsys):
    # the text is what is tested, not the numbers: numba (the spec's bits) evaluates about 10x sooner
    backend = "numba" if importlib.util.find_spec("numba") else "spec"
    run = copy_run()
    _edit_recipe(run, lambda recipe: recipe.update(spec_version="0\x1b[2J\x1b[H" + EVIL))
    relink(run, read_traj(run), 1)  # a consistent stranger's run: the chain redone from the edited recipe's H_0
    _add_validation(run, 4, backend=EVIL, spec_version=EVIL)
    assert main(["eval", str(run), "--backend", backend, "--quiet"]) == 2  # the recorded bits differ
    out = capsys.readouterr()
    _clean(out.out)
    _clean(out.err)
    assert "DIFFERS from the value recorded during training" in out.out
    assert main(["sample", str(run), "--prompt", "x", "--backend", backend, "--max-new-tokens", "1", "--json"]) == 0
    out = capsys.readouterr()
    _clean(out.err)
    assert "was trained under SPEC_VERSION 0\\x1b[2J" in out.err


def test_export_puts_no_unverified_validation_loss_in_the_card(copy_run, tmp_path, capsys):
    run = copy_run()
    _add_validation(run, 4)  # nothing binds metrics.jsonl to the chain
    assert main(["export", str(run), "--out", str(tmp_path / "e")]) == 0
    card = (tmp_path / "e" / "README.md").read_text()
    assert "0.0123" not in card and "0.0235" not in card
    assert "`lockstep eval RUN_DIR --step 4` computes it" in card


def test_train_resume_escapes_the_model_name(copy_run, capsys):
    run = copy_run()
    _edit_recipe(run, lambda recipe: recipe["model"].update(name="tiny\r\x1b[2K" + EVIL))
    main(["train", "--resume", str(run), "--steps", "5", "--backend", "spec"])
    out = capsys.readouterr()
    _clean(out.out)
    _clean(out.err)
    assert "tiny\\x0d\\x1b[2K" in out.out + out.err


def test_data_verify_escapes_manifest_keys(honest_run, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(honest_run / "data", data)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["x\x1b[2K\rmanifest OK\u202e"] = 1
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert main(["data", "verify", str(data)]) == 1
    out = capsys.readouterr()
    _clean(out.out)
    _clean(out.err)
    assert "unknown key(s) x\\x1b[2K\\x0dmanifest OK" in out.err


# ---------------------------------------------------------------- a Hugging Face tokenizer run: 6 and 14

needs_tokenizers = pytest.mark.skipif(not hf_tokenizers_available(),
                                      reason="the optional 'tokenizers' package is not installed")


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """A 2-step tiny run on a BPE tokenizer whose first pre-tokenizer is a regular expression that
    backtracks without end on a run of '~' (none is in the training text)."""
    root = tmp_path_factory.mktemp("hf")
    data, texts = bpe_data(root, split="(~+~+)+!")
    run = root / "run"
    assert main(["train", "--preset", "tiny", "--data", str(data), "--steps", "2", "--backend", "spec", "--quiet",
                 "--out", str(run)]) == 0
    return run, data, texts


@needs_tokenizers
def test_a_swapped_vocabulary_is_found_against_the_run(hf_run, tmp_path, capsys):
    from tokenizers import Tokenizer

    run, data, texts = hf_run
    good = tmp_path / "export"
    assert main(["export", str(run), "--out", str(good), "--data", str(data)]) == 0
    assert main(["audit", "verify-export", str(good), str(run), "--data", str(data)]) == 0
    d = tmp_path / "forged"
    shutil.copytree(good, d)
    train_bpe([t[::-1] for t in texts], d / "tokenizer.json")  # another vocabulary of the same size
    ids = list(range(2, 40))
    assert Tokenizer.from_file(str(d / "tokenizer.json")).decode(ids) != \
        Tokenizer.from_file(str(good / "tokenizer.json")).decode(ids)
    config = json.loads((d / "config.json").read_text())
    config["tokenizer"]["sha256"] = hashlib.sha256((d / "tokenizer.json").read_bytes()).hexdigest()
    (d / "config.json").write_bytes(json_bytes(config))
    proof = json.loads((d / "proof.json").read_text())
    for name in ("config.json", "tokenizer.json"):
        proof["files"][name] = hashlib.sha256((d / name).read_bytes()).hexdigest()
    (d / "proof.json").write_bytes(json_bytes(proof))
    capsys.readouterr()
    assert main(["audit", "verify-export", str(d), str(run), "--data", str(data)]) == 2
    out = capsys.readouterr().out
    assert "FAIL config.json's tokenizer is the run's data manifest's" in out
    # without the data folder the tokenizer cannot be checked: said, and not VALID
    assert main(["audit", "verify-export", str(good), str(run)]) == 2
    assert "FAIL the run's data manifest (its tokenizer)" in capsys.readouterr().out


@needs_tokenizers
def test_a_tokenizer_panic_is_one_line(hf_run):
    run, data, _ = hf_run
    r = lockstep_limited("sample", run, "--data", data, "--prompt", "~" * 30, "--backend", "spec")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "panicked" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.count("\n") == 1 and "the run's tokenizer" in r.stderr and "PanicException" in r.stderr, r.stderr
    r = lockstep_limited("sample", run, "--data", data, "--prompt", "Ann sees", "--backend", "spec", "--json",
                         "--max-new-tokens", "2", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]  # the same tokenizer on ordinary text
