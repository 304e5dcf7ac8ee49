"""`python -m specdec` (also the `specdec` command and `python main.py`): race autoregressive and
speculative decoding, and explain the result.

    python -m specdec                                   # 355M target, 124M draft, K=4, greedy
    python -m specdec --prompt "The meaning of life is" --K 6 --temperature 0.8 --seed 1
    python -m specdec --draft ngram --target_model_size 124M
    python -m specdec --K auto --json
    python -m specdec --target_model_size stdlib-6L --draft stdlib-2L --prompt "def parse(line):"   # offline
    python -m specdec --draft ngram --tree auto          # token trees: up to N draft tokens per round, or auto
    echo "The meaning of life is" | python -m specdec --prompt -     # the prompt from standard input
    python -m specdec --draft ngram --prompt_file prompts.txt --batch 4  # 4 prompts (one per line) decoded together

Flags are strict (specdec/flags.py): no abbreviations, `--k-max` and `--k_max` alike,
and a flag that would be ignored (`--k_max` with a fixed K, `--top_k` at temperature 0)
is refused with one line saying why.

This file is the flags, loading the models and printing the race: specdec.race.race
runs and times both decoders and returns a report, which this prints as text or JSON.
The `cache` command, the `--batch` program and the terminal's status line and stream
live in specdec/cli/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

try:  # NumPy and tiktoken take a moment to import: Ctrl-C then should not print an import traceback
    import numpy as np

    from specdec import CheckpointError, DownloadError, SamplingParams, flags, load_folder
    from specdec.checkpoints import draft as shipped_draft
    from specdec.checkpoints import names, registry
    from specdec.checkpoints.hub import (
        HubSettings,
        default_models_dir,
        ensure_files,
        missing_files,
        resolve_model,
    )
    from specdec.checkpoints.load import load_model, tuned
    from specdec.model import tuning
    from specdec.checkpoints.pins import WHEELS
    from specdec.batch import check_batch_memory
    from specdec.cli.batch import run_batch
    from specdec.cli.cache import cache
    from specdec.cli.terminal import Status, Stream, shorten
    from specdec.costmodel import K_LIMIT, parse_k
    from specdec.drafters import make_drafter
    from specdec.drafters.crossvocab import check_rule
    from specdec.drafters.specs import DraftSpec, parse_draft
    from specdec.drafters.stopping import parse_confidence
    from specdec.race import RaceInterrupted, race
    from specdec.request import check_seed, check_verification, make_request, whole_number
    from specdec.words import human_size as human
    from specdec.words import plural
except KeyboardInterrupt:
    sys.exit(130)

DEFAULT_PROMPT = "Alan Turing theorized that computers would one day become"
DEFAULT_FOOTPRINT = names.footprint(["355M", "124M"])  # (download, kept layout) bytes of the default pair

def parse_args(argv=None, prog: str = "specdec") -> argparse.Namespace:
    """Parse and check every flag that needs no model, before anything is downloaded."""
    p = flags.Parser(prog=prog, description="Race plain autoregressive decoding against speculative decoding (GPT-2, SmolLM2 or any Llama GGUF).",
               epilog="Models come from the Hugging Face Hub (HF_ENDPOINT for a mirror, HF_HUB_OFFLINE=1 to stay "
                      "offline, HF_TOKEN for private repos). Disk: the default pair is a "
                      f"{human(DEFAULT_FOOTPRINT[0])} download plus {human(DEFAULT_FOOTPRINT[1])} of kept layout "
                      "(transposed weights beside each GPT-2 checkpoint, so later loads copy nothing; "
                      "SPECDEC_NO_LAYOUT_CACHE=1 skips it). `%(prog)s cache` lists what is stored, with sizes, "
                      "and removes it. The first load on a machine times its matrix products once and keeps the "
                      "fastest threads per pass length beside the models (SPECDEC_KERNELS=measure times them again, "
                      "e.g. after the machine's load changes for good; SPECDEC_KERNELS=rules keeps fixed rules).")  # fmt: skip
    add = p.add_argument
    add("--prompt", default=None,
        help=f"text to continue, or - to read it from standard input (default: {DEFAULT_PROMPT!r}); plain text: "
             "<|endoftext|> typed in it stays text; empty starts from the model's end-of-text token (with --chat: "
             "an empty user message)")
    add("--prompt_file", metavar="PATH", help="read the prompt from this file or pipe (the whole file, UTF-8, at "
        "most 1 MB; with --batch one prompt per line)")
    add("--batch", type=int, default=None, metavar="N", help="decode the first N non-empty lines of --prompt_file "
        "together, one target pass per round for the whole batch (specdec/batch.py), and report each row and "
        "the throughput of both decoders")
    add("--n_tokens_to_generate", type=int, default=40, metavar="N",
        help="new tokens per decoder (default: %(default)s)")
    add("--target_model_size", default="355M", metavar="MODEL",
        help=f"the model whose output we want: {registry.target_help()}, a Hub repo id, a local folder or a Llama "
             "GGUF file (default: %(default)s)")
    add("--draft_model_size", "--draft", dest="draft", default="124M", metavar="DRAFT",
        help="the drafter: a model as above, 'ngram[:N]' (prompt lookup, no model), 'early_exit:L' (the target's "
             "first L layers), 'eagle' (the EAGLE head shipped for "
             f"{', '.join(sorted({t for t, k in registry.SHIPPED_HEADS if k == 'eagle'}))}), "
             f"{shipped_draft.NAME} (for {shipped_draft.TARGET}: a one-block Llama distilled on its replies, shipped "
             "with specdec), 'medusa:DIR' / 'eagle:DIR' (trained heads), or 'ngram[:N]+X' with X one of early_exit:L, "
             "eagle, medusa:DIR, eagle:DIR (prompt lookup of 2..N tokens where it matches, X elsewhere) "
             "(default: %(default)s)")
    add("--ngram_max", type=int, default=3, help="longest suffix 'ngram' matches (default: %(default)s)")
    add("--K", default="4", help="draft tokens per round: an integer 1..32, 'auto' (chosen from measured costs and "
        "the running acceptance rate) or 'adaptive' (grow on full acceptance, shrink on rejection) "
        "(default: %(default)s)")
    add("--tree", default=None, metavar="N|auto", help="draft a token tree of up to N tokens (depth K) per round "
        "instead of a chain of K, or 'auto' (the tree cost model picks N each round); default: a chain")
    add("--verification", choices=["token", "block", "spectr", "traversal"], default="token", help="how the "
        "target judges the drafts, all exact: 'token' (draft by draft; on a tree SpecInfer's rule), 'block' (a chain "
        "jointly, Sun et al. 2024: never fewer tokens per round in expectation), and with --tree 'spectr' (SpecTr's "
        "selection among i.i.d. siblings: needs --siblings iid) or 'traversal' (the tree judged from the leaves, "
        "whole paths at a time) (default: %(default)s)")
    add("--siblings", choices=["without_replacement", "iid"], default=None, help="how a draft model or "
        "early_exit:L draws the children of one tree node: without replacement (EAGLE's way) or i.i.d. (what "
        "--verification spectr needs) (default: without_replacement)")
    add("--cross_vocab", choices=["tli", "slem", "slrs"], default=None, help="a draft model with ANOTHER tokenizer, "
        "verified exactly (Timor et al. 2025): 'tli' (token-level intersection, any temperature), 'slem' "
        "(string-level exact match, temperature 0) or 'slrs' (string-level rejection sampling; sampling only where "
        "the vocabularies are small enough); default: the draft must share the target's tokenizer")
    add("--draft_confidence", default=None, metavar="P|auto", help="end each round's chain before the "
        "position where the draft's own confidence that the chain survives (the product of its probabilities) "
        "would fall below P, in (0, 1]; rounds where the draft is unsure then verify fewer drafts or none, which "
        "pays where a pass over several tokens costs more than one (a CPU). 'auto': the bar the measured costs "
        "set, c + r(2) - 1 (about 0.3 on 2 CPU cores, about c on a GPU). Exact at every temperature. For a "
        "draft model, early_exit:L, eagle or medusa:DIR chains; default: always K drafts")
    add("--k_max", type=int, default=8, help="largest K that 'auto' and 'adaptive' may use (default: %(default)s)")
    add("--chat", action="store_true", help="send the prompt as a user message in the chat model's template "
        "(the smollm2 models); both decoders stop at the end of the reply")
    add("--temperature", type=float, default=0.0, help="0 is greedy decoding (default: %(default)s)")
    add("--top_k", type=int, default=None, help="keep only the k most likely tokens")
    add("--top_p", type=float, default=None,
        help="keep the smallest set of tokens with this much probability, in (0, 1]")
    add("--seed", type=int, default=0, help="random seed for sampling (temperature > 0), >= 0 (default: %(default)s)")
    add("--models_dir", help=f"where checkpoints are downloaded and looked for (default: {default_models_dir()}; "
        "set SPECDEC_HOME to move it)")
    add("--only", choices=["autoregressive", "speculative"], help="run just one of the two decoders")
    add("--repeats", type=int, default=3, help="timed runs per decoder, interleaved; the median speedup, its spread "
        "and a verdict are reported (default: %(default)s)")
    add("--no_warmup", action="store_true", help="skip the short untimed warm-up run")
    add("--float64", action="store_true", help="run the target in float64: greedy speculative output then equals "
        "greedy autoregressive output even where float32 would see a near-tie (about 1.8-1.9x slower per step)")
    add("--json", action="store_true", help="print the measurements as one JSON object instead of text")  # fmt: skip
    args = p.parse_args(argv)

    try:  # the API's own checks (autoregressive.py, sampling.py, ...), so both refuse alike
        whole_number(args.n_tokens_to_generate, "--n_tokens_to_generate", 1)
        whole_number(args.repeats, "--repeats", 1)
        whole_number(args.k_max, "--k_max", 1, K_LIMIT)
        whole_number(args.ngram_max, "--ngram_max", 1)
        check_seed(args.seed, "--seed")
        args.K = parse_k(args.K)
        args.tree = parse_tree(args.tree)
        if args.draft_confidence is not None:
            args.draft_confidence = parse_confidence(args.draft_confidence)  # "auto" or a bar in (0, 1]
        if args.siblings is not None:
            args.siblings = args.siblings.replace("_", " ")
        args.draft_spec = DraftSpec("ngram", args.ngram_max) if args.draft == "ngram" else parse_draft(args.draft)
        check_cli_verification(args)
        params = SamplingParams(args.temperature, args.top_k, args.top_p)
        if args.cross_vocab is not None:
            check_rule(args.cross_vocab, params)
        check_names(args)  # by the names alone: nothing is fetched yet
        if args.batch is not None:
            whole_number(args.batch, "--batch", 1)
            if args.draft_spec.kind == "lookup_first" and args.draft_spec.parts()[1].kind == "early_exit":
                raise ValueError(f"--batch gives each row its own lookup and drafter, and early exit drafts a batch in "
                                 f"batched passes instead: use --draft ngram+eagle or ngram+medusa:DIR, or "
                                 f"{args.draft_spec.parts()[1]} alone, with --batch")  # fmt: skip
            if args.tree is not None or args.K == "auto":
                raise ValueError("--batch drafts chains with an integer K or --K adaptive: leave out --tree and "
                                 "--K auto (the best K per batch size: python -m specdec.bench --only batch)")  # fmt: skip
            args.prompts = flags.read_prompts(args.prompt_file, args.batch)
            args.prompt = args.prompts[0]
        else:
            args.prompt = flags.read_prompt(args.prompt, args.prompt_file)
        if args.prompt is None:
            args.prompt = DEFAULT_PROMPT
        for name in (args.target_model_size, args.draft_spec.arg if args.draft_spec.kind == "model" else None):
            if name is not None and name not in (*WHEELS, shipped_draft.NAME) and not name.lower().endswith(".gguf"):
                resolve_model(name, args.models_dir)
        tuning.env_mode()  # SPECDEC_KERNELS, before anything is loaded
    except ValueError as e:
        p.error(f"--{e}" if str(e).startswith(("K ", "draft_confidence ")) else str(e))
    refuse_ignored(p, args)
    return args


def check_cli_verification(args) -> None:
    """--verification and --siblings against the rest, by request.check_verification (the API's own check)."""
    if args.only == "autoregressive" or args.temperature == 0 and args.verification in ("spectr", "traversal"):
        return  # refuse_ignored says what is ignored there
    if args.batch is not None and args.verification in ("spectr", "traversal"):
        raise ValueError(f"--verification {args.verification} judges trees and --batch drafts chains: use token or "
                         "block with --batch")  # fmt: skip
    samples_siblings = args.draft_spec.kind in ("model", "early_exit") and args.cross_vocab is None
    siblings = (args.siblings or "without replacement") if samples_siblings else None
    check_verification(args.verification, args.tree, "exact", siblings)


def check_names(args) -> None:
    """Refuse a pair, layer or length that the models' names already rule out (checkpoints/names.py)."""
    spec, speculative = args.draft_spec, args.only != "autoregressive"
    if spec.kind == "lookup_first":
        spec = spec.parts()[1]  # the drafter after the lookup is the one the names can rule out
    widest = max(args.tree if isinstance(args.tree, int) else 0, args.K if isinstance(args.K, int) else args.k_max)
    try:
        names.check_pair(
            args.target_model_size,
            draft_model=spec.arg if speculative and spec.kind == "model" else None,
            early_exit=spec.arg if speculative and spec.kind == "early_exit" else None,
            chat=args.chat, n_tokens=args.n_tokens_to_generate, k=widest if speculative else 0,
            cross_vocab=args.cross_vocab is not None,
            shipped_head="eagle" if speculative and spec.kind == "eagle" and not spec.arg else None,
        )  # fmt: skip
    except ValueError as e:
        if "tokenize text differently" in str(e) and "draft" not in flags.given(args):
            hint = f"{spec.arg} is the default draft: give --draft (ngram works with any model)"
            raise ValueError(f"{e}; {hint}") from None
        raise


def refuse_ignored(p, args) -> None:
    """A flag the user typed that this run would not use is an error saying why, not a silent no-op."""
    greedy, spec = args.temperature == 0, args.draft_spec
    only_ar = args.only == "autoregressive"
    flags.refuse_ignored(p, args, [
        ("k_max", args.K not in ("auto", "adaptive"),
         f"only bounds --K auto or adaptive; with --K {args.K} it would be ignored"),
        ("top_k", greedy, "has no effect at temperature 0 (greedy decoding takes the top token); give --temperature"),
        ("top_p", greedy, "has no effect at temperature 0 (greedy decoding takes the top token); give --temperature"),
        ("seed", greedy, "has no effect at temperature 0 (greedy decoding draws nothing); give --temperature"),
        ("cross_vocab", spec.kind != "model", f"verifies a draft model with another tokenizer; the draft here is "
         f"{args.draft}"),
        ("cross_vocab", args.batch is not None, "is not offered with --batch"),
        ("draft_confidence", spec.kind == "ngram", f"cuts the chains of a draft that draws from a distribution (a "
         f"model, early_exit:L, eagle, medusa:DIR); --draft {args.draft} proposes certain tokens, which it would "
         "never cut"),
        ("draft_confidence", args.cross_vocab is not None, "is not offered with --cross_vocab (the drafts are "
         "re-spelt in the target's vocabulary after they are drawn)"),
        ("draft_confidence", args.tree is not None, "cuts chains; a tree is already grown by the draft's "
         "confidence (EAGLE-2's expansion): give one or the other"),
        ("draft_confidence", args.batch is not None, "is not offered with --batch"),
        ("ngram_max", spec.kind != "ngram", f"only applies to --draft ngram; the draft here is {args.draft}"),
        ("ngram_max", args.draft != "ngram", f"and --draft {args.draft} both set the n-gram length; give one"),
        *((dest, only_ar, "is about the speculative decoder, which --only autoregressive does not run")
          for dest in ("draft", "K", "tree", "k_max", "ngram_max", "verification", "cross_vocab", "siblings",
                       "draft_confidence")),
        ("verification", greedy and args.verification in ("spectr", "traversal"), "has no effect at temperature 0 "
         "(every tree rule follows the target's argmax); give --temperature"),
        ("siblings", args.tree is None, "shapes a tree's children: give --tree N"),
        ("siblings", spec.kind not in ("model", "early_exit") or args.cross_vocab is not None,
         f"only applies to a draft model or early_exit:L (they sample a tree's children); the draft here is "
         f"{args.draft}" + (" with --cross_vocab" if args.cross_vocab else "")),
        ("siblings", greedy, "has no effect at temperature 0 (a tree's children are the draft's top tokens); "
         "give --temperature"),
        ("prompt", args.batch is not None, "is one prompt; --batch reads its prompts from --prompt_file"),
        ("no_warmup", args.batch is not None, "is not offered with --batch (the batch always runs untimed first)"),
    ])  # fmt: skip


def main(argv=None, prog: str = "specdec") -> int:
    """The command line; prog names it in messages ("main.py" when run through the wrapper)."""
    for stream in (sys.stdout, sys.stderr):  # a terminal that cannot show a character gets "?", not a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["cache"]:
        return cache(argv[1:], f"{prog} cache")
    args = parse_args(argv, prog)
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
            raise CheckpointError(f"{name}: the file has no tokenizer (no tokenizer.ggml.* metadata), and the "
                                  "command line decodes text; load it with specdec.load_model and pass token ids")  # fmt: skip
        return model, time.perf_counter() - start
    folder, repo = resolve_model(name, args.models_dir)
    missing = bool(missing_files(folder))
    if missing and not args.json and (card := registry.card(name)) is not None and card.kept_layout:
        print(f"(first use of {name}: {human(card.download)} to download, then {human(card.kept_layout)} more kept "
              f"beside it, its weights transposed so that later loads copy nothing; `python -m specdec cache` "
              "lists and removes what is stored)")  # fmt: skip
    start = time.perf_counter()
    ensure_files(folder, repo, HubSettings.from_env(), progress=not args.json)
    if missing and not args.json:
        print(f"(downloaded {name} in {time.perf_counter() - start:.0f} s)")
    start = time.perf_counter()
    return tuned(load_folder(folder, name=name), args.models_dir, progress=not args.json), time.perf_counter() - start


def run(args) -> int:
    say = (lambda *a, **k: None) if args.json else print
    target, target_load = load(args.target_model_size, args)
    tokenizer = target.tokenizer
    if args.chat and "<|im_start|>" not in tokenizer.special_tokens_set:
        raise BadRequest(f"--chat needs a chat model such as {', '.join(WHEELS)}; {args.target_model_size} has no "
                         "chat template")  # fmt: skip
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
            check_cross_vocab(target, draft, args)

    if args.float64:  # the target only: a draft (even the target itself) stays float32
        target = target.astype(np.float64)
    if args.batch is not None:
        return run_batch(args, target, draft, draft_label)
    request = requests[0]
    if not args.prompt and args.chat:
        say("(empty prompt: an empty user message, so the prompt is the chat template alone)")
    elif not args.prompt:
        end = tokenizer.decode([tokenizer.eot_token])
        say(f"(empty prompt: starting from the end-of-text token {end}, id {tokenizer.eot_token}, as GPT-2 samples "
            "unconditionally)")  # fmt: skip
    sampling = "greedy (temperature 0)" if args.temperature == 0 else f"temperature {args.temperature}"
    sampling += f", top-k {args.top_k}" if args.top_k and args.temperature else ""
    sampling += f", top-p {args.top_p}" if args.top_p and args.temperature else ""
    say(f"target: {args.target_model_size} ({plural(target.n_layer, 'layer')}, {target.n_embd} wide"
        f"{', float64' if args.float64 else ''}), loaded in {target_load:.2f} s")  # fmt: skip
    say(f"draft:  {draft_label}" + (f", loaded in {draft_load:.2f} s" if draft_load else ""))
    say(f"prompt: {shorten(args.prompt)!r} ({plural(len(request.prompt), 'token')}"
        + (f", {request.template_tokens} of them the chat template)" if args.chat else ")"))
    tree = f", tree={args.tree}" if args.tree else ""
    tree += f", {args.verification} verification" if args.verification != "token" else ""
    tree += f", siblings {args.siblings}" if args.siblings else ""
    if args.draft_confidence is not None:
        tree += ", draft confidence >= " + ("the bar the costs set" if args.draft_confidence == "auto"
                                            else str(args.draft_confidence))  # fmt: skip
    say(f"{args.n_tokens_to_generate} new tokens, K={args.K}{tree}, {sampling}, seed {args.seed}, repeats {args.repeats}")

    status = Status()
    stream = Stream(args, tokenizer, draft_label, status) if not args.json else None
    status.before = stream and stream.finish
    decoders = [d for d in ("autoregressive", "speculative") if args.only in (None, d)]
    interrupted = None
    try:
        report = race(target, draft, args.prompt, args.n_tokens_to_generate, K=args.K,
                      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                      repeats=args.repeats, warmup=not args.no_warmup, k_max=args.k_max, decoders=decoders,
                      on_token=stream, on_decoder=stream and stream.start, tree=args.tree, chat=args.chat,
                      on_status=status, verification=args.verification, cross_vocab=args.cross_vocab,
                      siblings=args.siblings, request=request, draft_confidence=args.draft_confidence)  # fmt: skip
    except RaceInterrupted as e:  # Ctrl-C: show what was measured, then exit 130
        report, interrupted = e.report, e.during
    status.clear()
    if stream:
        stream.finish()
        print()
    if interrupted:
        print(f"interrupted while {interrupted}" + ("; nothing was timed yet" if not has_runs(report) else
              "; what was measured so far:"), file=sys.stderr)  # fmt: skip
    if report is not None and (has_runs(report) or not interrupted):
        if args.json:
            out = report.to_dict()
            out["settings"].update(prompt=args.prompt, target=args.target_model_size, draft=str(spec),
                                   float64=args.float64)  # fmt: skip
            out["load_seconds"] = {"target": target_load, "draft": draft_load}
            out["interrupted"] = interrupted
            print(json.dumps(out, indent=2, allow_nan=False))
        else:
            print(report)
    return 130 if interrupted else 0


class BadRequest(ValueError):
    """Bad input that only the loaded model can judge (a prompt too long for its context, say): exit 2."""


def checked_request(target, prompt: str, args):
    """The prompt as the samplers will see it (request.make_request: control strings typed in it stay
    text), for the lines that describe it; its errors are bad input."""
    try:
        return make_request(target, prompt, args.n_tokens_to_generate, chat=args.chat)
    except ValueError as e:
        raise BadRequest(str(e).replace("n_tokens (", "--n_tokens_to_generate (")) from None


def has_runs(report) -> bool:
    return report is not None and bool(report.autoregressive or report.speculative)


def check_same_tokenizer(target, draft, args) -> None:
    probe = "Tokenizers must agree: 123 ünïcode <|endoftext|>"
    encode = lambda model: model.tokenizer.encode(probe, allowed_special="all")  # noqa: E731
    if target.tokenizer and draft.tokenizer and encode(target) != encode(draft):
        raise ValueError(f"the draft {args.draft} and target {args.target_model_size} tokenize text differently; "
                         f"give --cross_vocab tli (any temperature) or slem (temperature 0), or a draft with the "
                         f"target's tokenizer")


def check_cross_vocab(target, draft, args) -> None:
    """What only the two loaded vocabularies can tell: whether the rule can afford them (SLRS sampling)."""
    try:
        make_drafter(draft, target, args.cross_vocab).check(SamplingParams(args.temperature, args.top_k, args.top_p))
    except ValueError as e:
        raise BadRequest(str(e)) from None


def parse_tree(text: str | None):
    """--tree: None (a chain), a node budget 1..64, or 'auto'."""
    if text is None or text == "auto":
        return text
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise ValueError(f"--tree must be a node budget 1..64 or 'auto', got {text!r}")
    return int(text)




if __name__ == "__main__":
    sys.exit(main())
