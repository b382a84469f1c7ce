"""Any model size from the command line: ``--config FILE.json``, ``--set key=value``, the medium preset.

A mistake is one line on stderr, exit 1, and leaves no run directory. A run made with
them records the settings in its recipe, so resume and audit need nothing new.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.formats.config import PRESETS, preset, train_preset
from lockstep.formats.params import param_specs
from lockstep.formats.recipe import load_recipe
from lockstep.formats.settings import SettingsError, build_settings

MISTAKES = [
    (["--set", "model.d_model=abc"], "model.d_model"),
    (["--set", "model.dmodel=4"], "dmodel"),
    (["--set", "optim.lr=1"], "model.NAME or train.NAME"),
    (["--set", "model.d_model"], "KEY=VALUE"),
    (["--set", "model.quantize=maybe"], "model.quantize"),
    (["--set", "model.d_model=0"], "model.d_model"),
    (["--set", "train.peak_lr=inf"], "train.peak_lr"),
    (["--set", "train.batch_ramp=5:3"], "train.batch_ramp"),
    (["--set", "train.batch_ramp=0:x"], "train.batch_ramp"),
    (["--set", "model.n_kv_heads=3"], "n_kv_heads"),
    (["--set", "model.vocab_size=100"], "vocab_size"),
    (["--config", "{missing}"], "not found"),
    (["--config", "{file}", '{"model": {"d_model": 48, "bogus": 1}}'], "model.bogus"),
    (["--config", "{file}", '{"model": {"d_model": 48}, "seed": 3}'], "'seed'"),
    (["--config", "{file}", '{"model": {"d_model": "48"}}'], "model.d_model"),
    (["--config", "{file}", '{"train": [1]}'], "'train'"),
    (["--config", "{file}", '{"model": {"d_model": 48,}}'], "config file"),
]


@pytest.mark.parametrize("args,named", MISTAKES, ids=[f"m{i}" for i in range(len(MISTAKES))])
def test_a_mistake_is_one_line_and_leaves_no_run(tmp_path, capsys, args, named):
    if args[0] == "--config":
        path = tmp_path / "cfg.json"
        if args[1] == "{file}":
            path.write_text(args[2])
        args = ["--config", str(path)]
    run = tmp_path / "run"
    code = main(["train", "--preset", "tiny", "--backend", "spec", "--steps", "1", "--quiet", "--out", str(run),
                 *args])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith("lockstep train: ") and named in err, err
    assert not run.exists()


def test_order_is_preset_then_file_then_set():
    cfg, tcfg = build_settings("tiny", {"model": {"d_model": 48, "n_layers": 3}, "train": {"micro_batch": 2}},
                               ["model.d_model=40", "train.batch_ramp=0:4,1000:8", "model.quantize=false",
                                "train.peak_lr=5e-4"])
    assert (cfg.d_model, cfg.n_layers, cfg.quantize, cfg.name) == (40, 3, False, "custom")
    assert cfg.seq_len == preset("tiny").seq_len
    assert tcfg.batch_ramp == ((0, 4), (1000, 8)) and tcfg.micro_batch == 2 and tcfg.peak_lr == 5e-4
    assert build_settings("small") == (preset("small"), train_preset("small"))
    assert build_settings("small", sets=["model.name=mine", "model.d_model=128"])[0].name == "mine"
    with pytest.raises(SettingsError, match="unknown preset"):
        build_settings("huge")


def test_medium_preset_is_about_100m_parameters():
    n = sum(int(np.prod(s.shape)) for s in param_specs(PRESETS["medium"]))
    assert 90e6 <= n <= 110e6
    cfg, tcfg = build_settings("medium")
    assert cfg.name == "medium" and cfg.vocab_size >= 257  # trains on the default (byte) corpus
    assert tcfg.batch_ramp[0][1] % tcfg.micro_batch == 0


def test_a_set_run_resumes_and_verifies(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    conf = tmp_path / "m.json"
    conf.write_text(json.dumps({"model": {"d_model": 24, "n_layers": 1}, "train": {"batch_ramp": [[0, 4]]}}))
    base = ["--backend", "spec", "--quiet", "--data", str(corpus), "--checkpoint-every", "1"]
    assert main(["train", "--preset", "tiny", "--config", str(conf), "--set", "train.micro_batch=2",
                 "--set", "model.ffn_dim=40", "--steps", "1", "--out", str(run), *base]) == 0
    recipe = load_recipe(run)
    assert recipe["model"]["d_model"] == 24 and recipe["model"]["n_layers"] == 1
    assert recipe["model"]["ffn_dim"] == 40 and recipe["model"]["name"] == "custom"
    assert recipe["train"]["micro_batch"] == 2 and recipe["train"]["batch_ramp"] == [[0, 4]]
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--set", "model.d_model=32", *base]) == 1
    assert "--config and --set make a new run" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--steps", "2", *base]) == 0
    assert load_recipe(run) == recipe
    capsys.readouterr()
    assert main(["audit", "verify", str(run), "--data", str(corpus)]) == 0
    assert "VALID" in capsys.readouterr().out
