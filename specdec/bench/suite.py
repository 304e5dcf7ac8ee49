"""The prompt suite: how well each drafter does on each kind of text.

What it adds over the library: measurements on a fixed, committed set of
prompts (specdec/bench/prompts.json) in five categories: copying from the prompt,
code, free continuation, lists and templates, dialogue. It is a CPU-sized take
on Spec-Bench (Xia et al., arXiv 2401.07851), which showed that a drafter's
speedup depends strongly on the kind of text.

Two measurements:

    python -m specdec.bench --only suite --target 355M --drafts 124M,ngram,early_exit:12
        per category and drafter: speedup (autoregressive time / speculative
        time), tau (tokens per verification round, the bonus or corrected token
        included; 1 for plain decoding) and alpha (accepted / judged drafts).

    python -m specdec.bench --only alpha-table
        the acceptance rate alpha of every draft -> target pair of the GPT-2
        family found on disk (distilgpt2, 124M, 355M, 774M, 1558M) at
        temperatures 0, 0.7 and 1, as a markdown table. Real weights only: it
        never downloads.

The alpha table and how it measures alpha: bench/alpha.py. The prompts: bench/prompts.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable


from ..cli import flags
from .. import safe_io
from ..autoregressive import autoregressive_sample
from ..config import parse_k
from ..drafters import make_drafter
from ..drafters.specs import parse_draft
from ..costmodel import confidence_bar
from ..drafters.stopping import ConfidenceStop, parse_confidence
from ..model.tokenizer import chat_prompt
from ..timing import measure_costs
from ..model.base import CausalLM
from ..sampling import SamplingParams
from ..speculative import speculative_sample
from .alpha import alpha_markdown, alpha_table, model_hparams, n_params, present_models
from .progress import Progress, add_quiet
from .tally import Tally, suite_table
from .prompts import encode, load_prompts

# ---------------------------------------------------------------------------
# Speedup, tau and alpha per category and drafter.
# ---------------------------------------------------------------------------


def _seconds(fn: Callable[[], object]):
    """(wall time, fn's return value)."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run_suite(
    target: CausalLM,
    drafts: dict[str, object],
    prompts: dict[str, list[str]],
    n_tokens: int = 48,
    K: int | str | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    repeats: int = 1,
    say: Callable[[str], None] = lambda line: None,
    chat: bool = False,
    tree: int | None = None,
) -> dict[str, dict[str, dict]]:
    """{drafter label: {category: row, ..., "all": row}}; a row has speedup (median over repeats, with its
    min and max), tau, alpha and the acceptance at each draft position.

    drafts: label -> what speculative_sample takes as `draft` (a model, "ngram", "early_exit:L", "eagle",
    a drafter object). K: as speculative_sample takes it (None: each drafter's own: 32 for suffix decoding, which
    sizes its rounds, 4 for the others; "auto": chosen by the costs). Timing is interleaved: each repeat decodes every prompt once plainly and then once
    per drafter, with the same seed, so a change in the machine's load falls on all of them alike; a
    repeat's speedup is a ratio of token rates summed within a category. The decoding-alone speedup leaves the
    prompt's pass out of both (it is the same pass, which speculation cannot shorten, and it weighs most where
    a reply is short against its prompt): plain decoding's time after its first token, which comes with the
    prompt's pass, against speculative decoding's time less that pass. chat: each prompt is a user
    message to a chat model (its template applied; a reply may end before n_tokens). tree: draft token
    trees of up to this many nodes instead of chains.
    """
    settings = dict(temperature=temperature, seed=seed, chat=chat)
    ids = {cat: [p if chat else encode(target, p) for p in ps] for cat, ps in prompts.items()}
    first = next(iter(ids.values()))[0]
    autoregressive_sample(target, first, 4, **settings)  # warm-up: page in weights, start BLAS threads
    for draft in drafts.values():
        speculative_sample(target, draft, first, 4, K=K, tree=tree, **settings)

    tallies = {label: {cat: Tally() for cat in [*prompts, "all"]} for label in drafts}
    for repeat in range(repeats):
        for cat, prompt_ids in ids.items():
            for i, prompt in enumerate(prompt_ids):
                say(f"  repeat {repeat + 1}/{repeats}, {cat} {i + 1}/{len(prompt_ids)}")
                first_token_at = []  # when plain decoding's first token came: the end of the prompt's pass
                on_token = lambda token, kind: first_token_at or first_token_at.append(time.perf_counter())  # noqa: E731
                start = time.perf_counter()
                ar = autoregressive_sample(target, prompt, n_tokens, on_token=on_token, **settings)
                ar_seconds = time.perf_counter() - start
                prompt_seconds = first_token_at[0] - start if first_token_at else 0.0
                for label, draft in drafts.items():
                    spec_seconds, result = _seconds(
                        lambda: speculative_sample(target, draft, prompt, n_tokens, K=K, tree=tree, **settings)
                    )
                    for key in (cat, "all"):
                        tallies[label][key].add(
                            repeat, ar_seconds, len(ar.tokens), spec_seconds, result, prompt_seconds
                        )
    return {label: {cat: t.row() for cat, t in by_cat.items()} for label, by_cat in tallies.items()}


