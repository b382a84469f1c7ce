"""H_0 binds what changes trained bits and nothing else (no grinding of the audit plan through
cosmetic recipe edits), and a recipe with keys lockstep does not know is refused."""

from __future__ import annotations

import copy
import json
import math
from types import SimpleNamespace

import pytest

from lockstep.spec import SPEC_VERSION
from lockstep.formats.config import preset, train_preset
from lockstep.formats.rundir import RunFileError
from lockstep.formats.recipe import genesis, genesis_recipe, load_recipe, make_recipe, recipe_digest, write_recipe


def _recipe() -> dict:
    return make_recipe(preset("tiny"), train_preset("tiny"), SimpleNamespace(sha256="ab" * 32), "data", 5)


def _edited(edit) -> dict:
    r = copy.deepcopy(_recipe())
    edit(r)
    return r


NO_BIT_EDITS = {
    "lockstep_version": lambda r: r.__setitem__("lockstep_version", "99.0.0+grind.12345"),
    "no lockstep_version": lambda r: r.pop("lockstep_version"),
    "model.name": lambda r: r["model"].__setitem__("name", "grind-7"),
    "data.folder": lambda r: r["data"].__setitem__("folder", "/elsewhere/corpus-copy"),
    "default left out": lambda r: r["model"].pop("hadamard"),
    "int for a float": lambda r: r["train"].__setitem__("grad_clip", int(r["train"]["grad_clip"])),
    "no version key": lambda r: r.pop("version"),
    # read only as float32: another float64 of the same float32 trains the same bits
    "train.eps, same float32": lambda r: r["train"].__setitem__("eps", math.nextafter(r["train"]["eps"], 1.0)),
}


@pytest.mark.parametrize("label", sorted(NO_BIT_EDITS))
def test_fields_that_change_no_bit_leave_h0_alone(label):
    base, edited = _recipe(), _edited(NO_BIT_EDITS[label])
    assert recipe_digest(edited) != recipe_digest(base)  # the file differs ...
    assert genesis(edited) == genesis(base)  # ... but not the genesis it commits to
    assert genesis_recipe(edited) == genesis_recipe(base)


def test_a_subnormal_float32_setting_is_the_zero_the_ops_read():
    zero = _edited(lambda r: r["train"].__setitem__("weight_decay", 0.0))
    tiny = _edited(lambda r: r["train"].__setitem__("weight_decay", 1e-40))  # a float32 subnormal: read as 0
    assert genesis(tiny) == genesis(zero) != genesis(_recipe())


BIT_EDITS = {
    "seed": lambda r: r.__setitem__("seed", 6),
    "model.d_model": lambda r: r["model"].__setitem__("d_model", 64),
    "model.quantize": lambda r: r["model"].__setitem__("quantize", not r["model"]["quantize"]),
    "train.peak_lr": lambda r: r["train"].__setitem__("peak_lr", r["train"]["peak_lr"] * 2),
    "manifest": lambda r: r["data"].__setitem__("manifest_sha256", "cd" * 32),
    "spec_version": lambda r: r.__setitem__("spec_version", SPEC_VERSION + "x"),
    "train.eps, another float32": lambda r: r["train"].__setitem__("eps", r["train"]["eps"] * 1.001),
    "train.beta2, next float64": lambda r: r["train"].__setitem__("beta2", math.nextafter(r["train"]["beta2"], 1.0)),
}


@pytest.mark.parametrize("label", sorted(BIT_EDITS))
def test_fields_that_change_bits_change_h0(label):
    assert genesis(_edited(BIT_EDITS[label])) != genesis(_recipe())


@pytest.mark.parametrize("edit, match", [
    (lambda r: r.__setitem__("comment", "grind 1"), "unknown key"),
    (lambda r: r["data"].__setitem__("mirror", "x"), "unknown 'data' key"),
    (lambda r: r.__setitem__("version", 2), "recipe version"),
    (lambda r: r.__setitem__("lockstep_version", 7), "lockstep_version"),
])
def test_recipes_with_unknown_keys_are_refused(tmp_path, edit, match):
    write_recipe(tmp_path, _recipe())
    load_recipe(tmp_path)  # the recipe as written loads
    bad = _edited(edit)
    (tmp_path / "recipe.json").write_text(json.dumps(bad))
    with pytest.raises(RunFileError, match=match):
        load_recipe(tmp_path)
