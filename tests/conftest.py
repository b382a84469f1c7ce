"""Shared test settings and fixtures.

Hypothesis profiles (``lockstep.conformance.search.register_profiles``): the suite runs
``lockstep-suite`` (derandomized, no example database, no deadline); ``deep`` is for
``python3 -m tools.conformance_search`` and ``pytest --hypothesis-profile=deep``.
``honest_run``: one small honest run that the hostile-input tests copy and attack.
``corpus``: the default corpus, written once per test module, for tests that train their own runs.

The suite runs on pytest-xdist workers (``addopts`` in pyproject.toml): one per core, at most
``MAX_WORKERS`` (each holds a few hundred MB and some tests start four MPI ranks).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

from lockstep.conformance.search import SUITE_PROFILE, register_profiles

register_profiles()
settings.load_profile(SUITE_PROFILE)

MAX_WORKERS = 8


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: this machine's cores, at most ``MAX_WORKERS``."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from lockstep.formats.corpus import default_corpus

    folder = tmp_path_factory.mktemp("corpus") / "default"
    default_corpus(folder)
    return folder


@pytest.fixture(scope="session")
def honest_run(tmp_path_factory) -> Path:
    """A 4-step single-rank ``tiny`` run, its data inside it (``data/``), checkpoints at 2 and 4.

    Trained in this process on the spec backend. Tests never change it: they attack a
    copy (``copy_run``).
    """
    from lockstep.formats.config import preset, train_preset
    from lockstep.train.trainer import train

    out = tmp_path_factory.mktemp("honest") / "run"
    tcfg = dataclasses.replace(train_preset("tiny"), micro_batch=2, batch_ramp=((0, 6),))
    train(out, cfg=preset("tiny"), tcfg=tcfg, data="default", steps=4, checkpoint_every=2, progress=False,
          log=lambda *a, **k: None)
    return out


@pytest.fixture
def copy_run(honest_run, tmp_path):
    """``copy_run()``: a fresh copy of the honest run under this test's tmp_path (symlinks kept)."""
    count = [0]

    def make() -> Path:
        count[0] += 1
        dst = tmp_path / f"run{count[0]}"
        shutil.copytree(honest_run, dst, symlinks=True)
        return dst

    return make
