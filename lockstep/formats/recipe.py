"""``recipe.json``: the settings that define a run, their limits, and the genesis hash ``H_0`` they bind.

A recipe is written once, when a run starts (``write_recipe``), and read by everyone
after (``load_recipe``: strict JSON, unknown keys refused, every value within the
stated limits before anything is sized by it). ``genesis`` is ``H_0``: it binds the
settings that change trained bits, the data manifest's digest and ``SPEC_VERSION``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import lockstep
from lockstep.fsio import atomic_write_bytes, json_bytes
from lockstep.spec import SPEC_VERSION, fp, hashing

from .config import ModelConfig, TrainConfig
from .manifest import Manifest
from .rundir import (HEX64, MAX_RECIPE_BYTES, RECIPE_FILE, RECIPE_FORMAT, RECIPE_VERSION, RunFileError, _read_run_json,
                     _shown)


# ---------------------------------------------------------------- recipe


def make_recipe(cfg: ModelConfig, tcfg: TrainConfig, manifest: Manifest, data_folder: str, seed: int) -> dict:
    """Everything that defines the run's bits (not the number of ranks: it changes none)."""
    return {
        "format": RECIPE_FORMAT,
        "version": RECIPE_VERSION,
        "model": cfg.to_dict(),
        "train": tcfg.to_dict(),
        "data": {"manifest_sha256": manifest.sha256, "folder": data_folder},
        "seed": int(seed),
        "micro_batch": int(tcfg.micro_batch),
        "spec_version": SPEC_VERSION,
        "lockstep_version": lockstep.__version__,
    }


def write_recipe(run_dir: Path, recipe: dict) -> None:
    """``recipe.json``, atomically (indented, keys sorted)."""
    atomic_write_bytes(Path(run_dir) / RECIPE_FILE, json.dumps(recipe, indent=2, sort_keys=True).encode() + b"\n")


def recipe_digest(recipe: dict) -> str:
    """SHA-256 of the whole recipe's canonical JSON (``fsio.json_bytes``: sorted keys, 2-space
    indent, UTF-8, final newline); for a recipe ``write_recipe`` wrote, the file's own bytes.
    Checkpoint sidecars record it (``recipe_sha256``) to bind a checkpoint to its run; H_0
    binds ``genesis_recipe_digest`` instead."""
    return hashlib.sha256(json_bytes(recipe)).hexdigest()


# The top-level keys a recipe may have, and those of its "data" object; ``load_recipe``
# refuses any other, so no extra key can be added to the file (it would be inert for H_0
# anyway, but a recipe says what it means).
RECIPE_KEYS = frozenset({"format", "version", "model", "train", "data", "seed", "micro_batch", "spec_version",
                         "lockstep_version"})
RECIPE_DATA_KEYS = frozenset({"folder", "manifest_sha256"})
# Recipe fields that change no trained bit, so H_0 leaves them out: which lockstep release
# wrote the recipe, the preset's label, and where the data folder lies (the manifest's
# digest binds the data itself).
NON_BIT_FIELDS = ("lockstep_version", "model.name", "data.folder")


# Float settings that reach every op only as a float32 (``np.float32(v)`` or the backend's
# HOST_FLOAT -> float32 operand, read canonically): every float64 of one float32 rounding
# interval trains the same bits, so H_0 binds the float32 value. The others (peak_lr,
# min_lr_ratio, beta1, beta2, init_std, rope_theta) enter float64 host math first, so
# their float64 value is what counts. A new use of one of these five as a float64 must
# move it to the second list.
FLOAT32_SETTINGS = {"model": ("norm_eps", "z_loss"), "train": ("eps", "weight_decay", "grad_clip")}


def _settings(values: dict, cls, section: str) -> dict:
    """A model/train section written out in full: every field (defaults filled in), floats as
    floats, the ``FLOAT32_SETTINGS`` as the float32 the ops read (``fp.f32``: rounded, a
    subnormal read as a zero of its sign)."""
    cfg = cls.from_dict(values)
    out = cfg.to_dict()
    for f in dataclasses.fields(cls):
        if isinstance(f.default, float):
            out[f.name] = float(out[f.name])
        if f.name in FLOAT32_SETTINGS[section]:
            out[f.name] = float(fp.f32(out[f.name])[()])
    return out


