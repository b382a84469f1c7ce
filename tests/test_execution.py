"""How a step holds memory never changes a bit (``lockstep.train.execution``).

Activation recomputation and the LM head in row chunks against the in-memory path:
trajectories (state root and loss after every step) compared byte for byte, on the spec
(tiny only: it is slow), numba and opencl (skipped without PoCL), int8 on and off; row
chunks that divide N, that do not, and of one row. And the two ops that make the chunks
exact are tested in ``tests/test_reduce.py`` (``matmul_accumulate``) and ``tests/test_loss.py``
(``cross_entropy_rows``).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from backend_cases import token_windows

from lockstep.backends import BackendUnavailable, get_backend
from lockstep.formats.config import preset, train_preset
from lockstep.formats.schedule import StepPlan, learning_rate
from lockstep.spec.hashing import state_root
from lockstep.train.execution import IN_MEMORY, Execution
from lockstep.train.model import init_params, loss_and_grads
from lockstep.train.optim import optimizer_step
from lockstep.formats.state import AdamWState
from lockstep.train.step import tree_step
from lockstep.formats.state import state_tensors


def _backend(name: str):
    try:
        return get_backend(name)
    except BackendUnavailable as e:
        pytest.skip(f"{name} backend unavailable: {e}")


@functools.lru_cache(maxsize=4)
def _initial(cfg):
    return init_params(cfg, seed=0)


def trajectory(be, cfg, tcfg, batch: int, steps: int, execution: Execution) -> list[tuple[str, bytes]]:
    """(state root, loss bits) after each of ``steps`` one-micro-batch steps."""
    params = dict(_initial(cfg))
    state = AdamWState.zeros(params)
    out = []
    for step in range(steps):
        lr = learning_rate(tcfg, step * batch * cfg.seq_len)
        loss, grads = loss_and_grads(params, token_windows(cfg, batch, step), cfg, be, execution=execution)
        params, state, _ = optimizer_step(params, grads, state, cfg, tcfg, lr, be)
        params = {k: be.to_numpy(v) for k, v in params.items()}
        state = AdamWState(state.step, {k: be.to_numpy(v) for k, v in state.m.items()},
                           {k: be.to_numpy(v) for k, v in state.v.items()})
        out.append((state_root(state_tensors(params, state)),
                    np.asarray(be.to_numpy(loss), dtype=np.float32).tobytes()))
    return out


# tiny, batch 2: N = 64 tokens; 24 does not divide it, 1 is a row per chunk, 64 is one chunk
TINY_WAYS = [Execution(recompute=True), Execution(head_rows=24), Execution(head_rows=1),
             Execution(recompute=True, head_rows=64)]


@pytest.mark.parametrize("backend_name, quantize, ways", [
    ("numba", True, TINY_WAYS), ("numba", False, TINY_WAYS),
    ("opencl", True, TINY_WAYS), ("opencl", False, TINY_WAYS[-1:])], ids=["numba-int8", "numba-float32",
                                                                       "opencl-int8", "opencl-float32"])
def test_tiny_trajectories_are_the_same_however_the_step_holds_memory(backend_name, quantize, ways):
    """Two steps: the second starts from weights the first updated."""
    be = _backend(backend_name)
    cfg, tcfg = preset("tiny", quantize=quantize), train_preset("tiny")
    want = trajectory(be, cfg, tcfg, 2, 2, IN_MEMORY)
    for way in ways:
        assert trajectory(be, cfg, tcfg, 2, 2, way) == want, way


@pytest.mark.parametrize("quantize, way", [(True, Execution(recompute=True, head_rows=24)),
                                            (False, Execution(recompute=True, head_rows=1))], ids=["int8", "float32"])
def test_tiny_on_the_spec_recomputed_and_chunked_is_in_memory(quantize, way):
    """One sequence (N = 32 tokens: 24 does not divide it), one step: the spec is slow."""
    be = get_backend("spec")
    cfg, tcfg = preset("tiny", quantize=quantize), train_preset("tiny")
    assert trajectory(be, cfg, tcfg, 1, 1, way) == trajectory(be, cfg, tcfg, 1, 1, IN_MEMORY)


def test_small_on_numba_recomputed_and_chunked_is_in_memory():
    """One micro-batch of small's width: its loss and every gradient, byte for byte."""
    be = _backend("numba")
    cfg = preset("small")
    params, windows = _initial(cfg), token_windows(cfg, 1, 0)
    want_loss, want = loss_and_grads(params, windows, cfg, be)
    loss, got = loss_and_grads(params, windows, cfg, be, execution=Execution(recompute=True, head_rows=100))
    assert np.asarray(loss).tobytes() == np.asarray(want_loss).tobytes()
    assert list(got) == list(want) and all(got[k].tobytes() == want[k].tobytes() for k in want)


def test_tree_step_passes_the_execution_through():
    """A whole step (tree of 3 micro-batches, then the update) through ``tree_step``'s keyword."""
    be = _backend("numba")
    cfg = preset("tiny")
    tcfg = dataclasses.replace(train_preset("tiny"), micro_batch=2, batch_ramp=((0, 6),))
    params = init_params(cfg, 5)
    windows = token_windows(cfg, 6, 0)
    plan = StepPlan(1, 0, 6, 0, cfg.seq_len)
    want = tree_step(params, AdamWState.zeros(params), windows, plan, cfg, tcfg, be)
    got = tree_step(params, AdamWState.zeros(params), windows, plan, cfg, tcfg, be,
                    execution=Execution(recompute=True, head_rows=40))
    assert got.state_root == want.state_root and got.loss.tobytes() == want.loss.tobytes()


def test_execution_refuses_a_head_rows_that_is_no_count():
    for bad in (0, -3, 2.5, "8"):
        with pytest.raises(ValueError, match="head_rows"):
            Execution(head_rows=bad)
