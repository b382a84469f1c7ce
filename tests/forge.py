"""What a dishonest trainer can do to its own run: rewrite records and redo every hash consistently.

Used by the hostile-input tests. Everything here goes through the library's own
definitions (``trainer.step_record``, ``hashing.record_chain_hash``, ``save_checkpoint``),
so a forgery is exactly as consistent as a careful forger could make it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from lockstep.fsio import json_bytes
from lockstep.spec import hashing
from lockstep.formats import checkpoint as ckpt


def read_traj(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectory.jsonl").read_text().splitlines() if line.strip()]


def write_traj(run: Path, recs: list[dict]) -> None:
    (run / "trajectory.jsonl").write_bytes(b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in recs))


def write_commitment(run: Path, recs: list[dict]) -> None:
    com = json.loads((run / "commitment.json").read_text())
    com["chain_hash"], com["last_step"] = recs[-1]["chain_hash"], len(recs)
    (run / "commitment.json").write_bytes(json_bytes(com))


def relink(run: Path, recs: list[dict], from_step: int) -> list[dict]:
    """Recompute every chain hash from ``from_step`` on, the commitment, and the checkpoints' chain hashes."""
    from lockstep.formats.recipe import genesis, load_recipe

    h = genesis(load_recipe(run)) if from_step == 1 else recs[from_step - 2]["chain_hash"]
    for r in recs[from_step - 1:]:
        h = r["chain_hash"] = hashing.record_chain_hash(h, r)
    write_traj(run, recs)
    write_commitment(run, recs)
    for step, _ in ckpt.list_checkpoints(run):
        if step >= from_step:
            rewrite_sidecar(run, step, chain_hash=recs[step - 1]["chain_hash"])
    return recs


def rewrite_sidecar(run: Path, step: int, **changes) -> None:
    """Edit a checkpoint's sidecar and redo its COMPLETE marker (the marker is only a checksum)."""
    folder = run / "checkpoints" / ckpt.step_dirname(step)
    side = json.loads((folder / "sidecar.json").read_text())
    side.update(changes)
    data = json_bytes(side)
    (folder / "sidecar.json").write_bytes(data)
    (folder / "COMPLETE").write_bytes((hashlib.sha256(data).hexdigest() + "\n").encode())


def train_on_other_windows(run: Path, at_step: int, window: int) -> int:
    """The attack of issue 19 (High 2): from checkpoint ``at_step`` on, train on windows ``window..``.

    The checkpoint's ``stream_state`` is rewritten so that a stream positioned by it
    gives the content of window ``window`` where the recipe's next window is (its
    ``window`` and ``token`` fields keep the honest values, the rest describe
    ``window``'s place in the stream); every later step is recomputed on those windows (one process, the spec's micro-batch tree),
    with its record, chain hash, checkpoint (and its stream record) and the commitment
    redone, so everything but the data position is consistent. Returns the last step.
    """
    from lockstep.backends import get_backend
    from lockstep.formats.manifest import Manifest
    from lockstep.formats.recipe import load_recipe, recipe_configs, recipe_digest
    from lockstep.formats.trajectory import step_record
    from lockstep.formats.schedule import plan_step
    from lockstep.train.step import tree_step
    from lockstep.formats.state import split_state, state_tensors
    from lockstep.formats.stream import GlobalStream, batch_digest

    recipe = load_recipe(run)
    cfg, tcfg = recipe_configs(recipe)
    stream = GlobalStream(Manifest.load(run / recipe["data"]["folder"]), recipe["seed"], cfg.seq_len)
    recs = read_traj(run)
    last = len(recs)

    def lying_record(step: int, actual: int) -> dict:
        # the position of window ``actual`` in the stream, labelled as the honest next window
        honest = plan_step(tcfg, cfg.seq_len, step)
        m = honest.first_window + honest.n_windows
        return {**stream.state_at(actual), "window": m, "token": m * (cfg.seq_len + 1)}

    rewrite_sidecar(run, at_step, stream_state=lying_record(at_step, window))
    c = ckpt.load_checkpoint(run, at_step)
    params, opt = split_state({k: v.copy() for k, v in c.tensors.items()})
    prev, pos, be = c.sidecar["chain_hash"], window, get_backend("spec")
    for t in range(at_step + 1, last + 1):
        plan = plan_step(tcfg, cfg.seq_len, t)
        windows = stream.windows(pos, plan.n_windows)
        pos += plan.n_windows
        res = tree_step(params, opt, windows, plan, cfg, tcfg, be)
        params, opt = res.params, res.opt
        recs[t - 1] = step_record(t, plan, res, batch_digest(windows), prev)
        prev = recs[t - 1]["chain_hash"]
        folder = run / "checkpoints" / ckpt.step_dirname(t)
        if folder.exists():
            shutil.rmtree(folder)
            ckpt.save_checkpoint(run, t, state_tensors(params, opt),
                                 {"chain_hash": prev, "stream_state": lying_record(t, pos),
                                  "recipe_sha256": recipe_digest(recipe), "tokens": plan.tokens_after})
    write_traj(run, recs)
    write_commitment(run, recs)
    return last


def _limit_memory(limit: int):
    def apply():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def lockstep_limited(*args, memory: int = 3 << 30, timeout: float = 600):
    """``python -m lockstep.cli ARGS`` in a child limited to ``memory`` bytes of address space.

    The limit and the timeout protect the machine and the suite from an attack that
    works (an allocation until killed, a hang); they are not what a test checks: a
    test checks the exit code and the words of the refusal.
    """
    import os
    import subprocess
    import sys

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "lockstep.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, preexec_fn=_limit_memory(memory))
