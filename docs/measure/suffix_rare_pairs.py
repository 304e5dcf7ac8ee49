"""How often a match in the request's own text is right, by how common its last two tokens are in the datastore.

    PYTHONPATH=. python docs/measure/suffix_rare_pairs.py [--tasks FILE]

Every chat request (specdec/bench/chat_tasks.json, or --tasks) is decoded greedily (up to 128 tokens); then, at every
position of each reply, the text so far is looked up as the suffix drafter looks it up (its longest earlier
match, m tokens) and the likeliest continuation is checked against the reply: right or not, and how many of its
tokens in a row were. Places are counted by the match's length (2-3, 4-7, 8+ tokens) and by how often the text's
last two tokens occur together in the shipped datastore (SmolLM2's own replies): never, 1-9, 10-99, 100+ times.
This is what the drafter's prior for a match of a rare pair (drafters/suffix.py, RARE_PRIOR_OFFSET) rests on.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import specdec
from specdec.drafters import suffix_drafter
from specdec.drafters.suffix import SuffixDrafter, grow_candidates
from specdec.drafters.suffix_index import MAX_MATCH
from specdec.model.tokenizer import chat_prompt

TASKS = os.path.join(os.path.dirname(__file__), "..", "..", "specdec", "bench", "chat_tasks.json")


def length_bucket(m: int) -> str:
    return "2-3" if m < 4 else "4-7" if m < 8 else "8+"


def count_bucket(n: int) -> str:
    return "never" if n == 0 else "1-9" if n < 10 else "10-99" if n < 100 else "100+"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--tasks", default=TASKS, help="the chat requests (default: the bench's chat tasks)")
    args = ap.parse_args(argv)
    target = specdec.load_model(args.target)
    store = suffix_drafter("", target).datastore
    with open(args.tasks) as f:
        categories = json.load(f)["categories"]
    places = collections.defaultdict(lambda: [0, 0, 0])  # (kind, length, count) -> [places, right, run total]
    for kind, entry in categories.items():
        kind = "free" if kind == "free" else "copy"
        for prompt in entry["prompts"]:
            out = specdec.autoregressive_sample(target, prompt, 128, chat=True)
            start = chat_prompt(target.tokenizer, prompt)
            ids = start + out.tokens
            drafter = SuffixDrafter(target.n_vocab)  # the text alone: where its matches come from
            drafter.begin(None, None, start)
            for t in range(len(start), len(ids) - 1):
                drafter.commit(ids[:t], None)
                tail = ids[max(0, t - MAX_MATCH) : t]
                m, rows = drafter.lookup("text", tail, 32)
                if not m:
                    continue
                trie = grow_candidates(rows, m, lambda L, f: f, 32, chain=True)
                path = [trie.tokens[i] for i in trie.top_path()]
                run = 0
                while run < len(path) and t + run < len(ids) and ids[t + run] == path[run]:
                    run += 1
                for key in (
                    (kind, length_bucket(m), count_bucket(store.count(tail[-2:]))),
                    (kind, length_bucket(m), "all"),
                ):
                    places[key][0] += 1
                    places[key][1] += run > 0
                    places[key][2] += run
    print(f"{args.target}, greedy replies of up to 128 tokens; a match in the request's own text, its likeliest path")
    print("| requests | match | pair in the datastore | places | first token right | tokens right in a row (mean) |")
    print("|---|---|---|---|---|---|")
    for (kind, length, count), (n, right, run) in sorted(places.items()):
        print(f"| {kind} | {length} | {count} | {n} | {right / n:.0%} | {run / n:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
