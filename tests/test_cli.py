"""The command line's one convention: every command group registers itself, a broken module fails
loudly, and an optional package that is not installed is one line naming the package and extra."""

import subprocess
import sys

import pytest

import lockstep.cli
from lockstep.cli import build_parser, main

COMMANDS = ("version", "conformance", "data", "train", "audit", "sample", "eval", "export")


def test_every_command_is_registered():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)
    for name, p in sub.choices.items():
        assert callable(p.get_default("func")), name
    audit = sub.choices["audit"]
    audit_sub = next(a for a in audit._actions if a.dest == "audit_command")
    assert "verify-export" in audit_sub.choices


@pytest.mark.parametrize("module", ["-m lockstep.cli", "-m lockstep"])
def test_help_lists_every_command(module):
    r = subprocess.run([sys.executable, *module.split(), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in COMMANDS:
        assert name in r.stdout


def test_a_broken_command_module_surfaces():
    # before: `except ImportError: pass` dropped `lockstep audit` from --help without a word
    code = ("import sys; sys.modules['lockstep.cli.audit'] = None\n"
            "from lockstep.cli import main\n"
            "sys.exit(main(['--help']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" in r.stderr and "lockstep.cli.audit" in r.stderr


def test_missing_optional_package_is_one_line(tmp_path, monkeypatch, capsys):
    # launched as if by mpiexec, on a machine without mpi4py: the trainer imports it on use
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "1")
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    code = main(["train", "--preset", "tiny", "--backend", "spec", "--steps", "1", "--quiet",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1
    assert err == ("lockstep train: this needs the optional package 'mpi4py', which is not installed: "
                   "pip install 'lockstep[mpi]'\n")
    assert not (tmp_path / "run").exists()


def test_a_missing_lockstep_module_is_not_taken_for_an_optional_package(monkeypatch):
    def broken(args):
        import lockstep.no_such_module  # noqa: F401 - a bug, as a typo in an import would be

    monkeypatch.setattr(lockstep.cli.conformance, "cmd_version", broken)
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        main(["version"])


def test_usage_error_is_one_line_and_exit_1(capsys):
    assert main(["train", "--steps", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--steps" in err and "positive integer" in err


@pytest.mark.parametrize("command", ["replay", "check"])
def test_audit_backend_help_names_every_backend_get_backend_knows(command):
    """``audit replay/check --backend`` take any name ``get_backend`` knows (opencl included), and auto."""
    from lockstep.backends import BACKEND_ALIASES, FASTEST_FIRST, KNOWN_BACKENDS

    audit = next(a for a in build_parser()._actions if a.dest == "command").choices["audit"]
    p = next(a for a in audit._actions if a.dest == "audit_command").choices[command]
    (backend,) = [a for a in p._actions if "--backend" in a.option_strings]
    assert backend.default == "auto" and backend.choices is None
    words = backend.help.replace(",", " ").replace(";", " ").replace("(", " ").replace(")", " ").split()
    for name in ("auto", *KNOWN_BACKENDS, *BACKEND_ALIASES, *FASTEST_FIRST):
        assert name in words, name
    assert "opencl" in KNOWN_BACKENDS
