"""The numba backend's helper threads (``backends.numba_cpu.tasks``): every share runs once, errors
reach the caller, and a sleeping helper, a second calling thread and a forked child are served."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest
from numba import njit

from lockstep.backends.numba_cpu import tasks


@njit(nogil=True)
def _mark(lo, hi, out, share):
    for i in range(lo, hi):
        out[i] += share * 1000 + 1


def _marks(count: int, parts: int) -> np.ndarray:
    out = np.zeros(count, dtype=np.int64)
    bounds = [count * i // parts for i in range(parts + 1)]
    tasks.split(lambda lo, hi: _mark(lo, hi, out, bounds.index(lo)), count, parts)
    return out


@pytest.mark.parametrize("count, parts", [(2, 2), (7, 3), (1000, 5), (5, 5)])
def test_every_task_runs_once_in_its_share(count, parts):
    out = _marks(count, parts)
    bounds = [count * i // parts for i in range(parts + 1)]
    expect = np.concatenate([np.full(bounds[i + 1] - bounds[i], i * 1000 + 1) for i in range(parts)])
    assert (out == expect).all()


def test_many_splits_in_a_row():
    for _ in range(2000):
        assert (_marks(64, 2) == np.repeat([1, 1001], 32)).all()


def test_an_error_in_a_helpers_share_reaches_the_caller_and_the_team_goes_on():
    def run(lo, hi):
        if lo > 0:
            raise ValueError(f"share {lo}..{hi}")

    with pytest.raises(ValueError, match="share 2..4"):
        tasks.split(run, 4, 2)
    assert (_marks(10, 2) == np.repeat([1, 1001], 5)).all()


def test_a_sleeping_helper_is_woken():
    _marks(4, 2)
    helper = tasks._TEAM.helpers[0]
    give_up = time.monotonic() + 120  # the helper sleeps after polling for SPIN_US; this only bounds a hang
    while not helper.asleep:
        assert time.monotonic() < give_up, "the helper never went to sleep"
        time.sleep(0.002)
    assert (_marks(10, 2) == np.repeat([1, 1001], 5)).all()
    assert not helper.asleep


def test_two_calling_threads_get_their_own_results():
    results: dict[int, bool] = {}

    def caller(k: int) -> None:
        ok = True
        for _ in range(300):
            ok &= bool((_marks(100 + k, 2) == np.repeat([1, 1001], [(100 + k) // 2, 100 + k - (100 + k) // 2])).all())
        results[k] = ok

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: True, 1: True, 2: True}


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="needs fork (Linux)")
def test_a_forked_child_gets_its_own_helpers():
    _marks(4, 2)  # the parent's helpers exist
    pid = os.fork()
    if pid == 0:  # the child: the parent's threads are not here
        ok = False
        try:
            ok = (_marks(10, 2) == np.repeat([1, 1001], 5)).all()
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


_FEATURES_PROBE = """
import json
from lockstep.backends.numba_cpu import int8gemm, reduce, tasks, tiles
print(json.dumps({"features": tasks.host_cpu_features(), "gemm": int8gemm.implementation(),
                  "ymm": reduce.YMM_TILES, "in_parts": tiles.FIXED_POINT_IN_PARTS}))
"""


def _features_probe(env: dict) -> dict:
    import json
    import subprocess

    proc = subprocess.run([sys.executable, "-c", _FEATURES_PROBE], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_named_cpu_features_decide_the_backends_paths():
    """``NUMBA_CPU_FEATURES`` is what Numba compiles for, so the backend's own choices follow it: with
    every AVX-512 feature off (``benchmarks/isa.py avx2``) an AVX-512 CPU takes the AVX2 paths; a CPU
    named without features takes the portable ones."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import isa
    finally:
        sys.path.pop(0)
    if "avx2" not in tasks.host_cpu_features():
        pytest.skip("not an x86 CPU with AVX2: there is no AVX2 environment to stand in with")
    env = isa.avx2_environment()
    got = _features_probe({"NUMBA_CPU_FEATURES": env["NUMBA_CPU_FEATURES"]})
    assert got["features"]["avx2"] is True and got["features"]["avx512f"] is False
    assert (got["gemm"], got["ymm"], got["in_parts"]) == ("avx2", True, True)
    portable = _features_probe({"NUMBA_CPU_NAME": "generic"})
    assert portable["features"] == {} and portable["gemm"] == "blas"


def test_a_kernels_helper_share_says_when_it_let_the_gil_go(monkeypatch):
    """A ``TaskKernel``'s helper share runs ``announced``: it stores the share's number once the GIL is
    let go (``_Helper.post`` polls for that), and computes what the plain kernel computes."""
    from lockstep.backends.numba_cpu import fp

    monkeypatch.setattr(tasks, "num_threads", lambda: 2)
    monkeypatch.setattr(tasks, "PARALLEL_MIN_WORK", 0)
    a = np.arange(3 * tasks.BLOCK, dtype=np.float32) - 1000
    b = np.full(a.size, 0.5, dtype=np.float32)
    out = np.empty_like(a)
    for _ in range(50):
        assert fp._add_kernel(a, b, out) == 3  # three blocks of tasks: one here, two on the helper
        assert out.tobytes() == (a + b).tobytes()  # exact: halves added to integers below 2**23
        helper = tasks._TEAM.helpers[0]
        assert helper.slots[24] == helper.slots[0] == helper.slots[8]
