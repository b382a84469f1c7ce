"""The PyTorch baseline computes lockstep's function: same loss and gradients (quantize off).

``benchmarks/torch_baseline.py`` is the "stock PyTorch" side of the reproducibility
tax (issue 11, and issue 16 reuses it on the CPU); a tax measured against a different
model would mean nothing. Needs torch (``pip install 'lockstep[bench]'``); skips without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (benchmark-only: pip install 'lockstep[bench]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import torch_baseline  # noqa: E402


def test_torch_baseline_matches_lockstep_loss_and_gradients():
    # Both sides are float32 with different summation orders (PyTorch's BLAS and
    # reductions vs lockstep's fixed orders): they agree to a few float32 ulps
    # amplified through two layers (measured worst 6e-7). A wrong block (GQA head
    # mapping, RoPE layout, missing QK-norm, window off by one, z-loss) gives errors
    # of order 1e-2 or more, so 1e-4 separates "same function" from "different".
    res = torch_baseline.check_against_lockstep("tiny", seed=7, batch=2)
    assert res["loss_rel"] < 1e-5, res
    bad = {k: v for k, v in res["grad_rel"].items() if not v < 1e-4}
    assert not bad, bad
