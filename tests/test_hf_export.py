"""The Hugging Face export (``lockstep export --format hf``) loaded by ``transformers``, offline.

Two tiny runs (30 steps on numba, the spec's bits), int8 W8A8 on and off, exported for
transformers, loaded with ``AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)``
and ``AutoTokenizer.from_pretrained``, and compared with lockstep:

* the validation loss on the run's held-out windows, batched as ``lockstep eval`` batches them
  (an int8 activation scale covers its batch), agrees with ``lockstep eval``'s to
  ``LOSS_RTOL`` relative; the same check with the sliding window ignored fails it (the
  tolerance passes rounding and catches a change of semantics);
* greedy ``generate`` gives ``lockstep sample --temperature 0``'s tokens from the same prompt,
  the end-of-document token first.

Needs ``torch`` and ``transformers`` (``pip install 'lockstep[hf]'``); skipped with the reason
otherwise. Marked ``hf``: ``python3 -m pytest -m hf tests/test_hf_export.py`` runs only these,
``-m "not hf"`` leaves them out (about 40 s here, most of it importing torch and transformers
and training the two runs). The checks of the export itself that need neither package are in
``tests/test_hostile_exports.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub is reachable, and nothing may be fetched
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch", reason="the Hugging Face export tests need torch (pip install 'lockstep[hf]')")
transformers = pytest.importorskip("transformers",
                                   reason="the Hugging Face export tests need transformers (pip install 'lockstep[hf]')")

from lockstep.backends import BackendUnavailable, get_backend  # noqa: E402
from lockstep.cli import main  # noqa: E402
from lockstep.formats.stream import validation_windows  # noqa: E402
from lockstep.use.evaluate import evaluate  # noqa: E402
from lockstep.use.generate import CachedModel  # noqa: E402
from lockstep.use.run import open_data, open_model  # noqa: E402

pytestmark = pytest.mark.hf

# Why 1e-5 relative: float32 has a unit roundoff of 6e-8; the two models differ in summation
# order and in exp/silu/cos/sin (the spec's are within 2.6-3.6 ulp) at every op, which gives
# logits within ~8 ulp of lockstep's and loss sums within 1e-7 relative here (measured 2e-9 to
# 6e-8 on these runs); errors of independent tokens partly cancel in a sum, so larger models stay
# well inside. The smallest change of semantics measured on the tiny model, its sliding window
# ignored, moves the loss by 1.3e-4 relative (int8 off on an int8 model: 2.1e-4): 13x the tolerance.
# With SPEC_VERSION 4's int8 P.V (measured on the int8 tiny run): 9.8e-8 relative; the same model with
# a float32 P.V instead moves it by only 1.05e-5, so the tolerance does not reliably catch that change.
LOSS_RTOL = 1e-5
GREEDY_TOKENS = 16  # generated tokens compared with lockstep sample --temperature 0
# Why 1e-4: the logits (magnitude ~6) agree to ~8 ulp of float32 (measured at most 4e-6) at every step;
# a decode step that reads the cache wrongly (a masked end-of-document token) moves them by 0.16 to 0.3.
LOGIT_ATOL = 1e-4
MARGIN = 1e-3  # each compared choice is decided by more than this: 10x LOGIT_ATOL
PROMPT = "times table of"  # with the end-of-document token and GREEDY_TOKENS, within the 32 positions of tiny


@pytest.fixture(scope="module")
def backend():
    try:
        return get_backend("numba")
    except BackendUnavailable:
        return get_backend("spec")


@pytest.fixture(scope="module", params=["int8", "float32"])
def exported(request, tmp_path_factory, backend):
    """(run, export) of a 30-step tiny run with int8 on or off, exported with --format hf."""
    root = tmp_path_factory.mktemp(f"hf-{request.param}")
    run, out = root / "run", root / "export"
    quant = [] if request.param == "int8" else ["--no-quantize"]
    assert main(["train", "--preset", "tiny", "--steps", "30", "--eval-every", "0", "--checkpoint-every", "30",
                 "--backend", backend.name, "--quiet", "--out", str(run), *quant]) == 0
    assert main(["export", str(run), "--out", str(out), "--format", "hf"]) == 0
    os.environ["HF_HOME"] = str(root / "hf-home")  # transformers copies the model code here, not into ~/.cache
    return run, out


def _load(export: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)


def test_the_export_verifies_and_loads_offline(exported, capsys):
    run, export = exported
    capsys.readouterr()
    assert main(["audit", "verify-export", str(export), str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] and any("modeling_lockstep.py" in c["check"] for c in report["checks"])
    from transformers import AutoTokenizer

    model = _load(export)
    tok = AutoTokenizer.from_pretrained(export, trust_remote_code=True)
    assert type(model).__name__ == "LockstepForCausalLM" and not model.training
    assert model.config.eod_token_id == tok.eos_token_id == 256 and model.config.tokenizer_vocab_size == 257
    assert tok(PROMPT, add_special_tokens=False)["input_ids"] == list(PROMPT.encode())
    # the int8 codes and scales are the export's, as loaded: the forward uses exactly lockstep's
    from lockstep.fsio.safetensors import read_safetensors

    tensors, _ = read_safetensors(export / "model.safetensors")
    state = model.state_dict()
    assert set(state) == set(tensors)
    assert all(np.array_equal(state[k].numpy(), v) for k, v in tensors.items())


def _hf_loss_sum(model, splits, eval_batch: int) -> float:
    """The held-out windows' cross-entropy sum (no z-loss), batched as ``lockstep eval`` batches them."""
    total = 0.0
    with torch.no_grad():
        for split in splits:
            for i in range(0, split.windows.shape[0], eval_batch):
                w = split.windows[i : i + eval_batch].astype(np.int64)
                logits = model(input_ids=torch.from_numpy(w[:, :-1])).logits
                total += float(torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]).double(), torch.from_numpy(w[:, 1:]).reshape(-1),
                    reduction="sum"))
    return total