def genesis_recipe(recipe: dict) -> dict:
    """The fields of a recipe that ``H_0`` binds: the recipe without ``NON_BIT_FIELDS``, with
    every model and train setting written out in full (defaults filled in, an integer given
    for a float setting as the float, a ``FLOAT32_SETTINGS`` value as its float32). Recipes
    that differ only in how they spell the same settings, or in fields that change no bit,
    have the same genesis fields, so no such edit can give a run another ``H_0``.

    The result is ``{"format": "lockstep.recipe", "version": 1, "model": {...}, "train":
    {...}, "data": {"manifest_sha256": HEX}, "seed": S, "micro_batch": B, "spec_version":
    V}`` (``micro_batch`` equals ``train.micro_batch``; ``load_recipe`` refuses a recipe
    where they differ), hashed as ``fsio.json_bytes``. Every field of ``model``
    (``ModelConfig``) and ``train`` (``TrainConfig``), its type, its default as
    ``recipe.json`` spells it and that default as the genesis fields spell it::

        field                       type               default    in the genesis fields
        model.name                  str                "custom"   left out
        model.vocab_size            int                264        264
        model.d_model               int                256        256
        model.n_layers              int                4          4
        model.n_heads               int                4          4
        model.n_kv_heads            int                2          2
        model.head_dim              int                64         64
        model.ffn_dim               int                688        688
        model.seq_len               int                256        256
        model.sliding_window        int                128        128
        model.full_attention_every  int                5          5
        model.rope_theta            float              500000.0   500000.0
        model.norm_eps              float32            1e-06      9.999999974752427e-07
        model.z_loss                float32            0.0001     9.999999747378752e-05
        model.init_std              float              0.02       0.02
        model.quantize              bool               true       true
        model.hadamard              bool               true       true
        train.peak_lr               float              0.003      0.003
        train.min_lr_ratio          float              0.1        0.1
        train.warmup_tokens         int                65536      65536
        train.total_tokens          int                8388608    8388608
        train.beta1                 float              0.9        0.9
        train.beta2                 float              0.95       0.95
        train.eps                   float32            1e-08      9.99999993922529e-09
        train.weight_decay          float32            0.1        0.10000000149011612
        train.grad_clip             float32            1.0        1.0
        train.batch_ramp            [[int, int], ...]  [[0, 16]]  [[0, 16]]
        train.micro_batch           int                8          8

    Types (``recipe_value_problems`` checks them): ``int`` a JSON integer from 1 to its
    ``RECIPE_INT_LIMITS`` entry (2**62 where it has none); ``float`` a finite JSON number
    of magnitude at most ``MAX_FLOAT_MAGNITUDE``, written as the float64 it reads as
    (``2`` becomes ``2.0``); ``float32`` the same, written as the
    float64 of the float32 it rounds to (``fp.f32``: to nearest even, a subnormal to a
    zero of its sign); ``bool`` ``true``/``false``; ``batch_ramp`` pairs ``[from_tokens,
    sequences]``, the first from 0. docs/formats.md has the same table
    (tests/test_spec_text.py checks both against the dataclasses).
    """
    model = _settings(recipe["model"], ModelConfig, "model")
    del model["name"]
    return {
        "format": recipe["format"],
        "version": recipe.get("version", RECIPE_VERSION),
        "model": model,
        "train": _settings(recipe["train"], TrainConfig, "train"),
        "data": {"manifest_sha256": recipe["data"]["manifest_sha256"]},
        "seed": recipe["seed"],
        "micro_batch": recipe["micro_batch"],
        "spec_version": recipe["spec_version"],
    }


def genesis_recipe_digest(recipe: dict) -> str:
    """SHA-256 of ``genesis_recipe(recipe)``'s canonical JSON (``fsio.json_bytes``): H_0's recipe digest."""
    return hashlib.sha256(json_bytes(genesis_recipe(recipe))).hexdigest()


