"""``lockstep train``: train a new run, or ``--resume`` one.

Every flag is checked before anything is written; a bad one is one line on stderr
(printed once, by rank 0, under ``mpiexec``) and exit status 1. A run stopped by
SIGINT/SIGTERM writes a checkpoint at its last step and exits 130/143 with the
command that resumes it; one whose files could not be written (a full disk) says
which, the checkpoint it resumes from and the command, and exits 1. Every line goes
through ``common.say``/``note``/``fail`` (escaped: they quote the run's files).
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time
from pathlib import Path

from lockstep.backends import BACKEND_ALIASES, KNOWN_BACKENDS
from lockstep.errors import LockstepError
from lockstep.formats.config import ConfigError
from lockstep.formats.rundir import RECIPE_FILE
from lockstep.formats.settings import build_settings, read_config_file
from lockstep.launch import launcher_rank
from lockstep.train import trainer
from lockstep.train.collectives import AgreedError
from lockstep.train.trainer import RecipeMismatch, RunWriteError
from lockstep.use.hooks import run_hooks

from .common import (EXIT_ERROR, EXIT_OK, MAX_MEMORY_HELP, default_backend, fail, flag_of, gib, integer_arg,
                     non_negative_int, note, positive_int, said, say)

DEFAULT_STEPS = {"tiny": 100, "small": 100, "medium": 10, "open-1b": 10}
DEFAULT_PRESET = "small"
DEFAULT_SEED = 42
PRESETS = ("tiny", "small", "medium", "open-1b")
# every backend name get_backend knows, aliases included (cupy = cuda)
BACKENDS = (*KNOWN_BACKENDS, *sorted(BACKEND_ALIASES))


def seed_int(text: str) -> int:
    value = integer_arg(text)
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**64), got {value}")
    return value


def batch_ramp(text: str) -> tuple[tuple[int, int], ...]:
    """``FROM_TOKENS:SEQUENCES,...`` (``0:16,1048576:32``): ascending token counts, the first 0."""
    stages = []
    for part in text.split(","):
        start, sep, size = part.partition(":")
        try:
            stages.append((int(start), int(size)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not FROM_TOKENS:SEQUENCES (for example 0:16,1048576:32)")\
                from None
        if not sep or stages[-1][0] < 0 or stages[-1][1] < 1:
            raise argparse.ArgumentTypeError(f"{part!r}: give FROM_TOKENS:SEQUENCES with FROM_TOKENS >= 0 and "
                                             "SEQUENCES >= 1")
    starts = [a for a, _ in stages]
    if starts[0] != 0 or starts != sorted(set(starts)):
        raise argparse.ArgumentTypeError(f"{text!r}: the stages' token counts must start at 0 and increase")
    return tuple(stages)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train",
        help="train an auditable run (one process, or under mpiexec -n R)",
        description="Train an auditable run. With no arguments: the small preset on the embedded default "
                    "corpus for a few minutes. Under mpiexec -n R lockstep train ... the ranks share the "
                    "step's micro-batches, combine their sums as the spec's fixed tree says and compare "
                    "state roots every step: any R gives the same trajectory, and --resume may use another R. Ctrl-C (or "
                    "SIGTERM) finishes the current step, writes a checkpoint and says how to resume; a "
                    "second Ctrl-C stops at once (the run then resumes from its last checkpoint).",
    )
    p.add_argument("--preset", choices=PRESETS, help=f"model and schedule (default: {DEFAULT_PRESET}); medium is "
                                                     "about 100M parameters, for CPU work")
    p.add_argument("--config", metavar="FILE.json",
                   help="model and train settings over the preset's: a JSON object with a \"model\" and/or a "
                        "\"train\" object, keys as in a run's recipe.json (unknown keys are refused)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="one setting over the preset's and --config's, e.g. --set model.d_model=512 --set "
                        "train.micro_batch=2 --set train.batch_ramp=0:16,1048576:32 (repeatable)")
    p.add_argument("--data", help="a data folder or its manifest.json (default: the embedded corpus, built in "
                                  "the run); with --resume: where the run's data is now (its manifest digest "
                                  "is checked against the recipe)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--steps", type=positive_int, help="train until this step (default: depends on the preset; "
                                                      "with --resume: the run's recorded target)")
    g.add_argument("--tokens", type=positive_int, help="train until this many tokens are consumed")
    p.add_argument("--out", help="run directory (default: runs/<preset>-<time>)")
    p.add_argument("--backend", choices=BACKENDS, help="spec, numba, opencl, cuda (alias cupy) or metal (default: numba; without it, say "
                                                       "--backend spec, about 60x slower)")
    p.add_argument("--seed", type=seed_int, help="seed of the initial weights and of the data order, an integer "
                                                 f"in [0, 2**64) (default: {DEFAULT_SEED})")
    p.add_argument("--micro-batch", type=positive_int,
                   help="sequences per micro-batch (default: the preset's); it shapes the step's reduction "
                        "tree, so it is part of the recipe, unlike the number of ranks")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=positive_int, help="global batch in sequences, fixed (default: the preset's ramp)")
    batch.add_argument("--batch-ramp", type=batch_ramp, metavar="TOKENS:SEQS,...",
                       help="global batch that grows with the tokens consumed, e.g. 0:16,1048576:32 "
                            "(default: the preset's ramp)")
    p.add_argument("--checkpoint-every", type=positive_int,
                   help="checkpoint every K steps, at the end and when stopped (default: the preset's, 100 for "
                        "open-1b as in the paper, 50 for the others)")
    p.add_argument("--resume", metavar="RUN", help="continue RUN from its last complete checkpoint (or its "
                                                   "initial state), to its recorded target unless --steps/--tokens")
    p.add_argument("--no-quantize", action="store_true", help="float32 linears instead of int8 W8A8")
    p.add_argument("--eval-every", type=non_negative_int, metavar="K",
                   help="validation loss every K steps and at the end, into metrics.jsonl and loss.png "
                        "(default: 50 for small, off for tiny; 0: off)")
    p.add_argument("--max-memory", type=gib, metavar="GIB", help=MAX_MEMORY_HELP)
    p.add_argument("--scratch", metavar="DIR", help="an existing folder for the out-of-core plan's files (the AdamW "
                                                    "moments and the tree's gradient sums, memory-mapped; private, "
                                                    "removed at the end; default: the run directory)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_train)
    return p


def recipe_checker(args):
    """``check_recipe(recipe)`` for a resume: refuse every flag whose value differs from the run's recipe."""
    def check(recipe: dict) -> None:
        model, train = recipe.get("model", {}), recipe.get("train", {})
        recorded = {
            "--preset": (args.preset, model.get("name")),
            "--seed": (args.seed, recipe.get("seed")),
            "--micro-batch": (args.micro_batch, train.get("micro_batch")),
            "--batch": (args.batch and [[0, args.batch]], train.get("batch_ramp")),
            "--batch-ramp": (args.batch_ramp and [list(x) for x in args.batch_ramp], train.get("batch_ramp")),
            "--no-quantize": (False if args.no_quantize else None, model.get("quantize")),
        }
        for flag, (given, theirs) in recorded.items():
            if given is not None and given != theirs:
                raise RecipeMismatch(f"{flag} differs from the run's recipe.json ({theirs!r}); a resume continues "
                                     f"the run as it was made: drop {flag}, or start a new run with --out")

    return check


