"""Lookup-first drafting on SmolLM2 with the shipped EAGLE head: how short a match the lookup may take.

    python docs/measure/lookup_first.py [--temperature 0] [--repeats 2] [--bar 0.3] [--n-tokens 32]

For each of the prompt suite's 20 prompts as a chat message, interleaved in every repeat: plain decoding,
then speculative decoding (K=4) with prompt lookup alone (1 <= n <= 3), the EAGLE head alone with a
confidence bar, and lookup-first with the shortest match allowed 1, 2 or 3 tokens (the head, with the same
bar, where the lookup finds nothing). Prints, per drafter, the speedup over the whole suite (the sums of
seconds per token), the median of the per-prompt speedups, and tokens per round. `ngram+eagle` is the
shortest match of 2 (drafters/lookup_first.py).
"""

import specdec  # noqa: F401  (first: sets OpenBLAS's thread spin before NumPy loads)

import argparse
import os
import statistics
import time

from specdec.autoregressive import autoregressive_sample
from specdec.bench.prompts import load_prompts
from specdec.bench.suite import load_average
from specdec.checkpoints.load import load_model
from specdec.drafters import LookupFirst, NgramDrafter, make_drafter
from specdec.drafters.stopping import ConfidenceStop
from specdec.speculative import speculative_sample


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--bar", type=float, default=0.3, help="the head's confidence bar (default: 0.3)")
    parser.add_argument("--n-tokens", type=int, default=32)
    args = parser.parse_args()

    target = load_model("smollm2-135m")
    head = make_drafter("eagle", target)  # its weights, shared by the copies below (fresh)
    head.stop = ConfidenceStop(args.bar)
    drafters = {
        "ngram (1..3)": lambda: NgramDrafter(target.n_vocab, 3, 1),
        f"eagle@{args.bar}": head.fresh,
        **{
            f"lookup >= {n}, else eagle@{args.bar}": (
                lambda n=n: LookupFirst(NgramDrafter(target.n_vocab, 3, n), head.fresh())
            )
            for n in (1, 2, 3)
        },
    }
    prompts = [p for ps in load_prompts().values() for p in ps]
    seconds = {name: [] for name in ["plain", *drafters]}  # seconds per new token, per prompt and repeat
    rounds = {name: [0, 0] for name in drafters}  # tokens, rounds
    print(
        f"{len(prompts)} prompts, {args.n_tokens} tokens, T={args.temperature}, {args.repeats} repeats, "
        f"load average {load_average()}, {os.cpu_count()} CPUs",
        flush=True,
    )
    for repeat in range(args.repeats):
        for i, prompt in enumerate(prompts):
            start = time.perf_counter()
            plain = autoregressive_sample(
                target, prompt, args.n_tokens, temperature=args.temperature, seed=i, chat=True
            )
            seconds["plain"].append((time.perf_counter() - start) / len(plain.tokens))
            for name, make in drafters.items():
                start = time.perf_counter()
                out = speculative_sample(
                    target, make(), prompt, args.n_tokens, K=4, temperature=args.temperature, seed=i, chat=True
                )
                seconds[name].append((time.perf_counter() - start) / len(out.tokens))
                rounds[name][0] += len(out.tokens)
                rounds[name][1] += len(out.k_per_round)
                if args.temperature == 0:
                    assert out.tokens == plain.tokens, (name, prompt)
        print(f"repeat {repeat + 1} done, load average {load_average()}", flush=True)
    for name in drafters:
        per_prompt = [a / b for a, b in zip(seconds["plain"], seconds[name])]
        tau = rounds[name][0] / rounds[name][1]
        print(
            f"{name:28s} suite {sum(seconds['plain']) / sum(seconds[name]):.3f}x  median per prompt "
            f"{statistics.median(per_prompt):.3f}x  tokens per round {tau:.2f}"
        )


if __name__ == "__main__":
    main()
