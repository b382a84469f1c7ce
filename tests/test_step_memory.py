"""Where a step's vectors live: the in-place tree add, the trainer's vector pool, the
exchange's ``out`` buffer and the allocator settings. None of them may change a bit."""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lockstep.contract.capabilities import Capabilities
from lockstep.backends import get_backend
from lockstep.spec import fp, tree
from lockstep.train.collectives import tree_allreduce
from lockstep.formats.config import preset, train_preset
from lockstep.train.model import init_params
from lockstep.formats.schedule import StepPlan
from lockstep.train.step import GradLayout, micro_batch_value, subtree_sums
from lockstep.train.storage import VectorPool, in_place_add

F32 = np.float32
ROOT = Path(__file__).resolve().parents[1]


def _bits(x) -> bytes:
    return np.ascontiguousarray(x, dtype=F32).tobytes()


def _special_operands(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random bit patterns (every class: subnormals, infinities, NaN payloads, signed zeros)
    plus the pairs whose sums round, overflow or cancel."""
    rng = np.random.default_rng(seed)  # test inputs only; no published bit comes from here
    a = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(F32)
    b = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(F32)
    edge = np.array([0x7F7FFFFF, 0x00800000, 0x80800000, 0x00000001, 0x7F800000, 0xFF800000, 0x7FC00001, 0x80000000,
                     0x3F800000, 0x33800000], dtype=np.uint32).view(F32)
    a[: edge.size], b[: edge.size] = edge, edge[::-1]
    return a.copy(), b.copy()


@pytest.fixture(scope="module")
def numba_be():
    pytest.importorskip("numba", reason="the numba backend needs numba: pip install 'lockstep[numba]'")
    return get_backend("numba")


def test_add_into_gives_the_bits_of_add_whichever_operand_it_overwrites(numba_be):
    add_into = numba_be.capabilities.add_into
    a, b = _special_operands(100_003, 1)  # odd length: a short last block
    want = _bits(fp.add(a, b))
    assert _bits(numba_be.add(a, b)) == want
    assert _bits(add_into(a, b, np.empty_like(a))) == want
    for target in ("a", "b"):
        x, y = a.copy(), b.copy()
        out = x if target == "a" else y
        assert add_into(x, y, out) is out
        assert _bits(out) == want
        x, y = a.copy(), b.copy()  # the operand's elements through another view, as the butterfly passes them
        out = (x if target == "a" else y)[:]
        assert add_into(x, y, out) is out and _bits(out) == want
    x = a.copy()
    assert _bits(add_into(x, x, x)) == _bits(fp.add(a, a))  # all three the same elements


def test_add_into_refuses_what_it_cannot_write_in_place(numba_be):
    add_into = numba_be.capabilities.add_into
    a = np.ones(8, F32)
    with pytest.raises(TypeError):
        add_into(a, a.astype(np.float64), a)
    with pytest.raises(TypeError):
        add_into(a.reshape(2, 4), a.reshape(2, 4), a.reshape(2, 4))
    with pytest.raises(TypeError):
        add_into(np.ones(16, F32)[::2], a, a)  # not contiguous
    with pytest.raises(ValueError, match="lengths"):
        add_into(a, np.ones(7, F32), a)
    with pytest.raises(ValueError, match="overlaps"):
        add_into(a[:-1], a[:-1].copy(), a[1:])  # shifted by one element: not an in-place add
    ro = np.ones(8, F32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        add_into(a, a, ro)


def test_pool_hands_back_only_its_own_kind_of_vector_once():
    pool = VectorPool(6)
    v = pool.take()
    assert v.shape == (6,) and v.dtype == F32 and pool.allocated == 1
    pool.give(v, v, v[:3], np.ones(6, np.float64), np.ones(5, F32), np.ones(12, F32)[::2])
    assert pool.take() is v  # given twice, held once; the view, the float64 and the short one were left
    assert pool.take() is not v and pool.allocated == 2


def _tiny_step(m: int):
    cfg = preset("tiny")
    tcfg = dataclasses.replace(train_preset("tiny"), micro_batch=2, batch_ramp=((0, 2 * m),))
    windows = ((np.arange(2 * m)[:, None] * 7919 + np.arange(cfg.seq_len + 1)[None, :] * 31) % cfg.vocab_size)
    plan = StepPlan(1, 0, 2 * m, 0, cfg.seq_len)
    return cfg, tcfg, init_params(cfg, 3), windows.astype(np.int64), plan


@pytest.mark.parametrize("m", [1, 3, 5])
def test_in_place_sums_from_a_reused_pool_are_the_spec_tree(numba_be, m):
    """The trainer's path (pool, in-place adds, vectors given back and reused for the next
    step) against ``spec.tree.tree_sum`` of fresh vectors with the spec's add."""
    cfg, tcfg, params, windows, plan = _tiny_step(m)
    layout = GradLayout.of(cfg)
    leaves = [micro_batch_value(params, windows[a:b], cfg, plan.n_global, numba_be, layout)
              for a, b in plan.micro_batches(tcfg.micro_batch)]
    want = _bits(tree.tree_sum([v.copy() for v in leaves], add=fp.add))
    pool = VectorPool(layout.size)
    for _ in range(3):  # three "steps" on the same pool
        [(lo, hi, got)] = subtree_sums(params, windows, plan, 0, m, cfg, tcfg, numba_be, pool)
        assert (lo, hi) == (0, m) and _bits(got) == want
        pool.give(got)
    assert pool.allocated <= tree.depth(m) + 2  # the sums alive at once, plus the micro-batch being made
    # a range's maximal subtrees, as a rank computes them, are the spec's subtree sums
    for lo, hi in ((0, m), (m // 2, m)):
        parts = subtree_sums(params, windows, plan, lo, hi, cfg, tcfg, numba_be, pool)
        assert [(a, b) for a, b, _ in parts] == tree.maximal_subtrees(lo, hi, m)
        for a, b, v in parts:
            assert _bits(v) == _bits(tree.tree_sum([x.copy() for x in leaves[a:b]], add=fp.add))
            pool.give(v)


def test_a_backend_without_add_into_adds_through_its_own_add(numba_be):
    be = dataclasses.replace(numba_be, capabilities=Capabilities())
    pool = VectorPool(5)
    a, b = pool.take(), pool.take()
    a[:], b[:] = np.array([1, 2**-24, -0.0, 3e38, 1], F32), np.array([2**-24, 1, 0.0, 3e38, -1], F32)
    want = _bits(fp.add(a, b))
    got = in_place_add(be, pool)(a, b)
    assert got is a and _bits(got) == want
    assert pool.take() is b  # the right operand went back to the pool


class _OneRank:
    def Get_size(self) -> int:  # noqa: N802 - mpi4py's names
        return 1

    def Get_rank(self) -> int:  # noqa: N802
        return 0


def test_exchange_writes_into_the_given_buffer_and_refuses_an_aliased_one():
    v = np.arange(7, dtype=F32)
    out = np.full(7, np.nan, F32)
    assert tree_allreduce(_OneRank(), [(0, 1, v)], 1, 7, out=out) is out
    assert _bits(out) == _bits(v)
    fresh = tree_allreduce(_OneRank(), [(0, 1, v)], 1, 7)
    assert fresh is not v and _bits(fresh) == _bits(v)
    with pytest.raises(ValueError, match="shares memory"):
        tree_allreduce(_OneRank(), [(0, 1, v)], 1, 7, out=v)
    with pytest.raises(TypeError):
        tree_allreduce(_OneRank(), [(0, 1, v)], 1, 7, out=np.empty(6, F32))


# ---------------------------------------------------------------- the allocator settings

_FAULTS = r"""
import resource, sys
import numpy as np
from lockstep.train.malloc import keep_freed_memory
print(keep_freed_memory())
def faults_of_a_fresh_8_mib_array():
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.empty(2 << 20, np.float32)
    a[:] = 1.0  # touch every page
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    del a
    return f
print([faults_of_a_fresh_8_mib_array() for _ in range(4)])
"""


def _run_faults(env_extra: dict) -> tuple[str, list[int]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return out[0], [int(x) for x in out[1].strip("[]").split(",")]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator settings are glibc's (mallopt)")
def test_freed_memory_is_reused_without_page_faults():
    """An 8 MiB array freed and made again: with the settings its pages stay the heap's own
    (measured: 0 faults after the first array), without them glibc maps it afresh every
    time (measured: 516 faults per array on this x86-64 kernel, which faults anonymous
    memory in by more than one 4 KiB page at a time). Counts page faults, not time."""
    said, faults = _run_faults({})
    assert said.startswith("kept")
    assert all(f < 64 for f in faults[1:]), faults  # the first array grows the heap once
    said, faults = _run_faults({"MALLOC_TRIM_THRESHOLD_": "131072"})  # the user's choice: glibc's mmap path
    assert said == "left alone: the environment sets MALLOC_TRIM_THRESHOLD_"
    assert all(f >= 256 for f in faults), faults  # every array mapped afresh: what the settings avoid


def test_keep_freed_memory_says_what_it_did_and_does_it_once():
    from lockstep.train import malloc

    first = malloc.keep_freed_memory()
    assert first.startswith(("kept", "left alone"))
    assert malloc.keep_freed_memory() is first


# ---------------------------------------------------------------- weights quantized once per step

def test_weights_quantized_once_inside_the_scope_give_the_same_bits(numba_be, monkeypatch):
    from lockstep.backends.numba_cpu import quant

    rng = np.random.default_rng(7)  # test inputs only
    w = rng.standard_normal((64, 96), dtype=np.float32)
    xs = [rng.standard_normal((2, 16, 64), dtype=np.float32) for _ in range(3)]
    dys = [rng.standard_normal((2, 16, 96), dtype=np.float32) for _ in range(3)]
    want = [(_bits(spec_out), _bits(dx), _bits(dw)) for spec_out, (dx, dw) in
            ((numba_be.int8_linear_forward(x, w), numba_be.int8_linear_backward(dy, x, w)) for x, dy in zip(xs, dys))]
    calls = []
    real = quant.weight_scale
    monkeypatch.setattr(quant, "weight_scale", lambda w2: calls.append(1) or real(w2))
    with numba_be.capabilities.weights_unchanged():
        with numba_be.capabilities.weights_unchanged():  # nested: the outer block owns the memo
            pass
        got = [(_bits(numba_be.int8_linear_forward(x, w)),) + tuple(_bits(g) for g in numba_be.int8_linear_backward(dy, x, w))
               for x, dy in zip(xs, dys)]
        w_other = w.copy()  # another array object: its own forms, even with equal values
        numba_be.int8_linear_forward(xs[0], w_other)
    assert got == want
    assert len(calls) == 2  # once for w, once for w_other: not once per call
    assert quant._memo is None  # dropped on leaving the block
    numba_be.int8_linear_forward(xs[0], w)
    numba_be.int8_linear_forward(xs[0], w)
    assert len(calls) == 4  # outside the block every call quantizes its weight
    kept: dict = {}  # a memo the caller keeps across blocks (the sampler's cached model does)
    for i, x in enumerate(xs):
        with numba_be.capabilities.weights_unchanged(kept):
            assert _bits(numba_be.int8_linear_forward(x, w)) == want[i][0]
    assert len(calls) == 5 and quant._memo is None
