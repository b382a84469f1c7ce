"""``lockstep sample | eval | export`` and ``lockstep audit verify-export``: use what was trained.

    lockstep sample RUN --prompt TEXT [--step N] [--max-new-tokens 200] [--temperature 0.8]
                    [--top-k 40] [--seed 0] [--backend B] [--data DIR] [--quiet]
    lockstep eval RUN [--step N] [--backend B] [--data DIR] [--record] [--json]
    lockstep export RUN --out DIR [--step N] [--data DIR]
    lockstep audit verify-export DIR [RUN] [--data DIR]

Exit codes: 0 done / reproduced / valid; 2 a value that differs from the recorded one,
or an export that does not match its run (every finding listed); 1 the command could
not run (a refused checkpoint, a missing file, a bad argument).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_OK, EXIT_ERROR, EXIT_BAD = 0, 1, 2


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def _backend_default() -> str:
    from lockstep.train_cli import _default_backend

    return _default_backend()


def _err(cmd: str, msg: str) -> int:
    print(f"lockstep {cmd}: {msg}", file=sys.stderr)
    return EXIT_ERROR


# ---------------------------------------------------------------- eval

def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "eval", help="validation loss of a checkpoint on the data's held-out documents",
        description="Validation loss of a checkpoint (default: the latest) on the held-out documents of the run's "
                    "data, in nats per token and bits per byte. The same bits on every backend: if the run "
                    "recorded a value for that step (train --eval-every), it is compared bit for bit "
                    "(exit 2 if it differs).")
    p.add_argument("run", type=Path, help="the run directory")
    p.add_argument("--step", type=_positive_int, help="the checkpoint's step (default: the latest)")
    p.add_argument("--backend", default=None, help="spec or numba (default: numba when installed, else spec)")
    p.add_argument("--data", type=Path, help="the run's data folder, when it is not inside the run")
    p.add_argument("--record", action="store_true",
                   help="append the result to the run's metrics.jsonl and redraw loss.png")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run_eval)
    return p


def run_eval(args) -> int:
    from lockstep.backends import BackendUnavailable, get_backend

    from .use.evaluate import append_metrics, evaluate, metrics_line, progress_printer, recorded_validations
    from .use.plots import plot_run
    from .use.run import UseError, open_data, open_model

    try:
        be = get_backend(args.backend or _backend_default())
        model = open_model(args.run, args.step)
        manifest = open_data(args.run, model.recipe, args.data)
        v = evaluate(model.params, model.cfg, manifest, be, model.tcfg.micro_batch, step=model.step,
                     tokens=model.tokens, progress=progress_printer(not args.quiet and not args.json))
    except (UseError, BackendUnavailable, ValueError) as exc:
        return _err("eval", str(exc))
    recorded = recorded_validations(args.run).get(model.step)
    verdict, code = _compare(v, recorded)
    if args.json:
        print(json.dumps({"run": str(args.run), "step": v.step, "tokens": v.tokens, "validation": v.record(),
                          "recorded_bits": recorded.get("loss_sum_bits") if recorded else None,
                          "reproduced": None if recorded is None else code == EXIT_OK}, indent=2, sort_keys=True))
    else:
        print(v.format())
        print(verdict)
        note = model.spec_note()
        if note:
            print(note)
    if args.record:
        append_metrics(args.run, metrics_line(v))
        png = plot_run(args.run)
        print(f"recorded in {args.run / 'metrics.jsonl'}" + (f", {png}" if png else ""), file=sys.stderr)
    return code


def _compare(v, recorded: dict | None) -> tuple[str, int]:
    if recorded is None:
        return f"no validation loss recorded for step {v.step} (train --eval-every K records one)", EXIT_OK
    want = recorded.get("loss_sum_bits")
    if recorded.get("targets") != v.targets or want != v.bits:
        return (f"DIFFERS from the value recorded during training: loss sum bits {want} over "
                f"{recorded.get('targets')} tokens (recorded on {recorded.get('backend')}), here {v.bits} over "
                f"{v.targets} tokens on {v.backend}"), EXIT_BAD
    return (f"reproduces the value recorded during training bit for bit ({want}, recorded on "
            f"{recorded.get('backend')}, here on {v.backend})"), EXIT_OK


# ---------------------------------------------------------------- registration

def add_use_parsers(subparsers) -> None:
    """Add ``sample``, ``eval`` and ``export`` to the ``lockstep`` parser."""
    add_eval_parser(subparsers)
