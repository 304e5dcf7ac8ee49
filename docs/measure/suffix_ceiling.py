"""The most any drafter that copies from the text could gain on the chat tasks: an oracle's speedup, in steps.

    PYTHONPATH=. python docs/measure/suffix_ceiling.py [--temperature 1] [--seeds 3] [--tokens 128]

For each chat request the target writes its reply (plain decoding; at temperature > 0 one reply per seed). The
oracle then replays the reply round by round. At each round it looks at every earlier place in the text (prompt
and reply so far) whose two tokens before it match the text's last two (the suffix drafter's shortest match),
and drafts exactly the tokens that place's continuation shares with what the target writes next (a copy may run
on into the tokens it is drafting, as suffix_index.copied_on's does, and stops at 32, the most a round drafts):
all of them are accepted, and it drafts nothing where no place agrees on the next token. No real drafter knows
that, so its speedup is a ceiling for drafting from the request's own text by matches of 2 or more tokens (suffix
decoding without its other sources, prompt lookup of 2-token or longer n-grams); earlier outputs, a datastore or
a model head can add more. A round that accepts a tokens costs r(a + 1) target steps (r: SmolLM2's curve
measured on 2 cores, costmodel.SMOLLM2_CPU_R, and the paper's r = 1 beside it); the prompt's pass is left out,
so these are decoding-only figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import specdec
from specdec.costmodel import SMOLLM2_CPU_R, curve_values
from specdec.model.tokenizer import chat_prompt

TASKS = os.path.join(os.path.dirname(__file__), "..", "..", "specdec", "bench", "chat_tasks.json")
MATCH = 2  # tokens of context a copy needs (the suffix drafter's MIN_MATCH)


def oracle_rounds(ids: list[int], start: int) -> list[int]:
    """Accepted drafts per round when ids[start:] is decoded by a drafter that copies the best earlier place.

    >>> oracle_rounds([1, 2, 3, 4, 1, 2, 3, 4, 5], 6)  # [1, 2] came before, then 3, 4: both drafted, 5 the target's
    [2]
    >>> oracle_rounds([1, 2, 3, 4, 1, 2, 3, 9, 5], 5)  # [4, 1] is new; then 3 copied (the copy says 4, the text 9)
    [0, 1, 0]
    """
    rounds, t = [], start
    while t < len(ids):
        best = 0
        for e in range(MATCH, t):  # an earlier place e: ids[e - MATCH:e] == ids[t - MATCH:t], continuation ids[e:]
            if ids[e - MATCH : e] != ids[t - MATCH : t]:
                continue
            a = 0
            while t + a < len(ids) - 1 and ids[e + a] == ids[t + a]:
                a += 1
            best = max(best, a)
        best = min(best, len(ids) - 1 - t, 32)  # the round's own token comes after the drafts
        rounds.append(best)
        t += best + 1
    return rounds


def steps(rounds: list[int], r) -> float:
    values = curve_values(r, 34)
    return sum(values[a] for a in rounds)  # r(a + 1) is values[a]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seeds", type=int, default=1, help="replies per request (at temperature > 0)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--tasks", default=TASKS, help="the chat requests (default: the bench's chat tasks)")
    args = ap.parse_args(argv)
    target = specdec.load_model(args.target)
    with open(args.tasks) as f:
        categories = json.load(f)["categories"]
    flat = [1.0] * 34
    print(f"oracle ceiling, {args.target}, temperature {args.temperature}, up to {args.tokens} tokens per reply")
    print("| kind | request | tokens | rounds | speedup at SmolLM2's r(m) | at r = 1 |")
    print("|---|---|---|---|---|---|")
    by_kind: dict[str, list[float]] = {}
    for kind, entry in categories.items():
        for i, prompt in enumerate(entry["prompts"]):
            for seed in range(args.seeds if args.temperature > 0 else 1):
                out = specdec.autoregressive_sample(
                    target, prompt, args.tokens, temperature=args.temperature, seed=seed, chat=True
                )
                ids = chat_prompt(target.tokenizer, prompt) + out.tokens
                rounds = oracle_rounds(ids, len(ids) - len(out.tokens))
                n = len(out.tokens)
                speedup, ideal = n / steps(rounds, SMOLLM2_CPU_R), n / steps(rounds, flat)
                by_kind.setdefault(kind, []).append(speedup)
                print(
                    f"| {kind} | {i} (seed {seed}) | {n} | {len(rounds)} | {speedup:.2f}x | {ideal:.2f}x |", flush=True
                )
    print()
    copy = [x for kind, xs in by_kind.items() if kind != "free" for x in xs]
    for kind, xs in [*by_kind.items(), ("all copy kinds", copy)]:
        print(f"{kind}: median {statistics.median(xs):.2f}x, {min(xs):.2f}x to {max(xs):.2f}x over {len(xs)} replies")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
