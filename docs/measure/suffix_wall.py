"""Suffix decoding's settings against plain decoding and each other by the clock, interleaved request by request.

    PYTHONPATH=. python docs/measure/suffix_wall.py --variant before --variant kept [--repeats 2] [--tasks FILE]

The settings are suffix_priced.py's variants. Greedy, up to 128 tokens a reply; the drafters size their rounds on
the curve timed once for this process (timing.costs_for), and each setting keeps its own index of earlier outputs.
Each repeat decodes every request plainly and with every setting, in an order that turns around between repeats
(plain A B, B A plain, ...), so a slow spell of the machine hits them alike. A request's speedup: plain decoding's
time over the setting's, whole calls (the prompt's pass included), the median over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

import specdec
from specdec.drafters import suffix
from specdec.drafters.suffix_index import SuffixIndex
from specdec.timing import costs_for
from suffix_priced import TASKS, variant_drafter, with_prior


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--tasks", default=TASKS, help="the chat requests (default: the bench's chat tasks)")
    ap.add_argument("--variant", action="append", help="a setting of suffix_priced.py; repeat to compare")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    variants = args.variant or ["kept"]
    target = specdec.load_model(args.target)
    with open(args.tasks) as f:
        categories = json.load(f)["categories"]
    requests = [(kind, i, p) for kind, entry in categories.items() for i, p in enumerate(entry["prompts"])]
    specdec.speculative_sample(target, "suffix", "hi", 4, chat=True)  # times the costs, once
    curve = costs_for(target, "suffix", None, [], 1).r  # what that call timed (1: never a wider pass)
    print(f"{args.target}, greedy, up to 128 tokens; timed r(2..5) = {[round(x, 2) for x in curve[1:5]]}")
    suffix.Calibration.rate = with_prior(lambda cal: getattr(cal, "table", None))
    states = {v: {"earlier": SuffixIndex(suffix.EARLIER_CAPACITY)} for v in variants}
    seconds: dict = {}  # (kind, i) -> {name: [seconds, one per repeat]}

    def run(name: str, prompt: str) -> float:
        start = time.perf_counter()
        if name == "plain":
            specdec.autoregressive_sample(target, prompt, 128, chat=True)
        else:
            drafter = variant_drafter(target, curve, name, states[name])
            drafter.earlier = states[name]["earlier"]
            specdec.speculative_sample(target, drafter, prompt, 128, chat=True)
        return time.perf_counter() - start

    for repeat in range(args.repeats):
        order = ["plain", *variants]
        for kind, i, prompt in requests:
            for name in order if repeat % 2 == 0 else order[::-1]:
                seconds.setdefault((kind, i), {}).setdefault(name, []).append(run(name, prompt))
            print(
                f"repeat {repeat} {kind} {i}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in seconds[kind, i].items())
            )
    print()
    for name in variants:
        speedup = {key: statistics.median(a / b for a, b in zip(t["plain"], t[name])) for key, t in seconds.items()}
        copy = [x for (kind, _), x in speedup.items() if kind != "free"]
        free = [x for (kind, _), x in speedup.items() if kind == "free"]
        print(
            f"{name}: copy median {statistics.median(copy):.3f}x (mean {statistics.mean(copy):.3f}x, "
            f"{min(copy):.2f}-{max(copy):.2f}x); free median {statistics.median(free):.3f}x, each "
            + ", ".join(f"{x:.2f}x" for x in free)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
