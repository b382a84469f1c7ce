"""Using a trained run: validation loss, sampling, export with its proof.

One tiny run (spec backend, 4 steps, validation every 2) on a small data folder with
held-out documents serves every test. Bit-exactness is compared as bytes or float32
bits; the one tolerance (the validation loss against a float64 recomputation) says why.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from lockstep.backends import BackendUnavailable, get_backend
from lockstep.cli import main
from lockstep.spec import attention_forward
from lockstep.formats.config import preset
from lockstep.formats.corpus import documents
from lockstep.formats.ingest import ingest
from lockstep.formats.manifest import Manifest
from lockstep.formats.stream import validation_windows
from lockstep.train.model import init_params, logits_forward
from lockstep.formats.tokenizer import hf_tokenizers_available
from lockstep.use.generate import CachedModel, Sampling, cached_attention, candidates, choose, gumbel_noise
from lockstep.use.run import UseError, open_model


def _numba_or_skip():
    try:
        return get_backend("numba")
    except BackendUnavailable as exc:
        pytest.skip(f"numba backend unavailable: {exc}")


BACKENDS = ["spec", "numba"]


@pytest.fixture(scope="module")
def data_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("use-data")
    for name in ("text", "math"):
        with open(root / f"{name}.jsonl", "w") as f:
            for doc in documents(name, 40_000):
                f.write(json.dumps({"text": doc.decode()}) + "\n")
    return ingest(root / "data", [("text", root / "text.jsonl", 1), ("math", root / "math.jsonl", 1)],
                  validation_documents=3).parent


_DATA: list[str] = []  # the run's data folder: trained with --data DIR, so the commands are given it too


def cli(argv: list[str]) -> int:
    """``lockstep ARGV``, with ``--data DIR`` for the commands that read the run's data (or its manifest)."""
    reads_data = argv[0] in ("sample", "eval", "export") or argv[:2] == ["audit", "verify-export"]
    extra = ["--data", _DATA[0]] if reads_data and _DATA else []
    return main([*argv, *extra])


@pytest.fixture(scope="module")
def run(tmp_path_factory, data_folder):
    _DATA[:] = [str(data_folder)]
    out = tmp_path_factory.mktemp("use-run") / "run"
    rc = main(["train", "--preset", "tiny", "--data", str(data_folder), "--steps", "4", "--eval-every", "2",
               "--checkpoint-every", "2", "--backend", "spec", "--quiet", "--out", str(out)])
    assert rc == 0
    return out


def _validation_records(run: Path) -> dict[int, dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["validation"] for r in lines if "validation" in r}


# ---------------------------------------------------------------- validation loss

