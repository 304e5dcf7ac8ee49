"""K="auto" against the fixed K it chooses, on the same requests, in one process: what timing the costs once costs.

    PYTHONPATH=. python docs/measure/k_auto.py [--target smollm2-135m] [--draft ngram] [--tokens 64] [--repeats 3]

Step 1 times the first K="auto" call of the process (which times the target's passes and a draft step, once:
timing.costs_for) against the same call made again (which reuses them). Step 2 runs, for each chat request,
K="auto" and the fixed K it picked most often in its rounds, and K=4, interleaved (A B C, then C B A, ...), and
prints each request's median seconds and the ratio auto / fixed with its spread over the repeats. Greedy, so
every run of a request makes the same tokens. The machine's load is printed beside the figures.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import specdec
from specdec import speculative_sample
from specdec.timing import _TIMED

REQUESTS = [
    "Fix the spelling in this sentence: 'Teh quick brown fox jumpd over the lazy dgo.'",
    "Rewrite this list in alphabetical order: pear, apple, fig, banana, cherry.",
    "Write a short note asking my neighbour to water the plants while I am away.",
    "Explain in two sentences why the sky is blue.",
    "Repeat this sentence twice: The meeting is moved to Thursday at ten.",
    "Give three tips for learning to play the guitar.",
]


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="ngram")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    target = specdec.load_model(a.target, progress=False)
    settings = dict(chat=True, temperature=0.0)
    print(f"{a.target} with {a.draft}, {a.tokens} tokens, greedy; load {load()}", flush=True)

    # Step 1: the first call times the costs; the second reuses them.
    _TIMED.clear()
    first = []
    for _ in range(2):
        start = time.perf_counter()
        speculative_sample(target, a.draft, REQUESTS[0], a.tokens, K="auto", **settings)
        first.append(time.perf_counter() - start)
    print(
        f"first K='auto' call {first[0]:.2f} s, the same call again {first[1]:.2f} s: "
        f"timing the costs took about {first[0] - first[1]:.2f} s, once per process",
        flush=True,
    )

    # Step 2: auto against the K it chose, and K=4, interleaved per request.
    print(f"{'request':<44} {'k chosen':>8} {'auto s':>7} {'fixed s':>7} {'K=4 s':>7} {'auto/fixed':>18}")
    ratios = []
    for text in REQUESTS:
        out = speculative_sample(target, a.draft, text, a.tokens, K="auto", **settings)
        chosen = collections.Counter(k for k in out.k_per_round if k > 0).most_common(1)
        k = chosen[0][0] if chosen else 1
        runs = {"auto": "auto", "fixed": k, "4": 4}
        times = {name: [] for name in runs}
        for repeat in range(a.repeats):
            for name in list(runs) if repeat % 2 == 0 else list(runs)[::-1]:
                start = time.perf_counter()
                speculative_sample(target, a.draft, text, a.tokens, K=runs[name], **settings)
                times[name].append(time.perf_counter() - start)
        per_repeat = [x / y for x, y in zip(times["auto"], times["fixed"])]
        ratios.extend(per_repeat)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        print(
            f"{text[:44]:<44} {k:>8} {med['auto']:7.2f} {med['fixed']:7.2f} {med['4']:7.2f} "
            f"{med['auto'] / med['fixed']:6.2f} [{min(per_repeat):.2f}-{max(per_repeat):.2f}]",
            flush=True,
        )
    print(
        f"all requests: auto / fixed median {statistics.median(ratios):.2f} "
        f"[{min(ratios):.2f}-{max(ratios):.2f}] over {len(ratios)} repeats; load {load()}"
    )


if __name__ == "__main__":
    sys.exit(main())
