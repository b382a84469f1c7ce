"""The training loop: one process, or R ranks under ``mpiexec``; a run directory; resume.

Run directory::

    recipe.json          everything that defines the run; its digest is bound into H_0
    data/                the embedded default corpus (manifest + shards), when used
    trajectory.jsonl     one record per step: step, tokens, lr, loss, grad_norm,
                         state_root, batch_digest, chain_hash (+ exact float bits)
    metrics.jsonl        wall-clock facts (tokens/s, backend) and validation losses
                         (``--eval-every``): not part of the chain
    checkpoints/         step-NNNNNNNN/ folders (lockstep.train.checkpoint)
    commitment.json      the last chain hash, written when the run ends
    loss.png             training and validation loss over tokens (if matplotlib is installed)

The loop, per step t: plan the global batch (``step.plan_step``), compute this
rank's contribution (``step.rank_contribution``), combine with the fixed butterfly
(``collectives.allreduce_dict``), clip + AdamW (``step.apply_update``), compare
state roots across ranks, extend the chain, record, checkpoint every K steps.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import lockstep
from lockstep.fsio import atomic_write_bytes, atomic_write_json, json_bytes, read_json, safe_join
from lockstep.spec import SPEC_VERSION, hashing

from . import checkpoint as ckpt
from .config import ModelConfig, TrainConfig
from .data import GlobalStream, Manifest, batch_digest
from .model import init_params
from .optim import AdamWState
from .step import apply_update, float_record, plan_step, rank_contribution, split_state, state_tensors

RECIPE_FILE = "recipe.json"
TRAJECTORY_FILE = "trajectory.jsonl"
METRICS_FILE = "metrics.jsonl"
COMMITMENT_FILE = "commitment.json"
DATA_DIR = "data"
RECIPE_FORMAT = "lockstep.recipe"


class RecipeMismatch(RuntimeError):
    """A resume was asked with settings that differ from the run's recipe."""


# ---------------------------------------------------------------- recipe and chain

def make_recipe(cfg: ModelConfig, tcfg: TrainConfig, manifest: Manifest, data_folder: str, seed: int,
                world_size: int) -> dict:
    return {
        "format": RECIPE_FORMAT,
        "version": 1,
        "model": cfg.to_dict(),
        "train": tcfg.to_dict(),
        "data": {"manifest_sha256": manifest.sha256, "folder": data_folder},
        "seed": int(seed),
        "world_size": int(world_size),
        "micro_batch": int(tcfg.micro_batch),
        "spec_version": SPEC_VERSION,
        "lockstep_version": lockstep.__version__,
    }


def recipe_digest(recipe: dict) -> str:
    """SHA-256 of the recipe's canonical JSON (sorted keys, no spaces, ASCII)."""
    return hashlib.sha256(json_bytes(recipe)).hexdigest()


def genesis(recipe: dict) -> str:
    return hashing.genesis_hash(recipe_digest(recipe), recipe["data"]["manifest_sha256"], recipe["spec_version"])


def load_recipe(run_dir: Path) -> dict:
    recipe = read_json(safe_join(run_dir, RECIPE_FILE), "recipe")
    if not isinstance(recipe, dict) or recipe.get("format") != RECIPE_FORMAT:
        raise ValueError(f"{run_dir / RECIPE_FILE}: not a lockstep recipe")
    return recipe


def recipe_configs(recipe: dict) -> tuple[ModelConfig, TrainConfig]:
    return ModelConfig.from_dict(recipe["model"]), TrainConfig.from_dict(recipe["train"])


def open_run_data(run_dir: Path, recipe: dict, override: str | Path | None = None) -> Manifest:
    """The run's data, verified, and checked against the recipe's manifest digest."""
    folder = recipe["data"]["folder"]
    path = Path(override) if override else (safe_join(run_dir, folder) if not Path(folder).is_absolute() else Path(folder))
    manifest = Manifest.load(path)
    if manifest.sha256 != recipe["data"]["manifest_sha256"]:
        raise ValueError(f"{manifest.path}: manifest digest {manifest.sha256} is not the run's "
                         f"{recipe['data']['manifest_sha256']}; use the data the run was trained on")
    return manifest


# ---------------------------------------------------------------- trajectory

def read_trajectory(run_dir: Path, tolerate_torn_tail: bool = False) -> list[dict]:
    """Parse trajectory.jsonl. A torn last line (a crash mid-append) is dropped if tolerated."""
    path = safe_join(run_dir, TRAJECTORY_FILE)
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if tolerate_torn_tail and i >= len(lines) - 2:
                break
            raise ValueError(f"{path}:{i + 1}: malformed JSON line") from None
        records.append(rec)
    return records