def test_training_records_validation_and_draws_it(run):
    recs = _validation_records(run)
    assert sorted(recs) == [2, 4]
    assert all(r["targets"] > 0 and r["eval_batch"] == 4 and r["backend"] == "spec" for r in recs.values())
    assert recs[4]["nats_per_token"] < recs[2]["nats_per_token"] < np.log(257) + 0.5
    assert set(recs[4]["sources"]) == {"text", "math"}
    pytest.importorskip("matplotlib")
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_reproduces_the_recorded_bits(run, backend, capsys):
    if backend == "numba":
        _numba_or_skip()
    for step in (2, 4):
        assert cli(["eval", str(run), "--step", str(step), "--backend", backend, "--json", "--quiet"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["reproduced"] is True
        assert out["validation"]["loss_sum_bits"] == _validation_records(run)[step]["loss_sum_bits"]


def test_eval_reports_a_different_value(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    lines = (copy / "metrics.jsonl").read_text().splitlines()
    forged = []
    for line in lines:
        rec = json.loads(line)
        if rec.get("step") == 4 and "validation" in rec:
            rec["validation"]["loss_sum_bits"] = "0x3F800000"
        forged.append(json.dumps(rec))
    (copy / "metrics.jsonl").write_text("\n".join(forged) + "\n")
    assert cli(["eval", str(copy), "--backend", "spec", "--quiet"]) == 2
    assert "DIFFERS" in capsys.readouterr().out


def test_validation_loss_is_the_mean_cross_entropy(run, data_folder):
    """Accuracy check against float64: the float32 lane-tree sums of ~2,000 terms near 5 lose
    at most a few ulp of 2**-23 relative each level, far below the 1e-5 allowed here."""
    from lockstep.use.evaluate import evaluate

    model = open_model(run, 4)
    manifest = Manifest.load(data_folder)
    v = evaluate(model.params, model.cfg, manifest, get_backend("spec"), model.tcfg.micro_batch)
    total, targets, n_bytes = 0.0, 0, 0
    for split in validation_windows(manifest, model.cfg.seq_len):
        for i in range(0, len(split.windows), 4):
            w = split.windows[i : i + 4]
            logits = np.asarray(logits_forward(model.params, w[:, :-1], model.cfg, get_backend("spec")), np.float64)
            t = w[:, 1:].reshape(-1)
            m = logits.max(axis=1)
            lse = m + np.log(np.exp(logits - m[:, None]).sum(axis=1))
            total += float((lse - logits[np.arange(len(t)), t]).sum())
            targets += len(t)
            n_bytes += int((t < 256).sum())
    assert v.targets == targets and v.bytes == n_bytes
    assert abs(v.nats_per_token - total / targets) < 1e-5 * (total / targets)
    assert abs(v.bits_per_byte - total / (n_bytes * np.log(2))) < 1e-5 * v.bits_per_byte


def test_eval_without_held_out_documents_is_a_clear_error(run, tmp_path, capsys):
    from lockstep.use.evaluate import record_validation

    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"text": "one document"}) + "\n")
    manifest = Manifest.load(ingest(tmp_path / "d", [("t", src, 1)]))
    said = []
    cfg = preset("tiny")
    assert record_validation(tmp_path, 1, 0, init_params(cfg, 0), cfg, manifest, get_backend("spec"), 4,
                             said.append) is None
    assert "holds out no documents" in said[0]
    src.write_text(json.dumps({"text": "one document"}) + "\n" + json.dumps({"text": "too short"}) + "\n")
    short = Manifest.load(ingest(tmp_path / "d2", [("t", src, 1)], validation_documents=1))
    assert record_validation(tmp_path / "d2", 1, 0, init_params(cfg, 0), cfg, short, get_backend("spec"), 4,
                             said.append) is None
    assert "too few tokens for one window of 33" in said[1]
    assert main(["eval", str(run), "--data", str(tmp_path / "d")]) == 1  # not the run's data: refused
    assert "manifest" in capsys.readouterr().err


# ---------------------------------------------------------------- the model with a KV cache

@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_attention_is_the_last_row_of_the_spec(backend):
    be = _numba_or_skip() if backend == "numba" else get_backend("spec")
    rng = np.random.default_rng(1)
    h, g, dh = 4, 2, 8
    for t, window in [(1, None), (31, None), (40, 16), (77, 33), (100, 64), (33, 1), (65, 70)]:
        q, k, v = (rng.standard_normal((1, n, t, dh)).astype(np.float32) for n in (h, g, g))
        o = attention_forward(q, k, v, window)[0]
        kc = np.zeros((g, 128, dh), np.float32)
        vc = np.zeros((g, 128, dh), np.float32)
        kc[:, :t], vc[:, :t] = k[0], v[0]
        got = np.asarray(cached_attention(be, q[:, :, -1:], kc, vc, t, window)[0])
        assert got.tobytes() == o[:, :, -1:].tobytes(), (t, window)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_gives_the_training_forward(backend):
    """Float32 linears: every decoded position equals the full forward bit for bit. int8:
    the prefill equals the forward (one tensor, as in training); decode scales per token."""
    be = _numba_or_skip() if backend == "numba" else get_backend("spec")
    ids = (np.arange(32) * 37 + 5) % 257
    for quantize in (False, True):
        cfg = preset("tiny", quantize=quantize)
        params = init_params(cfg, 3)
        model = CachedModel(params, cfg, be)
        pre = model.prefill(ids[:10])
        assert pre.tobytes() == np.asarray(logits_forward(params, ids[None, :10], cfg, be)).tobytes()
        if not quantize:
            full = np.asarray(logits_forward(params, ids[None], cfg, be))
            decoded = np.stack([model.decode(int(t)) for t in ids[10:]])
            assert decoded.tobytes() == full[10:].tobytes()


# ---------------------------------------------------------------- sampling

