"""``lockstep data``: build data folders (token shards + manifest.json).

    lockstep data ingest --out DIR [NAME=]PATH ... [--weight NAME=W ...]
                         [--tokenizer tokenizer.json [--eod-token TOKEN]]
                         [--text-field text] [--shard-tokens N] [--validation-documents N]
                         [--recipe NAME] [--workers N] [--resume] [--skip-empty]
    lockstep data recipe NAME
    lockstep data default --out DIR
    lockstep data verify DIR

``ingest``: each PATH is a folder (every document file under it, formats mixed) or one
document file, and becomes one source, named NAME or after the path. A .txt file is one
document; a .jsonl, .jsonl.gz or .jsonl.zst file holds one JSON object per line whose
``text`` field (``--text-field``) is a document; a .parquet file holds one document per
row, in its ``text`` column (``--text-field``). The shards and the manifest are the same
whatever the format. ``--weight NAME=W`` sets a source's mixing weight (default 1; only
ratios matter). ``--recipe NAME`` builds a data recipe (``lockstep data recipe NAME``
lists its sources): give NAME=PATH for each of its sources; the weights follow from its
token shares and the manifest records it. Tokenization runs on every core (``--workers``);
a progress line shows documents, tokens, MB/s and the time left. An interrupted ingest
continues with the same command and ``--resume``, to the same bytes. An empty document is
an error unless ``--skip-empty``. The default tokenizer is bytes; with
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

from lockstep.formats.corpus import build_default_corpus
from lockstep.formats.data_recipes import RECIPES, data_recipe
from lockstep.formats.documents import document_suffix
from lockstep.formats.ingest import DEFAULT_SHARD_TOKENS, ingest
from lockstep.formats.manifest import DataError, Manifest, SOURCE_NAME_RE
from lockstep.fsio import printable

from .common import EXIT_ERROR, EXIT_OK, note, plain_help, said


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``data`` subcommand (``ingest``, ``default``, ``verify``) to ``subparsers``."""
    p = subparsers.add_parser("data", help="build and check training data folders", description=plain_help(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="data_command", metavar="{ingest,recipe,default,verify}")
    sub.required = True

    ing = sub.add_parser("ingest", help="tokenize documents (.txt, .jsonl[.gz|.zst], .parquet) into a new data folder")
    ing.add_argument("sources", nargs="+", metavar="[NAME=]PATH", help="a folder of document files, or one file")
    ing.add_argument("--out", required=True, type=Path, help="the new data folder (must not exist or be empty)")
    ing.add_argument("--weight", action="append", default=[], metavar="NAME=W", help="mixing weight of a source (default 1)")
    ing.add_argument("--tokenizer", type=Path, help="a Hugging Face tokenizer.json (default: bytes)")
    ing.add_argument("--eod-token", help="the tokenizer's end-of-document token (default: a new id)")
    ing.add_argument("--text-field", default=None,
                     help="the text field of JSON lines and the text column of Parquet files (default: text)")
    ing.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard at most")
    ing.add_argument("--validation-documents", type=int, default=0, metavar="N",
                     help="hold out the last N documents of each source for validation (default 0)")
    ing.add_argument("--recipe", help="build a data recipe (lockstep data recipe NAME lists its sources)")
    ing.add_argument("--workers", type=int, default=None, help="processes that tokenize (default: every core)")
    ing.add_argument("--resume", action="store_true", help="continue an interrupted ingest of the same command")
    ing.add_argument("--skip-empty", action="store_true", help="skip empty documents instead of stopping")

    rec = sub.add_parser("recipe", help="show a data recipe's sources and token shares")
    rec.add_argument("name", help=f"the recipe ({', '.join(RECIPES)})")

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
            suffix = document_suffix(path)
            name = path.name[: len(path.name) - len(suffix)] if suffix else path.name
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
    if m.recipe:
        lines.append(f"  data recipe {m.recipe['name']} (version {m.recipe['version']}), token shares "
                     + ", ".join(f"{k} {v}" for k, v in m.recipe["token_shares"].items()))
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
            recipe = None
            if args.recipe is not None:
                recipe = data_recipe(args.recipe)
                if args.weight or args.text_field is not None:
                    raise DataError(f"--recipe {args.recipe}: the recipe sets every source's weight and text field; "
                                    "leave out --weight and --text-field")
            try:
                path = ingest(
                    args.out, sources, tokenizer_file=args.tokenizer, eod_token=args.eod_token,
                    text_field=args.text_field or "text", shard_tokens=args.shard_tokens, progress=note,
                    validation_documents=args.validation_documents, recipe=recipe, workers=args.workers,
                    resume=args.resume, skip_empty=args.skip_empty,
                )
            except KeyboardInterrupt:
                note("interrupted: run the same command with --resume to continue from the last shard")
                return EXIT_ERROR
        elif args.data_command == "recipe":
            print("\n".join(printable(line) for line in data_recipe(args.name).describe().splitlines()))
            return EXIT_OK
        elif args.data_command == "default":
            path = build_default_corpus(args.out, progress=note)
        elif args.data_command == "verify":
            path = args.path
        else:
            raise DataError(f"unknown data command {args.data_command!r}")
        print(_summary(path))
    except DataError as e:
        print(f"error: {printable(said(e))}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
