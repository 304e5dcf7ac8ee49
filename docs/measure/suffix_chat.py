"""Suffix decoding on SmolLM2 chat requests that copy (editing, reordering, grounded answers) and that do not.

    python docs/measure/suffix_chat.py [--temperature 0] [--repeats 2] [--n-tokens 200] [--only copy|free]

Each request is a chat message; per repeat, interleaved: plain decoding, then speculative decoding with the
suffix drafter as a chain (K=32) and as a tree (K=32, tree=32), and prompt lookup (ngram, K=4) beside them.
Prints, per request and drafter: tokens, rounds, tokens per round; the speedup over plain decoding on the wall
clock, of the whole call and of its decoding alone (the call less its first pass, the prompt's prefill, which
both decoders make alike: on a busy machine a 100-token prefill took seconds), per token (at T > 0 the two
decoders write different texts); each the median over repeats of the ratio within a repeat; and the speedup the run's own rounds predict when priced by the r(m) measured on an
unloaded 2-core machine (costmodel.SMOLLM2_CPU_R: n_tokens over the sum of r(k + 1); the drafter's own time is
not in it, nor the prefill). Then the medians over the requests of each kind. Every drafter is made afresh per
run, as draft="suffix" is; at temperature 0 every output is checked against plain decoding's.
"""

import specdec  # noqa: F401  (first: sets OpenBLAS's thread spin before NumPy loads)

import argparse
import os
import statistics
import time

from specdec.autoregressive import autoregressive_sample
from specdec.bench.suite import load_average
from specdec.checkpoints.load import load_model
from specdec.costmodel import SMOLLM2_CPU_R, PointsCurve, speedup_from_rounds
from specdec.drafters import NgramDrafter, SuffixDrafter
from specdec.speculative import speculative_sample

COPY = {
    "typos": "Fix the typos in this paragraph: The quick brown fox jumpd over the lazy dog. It was a sunny day and "
    "the fox was verry happy to be outside. The dog, howver, did not care at all and kept sleeping under the tree "
    "until the evning came.",
    "sort": "Rewrite this list in alphabetical order: banana, cherry, apple, mango, kiwi, grape, lemon, orange, "
    "peach, pear, plum, apricot.",
    "rename": "Rename the variable x to total in this code:\n\ndef add_all(numbers):\n    x = 0\n    for n in "
    "numbers:\n        x = x + n\n    return x\n",
    "grounded": "Answer from the passage. Passage: The Eiffel Tower was built between 1887 and 1889 as the "
    "entrance arch to the 1889 World's Fair in Paris. It was designed by the engineering company of Gustave "
    "Eiffel and is 330 metres tall. Question: When was the Eiffel Tower built, and how tall is it?",
    "periods": "Add a period at the end of each line:\nThe sun rises in the east\nWater boils at one hundred "
    "degrees\nCats like to sleep in the sun\nThe train leaves at noon",
    "grammar": "Correct the grammar: Me and him goes to the store yesterday and buyed three apple. They was very "
    "tasty but the store are far from our house.",
    "bullets": "Turn this into a bulleted list: eggs, milk, flour, butter, sugar, baking powder, vanilla extract, "
    "salt.",
    "dedupe": "Remove the duplicate words from this list: red, blue, green, red, yellow, blue, purple, green, orange.",
    "json": "Convert this to JSON: name is Alice, age is 30, city is Paris, job is engineer.",
    "summary": "Summarize this paragraph in one sentence, keeping its wording: The library will be closed on Monday "
    "for repairs to the heating system. It will reopen on Tuesday morning at nine o'clock. Books due on Monday can "
    "be returned on Tuesday without a fine.",
    "docstring": "Add a docstring to this function:\n\ndef area(width, height):\n    return width * height\n",
    "cities": "List every city mentioned in this text: We flew from London to Paris, then took the train to Berlin "
    "and Vienna, before driving to Prague and finally flying home from Budapest.",
}
FREE = {
    "poem": "Write a short poem about the sea.",
    "cooking": "Give three tips for someone learning to cook.",
    "cpu": "Explain what a CPU does in two sentences.",
    "story": "Tell me a short story about a lost cat.",
    "advice": "How can I sleep better at night?",
}