# ---------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    paragraphs = __doc__.split("\n\n")
    p = flags.Parser(
        prog="python -m specdec.bench --only suite|alpha-table",
        description=paragraphs[0],
        epilog="\n\n".join(paragraphs[2:4]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--alpha-table", action="store_true", help="measure alpha of every draft/target pair on disk")
    p.add_argument(
        "--models",
        help="--alpha-table: comma-separated names or folders (default: the GPT-2 family "
        "members present in --models-dir)",
    )
    p.add_argument(
        "--models-dir",
        help="where checkpoints are looked for (default: as main.py, ~/.cache/specdec/models or $SPECDEC_HOME/models)",
    )
    p.add_argument("--target", default="355M", help="suite: the target model (default: %(default)s)")
    p.add_argument(
        "--drafts",
        default="124M,ngram,early_exit:12",
        help="suite: comma-separated drafters, model names or folders, 'ngram', 'ngram:N', "
        "'early_exit:L', 'eagle', 'suffix', 'suffix:none', 'ngram+eagle', 'suffix+eagle' (lookup first); NAME@P cuts NAME's chains by a "
        "draft confidence bar P "
        "(speculative_sample's draft_confidence: a number in (0, 1] or auto), e.g. eagle,eagle@auto "
        "(default: %(default)s)",
    )
    p.add_argument("--prompts", help="a JSON prompt suite in prompts.json's layout (default: the committed one)")
    p.add_argument("--categories", help="comma-separated categories to run (default: all)")
    p.add_argument("--n-tokens", type=int, help="new tokens per prompt (default 48; 32 for --alpha-table)")
    p.add_argument(
        "--K",
        type=k_flag,
        default=None,
        help="suite: draft tokens per round, or auto (default: each drafter's own: 32 for suffix decoding, else 4)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="suite: sampling temperature (default: 0)")
    p.add_argument("--temperatures", default="0,0.7,1", help="--alpha-table: temperatures (default: %(default)s)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="suite: timed runs of the whole suite, interleaved; the "
        "median speedup is printed with its range (default 1)",
    )
    p.add_argument("--chat", action="store_true", help="suite: each prompt is a user message to a chat model")
    p.add_argument("--tree", type=int, default=None, help="suite: draft token trees of up to N nodes (depth K)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON to PATH")
    add_quiet(p)
    args = p.parse_args(argv)
    if args.n_tokens is None:
        args.n_tokens = 32 if args.alpha_table else 48
    if args.n_tokens < 1 or args.repeats < 1:
        p.error("--n-tokens and --repeats must be at least 1")
    try:
        args.temperatures = [float(t) for t in args.temperatures.split(",")]
        for T in [*args.temperatures, args.temperature]:
            SamplingParams(T)
    except ValueError:
        p.error("temperatures must be numbers >= 0, e.g. --temperatures 0,0.7,1")
    try:
        args.suite = load_prompts(args.prompts)
    except (OSError, ValueError) as e:
        p.error(str(e))
    if args.categories:
        wanted = args.categories.split(",")
        unknown = [c for c in wanted if c not in args.suite]
        if unknown:
            p.error(f"unknown categories {', '.join(unknown)}: the suite has {', '.join(args.suite)}")
        args.suite = {c: args.suite[c] for c in wanted}
    return args


def k_flag(text: str):
    """--K's value: an integer in 1..32 or auto (config.parse_k), its refusal in argparse's words."""
    try:
        return parse_k(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def with_bar(label: str, draft, target: CausalLM, text: str, prompt: list[int], say: Callable[[str], None]):
    """The drafter of a --drafts entry NAME@P: P a number in (0, 1], or "auto", the bar the costs measured here
    set (costmodel.confidence_bar: c + r(2) - 1, timed after the suite's first prompt, as the race does)."""
    try:
        confidence = parse_confidence(text)
    except ValueError:
        raise ValueError(f"--drafts NAME@P needs P in (0, 1] or 'auto', got {text!r}") from None
    drafter = make_drafter(draft, target, confidence=confidence)
    if confidence == "auto":
        costs = measure_costs(target, drafter, prompt)
        drafter.stop = ConfidenceStop(confidence_bar(costs.c, costs.r))
        say(f"{label}: bar {drafter.stop.bar:g} (c {costs.c:.3f}, r(2) {costs.r[1]:.2f})")
    return drafter


def load_average() -> str:
    """The 1-minute load average, printed beside timings (a busy machine slows every decoder unevenly)."""
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "unknown"


def main(argv=None) -> int:
    args = parse_args(argv)
    from ..checkpoints.download import DownloadError
    from ..checkpoints.load import load_model
    from ..checkpoints.safetensors import CheckpointError
    from ..checkpoints.settings import default_models_dir

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    progress = Progress("suite", args.quiet)  # the errors above are said whatever --quiet says

    def load(name: str) -> CausalLM:
        return load_model(name, args.models_dir, progress=True)

    try:
        if args.alpha_table:
            where = args.models_dir or default_models_dir()
            names = args.models.split(",") if args.models else present_models(args.models_dir)
            missing = [name for name in names if not present_models(args.models_dir, [name])]
            if missing:
                say(
                    f"python -m specdec.bench: error: not on disk: {', '.join(missing)} (the alpha table never "
                    f"downloads; looked in {where})"
                )
                return 1
            if len(names) < 2:
                say(
                    f"--alpha-table needs at least two models on disk; found {names or 'none'} in {where}. It "
                    f"measures the real GPT-2 family: download them first, e.g. python main.py "
                    f"--target_model_size 355M --draft 124M"
                )
                return 1
            names = sorted(names, key=lambda name: n_params(model_hparams(name, args.models_dir)))
            progress(
                f"alpha table: {', '.join(names)}; {sum(map(len, args.suite.values()))} prompts, "
                f"{args.n_tokens} tokens each, T = {', '.join(map(str, args.temperatures))}"
            )
            table = alpha_table(load, names, args.suite, args.temperatures, args.n_tokens, args.seed, progress)
            alpha_markdown(table, sys.stdout)
            numbers = table
        else:
            target = load(args.target)
            drafts = {}
            first = next(iter(args.suite.values()))[0]  # "NAME@auto" times its costs after this prompt
            prompt = chat_prompt(target.tokenizer, first) if args.chat else encode(target, first)
            for label in args.drafts.split(","):
                name, at, bar = label.partition("@")
                model_free = parse_draft(name).kind != "model"
                draft = name if model_free else target if name == args.target else load(name)
                drafts[label] = with_bar(label, draft, target, bar, prompt, progress) if at else draft
            progress(
                f"suite: target {args.target}, drafters {', '.join(drafts)}, K={args.K or 'each drafter own'}, T={args.temperature}, "
                f"{args.n_tokens} tokens per prompt, {args.repeats} interleaved timed run(s)"
                f"{', chat' if args.chat else ''}{f', trees of {args.tree}' if args.tree else ''}; load average "
                f"{load_average()}"
            )
            numbers = run_suite(
                target,
                drafts,
                args.suite,
                args.n_tokens,
                args.K,
                args.temperature,
                args.seed,
                args.repeats,
                progress,
                chat=args.chat,
                tree=args.tree,
            )
            suite_table(numbers, sys.stdout)
            say(f"load average {load_average()} at the end (the speedups are wall-clock: read them with it)")
    except (ValueError, CheckpointError, DownloadError, OSError) as e:
        say(f"python -m specdec.bench: error: {e}")
        return 1
    if args.json:
        from ..race.render import jsonable

        safe_io.write_json(args.json, jsonable(numbers))
    return 0
