"""The layers point one way: every import of lockstep goes to a layer below, and nothing is cyclic.

The graph is derived from the source (``ast``), lazy imports inside functions
included, so the picture in ``docs/layout.md`` cannot drift from the code:

    1  lockstep.fsio, lockstep.spec      untrusted-file helpers; the definition (pure NumPy)
    2  lockstep.contract                 the typed op table (read from the spec), named vectors
    3  lockstep.backends, .conformance   the backends; the suite a user runs on new hardware
    4  lockstep.formats                  what train writes and audit/use read (when present)
    5  lockstep.train                    model, optimizer, schedule, collectives, trainer
    6  lockstep.audit, lockstep.use      verify, replay, certificates; sample, eval, export
    7  lockstep.cli, lockstep.__main__   the command line

A module may import its own package and any layer below; within a layer, packages may
import each other only without a cycle. Module-level cycles are refused everywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "lockstep"

LAYERS: dict[str, int] = {
    "lockstep": 0,  # the package's own __init__ (its version): imports nothing
    "lockstep.errors": 0,  # the root of the errors lockstep raises on purpose: imports nothing
    "lockstep.launch": 0,  # the rank mpiexec gave this process, and the MPI world: imports nothing of lockstep
    "lockstep.fsio": 1,
    "lockstep.spec": 1,
    "lockstep.contract": 2,
    "lockstep.backends": 3,
    "lockstep.conformance": 3,
    "lockstep.formats": 4,
    "lockstep.train": 5,
    "lockstep.audit": 6,
    "lockstep.use": 6,
    "lockstep.cli": 7,
    "lockstep.__main__": 7,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imported_by(name: str, path: Path, node: ast.AST, modules: dict[str, Path]) -> list[str]:
    """The lockstep modules one ``import`` node of module ``name`` (file ``path``) imports ([] for any other node)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "lockstep"]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "lockstep":
        return []
    # `from lockstep import spec` imports the module lockstep.spec
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """``(imported lockstep module, line)`` for every import in the file, at any depth."""
    return [(target, node.lineno) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            for target in imported_by(name, path, node, modules)]


def package_of(module: str) -> str:
    for cut in range(module.count(".") + 1, 0, -1):
        prefix = ".".join(module.split(".")[:cut])
        if prefix in LAYERS:
            return prefix
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS (and docs/layout.md)")


def resolve(target: str, modules: dict[str, Path]) -> str:
    while target not in modules and "." in target:  # `import a.b.c` of a name inside a module
        target = target.rsplit(".", 1)[0]
    return target


def graph() -> dict[str, set[tuple[str, int]]]:
    modules = all_modules()
    return {name: {(resolve(t, modules), line) for t, line in imports_of(name, path, modules)}
            for name, path in modules.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_every_module_belongs_to_a_layer():
    for name in all_modules():
        package_of(name)


def test_no_import_goes_up_a_layer():
    bad = []
    for name, targets in graph().items():
        here = package_of(name)
        for target, line in sorted(targets):
            there = package_of(target)
            if there != here and LAYERS[there] > LAYERS[here]:
                bad.append(f"{name}:{line} imports {target} (layer {LAYERS[there]} {there} from layer "
                           f"{LAYERS[here]} {here})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_packages_within_a_layer_form_no_cycle():
    edges: dict[str, set[str]] = {}
    for name, targets in graph().items():
        here = package_of(name)
        edges.setdefault(here, set()).update(package_of(t) for t, _ in targets if package_of(t) != here)
    cycle = find_cycle(edges)
    assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_modules_form_no_cycle():
    """Package ``__init__`` files are modules like any other: an ``__init__`` that imports its submodules
    is an edge, so a submodule that imports something that imports the package back is a cycle."""
    edges = {name: {t for t, _ in targets if t != name} for name, targets in graph().items()}
    cycle = find_cycle(edges)
    assert cycle is None, "module cycle: " + " -> ".join(cycle)


def _fake_tree(tmp_path, monkeypatch, planted: dict[str, str]) -> None:
    """A copy of the package with ``planted`` files (path below ``lockstep/`` -> source) added; ROOT points at it."""
    fake = tmp_path / "lockstep"
    for p in ROOT.rglob("*.py"):
        dst = fake / p.relative_to(ROOT)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    for rel, source in planted.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(source, encoding="utf-8")
    monkeypatch.setitem(globals(), "ROOT", fake)


@pytest.mark.parametrize("source, expect", [
    ("from lockstep.train import trainer\n", "upward"),
    ("import lockstep.cli.train\n", "upward"),
])
def test_the_check_sees_an_upward_import(tmp_path, monkeypatch, source, expect):
    """The test itself can fail: a planted upward import in the spec is reported."""
    _fake_tree(tmp_path, monkeypatch, {"spec/planted.py": source})
    with pytest.raises(AssertionError, match=expect):
        test_no_import_goes_up_a_layer()


def test_the_check_sees_a_cycle_through_a_package_init(tmp_path, monkeypatch):
    """Registration by import: a registry that imports a package (lazily) whose ``__init__`` imports
    modules that import the registry. The cycle runs through the ``__init__``, and is reported."""
    _fake_tree(tmp_path, monkeypatch, {
        "conformance/planted_registry.py": "def load():\n    from . import planted_ops  # noqa: F401\n",
        "conformance/planted_ops/__init__.py": "from . import one  # noqa: F401\n",
        "conformance/planted_ops/one.py": "from ..planted_registry import load  # noqa: F401\n",
    })
    with pytest.raises(AssertionError, match="module cycle: .*planted_ops"):
        test_modules_form_no_cycle()
