"""Tokenizers for the data pipeline: text -> token ids, and back for demos.

Two kinds, each with an *identity*: the JSON record that a data manifest stores under
``"tokenizer"`` so that anyone can tell which ids a shard holds.

``bytes`` (the default)
    Token ``b`` (0..255) is the byte ``b`` of the document's raw bytes (UTF-8 for
    text from .jsonl); ``EOD_ID = 256`` is the end-of-document separator the stream
    puts after every document. ``vocab_size = 257``. There is no padding id: every
    window the stream cuts is full, so nothing is ever padded.
    Identity: ``{"kind": "bytes", "vocab_size": 257, "eod_id": 256}``.

``hf-tokenizers``
    A Hugging Face ``tokenizers`` ``tokenizer.json``, loaded offline with
    ``Tokenizer.from_str`` (optional dependency: used only where the package
    imports) from the very bytes that were hashed: the file is read once, into
    memory, and never again. It is copied next to the manifest and recorded by SHA-256.
    The separator is ``--eod-token`` (an existing token, e.g. ``<|endoftext|>``) or,
    without one, a new id equal to the tokenizer's vocabulary size.
    Identity: ``{"kind": "hf-tokenizers", "file": "tokenizer.json", "sha256": HEX,
    "vocab_size": V, "eod_id": E, "eod_token": TOKEN or null}``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from lockstep.errors import LockstepError, Setting
from lockstep.fsio import read_named_file, read_regular

BYTE_VOCAB = 256  # one id per byte value
EOD_ID = 256  # the end-of-document separator of the byte tokenizer
BYTE_TOKENIZER_VOCAB_SIZE = BYTE_VOCAB + 1  # bytes plus the separator; no padding id

HF_TOKENIZER_FILE = "tokenizer.json"  # the name the copy gets in a data folder
MAX_TOKENIZER_BYTES = 256 << 20  # the largest published tokenizer.json files are tens of MB


class TokenizerError(LockstepError, ValueError):
    """A tokenizer that cannot be used; the message says which file and what to do."""


class ByteTokenizer:
    """Bytes in, bytes out: id b is byte b, ``EOD_ID`` ends a document."""

    kind = "bytes"
    vocab_size = BYTE_TOKENIZER_VOCAB_SIZE
    eod_id = EOD_ID

    def identity(self) -> dict:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "eod_id": self.eod_id}

    def encode(self, text: str | bytes) -> np.ndarray:
        """Token ids (uint8) of a document: its UTF-8 bytes, unchanged (no normalisation)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).copy()

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """``encode`` of each text."""
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        """Text of ids: the separator becomes a newline; invalid UTF-8 becomes U+FFFD."""
        ids = np.asarray(ids).reshape(-1)
        out = bytearray()
        for t in ids.tolist():
            if 0 <= t < BYTE_VOCAB:
                out.append(t)
            elif t == EOD_ID:
                out.extend(b"\n")
        return out.decode("utf-8", errors="replace")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hf_tokenizers_available() -> bool:
    """True where the optional ``tokenizers`` package imports."""
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


