"""The PTX lint: what NVRTC emitted must be the arithmetic the spec defines, nothing looser.

Rules (docs/gpu-kernels.md, "PTX lint and self-test"), each a regular expression over one PTX instruction:

* ``fma``/``mad`` on a float type: a contracted ``a*b+c`` (one rounding where the spec
  has two). ``mad.lo.s32`` and other integer forms are fine.
* ``.ftz`` anywhere: hardware flush-to-zero decides tininess its own way (docs/gpu-kernels.md,
  "Subnormals on GPUs"),
  the spec rounds first and flushes by an exponent test in software.
* ``.approx`` anywhere, and the approximate-only instructions ``ex2 lg2 sin cos rsqrt
  tanh`` (``rcp`` unless ``.rn``): not correctly rounded.
* ``add sub mul div sqrt`` on f32 without ``.rn``: PTX may fuse an unrounded ``add``/``mul``
  pair into an FMA at JIT time, and ``div.full`` is approximate.
* ``cvt`` to f32 from an integer or f64 without ``.rn`` (rounding other than nearest even).
* ``atom``/``red`` on floats: the order of float atomics is the hardware's.

Scope: lint every module that lockstep loads as a backend kernel. The flush probe in
``benchmarks/`` uses ``.ftz`` on purpose (it measures NVIDIA's hardware FTZ) and is not
a backend kernel, so it is not linted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lockstep.errors import LockstepError

_FLOAT = r"(?:f16|f16x2|bf16|bf16x2|f32|f32x2|f64)"

# (rule name, compiled pattern, why)
# An instruction's opcode starts the statement, after an optional guard predicate (@%p1, @!%p1).
_OP = r"^(?:@!?%\w+\s+)?"

# (rule name, compiled pattern, why)
RULES: tuple[tuple[str, re.Pattern, str], ...] = (
    ("fma", re.compile(rf"{_OP}(?:fma|mad)(?:\.[a-z0-9]+)*\.{_FLOAT}\b"),
     "fused multiply-add on floats (compile with --fmad=false)"),
    ("ftz", re.compile(r"\.ftz\b"), "hardware flush-to-zero (compile with -ftz=false)"),
    ("approx", re.compile(r"\.approx\b"), "approximate instruction"),
    ("approx-only", re.compile(rf"{_OP}(?:ex2|lg2|sin|cos|rsqrt|tanh)(?:\.[a-z0-9]+)*\.{_FLOAT}\b"),
     "instruction that exists only approximately"),
    ("rcp", re.compile(rf"{_OP}rcp(?!(?:\.[a-z0-9]+)*\.rn\b)(?:\.[a-z0-9]+)*\.{_FLOAT}\b"),
     "reciprocal without .rn"),
    ("not-rn", re.compile(rf"{_OP}(?:add|sub|mul|div|sqrt)(?!(?:\.[a-z0-9]+)*?\.rn\b)(?:\.[a-z0-9]+)*\.f32(?:x2)?\b"),
     "f32 arithmetic without .rn (may be fused or approximated)"),
    ("cvt", re.compile(rf"{_OP}cvt(?!(?:\.[a-z0-9]+)*?\.rn\b)(?:\.[a-z0-9]+)*\.f32\.(?:[su](?:8|16|32|64)|f64)\b"),
     "conversion to f32 without .rn"),
    ("float-atomic", re.compile(rf"{_OP}(?:atom|red)(?:\.[a-z0-9]+)*\.{_FLOAT}\b"),
     "float atomic (order decided by the hardware)"),
)


@dataclass(frozen=True)
class LintFinding:
    module: str
    line_no: int
    rule: str
    why: str
    text: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line_no}: [{self.rule}] {self.why}: {self.text}"


def _statements(line: str) -> list[str]:
    """The statements of a PTX line: comments and directives dropped, split at ';' and braces
    (inline asm may put several instructions on one line)."""
    line = line.split("//", 1)[0]
    parts = [p.strip() for p in re.split(r"[;{}]", line)]
    return [p for p in parts if p and not p.startswith((".pragma", ".file", ".loc"))]


def lint_ptx(ptx: str, module: str = "<ptx>") -> list[LintFinding]:
    """Every rule violation in ``ptx`` (empty list: clean)."""
    findings = []
    for no, raw in enumerate(ptx.splitlines(), start=1):
        for text in _statements(raw):
            for rule, pattern, why in RULES:
                if pattern.search(text):
                    findings.append(LintFinding(module, no, rule, why, text))
    return findings


class PTXLintError(LockstepError, RuntimeError):
    """A kernel's PTX breaks lockstep's arithmetic rules."""


def check_ptx(ptx: str, module: str) -> None:
    """Raise ``PTXLintError`` listing the first findings if ``ptx`` is not clean."""
    findings = lint_ptx(ptx, module)
    if findings:
        head = "\n".join(str(f) for f in findings[:10])
        more = f"\n... and {len(findings) - 10} more" if len(findings) > 10 else ""
        raise PTXLintError(f"PTX of {module} breaks the arithmetic rules ({len(findings)} findings):\n{head}{more}")
