"""``mpiexec -n R lockstep audit replay``: a step's micro-batches split over R processes, as training splits them.

The replay runs the trainer's own step (``step.step_over_ranks``); the tree does not
depend on R, so every R gives the same replayed state root, chain hash and MATCH, one
verdict (rank 0's), and says how it split the work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from have_mpi import needs_mpi

LOCKSTEP = [sys.executable, "-m", "lockstep.cli"]
MPI_ENV = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1")


@pytest.fixture(scope="module")
def run_every_4(tmp_path_factory):
    """A 5-step ``tiny`` run (3 micro-batches a step) with checkpoints at 4 and 5 only."""
    from lockstep.formats.config import preset, train_preset
    from lockstep.train.trainer import train

    out = tmp_path_factory.mktemp("every4") / "run"
    tcfg = dataclasses.replace(train_preset("tiny"), micro_batch=2, batch_ramp=((0, 6),))
    train(out, cfg=preset("tiny"), tcfg=tcfg, data="default", steps=5, checkpoint_every=4, progress=False,
          log=lambda *a, **k: None)
    return out


def _replay(run, ranks: int, steps: str, cert) -> subprocess.CompletedProcess:
    return subprocess.run(["mpiexec", "-n", str(ranks), *LOCKSTEP, "audit", "replay", str(run), "--step", steps,
                           "--backend", "spec", "--out", str(cert)],
                          capture_output=True, text=True, timeout=600, env=MPI_ENV)


@needs_mpi
def test_any_number_of_processes_gives_the_same_replay(run_every_4, tmp_path):
    seen = {}
    for ranks in (1, 2, 3):
        cert = tmp_path / f"cert-{ranks}.json"
        r = _replay(run_every_4, ranks, "3,5", cert)
        assert r.returncode == 0, f"R={ranks}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        assert r.stdout.count("certificate:") == 1, r.stdout  # one verdict, from rank 0
        if ranks > 1:
            assert f"on {ranks} processes (its 3 micro-batches split rank 0: 0.." in r.stderr, r.stderr
        else:
            assert "on one process" in r.stderr
        steps = json.loads(cert.read_text())["steps"]
        assert [s["step"] for s in steps] == [1, 2, 3, 5] and all(not s["differs"] for s in steps), steps
        seen[ranks] = [(s["step"], s["replayed"]["state_root"], s["replayed"]["chain_hash"]) for s in steps]
    assert seen[1] == seen[2] == seen[3]
