"""What suffix decoding's own bookkeeping costs: appending a token, proposing a round, querying the datastore.

    python docs/measure/suffix_speed.py [--tokens 4000] [--datastore DIR] [--corpus 1000000]

Token streams are synthetic, over SmolLM2's 49,152 ids with Zipf-like frequencies (a few ids very common, as
in text): "free" text, where matches are short and rare, and "copying" text, whose second half repeats its first
with an edit every 40 tokens. Prints, in microseconds:
  - append: one token into the request's own index (a SuffixIndex of one document, no bound), and into an index
    of earlier outputs bounded at EARLIER_CAPACITY tokens that is kept full, so it evicts as it goes;
  - propose: a whole round of SuffixDrafter.propose (chains of up to 32, and trees of 32 nodes), median and 90th
    percentile over every position of the text, with the text's own index and an earlier-outputs index filled
    with other synthetic replies;
  - datastore: building one over --corpus synthetic tokens (or loading --datastore DIR, a real one), and one
    longest_match + continuations query per round.
To put them beside a round: a SmolLM2 step is about 20-40 ms on 2 cores (python -m specdec.bench), so 200 us is
about 1% of a round.
"""

import specdec  # noqa: F401  (first: sets OpenBLAS's thread spin before NumPy loads)

import argparse
import os
import time

import numpy as np

from specdec.bench.suite import load_average
from specdec.drafters.datastore import Datastore
from specdec.drafters.suffix import EARLIER_CAPACITY, SuffixDrafter
from specdec.drafters.suffix_index import MAX_MATCH, SuffixIndex
from specdec.sampling import SamplingParams

N_VOCAB = 49_152
GREEDY = SamplingParams(0.0)


def zipf_text(rng: np.random.Generator, n: int) -> list[int]:
    """n ids with frequencies falling as 1 / rank (the commonest id about 10% of the text)."""
    ranks = np.arange(1, N_VOCAB + 1)
    p = 1.0 / ranks
    return rng.choice(N_VOCAB, size=n, p=p / p.sum()).tolist()


def copying_text(rng: np.random.Generator, n: int) -> list[int]:
    """A first half, then the first half again with one token changed every 40."""
    first = zipf_text(rng, n // 2)
    second = [int(rng.integers(N_VOCAB)) if i % 40 == 39 else t for i, t in enumerate(first)]
    return first + second


def per_token_us(work, n: int) -> float:
    start = time.perf_counter()
    work()
    return 1e6 * (time.perf_counter() - start) / n


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4000, help="tokens of each text (default 4000)")
    parser.add_argument("--datastore", metavar="DIR", help="time a real datastore (else a synthetic one)")
    parser.add_argument("--corpus", type=int, default=1_000_000, help="tokens of the synthetic datastore")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"load average {load_average()}, {os.cpu_count()} CPUs; times in microseconds", flush=True)

    texts = {"free": zipf_text(rng, args.tokens), "copying": copying_text(rng, args.tokens)}
    for name, text in texts.items():
        own = SuffixIndex()
        doc = own.start()
        us = per_token_us(lambda: own.extend(doc, text), len(text))
        print(f"append, the request's own index, {name} text: {us:.2f} per token", flush=True)
    earlier = SuffixIndex(EARLIER_CAPACITY)
    filler = zipf_text(rng, 2 * EARLIER_CAPACITY)
    replies = [filler[i : i + 256] for i in range(0, len(filler), 256)]
    us = per_token_us(lambda: [earlier.extend(earlier.start(key=i), r) for i, r in enumerate(replies)], len(filler))
    print(f"append, earlier outputs bounded at {EARLIER_CAPACITY:,} tokens (evicting): {us:.2f} per token", flush=True)

    store = None
    if args.datastore:
        start = time.perf_counter()
        store = Datastore.load(args.datastore, N_VOCAB)
        print(f"datastore: {store.describe()}, loaded and checked in {time.perf_counter() - start:.2f} s")
    elif args.corpus:
        corpus = zipf_text(rng, args.corpus)
        start = time.perf_counter()
        store = Datastore.build([corpus[i : i + 256] for i in range(0, len(corpus), 256)], N_VOCAB)
        print(f"datastore: {store.describe()}, built in {time.perf_counter() - start:.1f} s (synthetic)")
    if store is not None:
        queries = []
        for tail in (texts["free"][i - MAX_MATCH : i + 1] for i in range(MAX_MATCH, args.tokens, 7)):
            start = time.perf_counter()
            m, ends = store.longest_match(tail)
            if m:
                store.continuations(ends, 32)
            queries.append(1e6 * (time.perf_counter() - start))
        median, p90 = np.median(queries), np.percentile(queries, 90)
        print(f"datastore query (match + continuations): median {median:.0f}, 90th percentile {p90:.0f}", flush=True)

    for name, text in texts.items():
        for nodes in (None, 32):
            drafter = SuffixDrafter(N_VOCAB, earlier=earlier, datastore=store)
            drafter.begin(None, None, text[:2])
            times, drafted = [], 0
            for n in range(2, len(text)):
                ids = text[:n]
                drafter.commit(ids, None)
                start = time.perf_counter()
                drafted += len(drafter.propose(ids, 32, GREEDY, None, nodes))
                times.append(1e6 * (time.perf_counter() - start))
            shape = "chain" if nodes is None else f"tree of {nodes}"
            median, p90 = np.median(times), np.percentile(times, 90)
            print(
                f"propose, {name} text, {shape}: median {median:.0f}, 90th percentile {p90:.0f} per round; "
                f"{drafted / len(times):.1f} tokens drafted a round (sources {dict(drafter.proposed)})",
                flush=True,
            )


if __name__ == "__main__":
    main()
