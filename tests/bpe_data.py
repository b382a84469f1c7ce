"""Data on a Hugging Face BPE tokenizer, for the tests of runs that use one.

Needs the optional ``tokenizers`` package (imported on call, so a test module can
import this one and skip its tests where the package is absent).
"""

from __future__ import annotations

import json
from pathlib import Path

from lockstep.formats.corpus import documents
from lockstep.formats.ingest import ingest


def train_bpe(texts: list[str], path: Path, split: str | None = None) -> None:
    """A BPE tokenizer of 200 tokens (``[UNK]`` and ``<eod>`` special) trained on ``texts``, saved as ``path``.

    Pre-tokenized on whitespace; with ``split``, first split on that regular expression.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), "isolated"),
                                                     pre_tokenizers.Whitespace()])
    tok.decoder = decoders.BPEDecoder()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]", "<eod>"]))
    tok.save(str(path))


def bpe_data(root: Path, eod_token: str | None = "<eod>", split: str | None = None) -> tuple[Path, list[str]]:
    """(data folder, texts): 30,000 bytes of the synthetic ``text`` source's documents, a tokenizer
    trained on them (``train_bpe``, saved as root/tok.json), and the data folder ingested with it
    under root/data (``eod_token`` as given, 8 validation documents)."""
    texts = [doc.decode() for doc in documents("text", 30_000)]
    train_bpe(texts, root / "tok.json", split)
    with open(root / "t.jsonl", "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    data = ingest(root / "data", [("t", root / "t.jsonl", 1)], tokenizer_file=root / "tok.json",
                  eod_token=eod_token, validation_documents=8).parent
    return data, texts
