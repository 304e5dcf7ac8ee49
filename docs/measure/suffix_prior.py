"""How often a copied token is right, by the length of the match before it: a(L) measured on a model's replies.

    PYTHONPATH=. python docs/measure/suffix_prior.py --data DIR [--model smollm2-135m]

DIR is a folder made by `python -m specdec.train data` (chat prompts and the target's greedy replies). Each reply
is replayed one token a round through a suffix drafter that reads the request's own text (prompt and reply so
far): every round its likeliest path is scored against the tokens that follow, exactly as a run scores it
(SuffixDrafter.commit), with nothing decayed and no prior. Printed per bucket of L (the matched context before a
candidate: 1, 2-3, 4-7, .., 64+): the scored candidates, their summed share f, how many were right, and a(L) =
right / summed f, against which Calibration's prior a0(L) = L / (L + 2) can be read. No model runs: the
replies are in the folder.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from specdec.drafters.suffix import Calibration, SuffixDrafter
from specdec.sampling import SamplingParams
from specdec.train.shards import load_distill_data


def measure_rates(prompts, replies, n_vocab: int) -> Calibration:
    """A Calibration holding plain counts (no decay, a vanishing prior) over every reply, replayed."""
    drafter = SuffixDrafter(n_vocab)
    counts = Calibration(prior_weight=1e-9, decay=1.0)
    drafter.calibration["text"] = counts
    greedy = SamplingParams(0.0)
    for prompt, reply in zip(prompts, replies):
        ids = [int(t) for t in prompt] + [int(t) for t in reply]
        drafter.begin(None, None, ids[: len(prompt)])
        drafter.commit(ids[: len(prompt)], None)
        for t in range(len(prompt), len(ids)):
            drafter.propose(ids[:t], 32, greedy, None)
            drafter.commit(ids[: t + 1], None)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a folder made by `python -m specdec.train data`")
    ap.add_argument("--n-vocab", type=int, default=49152, help="the target's vocabulary (SmolLM2's by default)")
    args = ap.parse_args(argv)
    data = load_distill_data(args.data, complete=False)
    counts = measure_rates(data.prompts, data.replies, args.n_vocab)
    print(f"{len(data.replies)} replies, {data.n_tokens} tokens, from {args.data}")
    print("| L | scored share f | right | a(L) |")
    print("|---|---|---|---|")
    for b in range(Calibration.N_BUCKETS):
        low, high = 1 << b, (1 << (b + 1)) - 1
        label = f"{low}+" if b == Calibration.N_BUCKETS - 1 else (f"{low}" if low == high else f"{low}-{high}")
        rate = counts.hits[b] / counts.support[b] if counts.support[b] else float("nan")
        print(f"| {label} | {counts.support[b]:.1f} | {counts.hits[b]:.0f} | {rate:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
