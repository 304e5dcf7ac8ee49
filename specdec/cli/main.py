"""`python -m specdec` (also the `specdec` command and `python main.py`): race autoregressive and
speculative decoding, and explain the result.

    python -m specdec                                   # smollm2-135m, ngram+eagle, a chat request (cli/defaults.py)
    python -m specdec --prompt "Name three rivers." --K 6 --temperature 0.8 --seed 1
    python -m specdec --target_model_size 355M --draft 124M     # the GPT-2 pair, from the Hub
    python -m specdec --K auto --json
    python -m specdec --target_model_size stdlib-6L --draft stdlib-2L --prompt "def parse(line):"   # offline
    python -m specdec --draft ngram --tree auto          # token trees: up to N draft tokens per round, or auto
    echo "Name three rivers." | python -m specdec --prompt -     # the prompt from standard input
    python -m specdec --draft ngram --prompt_file prompts.txt --batch 4  # 4 prompts (one per line) decoded together

This file loads the models and prints the race: the flags are parsed and checked in cli/args.py,
specdec.race.race runs and times both decoders and returns a report, which this prints as text
or JSON. The `cache` command, the `--batch` program, the default run, `--equivalent` and the
terminal's status line and stream live beside it in specdec/cli/.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import numpy as np

from .. import CheckpointError, DownloadError, load_folder
from ..checkpoints import draft as shipped_draft
from ..checkpoints import registry
from ..checkpoints.hub import HubSettings, ensure_files, missing_files, resolve_model
from ..checkpoints.load import load_model, tuned
from ..checkpoints.pins import WHEELS
from ..checkpoints.sizes import human_size as human
from ..batch import check_batch_memory
from ..config import Config, setup
from ..drafters import same_tokenizer
from ..race import RaceInterrupted, race
from ..race.render import plural
from .args import config_of, parse_args
from .batch import run_batch
from .cache import cache
from .defaults import DEFAULT_RUN
from .equivalent import equivalent
from .terminal import Status, Stream, shorten


def main(argv=None, prog: str = "specdec") -> int:
    """The command line; prog names it in messages ("main.py" when run through the wrapper)."""
    for stream in (sys.stdout, sys.stderr):  # a terminal that cannot show a character gets "?", not a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["cache"]:
        return cache(argv[1:], f"{prog} cache")
    try:
        args = parse_args(argv, prog)
    except KeyboardInterrupt:  # while a prompt is read from a pipe that has no writer yet, say
        print("\ninterrupted", file=sys.stderr)
        return 130
    if args.equivalent:  # text only: no model is loaded
        print(equivalent(args, args.equivalent))
        return 0
    try:
        return run(args)
    except BadRequest as e:  # bad input that only the loaded model could judge: exit 2, as a bad flag
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, CheckpointError, DownloadError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the output piped into `head`, say: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:  # a models_dir that cannot be created or written, a full disk
        print(f"{prog}: error: {e.strerror or e}: {e.filename or ''} (check --models_dir)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def load(name: str, args, target=None) -> tuple:
    """(model, seconds to load it): a first run's download is timed apart, and said. target: the loaded
    target, whose embedding the shipped draft reads when it is the draft's own (checkpoints/draft.py)."""
    if name == shipped_draft.NAME and target is not None and target.name == shipped_draft.TARGET:
        start = time.perf_counter()
        return shipped_draft.load_draft(target), time.perf_counter() - start
    if name in WHEELS or name == shipped_draft.NAME or name.lower().endswith(".gguf"):  # a Llama GGUF (pip)
        start = time.perf_counter()
        model = load_model(name, args.models_dir, progress=not args.json)
        if model.tokenizer is None:  # the API takes token ids then; the command line has only text
            raise CheckpointError(
                f"{name}: the file has no tokenizer (no tokenizer.ggml.* metadata), and the "
                "command line decodes text; load it with specdec.load_model and pass token ids"
            )
        return model, time.perf_counter() - start
    folder, repo = resolve_model(name, args.models_dir)
    missing = bool(missing_files(folder))
    if missing and not args.json and (card := registry.card(name)) is not None and card.kept_layout:
        print(
            f"(first use of {name}: {human(card.download)} to download, then {human(card.kept_layout)} more kept "
            f"beside it, its weights transposed so that later loads copy nothing; `python -m specdec cache` "
            "lists and removes what is stored)"
        )
    start = time.perf_counter()
    ensure_files(folder, repo, HubSettings.from_env(), progress=not args.json)
    if missing and not args.json:
        print(f"(downloaded {name} in {time.perf_counter() - start:.0f} s)")
    start = time.perf_counter()
    return tuned(load_folder(folder, name=name), args.models_dir, progress=not args.json), time.perf_counter() - start