def _append_line(path: Path, obj: dict) -> None:
    with open(path, "ab") as f:
        f.write(json.dumps(obj, sort_keys=True).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------- MPI

def mpi_world():
    """``(comm, rank, size)``; comm is None when not launched by mpiexec."""
    launched = any(k in os.environ for k in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"))
    if not launched:
        return None, 0, 1
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return comm, comm.Get_rank(), comm.Get_size()


# ---------------------------------------------------------------- progress

class Progress:
    def __init__(self, total_steps: int, enabled: bool):
        self.total = total_steps
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def update(self, step: int, loss: float, tok_s: float) -> None:
        if not self.enabled:
            return
        width = 24
        done = int(width * step / max(self.total, 1))
        bar = "#" * done + "-" * (width - done)
        line = f"[{bar}] step {step}/{self.total}  loss {loss:.4f}  {tok_s:,.0f} tok/s  {time.perf_counter() - self.t0:,.0f}s"
        if self.tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)


# ---------------------------------------------------------------- the run

@dataclass
class RunSummary:
    run_dir: Path
    last_step: int
    chain_hash: str
    loss: float
    rank: int = 0


def _plot_loss(run_dir: Path, trajectory: list[dict]) -> Path | None:
    """loss.png: training and validation loss over tokens (``lockstep.use.plots``)."""
    from lockstep.use.plots import plot_run

    return plot_run(run_dir, trajectory)


def train(run_dir: str | Path, *, cfg: ModelConfig | None = None, tcfg: TrainConfig | None = None,
          data: str = "default", seed: int = 42, steps: int | None = None, tokens: int | None = None,
          backend_name: str = "spec", checkpoint_every: int = 50, resume: bool = False,
          progress: bool = True, log=print, eval_every: int | None = 0) -> RunSummary:
    """Train (or resume) the run in ``run_dir``; see the module docstring.

    ``eval_every`` K > 0: every K steps and at the last, rank 0 saves a checkpoint and
    records the validation loss in metrics.jsonl (``lockstep.use.evaluate``); None:
    the preset's default (``evaluate.DEFAULT_EVAL_EVERY``); 0: never."""
    from lockstep.backends import get_backend

    from .collectives import abort_on_exception, allreduce_dict, check_state_agreement

    comm, rank, world = mpi_world()
    run_dir = Path(run_dir)
    be = get_backend(backend_name)
    is_root = rank == 0
    say = log if is_root else (lambda *a, **k: None)

    ctx = abort_on_exception(comm) if comm is not None else _null_ctx()
    with ctx:
        if resume:
            recipe = load_recipe(run_dir)
            if recipe.get("spec_version") != SPEC_VERSION:
                raise RecipeMismatch(f"{run_dir}: run made with SPEC_VERSION {recipe.get('spec_version')}, "
                                     f"this lockstep has {SPEC_VERSION}; replay it with a matching version")
            r_cfg, r_tcfg = recipe_configs(recipe)
            if cfg is not None and cfg != r_cfg or tcfg is not None and tcfg != r_tcfg:
                raise RecipeMismatch(f"{run_dir}: the model/train settings given differ from recipe.json; "
                                     "resume without changing them (or start a new run)")
            if recipe["world_size"] != world:
                raise RecipeMismatch(f"{run_dir}: recorded world size {recipe['world_size']}, launched with {world}; "
                                     f"resume with mpiexec -n {recipe['world_size']}")
            cfg, tcfg = r_cfg, r_tcfg
            manifest = open_run_data(run_dir, recipe)
            seed = recipe["seed"]
        else:
            if cfg is None or tcfg is None:
                raise ValueError("train needs a model and a train config for a new run")
            if is_root:
                if (run_dir / RECIPE_FILE).exists():
                    raise FileExistsError(f"{run_dir} already holds a run; use --resume to continue it or pick another --out")
                run_dir.mkdir(parents=True, exist_ok=True)
            if comm is not None:
                comm.Barrier()
            if data == "default":
                from .corpus import default_corpus

                folder = run_dir / DATA_DIR
                if is_root:
                    default_corpus(folder, progress=lambda m: say(m))
                if comm is not None:
                    comm.Barrier()
                manifest = Manifest.load(folder)
                data_folder = DATA_DIR
            else:
                manifest = Manifest.load(data)
                data_folder = str(manifest.folder.resolve())
            if manifest.vocab_size > cfg.vocab_size:
                raise ValueError(f"the data's tokenizer has {manifest.vocab_size} ids but the model only "
                                 f"{cfg.vocab_size}; raise vocab_size")
            recipe = make_recipe(cfg, tcfg, manifest, data_folder, seed, world)
            if is_root:
                atomic_write_bytes(run_dir / RECIPE_FILE, json.dumps(recipe, indent=2, sort_keys=True).encode() + b"\n")
        h0 = genesis(recipe)

        # ---- starting state
        if resume:
            found = ckpt.latest_checkpoint(run_dir)
            if found is None:
                raise FileNotFoundError(f"{run_dir}: no complete checkpoint to resume from")
            c = ckpt.load_checkpoint(found[1])
            if c.sidecar.get("recipe_sha256") != recipe_digest(recipe):
                raise RecipeMismatch(f"{run_dir / RECIPE_FILE} does not match the recipe checkpoint {c.step} was made "
                                     "with (it was edited); restore it or start a new run")
            params, opt = split_state(c.tensors)
            start_step = c.step
            prev_chain = c.sidecar["chain_hash"]
            if is_root:
                traj = [r for r in read_trajectory(run_dir, tolerate_torn_tail=True) if r["step"] <= start_step]
                if len(traj) != start_step or (traj and traj[-1]["chain_hash"] != prev_chain):
                    raise ValueError(f"{run_dir}: trajectory.jsonl does not agree with checkpoint {start_step}")
                atomic_write_bytes(run_dir / TRAJECTORY_FILE,
                                   b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in traj))
                ckpt.remove_temporary_checkpoints(run_dir)
            stream = GlobalStream.from_state(manifest, seed, cfg.seq_len, c.sidecar["stream_state"])
            say(f"resuming {run_dir} from step {start_step}")
        else:
            params = init_params(cfg, seed)
            opt = AdamWState.zeros(params)
            start_step = 0
            prev_chain = h0
            stream = GlobalStream(manifest, seed, cfg.seq_len)
            if is_root:
                (run_dir / TRAJECTORY_FILE).write_bytes(b"")

        # ---- how far
        last_step = _last_step(tcfg, cfg.seq_len, start_step, steps, tokens)
        from lockstep.use.evaluate import eval_interval

        eval_every = eval_interval(eval_every, cfg)
        say(f"run {run_dir}: preset {cfg.name}, backend {be.name}, {world} rank(s), steps {start_step + 1}..{last_step}")
        bar = Progress(last_step, progress and is_root)
        summary_loss = float("nan")
        for t in range(start_step + 1, last_step + 1):
            t0 = time.perf_counter()
            plan = plan_step(tcfg, cfg.seq_len, t)
            windows = stream.windows(plan.first_window, plan.n_windows)
            bdigest = batch_digest(windows)
            mine = windows[plan.rank_windows(rank, world) - plan.first_window]
            contrib = rank_contribution(params, mine, cfg, tcfg, plan.n_global, be, step=t)
            summed = allreduce_dict(comm, contrib, add=be.add) if comm is not None and world > 1 else contrib
            res = apply_update(params, opt, summed, plan, cfg, tcfg, be)
            if comm is not None and world > 1:
                check_state_agreement(comm, res.state_root, t)
            params, opt = res.params, res.opt
            prev_chain = hashing.chain_hash(t, prev_chain, res.state_root, bdigest)
            dt = time.perf_counter() - t0
            summary_loss = float(res.loss)
            if is_root:
                rec = {
                    "step": t, "tokens": plan.tokens_after, "lr": float(res.lr), "loss": float(res.loss),
                    "grad_norm": float(res.grad_norm), "state_root": res.state_root, "batch_digest": bdigest,
                    "chain_hash": prev_chain, "lr_bits": float_record(res.lr)["bits"],
                    "loss_bits": float_record(res.loss)["bits"], "grad_norm_bits": float_record(res.grad_norm)["bits"],
                }
                _append_line(run_dir / TRAJECTORY_FILE, rec)
                _append_line(run_dir / METRICS_FILE, {"step": t, "seconds": dt, "tokens_per_s": plan.n_global / dt,
                                                      "backend": be.name, "world_size": world, "loss": float(res.loss)})
                bar.update(t, float(res.loss), plan.n_global / dt)
                evaluating = eval_every > 0 and (t % eval_every == 0 or t == last_step)
                if t % checkpoint_every == 0 or t == last_step or evaluating:
                    side = {"chain_hash": prev_chain, "stream_state": stream.state_at(plan.first_window + plan.n_windows),
                            "recipe_sha256": recipe_digest(recipe), "tokens": plan.tokens_after}
                    ckpt.save_checkpoint(run_dir, t, state_tensors(params, opt), side)
                if evaluating:  # after the checkpoint, so `lockstep eval --step t` can reproduce it
                    from lockstep.use.evaluate import record_validation

                    record_validation(run_dir, t, plan.tokens_after, params, cfg, stream.manifest, be,
                                      tcfg.micro_batch, say)
        bar.close()
        if is_root:
            atomic_write_json(run_dir / COMMITMENT_FILE, {
                "format": "lockstep.commitment", "version": 1, "last_step": last_step, "chain_hash": prev_chain,
                "genesis": h0, "recipe_sha256": recipe_digest(recipe), "spec_version": SPEC_VERSION,
            })
            png = _plot_loss(run_dir, read_trajectory(run_dir))
            say(f"done: {run_dir} step {last_step}, loss {summary_loss:.4f}, chain {prev_chain}"
                + (f", loss curve {png}" if png else ""))
    return RunSummary(run_dir, last_step, prev_chain, summary_loss, rank)


def _last_step(tcfg: TrainConfig, seq_len: int, start_step: int, steps: int | None, tokens: int | None) -> int:
    if steps is not None:
        if steps < start_step:
            raise ValueError(f"--steps {steps} is behind the checkpoint at step {start_step}")
        return int(steps)
    if tokens is not None:
        t = max(start_step, 0)
        while True:
            plan = plan_step(tcfg, seq_len, t + 1)
            if plan.tokens_before >= tokens:
                return t
            t += 1
    raise ValueError("give --steps or --tokens")


class _null_ctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