def run_train(args) -> int:
    is_root = launcher_rank() == 0
    run_dir = args.resume or args.out
    hooks = dataclasses.replace(run_hooks(), setting=flag_of)  # the run's lines name settings by their flags
    try:
        if args.resume and args.out is not None:
            raise ConfigError(f"--out names a new run; --resume {args.resume} continues that run in place")
        backend = args.backend or default_backend()
        if args.resume and (args.config or args.sets):
            raise ConfigError("--config and --set make a new run; a resume continues the run as its recipe.json "
                             "says: drop them, or start a new run with --out")
        if args.resume:
            asked = trainer.RunSettings(resume=True, data=args.data, steps=args.steps, tokens=args.tokens,
                                        backend_name=backend, checkpoint_every=args.checkpoint_every,
                                        eval_every=args.eval_every, max_memory=args.max_memory, scratch=args.scratch)
            summary = trainer.train(args.resume, asked, progress=not args.quiet, log=say,
                                    check_recipe=recipe_checker(args), hooks=hooks)
        else:
            name = args.preset or DEFAULT_PRESET
            cfg, tcfg = new_run_settings(args, name)
            steps = args.steps if args.steps is not None or args.tokens is not None else DEFAULT_STEPS[name]
            label = cfg.name if cfg.name != name and _plain_label(cfg.name) else name
            run_dir = args.out or str(Path("runs") / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}")
            asked = trainer.RunSettings(cfg=cfg, tcfg=tcfg, data=args.data, steps=steps, tokens=args.tokens,
                                        seed=DEFAULT_SEED if args.seed is None else args.seed, backend_name=backend,
                                        checkpoint_every=args.checkpoint_every, eval_every=args.eval_every,
                                        max_memory=args.max_memory, scratch=args.scratch)
            summary = trainer.train(run_dir, asked, progress=not args.quiet, log=say, hooks=hooks)
    except RunWriteError as e:  # a full disk: what was not written, where the run resumes, and how
        hint = _resume_hint(e.run_dir, e.world_size, args.data)
        return fail("train", f"{said(e)}; {hint}") if is_root else EXIT_ERROR
    except (LockstepError, OSError) as e:  # a ValueError from deep in the step is a bug: its traceback shows
        if isinstance(e, BrokenPipeError):
            raise  # stdout's reader went away: lockstep.cli.main ends every command the same way
        what = "" if isinstance(e, AgreedError) else f"{type(e).__name__}: "
        return fail("train", f"{what}{said(e)}") if is_root else EXIT_ERROR
    except KeyboardInterrupt:
        if is_root:
            print(file=sys.stderr)  # ends the progress bar's line
            note(f"lockstep train: stopped at once; {_resume_hint(run_dir, 1, args.data)}")
        return 130
    if summary.stopped_by:
        if summary.rank == 0:
            name = signal.Signals(summary.stopped_by).name
            note(f"lockstep train: stopped by {name} after step {summary.last_step} of {summary.target}; "
                 f"checkpoint {summary.last_step} written; "
                 f"{_resume_hint(summary.run_dir, summary.world_size, args.data)}")
        return 128 + summary.stopped_by
    if summary.rank != 0:
        return EXIT_OK
    say(f"run directory: {summary.run_dir}")
    say(f"last step {summary.last_step}, chain hash {summary.chain_hash}")
    return EXIT_OK


