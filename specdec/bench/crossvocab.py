"""Drafts across tokenizers: what the vocabularies share, and whether a cross-vocabulary draft pays.

    python -m specdec.bench --only cross-vocab                                 # SmolLM2-135M, stdlib-2L draft
    python -m specdec.bench --only cross-vocab --gpt2-tokenizer DIR            # GPT-2's vocabulary too
    python -m specdec.bench --only cross-vocab --no-race                       # the vocabulary tables only

Three tables (docs/cross-vocab.md):
    shared  tokens each pair of vocabularies shares (the same bytes; control tokens by name):
            SmolLM2-135M, the stdlib family and, given its folder, GPT-2
    mass    along real text (a held-out Python file and prose), the mean share of each model's
            next-token probability (T=1) on the tokens it shares with the other. For TLI the
            target's share bounds acceptance: q is 0 outside the shared tokens, so
            alpha = sum_y min(p(y), q(y)) <= p(shared)
    race    SmolLM2-135M drafted for by stdlib-2L (cross_vocab tli / slem) beside prompt lookup
            (ngram), at T=0 and T=1, on two code prompts and a prose prompt of the suite: accepted
            target tokens per round, alpha, c, and the wall-clock speedup of race()
A script that prints numbers, not a test.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np

from .. import flags
from ..checkpoints import family
from ..checkpoints.load import load_model
from ..drafters.crossvocab import vocab_map
from ..model.tokenizer import load_tokenizer
from ..race import race
from ..sampling import SamplingParams, probabilities
from .suite import load_prompts

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


def main(argv=None) -> dict:
    p = flags.Parser(prog="python -m specdec.bench --only cross-vocab", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m", help="the target (default %(default)s)")
    p.add_argument("--draft", default="stdlib-2L", help="the draft model with another tokenizer (default %(default)s)")
    p.add_argument("--gpt2-tokenizer", "--gpt2_tokenizer", default=None,
                   help="a folder with GPT-2's vocab.json and merges.txt, for the shared-token table")  # fmt: skip
    p.add_argument("--n-tokens", "--n_tokens", type=int, default=40, help="new tokens per run (default %(default)s)")
    p.add_argument("--repeats", type=int, default=1, help="timed repeats per run (default %(default)s)")
    p.add_argument("--no-race", "--no_race", action="store_true", help="only the vocabulary tables")
    args = p.parse_args(argv)
    target, draft = load_model(args.target), load_model(args.draft)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"target {target!r}, draft {draft!r}; load average {load:.2f} at the start")

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

    source, code = held_out_source()
    prose = "\n\n".join(load_prompts()["continuation"])
    print(f"\nprobability mass on the shared tokens (T=1, mean over the first {N_MASS} positions of each text)")
    print(f"| model | code ({source}) | prose (the suite's continuation prompts) |\n|---|---|---|")
    mass = {}
    for name, model, other in ((args.target, target, draft), (args.draft, draft, target)):
        mass[name] = [shared_mass(model, other.tokenizer, other.n_vocab, text) for text in (code, prose)]
        print(f"| {name} | {mass[name][0]:.3f} | {mass[name][1]:.3f} |")

    rows = []
    if not args.no_race:
        suite = load_prompts()
        prompts = {"code: softmax": suite["code"][0], "code: Stack": suite["code"][1],
                   "prose: Turing": suite["continuation"][0]}  # fmt: skip
        runs = [(0.0, "tli"), (0.0, "slem"), (0.0, "ngram"), (1.0, "tli"), (1.0, "ngram")]
        print(f"\n{args.target} with {args.draft} (cross_vocab) beside prompt lookup; K=4, {args.n_tokens} new "
              f"tokens, seed 0, {args.repeats} timed repeat(s)")  # fmt: skip
        print("| prompt | T | drafter | accepted per round | alpha | c | speedup (spread) |")
        print("|---|---|---|---|---|---|---|")
        for label, prompt in prompts.items():
            for temperature, rule in runs:
                drafter, cross = ("ngram", None) if rule == "ngram" else (draft, rule)
                report = race(target, drafter, prompt, args.n_tokens, K=4, temperature=temperature, seed=0,
                              repeats=args.repeats, cross_vocab=cross)  # fmt: skip
                result = report.spec.result
                lo, hi = report.spread
                row = dict(prompt=label, temperature=temperature, drafter=rule, accepted=result.tau - 1,
                           alpha=result.alpha, c=report.costs.c, speedup=report.speedup, spread=(lo, hi))  # fmt: skip
                rows.append(row)
                name = "ngram" if rule == "ngram" else f"{args.draft} {rule}"
                print(f"| {label} | {temperature:g} | {name} | {row['accepted']:.2f} | {row['alpha']:.2f} | "
                      f"{row['c']:.3f} | {row['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) |", flush=True)  # fmt: skip
    end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nload average {end:.2f} at the end")
    return {"shared": shared, "mass": mass, "race": rows, "load": (load, end)}
