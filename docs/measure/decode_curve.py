"""r(m) as suffix decoding's real rounds pay it, beside the curve timed to price them.

    PYTHONPATH=. python docs/measure/decode_curve.py [--draft suffix] [--repeats 2]

The timed curve (timing.costs_for: interleaved passes on a fixed context) is what the drafter sizes its rounds
by. Here every chat request (specdec/bench/chat_tasks.json, greedy, up to 128 tokens) is decoded plainly and then
speculatively, and each verification pass of the speculative run is timed and divided by the median 1-token step
of the plain run of the same request: the r(m) the rounds actually paid, by width m, with how many passes had it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from specdec import autoregressive_sample, load_model, speculative_sample
from specdec.timing import costs_for

TASKS = os.path.join(os.path.dirname(__file__), "..", "..", "specdec", "bench", "chat_tasks.json")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="suffix")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    target = load_model(args.target)
    with open(TASKS) as f:
        categories = json.load(f)["categories"]
    forward, passes = target.forward, []

    def timed(tokens, cache, **kw):
        start = time.perf_counter()
        out = forward(tokens, cache, **kw)
        passes.append((len(tokens), time.perf_counter() - start))
        return out

    speculative_sample(target, args.draft, "hi", 4, chat=True)  # times the costs, once
    r = costs_for(target, args.draft, None, [], 1).r  # what that call timed (1: never a wider pass)
    print("timed r(1..9):", [round(x, 2) for x in r[:9]], "r(17)", round(r[16], 2), "r(33)", round(r[32], 2))
    target.forward = timed
    ratios = collections.defaultdict(list)
    for _ in range(args.repeats):
        for entry in categories.values():
            for prompt in entry["prompts"]:
                passes.clear()
                autoregressive_sample(target, prompt, 128, chat=True)
                step = np.median([t for _, t in passes[1:]])  # the prompt's pass left out
                passes.clear()
                speculative_sample(target, args.draft, prompt, 128, chat=True)
                for m, t in passes[1:]:
                    ratios[m].append(t / step)
    print("paid r(m): (median ratio to the same request's plain step, passes)")
    print({m: (round(float(np.median(v)), 2), len(v)) for m, v in sorted(ratios.items())})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
