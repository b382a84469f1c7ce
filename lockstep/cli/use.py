"""``lockstep sample | eval | export`` and ``lockstep audit verify-export``: use what was trained.

    lockstep sample RUN --prompt TEXT [--step N] [--max-new-tokens 200] [--temperature 0.8]
                    [--top-k 40] [--seed 0] [--backend B] [--data DIR] [--quiet]
    lockstep eval RUN [--step N] [--backend B] [--data DIR] [--record] [--json]
    lockstep export RUN --out DIR [--format lockstep|hf] [--step N] [--data DIR]
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

from lockstep import backends
from lockstep.backends import BackendUnavailable
from lockstep.formats.recipe import load_recipe, recipe_configs
from lockstep.formats.rundir import RunFileError
from lockstep.formats.tokenizer import ByteTokenizer
from lockstep.fsio import printable
from lockstep.spec import SPEC_VERSION
from lockstep.train.memory import forward_memory, require_budget
from lockstep.use.evaluate import append_metrics, evaluate, metrics_line, progress_printer, recorded_validations
from lockstep.use.export import make_export
from lockstep.use.export_hf import make_hf_export
from lockstep.use.export_verify import verify_export
from lockstep.use.generate import (CachedModel, Sampling, SamplingError, generate, require_sample_memory,
                                   sample_memory_estimate)
from lockstep.use.plots import plot_run
from lockstep.use.run import UseError, open_data, open_model, open_tokenizer
from lockstep.use.tokenizing import guarded

from .common import EXIT_BAD, EXIT_OK, MAX_MEMORY_HELP, default_backend, fail, gib, note, positive_int, said, say


def _checkpoint_arguments(p: argparse.ArgumentParser, data_help: str) -> None:
    """RUN, ``--step``, ``--backend`` and ``--data``: the checkpoint a command computes with, and where."""
    p.add_argument("run", type=Path, help="the run directory")
    p.add_argument("--step", type=positive_int, help="the checkpoint's step (default: the latest the chain covers)")
    p.add_argument("--backend", default=None, help="spec, numba or another installed backend (default: numba)")
    p.add_argument("--data", type=Path, help=data_help)


# ---------------------------------------------------------------- eval

def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "eval", help="validation loss of a checkpoint on the data's held-out documents",
        description="Validation loss of a checkpoint (default: the latest) on the held-out documents of the run's "
                    "data, in nats per token and bits per byte. The same bits on every backend: if the run "
                    "recorded a value for that step (train --eval-every), it is compared bit for bit "
                    "(exit 2 if it differs).")
    _checkpoint_arguments(p, "the run's data folder, when it is not inside the run")
    p.add_argument("--record", action="store_true",
                   help="append the result to the run's metrics.jsonl and redraw loss.png")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--max-memory", type=gib, metavar="GIB", help=MAX_MEMORY_HELP)
    p.set_defaults(func=run_eval)
    return p


def _check_memory(args, what: str, need) -> None:
    """Before the checkpoint is read: the recipe's model against ``--max-memory`` (default: this machine's memory),
    ``need(cfg, tcfg)`` bytes; a ``UseError`` in one line when it does not fit."""
    try:
        cfg, tcfg = recipe_configs(load_recipe(args.run))
    except (RunFileError, ValueError):
        return  # open_model says what is wrong with the run
    try:
        require_budget(need(cfg, tcfg), what, cfg, args.max_memory)
    except RunFileError as exc:
        raise UseError(said(exc)) from None


def run_eval(args) -> int:

    try:
        be = backends.get_backend(args.backend or default_backend())
        _check_memory(args, "evaluate it", lambda cfg, tcfg: forward_memory(cfg, tcfg.micro_batch, be.memory))
        model = open_model(args.run, args.step)
        manifest = open_data(args.run, model.recipe, args.data)
        v = evaluate(model.params, model.cfg, manifest, be, model.tcfg.micro_batch, step=model.step,
                     tokens=model.tokens, progress=progress_printer(not args.quiet and not args.json))
    except (UseError, BackendUnavailable, ValueError) as exc:
        return fail("eval", said(exc))
    recorded = recorded_validations(args.run).get(model.step)
    verdict, code = _compare(v, recorded)
    if args.json:
        print(json.dumps({"run": str(args.run), "step": v.step, "tokens": v.tokens, "validation": v.record(),
                          "recorded_bits": recorded.get("loss_sum_bits") if recorded else None,
                          "reproduced": None if recorded is None else code == EXIT_OK}, indent=2, sort_keys=True))
    else:  # source names, the recorded backend and SPEC_VERSION come from files of the run: escaped
        print(v.format())
        print(printable(verdict))
        note = model.spec_note()
        if note:
            print(printable(note))
    if args.record:
        try:
            append_metrics(args.run, metrics_line(v))
            png = plot_run(args.run)
        except (OSError, ValueError) as exc:
            return fail("eval", f"could not record the result in {args.run}: {said(exc)}")
        note(f"recorded in {args.run / 'metrics.jsonl'}" + (f", {png}" if png else ""))
    return code


def _compare(v, recorded: dict | None) -> tuple[str, int]:
    if recorded is None:
        return f"no validation loss recorded for step {v.step} (train --eval-every K records one)", EXIT_OK
    want = recorded.get("loss_sum_bits")
    if recorded.get("targets") != v.targets or want != v.bits:
        other = recorded.get("spec_version")
        why = (f" (recorded under SPEC_VERSION {other}, this lockstep computes SPEC_VERSION {SPEC_VERSION}: "
               f"use a lockstep of SPEC_VERSION {other} to reproduce it)" if other != SPEC_VERSION else "")
        return (f"DIFFERS from the value recorded during training: loss sum bits {want} over "
                f"{recorded.get('targets')} tokens (recorded on {recorded.get('backend')}), here {v.bits} over "
                f"{v.targets} tokens on {v.backend}{why}"), EXIT_BAD
    return (f"reproduces the value recorded during training bit for bit ({want}, recorded on "
            f"{recorded.get('backend')}, here on {v.backend})"), EXIT_OK


# ---------------------------------------------------------------- sample

def add_sample_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sample", help="generate text from a checkpoint (KV cache; the same text on every backend)",
        description="Generate text from a verified checkpoint of RUN (default: the latest) with the model exactly "
                    "as trained (int8 W8A8 when the recipe quantizes) and the run's tokenizer. The prompt starts a "
                    "document (an end-of-document token goes before it, as in training); generation stops at the "
                    "end of the document or after --max-new-tokens. Sampling draws from Philox keyed by --seed, "
                    "so the same command prints the same text on every backend. The prompt and the text go to "
                    "stdout; progress and a summary to stderr.")
    _checkpoint_arguments(p, "the run's data folder (for its tokenizer), when it is not inside the run")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default="", help="the start of the text (default: empty: a new document)")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this file (bytes as they are)")
    p.add_argument("--max-new-tokens", type=positive_int, default=200, help="at most this many tokens (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy (argmax); default 0.8")
    p.add_argument("--top-k", type=int, default=0, help="sample only from the k most likely tokens (0: all; default 0)")
    p.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0)")
    p.add_argument("--no-stop", action="store_true", help="go on past the end of the document (into the next)")
    p.add_argument("--json", action="store_true", help="print one JSON record (ids and text) instead of streaming")
    p.add_argument("--quiet", action="store_true", help="no progress or summary on stderr")
    p.add_argument("--max-memory", type=gib, metavar="GIB", help=MAX_MEMORY_HELP)
    p.set_defaults(func=run_sample)
    return p


def _prompt_bytes(args) -> bytes:
    import os

    if args.prompt_file is not None:
        try:
            return args.prompt_file.read_bytes()
        except OSError as exc:
            raise ValueError(f"--prompt-file {args.prompt_file}: {exc.strerror or exc}") from None
    return os.fsencode(args.prompt)  # the bytes as given, even if they are not valid UTF-8


def encode_prompt(tokenizer, data: bytes, model_vocab: int) -> list[int]:
    """Token ids of a prompt; a clear error for text the tokenizer cannot represent."""
    if isinstance(tokenizer, ByteTokenizer):  # every byte is a token
        return tokenizer.encode(data).astype(int).tolist()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"the prompt is not UTF-8 (byte 0x{data[exc.start]:02X} at offset {exc.start}); this run's "
                         f"tokenizer ({tokenizer.kind}) reads UTF-8 text only") from None
    bad = tokenizer.unrepresentable(text)
    if bad is not None:
        at, ch = bad
        raise ValueError(f"the prompt has text the tokenizer cannot represent: {ch!r} (U+{ord(ch[0]):04X}) at "
                         f"character {at}; leave it out or use a run whose tokenizer knows it")
    ids = tokenizer.encode(text).astype(int).tolist()
    beyond = [t for t in ids if t >= model_vocab]
    if beyond:
        raise ValueError(f"the tokenizer gives id {beyond[0]}, beyond the model's vocabulary of {model_vocab}")
    return ids


class _TextStream:
    """Writes decoded text as tokens arrive: bytes as they are, other tokenizers by decoded suffix."""

    def __init__(self, tokenizer, out):
        self.tok, self.out = tokenizer, out
        self.raw = isinstance(tokenizer, ByteTokenizer)
        self.ids: list[int] = []
        self.shown = ""

    def write_ids(self, ids: list[int]) -> None:
        if self.raw:  # byte tokens straight through (a character split over tokens joins up on the way);
            self.out.flush()  # the separator is a newline
            self.out.buffer.write(b"".join(b"\n" if t == self.tok.eod_id else bytes([t]) for t in ids if t <= 256))
        else:
            self.ids += ids
            text = self.tok.decode(self.ids)
            stable = text[: len(text) - 1] if text.endswith("\ufffd") else text
            if stable.startswith(self.shown):
                self.out.write(stable[len(self.shown):])
                self.shown = stable
        self.out.flush()

    def finish(self) -> None:
        """Write what a held-back partial character (or a re-tokenised tail) kept from the screen."""
        if not self.raw:
            text = self.tok.decode(self.ids)
            if text.startswith(self.shown) and text != self.shown:
                self.out.write(text[len(self.shown):])
                self.shown = text
        self.out.write("\n")
        self.out.flush()


def run_sample(args) -> int:

    try:
        sampling = Sampling(args.temperature, args.top_k or None, args.seed).check()
        be = backends.get_backend(args.backend or default_backend())
        _check_memory(args, "sample from it", lambda cfg, tcfg: sample_memory_estimate(cfg, 0, args.max_new_tokens))
        model = open_model(args.run, args.step)
        tokenizer, identity = open_tokenizer(args.run, model.recipe, args.data)
        tokenizer = guarded(tokenizer)  # a panic of the tokenizer library is a one-line error
        prompt = encode_prompt(tokenizer, _prompt_bytes(args), model.cfg.vocab_size)
        limit = model.cfg.seq_len - 1  # the end-of-document token goes first
        require_sample_memory(model.cfg, min(len(prompt), limit), args.max_new_tokens,  # before anything is sized
                              max_memory=args.max_memory)
    except (UseError, SamplingError, BackendUnavailable, ValueError) as exc:
        return fail("sample", said(exc))
    say = note if not args.quiet else (lambda msg: None)
    if len(prompt) > limit:
        say(f"note: the prompt is {len(prompt)} tokens; the model reads at most {model.cfg.seq_len}, "
            f"so it sees the last {limit} after the end-of-document token")
        prompt = prompt[-limit:]
    try:
        return _generate_into(args, be, model, tokenizer, prompt, sampling, say)
    except UseError as exc:  # the tokenizer failed on the generated ids
        sys.stdout.write("\n")
        return fail("sample", said(exc))


def _generate_into(args, be, model, tokenizer, prompt: list[int], sampling, say) -> int:
    import time


    spec_note = model.spec_note()
    if spec_note:
        say(spec_note)  # the recipe's SPEC_VERSION is the run's text: say escapes it
    context = [tokenizer.eod_id] + prompt
    stream = None if args.json else _TextStream(tokenizer, sys.stdout)
    if stream is not None:
        stream.write_ids(prompt)
    bar = _SampleProgress(args.max_new_tokens, enabled=not args.quiet and not sys.stdout.isatty() and not args.json)
    out: list[int] = []
    t0 = time.perf_counter()
    try:
        cached = CachedModel(model.params, model.cfg, be)
        for tok in generate(cached, context, args.max_new_tokens, tokenizer.vocab_size, sampling,
                            stop_id=None if args.no_stop else tokenizer.eod_id):
            out.append(tok)
            if stream is not None and (args.no_stop or tok != tokenizer.eod_id):
                stream.write_ids([tok])
            bar.update(len(out))
    except (SamplingError, ValueError) as exc:
        if stream is not None:
            sys.stdout.write("\n")
        return fail("sample", said(exc))
    dt = time.perf_counter() - t0
    bar.close()
    ended = bool(out) and out[-1] == tokenizer.eod_id and not args.no_stop
    if args.json:
        print(json.dumps({"run": str(args.run), "step": model.step, "backend": be.name, "seed": args.seed,
                          "temperature": args.temperature, "top_k": args.top_k, "prompt_ids": prompt,
                          "ids": out, "end_of_document": ended,
                          "text": tokenizer.decode([t for t in out if t != tokenizer.eod_id or args.no_stop])}))
    else:
        stream.finish()
    say(f"{len(out)} tokens in {dt:.1f} s ({len(out) / max(dt, 1e-9):.1f} tokens/s) from step {model.step} of "
        f"{args.run} on {be.name}, seed {args.seed}, temperature {args.temperature}"
        + (f", top-k {args.top_k}" if args.top_k else "") + ("; the document ended" if ended else ""))
    return EXIT_OK


class _SampleProgress:
    """A progress line on stderr while the text goes to a file or pipe."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.tty = sys.stderr.isatty()
        self.last = 0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        width = 24
        line = f"[{'#' * (width * done // self.total):-<{width}}] {done}/{self.total} tokens"
        if self.tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        elif done - self.last >= max(1, self.total // 10):
            self.last = done
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)


