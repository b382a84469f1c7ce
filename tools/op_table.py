"""The "Op -> files" table of ``docs/layout.md``, written from the op table (``lockstep.spec.OP_TABLE``).

    python3 tools/op_table.py            # exit 1 (and say so) when docs/layout.md's table is not this one
    python3 tools/op_table.py --write    # rewrite the table in docs/layout.md
    python3 tools/op_table.py --print    # print the table

One row per spec module of ``spec.OP_MODULES``: its ops in table order, and the file of each
layer, named by the convention every layer keeps (the module's name), each checked to exist.
``tests/test_op_table.py`` runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lockstep import spec  # noqa: E402 - after the path to this checkout
from lockstep.fsio import atomic_write_text  # noqa: E402

LAYOUT = ROOT / "docs" / "layout.md"
BEGIN = "<!-- the op table: written by `python3 tools/op_table.py --write` from lockstep.spec.OP_TABLE -->"
END = "<!-- end of the op table -->"


def module_files(module: str) -> dict[str, list[str]]:
    """The files of one spec module in every layer, relative to the checkout (tests: every
    ``tests/test_<module>.py`` and ``tests/test_<module>_*.py``)."""
    tests = sorted(p.relative_to(ROOT).as_posix() for pattern in (f"test_{module}.py", f"test_{module}_*.py")
                   for p in (ROOT / "tests").glob(pattern))
    return {
        "spec": [f"lockstep/spec/{module}.py"],
        "numba": [f"lockstep/backends/numba_cpu/{module}.py"],
        "kernel": [f"lockstep/backends/kernels/{module}.kc", f"lockstep/backends/kernels/{module}.py"],
        "conformance": [f"lockstep/conformance/ops/{module}.py"],
        "tests": tests,
    }


def missing_files() -> list[str]:
    """Every file the convention names that is not there (a module without tests counts)."""
    out = []
    for module in spec.OP_MODULES:
        files = module_files(module)
        if not files["tests"]:
            out.append(f"tests/test_{module}.py")
        out += [f for fs in files.values() for f in fs if not (ROOT / f).is_file()]
    return out


def _short(path: str) -> str:
    return path.removeprefix("lockstep/")


def table() -> str:
    """The markdown table, one row per op module, ops in ``OP_TABLE`` order."""
    lines = ["| spec module | ops | spec | numba | kernel + host code | conformance (cases, strategy, regressions) | tests |",
             "|---|---|---|---|---|---|---|"]
    for module in spec.OP_MODULES:
        ops = " ".join(op.name for op in spec.OP_TABLE if op.module == module)
        f = module_files(module)
        kc, host = f["kernel"]
        cells = [module, ops, f"`{_short(f['spec'][0])}`", f"`{_short(f['numba'][0])}`",
                 f"`{_short(kc)}`, `{Path(host).name}`", f"`{_short(f['conformance'][0])}`",
                 ", ".join(f"`{t}`" for t in f["tests"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def with_table(text: str) -> str:
    """``text`` (docs/layout.md) with the part between the markers replaced by ``table()``."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{LAYOUT.relative_to(ROOT)}: the op table's markers are missing ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}{END}{tail}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="rewrite the table in docs/layout.md")
    p.add_argument("--print", action="store_true", help="print the table")
    args = p.parse_args(argv)
    if args.print:
        print(table(), end="")
        return 0
    missing = missing_files()
    if missing:
        print("op_table: files the op table names are missing: " + ", ".join(missing), file=sys.stderr)
        return 1
    text = LAYOUT.read_text(encoding="utf-8")
    want = with_table(text)
    if args.write:
        if want != text:
            atomic_write_text(LAYOUT, want)
        print(f"wrote the op table in {LAYOUT.relative_to(ROOT)}")
        return 0
    if want != text:
        print(f"op_table: the table in {LAYOUT.relative_to(ROOT)} is not the op table's; "
              "run `python3 tools/op_table.py --write`", file=sys.stderr)
        return 1
    print("the op table in docs/layout.md matches lockstep.spec.OP_TABLE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