def run(args) -> int:
    say = (lambda *a, **k: None) if args.json else print
    if args.default_run:
        say(DEFAULT_RUN.describe())
    target, target_load = load(args.target_model_size, args)
    tokenizer = target.tokenizer
    if args.chat and "<|im_start|>" not in tokenizer.special_tokens_set:
        raise BadRequest(
            f"--chat needs a chat model such as {', '.join(WHEELS)}; {args.target_model_size} has no chat template"
        )
    # Each prompt's ids as the samplers will see them, checked before a draft is loaded.
    prompts = args.prompts if args.batch is not None else [args.prompt]
    if args.batch is not None:  # the rows' memory, before a single row is made (batch.check_batch_memory)
        try:
            check_batch_memory(target, args.batch, args.n_tokens_to_generate, f"--batch {args.batch}")
        except ValueError as e:
            raise BadRequest(str(e)) from None
    requests = [checked_request(target, prompt, args) for prompt in prompts]
    spec, draft_load = args.draft_spec, 0.0
    draft, draft_label = str(spec), spec.describe()
    if args.only == "autoregressive":
        draft, draft_label = None, "none (--only autoregressive)"
    elif spec.kind == "model" and spec.arg == args.target_model_size:
        draft, draft_label = target, f"{spec.arg} (the target itself" + (", float32)" if args.float64 else ")")
    elif spec.kind == "model":
        draft, draft_load = load(spec.arg, args, target)
        draft_label = f"{spec.arg} ({plural(draft.n_layer, 'layer')}, {draft.n_embd} wide)"
        if args.cross_vocab is None:
            check_same_tokenizer(target, draft, args)
        else:
            check_cross_vocab(target, draft, requests[0], args)

    if args.float64:  # the target only: a draft (even the target itself) stays float32
        target = target.astype(np.float64)
    if args.batch is not None:
        return run_batch(args, target, draft, draft_label)
    request = requests[0]
    if not args.prompt and args.chat:
        say("(empty prompt: an empty user message, so the prompt is the chat template alone)")
    elif not args.prompt:
        end = tokenizer.decode([tokenizer.eot_token])
        say(
            f"(empty prompt: starting from the end-of-text token {end}, id {tokenizer.eot_token}, as GPT-2 samples "
            "unconditionally)"
        )
    sampling = "greedy (temperature 0)" if args.temperature == 0 else f"temperature {args.temperature}"
    sampling += f", top-k {args.top_k}" if args.top_k and args.temperature else ""
    sampling += f", top-p {args.top_p}" if args.top_p and args.temperature else ""
    say(
        f"target: {args.target_model_size} ({plural(target.n_layer, 'layer')}, {target.n_embd} wide"
        f"{', float64' if args.float64 else ''}), loaded in {target_load:.2f} s"
    )
    say(f"draft:  {draft_label}" + (f", loaded in {draft_load:.2f} s" if draft_load else ""))
    say(
        f"prompt: {shorten(args.prompt)!r} ({plural(len(request.prompt), 'token')}"
        + (f", {request.template_tokens} of them the chat template)" if args.chat else ")")
    )
    tree = f", tree={args.tree}" if args.tree else ""
    tree += f", {args.verification} verification" if args.verification != "token" else ""
    tree += f", siblings {args.siblings}" if args.siblings else ""
    if args.draft_confidence is not None:
        tree += ", draft confidence >= " + (
            "the bar the costs set" if args.draft_confidence == "auto" else str(args.draft_confidence)
        )
    say(
        f"{args.n_tokens_to_generate} new tokens, K={args.K}{tree}, {sampling}, seed {args.seed}, repeats {args.repeats}"
    )

    status = Status()
    stream = Stream(args, tokenizer, draft_label, status) if not args.json else None
    status.before = stream and stream.finish
    decoders = [d for d in ("autoregressive", "speculative") if args.only in (None, d)]
    interrupted = None
    try:
        report = race(
            target,
            draft,
            args.prompt,
            args.n_tokens_to_generate,
            seed=args.seed,
            repeats=args.repeats,
            warmup=not args.no_warmup,
            decoders=decoders,
            on_token=stream,
            on_decoder=stream and stream.start,
            on_status=status,
            request=request,
            config=config_of(args),
        )
    except RaceInterrupted as e:  # Ctrl-C: show what was measured, then exit 130
        report, interrupted = e.report, e.during
    status.clear()
    if stream:
        stream.finish()
        print()
    if interrupted:
        print(
            f"interrupted while {interrupted}"
            + ("; nothing was timed yet" if not has_runs(report) else "; what was measured so far:"),
            file=sys.stderr,
        )
    if report is not None and (has_runs(report) or not interrupted):
        if args.json:
            out = report.to_dict()
            out["settings"].update(
                prompt=args.prompt, target=args.target_model_size, draft=str(spec), float64=args.float64
            )
            out["load_seconds"] = {"target": target_load, "draft": draft_load}
            out["interrupted"] = interrupted
            print(json.dumps(out, indent=2, allow_nan=False))
        else:
            print(report)
    return 130 if interrupted else 0


class BadRequest(ValueError):
    """Bad input that only the loaded model can judge (a prompt too long for its context, say): exit 2."""


def checked_request(target, prompt: str, args):
    """The prompt as the samplers will see it (config.setup with no draft: control strings typed in it stay text),
    for the lines that describe it; its errors are bad input."""
    try:
        return setup(target, None, prompt, args.n_tokens_to_generate, Config(chat=args.chat)).request
    except ValueError as e:
        raise BadRequest(str(e).replace("n_tokens (", "--n_tokens_to_generate (")) from None


def has_runs(report) -> bool:
    return report is not None and bool(report.autoregressive or report.speculative)


def check_same_tokenizer(target, draft, args) -> None:
    if target.tokenizer and draft.tokenizer and not same_tokenizer(target, draft):
        raise ValueError(
            f"the draft {args.draft} and target {args.target_model_size} tokenize text differently; "
            f"give --cross_vocab tli (any temperature) or slem (temperature 0), or a draft with the "
            f"target's tokenizer"
        )


def check_cross_vocab(target, draft, request, args) -> None:
    """What only the two loaded vocabularies can tell: whether the rule can afford them (SLRS sampling). The race's
    own set-up, with a fixed K, so that nothing is timed for the check."""
    config = dataclasses.replace(config_of(args), K=1, k_max=max(1, args.k_max))
    try:
        setup(target, draft, None, args.n_tokens_to_generate, config, request=request)
    except ValueError as e:
        raise BadRequest(str(e)) from None