class FirstPass:
    """Wraps a model's forward to time its first pass after `reset` (the prompt's prefill)."""

    def __init__(self, model):
        self.forward, self.seconds = model.forward, None
        model.forward = self

    def reset(self) -> None:
        self.seconds = None

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.forward(*args, **kwargs)
        if self.seconds is None:
            self.seconds = time.perf_counter() - start
        return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--n-tokens", type=int, default=200)
    parser.add_argument("--only", choices=["copy", "free"])
    args = parser.parse_args()

    target = load_model("smollm2-135m")
    n_vocab, r, prefill = target.n_vocab, PointsCurve(SMOLLM2_CPU_R), FirstPass(target)
    drafters = {  # label -> (a fresh drafter, K, tree)
        "suffix chain": (lambda: SuffixDrafter(n_vocab), 32, None),
        "suffix tree": (lambda: SuffixDrafter(n_vocab), 32, 32),
        "ngram K=4": (lambda: NgramDrafter(n_vocab), 4, None),
    }
    requests = {**({} if args.only == "free" else COPY), **({} if args.only == "copy" else FREE)}
    what = f"{len(requests)} requests, up to {args.n_tokens} tokens, T={args.temperature}, {args.repeats} repeats"
    print(f"{what}; load average {load_average()}, {os.cpu_count()} CPUs", flush=True)
    rows = {}
    for name, prompt in requests.items():
        walls = {label: ([], []) for label in drafters}  # whole calls, decoding alone
        for repeat in range(args.repeats):
            settings = dict(temperature=args.temperature, seed=repeat, chat=True)
            prefill.reset()
            start = time.perf_counter()
            plain = autoregressive_sample(target, prompt, args.n_tokens, **settings)
            t_plain, p_plain = time.perf_counter() - start, prefill.seconds
            for label, (make, K, tree) in drafters.items():
                prefill.reset()
                start = time.perf_counter()
                out = speculative_sample(target, make(), prompt, args.n_tokens, K=K, tree=tree, **settings)
                t = time.perf_counter() - start
                per_token = len(out.tokens) / len(plain.tokens)  # at T > 0 the two texts differ in length
                walls[label][0].append(t_plain / t * per_token)
                walls[label][1].append((t_plain - p_plain) / (t - prefill.seconds) * per_token)
                if args.temperature == 0:
                    assert out.tokens == plain.tokens, f"{label} changed the greedy output of {name}"
                priced = speedup_from_rounds(len(out.tokens), out.k_per_round, 0, 0.0, r)
                rows[name, label] = (len(out.tokens), len(out.k_per_round), priced, *walls[label])
        for label in drafters:
            n, rounds, priced, whole, decoding = rows[name, label]
            print(
                f"{name:9} {label:13} {n:4d} tokens, {rounds:4d} rounds, {n / rounds:5.2f} tokens/round, priced "
                f"{priced:5.2f}x, wall {statistics.median(whole):5.2f}x, decoding {statistics.median(decoding):5.2f}x "
                f"({', '.join(f'{w:.2f}' for w in decoding)}); load {load_average()}",
                flush=True,
            )
    for kind, names in (("copy", COPY), ("free", FREE)):
        names = [n for n in names if n in requests]
        if not names:
            continue
        for label in drafters:
            priced = statistics.median(rows[n, label][2] for n in names)
            wall = statistics.median(statistics.median(rows[n, label][3]) for n in names)
            decoding = statistics.median(statistics.median(rows[n, label][4]) for n in names)
            print(
                f"median over {kind} requests, {label}: priced {priced:.2f}x, wall {wall:.2f}x, "
                f"decoding {decoding:.2f}x"
            )


if __name__ == "__main__":
    main()
