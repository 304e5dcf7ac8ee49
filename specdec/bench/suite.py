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
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO


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
from .prompts import encode, load_prompts

# ---------------------------------------------------------------------------
# Speedup, tau and alpha per category and drafter.
# ---------------------------------------------------------------------------


@dataclass
class Tally:
    """Sums over the prompts of one category, for one drafter, over every timed repeat."""

    ar_seconds: list[float] = field(default_factory=list)  # per repeat: seconds of plain decoding
    spec_seconds: list[float] = field(default_factory=list)  # per repeat: seconds of speculative decoding
    ar_tokens: list[int] = field(default_factory=list)  # per repeat: tokens plain decoding wrote
    spec_tokens: list[int] = field(default_factory=list)  # per repeat: tokens speculative decoding wrote
    tokens: int = 0  # the last repeat's counts (every repeat decodes the same: same seeds)
    rounds: int = 0
    accepted: int = 0
    judged: int = 0
    prompts: int = 0
    by_position: list[list[int]] = field(default_factory=list)  # [i] = [accepted, judged] of draft position i + 1
    lengths: list[int] = field(default_factory=lambda: [0] * len(LENGTH_BINS))  # rounds by drafts accepted, binned
    each: list[list[float]] = field(default_factory=list)  # [i] = prompt i's speedup (of rates) in each repeat
    seen: list[int] = field(default_factory=list)  # per repeat: prompts added so far
    # Decoding alone: the prompt's pass (timed as plain decoding's first token, which comes with it) taken out of
    # both. Plain decoding then wrote its tokens but the first; speculative decoding, which reads all of the prompt
    # but its last token before its first round, wrote all of its own.
    ar_decode: list[list[float]] = field(default_factory=list)  # per repeat: [seconds, tokens]
    spec_decode: list[list[float]] = field(default_factory=list)  # per repeat: [seconds, tokens]
    each_decode: list[list[float]] = field(default_factory=list)  # [i] = prompt i's decoding-alone speedup per repeat

    def add(
        self, repeat: int, ar_seconds: float, ar_tokens: int, spec_seconds: float, result, prompt_seconds: float = 0.0
    ) -> None:
        while len(self.ar_seconds) <= repeat:
            for series in (self.ar_seconds, self.spec_seconds, self.ar_tokens, self.spec_tokens, self.seen):
                series.append(0)
            self.ar_decode.append([0.0, 0])
            self.spec_decode.append([0.0, 0])
        i, self.seen[repeat] = self.seen[repeat], self.seen[repeat] + 1
        if i == len(self.each):
            self.each.append([])
            self.each_decode.append([])
        self.each[i].append(len(result.tokens) * ar_seconds / (spec_seconds * ar_tokens))
        ar_decode = (ar_seconds - prompt_seconds, ar_tokens - 1)
        spec_decode = (spec_seconds - prompt_seconds, len(result.tokens))
        if ar_decode[1] > 0 and min(ar_decode[0], spec_decode[0]) > 0:  # a 1-token reply has no decoding to time
            self.each_decode[i].append(spec_decode[1] * ar_decode[0] / (spec_decode[0] * ar_decode[1]))
        for total, (seconds, tokens) in ((self.ar_decode[repeat], ar_decode), (self.spec_decode[repeat], spec_decode)):
            total[0] += seconds
            total[1] += tokens
        self.ar_seconds[repeat] += ar_seconds
        self.spec_seconds[repeat] += spec_seconds
        self.ar_tokens[repeat] += ar_tokens
        self.spec_tokens[repeat] += len(result.tokens)
        if repeat > 0:
            return
        self.tokens += len(result.tokens)
        self.rounds += result.rounds
        self.accepted += result.accepted
        self.judged += sum(result.judged)
        self.prompts += 1
        for accepted, judged in zip(result.accepted_per_round, result.judged):
            self.lengths[length_bin(accepted)] += 1
            while len(self.by_position) < judged:
                self.by_position.append([0, 0])
            for i in range(judged):  # draft i + 1 was judged; accepted when i < accepted
                self.by_position[i][0] += i < accepted
                self.by_position[i][1] += 1

    def row(self) -> dict:
        ratio = lambda a, b: a / b if b else math.nan  # noqa: E731
        # Speedup = speculative tokens/s over plain tokens/s, per repeat: equal to the ratio of times when both
        # wrote the same number of tokens (always at T=0), and still fair when a chat reply ended early.
        speedups = sorted(
            ratio(st * a, s * at)
            for a, s, at, st in zip(self.ar_seconds, self.spec_seconds, self.ar_tokens, self.spec_tokens)
        )
        decode = sorted(ratio(st * a, s * at) for (a, at), (s, st) in zip(self.ar_decode, self.spec_decode))
        return {
            "speedup": statistics.median(speedups) if speedups else math.nan,
            "speedup_min": speedups[0] if speedups else math.nan,
            "speedup_max": speedups[-1] if speedups else math.nan,
            "decode_speedup": statistics.median(decode) if decode else math.nan,  # the prompt's pass left out
            "decode_speedup_min": decode[0] if decode else math.nan,
            "decode_speedup_max": decode[-1] if decode else math.nan,
            "repeats": len(speedups),
            "tau": ratio(self.tokens, self.rounds),
            "alpha": ratio(self.accepted, self.judged),
            "prompts": self.prompts,
            "tokens": self.tokens,
            "acceptance_by_position": [ratio(a, j) for a, j in self.by_position],
            "accepted_per_round": dict(zip(LENGTH_LABELS, self.lengths)),  # rounds by drafts accepted in them
            "prompt_speedups": [statistics.median(x) for x in self.each],  # each prompt's, the median of repeats
            "prompt_decode_speedups": [statistics.median(x) if x else math.nan for x in self.each_decode],
            "ar_seconds": statistics.median(self.ar_seconds) if self.ar_seconds else math.nan,
            "spec_seconds": statistics.median(self.spec_seconds) if self.spec_seconds else math.nan,
        }


