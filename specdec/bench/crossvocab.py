"""Drafts across tokenizers: what the vocabularies share, and whether a cross-vocabulary draft pays.

    python -m specdec.bench --only cross-vocab                                 # SmolLM2-135M, stdlib-2L and -6L drafts
    python -m specdec.bench --only cross-vocab --gpt2-tokenizer DIR            # GPT-2's vocabulary too
    python -m specdec.bench --only cross-vocab --no-race                       # the vocabulary tables only

Three tables (docs/cross-vocab.md):
    shared  tokens each pair of vocabularies shares (the same bytes; control tokens by name):
            SmolLM2-135M, the stdlib family and, given its folder, GPT-2
    mass    along real text (a held-out Python file and prose), the mean share of each model's
            next-token probability (T=1) on the tokens it shares with the other. For TLI the
            target's share bounds acceptance: q is 0 outside the shared tokens, so
            alpha = sum_y min(p(y), q(y)) <= p(shared)
    race    SmolLM2-135M drafted for by stdlib-2L and stdlib-6L (cross_vocab tli / slem / slrs)
            beside prompt lookup (ngram), at T=0 and T=1, on two code prompts and a prose prompt of
            the suite: accepted target tokens per round, alpha, c, and the wall-clock speedup of
            race() (the median of its interleaved repeats, with their spread). A rule that refuses
            a setting (SLEM and, for these vocabularies, SLRS at T=1) gets a row that says why
A script that prints numbers, not a test.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np

from ..cli import flags
from ..checkpoints import family
from ..checkpoints.load import load_model
from ..drafters.crossvocab import SLRS_MAX_PASSES
from ..drafters.vocabmap import tokenization_tree_size, vocab_map
from ..model.tokenizer import load_tokenizer
from ..race import race
from ..sampling import SamplingParams, probabilities
from .prompts import load_prompts

N_MASS = 200  # tokens of text per model for the mass table (the stdlib models read 256 at most)


def held_out_source(n_chars: int = 4000) -> tuple[str, str]:
    """(name, text): the start of the first held-out file (family.is_held_out) of this Python's stdlib."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if family.is_held_out(rel) and "test" not in rel and path.stat().st_size > n_chars:
            return rel, path.read_text(encoding="utf-8", errors="replace")[:n_chars]
    raise ValueError(f"no held-out stdlib file under {root}")


def shared_mass(model, other_tokenizer, other_n_vocab: int, text: str) -> float:
    """Mean over positions of the model's next-token probability (T=1) on tokens the other vocabulary has."""
    m = vocab_map(model.tokenizer, other_tokenizer, model.n_vocab, other_n_vocab)
    shared = np.zeros(model.n_vocab, bool)
    shared[m.draft_ids] = True  # the map is built with `model` in the draft's place
    ids = model.tokenizer.encode_ordinary(text)[:N_MASS]
    p = probabilities(model(ids), SamplingParams(1.0))  # [n, n_vocab]
    return float(p[:, shared].sum(axis=1).mean())


def race_row(target, draft, rule, label: str, prompt: str, temperature: float, args) -> dict:
    """One race (a table row), or why the rule refuses the setting."""
    row = dict(prompt=label, temperature=temperature, drafter=getattr(draft, "name", draft), rule=rule)
    try:
        report = race(
            target,
            draft,
            prompt,
            args.n_tokens,
            K=4,
            temperature=temperature,
            seed=0,
            repeats=args.repeats,
            cross_vocab=rule,
        )
    except ValueError as e:  # SLEM sampling; SLRS sampling where its tree is too large
        row["refused"] = str(e)
        return row
    result = report.spec.result
    return dict(
        row, accepted=result.tau - 1, alpha=result.alpha, c=report.costs.c, speedup=report.speedup, spread=report.spread
    )