# ---------------------------------------------------------------- export

def add_export_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "export", help="write a checkpoint's weights (float32 safetensors, int8 codes) with their proof",
        description="Write the weights of a verified checkpoint of RUN (default: the latest) to a new folder: "
                    "model.safetensors (float32 parameters under their lockstep names, plus the int8 codes and "
                    "scales of the int8 layers), config.json, recipe.json, proof.json (state root, chain hash, "
                    "every tensor digest) and a README model card. --format hf writes the same checkpoint as a "
                    "folder Hugging Face transformers loads (AutoModelForCausalLM.from_pretrained(DIR, "
                    "trust_remote_code=True), AutoTokenizer.from_pretrained(DIR)): transformers' names and "
                    "(out, in) layouts, the model code, the tokenizer files, and the same proof. Check an export "
                    "with `lockstep audit verify-export DIR RUN`.")
    p.add_argument("run", type=Path, help="the run directory")
    p.add_argument("--out", type=Path, required=True, help="the new export folder (must not exist, or be empty)")
    p.add_argument("--step", type=positive_int, help="the checkpoint's step (default: the latest the chain covers)")
    p.add_argument("--data", type=Path, help="the run's data folder (for its tokenizer), when it is not inside the run")
    p.add_argument("--format", choices=("lockstep", "hf"), default="lockstep",
                   help="lockstep's own layout (default), or hf: a Hugging Face transformers folder")
    p.set_defaults(func=run_export)
    return p