# The acceptance-length histogram's bins: rounds that kept 0, 1, 2-3, 4-7, 8-15, 16-31 or 32+ drafts (a suffix
# drafter's long copies land in the last bins, a K=4 chain's never pass the fourth).
LENGTH_BINS = [0, 1, 2, 4, 8, 16, 32]
LENGTH_LABELS = ["0", "1", "2-3", "4-7", "8-15", "16-31", "32+"]


def length_bin(accepted: int) -> int:
    """The LENGTH_BINS bin of a round that kept `accepted` drafts."""
    return max(i for i, low in enumerate(LENGTH_BINS) if accepted >= low)


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
    prompt's pass out of both (it is the same pass: speculation cannot shorten it, and on a CPU a long prompt's
    pass outweighs a short reply's decoding): plain decoding's time after its first token, which comes with the
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
                first = []  # when plain decoding's first token came: the end of the prompt's pass
                on_token = lambda token, kind: first or first.append(time.perf_counter())  # noqa: E731
                start = time.perf_counter()
                ar = autoregressive_sample(target, prompt, n_tokens, on_token=on_token, **settings)
                ar_seconds = time.perf_counter() - start
                prompt_seconds = first[0] - start if first else 0.0
                for label, draft in drafts.items():
                    spec_seconds, result = _seconds(
                        lambda: speculative_sample(target, draft, prompt, n_tokens, K=K, tree=tree, **settings)
                    )
                    for key in (cat, "all"):
                        tallies[label][key].add(
                            repeat, ar_seconds, len(ar.tokens), spec_seconds, result, prompt_seconds
                        )
    return {label: {cat: t.row() for cat, t in by_cat.items()} for label, by_cat in tallies.items()}


def suite_table(results: dict[str, dict[str, dict]], out: TextIO) -> None:
    """Markdown: one row per category, speedup / decoding alone / tau / alpha for each drafter (a speedup's range
    over repeats in brackets when there were several), then each drafter's acceptance by draft position."""
    labels = list(results)
    cats = list(next(iter(results.values())))
    out.write(
        "| category | " + " | ".join(f"{x} speedup | {x} decoding alone | {x} tau | {x} alpha" for x in labels) + " |\n"
    )
    out.write("|---" * (1 + 4 * len(labels)) + "|\n")
    for cat in cats:
        cells = []
        for label in labels:
            row = results[label][cat]
            speedups = []
            for key in ("speedup", "decode_speedup"):
                cell = f"{row[key]:.2f}x"
                if row.get("repeats", 1) > 1:
                    cell += f" [{row[key + '_min']:.2f}-{row[key + '_max']:.2f}]"
                speedups.append(cell)
            cells += [*speedups, f"{row['tau']:.2f}", _num(row["alpha"])]
        out.write(f"| {cat} | " + " | ".join(cells) + " |\n")
    lengths = {label: results[label]["all"].get("accepted_per_round") for label in labels}
    if all(lengths.values()):
        bins = list(next(iter(lengths.values())))
        out.write("\n| drafts accepted in a round (share of rounds, all prompts) | " + " | ".join(bins) + " |\n")
        out.write("|---" * (1 + len(bins)) + "|\n")
        for label, counts in lengths.items():
            total = sum(counts.values()) or 1
            out.write(f"| {label} | " + " | ".join(f"{100 * counts[b] / total:.0f}%" for b in bins) + " |\n")
    for label in labels:
        for key, what in (("prompt_speedups", "speedup"), ("prompt_decode_speedups", "decoding alone")):
            each = [x for x in results[label]["all"].get(key) or [] if not math.isnan(x)]
            if not each:
                continue
            out.write(
                f"\n{label}: {what} per prompt (each the median of its repeats): median "
                f"{statistics.median(each):.2f}x, {min(each):.2f}x to {max(each):.2f}x over {len(each)} prompts\n"
            )
            kinds = [(cat, [x for x in results[label][cat].get(key) or [] if not math.isnan(x)]) for cat in cats]
            out.write(
                "  by category, the median prompt (lowest-highest): "
                + ", ".join(
                    f"{c} {statistics.median(x):.2f}x ({min(x):.2f}-{max(x):.2f}x)"
                    for c, x in kinds
                    if x and c != "all"
                )
                + "\n"
            )
        by_position = results[label]["all"].get("acceptance_by_position") or []
        if by_position:
            out.write(
                f"\n{label}: acceptance by draft position (all prompts): "
                + ", ".join(f"{i + 1}: {_num(a)}" for i, a in enumerate(by_position))
                + "\n"
            )


def _num(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f}"


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