class HFTokenizer:
    """A ``tokenizers`` tokenizer.json, used offline, identified by its SHA-256."""

    kind = "hf-tokenizers"

    def __init__(self, path: str | Path, eod_token: str | None = None, expected_sha256: str | None = None,
                 data: bytes | None = None):
        """The tokenizer in ``data`` (the bytes of ``path``, read by the caller), or in the file ``path``.

        Either way the bytes are read once: their SHA-256 (``self.sha256``) is computed
        from the buffer the tokenizer is then built from, and ``self.data`` keeps it,
        so a copy (a data folder's, an export's) is written from the hashed bytes.
        """
        path = Path(path)
        if data is None:
            try:
                data = read_named_file(path, "tokenizer file", MAX_TOKENIZER_BYTES)
            except FileNotFoundError:
                raise TokenizerError(f"{path}: tokenizer file not found; pass the path of a tokenizer.json") from None
            except (OSError, ValueError) as e:
                raise TokenizerError(f"{path}: {e}") from None
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise TokenizerError(
                f"{path}: reading a Hugging Face tokenizer needs the optional 'tokenizers' package; "
                "install it (pip install tokenizers) or use the default byte tokenizer"
            ) from e
        self.path = path
        self.data = bytes(data)
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        if expected_sha256 is not None and self.sha256 != expected_sha256:
            raise TokenizerError(
                f"{path}: SHA-256 {self.sha256} differs from the manifest's {expected_sha256}; "
                "the tokenizer file was altered: restore it or re-ingest the data"
            )
        try:
            self._tok = Tokenizer.from_str(self.data.decode("utf-8"))
        except Exception as e:  # the library raises its own exception types (UnicodeDecodeError too)
            raise TokenizerError(f"{path}: not a readable tokenizer.json ({e}); check the file") from e
        base = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.eod_token = eod_token
        if eod_token is None:
            self.eod_id = base  # a new id, one past the tokenizer's own
            self.vocab_size = base + 1
        else:
            tid = self._tok.token_to_id(eod_token)
            if tid is None:
                raise TokenizerError.naming(f"{path}: the end-of-document token {eod_token!r} is not in the "
                                            "vocabulary; name an existing token or leave ", Setting("eod_token"),
                                            " out to add a new id")
            self.eod_id = int(tid)
            self.vocab_size = base

    def identity(self) -> dict:
        return {
            "kind": self.kind,
            "file": HF_TOKENIZER_FILE,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "eod_id": self.eod_id,
            "eod_token": self.eod_token,
        }

    def encode(self, text: str | bytes) -> np.ndarray:
        """Token ids (uint32) of a document, without added special tokens."""
        if isinstance(text, bytes):
            text = text.decode("utf-8")  # callers turn UnicodeDecodeError into a file error
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return np.asarray(ids, dtype=np.uint32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """``encode`` of each text, through the library's batch encoding (its threads, unless
        ``TOKENIZERS_PARALLELISM=false``): the same ids as one text at a time."""
        return [np.asarray(e.ids, dtype=np.uint32) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        ids = [int(t) for t in np.asarray(ids).reshape(-1).tolist() if int(t) != self.eod_id or self.eod_token]
        return self._tok.decode(ids, skip_special_tokens=False)

    def unrepresentable(self, text: str) -> tuple[int, str] | None:
        """The first character of ``text`` the tokenizer cannot represent, as ``(index, character)``:
        one it encodes as its unknown token, or one no token covers (whitespace aside, which
        pre-tokenizers drop). None when every character is represented."""
        import json

        enc = self._tok.encode(text, add_special_tokens=False)
        unk_token = json.loads(self._tok.to_str()).get("model", {}).get("unk_token")
        unk = self._tok.token_to_id(unk_token) if isinstance(unk_token, str) else None
        covered = np.zeros(len(text), dtype=bool)
        for tid, (a, b) in zip(enc.ids, enc.offsets):
            if unk is not None and tid == unk:
                return a, text[a:b] or text[a : a + 1]
            covered[a:b] = True
        for i, ch in enumerate(text):
            if not covered[i] and not ch.isspace():
                return i, ch
        return None


def tokenizer_from_identity(identity: dict, folder: Path):
    """The tokenizer a manifest names (``folder`` holds the manifest and its files).

    An ``hf-tokenizers`` file is read once, as a regular file inside ``folder``
    reached without symlinks, and its digest is compared with the identity's.
    """
    kind = identity.get("kind")
    if kind == ByteTokenizer.kind:
        return ByteTokenizer()
    if kind == HFTokenizer.kind:
        path = Path(folder) / str(identity["file"])
        try:
            data = read_regular(folder, identity["file"], "tokenizer file", MAX_TOKENIZER_BYTES)
        except FileNotFoundError:
            raise TokenizerError(f"{path}: tokenizer file missing; restore it or re-ingest the data") from None
        except (OSError, ValueError) as e:  # UnsafePath, NotRegularFile, FileFormatError
            raise TokenizerError(f"{e}; keep the tokenizer a regular file inside the data folder") from None
        return HFTokenizer(path, eod_token=identity.get("eod_token"), expected_sha256=identity["sha256"], data=data)
    raise TokenizerError(f"{folder}: unknown tokenizer kind {kind!r}; expected 'bytes' or 'hf-tokenizers'")