def test_gumbel_max_draws_from_the_softmax():
    """Sampling accuracy: 6,000 seeded draws over 5 classes; each frequency's standard error
    is at most sqrt(0.25 / 6000) = 0.0065, so 0.03 is over 4.5 standard errors. The draws are
    computed at once from the noise of tokens 0 .. 5999 (token i's noise is stream values
    5i .. 5i+4), and ``choose`` itself is checked to make the same choices."""
    be = get_backend("spec")
    logits = np.array([1.0, 0.0, -1.0, 0.5, 2.0], np.float32)
    temperature, n = 0.7, 6000
    noise = np.asarray(gumbel_noise(be, 11, 0, 5 * n)).reshape(n, 5)
    scores = be.add(be.div(np.tile(logits, (n, 1)), np.float32(temperature)), noise)
    draws = np.asarray(be.argmax(scores))
    s = Sampling(temperature, None, 11)
    assert [choose(be, logits, i, 5, s) for i in range(40)] == draws[:40].tolist()
    p = np.exp(logits / temperature)
    p /= p.sum()
    assert np.abs(np.bincount(draws, minlength=5) / n - p).max() < 0.03


def test_candidates_top_k_and_vocabulary():
    logits = np.array([3.0, 1.0, 3.0, 2.0, -0.0, 0.0, 9.0, 9.0], np.float32)
    assert np.flatnonzero(candidates(logits, 6, None)).tolist() == [0, 1, 2, 3, 4, 5]  # 6, 7: beyond the tokenizer
    assert np.flatnonzero(candidates(logits, 6, 2)).tolist() == [0, 2]
    assert np.flatnonzero(candidates(logits, 6, 3)).tolist() == [0, 2, 3]
    assert np.flatnonzero(candidates(logits, 6, 5)).tolist() == [0, 1, 2, 3, 5]  # +0.0 above -0.0
    be = get_backend("spec")
    assert choose(be, logits, 0, 6, Sampling(0.0, None, 0)) == 0  # greedy: the first maximum
    assert all(choose(be, logits, i, 6, Sampling(5.0, 2, 0)) in (0, 2) for i in range(50))
    with pytest.raises(ValueError, match="NaN"):
        choose(be, np.array([0.0, np.nan], np.float32), 0, 2, Sampling(1.0, None, 0))


def test_gumbel_noise_is_the_same_on_numba():
    a = np.asarray(gumbel_noise(get_backend("spec"), 7, 3, 300))
    b = np.asarray(gumbel_noise(_numba_or_skip(), 7, 3, 300))
    assert a.tobytes() == b.tobytes() and np.isfinite(a).all()


