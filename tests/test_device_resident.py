"""A training step whose state stays on the device (OpenCL on PoCL): the same trajectories as numba
and the spec, and a bound on what crosses between host and device.

Settings, chosen to keep this file cheap on 2 cores: tiny with ``--batch 6 --micro-batch 2`` (M = 3,
so the tree adds a right leaf into a left sum and a lone node moves up), 2 steps, int8 on and off,
trained as 1 step then resumed to 2 on opencl, and on 2 ranks (int8 on); small as one step of a
one window (M = 1: the tree's adds on the device are tiny's), int8 on, on one process (``tree_step``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from have_mpi import NO_MPI, have_mpi

from lockstep.backends import BackendUnavailable, get_backend
from lockstep.formats.config import preset, train_preset
from lockstep.formats.schedule import plan_step
from lockstep.spec import hashing
from lockstep.train.model import init_params
from lockstep.formats.state import AdamWState
from lockstep.train.step import GradLayout, tree_step
from lockstep.train.storage import DeviceVectorPool, step_storage
from lockstep.formats.state import state_tensors

try:
    _OPENCL = get_backend("opencl")
    _SKIP = None
except BackendUnavailable as e:  # pragma: no cover - depends on the machine
    _OPENCL, _SKIP = None, str(e)
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=f"opencl backend unavailable: {_SKIP}")

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "tiny", "--batch", "6", "--micro-batch", "2", "--quiet", "--checkpoint-every", "1"]


def _trajectory(run: Path) -> list[tuple[str, str]]:
    return [(r["state_root"], r["chain_hash"]) for r in map(json.loads, (run / "trajectory.jsonl").read_text().splitlines())]


def _train(args: list[str]) -> None:
    from lockstep.cli import main

    assert main(["train", *args]) == 0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """The embedded corpus, built once for every run here (``--data``)."""
    from lockstep.formats.corpus import default_corpus

    folder = tmp_path_factory.mktemp("corpus") / "data"
    default_corpus(folder, progress=lambda m: None)
    return str(folder)


@pytest.fixture(scope="module")
def numba_runs(tmp_path_factory, corpus):
    """The reference trajectories (numba, one process, 2 steps), int8 on and off."""
    pytest.importorskip("numba")
    out = {}
    for quantize in (True, False):
        run = tmp_path_factory.mktemp(f"numba-{quantize}") / "run"
        _train([*TINY, "--backend", "numba", "--steps", "2", "--out", str(run), "--data", corpus,
                *([] if quantize else ["--no-quantize"])])
        out[quantize] = _trajectory(run)
    return out


@pytest.mark.parametrize("quantize", [True, False])
def test_tiny_on_the_device_matches_numba_with_resume(tmp_path, corpus, numba_runs, quantize):
    run = tmp_path / "run"
    flags = [] if quantize else ["--no-quantize"]
    _train([*TINY, "--backend", "opencl", "--steps", "1", "--out", str(run), "--data", corpus, *flags])
    _train(["--resume", str(run), "--steps", "2", "--backend", "opencl", "--quiet", "--data", corpus])  # the state uploaded from step 1's checkpoint
    assert _trajectory(run) == numba_runs[quantize]
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all("transfer_bytes" in m for m in metrics)


def test_tiny_on_two_ranks_on_the_device_matches_numba(tmp_path, corpus, numba_runs):
    if not have_mpi():
        pytest.skip(NO_MPI)
    run = tmp_path / "run"
    env = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "lockstep.cli", "train", *TINY, "--backend", "opencl",
                        "--steps", "2", "--out", str(run), "--data", corpus], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _trajectory(run) == numba_runs[True]
    exchange = [json.loads(x)["transfer_bytes"]["exchange"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(e["out"] > 0 for e in exchange)  # the subtree sums crossed to the host for MPI


def _bound(cfg, plan, micro_batch: int) -> dict:
    """What one step without a checkpoint may copy, in bytes, per phase (1 rank).

    data in, per micro-batch of B windows (N = B * seq_len tokens): its token ids once as inputs and
    once as targets (int32: 8N, the window's tokens; the four ops that read them share one upload
    each), their grouping by id for the embedding backward (integer work on the host: the positions
    in id order and each id's first position, 4 * (N + vocab + 1)) and 1/n (4); the rope tables
    (cos and sin, seq_len * head_dim / 2 floats each) at most once a process, not per micro-batch.
    Nothing of the state or the gradients goes in.
    step out: the M micro-batch losses, the sum's loss, the norm, the clip coefficient and the
    norm once more for the record (4 * (M + 4)). hashing: the state's 32-byte leaves out and a
    24-byte segment-table entry per tensor in (without ``tensor_leaves``, the state's bytes out).
    Nothing crosses in the exchange or checkpoint; the int8 recipe's attention (SPEC_VERSION 4) runs in
    the kernels, so ``quantize`` moves nothing more."""
    bounds = plan.micro_batches(micro_batch)
    data_in = sum(8 * (stop - start) * cfg.seq_len + 4 * ((stop - start) * cfg.seq_len + cfg.vocab_size + 1) + 4
                  for start, stop in bounds) + 4 * cfg.seq_len * cfg.head_dim
    return {"data_in": data_in, "data_out": 0, "step_out": 4 * (len(bounds) + 4)}


def _one_step(backend, cfg, tcfg, params=None):
    params = init_params(cfg, 0) if params is None else params
    opt = AdamWState.zeros(params)
    params, opt = step_storage(backend, GradLayout.of(cfg).size).adopt(params, opt)
    plan = plan_step(tcfg, cfg.seq_len, 1)
    windows = np.random.default_rng(7).integers(0, cfg.vocab_size, size=(plan.n_windows, cfg.seq_len + 1))
    log = backend.capabilities.transfers
    if log is not None:
        log.take()
    res = tree_step(params, opt, windows, plan, cfg, tcfg, backend)
    return res, plan, (log.take() if log is not None else None)


def _check_bound(cfg, tcfg, moved, plan, res):
    b = _bound(cfg, plan, tcfg.micro_batch)
    state = state_tensors(res.params, res.opt)
    state_bytes = sum(x.nbytes for k, x in state.items() if k != "step")  # the step counter is a host value
    assert moved["data"]["in"] <= b["data_in"] and moved["data"]["out"] <= b["data_out"]
    assert moved["step"] == {"in": 0, "out": b["step_out"]}
    if _OPENCL.capabilities.tensor_leaves is None:
        assert moved["hashing"] == {"in": 0, "out": state_bytes}
    else:
        assert moved["hashing"]["in"] <= 24 * len(state) and 0 < moved["hashing"]["out"] <= 32 * sum(
            max(1, -(-x.nbytes // hashing.CHUNK_BYTES)) for x in state.values())
    assert moved["exchange"] == moved["checkpoint"] == {"in": 0, "out": 0}


def test_tiny_step_on_the_device_moves_only_tokens_scalars_and_digests():
    cfg, tcfg = preset("tiny"), train_preset("tiny", batch_ramp=((0, 6),), micro_batch=2)
    res, plan, moved = _one_step(_OPENCL, cfg, tcfg)
    _check_bound(cfg, tcfg, moved, plan, res)


@pytest.mark.parametrize("quantize", [True, False], ids=["int8", "float32"])
def test_small_step_on_the_device_matches_numba_and_its_transfers_are_bounded(quantize):
    pytest.importorskip("numba")
    cfg = preset("small", quantize=quantize)
    tcfg = train_preset("small", batch_ramp=((0, 1),), micro_batch=1)
    params = init_params(cfg, 0)
    res, plan, moved = _one_step(_OPENCL, cfg, tcfg, params)
    want, _, _ = _one_step(get_backend("numba"), cfg, tcfg, params)
    assert res.state_root == want.state_root
    assert (res.loss.tobytes(), res.grad_norm.tobytes()) == (want.loss.tobytes(), want.grad_norm.tobytes())
    _check_bound(cfg, tcfg, moved, plan, res)


def test_device_pool_reuses_its_own_vectors_only():
    pool = step_storage(_OPENCL, 10).pool
    assert isinstance(pool, DeviceVectorPool)
    a, b = pool.take(), pool.take()
    pool.give(a, a, _OPENCL.asarray(np.zeros(10, dtype=np.float32)), np.zeros(10, dtype=np.float32))
    assert pool.take() is a and pool.allocated == 2
    assert pool.take() is not b and pool.allocated == 3
    layout = GradLayout.of(preset("tiny"))
    assert step_storage(get_backend("spec"), layout.size).pool.__class__.__name__ == "VectorPool"
