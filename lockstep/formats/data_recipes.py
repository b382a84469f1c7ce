"""Data recipes: named mixtures of public corpora that ``lockstep data ingest --recipe NAME`` builds
from local copies in one command, recorded in the manifest (``manifest``, version 3).

A recipe names its sources, the column or field that holds each one's text, and each source's
share of the *tokens* of the training stream. The stream mixes documents, not tokens, so the
weights written to the manifest are the document weights that give those token shares with the
counts the ingest measured (``manifest.recipe_weight``): a source of long documents (arXiv papers)
gets a smaller document weight than one of short ones (web pages) for the same share.

``open-1b``: the mixture of the Open-1B paper. Its sources and the one ratio the paper gives,
Proof-Pile-2's arXiv : OpenWebMath : Algebraic Stack = 29 : 15 : 11 (the subsets' sizes in
billions of tokens), at about 80% web. The paper gives no other top-level weights; these are
lockstep's choice, in units of 1/550 of the tokens:

=================  =====  ===========================================================
source              share  why
=================  =====  ===========================================================
dclm                  330  web, 60%: DCLM-Baseline, the larger general web corpus
fineweb-edu           110  web, 20%: FineWeb-Edu, the educational filter of the web
stack-v2               55  code, 10%: The Stack v2, its permissively licensed files
arxiv                  29  math, 10% split 29 : 15 : 11, as Proof-Pile-2's subsets are
open-web-math          15
algebraic-stack        11
=================  =====  ===========================================================

Web is 440/550 = 80%, as the paper says. Within the web, DCLM-Baseline : FineWeb-Edu = 3 : 1
keeps the broader corpus the bulk while the educational one, a few times smaller (1.3T tokens),
is read well under once. Code and math split the other 20% evenly: no reason given in the paper
favours either, and at 10% each of a 400B-token run (40B tokens) Proof-Pile-2, the smallest
source (55B tokens), is read 0.73 times, so no source repeats.
"""

from __future__ import annotations

from dataclasses import dataclass

from .manifest import DataError


@dataclass(frozen=True)
class RecipeSource:
    name: str        # the source's name in the manifest
    share: int       # its share of the stream's tokens, in the recipe's units
    text_field: str  # the JSON field or Parquet column of its text
    local_copy: str  # what to give as its path


@dataclass(frozen=True)
class DataRecipe:
    name: str
    version: int
    sources: tuple[RecipeSource, ...]
    tokenizer: str  # the tokenizer the recipe was meant for

    def record(self) -> dict:
        """The manifest's ``recipe`` object."""
        return {"name": self.name, "version": self.version,
                "token_shares": {s.name: s.share for s in self.sources}}

    def describe(self) -> str:
        total = sum(s.share for s in self.sources)
        lines = [f"data recipe {self.name} (version {self.version}); tokenizer: {self.tokenizer}"]
        for s in self.sources:
            lines.append(f"  {s.name}={s.local_copy}  [{100 * s.share / total:.1f}% of the tokens, text in "
                         f"{s.text_field!r}]")
        return "\n".join(lines)


OPEN_1B = DataRecipe("open-1b", 1, (
    RecipeSource("dclm", 330, "text",
                 "DCLM-Baseline (mlfoundations/dclm-baseline-1.0: .jsonl.zst shards)"),
    RecipeSource("fineweb-edu", 110, "text", "FineWeb-Edu (HuggingFaceFW/fineweb-edu: .parquet files)"),
    RecipeSource("stack-v2", 55, "content",
                 "The Stack v2, permissively licensed files with their contents (bigcode/the-stack-v2 ids, "
                 "contents fetched from Software Heritage: .parquet or .jsonl with a 'content' column)"),
    RecipeSource("arxiv", 29, "text", "Proof-Pile-2 arXiv (EleutherAI/proof-pile-2 arxiv/: .jsonl.zst)"),
    RecipeSource("open-web-math", 15, "text",
                 "Proof-Pile-2 OpenWebMath (EleutherAI/proof-pile-2 open-web-math/: .jsonl.zst)"),
    RecipeSource("algebraic-stack", 11, "text",
                 "Proof-Pile-2 Algebraic Stack (EleutherAI/proof-pile-2 algebraic-stack/: .jsonl.zst)"),
), "the Llama 3 tokenizer's tokenizer.json (128,256 ids: the open-1b preset's vocab_size), --eod-token "
   "'<|end_of_text|>'")

RECIPES: dict[str, DataRecipe] = {r.name: r for r in (OPEN_1B,)}


def data_recipe(name: str) -> DataRecipe:
    if name not in RECIPES:
        raise DataError(f"unknown data recipe {name!r}; the recipes are {', '.join(RECIPES)}")
    return RECIPES[name]