def genesis(recipe: dict) -> str:
    """``H_0 = hashing.genesis_hash(genesis_recipe_digest(recipe), data.manifest_sha256, spec_version)``.

    It binds the recipe's genesis fields (``genesis_recipe``: everything but
    ``lockstep_version``, ``model.name`` and ``data.folder``, settings in full), the data
    manifest's SHA-256 and the SPEC_VERSION; see ``lockstep.spec.hashing.genesis_hash``
    for the bytes.
    """
    return hashing.genesis_hash(genesis_recipe_digest(recipe), recipe["data"]["manifest_sha256"],
                                recipe["spec_version"])


def recipe_configs(recipe: dict) -> tuple[ModelConfig, TrainConfig]:
    return ModelConfig.from_dict(recipe["model"]), TrainConfig.from_dict(recipe["train"])


# Stated maxima for the numbers in a recipe, checked before anything is sized by them. Open-1B is
# far inside every one (vocab 128,256, d_model 2048, 24 layers, seq_len 4096, 2304 sequences per step).
RECIPE_INT_LIMITS = {
    "vocab_size": 1 << 24, "d_model": 1 << 16, "n_layers": 1 << 10, "n_heads": 1 << 10, "n_kv_heads": 1 << 10,
    "head_dim": 1 << 12, "ffn_dim": 1 << 20, "seq_len": 1 << 20, "sliding_window": 1 << 20,
    "full_attention_every": 1 << 10, "warmup_tokens": 1 << 62, "total_tokens": 1 << 62, "micro_batch": 1 << 20,
}
MAX_BATCH_SEQUENCES = 1 << 20
MAX_BATCH_BYTES = 1 << 32  # one step's windows as int32 (Open-1B: 38 MB)
MAX_FLOAT_MAGNITUDE = 1e30


def _field_problem(name: str, value: Any, default: Any) -> str | None:
    """Why ``value`` cannot stand for the config field ``name`` whose default is ``default`` (or None)."""
    if isinstance(default, bool):
        return None if type(value) is bool else f"{name} must be true or false, got {value!r}"
    if isinstance(default, int):
        hi = RECIPE_INT_LIMITS.get(name, 1 << 62)
        if type(value) is not int or not 1 <= value <= hi:
            return f"{name} must be an integer from 1 to {hi}, got {value!r}"
        return None
    if isinstance(default, float):
        if type(value) not in (int, float) or not math.isfinite(value) or abs(value) > MAX_FLOAT_MAGNITUDE:
            return f"{name} must be a finite number, got {value!r}"
        return None
    if isinstance(default, str):
        return None if isinstance(value, str) and len(value) <= 200 else f"{name} must be a short string"
    return None


def _ramp_problem(ramp: Any) -> str | None:
    if not isinstance(ramp, list) or not 1 <= len(ramp) <= 1000:
        return "batch_ramp must be a list of 1 to 1000 [from_tokens, sequences] pairs"
    for pair in ramp:
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(v) is int for v in pair)
                and 0 <= pair[0] < 1 << 62 and 1 <= pair[1] <= MAX_BATCH_SEQUENCES):
            return (f"batch_ramp entry {pair!r} must be [from_tokens >= 0, sequences from 1 to "
                    f"{MAX_BATCH_SEQUENCES}]")
    if ramp[0][0] != 0:
        return "batch_ramp must start at 0 tokens"
    return None


