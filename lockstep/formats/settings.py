"""A new run's model and train settings from a preset, a config file and ``key=value`` overrides.

``lockstep train --preset P --config FILE.json --set model.d_model=512 --set train.micro_batch=2``:
the preset's settings (``config.PRESETS``/``TRAIN_PRESETS``), then the file's, then each
``--set`` in order. The file is strict JSON with a ``"model"`` and/or a ``"train"``
object whose keys are those of a run's ``recipe.json`` (``ModelConfig``/``TrainConfig``
fields); any other key is refused. Every value is checked as ``load_recipe`` checks a
recipe (``recipe.recipe_value_problems``: types, limits), then the configs are built
(their own checks, e.g. ``n_heads`` a multiple of ``n_kv_heads``); a mistake is a
``SettingsError`` of one line that names the key, raised before anything is written.
The run's recipe records the result, so a resume or an audit needs none of this.

When the model settings differ from the preset's and no ``model.name`` is given, the
model is named ``custom`` (the name is a label: it changes no bit and H_0 leaves it out).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterable

from lockstep.errors import LockstepError, Setting
from lockstep.fsio import FileFormatError, read_json

from .config import PRESETS, TRAIN_PRESETS, ModelConfig, TrainConfig
from .recipe import recipe_value_problems

MAX_CONFIG_BYTES = 1 << 20
SECTIONS = {"model": ModelConfig, "train": TrainConfig}


class SettingsError(LockstepError, ValueError):
    """A config file or ``--set`` mistake (one line, naming the key)."""


def _fields(section: str) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(SECTIONS[section])}


def parse_value(key: str, text: str) -> Any:
    """The JSON value ``--set key=text`` stands for, by the field's type (``key`` is ``section.field``)."""
    section, _, name = key.partition(".")
    if section not in SECTIONS or not name:
        raise SettingsError.naming(Setting("sets"), f" {key}: the key must be model.NAME or train.NAME (for example "
                                   "model.d_model)")
    fields = _fields(section)
    if name not in fields:
        raise SettingsError.naming(Setting("sets"), f" {key}: unknown {section} setting {name!r}; the {section} "
                                   f"settings are {', '.join(sorted(fields))}")
    default = fields[name]
    where = (Setting("sets"), f" {key}={text}")  # the message parts that name where the value came from
    if name == "batch_ramp":
        return _ramp(where, text)
    if isinstance(default, bool):
        low = text.strip().lower()
        if low not in ("true", "false"):
            raise SettingsError.naming(*where, f": {key} must be true or false")
        return low == "true"
    if isinstance(default, int):
        try:
            return int(text.replace("_", ""), 10)
        except ValueError:
            raise SettingsError.naming(*where, f": {key} must be an integer") from None
    if isinstance(default, float):
        try:
            value = float(text)
        except ValueError:
            raise SettingsError.naming(*where, f": {key} must be a number") from None
        if not math.isfinite(value):
            raise SettingsError.naming(*where, f": {key} must be a finite number")
        return value
    return text  # a string (model.name)


def _ramp(where: tuple, text: str) -> list[list[int]]:
    """``FROM:SEQS,FROM:SEQS`` (as ``--batch-ramp``) as the recipe's list of pairs (checked later); ``where``: the
    message parts that name where the text came from."""
    stages = []
    for part in text.split(","):
        start, sep, size = part.partition(":")
        try:
            stages.append([int(start), int(size)])
        except ValueError:
            raise SettingsError.naming(*where, ": train.batch_ramp is FROM_TOKENS:SEQUENCES,... "
                                       "(for example 0:16,1048576:32)") from None
        if not sep:
            raise SettingsError.naming(*where, ": train.batch_ramp is FROM_TOKENS:SEQUENCES,...")
    starts = [a for a, _ in stages]
    if starts != sorted(set(starts)):
        raise SettingsError.naming(*where, ": the batch ramp's token counts must increase")
    return stages


def read_config_file(path: str | os.PathLike) -> dict[str, dict]:
    """``{"model": {...}, "train": {...}}`` from a strict JSON file (either section may be absent)."""
    try:
        data = read_json(path, "config file", MAX_CONFIG_BYTES)
    except FileNotFoundError as exc:
        raise SettingsError(str(exc)) from None
    except (FileFormatError, OSError) as exc:
        raise SettingsError.naming(Setting("config"), f" {path}: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError.naming(Setting("config"), f" {path}: must be a JSON object with a \"model\" and/or a "
                                   "\"train\" object")
    extra = sorted(set(data) - set(SECTIONS))
    if extra:
        raise SettingsError.naming(Setting("config"), f" {path}: unknown key(s) {', '.join(map(repr, extra[:5]))}; "
                                   "a config file holds only \"model\" and \"train\"")
    for section, values in data.items():
        if not isinstance(values, dict):
            raise SettingsError.naming(Setting("config"), f" {path}: {section!r} must be a JSON object")
        unknown = sorted(set(values) - set(_fields(section)))
        if unknown:
            raise SettingsError.naming(Setting("config"), f" {path}: unknown {section} setting(s) "
                                       f"{', '.join(f'{section}.{k}' for k in unknown[:5])}")
    return data


def build_settings(preset_name: str, config: dict[str, dict] | None = None, sets: Iterable[str] = (),
                   where: str | Setting = Setting("config")) -> tuple[ModelConfig, TrainConfig]:
    """The preset's configs with ``config``'s sections and then each ``key=value`` of ``sets`` applied;
    ``where``: how a message names the origin of ``config``'s values."""
    if preset_name not in PRESETS:
        raise SettingsError(f"unknown preset {preset_name!r}; choose one of {', '.join(PRESETS)}")
    base = {"model": PRESETS[preset_name].to_dict(), "train": TRAIN_PRESETS[preset_name].to_dict()}
    values = {k: dict(v) for k, v in base.items()}
    origin: dict[str, tuple] = {}  # "section.name": the message parts that name where its value came from
    for section, given in (config or {}).items():
        values[section].update(given)
        origin.update({f"{section}.{k}": (where,) for k in given})
    for item in sets:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise SettingsError.naming(Setting("sets"), f" {item}: give KEY=VALUE, for example ", Setting("sets"),
                                       " model.d_model=512")
        value = parse_value(key, text)  # checks the section and the name first
        section, _, name = key.partition(".")
        values[section][name] = value
        origin[key] = (Setting("sets"), f" {key}")
    problems = recipe_value_problems(values)
    if problems:
        first = problems[0]
        key = first.split(" ", 1)[0]
        raise SettingsError.naming(*origin.get(key, ("settings",)), f": {first}")
    if values["model"] != base["model"] and "model.name" not in origin:
        values["model"]["name"] = "custom"
    try:
        cfg = ModelConfig.from_dict(values["model"])
        tcfg = TrainConfig.from_dict(values["train"])
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"model/train settings: {exc}") from None
    return cfg, tcfg