def test_validation_loss_agrees_with_lockstep_eval(exported, backend):
    run, export = exported
    m = open_model(run)
    manifest = open_data(run, m.recipe)
    v = evaluate(m.params, m.cfg, manifest, backend, m.tcfg.micro_batch)
    splits = validation_windows(manifest, m.cfg.seq_len)
    model = _load(export)
    got = _hf_loss_sum(model, splits, m.tcfg.micro_batch)
    assert abs(got - float(v.loss_sum)) <= LOSS_RTOL * float(v.loss_sum), (got, float(v.loss_sum))
    for module in model.modules():  # the negative control: the same model without its sliding window
        if type(module).__name__ == "LockstepAttention":
            module.window = None
    off = _hf_loss_sum(model, splits, m.tcfg.micro_batch)
    assert abs(off - float(v.loss_sum)) > LOSS_RTOL * float(v.loss_sum), (off, float(v.loss_sum))


def test_greedy_generate_gives_lockstep_samples_tokens(exported, backend, capsys):
    """Greedy generation through transformers' KV cache: lockstep sample's tokens (both stop after the
    end-of-document token), and at every step logits within LOGIT_ATOL of lockstep's cached model's (an int8
    decode step quantizes its one new position by its own scale in both)."""
    run, export = exported
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens",
                 str(GREEDY_TOKENS), "--backend", backend.name, "--json", "--quiet"]) == 0
    record = json.loads(capsys.readouterr().out)
    model = _load(export)
    context = [model.config.eod_token_id] + record["prompt_ids"]
    out = model.generate(torch.tensor([context]), attention_mask=torch.ones(1, len(context), dtype=torch.long),
                         max_new_tokens=GREEDY_TOKENS, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    ids = out.sequences[0, len(context):].tolist()
    assert ids == record["ids"] and len(ids) >= 4
    m = open_model(run)
    cached = CachedModel(m.params, m.cfg, backend)
    logits = cached.prefill(context)[-1]
    for step, tok in enumerate(ids):
        assert np.abs(out.logits[step][0].numpy() - logits).max() <= LOGIT_ATOL, step
        top = np.sort(logits[:257])[-2:]
        assert top[1] - top[0] > MARGIN, step  # a clear choice: rounding could not have made it
        if step + 1 < len(ids):
            logits = cached.decode(tok)


TEXTS = ["", "plain ascii", "h\u00e9llo w\u00f6rld \U0001F600", "tabs\tand\r\nnewlines\n\n", "<|endoftext|> as text",
         "\x00\x1f\x7f control", "\u00a0\u00ad\u0100 the byte-level alphabet's edges"]


def test_the_byte_tokenizer_is_lockstep_s(exported):
    """The export's tokenizer.json is lockstep's byte tokenizer: text -> its UTF-8 bytes, even the
    end-of-document token's string (split like any text), and back; loaded with and without
    trust_remote_code (transformers 5 reads config.json first, which names remote code)."""
    from transformers import AutoTokenizer

    _, export = exported
    for tok in (AutoTokenizer.from_pretrained(export, trust_remote_code=True), AutoTokenizer.from_pretrained(export)):
        for text in TEXTS:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert ids == list(text.encode("utf-8")), text
            assert tok.decode(ids) == text
        assert tok.decode([256]) == "<|endoftext|>" and tok.eos_token_id == 256


@pytest.mark.parametrize("eod_token", ["<eod>", None])
def test_a_bpe_run_exports_its_tokenizer(tmp_path, backend, eod_token, capsys):
    """A run on a BPE tokenizer: the export carries the run's tokenizer.json byte for byte; the end-of-document
    token is the tokenizer's own (``--eod-token``) or, as a new id past its vocabulary, an added token; texts
    encode to lockstep's ids, and generate runs from the end-of-document token."""
    from transformers import AutoTokenizer

    from bpe_data import bpe_data
    from lockstep.formats.manifest import Manifest

    data, texts = bpe_data(tmp_path, eod_token)
    run, export = tmp_path / "run", tmp_path / "export"
    assert main(["train", "--preset", "tiny", "--data", str(data), "--steps", "2", "--backend", backend.name,
                 "--quiet", "--out", str(run)]) == 0
    assert main(["export", str(run), "--data", str(data), "--out", str(export), "--format", "hf"]) == 0
    assert main(["audit", "verify-export", str(export), str(run), "--data", str(data)]) == 0
    capsys.readouterr()
    assert (export / "tokenizer.json").read_bytes() == (data / "tokenizer.json").read_bytes()
    lockstep_tok = Manifest.load(data).tokenizer()
    tok = AutoTokenizer.from_pretrained(export, trust_remote_code=True)
    assert tok.eos_token_id == lockstep_tok.eod_id == (1 if eod_token else 200)
    for text in texts[:20]:
        assert tok(text, add_special_tokens=False)["input_ids"] == lockstep_tok.encode(text).tolist()
    model = _load(export)
    ids = [model.config.eod_token_id] + tok("Ann sees", add_special_tokens=False)["input_ids"]
    out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    assert all(t < 201 for t in out[0].tolist())
    assert isinstance(tok.decode(out[0, len(ids):], skip_special_tokens=True), str)
