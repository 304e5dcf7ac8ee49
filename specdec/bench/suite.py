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

How the alpha table measures alpha. Leviathan et al. (arXiv 2211.17192,
section 3.1) define a position's acceptance as beta = sum_x min(p(x), q(x))
for the target's and draft's distributions p and q there, and alpha = E[beta].
So no speculative run is needed: the target writes a continuation of each
prompt (at the table's temperature), then one forward pass of each model over
prompt + continuation gives p and q at every generated position, and alpha is
the mean of beta over them. At temperature 0, beta is 1 where the two argmaxes
agree and 0 elsewhere. This is exact in expectation and has far less variance
than counting accepted drafts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, TextIO

import numpy as np

from ..cli import flags
from .. import safe_io
from ..autoregressive import autoregressive_sample
from ..drafters import make_drafter
from ..drafters.specs import parse_draft
from ..costmodel import confidence_bar
from ..drafters.stopping import ConfidenceStop, parse_confidence
from ..model.tokenizer import chat_prompt
from ..timing import measure_costs
from ..model.base import CausalLM
from ..model.gpt2 import GPT2, HParams
from ..sampling import SamplingParams, probabilities
from ..speculative import speculative_sample
from .progress import Progress, add_quiet

# The released GPT-2 family, smallest first (distilgpt2 has 6 layers of 124M's width).
GPT2_FAMILY = ("distilgpt2", "124M", "355M", "774M", "1558M")
TEMPERATURES = (0.0, 0.7, 1.0)


def load_prompts(path: str | Path | None = None) -> dict[str, list[str]]:
    """{category: [prompt, ...]} from the committed suite (or a JSON file of the same layout)."""
    if path is None:
        text = resources.files("specdec.bench").joinpath("prompts.json").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text)
    try:
        suite = {name: list(cat["prompts"]) for name, cat in data["categories"].items()}
    except (KeyError, TypeError, AttributeError):
        raise ValueError(
            f"{path or 'prompts.json'}: expected {{'categories': {{name: {{'prompts': [...]}}}}}}"
        ) from None
    if not suite or not all(suite.values()) or not all(isinstance(p, str) and p for ps in suite.values() for p in ps):
        raise ValueError(f"{path or 'prompts.json'}: every category needs at least one non-empty prompt")
    return suite


def encode(model: CausalLM, text: str) -> list[int]:
    if model.tokenizer is None:
        raise ValueError(f"{model.name} has no tokenizer: the suite's prompts are text")
    return model.tokenizer.encode(text, allowed_special="all")


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

    def add(self, repeat: int, ar_seconds: float, ar_tokens: int, spec_seconds: float, result) -> None:
        while len(self.ar_seconds) <= repeat:
            for series in (self.ar_seconds, self.spec_seconds, self.ar_tokens, self.spec_tokens):
                series.append(0)
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
        return {
            "speedup": statistics.median(speedups) if speedups else math.nan,
            "speedup_min": speedups[0] if speedups else math.nan,
            "speedup_max": speedups[-1] if speedups else math.nan,
            "repeats": len(speedups),
            "tau": ratio(self.tokens, self.rounds),
            "alpha": ratio(self.accepted, self.judged),
            "prompts": self.prompts,
            "tokens": self.tokens,
            "acceptance_by_position": [ratio(a, j) for a, j in self.by_position],
            "ar_seconds": statistics.median(self.ar_seconds) if self.ar_seconds else math.nan,
            "spec_seconds": statistics.median(self.spec_seconds) if self.spec_seconds else math.nan,
        }


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
    K: int = 4,
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
    a drafter object). Timing is interleaved: each repeat decodes every prompt once plainly and then once
    per drafter, with the same seed, so a change in the machine's load falls on all of them alike; a
    repeat's speedup is a ratio of token rates summed within a category. chat: each prompt is a user
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
                ar_seconds, ar = _seconds(lambda: autoregressive_sample(target, prompt, n_tokens, **settings))
                for label, draft in drafts.items():
                    spec_seconds, result = _seconds(
                        lambda: speculative_sample(target, draft, prompt, n_tokens, K=K, tree=tree, **settings)
                    )
                    for key in (cat, "all"):
                        tallies[label][key].add(repeat, ar_seconds, len(ar.tokens), spec_seconds, result)
    return {label: {cat: t.row() for cat, t in by_cat.items()} for label, by_cat in tallies.items()}


def suite_table(results: dict[str, dict[str, dict]], out: TextIO) -> None:
    """Markdown: one row per category, speedup / tau / alpha for each drafter (the speedup's range over
    repeats in brackets when there were several), then each drafter's acceptance by draft position."""
    labels = list(results)
    cats = list(next(iter(results.values())))
    out.write("| category | " + " | ".join(f"{x} speedup | {x} tau | {x} alpha" for x in labels) + " |\n")
    out.write("|---" * (1 + 3 * len(labels)) + "|\n")
    for cat in cats:
        cells = []
        for label in labels:
            row = results[label][cat]
            speedup = f"{row['speedup']:.2f}x"
            if row.get("repeats", 1) > 1:
                speedup += f" [{row['speedup_min']:.2f}-{row['speedup_max']:.2f}]"
            cells += [speedup, f"{row['tau']:.2f}", _num(row["alpha"])]
        out.write(f"| {cat} | " + " | ".join(cells) + " |\n")
    for label in labels:
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
# The alpha table of the GPT-2 family.
# ---------------------------------------------------------------------------


