"""How a step is executed, as opposed to what it computes.

A recipe (``formats.config``) fixes every trained bit. ``Execution`` only chooses how
much memory the same computation holds at once: every choice below gives the same
bits, byte for byte, which the tests check trajectory against trajectory. It is never
written into a recipe or hashed into H_0, so a run trained one way replays any other
way.

* ``recompute``: the forward keeps only each block's input; the backward recomputes
  the block (the same ops on the same inputs) just before differentiating it.
* ``head_rows``: the final norm, LM head and loss run over row chunks of this many
  tokens (``None``: the whole micro-batch at once), so the logits of a whole
  micro-batch never exist. The LM head's weight gradient continues its ascending
  contraction over tokens from chunk to chunk.
* ``scratch``: a folder for out-of-core state: the AdamW moments and the tree's live
  gradient sums are memory-mapped files there instead of RAM (``None``: RAM).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Execution:
    recompute: bool = False
    head_rows: int | None = None
    scratch: str | None = None

    def __post_init__(self):
        if self.head_rows is not None and (not isinstance(self.head_rows, int) or self.head_rows <= 0):
            raise ValueError(f"head_rows must be a positive number of tokens or None, got {self.head_rows!r}")


IN_MEMORY = Execution()
