"""``lockstep data``: build data folders (token shards + manifest.json).

    lockstep data ingest --out DIR [NAME=]PATH ... [--weight NAME=W ...]
                         [--tokenizer tokenizer.json [--eod-token TOKEN]]
                         [--text-field text] [--shard-tokens N] [--validation-documents N]
    lockstep data default --out DIR
    lockstep data verify DIR

``ingest``: each PATH is a folder (every .txt and .jsonl file under it, in sorted
order) or one such file, and becomes one source, named NAME or after the path. A .txt
file is one document; a .jsonl file holds one JSON object per line whose ``text``
field (``--text-field``) is a document. ``--weight NAME=W`` sets a source's mixing
weight (default 1; only ratios matter). The default tokenizer is bytes; with
``--tokenizer`` a Hugging Face ``tokenizer.json`` is used offline (needs the
``tokenizers`` package) and copied into DIR. ``--validation-documents N``: each source
holds out its last N documents (in sorted file order) for ``lockstep eval``; training
never sees them.
``default``: the embedded synthetic corpus (math, code, text), built offline.
``verify``: check a data folder's digests, paths and token ids, and summarise it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lockstep.formats.ingest import DEFAULT_SHARD_TOKENS, ingest
from lockstep.formats.manifest import SOURCE_NAME_RE, DataError, Manifest
from lockstep.fsio import printable

from .common import EXIT_ERROR, EXIT_OK, note, plain_help


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``data`` subcommand (``ingest``, ``default``, ``verify``) to ``subparsers``."""
    p = subparsers.add_parser("data", help="build and check training data folders", description=plain_help(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="data_command", metavar="{ingest,default,verify}")
    sub.required = True

    ing = sub.add_parser("ingest", help="tokenize .txt/.jsonl documents into a new data folder")
    ing.add_argument("sources", nargs="+", metavar="[NAME=]PATH", help="a folder of .txt/.jsonl files, or one file")
    ing.add_argument("--out", required=True, type=Path, help="the new data folder (must not exist or be empty)")
    ing.add_argument("--weight", action="append", default=[], metavar="NAME=W", help="mixing weight of a source (default 1)")
    ing.add_argument("--tokenizer", type=Path, help="a Hugging Face tokenizer.json (default: bytes)")
    ing.add_argument("--eod-token", help="the tokenizer's end-of-document token (default: a new id)")
    ing.add_argument("--text-field", default="text", help="the text field of .jsonl lines (default: text)")
    ing.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard at most")
    ing.add_argument("--validation-documents", type=int, default=0, metavar="N",
                     help="hold out the last N documents of each source for validation (default 0)")

    dfl = sub.add_parser("default", help="build the embedded synthetic corpus (no download)")
    dfl.add_argument("--out", required=True, type=Path, help="the new data folder")

    ver = sub.add_parser("verify", help="check a data folder and summarise it")
    ver.add_argument("path", type=Path, help="a data folder or its manifest.json")
    p.set_defaults(func=run_data)
    return p


def _parse_sources(specs: list[str], weights: list[str]) -> list[tuple[str, Path, str]]:
    out: list[tuple[str, Path, str]] = []
    for spec in specs:
        name, eq, rest = spec.partition("=")
        if eq and SOURCE_NAME_RE.match(name):
            path = Path(rest)
        else:
            path = Path(spec)
            name = path.stem if path.suffix.lower() in (".txt", ".jsonl") else path.name
            if not SOURCE_NAME_RE.match(name):
                raise DataError(f"{spec}: cannot name a source {name!r}; write NAME=PATH with a name like web or code_1")
        out.append((name, path, "1"))
    names = [n for n, _, _ in out]
    for w in weights:
        name, eq, value = w.partition("=")
        if not eq or name not in names:
            raise DataError(f"--weight {w}: expected NAME=W with NAME one of {', '.join(names)}")
        i = names.index(name)
        out[i] = (name, out[i][1], value)
    return out


def _summary(manifest_path: Path) -> str:
    m = Manifest.load(manifest_path)
    lines = [f"{m.path}  sha256 {m.sha256}", f"  tokenizer {m.tokenizer_identity}"]
    for s in m.sources:
        held = f" ({s.validation_documents} held out for validation)" if s.validation_documents else ""
        lines.append(f"  {s.name}: weight {s.weight}, {s.documents} documents{held}, {s.tokens} tokens, "
                     f"{len(s.shards)} shards")
    return "\n".join(printable(line) for line in lines)  # names and keys come from the manifest: escaped


def run_data(args) -> int:
    """Run ``lockstep data ...``; returns the exit status (1 on bad input)."""
    try:
        if args.data_command == "ingest":
            sources = _parse_sources(args.sources, args.weight)
            path = ingest(
                args.out, sources, tokenizer_file=args.tokenizer, eod_token=args.eod_token,
                text_field=args.text_field, shard_tokens=args.shard_tokens, progress=note,
                validation_documents=args.validation_documents,
            )
        elif args.data_command == "default":
            from lockstep.formats.corpus import build_default_corpus

            path = build_default_corpus(args.out, progress=note)
        elif args.data_command == "verify":
            path = args.path
        else:
            raise DataError(f"unknown data command {args.data_command!r}")
        print(_summary(path))
    except DataError as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
