"""Race autoregressive and speculative decoding on GPT-2, and explain the result.

    python main.py                                   # 355M target, 124M draft, K=4, greedy
    python main.py --prompt "The meaning of life is" --K 6 --temperature 0.8 --seed 1
    python main.py --draft ngram --target_model_size 124M
    python main.py --K auto --json

This file is flags and printing only: the timing lives in specdec/harness.py,
the decoding in specdec/autoregressive.py and specdec/speculative.py.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import sys
import time

from specdec import CheckpointError, DownloadError, load_model
from specdec.checkpoint import MODEL_REPOS
from specdec.hub import default_models_dir
from specdec.harness import jsonable, race

DEFAULT_PROMPT = "Alan Turing theorized that computers would one day become"

# ANSI colours for the speculative trace, by how each token was produced.
COLOURS = {"draft": "\033[32m", "target": "\033[33m", "bonus": "\033[36m"}
RESET = "\033[0m"
LEGEND = {
    "draft": "accepted draft token",
    "target": "sampled by the target (corrected)",
    "bonus": "bonus token (all drafts accepted)",
}


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit code 2, not a usage dump
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv=None) -> argparse.Namespace:
    names = ", ".join(MODEL_REPOS)
    p = Parser(prog="main.py", description="Race plain autoregressive decoding against speculative decoding on GPT-2.")
    p.add_argument(
        "--prompt",
        default=DEFAULT_PROMPT,
        help="text to continue (default: %(default)r); empty starts from <|endoftext|>",
    )
    p.add_argument(
        "--n_tokens_to_generate",
        type=int,
        default=40,
        metavar="N",
        help="new tokens per decoder (default: %(default)s)",
    )
    p.add_argument(
        "--target_model_size",
        default="355M",
        metavar="MODEL",
        help=f"the model whose output we want: {names}, a Hub repo id or a local folder (default: %(default)s)",
    )
    p.add_argument("--draft_model_size", "--draft", dest="draft", default="124M", metavar="DRAFT",
                   help="the drafter: a model name as above, 'ngram' (prompt lookup, no model) or 'early_exit:L' (the target's first L layers) (default: %(default)s)")  # fmt: skip
    p.add_argument(
        "--ngram_max", type=int, default=3, help="longest suffix the n-gram drafter matches (default: %(default)s)"
    )
    p.add_argument(
        "--K",
        default="4",
        help="draft tokens per round: an integer >= 1, 'auto' (chosen from measured costs and the running acceptance rate) or 'adaptive' (grow on full acceptance, shrink on rejection) (default: %(default)s)",
    )
    p.add_argument(
        "--k_max", type=int, default=8, help="largest K that 'auto' and 'adaptive' may use (default: %(default)s)"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy decoding (default: %(default)s)")
    p.add_argument("--top_k", type=int, default=None, help="keep only the k most likely tokens")
    p.add_argument(
        "--top_p",
        type=float,
        default=None,
        help="keep the smallest set of tokens with this much probability, in (0, 1]",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed for sampling (default: %(default)s)")
    p.add_argument("--models_dir", help=f"where checkpoints are downloaded and looked for (default: "
                   f"{default_models_dir()}; set SPECDEC_HOME to move it)")  # fmt: skip
    p.add_argument("--only", choices=["autoregressive", "speculative"], help="run just one of the two decoders")
    p.add_argument(
        "--repeats", type=int, default=1, help="timed runs per decoder; the median is reported (default: %(default)s)"
    )
    p.add_argument("--no_warmup", action="store_true", help="skip the short untimed warm-up run")
    p.add_argument("--json", action="store_true", help="print the measurements as one JSON object instead of text")
    args = p.parse_args(argv)

    if args.K not in ("auto", "adaptive"):
        try:
            args.K = int(args.K)
        except ValueError:
            p.error(f"--K must be an integer >= 1, 'auto' or 'adaptive', not {args.K!r}")
        if args.K < 1:
            p.error(f"--K must be at least 1 (it is the number of draft tokens per round), got {args.K}")
    if args.n_tokens_to_generate < 1:
        p.error("--n_tokens_to_generate must be >= 1")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if not 1 <= args.k_max <= 32:
        p.error("--k_max must be in 1..32")
    if args.ngram_max < 1:
        p.error("--ngram_max must be >= 1")
    return args


class TokenPrinter:
    """Streams tokens as text, decoding UTF-8 across token boundaries, optionally coloured."""

    def __init__(self, tokenizer, colour: bool, out=sys.stdout):
        self.tokenizer, self.colour, self.out = tokenizer, colour, out
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int, kind: str) -> None:
        text = self.decoder.decode(self.tokenizer.decode_single_token_bytes(token))
        if self.colour and kind in COLOURS:
            text = f"{COLOURS[kind]}{text}{RESET}"
        self.out.write(text)
        self.out.flush()

    def finish(self) -> None:
        self.out.write(self.decoder.decode(b"", final=True) + "\n")


def use_colour() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def load(name: str, models_dir: str, quiet: bool):
    start = time.perf_counter()
    model = load_model(name, models_dir, progress=not quiet)
    return model, time.perf_counter() - start


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (ValueError, CheckpointError, DownloadError) as e:
        print(f"main.py: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a models_dir that cannot be created or written, a full disk
        print(f"main.py: error: {e.strerror or e}: {e.filename or ''} (check --models_dir)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def run(args) -> int:
    quiet = args.json
    say = (lambda *a, **k: None) if quiet else print

    target, target_load = load(args.target_model_size, args.models_dir, quiet)
    draft_kind, _, draft_arg = args.draft.partition(":")
    draft_load = 0.0
    if args.only == "autoregressive":
        draft, draft_label = None, "none (--only autoregressive)"
    elif draft_kind == "ngram":
        n_max = int(draft_arg) if draft_arg.isdigit() else args.ngram_max
        draft, draft_label = f"ngram:{n_max}", f"n-gram lookup (n <= {n_max})"
    elif draft_kind == "early_exit":
        draft, draft_label = args.draft, f"the target's first {draft_arg} layers"
    elif args.draft == args.target_model_size:
        draft, draft_label = target, f"{args.draft} (the target itself)"
    else:
        draft, draft_load = load(args.draft, args.models_dir, quiet)
        draft_label = f"{args.draft} ({draft.n_layer} layers, {draft.n_embd} wide)"
        check_same_tokenizer(target, draft, args)

    tokenizer = target.tokenizer
    prompt_ids = tokenizer.encode(args.prompt, allowed_special="all") or [tokenizer.eot_token]
    if not args.prompt:
        say("(empty prompt: starting from <|endoftext|>, as GPT-2 does)")
    sampling = "greedy (temperature 0)" if args.temperature == 0 else f"temperature {args.temperature}"
    if args.top_k:
        sampling += f", top-k {args.top_k}"
    if args.top_p:
        sampling += f", top-p {args.top_p}"
    say(
        f"target: {args.target_model_size} ({target.n_layer} layers, {target.n_embd} wide), loaded in {target_load:.2f} s"
    )
    say(f"draft:  {draft_label}" + (f", loaded in {draft_load:.2f} s" if draft_load else ""))
    say(f"prompt: {args.prompt!r} ({len(prompt_ids)} tokens)")
    say(f"{args.n_tokens_to_generate} new tokens, K={args.K}, {sampling}, seed {args.seed}, repeats {args.repeats}")

    colour = use_colour() and not quiet
    printers = {}

    def on_token(sampler: str, token: int, kind: str) -> None:
        if quiet:
            return
        if sampler not in printers:
            section(sampler, args, draft_label)
            if sampler == "speculative" and colour:
                print("legend: " + "  ".join(f"{COLOURS[k]}{v}{RESET}" for k, v in LEGEND.items()))
            print(args.prompt, end="", flush=True)
            printers[sampler] = TokenPrinter(tokenizer, colour and sampler == "speculative")
        printers[sampler](token, kind)

    result = race(
        target, draft, prompt_ids, args.n_tokens_to_generate, K=args.K, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, seed=args.seed, repeats=args.repeats, warmup=not args.no_warmup,
        k_max=args.k_max, run_autoregressive=args.only != "speculative", run_speculative=args.only != "autoregressive",
        on_token=on_token if not quiet else None,
    )  # fmt: skip
    for name in ("autoregressive", "speculative"):
        if name in printers:
            printers[name].finish()
    report = build_report(args, result, target, tokenizer, prompt_ids, target_load, draft_load)
    if quiet:
        print(json.dumps(jsonable(report), indent=2, allow_nan=False))
    else:
        print_report(report, args)
    return 0


def check_same_tokenizer(target, draft, args) -> None:
    probe = "Tokenizers must agree: 123 ünïcode <|endoftext|>"
    if (
        target.tokenizer
        and draft.tokenizer
        and (
            target.tokenizer.encode(probe, allowed_special="all")
            != draft.tokenizer.encode(probe, allowed_special="all")
        )
    ):
        raise ValueError(
            f"the draft {args.draft} and target {args.target_model_size} tokenize text differently; "
            f"speculative decoding needs a draft with the target's tokenizer"
        )


def section(sampler: str, args, draft_label: str) -> None:
    title = (
        f"autoregressive ({args.target_model_size} alone)"
        if sampler == "autoregressive"
        else f"speculative (draft: {draft_label}, K={args.K})"
    )
    print(f"\n── {title} " + "─" * max(3, 70 - len(title)))


def build_report(args, result, target, tokenizer, prompt_ids, target_load, draft_load) -> dict:
    report = {
        "settings": {
            "prompt": args.prompt, "prompt_tokens": len(prompt_ids), "n_tokens": args.n_tokens_to_generate,
            "target": args.target_model_size, "draft": args.draft, "K": args.K, "temperature": args.temperature,
            "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed, "repeats": args.repeats,
        },
        "load_seconds": {"target": target_load, "draft": draft_load},
    }  # fmt: skip
    for name, run in (("autoregressive", result.ar), ("speculative", result.spec)):
        if run is None:
            continue
        r = run.result
        report[name] = {
            "seconds": run.seconds,
            "seconds_all_repeats": [x.seconds for x in getattr(result, name)],
            "tokens_per_second": run.tokens_per_second,
            "text": tokenizer.decode(r.tokens),
            "tokens": r.tokens,
            "target_calls": r.target_calls,
            "draft_calls": r.draft_calls,
            "tokens_per_target_call": r.tokens_per_target_call,
        }
        if name == "speculative":
            report[name].update({
                "rounds": r.rounds, "drafted": r.drafted, "accepted": r.accepted,
                "acceptance_rate": r.acceptance_rate, "alpha": r.alpha,
                "accepted_histogram": r.accepted_histogram, "mean_k": r.mean_k,
                "draft_seconds": run.draft_seconds, "verify_seconds": run.verify_seconds,
                "sampler_seconds": run.seconds - run.draft_seconds - run.verify_seconds,
            })  # fmt: skip
    report["costs"] = {"target_step_seconds": result.costs.target_step, "draft_step_seconds": result.costs.draft_step,
                       "c": result.costs.c, "r": result.costs.r}  # fmt: skip
    if result.spec:
        report["summary"] = {"speedup": result.speedup, "texts_identical": result.texts_identical, **result.explain()}
    return report


def first_difference(report: dict) -> str:
    a, b = report["autoregressive"]["tokens"], report["speculative"]["tokens"]
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (
        f"NO: they differ from new token {i}. A float32 near-tie between the two best tokens can do "
        f"this (the two decoders round differently); a difference at a clear winner is a bug"
    )


def print_report(report: dict, args) -> None:
    for name in ("autoregressive", "speculative"):
        if name not in report:
            continue
        r = report[name]
        line = f"{args.n_tokens_to_generate} tokens in {r['seconds']:.2f} s ({r['tokens_per_second']:.1f} tokens/s), {r['target_calls']} target passes"
        if name == "speculative":
            line += f", {r['draft_calls']} draft passes"
        print(f"[{name}] {line}")
        if name == "speculative":
            total = r["seconds"]
            print(
                f"[{name}] time: drafting {r['draft_seconds']:.2f} s ({r['draft_seconds'] / total:.0%}), "
                f"verifying {r['verify_seconds']:.2f} s ({r['verify_seconds'] / total:.0%}), "
                f"sampler {r['sampler_seconds']:.2f} s ({r['sampler_seconds'] / total:.0%})"
            )
    costs = report["costs"]
    summary = report.get("summary")
    print("\n── summary " + "─" * 62)
    if summary is None:
        print(
            f"target step {costs['target_step_seconds'] * 1e3:.1f} ms; draft step {costs['draft_step_seconds'] * 1e3:.1f} ms"
        )
        return
    spec = report["speculative"]
    both = "autoregressive" in report
    rows = [("speedup (autoregressive time / speculative time)", f"{summary['speedup']:.2f}x")] if both else []
    rows += [
        (
            "acceptance rate (accepted / drafted)",
            f"{spec['acceptance_rate']:.2f}  ({spec['accepted']} of {spec['drafted']})",
        ),
        ("alpha (accepted / drafts actually judged)", f"{summary['alpha']:.2f}"),
        (
            "tokens per target pass",
            f"{spec['tokens_per_target_call']:.2f}  ({spec['target_calls']} passes incl. prompt, {spec['rounds']} rounds)",
        ),
        ("accepted drafts per round (0..K histogram)", str(spec["accepted_histogram"])),
        ("draft / target passes", f"{spec['draft_calls']} / {spec['target_calls']}"),
        (
            "cost of a draft step, c = draft / target",
            f"{costs['c']:.3f}  ({costs['draft_step_seconds'] * 1e3:.1f} ms vs {costs['target_step_seconds'] * 1e3:.1f} ms)",
        ),
    ]
    if "predicted_speedup" in summary:
        k = round(summary["mean_k"])
        rows += [
            ("mean drafts per round, k", f"{summary['mean_k']:.2f}"),
            (f"target pass over k+1={k + 1} tokens vs 1 token", f"{summary['verify_cost_ratio']:.2f}x"),
            (
                f"expected tokens per round (1-a^{k + 1})/(1-a)",
                f"{summary['tokens_per_round_expected']:.2f}  (measured {summary['tokens_per_round']:.2f})",
            ),
            ("predicted speedup from these measurements", f"{summary['predicted_speedup']:.2f}x"),
            ("  ...if verifying cost one step (GPU-like)", f"{summary['predicted_speedup_if_r_were_1']:.2f}x"),
            (
                "best K for these costs and alpha",
                "none: plain decoding wins"
                if summary["best_k"] == 0
                else f"{summary['best_k']} (predicted {summary['best_k_speedup']:.2f}x)",
            ),
        ]
    if args.temperature == 0 and both:
        rows.append(
            ("identical text at temperature 0", "yes" if summary["texts_identical"] else first_difference(report))
        )
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    sys.exit(main())