def beta(p_logits: np.ndarray, q_logits: np.ndarray, temperature: float) -> np.ndarray:
    """[n, n_vocab] target and draft logits -> [n] acceptance beta = sum_x min(p(x), q(x)) per row.

    At temperature 0 both distributions are point masses on their argmax, so
    beta is 1 where the argmaxes agree and 0 where they differ.
    """
    if temperature == 0:
        return (p_logits.argmax(axis=-1) == q_logits.argmax(axis=-1)).astype(np.float64)
    params = SamplingParams(temperature)
    p, q = probabilities(p_logits, params), probabilities(q_logits, params)
    return np.minimum(p, q).sum(axis=-1, dtype=np.float64)


@dataclass
class TargetRows:
    """The target's side of the alpha table, for one temperature: each prompt's
    text (prompt + the target's continuation) and the target's logits at the
    positions that predicted the continuation."""

    texts: list[list[int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # row r of prompt j's logits predicts texts[j][starts[j] + r + 1]
    logits: list[np.ndarray] = field(default_factory=list)  # [n_tokens, n_vocab] each


def target_rows(target: CausalLM, prompts: list[list[int]], n_tokens: int, temperature: float, seed: int) -> TargetRows:
    rows = TargetRows()
    for j, prompt in enumerate(prompts):
        new = autoregressive_sample(target, prompt, n_tokens, temperature=temperature, seed=seed + j).tokens
        text = prompt + new
        start = len(prompt) - 1  # the row of the prompt's last token predicts the first new token
        rows.texts.append(text)
        rows.starts.append(start)
        rows.logits.append(target(text[:-1])[start:])  # [n_tokens, n_vocab]
    return rows


def pair_alpha(draft: CausalLM, rows: TargetRows, temperature: float) -> float:
    """Mean beta over every generated position of every prompt."""
    betas = [
        beta(p, draft(text[:-1])[start:], temperature) for text, start, p in zip(rows.texts, rows.starts, rows.logits)
    ]
    return float(np.concatenate(betas).mean())


def n_params(h: HParams) -> int:
    """Parameters of a GPT-2 of these shapes (blocks: 12 n_embd^2 each; embeddings), to order models by size."""
    return h.n_layer * 12 * h.n_embd**2 + (h.n_vocab + h.n_ctx) * h.n_embd


def alpha_table(
    load: Callable[[str], GPT2],
    names: list[str],
    prompts: dict[str, list[str]],
    temperatures=TEMPERATURES,
    n_tokens: int = 32,
    seed: int = 0,
    say: Callable[[str], None] = lambda line: None,
) -> list[dict]:
    """[{"draft", "target", "alpha": {T: alpha}}] for every pair of `names`
    (smallest first), the smaller model drafting for the larger. Models are
    loaded by `load(name)` one target at a time (plus one draft), so memory
    holds two models at most."""
    table = []
    for t_index, target_name in enumerate(names[1:], start=1):
        target = load(target_name)
        texts = [encode(target, p) for ps in prompts.values() for p in ps]
        rows = {}
        for T in temperatures:
            say(f"  {target_name}: writing {len(texts)} continuations of {n_tokens} tokens at T={T}")
            rows[T] = target_rows(target, texts, n_tokens, T, seed)
        for draft_name in names[:t_index]:
            draft = load(draft_name)
            if draft.n_vocab != target.n_vocab:
                raise ValueError(f"{draft_name} and {target_name} have different vocabularies")
            say(f"  {draft_name} -> {target_name}")
            table.append(
                {
                    "draft": draft_name,
                    "target": target_name,
                    "alpha": {T: pair_alpha(draft, rows[T], T) for T in temperatures},
                }
            )
            del draft
        del target
    return table


def alpha_markdown(table: list[dict], out: TextIO) -> None:
    temperatures = list(table[0]["alpha"]) if table else list(TEMPERATURES)
    out.write("| draft -> target | " + " | ".join(f"T = {T:g}" for T in temperatures) + " |\n")
    out.write("|---" * (1 + len(temperatures)) + "|\n")
    for row in table:
        cells = [f"{row['alpha'][T]:.3f}" for T in temperatures]
        out.write(f"| {row['draft']} -> {row['target']} | " + " | ".join(cells) + " |\n")


def model_hparams(name: str, models_dir: str | Path | None) -> HParams:
    """A model's shapes from its config.json, without loading the weights."""
    from ..checkpoints.gpt2_folder import read_hparams
    from ..checkpoints.hub import resolve_model

    return read_hparams(resolve_model(name, models_dir)[0] / "config.json")


def present_models(models_dir: str | Path | None, names=GPT2_FAMILY) -> list[str]:
    """The names among `names` whose checkpoint files are all in models_dir (no download)."""
    from ..checkpoints.folders import CHECKPOINT_FILES
    from ..checkpoints.hub import resolve_model

    present = []
    for name in names:
        folder, _ = resolve_model(name, models_dir)
        if all((folder / f).is_file() for f in CHECKPOINT_FILES):
            present.append(name)
    return present


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
        "'early_exit:L', 'eagle', 'ngram+eagle' (lookup first); NAME@P cuts NAME's chains by a "
        "draft confidence bar P "
        "(speculative_sample's draft_confidence: a number in (0, 1] or auto), e.g. eagle,eagle@auto "
        "(default: %(default)s)",
    )
    p.add_argument("--prompts", help="a JSON prompt suite in prompts.json's layout (default: the committed one)")
    p.add_argument("--categories", help="comma-separated categories to run (default: all)")
    p.add_argument("--n-tokens", type=int, help="new tokens per prompt (default 48; 32 for --alpha-table)")
    p.add_argument("--K", type=int, default=4, help="suite: draft tokens per round (default: %(default)s)")
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
    if args.n_tokens < 1 or args.K < 1 or args.repeats < 1:
        p.error("--n-tokens, --K and --repeats must be at least 1")
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
                f"suite: target {args.target}, drafters {', '.join(drafts)}, K={args.K}, T={args.temperature}, "
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