def _sample(run, capsys, *args) -> dict:
    assert cli(["sample", str(run), "--json", "--quiet", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("settings", [["--temperature", "0"], ["--temperature", "0.9", "--top-k", "20", "--seed", "5"],
                                      ["--temperature", "1.5", "--seed", "9", "--no-stop"]])
def test_sample_gives_the_same_text_on_spec_and_numba(run, capsys, settings):
    _numba_or_skip()
    # 45 tokens after a 6-token prompt: past the tiny context of 32, so the context shift runs too
    args = ["--prompt", "Ann sees", "--max-new-tokens", "45", *settings]
    a = _sample(run, capsys, "--backend", "spec", *args)
    b = _sample(run, capsys, "--backend", "numba", *args)
    assert a["ids"] == b["ids"] and a["text"] == b["text"]
    assert a["prompt_ids"] == list(b"Ann sees")
    assert len(a["ids"]) == 45 or a["end_of_document"]


def test_sample_streams_the_prompt_and_the_text(run, capsysbinary):
    args = ["sample", str(run), "--prompt", "Tom", "--max-new-tokens", "12", "--seed", "2", "--backend", "spec"]
    assert cli([*args, "--quiet"]) == 0
    streamed = capsysbinary.readouterr().out
    assert cli([*args, "--json", "--quiet"]) == 0
    record = json.loads(capsysbinary.readouterr().out)
    text = bytes(t for t in record["ids"] if t < 256)  # the byte tokens as they are (not always UTF-8)
    assert streamed == b"Tom" + text + b"\n"


def test_a_damaged_checkpoint_is_an_error_not_text(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    state = copy / "checkpoints" / "step-00000004" / "state.safetensors"
    data = bytearray(state.read_bytes())
    data[-7] ^= 0x01
    state.write_bytes(bytes(data))
    for cmd in (["sample", "--prompt", "x"], ["eval"], ["export", "--out", str(tmp_path / "e")]):
        assert cli([cmd[0], str(copy), *cmd[1:]]) == 1
        cap = capsys.readouterr()
        assert cap.out == "" and "refused" in cap.err and "step-00000004" in cap.err
    assert not (tmp_path / "e").exists()
    # the earlier checkpoint is still usable, by name
    assert cli(["sample", str(copy), "--step", "2", "--prompt", "x", "--max-new-tokens", "3", "--quiet", "--json"]) == 0


def test_a_checkpoint_of_another_recipe_or_trajectory_is_refused(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    recipe = json.loads((copy / "recipe.json").read_text())
    recipe["seed"] += 1
    (copy / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(UseError, match="another recipe"):
        open_model(copy)
    shutil.copy(run / "recipe.json", copy / "recipe.json")
    lines = (copy / "trajectory.jsonl").read_text().splitlines()
    rec = json.loads(lines[3])
    rec["state_root"] = "0" * 64
    lines[3] = json.dumps(rec)
    (copy / "trajectory.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(UseError, match="disagrees with trajectory.jsonl"):
        open_model(copy, 4)


def test_sample_argument_errors(run, tmp_path, capsys):
    cases = [
        (["--step", "3"], "no complete checkpoint of step 3 (complete ones: 2, 4)"),
        (["--prompt-file", str(tmp_path / "missing.txt")], "missing.txt"),
        (["--temperature", "-1"], "--temperature"),
        (["--top-k", "-2"], "--top-k"),
        (["--backend", "nonesuch"], "unknown backend"),
    ]
    for args, message in cases:
        assert cli(["sample", str(run), *args]) == 1
        cap = capsys.readouterr()
        assert cap.out == "" and message in cap.err, (args, cap.err)
    assert cli(["sample", str(tmp_path / "nowhere")]) == 1
    assert "not a run directory" in capsys.readouterr().err


@pytest.mark.skipif(not hf_tokenizers_available(), reason="the optional 'tokenizers' package is not installed")
def test_a_hugging_face_tokenizer_run(tmp_path, capsys):
    """A run on a BPE tokenizer: sample, eval (bits per byte from decoded text) and a clear error
    for a prompt the tokenizer cannot represent."""
    from bpe_data import bpe_data
    from lockstep.cli.use import encode_prompt

    data, _ = bpe_data(tmp_path)
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--data", str(data), "--steps", "2", "--eval-every", "2",
                 "--backend", "spec", "--quiet", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["sample", str(run), "--data", str(data), "--prompt", "Ann sees the cat", "--max-new-tokens", "5",
                 "--backend", "spec", "--json", "--quiet"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["ids"]) >= 1 and all(t < 200 for t in record["ids"])
    assert main(["eval", str(run), "--data", str(data), "--backend", "spec", "--json", "--quiet"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["reproduced"] is True and 0 < v["validation"]["bytes"] and v["validation"]["bits_per_byte"] > 0
    assert main(["sample", str(run), "--data", str(data), "--prompt", "Ann sees \u00e9t\u00e9"]) == 1
    assert "cannot represent: '\u00e9' (U+00E9) at character 9" in capsys.readouterr().err
    manifest_tok = Manifest.load(data).tokenizer()
    with pytest.raises(ValueError, match="not UTF-8"):
        encode_prompt(manifest_tok, b"Ann \xff", 264)


# ---------------------------------------------------------------- export

def test_export_verifies_alone_and_against_its_run(run, tmp_path, capsys):
    out = tmp_path / "export"
    assert cli(["export", str(run), "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli(["audit", "verify-export", str(out), str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] and len(report["checks"]) >= 15
    assert cli(["audit", "verify-export", str(out)]) == 0
    capsys.readouterr()
    from lockstep.fsio.safetensors import read_safetensors

    tensors, _ = read_safetensors(out / "model.safetensors")
    params = open_model(run).params
    assert all(tensors[k].tobytes() == v.tobytes() for k, v in params.items())
    assert tensors["layers.00.attn.wqkv.int8"].dtype == np.int8
    assert "verify-export" in (out / "README.md").read_text()
    # an existing folder is not overwritten
    assert cli(["export", str(run), "--out", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err


def test_verify_export_finds_forgeries(run, tmp_path, capsys):
    from lockstep.fsio import json_bytes
    from lockstep.fsio.safetensors import read_safetensors, write_safetensors
    from lockstep.formats.tokenizer import file_sha256

    good = tmp_path / "export"
    assert cli(["export", str(run), "--out", str(good), "--step", "2"]) == 0
    capsys.readouterr()

    def forged(name, change):
        d = tmp_path / name
        shutil.copytree(good, d)
        change(d)
        return d

    def edit_weight(d):  # change a weight and re-hash the file, as a forger would
        tensors, meta = read_safetensors(d / "model.safetensors")
        tensors = {k: v.copy() for k, v in tensors.items()}
        tensors["lm_head"][0, 0] += np.float32(0.001)
        write_safetensors(d / "model.safetensors", tensors, meta)
        proof = json.loads((d / "proof.json").read_text())
        proof["files"]["model.safetensors"] = file_sha256(d / "model.safetensors")
        (d / "proof.json").write_bytes(json_bytes(proof))

    def edit_root(d):
        proof = json.loads((d / "proof.json").read_text())
        proof["state_root"] = "1" * 64
        (d / "proof.json").write_bytes(json_bytes(proof))

    for d, failing in [(forged("weight", edit_weight), "every parameter's digest is the checkpoint's"),
                       (forged("root", edit_root), "state root from the tensor digests")]:
        assert cli(["audit", "verify-export", str(d), str(run)]) == 2
        out = capsys.readouterr().out
        assert f"FAIL {failing}" in out and "INVALID" in out
    # a genuine export of step 2 does not pass as step 4's: its step's record is checked
    proof = json.loads((good / "proof.json").read_text())
    proof["step"] = 4
    moved = forged("moved", lambda d: (d / "proof.json").write_bytes(json_bytes(proof)))
    assert cli(["audit", "verify-export", str(moved), str(run)]) == 2
    assert "FAIL step 4 in the run's trajectory" in capsys.readouterr().out
    # not an export at all: exit 1 with a one-line reason
    assert cli(["audit", "verify-export", str(tmp_path)]) == 1
    assert "not a readable lockstep export" in capsys.readouterr().err


def test_the_tokenizer_is_read_inside_the_run_or_from_data(run, tmp_path, capsys):
    """A run on the default corpus keeps its data inside: no --data needed. A run that names a
    folder outside itself is not followed: --data DIR is asked for."""
    inside = tmp_path / "inside"
    assert main(["train", "--preset", "tiny", "--steps", "2", "--backend", "spec", "--quiet", "--out", str(inside)]) == 0
    capsys.readouterr()
    assert main(["sample", str(inside), "--prompt", "1 + 1 =", "--max-new-tokens", "4", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_ids"] == list(b"1 + 1 =")
    assert main(["sample", str(run), "--prompt", "x"]) == 1
    assert "pass --data DIR" in capsys.readouterr().err
    assert main(["sample", str(run), "--prompt", "x", "--data", str(inside / "data")]) == 1
    assert "not the manifest the run was trained on" in capsys.readouterr().err


def test_eval_metrics_writes_and_reads_refuse_links_and_fifos(tmp_path):
    """``lockstep eval`` appends to metrics.jsonl and reads it back: a planted symlink
    is refused (its target untouched) and a FIFO is skipped without hanging."""
    from lockstep.fsio import NotRegularFile
    from lockstep.use.evaluate import append_metrics, recorded_validations

    run = tmp_path / "run"
    run.mkdir()
    decoy = tmp_path / "decoy.txt"
    decoy.write_bytes(b"keep\n")
    (run / "metrics.jsonl").symlink_to(decoy)
    with pytest.raises(NotRegularFile):
        append_metrics(run, {"step": 1, "validation": {}})
    assert decoy.read_bytes() == b"keep\n"
    assert recorded_validations(run) == {}
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    assert recorded_validations(run) == {}  # a blocking open of a FIFO would hang here
    (run / "metrics.jsonl").unlink()
    append_metrics(run, {"step": 3, "tokens": 9, "validation": {"nats_per_token": 1.0, "bits_per_byte": 1.5,
                                                               "loss_sum_bits": "0x3F800000", "targets": 4, "x": 1}})
    assert recorded_validations(run)[3]["x"] == 1