def main(argv=None) -> dict:
    p = flags.Parser(prog="python -m specdec.bench --only cross-vocab", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m", help="the target (default %(default)s)")
    p.add_argument(
        "--drafts",
        "--draft",
        default="stdlib-2L,stdlib-6L",
        help="draft models with another tokenizer, comma-separated (default %(default)s)",
    )
    p.add_argument(
        "--gpt2-tokenizer",
        "--gpt2_tokenizer",
        default=None,
        help="a folder with GPT-2's vocab.json and merges.txt, for the shared-token table",
    )
    p.add_argument("--n-tokens", "--n_tokens", type=int, default=32, help="new tokens per run (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per run, interleaved (default %(default)s)")
    p.add_argument("--no-race", "--no_race", action="store_true", help="only the vocabulary tables")
    args = p.parse_args(argv)
    target, drafts = load_model(args.target), {name: load_model(name) for name in args.drafts.split(",")}
    draft = next(iter(drafts.values()))  # the family shares one tokenizer
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"target {target!r}, drafts {list(drafts)}; load average {load:.2f} at the start")

    vocabs = {args.target: (target.tokenizer, target.n_vocab), "stdlib family": (draft.tokenizer, draft.n_vocab)}
    if args.gpt2_tokenizer:
        folder = Path(args.gpt2_tokenizer)
        vocabs["GPT-2"] = (load_tokenizer(folder / "vocab.json", folder / "merges.txt"), 50257)
    print("\n| vocabulary A | size | vocabulary B | size | shared tokens |\n|---|---|---|---|---|")
    shared = {}
    names = list(vocabs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            n = len(vocab_map(*vocabs[a][:1], *vocabs[b][:1], vocabs[a][1], vocabs[b][1]).draft_ids)
            shared[f"{a} & {b}"] = n
            print(f"| {a} | {vocabs[a][1]:,} | {b} | {vocabs[b][1]:,} | {n:,} |")
    tree = tokenization_tree_size(draft.tokenizer, target.tokenizer, draft.n_vocab, target.n_vocab, 10**12)
    print(
        f"\nSLRS's tree for {args.target} drafted for by the stdlib family: "
        f"{'more than ' if tree > 10**12 else ''}{tree:.3g} draft passes per drafted token at T > 0 "
        f"(refused above {SLRS_MAX_PASSES:,})"
    )

    source, code = held_out_source()
    prose = "\n\n".join(load_prompts()["continuation"])
    print(f"\nprobability mass on the shared tokens (T=1, mean over the first {N_MASS} positions of each text)")
    print(f"| model | code ({source}) | prose (the suite's continuation prompts) |\n|---|---|---|")
    mass = {}
    for name, model, other in ((args.target, target, draft), *((n, d, target) for n, d in drafts.items())):
        mass[name] = [shared_mass(model, other.tokenizer, other.n_vocab, text) for text in (code, prose)]
        print(f"| {name} | {mass[name][0]:.3f} | {mass[name][1]:.3f} |")

    rows = []
    if not args.no_race:
        suite = load_prompts()
        prompts = {
            "code: softmax": suite["code"][0],
            "code: Stack": suite["code"][1],
            "prose: Turing": suite["continuation"][0],
        }
        runs = [("ngram", None)] + [(name, rule) for name in drafts for rule in ("tli", "slem", "slrs")]
        print(
            f"\n{args.target} with {', '.join(drafts)} (cross_vocab) beside prompt lookup; K=4, {args.n_tokens} "
            f"new tokens, seed 0, {args.repeats} interleaved timed repeat(s)"
        )
        print("| prompt | T | drafter | accepted per round | alpha | c | speedup (spread) |")
        print("|---|---|---|---|---|---|---|")
        for label, prompt in prompts.items():
            for temperature in (0.0, 1.0):
                for name, rule in runs:
                    rows.append(race_row(target, drafts.get(name, name), rule, label, prompt, temperature, args))
                    row = rows[-1]
                    what = "ngram" if rule is None else f"{name} {rule}"
                    if "refused" in row:
                        print(f"| {label} | {temperature:g} | {what} | refused: {row['refused']} ||||", flush=True)
                        continue
                    lo, hi = row["spread"]
                    print(
                        f"| {label} | {temperature:g} | {what} | {row['accepted']:.2f} | {row['alpha']:.2f} | "
                        f"{row['c']:.3f} | {row['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) |",
                        flush=True,
                    )
    end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nload average {end:.2f} at the end")
    return {"shared": shared, "mass": mass, "race": rows, "load": (load, end)}
