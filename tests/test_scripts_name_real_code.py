"""The benchmark and tool scripts name only lockstep code that exists.

Most of them run only by hand or on a GPU machine, so a rename in the package (such as
``step.rank_contribution``, gone with the micro-batch tree) would otherwise surface only
when someone finally runs them there. Every ``from lockstep... import name`` in them,
at any depth, must resolve; a module whose optional package is missing here is skipped
by name (CuPy, PyObjC).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from lockstep.backends import BackendUnavailable

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("tools/*.py")])


def _lockstep_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "lockstep":
            out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "lockstep"]
    return out


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) >= 10 and any(p.name == "device_check.py" for p in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_lockstep_name_a_script_imports_exists(path):
    missing = []
    for line, module, names in _lockstep_imports(path):
        try:
            mod = importlib.import_module(module)
        except (ImportError, BackendUnavailable) as e:
            if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "lockstep":
                missing.append(f"line {line}: no module {module}")
            continue  # else an optional package this machine lacks: its names cannot be checked here
        for name in names:
            if name != "*" and not hasattr(mod, name):
                try:  # a submodule named in ``from package import submodule``
                    importlib.import_module(f"{module}.{name}")
                except ModuleNotFoundError:
                    missing.append(f"line {line}: {module} has no {name}")
    assert not missing, f"{path.relative_to(ROOT)}: " + "; ".join(missing)
