"""Measures of lockstep's structure, read from the source with ``ast`` (nothing is imported or run).

    python3 -m tools.structure_report            # the table
    python3 -m tools.structure_report --json     # the same numbers as JSON

What it counts, and why each is a cost:

* ``module cycles``: strongly connected groups of modules in the import graph (lazy
  imports inside functions and package ``__init__`` files included). A cycle means no
  module of it can be read, tested or changed alone.
* ``run_dir parameters``: functions that take a bare ``run_dir``; each re-reads some of
  the run's files and re-decides what they mean.
* ``run_dir walk from audit/accept.py``: a depth-first walk of the static call graph from
  the functions of ``audit/accept.py``, following only calls that pass a ``run_dir``
  argument to a lockstep function that takes one: the stops (functions reached) and the
  re-entries (a step back into a file the walk had already left).
* ``capability reads in train/``: ``.capabilities.X`` attribute reads in ``lockstep/train``;
  each is a place where the step asks what kind of backend it runs on.
* ``imports inside functions``: lockstep imports below a ``def``, per package.
* ``flag names outside cli/``: string literals outside ``lockstep/cli`` that name a
  command-line flag (``--word``); the library should speak in its own terms.
* ``exception classes``: classes lockstep defines that derive from an exception, and
  how many of them do not derive from the project's base error (when one exists).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_layering import all_modules, imported_by  # noqa: E402  (the layering test's one reading of imports)

ROOT = Path(__file__).resolve().parents[1] / "lockstep"
FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9]+(?:-[a-z0-9]+)*")
BASE_ERROR = "LockstepError"


def modules() -> dict[str, Path]:
    return all_modules()


def _trees(mods: dict[str, Path]) -> dict[str, ast.Module]:
    return {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in mods.items()}


def import_graph(mods, trees) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, tree in trees.items():
        for node in ast.walk(tree):
            for t in imported_by(m, mods[m], node, mods):
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != m:
                    graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
                continue
            if nxt not in index:
                index[nxt] = low[nxt] = counter[0]
                counter[0] += 1
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on:
                low[v] = min(low[v], index[nxt])
    return out


def _functions(tree: ast.Module):
    """``(qualified name, node)`` of every function and method."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{sub.name}", sub


def _params(fn) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def run_dir_functions(trees) -> dict[tuple[str, str], ast.AST]:
    return {(m, q): fn for m, tree in trees.items() for q, fn in _functions(tree) if "run_dir" in _params(fn)}


def _mentions_run_dir(expr) -> bool:
    """``run_dir``, ``self.run_dir``, ``Path(run_dir)``, ``run_dir / x``: an argument that carries the run's path."""
    return any((isinstance(n, ast.Name) and n.id == "run_dir") or (isinstance(n, ast.Attribute) and n.attr == "run_dir")
               for n in ast.walk(expr))


def run_dir_walk(mods, trees) -> tuple[int, int, int]:
    """``(stops, files, re-entries)`` of the walk from ``lockstep.audit.accept`` (module docstring)."""
    takers = run_dir_functions(trees)
    by_name: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for (m, q) in takers:
        by_name[q.rsplit(".", 1)[-1]].append((m, q))
        if q.endswith(".__init__"):  # calling the class runs its __init__
            by_name[q.rsplit(".", 1)[0]].append((m, q))
    start_mod = "lockstep.audit.accept"
    starts = [(start_mod, q) for q, _ in _functions(trees[start_mod])]
    seen: set[tuple[str, str]] = set()
    path_files: list[str] = []

    def calls_passing_run_dir(fn) -> list[str]:
        out = []
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                args = list(node.args) + [k.value for k in node.keywords]
                if not any(_mentions_run_dir(a) for a in args):
                    continue
                f = node.func
                callee = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if callee:
                    out.append(callee)
        return out

    def visit(key):
        if key in seen:
            return
        seen.add(key)
        path_files.append(key[0])
        m, q = key
        fn = dict(_functions(trees[m]))[q]
        for callee in calls_passing_run_dir(fn):
            cands = by_name.get(callee, [])
            local = [c for c in cands if c[0] == m]
            for c in (local or cands):
                visit(c)
                path_files.append(m)  # back in the caller's file

    for s in starts:
        visit(s)
    stops = len(seen)
    files = len({m for m, _ in seen})
    reentries, left = 0, set()
    prev = None
    for f in path_files:
        if f != prev:
            if f in left:
                reentries += 1
            if prev is not None:
                left.add(prev)
            prev = f
    return stops, files, reentries