def new_run_settings(args, name: str):
    """The new run's (ModelConfig, TrainConfig): the preset, then --config, then each --set, then the
    flags (--no-quantize, --micro-batch, --batch, --batch-ramp); ``SettingsError`` (one line) on a mistake."""
    import dataclasses


    config = read_config_file(args.config) if args.config else None
    cfg, tcfg = build_settings(name, config, args.sets, where=f"--config {args.config}")
    if args.no_quantize:
        cfg = dataclasses.replace(cfg, quantize=False)
    overrides = {"micro_batch": args.micro_batch} if args.micro_batch else {}
    if args.batch or args.batch_ramp:
        overrides["batch_ramp"] = args.batch_ramp or ((0, args.batch),)
    return cfg, dataclasses.replace(tcfg, **overrides) if overrides else tcfg


def _plain_label(text: str) -> bool:
    """A model name fit for a run folder's name (letters, digits, - _ . only)."""
    return 0 < len(text) <= 40 and all(c.isalnum() and c.isascii() or c in "-_." for c in text) and text[0] != "."


def _resume_hint(run_dir, world_size: int, data: str | None) -> str:
    """The command that resumes ``run_dir`` (with ``--data`` when the data was named: it may be outside the run)."""
    if run_dir is None or not (Path(run_dir) / RECIPE_FILE).is_file():
        return "the run had not started; run the same command again"
    launcher = f"mpiexec -n {world_size} " if world_size > 1 else ""
    named = f" --data {data}" if data not in (None, "default") else ""
    return f"resume with: {launcher}lockstep train --resume {run_dir}{named}"
