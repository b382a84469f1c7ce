"""One root for the errors lockstep raises on purpose, and what the command line does with the rest.

Every exception class lockstep defines derives from ``lockstep.errors.LockstepError``
(and keeps its built-in base); the CLI prints such an error as one line and exits 1,
while any other exception (a bug) ends with its traceback. ``--debug`` (or
``LOCKSTEP_DEBUG=1``) prints the traceback of a reported error too.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import lockstep
from lockstep.cli import main
from lockstep.errors import LockstepError
from lockstep.formats.config import ConfigError

OPTIONAL = ("cupy", "Metal", "objc", "Foundation", "pyopencl", "matplotlib", "torch", "transformers", "mpi4py")


def _lockstep_exception_classes() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(lockstep.__path__, "lockstep."):
        if info.name.endswith(".__main__"):  # runs the command line when imported
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError as exc:  # a backend whose optional package is not installed here
            if not any(name in str(exc) for name in OPTIONAL):
                raise
            continue
        except Exception as exc:  # noqa: BLE001 - a backend that refuses to load on this machine
            if type(exc).__name__.endswith("Unavailable"):
                continue
            raise
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found.append(obj)
    return found


def test_every_exception_lockstep_defines_derives_from_lockstep_error():
    classes = _lockstep_exception_classes()
    names = {c.__name__ for c in classes}
    assert {"RunFileError", "CheckpointError", "ReplayError", "UseError", "BackendUnavailable",
            "NonFiniteError", "ConfigError", "SpecVersionMismatch"} <= names, names
    # a private class (``audit.trace._Captured``) is control flow inside one module, never an error anyone sees
    outside = sorted(f"{c.__module__}.{c.__name__}" for c in classes
                     if not issubclass(c, LockstepError) and not c.__name__.startswith("_"))
    assert outside == [], outside


def test_each_keeps_the_builtin_base_callers_catch():
    from lockstep.formats.checkpoint import CheckpointError
    from lockstep.formats.rundir import RunFileError
    from lockstep.train.optim import NonFiniteError

    assert issubclass(RunFileError, ValueError) and issubclass(CheckpointError, RuntimeError)
    assert issubclass(NonFiniteError, FloatingPointError) and issubclass(ConfigError, ValueError)


def _train_raising(monkeypatch, exc: BaseException) -> None:
    from lockstep.train import trainer

    def raising(*a, **k):
        raise exc

    monkeypatch.setattr(trainer, "train", raising)


def test_an_error_raised_on_purpose_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("LOCKSTEP_DEBUG", raising=False)
    _train_raising(monkeypatch, ConfigError("seed must be an integer in [0, 2**64), got -1"))
    assert main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        "lockstep train: ConfigError: seed must be an integer in [0, 2**64), got -1")


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_debug_prints_the_traceback_of_a_reported_error(monkeypatch, tmp_path, capsys, how):
    monkeypatch.delenv("LOCKSTEP_DEBUG", raising=False)
    _train_raising(monkeypatch, ConfigError("a bad setting"))
    argv = ["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--steps", "1"]
    if how == "flag":
        argv = ["--debug", *argv]
    else:
        monkeypatch.setenv("LOCKSTEP_DEBUG", "1")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last):" in err and "raising" in err
    assert err.strip().splitlines()[-1] == "lockstep train: ConfigError: a bad setting"


def test_a_bug_deep_in_train_ends_with_its_traceback(monkeypatch, tmp_path):
    monkeypatch.delenv("LOCKSTEP_DEBUG", raising=False)
    _train_raising(monkeypatch, ValueError("operands could not be broadcast together"))
    with pytest.raises(ValueError, match="broadcast"):
        main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--steps", "1"])
