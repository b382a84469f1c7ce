"""Every document the code, tests, tools and docs cite is in the repository.

A citation of a document outside the repository ("see DESIGN.md", "GPU-NOTES 2.2") leaves
a reader of the code nothing to follow. Three kinds of reference are checked in every
tracked text file:

* a markdown document named in capitals (``README.md``, ``RESULTS.md``, ...): some tracked
  file has that name;
* a path under ``docs/``: that file exists;
* a capitalized document name followed by a section number (``NOTES 2.2``): the same as
  the first, with ``.md`` added.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DOC_NAME = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9_]*(?:-[A-Z0-9_]+)*\.md)\b")
DOCS_PATH = re.compile(r"\bdocs/[\w./-]*\w\.md\b")
SECTION_CITE = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+)(?:\.md)?\s+\d+\.\d+\b")
# Names that stand for a file the user names, not a document (placeholders in usage lines).
PLACEHOLDERS = {("tools/validate_metal.sh", "REPORT.md")}
SKIP_SUFFIXES = (".png", ".npy", ".safetensors")


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
        files = [f for f in out.splitlines() if (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file below the root
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    this = str(Path(__file__).resolve().relative_to(ROOT))  # its own examples are not citations
    return [f for f in files if not f.endswith(SKIP_SUFFIXES) and "/golden/" not in f and f != this]


def dangling_references(files: list[str], read=lambda f: (ROOT / f).read_text(encoding="utf-8", errors="replace")):
    names = {Path(f).name for f in files}
    paths = set(files)
    bad = []
    for f in files:
        text = read(f)
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in DOC_NAME.finditer(line):
                if m.group(1) not in names and (f, m.group(1)) not in PLACEHOLDERS:
                    bad.append(f"{f}:{lineno}: {m.group(1)}")
            for m in DOCS_PATH.finditer(line):
                if m.group(0) not in paths:
                    bad.append(f"{f}:{lineno}: {m.group(0)}")
            for m in SECTION_CITE.finditer(line):
                if f"{m.group(1)}.md" not in names:
                    bad.append(f"{f}:{lineno}: {m.group(0)}")
    return bad


def test_every_cited_document_is_in_the_repository():
    files = _tracked_files()
    assert "docs/numerical-contract.md" in files
    assert dangling_references(files) == []


def test_the_check_sees_outside_citations():
    texts = {"a.py": 'see DESIGN.md ("the four locks")\n', "b.h": "/* as GPU-NOTES 2.2 says */\n",
             "c.py": "docs/nowhere.md\n", "README.md": "docs/\n", "d.py": "README.md and SHA-256 1.5x\n"}
    bad = dangling_references(list(texts), read=texts.__getitem__)
    assert bad == ["a.py:1: DESIGN.md", "b.h:1: GPU-NOTES 2.2", "c.py:1: docs/nowhere.md"]
