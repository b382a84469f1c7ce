"""``lockstep train``: train a new run, or ``--resume`` one."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

DEFAULT_STEPS = {"tiny": 100, "small": 100, "open-1b": 10}


def _default_backend() -> str:
    try:
        import numba  # noqa: F401

        from lockstep.backends import get_backend

        get_backend("numba")
        return "numba"
    except Exception:  # noqa: BLE001 - any failure means: use the spec
        return "spec"


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train",
        help="train an auditable run (one process, or under mpiexec -n R)",
        description="Train an auditable run. With no arguments: the small preset on the embedded default "
                    "corpus for a few minutes. Under `mpiexec -n R lockstep train ...` the ranks combine "
                    "gradients with the fixed butterfly and compare state roots every step.",
    )
    p.add_argument("--preset", default="small", help="tiny, small or open-1b (default: small)")
    p.add_argument("--data", default="default", help="'default' (embedded corpus) or a data folder / manifest.json")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--steps", type=int, help="train until this step (default: depends on the preset)")
    g.add_argument("--tokens", type=int, help="train until this many tokens are consumed")
    p.add_argument("--out", help="run directory (default: runs/<preset>-<time>)")
    p.add_argument("--backend", default=None, help="spec or numba (default: numba when installed, else spec)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default: the preset's)")
    p.add_argument("--batch", type=int, help="global batch in sequences, fixed (default: the preset's ramp)")
    p.add_argument("--checkpoint-every", type=int, default=50, help="checkpoint every K steps (and at the end)")
    p.add_argument("--resume", metavar="RUN", help="continue RUN from its last complete checkpoint")
    p.add_argument("--no-quantize", action="store_true", help="float32 linears instead of int8 W8A8")
    p.add_argument("--eval-every", type=_non_negative_int, metavar="K",
                   help="validation loss every K steps and at the end, into metrics.jsonl and loss.png "
                        "(default: 50 for small, off for tiny; 0: off)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_train)
    return p


def run_train(args) -> int:
    from lockstep.backends import BackendUnavailable

    from .train.checkpoint import CheckpointError
    from .train.config import preset, train_preset
    from .train.data import DataError
    from .train.optim import NonFiniteError
    from .train.trainer import RecipeMismatch, train

    backend = args.backend or _default_backend()
    try:
        if args.resume:
            summary = train(args.resume, resume=True, steps=args.steps, tokens=args.tokens, backend_name=backend,
                            checkpoint_every=args.checkpoint_every, progress=not args.quiet,
                            eval_every=args.eval_every)
        else:
            cfg = preset(args.preset, quantize=not args.no_quantize)
            tcfg = train_preset(args.preset)
            if args.micro_batch:
                tcfg = dataclasses.replace(tcfg, micro_batch=args.micro_batch)
            if args.batch:
                tcfg = dataclasses.replace(tcfg, batch_ramp=((0, args.batch),))
            steps = args.steps if args.steps is not None or args.tokens is not None else DEFAULT_STEPS.get(args.preset, 50)
            out = args.out or str(Path("runs") / f"{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
            summary = train(out, cfg=cfg, tcfg=tcfg, data=args.data, seed=args.seed, steps=steps, tokens=args.tokens,
                            backend_name=backend, checkpoint_every=args.checkpoint_every, progress=not args.quiet,
                            eval_every=args.eval_every)
    except (BackendUnavailable, RecipeMismatch, CheckpointError, DataError, NonFiniteError, FileExistsError,
            FileNotFoundError, ValueError) as e:
        print(f"lockstep train: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if summary.rank != 0:
        return 0
    print(f"run directory: {summary.run_dir}")
    print(f"last step {summary.last_step}, chain hash {summary.chain_hash}")
    return 0
