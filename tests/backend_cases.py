"""Checks every backend's test module shares: bit comparisons, conformance, whole training steps.

``tests/test_numba_backend.py``, ``tests/test_opencl_backend.py``, ``tests/test_cuda_backend.py``
and ``tests/test_metal_backend.py`` import these, so each backend is held to the same checks
written once; what a module adds is what only its backend has (tiles, caches, devices).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lockstep import spec
from lockstep.backends import get_backend
from lockstep.conformance import inputs as gen
from lockstep.conformance.runner import all_passed, print_table, run_conformance
from lockstep.spec.hashing import state_root
from lockstep.formats.config import preset, train_preset
from lockstep.train.model import init_params, loss_and_grads
from lockstep.train.optim import optimizer_step
from lockstep.formats.schedule import learning_rate
from lockstep.formats.state import AdamWState, state_tensors

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "benchmarks" / "data" / "device_check_reference.json"


def loaded_backend(name: str):
    """``(backend, pytestmark)``: the backend ``name`` loaded once for a test module, or None and a mark that
    skips the module with the reason it cannot run here."""
    from lockstep.backends import BackendUnavailable

    try:
        be, why = get_backend(name), None
    except BackendUnavailable as e:  # pragma: no cover - CI installs pyopencl[pocl]
        be, why = None, str(e)
    return be, pytest.mark.skipif(why is not None, reason=f"{name} backend unavailable: {why}")


def same_bits(want, got) -> bool:
    """Same dtype, shape and bytes (``got`` may be a device array: read through ``np.asarray``)."""
    want, got = np.asarray(want), np.asarray(got)
    return want.dtype == got.dtype and want.shape == got.shape and want.tobytes() == np.ascontiguousarray(got).tobytes()


def assert_same(want, got, what=""):
    """Each output of ``got`` (a tuple, or one array) has the bits of ``want``'s; on a difference, fail
    naming the output, its dtype and shape, how many float32 elements differ and the first three."""
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    assert len(wants) == len(gots), what
    for k, (w, g) in enumerate(zip(wants, gots)):
        if w is None or g is None:
            assert w is None and g is None, f"{what}[{k}]"
            continue
        g = np.asarray(g)
        if not same_bits(w, g):
            w = np.asarray(w)
            detail = ""
            if w.shape == g.shape and w.dtype == g.dtype == np.float32:
                d = np.nonzero(w.reshape(-1).view(np.uint32) != np.ascontiguousarray(g).reshape(-1).view(np.uint32))[0]
                detail = f": {d.size} elements differ, first at {d[:3]}: spec {w.reshape(-1)[d[:3]]}, backend {g.reshape(-1)[d[:3]]}"
            pytest.fail(f"{what}[out{k}] {w.dtype}{w.shape} vs {g.dtype}{g.shape}{detail}")


def random_values(tag: str, seed, shape, lo_exp: int, hi_exp: int) -> np.ndarray:
    """Random float32 with exponents in [lo_exp, hi_exp): products near 2**-126 when both are small."""
    return gen.random_normal_range(seed, (tag, *shape, lo_exp + 200), shape, lo_exp, hi_exp).copy()


def check_implements_every_spec_op(be, name: str) -> None:
    assert be.name == name
    assert set(be.ops) == set(spec.OPS)
    for op in spec.OPS:
        assert be.implements(op)


def check_conformance(be, level: int) -> list:
    """Every op at ``level``, seed 0: all pass (else fail with the runner's table); the results."""
    out = io.StringIO()
    results = run_conformance(be, level=level, seed=0, progress=False, out=out)
    if not all_passed(results):
        print_table(results, be, level, 0, out=out)
        pytest.fail(out.getvalue())
    assert len(results) == len(spec.OPS)
    return results


# ---------------------------------------------------------------- whole training steps

def token_windows(cfg, batch: int, step: int) -> np.ndarray:
    """Deterministic token windows (integer arithmetic only)."""
    b = np.arange(batch, dtype=np.int64)[:, None]
    t = np.arange(cfg.seq_len + 1, dtype=np.int64)[None, :]
    return ((b * 7919 + t * 31 + step * 104729) % cfg.vocab_size).astype(np.int64)


def train_steps(backend, cfg, tcfg, batch: int, steps: int, to_host: bool = False):
    """``steps`` optimizer steps of one micro-batch each: (state root, last loss, last grad norm).

    ``to_host``: bring parameters and moments back to host arrays after every step (what a
    checkpoint does), so the next step uploads them again."""
    params = init_params(cfg, seed=0)
    state = AdamWState.zeros(params)
    loss = norm = None
    for step in range(steps):
        lr = learning_rate(tcfg, step * batch * cfg.seq_len)
        loss, grads = loss_and_grads(params, token_windows(cfg, batch, step), cfg, backend)
        params, state, norm = optimizer_step(params, grads, state, cfg, tcfg, lr, backend)
        if to_host:
            params = {k: backend.to_numpy(v) for k, v in params.items()}
            state = AdamWState(state.step, {k: backend.to_numpy(v) for k, v in state.m.items()},
                               {k: backend.to_numpy(v) for k, v in state.v.items()})
    return state_root(state_tensors(params, state)), backend.to_numpy(loss), backend.to_numpy(norm)


def check_training_steps(be, preset_name: str, quantize: bool = True, batch: int | None = None, steps: int = 2,
                         to_host: bool = False) -> None:
    """``steps`` steps of ``preset_name`` on ``be`` give the spec's state root, last loss and grad norm."""
    cfg = preset(preset_name, quantize=quantize)
    tcfg = train_preset(preset_name)
    batch = tcfg.micro_batch if batch is None else batch
    want = train_steps(get_backend("spec"), cfg, tcfg, batch, steps)
    got = train_steps(be, cfg, tcfg, batch, steps, to_host=to_host)
    assert got[0] == want[0]
    assert same_bits(want[1], got[1]) and same_bits(want[2], got[2])


def cli_state_roots(run: dict, backend: str, out: Path) -> list[str]:
    """``lockstep train`` with a reference run's arguments on ``backend``: the state root of every step."""
    res = subprocess.run([sys.executable, "-m", "lockstep.cli", "train", *run["args"], "--backend", backend,
                          "--out", str(out), "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return [json.loads(x)["state_root"] for x in (out / "trajectory.jsonl").read_text().splitlines()]


def reference_run(name: str = "tiny-int8") -> tuple[dict, int]:
    """One run of ``benchmarks/data/device_check_reference.json`` and the SPEC_VERSION it was made for."""
    ref = json.loads(REFERENCE.read_text())
    return ref["runs"][name], ref["SPEC_VERSION"]


def check_train_and_replay(tmp_path: Path, capsys, pairs, replay_steps: str, min_matches: int = 1) -> None:
    """For each (train backend, replay backend): ``lockstep train --preset tiny --steps 2`` on the first,
    ``lockstep audit replay --step replay_steps`` on the second: no MISMATCH, at least ``min_matches`` MATCH."""
    from lockstep.cli import main

    for train_be, replay_be in pairs:
        run = tmp_path / f"run-{train_be}"
        assert main(["train", "--preset", "tiny", "--steps", "2", "--backend", train_be, "--out", str(run), "--quiet"]) == 0
        assert main(["audit", "replay", str(run), "--step", replay_steps, "--backend", replay_be]) == 0
        out = capsys.readouterr().out
        assert "MISMATCH" not in out and out.count("MATCH") >= min_matches, out


def check_int8_linear(be, tag: str, m: int, k: int, n: int) -> None:
    """The int8 linear layer of an (m, k) input and a (k, n) weight, forward and backward with and
    without the Hadamard rotation, on seeded inputs named by ``tag``: the spec's bits."""
    x = gen.random_uniform(0, (tag, m, k), (m, k), -2, 2)
    w = gen.random_uniform(0, (f"{tag}-w", k, n), (k, n), -0.1, 0.1)
    dy = gen.random_uniform(0, (f"{tag}-dy", m, n), (m, n), -1e-3, 1e-3)
    assert_same(spec.int8_linear_forward(x, w), be.int8_linear_forward(x, w), "int8 forward")
    for hadamard in (True, False):
        assert_same(spec.int8_linear_backward(dy, x, w, hadamard), be.int8_linear_backward(dy, x, w, hadamard),
                    f"int8 backward hadamard={hadamard}")