def capability_reads(trees) -> int:
    n = 0
    for m, tree in trees.items():
        if not m.startswith("lockstep.train"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "capabilities":
                n += 1
    return n


def function_imports(mods, trees) -> tuple[Counter, Counter]:
    inside, total = Counter(), Counter()
    for m, tree in trees.items():
        pkg = m.split(".")[1] if "." in m else m
        for node in ast.walk(tree):
            if imported_by(m, mods[m], node, mods):
                total[pkg] += 1
        for _, fn in _functions(tree):
            for node in ast.walk(fn):
                if imported_by(m, mods[m], node, mods):
                    inside[pkg] += 1
    return inside, total


def flag_literals(trees) -> int:
    n = 0
    for m, tree in trees.items():
        if m.startswith("lockstep.cli") or m == "lockstep.__main__":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and FLAG_RE.search(node.value):
                n += 1
    return n


def exception_classes(trees) -> tuple[int, int]:
    """``(classes deriving from an exception, of those not deriving from BASE_ERROR)``."""
    bases: dict[str, list[str]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute)
                                    else "" for b in node.bases]

    def is_exc(name, depth=0) -> bool:
        if depth > 20:
            return False
        if name.endswith(("Error", "Exception", "Warning")) and name not in bases:
            return True  # a builtin exception
        return any(is_exc(b, depth + 1) for b in bases.get(name, []))

    def under_base(name, depth=0) -> bool:
        if name == BASE_ERROR:
            return True
        return depth < 20 and any(under_base(b, depth + 1) for b in bases.get(name, []))

    excs = [c for c in bases if is_exc(c) and c != BASE_ERROR]
    return len(excs), sum(not under_base(c) for c in excs)


def report() -> dict:
    mods = modules()
    trees = _trees(mods)
    graph = import_graph(mods, trees)
    cyc = cycles(graph)
    stops, files, reentries = run_dir_walk(mods, trees)
    inside, total = function_imports(mods, trees)
    excs, rootless = exception_classes(trees)
    return {
        "modules": len(mods),
        "module_cycles": len(cyc),
        "modules_in_cycles": sum(len(c) for c in cyc),
        "cycles": cyc,
        "run_dir_parameters": len(run_dir_functions(trees)),
        "run_dir_walk": {"stops": stops, "files": files, "re_entries": reentries},
        "capability_reads_in_train": capability_reads(trees),
        "imports_inside_functions": sum(inside.values()),
        "internal_imports": sum(total.values()),
        "imports_inside_functions_by_package": {k: [inside[k], total[k]] for k in sorted(total)},
        "flag_literals_outside_cli": flag_literals(trees),
        "exception_classes": excs,
        f"exception_classes_not_under_{BASE_ERROR}": rootless,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    r = report()
    if args.json:
        print(json.dumps(r, indent=2, sort_keys=True))
        return 0
    print(f"modules                         {r['modules']}")
    print(f"module cycles                   {r['module_cycles']} ({r['modules_in_cycles']} modules)")
    for c in r["cycles"]:
        print(f"    {', '.join(c)}")
    w = r["run_dir_walk"]
    print(f"run_dir parameters              {r['run_dir_parameters']}")
    print(f"run_dir walk from audit/accept  {w['stops']} stops in {w['files']} files, {w['re_entries']} re-entries")
    print(f"capability reads in train/      {r['capability_reads_in_train']}")
    print(f"imports inside functions        {r['imports_inside_functions']} of {r['internal_imports']}")
    for k, (a, b) in r["imports_inside_functions_by_package"].items():
        print(f"    {k:<12} {a} of {b}")
    print(f"flag names outside cli/         {r['flag_literals_outside_cli']}")
    print(f"exception classes               {r['exception_classes']} "
          f"({r[f'exception_classes_not_under_{BASE_ERROR}']} not under {BASE_ERROR})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
