"""The embedded default corpus: three small synthetic sources, built with no download.

``build_default_corpus(out_dir)`` writes a data folder (shards + ``manifest.json``)
that is the same, byte for byte, on every machine and Python version: every random
choice is an integer drawn from ``PhiloxStream(CORPUS_SEED, "lockstep.default-corpus",
source)`` and every generator below uses only integer arithmetic and ASCII string
operations (no floats, no sets, no ``hash()``). ``CORPUS_VERSION`` changes whenever
a generator does; ``tests/test_data.py`` pins the resulting bytes.

Sources (equal weights, about 1 MB of ASCII each, one byte per token):

``math``  arithmetic facts, multi-digit sums with their carries worked out, counting.
``code``  small programs in a toy language (``let``, assignment, ``repeat``, ``if``,
          ``print``) followed by the output of running them.
``text``  English-like sentences from a small grammar and word list, with
          number agreement and "a"/"an".

All three have short-range regularities a small byte-level model learns within a few
hundred steps (spelling, grammar, the format of facts and programs) and longer ones
(carrying, running a program) that keep the loss falling for longer.

Validation: each source holds out its last documents, the fewest whose tokens reach
``VALIDATION_TOKENS`` (``validation_documents`` in the manifest, see
``lockstep.formats.manifest``): a fixed slice that the training stream never yields and
``lockstep eval`` measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from lockstep.spec.philox import PhiloxStream

from .ingest import DataWriter
from .manifest import MANIFEST_NAME, Manifest
from .tokenizer import ByteTokenizer

CORPUS_VERSION = 1
CORPUS_SEED = 4  # any fixed integer: the corpus is one fixed draw, not a tunable
CORPUS_PURPOSE = "lockstep.default-corpus"
SOURCE_BYTES = 1_000_000  # each source stops after the document that reaches this many bytes
SHARD_TOKENS = 1 << 18  # about 4 shards a source, so shard order matters in the stream
SOURCES = ("math", "code", "text")
VALIDATION_TOKENS = 16_384  # per source: about 1.6% of it, ~64 windows of 257 tokens


class Draws:
    """Integer draws taken in order from one Philox stream (fetched in blocks)."""

    BLOCK = 1 << 16

    def __init__(self, stream: PhiloxStream):
        self.stream = stream
        self.pos = 0  # stream index of buf[0]
        self.buf: list[int] = []
        self.i = 0

    def u32(self) -> int:
        if self.i == len(self.buf):
            self.pos += len(self.buf)
            self.buf = self.stream.uint32(self.pos, self.BLOCK).tolist()
            self.i = 0
        self.i += 1
        return self.buf[self.i - 1]

    def below(self, n: int) -> int:
        """An integer in [0, n): ``(u * n) >> 32``."""
        return (self.u32() * n) >> 32

    def between(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        return lo + self.below(hi - lo + 1)

    def choice(self, seq):
        return seq[self.below(len(seq))]

    def chance(self, num: int, den: int) -> bool:
        """True with probability num/den."""
        return self.below(den) < num


# ---------------------------------------------------------------------------------
# math
# ---------------------------------------------------------------------------------


def _worked_sum(d: Draws) -> str:
    """A multi-digit sum with each column and carry written out."""
    a = d.between(10, 10 ** d.between(2, 5) - 1)
    b = d.between(10, 10 ** d.between(2, 5) - 1)
    lines = [f"add {a} and {b}:"]
    carry, col, x, y = 0, 0, a, b
    while x or y or carry:
        s = x % 10 + y % 10 + carry
        lines.append(f" column {col}: {x % 10} + {y % 10} + {carry} = {s}, write {s % 10} carry {s // 10}")
        carry, x, y, col = s // 10, x // 10, y // 10, col + 1
    lines.append(f"so {a} + {b} = {a + b}")
    return "\n".join(lines)


def _fact(d: Draws) -> str:
    kind = d.below(6)
    if kind == 0:
        a, b = d.between(0, 12), d.between(0, 12)
        return f"{a} * {b} = {a * b}"
    if kind == 1:
        a, b = d.between(0, 99), d.between(0, 99)
        return f"{a} + {b} = {a + b}"
    if kind == 2:
        a, b = d.between(0, 99), d.between(0, 99)
        return f"{max(a, b)} - {min(a, b)} = {max(a, b) - min(a, b)}"
    if kind == 3:
        b, q = d.between(1, 12), d.between(0, 12)
        return f"{b * q} / {b} = {q}"
    if kind == 4:
        a, b = d.between(100, 99999), d.between(100, 99999)
        return f"{a} + {b} = {a + b}"
    a, b = d.between(0, 999), d.between(0, 999)
    rel = "<" if a < b else ">" if a > b else "="
    return f"{a} {rel} {b}"


def math_document(d: Draws) -> str:
    """One math document: a times table, a run of mixed facts, a worked sum, or counting."""
    kind = d.below(4)
    if kind == 0:
        n = d.between(2, 12)
        return f"times table of {n}:\n" + "\n".join(f"{n} * {k} = {n * k}" for k in range(1, 13)) + "\n"
    if kind == 1:
        return "facts:\n" + "\n".join(_fact(d) for _ in range(d.between(6, 20))) + "\n"
    if kind == 2:
        return "\n\n".join(_worked_sum(d) for _ in range(d.between(1, 3))) + "\n"
    start, step = d.between(0, 200), d.between(1, 25)
    n = d.between(8, 20)
    return f"count from {start} by {step}: " + " ".join(str(start + step * k) for k in range(n)) + "\n"


# ---------------------------------------------------------------------------------
# code: a toy language and its interpreter
# ---------------------------------------------------------------------------------
# Expressions are ("num", v), ("var", name) or ("op", sym, left, right); a nested
# operation is always parenthesised, so no precedence rule is needed to read one.
# Statements: ("let", name, e), ("set", name, e), ("print", e),
# ("repeat", n, body), ("if", left, cmp, right, then, else).

_VARS = ("a", "b", "c", "n", "x", "y", "total", "count")
_OPS = ("+", "-", "*")
_CMPS = ("<", ">", "==")


def _expr(d: Draws, names: list[str], depth: int):
    if depth == 0 or d.chance(2, 5):
        if names and d.chance(3, 5):
            return ("var", d.choice(names))
        return ("num", d.between(0, 9))
    op = d.choice(_OPS)
    if op == "*":  # only ever times a digit, so values grow slowly
        return ("op", op, _expr(d, names, depth - 1), ("num", d.between(2, 9)))
    return ("op", op, _expr(d, names, depth - 1), _expr(d, names, depth - 1))


def _show(e, nested: bool = False) -> str:
    if e[0] == "num":
        return str(e[1])
    if e[0] == "var":
        return e[1]
    s = f"{_show(e[2], True)} {e[1]} {_show(e[3], True)}"
    return f"({s})" if nested else s


def _eval(e, env: dict) -> int:
    if e[0] == "num":
        return e[1]
    if e[0] == "var":
        return env[e[1]]
    a, b = _eval(e[2], env), _eval(e[3], env)
    return a + b if e[1] == "+" else a - b if e[1] == "-" else a * b


def _block(d: Draws, names: list[str], n: int, depth: int) -> list:
    out = []
    for _ in range(n):
        k = d.below(10)
        if not names or (k < 2 and len(names) < len(_VARS)):
            free = [v for v in _VARS if v not in names]
            v = d.choice(free)
            out.append(("let", v, _expr(d, names, 2)))
            names.append(v)
        elif k < 5:
            v = d.choice(names)
            # updates inside loops only add or subtract, so values stay small
            e = ("op", d.choice(("+", "-")), ("var", v), _expr(d, names, 0)) if depth else _expr(d, names, 2)
            out.append(("set", v, e))
        elif k < 7 or depth >= 2:
            out.append(("print", _expr(d, names, 1)))
        elif k < 9:
            out.append(("repeat", d.between(2, 4), _block(d, names[:], d.between(1, 2), depth + 1)))
        else:
            out.append(
                (
                    "if",
                    _expr(d, names, 0),
                    d.choice(_CMPS),
                    _expr(d, names, 0),
                    _block(d, names[:], d.between(1, 2), depth + 1),
                    _block(d, names[:], d.between(0, 1), depth + 1),
                )
            )
    return out


def _source_lines(stmts: list, indent: str = "") -> list[str]:
    lines = []
    for s in stmts:
        if s[0] == "let":
            lines.append(f"{indent}let {s[1]} = {_show(s[2])}")
        elif s[0] == "set":
            lines.append(f"{indent}{s[1]} = {_show(s[2])}")
        elif s[0] == "print":
            lines.append(f"{indent}print {_show(s[1])}")
        elif s[0] == "repeat":
            lines += [f"{indent}repeat {s[1]} {{", *_source_lines(s[2], indent + "  "), f"{indent}}}"]
        else:
            lines += [f"{indent}if {_show(s[1])} {s[2]} {_show(s[3])} {{", *_source_lines(s[4], indent + "  ")]
            if s[5]:
                lines += [f"{indent}}} else {{", *_source_lines(s[5], indent + "  ")]
            lines.append(f"{indent}}}")
    return lines


def _run(stmts: list, env: dict, out: list[int]) -> None:
    for s in stmts:
        if s[0] in ("let", "set"):
            env[s[1]] = _eval(s[2], env)
        elif s[0] == "print":
            out.append(_eval(s[1], env))
        elif s[0] == "repeat":
            for _ in range(s[1]):
                _run(s[2], env, out)
        else:
            a, b = _eval(s[1], env), _eval(s[3], env)
            hold = a < b if s[2] == "<" else a > b if s[2] == ">" else a == b
            _run(s[4] if hold else s[5], env, out)


CODE_VALUE_LIMIT = 10_000  # programs that print a number this large are drawn again


def code_document(d: Draws) -> str:
    """A program, then the lines it prints when run (drawn again until every printed
    value is below ``CODE_VALUE_LIMIT`` in magnitude)."""
    while True:
        stmts = _block(d, [], d.between(3, 8), 0)
        stmts.append(("print", ("var", d.choice([s[1] for s in stmts if s[0] == "let"]))))
        out: list[int] = []
        _run(stmts, {}, out)
        if all(-CODE_VALUE_LIMIT < v < CODE_VALUE_LIMIT for v in out):
            break
    return "program:\n" + "\n".join(_source_lines(stmts)) + "\noutput:\n" + "\n".join(map(str, out)) + "\n"


# ---------------------------------------------------------------------------------
# text: a small grammar
# ---------------------------------------------------------------------------------

_NAMES = ("Ann", "Tom", "Mia", "Sam", "Lena", "Omar", "Ivy", "Ben")
# (singular, plural)
_NOUNS = (
    ("cat", "cats"), ("dog", "dogs"), ("bird", "birds"), ("child", "children"), ("apple", "apples"),
    ("box", "boxes"), ("tree", "trees"), ("house", "houses"), ("ball", "balls"), ("book", "books"),
    ("river", "rivers"), ("owl", "owls"), ("egg", "eggs"), ("friend", "friends"), ("boat", "boats"),
    ("garden", "gardens"), ("mouse", "mice"), ("hill", "hills"), ("lamp", "lamps"), ("song", "songs"),
)
_ADJS = ("small", "big", "red", "old", "green", "happy", "quiet", "bright", "empty", "yellow", "orange", "tired")
# (third person singular, plural / base form)
_TRANS = (
    ("sees", "see"), ("finds", "find"), ("likes", "like"), ("carries", "carry"), ("watches", "watch"),
    ("follows", "follow"), ("paints", "paint"), ("opens", "open"), ("wants", "want"), ("helps", "help"),
)
_INTRANS = (("sleeps", "sleep"), ("runs", "run"), ("sings", "sing"), ("waits", "wait"), ("jumps", "jump"), ("smiles", "smile"))
_ADVS = ("slowly", "quickly", "again", "today", "at night", "in the morning")
_PREPS = ("near", "under", "behind", "next to", "inside")
_COUNTS = ("two", "three", "some", "many", "the")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _noun_phrase(d: Draws, plural: bool, allow_pp: bool = True) -> str:
    sg, pl = d.choice(_NOUNS)
    noun = pl if plural else sg
    adj = d.choice(_ADJS) if d.chance(2, 5) else ""
    head = f"{adj} {noun}" if adj else noun
    if plural:
        phrase = f"{d.choice(_COUNTS)} {head}"
    else:
        phrase = f"the {head}" if d.chance(1, 2) else f"{_article(head)} {head}"
    if allow_pp and d.chance(1, 5):
        phrase += f" {d.choice(_PREPS)} {_noun_phrase(d, d.chance(1, 3), False)}"
    return phrase


def _verb_phrase(d: Draws, plural: bool) -> str:
    k = d.below(5)
    if k < 2:
        v = d.choice(_TRANS)
        return f"{v[plural]} {_noun_phrase(d, d.chance(1, 3))}"
    if k < 4:
        v = d.choice(_INTRANS)
        return f"{v[plural]} {d.choice(_ADVS)}" if d.chance(1, 2) else v[plural]
    return f"{'are' if plural else 'is'} {d.choice(_ADJS)}"


def _clause(d: Draws, cast: tuple[str, ...]) -> str:
    k = d.below(6)
    if k < 2:
        s = f"{d.choice(cast)} {_verb_phrase(d, False)}"
    elif k < 4:
        s = f"{_noun_phrase(d, False)} {_verb_phrase(d, False)}"
    elif k < 5:
        s = f"{_noun_phrase(d, True)} {_verb_phrase(d, True)}"
    else:
        a, b = d.choice(cast), d.choice(cast)
        who = f"{a} and {b}" if a != b else "they"
        s = f"{who} {_verb_phrase(d, True)}"
    if d.chance(1, 6):
        s = f"then {s}" if d.chance(1, 2) else f"{s}, and then {_clause(d, cast)}"
    return s


def _sentence(d: Draws, cast: tuple[str, ...]) -> str:
    s = _clause(d, cast)
    return s[0].upper() + s[1:] + "."


def text_document(d: Draws) -> str:
    """A few paragraphs about a small cast of named characters."""
    cast = tuple(d.choice(_NAMES) for _ in range(d.between(1, 3)))
    paras = []
    for _ in range(d.between(1, 3)):
        paras.append(" ".join(_sentence(d, cast) for _ in range(d.between(3, 8))))
    return "\n".join(paras) + "\n"


GENERATORS: dict[str, Callable[[Draws], str]] = {"math": math_document, "code": code_document, "text": text_document}


def documents(source: str, target_bytes: int = SOURCE_BYTES) -> Iterator[bytes]:
    """The documents of one source, in order, until ``target_bytes`` is reached."""
    d = Draws(PhiloxStream(CORPUS_SEED, CORPUS_PURPOSE, CORPUS_VERSION, source))
    gen = GENERATORS[source]
    total = 0
    while total < target_bytes:
        doc = gen(d).encode("ascii")
        total += len(doc)
        yield doc


def build_default_corpus(out_dir: str | Path, progress: Callable[[str], None] | None = None) -> Path:
    """Write the default corpus to a new folder ``out_dir``; returns the manifest path."""
    tok = ByteTokenizer()
    desc = (f"lockstep default corpus v{CORPUS_VERSION} (synthetic math, code and text; built offline; "
            f"the last documents of each source, {VALIDATION_TOKENS}+ tokens, held out for validation)")
    with DataWriter(out_dir, tok, shard_tokens=SHARD_TOKENS, description=desc) as w:
        for name in SOURCES:
            sw = w.add_source(name, 1)
            docs = list(documents(name))
            for doc in docs:
                sw.add_document(tok.encode(doc))
            sw.validation_documents = held_out_count([len(d) for d in docs], VALIDATION_TOKENS)
            if progress:
                progress(f"default corpus: {name}: {sw.documents} documents, {sw.tokens} tokens, "
                         f"the last {sw.validation_documents} held out for validation")
        return w.commit()


def held_out_count(lengths: list[int], tokens: int) -> int:
    """The fewest last documents whose lengths sum to at least ``tokens``."""
    total, n = 0, 0
    while total < tokens and n < len(lengths) - 1:
        n += 1
        total += lengths[-n]
    return n


def default_corpus(folder: str | Path, progress: Callable[[str], None] | None = None) -> Manifest:
    """The default corpus in ``folder``, built there first if it holds no manifest."""
    folder = Path(folder)
    if not (folder / MANIFEST_NAME).is_file():
        build_default_corpus(folder, progress)
    return Manifest.load(folder)