def recipe_value_problems(recipe: dict) -> list[str]:
    """Every model/train value of a recipe with the wrong type, a non-finite number, or beyond a stated maximum.

    Checked before a config is built or anything is sized by it: integers are JSON
    integers within ``RECIPE_INT_LIMITS``, floats finite, flags true/false, and one
    step's batch at most ``MAX_BATCH_BYTES`` of windows.
    """
    problems = []
    for section, cls in (("model", ModelConfig), ("train", TrainConfig)):
        values = recipe.get(section)
        if not isinstance(values, dict):
            problems.append(f"'{section}' must be a JSON object")
            continue
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(defaults))
        if unknown:
            problems.append(f"unknown {section} key(s) {', '.join(map(repr, unknown[:5]))}")
        for name, value in values.items():
            if name == "batch_ramp":
                why = _ramp_problem(value)
            elif name in defaults:
                why = _field_problem(name, value, defaults[name])
            else:
                continue
            if why:
                problems.append(f"{section}.{why}")
    if problems:
        return problems
    seq_len = recipe["model"].get("seq_len", ModelConfig.seq_len)
    biggest = max(n for _, n in recipe["train"].get("batch_ramp", [[0, 16]]))
    if biggest * (seq_len + 1) * 4 > MAX_BATCH_BYTES:
        problems.append(f"a step of {biggest} sequences of {seq_len + 1} tokens is "
                        f"{biggest * (seq_len + 1) * 4 / 2**30:.1f} GiB of windows; at most "
                        f"{MAX_BATCH_BYTES / 2**30:.0f} GiB is supported")
    return problems




def load_recipe(run_dir: str | os.PathLike) -> dict:
    """``recipe.json``, strictly parsed and structurally checked (``RunFileError`` otherwise)."""
    run_dir = Path(run_dir)
    path = run_dir / RECIPE_FILE
    recipe = _read_run_json(run_dir, RECIPE_FILE, "recipe", MAX_RECIPE_BYTES,
                            "missing; this is not a lockstep run directory (or it was not copied whole)",
                            "; restore recipe.json from the run's publisher")
    if not isinstance(recipe, dict) or recipe.get("format") != RECIPE_FORMAT:
        raise RunFileError(f"{path}: not a lockstep recipe (format must be {RECIPE_FORMAT!r})")
    for key in ("model", "train", "data", "seed", "micro_batch", "spec_version"):
        if key not in recipe:
            raise RunFileError(f"{path}: key {key!r} missing")
    extra = sorted(set(recipe) - RECIPE_KEYS)
    if extra:
        raise RunFileError(f"{path}: unknown key(s) {', '.join(map(_shown, extra[:5]))}; a recipe holds only "
                           f"{', '.join(sorted(RECIPE_KEYS))}")
    version = recipe.get("version", RECIPE_VERSION)
    if type(version) is not int or version != RECIPE_VERSION:
        raise RunFileError(f"{path}: recipe version must be {RECIPE_VERSION}, got {version!r}")
    if "lockstep_version" in recipe and not (isinstance(recipe["lockstep_version"], str)
                                             and len(recipe["lockstep_version"]) <= 200):
        raise RunFileError(f"{path}: lockstep_version must be a short string")
    data = recipe["data"]
    if not (isinstance(data, dict) and isinstance(data.get("folder"), str)
            and isinstance(data.get("manifest_sha256"), str) and HEX64.fullmatch(data["manifest_sha256"])):
        raise RunFileError(f"{path}: 'data' must hold a folder and a 64-digit manifest_sha256")
    if set(data) - RECIPE_DATA_KEYS:
        raise RunFileError(f"{path}: unknown 'data' key(s) "
                           f"{', '.join(map(_shown, sorted(set(data) - RECIPE_DATA_KEYS)[:5]))}")
    if type(recipe["seed"]) is not int or not 0 <= recipe["seed"] < 2**64:
        raise RunFileError(f"{path}: seed must be an integer in [0, 2**64), got {recipe['seed']!r}")
    if not isinstance(recipe["spec_version"], str):
        raise RunFileError(f"{path}: spec_version must be a string")
    bad = recipe_value_problems(recipe)
    if bad:
        raise RunFileError(f"{path}: " + "; ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""))
    try:
        cfg, tcfg = recipe_configs(recipe)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise RunFileError(f"{path}: bad model/train settings: {exc}") from None
    if recipe["micro_batch"] != tcfg.micro_batch:
        raise RunFileError(f"{path}: micro_batch {recipe['micro_batch']!r} differs from train.micro_batch "
                           f"{tcfg.micro_batch}")
    return recipe