def run_export(args) -> int:
    try:
        model = open_model(args.run, args.step)
        tokenizer, identity = open_tokenizer(args.run, model.recipe, args.data)
        write = make_hf_export if args.format == "hf" else make_export
        out = write(model, tokenizer, identity, args.out)
        rep = verify_export(out, args.run, args.data)
    except (UseError, ValueError, OSError) as exc:
        return fail("export", said(exc))
    if not rep.ok:  # never expected: the export was just made from a verified checkpoint
        print(rep.format())
        return fail("export", f"{out} does not verify against {args.run}; do not publish it")
    form = " for transformers" if args.format == "hf" else ""
    say(f"exported step {model.step} of {args.run} to {out}{form} (state root {model.sidecar['state_root'][:16]}..., "
          f"chain hash {model.sidecar['chain_hash'][:16]}...); verified against the run")
    return EXIT_OK


def add_verify_export_parser(subparsers) -> argparse.ArgumentParser:
    """``verify-export`` (registered under ``lockstep audit``)."""
    p = subparsers.add_parser(
        "verify-export", help="check an export's weights against its proof and, given RUN, the run's chain",
        description="Check an export folder made by `lockstep export`: its files' SHA-256, every tensor's lockstep "
                    "digest against proof.json, the int8 codes and scales against the spec's quantizer, config.json "
                    "against the recipe, tokenizer.json against config.json, the state root from the digests and "
                    "the chain link of its step; with RUN also the run's recipe, its data manifest's tokenizer, its "
                    "chain recomputed from the genesis through the export's step to the commitment, and the "
                    "run's checkpoint of that step. Exit 0 valid, 2 invalid, 1 unreadable.")
    p.add_argument("export", type=Path, help="the export folder")
    p.add_argument("run", type=Path, nargs="?", help="the run directory the export claims to come from")
    p.add_argument("--data", type=Path, help="the run's data folder (its manifest names the tokenizer), when it is "
                                             "not inside the run")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=run_verify_export)
    return p


def run_verify_export(args) -> int:
    try:
        rep = verify_export(args.export, args.run, args.data)
    except (UseError, ValueError, OSError) as exc:
        return fail("audit verify-export", said(exc))
    if args.json:
        print(json.dumps({"export": str(args.export), "run": str(args.run) if args.run else None, "valid": rep.ok,
                          "checks": [{"check": n, "ok": ok, "detail": d} for n, ok, d in rep.checks]}, indent=2))
    else:
        print(rep.format())
    return EXIT_OK if rep.ok else EXIT_BAD


# ---------------------------------------------------------------- registration

def add_parser(subparsers) -> None:
    """Add ``sample``, ``eval`` and ``export`` to the ``lockstep`` parser."""
    add_sample_parser(subparsers)
    add_eval_parser(subparsers)
    add_export_parser(subparsers)
